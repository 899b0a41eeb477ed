//! The Docker Engine API implementation of [`ContainerEngine`] (bollard). Podman's
//! Docker-compatible API is spoken the same way.
//!
//! A thin, policy-free translation: every request is one Engine API call (counted, for
//! benchmarks); errors carry the engine's own words and say that they are the engine's
//! ([`EngineError::Refused`]), never Envoy's. The API version is negotiated down to what the
//! daemon speaks (Debian's docker.io 20.10 answers 1.41).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum,
    ContainerSummaryStateEnum, HostConfig, Mount as DockerMount, MountType, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
    EventsOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    PushImageOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    TagImageOptionsBuilder,
};
use bollard::{ClientVersion, Docker};
use futures_util::{StreamExt, TryStreamExt};

use super::{
    ContainerEngine, ContainerEvent, ContainerInfo, ContainerStatus, EngineError, EngineResult,
    Events, Exited, Hardening, ImageBuild, Inspected, LabelFilter, LiveSettings, Mount, Network,
    ObservationCache, ObservedContainer, OneShot, PullError, PullFailure, ReplicaContainer,
    RunState,
};

/// bollard's per-request timeout; `stop` raises it for its own request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the first request may take before berth asks `/version` instead (which then says
/// why the engine does not answer).
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Inspects in flight at once while observing.
const INSPECT_CONCURRENCY: usize = 16;
/// The container actions [`ContainerEngine::events`] reports.
/// `died` and `remove` are Podman's names for `die` and `destroy` ([`Flavor`]); Docker
/// matches its own names only, so asking for both is harmless.
const EVENT_ACTIONS: &[&str] = &[
    "create", "start", "restart", "die", "died", "destroy", "remove", "update", "rename", "stop",
    "kill", "oom", "pause", "unpause",
];

/// A connection to a Docker (or Docker-compatible) engine.
#[derive(Clone)]
pub struct DockerEngine {
    docker: Docker,
    endpoint: String,
    /// "Docker Engine 20.10.24", "Podman Engine 4.3.1": from `/version`, for messages.
    product: String,
    /// Podman's Docker-compatible service rather than dockerd (see [`Flavor`]).
    flavor: Flavor,
    /// API requests made since `connect` (including version negotiation).
    calls: Arc<AtomicU64>,
}

/// Which engine serves the Docker Engine API. Podman's compatible API differs where it
/// matters to berth:
///
/// - restart after a reboot: Podman has no daemon; `podman-restart.service` starts only
///   containers whose policy is `always` (`podman start --all --filter restart-policy=always`),
///   so replicas are created with `always` there and `always` reads back as berth's policy;
/// - local images are named `localhost/NAME` once stored (`berth-test/envoy:1.40.0` is listed
///   as `localhost/berth-test/envoy:1.40.0`): status shows the name as configured;
/// - the events stream calls a removal `remove` (Docker: `destroy`), and its `event` filter
///   matches the internal status `died`, not `die`: both names are asked for, and `remove` is
///   reported as `destroy`;
/// - inspect and list say `stopped` for a container that exited and awaits cleanup or its restart
///   ([`DockerEngine::inspect_stopped`], [`DockerEngine::list_with_stopped`]);
/// - a name in use is HTTP 500 "… is already in use" (Docker: 409), read as a conflict;
/// - inspect lists every dropped capability instead of `ALL`, omits `HostConfig.Mounts` and
///   spells `no-new-privileges` without `:true` (berth does not read these back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Docker,
    Podman,
}

