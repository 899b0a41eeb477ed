//! One reconcile pass over one proxy, through the operations layer, and the error policy that
//! decides what the scheduler does next (kube-rs' reconcile / error_policy split).
//!
//! A pass: prepare the host for the proxy, converge it (watched files delivered and confirmed
//! by every replica, replicas created, replaced or removed, health-gated) or, when it is no
//! longer wanted, drain and remove it with its own drain settings; then record conditions,
//! the last rollout and metrics from the typed outcome.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::scheduler::Action;
use super::{log, Failed, PassOutcome, Shared, Unfinished};
use crate::core::ir::OnFailure;
use crate::core::progress::Reporter;
use crate::core::target::Target;
use crate::infra::{ConvergeError, ConvergeRequest, Converged, Delivery, Gate};
use crate::status::record::{set_condition, RolloutRecord, DEGRADED, PROGRESSING, READY};

/// How long a live update that some replica did not confirm (no verdict before the deadline)
/// waits before it is tried again; one that a replica refused waits for the next edit.
const RETRY_UNCONFIRMED: Duration = Duration::from_secs(60);

/// The proxies this serve is responsible for: those desired and those with state in its state
/// directory (as `berth up` and `down` see it).
pub fn owned(shared: &Shared) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = shared
        .desired
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .targets
        .keys()
        .cloned()
        .collect();
    names.extend(shared.state.proxies().unwrap_or_default());
    names
}

fn set_busy(shared: &Shared, name: &str, what: &str) {
    shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), what.to_string());
}

/// What a pass did.
enum Done {
    /// With the host's warnings (what it lacks that berth could not fix).
    Converged(Box<Converged>, Vec<String>),
    Removed,
}

/// The error policy: retry soon (with backoff) what may pass by itself, wait for a change
/// otherwise.
pub fn error_policy(error: &ConvergeError) -> Action {
    match error {
        // The operator may fix the host (or a port may be freed) without touching the config.
        ConvergeError::Host { .. } => Action::Requeue,
        e if e.is_transient() => Action::Requeue,
        _ => Action::AwaitChange,
    }
}

/// After a pass that finished: replicas of the desired spec not all ready (e.g. still starting
/// after the engine restored them) are looked at again. In xDS mode a replica waits for Envoy
/// Gateway, which berth cannot hurry.
pub fn success_policy(target: &Target, c: &Converged) -> Action {
    if !c.readiness.all_ready() && !target.desired.xds {
        Action::Requeue
    } else {
        Action::AwaitChange
    }
}

/// One pass over one proxy; its outcome is recorded for the remote requests waiting on it.
pub async fn pass(shared: &Shared, name: &str, cancel: &CancellationToken) -> Action {
    let started = Instant::now();
    set_busy(shared, name, "observing");
    // A proxy with pull policy "always" whose image no tag check has seen yet (a new proxy or
    // image in the config) is pinned before its pass.
    super::tags::check(shared, super::tags::Which::Unpinned(name)).await;
    let (wanted, epoch) = {
        let d = shared.desired.lock().unwrap_or_else(|e| e.into_inner());
        let wanted = d
            .targets
            .get(name)
            .cloned()
            .map(|t| (t, d.generations.get(name).copied().unwrap_or(0)));
        (wanted, d.epochs.get(name).copied().unwrap_or(0))
    };
    let result = match &wanted {
        Some((target, generation)) => converge(shared, target, *generation, epoch, cancel)
            .await
            .map(|(c, warnings)| Done::Converged(Box::new(c), warnings)),
        None => remove(shared, name, epoch).await.map(|_| Done::Removed),
    };
    // ACME certificates due: obtained through the proxy just converged.
    let acme_error = match (&result, &wanted) {
        (Ok(Done::Converged(..)), Some((target, _))) => {
            set_busy(shared, name, "obtaining certificates");
            let reporter = {
                let (watchers, proxy) = (shared.watchers.clone(), name.to_string());
                Reporter::new(shared.opts.mode)
                    .on_event(move |event| watchers.forward(&proxy, epoch, event))
            };
            super::acme::renew(shared, target, &reporter).await
        }
        _ => None,
    };
    let label = match &result {
        Ok(_) => "success",
        Err(ConvergeError::Cancelled { .. }) => "cancelled",
        Err(_) => "error",
    };
    let m = &shared.metrics;
    m.inc(
        "berth_reconcile_total",
        "Reconcile passes, by proxy and result.",
        &[("proxy", name), ("result", label)],
    );
    m.observe(
        "berth_reconcile_duration_seconds",
        "Time one reconcile pass of a proxy took.",
        &[("proxy", name)],
        started.elapsed(),
    );
    if let Err(e) = &result {
        if label == "error" {
            log(shared.opts.mode, &format!("{name}: {e}"));
        }
    }
    let action = match (&result, &wanted) {
        (Err(e), _) => error_policy(e),
        (Ok(Done::Converged(c, _)), Some((target, _))) => success_policy(target, c),
        (Ok(_), _) => Action::AwaitChange,
    };
    shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
    shared.pass_ended(
        name,
        PassOutcome {
            epoch,
            error: result
                .as_ref()
                .err()
                .map(|e| (error_chain(e), e.is_transient())),
            unfinished: match (&result, &wanted) {
                (Ok(Done::Converged(c, _)), Some((target, _))) => unfinished(name, target, c),
                _ => None,
            }
            .or(acme_error.map(Unfinished::Delivery)),
            notes: match (&result, &wanted) {
                (Ok(Done::Converged(c, warnings)), Some((target, _))) => {
                    notes(name, target, c, warnings)
                }
                _ => Vec::new(),
            },
        },
    );
    action
}

