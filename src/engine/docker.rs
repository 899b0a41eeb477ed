//! The only module that talks to the Docker engine (bollard).
//!
//! [`Engine`] is a thin, policy-free client: it observes berth's containers, creates, starts,
//! stops and removes them, makes sure images are present, and runs `envoy --mode validate` in a
//! throw-away container. It never plans and never waits for Envoy to be ready; that is the
//! rollout's job (with [`crate::admin`]).
//!
//! Decisions taken here:
//! - **User.** Every replica (and every validate container) runs as [`REPLICA_USER`]
//!   (`101:101`, the `envoy` user of Envoy's official image and of `scripts/envoy-image.sh`),
//!   whatever `USER` the image declares. Two reasons: SO_REUSEPORT only lets sockets share a
//!   port when they belong to the same effective UID, so an old and a new replica from different
//!   images must run as the same UID for a start-first replacement to bind; and berth has to
//!   hand each replica's run directory to a numeric UID it knows before the container starts.
//! - **Run directory.** The mount whose target is [`layout::CONTAINER_RUN_DIR`] is the replica's
//!   own admin-socket directory. [`Engine::create`] creates it on the host, owned by
//!   [`REPLICA_UID`]:[`REPLICA_GID`] with mode 0700, so Envoy (non-root, read-only root
//!   filesystem) can create its admin socket there and nobody else can reach it. That needs berth
//!   to run as root (or as uid 101).
//! - Everything else a replica runs with is hardening from DESIGN decisions 1, 8 and 9: host
//!   networking, restart policy `unless-stopped`, read-only root filesystem, `cap_drop ALL` plus
//!   the spec's `cap_add`, `no-new-privileges`, CPU and memory limits.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum,
    ContainerSummaryStateEnum, HostConfig, Mount as DockerMount, MountType, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::{StreamExt, TryStreamExt};

use crate::layout;
use crate::replica::{
    ContainerInfo, LiveSettings, Mount, ObservedContainer, ReplicaContainer, RunState,
    LABEL_MANAGED_BY, LABEL_PROXY, LABEL_STATE_DIR, MANAGED_BY_VALUE,
};

/// The UID every replica runs as (see the module docs).
pub const REPLICA_UID: u32 = 101;
/// The GID every replica runs as.
pub const REPLICA_GID: u32 = 101;
/// `user` of every replica container.
pub const REPLICA_USER: &str = "101:101";
/// Label on `envoy --mode validate` containers, so a leftover one can be recognised.
pub const LABEL_VALIDATE: &str = "io.berth.validate";

/// The longest Unix socket path berth can connect to (`sun_path` is 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// How long `validate` may take before it is abandoned.
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(60);
/// bollard's per-request timeout; `stop` raises it for its own request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A connection to the Docker engine.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    /// API requests made since `connect` (including version negotiation), for benchmarks.
    calls: Arc<AtomicU64>,
}

/// What `inspect` tells about a container's process, beyond [`RunState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    pub state: RunState,
    /// The exit code of the last run (0 while running or never started).
    pub exit_code: Option<i64>,
    /// The host PID of the container's main process while it runs.
    pub pid: Option<i64>,
    pub oom_killed: bool,
    pub restart_count: Option<i64>,
    /// RFC 3339, as Docker reports it.
    pub started_at: Option<String>,
    /// Docker's error for the last start, if any.
    pub error: Option<String>,
}

/// One container event from [`Engine::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    /// die, destroy, stop, kill, oom, update, rename, …
    pub action: String,
    pub id: String,
    /// The container's `io.berth.proxy` label.
    pub proxy: Option<String>,
    /// The container's name (without the leading slash).
    pub name: Option<String>,
}

impl Engine {
    /// Connects to the local engine (`DOCKER_HOST` or `/var/run/docker.sock`) and negotiates the
    /// API version down to what the daemon speaks.
    pub async fn connect() -> Result<Engine> {
        let where_ = docker_host_description();
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let unreachable = |e: BollardError| {
            anyhow!(
                "the Docker engine at {where_} does not answer: {e}; is dockerd running? \
                 (set DOCKER_HOST to use another engine)"
            )
        };
        let docker = Docker::connect_with_local_defaults()
            .map_err(unreachable)?
            .with_timeout(REQUEST_TIMEOUT)
            .with_request_modifier(move |req| {
                counter.fetch_add(1, Ordering::Relaxed);
                req
            });
        let docker = docker.negotiate_version().await.map_err(unreachable)?;
        Ok(Engine { docker, calls })
    }

