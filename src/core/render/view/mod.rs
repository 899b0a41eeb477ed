//! The template context: the IR reshaped into exactly what the templates print, with every
//! decision (cluster types, enum names, duration strings, file paths) made here in Rust, so
//! templates stay declarative and an override template gets the same facts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::core::ir::{self, LbPolicy, PathMatch, Protocol, RouteAction, Routing, Traffic};
use crate::core::layout;

mod standalone;

use standalone::standalone;

/// Envoy Gateway's global downstream connection limit.
const MAX_DOWNSTREAM_CONNECTIONS: u64 = 50_000;

/// File (in the watched directory) of the xDS client certificate secret, xds mode.
pub const SDS_XDS_CERTIFICATE_FILE: &str = "sds-xds-certificate.yaml";
/// File (in the watched directory) of the xDS server CA secret, xds mode.
pub const SDS_XDS_TRUSTED_CA_FILE: &str = "sds-xds-trusted-ca.yaml";

#[derive(Debug, Serialize)]
pub struct Ctx {
    pub proxy: ProxyView,
    /// "standalone" or "xds".
    pub mode: &'static str,
    pub paths: Paths,
    pub overload: Overload,
    pub xds: Option<XdsView>,
    pub listeners: Vec<ListenerView>,
    pub route_configs: Vec<RouteConfigView>,
    pub clusters: Vec<ClusterView>,
    /// Standalone: one SDS secret per TLS listener.
    pub secrets: Vec<SecretView>,
    /// Standalone: the SDS secrets of backends' TLS (a CA, a client certificate).
    pub backend_secrets: Vec<BackendSecretView>,
}

#[derive(Debug, Serialize)]
pub struct ProxyView {
    pub name: String,
    pub namespace: String,
    /// The node cluster Envoy announces (EG's IR key for EG-driven proxies).
    pub cluster: String,
}

#[derive(Debug, Serialize)]
pub struct Paths {
    pub admin_socket: &'static str,
    /// 0600, in decimal as Envoy's `pipe.mode` wants it.
    pub admin_socket_mode: u32,
    pub xds_dir: &'static str,
    pub lds: String,
    pub cds: String,
    pub sds_xds_certificate: String,
    pub sds_xds_trusted_ca: String,
}

