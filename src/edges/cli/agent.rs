//! `berth agent run|health`: the flags (each with its environment variable, which is how a
//! service configures the agent), resolved into [`agent::settings::Settings`]. Exit codes are
//! the agent's own: see each command's help.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::core::ir::Shutdown;
use crate::edges::agent::{self, settings::Settings};
use crate::envoy::readiness::Expect;

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Run Envoy as this process's child and drain it on SIGTERM/SIGINT (the replica's
    /// entrypoint).
    ///
    /// Everything after `--` is Envoy's command line, program first. On SIGTERM or SIGINT the
    /// agent drains Envoy as berth does on one host: POST /healthcheck/fail, POST
    /// /drain_listeners?graceful&skip_exit, wait until downstream connections reach 0 (not
    /// before --min-drain-duration) or --drain-timeout passes, POST /drain_listeners, then
    /// SIGTERM Envoy (SIGKILL 5 s later). A second signal cuts the drain short. SIGHUP,
    /// SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to Envoy.
    ///
    /// Every second the agent asks Envoy's /ready: once Envoy has answered, 2 s of silence
    /// while Envoy is stopped by a signal or uses under 1 ms of CPU per second get its process
    /// group SIGKILL, and the agent exits 137.
    ///
    /// The stop grace period of the container must exceed the drain timeout: give it the drain
    /// timeout + 10 s (berth does so for the services it creates).
    ///
    /// Exit code: Envoy's; 128+N when Envoy was killed by signal N; 1 when Envoy could not be
    /// started; 2 for bad flags.
    #[command(after_help = "Example:
  berth agent run --port 8080 --drain-timeout 30s -- \\
      /usr/local/bin/envoy -c /etc/berth/bootstrap/bootstrap.yaml --drain-time-s 30")]
    Run {
        #[command(flatten)]
        probe: ProbeArgs,
        #[command(flatten)]
        drain: DrainArgs,
        /// Envoy's node id: replaces the value of `--service-node` in Envoy's command line (or
        /// is added). On Swarm the variable is `{{.Task.Name}}`, which Swarm expands per task
        /// (`berth-edge.2.<task id>`): templates reach the environment, not the arguments.
        #[arg(long, env = agent::ENV_SERVICE_NODE, value_name = "NODE")]
        service_node: Option<String>,
        /// Envoy's command line, after `--`.
        #[arg(last = true, required = true, value_name = "ENVOY")]
        envoy: Vec<String>,
    },
    /// Docker HEALTHCHECK: exit 0 when Envoy is LIVE and every --port is bound, else 1.
    ///
    /// Prints one line that Docker keeps in the container's State.Health.Log:
    /// `ready config=V lds=V cds=V`, or `not-ready config=V lds=V cds=V reason: …`, with the
    /// config version given (--config-version) and the listener and cluster versions Envoy
    /// accepted (`-` when none). The same verdict is written as JSON to agent-health.json beside
    /// the admin socket.
    Health {
        #[command(flatten)]
        probe: ProbeArgs,
    },
}

/// What identifies the replica's Envoy and its readiness.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Envoy's admin socket (the bootstrap's admin.address.pipe.path).
    #[arg(long, env = agent::ENV_ADMIN_SOCKET, value_name = "PATH",
          default_value = crate::core::layout::CONTAINER_ADMIN_SOCKET)]
    pub admin_socket: PathBuf,
    /// A listener a ready Envoy has bound: PORT (on 0.0.0.0) or ADDRESS:PORT (127.0.0.1:8080,
    /// [::1]:8080); repeatable, the variable takes a comma list. None: ready means LIVE.
    #[arg(long = "port", env = agent::ENV_PORTS, value_name = "[ADDRESS:]PORT",
          value_delimiter = ',', value_parser = parse_listener)]
    pub ports: Vec<(u16, Option<IpAddr>)>,
    /// The version of the config this replica was given, reported by `health`.
    #[arg(long, env = agent::ENV_CONFIG_VERSION, value_name = "VERSION")]
    pub config_version: Option<String>,
}

/// The drain on the stop signal (Envoy Gateway's shutdown settings).
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The longest drain: after it the listeners close and Envoy stops, connections or not
    /// [default: 60s].
    #[arg(long, env = agent::ENV_DRAIN_TIMEOUT, value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// The shortest drain, even when connections reach 0 sooner [default: 1s].
    #[arg(long, env = agent::ENV_MIN_DRAIN_DURATION, value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub min_drain_duration: Option<Duration>,
    /// How long health checks keep passing after the drain began [default: 0s].
    #[arg(long, env = agent::ENV_HEALTH_CHECK_FAILURE_DELAY, value_name = "DURATION",
          value_parser = humantime::parse_duration)]
    pub health_check_failure_delay: Option<Duration>,
}

impl AgentCommand {
    /// The settings this command runs with.
    pub fn settings(&self) -> Settings {
        let (probe, drain) = match self {
            AgentCommand::Run { probe, drain, .. } => (probe, Some(drain)),
            AgentCommand::Health { probe } => (probe, None),
        };
        let defaults = Shutdown::default();
        let shutdown = match drain {
            Some(d) => Shutdown {
                drain_timeout: d.drain_timeout.unwrap_or(defaults.drain_timeout),
                min_drain_duration: d.min_drain_duration.unwrap_or(defaults.min_drain_duration),
                health_check_failure_delay: d
                    .health_check_failure_delay
                    .unwrap_or(defaults.health_check_failure_delay),
            },
            None => defaults,
        };
        Settings {
            admin_socket: probe.admin_socket.clone(),
            expect: Expect {
                ports: probe.ports.iter().map(|(port, _)| *port).collect(),
                addresses: probe
                    .ports
                    .iter()
                    .filter_map(|(port, address)| Some((*port, (*address)?)))
                    .collect(),
            },
            shutdown,
            config_version: probe.config_version.clone().filter(|v| !v.is_empty()),
        }
    }
}

