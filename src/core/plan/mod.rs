//! The planner: a pure function from desired proxies and observed containers to an ordered list
//! of actions. No I/O, so every case is a unit test.
//!
//! # Rules
//!
//! * Containers without berth's managed-by label are never in any action, whatever their
//!   name or other labels. Their names are only avoided when naming new containers.
//! * A managed container without a proxy label, or with a desired proxy but no readable slot
//!   label, is removed as [`RemoveReason::Unidentifiable`]. One of a proxy that is not desired
//!   is removed as [`RemoveReason::ProxyRemoved`].
//! * Containers in state `removing` are already on their way out: the planner ignores them
//!   (with a [`Note`]) and treats their slot as it would without them.
//! * Per desired proxy and slot `0..replicas`: no container → [`Action::Create`]. Several
//!   containers (berth stopped mid-replacement) → keep the best and remove the others as
//!   [`RemoveReason::Duplicate`]; best is: desired hash, running and not drifted; then desired
//!   hash and running; then running; then desired hash; then by name and ID (so the choice is
//!   deterministic). The kept container, with the **desired hash**:
//!   - `dead` → replace ([`ReplaceReason::Dead`]; Docker cannot start a dead container);
//!   - a live setting differs from the spec (memory, CPUs, restart policy, its name vs. its
//!     [`crate::core::replica::LABEL_NAME`] label) or it is `paused` → replace
//!     ([`ReplaceReason::Drifted`]);
//!   - `running` → nothing; `created`/`exited` → [`Action::Start`];
//!   - `restarting` → nothing, with a [`Note`]: Docker's restart policy is already restarting
//!     it, and a new container of the same spec would not fare better.
//!
//!   With **another hash** (or none): replace, as [`ReplaceReason::SpecChanged`] when it is up
//!   (running, paused, restarting), else [`ReplaceReason::StoppedOutdated`].
//! * Containers in slots `>= replicas` → remove as [`RemoveReason::ScaleDown`].
//!
//! # Ordering
//!
//! Proxies by name. Within a proxy: removals of unidentifiable and duplicate containers (they
//! are extra, nothing depends on them), then starts and creates in ascending slot order
//! (capacity first: cheap, and they bring the proxy up to its replica count before anything is
//! retired), then replacements in ascending slot order (the rollout does them one at a time,
//! start-first), then scale-down removals from the highest slot down (shrink last, once the
//! remaining replicas run the new spec, so capacity never drops below the target mid-roll).
//! Containers of removed proxies come after every desired proxy, and managed containers with no
//! proxy label at the very end: a listener port moving from a removed proxy to a new one is
//! served throughout (both bind it with SO_REUSEPORT until the old one is drained).
//!
//! New containers are named [`replica_name`]; when that name is taken by any observed container
//! (e.g. replacing a drifted container of the same spec, whose name is the same) a `-1`, `-2`, …
//! suffix is added. The chosen name is in the action. A name is also taken while a container
//! *recorded* under it exists (renamed by hand): the recorded name keys that container's admin
//! socket directory, which a new container of the same name would share.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::core::replica::{
    replica_name, short_hash, DesiredProxy, ObservedContainer, RunState, RESTART_POLICY,
};

mod display;
mod drift;
mod live;
mod names;
#[cfg(test)]
mod tests;

use drift::drift;
pub use live::LiveUpdate;
use names::Names;

/// A container the plan acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRef {
    pub id: String,
    pub name: String,
}

