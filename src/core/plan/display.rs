//! How a plan reads: one terraform-like line per action and note, and the summary line.

use std::fmt;

use super::*;

/// "edge/1", or "edge" without a slot, "?" without a proxy.
fn target(proxy: &str, slot: Option<u32>) -> String {
    let proxy = if proxy.is_empty() { "?" } else { proxy };
    match slot {
        Some(s) => format!("{proxy}/{s}"),
        None => proxy.to_string(),
    }
}

fn hash_for_display(h: &str) -> &str {
    if h.is_empty() {
        "(none)"
    } else {
        short_hash(h)
    }
}

impl fmt::Display for ReplaceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplaceReason::SpecChanged { from, to } => write!(
                f,
                "spec {} → {}",
                hash_for_display(from),
                hash_for_display(to)
            ),
            ReplaceReason::StoppedOutdated { from, to } => write!(
                f,
                "stopped, spec {} → {}",
                hash_for_display(from),
                hash_for_display(to)
            ),
            ReplaceReason::Drifted { what } => write!(f, "drifted: {what}"),
            ReplaceReason::Dead => f.write_str("dead"),
            ReplaceReason::BootstrapChanged => {
                f.write_str("its bootstrap file was changed on disk")
            }
            ReplaceReason::NotServing { detail } => write!(f, "not serving: {detail}"),
        }
    }
}

impl fmt::Display for RemoveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RemoveReason::ScaleDown => "scale down",
            RemoveReason::ProxyRemoved => "proxy removed",
            RemoveReason::Duplicate => "duplicate in slot",
            RemoveReason::Unidentifiable => "unidentifiable (proxy or slot label unreadable)",
        })
    }
}

/// terraform-like: `+ create edge/0 as berth-edge-0-1a2b3c4d`, `> start edge/2 (name)`,
/// `~ replace edge/1 (name): spec a1b2c3d4e5f6 → d4e5f6a1b2c3`,
/// `- remove old/0 (name): proxy removed`.
impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Create { proxy, slot, name } => {
                write!(f, "+ create {} as {name}", target(proxy, Some(*slot)))
            }
            Action::Start {
                proxy,
                slot,
                container,
            } => write!(
                f,
                "> start {} ({})",
                target(proxy, Some(*slot)),
                container.name
            ),
            Action::Replace {
                proxy,
                slot,
                old,
                reason,
                ..
            } => write!(
                f,
                "~ replace {} ({}): {reason}",
                target(proxy, Some(*slot)),
                old.name
            ),
            Action::Remove {
                proxy,
                slot,
                container,
                reason,
            } => write!(
                f,
                "- remove {} ({}): {reason}",
                target(proxy, *slot),
                container.name
            ),
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "! {}", target(&self.proxy, self.slot))?;
        if let Some(c) = &self.container {
            write!(f, " ({})", c.name)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// "Plan: 1 to create, 0 to start, 2 to replace, 1 to remove."
impl fmt::Display for PlanSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Plan: {} to create, {} to start, {} to replace, {} to remove.",
            self.create, self.start, self.replace, self.remove
        )
    }
}

/// One line per action, then one per note, then the summary; "No changes." when empty.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for a in &self.actions {
            writeln!(f, "{a}")?;
        }
        for u in &self.live {
            writeln!(f, "{u}")?;
        }
        for n in &self.notes {
            writeln!(f, "{n}")?;
        }
        if self.changes_nothing() {
            writeln!(f, "No changes.")
        } else {
            writeln!(f, "{}", self.summary_line())
        }
    }
}
