//! A canary's hold (issue 22, [`crate::core::rollout::canary`]): the canaries run beside every old
//! replica; every [`LOOK_EVERY`] their counters since the hold began are judged against the old
//! replicas'. The hold is recorded in the proxy's `rollout.json` (when it began, and every
//! counter then), so a berth that stops during the hold (serve restarted, `up` interrupted)
//! resumes it with the same baseline: a canary is never forgotten, nor promoted without its
//! numbers.

use std::collections::BTreeMap;
use std::time::Duration;

use super::execute::Run;
use crate::core::plan::ContainerRef;
use crate::core::progress::Event;
use crate::core::rollout::canary::{decide, Canary, Decision, RolloutRecord};
use crate::core::rollout::Sample;
use crate::core::target::Target;
use crate::engine::{ObservedContainer, RunState};
use crate::infra::ConvergeError;
pub(super) use crate::state::rollout::now_secs;
use crate::state::rollout::{Request, RolloutFiles};

/// How often a holding canary is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often a hold that goes on says so as an event (besides the progress line).
const SAY_EVERY: Duration = Duration::from_secs(30);
/// Timeout of one admin call while holding.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The rollout files of `proxy` in this host's state directory.
pub(super) fn files(run: &Run<'_>, proxy: &str) -> RolloutFiles {
    RolloutFiles::new(run.state.root(), proxy)
}

pub(super) fn forget_record(run: &Run<'_>, proxy: &str) {
    files(run, proxy).forget();
}

/// How a hold ended.
pub(super) enum Held {
    Promoted(String),
    RolledBack(String),
}

impl Run<'_> {
    /// Holds `canaries` ((slot, run name) of each) beside `olds` (run names of the old
    /// replicas) until the numbers decide; resumes `resumed` when it is this hold's record.
    pub(super) async fn hold_canary(
        &self,
        proxy: &str,
        to_hash: &str,
        canary: &Canary,
        canaries: &[(u32, String)],
        olds: &[String],
        resumed: Option<RolloutRecord>,
    ) -> Result<Held, ConvergeError> {
        let admin = |run: &str| self.host.admin(proxy, run, ADMIN_TIMEOUT);
        let files = files(self, proxy);
        let mut record = match resumed {
            Some(r) => {
                self.reporter
                    .event(Event::new(proxy, "canary-resumed").message(format!(
                        "hold of {} canary replica(s) resumed, {}s into it",
                        r.canaries.len(),
                        r.held(now_secs()).as_secs()
                    )));
                r
            }
            None => {
                let mut start = Vec::new();
                for run in canaries.iter().map(|(_, r)| r).chain(olds) {
                    let s = crate::envoy::traffic::sample(admin(run).as_ref())
                        .await
                        .unwrap_or_default();
                    start.push((run.clone(), s));
                }
                let r = RolloutRecord {
                    to_hash: to_hash.to_string(),
                    started_at: now_secs(),
                    canaries: canaries.to_vec(),
                    hold_secs: canary.hold.as_secs(),
                    start,
                    ..RolloutRecord::default()
                };
                files.write(&r)?;
                self.reporter
                    .event(Event::new(proxy, "canary").message(format!(
                        "holding {} canary replica(s) beside {} old one(s) for {}",
                        canaries.len(),
                        olds.len(),
                        humantime::format_duration(canary.hold)
                    )));
                r
            }
        };
        let start: BTreeMap<String, Sample> = record.start.iter().cloned().collect();
        let mut said = None::<tokio::time::Instant>;
        loop {
            if self.cancel.is_cancelled() {
                return Err(ConvergeError::Cancelled {
                    proxy: proxy.to_string(),
                });
            }
            let since_start =
                |run: &str, now: Sample| now.since(&start.get(run).copied().unwrap_or_default());
            let mut mine = Sample::default();
            for (slot, run) in canaries {
                match crate::envoy::traffic::sample(admin(run).as_ref()).await {
                    Ok(now) => mine.add(&since_start(run, now)),
                    Err(e) => {
                        return Ok(Held::RolledBack(format!(
                            "canary {proxy}/{slot} ({run}) stopped answering on its admin \
                             socket: {e:#}"
                        )))
                    }
                }
            }
            let mut old = Sample::default();
            for run in olds {
                if let Ok(now) = crate::envoy::traffic::sample(admin(run).as_ref()).await {
                    old.add(&since_start(run, now));
                }
            }
            record.canary_numbers = Some(mine);
            record.baseline_numbers = Some(old);
            let now = now_secs();
            let elapsed = record.held(now);
            let numbers = format!("canaries: {mine}; old replicas: {old}");
            if files.take(Request::Undo) {
                files.set_undone(to_hash)?;
                return Ok(Held::RolledBack(format!(
                    "undone by hand (berth rollout undo) after {}s of its hold; {numbers}",
                    elapsed.as_secs()
                )));
            }
            if files.take(Request::Promote) {
                return Ok(Held::Promoted(format!(
                    "promoted by hand (berth rollout promote) after {}s of its hold; {numbers}",
                    elapsed.as_secs()
                )));
            }
            let paused = files.paused();
            let decision = match (paused, record.paused_at) {
                (true, None) => {
                    record.paused_at = Some(now);
                    self.reporter
                        .event(Event::new(proxy, "canary-paused").message(format!(
                            "paused by hand after {}s; {numbers}",
                            elapsed.as_secs()
                        )));
                    None
                }
                (true, Some(_)) => None,
                (false, Some(at)) => {
                    record.paused_secs += now.saturating_sub(at);
                    record.paused_at = None;
                    self.reporter
                        .event(Event::new(proxy, "canary-unpaused").message(numbers.clone()));
                    Some(decide(canary, record.held(now), &mine, &old))
                }
                (false, None) => Some(decide(canary, elapsed, &mine, &old)),
            };
            match decision {
                Some(Decision::Promote(why)) => return Ok(Held::Promoted(why)),
                Some(Decision::RollBack(why)) => {
                    return Ok(Held::RolledBack(format!(
                        "after {}s of its hold: {why}",
                        elapsed.as_secs()
                    )))
                }
                Some(Decision::Hold(why)) => {
                    self.reporter.waiting(format!("{proxy}: canary: {why}"));
                    if said.is_none_or(|t| t.elapsed() >= SAY_EVERY) {
                        self.reporter
                            .event(Event::new(proxy, "canary-holding").message(why.clone()));
                        said = Some(tokio::time::Instant::now());
                    }
                    record.last = why;
                }
                None => {
                    record.last = format!("paused; {numbers}");
                    self.reporter
                        .waiting(format!("{proxy}: canary paused (berth rollout resume)"));
                }
            }
            let _ = files.write(&record);
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }
}

