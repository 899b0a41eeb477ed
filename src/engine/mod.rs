//! The container-engine seam: what berth asks of an engine that runs containers on one host
//! (observe by label, ensure an image, create, start, stop, remove, logs, run a throw-away
//! validation container, events, ping), in engine-neutral types.
//!
//! [`docker::DockerEngine`] speaks the Docker Engine API (bollard; Docker and Podman's
//! compatible API). [`fake::FakeEngine`] is an in-memory engine whose "Envoy" answers admin
//! calls, for unit tests of everything above the seam without a daemon.
//!
//! Nothing here knows about proxies, plans or readiness. How a replica is hardened (user,
//! read-only root filesystem, capabilities, restart policy, network) is data in
//! [`ReplicaContainer`], decided by the caller; the adapters only translate it.

pub mod docker;
pub mod fake;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub use docker::{DockerEngine, Flavor};

/// A bind mount of a host path into a container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// A numeric user and group a container's process runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

/// The network a container joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// The host's network namespace (replicas share ports through SO_REUSEPORT).
    Host,
    /// No network at all (validation containers).
    None,
}

/// What a container is confined to. Every field is explicit: the adapters add nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hardening {
    pub user: User,
    pub read_only_rootfs: bool,
    /// Drop every capability, then add `cap_add`.
    pub cap_drop_all: bool,
    pub cap_add: Vec<String>,
    pub no_new_privileges: bool,
}

/// What inspect tells of a container beyond the list: kept in an [`ObservationCache`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inspected {
    pub live: LiveSettings,
    /// The state inspect saw (newer than the list's when the inspect is).
    pub state: Option<RunState>,
    pub pid: Option<u32>,
    pub started_at: Option<String>,
}

/// What earlier observations learned by inspecting containers, so that a later one inspects
/// only the containers the engine reports a change for ([`ContainerEngine::observe_cached`]).
/// Callers only keep it between observations; its contents are the engine's business.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservationCache {
    /// The label filter it answers (engine values); another filter starts afresh.
    pub filter: Vec<String>,
    /// The newest engine event matching the filter when the entries were last checked.
    pub witness: Option<String>,
    /// Per container id.
    pub inspected: BTreeMap<String, Inspected>,
}

/// Restart policy names as the Engine API spells them.
pub const RESTART_UNLESS_STOPPED: &str = "unless-stopped";
pub const RESTART_NO: &str = "no";

/// One container to create, fully described.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaContainer {
    pub name: String,
    pub slot: u32,
    pub image: String,
    /// Arguments after the image's entrypoint.
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    pub mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub hardening: Hardening,
    pub network: Network,
    /// "unless-stopped" for replicas ([`RESTART_UNLESS_STOPPED`]).
    pub restart_policy: String,
}

/// A throw-away container that runs to completion (`envoy --mode validate`).
#[derive(Debug, Clone, PartialEq)]
pub struct OneShot {
    pub image: String,
    pub args: Vec<String>,
    pub mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub hardening: Hardening,
    /// How long it may run before it is abandoned (and removed).
    pub timeout: Duration,
}

/// How a [`OneShot`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub code: i64,
    /// Its whole output (stdout and stderr, interleaved as logged).
    pub output: String,
}

/// The engine's view of one container, as list and inspect show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservedContainer {
    pub id: String,
    /// The live name, without Docker's leading '/'.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub state: RunState,
    pub live: LiveSettings,
    /// What the engine reports beyond what the planner needs, for status and preflight.
    #[serde(default)]
    pub info: ContainerInfo,
}

/// Facts about a container that the planner does not use.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// The image reference the container was created from.
    pub image: String,
    /// The main process on the host, while running.
    pub pid: Option<u32>,
    /// RFC 3339 start time, while running.
    pub started_at: Option<String>,
}

/// Settings someone can change on a live container (`docker update`, `docker rename`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveSettings {
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    /// The engine's restart policy name, e.g. "unless-stopped".
    pub restart_policy: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Created,
    Running,
    Paused,
    Restarting,
    Exited,
    Dead,
    Removing,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Created => "created",
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Restarting => "restarting",
            RunState::Exited => "exited",
            RunState::Dead => "dead",
            RunState::Removing => "removing",
        }
    }

    /// Parses the engine's `State.Status` ("running", "exited", …).
    pub fn parse(status: &str) -> Option<RunState> {
        Some(match status {
            "created" | "configured" | "initialized" => RunState::Created,
            "running" | "stopping" => RunState::Running,
            "paused" => RunState::Paused,
            "restarting" => RunState::Restarting,
            "exited" | "stopped" => RunState::Exited,
            "dead" => RunState::Dead,
            "removing" => RunState::Removing,
            _ => return None,
        })
    }

    /// Not running and `start` can start it again (Created or Exited; not Dead).
    pub fn is_startable(self) -> bool {
        matches!(self, RunState::Created | RunState::Exited)
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What inspect tells about a container's process, beyond [`RunState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    pub state: RunState,
    /// The exit code of the last run (0 while running or never started).
    pub exit_code: Option<i64>,
    /// The host PID of the container's main process while it runs.
    pub pid: Option<i64>,
    pub oom_killed: bool,
    pub restart_count: Option<i64>,
    /// RFC 3339, as the engine reports it.
    pub started_at: Option<String>,
    /// The engine's error for the last start, if any.
    pub error: Option<String>,
}

