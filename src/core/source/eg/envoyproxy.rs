//! EG's EnvoyProxy resource → berth's [`ir::EnvoyProxy`]: the subset berth honours, every
//! other field ignored with a `debug` log.

use std::collections::BTreeMap;

use super::node::{log_ignored, Node};
use super::units::{cpu_quantity, duration, memory_quantity};
use super::{default_image_tag, EgError, Result, DEFAULT_IMAGE};
use crate::core::ir;

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
        pull: Default::default(),
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
        // Passed through as EG does: Envoy runs one worker for `--concurrency 0`.
        out.concurrency =
            Some(u32::try_from(n).map_err(|_| EgError::new(at, format!("too large: {n}")))?);
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
    // After `concurrency` and `logging`: whether a flag in extraArgs repeats one EG sets
    // depends on them.
    extra_args(&spec.opt_array("extraArgs")?, &mut out)?;
    if let Some(shutdown) = spec.get("shutdown") {
        log_ignored(
            &shutdown,
            shutdown.object()?,
            &[
                "drainTimeout",
                "minDrainDuration",
                "healthCheckFailureDelay",
            ],
        );
        if let Some(d) = shutdown.get("drainTimeout") {
            out.shutdown.drain_timeout = duration(&d)?;
        }
        if let Some(d) = shutdown.get("minDrainDuration") {
            out.shutdown.min_drain_duration = duration(&d)?;
        }
        if let Some(d) = shutdown.get("healthCheckFailureDelay") {
            out.shutdown.health_check_failure_delay = duration(&d)?;
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
            out.image = format!("{repo}:{}", default_image_tag());
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
        // As EG's Deployment: limits cap the container (CPU quota, memory limit, and so the
        // heap cap); requests only reserve capacity for a scheduler, which one host does not
        // have, so they cap nothing.
        if let Some(requests) = res.get("requests") {
            requests.object()?;
            tracing::debug!(
                field = %requests.path,
                "resources.requests reserve nothing on one host and cap nothing; limits cap"
            );
        }
        if let Some(limits) = res.get("limits") {
            log_ignored(&limits, limits.object()?, &["cpu", "memory"]);
            if let Some(cpu) = limits.get("cpu") {
                out.resources.cpus = Some(cpu_quantity(&cpu)?);
            }
            if let Some(mem) = limits.get("memory") {
                out.resources.memory = Some(memory_quantity(&mem)?);
            }
        }
    }
    Ok(())
}

/// Envoy flags Envoy Gateway always passes (`BuildProxyArgs`), or berth passes in their place.
/// Envoy parses its command line with TCLAP, which exits at start ("Argument already set!")
/// when a flag is repeated, so an EnvoyProxy that repeats one in `extraArgs` does not run
/// under EG either: berth refuses it at input, naming the item, before anything starts.
const FLAGS_EG_SETS: &[(&str, &str)] = &[
    (
        "--service-cluster",
        "Envoy Gateway sets it to the proxy's IR key",
    ),
    ("--service-node", "it is set to each replica's own name"),
    ("--config-yaml", "the bootstrap comes from spec.bootstrap"),
    ("-c", "the bootstrap comes from spec.bootstrap"),
    ("--config-path", "the bootstrap comes from spec.bootstrap"),
    ("--log-level", "use spec.logging.level.default"),
    ("-l", "use spec.logging.level.default"),
    ("--cpuset-threads", "Envoy Gateway always sets it"),
    ("--drain-strategy", "Envoy Gateway sets it to immediate"),
    ("--drain-time-s", "use spec.shutdown.drainTimeout"),
    ("--mode", "replicas run in serve mode"),
    (
        "--restart-epoch",
        "replicas run with --disable-hot-restart (they share one host)",
    ),
    (
        "--base-id",
        "replicas run with --disable-hot-restart (they share one host)",
    ),
    (
        "--use-dynamic-base-id",
        "replicas run with --disable-hot-restart (they share one host)",
    ),
];

/// Maps `spec.extraArgs`. A flag EG sets only from another field is the user's to set when
/// that field is unset, exactly as under EG: `--concurrency N` becomes the proxy's concurrency
/// (berth then passes no worker count of its own), `--component-log-level` stays as given
/// (berth passes none unless `logging.level` names components). `--disable-hot-restart`,
/// which berth always passes, is dropped as a duplicate.
fn extra_args(items: &[Node<'_>], out: &mut ir::EnvoyProxy) -> Result<()> {
    let mut i = 0;
    while i < items.len() {
        let at = &items[i];
        let arg = at.str()?;
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v)),
            _ => (arg, None),
        };
        if let Some((_, why)) = FLAGS_EG_SETS.iter().find(|(f, _)| *f == flag) {
            return Err(at.err(format!(
                "{flag} cannot be given here: {why} (Envoy exits at start when a flag is \
                 repeated: \"Argument already set!\")"
            )));
        }
        match flag {
            "--concurrency" => {
                let (value, used) = match inline {
                    Some(v) => (v.to_string(), 1),
                    None => match items.get(i + 1) {
                        Some(next) => (next.str()?.to_string(), 2),
                        None => return Err(at.err("--concurrency needs a value")),
                    },
                };
                if out.concurrency.is_some() {
                    return Err(at.err(
                        "--concurrency repeats spec.concurrency, which Envoy Gateway passes as \
                         --concurrency (Envoy exits at start: \"Argument already set!\"); set \
                         one of them",
                    ));
                }
                let n: u32 = value.trim().parse().map_err(|_| {
                    at.err(format!(
                        "--concurrency needs a number of worker threads, got {value:?}"
                    ))
                })?;
                out.concurrency = Some(n);
                i += used;
                continue;
            }
            "--component-log-level" if out.logging.component_levels().next().is_some() => {
                return Err(at.err(
                    "--component-log-level repeats spec.logging.level, whose components \
                     Envoy Gateway passes as --component-log-level (Envoy exits at start: \
                     \"Argument already set!\"); set one of them",
                ));
            }
            "--disable-hot-restart" => {
                i += 1;
                continue;
            }
            _ => {}
        }
        out.extra_args.push(arg.to_string());
        i += 1;
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