impl ContainerRef {
    pub fn of(c: &ObservedContainer) -> ContainerRef {
        ContainerRef {
            id: c.id.clone(),
            name: c.name.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// A new replica in an empty slot, named `name`.
    Create {
        proxy: String,
        slot: u32,
        name: String,
    },
    /// A stopped replica whose spec is current: start it again.
    Start {
        proxy: String,
        slot: u32,
        container: ContainerRef,
    },
    /// Start a new replica for the slot, named `new_name`, then retire the old one
    /// (start-first). The old one may be stopped, paused or restarting: then there is nothing
    /// to drain.
    Replace {
        proxy: String,
        slot: u32,
        old: ContainerRef,
        new_name: String,
        reason: ReplaceReason,
    },
    /// Drain and remove a container that should not exist.
    Remove {
        proxy: String,
        slot: Option<u32>,
        container: ContainerRef,
        reason: RemoveReason,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReplaceReason {
    /// The spec hash changed (image, args, bootstrap, …). `from` is empty when the container
    /// had no hash label.
    SpecChanged { from: String, to: String },
    /// The hash matches but a live setting differs from the spec, e.g. memory after
    /// `docker update`, a renamed container, another restart policy, or it is paused.
    /// `what` lists each, e.g. "memory 536870912 → 268435456 (live)".
    Drifted { what: String },
    /// A stopped replica with an outdated spec.
    StoppedOutdated { from: String, to: String },
    /// A dead replica with the current spec: Docker cannot start it again.
    Dead,
    /// The current spec, but its bootstrap file on disk was changed (by hand): a restart would
    /// read the changed file. The file is rewritten and the replica replaced.
    BootstrapChanged,
    /// The current spec, LIVE, but not serving: a declared listener port is not bound (e.g.
    /// after a reboot reset `ip_unprivileged_port_start`). A new replica binds it once the
    /// host allows it; until then the gate keeps the old one and says why.
    NotServing { detail: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoveReason {
    /// Slot at or above the desired replica count.
    ScaleDown,
    /// The proxy is no longer in the config.
    ProxyRemoved,
    /// A second container in a slot that already has a current one (e.g. after a crash).
    Duplicate,
    /// berth's label is present but proxy or slot labels are missing or unreadable.
    Unidentifiable,
}

/// Something the planner saw and deliberately left alone, for `diff` and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub proxy: String,
    pub slot: Option<u32>,
    pub container: Option<ContainerRef>,
    pub message: String,
}

/// An ordered list of actions; empty when everything is converged.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Observations that need no action but deserve a mention.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
    /// Watched files that reach running replicas without a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live: Vec<LiveUpdate>,
}

/// How many actions of each kind a plan has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PlanSummary {
    pub create: usize,
    pub start: usize,
    pub replace: usize,
    pub remove: usize,
}

impl Plan {
    /// No actions (notes do not count).
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// No actions and no live file updates: nothing at all would change.
    pub fn changes_nothing(&self) -> bool {
        self.is_empty() && self.live.is_empty()
    }

    /// The actions on one proxy, in plan order.
    pub fn for_proxy<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Action> + 'a {
        self.actions.iter().filter(move |a| a.proxy() == name)
    }

    pub fn summary(&self) -> PlanSummary {
        let mut s = PlanSummary::default();
        for a in &self.actions {
            match a {
                Action::Create { .. } => s.create += 1,
                Action::Start { .. } => s.start += 1,
                Action::Replace { .. } => s.replace += 1,
                Action::Remove { .. } => s.remove += 1,
            }
        }
        s
    }

    /// The summary, and how many proxies change files live when any do:
    /// "Plan: 0 to create, 0 to start, 0 to replace, 0 to remove; 1 proxy updated live."
    pub fn summary_line(&self) -> String {
        let summary = self.summary().to_string();
        let actions = summary.trim_end_matches('.');
        match self.live.len() {
            0 => summary,
            1 => format!("{actions}; 1 proxy updated live."),
            n => format!("{actions}; {n} proxies updated live."),
        }
    }
}

impl Action {
    pub fn proxy(&self) -> &str {
        match self {
            Action::Create { proxy, .. }
            | Action::Start { proxy, .. }
            | Action::Replace { proxy, .. }
            | Action::Remove { proxy, .. } => proxy,
        }
    }

    pub fn slot(&self) -> Option<u32> {
        match self {
            Action::Create { slot, .. }
            | Action::Start { slot, .. }
            | Action::Replace { slot, .. } => Some(*slot),
            Action::Remove { slot, .. } => *slot,
        }
    }

    /// The existing container the action touches (none for a create).
    pub fn container(&self) -> Option<&ContainerRef> {
        match self {
            Action::Create { .. } => None,
            Action::Start { container, .. } | Action::Remove { container, .. } => Some(container),
            Action::Replace { old, .. } => Some(old),
        }
    }

    /// The name of the container the action creates, if it creates one.
    pub fn new_name(&self) -> Option<&str> {
        match self {
            Action::Create { name, .. } => Some(name),
            Action::Replace { new_name, .. } => Some(new_name),
            Action::Start { .. } | Action::Remove { .. } => None,
        }
    }
}

/// What the planner knows about a proxy beyond its containers' labels and settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProxyFacts {
    /// The desired bootstrap generation's file on disk was changed (its sha256 differs).
    pub bootstrap_tampered: bool,
    /// Running containers (by ID) that are LIVE but not serving, with why.
    pub not_serving: BTreeMap<String, String>,
}

/// Facts per desired proxy.
pub type Facts = BTreeMap<String, ProxyFacts>;

/// What must happen before a proxy's actions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Prepare {
    /// The desired image must be present: a new container will be created from it.
    pub image: bool,
    /// `envoy --mode validate` must check the desired spec first: new containers of a spec no
    /// running replica has proven.
    pub validate: bool,
}