/// Runs an agent command; returns the process's exit code.
pub async fn command(command: &AgentCommand) -> i32 {
    let settings = command.settings();
    match command {
        AgentCommand::Health { .. } => agent::health::command(&settings).await,
        AgentCommand::Run {
            envoy,
            service_node,
            ..
        } => match agent::run::run(
            &settings,
            &agent::run::with_service_node(envoy, service_node.as_deref()),
        )
        .await
        {
            Ok(code) => code,
            Err(e) => {
                eprintln!("berth agent: error: {e:#}");
                1
            }
        },
    }
}

/// `PORT` or `ADDRESS:PORT`.
fn parse_listener(s: &str) -> Result<(u16, Option<IpAddr>), String> {
    let s = s.trim();
    let (port, address) = match s.parse::<SocketAddr>() {
        Ok(a) => (a.port(), Some(a.ip())),
        Err(_) => (
            s.parse::<u16>()
                .map_err(|_| format!("must be PORT or ADDRESS:PORT (1–65535), got {s:?}"))?,
            None,
        ),
    };
    if port == 0 {
        return Err(format!("the port must be 1–65535, got {s:?}"));
    }
    Ok((port, address.filter(|a| !a.is_unspecified())))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::edges::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<AgentCommand, clap::Error> {
        let cli = Cli::try_parse_from(["berth", "agent"].iter().chain(args))?;
        match cli.command {
            Command::Agent { command } => Ok(command),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn run_takes_envoys_command_line_after_the_separator() {
        let c = parse(&[
            "run",
            "--port",
            "8080",
            "--port",
            "8443",
            "--drain-timeout",
            "30s",
            "--",
            "/usr/local/bin/envoy",
            "-c",
            "/etc/envoy.yaml",
            "--port",
        ])
        .unwrap();
        let s = c.settings();
        assert_eq!(s.expect.ports, vec![8080, 8443]);
        assert_eq!(s.shutdown.drain_timeout, Duration::from_secs(30));
        assert_eq!(s.shutdown.min_drain_duration, Duration::from_secs(1));
        assert_eq!(s.admin_socket, PathBuf::from("/run/berth/admin.sock"));
        let AgentCommand::Run { envoy, .. } = c else {
            panic!()
        };
        assert_eq!(
            envoy,
            ["/usr/local/bin/envoy", "-c", "/etc/envoy.yaml", "--port"]
        );
    }

    #[test]
    fn run_without_envoy_and_bad_values_are_refused() {
        assert!(parse(&["run"]).is_err());
        let e = parse(&["run", "--port", "0", "--", "envoy"]).unwrap_err();
        assert!(e.to_string().contains("1–65535"), "{e}");
        let e = parse(&["run", "--drain-timeout", "soon", "--", "envoy"]).unwrap_err();
        assert!(e.to_string().contains("--drain-timeout"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn health_reads_a_comma_list_of_ports_and_the_config_version() {
        let c = parse(&[
            "health",
            "--port",
            "80,443",
            "--config-version",
            "abc",
            "--admin-socket",
            "/tmp/a.sock",
        ])
        .unwrap();
        let s = c.settings();
        assert_eq!(s.expect.ports, vec![80, 443]);
        assert!(s.expect.addresses.is_empty());
        assert_eq!(s.config_version.as_deref(), Some("abc"));
        assert_eq!(s.health_file(), PathBuf::from("/tmp/agent-health.json"));
        let c = parse(&["health", "--port", "127.0.0.1:80,[::1]:443,0.0.0.0:8080"]).unwrap();
        let s = c.settings();
        assert_eq!(s.expect.ports, vec![80, 443, 8080]);
        assert_eq!(
            s.expect.addresses,
            [
                (80, "127.0.0.1".parse().unwrap()),
                (443, "::1".parse().unwrap())
            ]
            .into()
        );
    }

    #[test]
    fn the_service_environment_is_what_the_flags_read() {
        let shutdown = Shutdown {
            drain_timeout: Duration::from_secs(15),
            min_drain_duration: Duration::from_millis(1500),
            health_check_failure_delay: Duration::from_secs(2),
        };
        let expect = Expect {
            ports: vec![8080, 8443],
            addresses: [(8443, "127.0.0.1".parse().unwrap())].into(),
        };
        let env = agent::service_env(&shutdown, &expect, "v7");
        assert_eq!(env[agent::ENV_PORTS], "8080,127.0.0.1:8443");
        // Parse the same values through the flags the variables stand for.
        let flag = |var: &str| env[var].clone();
        let c = parse(&[
            "run",
            "--port",
            &flag(agent::ENV_PORTS),
            "--drain-timeout",
            &flag(agent::ENV_DRAIN_TIMEOUT),
            "--min-drain-duration",
            &flag(agent::ENV_MIN_DRAIN_DURATION),
            "--health-check-failure-delay",
            &flag(agent::ENV_HEALTH_CHECK_FAILURE_DELAY),
            "--config-version",
            &flag(agent::ENV_CONFIG_VERSION),
            "--",
            "envoy",
        ])
        .unwrap();
        let s = c.settings();
        assert_eq!(s.shutdown, shutdown);
        assert_eq!(s.expect, expect);
        assert_eq!(s.config_version.as_deref(), Some("v7"));
        assert_eq!(agent::stop_grace_period(&shutdown), Duration::from_secs(25));
    }
}
