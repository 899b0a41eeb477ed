//! Drift: the live settings of a container (memory, CPUs, restart policy, name, paused) that
//! differ from its proxy's spec.

use super::*;

/// Docker reports "no limit" as 0; berth's spec says `None`.
fn limit(v: Option<i64>) -> Option<i64> {
    v.filter(|&n| n != 0)
}

fn show_limit(v: Option<i64>, f: impl Fn(i64) -> String) -> String {
    v.map_or_else(|| "none".to_string(), f)
}

/// The live settings of `c` that differ from `d`'s spec, each as
/// "<setting> <desired> → <live> (live)".
pub(super) fn drift(d: &DesiredProxy, c: &ObservedContainer) -> Vec<String> {
    let mut out = Vec::new();
    let (want, have) = (limit(d.spec.memory), limit(c.live.memory));
    if want != have {
        let show = |v| show_limit(v, |n| n.to_string());
        out.push(format!("memory {} → {} (live)", show(want), show(have)));
    }
    let (want, have) = (limit(d.spec.nano_cpus), limit(c.live.nano_cpus));
    if want != have {
        let show = |v| show_limit(v, |n| (n as f64 / 1e9).to_string());
        out.push(format!("cpus {} → {} (live)", show(want), show(have)));
    }
    if c.live.restart_policy != RESTART_POLICY {
        let have = if c.live.restart_policy.is_empty() {
            "none"
        } else {
            &c.live.restart_policy
        };
        out.push(format!("restart policy {RESTART_POLICY} → {have} (live)"));
    }
    match c.recorded_name() {
        Some(n) if n == c.name => {}
        Some(n) => out.push(format!("name {n} → {} (live)", c.name)),
        None => out.push(format!("name label missing (live name {})", c.name)),
    }
    if c.state == RunState::Paused {
        out.push("paused".to_string());
    }
    out
}
