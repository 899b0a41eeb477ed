//! Listeners, routes, backends (standalone mode) and the xDS server (xds mode).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::ir;

use super::check::{self, show};
use super::doc::{self, Ctx, Item, Span, Tbl};
use super::proxy::{duration, name, unique, Ports};

const LISTENER_KEYS: &[&str] = &[
    "name",
    "port",
    "protocol",
    "tls",
    "route",
    "virtual_host",
    "backend",
];
const VHOST_KEYS: &[&str] = &["name", "domains", "route"];
const ROUTE_KEYS: &[&str] = &[
    "path_prefix",
    "path",
    "headers",
    "backend",
    "backends",
    "direct_response",
    "redirect",
    "timeout",
    "retries",
];
const ACTIONS: &[&str] = &["backend", "backends", "direct_response", "redirect"];
const BACKEND_KEYS: &[&str] = &[
    "name",
    "endpoints",
    "lb_policy",
    "connect_timeout",
    "health_check",
];
const HEALTH_KEYS: &[&str] = &[
    "path",
    "interval",
    "timeout",
    "healthy_threshold",
    "unhealthy_threshold",
];
const XDS_KEYS: &[&str] = &["address", "port", "ca_file", "cert_file", "key_file"];
const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];
const LB_POLICIES: &[&str] = &[
    "round_robin",
    "least_request",
    "random",
    "ring_hash",
    "maglev",
];
pub const DEFAULT_XDS_PORT: u16 = 18000;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const MAX_ENDPOINTS: usize = 1024;
pub const MAX_WEIGHT: i64 = 1_000_000;

/// A backend named by a route or a tcp listener, checked once the proxy's backends are known.
struct BackendRef {
    name: Item<String>,
}

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
    let mut routing = None;
    if xds {
        for key in ["tls", "route", "virtual_host", "backend"] {
            if t.get(key).is_some() {
                cx.err(
                    &t.key_span(key),
                    &t.field(key),
                    "not allowed in xds mode: Envoy Gateway provides routes, backends and TLS; a listener has only name, port and protocol",
                );
            }
        }
    } else {
        let tls = t.sub(cx, "tls", &["cert_file", "key_file"]).map(|tls| {
            let cert_file = pem(cx, &tls, "cert_file", "CERTIFICATE");
            let key_file = pem(cx, &tls, "key_file", "PRIVATE KEY");
            ir::TlsFiles {
                cert_file,
                key_file,
            }
        });
        let traffic = if protocol == "tcp" {
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
                    "an https listener needs tls = { cert_file = \"cert.pem\", key_file = \"key.pem\" }",
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
                virtual_hosts: virtual_hosts(cx, t, &name.v, refs),
            }
        };
        routing = Some(ir::ListenerRouting {
            listener: name.v.clone(),
            tls,
            traffic,
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
    };
    (pl, routing)
}

fn virtual_hosts(
    cx: &mut Ctx,
    l: &Tbl,
    listener: &str,
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
        }];
    }
    let mut names = BTreeMap::new();
    let mut domains_seen: BTreeMap<String, Span> = BTreeMap::new();
    let mut out = Vec::new();
    for v in l.tables(cx, "virtual_host", VHOST_KEYS) {
        let name = name(cx, &v, "api");
        unique(cx, &mut names, &name, "virtual host");
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
        });
    }
    out
}

fn routes(cx: &mut Ctx, parent: &Tbl, refs: &mut Vec<BackendRef>) -> Vec<ir::Route> {
    parent
        .tables(cx, "route", ROUTE_KEYS)
        .iter()
        .map(|r| route(cx, r, refs))
        .collect()
}

