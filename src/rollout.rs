//! Executes a plan against the engine: one replica at a time, start-first, health-gated, with
//! rollback (DESIGN decisions 5 and 6).
//!
//! Before anything is touched the new image is made present and the new bootstrap and resources
//! are validated by `envoy --mode validate` in a throw-away container of that image. Then each
//! slot gets its new replica, which must report `/ready` LIVE within the startup deadline and
//! stay so for the minimum ready time, before the old one is retired without losing a request.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

use crate::admin::{Admin, ReadyState};
use crate::crashpoint;
use crate::desired::Target;
use crate::docker::Engine;
use crate::ir::{OnFailure, RolloutPolicy, Shutdown};
use crate::live;
use crate::plan::{self, Action, ContainerRef};
use crate::progress::{Event, Reporter};
use crate::render;
use crate::spec::{self, DesiredProxy, ObservedContainer, ReplicaContainer, RunState, LABEL_NAME};
use crate::state::StateDir;

/// How often readiness and connection counts are polled.
const POLL: Duration = Duration::from_millis(50);
/// Time Envoy gets to exit after SIGTERM once it has drained.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin calls in a row that may go unanswered during the minimum ready time.
const MAX_ADMIN_ERRORS: u32 = 3;
/// Lines of a failed replica's log shown in the error.
const LOG_LINES: usize = 20;

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

/// Executes plans for a set of targets.
pub struct Rollout<'a> {
    pub engine: &'a Engine,
    pub state: &'a StateDir,
    pub reporter: &'a Reporter,
    /// Labels added to every container berth creates (the test suite's `io.berth.test`).
    pub extra_labels: BTreeMap<String, String>,
    /// When cancelled, the rollout stops between steps: a step (one replica started and its
    /// predecessor retired) is always finished, so no proxy is left with fewer ready replicas.
    pub cancel: CancellationToken,
}

/// The rollout stopped because it was cancelled (SIGTERM), between two steps.
#[derive(Debug)]
pub struct Cancelled {
    pub proxy: String,
}

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rollout of {} stopped between two steps (cancelled); the next run completes it",
            self.proxy
        )
    }
}

impl std::error::Error for Cancelled {}

/// What the readiness gate asks of a new replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
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
    fn of(desired: &DesiredProxy) -> Want {
        if desired.xds {
            Want::AdminAnswers
        } else {
            Want::Live {
                listeners: desired.listeners,
            }
        }
    }

    fn accepts(self, state: &ReadyState) -> bool {
        match self {
            Want::Live { .. } => *state == ReadyState::Live,
            Want::AdminAnswers => matches!(
                state,
                ReadyState::Live | ReadyState::PreInitializing | ReadyState::Initializing
            ),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Want::Live { .. } => "LIVE",
            Want::AdminAnswers => "answering on its admin socket (xds mode)",
        }
    }
}

