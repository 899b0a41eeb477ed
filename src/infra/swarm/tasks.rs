//! A proxy's tasks as Swarm reports them: status rows (node, state, readiness from the
//! health status, image, spec), whether an update's tasks run, and why one failed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bollard::models::{HealthStatusEnum, ServiceUpdateStatusStateEnum, Task, TaskState};
use bollard::query_parameters::{ListNodesOptions, ListTasksOptionsBuilder, LogsOptionsBuilder};
use futures_util::StreamExt;

use super::service::{self, ServicePlan};
use super::Swarm;
use crate::core::plan::ContainerRef;
use crate::core::replica::{short_hash, LABEL_SPEC_HASH};
use crate::core::target::Target;
use crate::engine::RunState;
use crate::infra::ReplicaStatus;
use crate::infra::{ConvergeError, Gate, GateFailure};

/// How long removing a service may take until its tasks are gone (each drains first).
const REMOVE_TIMEOUT: Duration = Duration::from_secs(180);
/// Lines of a failed task's log shown.
const LOG_LINES: usize = 20;

/// One task, read.
#[derive(Debug, Clone)]
pub(super) struct TaskView {
    pub id: String,
    /// `berth-<proxy>.<slot>` (replicated) or `berth-<proxy>.<node id>` (global), as
    /// `docker service ps` names it.
    pub name: String,
    /// 0-based, like berth's slots on one host (Swarm's slot 1 is berth's slot 0).
    pub slot: Option<u32>,
    pub node_id: String,
    pub state: Option<TaskState>,
    pub desired: Option<TaskState>,
    /// Swarm's error for a failed task ("task: non-zero exit (1)").
    pub err: Option<String>,
    pub message: Option<String>,
    pub container_id: Option<String>,
    pub image: String,
    pub spec_hash: String,
    pub timestamp: Option<String>,
    /// The configs and secrets it mounts, by name.
    pub objects: Vec<String>,
    /// Envoy's `--service-node`: with the agent, what Swarm expands `{{.Task.Name}}` to for
    /// this task (`<service>.<slot or node id>.<task id>`); without it, the service's name.
    pub service_node: String,
}

impl TaskView {
    fn of(t: Task, service: &str) -> TaskView {
        let status = t.status.clone().unwrap_or_default();
        let container = t.spec.as_ref().and_then(|s| s.container_spec.as_ref());
        let labels = container.and_then(|c| c.labels.clone()).unwrap_or_default();
        let slot = t
            .slot
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| *s > 0);
        let node_id = t.node_id.clone().unwrap_or_default();
        let id = t.id.clone().unwrap_or_default();
        let with_agent = container.and_then(|c| c.env.as_ref()).is_some_and(|env| {
            env.iter()
                .any(|e| e.starts_with(&format!("{}=", crate::core::agent::ENV_SERVICE_NODE)))
        });
        // Swarm's own naming of the task (moby's naming.Task), which the template expands to.
        let service_node = if with_agent {
            match slot {
                Some(s) => format!("{service}.{s}.{id}"),
                None => format!("{service}.{node_id}.{id}"),
            }
        } else {
            service.to_string()
        };
        TaskView {
            service_node,
            name: match slot {
                Some(s) => format!("{service}.{s}"),
                None => format!("{service}.{}", short_hash(&node_id)),
            },
            slot: slot.map(|s| s - 1),
            node_id,
            state: status.state,
            desired: t.desired_state,
            err: status.err.filter(|e| !e.is_empty()),
            message: status.message,
            container_id: status
                .container_status
                .and_then(|c| c.container_id)
                .filter(|c| !c.is_empty()),
            image: labels
                .get(service::LABEL_IMAGE)
                .cloned()
                .or_else(|| container.and_then(|c| c.image.clone()))
                .unwrap_or_default(),
            spec_hash: labels.get(LABEL_SPEC_HASH).cloned().unwrap_or_default(),
            timestamp: status.timestamp,
            objects: container
                .map(|c| {
                    let configs = c
                        .configs
                        .iter()
                        .flatten()
                        .filter_map(|r| r.config_name.clone());
                    let secrets = c
                        .secrets
                        .iter()
                        .flatten()
                        .filter_map(|r| r.secret_name.clone());
                    configs.chain(secrets).collect()
                })
                .unwrap_or_default(),
            id,
        }
    }

    pub fn reference(&self) -> ContainerRef {
        ContainerRef {
            id: self.id.clone(),
            name: self.name.clone(),
        }
    }

    fn running(&self) -> bool {
        self.state == Some(TaskState::RUNNING)
    }

    fn run_state(&self) -> RunState {
        match self.state {
            Some(TaskState::RUNNING) => RunState::Running,
            Some(TaskState::COMPLETE | TaskState::SHUTDOWN) => RunState::Exited,
            Some(TaskState::FAILED | TaskState::REJECTED | TaskState::ORPHANED) => RunState::Dead,
            Some(TaskState::REMOVE) => RunState::Removing,
            _ => RunState::Created,
        }
    }
}

