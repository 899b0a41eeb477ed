//! The reconciler: turns triggers into at most one reconcile per proxy at a time.
//!
//! Triggers mark proxies dirty; a dirty proxy that is not busy gets a task at once, one that is
//! busy runs again when its task ends (so any number of triggers during a rollout coalesce into
//! one more pass). Proxies are independent: a long rollout of one never delays another.
//!
//! One pass over a proxy:
//! 1. observe its containers (one list filtered by its label, one inspect each);
//! 2. when its watched files differ from the desired ones (stamped with the generation) and
//!    replicas run: [`delivery::update`], which every replica must confirm; when one does not, the
//!    previous files are back on disk and stay the ones the rollout below writes;
//! 3. [`Rollout::converge`] for the containers (create, replace, remove — health-gated);
//! 4. conditions, last rollout, metrics.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger};
use crate::admin::{Admin, ReadyState};
use crate::delivery::{self, Ack, LiveRejected};
use crate::ir::{RolloutPolicy, Shutdown};
use crate::plan::{self, ContainerRef};
use crate::progress::Reporter;
use crate::replica::{ObservedContainer, RunState, LABEL_NAME, LABEL_PROXY, MANAGED_BY_VALUE};
use crate::rollout::{Cancelled, Rollout};
use crate::status::record::{set_condition, RolloutRecord, DEGRADED, PROGRESSING, READY};
use crate::target::Target;

/// How long a live update that some replica did not confirm (no verdict before the deadline)
/// waits before it is tried again; one that a replica rejected waits for the next edit.
const RETRY_UNCONFIRMED: Duration = Duration::from_secs(60);

pub async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<Trigger>,
    cancel: CancellationToken,
) -> Result<()> {
    let mut dirty: BTreeSet<String> = BTreeSet::new();
    let mut active: BTreeSet<String> = BTreeSet::new();
    let mut tasks: JoinSet<String> = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(name) = done {
                    active.remove(&name);
                }
            }
            t = rx.recv() => match t {
                None => break,
                Some(t) => add(&shared, &mut dirty, t),
            },
        }
        while let Ok(t) = rx.try_recv() {
            add(&shared, &mut dirty, t);
        }
        let ready: Vec<String> = dirty.difference(&active).cloned().collect();
        for name in ready {
            dirty.remove(&name);
            active.insert(name.clone());
            let shared = shared.clone();
            let cancel = cancel.clone();
            tasks.spawn(async move {
                let pass = std::panic::AssertUnwindSafe(reconcile(&shared, &name, &cancel));
                let outcome = match pass.catch_unwind().await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        log(shared.opts.mode, &format!("{name}: reconcile panicked"));
                        super::PassOutcome {
                            epoch: u64::MAX,
                            error: Some(("berth's reconcile of this proxy panicked".into(), true)),
                            requeue: false,
                        }
                    }
                };
                shared
                    .busy
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&name);
                let requeue = outcome.requeue;
                shared.pass_ended(&name, outcome);
                requeue_later(&shared, &name, requeue, &cancel);
                name
            });
        }
    }
    // Cancelled: every running rollout stops after its current step.
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Schedules another pass of `name` after a backoff (1 s, doubling to 30 s) when `requeue`;
/// otherwise resets its backoff.
fn requeue_later(shared: &Arc<Shared>, name: &str, requeue: bool, cancel: &CancellationToken) {
    let mut attempts = shared.requeues.lock().unwrap_or_else(|e| e.into_inner());
    if !requeue {
        attempts.remove(name);
        return;
    }
    let n = attempts.entry(name.to_string()).or_insert(0);
    let delay = Duration::from_secs(1u64 << (*n).min(5)).min(MAX_REQUEUE);
    *n += 1;
    let (shared, name, cancel) = (shared.clone(), name.to_string(), cancel.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = tokio::time::sleep(delay) => shared.trigger(Trigger::Proxy(name, "requeue")),
        }
    });
}

const MAX_REQUEUE: Duration = Duration::from_secs(30);

