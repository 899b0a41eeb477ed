//! Backends (static endpoints, LB policy, health check), the xDS server, PEM files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::core::ir;

use super::check::{self, show};
use super::doc::{self, Ctx, Item, Span, Tbl};
use super::fields::{duration, name, unique};

pub(super) const BACKEND_KEYS: &[&str] = &[
    "name",
    "endpoints",
    "lb_policy",
    "connect_timeout",
    "health_check",
    "protocol",
    "tls",
];
const BACKEND_TLS_KEYS: &[&str] = &["ca_file", "sni", "cert_file", "key_file"];
const PROTOCOLS: &[&str] = &["http1", "h2"];
const HEALTH_KEYS: &[&str] = &[
    "path",
    "interval",
    "timeout",
    "healthy_threshold",
    "unhealthy_threshold",
];
const XDS_KEYS: &[&str] = &["address", "port", "ca_file", "cert_file", "key_file"];
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

pub(super) fn backend(cx: &mut Ctx, t: &Tbl, names: &mut BTreeMap<String, Span>) -> ir::Backend {
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
    let protocol = match t.str(cx, "protocol") {
        None => ir::BackendProtocol::Http1,
        Some(s) => match s.v {
            "http1" => ir::BackendProtocol::Http1,
            "h2" => ir::BackendProtocol::H2,
            other => {
                s.err(
                    cx,
                    format!(
                        "must be one of {} (h2 for gRPC); got {}",
                        PROTOCOLS.join(", "),
                        show(other)
                    ),
                );
                ir::BackendProtocol::Http1
            }
        },
    };
    let tls = t
        .sub(cx, "tls", BACKEND_TLS_KEYS)
        .map(|tls| backend_tls(cx, &tls, &endpoints));
    ir::Backend {
        name: name.v,
        endpoints,
        lb_policy,
        connect_timeout,
        health_check,
        protocol,
        tls,
    }
}

/// `tls = { ca_file, sni, cert_file, key_file }`: the CA is required (replicas have no system
/// trust store), the SNI defaults to the endpoints' one DNS name, the client pair is optional
/// but whole.
fn backend_tls(cx: &mut Ctx, t: &Tbl, endpoints: &[ir::Endpoint]) -> ir::BackendTls {
    let ca_file = pem(cx, t, "ca_file", "CERTIFICATE");
    let names: std::collections::BTreeSet<&str> = endpoints
        .iter()
        .filter(|e| !e.is_ip())
        .map(|e| e.host.as_str())
        .collect();
    let sni = match t.str(cx, "sni") {
        Some(s) => {
            if let Err(m) = check::host(s.v).and_then(|()| match s.v.parse::<std::net::IpAddr>() {
                Ok(_) => Err(format!(
                    "must be a DNS name (the name the backend's certificate carries), not an IP address; got {}",
                    show(s.v)
                )),
                Err(_) => Ok(()),
            }) {
                s.err(cx, m);
            }
            s.v.to_string()
        }
        None => match (names.len(), names.iter().next()) {
            (1, Some(only)) if endpoints.iter().all(|e| !e.is_ip()) => only.to_string(),
            _ => {
                cx.err(
                    &t.span,
                    &t.field("sni"),
                    "is required when the endpoints are not all one DNS name: give the name the \
                     backend's certificate carries, e.g. sni = \"api.internal\" (it is sent as \
                     SNI and must be among the certificate's DNS names)",
                );
                String::new()
            }
        },
    };
    let client = match (t.get("cert_file"), t.get("key_file")) {
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            let (given, missing) = if t.get("cert_file").is_some() {
                ("cert_file", "key_file")
            } else {
                ("key_file", "cert_file")
            };
            cx.err(
                &t.key_span(given),
                &t.field(missing),
                format!("is required with {given}: a client certificate needs its certificate and its key"),
            );
            None
        }
        (Some(_), Some(_)) => Some(ir::TlsFiles {
            cert_file: pem(cx, t, "cert_file", "CERTIFICATE"),
            key_file: pem(cx, t, "key_file", "PRIVATE KEY"),
        }),
    };
    ir::BackendTls {
        ca_file,
        sni,
        client,
    }
}

pub(super) fn xds_server(cx: &mut Ctx, p: &Tbl) -> ir::XdsServer {
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
pub(super) fn pem(cx: &mut Ctx, t: &Tbl, key: &str, kind: &str) -> PathBuf {
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
    let path = cx.named_file(s.v);
    if let Err(m) = pem_file(&path, kind) {
        s.err(cx, m);
    }
    path
}

/// Checks that `path` is a readable regular file of at most 1 MiB holding a PEM block of
/// `kind` ("CERTIFICATE", "PRIVATE KEY").
pub fn pem_file(path: &std::path::Path, kind: &str) -> Result<(), String> {
    let shown = show(&path.display().to_string());
    let bytes = match std::fs::metadata(path) {
        Err(e) => {
            return Err(format!(
                "cannot read {shown}: {e}; relative paths are relative to the config file"
            ))
        }
        Ok(m) if !m.is_file() => return Err(format!("{shown} is not a regular file")),
        Ok(m) if m.len() > 1024 * 1024 => {
            return Err(format!("{shown} is larger than 1 MiB; expected a PEM file"))
        }
        Ok(_) => std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?,
    };
    let text = String::from_utf8_lossy(&bytes);
    let has_kind = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.contains(kind));
    if !has_kind {
        return Err(format!(
            "{shown} is not a PEM {} file (no \"-----BEGIN …{kind}-----\" line)",
            kind.to_lowercase()
        ));
    }
    Ok(())
}