impl Swarm {
    /// Every task of the proxy's service Swarm still knows (its history included).
    async fn tasks(&self, proxy: &str) -> Result<Vec<TaskView>, ConvergeError> {
        let name = service::service_name(proxy);
        let filters = HashMap::from([("service".to_string(), vec![name.clone()])]);
        let list = self
            .docker()
            .list_tasks(Some(
                ListTasksOptionsBuilder::default().filters(&filters).build(),
            ))
            .await;
        match list {
            Ok(tasks) => Ok(tasks
                .into_iter()
                // The filter matches name prefixes too (berth-a matches berth-ab's tasks).
                .filter(|t| {
                    t.spec
                        .as_ref()
                        .and_then(|s| s.container_spec.as_ref())
                        .and_then(|c| c.labels.as_ref())
                        .and_then(|l| l.get(service::LABEL_SWARM))
                        .is_some_and(|p| p == proxy)
                })
                .map(|t| TaskView::of(t, &name))
                .collect()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(Vec::new()),
            Err(e) => Err(self.refused(format!("list the tasks of {name}"), e).await),
        }
    }

    /// The tasks Swarm wants running, by slot.
    pub(super) async fn running_tasks(&self, proxy: &str) -> Result<Vec<TaskView>, ConvergeError> {
        let mut tasks: Vec<TaskView> = self
            .tasks(proxy)
            .await?
            .into_iter()
            .filter(|t| t.desired == Some(TaskState::RUNNING))
            .collect();
        tasks.sort_by(|a, b| (a.slot, &a.name).cmp(&(b.slot, &b.name)));
        Ok(tasks)
    }

    /// The configs and secrets the tasks Swarm wants running mount.
    pub(super) async fn objects_of_running_tasks(
        &self,
        proxy: &str,
    ) -> Result<BTreeSet<String>, ConvergeError> {
        Ok(self
            .running_tasks(proxy)
            .await?
            .into_iter()
            .flat_map(|t| t.objects)
            .collect())
    }

    /// Whether every task Swarm wants running runs the spec `hash`, and as many as wanted.
    pub(super) async fn tasks_ready(
        &self,
        target: &Target,
        hash: &str,
    ) -> Result<bool, ConvergeError> {
        let tasks = self.running_tasks(target.name()).await?;
        let all_current = tasks.iter().all(|t| t.running() && t.spec_hash == hash);
        let enough = if target.proxy.placement.global {
            !tasks.is_empty()
        } else {
            tasks.len() == target.desired.replicas as usize
        };
        Ok(all_current && enough)
    }

    /// Why the rollout of spec `hash` cannot go on, once its startup deadline passed: a task
    /// Swarm cannot place (no node matches the constraints, or none has the resources), or,
    /// for a new service (`fresh`, where Swarm has no update to roll back), a task that failed.
    pub(super) async fn stuck(
        &self,
        target: &Target,
        hash: &str,
        fresh: bool,
    ) -> Result<Option<String>, ConvergeError> {
        let tasks = self.tasks(target.name()).await?;
        let current = tasks.iter().filter(|t| t.spec_hash == hash);
        for t in current {
            let why = t.err.clone().unwrap_or_default();
            if t.desired == Some(TaskState::RUNNING)
                && t.state == Some(TaskState::PENDING)
                && !why.is_empty()
            {
                return Ok(Some(format!(
                    "Swarm cannot place task {}: {why} (constraints: {})",
                    t.name,
                    if target.proxy.placement.constraints.is_empty() {
                        "none".to_string()
                    } else {
                        target.proxy.placement.constraints.join(", ")
                    }
                )));
            }
            if fresh && matches!(t.state, Some(TaskState::FAILED | TaskState::REJECTED)) {
                return Ok(Some(format!(
                    "task {} failed: {why}; Swarm keeps restarting the new service's tasks",
                    t.name
                )));
            }
        }
        Ok(None)
    }

    /// The pids of this node's task containers (their inotify use is the fleet's own).
    pub(super) async fn task_pids(&self) -> BTreeSet<u32> {
        let mut pids = BTreeSet::new();
        let Ok(services) = self.services().await else {
            return pids;
        };
        for proxy in services.keys() {
            for t in self.running_tasks(proxy).await.unwrap_or_default() {
                if let Some(id) = &t.container_id {
                    if let Ok(i) = self.docker().inspect_container(id, None).await {
                        if let Some(pid) = i.state.and_then(|s| s.pid).filter(|p| *p > 0) {
                            pids.insert(pid as u32);
                        }
                    }
                }
            }
        }
        pids
    }

    /// Node IDs to hostnames.
    async fn node_names(&self) -> BTreeMap<String, String> {
        self.docker()
            .list_nodes(None::<ListNodesOptions>)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| {
                let host = n.description.and_then(|d| d.hostname)?;
                Some((n.id?, host))
            })
            .collect()
    }

