//! The status model of `berth serve`: per proxy a generation, kube-style conditions and the last
//! rollout; persisted in `<state_dir>/serve/status.json` so generations stay monotonic across
//! restarts and `berth status` can show them.
//!
//! **Generation.** Every accepted config change that touches a proxy (its IR, its spec hash or
//! its rendered files) gives that proxy the next generation number. The watched files are
//! stamped with it ([`crate::infra::delivery::stamp`]); each replica's *observed* generation is the version
//! its Envoy reports having accepted, capped by the generation its container spec was first
//! desired at (a replica of an older spec has not observed a newer image or bootstrap).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::core::target::Target;
use crate::state::{write_atomic, StateDir};

/// Where the status lives under the state directory.
pub const STATUS_FILE: &str = "serve/status.json";
/// Spec hashes remembered per proxy (for observed generations of older replicas).
const KEEP_SPECS: usize = 16;

pub const ACCEPTED: &str = "Accepted";
pub const PROGRESSING: &str = "Progressing";
pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";

/// A kube-style condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339; changes only when `status` changes.
    pub last_transition_time: String,
}

/// How the last rollout (a reconcile that changed something) ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRecord {
    /// succeeded, failed or cancelled.
    pub outcome: String,
    /// What changed: "live" (files only), "rollout" (containers) or both.
    pub kind: String,
    pub generation: u64,
    pub finished_at: String,
    pub duration_seconds: f64,
    pub message: String,
}

/// One proxy's persisted status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyRecord {
    pub generation: u64,
    /// What the generation was given for (a hash of the proxy's IR, spec and files).
    pub fingerprint: String,
    /// Spec hash → the generation it was first desired at.
    #[serde(default)]
    pub specs: BTreeMap<String, u64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub last_rollout: Option<RolloutRecord>,
    #[serde(default)]
    pub last_reconcile: Option<String>,
}

/// The config file as last loaded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigRecord {
    pub file: PathBuf,
    /// Whether the file as it is now was accepted; when not, the last good config runs.
    pub accepted: bool,
    /// `file:line:col: field: message`, one per problem.
    pub errors: Vec<String>,
    pub loaded_at: String,
}

/// Everything serve persists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub config: ConfigRecord,
    pub proxies: BTreeMap<String, ProxyRecord>,
}

pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// The fingerprint of what a proxy should be: its IR, spec hash, replica count and rendered
/// files (unstamped).
pub fn fingerprint(target: &Target) -> String {
    let ir = serde_json::to_string(&target.proxy).unwrap_or_default();
    let files = serde_json::to_string(&target.rendered.xds).unwrap_or_default();
    let text = format!(
        "{ir}\0{}\0{}\0{}\0{files}",
        target.desired.hash, target.desired.replicas, target.rendered.bootstrap
    );
    crate::core::replica::sha256_hex(text.as_bytes())
}

impl Record {
    /// Reads the persisted record, or an empty one.
    pub fn load(state: &StateDir) -> Record {
        std::fs::read(state.root().join(STATUS_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    pub fn save(&self, state: &StateDir) -> Result<()> {
        let path = state.root().join(STATUS_FILE);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        write_atomic(&path, &serde_json::to_vec_pretty(self)?, 0o600)
    }

    /// Gives every target whose fingerprint changed the next generation; returns each
    /// target's generation. Proxies no longer in the config keep their record until removed.
    pub fn accept(&mut self, targets: &[Target]) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for t in targets {
            let fp = fingerprint(t);
            let rec = self.proxies.entry(t.name().to_string()).or_default();
            if rec.fingerprint != fp {
                rec.generation += 1;
                rec.fingerprint = fp;
            }
            let generation = rec.generation;
            rec.specs
                .entry(t.desired.hash.clone())
                .or_insert(generation);
            if rec.specs.len() > KEEP_SPECS {
                let oldest = rec
                    .specs
                    .iter()
                    .filter(|(h, _)| **h != t.desired.hash)
                    .min_by_key(|(_, g)| **g)
                    .map(|(h, _)| h.clone());
                if let Some(h) = oldest {
                    rec.specs.remove(&h);
                }
            }
            set_condition(
                &mut rec.conditions,
                ACCEPTED,
                true,
                "Accepted",
                &format!("generation {generation} accepted"),
            );
            out.insert(t.name().to_string(), generation);
        }
        out
    }

    /// Marks the config as refused: every proxy's Accepted becomes False (InvalidParameters);
    /// the last good config keeps running.
    pub fn refuse(&mut self, errors: &[String]) {
        let message = format!(
            "the config edit was refused; generation kept: {}",
            errors.join("; ")
        );
        for rec in self.proxies.values_mut() {
            set_condition(
                &mut rec.conditions,
                ACCEPTED,
                false,
                "InvalidParameters",
                &message,
            );
        }
    }
}

/// Sets a condition, keeping its transition time unless its status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) {
    let status = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now();
            }
            c.status = status.to_string();
            c.reason = reason.to_string();
            c.message = message.to_string();
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                last_transition_time: now(),
            });
            let order = |t: &str| {
                [ACCEPTED, PROGRESSING, READY, DEGRADED]
                    .iter()
                    .position(|x| *x == t)
                    .unwrap_or(9)
            };
            conditions.sort_by_key(|c| order(&c.type_));
        }
    }
}

/// The status serve last wrote to a state directory (for `berth status`), if any.
pub fn read(state: &StateDir) -> Option<Record> {
    let path = state.root().join(STATUS_FILE);
    path.exists().then(|| Record::load(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_keep_their_transition_time() {
        let mut c = Vec::new();
        set_condition(&mut c, READY, true, "AllReplicasReady", "2/2");
        set_condition(&mut c, ACCEPTED, true, "Accepted", "g1");
        assert_eq!(c[0].type_, ACCEPTED);
        let t = c[1].last_transition_time.clone();
        set_condition(&mut c, READY, true, "AllReplicasReady", "3/3");
        assert_eq!(c[1].last_transition_time, t);
        assert_eq!(c[1].message, "3/3");
        set_condition(&mut c, READY, false, "ReplicaNotReady", "1/3");
        assert_eq!(c[1].status, "False");
    }
}
