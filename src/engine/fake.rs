//! An in-memory [`ContainerEngine`] whose containers run a scripted "Envoy" that answers the
//! admin calls berth makes ([`AdminApi`]), so the executor and serve's scheduler are unit-tested
//! without a daemon, on tokio's clock (pause it, and a 30 s startup deadline passes at once).
//!
//! Each image has a [`Behavior`]: how long its Envoy takes to become LIVE, which ports it binds,
//! whether it exits at start, what `envoy --mode validate` says, how many connections it holds
//! until drained. Every operation is appended to [`FakeEngine::history`], so tests assert order
//! ("every replica was draining before any was removed") instead of timing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail};
use async_trait::async_trait;
use futures_util::StreamExt;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{
    ContainerEngine, ContainerEvent, ContainerInfo, ContainerStatus, EngineError, EngineResult,
    Events, Exited, ImageBuild, LabelFilter, LiveSettings, ObservedContainer, OneShot,
    ReplicaContainer, RunState,
};
use crate::core::layout;
use crate::envoy::admin::{AdminApi, AdminConnector, BoundListener, ReadyState};

/// How a fake image's Envoy behaves.
#[derive(Debug, Clone)]
pub struct Behavior {
    /// From start to LIVE.
    pub live_after: Duration,
    /// Ports bound once LIVE.
    pub binds: Vec<u16>,
    /// Exits this long after start, with this code and log line (Docker then restarts it).
    pub exits_after: Option<(Duration, i64, String)>,
    /// `envoy --mode validate`: None accepts; Some(output) rejects with exit code 1.
    pub rejects: Option<String>,
    /// Downstream connections open until the replica is drained.
    pub connections: u64,
    /// How long connections take to go after a graceful drain starts.
    pub drains_in: Duration,
}

impl Behavior {
    /// LIVE after 1 s, bound on `ports`, never exits, accepted by validation.
    pub fn healthy(ports: &[u16]) -> Behavior {
        Behavior {
            live_after: Duration::from_secs(1),
            binds: ports.to_vec(),
            exits_after: None,
            rejects: None,
            connections: 2,
            drains_in: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Clone)]
struct Image {
    id: String,
    behavior: Behavior,
    entrypoint: Vec<String>,
}

#[derive(Debug, Clone)]
struct Container {
    id: String,
    spec: ReplicaContainer,
    live_name: String,
    state: RunState,
    started: Option<Instant>,
    exit_code: i64,
    restarts: i64,
    health_failed: bool,
    drain_started: Option<Instant>,
    listeners_closed: bool,
    log: Vec<String>,
    memory: Option<i64>,
    /// Its Envoy answers nothing (a wedged process the engine still shows running).
    hung: bool,
}

#[derive(Default)]
struct World {
    next: u64,
    images: BTreeMap<String, Image>,
    containers: BTreeMap<String, Container>,
    history: Vec<String>,
    /// Operations that fail once: (operation prefix, error message).
    failures: Vec<(String, String)>,
    /// What a registry holds: [`FakeEngine::push`]ed images, pulled by `pull`.
    registry: BTreeMap<String, Image>,
    /// Every `pull` fails so while set ([`FakeEngine::fail_pulls`]).
    pull_failure: Option<crate::engine::PullFailure>,
    /// Host processes and the container each runs in ([`FakeEngine::place_process`]).
    processes: BTreeMap<u32, String>,
}

/// The in-memory engine. Share it as `Arc<FakeEngine>`: it is also the [`AdminConnector`] of
/// its containers' Envoys.
pub struct FakeEngine {
    world: Mutex<World>,
    events: broadcast::Sender<ContainerEvent>,
    calls: AtomicU64,
    /// `/ready` asked of any container's Envoy.
    ready_asks: AtomicU64,
}

impl Default for FakeEngine {
    fn default() -> Self {
        FakeEngine {
            world: Mutex::new(World::default()),
            events: broadcast::channel(1024).0,
            calls: AtomicU64::new(0),
            ready_asks: AtomicU64::new(0),
        }
    }
}

/// A container as a test sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub id: String,
    pub name: String,
    pub image: String,
    pub state: RunState,
    pub labels: BTreeMap<String, String>,
}

