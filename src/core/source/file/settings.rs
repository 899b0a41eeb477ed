//! Proxy-wide settings: resources, logging, labels, env, args, shutdown, rollout, bootstrap.

use std::collections::BTreeMap;

use crate::core::ir;

use super::check::{self, show};
use super::doc::{self, Ctx, Item, Tbl};
use super::fields::{duration, MIN_MEMORY};

const LOG_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "critical", "off"];
/// Label prefixes that belong to berth or Docker.
const RESERVED_LABEL_PREFIXES: &[&str] = &[
    "io.berth.",
    "com.docker.",
    "io.docker.",
    "org.dockerproject.",
];
/// Envoy flags berth sets itself, and the setting to use instead.
const OWNED_ARGS: &[(&str, &str)] = &[
    ("-c", "berth renders the bootstrap; use [proxy.bootstrap]"),
    (
        "--config-path",
        "berth renders the bootstrap; use [proxy.bootstrap]",
    ),
    (
        "--config-yaml",
        "berth renders the bootstrap; use [proxy.bootstrap]",
    ),
    ("--service-cluster", "berth sets it to the proxy name"),
    ("--service-node", "berth sets it to the replica name"),
    ("-l", "use log_level"),
    ("--log-level", "use log_level"),
    (
        "--component-log-level",
        "use log_level = { default = \"info\", upstream = \"debug\" }",
    ),
    ("--concurrency", "use concurrency"),
    ("--drain-time-s", "use [proxy.shutdown] drain_timeout"),
    ("--drain-strategy", "berth sets it"),
    ("--base-id", "berth disables hot restart"),
    ("--disable-hot-restart", "berth sets it"),
];

/// Where each host port is bound, for the across-proxies uniqueness check.
pub(super) fn resources(cx: &mut Ctx, p: &Tbl) -> ir::Resources {
    let mut r = ir::Resources::default();
    let Some(t) = p.sub(cx, "resources", &["cpus", "memory"]) else {
        return r;
    };
    if let Some(v) = t.get("cpus") {
        if let Some(c) = doc::float(cx, v, t.field("cpus")) {
            if c.v > 0.0 && c.v <= 1024.0 {
                r.cpus = Some(c.v);
            } else {
                c.err(cx, format!("must be more than 0 and at most 1024 (a fraction of CPUs, e.g. 0.5 or 2), got {}", c.v));
            }
        }
    }
    if let Some(v) = t.get("memory") {
        let field = t.field("memory");
        let bytes = match v.get_ref() {
            toml::de::DeValue::String(s) => check::size(s),
            toml::de::DeValue::Integer(_) => doc::int(cx, v, field.clone(), 0, i64::MAX)
                .map(|n| n.v as u64)
                .ok_or_else(String::new),
            other => Err(format!(
                "must be a size string like \"512Mi\" or a number of bytes, got {}",
                doc::kind(other)
            )),
        };
        match bytes {
            Ok(b) if b < MIN_MEMORY => cx.err(
                &v.span(),
                &field,
                format!(
                    "must be at least 32Mi ({MIN_MEMORY} bytes) for Envoy to run, got {b} bytes"
                ),
            ),
            Ok(b) => r.memory = Some(b),
            Err(m) if m.is_empty() => {}
            Err(m) => cx.err(&v.span(), &field, m),
        }
    }
    r
}

