//! The planner: a pure function from desired proxies and observed containers to an ordered list
//! of actions. No I/O, so every case is a unit test.

use serde::{Deserialize, Serialize};

use crate::spec::{DesiredProxy, ObservedContainer};

/// A container the plan acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRef {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// A new replica in an empty slot.
    Create { proxy: String, slot: u32 },
    /// A stopped replica whose spec is current: start it again.
    Start {
        proxy: String,
        slot: u32,
        container: ContainerRef,
    },
    /// Start a new replica for the slot, then retire the old one (start-first).
    Replace {
        proxy: String,
        slot: u32,
        old: ContainerRef,
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
    /// The spec hash changed (image, args, bootstrap, …).
    SpecChanged { from: String, to: String },
    /// The hash matches but a live setting differs from the spec, e.g. memory after
    /// `docker update`, a renamed container, another restart policy.
    Drifted { what: String },
    /// A stopped replica with an outdated spec.
    StoppedOutdated { from: String, to: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// An ordered list of actions; empty when everything is converged.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Plan {
    pub actions: Vec<Action>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
}

/// Desired vs observed → actions. `observed` may contain containers without berth's label;
/// they never appear in any action.
pub fn plan(_desired: &[DesiredProxy], _observed: &[ObservedContainer]) -> Plan {
    Plan::default()
}
