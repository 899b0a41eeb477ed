//! Replacements in waves of `max_surge` (issue 22): every new replica of a wave starts and
//! passes the gate together, beside the old ones, then the wave's old replicas drain together.
//! `maxUnavailable` is 0: a proxy never serves on fewer than its replica count, and never runs
//! more than its count plus the surge. A failed gate in a wave retires the wave's other new
//! replicas, keeps its old ones, and rolls the earlier waves back, as many slots at a time.
//!
//! Before the first wave the host is asked whether it holds the surge (memory limits, inotify
//! instances, CPUs); when it does not, the surge is lowered and an event says why.

use std::collections::BTreeSet;
use std::time::Duration;

use super::canary::{files, forget_record, now_secs, Held};
use super::execute::{run_dir_name, Run};
use super::gate::{Gate, GateFailure, Want};
use super::traffic_gate::{Siblings, MAX_SIBLINGS};
use crate::core::plan::{Action, ContainerRef};
use crate::core::progress::Event;
use crate::core::rollout::canary::RolloutRecord;
use crate::core::rollout::surge::{self, Limit};
use crate::core::rollout::Thresholds;
use crate::core::target::Target;
use crate::engine::{ObservedContainer, RunState};
use crate::infra::ConvergeError;
use crate::state::rollout::{Request, RolloutFiles};

/// Timeout of one admin call to a sibling while judging traffic.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// New replicas per host CPU that may start together: beyond this, starting more at once
/// makes every one slower (Envoy's start is CPU-bound) without finishing the wave sooner.
const STARTS_PER_CPU: u32 = 4;

/// A wave that failed: the first failure, and the new replicas of the wave that passed.
struct WaveFailure {
    failure: GateFailure,
    passed: Vec<String>,
}

/// One planned replacement.
struct Replacement<'a> {
    slot: u32,
    old: &'a ContainerRef,
    new_name: &'a str,
    reason: String,
    old_hash: String,
}