pub(super) fn logging(cx: &mut Ctx, p: &Tbl) -> ir::Logging {
    let mut level = BTreeMap::new();
    let Some(v) = p.get("log_level") else {
        return ir::Logging { level };
    };
    let field = p.field("log_level");
    let parse_level = |cx: &mut Ctx, item: &Item<&str>| -> Option<ir::LogLevel> {
        let l = match item.v {
            "trace" => ir::LogLevel::Trace,
            "debug" => ir::LogLevel::Debug,
            "info" => ir::LogLevel::Info,
            "warn" | "warning" => ir::LogLevel::Warn,
            "error" => ir::LogLevel::Error,
            "critical" => ir::LogLevel::Critical,
            "off" => ir::LogLevel::Off,
            other => {
                item.err(
                    cx,
                    format!(
                        "must be one of {}, got {}",
                        LOG_LEVELS.join(", "),
                        show(other)
                    ),
                );
                return None;
            }
        };
        Some(l)
    };
    match v.get_ref() {
        toml::de::DeValue::Table(_) => {
            for (k, val) in doc::string_map(cx, v, field).unwrap_or_default() {
                let component_ok = !k.v.is_empty()
                    && k.v.len() <= 64
                    && k.v
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !component_ok {
                    k.err(cx, format!("must be \"default\" or an Envoy log component name (a–z, 0–9, '_'), e.g. upstream, http, router; got {}", show(k.v)));
                    continue;
                }
                if let Some(l) = parse_level(cx, &val) {
                    level.insert(k.v.to_string(), l);
                }
            }
        }
        _ => {
            if let Some(s) = doc::string(cx, v, field) {
                if let Some(l) = parse_level(cx, &s) {
                    level.insert("default".to_string(), l);
                }
            }
        }
    }
    ir::Logging { level }
}

/// `labels` / `annotations`: Docker-label-safe keys, no reserved prefixes.
pub(super) fn labels(cx: &mut Ctx, p: &Tbl, key: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(v) = p.get(key) else {
        return out;
    };
    for (k, val) in doc::string_map(cx, v, p.field(key)).unwrap_or_default() {
        let key_ok = !k.v.is_empty()
            && k.v.len() <= 253
            && k.v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
            && k.v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && k.v.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !key_ok {
            k.err(cx, format!("must be a label key of letters, digits and ._-/ (1–253 characters, starting and ending with a letter or digit), e.g. \"team\" or \"com.example.owner\"; got {}", show(k.v)));
            continue;
        }
        if let Some(prefix) = RESERVED_LABEL_PREFIXES
            .iter()
            .find(|p| k.v.to_ascii_lowercase().starts_with(*p))
        {
            k.err(cx, format!("keys starting with \"{prefix}\" are reserved (berth and Docker use them); choose another prefix"));
            continue;
        }
        if let Err(m) = check::plain(val.v, check::MAX_VALUE) {
            val.err(cx, m);
            continue;
        }
        out.insert(k.v.to_string(), val.v.to_string());
    }
    out
}

pub(super) fn env(cx: &mut Ctx, p: &Tbl) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(v) = p.get("env") else {
        return out;
    };
    for (k, val) in doc::string_map(cx, v, p.field("env")).unwrap_or_default() {
        let key_ok = k.v.len() <= 256
            && k.v
                .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !key_ok {
            k.err(cx, format!("must be an environment variable name: letters, digits and '_', not starting with a digit; got {}", show(k.v)));
            continue;
        }
        if val.v.contains('\0') || val.v.len() > 32 * 1024 {
            val.err(
                cx,
                "must not contain NUL characters and must be at most 32768 bytes",
            );
            continue;
        }
        out.insert(k.v.to_string(), val.v.to_string());
    }
    out
}

pub(super) fn extra_args(cx: &mut Ctx, p: &Tbl) -> Vec<String> {
    let mut out = Vec::new();
    let Some((items, _, field)) = p.array(cx, "extra_args") else {
        return out;
    };
    for (i, v) in items.iter().enumerate() {
        let Some(s) = doc::string(cx, v, format!("{field}[{i}]")) else {
            continue;
        };
        if let Err(m) = check::plain(s.v, 4096) {
            s.err(cx, m);
            continue;
        }
        let flag = s.v.split('=').next().unwrap_or("");
        if let Some((_, instead)) = OWNED_ARGS.iter().find(|(f, _)| *f == flag) {
            s.err(cx, format!("{flag} is set by berth ({instead})"));
            continue;
        }
        out.push(s.v.to_string());
    }
    out
}

