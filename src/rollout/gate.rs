//! A new replica: create it, then gate it on readiness (LIVE, every listener active, for the
//! minimum ready time; or in xds mode an answering admin).

use super::retire::drain;
use super::*;

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
    /// Ready, but not every listener is bound (e.g. a port taken, or not allowed).
    Listeners,
    /// Ready, but not for the whole minimum ready time.
    MinReady,
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Gate::Start => "start",
            Gate::Ready => "ready within the startup deadline",
            Gate::Exited => "stay running",
            Gate::Listeners => "bind all its listeners",
            Gate::MinReady => "stay ready for the minimum ready time",
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
        writeln!(f, "{}", self.aftermath)?;
        write!(
            f,
            "last {LOG_LINES} lines of its log:\n{}",
            self.log_tail.trim_end()
        )
    }
}

impl std::error::Error for GateFailure {}

/// What the readiness gate asks of a new replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// Standalone mode: `/ready` LIVE and `listeners` listeners active. berth wrote every
    /// listener itself, so LIVE is reachable and means "serving".
    Live { listeners: u32 },
    /// xds mode: the container runs and its admin answers `/ready` with PRE_INITIALIZING,
    /// INITIALIZING or LIVE (not DRAINING). A replica only becomes LIVE once Envoy Gateway's
    /// xDS server has sent its clusters and listeners (EG's own Kubernetes readiness probe is
    /// served by an xDS-pushed listener), which berth neither controls nor can wait for: EG
    /// may be down, or may only push once the proxy it asked for exists. What berth can prove
    /// is that the new Envoy started with its bootstrap (it passed `envoy --mode validate`
    /// before) and stays up for the minimum ready time. `berth status` and serve's `/status`
    /// show the real `/ready` state of each replica.
    AdminAnswers,
}

impl Want {
    pub(super) fn of(desired: &DesiredProxy) -> Want {
        if desired.xds {
            Want::AdminAnswers
        } else {
            Want::Live {
                listeners: desired.listeners,
            }
        }
    }

    pub(super) fn accepts(self, state: &ReadyState) -> bool {
        match self {
            Want::Live { .. } => *state == ReadyState::Live,
            Want::AdminAnswers => matches!(
                state,
                ReadyState::Live | ReadyState::PreInitializing | ReadyState::Initializing
            ),
        }
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            Want::Live { .. } => "LIVE",
            Want::AdminAnswers => "answering on its admin socket (xds mode)",
        }
    }
}

