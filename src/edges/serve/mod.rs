//! `berth serve`: a run group of components sharing one cancellation (the oklog/run pattern,
//! DESIGN "runner"). Each component is an async function that runs until the shared
//! [`CancellationToken`] is cancelled; when any one returns (SIGTERM, an error), the token is
//! cancelled and every other one shuts down too.
//!
//! ```text
//!  config watcher ──┐ (notify, debounced: re-load, re-render, new generations)
//!  engine changes ──┼──► triggers ──► scheduler ──► reconciler: one pass per dirty proxy,
//!  periodic resync ─┤                (coalesces,    through the operations layer (host
//!  EG remote ───────┤                 requeues)     prepared, files delivered, replicas rolled;
//!  ACME renewal ────┤                               due ACME certificates obtained)
//!  liveness (1 s) ──┘ (kills a replica that stopped serving, then asks for its pass)
//!  status server  ◄── Shared { desired, record, metrics }
//!  signals ──► cancel
//! ```
//!
//! Proxies are independent: each has at most one pass running, and a trigger for a proxy that
//! is busy marks it dirty so it runs once more afterwards ([`scheduler`]). On cancellation the
//! running rollouts finish their current step and serve exits 0; the proxies keep running
//! (they are not berth's children).

mod acme;
mod api;
mod config;
pub mod eg_proxies;
mod events;
pub mod liveness;
pub mod reconciler;
mod resync;
pub mod scheduler;
mod server;
mod signals;
mod tags;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::core::progress::Mode;
use crate::core::render::Renderer;
use crate::core::source::file::{self, Config, ServeSection};
use crate::core::target::{self, Target};
use crate::host::default_state_dir;
use crate::infra::Caller;
use crate::ops::{HostPolicy, Operations};
use crate::state::StateDir;
use crate::status::metrics::Metrics;

use crate::status::record as status;
pub use crate::status::record::{Condition, Record};

/// Quiet time after a config file event before it is re-read.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// What `berth serve` runs with.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: PathBuf,
    /// Overrides the config's `state_dir`.
    pub state_dir: Option<PathBuf>,
    pub templates: Option<PathBuf>,
    /// Labels added to every container berth creates.
    pub extra_labels: BTreeMap<String, String>,
    /// How rollout steps are reported (human lines on stderr, JSON on stdout, nothing).
    pub mode: Mode,
    /// Flags that override the config's `[serve]`.
    pub flags: ServeFlags,
    /// Envoy Gateway's remote infrastructure provider service.
    pub remote: RemoteFlag,
}

/// `berth serve`'s flags; each, when given, overrides its `[serve]` key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeFlags {
    /// The status server's address; Some(None): no server.
    pub listen: Option<Option<SocketAddr>>,
    /// The periodic resync's interval; Some(None): no resync.
    pub resync: Option<Option<Duration>>,
    pub confirm_timeout: Option<Duration>,
    /// Some(false): do not watch the config and the files it names.
    pub watch: Option<bool>,
    /// Some(false): do not watch the engine's events.
    pub engine_events: Option<bool>,
    /// Some(false): do not watch the replicas' liveness.
    pub liveness: Option<bool>,
}

impl ServeFlags {
    /// The config's `[serve]` with these flags applied: what serve runs with.
    pub fn over(&self, section: &ServeSection) -> ServeSection {
        ServeSection {
            listen: self.listen.unwrap_or(section.listen),
            resync: self.resync.unwrap_or(section.resync),
            confirm_timeout: self.confirm_timeout.unwrap_or(section.confirm_timeout),
            watch: self.watch.unwrap_or(section.watch),
            engine_events: self.engine_events.unwrap_or(section.engine_events),
            liveness: self.liveness.unwrap_or(section.liveness),
            acme: section.acme,
        }
    }
}

/// Where serve offers Envoy Gateway's remote infrastructure provider service.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RemoteFlag {
    /// `[envoy_gateway] remote` of the config, if any.
    #[default]
    FromConfig,
    Off,
    At(crate::edges::eg_provider::Listen),
}

pub use scheduler::Trigger;

/// What should run: the last good config and the proxies Envoy Gateway asked for, rendered.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    pub targets: BTreeMap<String, Target>,
    pub generations: BTreeMap<String, u64>,
    /// Per proxy, a counter bumped by every remote request: a reconcile pass that read epoch
    /// `e` with the targets answers every request up to `e` ([`Shared::wait_pass`]).
    pub epochs: BTreeMap<String, u64>,
}

