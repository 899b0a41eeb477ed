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

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::ir;

/// The image EG runs when an EnvoyProxy names none: EG's `DefaultEnvoyProxyImage` on its main
/// branch (`api/v1alpha1/shared_types.go`). EG release branches pin a versioned tag instead;
/// set `container.image` in the EnvoyProxy to choose one.
pub const DEFAULT_IMAGE: &str = "docker.io/envoyproxy/envoy:distroless-dev";

/// The tag EG appends to `container.imageRepository` (the tag of [`DEFAULT_IMAGE`]).
pub const DEFAULT_IMAGE_TAG: &str = "distroless-dev";

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
    pub proxy: ir::ProxyInfra,
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
    pub fn server(&self) -> ir::XdsServer {
        ir::XdsServer {
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
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
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

type Result<T, E = EgError> = std::result::Result<T, E>;

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
    };
    build(raw, Node::root(&config, &config_path), path, xds)
}

// ---------------------------------------------------------------------------------------------
// ProxyInfra

/// A ProxyInfra with its structure checked but its values not yet validated.
struct RawProxy {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    listeners: Vec<RawListener>,
    addresses: Vec<String>,
}

struct RawListener {
    name: String,
    ports: Vec<RawPort>,
    http3: bool,
}

struct RawPort {
    name: String,
    protocol: String,
    service_port: Option<i64>,
    container_port: Option<i64>,
}

fn proxy_from_value(at: Node<'_>, key: Option<&str>, xds: &XdsDefaults) -> Result<EgProxy> {
    let obj = at.object()?;
    log_ignored(
        &at,
        obj,
        &[
            "metadata",
            "name",
            "namespace",
            "config",
            "listeners",
            "addresses",
        ],
    );
    let mut name = at.opt_str("name")?.unwrap_or_default().to_string();
    if let Some(key) = key {
        if name.is_empty() {
            name = key.to_string();
        } else if name != key {
            tracing::debug!(
                key,
                name,
                "infraIR key differs from proxy.name; using proxy.name"
            );
        }
    }
    let (mut labels, mut annotations) = (BTreeMap::new(), BTreeMap::new());
    if let Some(meta) = at.get("metadata") {
        let obj = meta.object()?;
        log_ignored(&meta, obj, &["labels", "annotations"]);
        labels = meta.string_map("labels")?;
        annotations = meta.string_map("annotations")?;
    }
    let mut listeners = Vec::new();
    for l in at.opt_array("listeners")? {
        let obj = l.object()?;
        log_ignored(&l, obj, &["name", "ports", "http3"]);
        let mut ports = Vec::new();
        for p in l.opt_array("ports")? {
            let obj = p.object()?;
            log_ignored(
                &p,
                obj,
                &["name", "protocol", "servicePort", "containerPort"],
            );
            ports.push(RawPort {
                name: p.opt_str("name")?.unwrap_or_default().to_string(),
                protocol: p.opt_str("protocol")?.unwrap_or_default().to_string(),
                service_port: p.opt_int("servicePort")?,
                container_port: p.opt_int("containerPort")?,
            });
        }
        listeners.push(RawListener {
            name: l.opt_str("name")?.unwrap_or_default().to_string(),
            ports,
            http3: l.get("http3").is_some(),
        });
    }
    let mut addresses = Vec::new();
    for a in at.opt_array("addresses")? {
        addresses.push(a.str()?.to_string());
    }
    let raw = RawProxy {
        name,
        namespace: at.opt_str("namespace")?.unwrap_or_default().to_string(),
        labels,
        annotations,
        listeners,
        addresses,
    };
    let config_path = join(&at.path, "config");
    let config = at.get("config").map(|n| n.value).unwrap_or(&Value::Null);
    build(raw, Node::root(config, &config_path), &at.path, xds)
}

fn build(raw: RawProxy, config: Node<'_>, path: &str, xds: &XdsDefaults) -> Result<EgProxy> {
    if raw.name.trim().is_empty() {
        return Err(EgError::new(join(path, "name"), "must not be empty"));
    }
    let listeners = raw
        .listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| listener(l, &format!("{}[{i}]", join(path, "listeners"))))
        .collect::<Result<Vec<_>>>()?;
    let config = envoy_proxy(config)?;
    let proxy = ir::ProxyInfra {
        metadata: ir::InfraMetadata {
            labels: raw.labels,
            annotations: raw.annotations,
        },
        name: berth_name(&raw.name),
        namespace: raw.namespace,
        config,
        listeners,
        addresses: raw.addresses,
        rollout: ir::RolloutPolicy::default(),
        routing: ir::Routing::Xds(xds.server()),
        service_cluster: Some(raw.name.clone()),
    };
    Ok(EgProxy {
        eg_name: raw.name,
        proxy,
    })
}

