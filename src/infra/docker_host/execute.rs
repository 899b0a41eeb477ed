//! Executes one proxy's planned actions (DESIGN decisions 5 and 6): empty slots filled at once,
//! stopped replicas started, replacements one at a time (start the new replica, gate it,
//! retire the old one), removals drained; after a failed gate the already replaced slots are
//! rolled back or left (policy), and a rollback is never rolled back.
//!
//! Every decision was the planner's; this only executes, and says what it did.

use std::collections::BTreeMap;

use tokio_util::sync::CancellationToken;

use super::gate::{Ask, Want};
use super::DockerHost;
use crate::core::crashpoint;
use crate::core::ir::{OnFailure, RolloutPolicy, Shutdown};
use crate::core::plan::{Action, ContainerRef, PlanSummary};
use crate::core::progress::{Event, Reporter};
use crate::core::replica::{self, DesiredProxy, LABEL_NAME};
use crate::core::target::Target;
use crate::engine::{ContainerEngine, ObservedContainer};
use crate::envoy::admin::AdminConnector;
use crate::infra::{ConvergeError, GateFailure};
use crate::state::StateDir;

/// One converge's (or removal's) view of the host: what it acts through and reports to.
pub(super) struct Run<'a> {
    pub host: &'a DockerHost,
    pub engine: &'a dyn ContainerEngine,
    pub admins: &'a dyn AdminConnector,
    pub state: &'a StateDir,
    pub reporter: &'a Reporter,
    pub extra_labels: &'a BTreeMap<String, String>,
    pub cancel: &'a CancellationToken,
}

impl DockerHost {
    pub(super) fn run<'a>(
        &'a self,
        reporter: &'a Reporter,
        cancel: &'a CancellationToken,
    ) -> Run<'a> {
        Run {
            host: self,
            engine: self.engine.as_ref(),
            admins: self.admins.as_ref(),
            state: &self.state,
            reporter,
            extra_labels: &self.extra_labels,
            cancel,
        }
    }
}