impl Rollout<'_> {
    /// Creates the replica for `slot` and waits for its gates. On failure the new container
    /// is removed and the failure carries its log.
    pub(super) async fn start_replica(
        &self,
        desired: &DesiredProxy,
        slot: u32,
        name: &str,
        image_id: &str,
        policy: &RolloutPolicy,
    ) -> Result<(), GateFailure> {
        let proxy = &desired.spec.proxy;
        let failure = |gate: Gate, reason: String| GateFailure {
            proxy: proxy.clone(),
            slot,
            container: name.to_string(),
            gate,
            reason,
            log_tail: String::new(),
            aftermath: String::new(),
        };
        let replica = ReplicaContainer::new(desired, slot, name, image_id, self.state.root());
        self.reporter
            .waiting(format!("{proxy}/{slot}: starting {name}"));
        let started = Instant::now();
        let id = match self
            .engine
            .create_replica(&replica, &self.extra_labels)
            .await
        {
            Ok(id) => id,
            Err(e) => return Err(failure(Gate::Start, format!("{e:#}"))),
        };
        crashpoint::reached("after-create");
        self.reporter
            .event(Event::new(proxy, "created").slot(slot).container(name));
        if let Err(mut f) = self
            .gate(proxy, slot, &id, name, policy, Want::of(desired))
            .await
        {
            // A replica that failed during the minimum ready time may already be serving:
            // drain it like any other before it goes.
            if matches!(self.engine.state(&id).await, Ok(Some(RunState::Running))) {
                let admin = Admin::new(self.state.proxy(proxy).admin_socket(name));
                let shutdown = Shutdown::default();
                let _ = drain(&admin, &shutdown, self.reporter, proxy, name).await;
                let _ = self.engine.stop(&id, STOP_TIMEOUT).await;
            }
            f.log_tail = self
                .engine
                .logs_tail(&id, LOG_LINES)
                .await
                .unwrap_or_default();
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

    /// Waits until the replica reaches `want` within the startup deadline (LIVE, or in xds
    /// mode an answering admin), then requires it to stay so, and running, for the minimum
    /// ready time.
    pub(super) async fn gate(
        &self,
        proxy: &str,
        slot: u32,
        id: &str,
        run_name: &str,
        policy: &RolloutPolicy,
        want: Want,
    ) -> Result<(), GateFailure> {
        let admin = Admin::new(self.state.proxy(proxy).admin_socket(run_name));
        let failure = |gate: Gate, reason: String| GateFailure {
            proxy: proxy.to_string(),
            slot,
            container: run_name.to_string(),
            gate,
            reason,
            log_tail: String::new(),
            aftermath: String::new(),
        };
        let deadline = Instant::now() + policy.startup_deadline;
        let mut last: String;
        loop {
            if let Err(reason) = self.still_running(id).await {
                return Err(failure(Gate::Exited, reason));
            }
            match admin.ready().await {
                Ok(state) if want.accepts(&state) => break,
                Ok(other) => last = format!("/ready says {other:?}"),
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() >= deadline {
                return Err(failure(
                    Gate::Ready,
                    format!(
                        "not {} after {} ({last})",
                        want.describe(),
                        humantime::format_duration(policy.startup_deadline)
                    ),
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        // LIVE means initialised, not serving: a listener Envoy could not bind is only a
        // rejected LDS update in its log.
        if let Want::Live { listeners } = want {
            if listeners > 0 {
                if let Err(reason) = listeners_active(&admin, listeners).await {
                    return Err(failure(Gate::Listeners, reason));
                }
            }
        }
        let ready_until = Instant::now() + policy.min_ready;
        let mut admin_errors = 0;
        while Instant::now() < ready_until {
            tokio::time::sleep(POLL.min(policy.min_ready)).await;
            if let Err(reason) = self.still_running(id).await {
                return Err(failure(Gate::Exited, reason));
            }
            match admin.ready().await {
                Ok(state) if want.accepts(&state) => {}
                Ok(other) => {
                    return Err(failure(Gate::MinReady, format!("/ready says {other:?}")));
                }
                // One unanswered call on a loaded host is not a verdict: only a run of them.
                Err(e) => {
                    admin_errors += 1;
                    if admin_errors >= MAX_ADMIN_ERRORS {
                        return Err(failure(Gate::MinReady, format!("{e:#}")));
                    }
                    continue;
                }
            }
            admin_errors = 0;
        }
        Ok(())
    }

    /// Ok while the container runs its first process; otherwise what happened to it. A
    /// container the restart policy has restarted counts as exited: its Envoy died once.
    async fn still_running(&self, id: &str) -> Result<(), String> {
        let status = match self.engine.status(id).await {
            Ok(Some(status)) => status,
            Ok(None) => return Err("the container was removed".to_string()),
            Err(e) => return Err(format!("{e:#}")),
        };
        let restarts = status.restart_count.unwrap_or(0);
        if status.state == RunState::Running && restarts == 0 {
            return Ok(());
        }
        let mut why = match status.state {
            RunState::Running | RunState::Restarting => "Envoy exited".to_string(),
            other => format!("the container is {other}"),
        };
        if let Some(code) = status.exit_code.filter(|c| *c != 0) {
            why.push_str(&format!(" with code {code}"));
        }
        if status.oom_killed {
            why.push_str(" (killed: out of memory)");
        }
        if restarts > 0 {
            why.push_str(&format!(" (Docker restarted it {restarts} time(s))"));
        }
        if let Some(e) = status.error {
            why.push_str(&format!(": {e}"));
        }
        Err(why)
    }
}

/// Ok when `want` listeners are active and no listener update was rejected; a few tries, as
/// the stats may lag the LIVE state by a moment.
async fn listeners_active(admin: &Admin, want: u32) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..MAX_ADMIN_ERRORS * 3 {
        match admin.stats().await {
            Ok(stats) => {
                let active = stats
                    .get("listener_manager.total_listeners_active")
                    .copied()
                    .unwrap_or(0);
                let rejected = stats
                    .get("listener_manager.lds.update_rejected")
                    .copied()
                    .unwrap_or(0);
                if rejected > 0 {
                    return Err(format!(
                        "Envoy rejected its listeners ({active} of {want} active); its log says why"
                    ));
                }
                if active >= u64::from(want) {
                    return Ok(());
                }
                last = format!("{active} of {want} listeners active");
            }
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(POLL).await;
    }
    Err(last)
}
