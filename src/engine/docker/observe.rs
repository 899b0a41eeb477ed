//! Observing containers: one list by label, one inspect per container for what the list cannot
//! tell, assembled into [`ObservedContainer`]s; container states as berth's.

use super::*;

/// Inspects in flight at once while observing.
const INSPECT_CONCURRENCY: usize = 16;

impl DockerEngine {
    /// Inspects a container; `None` when there is none.
    pub(super) async fn inspect(&self, id: &str) -> EngineResult<Option<ContainerInspectResponse>> {
        match self.docker.inspect_container(id, None).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) if self.flavor == Flavor::Podman && e.to_string().contains("`stopped`") => {
                self.inspect_stopped(id, e).await
            }
            Err(e) => Err(self.refused(format!("inspect container {id}"), e).await),
        }
    }

    /// The containers matching `filter` (the daemon filters; anything else is dropped).
    pub(super) async fn list_matching(
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
    pub(super) async fn inspect_all(
        &self,
        ids: &[String],
    ) -> EngineResult<BTreeMap<String, Inspected>> {
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

    pub(super) async fn list(
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
}

/// One list call filtered by label, then one inspect per container (concurrently) for
/// what list cannot tell: memory, CPUs, restart policy, PID and start time.
pub(super) async fn observe(
    engine: &DockerEngine,
    filter: &LabelFilter,
) -> EngineResult<Vec<ObservedContainer>> {
    let summaries = engine.list_matching(filter).await?;
    let ids: Vec<String> = summaries.iter().filter_map(|s| s.id.clone()).collect();
    let mut inspected = engine.inspect_all(&ids).await?;
    Ok(assemble(
        summaries,
        &mut inspected,
        &BTreeMap::new(),
        engine.flavor,
    ))
}

pub(super) async fn status(
    engine: &DockerEngine,
    id: &str,
) -> EngineResult<Option<ContainerStatus>> {
    let Some(inspect) = engine.inspect(id).await? else {
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

/// What only inspect tells about a container.
pub(super) fn inspected_of(inspect: &ContainerInspectResponse, flavor: Flavor) -> Inspected {
    let hc = inspect.host_config.as_ref();
    let restart_policy = hc
        .and_then(|h| h.restart_policy.as_ref())
        .and_then(|r| r.name)
        .map(|n| match n {
            RestartPolicyNameEnum::EMPTY => "no".to_string(),
            RestartPolicyNameEnum::ALWAYS if flavor == Flavor::Podman => {
                crate::engine::RESTART_UNLESS_STOPPED.to_string()
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
pub(super) fn observed_from(
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
pub(super) fn assemble(
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

pub(super) fn summary_state_of(s: ContainerSummaryStateEnum) -> RunState {
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
