//! The template context: the IR reshaped into exactly what the templates print, with every
//! decision (cluster types, enum names, duration strings, file paths) made here in Rust, so
//! templates stay declarative and an override template gets the same facts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::core::ir::{self, LbPolicy, PathMatch, Protocol, RouteAction, Routing, Traffic};
use crate::core::layout;

/// Envoy's default cap on `direct_response` bodies; berth raises it when a body is larger.
const ENVOY_DEFAULT_MAX_DIRECT_RESPONSE_BODY: usize = 4096;
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

fn lb_policy(p: LbPolicy) -> &'static str {
    match p {
        LbPolicy::RoundRobin => "ROUND_ROBIN",
        LbPolicy::LeastRequest => "LEAST_REQUEST",
        LbPolicy::Random => "RANDOM",
        LbPolicy::RingHash => "RING_HASH",
        LbPolicy::Maglev => "MAGLEV",
    }
}

fn redirect_code(status: u16) -> Result<&'static str> {
    Ok(match status {
        301 => "MOVED_PERMANENTLY",
        302 => "FOUND",
        303 => "SEE_OTHER",
        307 => "TEMPORARY_REDIRECT",
        308 => "PERMANENT_REDIRECT",
        other => {
            bail!("redirect status {other} is not one Envoy supports (301, 302, 303, 307, 308)")
        }
    })
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