impl FakeEngine {
    pub fn new() -> Arc<FakeEngine> {
        Arc::new(FakeEngine::default())
    }

    /// Makes `image` present with `behavior`.
    pub fn add_image(&self, image: &str, behavior: Behavior) {
        let mut w = self.lock();
        w.next += 1;
        let id = format!("sha256:{:064x}", w.next);
        w.images.insert(
            image.to_string(),
            Image {
                id,
                behavior,
                entrypoint: vec!["/usr/local/bin/envoy".to_string()],
            },
        );
    }

    /// Puts a new image under `image` in the fake registry (a tag moved there); the local
    /// image stays until a `pull`. Returns the new image's ID.
    pub fn push(&self, image: &str, behavior: Behavior) -> String {
        let mut w = self.lock();
        w.next += 1;
        let id = format!("sha256:{:064x}", w.next);
        w.registry.insert(
            image.to_string(),
            Image {
                id: id.clone(),
                behavior,
                entrypoint: vec!["/usr/local/bin/envoy".to_string()],
            },
        );
        id
    }

    /// Every `pull` fails with `failure` until called with None.
    pub fn fail_pulls(&self, failure: Option<crate::engine::PullFailure>) {
        self.lock().pull_failure = failure;
    }

    /// The next operation whose description starts with `operation` (e.g. "start",
    /// "create berth-edge-1") fails once with `message`.
    pub fn fail_once(&self, operation: &str, message: &str) {
        self.lock()
            .failures
            .push((operation.to_string(), message.to_string()));
    }

    /// Every operation so far, e.g. "create berth-edge-0-1a2b3c4d", "drain berth-edge-0-…",
    /// "remove berth-edge-0-…".
    pub fn history(&self) -> Vec<String> {
        self.lock().history.clone()
    }

    /// How often any container's Envoy was asked for `/ready`.
    pub fn ready_asks(&self) -> u64 {
        self.ready_asks.load(Ordering::Relaxed)
    }

    /// Every container, as created.
    pub fn containers(&self) -> Vec<Seen> {
        let mut w = self.lock();
        let ids: Vec<String> = w.containers.keys().cloned().collect();
        ids.iter()
            .filter_map(|id| {
                let c = advance(&mut w, id)?;
                Some(Seen {
                    id: c.id.clone(),
                    name: c.live_name.clone(),
                    image: c.spec.image.clone(),
                    state: c.state,
                    labels: c.spec.labels.clone(),
                })
            })
            .collect()
    }

    /// Kills a container as `docker kill` would (it stays, exited, with code 137).
    pub fn kill(&self, id: &str) {
        let mut w = self.lock();
        if let Some(c) = w.containers.get_mut(id) {
            c.state = RunState::Exited;
            c.exit_code = 137;
            c.started = None;
        }
        w.history.push(format!("kill {id}"));
    }

    /// Says host process `pid` runs in container `id` (what its cgroup would tell).
    pub fn place_process(&self, pid: u32, id: &str) {
        self.lock().processes.insert(pid, id.to_string());
    }

    /// Its Envoy stops answering while the engine still shows it running (a wedged process).
    pub fn hang(&self, id: &str) {
        if let Some(c) = self.lock().containers.get_mut(id) {
            c.hung = true;
        }
    }

    /// Freezes a container as `docker pause` would.
    pub fn pause(&self, id: &str) {
        let mut w = self.lock();
        if let Some(c) = w.containers.get_mut(id) {
            c.state = RunState::Paused;
        }
        w.history.push(format!("pause {id}"));
    }

