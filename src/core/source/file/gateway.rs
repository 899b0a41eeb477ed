//! `[envoy_gateway]`: where Envoy Gateway's xDS server is (and the mTLS files to reach it),
//! proxies read from EG infra IR files, and the address `berth serve` offers EG's remote
//! infrastructure provider service on.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::core::ir;
use crate::core::source::eg::{self, XdsDefaults};
use crate::core::source::remote::{Listen, Security, TlsFiles};

use super::backend::pem;
use super::check::{self, show};
use super::doc::{self, Ctx, Item, Span, Tbl};
use super::fields::Ports;

const KEYS: &[&str] = &[
    "xds_address",
    "xds_port",
    "ca_file",
    "cert_file",
    "key_file",
    "ir_files",
    "remote",
    "remote_cert_file",
    "remote_key_file",
    "remote_client_ca_file",
    "remote_plaintext",
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
    /// How that service is secured on TCP (`remote_cert_file`, `remote_key_file`,
    /// `remote_client_ca_file`, or `remote_plaintext = true`).
    pub remote_security: Security,
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
            let path = cx.named_file(s.v);
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
    let remote_security = remote_security(cx, &t, remote.as_ref());
    let gw = EnvoyGateway {
        xds,
        ir_files: files.iter().map(|(p, _)| p.clone()).collect(),
        remote,
        remote_security,
    };
    Some((gw, files))
}

