//! The infra IR: plain data, no I/O.
//!
//! [`ProxyInfra`] mirrors Envoy Gateway's `ProxyInfra` (name, namespace, metadata, listeners,
//! addresses) and carries, in [`EnvoyProxy`], the typed subset of EG's EnvoyProxy that berth
//! honours. berth adds its own [`RolloutPolicy`] and, in standalone mode, a small routing model
//! ([`Routing::Standalone`]); in xds mode Envoy Gateway pushes routes and berth only points the
//! bootstrap at it ([`Routing::Xds`]). JSON field names are EG's (camelCase).
//!
//! Values here are already validated and parsed (durations as [`Duration`], sizes in bytes):
//! the sources turn user input into this shape or report errors.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod acme;
mod rollout;
mod routing;

pub use acme::*;
pub use rollout::*;
pub use routing::*;

/// Everything berth should run on one host.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Infra {
    pub proxies: Vec<ProxyInfra>,
}

impl Infra {
    pub fn proxy(&self, name: &str) -> Option<&ProxyInfra> {
        self.proxies.iter().find(|p| p.name == name)
    }
}

/// One proxy fleet: N replicas of one Envoy behind the listeners' host ports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyInfra {
    #[serde(default)]
    pub metadata: InfraMetadata,
    /// A DNS label; EG's "ns/gateway" keys are mapped to e.g. "ns-gateway" by the sources.
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub config: EnvoyProxy,
    #[serde(default)]
    pub listeners: Vec<ProxyListener>,
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub rollout: RolloutPolicy,
    /// Where a Swarm runs the replicas (`[proxy.swarm]`); unused on one Docker host.
    #[serde(default, skip_serializing_if = "Placement::is_default")]
    pub placement: Placement,
    pub routing: Routing,
    /// Envoy's `--service-cluster` (the bootstrap's node cluster) when it is not `name`.
    /// Envoy Gateway matches xDS snapshots on it, so EG-driven proxies carry EG's IR key
    /// ("ns/gateway") here, which is not a DNS label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_cluster: Option<String>,
}

impl ProxyInfra {
    /// The cluster name Envoy announces: [`ProxyInfra::service_cluster`] or the name.
    pub fn service_cluster(&self) -> &str {
        self.service_cluster.as_deref().unwrap_or(&self.name)
    }

    /// Every address and port Envoy binds on the host.
    pub fn host_binds(&self) -> Vec<(std::net::IpAddr, u16)> {
        self.listeners
            .iter()
            .flat_map(|l| l.ports.iter().map(|p| (l.bind_address(), p.container_port)))
            .collect()
    }

    /// Every port Envoy binds on the host (host networking: container port = host port).
    pub fn host_ports(&self) -> Vec<u16> {
        self.listeners
            .iter()
            .flat_map(|l| l.ports.iter().map(|p| p.container_port))
            .collect()
    }
}

/// Where a Swarm places a proxy's tasks: `replicas` of them, or one per node (`global`, Envoy
/// Gateway's DaemonSet), on the nodes matching every constraint (`node.labels.edge == true`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Placement {
    #[serde(default)]
    pub global: bool,
    #[serde(default)]
    pub constraints: Vec<String>,
}

impl Placement {
    pub fn is_default(&self) -> bool {
        *self == Placement::default()
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InfraMetadata {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyListener {
    pub name: String,
    pub ports: Vec<ListenerPort>,
    /// The IP address the ports are bound on; None binds every IPv4 address (0.0.0.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::IpAddr>,
}

impl ProxyListener {
    /// The address its ports are bound on: [`ProxyListener::address`] or 0.0.0.0.
    pub fn bind_address(&self) -> std::net::IpAddr {
        self.address
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerPort {
    /// EG's convention: lower("<protocol>-<servicePort>"), e.g. "http-8080".
    pub name: String,
    pub protocol: Protocol,
    pub service_port: u16,
    pub container_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Http,
    Https,
    Tls,
    Tcp,
    Udp,
}

/// The subset of EG's EnvoyProxy spec berth honours, flattened. The EG source maps
/// `provider.kubernetes.envoyDeployment.{replicas, container.{image, env, resources}}` here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyProxy {
    pub image: String,
    pub replicas: u32,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Envoy worker threads (`--concurrency`); `None` means max(1, host CPUs / replicas).
    /// Envoy runs one worker for 0, as it does under Envoy Gateway.
    #[serde(default)]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub extra_args: Vec<String>,
    #[serde(default)]
    pub logging: Logging,
    #[serde(default)]
    pub shutdown: Shutdown,
    #[serde(default)]
    pub bootstrap: Option<BootstrapOverride>,
    /// When berth pulls the image (berth's own; EG's IR has none, so EG proxies pull when
    /// missing). Left out of the JSON when it is the default, so IR fingerprints made before
    /// it existed still hold.
    #[serde(default, skip_serializing_if = "PullPolicy::is_default")]
    pub pull: PullPolicy,
}

/// When the image is pulled: compose's `pull_policy`, whose documented default is `missing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PullPolicy {
    /// Only when no local image has the reference; a local tag is what runs.
    #[default]
    Missing,
    /// Ask the registry whenever berth converges (`up`, `diff`, serve's startup and its tag
    /// checks): a tag that now names another image rolls the replicas to it.
    Always,
}

impl PullPolicy {
    pub fn is_default(&self) -> bool {
        *self == PullPolicy::Missing
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPUs as a fraction (1.5 = one and a half cores).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory: Option<u64>,
}

/// EG's `logging.level`: a map from component ("default", "upstream", "http", …) to level.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Logging {
    #[serde(default)]
    pub level: BTreeMap<String, LogLevel>,
}

impl Logging {
    pub fn default_level(&self) -> LogLevel {
        self.level.get("default").copied().unwrap_or(LogLevel::Warn)
    }

    /// Component levels other than "default", for Envoy's `--component-log-level`.
    pub fn component_levels(&self) -> impl Iterator<Item = (&str, LogLevel)> {
        self.level
            .iter()
            .filter(|(c, _)| c.as_str() != "default")
            .map(|(c, l)| (c.as_str(), *l))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
    Off,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Off => "off",
        }
    }
}

/// EG's `shutdown`: how a retiring replica drains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Shutdown {
    /// The drain window: Envoy's `--drain-time-s`, and the longest a retiring replica is
    /// drained before it is removed with whatever connections it still has.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// The least time a retiring replica drains, even when its connections reach 0 sooner.
    #[serde(with = "humantime_serde")]
    pub min_drain_duration: Duration,
    /// How long a retiring replica keeps passing health checks after its drain began (EG's
    /// `healthCheckFailureDelay`): `/healthcheck/fail` is sent this long after
    /// `/drain_listeners?graceful`, for load balancers that probe the replica.
    #[serde(default, with = "humantime_serde")]
    pub health_check_failure_delay: Duration,
}

impl Default for Shutdown {
    fn default() -> Self {
        // EG's drain time; EG's 10 s minimum drain exists for Kubernetes endpoint propagation,
        // which a host port does not have: a closed listener gets no new connections at once.
        Shutdown {
            drain_timeout: Duration::from_secs(60),
            min_drain_duration: Duration::from_secs(1),
            health_check_failure_delay: Duration::ZERO,
        }
    }
}

/// EG's `bootstrap`: a user document merged into, or replacing, the rendered bootstrap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapOverride {
    #[serde(rename = "type")]
    pub kind: BootstrapOverrideKind,
    /// YAML (or JSON) text; for JSONPatch, a JSON Patch array.
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BootstrapOverrideKind {
    Merge,
    Replace,
    JSONPatch,
}