    /// One row per task Swarm wants running. A task's container on this node is inspected for
    /// its health (the agent's HEALTHCHECK: LIVE and every listener bound); on other nodes a
    /// task with a health check is only reported running once healthy, so running is ready.
    pub(super) async fn rows(&self, proxy: &str) -> Result<Vec<ReplicaStatus>, ConvergeError> {
        let nodes = self.node_names().await;
        let tasks = self.running_tasks(proxy).await?;
        let rows = tasks.into_iter().map(|t| {
            let node = nodes.get(&t.node_id).cloned().unwrap_or(t.node_id.clone());
            async move {
                let inspected = match &t.container_id {
                    Some(id) => self.docker().inspect_container(id, None).await.ok(),
                    None => None,
                };
                let state = inspected.as_ref().and_then(|i| i.state.clone());
                let health = state.as_ref().and_then(|s| s.health.clone());
                let health_status = health.as_ref().and_then(|h| h.status);
                let last_output = health
                    .as_ref()
                    .and_then(|h| h.log.as_ref())
                    .and_then(|l| l.last())
                    .and_then(|l| l.output.clone())
                    .map(|o| o.trim().to_string());
                let ready = t.running()
                    && !matches!(
                        health_status,
                        Some(HealthStatusEnum::STARTING | HealthStatusEnum::UNHEALTHY)
                    );
                let envoy = match health_status {
                    Some(HealthStatusEnum::HEALTHY) => "healthy".to_string(),
                    Some(HealthStatusEnum::STARTING) => "starting".to_string(),
                    Some(HealthStatusEnum::UNHEALTHY) => "unhealthy".to_string(),
                    _ => "-".to_string(),
                };
                let reason = if ready {
                    None
                } else if let Some(out) = last_output.filter(|o| !o.is_empty()) {
                    Some(out)
                } else {
                    Some(
                        t.err
                            .clone()
                            .or(t.message.clone())
                            .unwrap_or_else(|| format!("the task is {}", t.run_state())),
                    )
                };
                let uptime_seconds = state
                    .as_ref()
                    .filter(|_| t.running())
                    .and_then(|s| s.started_at.as_deref())
                    .and_then(|s| humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok())
                    .and_then(|at| std::time::SystemTime::now().duration_since(at).ok())
                    .map(|d| d.as_secs());
                ReplicaStatus {
                    proxy: proxy.to_string(),
                    slot: t.slot,
                    container: t.name.clone(),
                    node: Some(node),
                    service_node: Some(t.service_node.clone()),
                    state: t.run_state(),
                    ready,
                    envoy,
                    reason,
                    image: t.image.split('@').next().unwrap_or(&t.image).to_string(),
                    spec: short_hash(&t.spec_hash).to_string(),
                    uptime_seconds,
                    connections: None,
                    observed_generation: None,
                    xds: None,
                }
            }
        });
        let mut rows = futures_util::future::join_all(rows).await;
        rows.sort_by(|a, b| (a.slot, &a.container).cmp(&(b.slot, &b.container)));
        Ok(rows)
    }