#[derive(Debug, Serialize)]
pub struct Overload {
    pub max_downstream_connections: u64,
    /// 80% of the memory limit, when one is set.
    pub max_heap_size_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct XdsView {
    pub address: String,
    pub port: u16,
    /// STATIC for an IP address, STRICT_DNS for a name.
    pub cluster_type: &'static str,
    pub cert: String,
    pub key: String,
    pub ca: String,
    /// The directory holding the mounted xDS TLS files, watched for rotation.
    pub tls_dir: String,
}

#[derive(Debug, Serialize)]
pub struct ListenerView {
    /// The Envoy listener name (the IR listener name, suffixed with the port when it has
    /// several).
    pub name: String,
    /// The IP address it binds ("0.0.0.0" unless the listener names one).
    pub address: String,
    /// "::" binds IPv4 too (`ipv4_compat`), as a dual-stack socket does on Linux.
    pub ipv4_compat: bool,
    pub port: u16,
    /// "http" or "tcp".
    pub kind: &'static str,
    /// The filter chains: one per virtual host with its own certificate (chosen by SNI),
    /// then the default one.
    pub chains: Vec<ChainView>,
    /// Some chain is chosen by SNI, so the listener needs the TLS inspector.
    pub sni: bool,
    /// HTTP: WebSocket upgrades pass.
    pub websocket: bool,
    /// "text", "json", or None for no access log.
    pub access_log: Option<&'static str>,
    /// HTTP: the RDS route configuration name…
    pub route_config: Option<String>,
    /// …and the watched file that holds it ([`layout::rds_file`]).
    pub rds_path: Option<String>,
    /// TCP: the cluster to proxy to.
    pub cluster: Option<String>,
}

#[derive(Debug, Serialize, Clone)]
pub struct ChainView {
    /// SNI names choosing this chain; empty for the default chain.
    pub server_names: Vec<String>,
    pub tls: Option<TlsView>,
    /// A TLS-ALPN-01 challenge chain: chosen (and answering) by ALPN `acme-tls/1` only.
    pub acme_tls_alpn: bool,
}

#[derive(Debug, Serialize, Clone)]
pub struct TlsView {
    /// The SDS secret's name (the listener's).
    pub secret: String,
    /// The SDS file in the watched directory that holds the secret.
    pub sds: String,
    pub cert: String,
    pub key: String,
}

/// A listener's certificate secret: one `sds-<listener>.yaml` in the watched directory.
#[derive(Debug, Serialize, Clone)]
pub struct SecretView {
    /// The file name in the watched directory.
    pub file: String,
    pub tls: TlsView,
}

/// The watched-directory file holding the certificate of `listener`.
/// A name that is not a plain file name is replaced by a digest of it.
pub fn listener_secret_file(listener: &str) -> String {
    let plain = !listener.is_empty()
        && !listener.starts_with('.')
        && listener
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if plain {
        format!("sds-{listener}.yaml")
    } else {
        use sha2::Digest;
        let digest = hex::encode(sha2::Sha256::digest(listener.as_bytes()));
        format!("sds-{}.yaml", &digest[..16])
    }
}

#[derive(Debug, Serialize)]
pub struct RouteConfigView {
    pub name: String,
    pub max_direct_response_body_size_bytes: Option<usize>,
    pub virtual_hosts: Vec<VirtualHostView>,
}

#[derive(Debug, Serialize)]
pub struct VirtualHostView {
    pub name: String,
    pub domains: Vec<String>,
    pub routes: Vec<RouteView>,
}

#[derive(Debug, Serialize)]
pub struct RouteView {
    pub prefix: Option<String>,
    pub path: Option<String>,
    pub headers: Vec<HeaderView>,
    /// "route", "direct_response" or "redirect".
    pub action: &'static str,
    /// route: a single cluster…
    pub cluster: Option<String>,
    /// …or weighted clusters (two or more).
    pub weighted_clusters: Vec<WeightedView>,
    pub timeout: Option<String>,
    pub retry: Option<RetryView>,
    pub direct_response: Option<DirectResponseView>,
    pub redirect: Option<RedirectView>,
}

#[derive(Debug, Serialize)]
pub struct HeaderView {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Serialize)]
pub struct WeightedView {
    pub name: String,
    pub weight: u32,
}

