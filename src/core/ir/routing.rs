//! The IR's routing model: standalone listeners, virtual hosts, routes and backends that berth
//! renders itself, or the Envoy Gateway xDS server a proxy takes its routes from.

use super::*;

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
