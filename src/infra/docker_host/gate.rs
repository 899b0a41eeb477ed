//! A new replica: create it, then gate it on the one readiness probe ([`crate::envoy::readiness`]):
//! LIVE with every declared listener port bound within the startup deadline, and still so for
//! the minimum ready time.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::execute::Run;
use super::retire::drain;
use super::traffic_gate::{Siblings, TrafficWatch};
use crate::core::crashpoint;
use crate::core::ir::{RolloutPolicy, Shutdown};
use crate::core::progress::Event;
use crate::core::replica::{DesiredProxy, ReplicaContainer};
use crate::engine::RunState;
use crate::envoy::admin::ReadyState;
use crate::envoy::readiness::{self, Expect, NotReady, Readiness};

/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(50);
/// How often the engine is asked whether a gated container still runs (see [`Run::gate`]).
const INSPECT_EVERY: Duration = Duration::from_millis(250);
/// Admin calls in a row that may go unanswered during the minimum ready time.
const MAX_ADMIN_ERRORS: u32 = 3;
/// Timeout of one admin call while gating.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of a failed replica's log shown after the lines that say why.
pub const LOG_LINES: usize = 20;

/// Which gate a new replica failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Gate {
    /// The container would not start.
    Start,
    /// Not ready within the startup deadline.
    Ready,
    /// The container exited while starting or during the minimum ready time.
    Exited,
    /// LIVE, but not every declared listener port is bound (e.g. a port taken, or not
    /// allowed).
    Listeners,
    /// Ready, but not for the whole minimum ready time.
    MinReady,
    /// Ready, but its own traffic during the minimum ready time failed far more often than
    /// its siblings' ([`crate::core::rollout::judge`]).
    Traffic,
    /// A canary whose numbers during its hold were worse than the old replicas'.
    Canary,
    /// `berth rollout undo` during the rollout.
    Undone,
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Gate::Start => "start",
            Gate::Ready => "become ready within the startup deadline",
            Gate::Exited => "stay running",
            Gate::Listeners => "bind all its listeners",
            Gate::MinReady => "stay ready for the minimum ready time",
            Gate::Traffic => "answer its traffic as well as its siblings",
            Gate::Canary => "pass its canary hold",
            Gate::Undone => "start: the rollout was undone",
        })
    }
}

/// A rollout stopped at a failed gate. The old replicas keep serving.
#[derive(Debug)]
pub struct GateFailure {
    pub proxy: String,
    pub slot: u32,
    pub container: String,
    pub gate: Gate,
    pub reason: String,
    /// The lines of its log that say why (Envoy's first critical and error lines).
    pub why: Vec<String>,
    pub log_tail: String,
    /// What happened to the slots already replaced.
    pub aftermath: String,
}

impl fmt::Display for GateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rollout of {} failed: replica {}/{} ({}) did not {}: {}",
            self.proxy, self.proxy, self.slot, self.container, self.gate, self.reason
        )?;
        write!(f, "{}", self.aftermath)?;
        if !self.why.is_empty() {
            write!(f, "\nwhy, from its log:\n{}", self.why.join("\n"))?;
        }
        if !self.log_tail.trim().is_empty() {
            write!(
                f,
                "\nlast {LOG_LINES} lines of its log:\n{}",
                self.log_tail.trim_end()
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for GateFailure {}

/// What the gate asks of a new replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Want {
    /// Ready by the one probe: LIVE and every declared listener port bound.
    Serving(Expect),
    /// xDS mode, first install, nothing serving yet: the container runs and its admin answers
    /// (any state but DRAINING). A replica serves only once Envoy Gateway's xDS server has
    /// sent its listeners, and EG may only push once the proxy it asked for exists; with no
    /// old replica to protect there is nothing to lose by accepting less. Every later rollout
    /// of the proxy asks for [`Want::Serving`].
    Started,
}

impl Want {
    pub(super) fn of(desired: &DesiredProxy, fresh: bool) -> Want {
        if desired.xds && fresh {
            Want::Started
        } else {
            Want::Serving(desired.expect())
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Want::Serving(_) => "ready (LIVE, every listener bound)",
            Want::Started => "answering on its admin socket (xDS mode, first install)",
        }
    }
}

/// What a gate asks of one replica: the policy's deadlines, what it must show, and the
/// siblings its traffic is judged against (None: not judged).
pub(super) struct Ask<'a> {
    pub policy: &'a RolloutPolicy,
    pub want: &'a Want,
    pub siblings: Option<&'a Siblings>,
}

