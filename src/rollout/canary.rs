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

/// A canary in its hold, as recorded in the proxy's `rollout.json`: what a restarted berth
/// needs to resume the hold where it was, with the same baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryRecord {
    /// The spec hash the canaries run.
    pub to_hash: String,
    /// Names (as recorded: their run directories) of the canary containers, by slot.
    pub canaries: Vec<(u32, String)>,
    /// When the hold began, seconds since the Unix epoch.
    pub started_at: u64,
    /// The canaries' and the old replicas' counters when the hold began, by run name.
    pub start: Vec<(String, Sample)>,
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
    fn too_few_requests_keep_holding_and_say_so() {
        let c = Canary::default();
        let d = decide(&c, c.hold * 2, &s(10, 0), &s(2000, 0));
        assert!(
            matches!(&d, Decision::Hold(w) if w.contains("answered 10 of the 100")),
            "{d:?}"
        );
    }
}
