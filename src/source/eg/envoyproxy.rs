//! EG's EnvoyProxy resource → berth's [`ir::EnvoyProxy`]: the subset berth honours, every
//! other field ignored with a `debug` log.

use std::collections::BTreeMap;

use super::node::{log_ignored, Node};
use super::units::{cpu_quantity, duration, memory_quantity};
use super::{EgError, Result, DEFAULT_IMAGE, DEFAULT_IMAGE_TAG};
use crate::ir;

/// Maps the EnvoyProxy resource (the full `{apiVersion, kind, metadata, spec}` or just its
/// `spec`) to berth's flat subset. `Null` means EG's defaults.
pub(super) fn envoy_proxy(at: Node<'_>) -> Result<ir::EnvoyProxy> {
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