#[derive(Debug, Serialize)]
pub struct RetryView {
    /// Conditions joined with commas; None when the IR lists none (Envoy's default applies).
    pub retry_on: Option<String>,
    pub num_retries: u32,
    pub per_try_timeout: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DirectResponseView {
    pub status: u16,
    pub body: String,
}

#[derive(Debug, Serialize)]
pub struct RedirectView {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<String>,
    /// Envoy's RedirectResponseCode enum name.
    pub response_code: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ClusterView {
    pub name: String,
    /// STATIC when every endpoint is an IP address, else STRICT_DNS.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub lb_policy: &'static str,
    pub connect_timeout: String,
    pub endpoints: Vec<EndpointView>,
    pub health_check: Option<HealthCheckView>,
    /// HTTP/2 to the endpoints (prior knowledge, or ALPN "h2" over TLS).
    pub http2: bool,
    pub tls: Option<UpstreamTlsView>,
}

/// TLS to a backend: the secrets live in the watched directory, so they rotate live.
#[derive(Debug, Serialize)]
pub struct UpstreamTlsView {
    pub sni: String,
    pub alpn: Vec<&'static str>,
    /// The validation context (CA and the SAN to match).
    pub ca: SdsRef,
    /// The client certificate, for backends that require one.
    pub client: Option<SdsRef>,
}

/// A secret read from a file in the watched directory.
#[derive(Debug, Serialize, Clone)]
pub struct SdsRef {
    pub name: String,
    pub sds: String,
}

/// One backend secret file: a validation context (`kind` "ca": `ca`, `san`) or a client
/// certificate (`kind` "client": `cert`, `key`).
#[derive(Debug, Serialize)]
pub struct BackendSecretView {
    pub file: String,
    pub kind: &'static str,
    pub name: String,
    pub ca: Option<String>,
    pub san: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// The directory (under the state's and the container's `tls/`) of a backend's TLS files,
/// and the key of its version in the map [`build`] takes. Listener names (DNS labels) never
/// contain a dot, so the two never meet.
pub fn backend_tls_owner(backend: &str) -> String {
    format!("backend.{backend}")
}

/// The watched-directory file of a backend secret (`kind` "ca" or "client").
pub fn backend_secret_file(backend: &str, kind: &str) -> String {
    let plain = !backend.is_empty()
        && backend
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if plain {
        format!("sds-backend.{backend}.{kind}.yaml")
    } else {
        use sha2::Digest;
        let digest = hex::encode(sha2::Sha256::digest(backend.as_bytes()));
        format!("sds-backend.{}.{kind}.yaml", &digest[..16])
    }
}

#[derive(Debug, Serialize)]
pub struct EndpointView {
    pub host: String,
    pub port: u16,
}

#[derive(Debug, Serialize)]
pub struct HealthCheckView {
    pub path: String,
    pub interval: String,
    pub timeout: String,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
}

/// An Envoy (protobuf JSON) duration string: "5s", "0.500s", "0.000001500s".
pub fn duration(d: Duration) -> String {
    let (s, n) = (d.as_secs(), d.subsec_nanos());
    if n == 0 {
        format!("{s}s")
    } else if n % 1_000_000 == 0 {
        format!("{s}.{:03}s", n / 1_000_000)
    } else if n % 1_000 == 0 {
        format!("{s}.{:06}s", n / 1_000)
    } else {
        format!("{s}.{n:09}s")
    }
}

fn is_ip(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
}

/// The template context of one proxy. `versions` names each TLS listener's certificate copy
/// ([`crate::core::certificates::Certificate::version`]); a listener missing from it reads
/// `cert.pem`/`key.pem`.
pub fn build(proxy: &ir::ProxyInfra, versions: &BTreeMap<String, String>) -> Result<Ctx> {
    let xds_dir = layout::CONTAINER_XDS_DIR;
    let in_xds = |f: &str| format!("{xds_dir}/{f}");
    let mut ctx = Ctx {
        proxy: ProxyView {
            name: proxy.name.clone(),
            namespace: proxy.namespace.clone(),
            cluster: proxy.service_cluster().to_string(),
        },
        mode: "standalone",
        paths: Paths {
            admin_socket: layout::CONTAINER_ADMIN_SOCKET,
            admin_socket_mode: 0o600,
            xds_dir,
            lds: in_xds(layout::LDS_FILE),
            cds: in_xds(layout::CDS_FILE),
            sds_xds_certificate: in_xds(SDS_XDS_CERTIFICATE_FILE),
            sds_xds_trusted_ca: in_xds(SDS_XDS_TRUSTED_CA_FILE),
        },
        overload: Overload {
            max_downstream_connections: MAX_DOWNSTREAM_CONNECTIONS,
            max_heap_size_bytes: proxy
                .config
                .resources
                .memory
                .map(|m| (u128::from(m) * 4 / 5) as u64),
        },
        xds: None,
        listeners: vec![],
        route_configs: vec![],
        clusters: vec![],
        secrets: vec![],
        backend_secrets: vec![],
    };
    match &proxy.routing {
        Routing::Xds(x) => {
            ctx.mode = "xds";
            ctx.xds = Some(XdsView {
                address: x.address.clone(),
                port: x.port,
                cluster_type: if is_ip(&x.address) {
                    "STATIC"
                } else {
                    "STRICT_DNS"
                },
                cert: layout::container_tls_file("xds", "cert.pem"),
                key: layout::container_tls_file("xds", "key.pem"),
                ca: layout::container_tls_file("xds", "ca.pem"),
                tls_dir: format!("{}/xds", layout::CONTAINER_TLS_DIR),
            });
        }
        Routing::Standalone(s) => standalone(proxy, s, versions, &mut ctx)?,
    }
    Ok(ctx)
}

#[cfg(test)]
mod tests {
    use super::duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(duration(Duration::from_secs(5)), "5s");
        assert_eq!(duration(Duration::from_millis(500)), "0.500s");
        assert_eq!(duration(Duration::from_millis(1500)), "1.500s");
        assert_eq!(duration(Duration::from_micros(1500)), "0.001500s");
        assert_eq!(duration(Duration::from_nanos(1)), "0.000000001s");
        assert_eq!(duration(Duration::ZERO), "0s");
    }
}