impl DockerEngine {
    /// Connects to the engine at [`endpoint`] and negotiates the API version down to what it
    /// speaks, learning which engine it is from the same `/version` request.
    pub async fn connect() -> EngineResult<DockerEngine> {
        let endpoint = endpoint();
        let calls = Arc::new(AtomicU64::new(0));
        let unreachable = |e: BollardError| EngineError::Unreachable {
            endpoint: endpoint.clone(),
            message: e.to_string(),
        };
        let client = |version: &ClientVersion| -> Result<Docker, BollardError> {
            let counter = calls.clone();
            let docker = if endpoint.starts_with("unix://") {
                Docker::connect_with_unix(&endpoint, REQUEST_TIMEOUT.as_secs(), version)?
            } else if endpoint.starts_with("tcp://") || endpoint.starts_with("http://") {
                Docker::connect_with_http(&endpoint, REQUEST_TIMEOUT.as_secs(), version)?
            } else {
                Docker::connect_with_host(&endpoint)?
            };
            Ok(docker
                .with_timeout(REQUEST_TIMEOUT)
                .with_request_modifier(move |req| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    req
                }))
        };
        let docker = client(bollard::API_DEFAULT_VERSION).map_err(unreachable)?;
        let pinged = match endpoint.strip_prefix("unix://") {
            Some(path) => {
                calls.fetch_add(1, Ordering::Relaxed);
                super::ping::unix(path, PING_TIMEOUT).await
            }
            None => None,
        };
        let (product, flavor, api_version) = match pinged {
            Some(p) => (p.product, p.flavor, Some(p.api_version)),
            None => {
                let version = docker.version().await.map_err(unreachable)?;
                let (product, flavor) = product_of(&version);
                (product, flavor, version.api_version)
            }
        };
        let server = api_version
            .as_deref()
            .and_then(parse_api_version)
            .ok_or_else(|| EngineError::Unreachable {
                endpoint: endpoint.clone(),
                message: format!("{product} did not say which API version it speaks"),
            })?;
        let docker = if server < docker.client_version() {
            client(&server).map_err(unreachable)?
        } else {
            docker
        };
        Ok(DockerEngine {
            docker,
            endpoint,
            product,
            flavor,
            calls,
        })
    }

    /// The bollard client, for callers that need an engine call the seam does not have
    /// (tests inspecting what `create` made).
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// Docker or Podman.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// The API version in use after negotiation, e.g. "1.41".
    pub fn api_version(&self) -> String {
        let v = self.docker.client_version();
        format!("{}.{}", v.major_version, v.minor_version)
    }

    /// Removes every container matching `filter`, in any state. Returns how many.
    pub async fn remove_matching(&self, filter: &LabelFilter) -> EngineResult<usize> {
        let ids: Vec<String> = self
            .list(filter)
            .await?
            .into_iter()
            .filter_map(|c| c.id)
            .collect();
        futures_util::stream::iter(ids.iter().map(|id| self.remove(id)))
            .buffer_unordered(8)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(ids.len())
    }

    /// Inspects a container; `None` when there is none.
    async fn inspect(&self, id: &str) -> EngineResult<Option<ContainerInspectResponse>> {
        match self.docker.inspect_container(id, None).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) if self.flavor == Flavor::Podman && e.to_string().contains("`stopped`") => {
                self.inspect_stopped(id, e).await
            }
            Err(e) => Err(self.refused(format!("inspect container {id}"), e).await),
        }
    }

    /// Podman's inspect of a container that exited and whose cleanup (or restart by policy) is
    /// still pending says `State.Status: "stopped"`, a word of Podman's own that the Engine API
    /// (and bollard's typed answer) does not have. Read the answer raw, as "exited".
    async fn inspect_stopped(
        &self,
        id: &str,
        typed: BollardError,
    ) -> EngineResult<Option<ContainerInspectResponse>> {
        let Some(socket) = self.endpoint.strip_prefix("unix://") else {
            return Err(self.refused(format!("inspect container {id}"), typed).await);
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        let path = format!("/v{}/containers/{id}/json", self.api_version());
        let refused = |message: String| EngineError::Refused {
            engine: self.describe(),
            operation: format!("inspect container {id}"),
            status: 0,
            message,
        };
        let (status, body) = crate::envoy::admin::Admin::new(socket)
            .with_timeout(REQUEST_TIMEOUT)
            .get(&path)
            .await
            .map_err(|e| refused(format!("{e:#}")))?;
        match status {
            404 => return Ok(None),
            200 => {}
            _ => return Err(refused(format!("HTTP {status}: {}", body.trim()))),
        }
        let mut value: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| refused(e.to_string()))?;
        if let Some(state) = value.pointer_mut("/State/Status") {
            if state == "stopped" {
                *state = "exited".into();
            }
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| refused(e.to_string()))
    }

    /// The restart policy to create with, for berth's engine-neutral name.
    fn restart_policy_for(&self, name: &str) -> RestartPolicyNameEnum {
        if self.flavor == Flavor::Podman && name == super::RESTART_UNLESS_STOPPED {
            return RestartPolicyNameEnum::ALWAYS;
        }
        restart_policy_of(name)
    }

    /// The engine's error, said to be the engine's.
    pub async fn refused(&self, operation: impl Into<String>, e: BollardError) -> EngineError {
        let operation = operation.into();
        let (status, message) = match e {
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => (status_code, message),
            BollardError::DockerStreamError { error } => (0, error),
            BollardError::DockerContainerWaitError { error, code } => {
                (0, format!("{error} (exit code {code})"))
            }
            other if is_connection_error(&other) => {
                return EngineError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    message: other.to_string(),
                }
            }
            other => (0, other.to_string()),
        };
        // Podman answers a name in use with 500 ("… is already in use"); Docker with 409.
        let status = if status == 500 && message.contains("is already in use") {
            409
        } else {
            status
        };
        EngineError::Refused {
            engine: self.describe(),
            operation,
            status,
            message,
        }
    }

    /// The containers matching `filter` (the daemon filters; anything else is dropped).
    async fn list_matching(
        &self,
        filter: &LabelFilter,
    ) -> EngineResult<Vec<bollard::models::ContainerSummary>> {
        let mut summaries = self.list(filter).await?;
        summaries.retain(|s| {
            filter.matches(&s.labels.clone().unwrap_or_default().into_iter().collect())
        });
        Ok(summaries)
    }

    /// Inspects `ids` concurrently. A container removed meanwhile is left out: it is gone,
    /// not an error.
    async fn inspect_all(&self, ids: &[String]) -> EngineResult<BTreeMap<String, Inspected>> {
        let found = futures_util::stream::iter(ids.iter().cloned().map(|id| async move {
            Ok(self
                .inspect(&id)
                .await?
                .map(|i| (id, inspected_of(&i, self.flavor))))
        }))
        .buffer_unordered(INSPECT_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// The last look's containers, when the engine reports no event for any container of
    /// `filter` since that look's witness: every change to a container (created, started,
    /// died, removed, renamed, updated) is an event, so the list would say the same. One
    /// request instead of a list and an events request. None when anything happened, or the
    /// witness is gone (evicted, or the engine restarted): then the caller lists.
    async fn unchanged_since_last_look(
        &self,
        filter: &LabelFilter,
        cache: &mut ObservationCache,
    ) -> EngineResult<Option<Vec<ObservedContainer>>> {
        let (Some(found), Some(witness)) = (&cache.found, cache.witness.as_deref()) else {
            return Ok(None);
        };
        let (newest, changed) = self.events_since(filter, Some(witness)).await?;
        if !changed.is_some_and(|c| c.is_empty()) {
            return Ok(None);
        }
        let found = found.clone();
        cache.vouched = found.iter().map(|c| c.id.clone()).collect();
        if newest.is_some() {
            cache.witness = newest;
        }
        Ok(Some(found))
    }

    /// The engine's buffered container events matching `filter` from `witness` (inclusive) up
    /// to now: the newest event's token, and the containers with an event after the witness.
    /// `None` for the containers when the witness is absent or no longer buffered: nothing
    /// can be vouched for.
    async fn events_since(
        &self,
        filter: &LabelFilter,
        witness: Option<&str>,
    ) -> EngineResult<(Option<String>, Option<BTreeSet<String>>)> {
        let labels = filter.engine_values();
        let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
        filters.insert("type", vec!["container"]);
        filters.insert("label", labels.iter().map(String::as_str).collect());
        let since = witness
            .and_then(|w| w.split_once(' '))
            .map_or("0".to_string(), |(nanos, _)| since_of(nanos));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let until = format!("{}.{:09}", now.as_secs(), now.subsec_nanos());
        let opts = EventsOptionsBuilder::default()
            .since(&since)
            .until(&until)
            .filters(&filters)
            .build();
        let events: Vec<bollard::models::EventMessage> =
            match self.docker.events(Some(opts)).try_collect().await {
                Ok(events) => events,
                Err(e) => return Err(self.refused("list recent events", e).await),
            };
        let tokens: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                let id = e
                    .actor
                    .as_ref()
                    .and_then(|a| a.id.clone())
                    .unwrap_or_default();
                let token = format!(
                    "{} {} {}",
                    e.time_nano.unwrap_or_default(),
                    id,
                    e.action.as_deref().unwrap_or_default()
                );
                (token, id)
            })
            .collect();
        let newest = tokens.last().map(|(t, _)| t.clone());
        let changed = witness.and_then(|w| {
            let at = tokens.iter().position(|(t, _)| t == w)?;
            Some(tokens[at + 1..].iter().map(|(_, id)| id.clone()).collect())
        });
        Ok((newest, changed))
    }

    async fn list(
        &self,
        filter: &LabelFilter,
    ) -> EngineResult<Vec<bollard::models::ContainerSummary>> {
        let values = filter.engine_values();
        let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
        filters.insert("label", values.iter().map(String::as_str).collect());
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        match self.docker.list_containers(Some(opts)).await {
            Ok(list) => Ok(list),
            Err(e) if self.flavor == Flavor::Podman && e.to_string().contains("`stopped`") => {
                self.list_with_stopped(&filters, e).await
            }
            Err(e) => Err(self.refused("list containers", e).await),
        }
    }

    /// Podman lists a container that exited and awaits its cleanup as `State: "stopped"`
    /// (see [`DockerEngine::inspect_stopped`]); read the list raw, with those as "exited".
    async fn list_with_stopped(
        &self,
        filters: &HashMap<&str, Vec<&str>>,
        typed: BollardError,
    ) -> EngineResult<Vec<bollard::models::ContainerSummary>> {
        let Some(socket) = self.endpoint.strip_prefix("unix://") else {
            return Err(self.refused("list containers", typed).await);
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        let refused = |message: String| EngineError::Refused {
            engine: self.describe(),
            operation: "list containers".into(),
            status: 0,
            message,
        };
        let filters = serde_json::to_string(filters).map_err(|e| refused(e.to_string()))?;
        let path = format!(
            "/v{}/containers/json?all=1&filters={}",
            self.api_version(),
            crate::envoy::admin::percent_encode(&filters)
        );
        let (status, body) = crate::envoy::admin::Admin::new(socket)
            .with_timeout(REQUEST_TIMEOUT)
            .get(&path)
            .await
            .map_err(|e| refused(format!("{e:#}")))?;
        if status != 200 {
            return Err(refused(format!("HTTP {status}: {}", body.trim())));
        }
        let mut value: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| refused(e.to_string()))?;
        for container in value.as_array_mut().into_iter().flatten() {
            if let Some(state) = container.get_mut("State") {
                if state == "stopped" {
                    *state = "exited".into();
                }
            }
        }
        serde_json::from_value(value).map_err(|e| refused(e.to_string()))
    }

    /// Pulls `image` with the Docker client's credentials for its registry, drawing a byte
    /// progress bar on stderr when `progress`. Errors are classified and name the image and
    /// the registry, never a credential.
    async fn pull_from_registry(&self, image: &str, progress: bool) -> EngineResult<()> {
        use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
        let registry = super::credentials::registry_of(image).to_string();
        let failed = |failure, detail: String, with_credentials| {
            // On a host without a registry the usual fix is a locally built image.
            let hint = if registry == "docker.io" {
                let version = image_version_hint(image);
                format!(
                    "\nhint: on a host without a registry, build a local Envoy image with \
                     `scripts/envoy-image.sh {version}` and use berth/envoy:{version}"
                )
            } else {
                String::new()
            };
            EngineError::Pull(PullError {
                image: image.to_string(),
                registry: registry.clone(),
                failure,
                detail,
                with_credentials,
                hint,
            })
        };
        let lookup = registry.clone();
        let credentials = tokio::task::spawn_blocking(move || super::credentials::lookup(&lookup))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|detail| failed(PullFailure::Credentials, detail, false))?;
        let with_credentials = credentials.is_some();
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
        let mut stream = self.docker.create_image(Some(opts), None, credentials);
        while let Some(info) = stream.next().await {
            let info = match info {
                Ok(info) => info,
                Err(e) => {
                    bar.abandon_with_message(format!("pulling {image} failed"));
                    if is_connection_error(&e) {
                        return Err(EngineError::Unreachable {
                            endpoint: self.endpoint.clone(),
                            message: e.to_string(),
                        });
                    }
                    let detail = match e {
                        BollardError::DockerResponseServerError { message, .. } => message,
                        BollardError::DockerStreamError { error } => error,
                        other => other.to_string(),
                    };
                    return Err(failed(
                        PullFailure::classify(&detail),
                        detail,
                        with_credentials,
                    ));
                }
            };
            if let Some(err) = info.error_detail.and_then(|d| d.message) {
                bar.abandon_with_message(format!("pulling {image} failed"));
                return Err(failed(PullFailure::classify(&err), err, with_credentials));
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
}

#[async_trait]
impl ContainerEngine for DockerEngine {
    fn describe(&self) -> String {
        format!("{} at {}", self.product, self.endpoint)
    }

    fn container_of_process(&self, pid: u32) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        container_id_in_cgroup(&text)
    }

    fn api_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    async fn ping(&self) -> bool {
        self.docker.ping().await.is_ok()
    }

    /// One list call filtered by label, then one inspect per container (concurrently) for
    /// what list cannot tell: memory, CPUs, restart policy, PID and start time.
    async fn observe(&self, filter: &LabelFilter) -> EngineResult<Vec<ObservedContainer>> {
        let summaries = self.list_matching(filter).await?;
        let ids: Vec<String> = summaries.iter().filter_map(|s| s.id.clone()).collect();
        let mut inspected = self.inspect_all(&ids).await?;
        Ok(assemble(
            summaries,
            &mut inspected,
            &BTreeMap::new(),
            self.flavor,
        ))
    }

    /// One list, one look at the engine's recent events matching `filter` (Docker keeps the
    /// last 256 in memory), and an inspect of only the containers the cache cannot vouch for:
    /// those it has never seen, and those with any event since its witness, the newest event
    /// it had seen. The cache vouches for nothing when that witness is no longer among the
    /// engine's events (evicted by newer ones, or the engine restarted and forgot them): then
    /// every container is inspected, as [`ContainerEngine::observe`] does. `docker update`
    /// (memory, CPUs, restart policy) is a container event, so it is always seen.
    ///
    /// Podman keeps its events elsewhere, and a remote engine's clock is not this host's
    /// (the events are asked for up to "now"): both are observed in full.
    async fn observe_cached(
        &self,
        filter: &LabelFilter,
        cache: &mut ObservationCache,
    ) -> EngineResult<Vec<ObservedContainer>> {
        let values = filter.engine_values();
        if self.flavor != Flavor::Docker || !self.endpoint.starts_with("unix://") {
            *cache = ObservationCache::default();
            return self.observe(filter).await;
        }
        if cache.filter != values {
            *cache = ObservationCache {
                filter: values,
                ..Default::default()
            };
        }
        if let Some(found) = self.unchanged_since_last_look(filter, cache).await? {
            return Ok(found);
        }
        let summaries = self.list_matching(filter).await?;
        let (witness, changed) = self.events_since(filter, cache.witness.as_deref()).await?;
        let trusted: BTreeMap<String, Inspected> = match &changed {
            Some(changed) => std::mem::take(&mut cache.inspected)
                .into_iter()
                .filter(|(id, _)| !changed.contains(id))
                .collect(),
            None => BTreeMap::new(),
        };
        let stale: Vec<String> = summaries
            .iter()
            .filter_map(|s| s.id.clone())
            .filter(|id| !trusted.contains_key(id))
            .collect();
        let mut inspected = self.inspect_all(&stale).await?;
        let out = assemble(summaries, &mut inspected, &trusted, self.flavor);
        cache.vouched = out
            .iter()
            .filter(|c| trusted.contains_key(&c.id))
            .map(|c| c.id.clone())
            .collect();
        cache.witness = witness;
        cache.inspected = inspected;
        cache.inspected.extend(
            trusted
                .into_iter()
                .filter(|(id, _)| out.iter().any(|c| &c.id == id)),
        );
        cache.found = Some(out.clone());
        Ok(out)
    }

    async fn status(&self, id: &str) -> EngineResult<Option<ContainerStatus>> {
        let Some(inspect) = self.inspect(id).await? else {
            return Ok(None);
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

    async fn image_id(&self, image: &str) -> EngineResult<Option<String>> {
        match self.docker.inspect_image(image).await {
            Ok(img) => Ok(img.id),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.refused(format!("inspect image {image}"), e).await),
        }
    }

    async fn ensure_image(&self, image: &str, progress: bool) -> EngineResult<String> {
        if let Some(id) = self.image_id(image).await? {
            return Ok(id);
        }
        self.pull(image, progress).await
    }

    async fn pull(&self, image: &str, progress: bool) -> EngineResult<String> {
        self.pull_from_registry(image, progress).await?;
        self.image_id(image)
            .await?
            .ok_or_else(|| EngineError::ImageUnavailable {
                image: image.to_string(),
                message: "it was pulled but is not present afterwards".to_string(),
                hint: String::new(),
            })
    }

    async fn image_entrypoint(&self, image: &str) -> EngineResult<Option<Vec<String>>> {
        match self.docker.inspect_image(image).await {
            Ok(img) => Ok(Some(
                img.config.and_then(|c| c.entrypoint).unwrap_or_default(),
            )),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.refused(format!("inspect image {image}"), e).await),
        }
    }

    async fn build_image(&self, build: &ImageBuild, progress: bool) -> EngineResult<String> {
        let operation = format!("build image {}", build.tag);
        let opts = BuildImageOptionsBuilder::default()
            .t(&build.tag)
            .dockerfile("Dockerfile")
            .rm(true)
            .forcerm(true)
            .labels(&build.labels.clone().into_iter().collect::<HashMap<_, _>>())
            .build();
        let body = bollard::body_full(build.context.clone().into());
        let mut stream = self.docker.build_image(opts, None, Some(body));
        let mut log = String::new();
        while let Some(info) = stream.next().await {
            let info = match info {
                Ok(info) => info,
                Err(e) => return Err(self.refused(operation, e).await),
            };
            if let Some(message) = info.error_detail.and_then(|d| d.message) {
                return Err(EngineError::Refused {
                    engine: self.describe(),
                    operation,
                    status: 0,
                    message: format!("{message}\n{log}").trim_end().to_string(),
                });
            }
            if let Some(line) = info.stream {
                if progress {
                    eprint!("{line}");
                }
                log.push_str(&line);
            }
        }
        self.image_id(&build.tag)
            .await?
            .ok_or_else(|| EngineError::Refused {
                engine: self.describe(),
                operation,
                status: 0,
                message: format!(
                    "the build ended without an image tagged {}: {log}",
                    build.tag
                ),
            })
    }

    async fn tag_image(&self, image: &str, target: &str) -> EngineResult<()> {
        let (repo, tag) = split_image(target);
        let opts = TagImageOptionsBuilder::default()
            .repo(repo)
            .tag(tag)
            .build();
        match self.docker.tag_image(image, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self
                .refused(format!("tag image {image} as {target}"), e)
                .await),
        }
    }

    async fn push_image(&self, image: &str, progress: bool) -> EngineResult<String> {
        let registry = super::credentials::registry_of(image).to_string();
        let operation = format!("push image {image} to registry {registry}");
        let refused = |message: String| EngineError::Refused {
            engine: self.describe(),
            operation: operation.clone(),
            status: 0,
            message,
        };
        let lookup = registry.clone();
        let credentials = tokio::task::spawn_blocking(move || super::credentials::lookup(&lookup))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|e| refused(format!("the credentials could not be read: {e}")))?;
        let with_credentials = credentials.is_some();
        let (repo, tag) = split_image(image);
        let opts = PushImageOptionsBuilder::default().tag(tag).build();
        // The engine wants an X-Registry-Auth header on a push, empty or not.
        let mut stream =
            self.docker
                .push_image(repo, Some(opts), Some(credentials.unwrap_or_default()));
        let failed = |detail: String| {
            let config = super::credentials::config_file()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "~/.docker/config.json".into());
            let hint = match PullFailure::classify(&detail) {
                PullFailure::Unauthorized if with_credentials => format!(
                    "; the registry refused the credentials from {config}: run `docker login {registry}` as the user berth runs as (or set DOCKER_CONFIG)"
                ),
                PullFailure::Unauthorized => format!(
                    "; {config} has no credentials for {registry}: run `docker login {registry}` as the user berth runs as (or set DOCKER_CONFIG)"
                ),
                PullFailure::Unreachable => format!("; is registry {registry} up and reachable from this host?"),
                _ => String::new(),
            };
            refused(format!("{detail}{hint}"))
        };
        while let Some(info) = stream.next().await {
            let info = match info {
                Ok(info) => info,
                Err(e) if is_connection_error(&e) => {
                    return Err(EngineError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        message: e.to_string(),
                    })
                }
                Err(BollardError::DockerResponseServerError { message, .. })
                | Err(BollardError::DockerStreamError { error: message }) => {
                    return Err(failed(message))
                }
                Err(e) => return Err(failed(e.to_string())),
            };
            if let Some(message) = info.error_detail.and_then(|d| d.message) {
                return Err(failed(message));
            }
            if progress {
                if let Some(status) = info.status {
                    eprintln!("push {image}: {status}");
                }
            }
        }
        let inspected = match self.docker.inspect_image(image).await {
            Ok(i) => i,
            Err(e) => return Err(self.refused(format!("inspect image {image}"), e).await),
        };
        inspected
            .repo_digests
            .unwrap_or_default()
            .into_iter()
            .find(|d| d.split_once('@').is_some_and(|(r, _)| r == repo))
            .ok_or_else(|| {
                refused(format!(
                    "the push ended without a digest of {repo} on the image"
                ))
            })
    }

    async fn create(&self, c: &ReplicaContainer) -> EngineResult<String> {
        let host_config = HostConfig {
            restart_policy: Some(RestartPolicy {
                name: Some(self.restart_policy_for(&c.restart_policy)),
                maximum_retry_count: None,
            }),
            nano_cpus: c.nano_cpus,
            memory: c.memory,
            ..host_config(&c.hardening, c.network, &c.mounts)
        };
        let body = ContainerCreateBody {
            image: Some(c.image.clone()),
            user: Some(c.hardening.user.to_string()),
            cmd: Some(c.args.clone()),
            env: Some(c.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(c.labels.clone().into_iter().collect()),
            host_config: Some(host_config),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default()
            .name(&c.name)
            .build();
        match self.docker.create_container(Some(opts), body).await {
            Ok(created) => Ok(created.id),
            Err(e) => Err(self
                .refused(format!("create container {} from {}", c.name, c.image), e)
                .await),
        }
    }

    async fn start(&self, id: &str) -> EngineResult<()> {
        match self.docker.start_container(id, None).await {
            Ok(()) => Ok(()),
            // 304: already running.
            Err(BollardError::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) => Err(self.refused(format!("start container {id}"), e).await),
        }
    }

    async fn stop(&self, id: &str, timeout: Duration) -> EngineResult<()> {
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
            Err(e) => Err(self.refused(format!("stop container {id}"), e).await),
        }
    }

    async fn kill(&self, id: &str) -> EngineResult<()> {
        let opts = bollard::query_parameters::KillContainerOptions {
            signal: "SIGKILL".to_string(),
        };
        match self.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // 409 "is not running": it is already down.
            Err(BollardError::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(e) => Err(self.refused(format!("kill container {id}"), e).await),
        }
    }

    async fn remove(&self, id: &str) -> EngineResult<()> {
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
            Err(e) => Err(self.refused(format!("remove container {id}"), e).await),
        }
    }

    async fn logs(&self, id: &str, tail: Option<usize>) -> EngineResult<String> {
        let tail = tail.map_or_else(|| "all".to_string(), |n| n.to_string());
        let opts = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&tail)
            .build();
        let chunks: Vec<_> = match self.docker.logs(id, Some(opts)).try_collect().await {
            Ok(c) => c,
            Err(e) => return Err(self.refused(format!("read the logs of {id}"), e).await),
        };
        let mut out = String::new();
        for chunk in chunks {
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        Ok(out)
    }

    async fn run_to_completion(&self, job: &OneShot) -> EngineResult<Exited> {
        let body = ContainerCreateBody {
            image: Some(job.image.clone()),
            user: Some(job.hardening.user.to_string()),
            cmd: Some(job.args.clone()),
            labels: Some(job.labels.clone().into_iter().collect()),
            host_config: Some(host_config(&job.hardening, Network::None, &job.mounts)),
            ..Default::default()
        };
        let id = match self.docker.create_container(None, body).await {
            Ok(created) => created.id,
            Err(e) => {
                return Err(self
                    .refused(
                        format!("create a throw-away container from {}", job.image),
                        e,
                    )
                    .await)
            }
        };
        let result = self.wait_exit(&id, job).await;
        let removed = self.remove(&id).await;
        let exited = result?;
        removed?;
        Ok(exited)
    }

    fn events(&self, filter: &LabelFilter) -> Events {
        let labels = filter.engine_values();
        let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
        filters.insert("type", vec!["container"]);
        filters.insert("label", labels.iter().map(String::as_str).collect());
        filters.insert("event", EVENT_ACTIONS.to_vec());
        let opts = EventsOptionsBuilder::default().filters(&filters).build();
        let endpoint = self.endpoint.clone();
        // bollard's timeout bounds only the response headers, which /events sends at once.
        self.docker
            .events(Some(opts))
            .map(move |r| {
                let e = r.map_err(|e| EngineError::Unreachable {
                    endpoint: endpoint.clone(),
                    message: format!("the event stream broke: {e}"),
                })?;
                let mut labels: BTreeMap<String, String> = e
                    .actor
                    .as_ref()
                    .and_then(|a| a.attributes.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                let name = labels.remove("name");
                labels.remove("image");
                let action = match e.action.unwrap_or_default() {
                    a if a == "remove" => "destroy".to_string(),
                    a => a,
                };
                Ok(ContainerEvent {
                    action,
                    id: e.actor.and_then(|a| a.id).unwrap_or_default(),
                    labels,
                    name,
                })
            })
            .boxed()
    }
}

