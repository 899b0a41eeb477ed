//! Canaries (`[proxy.rollout.canary]`): the new spec first runs on a few replicas beside all the
//! old ones for `hold`; their own traffic is judged against the old replicas' over the same
//! time ([`super::judge`]), and the rollout promotes (continues) or rolls back by itself.
//!
//! SO_REUSEPORT shares only new connections, so keep-alive clients stay on the old replicas and
//! a canary may see little traffic: without `min_requests` at the end of the hold it neither
//! promotes nor fails, it keeps holding and says so (a canary that saw nothing proves nothing,
//! and rolling back a change nobody judged would hide that).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::judge::{judge, Sample, Thresholds, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Canary {
    /// How many replicas run the new spec during the hold.
    pub replicas: u32,
    #[serde(with = "humantime_serde")]
    pub hold: Duration,
    pub thresholds: Thresholds,
}

impl Default for Canary {
    fn default() -> Self {
        Canary {
            replicas: 1,
            hold: Duration::from_secs(300),
            thresholds: Thresholds {
                min_requests: 100,
                max_error_ratio: 0.05,
            },
        }
    }
}

/// What a canary's numbers say at one look.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Keep holding: why (time left, or too few requests after the hold).
    Hold(String),
    Promote(String),
    RollBack(String),
}

/// The canaries' numbers since the hold began against the old replicas', `elapsed` into a
/// hold of `canary.hold`.
pub fn decide(canary: &Canary, elapsed: Duration, mine: &Sample, old: &Sample) -> Decision {
    let left = canary.hold.saturating_sub(elapsed);
    match judge(mine, old, &canary.thresholds) {
        Verdict::Fail(why) => Decision::RollBack(why),
        Verdict::Pass if left.is_zero() => Decision::Promote(format!(
            "within the thresholds after {}: canaries: {mine}; old replicas: {old}",
            humantime::format_duration(round(elapsed))
        )),
        Verdict::Pass => Decision::Hold(format!(
            "{} left; canaries: {mine}; old replicas: {old}",
            humantime::format_duration(round(left))
        )),
        Verdict::TooFew { requests, needed } if left.is_zero() => Decision::Hold(format!(
            "the hold is over but the canaries answered {requests} of the {needed} requests \
             needed to judge them (keep-alive clients stay on the old replicas): holding until \
             they have, or `berth rollout promote` / `undo`"
        )),
        Verdict::TooFew { requests, needed } => Decision::Hold(format!(
            "{} left; canaries: {requests} of {needed} requests needed so far",
            humantime::format_duration(round(left))
        )),
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// A rollout under way, as recorded in the proxy's `rollout.json` by whoever runs it (`up` or
/// serve): what `berth rollout status` shows, and what a restarted berth needs to resume a
/// canary's hold where it was, with the same baseline.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// The spec hash the rollout goes to.
    pub to_hash: String,
    /// When it (or the canaries' hold) began, seconds since the Unix epoch.
    pub started_at: u64,
    /// The canaries in their hold, (slot, name as recorded: their run directories); empty
    /// when no canary holds (the waves).
    #[serde(default)]
    pub canaries: Vec<(u32, String)>,
    /// The hold's length, seconds.
    #[serde(default)]
    pub hold_secs: u64,
    /// The canaries' and the old replicas' counters when the hold began, by run name.
    #[serde(default)]
    pub start: Vec<(String, Sample)>,
    /// Seconds the hold spent paused, and since when it is paused now.
    #[serde(default)]
    pub paused_secs: u64,
    #[serde(default)]
    pub paused_at: Option<u64>,
    /// The latest word: the hold's decision with its numbers, or the waves' progress.
    #[serde(default)]
    pub last: String,
    /// The canaries' and the old replicas' numbers since the hold began, at the latest look
    /// (`berth rollout status`, serve's `berth_rollout_canary_*`).
    #[serde(default)]
    pub canary_numbers: Option<Sample>,
    #[serde(default)]
    pub baseline_numbers: Option<Sample>,
}

impl RolloutRecord {
    /// How long the hold has run at `now` (seconds since the epoch), paused time left out.
    pub fn held(&self, now: u64) -> Duration {
        let paused_now = self.paused_at.map_or(0, |p| now.saturating_sub(p));
        Duration::from_secs(
            now.saturating_sub(self.started_at)
                .saturating_sub(self.paused_secs + paused_now),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(requests: u64, errors_5xx: u64) -> Sample {
        Sample {
            requests,
            errors_5xx,
            ..Sample::default()
        }
    }

    #[test]
    fn a_failing_canary_rolls_back_at_once_and_a_good_one_waits_for_the_hold() {
        let c = Canary::default();
        let early = Duration::from_secs(10);
        assert!(matches!(
            decide(&c, early, &s(200, 100), &s(2000, 0)),
            Decision::RollBack(_)
        ));
        let d = decide(&c, early, &s(200, 0), &s(2000, 0));
        assert!(
            matches!(&d, Decision::Hold(w) if w.starts_with("4m 50s left")),
            "{d:?}"
        );
        let d = decide(&c, c.hold, &s(200, 0), &s(2000, 0));
        assert!(
            matches!(&d, Decision::Promote(w) if w.contains("after 5m")),
            "{d:?}"
        );
    }

    #[test]
    fn paused_time_does_not_count() {
        let r = RolloutRecord {
            started_at: 100,
            paused_secs: 10,
            paused_at: Some(150),
            ..RolloutRecord::default()
        };
        assert_eq!(r.held(160), Duration::from_secs(40));
        assert_eq!(
            RolloutRecord {
                paused_at: None,
                ..r
            }
            .held(160),
            Duration::from_secs(50)
        );
    }

    #[test]
    fn too_few_requests_keep_holding_and_say_so() {
        let c = Canary::default();
        let d = decide(&c, c.hold * 2, &s(10, 0), &s(2000, 0));
        assert!(
            matches!(&d, Decision::Hold(w) if w.contains("answered 10 of the 100")),
            "{d:?}"
        );
    }
}