fn listener(l: RawListener, path: &str) -> Result<ir::ProxyListener> {
    if l.name.trim().is_empty() {
        return Err(EgError::new(join(path, "name"), "must not be empty"));
    }
    if l.ports.is_empty() {
        return Err(EgError::new(
            join(path, "ports"),
            "a listener needs at least one port",
        ));
    }
    if l.http3 {
        tracing::debug!(
            listener = %l.name,
            "ignoring http3: berth binds the listener's port number for UDP too (host networking)"
        );
    }
    let mut ports = Vec::with_capacity(l.ports.len());
    for (i, p) in l.ports.into_iter().enumerate() {
        let at = format!("{}[{i}]", join(path, "ports"));
        if p.name.trim().is_empty() {
            return Err(EgError::new(join(&at, "name"), "must not be empty"));
        }
        let protocol = protocol(&p.protocol).ok_or_else(|| {
            EgError::new(
                join(&at, "protocol"),
                format!(
                    "unknown protocol {:?}; expected one of HTTP, HTTPS, TLS, TCP, UDP",
                    p.protocol
                ),
            )
        })?;
        let service = port_number(p.service_port, &join(&at, "servicePort"))?;
        let container = match p.container_port {
            // EG always sets containerPort; be lenient with hand-written IR that omits it.
            None => service,
            some => port_number(some, &join(&at, "containerPort"))?,
        };
        if container != service {
            tracing::info!(
                port = %p.name,
                service_port = service,
                container_port = container,
                "containerPort differs from servicePort; berth uses host networking and binds \
                 containerPort"
            );
        }
        ports.push(ir::ListenerPort {
            name: p.name,
            protocol,
            service_port: container,
            container_port: container,
        });
    }
    Ok(ir::ProxyListener {
        name: l.name,
        ports,
    })
}

fn protocol(s: &str) -> Option<ir::Protocol> {
    Some(match s.to_ascii_uppercase().as_str() {
        "HTTP" => ir::Protocol::Http,
        "HTTPS" => ir::Protocol::Https,
        "TLS" => ir::Protocol::Tls,
        "TCP" => ir::Protocol::Tcp,
        "UDP" => ir::Protocol::Udp,
        _ => return None,
    })
}

