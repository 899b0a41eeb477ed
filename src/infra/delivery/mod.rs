//! Live updates of the watched resource files (DESIGN decision 3), confirmed by every replica.
//!
//! Routes, clusters and listeners (standalone mode) reach running replicas as files in the
//! directory they all mount read-only and Envoy watches (`path_config_source` +
//! `watched_directory`): no container restarts. [`update`] writes the new files atomically (temp
//! file, fsync, rename into the watched directory), then asks **each replica** over its admin
//! socket whether it took them, and only reports success when all did. When a replica rejects
//! the change, or does not confirm it within the deadline, the previous files are put back and
//! the error names the replicas and what they said.
//!
//! **How a replica confirms.** Every file is a DiscoveryResponse (`resources: [...]`); berth
//! stamps it with `version_info: "<generation>"` ([`stamp`]). Envoy then reports, per
//! subscription, the version it last *accepted* as the text readout `<prefix>.version_text`, and
//! counts `update_attempt`, `update_rejected` (the config was refused) and `update_failure` (the
//! file could not be read or parsed). Names checked on Envoy 1.40.0: `listener_manager.lds.*`,
//! `cluster_manager.cds.*` and `http.<stat_prefix>.rds.<route_config_name>.*` per HTTP
//! listener. Every rename into the watched directory makes *every* subscription of that
//! directory reload once (also measured), so after `n` renames a subscription whose
//! `update_attempt` grew by `n` has seen the final files: if its `version_text` is then not the
//! new generation, the replica refused them.
//!
//! **Make before break.** Replicas reload each subscription on its own, so renaming a new
//! route file and `cds.yaml` one after the other (or swapping them together) can leave a route
//! naming a cluster a replica does not have yet, for a moment: requests get a 503. [`update`]
//! therefore goes in stages, each confirmed by every replica before the next: (on a Swarm) the
//! certificate copies the secrets name; new and changed secrets and other files; clusters as the union of old and new; the new and changed route
//! configurations (one file each: `rds-<listener>.yaml`); the new listeners; the route
//! configurations no longer named; the new clusters; then the other files no longer wanted go.
//! At every moment each replica's listeners name route
//! configurations it has, and its routes name clusters it has. Intermediate files are stamped
//! `<generation>.<stage>`. A file whose only change is its stamp (every file of a new
//! generation is restamped) goes with the last stage, so a route-only change is one stage.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::time::Instant;

use crate::core::layout::{is_rds_file, CDS_FILE, LDS_FILE};
use crate::envoy::admin::AdminApi;
use crate::state::{write_atomic, StateDir};

mod certificates;
mod confirm;
mod files;
mod staging;
mod stamps;
mod stats;
mod subscriptions;

pub use certificates::*;
pub use confirm::*;
pub use files::*;
pub use staging::*;
pub use stamps::*;
pub use stats::*;
pub use subscriptions::*;

/// How long replicas get to confirm a change unless told otherwise.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How often replicas are asked while waiting.
const POLL: Duration = Duration::from_millis(20);
/// Timeout of one admin call while waiting.
pub const ADMIN_TIMEOUT: Duration = Duration::from_millis(500);

/// One replica that must confirm a change.
#[derive(Clone)]
pub struct Replica {
    /// The container name (for messages and status).
    pub name: String,
    pub admin: Arc<dyn AdminApi>,
}

/// What one replica said about a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Ack {
    /// Every subscription reports the new version.
    Confirmed { millis: u64 },
    /// A subscription processed the final files and kept its old version.
    Rejected { detail: String },
    /// No verdict before the deadline (the replica is stuck, or its admin does not answer).
    NoAnswer { detail: String },
}

/// A change every replica confirmed.
#[derive(Debug, Clone, Serialize)]
pub struct LiveOutcome {
    pub proxy: String,
    pub generation: Option<u64>,
    /// Files that changed (empty: nothing had changed).
    pub written: Vec<String>,
    pub replicas: BTreeMap<String, Ack>,
    /// From the first rename to the last confirmation.
    pub elapsed: Duration,
}

/// A change not every replica confirmed; the previous files were put back.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRejected {
    pub proxy: String,
    pub generation: Option<u64>,
    /// The stage that failed, e.g. "clusters (old and new)".
    pub stage: String,
    pub replicas: BTreeMap<String, Ack>,
    /// What happened to the previous files.
    pub restored: String,
}

impl LiveRejected {
    /// Some replica refused the files (as opposed to not answering in time): the same files
    /// will be refused again.
    pub fn refused(&self) -> bool {
        self.replicas
            .values()
            .any(|a| matches!(a, Ack::Rejected { .. }))
    }
}

