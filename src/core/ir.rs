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

/// berth's rollout policy for one proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// How long a new replica may take to report /ready LIVE.
    #[serde(with = "humantime_serde")]
    pub startup_deadline: Duration,
    /// How long a new replica must stay ready before the old one is retired.
    #[serde(with = "humantime_serde")]
    pub min_ready: Duration,
    pub on_failure: OnFailure,
    /// How many new replicas start and are gated together ([`crate::core::rollout::surge`]).
    #[serde(default)]
    pub max_surge: crate::core::rollout::MaxSurge,
    /// Whether the gate judges a new replica's own traffic during `min_ready` against its
    /// siblings' ([`crate::core::rollout::judge`], [`crate::core::rollout::Thresholds::GATE`]).
    #[serde(default = "yes")]
    pub judge_traffic: bool,
    /// `[proxy.rollout.canary]`: the first replicas of the new spec are held beside the old
    /// ones and judged before the rest roll ([`crate::core::rollout::canary`]).
    #[serde(default)]
    pub canary: Option<crate::core::rollout::Canary>,
}

fn yes() -> bool {
    true
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        RolloutPolicy {
            startup_deadline: Duration::from_secs(30),
            min_ready: Duration::from_secs(2),
            on_failure: OnFailure::Rollback,
            max_surge: crate::core::rollout::MaxSurge::default(),
            judge_traffic: true,
            canary: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    #[default]
    Rollback,
    Pause,
}

/// Where a proxy's listeners, routes and clusters come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Routing {
    /// berth renders listener and cluster files that Envoy watches.
    Standalone(Standalone),
    /// Envoy Gateway pushes everything over ADS.
    Xds(XdsServer),
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Standalone {
    /// One entry per [`ProxyListener`], matched by name.
    pub listeners: Vec<ListenerRouting>,
    pub backends: Vec<Backend>,
}

impl Standalone {
    pub fn backend(&self, name: &str) -> Option<&Backend> {
        self.backends.iter().find(|b| b.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerRouting {
    /// The [`ProxyListener`] name this applies to.
    pub listener: String,
    /// TLS termination; present for HTTPS listeners and TLS-terminating TCP listeners. On an
    /// HTTPS listener whose virtual hosts carry certificates of their own, this one is served
    /// to clients whose SNI names none of them.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    pub traffic: Traffic,
    /// HTTP: WebSocket upgrades are passed to the backend.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub websocket: bool,
    #[serde(default)]
    pub access_log: AccessLog,
    /// The certificate is obtained from an ACME server instead of named files; `tls` then
    /// names berth's own copies in the state directory (see `crate::ops::acme`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<Acme>,
}

impl ListenerRouting {
    /// Every certificate this listener serves, each with the name of its SDS secret (also its
    /// directory under the state's `tls/`) and the SNI names that choose it: the listener's
    /// own (no names: the default) and each virtual host's, named `<listener>_<vhost>` (both
    /// are DNS labels, so the `_` keeps every name apart).
    pub fn certificates(&self) -> Vec<ListenerCertificate<'_>> {
        let mut out: Vec<ListenerCertificate<'_>> = self
            .tls
            .iter()
            .map(|files| ListenerCertificate {
                secret: self.listener.clone(),
                dir: self.listener.clone(),
                server_names: Vec::new(),
                files,
                acme_tls_alpn: false,
            })
            .collect();
        if let Traffic::Http { virtual_hosts } = &self.traffic {
            for vh in virtual_hosts {
                if let Some(files) = &vh.tls {
                    let secret = format!("{}_{}", self.listener, vh.name);
                    out.push(ListenerCertificate {
                        dir: secret.clone(),
                        secret,
                        server_names: vh.domains.iter().map(|d| d.to_ascii_lowercase()).collect(),
                        files,
                        acme_tls_alpn: false,
                    });
                }
            }
        }
        // TLS-ALPN-01 challenge certificates while a challenge is up; `__` keeps their names
        // apart from the virtual hosts' (DNS labels never start with `_`). Their copies go in
        // the listener's own directory: each directory is a mount made when a replica is
        // created, so one made for a challenge would not reach the running replicas (and
        // would change their spec).
        for (i, a) in self.acme.iter().flat_map(|a| &a.alpn_answers).enumerate() {
            out.push(ListenerCertificate {
                secret: format!("{}__acme-tls-alpn-{i}", self.listener),
                dir: self.listener.clone(),
                server_names: vec![a.domain.clone()],
                files: &a.files,
                acme_tls_alpn: true,
            });
        }
        out
    }
}

/// One certificate of a listener (see [`ListenerRouting::certificates`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerCertificate<'a> {
    pub secret: String,
    /// Its directory under the state's `tls/` (mounted at the same name under
    /// `layout::CONTAINER_TLS_DIR`): the secret's name, or the listener's for a TLS-ALPN-01
    /// challenge certificate.
    pub dir: String,
    /// Empty for the listener's default certificate.
    pub server_names: Vec<String>,
    pub files: &'a TlsFiles,
    /// A TLS-ALPN-01 challenge certificate: chosen by its name and ALPN `acme-tls/1` only.
    pub acme_tls_alpn: bool,
}

/// A listener's access log, written to the replica's stdout (so `berth logs` shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLog {
    Off,
    /// Envoy's default text format.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A listener certificate berth obtains and renews over ACME (RFC 8555), answering the CA's
/// challenges itself: HTTP-01 through a plain-HTTP listener of the same proxy, TLS-ALPN-01 on
/// the listener itself, or DNS-01 through a DNS solver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Acme {
    /// DNS names the certificate covers; the first is its subject.
    pub domains: Vec<String>,
    /// Contact for the account (expiry and revocation notices).
    #[serde(default)]
    pub email: Option<String>,
    /// The ACME directory URL.
    pub directory: String,
    /// CA certificates (PEM) that the directory's HTTPS certificate chains to, instead of the
    /// system roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The plain-HTTP listener of this proxy that answers HTTP-01 challenges (empty for the
    /// other challenges).
    pub challenge_listener: String,
    /// Which challenge berth answers.
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// TLS-ALPN-01 challenge certificates served while the CA validates (set by issuance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alpn_answers: Vec<AlpnAnswer>,
}

/// One TLS-ALPN-01 challenge certificate (RFC 8737), in the state directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlpnAnswer {
    pub domain: String,
    pub files: TlsFiles,
}

