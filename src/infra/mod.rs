//! Layer infra: the seam below, its implementations, and [`delivery`]. May use: core, envoy,
//! host, state, engine. Never names its callers (ops, status, edges).
//!
//! The infrastructure seam, as Envoy Gateway has it (`internal/infrastructure/manager.go`: one
//! interface, an implementation per platform): converge a proxy, remove it, report its status.
//! Nothing above this module knows whether a proxy's replicas are containers berth rolls on one
//! Docker host ([`docker_host::DockerHost`]) or tasks of a Swarm service ([`swarm::Swarm`]).
//!
//! Every implementation returns typed outcomes ([`Converged`]) and typed errors
//! ([`ConvergeError`]); callers decide what to do about them (serve's error policy) without
//! reading strings.

pub mod delivery;
pub mod docker_host;
mod replica_status;
pub mod swarm;

pub use crate::core::policy::{EngineKind, HostPolicy, SwarmSettings};
pub use replica_status::ReplicaStatus;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::core::plan::{Plan, PlanSummary};
use crate::core::progress::Reporter;
use crate::core::target::Target;
use crate::engine::EngineError;
use crate::envoy::readiness::Readiness;
use crate::infra::delivery::LiveRejected;

pub use docker_host::{Gate, GateFailure};

/// How long one command (not serve) may reuse its observation while it changes nothing.
pub const COMMAND_OBSERVATION_REUSE: Duration = Duration::from_secs(10);

/// Who asks: one command, or the long-running serve (which must always see the engine as it
/// is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Command,
    Serve,
}

/// The one constructor of the infrastructure this berth runs on (DESIGN: like Envoy
/// Gateway's `NewManager`, it picks the implementation by configuration): the single Docker
/// host behind `DOCKER_HOST` (or the local socket), or the Swarm that engine manages.
pub async fn connect(
    kind: EngineKind,
    swarm: &SwarmSettings,
    state: crate::state::StateDir,
    extra_labels: std::collections::BTreeMap<String, String>,
    caller: Caller,
) -> anyhow::Result<std::sync::Arc<dyn Infrastructure>> {
    connect_with(
        crate::engine::DockerEngine::connect().await?,
        kind,
        swarm,
        state,
        extra_labels,
        caller,
        None,
    )
    .await
}

/// [`connect`] over an engine already connected (a command connects while it renders).
pub async fn connect_with(
    engine: crate::engine::DockerEngine,
    kind: EngineKind,
    swarm: &SwarmSettings,
    state: crate::state::StateDir,
    extra_labels: std::collections::BTreeMap<String, String>,
    caller: Caller,
    ahead: Option<docker_host::Ahead>,
) -> anyhow::Result<std::sync::Arc<dyn Infrastructure>> {
    if kind == EngineKind::Swarm {
        return Ok(std::sync::Arc::new(
            swarm::Swarm::connect(engine, swarm.clone(), state, extra_labels).await?,
        ));
    }
    let host = docker_host::DockerHost::new(
        std::sync::Arc::new(engine),
        std::sync::Arc::new(crate::envoy::admin::SocketConnector),
        state,
        extra_labels,
    );
    let host = match ahead {
        Some(ahead) => host.with_ahead(ahead),
        None => host,
    };
    Ok(std::sync::Arc::new(match caller {
        Caller::Command => host.reusing_observations(COMMAND_OBSERVATION_REUSE),
        Caller::Serve => host,
    }))
}

/// The Swarm the engine behind `DOCKER_HOST` (or the local socket) manages, when it manages
/// one: what `down` without a config also looks at, as it cannot know the config's engine.
pub async fn swarm_if_manager(
    state: crate::state::StateDir,
    extra_labels: std::collections::BTreeMap<String, String>,
) -> anyhow::Result<Option<std::sync::Arc<dyn Infrastructure>>> {
    let engine = crate::engine::DockerEngine::connect().await?;
    if !swarm::Swarm::is_manager(&engine).await {
        return Ok(None);
    }
    Ok(Some(std::sync::Arc::new(
        swarm::Swarm::connect(engine, SwarmSettings::default(), state, extra_labels).await?,
    )))
}

