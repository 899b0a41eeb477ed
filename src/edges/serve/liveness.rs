//! The liveness watcher (DESIGN decision 14): every [`CADENCE`] (1 s) one
//! [`crate::ops::liveness::Watch`] pass looks at every replica of the proxies serve manages,
//! judges each, and kills at once each one judged dead (paused by the engine, its Envoy
//! stopped by a signal, or silent while it uses no CPU): with SO_REUSEPORT only closing its
//! socket takes it out of the port. For each kill: one log line (proxy, container, reason, how
//! long it was silent), `berth_replica_repairs_total{proxy,reason}`, then a reconcile pass of
//! its proxy at once, which replaces it (start-first while a sibling serves). The kill always
//! comes before the pass, so before the replacement is counted.
//!
//! It runs while a rollout of the proxy runs too: the replicas a rollout starts are "starting"
//! until they first answer (the rollout's gate judges those, never this watcher), and one that
//! hangs mid-rollout is as much a black hole as any other. The pass it asks for runs after the
//! rollout's (the scheduler coalesces), and sees the killed replica as gone.
//!
//! The latest verdicts are kept for `/status` and `berth_replica_live{proxy,container}`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger};
use crate::core::liveness::{Verdict, CADENCE};
use crate::core::progress::Mode;
use crate::ops::liveness::{Judged, Watch};
use crate::status::metrics::Metrics;

/// What the watcher last said of one replica, for `/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveView {
    /// False once it has not answered for a while, or was killed as dead.
    pub live: bool,
    /// Why it is not live ("frozen by the engine", "not answering for 2.1 s", "starting", …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the watcher looked (RFC 3339).
    pub observed_at: String,
    /// When it was killed as dead: its view outlives it by [`KEEP_KILLED`], so that `/status`
    /// still says why while its container is replaced.
    #[serde(skip)]
    pub killed_at: Option<std::time::Instant>,
}

/// How long the view of a killed replica stays after the watcher stops seeing it.
pub const KEEP_KILLED: Duration = Duration::from_secs(300);

/// Container name → its latest view.
pub type Views = Arc<Mutex<BTreeMap<String, LiveView>>>;

/// Runs until `cancel`: one watch pass per [`CADENCE`] over every proxy serve owns.
pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let mut watch = Watch::new();
    let mut tick = tokio::time::interval(CADENCE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let proxies = super::reconciler::owned(&shared);
        let judged = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            j = watch.pass(shared.ops.infra.as_ref(), &proxies) => j,
        };
        match judged {
            Ok(judged) => {
                failing = false;
                let repair = record(&shared.metrics, &shared.liveness, shared.opts.mode, &judged);
                for proxy in repair {
                    shared.trigger(Trigger::Proxy(proxy, "liveness"));
                }
            }
            // The engine away: the events watcher says so and reconnects; said once here.
            Err(e) if !failing => {
                failing = true;
                log(shared.opts.mode, &format!("liveness: cannot look: {e}"));
            }
            Err(_) => {}
        }
    }
}