/// `remote_cert_file` + `remote_key_file` (TLS; with `remote_client_ca_file`, mTLS), or
/// `remote_plaintext = true`. A `tcp://` remote needs one of them; a Unix socket takes none.
fn remote_security(cx: &mut Ctx, t: &Tbl, remote: Option<&Listen>) -> Security {
    let has = |k: &str| t.get(k).is_some();
    let plaintext = match t.get("remote_plaintext") {
        None => false,
        Some(v) => match v.get_ref() {
            toml::de::DeValue::Boolean(b) => *b,
            other => {
                cx.err(
                    &v.span(),
                    &t.field("remote_plaintext"),
                    format!(
                        "must be true or false (serve the remote infrastructure service over \
                         plain-text TCP, which lets anyone who reaches the port create and \
                         delete proxies on this host), got {}",
                        doc::kind(other)
                    ),
                );
                false
            }
        },
    };
    let tls_keys = [
        "remote_cert_file",
        "remote_key_file",
        "remote_client_ca_file",
    ];
    let any_tls = tls_keys.iter().any(|k| has(k));
    let field = |k: &str| t.field(k);
    match remote {
        Some(Listen::Unix(_)) | None => {
            for k in tls_keys.iter().chain(["remote_plaintext"].iter()) {
                if has(k) {
                    cx.err(
                        &t.key_span(k),
                        &field(k),
                        "applies to remote = \"tcp://…\" only: a Unix socket is guarded by its \
                         file mode (0600) and Envoy Gateway connects to it without TLS",
                    );
                }
            }
            Security::None
        }
        Some(Listen::Tcp(_)) if plaintext => {
            if any_tls {
                cx.err(
                    &t.key_span("remote_plaintext"),
                    &field("remote_plaintext"),
                    "contradicts remote_cert_file/remote_key_file: choose TLS or plain text",
                );
            }
            Security::Plaintext
        }
        Some(Listen::Tcp(_)) => {
            if !has("remote_cert_file") && !has("remote_key_file") {
                cx.err(
                    &t.key_span("remote"),
                    &field("remote"),
                    "a tcp:// remote infrastructure service needs TLS: set remote_cert_file and \
                     remote_key_file (and remote_client_ca_file to require Envoy Gateway's \
                     client certificate), or listen on unix:///path, or set remote_plaintext = \
                     true to accept that anyone who can reach the port can create and delete \
                     proxies on this host",
                );
                return Security::None;
            }
            let cert = pem(cx, t, "remote_cert_file", "CERTIFICATE");
            let key = pem(cx, t, "remote_key_file", "PRIVATE KEY");
            let client_ca = has("remote_client_ca_file")
                .then(|| pem(cx, t, "remote_client_ca_file", "CERTIFICATE"));
            Security::Tls(TlsFiles {
                cert,
                key,
                client_ca,
            })
        }
    }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::core::source::file::{parse, ConfigError};

    fn section(extra: &str) -> String {
        let certs = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/certs");
        format!(
            "[envoy_gateway]\nxds_address = \"127.0.0.1\"\nca_file = \"{c}/cert.pem\"\ncert_file = \"{c}/cert.pem\"\nkey_file = \"{c}/key.pem\"\n{extra}",
            c = certs.display()
        )
    }

    const IR: &str = "proxy:\n  name: default/eg\n  listeners:\n  - name: http\n    ports:\n    - {name: http-8080, protocol: HTTP, servicePort: 8080, containerPort: 8080}\n";
    const EMPTY_IR: &str = "proxy:\n  name: default/idle\n";
    const PROXY: &str = "[[proxy]]\nname = \"default-eg\"\n[[proxy.listener]]\nname = \"web\"\nport = 9090\nprotocol = \"http\"\n[[proxy.listener.route]]\npath_prefix = \"/\"\ndirect_response = { status = 200 }\n";

    fn errors(dir: &Path, text: &str) -> Vec<ConfigError> {
        parse(&dir.join("berth.toml"), text).unwrap_err().0
    }

    #[test]
    fn ir_files_add_proxies_and_make_proxy_tables_optional() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gw.yaml"), IR).unwrap();
        std::fs::write(dir.path().join("idle.yaml"), EMPTY_IR).unwrap();
        let text = section("ir_files = [\"gw.yaml\", \"idle.yaml\"]\nremote = \"unix://r.sock\"\n");
        let c = parse(&dir.path().join("berth.toml"), &text).unwrap();
        assert_eq!(c.infra.proxies.len(), 1);
        let p = &c.infra.proxies[0];
        assert_eq!(
            (p.name.as_str(), p.service_cluster()),
            ("default-eg", "default/eg")
        );
        assert!(matches!(&p.routing, crate::core::ir::Routing::Xds(x) if x.port == 18000));
        assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
        assert!(c.notes[0].contains("default/idle"), "{:?}", c.notes);
        let gw = c.envoy_gateway.unwrap();
        assert_eq!(
            gw.remote,
            Some(crate::core::source::remote::Listen::Unix(
                std::path::absolute(dir.path()).unwrap().join("r.sock")
            ))
        );
    }

    #[test]
    fn proxies_are_still_required_without_ir_files_or_remote() {
        let dir = tempfile::tempdir().unwrap();
        let errs = errors(dir.path(), &section(""));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "proxy");
    }

    #[test]
    fn errors_name_the_field_the_ir_file_and_eg_s_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bad.yaml"),
            IR.replace("protocol: HTTP", "protocol: SCTP"),
        )
        .unwrap();
        std::fs::write(dir.path().join("gw.yaml"), IR).unwrap();
        let text = section(
            "xds_prot = 1\nremote = \"http://x\"\nir_files = [\"bad.yaml\", \"missing.yaml\"]\n",
        );
        let errs = errors(dir.path(), &text);
        let find = |field: &str| {
            errs.iter()
                .find(|e| e.field == field)
                .unwrap_or_else(|| panic!("no error for {field}: {errs:?}"))
        };
        let typo = find("envoy_gateway.xds_prot");
        assert_eq!((typo.line, typo.column), (6, 1));
        assert!(typo.message.contains("did you mean `xds_port`"), "{typo}");
        assert!(find("envoy_gateway.remote").message.contains("unix://"));
        let bad = find("envoy_gateway.ir_files[0]");
        assert_eq!(bad.line, 8);
        assert!(bad.message.contains("bad.yaml"), "{bad}");
        assert!(
            bad.message.contains("proxy.listeners[0].ports[0].protocol"),
            "{bad}"
        );
        assert!(find("envoy_gateway.ir_files[1]")
            .message
            .contains("cannot read the IR file"));

        // A berth name or a port a [[proxy]] already has.
        let text = format!("{}{PROXY}", section("ir_files = [\"gw.yaml\"]\n"));
        let errs = errors(dir.path(), &text);
        assert!(
            errs.iter().any(|e| e.message.contains("already used")),
            "{errs:?}"
        );
        let other_port = PROXY.replace("default-eg", "other").replace("9090", "8080");
        let errs = errors(
            dir.path(),
            &format!("{}{other_port}", section("ir_files = [\"gw.yaml\"]\n")),
        );
        assert!(
            errs.iter()
                .any(|e| e.message.contains("port 8080 is already used")),
            "{errs:?}"
        );
    }

    #[test]
    fn a_tcp_remote_needs_tls_or_the_plaintext_opt_in() {
        use crate::core::source::remote::{Security, TlsFiles};
        let dir = tempfile::tempdir().unwrap();
        let certs = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/certs");
        let c = |p: &str| certs.join(p).display().to_string();
        let errs = errors(dir.path(), &section("remote = \"tcp://127.0.0.1:9478\"\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "envoy_gateway.remote");
        assert!(
            errs[0].message.contains("remote_plaintext = true"),
            "{}",
            errs[0]
        );

        let text = section(&format!(
            "remote = \"tcp://127.0.0.1:9478\"\nremote_cert_file = \"{}\"\nremote_key_file = \"{}\"\nremote_client_ca_file = \"{}\"\n",
            c("cert.pem"),
            c("key.pem"),
            c("cert.pem")
        ));
        let gw = parse(&dir.path().join("berth.toml"), &text)
            .unwrap()
            .envoy_gateway
            .unwrap();
        assert_eq!(
            gw.remote_security,
            Security::Tls(TlsFiles {
                cert: certs.join("cert.pem"),
                key: certs.join("key.pem"),
                client_ca: Some(certs.join("cert.pem")),
            })
        );

        let text = section("remote = \"tcp://127.0.0.1:9478\"\nremote_plaintext = true\n");
        let gw = parse(&dir.path().join("berth.toml"), &text)
            .unwrap()
            .envoy_gateway
            .unwrap();
        assert_eq!(gw.remote_security, Security::Plaintext);

        let errs = errors(
            dir.path(),
            &section("remote = \"unix://r.sock\"\nremote_plaintext = true\n"),
        );
        assert_eq!(errs[0].field, "envoy_gateway.remote_plaintext");
        assert!(errs[0].message.contains("tcp://"), "{}", errs[0]);
    }
}
