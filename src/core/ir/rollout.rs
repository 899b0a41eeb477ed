//! The IR's rollout policy: how a proxy's replicas are replaced (deadlines, surge, traffic
//! judgement, canary) and what happens when a new replica fails.

use super::*;

/// berth's rollout policy for one proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// How long a new replica may take to report /ready LIVE.
    #[serde(with = "humantime_serde")]
    pub startup_deadline: Duration,
    /// How long a new replica must stay ready before the old one is retired.
    #[serde(with = "humantime_serde")]
    pub min_ready: Duration,
    pub on_failure: OnFailure,
    /// How many new replicas start and are gated together ([`crate::core::rollout::surge`]).
    #[serde(default)]
    pub max_surge: crate::core::rollout::MaxSurge,
    /// Whether the gate judges a new replica's own traffic during `min_ready` against its
    /// siblings' ([`crate::core::rollout::judge`], [`crate::core::rollout::Thresholds::GATE`]).
    #[serde(default = "yes")]
    pub judge_traffic: bool,
    /// `[proxy.rollout.canary]`: the first replicas of the new spec are held beside the old
    /// ones and judged before the rest roll ([`crate::core::rollout::canary`]).
    #[serde(default)]
    pub canary: Option<crate::core::rollout::Canary>,
}

fn yes() -> bool {
    true
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        RolloutPolicy {
            startup_deadline: Duration::from_secs(30),
            min_ready: Duration::from_secs(2),
            on_failure: OnFailure::Rollback,
            max_surge: crate::core::rollout::MaxSurge::default(),
            judge_traffic: true,
            canary: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    #[default]
    Rollback,
    Pause,
}
