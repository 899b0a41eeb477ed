//! The standalone part of the template context: listeners, filter chains, route configurations
//! and clusters berth renders itself, with the secret files of listener and backend TLS.

use super::*;

/// Envoy's default cap on `direct_response` bodies; berth raises it when a body is larger.
const ENVOY_DEFAULT_MAX_DIRECT_RESPONSE_BODY: usize = 4096;

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

pub(super) fn standalone(
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
        crate::core::render::alpn::ordinary_chains(&mut sni_chains, tls.as_ref(), proved);
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
