//! Listeners and virtual hosts: standalone routing or xds mode, per proxy.

use std::collections::BTreeMap;

use crate::core::ir;

use super::backend::{backend, pem, xds_server, BACKEND_KEYS};
use super::check::{self, show};
use super::doc::{self, Ctx, Item, Span, Tbl};
use super::fields::{name, unique, BackendRef, Ports};
use super::route::routes;

const LISTENER_KEYS: &[&str] = &[
    "name",
    "port",
    "protocol",
    "tls",
    "route",
    "virtual_host",
    "backend",
    "address",
    "websocket",
    "access_log",
];
const VHOST_KEYS: &[&str] = &["name", "domains", "route", "tls"];
const TLS_KEYS: &[&str] = &["cert_file", "key_file"];
/// A listener (not a virtual host) may also ask for its certificate over ACME.
const LISTENER_TLS_KEYS: &[&str] = &["cert_file", "key_file", "acme"];

pub(super) fn routing(
    cx: &mut Ctx,
    p: &Tbl,
    ports: &mut Ports,
) -> (Vec<ir::ProxyListener>, ir::Routing) {
    let xds = p.get("xds").is_some();
    let listeners = p.tables(cx, "listener", LISTENER_KEYS);
    let mut names = BTreeMap::new();
    let mut refs = Vec::new();
    let mut proxy_listeners = Vec::new();
    let mut routings = Vec::new();
    for l in &listeners {
        let (pl, lr) = listener(cx, l, xds, ports, &mut names, &mut refs);
        proxy_listeners.push(pl);
        routings.extend(lr);
    }
    if xds {
        if p.get("backend").is_some() {
            cx.err(
                &p.key_span("backend"),
                &p.field("backend"),
                "backends are not allowed in xds mode (Envoy Gateway provides clusters); remove [[proxy.backend]] or [proxy.xds]",
            );
        }
        let server = xds_server(cx, p);
        return (proxy_listeners, ir::Routing::Xds(server));
    }
    if listeners.is_empty() && p.get("listener").is_none() {
        cx.err(
            &p.span,
            &p.field("listener"),
            "a proxy needs at least one listener: add [[proxy.listener]] with name, port and protocol (or use [proxy.xds])",
        );
    }
    let mut backend_names = BTreeMap::new();
    let backends: Vec<ir::Backend> = p
        .tables(cx, "backend", BACKEND_KEYS)
        .iter()
        .map(|b| backend(cx, b, &mut backend_names))
        .collect();
    for r in refs {
        if r.name.v.is_empty() || backend_names.contains_key(&r.name.v) {
            continue;
        }
        let defined: Vec<&str> = backend_names.keys().map(String::as_str).collect();
        let msg = if defined.is_empty() {
            format!(
                "unknown backend {}: this proxy defines no backends; add a [[proxy.backend]] with that name",
                show(&r.name.v)
            )
        } else {
            format!(
                "unknown backend {}; defined backends in this proxy: {}",
                show(&r.name.v),
                defined.join(", ")
            )
        };
        r.name.err(cx, msg);
    }
    super::acme::challenge_listeners(cx, &listeners, &mut routings);
    let standalone = ir::Standalone {
        listeners: routings,
        backends,
    };
    (proxy_listeners, ir::Routing::Standalone(standalone))
}