    /// The update did not finish: which task of the new spec failed, with Swarm's error and
    /// what its log says.
    pub(super) async fn failure(
        &self,
        target: &Target,
        plan: &ServicePlan,
        state: Option<ServiceUpdateStatusStateEnum>,
        message: String,
    ) -> ConvergeError {
        let proxy = target.name().to_string();
        let tasks = self.tasks(&proxy).await.unwrap_or_default();
        // The latest task of the new spec that did not stay running.
        let new_spec = || {
            tasks
                .iter()
                .filter(|t| t.spec_hash == plan.hash && !t.running())
        };
        let failed = new_spec()
            .filter(|t| t.err.is_some())
            .max_by(|a, b| a.timestamp.cmp(&b.timestamp))
            .or_else(|| new_spec().max_by(|a, b| a.timestamp.cmp(&b.timestamp)));
        let (container, slot, reason, log) = match failed {
            Some(t) => {
                let log = match &t.container_id {
                    Some(id) => self.log_of(id).await,
                    None => String::new(),
                };
                let reason = t
                    .err
                    .clone()
                    .or(t.message.clone())
                    .unwrap_or_else(|| format!("the task is {}", t.run_state()));
                (t.name.clone(), t.slot.unwrap_or(0), reason, log)
            }
            None => (plan.name.clone(), 0, message.clone(), String::new()),
        };
        let aftermath = match state {
            Some(ServiceUpdateStatusStateEnum::ROLLBACK_COMPLETED) => format!(
                "Swarm rolled service {} back to the previous spec; its tasks keep serving ({message})",
                plan.name
            ),
            Some(ServiceUpdateStatusStateEnum::ROLLBACK_PAUSED) => format!(
                "Swarm's rollback of service {} paused; see `docker service ps {}` ({message})",
                plan.name, plan.name
            ),
            Some(ServiceUpdateStatusStateEnum::PAUSED) => format!(
                "Swarm paused the update of service {} (on_failure = \"pause\"): the tasks already replaced stay, the others keep the previous spec ({message})",
                plan.name
            ),
            _ => message,
        };
        let why = crate::envoy::log::why(&log);
        let tail: Vec<&str> = log.lines().collect();
        let log_tail = tail[tail.len().saturating_sub(LOG_LINES)..].join("\n");
        ConvergeError::Gate(GateFailure {
            proxy,
            slot,
            container,
            gate: Gate::Exited,
            reason,
            why,
            log_tail,
            aftermath,
        })
    }

    /// The log of a task's container on this node (empty when it is elsewhere or gone).
    async fn log_of(&self, container_id: &str) -> String {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail("200")
            .build();
        let mut out = String::new();
        let mut stream = self.docker().logs(container_id, Some(options));
        while let Some(Ok(chunk)) = stream.next().await {
            out.push_str(&chunk.to_string());
        }
        out
    }

    /// Waits until a removed service's tasks are gone (Swarm stops each with its grace period).
    pub(super) async fn await_tasks_gone(&self, proxy: &str) -> Result<(), ConvergeError> {
        let deadline = tokio::time::Instant::now() + REMOVE_TIMEOUT;
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                format!("{}={proxy}", service::LABEL_SWARM),
                format!(
                    "com.docker.swarm.service.name={}",
                    service::service_name(proxy)
                ),
            ],
        )]);
        loop {
            let left = self
                .docker()
                .list_containers(Some(
                    bollard::query_parameters::ListContainersOptionsBuilder::default()
                        .filters(&filters)
                        .build(),
                ))
                .await
                .map(|l| l.len())
                .unwrap_or(0);
            if left == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ConvergeError::Host {
                    problem: format!(
                        "{left} task container(s) of proxy {proxy} still run {REMOVE_TIMEOUT:?} after its service was removed"
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