/// How the last reconcile pass of a proxy ended, for the requests waiting on it (Envoy
/// Gateway's, and `berth up` handed to serve).
#[derive(Debug, Clone, Default)]
pub struct PassOutcome {
    /// The epoch the pass read with its target.
    pub epoch: u64,
    /// None: success; else the error and whether it is worth retrying.
    pub error: Option<(String, bool)>,
    /// A pass that ended without error but left the proxy short of what `up` promises: the
    /// live update that failed, or the replicas that are not ready (outside xDS mode).
    pub unfinished: Option<Unfinished>,
    /// Lines `up` would print beside its verdict (host warnings, xDS-mode notes).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfinished {
    Delivery(String),
    NotReady(String),
}

/// Who listens to the progress events of the passes of some proxies: a `berth up` handed to
/// serve ([`api`]), from the epoch its request bumped.
struct Watcher {
    id: u64,
    from: BTreeMap<String, u64>,
    events: mpsc::UnboundedSender<crate::core::progress::Event>,
}

/// The watchers, shareable with a pass's progress hook.
#[derive(Default)]
pub struct Watchers {
    list: Mutex<Vec<Watcher>>,
    next: std::sync::atomic::AtomicU64,
}

impl Watchers {
    /// Hands `event` of a pass of `proxy` that read `epoch` to those who asked for it.
    pub fn forward(&self, proxy: &str, epoch: u64, event: &crate::core::progress::Event) {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        for w in list.iter() {
            if w.from.get(proxy).is_some_and(|from| *from <= epoch) {
                let _ = w.events.send(event.clone());
            }
        }
    }

    fn add(
        &self,
        from: BTreeMap<String, u64>,
        events: mpsc::UnboundedSender<crate::core::progress::Event>,
    ) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Watcher { id, from, events });
        id
    }

    fn remove(&self, id: u64) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|w| w.id != id);
    }
}

/// A live update that failed, and when it may be tried again (None: after the next edit).
#[derive(Debug, Clone, Copy)]
pub struct Failed {
    pub generation: u64,
    pub retry_after: Option<tokio::time::Instant>,
}

/// The persisted record, shareable with a progress hook.
pub struct RecordStore {
    record: Mutex<Record>,
    state: StateDir,
    mode: Mode,
}

