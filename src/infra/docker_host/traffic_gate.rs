//! The gate's traffic judge: during a new replica's minimum ready time, its own Envoy counters
//! against its siblings' (the replicas of the spec being replaced) over the same time, judged by
//! [`crate::core::rollout::judge`]. A replica gets traffic only from new connections (SO_REUSEPORT
//! hands it its share of those; keep-alive clients stay where they are), so one that got fewer
//! requests than the threshold is not judged, and the event says so.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::rollout::judge::{judge, Sample, Thresholds, Verdict};
use crate::envoy::admin::AdminApi;

/// How often the numbers are read while the gate waits: a replica answering only errors fails
/// within this of reaching the threshold, not only at the end of `min_ready`.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// The most siblings read per check: enough for a baseline, bounded on a large proxy.
pub(super) const MAX_SIBLINGS: usize = 6;

/// The replicas a new one is compared with, and the thresholds.
pub(super) struct Siblings {
    pub admins: Vec<Arc<dyn AdminApi>>,
    pub thresholds: Thresholds,
}

/// One new replica's judge while it is gated.
pub(super) struct TrafficWatch<'a> {
    siblings: &'a Siblings,
    /// Each sibling's counters when the watch began (None: it did not answer then).
    start: Vec<Option<Sample>>,
    next_check: Instant,
    last: Option<(Sample, Sample, Verdict)>,
}

impl<'a> TrafficWatch<'a> {
    pub async fn begin(siblings: &'a Siblings) -> TrafficWatch<'a> {
        let start = read_all(&siblings.admins).await;
        TrafficWatch {
            siblings,
            start,
            next_check: Instant::now() + CHECK_EVERY,
            last: None,
        }
    }

    /// Reads the numbers when due (always when `last`); Err with the numbers when the replica
    /// fails. A replica whose admin does not answer is the readiness probe's business.
    pub async fn check(&mut self, candidate: &dyn AdminApi, last: bool) -> Result<(), String> {
        if !last && Instant::now() < self.next_check {
            return Ok(());
        }
        self.next_check = Instant::now() + CHECK_EVERY;
        let Ok(mine) = crate::envoy::traffic::sample(candidate).await else {
            return Ok(());
        };
        let now = read_all(&self.siblings.admins).await;
        let mut base = Sample::default();
        for (before, after) in self.start.iter().zip(&now) {
            if let (Some(b), Some(a)) = (before, after) {
                base.add(&a.since(b));
            }
        }
        let verdict = judge(&mine, &base, &self.siblings.thresholds);
        if let Verdict::Fail(why) = &verdict {
            return Err(format!("during the minimum ready time: {why}"));
        }
        self.last = Some((mine, base, verdict));
        Ok(())
    }

    /// What the judge saw, for the replica's `traffic` event.
    pub fn outcome(&self) -> String {
        match &self.last {
            None => "not judged: its numbers could not be read".to_string(),
            Some((mine, base, Verdict::TooFew { requests, needed })) => format!(
                "not judged: it answered {requests} request(s), fewer than the {needed} needed \
                 (keep-alive clients stay on the old replicas); its siblings: {base}; it: {mine}"
            ),
            Some((mine, base, _)) => format!("judged: it: {mine}; its siblings: {base}"),
        }
    }
}

async fn read_all(admins: &[Arc<dyn AdminApi>]) -> Vec<Option<Sample>> {
    let reads = admins
        .iter()
        .map(|a| crate::envoy::traffic::sample(a.as_ref()));
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .map(Result::ok)
        .collect()
}