fn standalone(
    proxy: &ir::ProxyInfra,
    s: &ir::Standalone,
    versions: &BTreeMap<String, String>,
    ctx: &mut Ctx,
) -> Result<()> {
    let known: BTreeSet<&str> = proxy.listeners.iter().map(|l| l.name.as_str()).collect();
    for r in &s.listeners {
        if !known.contains(r.listener.as_str()) {
            bail!(
                "routing refers to listener {:?}, which the proxy does not have",
                r.listener
            );
        }
    }
    let backend = |name: &str, what: &str| -> Result<String> {
        match s.backend(name) {
            Some(b) => Ok(b.name.clone()),
            None => bail!("{what} refers to backend {name:?}, which is not defined"),
        }
    };
    for l in &proxy.listeners {
        let Some(r) = s.listeners.iter().find(|r| r.listener == l.name) else {
            bail!(
                "listener {:?} has no routing (routes or a TCP backend)",
                l.name
            );
        };
        let mut sni_chains = Vec::new();
        let mut tls = None;
        for c in r.certificates() {
            let (cert, key) = match versions.get(&c.secret) {
                Some(v) => (format!("cert-{v}.pem"), format!("key-{v}.pem")),
                None => ("cert.pem".to_string(), "key.pem".to_string()),
            };
            let file = listener_secret_file(&c.secret);
            let view = TlsView {
                secret: c.secret.clone(),
                sds: format!("{}/{file}", layout::CONTAINER_XDS_DIR),
                cert: layout::container_tls_file(&c.dir, &cert),
                key: layout::container_tls_file(&c.dir, &key),
            };
            ctx.secrets.push(SecretView {
                file,
                tls: view.clone(),
            });
            if c.server_names.is_empty() {
                tls = Some(view);
            } else {
                sni_chains.push(ChainView {
                    server_names: c.server_names,
                    tls: Some(view),
                    acme_tls_alpn: c.acme_tls_alpn,
                });
            }
        }
        let proved: &[String] = match &r.acme {
            Some(a) if a.challenge == ir::AcmeChallenge::TlsAlpn01 => &a.domains,
            _ => &[],
        };
        super::alpn::ordinary_chains(&mut sni_chains, tls.as_ref(), proved);
        let address = l.bind_address();
        let access_log = match r.access_log {
            ir::AccessLog::Off => None,
            ir::AccessLog::Text => Some("text"),
            ir::AccessLog::Json => Some("json"),
        };
        for p in &l.ports {
            let name = if l.ports.len() == 1 {
                l.name.clone()
            } else {
                format!("{}-{}", l.name, p.container_port)
            };
            let ok = matches!(
                (p.protocol, &r.traffic),
                (Protocol::Http | Protocol::Https, Traffic::Http { .. })
                    | (Protocol::Tcp | Protocol::Tls, Traffic::Tcp { .. })
            );
            if !ok {
                bail!(
                    "listener {:?} port {} is {:?} but its routing is {}",
                    l.name,
                    p.container_port,
                    p.protocol,
                    match r.traffic {
                        Traffic::Http { .. } => "HTTP routes",
                        Traffic::Tcp { .. } => "a TCP backend",
                    }
                );
            }
            if matches!(p.protocol, Protocol::Https | Protocol::Tls) && tls.is_none() {
                bail!(
                    "listener {:?} port {} is {:?} but has no certificate and key",
                    l.name,
                    p.container_port,
                    p.protocol
                );
            }
            let mut chains = sni_chains.clone();
            chains.push(ChainView {
                server_names: Vec::new(),
                tls: tls.clone(),
                acme_tls_alpn: false,
            });
            let mut view = ListenerView {
                name,
                address: address.to_string(),
                ipv4_compat: address == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                port: p.container_port,
                kind: "http",
                sni: !sni_chains.is_empty(),
                chains,
                websocket: r.websocket,
                access_log,
                route_config: None,
                rds_path: None,
                cluster: None,
            };
            match &r.traffic {
                Traffic::Http { .. } => {
                    view.route_config = Some(l.name.clone());
                    view.rds_path = Some(format!(
                        "{}/{}",
                        layout::CONTAINER_XDS_DIR,
                        layout::rds_file(&l.name)
                    ));
                }
                Traffic::Tcp { backend: b } => {
                    view.kind = "tcp";
                    view.cluster = Some(backend(b, &format!("TCP listener {:?}", l.name))?);
                }
            }
            ctx.listeners.push(view);
        }
        if let Traffic::Http { virtual_hosts } = &r.traffic {
            let mut max_body = 0;
            let mut vhosts = vec![];
            for vh in virtual_hosts {
                let mut routes = vec![];
                for (i, rt) in vh.routes.iter().enumerate() {
                    let what = format!("route {i} of virtual host {:?}", vh.name);
                    let mut v = RouteView {
                        prefix: None,
                        path: None,
                        headers: rt
                            .matcher
                            .headers
                            .iter()
                            .map(|h| HeaderView {
                                name: h.name.clone(),
                                value: h.value.clone(),
                            })
                            .collect(),
                        action: "route",
                        cluster: None,
                        weighted_clusters: vec![],
                        timeout: None,
                        retry: None,
                        direct_response: None,
                        redirect: None,
                    };
                    match &rt.matcher.path {
                        PathMatch::Prefix(p) => v.prefix = Some(p.clone()),
                        PathMatch::Exact(p) => v.path = Some(p.clone()),
                    }
                    match &rt.action {
                        RouteAction::Forward { backends } => {
                            v.action = "route";
                            match backends.as_slice() {
                                [] => bail!("{what} forwards to no backend"),
                                [one] => v.cluster = Some(backend(&one.name, &what)?),
                                many => {
                                    if many.iter().all(|b| b.weight == 0) {
                                        bail!("{what}: the backend weights add up to 0");
                                    }
                                    for b in many {
                                        v.weighted_clusters.push(WeightedView {
                                            name: backend(&b.name, &what)?,
                                            weight: b.weight,
                                        });
                                    }
                                }
                            }
                            // Envoy's default 15 s would cut every gRPC stream that lasts
                            // longer; h2 backends get none unless the route sets one.
                            let all_h2 = backends.iter().all(|b| {
                                s.backend(&b.name)
                                    .is_some_and(|b| b.protocol == ir::BackendProtocol::H2)
                            });
                            v.timeout = match rt.timeout {
                                Some(t) => Some(duration(t)),
                                None if all_h2 => Some(duration(Duration::ZERO)),
                                None => None,
                            };
                            v.retry = rt.retries.as_ref().map(|r| RetryView {
                                retry_on: (!r.on.is_empty()).then(|| r.on.join(",")),
                                num_retries: r.attempts,
                                per_try_timeout: r.per_try_timeout.map(duration),
                            });
                        }
                        RouteAction::DirectResponse { status, body } => {
                            v.action = "direct_response";
                            max_body = max_body.max(body.len());
                            v.direct_response = Some(DirectResponseView {
                                status: *status,
                                body: body.clone(),
                            });
                        }
                        RouteAction::Redirect(r) => {
                            v.action = "redirect";
                            v.redirect = Some(RedirectView {
                                scheme: r.scheme.clone(),
                                host: r.host.clone(),
                                port: r.port,
                                path: r.path.clone(),
                                response_code: redirect_code(r.status)
                                    .map_err(|e| e.context(what.clone()))?,
                            });
                        }
                    }
                    routes.push(v);
                }
                vhosts.push(VirtualHostView {
                    name: vh.name.clone(),
                    domains: vh.domains.clone(),
                    routes,
                });
            }
            ctx.route_configs.push(RouteConfigView {
                name: l.name.clone(),
                max_direct_response_body_size_bytes: (max_body
                    > ENVOY_DEFAULT_MAX_DIRECT_RESPONSE_BODY)
                    .then_some(max_body),
                virtual_hosts: vhosts,
            });
        }
    }
    for b in &s.backends {
        if b.endpoints.is_empty() {
            bail!("backend {:?} has no endpoints", b.name);
        }
        ctx.clusters.push(ClusterView {
            name: b.name.clone(),
            kind: if b.endpoints.iter().all(|e| e.is_ip()) {
                "STATIC"
            } else {
                "STRICT_DNS"
            },
            lb_policy: lb_policy(b.lb_policy),
            connect_timeout: duration(b.connect_timeout),
            endpoints: b
                .endpoints
                .iter()
                .map(|e| EndpointView {
                    host: e.host.clone(),
                    port: e.port,
                })
                .collect(),
            health_check: b.health_check.as_ref().map(|h| HealthCheckView {
                path: h.path.clone(),
                interval: duration(h.interval),
                timeout: duration(h.timeout),
                healthy_threshold: h.healthy_threshold,
                unhealthy_threshold: h.unhealthy_threshold,
            }),
            http2: b.protocol == ir::BackendProtocol::H2,
            tls: b
                .tls
                .as_ref()
                .map(|t| backend_tls(b, t, versions, &mut ctx.backend_secrets)),
        });
    }
    Ok(())
}