fn route(cx: &mut Ctx, t: &Tbl, refs: &mut Vec<BackendRef>) -> ir::Route {
    // Path: exactly one of path_prefix, path.
    let prefix = t.str(cx, "path_prefix");
    let exact = t.str(cx, "path");
    let path = match (prefix, exact) {
        (Some(p), None) => Some((p, true)),
        (None, Some(p)) => Some((p, false)),
        (Some(_), Some(p)) => {
            cx.err(
                &t.key_span("path"),
                &p.field,
                "give exactly one of path_prefix or path (exact match), not both",
            );
            None
        }
        (None, None) => {
            if t.get("path_prefix").is_none() && t.get("path").is_none() {
                cx.err(
                    &t.span,
                    &t.field("path_prefix"),
                    "a route needs a path match: path_prefix = \"/\" (prefix) or path = \"/exact\"",
                );
            }
            None
        }
    };
    let path = match path {
        Some((p, is_prefix)) => {
            if let Err(m) = check::url_path(p.v, false) {
                p.err(cx, m);
            }
            if is_prefix {
                ir::PathMatch::Prefix(p.v.to_string())
            } else {
                ir::PathMatch::Exact(p.v.to_string())
            }
        }
        None => ir::PathMatch::Prefix("/".to_string()),
    };
    let mut headers = Vec::new();
    if let Some(v) = t.get("headers") {
        for (k, val) in doc::string_map(cx, v, t.field("headers")).unwrap_or_default() {
            if let Err(m) = check::header_name(k.v) {
                k.err(cx, m);
                continue;
            }
            if let Err(m) = check::plain(val.v, check::MAX_VALUE) {
                val.err(cx, m);
                continue;
            }
            headers.push(ir::HeaderMatch {
                name: k.v.to_ascii_lowercase(),
                value: val.v.to_string(),
            });
        }
    }
    // Action: exactly one.
    let present: Vec<&str> = ACTIONS
        .iter()
        .copied()
        .filter(|a| t.get(a).is_some())
        .collect();
    if present.is_empty() {
        cx.err(
            &t.span,
            &t.field("backend"),
            "a route needs one action: backend = \"name\", backends = [{ name, weight }], direct_response = { status, body } or redirect = { … }",
        );
    }
    if present.len() > 1 {
        cx.err(
            &t.key_span(present[1]),
            &t.field(present[1]),
            format!(
                "a route has exactly one action, found {}; keep one",
                present.join(" and ")
            ),
        );
    }
    let action = match present.first().copied() {
        Some("backend") => forward_one(cx, t, refs),
        Some("backends") => forward_weighted(cx, t, refs),
        Some("direct_response") => direct_response(cx, t),
        Some("redirect") => redirect(cx, t),
        _ => ir::RouteAction::DirectResponse {
            status: 404,
            body: String::new(),
        },
    };
    let forwards = matches!(action, ir::RouteAction::Forward { .. });
    for key in ["timeout", "retries"] {
        if t.get(key).is_some() && !forwards && !present.is_empty() {
            cx.err(
                &t.key_span(key),
                &t.field(key),
                format!("{key} applies only to routes that forward to backend or backends"),
            );
        }
    }
    let timeout = t
        .get("timeout")
        .map(|_| duration(cx, t, "timeout", Duration::ZERO, false));
    ir::Route {
        matcher: ir::RouteMatch { path, headers },
        action,
        timeout,
        retries: retries(cx, t),
    }
}

fn forward_one(cx: &mut Ctx, t: &Tbl, refs: &mut Vec<BackendRef>) -> ir::RouteAction {
    let mut backends = Vec::new();
    if let Some(b) = t.str(cx, "backend") {
        backends.push(ir::WeightedBackend {
            name: b.v.to_string(),
            weight: 1,
        });
        refs.push(BackendRef {
            name: Item::new(b.v.to_string(), b.span, b.field),
        });
    }
    ir::RouteAction::Forward { backends }
}

fn forward_weighted(cx: &mut Ctx, t: &Tbl, refs: &mut Vec<BackendRef>) -> ir::RouteAction {
    let mut backends = Vec::new();
    let Some((items, span, field)) = t.array(cx, "backends") else {
        return ir::RouteAction::Forward { backends };
    };
    if items.is_empty() {
        cx.err(&span, &field, "must list at least one backend, e.g. [{ name = \"a\", weight = 90 }, { name = \"b\", weight = 10 }]");
    }
    let mut seen = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let Some(b) = Tbl::new(cx, item, format!("{field}[{i}]"), &["name", "weight"]) else {
            continue;
        };
        let Some(n) = b.req_str(cx, "name", "a backend name") else {
            continue;
        };
        let n = Item::new(n.v.to_string(), n.span, n.field);
        unique(cx, &mut seen, &n, "weighted backend");
        let weight = match b.get("weight") {
            Some(v) => doc::int(cx, v, b.field("weight"), 1, MAX_WEIGHT).map_or(1, |w| w.v as u32),
            None => 1,
        };
        backends.push(ir::WeightedBackend {
            name: n.v.clone(),
            weight,
        });
        refs.push(BackendRef { name: n });
    }
    ir::RouteAction::Forward { backends }
}

