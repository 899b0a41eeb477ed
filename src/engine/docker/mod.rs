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

mod cache;
mod connect;
mod containers;
mod errors;
mod events;
mod images;
mod logs;
mod observe;
mod raw_http;
mod validation;

use containers::host_config;
use errors::{is_connection_error, is_not_found};
use observe::assemble;

pub use connect::endpoint;
pub use containers::container_id_in_cgroup;
pub use images::split_image;
pub use observe::run_state_of;

/// bollard's per-request timeout; `stop` raises it for its own request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

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

    async fn observe(&self, filter: &LabelFilter) -> EngineResult<Vec<ObservedContainer>> {
        observe::observe(self, filter).await
    }

    async fn observe_cached(
        &self,
        filter: &LabelFilter,
        cache: &mut ObservationCache,
    ) -> EngineResult<Vec<ObservedContainer>> {
        cache::observe_cached(self, filter, cache).await
    }

    async fn status(&self, id: &str) -> EngineResult<Option<ContainerStatus>> {
        observe::status(self, id).await
    }

    async fn image_id(&self, image: &str) -> EngineResult<Option<String>> {
        images::image_id(self, image).await
    }

    async fn ensure_image(&self, image: &str, progress: bool) -> EngineResult<String> {
        images::ensure_image(self, image, progress).await
    }

    async fn pull(&self, image: &str, progress: bool) -> EngineResult<String> {
        images::pull(self, image, progress).await
    }

    async fn image_entrypoint(&self, image: &str) -> EngineResult<Option<Vec<String>>> {
        images::image_entrypoint(self, image).await
    }

    async fn build_image(&self, build: &ImageBuild, progress: bool) -> EngineResult<String> {
        images::build_image(self, build, progress).await
    }

    async fn tag_image(&self, image: &str, target: &str) -> EngineResult<()> {
        images::tag_image(self, image, target).await
    }

    async fn push_image(&self, image: &str, progress: bool) -> EngineResult<String> {
        images::push_image(self, image, progress).await
    }

    async fn create(&self, c: &ReplicaContainer) -> EngineResult<String> {
        containers::create(self, c).await
    }

    async fn start(&self, id: &str) -> EngineResult<()> {
        containers::start(self, id).await
    }

    async fn stop(&self, id: &str, timeout: Duration) -> EngineResult<()> {
        containers::stop(self, id, timeout).await
    }

    async fn kill(&self, id: &str) -> EngineResult<()> {
        containers::kill(self, id).await
    }

    async fn remove(&self, id: &str) -> EngineResult<()> {
        containers::remove(self, id).await
    }

    async fn logs(&self, id: &str, tail: Option<usize>) -> EngineResult<String> {
        logs::logs(self, id, tail).await
    }

    async fn run_to_completion(&self, job: &OneShot) -> EngineResult<Exited> {
        validation::run_to_completion(self, job).await
    }

    fn events(&self, filter: &LabelFilter) -> Events {
        events::events(self, filter)
    }
}

#[cfg(test)]
mod tests;
