//! The top level and each proxy: name, namespace, image, replicas; host port bookkeeping.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::core::ir;

use super::check::{self, show};
use super::doc::{self, Ctx, Span, Tbl};
use super::fields::{name, unique, Ports};
use super::gateway::{self, EnvoyGateway};
use super::listener;
use super::settings::{bootstrap, env, extra_args, labels, logging, resources, rollout, shutdown};

/// The image used when a proxy names none.
pub const DEFAULT_IMAGE: &str = "envoyproxy/envoy:v1.36.2";
pub const MAX_REPLICAS: i64 = 32;
pub const MAX_CONCURRENCY: i64 = 128;

const ROOT_KEYS: &[&str] = &[
    "state_dir",
    "tune_host",
    "engine",
    "swarm",
    "envoy_gateway",
    "serve",
    "proxy",
];
const PROXY_KEYS: &[&str] = &[
    "name",
    "namespace",
    "image",
    "pull",
    "replicas",
    "concurrency",
    "log_level",
    "labels",
    "annotations",
    "env",
    "extra_args",
    "resources",
    "shutdown",
    "rollout",
    "bootstrap",
    "listener",
    "backend",
    "xds",
    "swarm",
];

/// The walked top level.
pub(super) struct Root {
    pub state_dir: Option<PathBuf>,
    pub tune_host: bool,
    pub engine: crate::core::policy::EngineKind,
    pub swarm: crate::core::policy::SwarmSettings,
    pub infra: ir::Infra,
    pub envoy_gateway: Option<EnvoyGateway>,
    pub serve: super::serve::ServeSection,
    pub notes: Vec<String>,
}

/// The top level: `state_dir`, `tune_host` (default true), `[envoy_gateway]` and the proxies
/// (those of `[[proxy]]` first, then those of the IR files).
pub(super) fn root(cx: &mut Ctx, t: &Tbl) -> Root {
    t.check_keys(cx, ROOT_KEYS);
    let tune_host = match t.get("tune_host") {
        None => true,
        Some(v) => match v.get_ref() {
            toml::de::DeValue::Boolean(b) => *b,
            other => {
                cx.err(
                    &v.span(),
                    &t.field("tune_host"),
                    format!(
                        "must be true or false (may berth set net.ipv4.tcp_migrate_req=1), got {}",
                        doc::kind(other)
                    ),
                );
                true
            }
        },
    };
    let state_dir = t.str(cx, "state_dir").and_then(|s| {
        if s.v.is_empty() {
            s.err(cx, "must be a directory path, got an empty string");
            return None;
        }
        if let Err(m) = check::plain(s.v, 4096) {
            s.err(cx, m);
            return None;
        }
        Some(cx.resolve(s.v))
    });
    let engine = super::swarm::engine(cx, t);
    let swarm = super::swarm::settings(cx, t, engine);
    let gateway = gateway::section(cx, t);
    let serve = super::serve::section(cx, t);
    let proxies = t.tables(cx, "proxy", PROXY_KEYS);
    super::swarm::only_on_swarm(cx, engine, &proxies);
    let none = match t.get("proxy") {
        None => true,
        Some(v) => v.get_ref().as_array().is_some_and(|a| a.is_empty()),
    };
    let eg_provides = gateway.as_ref().is_some_and(|(g, _)| g.provides_proxies());
    if none && !eg_provides {
        cx.err(
            &(0..0),
            "proxy",
            "no proxies defined; add at least one [[proxy]] table with a name and a listener (or [envoy_gateway] with ir_files or remote)",
        );
    }
    let mut ports = Ports(Vec::new());
    let mut names: BTreeMap<String, Span> = BTreeMap::new();
    let mut infra = ir::Infra::default();
    for p in &proxies {
        let proxy = proxy(cx, p, &mut ports, &mut names);
        infra.proxies.push(proxy);
    }
    let mut notes = Vec::new();
    if let Some((gw, files)) = &gateway {
        gateway::add_ir_proxies(
            cx, gw, files, &mut ports, &mut names, &mut infra, &mut notes,
        );
    }
    Root {
        state_dir,
        tune_host,
        engine,
        swarm,
        infra,
        envoy_gateway: gateway.map(|(g, _)| g),
        serve,
        notes,
    }
}

fn proxy(
    cx: &mut Ctx,
    t: &Tbl,
    ports: &mut Ports,
    names: &mut BTreeMap<String, Span>,
) -> ir::ProxyInfra {
    let name = name(cx, t, "edge");
    unique(cx, names, &name, "proxy");
    let namespace = match t.str(cx, "namespace") {
        Some(n) => {
            if let Err(m) = check::dns_label(n.v) {
                n.err(cx, m);
            }
            n.v.to_string()
        }
        None => "default".to_string(),
    };
    let image = match t.str(cx, "image") {
        Some(i) => {
            if let Err(m) = image_ref(i.v) {
                i.err(cx, m);
            }
            i.v.to_string()
        }
        None => DEFAULT_IMAGE.to_string(),
    };
    let pull = match t.str(cx, "pull") {
        None => ir::PullPolicy::default(),
        Some(s) => match s.v {
            "missing" => ir::PullPolicy::Missing,
            "always" => ir::PullPolicy::Always,
            other => {
                s.err(
                    cx,
                    format!(
                        "must be \"missing\" (pull only when no local image has the name; the default, as in compose) or \"always\" (ask the registry on every up and serve's tag checks), got {}",
                        show(other)
                    ),
                );
                ir::PullPolicy::default()
            }
        },
    };
    let replicas = t
        .int(cx, "replicas", 1, MAX_REPLICAS)
        .map_or(1, |r| r.v as u32);
    let concurrency = t
        .int(cx, "concurrency", 1, MAX_CONCURRENCY)
        .map(|c| c.v as u32);
    let config = ir::EnvoyProxy {
        image,
        replicas,
        resources: resources(cx, t),
        env: env(cx, t),
        concurrency,
        extra_args: extra_args(cx, t),
        logging: logging(cx, t),
        shutdown: shutdown(cx, t),
        bootstrap: bootstrap(cx, t),
        pull,
    };
    let metadata = ir::InfraMetadata {
        labels: labels(cx, t, "labels"),
        annotations: labels(cx, t, "annotations"),
    };
    let rollout = rollout(cx, t);
    let (listeners, routing) = listener::routing(cx, t, ports);
    ir::ProxyInfra {
        metadata,
        name: name.v,
        namespace,
        config,
        listeners,
        addresses: Vec::new(),
        rollout,
        placement: super::swarm::placement(cx, t),
        routing,
        service_cluster: None,
    }
}

/// A Docker image reference: `[registry/]repo[:tag][@digest]`.
fn image_ref(s: &str) -> Result<(), String> {
    let allowed = "must be a Docker image reference like \"envoyproxy/envoy:v1.36.2\" (lowercase repository; letters, digits and ._-/:@ only)";
    let ok_chars = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c));
    let first_ok = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok_chars || !first_ok || s.len() > 255 {
        return Err(format!("{allowed}; got {}", show(s)));
    }
    let without_digest = s.split('@').next().unwrap_or(s);
    let repo = match without_digest.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => without_digest,
    };
    // The registry host may carry a port; the path must be lowercase.
    let path = repo.split_once('/').map_or(repo, |(_, p)| p);
    if path.chars().any(|c| c.is_ascii_uppercase()) || repo.is_empty() {
        return Err(format!("{allowed}; got {}", show(s)));
    }
    Ok(())
}
