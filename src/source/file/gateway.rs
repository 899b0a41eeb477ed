//! `[envoy_gateway]`: where Envoy Gateway's xDS server is (and the mTLS files to reach it),
//! proxies read from EG infra IR files, and the address `berth serve` offers EG's remote
//! infrastructure provider service on.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::ir;
use crate::remote::Listen;
use crate::source::eg::{self, XdsDefaults};

use super::backend::pem;
use super::check::{self, show};
use super::doc::{self, Ctx, Item, Span, Tbl};
use super::proxy::Ports;

const KEYS: &[&str] = &[
    "xds_address",
    "xds_port",
    "ca_file",
    "cert_file",
    "key_file",
    "ir_files",
    "remote",
];

/// The largest IR file berth reads (egctl output for many gateways is larger than a config).
pub const MAX_IR_FILE_SIZE: u64 = 8 * 1024 * 1024;

/// `[envoy_gateway]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyGateway {
    /// Where every EG-driven proxy's bootstrap points (ADS over mTLS).
    pub xds: XdsDefaults,
    /// The IR files (absolute), in the order given.
    pub ir_files: Vec<PathBuf>,
    /// Where `berth serve` offers EG's remote infrastructure provider service; None: off.
    pub remote: Option<Listen>,
}

impl EnvoyGateway {
    /// Whether the section provides proxies (so `[[proxy]]` may be absent).
    pub fn provides_proxies(&self) -> bool {
        !self.ir_files.is_empty() || self.remote.is_some()
    }
}

/// An `ir_files` entry: the resolved path and the spanned value it came from.
pub(super) type IrFile = (PathBuf, Item<String>);

/// Walks `[envoy_gateway]`; returns it and the `ir_files` items (for [`add_ir_proxies`]).
pub(super) fn section(cx: &mut Ctx, root: &Tbl) -> Option<(EnvoyGateway, Vec<IrFile>)> {
    let t = root.sub(cx, "envoy_gateway", KEYS)?;
    let mut xds = XdsDefaults {
        address: String::new(),
        port: eg::DEFAULT_XDS_PORT,
        ca_file: PathBuf::new(),
        cert_file: PathBuf::new(),
        key_file: PathBuf::new(),
    };
    if let Some(a) = t.req_str(
        cx,
        "xds_address",
        "the IP address or DNS name of Envoy Gateway's xDS server",
    ) {
        match check::host(a.v) {
            Ok(()) => xds.address = a.v.to_string(),
            Err(m) => a.err(cx, m),
        }
    }
    if let Some(port) = t.int(cx, "xds_port", 1, 65535) {
        xds.port = port.v as u16;
    }
    xds.ca_file = pem(cx, &t, "ca_file", "CERTIFICATE");
    xds.cert_file = pem(cx, &t, "cert_file", "CERTIFICATE");
    xds.key_file = pem(cx, &t, "key_file", "PRIVATE KEY");

    let mut files = Vec::new();
    if let Some((items, _, field)) = t.array(cx, "ir_files") {
        for (i, v) in items.iter().enumerate() {
            let Some(s) = doc::string(cx, v, format!("{field}[{i}]")) else {
                continue;
            };
            if s.v.is_empty() {
                s.err(cx, "must be a path to an Envoy Gateway infra IR file (JSON or YAML), got an empty string");
                continue;
            }
            if let Err(m) = check::plain(s.v, 4096) {
                s.err(cx, m);
                continue;
            }
            let path = cx.resolve(s.v);
            files.push((path, Item::new(s.v.to_string(), s.span, s.field)));
        }
    }
    let remote = t
        .str(cx, "remote")
        .and_then(|s| match Listen::parse(s.v, &cx.dir) {
            Ok(l) => Some(l),
            Err(m) => {
                s.err(cx, m);
                None
            }
        });
    let gw = EnvoyGateway {
        xds,
        ir_files: files.iter().map(|(p, _)| p.clone()).collect(),
        remote,
    };
    Some((gw, files))
}

/// Reads each IR file and adds its proxies to `infra`. Errors point at the `ir_files` entry and
/// name the IR file and EG's field path; proxies without listeners are skipped with a note.
/// Berth names and host ports must not clash with `[[proxy]]`s or each other.
pub(super) fn add_ir_proxies(
    cx: &mut Ctx,
    gw: &EnvoyGateway,
    files: &[IrFile],
    ports: &mut Ports,
    names: &mut BTreeMap<String, Span>,
    infra: &mut ir::Infra,
    notes: &mut Vec<String>,
) {
    for (path, item) in files {
        let shown = show(&path.display().to_string());
        let text = match read_ir_file(path) {
            Ok(t) => t,
            Err(m) => {
                item.err(
                    cx,
                    format!("cannot read the IR file {shown}: {m}; relative paths are relative to the config file"),
                );
                continue;
            }
        };
        let proxies = match eg::parse_ir(&text, &gw.xds) {
            Ok(p) => p,
            Err(e) => {
                item.err(cx, format!("{shown}: {e}"));
                continue;
            }
        };
        for p in proxies {
            if p.is_empty() {
                notes.push(format!(
                    "{}: Envoy Gateway proxy {:?} has no listeners; skipped (as Envoy Gateway does)",
                    path.display(),
                    p.eg_name
                ));
                continue;
            }
            if let Some(first) = names.get(&p.proxy.name) {
                let (line, col) = cx.position(first.start);
                item.err(
                    cx,
                    format!(
                        "{shown}: Envoy Gateway proxy {} becomes berth proxy {}, a name already used (line {line}, column {col}); proxy names must be unique",
                        show(&p.eg_name),
                        show(&p.proxy.name)
                    ),
                );
                continue;
            }
            names.insert(p.proxy.name.clone(), item.span.clone());
            let field = format!("{} ({})", item.field, p.eg_name);
            let mut own = p.proxy.host_ports();
            own.sort_unstable();
            own.dedup();
            for port in own {
                ports.claim_at(cx, port, &field, &item.span);
            }
            infra.proxies.push(p.proxy);
        }
    }
}

/// Reads an IR file (at most [`MAX_IR_FILE_SIZE`] bytes); the error says why not.
pub fn read_ir_file(path: &std::path::Path) -> Result<String, String> {
    match std::fs::metadata(path) {
        Err(e) => return Err(e.to_string()),
        Ok(m) if !m.is_file() => return Err("not a regular file".into()),
        Ok(m) if m.len() > MAX_IR_FILE_SIZE => {
            return Err(format!(
                "{} bytes; IR files may be at most {MAX_IR_FILE_SIZE} bytes",
                m.len()
            ))
        }
        Ok(_) => {}
    }
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}
