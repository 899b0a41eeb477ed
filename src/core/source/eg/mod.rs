//! Envoy Gateway's infra IR → berth's IR.
//!
//! Envoy Gateway hands each of its infrastructure backends one `ir.Infra{proxy: ProxyInfra}` per
//! Gateway (or per GatewayClass when gateways are merged). This module reads that IR in the
//! shapes EG prints it — JSON or YAML; `{proxy: …}`, a bare `ProxyInfra`, or the
//! `infraIR: {key: {proxy: …}}` map from `egctl x translate --to ir` — and, through
//! [`from_proto_parts`], the same IR as it arrives over EG's remote-infrastructure gRPC service.
//!
//! Of the EnvoyProxy resource carried in `config`, berth honours the subset in
//! [`ir::EnvoyProxy`]; everything else is ignored with a `debug` log, as EG's contract asks
//! ("design your provider to ignore unknown fields"). Every error names the field it is about,
//! as a path from the top of the input (`proxy.listeners[1].ports[0].protocol: …`).
//!
//! An IR with no listeners parses fine; callers skip it ([`EgProxy::is_empty`]) rather than tear
//! anything down, exactly as EG's infrastructure runner does.

mod envoyproxy;
mod ir;
mod node;
mod units;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::core::ir as berth_ir;
use ir::{build, proxy_from_value, RawListener, RawPort, RawProxy};
use node::{join, kind, log_ignored, parse_document, Node};

pub use units::{parse_go_duration, parse_quantity};

/// The Envoy Gateway release whose behaviour berth follows: the first with the remote
/// infrastructure provider.
pub const EG_RELEASE: &str = "v1.9.0";

/// The image Envoy Gateway [`EG_RELEASE`] runs when an EnvoyProxy names none
/// (`DefaultEnvoyProxyImage`, `api/v1alpha1/shared_types.go`). Move it with [`EG_RELEASE`];
/// `container.imageRepository` gets its tag ([`default_image_tag`]).
pub const DEFAULT_IMAGE: &str = "docker.io/envoyproxy/envoy:distroless-v1.39.0";

/// The tag of [`DEFAULT_IMAGE`], which EG appends to `container.imageRepository`.
pub fn default_image_tag() -> &'static str {
    DEFAULT_IMAGE
        .rsplit_once(':')
        .map_or(DEFAULT_IMAGE, |(_, tag)| tag)
}

/// EG's xDS server port.
pub const DEFAULT_XDS_PORT: u16 = 18000;

/// One proxy from Envoy Gateway, in berth's IR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgProxy {
    /// EG's IR key, e.g. "envoy-gateway/gateway-1". In xDS mode Envoy's `--service-cluster`
    /// must equal it: EG's snapshot cache serves a stream whose `node.cluster` is this key.
    pub eg_name: String,
    /// The proxy in berth's terms; `proxy.name` is [`berth_name`]`(eg_name)`.
    pub proxy: berth_ir::ProxyInfra,
}

impl EgProxy {
    /// True when the IR has no listeners. EG sends such IRs while a Gateway is invalid or being
    /// edited; its own backends skip them instead of tearing the proxy down, and so should callers.
    pub fn is_empty(&self) -> bool {
        self.proxy.listeners.is_empty()
    }
}