    /// Changes a container's memory limit as `docker update` would.
    pub fn update_memory(&self, id: &str, memory: Option<i64>) {
        if let Some(c) = self.lock().containers.get_mut(id) {
            c.memory = memory;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Records `op`, failing it when a failure was scripted for it.
    fn step(&self, w: &mut World, op: String) -> EngineResult<()> {
        if let Some(i) = w.failures.iter().position(|(p, _)| op.starts_with(p)) {
            let (_, message) = w.failures.remove(i);
            w.history.push(format!("{op} (failed)"));
            return Err(EngineError::Refused {
                engine: self.describe(),
                operation: op,
                status: 500,
                message,
            });
        }
        w.history.push(op);
        Ok(())
    }

    fn emit(&self, action: &str, c: &Container) {
        let _ = self.events.send(ContainerEvent {
            action: action.to_string(),
            id: c.id.clone(),
            labels: c.spec.labels.clone(),
            name: Some(c.live_name.clone()),
        });
    }

    /// The container whose admin socket is at `socket`.
    fn by_socket(&self, socket: &Path) -> Option<String> {
        let w = self.lock();
        w.containers
            .values()
            .find(|c| {
                c.spec.mounts.iter().any(|m| {
                    m.target == layout::CONTAINER_RUN_DIR
                        && m.source.join(layout::ADMIN_SOCKET_FILE) == socket
                })
            })
            .map(|c| c.id.clone())
    }
}

fn behavior_of(w: &World, image: &str) -> Behavior {
    w.images
        .get(image)
        .or_else(|| w.images.values().find(|i| i.id == image))
        .or_else(|| w.registry.values().find(|i| i.id == image))
        .map(|i| i.behavior.clone())
        .unwrap_or_else(|| Behavior::healthy(&[]))
}

/// Applies what time did to a container and returns it. An Envoy that exits is restarted by
/// its policy and exits again: it stays `restarting` (a crash loop).
fn advance<'a>(w: &'a mut World, id: &str) -> Option<&'a Container> {
    let behavior = behavior_of(w, &w.containers.get(id)?.spec.image);
    let c = w.containers.get_mut(id)?;
    if let (RunState::Running, Some(started), Some((after, code, line))) =
        (c.state, c.started, &behavior.exits_after)
    {
        if started.elapsed() >= *after {
            c.log.push(line.clone());
            c.exit_code = *code;
            c.restarts += 1;
            c.state = RunState::Restarting;
            c.started = None;
        }
    }
    Some(c)
}

#[async_trait]
impl ContainerEngine for FakeEngine {
    fn describe(&self) -> String {
        "the fake engine".to_string()
    }

    fn api_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    async fn ping(&self) -> bool {
        self.count();
        true
    }

    fn container_of_process(&self, pid: u32) -> Option<String> {
        self.lock().processes.get(&pid).cloned()
    }

    /// The fake has no event log: it vouches for a container the cache knew whose
    /// incarnation (state, settings, restarts, start) is unchanged, as Docker's "no event
    /// since" would.
    async fn observe_cached(
        &self,
        filter: &LabelFilter,
        cache: &mut super::ObservationCache,
    ) -> EngineResult<Vec<ObservedContainer>> {
        let found = self.observe(filter).await?;
        let values = filter.engine_values();
        let now: BTreeMap<String, super::Inspected> = {
            let w = self.lock();
            found
                .iter()
                .map(|c| {
                    let incarnation = w
                        .containers
                        .get(&c.id)
                        .map(|x| format!("{} {:?}", x.restarts, x.started));
                    (
                        c.id.clone(),
                        super::Inspected {
                            live: c.live.clone(),
                            state: Some(c.state),
                            pid: None,
                            started_at: incarnation,
                        },
                    )
                })
                .collect()
        };
        cache.vouched = if cache.filter == values {
            now.iter()
                .filter(|(id, i)| cache.inspected.get(*id) == Some(*i))
                .map(|(id, _)| id.clone())
                .collect()
        } else {
            Default::default()
        };
        cache.filter = values;
        cache.witness = None;
        cache.inspected = now;
        Ok(found)
    }