impl RecordStore {
    /// Changes the record and writes it.
    pub fn update<R>(&self, f: impl FnOnce(&mut Record) -> R) -> R {
        let mut rec = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut rec);
        if let Err(e) = rec.save(&self.state) {
            log(self.mode, &format!("cannot persist status: {e:#}"));
        }
        r
    }

    pub fn snapshot(&self) -> Record {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What the components share.
pub struct Shared {
    pub opts: Options,
    /// What serve runs with: the first config's `[serve]` with the flags applied.
    pub settings: ServeSection,
    pub ops: Operations,
    pub state: StateDir,
    /// `tune_host` of the last good config.
    pub tune_host: std::sync::atomic::AtomicBool,
    pub metrics: Arc<Metrics>,
    pub desired: Mutex<Desired>,
    /// The last good config's targets (`desired` merges them with `remote`).
    pub config_targets: Mutex<BTreeMap<String, Target>>,
    /// Image reference → the image ID it named at the last tag check, for proxies whose pull
    /// policy is "always" (see [`tags`]); `publish` pins their specs to it.
    pub image_pins: Mutex<BTreeMap<String, String>>,
    /// Proxies Envoy Gateway asked for over the remote infrastructure service.
    pub remote: Mutex<BTreeMap<String, eg_proxies::Managed>>,
    /// The last reconcile pass of each proxy, and a wake-up when one ends.
    pub passes: Mutex<BTreeMap<String, PassOutcome>>,
    pub pass_done: tokio::sync::Notify,
    pub record: Arc<RecordStore>,
    /// Proxies with a reconcile running now, and what it is doing.
    pub busy: Mutex<BTreeMap<String, String>>,
    /// Proxy → the generation whose live update failed.
    pub rejected: Mutex<BTreeMap<String, Failed>>,
    pub triggers: mpsc::UnboundedSender<Trigger>,
    /// Who follows the passes' progress events.
    pub watchers: Arc<Watchers>,
    /// The liveness watcher's latest verdict of each replica, by container name.
    pub liveness: liveness::Views,
}

impl Shared {
    /// How the host is treated: the config's `tune_host`.
    pub fn host_policy(&self) -> HostPolicy {
        HostPolicy {
            tune: self.tune_host.load(std::sync::atomic::Ordering::Relaxed),
            force_memory: false,
        }
    }

    /// The record, for hooks that outlive a borrow of `self`.
    pub fn record_handle(&self) -> Arc<RecordStore> {
        self.record.clone()
    }

    pub fn trigger(&self, t: Trigger) {
        let source = t.source();
        self.metrics.inc(
            "berth_triggers_total",
            "Reconcile triggers received, by source.",
            &[("source", source)],
        );
        let _ = self.triggers.send(t);
    }

    /// Merges the config's and Envoy Gateway's targets into the desired set, giving changed
    /// proxies a new generation. `bump` names a proxy a remote request changed: its epoch is
    /// bumped under the same lock. Returns whether any generation changed, and `bump`'s epoch.
    pub fn publish(&self, bump: Option<&str>) -> (bool, u64) {
        let mut targets = self
            .config_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (name, m) in self.remote.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            targets.insert(name.clone(), m.target.clone());
        }
        tags::pin(
            &self.image_pins.lock().unwrap_or_else(|e| e.into_inner()),
            targets.values_mut(),
        );
        let list: Vec<Target> = targets.values().cloned().collect();
        let generations = self.update_record(|rec| rec.accept(&list));
        for (name, g) in &generations {
            self.metrics.set(
                "berth_proxy_generation",
                "The generation of each proxy's desired state.",
                &[("proxy", name)],
                *g as f64,
            );
        }
        let mut d = self.desired.lock().unwrap_or_else(|e| e.into_inner());
        let changed = d.generations != generations;
        d.targets = targets;
        d.generations = generations;
        let epoch = match bump {
            Some(name) => {
                let e = d.epochs.entry(name.to_string()).or_default();
                *e += 1;
                *e
            }
            None => 0,
        };
        (changed, epoch)
    }

    /// Records how a reconcile pass of `name` ended and wakes the requests waiting on it.
    pub fn pass_ended(&self, name: &str, outcome: PassOutcome) {
        self.passes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), outcome);
        self.pass_done.notify_waiters();
    }

    /// Waits until a reconcile pass of `name` that read epoch `epoch` or later has ended.
    pub async fn wait_pass(
        &self,
        name: &str,
        epoch: u64,
        cancel: &CancellationToken,
    ) -> Option<(String, bool)> {
        match self.wait_outcome(name, epoch, cancel).await {
            Some(o) => o.error,
            None => Some((
                "berth serve is shutting down; the next serve completes the change".into(),
                true,
            )),
        }
    }

    /// Bumps the epoch of every proxy of `names` and hands the progress events of the passes
    /// that read the new epochs (or later) to `events`, until [`Shared::unwatch`]. Returns the
    /// epochs to wait for ([`Shared::wait_outcome`]) and the watcher's id.
    pub fn watch(
        &self,
        names: &[String],
        events: mpsc::UnboundedSender<crate::core::progress::Event>,
    ) -> (BTreeMap<String, u64>, u64) {
        // Under the lock a pass reads its epoch with: no pass can read the new epoch before
        // the watcher is in place.
        let mut d = self.desired.lock().unwrap_or_else(|e| e.into_inner());
        let epochs: BTreeMap<String, u64> = names
            .iter()
            .map(|name| {
                let e = d.epochs.entry(name.clone()).or_default();
                *e += 1;
                (name.clone(), *e)
            })
            .collect();
        let id = self.watchers.add(epochs.clone(), events);
        drop(d);
        (epochs, id)
    }

    pub fn unwatch(&self, id: u64) {
        self.watchers.remove(id);
    }

    /// Waits until a reconcile pass of `name` that read epoch `epoch` or later has ended, and
    /// says how; None when serve is stopping first.
    pub async fn wait_outcome(
        &self,
        name: &str,
        epoch: u64,
        cancel: &CancellationToken,
    ) -> Option<PassOutcome> {
        loop {
            let notified = self.pass_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(o) = self
                .passes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                .filter(|o| o.epoch >= epoch)
            {
                return Some(o.clone());
            }
            tokio::select! {
                _ = notified => {}
                _ = cancel.cancelled() => return None,
            }
        }
    }

    /// Changes the persisted record and writes it.
    pub fn update_record<R>(&self, f: impl FnOnce(&mut Record) -> R) -> R {
        self.record.update(f)
    }

    /// Re-reads and renders the config. On success the new targets replace the desired ones
    /// and changed proxies get a new generation; on failure the last good config stays and the
    /// errors are recorded (Accepted=False, InvalidParameters).
    pub fn reload(&self) -> Result<bool> {
        let loaded = load(&self.opts, &self.state).and_then(|(config, targets)| {
            let remote = self.remote.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = targets.iter().find(|t| remote.contains_key(t.name())) {
                anyhow::bail!(
                    "{}: proxy {:?} is managed by Envoy Gateway (remote infrastructure, {}); rename the proxy in the config or delete the Gateway",
                    config.path.display(),
                    t.name(),
                    eg_proxies::persisted_path(&self.state, t.name()).display()
                );
            }
            Ok((config.tune_host, targets))
        });
        match loaded {
            Ok((tune_host, targets)) => {
                self.tune_host
                    .store(tune_host, std::sync::atomic::Ordering::Relaxed);
                self.update_record(|rec| {
                    rec.config = status::ConfigRecord {
                        file: self.opts.config.clone(),
                        accepted: true,
                        errors: Vec::new(),
                        loaded_at: status::now(),
                    };
                });
                *self
                    .config_targets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = targets
                    .into_iter()
                    .map(|t| (t.name().to_string(), t))
                    .collect();
                let changed = self.publish(None).0;
                self.metrics.inc(
                    "berth_config_loads_total",
                    "Config file loads, by result.",
                    &[("result", "accepted")],
                );
                Ok(changed)
            }
            Err(e) => {
                let errors: Vec<String> = match e.downcast_ref::<file::ConfigErrors>() {
                    Some(errs) => errs.0.iter().map(|x| x.to_string()).collect(),
                    None => vec![format!("{e:#}")],
                };
                self.update_record(|rec| {
                    rec.config.file = self.opts.config.clone();
                    rec.config.accepted = false;
                    rec.config.errors = errors.clone();
                    rec.config.loaded_at = status::now();
                    rec.refuse(&errors);
                });
                self.metrics.inc(
                    "berth_config_loads_total",
                    "Config file loads, by result.",
                    &[("result", "invalid")],
                );
                Err(e)
            }
        }
    }
}