/// Takes one pass into account: views (but those of replicas killed in the last
/// [`KEEP_KILLED`]) and `berth_replica_live` replaced by this pass's, a log line and `berth_replica_repairs_total` for each replica killed. Returns the proxies
/// to reconcile now (those that lost a replica).
pub fn record(metrics: &Metrics, views: &Views, mode: Mode, judged: &[Judged]) -> BTreeSet<String> {
    let at = crate::status::record::now();
    let mut repair = BTreeSet::new();
    let mut next: BTreeMap<String, LiveView> = views
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(_, v)| v.killed_at.is_some_and(|t| t.elapsed() < KEEP_KILLED))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metrics.clear("berth_replica_live");
    for j in judged {
        let (proxy, name) = (j.look.proxy.as_str(), j.look.name.as_str());
        let silent = j.silent.map(seconds).unwrap_or_else(|| "-".into());
        let mut killed_at = None;
        let (live, reason) = match (&j.verdict, &j.killed) {
            (Verdict::Live, _) => (true, None),
            (Verdict::Starting, _) => (false, Some("starting: it has not answered yet".into())),
            (Verdict::Quiet { silent, busy }, _) => (
                // One late answer is no verdict: live until the silence reaches the judge's bar.
                *silent < Duration::from_secs(2),
                Some(format!(
                    "not answering for {}{}",
                    seconds(*silent),
                    if *busy { " (busy: its CPU moves)" } else { "" }
                )),
            ),
            (Verdict::Dead(why), Some(Ok(()))) => {
                log(
                    mode,
                    &format!(
                        "{proxy}: replica {name} killed: {why} (silent for {silent}); replacing it"
                    ),
                );
                metrics.inc(
                    "berth_replica_repairs_total",
                    "Replicas killed because they stopped serving while holding their port, by proxy and reason (paused, stopped, not_answering).",
                    &[("proxy", proxy), ("reason", why.label())],
                );
                repair.insert(proxy.to_string());
                killed_at = Some(std::time::Instant::now());
                (false, Some(format!("killed: {why}")))
            }
            (Verdict::Dead(why), killed) => {
                let error = match killed {
                    Some(Err(e)) => e.clone(),
                    _ => "not killed".into(),
                };
                log(
                    mode,
                    &format!(
                        "{proxy}: replica {name} is dead ({why}) but cannot be killed: {error}"
                    ),
                );
                (false, Some(format!("{why}; cannot be killed: {error}")))
            }
        };
        metrics.set(
            "berth_replica_live",
            "1 while the replica answers its admin API (liveness watch, every second), 0 when not.",
            &[("proxy", proxy), ("container", name)],
            if live { 1.0 } else { 0.0 },
        );
        next.insert(
            name.to_string(),
            LiveView {
                live,
                reason,
                observed_at: at.clone(),
                killed_at,
            },
        );
    }
    *views.lock().unwrap_or_else(|e| e.into_inner()) = next;
    repair
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::liveness::{DeadReason, Probe};
    use crate::infra::ReplicaLook;

    fn judged(name: &str, verdict: Verdict, killed: Option<Result<(), String>>) -> Judged {
        Judged {
            look: ReplicaLook {
                proxy: "edge".into(),
                container: format!("id-{name}"),
                name: name.into(),
                probe: Probe::default(),
            },
            verdict,
            silent: Some(Duration::from_millis(2300)),
            killed,
        }
    }

    /// A replica killed as dead: counted by reason, not live in the view and the gauge, its
    /// proxy reconciled; a live one and a busy one are left alone; a kill that failed is
    /// reported but neither counted nor reconciled.
    #[test]
    fn a_killed_replica_is_counted_shown_and_its_proxy_reconciled() {
        let metrics = Metrics::new();
        let views = Views::default();
        let busy = Verdict::Quiet {
            silent: Duration::from_secs(5),
            busy: true,
        };
        let pass = [
            judged("a", Verdict::Live, None),
            judged("b", Verdict::Dead(DeadReason::Paused), Some(Ok(()))),
            judged("c", busy, None),
        ];
        let repair = record(&metrics, &views, Mode::Quiet, &pass);
        assert_eq!(repair, BTreeSet::from(["edge".to_string()]));
        let repairs = |reason| {
            metrics.value(
                "berth_replica_repairs_total",
                &[("proxy", "edge"), ("reason", reason)],
            )
        };
        assert_eq!(repairs("paused"), Some(1.0));
        let live = |c| metrics.value("berth_replica_live", &[("proxy", "edge"), ("container", c)]);
        assert_eq!(
            (live("a"), live("b"), live("c")),
            (Some(1.0), Some(0.0), Some(0.0))
        );
        let v = views.lock().unwrap().clone();
        assert!(v["a"].live && v["a"].reason.is_none());
        assert_eq!(
            v["b"].reason.as_deref(),
            Some("killed: frozen by the engine")
        );
        assert!(v["c"].reason.as_deref().unwrap().contains("busy"), "{v:?}");

        let failed = [judged(
            "d",
            Verdict::Dead(DeadReason::StoppedBySignal),
            Some(Err("no such container".into())),
        )];
        assert!(record(&metrics, &views, Mode::Quiet, &failed).is_empty());
        assert_eq!(repairs("stopped"), None);
        let v = views.lock().unwrap().clone();
        assert_eq!(
            v.len(),
            2,
            "gone replicas drop out, killed ones stay: {v:?}"
        );
        assert!(v["b"].reason.as_deref().unwrap().starts_with("killed"));
        assert!(v["d"]
            .reason
            .as_deref()
            .unwrap()
            .contains("no such container"));
        assert_eq!(live("a"), None, "gone replicas drop out of the gauge");
    }
}