pub(super) fn shutdown(cx: &mut Ctx, p: &Tbl) -> ir::Shutdown {
    let d = ir::Shutdown::default();
    let keys = [
        "drain_timeout",
        "min_drain_duration",
        "health_check_failure_delay",
    ];
    let Some(t) = p.sub(cx, "shutdown", &keys) else {
        return d;
    };
    let drain_timeout = duration(cx, &t, "drain_timeout", d.drain_timeout, false);
    let min_drain_duration = duration(cx, &t, "min_drain_duration", d.min_drain_duration, true);
    let health_check_failure_delay = duration(
        cx,
        &t,
        "health_check_failure_delay",
        d.health_check_failure_delay,
        true,
    );
    if min_drain_duration > drain_timeout {
        let span = t
            .get("min_drain_duration")
            .map_or(t.span.clone(), |v| v.span());
        cx.err(
            &span,
            &t.field("min_drain_duration"),
            format!(
                "must not be longer than drain_timeout ({}s), got {}s",
                drain_timeout.as_secs_f64(),
                min_drain_duration.as_secs_f64()
            ),
        );
    }
    ir::Shutdown {
        drain_timeout,
        min_drain_duration,
        health_check_failure_delay,
    }
}

pub(super) fn rollout(cx: &mut Ctx, p: &Tbl) -> ir::RolloutPolicy {
    let d = ir::RolloutPolicy::default();
    let keys = [
        "startup_deadline",
        "min_ready",
        "drain_timeout",
        "on_failure",
        "max_surge",
        "judge_traffic",
        "canary",
    ];
    let Some(t) = p.sub(cx, "rollout", &keys) else {
        return d;
    };
    if t.get("drain_timeout").is_some() {
        cx.err(
            &t.key_span("drain_timeout"),
            &t.field("drain_timeout"),
            "has moved: the drain window of a retiring replica is [proxy.shutdown] drain_timeout \
             (Envoy Gateway's shutdown.drainTimeout, default 60s); set it there",
        );
    }
    let on_failure = match t.str(cx, "on_failure") {
        None => d.on_failure,
        Some(s) => match s.v {
            "rollback" => ir::OnFailure::Rollback,
            "pause" => ir::OnFailure::Pause,
            other => {
                s.err(
                    cx,
                    format!("must be \"rollback\" or \"pause\", got {}", show(other)),
                );
                d.on_failure
            }
        },
    };
    ir::RolloutPolicy {
        startup_deadline: duration(cx, &t, "startup_deadline", d.startup_deadline, false),
        min_ready: duration(cx, &t, "min_ready", d.min_ready, true),
        on_failure,
        max_surge: max_surge(cx, &t).unwrap_or(d.max_surge),
        judge_traffic: t.bool(cx, "judge_traffic").map_or(d.judge_traffic, |b| b.v),
        canary: canary(cx, &t),
    }
}

/// `[proxy.rollout.canary]`: replicas, hold, max_error_ratio, min_requests.
fn canary(cx: &mut Ctx, t: &Tbl) -> Option<crate::core::rollout::Canary> {
    let keys = ["replicas", "hold", "max_error_ratio", "min_requests"];
    let c = t.sub(cx, "canary", &keys)?;
    let d = crate::core::rollout::Canary::default();
    let max_error_ratio = match c.get("max_error_ratio") {
        None => d.thresholds.max_error_ratio,
        Some(v) => match doc::float(cx, v, c.field("max_error_ratio")) {
            Some(f) if (0.0..=1.0).contains(&f.v) => f.v,
            Some(f) => {
                f.err(
                    cx,
                    format!(
                        "must be a fraction from 0.0 to 1.0 (0.05: the canaries may fail 5 \
                         points more of their requests than the old replicas), got {}",
                        f.v
                    ),
                );
                d.thresholds.max_error_ratio
            }
            None => d.thresholds.max_error_ratio,
        },
    };
    Some(crate::core::rollout::Canary {
        replicas: c
            .int(cx, "replicas", 1, 32)
            .map_or(d.replicas, |n| n.v as u32),
        hold: duration(cx, &c, "hold", d.hold, true),
        thresholds: crate::core::rollout::Thresholds {
            min_requests: c
                .int(cx, "min_requests", 1, 1_000_000_000)
                .map_or(d.thresholds.min_requests, |n| n.v as u64),
            max_error_ratio,
        },
    })
}

