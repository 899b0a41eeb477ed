//! Executes a plan against the engine: one replica at a time, start-first, health-gated, with
//! rollback (DESIGN decisions 5 and 6).
//!
//! Before anything is touched the new image is made present and the new bootstrap and resources
//! are validated by `envoy --mode validate` in a throw-away container of that image. Then each
//! slot gets its new replica, which must report `/ready` LIVE within the startup deadline and
//! stay so for the minimum ready time, before the old one is retired without losing a request.
//!
//! Files: `gate` (a new replica and its readiness gate), `retire` (the drain sequence),
//! `files` (validation and the files replicas read); this file sequences them.

mod files;
mod gate;
mod retire;

use gate::Want;
pub use gate::{Gate, GateFailure};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

use crate::admin::{Admin, ReadyState};
use crate::crashpoint;
use crate::delivery;
use crate::engine::Engine;
use crate::ir::{OnFailure, RolloutPolicy, Shutdown};
use crate::plan::{self, Action, ContainerRef};
use crate::progress::{Event, Reporter};
use crate::render;
use crate::replica::{
    self, DesiredProxy, ObservedContainer, ReplicaContainer, RunState, LABEL_NAME,
};
use crate::state::StateDir;
use crate::target::Target;

/// How often readiness and connection counts are polled.
const POLL: Duration = Duration::from_millis(50);
/// Time Envoy gets to exit after SIGTERM once it has drained.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin calls in a row that may go unanswered during the minimum ready time.
const MAX_ADMIN_ERRORS: u32 = 3;
/// Lines of a failed replica's log shown in the error.
const LOG_LINES: usize = 20;

/// Executes plans for a set of targets.
pub struct Rollout<'a> {
    pub engine: &'a Engine,
    pub state: &'a StateDir,
    pub reporter: &'a Reporter,
    /// Labels added to every container berth creates (the test suite's `io.berth.test`).
    pub extra_labels: BTreeMap<String, String>,
    /// When cancelled, the rollout stops between steps: a step (one replica started and its
    /// predecessor retired) is always finished, so no proxy is left with fewer ready replicas.
    pub cancel: CancellationToken,
}

/// The rollout stopped because it was cancelled (SIGTERM), between two steps.
#[derive(Debug)]
pub struct Cancelled {
    pub proxy: String,
}

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rollout of {} stopped between two steps (cancelled); the next run completes it",
            self.proxy
        )
    }
}

impl std::error::Error for Cancelled {}

