//! EG's `ProxyInfra` (name, metadata, listeners, addresses) → berth's [`ir::ProxyInfra`].

use std::collections::BTreeMap;

use serde_json::Value;

use super::envoyproxy::envoy_proxy;
use super::node::{join, log_ignored, Node};
use super::{berth_name, ir_key, EgError, EgProxy, Result, XdsDefaults};
use crate::core::ir;

/// A ProxyInfra with its structure checked but its values not yet validated.
pub(super) struct RawProxy {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) annotations: BTreeMap<String, String>,
    pub(super) listeners: Vec<RawListener>,
    pub(super) addresses: Vec<String>,
    /// `metadata.ownerReference.kind`: "Gateway" in EG's gateway-namespace mode.
    pub(super) owner_kind: Option<String>,
}

pub(super) struct RawListener {
    pub(super) name: String,
    pub(super) ports: Vec<RawPort>,
    pub(super) http3: bool,
}

pub(super) struct RawPort {
    pub(super) name: String,
    pub(super) protocol: String,
    pub(super) service_port: Option<i64>,
    pub(super) container_port: Option<i64>,
}

pub(super) fn proxy_from_value(
    at: Node<'_>,
    key: Option<&str>,
    xds: &XdsDefaults,
) -> Result<EgProxy> {
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
    let mut owner_kind = None;
    if let Some(meta) = at.get("metadata") {
        let obj = meta.object()?;
        log_ignored(&meta, obj, &["labels", "annotations", "ownerReference"]);
        labels = meta.string_map("labels")?;
        annotations = meta.string_map("annotations")?;
        if let Some(owner) = meta.get("ownerReference") {
            owner.object()?;
            owner_kind = owner.opt_str("kind")?.map(str::to_string);
        }
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
        owner_kind,
    };
    let config_path = join(&at.path, "config");
    let config = at.get("config").map(|n| n.value).unwrap_or(&Value::Null);
    build(raw, Node::root(config, &config_path), &at.path, xds)
}

pub(super) fn build(
    raw: RawProxy,
    config: Node<'_>,
    path: &str,
    xds: &XdsDefaults,
) -> Result<EgProxy> {
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
    let key = ir_key(&raw.name, &raw.namespace, raw.owner_kind.as_deref());
    let proxy = ir::ProxyInfra {
        metadata: ir::InfraMetadata {
            labels: raw.labels,
            annotations: raw.annotations,
        },
        name: berth_name(&key),
        namespace: raw.namespace,
        config,
        listeners,
        addresses: raw.addresses,
        rollout: ir::RolloutPolicy::default(),
        placement: ir::Placement::default(),
        routing: ir::Routing::Xds(xds.server()),
        service_cluster: Some(key.clone()),
    };
    Ok(EgProxy {
        eg_name: key,
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
        address: None,
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