impl Run<'_> {
    /// Resumes the hold recorded for `target` when its canaries still run the desired spec
    /// (berth stopped during a hold): decides it, then returns the IDs of the old replicas
    /// beside the canaries that the plan would remove as duplicates (they are the hold's
    /// business: retired on promotion, kept on a rollback). None when there is no such hold;
    /// a record that no longer fits is dropped.
    pub(super) async fn resume_canary(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
    ) -> Result<Option<Vec<String>>, ConvergeError> {
        let name = target.name();
        let desired = &target.desired;
        let Some(record) = files(self, name).read() else {
            return Ok(None);
        };
        let running = |c: &&ObservedContainer| c.state == RunState::Running;
        let run_name = |c: &ObservedContainer| c.recorded_name().unwrap_or(&c.name).to_string();
        let canaries_run = record.canaries.iter().all(|(_, n)| {
            observed
                .iter()
                .filter(running)
                .any(|c| run_name(c) == *n && c.spec_hash() == Some(desired.hash.as_str()))
        });
        let Some(canary) = desired.rollout.canary.filter(|_| {
            record.to_hash == desired.hash && canaries_run && !record.canaries.is_empty()
        }) else {
            forget_record(self, name);
            return Ok(None);
        };
        let slots: Vec<u32> = record.canaries.iter().map(|(s, _)| *s).collect();
        let partners: Vec<ContainerRef> = observed
            .iter()
            .filter(running)
            .filter(|c| {
                c.spec_hash() != Some(desired.hash.as_str())
                    && c.slot().is_some_and(|s| slots.contains(&s))
            })
            .map(ContainerRef::of)
            .collect();
        let olds = super::waves::old_run_names(target, observed);
        let canaries = record.canaries.clone();
        let held = self
            .hold_canary(name, &desired.hash, &canary, &canaries, &olds, Some(record))
            .await?;
        self.end_hold(target, held, &canaries, &partners, observed)
            .await?;
        Ok(Some(partners.into_iter().map(|c| c.id).collect()))
    }
}

/// When `berth rollout undo` rolled `target`'s desired spec back: the spec its replicas stay
/// on (the one most of them run), as a desired proxy to count readiness by.
pub(super) fn held_spec(
    run: &Run<'_>,
    target: &Target,
    observed: &[ObservedContainer],
) -> Option<crate::core::replica::DesiredProxy> {
    let desired = &target.desired;
    if files(run, target.name()).undone()? != desired.hash {
        return None;
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for h in observed.iter().filter_map(|c| c.spec_hash()) {
        *counts.entry(h).or_default() += 1;
    }
    let (held, _) = counts
        .into_iter()
        .filter(|(h, _)| *h != desired.hash)
        .max_by_key(|(_, n)| *n)?;
    let mut d = desired.clone();
    d.hash = held.to_string();
    Some(d)
}