impl Rollout<'_> {
    /// Brings one proxy to its desired state, leaving every other proxy and its state alone
    /// (`berth serve` converges proxies independently). `observed` may hold other containers.
    pub async fn converge_one(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
    ) -> Result<()> {
        let mine: Vec<ObservedContainer> = observed
            .iter()
            .filter(|c| c.proxy() == Some(target.name()))
            .cloned()
            .collect();
        let plan = plan::plan(std::slice::from_ref(&target.desired), &mine);
        let actions: Vec<&Action> = plan.for_proxy(target.name()).collect();
        self.converge_proxy(target, &actions, &mine).await
    }

    /// Brings every target to its desired state and removes berth containers of proxies not
    /// among them. Proxies are converged one after the other; the first failure stops.
    pub async fn converge(&self, targets: &[Target], observed: &[ObservedContainer]) -> Result<()> {
        let desired: Vec<DesiredProxy> = targets.iter().map(|t| t.desired.clone()).collect();
        let plan = plan::plan(&desired, observed);
        for target in targets {
            let actions: Vec<&Action> = plan.for_proxy(target.name()).collect();
            self.converge_proxy(target, &actions, observed).await?;
        }
        let strays: Vec<&Action> = plan
            .actions
            .iter()
            .filter(|a| !targets.iter().any(|t| t.name() == a.proxy()))
            .collect();
        let mut emptied = BTreeSet::new();
        for action in strays {
            if let Action::Remove {
                proxy, container, ..
            } = action
            {
                emptied.insert(proxy.as_str());
                self.retire(
                    proxy,
                    container,
                    observed,
                    &Shutdown::default(),
                    &RolloutPolicy::default(),
                )
                .await?;
            }
        }
        for gone in self.state.proxies()? {
            // `observed` predates the removals above: a proxy whose strays were all just
            // removed has no container left either.
            if !targets.iter().any(|t| t.name() == gone)
                && (emptied.contains(gone.as_str())
                    || !observed.iter().any(|c| c.proxy() == Some(gone.as_str())))
            {
                self.state.remove_proxy(&gone)?;
            }
        }
        Ok(())
    }

    async fn converge_proxy(
        &self,
        target: &Target,
        actions: &[&Action],
        observed: &[ObservedContainer],
    ) -> Result<()> {
        let name = target.name();
        let desired = &target.desired;
        let needs_new = actions
            .iter()
            .any(|a| matches!(a, Action::Create { .. } | Action::Replace { .. }));
        let tampered = self.tampered_bootstrap(desired, observed);
        let image_id = if needs_new || !tampered.is_empty() {
            self.reporter
                .waiting(format!("{name}: image {}", desired.spec.image));
            let id = self
                .engine
                .ensure_image(&desired.spec.image, self.reporter.shows_progress())
                .await?;
            crashpoint::reached("after-pull");
            if self.spec_is_proven(desired, observed) {
                self.copy_tls(target)?;
            } else {
                self.validate_target(target).await?;
                crashpoint::reached("after-validate");
            }
            id
        } else {
            self.copy_tls(target)?;
            String::new()
        };
        self.write_files(target, observed).await?;

        let policy = &target.proxy.rollout;
        let shutdown = &target.proxy.config.shutdown;
        let mut replaced: Vec<(u32, String, String)> = Vec::new(); // (slot, new name, old hash)
        let mut creates_done = false;
        for (done, action) in actions.iter().enumerate() {
            self.reporter.steps(done, actions.len());
            if self.cancel.is_cancelled() {
                return Err(anyhow::Error::new(Cancelled {
                    proxy: name.to_string(),
                }));
            }
            match action {
                Action::Create { .. } => {
                    if creates_done {
                        continue;
                    }
                    creates_done = true;
                    self.create_all(target, actions, &image_id).await?;
                }
                Action::Start {
                    slot, container, ..
                } => {
                    self.engine.start(&container.id).await?;
                    let run_name = run_dir_name(container, observed);
                    self.gate(
                        name,
                        *slot,
                        &container.id,
                        &run_name,
                        policy,
                        Want::of(desired),
                    )
                    .await
                    .map_err(anyhow::Error::new)?;
                    self.reporter.event(
                        Event::new(name, "started")
                            .slot(*slot)
                            .container(&container.name),
                    );
                }
                Action::Replace {
                    slot,
                    old,
                    reason,
                    new_name,
                    ..
                } => {
                    self.reporter.event(
                        Event::new(name, "replacing")
                            .slot(*slot)
                            .container(&old.name)
                            .message(reason.to_string()),
                    );
                    let old_hash = observed
                        .iter()
                        .find(|c| c.id == old.id)
                        .and_then(|c| c.spec_hash())
                        .unwrap_or_default()
                        .to_string();
                    match self
                        .start_replica(desired, *slot, new_name, &image_id, policy)
                        .await
                    {
                        Ok(()) => {
                            self.retire(name, old, observed, shutdown, policy).await?;
                            replaced.push((*slot, new_name.clone(), old_hash));
                        }
                        Err(mut failure) => {
                            failure.aftermath =
                                self.after_failure(target, &replaced, observed).await;
                            return Err(anyhow::Error::new(failure));
                        }
                    }
                }
                Action::Remove {
                    container, reason, ..
                } => {
                    self.reporter.event(
                        Event::new(name, "removing")
                            .container(&container.name)
                            .message(reason.to_string()),
                    );
                    self.retire(name, container, observed, shutdown, policy)
                        .await?;
                }
            }
        }
        for slot_container in &tampered {
            // The bootstrap on disk was changed by hand: it has been rewritten; replicas that
            // could restart with the tampered file are replaced by fresh ones.
            let Some(old) = observed.iter().find(|c| &c.id == slot_container) else {
                continue;
            };
            let slot = old.slot().unwrap_or_default();
            let old_ref = ContainerRef {
                id: old.id.clone(),
                name: old.name.clone(),
            };
            if actions.iter().any(|a| a.slot() == Some(slot)) {
                continue;
            }
            self.reporter.event(
                Event::new(name, "replacing")
                    .slot(slot)
                    .container(&old.name)
                    .message("its bootstrap file was changed on disk"),
            );
            let new_name = fresh_name(desired, slot, observed);
            self.start_replica(desired, slot, &new_name, &image_id, policy)
                .await
                .map_err(anyhow::Error::new)?;
            self.retire(name, &old_ref, observed, shutdown, policy)
                .await?;
        }
        if !actions.is_empty() || !tampered.is_empty() {
            self.prune(target).await?;
        }
        Ok(())
    }

    /// Creates the replicas of every empty slot at once: they are independent (nothing is
    /// retired), so a fresh install or a scale-up costs about one replica's time. Returns the
    /// first failure once all have finished; replicas that became ready stay.
    async fn create_all(&self, target: &Target, actions: &[&Action], image_id: &str) -> Result<()> {
        let policy = &target.proxy.rollout;
        let creates = actions.iter().filter_map(|a| match a {
            Action::Create { slot, name, .. } => {
                Some(self.start_replica(&target.desired, *slot, name, image_id, policy))
            }
            _ => None,
        });
        let results = futures_util::future::join_all(creates).await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            Some(mut failure) => {
                failure.aftermath = format!(
                    "{failed} new replica(s) failed and were removed; no existing replica was \
                     touched; the next `berth up` tries the empty slots again"
                );
                Err(anyhow::Error::new(failure))
            }
        }
    }

    /// A spec is proven when a replica already runs it: no need to validate it again.
    fn spec_is_proven(&self, desired: &DesiredProxy, observed: &[ObservedContainer]) -> bool {
        observed.iter().any(|c| {
            c.is_managed()
                && c.proxy() == Some(desired.spec.proxy.as_str())
                && c.spec_hash() == Some(desired.hash.as_str())
                && c.state == RunState::Running
        })
    }

    /// Running replicas of the current spec whose bootstrap file differs on disk.
    fn tampered_bootstrap(
        &self,
        desired: &DesiredProxy,
        observed: &[ObservedContainer],
    ) -> Vec<String> {
        let proxy = &desired.spec.proxy;
        let on_disk = self
            .state
            .read_generation(proxy, &desired.spec.bootstrap_sha256);
        let intact = on_disk
            .map(|text| replica::sha256_hex(text.as_bytes()) == desired.spec.bootstrap_sha256)
            .unwrap_or(false);
        if intact {
            return Vec::new();
        }
        observed
            .iter()
            .filter(|c| {
                c.is_managed()
                    && c.proxy() == Some(proxy.as_str())
                    && c.spec_hash() == Some(desired.hash.as_str())
            })
            .map(|c| c.id.clone())
            .collect()
    }

    /// After a failed gate: roll the already replaced slots back to their previous spec
    /// (policy `rollback`), or leave them (policy `pause`). Returns what was done.
    async fn after_failure(
        &self,
        target: &Target,
        replaced: &[(u32, String, String)],
        observed: &[ObservedContainer],
    ) -> String {
        let name = target.name();
        if replaced.is_empty() {
            return "no replica had been replaced; the old replicas keep serving".to_string();
        }
        if target.proxy.rollout.on_failure == OnFailure::Pause {
            return format!(
                "rollout paused: {} replica(s) already run the new spec, the others the old one",
                replaced.len()
            );
        }
        let mut notes = Vec::new();
        for (slot, new_name, old_hash) in replaced.iter().rev() {
            let Some(previous) = self.state.read_spec(name, old_hash) else {
                notes.push(format!(
                    "slot {slot}: previous spec {old_hash} is not recorded; left on the new spec"
                ));
                continue;
            };
            let image_id = match self.engine.ensure_image(&previous.spec.image, false).await {
                Ok(id) => id,
                Err(e) => {
                    notes.push(format!("slot {slot}: {e:#}"));
                    continue;
                }
            };
            // Never roll back a rollback: a failure here is reported, not retried.
            let back_name = fresh_name(&previous, *slot, observed);
            match self
                .start_replica(
                    &previous,
                    *slot,
                    &back_name,
                    &image_id,
                    &target.proxy.rollout,
                )
                .await
            {
                Ok(_) => {
                    crashpoint::reached("mid-rollback");
                    let only = BTreeSet::from([name.to_string()]);
                    let current = self
                        .engine
                        .observe_proxies(&only, self.state.root())
                        .await
                        .unwrap_or_default();
                    if let Some(c) = current.iter().find(|c| c.name == *new_name) {
                        let r = ContainerRef {
                            id: c.id.clone(),
                            name: c.name.clone(),
                        };
                        let _ = self
                            .retire(
                                name,
                                &r,
                                observed,
                                &target.proxy.config.shutdown,
                                &target.proxy.rollout,
                            )
                            .await;
                    }
                    self.reporter.event(
                        Event::new(name, "rolled-back")
                            .slot(*slot)
                            .message(old_hash.clone()),
                    );
                    notes.push(format!(
                        "slot {slot}: rolled back to spec {}",
                        replica::short_hash(old_hash)
                    ));
                }
                Err(f) => notes.push(format!(
                    "slot {slot}: rollback failed too ({}); left as is",
                    f.reason
                )),
            }
        }
        format!("rolled back the replaced replicas: {}", notes.join("; "))
    }

    /// Removes files nothing uses any more: old generations, specs and run directories.
    async fn prune(&self, target: &Target) -> Result<()> {
        let name = target.name();
        let current = self
            .engine
            .observe_proxies(&BTreeSet::from([name.to_string()]), self.state.root())
            .await?;
        let mine: Vec<&ObservedContainer> =
            current.iter().filter(|c| c.proxy() == Some(name)).collect();
        let hashes: BTreeSet<String> = mine
            .iter()
            .filter_map(|c| c.spec_hash().map(str::to_string))
            .chain([target.desired.hash.clone()])
            .collect();
        let bootstraps: BTreeSet<String> = hashes
            .iter()
            .filter_map(|h| self.state.read_spec(name, h))
            .map(|d| d.spec.bootstrap_sha256)
            .collect();
        let keep_hashes: Vec<&str> = hashes.iter().map(String::as_str).collect();
        let keep_bootstraps: Vec<&str> = bootstraps.iter().map(String::as_str).collect();
        let runs: Vec<String> = mine
            .iter()
            .map(|c| c.label(LABEL_NAME).unwrap_or(&c.name).to_string())
            .collect();
        let keep_runs: Vec<&str> = runs.iter().map(String::as_str).collect();
        self.state.prune_specs(name, &keep_hashes)?;
        self.state.prune_generations(name, &keep_bootstraps)?;
        self.state.prune_run_dirs(name, &keep_runs)?;
        Ok(())
    }
}

/// The name a container's admin socket directory was created under (its original name).
fn run_dir_name(container: &ContainerRef, observed: &[ObservedContainer]) -> String {
    observed
        .iter()
        .find(|c| c.id == container.id)
        .and_then(|c| c.label(LABEL_NAME))
        .unwrap_or(&container.name)
        .to_string()
}

/// A name for a new replica of `desired` in `slot` that no observed container has, for
/// replacements the planner did not name (tampered files, rollback).
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
