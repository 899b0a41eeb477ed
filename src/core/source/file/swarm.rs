//! `engine` at the top level and each proxy's `[proxy.swarm]`: where a Swarm runs its tasks.

use super::check::show;
use super::doc::{self, Ctx, Tbl};
use crate::core::ir;
use crate::core::policy::EngineKind;

const SWARM_KEYS: &[&str] = &["mode", "constraints"];
const ROOT_SWARM_KEYS: &[&str] = &["registry"];
/// The node attributes a Swarm placement constraint may test (Docker's `--constraint`).
const CONSTRAINT_ATTRIBUTES: &[&str] = &[
    "node.id",
    "node.hostname",
    "node.role",
    "node.platform.os",
    "node.platform.arch",
    "node.labels.",
    "engine.labels.",
];

/// `engine = "docker" | "swarm"` (default: docker, the single Docker host).
pub(super) fn engine(cx: &mut Ctx, t: &Tbl) -> EngineKind {
    match t.str(cx, "engine") {
        None => EngineKind::Docker,
        Some(s) => match s.v {
            "docker" => EngineKind::Docker,
            "swarm" => EngineKind::Swarm,
            other => {
                s.err(
                    cx,
                    format!(
                        "must be \"docker\" (berth rolls containers on this Docker host) or \"swarm\" (a Swarm service per proxy, on the Swarm this engine manages); got {}",
                        show(other)
                    ),
                );
                EngineKind::Docker
            }
        },
    }
}

/// The top-level `[swarm]`: `registry = "host[:port][/path]"` (only with engine = "swarm").
pub(super) fn settings(
    cx: &mut Ctx,
    t: &Tbl,
    engine: EngineKind,
) -> crate::core::policy::SwarmSettings {
    let mut out = crate::core::policy::SwarmSettings::default();
    let Some(s) = t.sub(cx, "swarm", ROOT_SWARM_KEYS) else {
        return out;
    };
    if engine != EngineKind::Swarm {
        cx.err(
            &t.key_span("swarm"),
            &t.field("swarm"),
            "applies only with engine = \"swarm\" at the top level (this config runs on one Docker host); remove it or set engine = \"swarm\"",
        );
        return out;
    }
    if let Some(r) = s.str(cx, "registry") {
        match registry(r.v) {
            Ok(v) => out.registry = Some(v),
            Err(m) => r.err(cx, m),
        }
    }
    out
}

/// A registry and repository path the derived image is pushed under: `host[:port][/path]`,
/// without a scheme, tag or digest.
fn registry(s: &str) -> Result<String, String> {
    let allowed = "must be a registry host with an optional port and repository path, \"host[:port][/path]\" (e.g. \"registry.example.com:5000/berth\"), without a scheme, tag or digest: berth pushes the agent image there as <registry>/berth-agent/envoy:<hash>";
    let bad = || Err(format!("{allowed}; got {}", show(s)));
    let s = s.trim_end_matches('/');
    let (host, path) = s.split_once('/').unwrap_or((s, ""));
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    let host_ok = !name.is_empty()
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    // Docker's repository path components: lowercase alphanumerics, separated by . _ __ -.
    let path_ok = path.is_empty()
        || path.split('/').all(|c| {
            !c.is_empty()
                && c.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
                && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
                && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
        });
    // A first component without a dot or port and not localhost is a Docker Hub user, not a
    // registry host.
    let is_host = name.contains('.') || port.is_some() || name == "localhost";
    if s.contains("://") || !host_ok || !port_ok || !path_ok || !is_host {
        return bad();
    }
    Ok(s.to_string())
}