impl DockerEngine {
    async fn wait_exit(&self, id: &str, job: &OneShot) -> EngineResult<Exited> {
        self.start(id).await.map_err(|e| match e {
            EngineError::Refused {
                engine,
                status,
                message,
                ..
            } => EngineError::Refused {
                engine,
                operation: format!("start a throw-away container from {} ({id})", job.image),
                status,
                message,
            },
            other => other,
        })?;
        let waited = tokio::time::timeout(job.timeout, async {
            let mut wait = self.docker.wait_container(id, None);
            match wait.next().await {
                Some(Ok(r)) => Ok(r.status_code),
                Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
                Some(Err(e)) => Err(self.refused(format!("wait for container {id}"), e).await),
                None => Err(EngineError::Refused {
                    engine: self.describe(),
                    operation: format!("wait for container {id}"),
                    status: 0,
                    message: "the engine ended the wait without an exit code".into(),
                }),
            }
        })
        .await;
        let code = match waited {
            Ok(r) => r?,
            Err(_) => {
                return Err(EngineError::Timeout {
                    what: format!("container {id} ({})", job.image),
                    timeout: job.timeout,
                })
            }
        };
        let output = self.logs(id, None).await.unwrap_or_default();
        Ok(Exited { code, output })
    }
}

/// What every container berth makes shares: hardening, network and bind mounts.
fn host_config(h: &Hardening, network: Network, mounts: &[Mount]) -> HostConfig {
    let mut security_opt = Vec::new();
    if h.no_new_privileges {
        security_opt.push("no-new-privileges:true".to_string());
    }
    HostConfig {
        network_mode: Some(
            match network {
                Network::Host => "host",
                Network::None => "none",
            }
            .into(),
        ),
        readonly_rootfs: Some(h.read_only_rootfs),
        cap_drop: h.cap_drop_all.then(|| vec!["ALL".to_string()]),
        cap_add: (!h.cap_add.is_empty()).then(|| h.cap_add.clone()),
        security_opt: (!security_opt.is_empty()).then_some(security_opt),
        mounts: Some(mounts.iter().map(bind_mount).collect()),
        ..Default::default()
    }
}