/// `max_surge = 2` or `max_surge = "50%"`.
fn max_surge(cx: &mut Ctx, t: &Tbl) -> Option<crate::core::rollout::MaxSurge> {
    let v = t.get("max_surge")?;
    let field = t.field("max_surge");
    match v.get_ref() {
        toml::de::DeValue::String(s) => match crate::core::rollout::MaxSurge::parse_percent(s) {
            Ok(m) => Some(m),
            Err(e) => {
                cx.err(&v.span(), &field, e);
                None
            }
        },
        _ => doc::int(cx, v, field, 1, 10_000)
            .map(|n| crate::core::rollout::MaxSurge::Count(n.v as u32)),
    }
}

pub(super) fn bootstrap(cx: &mut Ctx, p: &Tbl) -> Option<ir::BootstrapOverride> {
    let t = p.sub(cx, "bootstrap", &["type", "value", "file"])?;
    let kind = match t.str(cx, "type") {
        None => ir::BootstrapOverrideKind::Merge,
        Some(s) => match s.v {
            "merge" => ir::BootstrapOverrideKind::Merge,
            "replace" => ir::BootstrapOverrideKind::Replace,
            "json_patch" => ir::BootstrapOverrideKind::JSONPatch,
            other => {
                s.err(
                    cx,
                    format!(
                        "must be one of merge, replace, json_patch; got {}",
                        show(other)
                    ),
                );
                ir::BootstrapOverrideKind::Merge
            }
        },
    };
    let value = t.str(cx, "value");
    let file = t.str(cx, "file");
    let (text, at) = match (value, file) {
        (Some(v), None) => (v.v.to_string(), v),
        (None, Some(f)) => {
            let path = cx.named_file(f.v);
            let text = match std::fs::metadata(&path) {
                Ok(m) if m.len() > 1024 * 1024 => Err("is larger than 1 MiB".to_string()),
                Ok(m) if !m.is_file() => Err("is not a regular file".to_string()),
                Ok(_) => std::fs::read_to_string(&path).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match text {
                Ok(text) => (text, f),
                Err(e) => {
                    f.err(cx, format!("cannot read bootstrap file {} ({e}); relative paths are relative to the config file", show(&path.display().to_string())));
                    return None;
                }
            }
        }
        (Some(_), Some(f)) => {
            cx.err(
                &t.key_span("file"),
                &f.field,
                "give either value or file, not both",
            );
            return None;
        }
        (None, None) => {
            cx.err(
                &t.span,
                &t.field("value"),
                "missing the override document: set value = \"\"\"…\"\"\" (YAML) or file = \"override.yaml\"",
            );
            return None;
        }
    };
    match serde_yaml::from_str::<serde_yaml::Value>(&text) {
        Ok(serde_yaml::Value::Mapping(_)) if kind != ir::BootstrapOverrideKind::JSONPatch => {}
        Ok(serde_yaml::Value::Sequence(_)) if kind == ir::BootstrapOverrideKind::JSONPatch => {}
        Ok(_) if kind == ir::BootstrapOverrideKind::JSONPatch => {
            at.err(cx, "must be a JSON Patch: an array of operations like [{\"op\": \"add\", \"path\": \"/…\", \"value\": …}]")
        }
        Ok(_) => at.err(cx, "must be a YAML (or JSON) mapping: a partial Envoy bootstrap"),
        Err(e) => at.err(cx, format!("is not valid YAML: {e}")),
    }
    Some(ir::BootstrapOverride { kind, value: text })
}
