//! `berth.toml` → IR.
//!
//! The file is parsed into a spanned TOML document and walked by hand, so that every error
//! carries the file, line, column and dotted field path (`proxy[0].listener[1].port`), and so
//! that one bad item does not hide the errors in the others: all errors in a file are reported
//! at once. A TOML syntax error stops the walk (the document is not trustworthy), but is still
//! reported with its position.
//!
//! Field paths use the array index scheme everywhere: `proxy[1].listener[0].route[2].backend`;
//! map keys that are not plain identifiers are quoted (`proxy[0].labels."a b"`).

mod acme;
mod acme_dns;
mod backend;
mod check;
mod doc;
mod errors;
mod fields;
mod gateway;
mod listener;
mod proxy;
mod route;
mod serve;
mod settings;
mod swarm;

use std::path::{Path, PathBuf};

use crate::core::ir;

pub use acme_dns::{read_env_file, read_tsig_secret};
pub use backend::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_XDS_PORT};
pub use errors::{ConfigError, ConfigErrors};
pub use gateway::{read_ir_file, EnvoyGateway, MAX_IR_FILE_SIZE};
pub use serve::{parse_listen, ServeSection};

/// An IP address or a DNS name (no port); the message says what is allowed.
pub fn check_host(s: &str) -> Result<(), String> {
    check::host(s)
}

/// A readable PEM file holding a block of `kind` ("CERTIFICATE", "PRIVATE KEY").
pub fn check_pem(path: &Path, kind: &str) -> Result<(), String> {
    backend::pem_file(path, kind)
}
pub use proxy::{DEFAULT_IMAGE, MAX_CONCURRENCY, MAX_REPLICAS};

/// The largest config file berth reads.
pub const MAX_FILE_SIZE: u64 = 1024 * 1024;

/// A parsed and validated `berth.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file as given to [`load`] / [`parse`].
    pub path: PathBuf,
    /// `state_dir`, made absolute (relative paths are relative to the config file).
    pub state_dir: Option<PathBuf>,
    /// `tune_host` (default true): berth may set host settings replicas depend on
    /// (`net.ipv4.tcp_migrate_req=1`) when it runs as root.
    pub tune_host: bool,
    /// `engine`: this Docker host (default) or the Swarm its engine manages.
    pub engine: crate::core::policy::EngineKind,
    /// `[swarm]`: settings every proxy on a Swarm shares (the registry of the agent image).
    pub swarm: crate::core::policy::SwarmSettings,
    /// Every proxy: `[[proxy]]`s, then those of `[envoy_gateway] ir_files`.
    pub infra: ir::Infra,
    /// `[envoy_gateway]`: the xDS defaults for EG-driven proxies and the remote provider's
    /// listen address for `berth serve`.
    pub envoy_gateway: Option<EnvoyGateway>,
    /// `[serve]`: which components `berth serve` runs.
    pub serve: ServeSection,
    /// Things worth saying that are not errors (an IR proxy without listeners was skipped).
    pub notes: Vec<String>,
    /// Every file the config names (certificates, keys, CA files, IR files, bootstrap
    /// override files), absolute: `serve` watches them besides the config itself.
    pub files: Vec<PathBuf>,
}

impl Config {
    /// A config with no proxies (for `berth up --ir` without a config file).
    pub fn empty(path: &Path) -> Config {
        Config {
            path: path.to_path_buf(),
            state_dir: None,
            tune_host: true,
            engine: Default::default(),
            swarm: Default::default(),
            infra: ir::Infra::default(),
            envoy_gateway: None,
            serve: ServeSection::default(),
            notes: Vec::new(),
            files: Vec::new(),
        }
    }
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let unreadable = |message: String| {
        ConfigErrors(vec![ConfigError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            field: "file".into(),
            message,
        }])
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(unreadable(
                "is a directory; expected a berth.toml file".into(),
            ))
        }
        Ok(m) if m.len() > MAX_FILE_SIZE => {
            return Err(unreadable(format!(
                "is {} bytes; config files may be at most {MAX_FILE_SIZE} bytes",
                m.len()
            )))
        }
        _ => {}
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        // Point at the first invalid byte.
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let valid = std::str::from_utf8(valid).unwrap_or_default();
        let line = valid.matches('\n').count() + 1;
        let column = valid.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        ConfigErrors(vec![ConfigError {
            file: path.to_path_buf(),
            line,
            column,
            field: "syntax".into(),
            message: "invalid UTF-8; TOML files must be UTF-8 encoded".into(),
        }])
    })?;
    parse(path, &text)
}

/// Parses config text. `path` names the file in messages, and relative file paths inside
/// (TLS certificates, bootstrap files, `state_dir`) are resolved against its directory.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigErrors> {
    let mut cx = doc::Ctx::new(path, text);
    let walked;
    {
        let (root, syntax) = toml::de::DeTable::parse_recoverable(text);
        if !syntax.is_empty() {
            for e in syntax {
                let span = e.span().unwrap_or(0..0);
                let mut msg = format!("invalid TOML: {}", e.message().trim());
                if msg.ends_with("duplicate key") {
                    let key = text.get(span.clone()).unwrap_or("");
                    msg = format!(
                        "{msg} {}; each key may appear once per table (use [[…]] for repeated tables)",
                        check::show(key)
                    );
                }
                cx.err(&span, "syntax", msg);
            }
            return Err(cx.finish());
        }
        let table = doc::Tbl::root(root.get_ref(), root.span());
        walked = proxy::root(&mut cx, &table);
    }
    if cx.has_errors() {
        return Err(cx.finish());
    }
    Ok(Config {
        path: path.to_path_buf(),
        state_dir: walked.state_dir,
        tune_host: walked.tune_host,
        engine: walked.engine,
        swarm: walked.swarm,
        serve: walked.serve,
        infra: walked.infra,
        envoy_gateway: walked.envoy_gateway,
        notes: walked.notes,
        files: cx.named_files(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROXY: &str = "[[proxy]]\nname = \"p\"\n[[proxy.listener]]\nname = \"web\"\nport = 8080\nprotocol = \"http\"\n[[proxy.listener.route]]\npath_prefix = \"/\"\ndirect_response = { status = 200 }\n";

    #[test]
    fn tune_host_defaults_to_true_and_must_be_a_boolean() {
        let path = Path::new("/etc/berth/berth.toml");
        assert!(parse(path, PROXY).unwrap().tune_host);
        let off = format!("tune_host = false\n{PROXY}");
        assert!(!parse(path, &off).unwrap().tune_host);
        let bad = format!("tune_host = \"no\"\n{PROXY}");
        let errs = parse(path, &bad).unwrap_err().0;
        assert_eq!(errs.len(), 1);
        assert_eq!((errs[0].line, errs[0].column), (1, 13));
        assert_eq!(errs[0].field, "tune_host");
        assert!(
            errs[0].message.contains("must be true or false"),
            "{}",
            errs[0]
        );
    }
}