/// `[proxy.swarm]`: `mode = "replicated" | "global"`, `constraints = ["node.labels.edge == true"]`.
pub(super) fn placement(cx: &mut Ctx, p: &Tbl) -> ir::Placement {
    let Some(t) = p.sub(cx, "swarm", SWARM_KEYS) else {
        return ir::Placement::default();
    };
    let global = match t.str(cx, "mode") {
        None => false,
        Some(s) => match s.v {
            "replicated" => false,
            "global" => true,
            other => {
                s.err(
                    cx,
                    format!(
                        "must be \"replicated\" (`replicas` tasks) or \"global\" (one task per node); got {}",
                        show(other)
                    ),
                );
                false
            }
        },
    };
    let mut constraints = Vec::new();
    if let Some((items, _, field)) = t.array(cx, "constraints") {
        for (i, v) in items.iter().enumerate() {
            let Some(s) = doc::string(cx, v, format!("{field}[{i}]")) else {
                continue;
            };
            match constraint(s.v) {
                Ok(c) => constraints.push(c),
                Err(m) => s.err(cx, m),
            }
        }
    }
    ir::Placement {
        global,
        constraints,
    }
}

/// A Swarm placement constraint, `<attribute> == <value>` or `!=`, normalized to single
/// spaces around the operator.
fn constraint(s: &str) -> Result<String, String> {
    let allowed = format!(
        "must be \"<attribute> == <value>\" or \"<attribute> != <value>\" with attribute one of {} (e.g. \"node.labels.edge == true\")",
        CONSTRAINT_ATTRIBUTES
            .iter()
            .map(|a| if a.ends_with('.') { format!("{a}<name>") } else { a.to_string() })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (attr, op, value) = match (s.split_once("=="), s.split_once("!=")) {
        (Some((a, v)), None) => (a, "==", v),
        (None, Some((a, v))) => (a, "!=", v),
        _ => return Err(format!("{allowed}; got {}", show(s))),
    };
    let (attr, value) = (attr.trim(), value.trim());
    let known = CONSTRAINT_ATTRIBUTES.iter().any(|a| {
        if a.ends_with('.') {
            attr.strip_prefix(a).is_some_and(|rest| {
                !rest.is_empty()
                    && rest
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            })
        } else {
            attr == *a
        }
    });
    let plain_value = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:/".contains(c));
    if !known || !plain_value {
        return Err(format!("{allowed}; got {}", show(s)));
    }
    Ok(format!("{attr} {op} {value}"))
}

/// `[proxy.swarm]` only means something on a Swarm: refuse it elsewhere rather than ignore it.
pub(super) fn only_on_swarm(cx: &mut Ctx, engine: EngineKind, proxies: &[Tbl]) {
    if engine == EngineKind::Swarm {
        return;
    }
    for p in proxies {
        if p.get("swarm").is_some() {
            cx.err(
                &p.key_span("swarm"),
                &p.field("swarm"),
                "applies only with engine = \"swarm\" at the top level (this config runs on one Docker host); remove it or set engine = \"swarm\"",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{constraint, registry};

    #[test]
    fn registries_are_hosts_with_optional_port_and_path() {
        for good in [
            "127.0.0.1:5000",
            "registry.example.com/berth",
            "localhost:5000/a/b-c",
        ] {
            assert_eq!(registry(good).unwrap(), good);
        }
        assert_eq!(registry("r.example:5000/x/").unwrap(), "r.example:5000/x");
        for bad in [
            "http://r.example:5000",
            "berth",
            "r.example/Upper",
            "r.example:0",
            "r.example/x:tag",
            "r.example/x@sha256:00",
            "",
        ] {
            let e = registry(bad).unwrap_err();
            assert!(e.contains("host[:port][/path]"), "{bad}: {e}");
        }
    }

    #[test]
    fn constraints_are_checked_and_normalized() {
        assert_eq!(
            constraint("node.labels.edge==true").unwrap(),
            "node.labels.edge == true"
        );
        assert_eq!(
            constraint(" node.role != manager ").unwrap(),
            "node.role != manager"
        );
        for bad in [
            "node.labels.edge",
            "node.label.edge == true",
            "node.labels. == x",
            "node.role == ",
            "node.role == a b",
            "node.role == a == b",
        ] {
            let e = constraint(bad).unwrap_err();
            assert!(e.contains("node.labels.<name>"), "{bad}: {e}");
        }
    }
}