impl Run<'_> {
    /// Runs every [`Action::Replace`] of `actions` in waves; how many were replaced.
    pub(super) async fn replace_in_waves(
        &self,
        target: &Target,
        actions: &[&Action],
        observed: &[ObservedContainer],
        image_id: &str,
        want: &Want,
        canary_done: bool,
    ) -> Result<usize, ConvergeError> {
        let name = target.name();
        let desired = &target.desired;
        let replacements: Vec<Replacement> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Replace {
                    slot,
                    old,
                    new_name,
                    reason,
                    ..
                } => Some(Replacement {
                    slot: *slot,
                    old,
                    new_name,
                    reason: reason.to_string(),
                    old_hash: observed
                        .iter()
                        .find(|c| c.id == old.id)
                        .and_then(|c| c.spec_hash())
                        .unwrap_or_default()
                        .to_string(),
                }),
                _ => None,
            })
            .collect();
        if replacements.is_empty() {
            return Ok(0);
        }
        let files = files(self, name);
        match files.undone() {
            Some(h) if h == desired.hash => {
                self.reporter
                    .event(Event::new(name, "held").message(format!(
                    "the rollout to spec {} was undone (berth rollout undo): the replicas stay \
                     on their spec until the config asks for another one",
                    crate::core::replica::short_hash(&h)
                )));
                return Ok(0);
            }
            Some(_) => files.clear_undone(),
            None => {}
        }
        let surge = self.surge(target, observed, replacements.len());
        let result = self
            .replace_all(
                target,
                &replacements,
                observed,
                image_id,
                want,
                canary_done,
                surge,
            )
            .await;
        // A berth stopping mid-hold keeps the record: the next pass resumes the hold.
        let cancelled = matches!(result, Err(ConvergeError::Cancelled { .. }));
        if !(cancelled && files.read().is_some_and(|r| !r.canaries.is_empty())) {
            files.forget();
        }
        // Every replica rolled: what `berth rollout undo` after it goes back to (the spec most
        // of them ran), kept recorded until the next finished rollout.
        if matches!(result, Ok(n) if n == replacements.len()) {
            let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
            for r in replacements.iter().filter(|r| !r.old_hash.is_empty()) {
                *counts.entry(r.old_hash.as_str()).or_default() += 1;
            }
            if let Some((from, _)) = counts.into_iter().max_by_key(|(_, n)| *n) {
                files.set_previous(from, &desired.hash)?;
            }
        }
        result
    }

    /// `berth rollout undo` after a finished rollout: the replicas running the undone spec
    /// (`target`'s desired one) go back to the spec that rollout came from, `max_surge` slots
    /// at a time, each as a rollback does (a replica of the previous spec started and gated,
    /// then the undone one drained). How many went back; 0 when there is no such undo.
    pub(super) async fn undo_finished(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
    ) -> Result<usize, ConvergeError> {
        let name = target.name();
        let desired = &target.desired;
        let files = files(self, name);
        // The config asks for another spec than the undone one: the undo is over.
        if files.undone().is_some_and(|h| h != desired.hash) {
            files.clear_undone();
        }
        let (Some(undone), Some((from, to))) = (files.undone(), files.previous()) else {
            return Ok(0);
        };
        if undone != desired.hash || to != desired.hash || files.read().is_some() {
            return Ok(0);
        }
        let back: Vec<(u32, String, String)> = observed
            .iter()
            .filter(|c| c.state == RunState::Running && c.spec_hash() == Some(to.as_str()))
            .filter_map(|c| Some((c.slot()?, c.name.clone(), from.clone())))
            .collect();
        if back.is_empty() {
            return Ok(0);
        }
        if self.state.read_spec(name, &from).is_none() {
            // `berth rollout undo` checks this before it asks; nothing to go back to.
            files.clear_undone();
            self.reporter
                .event(Event::new(name, "note").message(format!(
                    "berth rollout undo: the previous spec {} is no longer recorded; the replicas \
                 stay on spec {} (edit the config back instead)",
                    crate::core::replica::short_hash(&from),
                    crate::core::replica::short_hash(&to)
                )));
            return Ok(0);
        }
        let surge = self.surge(target, observed, back.len());
        self.reporter
            .event(Event::new(name, "undoing").message(format!(
                "berth rollout undo: {} replica(s) go back from spec {} to spec {}",
                back.len(),
                crate::core::replica::short_hash(&to),
                crate::core::replica::short_hash(&from)
            )));
        let mut done = 0;
        for wave in back.chunks(surge) {
            if self.cancel.is_cancelled() {
                return Err(ConvergeError::Cancelled {
                    proxy: name.to_string(),
                });
            }
            let backs = wave.iter().map(|(slot, new_name, old_hash)| {
                self.roll_back_slot(name, *slot, new_name, old_hash, observed)
            });
            for note in futures_util::future::join_all(backs).await {
                if !note.contains("rolled back to spec") {
                    return Err(ConvergeError::Host {
                        problem: format!(
                            "{name}: berth rollout undo stopped with {done} of {} back: {note}",
                            back.len()
                        ),
                    });
                }
                done += 1;
            }
        }
        Ok(done)
    }

    /// [`Self::replace_in_waves`] once the surge is known: the canary's hold if there is one,
    /// then the waves; `berth rollout pause` and `undo` are honoured between waves.
    #[allow(clippy::too_many_arguments)]
    async fn replace_all(
        &self,
        target: &Target,
        replacements: &[Replacement<'_>],
        observed: &[ObservedContainer],
        image_id: &str,
        want: &Want,
        canary_done: bool,
        surge: usize,
    ) -> Result<usize, ConvergeError> {
        let name = target.name();
        let desired = &target.desired;
        let files = files(self, name);
        // (slot, new name, old hash) of each replacement done, for a rollback.
        let mut replaced: Vec<(u32, String, String)> = Vec::new();
        let mut retired: BTreeSet<String> = BTreeSet::new();
        let mut rest: &[Replacement] = replacements;
        if let Some(canary) = desired.rollout.canary.filter(|_| !canary_done) {
            let (first, others) = rest.split_at((canary.replicas as usize).min(rest.len()));
            if let Err(failed) = self
                .start_wave(target, first, observed, &retired, image_id, want)
                .await
            {
                let mut failure = self.fail_wave(target, failed).await;
                if failure.aftermath.is_empty() {
                    failure.aftermath = "the canary did not start; no replica had been \
                                         replaced; the old replicas keep serving"
                        .to_string();
                }
                return Err(failure.into());
            }
            let canaries: Vec<(u32, String)> = first
                .iter()
                .map(|r| (r.slot, r.new_name.to_string()))
                .collect();
            let olds = old_run_names(target, observed);
            let held = self
                .hold_canary(name, &desired.hash, &canary, &canaries, &olds, None)
                .await?;
            let partners: Vec<ContainerRef> = first.iter().map(|r| r.old.clone()).collect();
            self.end_hold(target, held, &canaries, &partners, observed)
                .await?;
            for r in first {
                retired.insert(r.old.id.clone());
                replaced.push((r.slot, r.new_name.to_string(), r.old_hash.clone()));
            }
            rest = others;
        }
        let mut record = RolloutRecord {
            to_hash: desired.hash.clone(),
            started_at: now_secs(),
            ..RolloutRecord::default()
        };
        for wave in rest.chunks(surge) {
            record.last = format!(
                "{} of {} replaced, {surge} at a time",
                replaced.len(),
                replacements.len()
            );
            if self.cancel.is_cancelled() {
                return Err(ConvergeError::Cancelled {
                    proxy: name.to_string(),
                });
            }
            let _ = files.write(&record);
            self.wait_while_paused(name, &files).await?;
            if files.take(Request::Undo) {
                files.set_undone(&desired.hash)?;
                let back = self.after_failure(target, &replaced, observed, surge).await;
                return Err(GateFailure {
                    proxy: name.to_string(),
                    slot: wave[0].slot,
                    container: wave[0].new_name.to_string(),
                    gate: Gate::Undone,
                    reason: format!(
                        "undone by hand (berth rollout undo) with {} of {} replaced",
                        replaced.len(),
                        replacements.len()
                    ),
                    why: Vec::new(),
                    log_tail: String::new(),
                    aftermath: back,
                }
                .into());
            }
            if let Err(failed) = self
                .start_wave(target, wave, observed, &retired, image_id, want)
                .await
            {
                let mut failure = self.fail_wave(target, failed).await;
                let back = self.after_failure(target, &replaced, observed, surge).await;
                failure.aftermath = match failure.aftermath.is_empty() {
                    true => back,
                    false => format!("{}; {back}", failure.aftermath),
                };
                return Err(failure.into());
            }
            let retires = wave
                .iter()
                .map(|r| self.retire(name, r.old, observed, &desired.shutdown, &desired.rollout));
            for done in futures_util::future::join_all(retires).await {
                done?;
            }
            for r in wave {
                retired.insert(r.old.id.clone());
                replaced.push((r.slot, r.new_name.to_string(), r.old_hash.clone()));
            }
        }
        Ok(replaced.len())
    }

    /// Waits while `berth rollout pause` holds the rollout (between two waves).
    async fn wait_while_paused(
        &self,
        name: &str,
        files: &RolloutFiles,
    ) -> Result<(), ConvergeError> {
        if !files.paused() {
            return Ok(());
        }
        self.reporter.event(
            Event::new(name, "paused").message("paused by hand; `berth rollout resume` goes on"),
        );
        while files.paused() {
            if self.cancel.is_cancelled() {
                return Err(ConvergeError::Cancelled {
                    proxy: name.to_string(),
                });
            }
            self.reporter
                .waiting(format!("{name}: rollout paused (berth rollout resume)"));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.reporter.event(Event::new(name, "resumed"));
        Ok(())
    }

    /// Starts and gates the new replicas of `wave` together, each judged against the old
    /// replicas not yet retired.
    async fn start_wave(
        &self,
        target: &Target,
        wave: &[Replacement<'_>],
        observed: &[ObservedContainer],
        retired: &BTreeSet<String>,
        image_id: &str,
        want: &Want,
    ) -> Result<(), WaveFailure> {
        let name = target.name();
        for r in wave {
            self.reporter.event(
                Event::new(name, "replacing")
                    .slot(r.slot)
                    .container(&r.old.name)
                    .message(r.reason.clone()),
            );
        }
        let siblings = self.siblings(target, observed, retired);
        let starts = wave.iter().map(|r| {
            self.start_replica(
                &target.desired,
                r.slot,
                r.new_name,
                image_id,
                want,
                siblings.as_ref(),
            )
        });
        let results = futures_util::future::join_all(starts).await;
        let passed: Vec<String> = wave
            .iter()
            .zip(&results)
            .filter(|(_, res)| res.is_ok())
            .map(|(r, _)| r.new_name.to_string())
            .collect();
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            Some(failure) => Err(WaveFailure { failure, passed }),
        }
    }

    /// After a failed wave: its new replicas that passed are drained and removed (their old
    /// ones were never touched); the failure says so.
    async fn fail_wave(&self, target: &Target, f: WaveFailure) -> GateFailure {
        let mut failure = f.failure;
        let retired = self.retire_new(target, &f.passed).await;
        if retired > 0 {
            failure.aftermath = format!(
                "{retired} other new replica(s) of its wave were ready and were retired, their \
                 old replicas kept"
            );
        }
        failure
    }

    /// Ends a canary's hold: promoted, the old replicas of the canaries' slots retire; rolled
    /// back, the canaries do, and the failure carries the numbers.
    pub(super) async fn end_hold(
        &self,
        target: &Target,
        held: Held,
        canaries: &[(u32, String)],
        olds: &[ContainerRef],
        observed: &[ObservedContainer],
    ) -> Result<(), ConvergeError> {
        let name = target.name();
        let desired = &target.desired;
        forget_record(self, name);
        match held {
            Held::Promoted(why) => {
                self.reporter
                    .event(Event::new(name, "canary-promoted").message(why));
                let retires = olds
                    .iter()
                    .map(|c| self.retire(name, c, observed, &desired.shutdown, &desired.rollout));
                for done in futures_util::future::join_all(retires).await {
                    done?;
                }
                Ok(())
            }
            Held::RolledBack(why) => {
                let names: Vec<String> = canaries.iter().map(|(_, n)| n.clone()).collect();
                self.retire_new(target, &names).await;
                self.reporter
                    .event(Event::new(name, "canary-rolled-back").message(why.clone()));
                let (slot, container) = canaries.first().cloned().unwrap_or_default();
                Err(GateFailure {
                    proxy: name.to_string(),
                    slot,
                    container,
                    gate: Gate::Canary,
                    reason: why,
                    why: Vec::new(),
                    log_tail: String::new(),
                    aftermath: format!(
                        "the {} canary replica(s) were drained and removed; the old replicas \
                         kept serving throughout",
                        canaries.len()
                    ),
                }
                .into())
            }
        }
    }

    /// Drains and removes the new replicas named `names` (of a failed wave or hold).
    async fn retire_new(&self, target: &Target, names: &[String]) -> usize {
        if names.is_empty() {
            return 0;
        }
        let name = target.name();
        self.host.forget_observation();
        let current = self.host.observe_proxy(name).await.unwrap_or_default();
        let retires = names.iter().filter_map(|n| {
            let c = current.iter().find(|c| c.name == *n)?;
            let (shutdown, policy) = self.drain_settings(name, c);
            let c = ContainerRef::of(c);
            let current = &current;
            Some(async move {
                self.retire(name, &c, current, &shutdown, &policy)
                    .await
                    .is_ok()
            })
        });
        futures_util::future::join_all(retires)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    /// The old replicas a wave's new ones are judged against (at most [`MAX_SIBLINGS`]), or
    /// None when the gate does not judge traffic or nothing old serves.
    fn siblings(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
        retired: &BTreeSet<String>,
    ) -> Option<Siblings> {
        let desired = &target.desired;
        if !desired.rollout.judge_traffic {
            return None;
        }
        let admins: Vec<_> = observed
            .iter()
            .filter(|c| {
                c.state == RunState::Running
                    && c.spec_hash() != Some(desired.hash.as_str())
                    && !retired.contains(&c.id)
            })
            .take(MAX_SIBLINGS)
            .map(|c| {
                let run = run_dir_name(&ContainerRef::of(c), observed);
                self.host.admin(target.name(), &run, ADMIN_TIMEOUT)
            })
            .collect();
        (!admins.is_empty()).then_some(Siblings {
            admins,
            thresholds: Thresholds::GATE,
        })
    }

    /// The surge this rollout of `n` replacements runs with: `max_surge` resolved against the
    /// replica count, lowered to what the host holds, with an event saying so.
    fn surge(&self, target: &Target, observed: &[ObservedContainer], n: usize) -> usize {
        let name = target.name();
        let desired = &target.desired;
        let policy = desired.rollout.max_surge;
        let wanted = policy.resolve(desired.replicas).min(n as u32).max(1);
        let (surge, lowered) = if wanted > 1 {
            surge::fit(wanted, &host_limits(target, observed))
        } else {
            (1, None)
        };
        if let Some(why) = lowered {
            self.reporter
                .event(Event::new(name, "surge-lowered").message(why));
        }
        self.reporter
            .event(Event::new(name, "surge").message(format!(
                "replacing {n} replica(s), {surge} at a time (max_surge {policy})"
            )));
        surge as usize
    }
}

/// What this host holds beside the replicas running now, one [`Limit`] per resource.
fn host_limits(target: &Target, observed: &[ObservedContainer]) -> Vec<Limit> {
    let mut limits = Vec::new();
    let running = observed
        .iter()
        .filter(|c| c.state == RunState::Running)
        .count() as u64;
    if let Some(memory) = target.desired.spec.memory.filter(|m| *m > 0) {
        let mut sys = sysinfo::System::new();
        sys.refresh_memory();
        let total = sys.total_memory();
        let memory = memory as u64;
        let allows = (total / memory).saturating_sub(running);
        limits.push(Limit {
            allows: allows.min(u64::from(u32::MAX)) as u32,
            why: format!(
                "memory: {running} running replica(s) of {} limit each leave room for {allows} \
                 more within this host's {}",
                crate::host::preflight::human_bytes(memory),
                crate::host::preflight::human_bytes(total)
            ),
        });
    }
    let per = u64::from(target.rendered.inotify_per_replica);
    let max = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let (Some(max), true) = (max, per > 0) {
        let uid = crate::core::replica::replica_user().uid;
        let used = crate::host::inotify::usage(uid, &BTreeSet::new()).instances;
        let allows = max.saturating_sub(used).checked_div(per).unwrap_or(0);
        limits.push(Limit {
            allows: allows.min(u64::from(u32::MAX)) as u32,
            why: format!(
                "inotify: uid {uid} holds {used} of fs.inotify.max_user_instances {max}, room \
                 for {allows} more replica(s) of {per} each"
            ),
        });
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    limits.push(Limit {
        allows: cpus * STARTS_PER_CPU,
        why: format!("CPU: {cpus} CPU(s), at most {STARTS_PER_CPU} starting replicas each"),
    });
    limits
}

/// The run names of the running replicas of other specs than the desired one: the old ones.
pub(super) fn old_run_names(target: &Target, observed: &[ObservedContainer]) -> Vec<String> {
    observed
        .iter()
        .filter(|c| {
            c.state == RunState::Running && c.spec_hash() != Some(target.desired.hash.as_str())
        })
        .map(|c| run_dir_name(&ContainerRef::of(c), observed))
        .collect()
}