/// Whether `actions` of `desired` need its image, and a validation (a spec is proven once a
/// replica runs it).
pub fn prepare(
    desired: &DesiredProxy,
    observed: &[ObservedContainer],
    actions: &[&Action],
) -> Prepare {
    let image = actions
        .iter()
        .any(|a| matches!(a, Action::Create { .. } | Action::Replace { .. }));
    let proven = observed.iter().any(|c| {
        c.is_managed()
            && c.proxy() == Some(desired.name())
            && c.spec_hash() == Some(desired.hash.as_str())
            && c.state == RunState::Running
    });
    Prepare {
        image,
        validate: image && !proven,
    }
}

/// Actions for one desired proxy, grouped for ordering.
#[derive(Default)]
struct ProxyActions {
    cleanup: Vec<Action>,
    start: Vec<Action>,
    create: Vec<Action>,
    replace: Vec<Action>,
    scale_down: Vec<(u32, String, Action)>,
}

/// Desired vs observed → actions. `observed` may contain containers without berth's label;
/// they never appear in any action. See the module docs for the rules and the ordering.
/// If `desired` names a proxy twice, the first one counts (the sources reject that).
pub fn plan(desired: &[DesiredProxy], observed: &[ObservedContainer]) -> Plan {
    plan_with(desired, observed, &Facts::new())
}