/// One converge of one proxy.
pub struct ConvergeRequest<'a> {
    pub target: &'a Target,
    /// The generation the watched files are stamped with (serve numbers them); None: the next
    /// one after what is on disk.
    pub generation: Option<u64>,
    /// Keep the watched files on disk instead of delivering the target's (a generation the
    /// replicas refused before, not retried until it changes).
    pub hold_files: bool,
    /// How long every replica gets to confirm new watched files.
    pub confirm_timeout: Duration,
    pub reporter: &'a Reporter,
    /// Cancelled: stop between two steps (a step is one replica started and its predecessor
    /// retired), so no proxy is left with fewer ready replicas.
    pub cancel: CancellationToken,
}

/// What happened to the watched files (routes, clusters, listeners, secrets).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Delivery {
    /// They were already what the target renders.
    Unchanged,
    /// Written with no running replica to confirm them (a fresh proxy).
    Written { files: Vec<String> },
    /// Every running replica confirmed them.
    Confirmed {
        files: Vec<String>,
        replicas: usize,
        #[serde(with = "humantime_serde")]
        elapsed: Duration,
    },
    /// The previous files were kept, as asked ([`ConvergeRequest::hold_files`]).
    Held,
    /// Not every replica confirmed them; the previous files are back.
    Failed(LiveRejected),
}

impl Delivery {
    pub fn failed(&self) -> Option<&LiveRejected> {
        match self {
            Delivery::Failed(r) => Some(r),
            _ => None,
        }
    }

    /// Whether new files reached the replicas.
    pub fn changed(&self) -> bool {
        matches!(self, Delivery::Written { .. } | Delivery::Confirmed { .. })
    }
}

/// How ready a proxy's replicas of the desired spec are, by the one probe.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProxyReadiness {
    pub wanted: u32,
    pub ready: u32,
    /// Replicas of the desired spec that are not ready, with why.
    pub not_ready: Vec<(String, Readiness)>,
}

impl ProxyReadiness {
    pub fn all_ready(&self) -> bool {
        self.ready >= self.wanted
    }
}

impl fmt::Display for ProxyReadiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} replicas ready", self.ready, self.wanted)?;
        for (name, r) in &self.not_ready {
            write!(f, "; {name}: {r}")?;
        }
        Ok(())
    }
}

/// A converge that finished.
#[derive(Debug, Clone, Serialize)]
pub struct Converged {
    pub delivery: Delivery,
    /// What was done to replicas.
    pub actions: PlanSummary,
    pub readiness: ProxyReadiness,
}

/// Why a converge (or a removal, or a validation) did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ConvergeError {
    /// The engine failed or refused a request (it says so, and quotes itself).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// `envoy --mode validate` refused the new bootstrap: nothing was changed.
    #[error(
        "envoy --mode validate rejected the new config of proxy {proxy} (image {image}); no replica was changed:\n{why}"
    )]
    Rejected {
        proxy: String,
        image: String,
        /// The lines of Envoy's output that say why.
        why: String,
    },
    /// A new replica did not become ready; the old ones keep serving.
    #[error(transparent)]
    Gate(#[from] GateFailure),
    /// The state directory could not be read or written.
    #[error("state directory: {0:#}")]
    State(anyhow::Error),
    /// Stopped between two steps.
    #[error("rollout of {proxy} stopped between two steps (cancelled); the next run completes it")]
    Cancelled { proxy: String },
    /// The host cannot hold what the fleet needs (a port taken, a setting berth may not change,
    /// too little memory); nothing was changed. The message has the numbers and the fix.
    #[error("{problem}")]
    Host { problem: String },
}

impl ConvergeError {
    /// Worth trying again soon without a change of input: the engine was away or busy, the
    /// state directory had a passing I/O problem, the run was cancelled. A rejected config, a
    /// failed gate or an engine refusal of the request itself fail the same way again.
    pub fn is_transient(&self) -> bool {
        match self {
            ConvergeError::Engine(e) => e.is_transient(),
            ConvergeError::State(_) | ConvergeError::Cancelled { .. } => true,
            ConvergeError::Rejected { .. }
            | ConvergeError::Gate(_)
            | ConvergeError::Host { .. } => false,
        }
    }
}

impl From<anyhow::Error> for ConvergeError {
    fn from(e: anyhow::Error) -> Self {
        ConvergeError::State(e)
    }
}

/// What preparing the host did and could not do.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostPreparation {
    /// What was changed or checked, worth a line ("net.ipv4.ip_unprivileged_port_start
    /// lowered from 1024 to 80").
    pub notes: Vec<String>,
    /// What the host lacks that berth could not fix, and what is lost because of it, with the
    /// command that fixes it, as (reason, message): serve reports it as a Degraded condition.
    pub degraded: Vec<(String, String)>,
}

