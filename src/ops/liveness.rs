//! Watching replicas' liveness (DESIGN decision 14): one [`Watch`] keeps a judge
//! ([`crate::core::liveness::Tracker`]) per replica; each [`Watch::pass`] looks at every
//! replica of the named proxies through the seam ([`Infrastructure::look`]), judges, and
//! kills at once each replica judged dead ([`Infrastructure::kill`]): with SO_REUSEPORT only
//! closing its socket takes it out of the port. Replacing it is the next reconcile pass's
//! work (serve triggers one).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::core::liveness::{Thresholds, Tracker, Verdict};
use crate::infra::{ConvergeError, Infrastructure, ReplicaLook};

/// The judges of the replicas seen so far.
#[derive(Debug, Default)]
pub struct Watch {
    trackers: BTreeMap<String, Tracker>,
}

/// One replica after a pass.
#[derive(Debug, Clone)]
pub struct Judged {
    pub look: ReplicaLook,
    pub verdict: Verdict,
    /// How long it has not answered: since its last answer (None: it never answered since it
    /// was first seen, or it answers).
    pub silent: Option<Duration>,
    /// For a replica judged dead: whether the kill worked (the engine's error when not).
    pub killed: Option<Result<(), String>>,
}

impl Watch {
    pub fn new() -> Watch {
        Watch::default()
    }

    /// One look at every running or paused replica of `proxies`: each judged, the dead ones
    /// killed.
    pub async fn pass(
        &mut self,
        infra: &dyn Infrastructure,
        proxies: &BTreeSet<String>,
    ) -> Result<Vec<Judged>, ConvergeError> {
        let looks = infra.look(proxies).await?;
        let now = tokio::time::Instant::now().into_std();
        let seen: BTreeSet<&str> = looks.iter().map(|l| l.container.as_str()).collect();
        self.trackers.retain(|id, _| seen.contains(id.as_str()));
        let mut judged = Vec::with_capacity(looks.len());
        for look in looks {
            let tracker = self
                .trackers
                .entry(look.container.clone())
                .or_insert_with(|| Tracker::new(Thresholds::default()));
            let verdict = tracker.observe(now, look.probe);
            let silent = match verdict {
                Verdict::Live => None,
                _ => tracker
                    .last_answer()
                    .map(|at| now.saturating_duration_since(at)),
            };
            let killed = match verdict {
                Verdict::Dead(_) => {
                    // A fresh judge for whatever runs under that id next.
                    self.trackers.remove(&look.container);
                    Some(infra.kill(&look.container).await.map_err(|e| e.to_string()))
                }
                _ => None,
            };
            judged.push(Judged {
                look,
                verdict,
                silent,
                killed,
            });
        }
        Ok(judged)
    }
}