    async fn observe(&self, filter: &LabelFilter) -> EngineResult<Vec<ObservedContainer>> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, "observe".into())?;
        let ids: Vec<String> = w.containers.keys().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(c) = advance(&mut w, &id) else {
                continue;
            };
            if !filter.matches(&c.spec.labels) {
                continue;
            }
            out.push(ObservedContainer {
                id: c.id.clone(),
                name: c.live_name.clone(),
                labels: c.spec.labels.clone(),
                state: c.state,
                live: LiveSettings {
                    nano_cpus: c.spec.nano_cpus,
                    memory: c.memory,
                    restart_policy: c.spec.restart_policy.clone(),
                },
                info: ContainerInfo {
                    image: c.spec.image.clone(),
                    pid: None,
                    started_at: None,
                },
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn status(&self, id: &str) -> EngineResult<Option<ContainerStatus>> {
        self.count();
        let mut w = self.lock();
        Ok(advance(&mut w, id).map(|c| ContainerStatus {
            state: c.state,
            exit_code: Some(c.exit_code),
            pid: None,
            oom_killed: false,
            restart_count: Some(c.restarts),
            started_at: None,
            error: None,
        }))
    }

    async fn image_id(&self, image: &str) -> EngineResult<Option<String>> {
        self.count();
        Ok(self.lock().images.get(image).map(|i| i.id.clone()))
    }

    async fn ensure_image(&self, image: &str, _progress: bool) -> EngineResult<String> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, format!("pull {image}"))?;
        w.images
            .get(image)
            .map(|i| i.id.clone())
            .ok_or_else(|| EngineError::ImageUnavailable {
                image: image.to_string(),
                message: "no such image in the fake engine".into(),
                hint: String::new(),
            })
    }

    /// The fake's "registry" is [`FakeEngine::push`]: a pull makes the pushed image the local
    /// one; a failure set with [`FakeEngine::fail_pulls`] is returned instead.
    async fn pull(&self, image: &str, _progress: bool) -> EngineResult<String> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, format!("registry pull {image}"))?;
        if let Some(failure) = w.pull_failure {
            return Err(EngineError::Pull(crate::engine::PullError {
                image: image.to_string(),
                registry: crate::engine::credentials::registry_of(image).to_string(),
                failure,
                detail: "the fake registry fails as told".into(),
                with_credentials: false,
                hint: String::new(),
            }));
        }
        if let Some(pushed) = w.registry.get(image).cloned() {
            // The image the tag named before stays, by its ID (containers still use it).
            if let Some(before) = w.images.insert(image.to_string(), pushed) {
                w.images.insert(before.id.clone(), before);
            }
        }
        w.images.get(image).map(|i| i.id.clone()).ok_or_else(|| {
            EngineError::Pull(crate::engine::PullError {
                image: image.to_string(),
                registry: crate::engine::credentials::registry_of(image).to_string(),
                failure: crate::engine::PullFailure::NotFound,
                detail: "manifest unknown (fake registry)".into(),
                with_credentials: false,
                hint: String::new(),
            })
        })
    }

    async fn tag_image(&self, image: &str, target: &str) -> EngineResult<()> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, format!("tag {image} {target}"))?;
        let found = w
            .images
            .get(image)
            .or_else(|| w.images.values().find(|i| i.id == image))
            .cloned()
            .ok_or_else(|| EngineError::Refused {
                engine: "fake engine".into(),
                operation: format!("tag image {image} as {target}"),
                status: 404,
                message: format!("No such image: {image}"),
            })?;
        w.images.insert(target.to_string(), found);
        Ok(())
    }

    /// Puts the local image into the fake's registry ([`FakeEngine::push`]'s) under its name
    /// and under its digest reference, which it returns.
    async fn push_image(&self, image: &str, _progress: bool) -> EngineResult<String> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, format!("push {image}"))?;
        let found = w
            .images
            .get(image)
            .cloned()
            .ok_or_else(|| EngineError::Refused {
                engine: "fake engine".into(),
                operation: format!("push image {image}"),
                status: 404,
                message: format!("An image does not exist locally with the tag: {image}"),
            })?;
        let (repo, _) = crate::engine::docker::split_image(image);
        let digest = format!(
            "{repo}@sha256:{}",
            crate::core::replica::sha256_hex(found.id.as_bytes())
        );
        w.registry.insert(image.to_string(), found.clone());
        w.registry.insert(digest.clone(), found.clone());
        w.images.insert(digest.clone(), found);
        Ok(digest)
    }

    async fn image_entrypoint(&self, image: &str) -> EngineResult<Option<Vec<String>>> {
        self.count();
        Ok(self.lock().images.get(image).map(|i| i.entrypoint.clone()))
    }

    /// Reads the context's Dockerfile: the image built behaves as its FROM image, which must
    /// be present; the ENTRYPOINT line (JSON form) becomes its entrypoint.
    async fn build_image(&self, build: &ImageBuild, _progress: bool) -> EngineResult<String> {
        self.count();
        let refuse = |message: String| EngineError::Refused {
            engine: self.describe(),
            operation: format!("build image {}", build.tag),
            status: 0,
            message,
        };
        let dockerfile = dockerfile_of(&build.context).map_err(|e| refuse(format!("{e:#}")))?;
        let mut w = self.lock();
        self.step(&mut w, format!("build {}", build.tag))?;
        let from = dockerfile
            .lines()
            .find_map(|l| l.strip_prefix("FROM "))
            .ok_or_else(|| refuse("the Dockerfile has no FROM".into()))?
            .trim();
        let base = w
            .images
            .get(from)
            .or_else(|| w.images.values().find(|i| i.id == from))
            .cloned()
            .ok_or_else(|| refuse(format!("pull access denied for {from}")))?;
        let entrypoint = dockerfile
            .lines()
            .find_map(|l| l.strip_prefix("ENTRYPOINT "))
            .map(|json| serde_json::from_str(json).map_err(|e| refuse(e.to_string())))
            .transpose()?
            .unwrap_or(base.entrypoint);
        w.next += 1;
        let id = format!("sha256:{:064x}", w.next);
        w.images.insert(
            build.tag.clone(),
            Image {
                id: id.clone(),
                behavior: base.behavior,
                entrypoint,
            },
        );
        Ok(id)
    }

    async fn create(&self, spec: &ReplicaContainer) -> EngineResult<String> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, format!("create {}", spec.name))?;
        if w.containers.values().any(|c| c.live_name == spec.name) {
            return Err(EngineError::Refused {
                engine: self.describe(),
                operation: format!("create container {}", spec.name),
                status: 409,
                message: format!("the container name \"/{}\" is already in use", spec.name),
            });
        }
        w.next += 1;
        let id = format!("{:012x}{:052x}", w.next, 0);
        let c = Container {
            id: id.clone(),
            live_name: spec.name.clone(),
            spec: spec.clone(),
            state: RunState::Created,
            started: None,
            exit_code: 0,
            restarts: 0,
            health_failed: false,
            drain_started: None,
            listeners_closed: false,
            log: vec!["[info] starting main dispatch loop".into()],
            memory: spec.memory,
            hung: false,
        };
        self.emit("create", &c);
        w.containers.insert(id.clone(), c);
        Ok(id)
    }

    async fn start(&self, id: &str) -> EngineResult<()> {
        self.count();
        let mut w = self.lock();
        let name = w
            .containers
            .get(id)
            .map(|c| c.live_name.clone())
            .ok_or_else(|| not_found(id))?;
        self.step(&mut w, format!("start {name}"))?;
        let c = w.containers.get_mut(id).expect("looked up above");
        if c.state != RunState::Running {
            c.state = RunState::Running;
            c.started = Some(Instant::now());
        }
        let c = c.clone();
        self.emit("start", &c);
        Ok(())
    }

    async fn stop(&self, id: &str, _timeout: Duration) -> EngineResult<()> {
        self.count();
        let mut w = self.lock();
        let Some(name) = w.containers.get(id).map(|c| c.live_name.clone()) else {
            return Err(not_found(id));
        };
        self.step(&mut w, format!("stop {name}"))?;
        let c = w.containers.get_mut(id).expect("looked up above");
        c.state = RunState::Exited;
        c.started = None;
        let c = c.clone();
        self.emit("die", &c);
        Ok(())
    }

    async fn kill(&self, id: &str) -> EngineResult<()> {
        self.count();
        let mut w = self.lock();
        let Some(name) = w.containers.get(id).map(|c| c.live_name.clone()) else {
            return Ok(());
        };
        self.step(&mut w, format!("sigkill {name}"))?;
        if let Some(c) = w.containers.get_mut(id) {
            if matches!(c.state, RunState::Running | RunState::Paused) {
                c.state = RunState::Exited;
                c.exit_code = 137;
                c.started = None;
                // The next start is a new process: it answers.
                c.hung = false;
                let c = c.clone();
                self.emit("die", &c);
            }
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> EngineResult<()> {
        self.count();
        let mut w = self.lock();
        let Some(name) = w.containers.get(id).map(|c| c.live_name.clone()) else {
            return Ok(());
        };
        self.step(&mut w, format!("remove {name}"))?;
        if let Some(c) = w.containers.remove(id) {
            self.emit("destroy", &c);
        }
        Ok(())
    }

    async fn logs(&self, id: &str, tail: Option<usize>) -> EngineResult<String> {
        self.count();
        let mut w = self.lock();
        let c = advance(&mut w, id).ok_or_else(|| not_found(id))?;
        let skip = tail.map_or(0, |n| c.log.len().saturating_sub(n));
        Ok(c.log[skip..].iter().map(|l| format!("{l}\n")).collect())
    }

    async fn run_to_completion(&self, job: &OneShot) -> EngineResult<Exited> {
        self.count();
        let mut w = self.lock();
        self.step(&mut w, format!("validate {}", job.image))?;
        if !w.images.contains_key(&job.image) {
            return Err(EngineError::ImageUnavailable {
                image: job.image.clone(),
                message: "no such image in the fake engine".into(),
                hint: String::new(),
            });
        }
        Ok(match behavior_of(&w, &job.image).rejects {
            None => Exited {
                code: 0,
                output: "configuration '/etc/envoy/bootstrap.yaml' OK\n".into(),
            },
            Some(output) => Exited { code: 1, output },
        })
    }

    fn events(&self, filter: &LabelFilter) -> Events {
        let filter = filter.clone();
        tokio_stream_of(self.events.subscribe())
            .filter(move |e| {
                let keep = match e {
                    Ok(e) => filter.matches(&e.labels),
                    Err(_) => true,
                };
                async move { keep }
            })
            .boxed()
    }
}

fn tokio_stream_of(
    rx: broadcast::Receiver<ContainerEvent>,
) -> impl futures_util::Stream<Item = EngineResult<ContainerEvent>> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(e) => return Some((Ok(e), rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

fn not_found(id: &str) -> EngineError {
    EngineError::Refused {
        engine: "the fake engine".into(),
        operation: format!("find container {id}"),
        status: 404,
        message: format!("No such container: {id}"),
    }
}

/// The admin API of one fake container's Envoy.
struct FakeAdmin {
    engine: Arc<FakeEngine>,
    socket: PathBuf,
}

impl FakeAdmin {
    /// The running container behind the socket, with time applied, and its behavior.
    fn with<R>(&self, f: impl FnOnce(&mut Container, &Behavior) -> R) -> anyhow::Result<R> {
        let id = self
            .engine
            .by_socket(&self.socket)
            .ok_or_else(|| anyhow!("{}: no such socket", self.socket.display()))?;
        let mut w = self.engine.lock();
        advance(&mut w, &id);
        let behavior = behavior_of(&w, &w.containers[&id].spec.image);
        let c = w.containers.get_mut(&id).expect("found above");
        if c.state != RunState::Running {
            bail!("{}: connection refused", self.socket.display());
        }
        if c.hung {
            bail!("{}: no answer", self.socket.display());
        }
        Ok(f(c, &behavior))
    }

    fn record(&self, what: &str) {
        let name = self
            .engine
            .by_socket(&self.socket)
            .and_then(|id| {
                self.engine
                    .lock()
                    .containers
                    .get(&id)
                    .map(|c| c.live_name.clone())
            })
            .unwrap_or_default();
        self.engine.lock().history.push(format!("{what} {name}"));
    }
}

fn is_live(c: &Container, b: &Behavior) -> bool {
    c.started.is_some_and(|s| s.elapsed() >= b.live_after)
}

#[async_trait]
impl AdminApi for FakeAdmin {
    fn location(&self) -> String {
        format!("fake admin {}", self.socket.display())
    }

    async fn ready(&self) -> anyhow::Result<ReadyState> {
        self.engine.ready_asks.fetch_add(1, Ordering::Relaxed);
        self.with(|c, b| {
            if c.health_failed {
                ReadyState::Draining
            } else if is_live(c, b) {
                ReadyState::Live
            } else {
                ReadyState::PreInitializing
            }
        })
    }

    async fn listeners(&self) -> anyhow::Result<Vec<BoundListener>> {
        self.with(|c, b| {
            if !is_live(c, b) || c.listeners_closed {
                return Vec::new();
            }
            b.binds
                .iter()
                .map(|p| BoundListener {
                    name: format!("listener_{p}"),
                    port: *p,
                    address: None,
                })
                .collect()
        })
    }

    async fn downstream_connections(&self) -> anyhow::Result<u64> {
        self.with(|c, b| match c.drain_started {
            Some(at) if at.elapsed() >= b.drains_in => 0,
            _ if !is_live(c, b) => 0,
            _ => b.connections,
        })
    }

    async fn healthcheck_fail(&self) -> anyhow::Result<()> {
        self.with(|c, _| c.health_failed = true)?;
        self.record("drain");
        Ok(())
    }

    async fn drain_listeners(&self, graceful_skip_exit: bool) -> anyhow::Result<()> {
        self.with(|c, _| {
            if graceful_skip_exit {
                c.drain_started.get_or_insert(Instant::now());
            } else {
                c.listeners_closed = true;
            }
        })?;
        if !graceful_skip_exit {
            self.record("close-listeners");
        }
        Ok(())
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.with(|_, _| ())?;
        Ok((404, format!("the fake Envoy does not serve {path}")))
    }
}

impl AdminConnector for Arc<FakeEngine> {
    fn connect(&self, socket: &Path, _timeout: Duration) -> Arc<dyn AdminApi> {
        Arc::new(FakeAdmin {
            engine: self.clone(),
            socket: socket.to_path_buf(),
        })
    }
}

/// The `Dockerfile` at the root of a build context (a tar archive).
fn dockerfile_of(context: &[u8]) -> anyhow::Result<String> {
    use std::io::Read;
    let mut archive = tar::Archive::new(context);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.path()?.as_os_str() == "Dockerfile" {
            let mut text = String::new();
            entry.read_to_string(&mut text)?;
            return Ok(text);
        }
    }
    bail!("the build context has no Dockerfile")
}