/// [`plan`], also replacing running replicas of the current spec that `facts` shows are not
/// fit to keep: a tampered bootstrap file ([`ReplaceReason::BootstrapChanged`]) or LIVE but
/// not serving ([`ReplaceReason::NotServing`]).
pub fn plan_with(desired: &[DesiredProxy], observed: &[ObservedContainer], facts: &Facts) -> Plan {
    let mut notes = Vec::new();
    let no_facts = ProxyFacts::default();
    // A container's recorded name (its `io.berth.name` label) names its admin socket
    // directory, so it stays taken while the container exists, even after a rename.
    let mut names = Names {
        taken: observed
            .iter()
            .map(|c| c.name.clone())
            .chain(
                observed
                    .iter()
                    .filter_map(|c| c.recorded_name().map(str::to_string)),
            )
            .collect(),
    };

    let mut wanted: BTreeMap<&str, &DesiredProxy> = BTreeMap::new();
    for d in desired {
        if wanted.contains_key(d.name()) {
            notes.push(Note {
                proxy: d.name().to_string(),
                slot: None,
                container: None,
                message: "proxy listed twice; the first one counts".to_string(),
            });
        } else {
            wanted.insert(d.name(), d);
        }
    }

    // Sort berth's containers into: per desired proxy and slot; per proxy, unidentifiable;
    // strays of removed proxies; and proxy-less ones. Sorting by name then ID first makes every
    // later choice independent of the order the engine listed them in.
    let mut managed: Vec<&ObservedContainer> = observed.iter().filter(|c| c.is_managed()).collect();
    managed.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));

    let mut slots: BTreeMap<&str, BTreeMap<u32, Vec<&ObservedContainer>>> = BTreeMap::new();
    let mut unidentified: BTreeMap<&str, Vec<&ObservedContainer>> = BTreeMap::new();
    let mut strays: Vec<&ObservedContainer> = Vec::new();
    let mut orphans: Vec<&ObservedContainer> = Vec::new();
    for c in managed {
        if c.state == RunState::Removing {
            notes.push(Note {
                proxy: c.proxy().unwrap_or_default().to_string(),
                slot: c.slot(),
                container: Some(ContainerRef::of(c)),
                message: "being removed by the engine; ignored".to_string(),
            });
            continue;
        }
        match c.proxy().filter(|p| !p.is_empty()) {
            None => orphans.push(c),
            Some(p) => match (wanted.get_key_value(p), c.slot()) {
                (None, _) => strays.push(c),
                (Some((&p, _)), None) => unidentified.entry(p).or_default().push(c),
                (Some((&p, _)), Some(s)) => {
                    slots.entry(p).or_default().entry(s).or_default().push(c)
                }
            },
        }
    }

    for d in wanted.values() {
        notes.extend(moved_tag(d, observed));
    }

    let mut actions = Vec::new();
    for (&name, &d) in &wanted {
        let mut acts = ProxyActions::default();
        for c in unidentified.remove(name).unwrap_or_default() {
            acts.cleanup
                .push(remove(name, None, c, RemoveReason::Unidentifiable));
        }
        let mut by_slot = slots.remove(name).unwrap_or_default();
        for slot in 0..d.replicas {
            match by_slot.remove(&slot) {
                None => acts.create.push(Action::Create {
                    proxy: name.to_string(),
                    slot,
                    name: names.fresh(name, slot, &d.hash),
                }),
                Some(mut cs) => {
                    cs.sort_by_key(|c| rank(d, c));
                    let kept = cs.remove(0);
                    // The others by name (as `managed` is sorted), not by rank.
                    cs.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
                    for dup in cs {
                        acts.cleanup
                            .push(remove(name, Some(slot), dup, RemoveReason::Duplicate));
                    }
                    let facts = facts.get(name).unwrap_or(&no_facts);
                    plan_slot(d, facts, slot, kept, &mut names, &mut acts, &mut notes);
                }
            }
        }
        // What is left is at or above the replica count.
        for (slot, cs) in by_slot {
            for c in cs {
                acts.scale_down.push((
                    slot,
                    c.name.clone(),
                    remove(name, Some(slot), c, RemoveReason::ScaleDown),
                ));
            }
        }
        acts.scale_down
            .sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));

        actions.extend(acts.cleanup);
        actions.extend(acts.start);
        actions.extend(acts.create);
        actions.extend(acts.replace);
        actions.extend(acts.scale_down.into_iter().map(|(_, _, a)| a));
    }

    // Removed proxies: by proxy, highest slot first (unreadable slots last), then name.
    strays.sort_by(|a, b| {
        a.proxy()
            .cmp(&b.proxy())
            // Reversed, so None (unreadable) sorts after every slot.
            .then_with(|| b.slot().cmp(&a.slot()))
            .then_with(|| (&a.name, &a.id).cmp(&(&b.name, &b.id)))
    });
    for c in strays {
        let p = c.proxy().unwrap_or_default();
        actions.push(remove(p, c.slot(), c, RemoveReason::ProxyRemoved));
    }
    for c in orphans {
        // A slot means nothing without its proxy.
        actions.push(remove("", None, c, RemoveReason::Unidentifiable));
    }

    Plan {
        actions,
        notes,
        live: Vec::new(),
    }
}

