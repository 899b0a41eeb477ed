//! Layer engine: the only code that talks to a container engine (the only bollard user).
//! May use: core, and envoy's admin HTTP client for the engine's Unix socket.
//!
//! The container-engine seam: what berth asks of an engine that runs containers on one host
//! (observe by label, ensure or build an image, create, start, stop, remove, logs, run a
//! throw-away validation container, events, ping), in engine-neutral types.
//!
//! [`docker::DockerEngine`] speaks the Docker Engine API (bollard; Docker and Podman's
//! compatible API). `fake::FakeEngine` is an in-memory engine whose "Envoy" answers admin
//! calls, for unit tests of everything above the seam without a daemon (compiled for unit
//! tests only).
//!
//! Nothing here knows about proxies, plans or readiness. How a replica is hardened (user,
//! read-only root filesystem, capabilities, restart policy, network) is data in
//! [`ReplicaContainer`], decided by the caller; the adapters only translate it.

pub mod credentials;
pub mod docker;
/// The in-memory engine, for unit tests only (integration tests use the real engine).
#[cfg(test)]
pub mod fake;
pub mod ping;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};

pub use docker::{DockerEngine, Flavor};

/// The container types are the core's (a replica's spec); the adapters translate them.
pub use crate::core::replica::container::{
    ContainerInfo, Hardening, LiveSettings, Mount, Network, ObservedContainer, ReplicaContainer,
    RunState, User, RESTART_NO, RESTART_UNLESS_STOPPED,
};

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
    /// What the last observation found, whole: while the engine reports no event since the
    /// witness, it is what a new list would say.
    #[serde(default)]
    pub found: Option<Vec<ObservedContainer>>,
    /// Set by the last observation, never stored: the containers it found that the cache
    /// already knew and that had no engine event since (the same container, untouched since
    /// the previous look). Empty when the engine cannot tell.
    #[serde(skip)]
    pub vouched: BTreeSet<String>,
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

/// An image to build from an in-memory context and tag ([`ContainerEngine::build_image`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBuild {
    /// The tag the built image gets (`repository:tag`).
    pub tag: String,
    /// The build context: a tar archive with a `Dockerfile` at its root.
    pub context: Vec<u8>,
    /// Labels the built image carries.
    pub labels: BTreeMap<String, String>,
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
    /// A pull failed: the registry refused it, has no such image, or cannot be reached.
    #[error(transparent)]
    Pull(PullError),
}

/// Why a pull failed, as far as the engine's words tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullFailure {
    /// The registry wants credentials, or refused the ones sent.
    Unauthorized,
    /// The registry has no such repository or tag.
    NotFound,
    /// The registry cannot be reached (refused, no route, no such host, TLS, timeout).
    Unreachable,
    /// The Docker client config or its credential helper failed; nothing was asked of the
    /// registry.
    Credentials,
    /// Anything else the engine said.
    Other,
}

impl PullFailure {
    /// Reads the engine's error message of a failed pull.
    pub fn classify(message: &str) -> PullFailure {
        let m = message.to_ascii_lowercase();
        let any = |words: &[&str]| words.iter().any(|w| m.contains(w));
        if any(&[
            "unauthorized",
            "no basic auth credentials",
            "authentication required",
            "access denied",
            "denied:",
            "incorrect username or password",
        ]) {
            PullFailure::Unauthorized
        } else if any(&[
            "manifest unknown",
            "name unknown",
            "not found",
            "no such image",
        ]) {
            PullFailure::NotFound
        } else if any(&[
            "dial tcp",
            "connection refused",
            "no such host",
            "i/o timeout",
            "network is unreachable",
            "no route to host",
            "tls:",
            "x509:",
            "http response to https client",
            "deadline exceeded",
            "connection reset",
        ]) {
            PullFailure::Unreachable
        } else {
            PullFailure::Other
        }
    }
}

/// A failed pull, naming the image and the registry (never a credential).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.describe())]
pub struct PullError {
    pub image: String,
    /// "docker.io", "127.0.0.1:5000", …
    pub registry: String,
    pub failure: PullFailure,
    /// The engine's (or the credential lookup's) own words.
    pub detail: String,
    /// Whether credentials from the Docker client config were sent.
    pub with_credentials: bool,
    /// Advice for hosts without a registry (may be empty).
    pub hint: String,
}

impl PullError {
    fn describe(&self) -> String {
        let (image, registry, detail) = (&self.image, &self.registry, &self.detail);
        let config = credentials::config_file()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "~/.docker/config.json".into());
        let what = match self.failure {
            PullFailure::Unauthorized if self.with_credentials => format!(
                "cannot pull {image}: registry {registry} refused the credentials berth sent \
                 (from {config}; unauthorized): {detail}; run `docker login {registry}` as the \
                 user berth runs as (or set DOCKER_CONFIG)"
            ),
            PullFailure::Unauthorized => format!(
                "cannot pull {image}: registry {registry} wants credentials and {config} has \
                 none for it (unauthorized): {detail}; run `docker login {registry}` as the user \
                 berth runs as (or set DOCKER_CONFIG)"
            ),
            PullFailure::NotFound => format!(
                "cannot pull {image}: registry {registry} has no such repository or tag (not \
                 found): {detail}"
            ),
            PullFailure::Unreachable => format!(
                "cannot pull {image}: registry {registry} cannot be reached (unreachable): {detail}"
            ),
            PullFailure::Credentials => format!(
                "cannot pull {image}: the credentials for registry {registry} could not be read: \
                 {detail}"
            ),
            PullFailure::Other => format!("cannot pull {image} from registry {registry}: {detail}"),
        };
        format!("{what}{}", self.hint)
    }
}