impl Run<'_> {
    /// Runs `actions` of one proxy in plan order. `fresh`: no replica of the proxy serves now
    /// (a first install, in xDS mode gated more leniently: see [`Want::of`]).
    pub(super) async fn execute(
        &self,
        target: &Target,
        actions: &[&Action],
        observed: &[ObservedContainer],
        image_id: &str,
        fresh: bool,
    ) -> Result<PlanSummary, ConvergeError> {
        let name = target.name();
        let desired = &target.desired;
        let want = Want::of(desired, fresh);
        let policy = &desired.rollout;
        let shutdown = &desired.shutdown;
        let mut done = PlanSummary::default();
        let mut creates_done = false;
        let mut replaces_done = false;
        // A canary hold berth stopped in is decided first (see `canary`).
        let resumed = self.resume_canary(target, observed).await?;
        let canary_done = resumed.is_some();
        let handled = resumed.unwrap_or_default();
        let actions: Vec<&Action> = actions
            .iter()
            .copied()
            .filter(|a| !matches!(a, Action::Remove { container, .. } if handled.contains(&container.id)))
            .collect();
        for (step, action) in actions.iter().enumerate() {
            self.reporter.steps(step, actions.len());
            if self.cancel.is_cancelled() {
                return Err(ConvergeError::Cancelled {
                    proxy: name.to_string(),
                });
            }
            match action {
                Action::Create { .. } => {
                    if creates_done {
                        continue;
                    }
                    creates_done = true;
                    done.create += self.create_all(desired, &actions, image_id, &want).await?;
                }
                Action::Start {
                    slot, container, ..
                } => {
                    self.engine.start(&container.id).await?;
                    let run_name = run_dir_name(container, observed);
                    let ask = Ask {
                        policy,
                        want: &want,
                        siblings: None,
                    };
                    self.gate(name, *slot, &container.id, &run_name, ask)
                        .await?;
                    self.reporter.event(
                        Event::new(name, "started")
                            .slot(*slot)
                            .container(&container.name),
                    );
                    done.start += 1;
                }
                Action::Replace { .. } => {
                    // Every replacement at once, in waves of max_surge (see `waves`).
                    if replaces_done {
                        continue;
                    }
                    replaces_done = true;
                    done.replace += self
                        .replace_in_waves(target, &actions, observed, image_id, &want, canary_done)
                        .await?;
                }
                Action::Remove {
                    container, reason, ..
                } => {
                    self.reporter.event(
                        Event::new(name, "removing")
                            .container(&container.name)
                            .message(reason.to_string()),
                    );
                    let c = observed.iter().find(|c| c.id == container.id);
                    let (shutdown, policy) = match c {
                        Some(c) => self.drain_settings(name, c),
                        None => (shutdown.clone(), policy.clone()),
                    };
                    self.retire(name, container, observed, &shutdown, &policy)
                        .await?;
                    done.remove += 1;
                }
            }
        }
        Ok(done)
    }

    /// Creates the replicas of every empty slot at once: they are independent (nothing is
    /// retired), so a fresh install or a scale-up costs about one replica's time. Returns how
    /// many came up, or the first failure once all have finished; replicas that became ready
    /// stay.
    async fn create_all(
        &self,
        desired: &DesiredProxy,
        actions: &[&Action],
        image_id: &str,
        want: &Want,
    ) -> Result<usize, GateFailure> {
        let creates = actions.iter().filter_map(|a| match a {
            Action::Create { slot, name, .. } => {
                Some(self.start_replica(desired, *slot, name, image_id, want, None))
            }
            _ => None,
        });
        let results = futures_util::future::join_all(creates).await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        match results.into_iter().find_map(Result::err) {
            None => Ok(actions
                .iter()
                .filter(|a| matches!(a, Action::Create { .. }))
                .count()),
            Some(mut failure) => {
                failure.aftermath = format!(
                    "{failed} new replica(s) failed and were removed; no existing replica was \
                     touched; the next converge tries the empty slots again"
                );
                Err(failure)
            }
        }
    }

    /// Removes the replicas of the desired spec a converge just created (a fresh proxy whose
    /// config Envoy refused while they started): nothing served through them yet.
    pub(super) async fn remove_new(&self, target: &Target) {
        self.host.forget_observation();
        let Ok(mine) = self.host.observe_proxy(target.name()).await else {
            return;
        };
        for c in mine
            .iter()
            .filter(|c| c.spec_hash() == Some(target.desired.hash.as_str()))
        {
            let _ = self.engine.remove(&c.id).await;
            let run = c.recorded_name().unwrap_or(&c.name);
            let _ = std::fs::remove_dir_all(self.state.proxy(target.name()).run(run));
        }
        self.host.forget_observation();
    }

    /// The drain settings a container retires with: those of the spec it runs (recorded with
    /// it), else the defaults.
    pub(super) fn drain_settings(
        &self,
        proxy: &str,
        c: &ObservedContainer,
    ) -> (Shutdown, RolloutPolicy) {
        c.spec_hash()
            .and_then(|h| self.state.read_spec(proxy, h))
            .map(|d| (d.shutdown, d.rollout))
            .unwrap_or_default()
    }

    /// After a failed gate: roll the already replaced slots back to their previous spec
    /// (policy `rollback`), `surge` slots at a time, or leave them (policy `pause`). Returns
    /// what was done.
    pub(super) async fn after_failure(
        &self,
        target: &Target,
        replaced: &[(u32, String, String)],
        observed: &[ObservedContainer],
        surge: usize,
    ) -> String {
        if replaced.is_empty() {
            return "no replica had been replaced; the old replicas keep serving".to_string();
        }
        if target.desired.rollout.on_failure == OnFailure::Pause {
            return format!(
                "rollout paused: {} replica(s) already run the new spec, the others the old one",
                replaced.len()
            );
        }
        let mut notes = Vec::new();
        let latest_first: Vec<_> = replaced.iter().rev().collect();
        for wave in latest_first.chunks(surge.max(1)) {
            let backs = wave.iter().map(|(slot, new_name, old_hash)| {
                self.roll_back_slot(target.name(), *slot, new_name, old_hash, observed)
            });
            notes.extend(futures_util::future::join_all(backs).await);
        }
        format!("rolled back the replaced replicas: {}", notes.join("; "))
    }

    /// Puts `slot` back on spec `old_hash`: a replica of it started and gated, then the new
    /// one (`new_name`) retired. Never rolls back a rollback: a failure is reported, not
    /// retried.
    pub(super) async fn roll_back_slot(
        &self,
        name: &str,
        slot: u32,
        new_name: &str,
        old_hash: &str,
        observed: &[ObservedContainer],
    ) -> String {
        let Some(previous) = self.state.read_spec(name, old_hash) else {
            return format!(
                "slot {slot}: previous spec {old_hash} is not recorded; left on the new spec"
            );
        };
        let image_id = match self.engine.ensure_image(&previous.spec.image, false).await {
            Ok(id) => id,
            Err(e) => return format!("slot {slot}: {e}"),
        };
        let back_name = fresh_name(&previous, slot, observed);
        let want = Want::of(&previous, false);
        match self
            .start_replica(&previous, slot, &back_name, &image_id, &want, None)
            .await
        {
            Ok(_) => {
                crashpoint::reached("mid-rollback");
                let current = self.host.observe_proxy(name).await.unwrap_or_default();
                if let Some(c) = current.iter().find(|c| c.name == *new_name) {
                    let (shutdown, policy) = self.drain_settings(name, c);
                    let _ = self
                        .retire(name, &ContainerRef::of(c), observed, &shutdown, &policy)
                        .await;
                }
                self.reporter.event(
                    Event::new(name, "rolled-back")
                        .slot(slot)
                        .message(old_hash.to_string()),
                );
                format!(
                    "slot {slot}: rolled back to spec {}",
                    replica::short_hash(old_hash)
                )
            }
            Err(f) => format!(
                "slot {slot}: rollback failed too ({}); left as is",
                f.reason
            ),
        }
    }

    /// Removes files nothing uses any more: old generations, specs and run directories.
    pub(super) async fn prune(&self, target: &Target) -> Result<(), ConvergeError> {
        let name = target.name();
        let mine = self.host.observe_proxy(name).await?;
        let mut hashes: Vec<String> = mine
            .iter()
            .filter_map(|c| c.spec_hash().map(str::to_string))
            .chain([target.desired.hash.clone()])
            // What `berth rollout undo` after the last finished rollout goes back to.
            .chain(
                super::canary::files(self, name)
                    .previous()
                    .map(|(from, _)| from),
            )
            .collect();
        hashes.sort();
        hashes.dedup();
        let mut bootstraps: Vec<String> = hashes
            .iter()
            .filter_map(|h| self.state.read_spec(name, h))
            .map(|d| d.spec.bootstrap_sha256)
            .collect();
        bootstraps.sort();
        bootstraps.dedup();
        let runs: Vec<String> = mine
            .iter()
            .map(|c| c.label(LABEL_NAME).unwrap_or(&c.name).to_string())
            .collect();
        self.state.prune_specs(name, &as_strs(&hashes))?;
        self.state.prune_generations(name, &as_strs(&bootstraps))?;
        self.state.prune_run_dirs(name, &as_strs(&runs))?;
        Ok(())
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The name a container's admin socket directory was created under (its original name).
pub(super) fn run_dir_name(container: &ContainerRef, observed: &[ObservedContainer]) -> String {
    observed
        .iter()
        .find(|c| c.id == container.id)
        .and_then(|c| c.label(LABEL_NAME))
        .unwrap_or(&container.name)
        .to_string()
}

/// A name for a rollback replica of `desired` in `slot` that no observed container has.
fn fresh_name(desired: &DesiredProxy, slot: u32, observed: &[ObservedContainer]) -> String {
    let base = replica::replica_name(&desired.spec.proxy, slot, &desired.hash);
    // Recorded names key admin socket directories: they stay taken after a rename.
    let taken = |n: &str| {
        observed
            .iter()
            .any(|c| c.name == n || c.recorded_name() == Some(n))
    };
    (0..)
        .map(|i| {
            if i == 0 {
                base.clone()
            } else {
                format!("{base}-r{i}")
            }
        })
        .find(|n| !taken(n))
        .unwrap_or(base)
}
