//! A canary's hold (issue 22, [`crate::rollout::canary`]): the canaries run beside every old
//! replica; every [`LOOK_EVERY`] their counters since the hold began are judged against the old
//! replicas'. The hold is recorded in the proxy's `rollout.json` (when it began, and every
//! counter then), so a berth that stops during the hold (serve restarted, `up` interrupted)
//! resumes it with the same baseline: a canary is never forgotten, nor promoted without its
//! numbers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::execute::Run;
use crate::engine::{ObservedContainer, RunState};
use crate::infrastructure::ConvergeError;
use crate::plan::ContainerRef;
use crate::progress::Event;
use crate::rollout::canary::{decide, Canary, CanaryRecord, Decision};
use crate::rollout::Sample;
use crate::target::Target;

/// How often a holding canary is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often a hold that goes on says so as an event (besides the progress line).
const SAY_EVERY: Duration = Duration::from_secs(30);
/// Timeout of one admin call while holding.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The file a proxy's canary hold is recorded in.
pub(super) fn record_path(run: &Run<'_>, proxy: &str) -> PathBuf {
    run.state.proxy(proxy).root().join("rollout.json")
}

pub(super) fn read_record(run: &Run<'_>, proxy: &str) -> Option<CanaryRecord> {
    let text = std::fs::read_to_string(record_path(run, proxy)).ok()?;
    serde_json::from_str(&text).ok()
}

pub(super) fn forget_record(run: &Run<'_>, proxy: &str) {
    let _ = std::fs::remove_file(record_path(run, proxy));
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
        resumed: Option<CanaryRecord>,
    ) -> Result<Held, ConvergeError> {
        let admin = |run: &str| self.host.admin(proxy, run, ADMIN_TIMEOUT);
        let record = match resumed {
            Some(r) => {
                self.reporter
                    .event(Event::new(proxy, "canary-resumed").message(format!(
                        "hold of {} canary replica(s) resumed, {}s after it began",
                        r.canaries.len(),
                        now_secs().saturating_sub(r.started_at)
                    )));
                r
            }
            None => {
                let mut start = Vec::new();
                for run in canaries.iter().map(|(_, r)| r).chain(olds) {
                    let s = crate::traffic::sample(admin(run).as_ref())
                        .await
                        .unwrap_or_default();
                    start.push((run.clone(), s));
                }
                let r = CanaryRecord {
                    to_hash: to_hash.to_string(),
                    canaries: canaries.to_vec(),
                    started_at: now_secs(),
                    start,
                };
                let json = serde_json::to_vec_pretty(&r).unwrap_or_default();
                crate::state::write_atomic(&record_path(self, proxy), &json, 0o600)?;
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
        let start: BTreeMap<&str, Sample> =
            record.start.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let mut said = None::<tokio::time::Instant>;
        loop {
            if self.cancel.is_cancelled() {
                return Err(ConvergeError::Cancelled {
                    proxy: proxy.to_string(),
                });
            }
            let mut mine = Sample::default();
            for (slot, run) in canaries {
                match crate::traffic::sample(admin(run).as_ref()).await {
                    Ok(now) => {
                        mine.add(&now.since(&start.get(run.as_str()).copied().unwrap_or_default()))
                    }
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
                if let Ok(now) = crate::traffic::sample(admin(run).as_ref()).await {
                    old.add(&now.since(&start.get(run.as_str()).copied().unwrap_or_default()));
                }
            }
            let elapsed = Duration::from_secs(now_secs().saturating_sub(record.started_at));
            match decide(canary, elapsed, &mine, &old) {
                Decision::Promote(why) => return Ok(Held::Promoted(why)),
                Decision::RollBack(why) => {
                    return Ok(Held::RolledBack(format!(
                        "after {}s of its hold: {why}",
                        elapsed.as_secs()
                    )))
                }
                Decision::Hold(why) => {
                    self.reporter.waiting(format!("{proxy}: canary: {why}"));
                    let due = said.is_none_or(|t| t.elapsed() >= SAY_EVERY);
                    if due {
                        self.reporter
                            .event(Event::new(proxy, "canary-holding").message(why));
                        said = Some(tokio::time::Instant::now());
                    }
                }
            }
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
        let Some(record) = read_record(self, name) else {
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