impl std::fmt::Display for LiveRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gen = self
            .generation
            .map(|g| format!(" (generation {g})"))
            .unwrap_or_default();
        write!(
            f,
            "route/cluster update of {}{gen} not confirmed by every replica at stage {}:",
            self.proxy, self.stage
        )?;
        for (name, ack) in &self.replicas {
            match ack {
                Ack::Confirmed { .. } => {}
                Ack::Rejected { detail } => write!(f, " {name} rejected it ({detail});")?,
                Ack::NoAnswer { detail } => write!(f, " {name} did not confirm ({detail});")?,
            }
        }
        write!(f, " {}", self.restored)
    }
}

impl std::error::Error for LiveRejected {}

/// Why [`update`] did not finish.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// A replica refused or did not confirm; the previous files are back.
    #[error(transparent)]
    Rejected(LiveRejected),
    /// The watched directory could not be read or written.
    #[error("{0:#}")]
    Io(anyhow::Error),
}

/// Writes `files` (normally [`stamp`]ed) into the proxy's watched directory in
/// make-before-break [`stages`], each confirmed by every replica in `replicas` (each stage at
/// most `timeout`); then, when `serials` are given, until each replica's admin `/certs` lists
/// them (the new certificates are served). When a replica refuses or does not confirm, the
/// previous files are put
/// back the same way (their confirmation awaited, best effort) and the error is a
/// [`LiveRejected`]. With no change on disk it returns at once with nothing written.
pub async fn update(
    state: &StateDir,
    proxy: &str,
    files: &BTreeMap<String, String>,
    replicas: &[Replica],
    serials: &[String],
    timeout: Duration,
) -> std::result::Result<LiveOutcome, UpdateError> {
    let dir = state.proxy(proxy).xds();
    let previous = state.read_xds(proxy).map_err(UpdateError::Io)?;
    let generation = generation_of(files);
    let written: Vec<String> = files
        .iter()
        .filter(|(n, c)| previous.get(*n) != Some(*c))
        .map(|(n, _)| n.clone())
        .chain(previous.keys().filter(|n| !files.contains_key(*n)).cloned())
        .collect();
    let started = Instant::now();
    let mut acks = BTreeMap::new();
    for stage in stages(&previous, files) {
        match apply(&dir, &stage, replicas, timeout).await {
            Ok(a) => acks = a,
            Err(StageError::Io(e)) => return Err(UpdateError::Io(e)),
            Err(StageError::Unconfirmed(replies)) => {
                let restored = restore(state, proxy, &dir, &previous, replicas, timeout).await;
                return Err(UpdateError::Rejected(LiveRejected {
                    proxy: proxy.to_string(),
                    generation,
                    stage: stage.what.to_string(),
                    replicas: replies,
                    restored,
                }));
            }
        }
    }
    if !serials.is_empty() && !written.is_empty() {
        let served = certificates_served(replicas, serials, started, timeout).await;
        if !served.values().all(|a| matches!(a, Ack::Confirmed { .. })) {
            let restored = restore(state, proxy, &dir, &previous, replicas, timeout).await;
            return Err(UpdateError::Rejected(LiveRejected {
                proxy: proxy.to_string(),
                generation,
                stage: "certificates served (admin /certs)".to_string(),
                replicas: served,
                restored,
            }));
        }
        acks = served;
    }
    Ok(LiveOutcome {
        proxy: proxy.to_string(),
        generation,
        written,
        replicas: acks,
        elapsed: started.elapsed(),
    })
}

/// Puts `previous` back (in stages, confirmed best effort); says how that went.
async fn restore(
    state: &StateDir,
    proxy: &str,
    dir: &Path,
    previous: &BTreeMap<String, String>,
    replicas: &[Replica],
    timeout: Duration,
) -> String {
    let now = match state.read_xds(proxy) {
        Ok(now) => now,
        Err(e) => return format!("restoring the previous files failed: {e:#}"),
    };
    let mut not_back = Vec::new();
    for stage in stages(&now, previous) {
        match apply(dir, &stage, replicas, timeout).await {
            Ok(_) => {}
            Err(StageError::Io(e)) => {
                return format!("restoring the previous files failed too: {e:#}")
            }
            Err(StageError::Unconfirmed(acks)) => not_back.extend(
                acks.into_iter()
                    .filter(|(_, a)| !matches!(a, Ack::Confirmed { .. }))
                    .map(|(n, _)| n),
            ),
        }
    }
    not_back.sort();
    not_back.dedup();
    restored_summary(previous, &not_back, "", "every replica serves them")
}

/// How a restore of `previous` went: `where_` follows "were restored" (e.g. " on every
/// task"), `all_back` is said when none of them is `not_back`.
pub fn restored_summary(
    previous: &BTreeMap<String, String>,
    not_back: &[String],
    where_: &str,
    all_back: &str,
) -> String {
    let what = match generation_of(previous) {
        Some(g) => format!("the previous files (generation {g}) were restored{where_}"),
        None => format!("the previous files were restored{where_}"),
    };
    if not_back.is_empty() {
        format!("{what}; {all_back}")
    } else {
        format!("{what}; not confirmed yet by {}", not_back.join(", "))
    }
}

#[cfg(test)]
mod tests;