/// A backend's upstream TLS view, pushing its secret files. `versions` names the checked
/// copies by owner ([`backend_tls_owner`]); without one the files are `ca.pem`, `cert.pem`,
/// `key.pem`.
fn backend_tls(
    b: &ir::Backend,
    t: &ir::BackendTls,
    versions: &BTreeMap<String, String>,
    secrets: &mut Vec<BackendSecretView>,
) -> UpstreamTlsView {
    let owner = backend_tls_owner(&b.name);
    let file = |stem: &str| match versions.get(&owner) {
        Some(v) => layout::container_tls_file(&owner, &format!("{stem}-{v}.pem")),
        None => layout::container_tls_file(&owner, &format!("{stem}.pem")),
    };
    let sds = |kind: &str| {
        let file = backend_secret_file(&b.name, kind);
        let r = SdsRef {
            name: format!("{owner}.{kind}"),
            sds: format!("{}/{file}", layout::CONTAINER_XDS_DIR),
        };
        (file, r)
    };
    let (ca_file, ca) = sds("ca");
    secrets.push(BackendSecretView {
        file: ca_file,
        kind: "ca",
        name: ca.name.clone(),
        ca: Some(file("ca")),
        san: Some(t.sni.clone()),
        cert: None,
        key: None,
    });
    let client = t.client.as_ref().map(|_| {
        let (client_file, client) = sds("client");
        secrets.push(BackendSecretView {
            file: client_file,
            kind: "client",
            name: client.name.clone(),
            ca: None,
            san: None,
            cert: Some(file("cert")),
            key: Some(file("key")),
        });
        client
    });
    UpstreamTlsView {
        sni: t.sni.clone(),
        alpn: match b.protocol {
            ir::BackendProtocol::H2 => vec!["h2"],
            ir::BackendProtocol::Http1 => vec!["http/1.1"],
        },
        ca,
        client,
    }
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