fn port_number(n: Option<i64>, path: &str) -> Result<u16> {
    match n {
        None => Err(EgError::new(path, "required")),
        Some(n) if (1..=65535).contains(&n) => Ok(n as u16),
        Some(n) => Err(EgError::new(path, format!("must be in 1..=65535, got {n}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// EnvoyProxy

/// Maps the EnvoyProxy resource (the full `{apiVersion, kind, metadata, spec}` or just its
/// `spec`) to berth's flat subset. `Null` means EG's defaults.
fn envoy_proxy(at: Node<'_>) -> Result<ir::EnvoyProxy> {
    let mut out = ir::EnvoyProxy {
        image: DEFAULT_IMAGE.to_string(),
        replicas: 1,
        resources: ir::Resources::default(),
        env: BTreeMap::new(),
        concurrency: None,
        extra_args: Vec::new(),
        logging: ir::Logging::default(),
        shutdown: ir::Shutdown::default(),
        bootstrap: None,
    };
    if at.value.is_null() {
        return Ok(out);
    }
    let obj = at.object()?;
    let spec = if obj.contains_key("spec") || obj.contains_key("kind") {
        log_ignored(
            &at,
            obj,
            &["spec", "apiVersion", "kind", "metadata", "status"],
        );
        match at.get("spec") {
            Some(spec) => spec,
            None => return Ok(out),
        }
    } else {
        at
    };
    let obj = spec.object()?;
    log_ignored(
        &spec,
        obj,
        &[
            "provider",
            "concurrency",
            "extraArgs",
            "logging",
            "shutdown",
            "bootstrap",
        ],
    );

    if let Some(provider) = spec.get("provider") {
        provider_settings(provider, &mut out)?;
    }
    if let Some(n) = spec.opt_int("concurrency")? {
        let at = spec.path_of("concurrency");
        if n < 0 {
            return Err(EgError::new(at, format!("must be ≥ 0, got {n}")));
        }
        // EG passes 0 through to Envoy, which treats it as "one worker per hardware thread";
        // berth's `None` (host CPUs / replicas) is the faithful equivalent on a shared host.
        out.concurrency = match u32::try_from(n) {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return Err(EgError::new(at, format!("too large: {n}"))),
        };
    }
    for a in spec.opt_array("extraArgs")? {
        out.extra_args.push(a.str()?.to_string());
    }
    if let Some(logging) = spec.get("logging") {
        log_ignored(&logging, logging.object()?, &["level"]);
        if let Some(level) = logging.get("level") {
            for (component, v) in level.object()? {
                let at = level.key(component, v);
                let s = at.str()?;
                let lvl = log_level(s).ok_or_else(|| {
                    at.err(format!(
                        "unknown log level {s:?}; expected trace, debug, info, warn, error, \
                         critical or off"
                    ))
                })?;
                out.logging.level.insert(component.clone(), lvl);
            }
        }
    }
    if let Some(shutdown) = spec.get("shutdown") {
        log_ignored(
            &shutdown,
            shutdown.object()?,
            &["drainTimeout", "minDrainDuration"],
        );
        if let Some(d) = shutdown.get("drainTimeout") {
            out.shutdown.drain_timeout = duration(&d)?;
        }
        if let Some(d) = shutdown.get("minDrainDuration") {
            out.shutdown.min_drain_duration = duration(&d)?;
        }
    }
    if let Some(bootstrap) = spec.get("bootstrap") {
        out.bootstrap = Some(bootstrap_override(bootstrap)?);
    }
    Ok(out)
}

fn provider_settings(provider: Node<'_>, out: &mut ir::EnvoyProxy) -> Result<()> {
    log_ignored(&provider, provider.object()?, &["type", "kubernetes"]);
    if let Some(t) = provider.opt_str("type")? {
        if !t.eq_ignore_ascii_case("Kubernetes") {
            tracing::debug!(
                provider = t,
                "EnvoyProxy provider is not Kubernetes; berth reads only \
                 provider.kubernetes.envoyDeployment settings"
            );
        }
    }
    let Some(kube) = provider.get("kubernetes") else {
        return Ok(());
    };
    log_ignored(
        &kube,
        kube.object()?,
        &["envoyDeployment", "envoyDaemonSet"],
    );
    // A DaemonSet is one Envoy per node; on one host that is one replica.
    let (workload, daemonset) = match (kube.get("envoyDeployment"), kube.get("envoyDaemonSet")) {
        (Some(d), _) => (d, false),
        (None, Some(ds)) => (ds, true),
        (None, None) => return Ok(()),
    };
    let allowed: &[&str] = if daemonset {
        &["container"]
    } else {
        &["replicas", "container"]
    };
    log_ignored(&workload, workload.object()?, allowed);
    if !daemonset {
        if let Some(n) = workload.opt_int("replicas")? {
            let at = workload.path_of("replicas");
            if n < 0 {
                return Err(EgError::new(at, format!("must be ≥ 0, got {n}")));
            }
            out.replicas =
                u32::try_from(n).map_err(|_| EgError::new(at, format!("too large: {n}")))?;
        }
    }
    let Some(container) = workload.get("container") else {
        return Ok(());
    };
    log_ignored(
        &container,
        container.object()?,
        &["image", "imageRepository", "env", "resources"],
    );
    match (
        container.opt_str("image")?,
        container.opt_str("imageRepository")?,
    ) {
        (Some(_), Some(_)) => {
            return Err(EgError::new(
                container.path_of("imageRepository"),
                "image and imageRepository are mutually exclusive; set one",
            ))
        }
        (Some(image), None) => {
            if image.trim().is_empty() {
                return Err(EgError::new(
                    container.path_of("image"),
                    "must not be empty",
                ));
            }
            out.image = image.to_string();
        }
        (None, Some(repo)) => {
            if repo.trim().is_empty() {
                return Err(EgError::new(
                    container.path_of("imageRepository"),
                    "must not be empty",
                ));
            }
            out.image = format!("{repo}:{DEFAULT_IMAGE_TAG}");
        }
        (None, None) => {}
    }
    for e in container.opt_array("env")? {
        log_ignored(&e, e.object()?, &["name", "value"]);
        let name = e.opt_str("name")?.unwrap_or_default();
        if name.is_empty() {
            return Err(EgError::new(e.path_of("name"), "must not be empty"));
        }
        if e.get("valueFrom").is_some() && e.get("value").is_none() {
            tracing::debug!(
                env = name,
                "skipping env var with valueFrom: Kubernetes references do not exist on a \
                 Docker host"
            );
            continue;
        }
        let value = e.opt_str("value")?.unwrap_or_default();
        out.env.insert(name.to_string(), value.to_string());
    }
    if let Some(res) = container.get("resources") {
        log_ignored(&res, res.object()?, &["limits", "requests"]);
        let limits = res.get("limits");
        let requests = res.get("requests");
        for side in [&limits, &requests].into_iter().flatten() {
            log_ignored(side, side.object()?, &["cpu", "memory"]);
        }
        // Docker has limits only: a limit wins, a request stands in for a missing one.
        let pick = |key: &str| {
            limits
                .as_ref()
                .and_then(|l| l.get(key))
                .or_else(|| requests.as_ref().and_then(|r| r.get(key)))
        };
        if let Some(cpu) = pick("cpu") {
            out.resources.cpus = Some(cpu_quantity(&cpu)?);
        }
        if let Some(mem) = pick("memory") {
            out.resources.memory = Some(memory_quantity(&mem)?);
        }
    }
    Ok(())
}

fn log_level(s: &str) -> Option<ir::LogLevel> {
    Some(match s.to_ascii_lowercase().as_str() {
        "trace" => ir::LogLevel::Trace,
        "debug" => ir::LogLevel::Debug,
        "info" => ir::LogLevel::Info,
        "warn" | "warning" => ir::LogLevel::Warn,
        "error" => ir::LogLevel::Error,
        "critical" => ir::LogLevel::Critical,
        "off" => ir::LogLevel::Off,
        _ => return None,
    })
}

fn bootstrap_override(at: Node<'_>) -> Result<ir::BootstrapOverride> {
    log_ignored(&at, at.object()?, &["type", "value", "jsonPatches"]);
    // EG: "Replace" when type is unset.
    let kind = match at.opt_str("type")? {
        None => ir::BootstrapOverrideKind::Replace,
        Some(t) => match t.to_ascii_lowercase().as_str() {
            "merge" => ir::BootstrapOverrideKind::Merge,
            "replace" => ir::BootstrapOverrideKind::Replace,
            "jsonpatch" => ir::BootstrapOverrideKind::JSONPatch,
            _ => {
                return Err(EgError::new(
                    at.path_of("type"),
                    format!("unknown bootstrap type {t:?}; expected Merge, Replace or JSONPatch"),
                ))
            }
        },
    };
    let value = at.opt_str("value")?;
    let patches = at.get("jsonPatches");
    let value = match (kind, value, patches) {
        (ir::BootstrapOverrideKind::JSONPatch, _, Some(p)) => {
            p.array()?;
            serde_json::to_string(p.value).expect("a JSON value serializes")
        }
        (ir::BootstrapOverrideKind::JSONPatch, Some(v), None) => v.to_string(),
        (ir::BootstrapOverrideKind::JSONPatch, None, None) => {
            return Err(EgError::new(
                at.path_of("jsonPatches"),
                "required when type is JSONPatch",
            ))
        }
        (_, Some(v), _) if !v.trim().is_empty() => v.to_string(),
        _ => {
            return Err(EgError::new(
                at.path_of("value"),
                format!("required when type is {kind:?}"),
            ))
        }
    };
    Ok(ir::BootstrapOverride { kind, value })
}

// ---------------------------------------------------------------------------------------------
// Durations and quantities

fn duration(at: &Node<'_>) -> Result<Duration> {
    let s = at.str()?;
    parse_go_duration(s)
        .map_err(|why| at.err(format!("{why} (got {s:?}; e.g. \"60s\", \"1m30s\")")))
}

/// Parses a Go/Kubernetes duration string: "60s", "1m30s", "1.5h", "250ms", "0".
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err("not a duration".into());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." {
            return Err("not a duration".into());
        }
        let n: f64 = num.parse().map_err(|_| "not a duration".to_string())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err("missing unit (ns, us, ms, s, m, h)".into()),
            u => return Err(format!("unknown unit {u:?} (ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        total += n * secs;
    }
    Duration::try_from_secs_f64(total).map_err(|_| "out of range".to_string())
}

/// A Kubernetes quantity as a number: "100m" → 0.1, "1.5" → 1.5, "512Mi" → 536870912,
/// "1G" → 1e9, "1e3" → 1000. JSON numbers are taken as they are.
pub fn parse_quantity(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (mut num, mut suffix) = s.split_at(num_end);
    // Decimal exponent ("1e3", "5E-2"), as opposed to the exa suffix "E".
    let mut exp = 0i32;
    if let Some(e) = suffix.strip_prefix(['e', 'E']) {
        if !e.is_empty()
            && e.trim_start_matches(['+', '-'])
                .chars()
                .all(|c| c.is_ascii_digit())
        {
            exp = e.parse().map_err(|_| "bad exponent".to_string())?;
            suffix = "";
        }
    }
    num = num.trim();
    if num.is_empty() {
        return Err("not a quantity".into());
    }
    let n: f64 = num.parse().map_err(|_| "not a quantity".to_string())?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        u => return Err(format!("unknown suffix {u:?}")),
    };
    let v = n * mult * 10f64.powi(exp);
    if !v.is_finite() {
        return Err("out of range".into());
    }
    Ok(v)
}

fn quantity(at: &Node<'_>) -> Result<f64> {
    let v = match at.value {
        Value::Number(n) => n.as_f64().ok_or_else(|| at.err("not a number"))?,
        Value::String(s) => parse_quantity(s).map_err(|why| {
            at.err(format!(
                "{why} (got {s:?}; e.g. \"500m\", \"1.5\", \"512Mi\", \"1G\")"
            ))
        })?,
        other => return Err(at.err(format!("expected a quantity, got {}", kind(other)))),
    };
    if v < 0.0 {
        return Err(at.err(format!("must be ≥ 0, got {v}")));
    }
    Ok(v)
}

fn cpu_quantity(at: &Node<'_>) -> Result<f64> {
    quantity(at)
}

fn memory_quantity(at: &Node<'_>) -> Result<u64> {
    let v = quantity(at)?.ceil();
    if v > u64::MAX as f64 {
        return Err(at.err("out of range"));
    }
    Ok(v as u64)
}

// ---------------------------------------------------------------------------------------------
// Reading JSON values with field paths

fn parse_document(text: &str) -> Result<Value> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(text).map_err(|e| EgError::new("", format!("malformed JSON: {e}")))
    } else {
        serde_yaml::from_str::<Value>(text)
            .map_err(|e| EgError::new("", format!("malformed YAML: {e}")))
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A value and the path that leads to it.
#[derive(Clone)]
struct Node<'a> {
    value: &'a Value,
    path: String,
}

impl<'a> Node<'a> {
    fn root(value: &'a Value, path: &str) -> Self {
        Node {
            value,
            path: path.to_string(),
        }
    }

    fn child(&self, key: &str, value: &'a Value) -> Node<'a> {
        Node {
            value,
            path: join(&self.path, key),
        }
    }

    /// A map entry whose key may contain dots or slashes: `infraIR["ns/gw"]`.
    fn key(&self, key: &str, value: &'a Value) -> Node<'a> {
        if key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            self.child(key, value)
        } else {
            Node {
                value,
                path: format!("{}[{key:?}]", self.path),
            }
        }
    }

    fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    fn err(&self, message: impl Into<String>) -> EgError {
        EgError::new(self.path.clone(), message)
    }

    fn object(&self) -> Result<&'a Map<String, Value>> {
        match self.value {
            Value::Object(m) => Ok(m),
            other => Err(self.err(format!("expected an object, got {}", kind(other)))),
        }
    }

    fn array(&self) -> Result<&'a Vec<Value>> {
        match self.value {
            Value::Array(a) => Ok(a),
            other => Err(self.err(format!("expected a list, got {}", kind(other)))),
        }
    }

    fn str(&self) -> Result<&'a str> {
        match self.value {
            Value::String(s) => Ok(s),
            other => Err(self.err(format!("expected a string, got {}", kind(other)))),
        }
    }

    /// A field of this object; absent and `null` (Go's nil) are the same.
    fn get(&self, key: &str) -> Option<Node<'a>> {
        match self.value {
            Value::Object(m) => m
                .get(key)
                .filter(|v| !v.is_null())
                .map(|v| self.child(key, v)),
            _ => None,
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key).map(|n| n.str()).transpose()
    }

    fn opt_int(&self, key: &str) -> Result<Option<i64>> {
        let Some(n) = self.get(key) else {
            return Ok(None);
        };
        match n.value {
            Value::Number(num) => match num.as_i64() {
                Some(i) => Ok(Some(i)),
                None => Err(n.err(format!("expected an integer, got {num}"))),
            },
            other => Err(n.err(format!("expected an integer, got {}", kind(other)))),
        }
    }

    fn opt_array(&self, key: &str) -> Result<Vec<Node<'a>>> {
        let Some(n) = self.get(key) else {
            return Ok(Vec::new());
        };
        let items = n.array()?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, v)| Node {
                value: v,
                path: format!("{}[{i}]", n.path),
            })
            .collect())
    }

    fn string_map(&self, key: &str) -> Result<BTreeMap<String, String>> {
        let Some(n) = self.get(key) else {
            return Ok(BTreeMap::new());
        };
        let mut out = BTreeMap::new();
        for (k, v) in n.object()? {
            let s = match v {
                Value::String(s) => s.clone(),
                // YAML may read `version: 2` or `enabled: true` as non-strings.
                Value::Number(num) => num.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(n
                        .key(k, v)
                        .err(format!("expected a string, got {}", kind(other))))
                }
            };
            out.insert(k.clone(), s);
        }
        Ok(out)
    }
}