fn listener(
    cx: &mut Ctx,
    t: &Tbl,
    xds: bool,
    ports: &mut Ports,
    names: &mut BTreeMap<String, Span>,
    refs: &mut Vec<BackendRef>,
) -> (ir::ProxyListener, Option<ir::ListenerRouting>) {
    let name = name(cx, t, "web");
    unique(cx, names, &name, "listener");
    let port = match t.require(cx, "port", "1–65535") {
        Some(v) => doc::int(cx, v, t.field("port"), 1, 65535),
        None => None,
    };
    if let Some(p) = &port {
        ports.claim(cx, p);
    }
    let port = port.map_or(0, |p| p.v as u16);
    let protocol = match t.str(cx, "protocol") {
        None => "http",
        Some(s) => match s.v {
            "http" | "https" | "tcp" => s.v,
            other => {
                s.err(
                    cx,
                    format!("must be one of http, https, tcp; got {}", show(other)),
                );
                "http"
            }
        },
    };
    let mut ir_protocol = match protocol {
        "https" => ir::Protocol::Https,
        "tcp" => ir::Protocol::Tcp,
        _ => ir::Protocol::Http,
    };
    let address = bind_address(cx, t);
    let mut routing = None;
    if xds {
        for key in [
            "tls",
            "route",
            "virtual_host",
            "backend",
            "websocket",
            "access_log",
        ] {
            if t.get(key).is_some() {
                cx.err(
                    &t.key_span(key),
                    &t.field(key),
                    "not allowed in xds mode: Envoy Gateway provides routes, backends, TLS and access logs; a listener has only name, port, protocol and address",
                );
            }
        }
    } else {
        let mut acme = None;
        let tls = t.sub(cx, "tls", LISTENER_TLS_KEYS).map(|tls| {
            if tls.get("acme").is_none() {
                return tls_files(cx, &tls);
            }
            acme = super::acme::acme(cx, &tls);
            // berth's own copies in the state directory, named once it is known.
            ir::TlsFiles {
                cert_file: Default::default(),
                key_file: Default::default(),
            }
        });
        let websocket = t.bool(cx, "websocket");
        let access_log = access_log(cx, t);
        let traffic = if protocol == "tcp" {
            if let Some(w) = &websocket {
                w.err(cx, "WebSocket upgrades are HTTP; a tcp listener passes any stream through as it is");
            }
            for key in ["route", "virtual_host"] {
                if t.get(key).is_some() {
                    cx.err(
                        &t.key_span(key),
                        &t.field(key),
                        "a tcp listener forwards to one backend (backend = \"name\"); routes need protocol = \"http\" or \"https\"",
                    );
                }
            }
            if tls.is_some() {
                ir_protocol = ir::Protocol::Tls;
            }
            let backend =
                match t.req_str(cx, "backend", "the backend this tcp listener forwards to") {
                    Some(b) => {
                        let item = Item::new(b.v.to_string(), b.span, b.field);
                        refs.push(BackendRef { name: item });
                        b.v.to_string()
                    }
                    None => String::new(),
                };
            ir::Traffic::Tcp { backend }
        } else {
            if protocol == "http" && tls.is_some() {
                cx.err(
                    &t.key_span("tls"),
                    &t.field("tls"),
                    "TLS termination needs protocol = \"https\" (or \"tcp\" for TLS over TCP)",
                );
            }
            if protocol == "https" && tls.is_none() {
                cx.err(
                    &t.span,
                    &t.field("tls"),
                    "an https listener needs tls = { cert_file = \"cert.pem\", key_file = \"key.pem\" } or tls = { acme = { domains = [\"example.com\"], directory = \"https://…\" } }",
                );
            }
            if t.get("backend").is_some() {
                cx.err(
                    &t.key_span("backend"),
                    &t.field("backend"),
                    "backend on a listener is for protocol = \"tcp\"; http listeners forward with [[proxy.listener.route]] backend = \"name\"",
                );
            }
            ir::Traffic::Http {
                virtual_hosts: virtual_hosts(cx, t, &name.v, protocol == "https", refs),
            }
        };
        routing = Some(ir::ListenerRouting {
            listener: name.v.clone(),
            tls,
            traffic,
            websocket: websocket.is_some_and(|w| w.v),
            access_log,
            acme,
        });
    }
    let proto_name = format!("{ir_protocol:?}").to_lowercase();
    let pl = ir::ProxyListener {
        name: name.v,
        ports: vec![ir::ListenerPort {
            name: format!("{proto_name}-{port}"),
            protocol: ir_protocol,
            service_port: port,
            container_port: port,
        }],
        address,
    };
    (pl, routing)
}

fn tls_files(cx: &mut Ctx, tls: &Tbl) -> ir::TlsFiles {
    ir::TlsFiles {
        cert_file: pem(cx, tls, "cert_file", "CERTIFICATE"),
        key_file: pem(cx, tls, "key_file", "PRIVATE KEY"),
    }
}

/// `address`: an IPv4 or IPv6 address of this host; None (0.0.0.0) when absent.
fn bind_address(cx: &mut Ctx, t: &Tbl) -> Option<std::net::IpAddr> {
    let a = t.str(cx, "address")?;
    match a.v.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_multicast() => {
            a.err(cx, format!("{} is a multicast address; give an address of this host, e.g. \"127.0.0.1\", \"::1\", \"0.0.0.0\" or \"::\"", show(a.v)));
            None
        }
        Ok(ip) => Some(ip),
        Err(_) => {
            a.err(cx, format!("must be an IP address of this host (IPv4 like \"127.0.0.1\" or \"0.0.0.0\", IPv6 like \"::1\" or \"::\", without brackets or port); got {}", show(a.v)));
            None
        }
    }
}

fn access_log(cx: &mut Ctx, t: &Tbl) -> ir::AccessLog {
    let Some(a) = t.str(cx, "access_log") else {
        return ir::AccessLog::default();
    };
    match a.v {
        "off" => ir::AccessLog::Off,
        "text" => ir::AccessLog::Text,
        "json" => ir::AccessLog::Json,
        other => {
            a.err(
                cx,
                format!("must be one of text, json, off; got {}", show(other)),
            );
            ir::AccessLog::default()
        }
    }
}