/// Creates a proxy's directory in the state directory (mode 0755, as `StateDir` makes them).
pub(crate) fn create_proxy_dir(state: &StateDir, name: &str) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = state.proxy(name).root().to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// The renderer serve uses (built-in templates, or the overrides directory).
pub(crate) fn renderer(opts: &Options) -> Result<Renderer> {
    match &opts.templates {
        Some(dir) => Renderer::with_overrides(dir),
        None => Ok(Renderer::builtin()),
    }
}

/// Loads and renders the config against the state directory.
fn load(opts: &Options, state: &StateDir) -> Result<(Config, Vec<Target>)> {
    let config = file::load(&opts.config)?;
    for note in &config.notes {
        log(opts.mode, &format!("note: {note}"));
    }
    let targets = target::targets(
        &config.infra,
        &renderer(opts)?,
        state.root(),
        target::host_cpus(),
        crate::ops::acme::Placeholders::Write,
    )?;
    Ok((config, targets))
}

/// Takes the state directory's lock for serve. Another serve holding it is an error (two
/// managers of one state directory is a mistake to fix, not to wait out); an `up` or `down`
/// holding it is waited for, said once.
async fn take_lock(root: &std::path::Path, mode: Mode) -> Result<crate::state::lock::StateLock> {
    use crate::state::lock::{Attempt, Role, StateLock};
    let mut said = false;
    loop {
        match StateLock::try_acquire(root, Role::Serve)? {
            Attempt::Locked(lock) => return Ok(lock),
            Attempt::Held(Some(h)) if h.role == Role::Serve => anyhow::bail!(
                "{h} already manages the state directory {}; stop it first (one serve per state directory)",
                root.display()
            ),
            Attempt::Held(h) => {
                if !said {
                    log(mode, &crate::edges::control::waiting_message(root, h.as_ref()));
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// A line on stderr (unless quiet) and in the tracing log.
pub(crate) fn log(mode: Mode, line: &str) {
    tracing::info!("{line}");
    if mode != Mode::Quiet {
        eprintln!("serve: {line}");
    }
}

type Component = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

/// Runs `berth serve` until SIGTERM/SIGINT (Ok) or a component fails (Err). A config that is
/// invalid at startup is an error (exit 2): there is no last good config to keep.
pub async fn run(opts: Options) -> Result<()> {
    let first = file::load(&opts.config)?;
    let state_path = opts
        .state_dir
        .clone()
        .or(first.state_dir.clone())
        .unwrap_or_else(default_state_dir);
    // Absolute: it is a bind-mount source and a container label.
    let state_path = std::path::absolute(&state_path).unwrap_or(state_path);
    let settings = opts.flags.over(&first.serve);
    // One writer per state directory: held until serve returns.
    let mut lock = take_lock(&state_path, opts.mode).await?;
    let state = StateDir::open(&state_path)?;
    let ops = Operations::new(
        crate::infra::connect(
            first.engine,
            &first.swarm,
            state.clone(),
            opts.extra_labels.clone(),
            Caller::Serve,
        )
        .await?,
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        record: Arc::new(RecordStore {
            record: Mutex::new(Record::load(&state)),
            state: state.clone(),
            mode: opts.mode,
        }),
        opts: opts.clone(),
        settings: settings.clone(),
        ops,
        tune_host: std::sync::atomic::AtomicBool::new(first.tune_host),
        state,
        metrics: Arc::new(Metrics::new()),
        desired: Mutex::new(Desired::default()),
        config_targets: Mutex::new(BTreeMap::new()),
        image_pins: Mutex::new(BTreeMap::new()),
        remote: Mutex::new(BTreeMap::new()),
        passes: Mutex::new(BTreeMap::new()),
        pass_done: tokio::sync::Notify::new(),
        busy: Mutex::new(BTreeMap::new()),
        rejected: Mutex::new(BTreeMap::new()),
        triggers: tx,
        watchers: Arc::default(),
        liveness: Arc::default(),
    });
    // Proxies Envoy Gateway asked an earlier serve for are desired before the first reconcile
    // (else they would look like leftovers and be removed).
    let xds = first.envoy_gateway.as_ref().map(|g| g.xds.clone());
    eg_proxies::restore(&shared, xds.as_ref())?;
    shared.reload()?;
    // Pull policy "always": ask the registries before the first pass, as `up` would.
    tags::check(&shared, tags::Which::All).await;
    let remote_listen = match &opts.remote {
        RemoteFlag::Off => None,
        RemoteFlag::At(l) => Some(l.clone()),
        RemoteFlag::FromConfig => first.envoy_gateway.as_ref().and_then(|g| g.remote.clone()),
    };
    let remote_bound = match &remote_listen {
        None => None,
        Some(listen) => {
            let Some(xds) = xds.clone() else {
                anyhow::bail!(
                    "the remote infrastructure service ({listen}) needs Envoy Gateway's xDS settings: add [envoy_gateway] with xds_address, ca_file, cert_file and key_file to {}",
                    opts.config.display()
                );
            };
            let security = first
                .envoy_gateway
                .as_ref()
                .map(|g| g.remote_security.clone())
                .unwrap_or_default();
            Some((
                crate::edges::eg_provider::bind(listen, &security).await?,
                xds,
                listen.clone(),
            ))
        }
    };
    // Every proxy's state directory exists before its first reconcile.
    let names: Vec<String> = shared
        .desired
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .targets
        .keys()
        .cloned()
        .collect();
    for name in names {
        create_proxy_dir(&shared.state, &name)?;
    }
    // After a reboot the kernel settings replicas depend on are gone while Docker has already
    // restarted the replicas: put them back before anything else.
    let fleet: Vec<Target> = shared
        .desired
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .targets
        .values()
        .cloned()
        .collect();
    match shared.ops.prepare_host(&fleet, shared.host_policy()).await {
        Ok(prep) => {
            for line in &prep.notes {
                log(opts.mode, line);
            }
            for (_, warning) in &prep.degraded {
                log(opts.mode, &format!("warning: {warning}"));
            }
        }
        // Reported per proxy (Degraded) by its first pass, which prepares again.
        Err(e) => log(
            opts.mode,
            &format!("the host is not ready for the fleet: {e}"),
        ),
    }
    let cancel = CancellationToken::new();

    // Bind before anything runs, so a port in use fails at once.
    let api_socket = crate::edges::control::socket_path(shared.state.root());
    let api_listener = crate::edges::control::bind(&api_socket)?;
    let listener = match settings.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("the status server cannot listen on {addr}"))?,
        ),
        None => None,
    };

    let mut components: Vec<(&'static str, Component)> = vec![
        (
            "signals",
            Box::pin(signals::run(shared.clone(), cancel.clone())),
        ),
        (
            "reconciler",
            Box::pin({
                let (shared, cancel) = (shared.clone(), cancel.clone());
                async move {
                    let requeue = shared.triggers.clone();
                    let owned = {
                        let shared = shared.clone();
                        move || reconciler::owned(&shared)
                    };
                    scheduler::run(rx, requeue, cancel, owned, move |name, cancel| {
                        let shared = shared.clone();
                        async move { reconciler::pass(&shared, &name, &cancel).await }
                    })
                    .await;
                    Ok(())
                }
            }),
        ),
    ];
    if settings.watch {
        components.push((
            "config watcher",
            Box::pin(config::run(shared.clone(), cancel.clone())),
        ));
    }
    if settings.engine_events {
        components.push((
            "docker events",
            Box::pin(events::run(shared.clone(), cancel.clone())),
        ));
    }
    if settings.liveness {
        components.push((
            "liveness",
            Box::pin(liveness::run(shared.clone(), cancel.clone())),
        ));
    }
    if settings.acme {
        components.push((
            "acme renewal",
            Box::pin(acme::run(shared.clone(), cancel.clone())),
        ));
    }
    if let Some(every) = settings.resync {
        components.push((
            "resync",
            Box::pin(resync::run(shared.clone(), every, cancel.clone())),
        ));
    }
    if let Some(listener) = listener {
        log(
            opts.mode,
            &format!(
                "status on http://{}/status, metrics on /metrics",
                listener.local_addr()?
            ),
        );
        components.push((
            "status server",
            Box::pin(server::run(shared.clone(), listener, cancel.clone())),
        ));
    }
    if let Some((bound, xds, listen)) = remote_bound {
        log(
            opts.mode,
            &format!("Envoy Gateway remote infrastructure on {listen}"),
        );
        let provider = Arc::new(eg_proxies::Provider::new(shared.clone(), cancel.clone()));
        let stop = cancel.clone();
        components.push((
            "remote infrastructure",
            Box::pin(async move {
                bound
                    .serve(provider, xds, async move { stop.cancelled().await })
                    .await
            }),
        ));
    }
    components.push((
        "local API",
        Box::pin({
            let api = Arc::new(api::Api::new(shared.clone(), cancel.clone()));
            crate::edges::control::serve(api_listener, api, cancel.clone())
        }),
    ));
    // `berth up` finds serve's API here and hands its requests over from now on.
    lock.advertise_api(&api_socket)?;
    log(
        opts.mode,
        &format!(
            "managing {} proxies from {} (state {})",
            shared
                .desired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .targets
                .len(),
            opts.config.display(),
            shared.state.root().display()
        ),
    );
    shared.trigger(Trigger::All("startup"));

    // The run group: the first component to return cancels all the others.
    let mut set = tokio::task::JoinSet::new();
    for (name, fut) in components {
        let cancel = cancel.clone();
        set.spawn(async move {
            let r = fut.await;
            cancel.cancel();
            (name, r)
        });
    }
    let mut first_error: Option<anyhow::Error> = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((_, Ok(()))) => {}
            Ok((name, Err(e))) => {
                log(opts.mode, &format!("{name} failed: {e:#}"));
                first_error.get_or_insert(e.context(format!("serve: {name} failed")));
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("serve: a component panicked: {e}"));
                cancel.cancel();
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            log(opts.mode, "stopped; the proxies keep running");
            Ok(())
        }
    }
}