/// A proxy pinned to an image ID (pull policy "always") whose replicas of another spec run
/// another image: the tag moved. Says so, by tag, old ID → new ID (the replacements follow
/// from the hash).
fn moved_tag(d: &DesiredProxy, observed: &[ObservedContainer]) -> Option<Note> {
    let new = d.spec.image_id.as_deref()?;
    let old: BTreeSet<&str> = observed
        .iter()
        .filter(|c| c.is_managed() && c.proxy() == Some(d.name()))
        .filter(|c| c.spec_hash() != Some(d.hash.as_str()) && c.state != RunState::Removing)
        .filter_map(|c| c.image_id())
        .filter(|id| !id.is_empty() && *id != new)
        .collect();
    if old.is_empty() {
        return None;
    }
    let old: Vec<&str> = old.into_iter().map(short_image_id).collect();
    Some(Note {
        proxy: d.name().to_string(),
        slot: None,
        container: None,
        message: format!(
            "image {}: {} -> {} (the tag names another image now)",
            d.spec.image,
            old.join(", "),
            short_image_id(new)
        ),
    })
}

/// "sha256:1a2b3c4d5e6f" of a full image ID.
pub fn short_image_id(id: &str) -> &str {
    id.get(..19).unwrap_or(id)
}

fn remove(proxy: &str, slot: Option<u32>, c: &ObservedContainer, reason: RemoveReason) -> Action {
    Action::Remove {
        proxy: proxy.to_string(),
        slot,
        container: ContainerRef::of(c),
        reason,
    }
}

/// Lower is better: which of several containers in one slot to keep. Callers sort by name and
/// ID beforehand and the sort is stable, so ties keep that order.
fn rank(d: &DesiredProxy, c: &ObservedContainer) -> (bool, bool, bool, bool) {
    let current = c.spec_hash() == Some(d.hash.as_str());
    let running = c.state == RunState::Running;
    let healthy = current && running && drift(d, c).is_empty();
    (!healthy, !(current && running), !running, !current)
}

/// The action (if any) for the one container kept in a slot below the replica count.
fn plan_slot(
    d: &DesiredProxy,
    facts: &ProxyFacts,
    slot: u32,
    c: &ObservedContainer,
    names: &mut Names,
    acts: &mut ProxyActions,
    notes: &mut Vec<Note>,
) {
    let proxy = d.name();
    let mut replace = |reason: ReplaceReason| {
        acts.replace.push(Action::Replace {
            proxy: proxy.to_string(),
            slot,
            old: ContainerRef::of(c),
            new_name: names.fresh(proxy, slot, &d.hash),
            reason,
        })
    };

    let current = c.spec_hash() == Some(d.hash.as_str());
    if !current {
        let from = c.spec_hash().unwrap_or_default().to_string();
        let to = d.hash.clone();
        return match c.state {
            RunState::Running | RunState::Paused | RunState::Restarting => {
                replace(ReplaceReason::SpecChanged { from, to })
            }
            _ => replace(ReplaceReason::StoppedOutdated { from, to }),
        };
    }

    if c.state == RunState::Dead {
        return replace(ReplaceReason::Dead);
    }
    let drifted = drift(d, c);
    if !drifted.is_empty() {
        return replace(ReplaceReason::Drifted {
            what: drifted.join(", "),
        });
    }
    match c.state {
        RunState::Running if facts.bootstrap_tampered => replace(ReplaceReason::BootstrapChanged),
        RunState::Running => {
            if let Some(detail) = facts.not_serving.get(&c.id) {
                replace(ReplaceReason::NotServing {
                    detail: detail.clone(),
                })
            }
        }
        RunState::Created | RunState::Exited => acts.start.push(Action::Start {
            proxy: proxy.to_string(),
            slot,
            container: ContainerRef::of(c),
        }),
        RunState::Restarting => notes.push(Note {
            proxy: proxy.to_string(),
            slot: Some(slot),
            container: Some(ContainerRef::of(c)),
            message: "restarting (Docker's restart policy is retrying it; is Envoy crashing? \
                      see `docker logs`); left alone"
                .to_string(),
        }),
        // Handled above (Paused is drift; Removing was filtered out).
        RunState::Dead | RunState::Paused | RunState::Removing => {}
    }
}