impl Rollout<'_> {
    /// Brings one proxy to its desired state, leaving every other proxy and its state alone
    /// (`berth serve` converges proxies independently). `observed` may hold other containers.
    pub async fn converge_one(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
    ) -> Result<()> {
        let mine: Vec<ObservedContainer> = observed
            .iter()
            .filter(|c| c.proxy() == Some(target.name()))
            .cloned()
            .collect();
        let plan = plan::plan(std::slice::from_ref(&target.desired), &mine);
        let actions: Vec<&Action> = plan.for_proxy(target.name()).collect();
        self.converge_proxy(target, &actions, &mine).await
    }

    /// Brings every target to its desired state and removes berth containers of proxies not
    /// among them. Proxies are converged one after the other; the first failure stops.
    pub async fn converge(&self, targets: &[Target], observed: &[ObservedContainer]) -> Result<()> {
        let desired: Vec<DesiredProxy> = targets.iter().map(|t| t.desired.clone()).collect();
        let plan = plan::plan(&desired, observed);
        for target in targets {
            let actions: Vec<&Action> = plan.for_proxy(target.name()).collect();
            self.converge_proxy(target, &actions, observed).await?;
        }
        let strays: Vec<&Action> = plan
            .actions
            .iter()
            .filter(|a| !targets.iter().any(|t| t.name() == a.proxy()))
            .collect();
        let mut emptied = BTreeSet::new();
        for action in strays {
            if let Action::Remove {
                proxy, container, ..
            } = action
            {
                emptied.insert(proxy.as_str());
                self.retire(
                    proxy,
                    container,
                    observed,
                    &Shutdown::default(),
                    &RolloutPolicy::default(),
                )
                .await?;
            }
        }
        for gone in self.state.proxies()? {
            // `observed` predates the removals above: a proxy whose strays were all just
            // removed has no container left either.
            if !targets.iter().any(|t| t.name() == gone)
                && (emptied.contains(gone.as_str())
                    || !observed.iter().any(|c| c.proxy() == Some(gone.as_str())))
            {
                self.state.remove_proxy(&gone)?;
            }
        }
        Ok(())
    }

    async fn converge_proxy(
        &self,
        target: &Target,
        actions: &[&Action],
        observed: &[ObservedContainer],
    ) -> Result<()> {
        let name = target.name();
        let desired = &target.desired;
        let needs_new = actions
            .iter()
            .any(|a| matches!(a, Action::Create { .. } | Action::Replace { .. }));
        let tampered = self.tampered_bootstrap(desired, observed);
        let image_id = if needs_new || !tampered.is_empty() {
            self.reporter
                .waiting(format!("{name}: image {}", desired.spec.image));
            let id = self
                .engine
                .ensure_image(&desired.spec.image, self.reporter.shows_progress())
                .await?;
            crashpoint::reached("after-pull");
            if self.spec_is_proven(desired, observed) {
                self.copy_tls(target)?;
            } else {
                self.validate_target(target).await?;
                crashpoint::reached("after-validate");
            }
            id
        } else {
            self.copy_tls(target)?;
            String::new()
        };
        self.write_files(target, observed).await?;

        let policy = &target.proxy.rollout;
        let shutdown = &target.proxy.config.shutdown;
        let mut replaced: Vec<(u32, String, String)> = Vec::new(); // (slot, new name, old hash)
        let mut creates_done = false;
        for (done, action) in actions.iter().enumerate() {
            self.reporter.steps(done, actions.len());
            if self.cancel.is_cancelled() {
                return Err(anyhow::Error::new(Cancelled {
                    proxy: name.to_string(),
                }));
            }
            match action {
                Action::Create { .. } => {
                    if creates_done {
                        continue;
                    }
                    creates_done = true;
                    self.create_all(target, actions, &image_id).await?;
                }
                Action::Start {
                    slot, container, ..
                } => {
                    self.engine.start(&container.id).await?;
                    let run_name = run_dir_name(container, observed);
                    self.gate(
                        name,
                        *slot,
                        &container.id,
                        &run_name,
                        policy,
                        Want::of(desired),
                    )
                    .await
                    .map_err(anyhow::Error::new)?;
                    self.reporter.event(
                        Event::new(name, "started")
                            .slot(*slot)
                            .container(&container.name),
                    );
                }
                Action::Replace {
                    slot,
                    old,
                    reason,
                    new_name,
                    ..
                } => {
                    self.reporter.event(
                        Event::new(name, "replacing")
                            .slot(*slot)
                            .container(&old.name)
                            .message(reason.to_string()),
                    );
                    let old_hash = observed
                        .iter()
                        .find(|c| c.id == old.id)
                        .and_then(|c| c.spec_hash())
                        .unwrap_or_default()
                        .to_string();
                    match self
                        .start_replica(desired, *slot, new_name, &image_id, policy)
                        .await
                    {
                        Ok(()) => {
                            self.retire(name, old, observed, shutdown, policy).await?;
                            replaced.push((*slot, new_name.clone(), old_hash));
                        }
                        Err(mut failure) => {
                            failure.aftermath =
                                self.after_failure(target, &replaced, observed).await;
                            return Err(anyhow::Error::new(failure));
                        }
                    }
                }
                Action::Remove {
                    container, reason, ..
                } => {
                    self.reporter.event(
                        Event::new(name, "removing")
                            .container(&container.name)
                            .message(reason.to_string()),
                    );
                    self.retire(name, container, observed, shutdown, policy)
                        .await?;
                }
            }
        }
        for slot_container in &tampered {
            // The bootstrap on disk was changed by hand: it has been rewritten; replicas that
            // could restart with the tampered file are replaced by fresh ones.
            let Some(old) = observed.iter().find(|c| &c.id == slot_container) else {
                continue;
            };
            let slot = old.slot().unwrap_or_default();
            let old_ref = ContainerRef {
                id: old.id.clone(),
                name: old.name.clone(),
            };
            if actions.iter().any(|a| a.slot() == Some(slot)) {
                continue;
            }
            self.reporter.event(
                Event::new(name, "replacing")
                    .slot(slot)
                    .container(&old.name)
                    .message("its bootstrap file was changed on disk"),
            );
            let new_name = fresh_name(desired, slot, observed);
            self.start_replica(desired, slot, &new_name, &image_id, policy)
                .await
                .map_err(anyhow::Error::new)?;
            self.retire(name, &old_ref, observed, shutdown, policy)
                .await?;
        }
        if !actions.is_empty() || !tampered.is_empty() {
            self.prune(target).await?;
        }
        Ok(())
    }

    /// Creates the replicas of every empty slot at once: they are independent (nothing is
    /// retired), so a fresh install or a scale-up costs about one replica's time. Returns the
    /// first failure once all have finished; replicas that became ready stay.
    async fn create_all(&self, target: &Target, actions: &[&Action], image_id: &str) -> Result<()> {
        let policy = &target.proxy.rollout;
        let creates = actions.iter().filter_map(|a| match a {
            Action::Create { slot, name, .. } => {
                Some(self.start_replica(&target.desired, *slot, name, image_id, policy))
            }
            _ => None,
        });
        let results = futures_util::future::join_all(creates).await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            Some(mut failure) => {
                failure.aftermath = format!(
                    "{failed} new replica(s) failed and were removed; no existing replica was \
                     touched; the next `berth up` tries the empty slots again"
                );
                Err(anyhow::Error::new(failure))
            }
        }
    }

    /// A spec is proven when a replica already runs it: no need to validate it again.
    fn spec_is_proven(&self, desired: &DesiredProxy, observed: &[ObservedContainer]) -> bool {
        observed.iter().any(|c| {
            c.is_managed()
                && c.proxy() == Some(desired.spec.proxy.as_str())
                && c.spec_hash() == Some(desired.hash.as_str())
                && c.state == RunState::Running
        })
    }

    /// Running replicas of the current spec whose bootstrap file differs on disk.
    fn tampered_bootstrap(
        &self,
        desired: &DesiredProxy,
        observed: &[ObservedContainer],
    ) -> Vec<String> {
        let proxy = &desired.spec.proxy;
        let on_disk = self
            .state
            .read_generation(proxy, &desired.spec.bootstrap_sha256);
        let intact = on_disk
            .map(|text| spec::sha256_hex(text.as_bytes()) == desired.spec.bootstrap_sha256)
            .unwrap_or(false);
        if intact {
            return Vec::new();
        }
        observed
            .iter()
            .filter(|c| {
                c.is_managed()
                    && c.proxy() == Some(proxy.as_str())
                    && c.spec_hash() == Some(desired.hash.as_str())
            })
            .map(|c| c.id.clone())
            .collect()
    }

    /// Runs `envoy --mode validate` on the target's bootstrap and resources in a throw-away
    /// container of its image.
    pub async fn validate_target(&self, target: &Target) -> Result<()> {
        let name = target.name();
        self.copy_tls(target)?;
        self.reporter
            .waiting(format!("{name}: envoy --mode validate"));
        let dir = tempfile::Builder::new()
            .prefix(crate::state::VALIDATION_DIR_PREFIX)
            .tempdir_in(self.state.root())
            .context("cannot create a validation directory")?;
        let bootstrap = render::validation_bootstrap(&target.rendered)?;
        let path = dir.path().join(crate::layout::BOOTSTRAP_FILE);
        crate::state::write_atomic(&path, bootstrap.as_bytes(), 0o644)?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let mut mounts: Vec<spec::Mount> = target
            .desired
            .spec
            .mounts
            .iter()
            // The validation bootstrap inlines the watched files, so only TLS is mounted.
            .filter(|m| {
                m.target != crate::layout::CONTAINER_BOOTSTRAP_DIR
                    && m.target != crate::layout::CONTAINER_XDS_DIR
            })
            .cloned()
            .collect();
        mounts.push(spec::Mount {
            source: dir.path().to_path_buf(),
            target: crate::layout::CONTAINER_BOOTSTRAP_DIR.to_string(),
            read_only: true,
        });
        self.engine
            .validate(
                &target.desired.spec.image,
                &mounts,
                crate::layout::CONTAINER_BOOTSTRAP,
                &self.extra_labels,
            )
            .await
            .with_context(|| {
                format!(
                    "envoy --mode validate rejected the new config of proxy {name} (image {}); no replica was changed",
                    target.desired.spec.image
                )
            })?;
        self.reporter
            .event(Event::new(name, "validated").message(&target.desired.spec.image));
        Ok(())
    }

    /// Copies the TLS files the replicas (and validation) mount.
    fn copy_tls(&self, target: &Target) -> Result<()> {
        let name = target.name();
        let tls = self
            .state
            .write_tls(name, &spec::tls_files(&target.proxy))?;
        if !tls.is_empty() {
            self.reporter
                .event(Event::new(name, "files").message(format!("copied {}", tls.join(", "))));
        }
        Ok(())
    }

    async fn write_files(&self, target: &Target, observed: &[ObservedContainer]) -> Result<()> {
        let name = target.name();
        self.state.write_spec(&target.desired)?;
        self.state.write_generation(
            name,
            &target.desired.spec.bootstrap_sha256,
            &target.rendered.bootstrap,
        )?;
        let on_disk = self.state.read_xds(name)?;
        let files = if live::generation_of(&target.rendered.xds).is_some() {
            // `berth serve` stamps its own generations.
            target.rendered.xds.clone()
        } else if live::unstamp(&on_disk) == target.rendered.xds {
            on_disk.clone()
        } else {
            let next = live::generation_of(&on_disk).unwrap_or(0) + 1;
            live::stamp(&target.rendered.xds, next)
        };
        if files == on_disk {
            return Ok(());
        }
        // Routes, clusters and backends change live: every running replica must confirm the
        // new files, or the previous ones come back and nothing else is changed.
        let mut replicas = live::replicas(self.state, name, observed);
        if live::subscriptions(&files).is_empty() {
            // xds mode: only SDS files here, which Envoy Gateway's config does not version.
            replicas.clear();
        }
        let written = if replicas.is_empty() {
            self.state.write_xds(name, &files)?
        } else {
            self.reporter.waiting(format!(
                "{name}: {} replica(s) confirming the new files",
                replicas.len()
            ));
            let outcome = live::update(
                self.state,
                name,
                &files,
                &replicas,
                live::DEFAULT_CONFIRM_TIMEOUT,
            )
            .await
            .with_context(|| format!("live update of proxy {name}'s routes, clusters and backends; the previous files are back and no replica was changed"))?;
            outcome.written
        };
        if !written.is_empty() {
            self.reporter
                .event(Event::new(name, "files").message(format!(
                    "wrote {}{}",
                    written.join(", "),
                    if replicas.is_empty() {
                        String::new()
                    } else {
                        format!("; confirmed by {} replica(s)", replicas.len())
                    }
                )));
        }
        Ok(())
    }

    /// Creates the replica for `slot` and waits for its gates. On failure the new container
    /// is removed and the failure carries its log.
    async fn start_replica(
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
                let _ = drain(&admin, &shutdown, policy, self.reporter, proxy, name).await;
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
    async fn gate(
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

    /// Retires a replica without losing a request: fail health checks, drain gracefully until
    /// its connections are gone, close the listen sockets (see [`drain`] for the order and
    /// why), then stop and remove.
    pub async fn retire(
        &self,
        proxy: &str,
        container: &ContainerRef,
        observed: &[ObservedContainer],
        shutdown: &Shutdown,
        policy: &RolloutPolicy,
    ) -> Result<()> {
        let run_name = run_dir_name(container, observed);
        let running = matches!(
            self.engine.state(&container.id).await?,
            Some(RunState::Running)
        );
        if running {
            let admin = Admin::new(self.state.proxy(proxy).admin_socket(&run_name));
            self.reporter
                .event(Event::new(proxy, "draining").container(&container.name));
            let drained = drain(
                &admin,
                shutdown,
                policy,
                self.reporter,
                proxy,
                &container.name,
            )
            .await;
            // A drained replica has closed its listeners and has no connection left: removing
            // it (SIGKILL) loses nothing and saves a stop round trip. Without a drain, Envoy
            // gets its SIGTERM first.
            if drained.is_err() {
                self.reporter.event(
                    Event::new(proxy, "drain-skipped")
                        .container(&container.name)
                        .message("admin socket did not answer; stopping directly"),
                );
                self.engine.stop(&container.id, STOP_TIMEOUT).await?;
            }
        }
        self.engine.remove(&container.id).await?;
        crashpoint::reached("after-remove");
        let _ = std::fs::remove_dir_all(self.state.proxy(proxy).run(&run_name));
        self.reporter
            .event(Event::new(proxy, "removed").container(&container.name));
        Ok(())
    }

    /// After a failed gate: roll the already replaced slots back to their previous spec
    /// (policy `rollback`), or leave them (policy `pause`). Returns what was done.
    async fn after_failure(
        &self,
        target: &Target,
        replaced: &[(u32, String, String)],
        observed: &[ObservedContainer],
    ) -> String {
        let name = target.name();
        if replaced.is_empty() {
            return "no replica had been replaced; the old replicas keep serving".to_string();
        }
        if target.proxy.rollout.on_failure == OnFailure::Pause {
            return format!(
                "rollout paused: {} replica(s) already run the new spec, the others the old one",
                replaced.len()
            );
        }
        let mut notes = Vec::new();
        for (slot, new_name, old_hash) in replaced.iter().rev() {
            let Some(previous) = self.state.read_spec(name, old_hash) else {
                notes.push(format!(
                    "slot {slot}: previous spec {old_hash} is not recorded; left on the new spec"
                ));
                continue;
            };
            let image_id = match self.engine.ensure_image(&previous.spec.image, false).await {
                Ok(id) => id,
                Err(e) => {
                    notes.push(format!("slot {slot}: {e:#}"));
                    continue;
                }
            };
            // Never roll back a rollback: a failure here is reported, not retried.
            let back_name = fresh_name(&previous, *slot, observed);
            match self
                .start_replica(
                    &previous,
                    *slot,
                    &back_name,
                    &image_id,
                    &target.proxy.rollout,
                )
                .await
            {
                Ok(_) => {
                    crashpoint::reached("mid-rollback");
                    let only = BTreeSet::from([name.to_string()]);
                    let current = self
                        .engine
                        .observe_proxies(&only, self.state.root())
                        .await
                        .unwrap_or_default();
                    if let Some(c) = current.iter().find(|c| c.name == *new_name) {
                        let r = ContainerRef {
                            id: c.id.clone(),
                            name: c.name.clone(),
                        };
                        let _ = self
                            .retire(
                                name,
                                &r,
                                observed,
                                &target.proxy.config.shutdown,
                                &target.proxy.rollout,
                            )
                            .await;
                    }
                    self.reporter.event(
                        Event::new(name, "rolled-back")
                            .slot(*slot)
                            .message(old_hash.clone()),
                    );
                    notes.push(format!(
                        "slot {slot}: rolled back to spec {}",
                        spec::short_hash(old_hash)
                    ));
                }
                Err(f) => notes.push(format!(
                    "slot {slot}: rollback failed too ({}); left as is",
                    f.reason
                )),
            }
        }
        format!("rolled back the replaced replicas: {}", notes.join("; "))
    }

    /// Removes files nothing uses any more: old generations, specs and run directories.
    async fn prune(&self, target: &Target) -> Result<()> {
        let name = target.name();
        let current = self
            .engine
            .observe_proxies(&BTreeSet::from([name.to_string()]), self.state.root())
            .await?;
        let mine: Vec<&ObservedContainer> =
            current.iter().filter(|c| c.proxy() == Some(name)).collect();
        let hashes: BTreeSet<String> = mine
            .iter()
            .filter_map(|c| c.spec_hash().map(str::to_string))
            .chain([target.desired.hash.clone()])
            .collect();
        let bootstraps: BTreeSet<String> = hashes
            .iter()
            .filter_map(|h| self.state.read_spec(name, h))
            .map(|d| d.spec.bootstrap_sha256)
            .collect();
        let keep_hashes: Vec<&str> = hashes.iter().map(String::as_str).collect();
        let keep_bootstraps: Vec<&str> = bootstraps.iter().map(String::as_str).collect();
        let runs: Vec<String> = mine
            .iter()
            .map(|c| c.label(LABEL_NAME).unwrap_or(&c.name).to_string())
            .collect();
        let keep_runs: Vec<&str> = runs.iter().map(String::as_str).collect();
        self.state.prune_specs(name, &keep_hashes)?;
        self.state.prune_generations(name, &keep_bootstraps)?;
        self.state.prune_run_dirs(name, &keep_runs)?;
        Ok(())
    }
}

/// How long a retiring replica keeps its listen sockets open past the minimum drain time while
/// connections are still open, before they are closed anyway (see [`drain`]).
const LISTEN_GRACE: Duration = Duration::from_secs(2);

/// The drain sequence of DESIGN decision 6, in the order measured best under keep-alive load:
///
/// 1. `/healthcheck/fail` and `/drain_listeners?graceful&skip_exit`: Envoy answers every
///    request with `connection: close`; its listen sockets stay open.
/// 2. Wait for 0 downstream connections (not before `min_drain_duration`). A keep-alive
///    client that reconnects lands on a sibling or, now and then, on this replica again and is
///    closed after one response; once on a sibling it stays there, so the count falls to 0
///    within the minimum drain time and the listen socket is idle.
/// 3. `/drain_listeners`: close the listen sockets. Closing them while idle is what makes this
///    order lose nothing even without `net.ipv4.tcp_migrate_req` (a connection still in a
///    closing socket's accept queue is otherwise reset). Clients that open a new connection
///    per request keep an open listener busy for ever, so after `LISTEN_GRACE` more the
///    sockets are closed anyway (that relies on `tcp_migrate_req`, which berth sets).
/// 4. Wait for the remaining connections, at most `drain_timeout` in all.
async fn drain(
    admin: &Admin,
    shutdown: &Shutdown,
    policy: &RolloutPolicy,
    reporter: &Reporter,
    proxy: &str,
    container: &str,
) -> Result<()> {
    let started = Instant::now();
    admin.healthcheck_fail().await?;
    admin.drain_listeners(true).await?;
    crashpoint::reached("mid-drain");
    let deadline = started + policy.drain_timeout;
    let earliest = started + shutdown.min_drain_duration;
    let close_by = (earliest + LISTEN_GRACE).min(deadline);
    let mut listening = true;
    loop {
        let open = admin.downstream_connections().await.unwrap_or(0);
        let now = Instant::now();
        if listening && ((open == 0 && now >= earliest) || now >= close_by) {
            admin.drain_listeners(false).await?;
            listening = false;
            continue;
        }
        if !listening && ((open == 0 && now >= earliest) || now >= deadline) {
            reporter.event(
                Event::new(proxy, "drained")
                    .container(container)
                    .message(format!(
                        "{} connection(s) left after {:.1}s",
                        open,
                        started.elapsed().as_secs_f64()
                    )),
            );
            return Ok(());
        }
        reporter.waiting(format!(
            "{proxy}: draining {container}, {open} connection(s) open"
        ));
        tokio::time::sleep(POLL).await;
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

/// The name a container's admin socket directory was created under (its original name).
fn run_dir_name(container: &ContainerRef, observed: &[ObservedContainer]) -> String {
    observed
        .iter()
        .find(|c| c.id == container.id)
        .and_then(|c| c.label(LABEL_NAME))
        .unwrap_or(&container.name)
        .to_string()
}

/// A name for a new replica of `desired` in `slot` that no observed container has, for
/// replacements the planner did not name (tampered files, rollback).
fn fresh_name(desired: &DesiredProxy, slot: u32, observed: &[ObservedContainer]) -> String {
    let base = spec::replica_name(&desired.spec.proxy, slot, &desired.hash);
    // Recorded names key admin socket directories: they stay taken after a rename.
    let taken = |n: &str| {
        observed
            .iter()
            .any(|c| c.name == n || c.recorded_name() == Some(n))
    };
    (0..)
        .map(|i| {
            if i == 0 {
                base.clone()
            } else {
                format!("{base}-r{i}")
            }
        })
        .find(|n| !taken(n))
        .unwrap_or(base)
}
