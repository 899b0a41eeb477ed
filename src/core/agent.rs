//! The contract between the manager and `berth agent` (the entrypoint of a Swarm replica,
//! [`crate::edges::agent`]): where the derived image holds the agent, its HEALTHCHECK, and the
//! environment a service sets for it. Both sides read it from here.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::expect::Expect;
use crate::core::ir::Shutdown;

/// Where the derived image holds the agent binary.
pub const AGENT_PATH: &str = "/usr/local/bin/berth-agent";

/// The HEALTHCHECK command of the derived image, in the Engine API's form (`HealthConfig.Test`).
pub const HEALTHCHECK_TEST: [&str; 4] = ["CMD", AGENT_PATH, "agent", "health"];

/// The HEALTHCHECK's timing (the derived image's and the Swarm service's). It is what acts on
/// a task whose agent cannot (the agent's own liveness watch kills a hung Envoy within about
/// 3 s): the engine runs a check [`HEALTH_INTERVAL`] after the previous one ended, each may
/// take [`HEALTH_TIMEOUT`], and [`HEALTH_RETRIES`] failures in a row make the task unhealthy,
/// which Swarm replaces: at most [`health_bound`] (6 s) after the last passing check. A check
/// of a hung Envoy takes about 2 s (two admin calls of 1 s), so the timeout rarely cuts one
/// short; two failures in a row (not one) so that one slow check on a loaded host never
/// replaces a task. Slow starts are the start period's (the rollout's `startup_deadline`).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
pub const HEALTH_RETRIES: u32 = 2;

/// The longest time from a task's last passing health check to its being judged unhealthy:
/// retries × (interval + timeout).
pub fn health_bound() -> Duration {
    (HEALTH_INTERVAL + HEALTH_TIMEOUT) * HEALTH_RETRIES
}

/// Environment variables the agent reads (flags override them).
pub const ENV_ADMIN_SOCKET: &str = "BERTH_AGENT_ADMIN_SOCKET";
pub const ENV_PORTS: &str = "BERTH_AGENT_PORTS";
pub const ENV_DRAIN_TIMEOUT: &str = "BERTH_AGENT_DRAIN_TIMEOUT";
pub const ENV_MIN_DRAIN_DURATION: &str = "BERTH_AGENT_MIN_DRAIN_DURATION";
pub const ENV_HEALTH_CHECK_FAILURE_DELAY: &str = "BERTH_AGENT_HEALTH_CHECK_FAILURE_DELAY";
pub const ENV_CONFIG_VERSION: &str = "BERTH_AGENT_CONFIG_VERSION";
pub const ENV_SERVICE_NODE: &str = "BERTH_AGENT_SERVICE_NODE";

/// What the agent needs beyond the drain window before its container may be killed: the
/// admin calls still in flight when the drain window ends (2 s each at most) and Envoy's own
/// exit after SIGTERM ([`crate::edges::agent::run::ENVOY_EXIT_TIMEOUT`]), with room to spare.
pub const STOP_MARGIN: Duration = Duration::from_secs(10);

/// The stop grace period a service must give a replica running the agent: the drain window
/// plus [`STOP_MARGIN`]. A shorter one lets the engine SIGKILL the replica mid-drain.
pub fn stop_grace_period(shutdown: &Shutdown) -> Duration {
    shutdown.drain_timeout + STOP_MARGIN
}

/// The environment a service sets on a replica running the agent: the drain settings, the
/// listeners a ready replica has bound (the proxy's [`Expect`], as the one readiness probe
/// takes it), and the version of the config it was given.
pub fn service_env(
    shutdown: &Shutdown,
    expect: &Expect,
    config_version: &str,
) -> BTreeMap<String, String> {
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    let ports: Vec<String> = expect
        .ports
        .iter()
        .map(|port| match expect.addresses.get(port) {
            Some(address) => std::net::SocketAddr::new(*address, *port).to_string(),
            None => port.to_string(),
        })
        .collect();
    BTreeMap::from([
        (ENV_PORTS.to_string(), ports.join(",")),
        (
            ENV_DRAIN_TIMEOUT.to_string(),
            duration(shutdown.drain_timeout),
        ),
        (
            ENV_MIN_DRAIN_DURATION.to_string(),
            duration(shutdown.min_drain_duration),
        ),
        (
            ENV_HEALTH_CHECK_FAILURE_DELAY.to_string(),
            duration(shutdown.health_check_failure_delay),
        ),
        (ENV_CONFIG_VERSION.to_string(), config_version.to_string()),
    ])
}

/// The agent channel (`infra::swarm::hub` and `edges::agent::channel`): the environment of a
/// task whose watched files come through it, and the names in its certificates.
pub mod channel {
    pub const ENV_MANAGER: &str = "BERTH_AGENT_MANAGER";
    pub const ENV_PROXY: &str = "BERTH_AGENT_PROXY";
    pub const ENV_WATCHED: &str = "BERTH_AGENT_WATCHED_DIR";
    pub const ENV_BASELINE: &str = "BERTH_AGENT_BASELINE_DIR";
    pub const ENV_CREDENTIALS: &str = "BERTH_AGENT_CREDENTIALS_DIR";
    /// The task's TLS directory (a tmpfs the agent writes): listener and backend certificate
    /// copies, named by version, which the watched SDS files point at.
    pub const ENV_TLS: &str = "BERTH_AGENT_TLS_DIR";
    /// Files of the live set whose name starts with this go to the TLS directory, as
    /// `tls/<owner>/<file>` (the listener's secret or the backend's owner, then the versioned
    /// copy's name), not to the watched directory.
    pub const TLS_PREFIX: &str = "tls/";
    /// Files in the credentials directory.
    pub const CA_FILE: &str = "ca.pem";
    pub const CERT_FILE: &str = "cert.pem";
    pub const KEY_FILE: &str = "key.pem";
    /// The name in the manager's certificate, which agents check (the address they dial may be
    /// any of the manager's).
    pub const MANAGER_NAME: &str = "berth-manager";
    /// The port the berth holding the state directory listens on for its Swarm agents.
    pub const PORT: u16 = 7950;
}