/// One look at one replica for the liveness judge ([`crate::core::liveness`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaLook {
    pub proxy: String,
    /// The container's id (what [`Infrastructure::kill`] takes).
    pub container: String,
    /// The container's name.
    pub name: String,
    pub probe: crate::core::liveness::Probe,
}

/// A change on the infrastructure someone else made (a container died, was removed, was
/// updated): the proxy it belongs to should be looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub proxy: String,
    /// What happened ("die", "destroy", …).
    pub what: String,
}

/// A stream of [`Changed`]; it ends or fails when the infrastructure goes away.
pub type Changes = BoxStream<'static, Result<Changed, EngineError>>;

/// The infrastructure seam.
#[async_trait]
pub trait Infrastructure: Send + Sync {
    /// What this is, for messages ("Docker host (Docker Engine 20.10.24 at unix://…)").
    fn describe(&self) -> String;

    /// Requests made to the engine so far (for benchmarks).
    fn api_calls(&self) -> u64;

    /// Whether the engine answers.
    async fn ping(&self) -> bool;

    /// Brings the host to what the whole `fleet` needs before any replica starts, or refuses
    /// ([`ConvergeError::Host`]) what it cannot hold.
    async fn prepare(
        &self,
        fleet: &[Target],
        policy: crate::core::policy::HostPolicy,
    ) -> Result<HostPreparation, ConvergeError>;

    /// Every proxy this berth has something of: replicas, or state.
    async fn owned(&self) -> Result<BTreeSet<String>, ConvergeError>;

    /// What converging `targets` would do, and the removal of owned proxies not among them.
    async fn diff(&self, targets: &[Target]) -> Result<Plan, ConvergeError>;

    /// The image ID `image` names, for a proxy whose pull policy is "always": pulled from its
    /// registry first when `pull` (the tag may have moved), else the local image (pulled only
    /// when absent). None when this infrastructure runs images by reference only.
    async fn resolve_image(
        &self,
        image: &str,
        pull: bool,
        reporter: &Reporter,
    ) -> Result<Option<String>, ConvergeError> {
        let _ = (image, pull, reporter);
        Ok(None)
    }

    /// Runs the real Envoy's config check on the target (no replica is touched).
    async fn validate(&self, target: &Target, reporter: &Reporter) -> Result<(), ConvergeError>;

    /// Brings one proxy to its target: its watched files delivered, its replicas created,
    /// replaced (health-gated, with rollback) or removed.
    async fn converge(&self, request: ConvergeRequest<'_>) -> Result<Converged, ConvergeError>;

    /// Drains and removes every replica of a proxy (each with the drain settings of the spec
    /// it runs) and its state. Returns how many replicas went.
    async fn remove(&self, proxy: &str, reporter: &Reporter) -> Result<usize, ConvergeError>;

    /// After `down`: removes the images berth built for its replicas (a Swarm's derived agent
    /// images) that nothing uses any more; returns their names. None elsewhere.
    async fn prune_images(&self, _reporter: &Reporter) -> Result<Vec<String>, ConvergeError> {
        Ok(Vec::new())
    }

    /// One row per replica of the named proxies.
    async fn status(&self, proxies: &BTreeSet<String>)
        -> Result<Vec<ReplicaStatus>, ConvergeError>;

    /// Each running replica's Envoy stats in Prometheus text: (proxy, replica, body).
    async fn envoy_metrics(&self, proxies: &BTreeSet<String>) -> Vec<(String, String, String)>;

    /// Changes to this berth's replicas made by others, from now on.
    fn changes(&self) -> Changes;

    /// One look at every running or paused replica of `proxies` for the liveness judge: its
    /// admin `/ready` asked (an answer later than
    /// [`crate::core::liveness::PROBE_TIMEOUT`] counts as none), whether the engine froze it,
    /// whether its Envoy is stopped by a signal, the CPU its container has used. Empty where
    /// this infrastructure cannot look (a Swarm: each task's agent watches its own Envoy).
    async fn look(&self, proxies: &BTreeSet<String>) -> Result<Vec<ReplicaLook>, ConvergeError> {
        let _ = proxies;
        Ok(Vec::new())
    }

    /// Kills one replica at once (SIGKILL, also when paused): its sockets close, which is what
    /// takes it out of its port; the next reconcile pass replaces it.
    async fn kill(&self, container: &str) -> Result<(), ConvergeError> {
        let _ = container;
        Ok(())
    }
}