/// An error and its causes on one line, as `berth up` prints an error.
fn error_chain(e: &ConvergeError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// What `berth up` would fail on after converging: a live update that failed, replicas not
/// ready (outside xDS mode, where a replica waits for Envoy Gateway).
fn unfinished(name: &str, target: &Target, c: &Converged) -> Option<Unfinished> {
    if let Some(r) = c.delivery.failed() {
        return Some(Unfinished::Delivery(r.to_string()));
    }
    (!c.readiness.all_ready() && !target.desired.xds)
        .then(|| Unfinished::NotReady(format!("proxy {name}: {}", c.readiness)))
}

/// The lines `berth up` prints beside its verdict: the host's warnings, and replicas of an
/// xDS-mode proxy still waiting for Envoy Gateway.
fn notes(name: &str, target: &Target, c: &Converged, warnings: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = warnings.iter().map(|w| format!("warning: {w}")).collect();
    if target.desired.xds && !c.readiness.all_ready() {
        lines.push(format!(
            "note: proxy {name}: {} (xDS mode: waiting for Envoy Gateway's listeners)",
            c.readiness
        ));
    }
    lines
}

/// Whether the watched files of `generation` must stay as they are: a replica refused them
/// (until the next edit), or did not confirm them (until a backoff has passed).
fn held(shared: &Shared, name: &str, generation: u64) -> bool {
    match shared
        .rejected
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
    {
        Some(f) if f.generation == generation => f.retry_after.is_none_or(|at| Instant::now() < at),
        _ => false,
    }
}

async fn converge(
    shared: &Shared,
    target: &Target,
    generation: u64,
    epoch: u64,
    cancel: &CancellationToken,
) -> Result<(Converged, Vec<String>), ConvergeError> {
    let name = target.name();
    let started = Instant::now();
    set_busy(shared, name, "preparing the host");
    let host = shared
        .ops
        .prepare_host(std::slice::from_ref(target), shared.host_policy())
        .await;
    let host = match host {
        Ok(h) => h,
        Err(e) => {
            record_failure(shared, name, generation, "HostNotReady", &e.to_string());
            return Err(e);
        }
    };
    set_busy(shared, name, "converging");
    let reporter = {
        let (shared_name, gen) = (name.to_string(), generation);
        let record = shared.record_handle();
        let watchers = shared.watchers.clone();
        let metrics = shared.metrics.clone();
        Reporter::new(shared.opts.mode).on_event(move |event| {
            watchers.forward(&shared_name, epoch, event);
            match event.event.as_str() {
                "canary-promoted" => count_decision(&metrics, &shared_name, "promoted"),
                // `berth rollout undo` after a finished rollout.
                "undoing" => count_decision(&metrics, &shared_name, "undone"),
                _ => {}
            }
            // The first step that changes something marks the proxy as progressing.
            if matches!(
                event.event.as_str(),
                "replacing" | "created" | "removing" | "files"
            ) {
                record.update(|rec| {
                    if let Some(p) = rec.proxies.get_mut(&shared_name) {
                        set_condition(
                            &mut p.conditions,
                            PROGRESSING,
                            true,
                            "RollingOut",
                            &format!("generation {gen}: {}", event.event),
                        );
                    }
                });
            }
        })
    };
    let result = shared
        .ops
        .converge(ConvergeRequest {
            target,
            generation: Some(generation),
            hold_files: held(shared, name, generation),
            confirm_timeout: shared.settings.confirm_timeout,
            reporter: &reporter,
            cancel: cancel.clone(),
        })
        .await;
    drop(reporter);
    let converged = match result {
        Ok(c) => c,
        Err(e) => {
            let reason = match &e {
                ConvergeError::Cancelled { .. } => "Cancelled",
                ConvergeError::Gate(_) => "RolloutFailed",
                ConvergeError::Rejected { .. } => "ConfigRejected",
                ConvergeError::Engine(_) => "EngineError",
                _ => "ReconcileFailed",
            };
            if reason != "Cancelled" {
                count_rollout(shared, name, "failed", started);
            }
            if let ConvergeError::Gate(g) = &e {
                let undone = g.gate == Gate::Undone
                    || (g.gate == Gate::Canary && g.reason.starts_with("undone by hand"));
                let result = match target.desired.rollout.on_failure {
                    _ if undone => "undone",
                    OnFailure::Rollback => "rolled_back",
                    OnFailure::Pause => "paused",
                };
                count_decision(&shared.metrics, name, result);
            }
            record_failure(shared, name, generation, reason, &e.to_string());
            return Err(e);
        }
    };
    record_delivery(shared, name, generation, &converged.delivery);
    let rolled = converged.actions != Default::default();
    let live = converged.delivery.changed();
    let failed_delivery = converged.delivery.failed().map(|r| r.to_string());
    let outcome = if failed_delivery.is_some() {
        "failed"
    } else {
        "succeeded"
    };
    if rolled {
        count_rollout(shared, name, outcome, started);
    }
    let refused_still = held(shared, name, generation);
    let r = &converged.readiness;
    shared.update_record(|rec| {
        let Some(p) = rec.proxies.get_mut(name) else {
            return;
        };
        p.last_reconcile = Some(crate::status::record::now());
        if live || rolled || failed_delivery.is_some() {
            p.last_rollout = Some(RolloutRecord {
                outcome: outcome.to_string(),
                kind: match (live || failed_delivery.is_some(), rolled) {
                    (true, true) => "live+rollout",
                    (true, false) => "live",
                    _ => "rollout",
                }
                .to_string(),
                generation,
                finished_at: crate::status::record::now(),
                duration_seconds: started.elapsed().as_secs_f64(),
                message: failed_delivery
                    .clone()
                    .unwrap_or_else(|| format!("generation {generation}: {r}")),
            });
        }
        set_condition(
            &mut p.conditions,
            PROGRESSING,
            false,
            "Complete",
            &format!("generation {generation} is rolled out"),
        );
        let mut degraded: Vec<(&str, String)> = Vec::new();
        if let Some(msg) = &failed_delivery {
            degraded.push(("LiveUpdateRejected", msg.clone()));
        } else if refused_still {
            degraded.push((
                "LiveUpdateRejected",
                format!("generation {generation}'s routes were refused by a replica; the previous ones serve until the next edit"),
            ));
        }
        for (reason, message) in &host.degraded {
            degraded.push((reason.as_str(), message.clone()));
        }
        if !r.all_ready() && !target.desired.xds {
            degraded.push(("ReplicasNotServing", r.to_string()));
        }
        match degraded.first() {
            Some((reason, _)) => {
                let message: Vec<String> = degraded.iter().map(|(_, m)| m.clone()).collect();
                set_condition(&mut p.conditions, DEGRADED, true, reason, &message.join("; "))
            }
            None => set_condition(&mut p.conditions, DEGRADED, false, "AsExpected", ""),
        }
        set_condition(
            &mut p.conditions,
            READY,
            r.all_ready(),
            if r.all_ready() {
                "AllReplicasReady"
            } else {
                "ReplicasNotReady"
            },
            &if target.desired.xds && !r.all_ready() {
                format!("{r} (xDS mode: a replica is ready once Envoy Gateway's xDS server has sent its listeners)")
            } else {
                r.to_string()
            },
        );
    });
    let warnings = host.degraded.into_iter().map(|(_, m)| m).collect();
    Ok((converged, warnings))
}

fn count_rollout(shared: &Shared, name: &str, outcome: &str, started: Instant) {
    shared.metrics.inc(
        "berth_rollouts_total",
        "Rollouts (reconciles that changed containers), by outcome.",
        &[("proxy", name), ("outcome", outcome)],
    );
    shared.metrics.observe(
        "berth_rollout_duration_seconds",
        "Time a rollout of a proxy took.",
        &[("proxy", name)],
        started.elapsed(),
    );
}

/// Counts how a rollout was decided: a canary promoted, a rollout rolled back (a failed gate or
/// canary: the new spec's replicas retired, the replaced ones put back), paused there
/// (`on_failure = "pause"`), or undone by hand (`berth rollout undo`).
fn count_decision(metrics: &crate::status::metrics::Metrics, name: &str, result: &str) {
    metrics.inc(
        "berth_rollout_decisions_total",
        "Rollout decisions, by proxy and result: promoted (a canary), rolled_back (a failed gate or canary), paused (a failed gate with on_failure = \"pause\"), undone (berth rollout undo).",
        &[("proxy", name), ("result", result)],
    );
}

/// Counts a delivery and remembers a failed one's generation (see [`held`]).
fn record_delivery(shared: &Shared, name: &str, generation: u64, delivery: &Delivery) {
    let outcome = match delivery {
        Delivery::Confirmed { .. } => "confirmed",
        Delivery::Failed(r) if r.refused() => "rejected",
        Delivery::Failed(_) => "unconfirmed",
        _ => return,
    };
    shared.metrics.inc(
        "berth_live_updates_total",
        "Live updates of the watched files, by outcome.",
        &[("proxy", name), ("outcome", outcome)],
    );
    let mut rejected = shared.rejected.lock().unwrap_or_else(|e| e.into_inner());
    match delivery {
        Delivery::Confirmed {
            files,
            replicas,
            elapsed,
        } => {
            shared.metrics.observe(
                "berth_live_update_duration_seconds",
                "From the first rename to the last replica's confirmation.",
                &[("proxy", name)],
                *elapsed,
            );
            log(
                shared.opts.mode,
                &format!(
                    "{name}: generation {generation}: {} confirmed by {replicas} replica(s) in {} ms",
                    files.join(", "),
                    elapsed.as_millis()
                ),
            );
            rejected.remove(name);
        }
        Delivery::Failed(r) => {
            log(shared.opts.mode, &format!("{name}: {r}"));
            rejected.insert(
                name.to_string(),
                Failed {
                    generation,
                    retry_after: (!r.refused()).then(|| Instant::now() + RETRY_UNCONFIRMED),
                },
            );
        }
        _ => {}
    }
}

/// Records a pass that did not finish: Progressing False (or True when cancelled), Degraded
/// with the reason.
fn record_failure(shared: &Shared, name: &str, generation: u64, reason: &str, message: &str) {
    shared.update_record(|rec| {
        let Some(p) = rec.proxies.get_mut(name) else {
            return;
        };
        p.last_reconcile = Some(crate::status::record::now());
        if reason == "Cancelled" {
            set_condition(
                &mut p.conditions,
                PROGRESSING,
                true,
                "Cancelled",
                "stopped between two steps; the next serve completes the rollout",
            );
            return;
        }
        p.last_rollout = Some(RolloutRecord {
            outcome: "failed".into(),
            kind: "rollout".into(),
            generation,
            finished_at: crate::status::record::now(),
            duration_seconds: 0.0,
            message: message.to_string(),
        });
        set_condition(&mut p.conditions, PROGRESSING, false, "Failed", message);
        set_condition(&mut p.conditions, DEGRADED, true, reason, message);
    });
}

/// A proxy no longer desired but with state here: drain and remove its replicas (each with
/// its own spec's drain settings), then its state.
async fn remove(shared: &Shared, name: &str, epoch: u64) -> Result<usize, ConvergeError> {
    if !shared.state.proxies()?.iter().any(|p| p == name) {
        return Ok(0);
    }
    set_busy(shared, name, "removing");
    let watchers = shared.watchers.clone();
    let proxy = name.to_string();
    let reporter = Reporter::new(shared.opts.mode)
        .on_event(move |event| watchers.forward(&proxy, epoch, event));
    let n = shared.ops.remove(name, &reporter).await?;
    shared.update_record(|rec| {
        rec.proxies.remove(name);
    });
    shared.metrics.forget("proxy", name);
    log(
        shared.opts.mode,
        &format!("{name}: removed ({n} replica(s))"),
    );
    Ok(n)
}