/// The ACME challenge a listener's certificate is proved with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcmeChallenge {
    /// `http-01`: an answer route on a plain-HTTP listener (port 80 for a public CA).
    #[default]
    Http01,
    /// `tls-alpn-01`: a challenge certificate on the listener itself for ALPN `acme-tls/1`.
    TlsAlpn01,
    /// `dns-01`: a `_acme-challenge` TXT record (the only one allowing wildcards).
    Dns01(Dns01),
}

impl AcmeChallenge {
    /// As the config spells it.
    pub fn name(&self) -> &'static str {
        match self {
            AcmeChallenge::Http01 => "http-01",
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            AcmeChallenge::Dns01(_) => "dns-01",
        }
    }
}

/// How DNS-01 TXT records are set and checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dns01 {
    pub provider: DnsProvider,
    /// Servers asked whether the record is visible; empty: the zone's authoritative servers.
    #[serde(default)]
    pub resolvers: Vec<std::net::SocketAddr>,
    /// The longest wait for the record to be visible before the CA is asked to validate.
    #[serde(with = "humantime_serde")]
    pub propagation_timeout: Duration,
    /// The pause between two visibility checks.
    #[serde(with = "humantime_serde")]
    pub propagation_interval: Duration,
    /// The TXT record's TTL in seconds.
    pub ttl: u32,
}

/// Who sets the TXT record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum DnsProvider {
    /// RFC 2136 dynamic updates signed with TSIG, sent to the zone's primary server.
    Rfc2136 {
        server: std::net::SocketAddr,
        /// The zone updated, e.g. `example.com`.
        zone: String,
        key_name: String,
        /// `hmac-sha256`, `hmac-sha384` or `hmac-sha512`.
        algorithm: String,
        /// The key's base64 secret, or a `tsig-keygen` key file; read at each issuance.
        secret_file: PathBuf,
    },
    /// A command run with `BERTH_ACME_*` variables to present and clean up the record.
    Hook {
        command: Vec<String>,
        /// `NAME=value` lines added to the command's environment (credentials).
        #[serde(default)]
        env_file: Option<PathBuf>,
        #[serde(with = "humantime_serde")]
        timeout: Duration,
    },
}

impl DnsProvider {
    /// As the config spells it.
    pub fn name(&self) -> &'static str {
        match self {
            DnsProvider::Rfc2136 { .. } => "rfc2136",
            DnsProvider::Hook { .. } => "hook",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Traffic {
    Http { virtual_hosts: Vec<VirtualHost> },
    Tcp { backend: String },
}

/// Certificate and key files on the host, mounted read-only into the replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualHost {
    pub name: String,
    /// Host header values; `["*"]` matches any.
    pub domains: Vec<String>,
    pub routes: Vec<Route>,
    /// HTTPS: this virtual host's own certificate, served to clients whose SNI is one of
    /// `domains`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    pub action: RouteAction,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub retries: Option<Retries>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteMatch {
    pub path: PathMatch,
    /// All must match (exact value comparison).
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PathMatch {
    Prefix(String),
    Exact(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderMatch {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum RouteAction {
    /// Forward to one backend, or split by weight across several.
    Forward {
        backends: Vec<WeightedBackend>,
    },
    DirectResponse {
        status: u16,
        body: String,
    },
    Redirect(Redirect),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WeightedBackend {
    pub name: String,
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Redirect {
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub path: Option<String>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retries {
    pub attempts: u32,
    /// Envoy `retry_on` conditions, e.g. ["5xx", "connect-failure"].
    pub on: Vec<String>,
    #[serde(default, with = "humantime_serde")]
    pub per_try_timeout: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    pub name: String,
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub lb_policy: LbPolicy,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    /// The protocol Envoy speaks to the endpoints (HTTP routes only).
    #[serde(default, skip_serializing_if = "BackendProtocol::is_http1")]
    pub protocol: BackendProtocol,
    /// TLS to the endpoints: verified against a CA, optionally with a client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BackendTls>,
}

/// What Envoy speaks to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendProtocol {
    /// HTTP/1.1.
    #[default]
    Http1,
    /// HTTP/2 (what gRPC needs): prior knowledge in cleartext, ALPN "h2" over TLS.
    H2,
}

impl BackendProtocol {
    pub fn is_http1(&self) -> bool {
        *self == BackendProtocol::Http1
    }
}

/// TLS from Envoy to a backend's endpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTls {
    /// PEM CA certificates the backend's certificate must chain to.
    pub ca_file: PathBuf,
    /// The server name sent (SNI) and required among the certificate's DNS names.
    pub sni: String,
    /// A client certificate to present (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<TlsFiles>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// An IP address or a DNS name.
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn is_ip(&self) -> bool {
        self.host.parse::<std::net::IpAddr>().is_ok()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LbPolicy {
    #[default]
    RoundRobin,
    LeastRequest,
    Random,
    RingHash,
    Maglev,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    pub path: String,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
}

/// The Envoy Gateway xDS server and the mTLS files to reach it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct XdsServer {
    pub address: String,
    pub port: u16,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}