/// The proxies this serve is responsible for: those in the config and those with state in its
/// state directory (as `berth up` and `down` see it).
fn owned(shared: &Shared) -> BTreeSet<String> {
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

fn add(shared: &Shared, dirty: &mut BTreeSet<String>, t: Trigger) {
    match t {
        Trigger::All(_) => dirty.extend(owned(shared)),
        Trigger::Proxy(p, _) => {
            if owned(shared).contains(&p) {
                dirty.insert(p);
            }
        }
    }
}

fn set_busy(shared: &Shared, name: &str, what: &str) {
    shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), what.to_string());
}

/// One pass over one proxy.
async fn reconcile(shared: &Shared, name: &str, cancel: &CancellationToken) -> super::PassOutcome {
    let started = Instant::now();
    set_busy(shared, name, "observing");
    let (wanted, epoch) = {
        let d = shared.desired.lock().unwrap_or_else(|e| e.into_inner());
        let wanted = d
            .targets
            .get(name)
            .cloned()
            .map(|t| (t, d.generations.get(name).copied().unwrap_or(0)));
        (wanted, d.epochs.get(name).copied().unwrap_or(0))
    };
    let result = match wanted {
        Some((target, generation)) => converge(shared, &target, generation, cancel).await,
        None => remove(shared, name).await.map(|_| Pass::default()),
    };
    let elapsed = started.elapsed();
    let label = match &result {
        Ok(_) => "success",
        Err(e) if e.downcast_ref::<Cancelled>().is_some() => "cancelled",
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
        elapsed,
    );
    if let Err(e) = &result {
        if label == "error" {
            log(shared.opts.mode, &format!("{name}: {e:#}"));
        }
    }
    let error = result
        .as_ref()
        .err()
        .map(|e| (format!("{e:#}"), super::eg_proxies::transient(e)));
    super::PassOutcome {
        epoch,
        // Level-triggered: a pass that could not finish (the engine away) or left replicas
        // not ready (e.g. still starting after the engine restored them) is looked at again.
        requeue: match &result {
            Ok(pass) => pass.short,
            Err(_) => error.as_ref().is_some_and(|(_, transient)| *transient),
        },
        error,
    }
}

/// What one pass did.
#[derive(Debug, Default)]
struct Pass {
    live: bool,
    rolled: bool,
    /// Fewer replicas of the desired spec are ready than wanted (standalone mode).
    short: bool,
}

/// Observes one proxy's containers (berth's only).
async fn observe(shared: &Shared, name: &str) -> Result<Vec<ObservedContainer>> {
    let mut mine = shared
        .engine
        .observe_labelled(&format!("{LABEL_PROXY}={name}"))
        .await?;
    mine.retain(|c| c.is_managed() && c.proxy() == Some(name) && shared.is_mine(c));
    Ok(mine)
}