fn direct_response(cx: &mut Ctx, t: &Tbl) -> ir::RouteAction {
    let mut status = 200;
    let mut body = String::new();
    if let Some(d) = t.sub(cx, "direct_response", &["status", "body"]) {
        if let Some(s) = d.int(cx, "status", 200, 599) {
            status = s.v as u16;
        }
        if let Some(b) = d.str(cx, "body") {
            if b.v.len() > check::MAX_BODY {
                b.err(
                    cx,
                    format!(
                        "must be at most {} bytes (64 KiB), got {}",
                        check::MAX_BODY,
                        b.v.len()
                    ),
                );
            } else if let Some(c) =
                b.v.chars()
                    .find(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
            {
                b.err(cx, format!("must not contain control characters other than newline, carriage return and tab (found {c:?})"));
            }
            body = b.v.to_string();
        }
    }
    ir::RouteAction::DirectResponse { status, body }
}

fn redirect(cx: &mut Ctx, t: &Tbl) -> ir::RouteAction {
    let mut r = ir::Redirect {
        status: 301,
        ..Default::default()
    };
    let Some(d) = t.sub(
        cx,
        "redirect",
        &["scheme", "host", "port", "path", "status"],
    ) else {
        return ir::RouteAction::Redirect(r);
    };
    if let Some(s) = d.str(cx, "scheme") {
        if s.v == "http" || s.v == "https" {
            r.scheme = Some(s.v.to_string());
        } else {
            s.err(
                cx,
                format!("must be \"http\" or \"https\", got {}", show(s.v)),
            );
        }
    }
    if let Some(h) = d.str(cx, "host") {
        match check::host(h.v) {
            Ok(()) => r.host = Some(h.v.to_string()),
            Err(m) => h.err(cx, m),
        }
    }
    if let Some(p) = d.int(cx, "port", 1, 65535) {
        r.port = Some(p.v as u16);
    }
    if let Some(p) = d.str(cx, "path") {
        match check::url_path(p.v, true) {
            Ok(()) => r.path = Some(p.v.to_string()),
            Err(m) => p.err(cx, m),
        }
    }
    if let Some(v) = d.get("status") {
        if let Some(s) = doc::int(cx, v, d.field("status"), 0, 999) {
            match check::status_in(s.v, &[301, 302, 303, 307, 308]) {
                Ok(()) => r.status = s.v as u16,
                Err(m) => s.err(cx, m),
            }
        }
    }
    if ["scheme", "host", "port", "path"]
        .iter()
        .all(|k| d.get(k).is_none())
    {
        cx.err(
            &d.span,
            &d.path,
            "a redirect must change at least one of scheme, host, port, path",
        );
    }
    ir::RouteAction::Redirect(r)
}

fn retries(cx: &mut Ctx, t: &Tbl) -> Option<ir::Retries> {
    let r = t.sub(cx, "retries", &["attempts", "on", "per_try_timeout"])?;
    let attempts = match r.require(cx, "attempts", "1–10") {
        Some(v) => doc::int(cx, v, r.field("attempts"), 1, 10).map_or(1, |a| a.v as u32),
        None => 1,
    };
    let mut on = Vec::new();
    if let Some((items, span, field)) = r.array(cx, "on") {
        if items.is_empty() {
            cx.err(
                &span,
                &field,
                format!("must list at least one condition: {}", RETRY_ON.join(", ")),
            );
        }
        for (i, v) in items.iter().enumerate() {
            if let Some(s) = doc::string(cx, v, format!("{field}[{i}]")) {
                if RETRY_ON.contains(&s.v) {
                    on.push(s.v.to_string());
                } else {
                    s.err(
                        cx,
                        format!("must be one of {}; got {}", RETRY_ON.join(", "), show(s.v)),
                    );
                }
            }
        }
    } else if r.get("on").is_none() {
        on = vec![
            "connect-failure".to_string(),
            "refused-stream".to_string(),
            "5xx".to_string(),
        ];
    }
    let per_try_timeout = r
        .get("per_try_timeout")
        .map(|_| duration(cx, &r, "per_try_timeout", Duration::ZERO, false));
    Some(ir::Retries {
        attempts,
        on,
        per_try_timeout,
    })
}

fn backend(cx: &mut Ctx, t: &Tbl, names: &mut BTreeMap<String, Span>) -> ir::Backend {
    let name = name(cx, t, "api");
    unique(cx, names, &name, "backend");
    let mut endpoints = Vec::new();
    if t.require(cx, "endpoints", "an array like [\"127.0.0.1:9000\"]")
        .is_some()
    {
        if let Some((items, span, field)) = t.array(cx, "endpoints") {
            if items.is_empty() {
                cx.err(
                    &span,
                    &field,
                    "must list at least one endpoint, e.g. [\"127.0.0.1:9000\"]",
                );
            }
            if items.len() > MAX_ENDPOINTS {
                cx.err(
                    &span,
                    &field,
                    format!(
                        "must list at most {MAX_ENDPOINTS} endpoints, got {}",
                        items.len()
                    ),
                );
            }
            let mut seen: BTreeMap<String, Span> = BTreeMap::new();
            for (i, v) in items.iter().enumerate() {
                let Some(s) = doc::string(cx, v, format!("{field}[{i}]")) else {
                    continue;
                };
                match check::endpoint(s.v) {
                    Ok((host, port)) => {
                        let item = Item::new(s.v.to_string(), s.span.clone(), s.field.clone());
                        unique(cx, &mut seen, &item, "endpoint");
                        endpoints.push(ir::Endpoint { host, port });
                    }
                    Err(m) => s.err(cx, m),
                }
            }
        }
    }
    let lb_policy = match t.str(cx, "lb_policy") {
        None => ir::LbPolicy::RoundRobin,
        Some(s) => match s.v {
            "round_robin" => ir::LbPolicy::RoundRobin,
            "least_request" => ir::LbPolicy::LeastRequest,
            "random" => ir::LbPolicy::Random,
            "ring_hash" => ir::LbPolicy::RingHash,
            "maglev" => ir::LbPolicy::Maglev,
            other => {
                s.err(
                    cx,
                    format!(
                        "must be one of {}; got {}",
                        LB_POLICIES.join(", "),
                        show(other)
                    ),
                );
                ir::LbPolicy::RoundRobin
            }
        },
    };
    let connect_timeout = duration(cx, t, "connect_timeout", DEFAULT_CONNECT_TIMEOUT, false);
    let health_check = t.sub(cx, "health_check", HEALTH_KEYS).map(|h| {
        let path = match h.req_str(cx, "path", "the HTTP path to probe, e.g. \"/healthz\"") {
            Some(p) => {
                if let Err(m) = check::url_path(p.v, true) {
                    p.err(cx, m);
                }
                p.v.to_string()
            }
            None => String::new(),
        };
        let threshold = |cx: &mut Ctx, key: &str, default: u32| {
            h.int(cx, key, 1, 100).map_or(default, |n| n.v as u32)
        };
        ir::HealthCheck {
            path,
            interval: duration(cx, &h, "interval", Duration::from_secs(5), false),
            timeout: duration(cx, &h, "timeout", Duration::from_secs(1), false),
            healthy_threshold: threshold(cx, "healthy_threshold", 2),
            unhealthy_threshold: threshold(cx, "unhealthy_threshold", 3),
        }
    });
    ir::Backend {
        name: name.v,
        endpoints,
        lb_policy,
        connect_timeout,
        health_check,
    }
}

fn xds_server(cx: &mut Ctx, p: &Tbl) -> ir::XdsServer {
    let mut server = ir::XdsServer {
        address: String::new(),
        port: DEFAULT_XDS_PORT,
        ca_file: PathBuf::new(),
        cert_file: PathBuf::new(),
        key_file: PathBuf::new(),
    };
    let Some(t) = p.sub(cx, "xds", XDS_KEYS) else {
        return server;
    };
    if let Some(a) = t.req_str(cx, "address", "the xDS server's IP address or DNS name") {
        match check::host(a.v) {
            Ok(()) => server.address = a.v.to_string(),
            Err(m) => a.err(cx, m),
        }
    }
    if let Some(port) = t.int(cx, "port", 1, 65535) {
        server.port = port.v as u16;
    }
    server.ca_file = pem(cx, &t, "ca_file", "CERTIFICATE");
    server.cert_file = pem(cx, &t, "cert_file", "CERTIFICATE");
    server.key_file = pem(cx, &t, "key_file", "PRIVATE KEY");
    server
}

/// A required PEM file path: resolved against the config's directory, must exist and hold a
/// PEM block of the expected kind ("CERTIFICATE", "PRIVATE KEY").
fn pem(cx: &mut Ctx, t: &Tbl, key: &str, kind: &str) -> PathBuf {
    let what = format!("a path to a PEM {} file", kind.to_lowercase());
    let Some(s) = t.req_str(cx, key, &what) else {
        return PathBuf::new();
    };
    if let Err(m) = check::plain(s.v, 4096) {
        s.err(cx, m);
        return PathBuf::new();
    }
    if s.v.is_empty() {
        s.err(cx, format!("must be {what}, got an empty string"));
        return PathBuf::new();
    }
    let path = cx.resolve(s.v);
    let shown = show(&path.display().to_string());
    let text = match std::fs::metadata(&path) {
        Err(e) => Err(format!(
            "cannot read {shown}: {e}; relative paths are relative to the config file"
        )),
        Ok(m) if !m.is_file() => Err(format!("{shown} is not a regular file")),
        Ok(m) if m.len() > 1024 * 1024 => {
            Err(format!("{shown} is larger than 1 MiB; expected a PEM file"))
        }
        Ok(_) => std::fs::read(&path).map_err(|e| format!("cannot read {shown}: {e}")),
    };
    match text {
        Err(m) => s.err(cx, m),
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let has_kind = text
                .lines()
                .any(|l| l.starts_with("-----BEGIN ") && l.contains(kind));
            if !has_kind {
                s.err(
                    cx,
                    format!(
                        "{shown} is not a PEM {} file (no \"-----BEGIN …{kind}-----\" line)",
                        kind.to_lowercase()
                    ),
                );
            }
        }
    }
    path
}