fn restart_policy_of(name: &str) -> RestartPolicyNameEnum {
    match name {
        "always" => RestartPolicyNameEnum::ALWAYS,
        "unless-stopped" => RestartPolicyNameEnum::UNLESS_STOPPED,
        "on-failure" => RestartPolicyNameEnum::ON_FAILURE,
        _ => RestartPolicyNameEnum::NO,
    }
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

/// The container id a process's `/proc/PID/cgroup` names: a 64-hex path component, as
/// Docker's cgroupfs driver (`/docker/<id>`), its systemd driver (`docker-<id>.scope`) and
/// Podman (`libpod-<id>.scope`, `libpod-conmon-…` is not the container) write it.
pub fn container_id_in_cgroup(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .flat_map(|path| path.split('/'))
        .map(|part| {
            let part = part.strip_suffix(".scope").unwrap_or(part);
            part.strip_prefix("docker-")
                .or_else(|| part.strip_prefix("libpod-"))
                .unwrap_or(part)
        })
        .find(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// What only inspect tells about a container.
fn inspected_of(inspect: &ContainerInspectResponse, flavor: Flavor) -> Inspected {
    let hc = inspect.host_config.as_ref();
    let restart_policy = hc
        .and_then(|h| h.restart_policy.as_ref())
        .and_then(|r| r.name)
        .map(|n| match n {
            RestartPolicyNameEnum::EMPTY => "no".to_string(),
            RestartPolicyNameEnum::ALWAYS if flavor == Flavor::Podman => {
                super::RESTART_UNLESS_STOPPED.to_string()
            }
            other => other.to_string(),
        })
        .unwrap_or_else(|| "no".into());
    let state = inspect.state.as_ref();
    Inspected {
        live: LiveSettings {
            // Docker reports 0 for "no limit".
            nano_cpus: hc.and_then(|h| h.nano_cpus).filter(|v| *v > 0),
            memory: hc.and_then(|h| h.memory).filter(|v| *v > 0),
            restart_policy,
        },
        state: state.and_then(|s| s.status).map(run_state_of),
        pid: state
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .map(|p| p as u32),
        started_at: state
            .filter(|s| s.running == Some(true))
            .and_then(|s| s.started_at.clone()),
    }
}

/// A listed container with what inspect said of it. `fresh`: the inspect was made for this
/// observation (its state is newer than the list's); otherwise it comes from the cache and
/// the list's state is the newer one.
fn observed_from(
    summary: bollard::models::ContainerSummary,
    inspected: Inspected,
    fresh: bool,
    flavor: Flavor,
) -> ObservedContainer {
    let name = summary
        .names
        .as_ref()
        .and_then(|n| n.first().cloned())
        .unwrap_or_default();
    let name = name.strip_prefix('/').unwrap_or(&name).to_string();
    let listed = summary.state.map(summary_state_of);
    let state = if fresh {
        inspected.state.or(listed)
    } else {
        listed.or(inspected.state)
    }
    .unwrap_or(RunState::Dead);
    let running = state == RunState::Running;
    ObservedContainer {
        id: summary.id.unwrap_or_default(),
        name,
        labels: summary.labels.unwrap_or_default().into_iter().collect(),
        state,
        live: inspected.live,
        info: ContainerInfo {
            image: summary
                .image
                .as_deref()
                .map(|i| match flavor {
                    Flavor::Podman => i.strip_prefix("localhost/").unwrap_or(i),
                    Flavor::Docker => i,
                })
                .unwrap_or_default()
                .to_string(),
            pid: inspected.pid.filter(|_| running),
            started_at: inspected.started_at.filter(|_| running),
        },
    }
}

/// Observed containers from the list, each with a fresh inspect (moved out of `fresh`) or
/// else a trusted one; a container neither knows was removed meanwhile and is left out.
fn assemble(
    summaries: Vec<bollard::models::ContainerSummary>,
    fresh: &mut BTreeMap<String, Inspected>,
    trusted: &BTreeMap<String, Inspected>,
    flavor: Flavor,
) -> Vec<ObservedContainer> {
    let mut out: Vec<ObservedContainer> = summaries
        .into_iter()
        .filter_map(|s| {
            let id = s.id.clone().unwrap_or_default();
            match (fresh.get(&id), trusted.get(&id)) {
                (Some(i), _) => Some(observed_from(s, i.clone(), true, flavor)),
                (None, Some(i)) => Some(observed_from(s, i.clone(), false, flavor)),
                (None, None) => None,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Docker's `since` for an event's `timeNano`: seconds and nanoseconds.
fn since_of(nanos: &str) -> String {
    let n: u128 = nanos.parse().unwrap_or(0);
    format!("{}.{:09}", n / 1_000_000_000, n % 1_000_000_000)
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

/// A failure to reach the engine at all, as opposed to an answer from it.
fn is_connection_error(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::HyperResponseError { .. }
            | BollardError::IOError { .. }
            | BollardError::RequestTimeoutError
            | BollardError::SocketNotFoundError(_)
    )
}

/// Where the engine is expected, for messages.
/// Where the engine is: `DOCKER_HOST` when set (as for the docker CLI and compose; a Podman
/// service is chosen this way), else Docker's socket when it exists, else Podman's (rootful
/// `/run/podman/podman.sock`, then the user's `$XDG_RUNTIME_DIR/podman/podman.sock`), else
/// Docker's, so that "is dockerd running?" names the usual place.
pub fn endpoint() -> String {
    if let Ok(h) = std::env::var("DOCKER_HOST") {
        if !h.is_empty() {
            return h;
        }
    }
    const DOCKER: &str = "/var/run/docker.sock";
    let mut candidates = vec![std::path::PathBuf::from(DOCKER)];
    candidates.push("/run/podman/podman.sock".into());
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR") {
        candidates.push(std::path::Path::new(&run).join("podman/podman.sock"));
    }
    let found = candidates.into_iter().find(|p| p.exists());
    format!(
        "unix://{}",
        found
            .as_deref()
            .unwrap_or(std::path::Path::new(DOCKER))
            .display()
    )
}

/// The engine's product name and version, and which engine it is, from `/version`.
fn product_of(v: &bollard::models::SystemVersion) -> (String, Flavor) {
    let components: Vec<&str> = v
        .components
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    if let Some(podman) = components.iter().find(|n| n.contains("Podman")) {
        let version = v.version.as_deref().unwrap_or_default();
        return (
            format!("{podman} {version}").trim().to_string(),
            Flavor::Podman,
        );
    }
    // Docker's own builds say "Docker Engine - Community"; Debian's leave the platform empty
    // and call the component "Engine".
    let product = v
        .platform
        .as_ref()
        .map(|p| p.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| match components.first() {
            None | Some(&"Engine") => "Docker Engine".to_string(),
            Some(other) => other.to_string(),
        });
    let product = match &v.version {
        Some(version) => format!("{product} {version}"),
        None => product,
    };
    (product, Flavor::Docker)
}

/// "1.41" as a client version.
fn parse_api_version(v: &str) -> Option<ClientVersion> {
    let (major, minor) = v.split_once('.')?;
    Some(ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    })
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
    fn a_process_cgroup_names_its_container() {
        let id = "d692b2b621254704f4db3d246faf7e22ef4b8d44ebcfb165fafc1ac6d3196d4e";
        let cgroupfs =
            format!("9:name=systemd:/docker/{id}\n4:memory:/docker/{id}\n0::/docker/{id}\n");
        assert_eq!(container_id_in_cgroup(&cgroupfs).as_deref(), Some(id));
        let systemd = format!("0::/system.slice/docker-{id}.scope\n");
        assert_eq!(container_id_in_cgroup(&systemd).as_deref(), Some(id));
        let podman = format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{id}.scope/container\n");
        assert_eq!(container_id_in_cgroup(&podman).as_deref(), Some(id));
        assert_eq!(
            container_id_in_cgroup("0::/user.slice/session-3.scope\n"),
            None
        );
        assert_eq!(container_id_in_cgroup("0::/\n"), None);
    }

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
    fn restart_policies_translate() {
        assert_eq!(
            restart_policy_of(super::super::RESTART_UNLESS_STOPPED),
            RestartPolicyNameEnum::UNLESS_STOPPED
        );
        assert_eq!(
            RestartPolicyNameEnum::UNLESS_STOPPED.to_string(),
            super::super::RESTART_UNLESS_STOPPED
        );
        assert_eq!(restart_policy_of("no"), RestartPolicyNameEnum::NO);
    }

    #[test]
    fn the_engine_is_named_from_its_version_answer() {
        // Debian's docker.io 20.10 and Debian's podman 4.3, as they answer /version.
        let docker: bollard::models::SystemVersion = serde_json::from_str(
            r#"{"Platform":{"Name":""},"Components":[{"Name":"Engine","Version":"20.10.24+dfsg1"},
            {"Name":"containerd","Version":"1.6.20~ds1"}],"Version":"20.10.24+dfsg1","ApiVersion":"1.41"}"#,
        )
        .unwrap();
        assert_eq!(
            product_of(&docker),
            ("Docker Engine 20.10.24+dfsg1".to_string(), Flavor::Docker)
        );
        let podman: bollard::models::SystemVersion = serde_json::from_str(
            r#"{"Platform":{"Name":"linux/amd64/debian-12"},"Components":[{"Name":"Podman Engine",
            "Version":"4.3.1"},{"Name":"Conmon","Version":"conmon version 2.1.6"}],
            "Version":"4.3.1","ApiVersion":"1.41","MinAPIVersion":"1.24"}"#,
        )
        .unwrap();
        assert_eq!(
            product_of(&podman),
            ("Podman Engine 4.3.1".to_string(), Flavor::Podman)
        );
        let ce: bollard::models::SystemVersion = serde_json::from_str(
            r#"{"Platform":{"Name":"Docker Engine - Community"},"Version":"28.2.2"}"#,
        )
        .unwrap();
        assert_eq!(product_of(&ce).0, "Docker Engine - Community 28.2.2");
        let v = parse_api_version("1.41").unwrap();
        assert_eq!((v.major_version, v.minor_version), (1, 41));
        assert!(parse_api_version("4.3.1x").is_none());
    }

    #[test]
    fn version_hint_from_tag() {
        assert_eq!(image_version_hint("envoyproxy/envoy:v1.36.2"), "1.36.2");
        assert_eq!(image_version_hint("berth-test/envoy:1.39.3"), "1.39.3");
        assert_eq!(image_version_hint("berth-test/does-not-exist:1"), "1.40.0");
        assert_eq!(image_version_hint("envoy"), "1.40.0");
    }
}