/// Logs, at debug level, every field of `obj` berth does not read.
fn log_ignored(at: &Node<'_>, obj: &Map<String, Value>, known: &[&str]) {
    for key in obj.keys().filter(|k| !known.contains(&k.as_str())) {
        tracing::debug!(field = %join(&at.path, key), "ignoring field berth does not use");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xds() -> XdsDefaults {
        XdsDefaults {
            address: "127.0.0.1".into(),
            port: DEFAULT_XDS_PORT,
            ca_file: "/etc/berth/xds/ca.crt".into(),
            cert_file: "/etc/berth/xds/tls.crt".into(),
            key_file: "/etc/berth/xds/tls.key".into(),
        }
    }

    fn err(text: &str) -> String {
        parse_ir(text, &xds()).unwrap_err().to_string()
    }

    const LISTENER: &str = r#""listeners":[{"name":"ns/gw/http","ports":[{"name":"http-80","protocol":"HTTP","servicePort":80,"containerPort":80}]}]"#;

    fn with_config(config: &str) -> String {
        format!(r#"{{"proxy":{{"name":"ns/gw","config":{config},{LISTENER}}}}}"#)
    }

    #[test]
    fn berth_names() {
        assert_eq!(berth_name("ns/gw"), "ns-gw");
        assert_eq!(berth_name("default/eg"), "default-eg");
        assert_eq!(berth_name("eg"), "eg");
        assert_eq!(berth_name("edge-1"), "edge-1");
        // Ambiguous or lossy mappings get a hash.
        let a = berth_name("a-b/c");
        let b = berth_name("a/b-c");
        assert_ne!(a, b);
        assert!(
            a.starts_with("a-b-c-") && a.len() == "a-b-c-".len() + 8,
            "{a}"
        );
        let upper = berth_name("NS/Gw");
        assert!(upper.starts_with("ns-gw-"), "{upper}");
        assert_ne!(upper, berth_name("ns/gw"));
        assert!(berth_name("/x/").starts_with("x-"));
        assert_eq!(berth_name("").len(), 8);
        let long = berth_name(&"a".repeat(100));
        assert_eq!(long.len(), 63);
        assert!(long.starts_with(&"a".repeat(54)));
        for n in ["a.b/c_d", "ns/gw", &"x/".repeat(40), "Ünïcode/gw"] {
            let l = berth_name(n);
            assert!(l.len() <= 63 && !l.is_empty(), "{l}");
            assert!(!l.starts_with('-') && !l.ends_with('-'), "{l}");
            assert!(
                l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{l}"
            );
        }
    }

    #[test]
    fn go_durations() {
        let d = |s| parse_go_duration(s).unwrap();
        assert_eq!(d("60s"), Duration::from_secs(60));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("1h2m3s4ms"), Duration::from_millis(3_723_004));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "60", "-5s", "5 s", "1d", "s", ".s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quantities() {
        let q = |s| parse_quantity(s).unwrap();
        assert!((q("100m") - 0.1).abs() < 1e-12);
        assert_eq!(q("1.5"), 1.5);
        assert_eq!(q("2"), 2.0);
        assert_eq!(q("512Mi"), 536_870_912.0);
        assert_eq!(q("1G"), 1e9);
        assert_eq!(q("1Gi"), 1_073_741_824.0);
        assert_eq!(q("1e3"), 1000.0);
        assert_eq!(q("2E"), 2e18);
        assert!(parse_quantity("12XB").is_err());
        assert!(parse_quantity("Mi").is_err());
    }

    #[test]
    fn minimal_bare_proxy_gets_eg_defaults() {
        let p = parse_ir(&format!(r#"{{"name":"ns/gw",{LISTENER}}}"#), &xds()).unwrap();
        assert_eq!(p.len(), 1);
        let c = &p[0].proxy.config;
        assert_eq!(c.image, DEFAULT_IMAGE);
        assert_eq!(c.replicas, 1);
        assert_eq!(c.resources, ir::Resources::default());
        assert_eq!(c.shutdown, ir::Shutdown::default());
        assert_eq!(p[0].eg_name, "ns/gw");
        assert_eq!(p[0].proxy.name, "ns-gw");
        assert!(matches!(&p[0].proxy.routing, ir::Routing::Xds(x) if x.port == 18000));
    }

    #[test]
    fn no_listeners_is_empty_not_an_error() {
        let p = parse_ir("proxy:\n  name: ns/gw\n", &xds()).unwrap();
        assert!(p[0].is_empty());
        let p = parse_ir(r#"{"proxy":{"name":"ns/gw","listeners":null}}"#, &xds()).unwrap();
        assert!(p[0].is_empty());
    }

    #[test]
    fn image_repository_gets_default_tag() {
        let p = parse_ir(
            &with_config(
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"imageRepository":"registry.local/envoy"}}}}}}"#,
            ),
            &xds(),
        )
        .unwrap();
        assert_eq!(
            p[0].proxy.config.image,
            "registry.local/envoy:distroless-dev"
        );
    }

    #[test]
    fn requests_stand_in_for_missing_limits() {
        let p = parse_ir(
            &with_config(
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"resources":{"limits":{"memory":"1Gi"},"requests":{"cpu":"250m","memory":"512Mi"}}}}}}}}"#,
            ),
            &xds(),
        )
        .unwrap();
        let r = &p[0].proxy.config.resources;
        assert_eq!(r.memory, Some(1 << 30));
        assert_eq!(r.cpus, Some(0.25));
    }

    #[test]
    fn daemonset_container_is_read_and_means_one_replica() {
        let p = parse_ir(
            &with_config(
                r#"{"spec":{"provider":{"kubernetes":{"envoyDaemonSet":{"container":{"image":"envoy:ds"}}}}}}"#,
            ),
            &xds(),
        )
        .unwrap();
        assert_eq!(p[0].proxy.config.image, "envoy:ds");
        assert_eq!(p[0].proxy.config.replicas, 1);
    }

    #[test]
    fn json_patch_bootstrap_keeps_the_patch_list() {
        let p = parse_ir(
            &with_config(
                r#"{"spec":{"bootstrap":{"type":"JSONPatch","jsonPatches":[{"op":"add","path":"/a","value":1}]}}}"#,
            ),
            &xds(),
        )
        .unwrap();
        let b = p[0].proxy.config.bootstrap.as_ref().unwrap();
        assert_eq!(b.kind, ir::BootstrapOverrideKind::JSONPatch);
        assert_eq!(b.value, r#"[{"op":"add","path":"/a","value":1}]"#);
    }

    #[test]
    fn bootstrap_type_defaults_to_replace() {
        let p = parse_ir(
            &with_config(r#"{"spec":{"bootstrap":{"value":"admin: {}"}}}"#),
            &xds(),
        )
        .unwrap();
        let b = p[0].proxy.config.bootstrap.as_ref().unwrap();
        assert_eq!(b.kind, ir::BootstrapOverrideKind::Replace);
    }

    #[test]
    fn differing_container_port_wins() {
        let p = parse_ir(
            r#"{"name":"ns/gw","listeners":[{"name":"ns/gw/http","ports":[{"name":"http-80","protocol":"http","servicePort":80,"containerPort":10080}]}]}"#,
            &xds(),
        )
        .unwrap();
        let port = &p[0].proxy.listeners[0].ports[0];
        assert_eq!((port.service_port, port.container_port), (10080, 10080));
        assert_eq!(port.protocol, ir::Protocol::Http);
    }

    #[test]
    fn negative_replicas() {
        assert_eq!(
            err(&with_config(
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":-1}}}}}"#
            )),
            "proxy.config.spec.provider.kubernetes.envoyDeployment.replicas: must be ≥ 0, got -1"
        );
    }

    #[test]
    fn non_integer_replicas() {
        let e = err(&with_config(
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":"two"}}}}}"#,
        ));
        assert!(
            e.starts_with("proxy.config.spec.provider.kubernetes.envoyDeployment.replicas: "),
            "{e}"
        );
    }

    #[test]
    fn unknown_protocol() {
        let e = err(
            r#"{"proxy":{"name":"ns/gw","listeners":[{"name":"l","ports":[{"name":"p","protocol":"SCTP","servicePort":80,"containerPort":80}]}]}}"#,
        );
        assert!(
            e.starts_with("proxy.listeners[0].ports[0].protocol: unknown protocol \"SCTP\""),
            "{e}"
        );
    }

    #[test]
    fn port_out_of_range() {
        for (port, field) in [("0", "servicePort"), ("70000", "servicePort")] {
            let e = err(&format!(
                r#"{{"proxy":{{"name":"ns/gw","listeners":[{{"name":"l","ports":[{{"name":"p","protocol":"TCP","servicePort":{port},"containerPort":80}}]}}]}}}}"#
            ));
            assert_eq!(
                e,
                format!("proxy.listeners[0].ports[0].{field}: must be in 1..=65535, got {port}")
            );
        }
        let e = err(
            r#"{"proxy":{"name":"ns/gw","listeners":[{"name":"l","ports":[{"name":"p","protocol":"TCP","servicePort":80,"containerPort":-3}]}]}}"#,
        );
        assert_eq!(
            e,
            "proxy.listeners[0].ports[0].containerPort: must be in 1..=65535, got -3"
        );
    }

    #[test]
    fn empty_names() {
        assert_eq!(
            err(&format!(r#"{{"proxy":{{"name":"",{LISTENER}}}}}"#)),
            "proxy.name: must not be empty"
        );
        assert_eq!(
            err(r#"{"proxy":{"name":"x","listeners":[{"name":"","ports":[]}]}}"#),
            "proxy.listeners[0].name: must not be empty"
        );
        assert_eq!(
            err(
                r#"{"proxy":{"name":"x","listeners":[{"name":"l","ports":[{"protocol":"TCP","servicePort":1,"containerPort":1}]}]}}"#
            ),
            "proxy.listeners[0].ports[0].name: must not be empty"
        );
        assert_eq!(
            err(r#"{"proxy":{"name":"x","listeners":[{"name":"l"}]}}"#),
            "proxy.listeners[0].ports: a listener needs at least one port"
        );
    }

    #[test]
    fn bad_config_values_name_their_field() {
        let cases = [
            (
                r#"{"spec":{"logging":{"level":{"default":"loud"}}}}"#,
                "proxy.config.spec.logging.level.default: unknown log level",
            ),
            (
                r#"{"spec":{"shutdown":{"drainTimeout":"forever"}}}"#,
                "proxy.config.spec.shutdown.drainTimeout: ",
            ),
            (
                r#"{"spec":{"concurrency":-2}}"#,
                "proxy.config.spec.concurrency: must be ≥ 0, got -2",
            ),
            (
                r#"{"spec":{"bootstrap":{"type":"Patch","value":"x"}}}"#,
                "proxy.config.spec.bootstrap.type: unknown bootstrap type",
            ),
            (
                r#"{"spec":{"bootstrap":{"type":"Merge"}}}"#,
                "proxy.config.spec.bootstrap.value: required when type is Merge",
            ),
            (
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"resources":{"limits":{"memory":"lots"}}}}}}}}"#,
                "proxy.config.spec.provider.kubernetes.envoyDeployment.container.resources.limits.memory: ",
            ),
            (
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"resources":{"limits":{"cpu":"-1"}}}}}}}}"#,
                "proxy.config.spec.provider.kubernetes.envoyDeployment.container.resources.limits.cpu: must be ≥ 0",
            ),
            (
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"env":[{"value":"x"}]}}}}}}"#,
                "proxy.config.spec.provider.kubernetes.envoyDeployment.container.env[0].name: must not be empty",
            ),
            (
                r#"{"spec":{"extraArgs":"--foo"}}"#,
                "proxy.config.spec.extraArgs: expected a list, got a string",
            ),
            (
                r#""just a string""#,
                "proxy.config: expected an object, got a string",
            ),
        ];
        for (config, want) in cases {
            let e = err(&with_config(config));
            assert!(
                e.starts_with(want),
                "config {config}\n got: {e}\nwant: {want}…"
            );
        }
    }

    #[test]
    fn not_an_ir() {
        assert!(err("- a\n- b\n").starts_with("expected an Envoy Gateway infra IR object"));
        assert!(err("foo: bar\n").starts_with("not an Envoy Gateway infra IR"));
        assert!(err("{\"proxy\": ").starts_with("malformed JSON"));
        assert!(err("proxy: [\n").starts_with("malformed YAML"));
    }

    #[test]
    fn infra_ir_map_paths_quote_keys() {
        let e = err(
            "infraIR:\n  ns/gw:\n    proxy:\n      name: ns/gw\n      listeners:\n      - name: l\n        ports:\n        - {name: p, protocol: QUIC, servicePort: 1, containerPort: 1}\n",
        );
        assert!(
            e.starts_with(r#"infraIR["ns/gw"].proxy.listeners[0].ports[0].protocol: "#),
            "{e}"
        );
    }

    #[test]
    fn proto_parts_map_like_the_file_form() {
        let parts = ProxyParts {
            name: "ns/gw".into(),
            namespace: "envoy-gateway-system".into(),
            config_json:
                br#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":3}}}}}"#
                    .to_vec(),
            listeners: vec![ListenerParts {
                name: "ns/gw/http".into(),
                ports: vec![PortParts {
                    name: "http-80".into(),
                    protocol: "HTTP".into(),
                    service_port: 80,
                    container_port: 80,
                }],
                http3: false,
            }],
            ..Default::default()
        };
        let from_proto = from_proto_parts(parts, "infra.proxy", &xds()).unwrap();
        let from_file = parse_ir(
            &with_config(
                r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":3}}}}}"#,
            )
            .replace(
                r#""name":"ns/gw","#,
                r#""name":"ns/gw","namespace":"envoy-gateway-system","#,
            ),
            &xds(),
        )
        .unwrap();
        assert_eq!(from_proto, from_file[0]);

        let bad = ProxyParts {
            name: "ns/gw".into(),
            config_json: b"{not json".to_vec(),
            ..Default::default()
        };
        let e = from_proto_parts(bad, "infra.proxy", &xds())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("infra.proxy.config: malformed EnvoyProxy JSON"),
            "{e}"
        );
    }
}