/// The name a client sends in SNI for `domain`, or why a certificate cannot be chosen by it:
/// Envoy matches server names exactly or by a leading `*.` wildcard, never an IP or a port.
fn server_name(domain: &str) -> Result<String, String> {
    let name = domain.to_ascii_lowercase();
    if name == "*" {
        return Err("\"*\" matches any Host header but is no server name a certificate can be chosen by; move this certificate to the listener's tls (served when no virtual host's name matches) or list the names".into());
    }
    if name.contains(':') || name.starts_with('[') {
        return Err(format!("{}: a virtual host with its own certificate lists host names without a port (clients send no port in SNI)", show(domain)));
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(format!("{}: clients send no IP address in SNI, so no certificate can be chosen by it; serve IP clients with the listener's tls", show(domain)));
    }
    let wild_ok = name.strip_prefix("*.").is_some_and(|r| !r.contains('*'));
    if name.contains('*') && !wild_ok {
        return Err(format!("{}: a certificate is chosen by an exact name or a leading \"*.\" wildcard (\"*.example.com\"); other wildcards cannot select one", show(domain)));
    }
    Ok(name)
}

fn virtual_hosts(
    cx: &mut Ctx,
    l: &Tbl,
    listener: &str,
    https: bool,
    refs: &mut Vec<BackendRef>,
) -> Vec<ir::VirtualHost> {
    let has_routes = l.get("route").is_some();
    let has_vhosts = l.get("virtual_host").is_some();
    if has_routes && has_vhosts {
        cx.err(
            &l.key_span("virtual_host"),
            &l.field("virtual_host"),
            "use either routes directly under the listener or virtual hosts, not both; put catch-all routes in a virtual_host with domains = [\"*\"]",
        );
    }
    if !has_routes && !has_vhosts {
        cx.err(
            &l.span,
            &l.field("route"),
            "an http listener needs at least one route: add [[proxy.listener.route]] (or [[proxy.listener.virtual_host]])",
        );
        return Vec::new();
    }
    if has_routes {
        let routes = routes(cx, l, refs);
        return vec![ir::VirtualHost {
            name: listener.to_string(),
            domains: vec!["*".to_string()],
            routes,
            tls: None,
        }];
    }
    let mut names = BTreeMap::new();
    let mut domains_seen: BTreeMap<String, Span> = BTreeMap::new();
    // Server names of the virtual hosts' certificates: where each was first given.
    let mut server_names: BTreeMap<String, (String, Span)> = BTreeMap::new();
    let mut out = Vec::new();
    for v in l.tables(cx, "virtual_host", VHOST_KEYS) {
        let name = name(cx, &v, "api");
        unique(cx, &mut names, &name, "virtual host");
        let tls = v.sub(cx, "tls", TLS_KEYS).map(|tls| tls_files(cx, &tls));
        if tls.is_some() && !https {
            cx.err(
                &v.key_span("tls"),
                &v.field("tls"),
                "a virtual host's own certificate needs protocol = \"https\" on its listener",
            );
        }
        let mut domains = Vec::new();
        if v.require(cx, "domains", "an array like [\"api.example.com\"]")
            .is_some()
        {
            if let Some((items, span, field)) = v.array(cx, "domains") {
                if items.is_empty() {
                    cx.err(
                        &span,
                        &field,
                        "must list at least one domain, e.g. [\"api.example.com\"] or [\"*\"]",
                    );
                }
                for (i, d) in items.iter().enumerate() {
                    let Some(d) = doc::string(cx, d, format!("{field}[{i}]")) else {
                        continue;
                    };
                    if let Err(m) = check::domain(d.v) {
                        d.err(cx, m);
                        continue;
                    }
                    let key = d.v.to_ascii_lowercase();
                    if let Some(first) = domains_seen.get(&key) {
                        let (line, col) = cx.position(first.start);
                        d.err(cx, format!("domain {} already appears at line {line}, column {col}; each domain may appear once per listener", show(d.v)));
                        continue;
                    }
                    domains_seen.insert(key, d.span.clone());
                    domains.push(d.v.to_string());
                    if tls.is_none() {
                        continue;
                    }
                    match server_name(d.v) {
                        Err(m) => d.err(cx, m),
                        Ok(sni) => {
                            if let Some((by, first)) = server_names.get(&sni) {
                                let (line, col) = cx.position(first.start);
                                d.err(cx, format!("server name {} already selects the certificate of {by} (line {line}, column {col}); each name may choose one certificate per listener", show(&sni)));
                            } else {
                                server_names.insert(sni, (v.field("tls"), d.span.clone()));
                            }
                        }
                    }
                }
            }
        }
        if v.get("route").is_none() {
            cx.err(&v.span, &v.field("route"), "a virtual host needs at least one route: add [[proxy.listener.virtual_host.route]]");
        }
        let routes = routes(cx, &v, refs);
        out.push(ir::VirtualHost {
            name: name.v,
            domains,
            routes,
            tls,
        });
    }
    out
}