/// One look at a replica against what the gate wants: Ok when satisfied, else why not.
async fn look(admin: &dyn crate::envoy::admin::AdminApi, want: &Want) -> Result<(), NotReady> {
    match want {
        Want::Serving(expect) => match readiness::probe(admin, expect).await {
            Readiness::Ready => Ok(()),
            Readiness::NotReady { reason } => Err(reason),
        },
        Want::Started => match admin.ready().await {
            Ok(ReadyState::Draining) => Err(NotReady::Draining),
            Ok(_) => Ok(()),
            Err(e) => Err(NotReady::AdminUnreachable {
                detail: format!("{e:#}"),
            }),
        },
    }
}

impl Run<'_> {
    /// Creates and starts the replica for `slot` and waits for its gates. On failure the new
    /// container is drained if it may serve, removed, and the failure carries the lines of its
    /// log that say why.
    pub(super) async fn start_replica(
        &self,
        desired: &DesiredProxy,
        slot: u32,
        name: &str,
        image_id: &str,
        want: &Want,
        siblings: Option<&Siblings>,
    ) -> Result<(), GateFailure> {
        let proxy = &desired.spec.proxy;
        let failure = |gate: Gate, reason: String| GateFailure {
            proxy: proxy.clone(),
            slot,
            container: name.to_string(),
            gate,
            reason,
            why: Vec::new(),
            log_tail: String::new(),
            aftermath: String::new(),
        };
        let replica = ReplicaContainer::new(
            desired,
            slot,
            name,
            image_id,
            self.state.root(),
            self.extra_labels,
        );
        self.reporter
            .waiting(format!("{proxy}/{slot}: starting {name}"));
        let started = Instant::now();
        if let Err(e) = self.prepare_host_dirs(&replica) {
            return Err(failure(Gate::Start, format!("{e:#}")));
        }
        self.host.forget_observation();
        let id = match self.engine.create(&replica).await {
            Ok(id) => id,
            Err(e) => return Err(failure(Gate::Start, e.to_string())),
        };
        if let Err(e) = self.engine.start(&id).await {
            let _ = self.engine.remove(&id).await;
            return Err(failure(Gate::Start, e.to_string()));
        }
        crashpoint::reached("after-create");
        self.reporter
            .event(Event::new(proxy, "created").slot(slot).container(name));
        if let Err(mut f) = self
            .gate(
                proxy,
                slot,
                &id,
                name,
                Ask {
                    policy: &desired.rollout,
                    want,
                    siblings,
                },
            )
            .await
        {
            if desired.xds && f.gate == Gate::Ready {
                f.reason.push_str(&self.xds_hint(proxy, name).await);
            }
            // A replica that failed during the minimum ready time may already be serving:
            // drain it like any other before it goes.
            if let Ok(Some(s)) = self.engine.status(&id).await {
                if s.state == RunState::Running {
                    let admin = self.host.admin(proxy, name, ADMIN_TIMEOUT);
                    let _ = drain(
                        admin.as_ref(),
                        &Shutdown::default(),
                        self.reporter,
                        proxy,
                        name,
                    )
                    .await;
                    let _ = self.engine.stop(&id, super::STOP_TIMEOUT).await;
                }
            }
            let log = self.engine.logs(&id, None).await.unwrap_or_default();
            f.why = crate::envoy::log::why(&log);
            f.log_tail = tail(&log, LOG_LINES);
            let _ = self.engine.remove(&id).await;
            let _ = std::fs::remove_dir_all(self.state.proxy(proxy).run(name));
            self.reporter.event(
                Event::new(proxy, "failed")
                    .slot(slot)
                    .container(name)
                    .message(format!("did not {}: {}", f.gate, f.reason)),
            );
            return Err(f);
        }
        self.reporter.event(
            Event::new(proxy, "ready")
                .slot(slot)
                .container(name)
                .message(format!("in {:.1}s", started.elapsed().as_secs_f64())),
        );
        crashpoint::reached("after-ready");
        Ok(())
    }

    /// Waits until the replica satisfies `want` within the startup deadline, then requires it
    /// to stay so, and running, for the minimum ready time.
    pub(super) async fn gate(
        &self,
        proxy: &str,
        slot: u32,
        id: &str,
        run_name: &str,
        ask: Ask<'_>,
    ) -> Result<(), GateFailure> {
        let Ask {
            policy,
            want,
            siblings,
        } = ask;
        let admin = self.host.admin(proxy, run_name, ADMIN_TIMEOUT);
        let failure = |gate: Gate, reason: String| GateFailure {
            proxy: proxy.to_string(),
            slot,
            container: run_name.to_string(),
            gate,
            reason,
            why: Vec::new(),
            log_tail: String::new(),
            aftermath: String::new(),
        };
        let deadline = Instant::now() + policy.startup_deadline;
        let mut next_inspect = Instant::now();
        loop {
            // The engine is asked whether the container still runs its first Envoy once the
            // probe passes (one restarted by the policy answers too) and, while it fails, every
            // INSPECT_EVERY: many replicas starting at once should not cost the engine an
            // inspect each per poll.
            let verdict = look(admin.as_ref(), want).await;
            if verdict.is_ok() || Instant::now() >= next_inspect {
                if let Err(reason) = self.still_running(id).await {
                    return Err(failure(Gate::Exited, reason));
                }
                next_inspect = Instant::now() + INSPECT_EVERY;
            }
            let Err(why) = verdict else { break };
            if Instant::now() >= deadline {
                let gate = match why {
                    NotReady::ListenersNotBound { .. } => Gate::Listeners,
                    _ => Gate::Ready,
                };
                return Err(failure(
                    gate,
                    format!(
                        "not {} after {}: {why}",
                        want.describe(),
                        humantime::format_duration(policy.startup_deadline)
                    ),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        let ready_until = Instant::now() + policy.min_ready;
        let mut admin_errors = 0;
        let mut traffic = match siblings {
            Some(s) => Some(TrafficWatch::begin(s).await),
            None => None,
        };
        while Instant::now() < ready_until {
            tokio::time::sleep(POLL.min(policy.min_ready)).await;
            let last = Instant::now() >= ready_until;
            if last || Instant::now() >= next_inspect {
                if let Err(reason) = self.still_running(id).await {
                    return Err(failure(Gate::Exited, reason));
                }
                next_inspect = Instant::now() + INSPECT_EVERY;
            }
            match look(admin.as_ref(), want).await {
                Ok(()) => admin_errors = 0,
                // One unanswered call on a loaded host is not a verdict: only a run of them.
                Err(e @ NotReady::AdminUnreachable { .. }) => {
                    admin_errors += 1;
                    if admin_errors >= MAX_ADMIN_ERRORS {
                        return Err(failure(Gate::MinReady, e.to_string()));
                    }
                }
                Err(e) => return Err(failure(Gate::MinReady, e.to_string())),
            }
            if let Some(t) = traffic.as_mut() {
                t.check(admin.as_ref(), last)
                    .await
                    .map_err(|why| failure(Gate::Traffic, why))?;
            }
        }
        if let Some(t) = traffic {
            self.reporter.event(
                Event::new(proxy, "traffic")
                    .slot(slot)
                    .container(run_name)
                    .message(t.outcome()),
            );
        }
        Ok(())
    }

    /// Why an xDS-mode replica may not have initialised, from its own stats: Envoy's warn-level
    /// log says nothing about an xDS server that refuses its client certificate.
    async fn xds_hint(&self, proxy: &str, run_name: &str) -> String {
        let admin = self.host.admin(proxy, run_name, ADMIN_TIMEOUT);
        match crate::envoy::xds::read(admin.as_ref()).await {
            Ok(x) if !x.connected => "; it has no stream to its xDS server: is the server \
                reachable from this host, and does it trust the client certificate (and the \
                replica the server's)?"
                .to_string(),
            Ok(_) => "; it is connected to its xDS server, which has not sent it listeners \
                and clusters (does the server know this proxy's --service-cluster?)"
                .to_string(),
            Err(_) => String::new(),
        }
    }

    /// Ok while the container runs its first process; otherwise what happened to it. A
    /// container the restart policy has restarted counts as exited: its Envoy died once.
    async fn still_running(&self, id: &str) -> Result<(), String> {
        let status = match self.engine.status(id).await {
            Ok(Some(status)) => status,
            Ok(None) => return Err("the container was removed".to_string()),
            Err(e) => return Err(e.to_string()),
        };
        let restarts = status.restart_count.unwrap_or(0);
        if status.state == RunState::Running && restarts == 0 {
            return Ok(());
        }
        // Exited: Podman's view between Envoy's exit and its restart by policy.
        let mut why = match status.state {
            RunState::Running | RunState::Restarting | RunState::Exited => {
                "Envoy exited".to_string()
            }
            other => format!("the container is {other}"),
        };
        if let Some(code) = status.exit_code.filter(|c| *c != 0) {
            why.push_str(&format!(" with code {code}"));
        }
        if status.oom_killed {
            why.push_str(" (killed: out of memory)");
        }
        if restarts > 0 {
            why.push_str(&format!(" (the engine restarted it {restarts} time(s))"));
        }
        if let Some(e) = status.error {
            why.push_str(&format!(": {e}"));
        }
        Err(why)
    }
}

/// The last `n` lines of `log`.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