/// One container event from [`ContainerEngine::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    /// die, destroy, stop, kill, oom, update, rename, start, …
    pub action: String,
    pub id: String,
    /// The container's labels as the event carries them.
    pub labels: BTreeMap<String, String>,
    /// The container's name (without the leading slash).
    pub name: Option<String>,
}

/// Containers to observe: every label must be present, with the value when one is given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelFilter(pub Vec<(String, Option<String>)>);

impl LabelFilter {
    pub fn with(mut self, key: &str, value: Option<&str>) -> Self {
        self.0.push((key.to_string(), value.map(str::to_string)));
        self
    }

    /// The Engine API's `label` filter values: `key` or `key=value`.
    pub fn engine_values(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => k.clone(),
            })
            .collect()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|(k, v)| match (labels.get(k), v) {
            (Some(_), None) => true,
            (Some(have), Some(want)) => have == want,
            (None, _) => false,
        })
    }
}

/// Why the engine could not do something. Each variant says whose fault it is, so no caller
/// has to guess: an engine that refuses to start a container is never reported as Envoy
/// rejecting a config.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine does not answer at all.
    #[error("the container engine at {endpoint} does not answer: {message}; is it running? (set DOCKER_HOST to use another engine)")]
    Unreachable { endpoint: String, message: String },
    /// The engine answered with an error of its own (ulimits, cgroups, seccomp, a name in use,
    /// a bad request). `engine` names it ("Docker Engine 20.10.24"), `message` is its words.
    #[error("{engine} refused to {operation}: {message}")]
    Refused {
        engine: String,
        operation: String,
        /// The HTTP status the engine answered with (0 when it was a stream error).
        status: u16,
        message: String,
    },
    /// The image is not present and could not be pulled.
    #[error("image {image} is not present locally and could not be pulled: {message}{hint}")]
    ImageUnavailable {
        image: String,
        message: String,
        /// Advice on hosts without a registry (may be empty).
        hint: String,
    },
    /// A container did not finish in time.
    #[error("{what} did not finish within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
}

impl EngineError {
    /// Worth trying again later (the engine was away, or busy), as opposed to a request the
    /// engine will refuse again the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Unreachable { .. } | EngineError::Timeout { .. } => true,
            EngineError::Refused { status, .. } => *status == 0 || *status >= 500,
            EngineError::ImageUnavailable { .. } => false,
        }
    }

    /// A name already in use (HTTP 409 on create).
    pub fn is_conflict(&self) -> bool {
        matches!(self, EngineError::Refused { status: 409, .. })
    }
}

pub type EngineResult<T> = std::result::Result<T, EngineError>;

/// A stream of container events; it ends or fails when the engine goes away.
pub type Events = BoxStream<'static, EngineResult<ContainerEvent>>;

/// The container engine seam. Implementations are policy-free: they never plan, wait for
/// readiness or retry.
#[async_trait]
pub trait ContainerEngine: Send + Sync {
    /// What this engine is, for messages ("Docker Engine 20.10.24 at unix:///var/run/docker.sock").
    fn describe(&self) -> String;

    /// Engine API requests made so far (for benchmarks).
    fn api_calls(&self) -> u64;

    /// Whether the engine answers.
    async fn ping(&self) -> bool;

    /// Every container (any state) whose labels match, with its live settings.
    async fn observe(&self, filter: &LabelFilter) -> EngineResult<Vec<ObservedContainer>>;

    /// [`ContainerEngine::observe`], reusing from `cache` what it knows of containers the
    /// engine reports no change for, and updating it. An engine that cannot tell observes
    /// everything (this default).
    async fn observe_cached(
        &self,
        filter: &LabelFilter,
        cache: &mut ObservationCache,
    ) -> EngineResult<Vec<ObservedContainer>> {
        *cache = ObservationCache::default();
        self.observe(filter).await
    }

    /// One container's process state, or None when it does not exist.
    async fn status(&self, id: &str) -> EngineResult<Option<ContainerStatus>>;

    /// The local image's ID, or None when it is not present.
    async fn image_id(&self, image: &str) -> EngineResult<Option<String>>;

    /// Makes sure `image` is present, pulling it when absent (with progress on a terminal when
    /// `progress`). Returns its ID.
    async fn ensure_image(&self, image: &str, progress: bool) -> EngineResult<String>;

    /// Creates a container without starting it. Returns its ID.
    async fn create(&self, container: &ReplicaContainer) -> EngineResult<String>;

    async fn start(&self, id: &str) -> EngineResult<()>;

    /// SIGTERM, then SIGKILL after `timeout`. Stopping a stopped container is fine.
    async fn stop(&self, id: &str, timeout: Duration) -> EngineResult<()>;

    /// Removes a container (forced). A missing one is success.
    async fn remove(&self, id: &str) -> EngineResult<()>;

    /// The container's whole log, or its last `tail` lines.
    async fn logs(&self, id: &str, tail: Option<usize>) -> EngineResult<String>;

    /// Runs a throw-away container to completion and removes it.
    async fn run_to_completion(&self, job: &OneShot) -> EngineResult<Exited>;

    /// Container events (start, die, destroy, …) of containers matching `filter`, from now on.
    fn events(&self, filter: &LabelFilter) -> Events;
}