/// Where Envoy Gateway's xDS server is and the mTLS files replicas use to reach it. These come
/// from berth's configuration, not from EG's IR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct XdsDefaults {
    pub address: String,
    /// EG's default is [`DEFAULT_XDS_PORT`].
    pub port: u16,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl XdsDefaults {
    /// The xDS server block of a proxy's routing.
    pub fn server(&self) -> berth_ir::XdsServer {
        berth_ir::XdsServer {
            address: self.address.clone(),
            port: self.port,
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

/// A problem with Envoy Gateway input, naming the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgError {
    /// Path of the offending field from the top of the input, e.g.
    /// `proxy.config.spec.provider.kubernetes.envoyDeployment.replicas`.
    pub field: String,
    pub message: String,
}

impl EgError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        EgError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for EgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for EgError {}

pub(crate) type Result<T, E = EgError> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// Names

/// Maps an EG IR key to a DNS label berth can use in container names and labels.
///
/// "ns/gw" becomes "ns-gw". When the mapping could make two different EG names equal — any
/// character other than `[a-z0-9-/]`, a name with both '/' and '-' ("a-b/c" and "a/b-c" would
/// both read "a-b-c"), leading or trailing separators, or more than 63 characters — the label
/// gets "-" and the first 8 hex digits of sha256(eg_name) appended (EG's own `GetHashedName`
/// suffix), keeping the whole at most 63 characters.
pub fn berth_name(eg_name: &str) -> String {
    const MAX: usize = 63;
    let mut lossy = eg_name.contains('/') && eg_name.contains('-');
    let mut label = String::with_capacity(eg_name.len());
    for c in eg_name.chars() {
        match c {
            'a'..='z' | '0'..='9' | '-' => label.push(c),
            '/' => label.push('-'),
            _ => {
                lossy = true;
                let lower = c.to_ascii_lowercase();
                label.push(if lower.is_ascii_alphanumeric() {
                    lower
                } else {
                    '-'
                });
            }
        }
    }
    let trimmed = label.trim_matches('-');
    if trimmed.len() != label.len() || trimmed.is_empty() {
        lossy = true;
    }
    if !lossy && trimmed.len() <= MAX {
        return trimmed.to_string();
    }
    let hash = hex::encode(Sha256::digest(eg_name.as_bytes()));
    let hash = &hash[..8];
    // All of `trimmed` is ASCII, so byte slicing is char slicing.
    let keep = trimmed.len().min(MAX - 1 - hash.len());
    let base = trimmed[..keep].trim_end_matches('-');
    if base.is_empty() {
        hash.to_string()
    } else {
        format!("{base}-{hash}")
    }
}

/// The key Envoy Gateway serves a proxy's xDS snapshot under, which is also the proxy's
/// `--service-cluster`: the IR `name`, or in EG's gateway-namespace mode (the IR's owner is the
/// Gateway itself, and its name is the bare gateway name) `<namespace>/<name>`, as EG's
/// `BuildProxyArgs` does.
pub fn ir_key(name: &str, namespace: &str, owner_kind: Option<&str>) -> String {
    if owner_kind == Some("Gateway") && !namespace.is_empty() && !name.contains('/') {
        format!("{namespace}/{name}")
    } else {
        name.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points

/// Parses Envoy Gateway infra IR, JSON or YAML, into berth proxies.
///
/// Accepts `{proxy: {...}}` (EG's `ir.Infra`), a bare `ProxyInfra` (`{name, listeners, ...}`),
/// and `egctl x translate --to ir` output (`infraIR: {key: {proxy: ...}}`, other top-level keys
/// such as `xdsIR` ignored). Proxies with no listeners are returned too; see
/// [`EgProxy::is_empty`].
pub fn parse_ir(text: &str, xds: &XdsDefaults) -> Result<Vec<EgProxy>> {
    let doc = parse_document(text)?;
    let Value::Object(top) = &doc else {
        return Err(EgError::new(
            "",
            format!(
                "expected an Envoy Gateway infra IR object, got {}",
                kind(&doc)
            ),
        ));
    };
    if let Some(infra_ir) = top.get("infraIR") {
        let at = Node::root(infra_ir, "infraIR");
        let map = at.object()?;
        for key in top.keys().filter(|k| *k != "infraIR") {
            tracing::debug!(field = %key, "ignoring top-level field of egctl output");
        }
        let mut out = Vec::with_capacity(map.len());
        for (key, infra) in map {
            let at = at.key(key, infra);
            let infra = at.object()?;
            let Some(proxy) = infra.get("proxy").filter(|v| !v.is_null()) else {
                return Err(at.err("missing `proxy`"));
            };
            log_ignored(&at, infra, &["proxy"]);
            out.push(proxy_from_value(at.child("proxy", proxy), Some(key), xds)?);
        }
        return Ok(out);
    }
    if let Some(proxy) = top.get("proxy") {
        let root = Node::root(&doc, "");
        log_ignored(&root, top, &["proxy"]);
        return Ok(vec![proxy_from_value(
            Node::root(proxy, "proxy"),
            None,
            xds,
        )?]);
    }
    if top.contains_key("name") {
        return Ok(vec![proxy_from_value(Node::root(&doc, ""), None, xds)?]);
    }
    Err(EgError::new(
        "",
        "not an Envoy Gateway infra IR: expected `proxy:` (ir.Infra), `infraIR:` (egctl x \
         translate --to ir) or a ProxyInfra with `name:` at the top level",
    ))
}

/// The pieces of a `ProxyInfra` as EG's remote-infrastructure gRPC service carries them,
/// free of the generated protobuf types.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyParts {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The EnvoyProxy resource as JSON (EG sends `json.Marshal(EnvoyProxy)`); empty or `null`
    /// means none.
    pub config_json: Vec<u8>,
    pub listeners: Vec<ListenerParts>,
    pub addresses: Vec<String>,
    /// `metadata.owner_reference.kind` ("Gateway" in gateway-namespace mode).
    pub owner_kind: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListenerParts {
    pub name: String,
    pub ports: Vec<PortParts>,
    /// EG's `http3` (presence enables HTTP/3).
    pub http3: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PortParts {
    pub name: String,
    pub protocol: String,
    pub service_port: i64,
    pub container_port: i64,
}

/// Builds the same [`EgProxy`] as [`parse_ir`] from the parts of a gRPC `ProxyInfra`.
/// `path` names the message in errors, e.g. "infra.proxy".
pub fn from_proto_parts(parts: ProxyParts, path: &str, xds: &XdsDefaults) -> Result<EgProxy> {
    let config_path = join(path, "config");
    let config = if parts.config_json.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&parts.config_json)
            .map_err(|e| EgError::new(&config_path, format!("malformed EnvoyProxy JSON: {e}")))?
    };
    let listeners = parts
        .listeners
        .into_iter()
        .map(|l| RawListener {
            name: l.name,
            ports: l
                .ports
                .into_iter()
                .map(|p| RawPort {
                    name: p.name,
                    protocol: p.protocol,
                    service_port: Some(p.service_port),
                    container_port: Some(p.container_port),
                })
                .collect(),
            http3: l.http3,
        })
        .collect();
    let raw = RawProxy {
        name: parts.name,
        namespace: parts.namespace,
        labels: parts.labels,
        annotations: parts.annotations,
        listeners,
        addresses: parts.addresses,
        owner_kind: parts.owner_kind,
    };
    build(raw, Node::root(&config, &config_path), path, xds)
}