    /// The bollard client, for callers that need an engine call this module does not wrap
    /// (tests inspecting what `create_replica` made).
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// The API version in use after negotiation, e.g. "1.41".
    pub fn api_version(&self) -> String {
        let v = self.docker.client_version();
        format!("{}.{}", v.major_version, v.minor_version)
    }

    /// Engine API requests made so far.
    pub fn api_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Whether the engine answers (`GET /_ping`).
    pub async fn ping(&self) -> bool {
        self.docker.ping().await.is_ok()
    }

    /// Every container carrying berth's managed-by label, in any state, as the planner sees
    /// it: one list call filtered by label, then one inspect per container (concurrently) for
    /// what list cannot tell: memory, CPUs and restart policy.
    pub async fn observe(&self) -> Result<Vec<ObservedContainer>> {
        let filter = format!("{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}");
        let mut found = self.observe_labelled(&filter).await?;
        // The daemon filtered already; never hand the planner anything else.
        found.retain(ObservedContainer::is_managed);
        Ok(found)
    }

    /// Like [`Engine::observe`], but only the containers of the named proxies made by the berth
    /// of `state_dir` are inspected
    /// (and returned): one list call plus one inspect per container of those proxies, however
    /// many other berth containers (other state directories, test runs) the host has.
    pub async fn observe_proxies(
        &self,
        proxies: &std::collections::BTreeSet<String>,
        state_dir: &Path,
    ) -> Result<Vec<ObservedContainer>> {
        let filter = format!("{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}");
        let mut summaries = self.list_labelled(&filter).await?;
        summaries.retain(|s| {
            s.labels.as_ref().is_some_and(|l| {
                l.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY_VALUE)
                    && l.get(LABEL_PROXY).is_some_and(|p| proxies.contains(p))
                    && l.get(LABEL_STATE_DIR)
                        .is_none_or(|d| Path::new(d) == state_dir)
            })
        });
        let mut found = self.inspect_all(summaries).await?;
        found.retain(ObservedContainer::is_managed);
        Ok(found)
    }

    /// Every container matching a label filter (`key` or `key=value`), any state, with the same
    /// detail as [`Engine::observe`].
    pub async fn observe_labelled(&self, label_filter: &str) -> Result<Vec<ObservedContainer>> {
        let summaries = self.list_labelled(label_filter).await?;
        self.inspect_all(summaries).await
    }

    /// One inspect per listed container (concurrently), for what list cannot tell.
    async fn inspect_all(
        &self,
        summaries: Vec<bollard::models::ContainerSummary>,
    ) -> Result<Vec<ObservedContainer>> {
        let inspects = futures_util::stream::iter(summaries.into_iter().map(|s| async move {
            let id = s.id.clone().unwrap_or_default();
            match self.docker.inspect_container(&id, None).await {
                Ok(inspect) => Ok(Some(observed_from(s, &inspect))),
                // Removed between list and inspect: it is gone, not an error.
                Err(e) if is_not_found(&e) => Ok(None),
                Err(e) => Err(anyhow!(e).context(format!("inspecting container {id}"))),
            }
        }))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
        let mut out: Vec<ObservedContainer> = inspects.into_iter().flatten().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn list_labelled(
        &self,
        label_filter: &str,
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        let mut filters = HashMap::new();
        filters.insert("label", vec![label_filter]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        self.docker
            .list_containers(Some(opts))
            .await
            .with_context(|| format!("listing containers with label {label_filter}"))
    }

    /// The local image's ID (`sha256:…`), or None when it is not present.
    pub async fn image_id(&self, image: &str) -> Result<Option<String>> {
        match self.docker.inspect_image(image).await {
            Ok(img) => Ok(img.id),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(anyhow!(e).context(format!("inspecting image {image}"))),
        }
    }

    /// Makes sure `image` is present locally, pulling it when absent (with a progress bar on
    /// stderr when `progress` is set and stderr is a terminal). Returns the image ID.
    pub async fn ensure_image(&self, image: &str, progress: bool) -> Result<String> {
        if let Some(id) = self.image_id(image).await? {
            return Ok(id);
        }
        if let Err(e) = self.pull(image, progress).await {
            let version = image_version_hint(image);
            bail!(
                "image {image} is not present locally and could not be pulled: {e:#}\n\
                 hint: on a host without a registry, build a local Envoy image with \
                 `scripts/envoy-image.sh {version}` and use berth/envoy:{version}"
            );
        }
        self.image_id(image)
            .await?
            .ok_or_else(|| anyhow!("image {image} was pulled but is not present afterwards"))
    }

    async fn pull(&self, image: &str, progress: bool) -> Result<()> {
        use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
        let (repo, tag) = split_image(image);
        let opts = CreateImageOptionsBuilder::default()
            .from_image(repo)
            .tag(tag)
            .build();
        let target = if progress {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(0), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        bar.set_message(format!("pulling {image}"));
        // Per layer: (current, total) bytes; the bar shows the sum.
        let mut layers: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut stream = self.docker.create_image(Some(opts), None, None);
        while let Some(info) = stream.next().await {
            let info = match info {
                Ok(info) => info,
                Err(e) => {
                    bar.abandon_with_message(format!("pulling {image} failed"));
                    return Err(docker_error(e));
                }
            };
            if let Some(err) = info.error_detail.and_then(|d| d.message) {
                bar.abandon_with_message(format!("pulling {image} failed"));
                bail!("{err}");
            }
            if let (Some(id), Some(detail)) = (info.id, info.progress_detail) {
                let entry = layers.entry(id).or_default();
                if let Some(total) = detail.total.filter(|t| *t > 0) {
                    entry.1 = total as u64;
                }
                if let Some(current) = detail.current {
                    entry.0 = current as u64;
                }
                bar.set_length(layers.values().map(|l| l.1).sum());
                bar.set_position(layers.values().map(|l| l.0.min(l.1)).sum());
            }
        }
        bar.finish_with_message(format!("pulled {image}"));
        Ok(())
    }

    /// Creates and starts one replica. Returns the container ID. If the container was created
    /// but does not start, it is removed again and the error says why.
    pub async fn create_replica(
        &self,
        replica: &ReplicaContainer,
        extra_labels: &BTreeMap<String, String>,
    ) -> Result<String> {
        let id = self.create(replica, extra_labels).await?;
        if let Err(e) = self.start(&id).await {
            let _ = self.remove(&id).await;
            return Err(e.context(format!("replica {} did not start", replica.name)));
        }
        Ok(id)
    }

    /// Creates one replica container without starting it (see [`Engine::create_replica`]).
    /// Prepares its run directory on the host first.
    pub async fn create(
        &self,
        replica: &ReplicaContainer,
        extra_labels: &BTreeMap<String, String>,
    ) -> Result<String> {
        let run_dir = replica
            .mounts
            .iter()
            .find(|m| m.target == layout::CONTAINER_RUN_DIR)
            .map(|m| m.source.clone());
        if let Some(dir) = &run_dir {
            let sock = dir.join(layout::ADMIN_SOCKET_FILE);
            if sock.as_os_str().len() > MAX_SOCKET_PATH {
                bail!(
                    "the admin socket path {} is {} bytes, longer than Unix sockets allow \
                     ({MAX_SOCKET_PATH}); use a shorter state directory",
                    sock.display(),
                    sock.as_os_str().len()
                );
            }
            prepare_run_dir(dir)?;
        }
        for m in replica.mounts.iter().filter(|m| m.read_only) {
            check_readable_by_replica(&m.source)?;
        }
        let mut labels: HashMap<String, String> = replica
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.extend(extra_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        let host_config = HostConfig {
            network_mode: Some("host".into()),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                maximum_retry_count: None,
            }),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: (!replica.cap_add.is_empty()).then(|| replica.cap_add.clone()),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            nano_cpus: replica.nano_cpus,
            memory: replica.memory,
            mounts: Some(replica.mounts.iter().map(bind_mount).collect()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(replica.image.clone()),
            user: Some(REPLICA_USER.into()),
            cmd: Some(replica.args.clone()),
            env: Some(
                replica
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            ),
            labels: Some(labels),
            host_config: Some(host_config),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default()
            .name(&replica.name)
            .build();
        let created = self
            .docker
            .create_container(Some(opts), body)
            .await
            .map_err(docker_error)
            .with_context(|| {
                format!("creating container {} from {}", replica.name, replica.image)
            })?;
        // The name was free, so no live replica owns a socket in this directory: a socket file
        // left by an earlier container of the same name is stale.
        if let Some(dir) = &run_dir {
            let sock = dir.join(layout::ADMIN_SOCKET_FILE);
            if sock.exists() {
                let _ = std::fs::remove_file(&sock);
            }
        }
        Ok(created.id)
    }

    pub async fn start(&self, id: &str) -> Result<()> {
        match self.docker.start_container(id, None).await {
            Ok(()) => Ok(()),
            // 304: already running.
            Err(BollardError::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) => Err(docker_error(e)).with_context(|| format!("starting container {id}")),
        }
    }

    /// Stops a container: SIGTERM, then SIGKILL after `timeout`. Stopping a stopped container
    /// is fine; a missing one is an error.
    pub async fn stop(&self, id: &str, timeout: Duration) -> Result<()> {
        let secs = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
        let opts = StopContainerOptionsBuilder::default().t(secs).build();
        // The request lasts as long as the stop: make the client wait longer than the engine.
        let docker = self
            .docker
            .clone()
            .with_timeout(timeout + Duration::from_secs(30));
        match docker.stop_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(BollardError::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) => Err(docker_error(e)).with_context(|| format!("stopping container {id}")),
        }
    }

    /// Removes a container (force, with its anonymous volumes). A missing one is success.
    pub async fn remove(&self, id: &str) -> Result<()> {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // 409 "removal already in progress": it is going away.
            Err(BollardError::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => Ok(()),
            Err(e) => Err(docker_error(e)).with_context(|| format!("removing container {id}")),
        }
    }

    /// The container's state, or None when it does not exist.
    pub async fn state(&self, id: &str) -> Result<Option<RunState>> {
        Ok(self.status(id).await?.map(|s| s.state))
    }

    /// The container's state with exit code, PID and restart count, or None when it does not
    /// exist.
    pub async fn status(&self, id: &str) -> Result<Option<ContainerStatus>> {
        let inspect = match self.docker.inspect_container(id, None).await {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(docker_error(e)).with_context(|| format!("inspecting {id}")),
        };
        let st = inspect.state.unwrap_or_default();
        Ok(Some(ContainerStatus {
            state: st.status.map(run_state_of).unwrap_or(RunState::Dead),
            exit_code: st.exit_code,
            pid: st.pid.filter(|p| *p > 0),
            oom_killed: st.oom_killed.unwrap_or(false),
            restart_count: inspect.restart_count,
            started_at: st.started_at,
            error: st.error.filter(|e| !e.is_empty()),
        }))
    }

    /// The last `lines` lines of the container's stdout and stderr, interleaved as logged.
    pub async fn logs_tail(&self, id: &str, lines: usize) -> Result<String> {
        let tail = lines.to_string();
        let opts = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&tail)
            .build();
        let chunks: Vec<_> = self
            .docker
            .logs(id, Some(opts))
            .try_collect()
            .await
            .map_err(docker_error)
            .with_context(|| format!("reading logs of container {id}"))?;
        let mut out = String::new();
        for chunk in chunks {
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        Ok(out)
    }

    /// Runs `envoy --mode validate -c <config_path>` in a throw-away container of `image`:
    /// no network, the given mounts read-only, hardened like a replica. Ok when Envoy accepts
    /// the configuration; otherwise an error carrying the last lines of Envoy's output. The
    /// container is removed in every case.
    pub async fn validate(
        &self,
        image: &str,
        mounts: &[Mount],
        config_path: &str,
        extra_labels: &BTreeMap<String, String>,
    ) -> Result<()> {
        let args: Vec<String> = [
            "-c",
            config_path,
            "--disable-hot-restart",
            // An xDS (ADS) bootstrap needs a node id and cluster; replicas get theirs from
            // --service-node/--service-cluster, so validation must pass some too.
            "--service-cluster",
            "berth-validate",
            "--service-node",
            "berth-validate",
        ]
        .map(String::from)
        .to_vec();
        self.validate_with_args(image, mounts, &args, extra_labels)
            .await
    }

    /// [`Engine::validate`] with Envoy's arguments as given (after `--mode validate`): those a
    /// replica runs with, so that a flag Envoy does not accept fails here, not at start.
    pub async fn validate_with_args(
        &self,
        image: &str,
        mounts: &[Mount],
        args: &[String],
        extra_labels: &BTreeMap<String, String>,
    ) -> Result<()> {
        for m in mounts {
            check_readable_by_replica(&m.source)?;
        }
        let mut labels: HashMap<String, String> = extra_labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(LABEL_VALIDATE.into(), "1".into());
        let host_config = HostConfig {
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            mounts: Some(
                mounts
                    .iter()
                    .map(|m| {
                        bind_mount(&Mount {
                            read_only: true,
                            ..m.clone()
                        })
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.into()),
            user: Some(REPLICA_USER.into()),
            cmd: Some(
                ["--mode".to_string(), "validate".to_string()]
                    .into_iter()
                    .chain(args.iter().cloned())
                    .collect(),
            ),
            labels: Some(labels),
            host_config: Some(host_config),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(None, body)
            .await
            .map_err(docker_error)
            .with_context(|| format!("creating a validate container from {image}"))?;
        let id = created.id;
        let result = self.run_validate(&id, image).await;
        let removed = self.remove(&id).await;
        result?;
        removed
    }

    async fn run_validate(&self, id: &str, image: &str) -> Result<()> {
        self.start(id).await?;
        let exit = tokio::time::timeout(VALIDATE_TIMEOUT, async {
            let mut wait = self.docker.wait_container(id, None);
            match wait.next().await {
                Some(Ok(r)) => Ok(r.status_code),
                Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
                Some(Err(e)) => Err(docker_error(e)),
                None => Err(anyhow!("the engine ended the wait without an exit code")),
            }
        })
        .await
        .map_err(|_| anyhow!("envoy --mode validate did not finish within {VALIDATE_TIMEOUT:?}"))?
        .with_context(|| format!("waiting for validate container {id}"))?;
        if exit == 0 {
            return Ok(());
        }
        let logs = self.logs_tail(id, 20).await.unwrap_or_default();
        bail!(
            "Envoy ({image}) rejected the configuration (exit code {exit}):\n{}",
            logs.trim_end()
        )
    }

    /// A stream of container events (die, destroy, stop, …) of containers matching a label
    /// filter (`key` or `key=value`), from now on. The stream ends or fails when the engine
    /// goes away; the caller reconnects.
    pub fn events(
        &self,
        label_filter: &str,
        actions: &[&str],
    ) -> impl futures_util::Stream<Item = Result<ContainerEvent>> + Send + 'static {
        let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
        filters.insert("type", vec!["container"]);
        filters.insert("label", vec![label_filter]);
        filters.insert("event", actions.to_vec());
        let opts = bollard::query_parameters::EventsOptionsBuilder::default()
            .filters(&filters)
            .build();
        // bollard's timeout bounds only the response headers, which /events sends at once.
        self.docker.events(Some(opts)).map(|r| {
            let e = r.map_err(docker_error)?;
            let attrs = e.actor.as_ref().and_then(|a| a.attributes.clone());
            Ok(ContainerEvent {
                action: e.action.unwrap_or_default(),
                id: e.actor.and_then(|a| a.id).unwrap_or_default(),
                proxy: attrs
                    .as_ref()
                    .and_then(|a| a.get(crate::replica::LABEL_PROXY).cloned()),
                name: attrs.and_then(|a| a.get("name").cloned()),
            })
        })
    }

    /// Removes every container matching a label filter (`key` or `key=value`), in any state.
    /// Returns how many were removed.
    pub async fn remove_labelled(&self, label_filter: &str) -> Result<usize> {
        let found = self.list_labelled(label_filter).await?;
        let ids: Vec<String> = found.into_iter().filter_map(|c| c.id).collect();
        let n = ids.len();
        futures_util::stream::iter(ids.iter().map(|id| self.remove(id)))
            .buffer_unordered(8)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(n)
    }
}

/// Creates a replica's run directory: owned by the replica user, mode 0700.
fn prepare_run_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the replica run directory {}", dir.display()))?;
    std::os::unix::fs::chown(dir, Some(REPLICA_UID), Some(REPLICA_GID)).with_context(|| {
        format!(
            "handing the run directory {} to uid {REPLICA_UID} (Envoy creates its admin socket \
             there); berth must run as root to do this",
            dir.display()
        )
    })?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("setting mode 0700 on {}", dir.display()))?;
    Ok(())
}

/// Envoy runs as uid 101: a mounted directory must be searchable and readable by it, and the
/// files directly in it readable, or Envoy fails later with a vague "unable to read file".
/// (The directories above a mount source do not matter: the engine resolves them as root.)
pub fn check_readable_by_replica(source: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let allowed = |md: &std::fs::Metadata, need: u32| {
        let mode = md.mode();
        (mode & need) == need
            || (md.uid() == REPLICA_UID && (mode & (need << 6)) == need << 6)
            || (md.gid() == REPLICA_GID && (mode & (need << 3)) == need << 3)
    };
    let md =
        std::fs::metadata(source).with_context(|| format!("mount source {}", source.display()))?;
    let hint = "Envoy runs as uid 101: make mounted directories 0755 and files 0644 \
                (files written through a temporary file are 0600 unless chmod-ed before the rename)";
    if md.is_dir() {
        if !allowed(&md, 0o5) {
            bail!(
                "mount source {} (mode {:o}) is not readable by uid {REPLICA_UID}; {hint}",
                source.display(),
                md.mode() & 0o7777
            );
        }
        for entry in std::fs::read_dir(source)
            .with_context(|| format!("reading {}", source.display()))?
            .flatten()
        {
            let Ok(fmd) = entry.metadata() else { continue };
            let need = if fmd.is_dir() { 0o5 } else { 0o4 };
            if (fmd.is_file() || fmd.is_dir()) && !allowed(&fmd, need) {
                bail!(
                    "{} (mode {:o}) is not readable by uid {REPLICA_UID}; {hint}",
                    entry.path().display(),
                    fmd.mode() & 0o7777
                );
            }
        }
    } else if !allowed(&md, 0o4) {
        bail!(
            "mount source {} (mode {:o}) is not readable by uid {REPLICA_UID}; {hint}",
            source.display(),
            md.mode() & 0o7777
        );
    }
    Ok(())
}

fn bind_mount(m: &Mount) -> DockerMount {
    DockerMount {
        target: Some(m.target.clone()),
        source: Some(m.source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(m.read_only),
        ..Default::default()
    }
}

fn observed_from(
    summary: bollard::models::ContainerSummary,
    inspect: &ContainerInspectResponse,
) -> ObservedContainer {
    let name = summary
        .names
        .as_ref()
        .and_then(|n| n.first().cloned())
        .or_else(|| inspect.name.clone())
        .unwrap_or_default();
    let name = name.strip_prefix('/').unwrap_or(&name).to_string();
    // Inspect is newer than list: prefer its state.
    let state = inspect
        .state
        .as_ref()
        .and_then(|s| s.status)
        .map(run_state_of)
        .or(summary.state.map(summary_state_of))
        .unwrap_or(RunState::Dead);
    let hc = inspect.host_config.as_ref();
    let restart_policy = hc
        .and_then(|h| h.restart_policy.as_ref())
        .and_then(|r| r.name)
        .map(|n| match n {
            RestartPolicyNameEnum::EMPTY => "no".to_string(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "no".into());
    ObservedContainer {
        id: summary.id.unwrap_or_default(),
        name,
        labels: summary.labels.unwrap_or_default().into_iter().collect(),
        state,
        live: LiveSettings {
            // Docker reports 0 for "no limit".
            nano_cpus: hc.and_then(|h| h.nano_cpus).filter(|v| *v > 0),
            memory: hc.and_then(|h| h.memory).filter(|v| *v > 0),
            restart_policy,
        },
        info: ContainerInfo {
            image: summary.image.clone().unwrap_or_default(),
            pid: inspect
                .state
                .as_ref()
                .and_then(|s| s.pid)
                .filter(|p| *p > 0)
                .map(|p| p as u32),
            started_at: inspect
                .state
                .as_ref()
                .filter(|s| s.running == Some(true))
                .and_then(|s| s.started_at.clone()),
        },
    }
}

/// Docker's container state as berth's. `stopping` (newer engines) is still running; an empty
/// state is unknown, treated as dead.
pub fn run_state_of(s: ContainerStateStatusEnum) -> RunState {
    match s {
        ContainerStateStatusEnum::CREATED => RunState::Created,
        ContainerStateStatusEnum::RUNNING | ContainerStateStatusEnum::STOPPING => RunState::Running,
        ContainerStateStatusEnum::PAUSED => RunState::Paused,
        ContainerStateStatusEnum::RESTARTING => RunState::Restarting,
        ContainerStateStatusEnum::REMOVING => RunState::Removing,
        ContainerStateStatusEnum::EXITED => RunState::Exited,
        ContainerStateStatusEnum::DEAD | ContainerStateStatusEnum::EMPTY => RunState::Dead,
    }
}

fn summary_state_of(s: ContainerSummaryStateEnum) -> RunState {
    match s {
        ContainerSummaryStateEnum::CREATED => RunState::Created,
        ContainerSummaryStateEnum::RUNNING | ContainerSummaryStateEnum::STOPPING => {
            RunState::Running
        }
        ContainerSummaryStateEnum::PAUSED => RunState::Paused,
        ContainerSummaryStateEnum::RESTARTING => RunState::Restarting,
        ContainerSummaryStateEnum::REMOVING => RunState::Removing,
        ContainerSummaryStateEnum::EXITED => RunState::Exited,
        ContainerSummaryStateEnum::DEAD | ContainerSummaryStateEnum::EMPTY => RunState::Dead,
    }
}

fn is_not_found(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// bollard's error with the engine's own message up front.
fn docker_error(e: BollardError) -> anyhow::Error {
    match e {
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => anyhow!("{message} (engine status {status_code})"),
        BollardError::DockerStreamError { error } => anyhow!("{error}"),
        other => anyhow!(other),
    }
}

/// Where the engine is expected, for error messages.
fn docker_host_description() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(h) if !h.is_empty() => h,
        _ => "unix:///var/run/docker.sock".into(),
    }
}

/// Splits "repo[:tag][@digest]" into what the pull API wants. A digest reference is passed
/// whole as the repository with an empty tag; no tag means "latest".
pub fn split_image(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// The Envoy version an image name suggests ("envoyproxy/envoy:v1.36.2" → "1.36.2"), for the
/// hint to build a local image; "1.40.0" when the tag says nothing.
fn image_version_hint(image: &str) -> String {
    let (_, tag) = split_image(image);
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let looks_like_version = tag.split('.').count() == 3
        && tag
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    if looks_like_version {
        tag.to_string()
    } else {
        "1.40.0".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_image_references() {
        assert_eq!(
            split_image("envoyproxy/envoy:v1.36.2"),
            ("envoyproxy/envoy", "v1.36.2")
        );
        assert_eq!(split_image("envoy"), ("envoy", "latest"));
        assert_eq!(
            split_image("localhost:5000/envoy"),
            ("localhost:5000/envoy", "latest")
        );
        assert_eq!(
            split_image("localhost:5000/envoy:1.40.0"),
            ("localhost:5000/envoy", "1.40.0")
        );
        assert_eq!(split_image("envoy@sha256:abc"), ("envoy@sha256:abc", ""));
    }

    #[test]
    fn mount_sources_must_be_readable_by_the_replica_user() {
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bootstrap.yaml");
        std::fs::write(&file, "x").unwrap();
        set(dir.path(), 0o755);
        set(&file, 0o644);
        check_readable_by_replica(dir.path()).unwrap();
        check_readable_by_replica(&file).unwrap();
        set(&file, 0o600);
        let err = check_readable_by_replica(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bootstrap.yaml") && err.contains("600"),
            "{err}"
        );
        set(&file, 0o644);
        set(dir.path(), 0o700);
        let err = check_readable_by_replica(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("700"), "{err}");
        assert!(check_readable_by_replica(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn restart_policy_is_the_specs() {
        assert_eq!(
            RestartPolicyNameEnum::UNLESS_STOPPED.to_string(),
            crate::replica::RESTART_POLICY
        );
    }

    #[test]
    fn version_hint_from_tag() {
        assert_eq!(image_version_hint("envoyproxy/envoy:v1.36.2"), "1.36.2");
        assert_eq!(image_version_hint("berth-test/envoy:1.39.3"), "1.39.3");
        assert_eq!(image_version_hint("berth-test/does-not-exist:1"), "1.40.0");
        assert_eq!(image_version_hint("envoy"), "1.40.0");
    }
}