async fn converge(
    shared: &Shared,
    target: &Target,
    generation: u64,
    cancel: &CancellationToken,
) -> Result<Pass> {
    let name = target.name();
    let started = Instant::now();
    if !shared.state.proxy(name).root().exists() {
        super::create_proxy_dir(&shared.state, name)?;
    }
    let mine = observe(shared, name).await?;
    let stamped = delivery::stamp(&target.rendered.xds, generation);
    let on_disk = shared.state.read_xds(name)?;
    let mut files = stamped.clone();
    let mut pass = Pass::default();
    let mut live_error: Option<String> = None;

    let replicas = delivery::replicas(&shared.state, name, &mine);
    if on_disk != stamped && !on_disk.is_empty() && !replicas.is_empty() {
        let failed_before = shared
            .rejected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied();
        let wait = match failed_before {
            Some(f) if f.generation == generation => match f.retry_after {
                None => true,
                Some(at) => Instant::now() < at,
            },
            _ => false,
        };
        if wait {
            // This generation was refused (not retried until the next edit) or not confirmed
            // (retried after a backoff): the previous files stay.
            files = on_disk.clone();
        } else {
            pass.live = true;
            set_busy(shared, name, "live update");
            shared.update_record(|rec| {
                if let Some(p) = rec.proxies.get_mut(name) {
                    set_condition(
                        &mut p.conditions,
                        PROGRESSING,
                        true,
                        "LiveUpdate",
                        &format!(
                            "generation {generation}: waiting for {} replica(s) to confirm the new routes",
                            replicas.len()
                        ),
                    );
                }
            });
            let t0 = Instant::now();
            match delivery::update(
                &shared.state,
                name,
                &stamped,
                &replicas,
                shared.opts.confirm_timeout,
            )
            .await
            {
                Ok(outcome) => {
                    shared.metrics.inc(
                        "berth_live_updates_total",
                        "Live updates of the watched files, by outcome.",
                        &[("proxy", name), ("outcome", "confirmed")],
                    );
                    shared.metrics.observe(
                        "berth_live_update_duration_seconds",
                        "From the first rename to the last replica's confirmation.",
                        &[("proxy", name)],
                        outcome.elapsed,
                    );
                    log(
                        shared.opts.mode,
                        &format!(
                            "{name}: generation {generation}: {} confirmed by {} replica(s) in {} ms",
                            outcome.written.join(", "),
                            outcome.replicas.len(),
                            outcome.elapsed.as_millis()
                        ),
                    );
                    shared
                        .rejected
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(name);
                }
                Err(e) => {
                    let refused = e.downcast_ref::<LiveRejected>().is_some_and(|r| {
                        r.replicas
                            .values()
                            .any(|a| matches!(a, Ack::Rejected { .. }))
                    });
                    shared.metrics.inc(
                        "berth_live_updates_total",
                        "Live updates of the watched files, by outcome.",
                        &[
                            ("proxy", name),
                            ("outcome", if refused { "rejected" } else { "unconfirmed" }),
                        ],
                    );
                    shared
                        .rejected
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(
                            name.to_string(),
                            super::Failed {
                                generation,
                                retry_after: (!refused).then(|| Instant::now() + RETRY_UNCONFIRMED),
                            },
                        );
                    log(
                        shared.opts.mode,
                        &format!("{name}: {e:#} (after {} ms)", t0.elapsed().as_millis()),
                    );
                    live_error = Some(format!("{e:#}"));
                    // The previous files are back: the rollout keeps them.
                    files = shared.state.read_xds(name)?;
                }
            }
        }
    }

    let mut rollout_target = target.clone();
    rollout_target.rendered.xds = files;
    let plan = plan::plan(std::slice::from_ref(&rollout_target.desired), &mine);
    pass.rolled = !plan.is_empty();
    if pass.rolled {
        set_busy(shared, name, "rollout");
        let s = plan.summary();
        shared.update_record(|rec| {
            if let Some(p) = rec.proxies.get_mut(name) {
                set_condition(
                    &mut p.conditions,
                    PROGRESSING,
                    true,
                    "RollingOut",
                    &format!(
                        "generation {generation}: {} to create, {} to start, {} to replace, {} to remove",
                        s.create, s.start, s.replace, s.remove
                    ),
                );
            }
        });
    }
    let reporter = Reporter::new(shared.opts.mode);
    let rollout = Rollout {
        engine: &shared.engine,
        state: &shared.state,
        reporter: &reporter,
        extra_labels: shared.opts.extra_labels.clone(),
        cancel: cancel.clone(),
    };
    let converged = rollout.converge_one(&rollout_target, &mine).await;
    drop(reporter);

    // Readiness, conditions, the last rollout.
    let now_mine = if pass.rolled {
        observe(shared, name).await.unwrap_or(mine)
    } else {
        mine
    };
    let (ready, wanted) = readiness(shared, &rollout_target, &now_mine).await;
    pass.short = ready < wanted as usize && !rollout_target.desired.xds;
    let outcome = match &converged {
        Ok(()) if live_error.is_none() => "succeeded",
        Err(e) if e.downcast_ref::<Cancelled>().is_some() => "cancelled",
        _ => "failed",
    };
    let message = match (&converged, &live_error) {
        (Err(e), _) => format!("{e:#}"),
        (Ok(()), Some(e)) => e.clone(),
        (Ok(()), None) => format!("generation {generation}: {ready}/{wanted} replicas ready"),
    };
    if pass.rolled {
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
    let refused_still = shared
        .rejected
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .is_some_and(|f| f.generation == generation);
    shared.update_record(|rec| {
        let Some(p) = rec.proxies.get_mut(name) else {
            return;
        };
        p.last_reconcile = Some(crate::status::record::now());
        if pass.live || pass.rolled {
            p.last_rollout = Some(RolloutRecord {
                outcome: outcome.to_string(),
                kind: match (pass.live, pass.rolled) {
                    (true, true) => "live+rollout",
                    (true, false) => "live",
                    _ => "rollout",
                }
                .to_string(),
                generation,
                finished_at: crate::status::record::now(),
                duration_seconds: started.elapsed().as_secs_f64(),
                message: message.clone(),
            });
        }
        match outcome {
            "cancelled" => set_condition(
                &mut p.conditions,
                PROGRESSING,
                true,
                "Cancelled",
                "stopped between two steps; the next serve completes the rollout",
            ),
            "failed" => set_condition(&mut p.conditions, PROGRESSING, false, "Failed", &message),
            _ => set_condition(
                &mut p.conditions,
                PROGRESSING,
                false,
                "Complete",
                &format!("generation {generation} is rolled out"),
            ),
        }
        if outcome == "failed" {
            let reason = if live_error.is_some() && converged.is_ok() {
                "LiveUpdateRejected"
            } else {
                "RolloutFailed"
            };
            set_condition(&mut p.conditions, DEGRADED, true, reason, &message);
        } else if refused_still {
            // A refused generation stays refused until the next edit.
        } else if outcome == "succeeded" {
            set_condition(&mut p.conditions, DEGRADED, false, "AsExpected", "");
        }
        set_condition(
            &mut p.conditions,
            READY,
            ready >= wanted as usize,
            if ready >= wanted as usize {
                "AllReplicasReady"
            } else {
                "ReplicasNotReady"
            },
            &if rollout_target.desired.xds && ready < wanted as usize {
                format!("{ready}/{wanted} replicas of the desired spec are LIVE (xds mode: a replica becomes LIVE once Envoy Gateway's xDS server has sent its listeners)")
            } else {
                format!("{ready}/{wanted} replicas of the desired spec are ready")
            },
        );
    });
    converged.map(|_| pass)
}

/// Replicas of the desired spec that run and report LIVE, and how many are wanted.
async fn readiness(shared: &Shared, target: &Target, mine: &[ObservedContainer]) -> (usize, u32) {
    let checks = mine
        .iter()
        .filter(|c| {
            c.state == RunState::Running && c.spec_hash() == Some(target.desired.hash.as_str())
        })
        .map(|c| {
            let run = c.label(LABEL_NAME).unwrap_or(&c.name).to_string();
            let admin = Admin::new(shared.state.proxy(target.name()).admin_socket(&run))
                .with_timeout(Duration::from_millis(500));
            async move { matches!(admin.ready().await, Ok(ReadyState::Live)) }
        });
    let ready = futures_util::future::join_all(checks)
        .await
        .into_iter()
        .filter(|r| *r)
        .count();
    (ready, target.desired.replicas)
}

/// A proxy no longer in the config but with state here: drain and remove its replicas, then
/// its state.
async fn remove(shared: &Shared, name: &str) -> Result<()> {
    if !shared.state.proxies()?.iter().any(|p| p == name) {
        return Ok(());
    }
    set_busy(shared, name, "removing");
    let mine = observe(shared, name).await?;
    let reporter = Reporter::new(shared.opts.mode);
    let rollout = Rollout {
        engine: &shared.engine,
        state: &shared.state,
        reporter: &reporter,
        extra_labels: shared.opts.extra_labels.clone(),
        cancel: CancellationToken::new(),
    };
    for c in &mine {
        debug_assert_eq!(
            c.label(crate::replica::LABEL_MANAGED_BY),
            Some(MANAGED_BY_VALUE)
        );
        rollout
            .retire(
                name,
                &ContainerRef {
                    id: c.id.clone(),
                    name: c.name.clone(),
                },
                &mine,
                &Shutdown::default(),
                &RolloutPolicy::default(),
            )
            .await?;
    }
    shared.state.remove_proxy(name)?;
    shared.update_record(|rec| {
        rec.proxies.remove(name);
    });
    shared.metrics.forget("proxy", name);
    log(
        shared.opts.mode,
        &format!("{name}: removed ({} replica(s))", mine.len()),
    );
    Ok(())
}