impl EngineError {
    /// Worth trying again later (the engine was away, or busy), as opposed to a request the
    /// engine will refuse again the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Unreachable { .. } | EngineError::Timeout { .. } => true,
            EngineError::Refused { status, .. } => *status == 0 || *status >= 500,
            EngineError::ImageUnavailable { .. } => false,
            // A registry away comes back; credentials and names wait for a change.
            EngineError::Pull(p) => p.failure == PullFailure::Unreachable,
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

    /// The id of the container whose process `pid` is on this host (from the process's
    /// cgroup), when the engine can tell. Whatever the container's state (paused, restarting,
    /// stopped by a signal, none of which the engine reports a pid for), so preflight never
    /// takes a socket of the fleet's own containers for a stranger's.
    fn container_of_process(&self, _pid: u32) -> Option<String> {
        None
    }

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

    /// Pulls `image` from its registry whether or not it is present (with the credentials of
    /// the Docker client config, progress on a terminal when `progress`). Returns the ID the
    /// reference names afterwards: another one than before when the tag moved.
    async fn pull(&self, image: &str, progress: bool) -> EngineResult<String>;

    /// The image's ENTRYPOINT (empty when it has none), or None when it is not present.
    async fn image_entrypoint(&self, image: &str) -> EngineResult<Option<Vec<String>>>;

    /// Builds an image from an in-memory context (base images must be present: nothing is
    /// pulled) and tags it, printing the build's steps on stderr when `progress`. Returns the
    /// image's ID.
    async fn build_image(&self, build: &ImageBuild, progress: bool) -> EngineResult<String>;

    /// Gives the local image `image` a second name, `target` (`repository:tag`).
    async fn tag_image(&self, image: &str, target: &str) -> EngineResult<()>;

    /// Pushes the local `image` (`registry/repository:tag`) to its registry with the Docker
    /// client config's credentials for that registry (progress on stderr when `progress`).
    /// Returns the pushed image by digest, `registry/repository@sha256:…`.
    async fn push_image(&self, image: &str, progress: bool) -> EngineResult<String>;

    /// Creates a container without starting it. Returns its ID.
    async fn create(&self, container: &ReplicaContainer) -> EngineResult<String>;

    async fn start(&self, id: &str) -> EngineResult<()>;

    /// SIGTERM, then SIGKILL after `timeout`. Stopping a stopped container is fine.
    async fn stop(&self, id: &str, timeout: Duration) -> EngineResult<()>;

    /// SIGKILL at once, also to a paused container (the engine thaws it to deliver the
    /// signal): its sockets close with it. A stopped or missing container is success.
    async fn kill(&self, id: &str) -> EngineResult<()>;

    /// Removes a container (forced). A missing one is success.
    async fn remove(&self, id: &str) -> EngineResult<()>;

    /// The container's whole log, or its last `tail` lines.
    async fn logs(&self, id: &str, tail: Option<usize>) -> EngineResult<String>;

    /// Runs a throw-away container to completion and removes it.
    async fn run_to_completion(&self, job: &OneShot) -> EngineResult<Exited>;

    /// Container events (start, die, destroy, …) of containers matching `filter`, from now on.
    fn events(&self, filter: &LabelFilter) -> Events;
}

#[cfg(test)]
mod tests {
    use super::PullFailure;

    #[test]
    fn pull_failures_are_read_from_the_engines_words() {
        // Docker 20.10's answers against Debian's docker-registry 2.8 and an absent one.
        for (message, failure) in [
            (
                r#"Head "http://127.0.0.1:45123/v2/envoy/manifests/edge": no basic auth credentials"#,
                PullFailure::Unauthorized,
            ),
            (
                "unauthorized: authentication required",
                PullFailure::Unauthorized,
            ),
            (
                "pull access denied for envoy, repository does not exist or may require 'docker login'",
                PullFailure::Unauthorized,
            ),
            (
                "manifest for 127.0.0.1:45123/envoy:nope not found: manifest unknown: manifest unknown",
                PullFailure::NotFound,
            ),
            (
                r#"Get "http://127.0.0.1:45124/v2/": dial tcp 127.0.0.1:45124: connect: connection refused"#,
                PullFailure::Unreachable,
            ),
            ("something else entirely", PullFailure::Other),
        ] {
            assert_eq!(PullFailure::classify(message), failure, "{message}");
        }
    }
}
