//! Docker Swarm: one service per proxy, and Swarm rolls it (issue 13). berth renders the same
//! files as on one host and maps a proxy to Swarm objects ([`service`]): its rendered files
//! as configs and its TLS keys as secrets, named by content hash; a service on the host
//! network (replicas on one node share the port through SO_REUSEPORT; the ingress mesh would
//! add a hop and needs IPVS), replicated or global, placed by constraints, updated start-first
//! one task at a time with rollback. With the agent in the image, a stopping task drains
//! before it exits and a starting one counts only once it serves.
//!
//! Files: `service` (the pure mapping), `objects` (configs and secrets), `tasks` (observing
//! tasks: status rows, readiness, waiting for an update), `events` (what serve watches),
//! `entrypoint` (the agent or the image's own, registry credentials), `update` (a service's
//! plan applied and its rolling update awaited), `diff` (targets against services, drift).

pub mod agent_binary;
pub mod agent_image;
mod diff;
mod entrypoint;
mod events;
pub mod hub;
mod images;
mod kernel;
mod live;
mod objects;
pub mod pki;
mod placement;
pub mod service;
mod tasks;
#[cfg(test)]
mod tests;
mod update;

use diff::*;
use update::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use async_trait::async_trait;
use bollard::models::{Service, ServiceUpdateStatusStateEnum};
use bollard::query_parameters::{ListServicesOptionsBuilder, UpdateServiceOptionsBuilder};

use super::{
    docker_host::DockerHost, Changes, ConvergeError, ConvergeRequest, Converged, Delivery,
    HostPreparation, Infrastructure, ProxyReadiness,
};
use crate::core::plan::{Action, Plan, PlanSummary, RemoveReason, ReplaceReason};
use crate::core::progress::{Event, Reporter};
use crate::core::replica::{LABEL_MANAGED_BY, LABEL_SPEC_HASH, LABEL_STATE_DIR, MANAGED_BY_VALUE};
use crate::core::target::Target;
use crate::engine::{ContainerEngine, DockerEngine};
use crate::infra::ReplicaStatus;
use crate::state::StateDir;
use service::{Entrypoint, ServicePlan, LABEL_SWARM};

/// How often an update's progress is polled.
const POLL: Duration = Duration::from_millis(250);

/// berth's proxies as services of the Swarm this engine manages.
pub struct Swarm {
    engine: Arc<DockerEngine>,
    /// The manager as a plain Docker host: validation (`envoy --mode validate` in a throw-away
    /// container) and the host settings of this node.
    local: DockerHost,
    state: StateDir,
    extra_labels: BTreeMap<String, String>,
    host_network: String,
    /// `[swarm] registry`: where the derived agent image is pushed for every node to pull.
    registry: Option<String>,
    /// `[swarm] agent = false`: Envoy's own entrypoint, chosen knowingly.
    no_agent: bool,
    /// Where the agents dial this manager (`[swarm] agent_address`, else this node's Swarm
    /// address).
    agent_address: std::net::SocketAddr,
    /// The agent channel, started by the first converge that needs it.
    hub: tokio::sync::OnceCell<hub::Hub>,
    /// This node's Swarm ID (its host settings are berth's to set; other nodes' are reported).
    node_id: String,
    /// How many nodes the Swarm had when berth connected.
    nodes: usize,
    /// Derived images this process pushed already, local tag → pinned registry reference
    /// (serve converges again and again: one push per image is enough).
    pushed: std::sync::Mutex<BTreeMap<String, String>>,
    /// "Swarm of 1 node(s), manager Docker Engine 20.10.24 at unix://…".
    description: String,
}

const _: fn() = || {
    fn is_infrastructure<T: Infrastructure>() {}
    is_infrastructure::<Swarm>();
};

impl Swarm {
    /// The Swarm managed by `engine`; refuses an engine that is not a Swarm manager, saying
    /// what to do.
    pub async fn connect(
        engine: DockerEngine,
        settings: super::SwarmSettings,
        state: StateDir,
        extra_labels: BTreeMap<String, String>,
    ) -> anyhow::Result<Swarm> {
        let docker = engine.client().clone();
        let info = docker
            .info()
            .await
            .map_err(|e| anyhow!("{}: {e}", engine.describe()))?;
        let swarm = info.swarm.unwrap_or_default();
        let node_addr = swarm
            .node_addr
            .as_deref()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let agent_address = settings
            .agent_address
            .unwrap_or((node_addr, crate::core::agent::channel::PORT).into());
        let node_id = swarm.node_id.clone().unwrap_or_default();
        let node_state = swarm
            .local_node_state
            .map(|s| s.to_string())
            .unwrap_or_default();
        if swarm.control_available != Some(true) {
            bail!(
                "engine = \"swarm\", but {} is not a Swarm manager (its node state: {}); run berth against a manager (DOCKER_HOST), or make this one: `docker swarm init` (a new Swarm) or `docker swarm join --token <manager token> <manager>:2377`",
                engine.describe(),
                if node_state.is_empty() { "unknown" } else { &node_state }
            );
        }
        let host = docker
            .inspect_network(
                "host",
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
            .map_err(|e| anyhow!("{}: the host network: {e}", engine.describe()))?;
        let host_network = host
            .id
            .ok_or_else(|| anyhow!("the engine's host network has no ID"))?;
        let nodes = docker
            .list_nodes(None::<bollard::query_parameters::ListNodesOptions>)
            .await
            .map(|n| n.len())
            .unwrap_or(0);
        let description = format!("Swarm of {nodes} node(s), manager {}", engine.describe());
        let engine = Arc::new(engine);
        let local = DockerHost::new(
            engine.clone(),
            Arc::new(crate::envoy::admin::SocketConnector),
            state.clone(),
            extra_labels.clone(),
        );
        Ok(Swarm {
            engine,
            local,
            state,
            extra_labels,
            host_network,
            registry: settings.registry,
            no_agent: settings.no_agent,
            agent_address,
            hub: tokio::sync::OnceCell::new(),
            node_id,
            nodes,
            pushed: Default::default(),
            description,
        })
    }

    /// Whether `engine` is a Swarm manager.
    pub async fn is_manager(engine: &DockerEngine) -> bool {
        engine
            .client()
            .info()
            .await
            .ok()
            .and_then(|i| i.swarm)
            .and_then(|s| s.control_available)
            == Some(true)
    }

    fn docker(&self) -> &bollard::Docker {
        self.engine.client()
    }

    fn state_dir(&self) -> String {
        self.state.root().display().to_string()
    }

    async fn refused(&self, what: impl Into<String>, e: bollard::errors::Error) -> ConvergeError {
        ConvergeError::Engine(self.engine.refused(what, e).await)
    }

    /// Whether a Swarm object's labels say it is this berth's.
    fn mine(&self, labels: Option<&std::collections::HashMap<String, String>>) -> bool {
        let Some(l) = labels else { return false };
        l.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY_VALUE)
            && l.contains_key(LABEL_SWARM)
            && l.get(LABEL_STATE_DIR) == Some(&self.state_dir())
            && self.extra_labels.iter().all(|(k, v)| l.get(k) == Some(v))
    }

    /// This berth's services, by proxy.
    async fn services(&self) -> Result<BTreeMap<String, Service>, ConvergeError> {
        let filters = std::collections::HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}")],
        )]);
        let list = self
            .docker()
            .list_services(Some(
                ListServicesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await;
        let list = match list {
            Ok(l) => l,
            Err(e) => return Err(self.refused("list services", e).await),
        };
        Ok(list
            .into_iter()
            .filter(|s| self.mine(s.spec.as_ref().and_then(|s| s.labels.as_ref())))
            .filter_map(|s| {
                let proxy = s.spec.as_ref()?.labels.as_ref()?.get(LABEL_SWARM)?.clone();
                Some((proxy, s))
            })
            .collect())
    }

    /// The service of one proxy; a service of that name that is not this berth's is refused.
    async fn service(&self, proxy: &str) -> Result<Option<Service>, ConvergeError> {
        let name = service::service_name(proxy);
        match self
            .docker()
            .inspect_service(
                &name,
                None::<bollard::query_parameters::InspectServiceOptions>,
            )
            .await
        {
            Ok(s) if self.mine(s.spec.as_ref().and_then(|s| s.labels.as_ref())) => Ok(Some(s)),
            Ok(_) => Err(ConvergeError::Host {
                problem: format!(
                    "a Swarm service named {name} exists and is not this berth's (labels {LABEL_MANAGED_BY}=berth and {LABEL_STATE_DIR}={} missing); berth leaves it alone: remove or rename it (`docker service rm {name}`), or rename proxy {proxy}",
                    self.state_dir()
                ),
            }),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(self.refused(format!("inspect service {name}"), e).await),
        }
    }
}

/// An error of the host's side, in the words it came with.
fn host(e: anyhow::Error) -> ConvergeError {
    ConvergeError::Host {
        problem: format!("{e:#}"),
    }
}

#[async_trait]
impl Infrastructure for Swarm {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn api_calls(&self) -> u64 {
        self.engine.api_calls()
    }

    async fn ping(&self) -> bool {
        self.engine.ping().await
    }

    async fn prepare(
        &self,
        fleet: &[Target],
        policy: crate::core::policy::HostPolicy,
    ) -> Result<HostPreparation, ConvergeError> {
        // The manager's own kernel settings (tcp_migrate_req above all); other nodes' are the
        // operator's, reported from their tasks' agents (kernel.rs). Ports are held by the services' own tasks, so there
        // is no port check here.
        let settings = crate::host::Settings::for_host(policy.tune, self.task_pids().await);
        let prepared = crate::host::prepare(&crate::host::preflight::host_needs(fleet), &settings)
            .map_err(|r| ConvergeError::Host {
                problem: r.to_string(),
            })?;
        let mut degraded: Vec<(String, String)> = prepared
            .degraded()
            .map(|(reason, message)| (reason.to_string(), message))
            .into_iter()
            .collect();
        degraded.extend(self.kernel_concerns(fleet).await);
        Ok(HostPreparation {
            notes: prepared.change_lines(),
            degraded,
        })
    }

    async fn owned(&self) -> Result<BTreeSet<String>, ConvergeError> {
        let mut names: BTreeSet<String> = self.state.proxies()?.into_iter().collect();
        names.extend(self.services().await?.into_keys());
        Ok(names)
    }

    async fn diff(&self, targets: &[Target]) -> Result<Plan, ConvergeError> {
        diff::diff(self, targets).await
    }

    async fn validate(&self, target: &Target, reporter: &Reporter) -> Result<(), ConvergeError> {
        self.local.validate(target, reporter).await
    }

    async fn converge(&self, req: ConvergeRequest<'_>) -> Result<Converged, ConvergeError> {
        let target = req.target;
        let name = target.name();
        let reporter = req.reporter;
        // A proxy no node can run is said at once (a global service would have no task to
        // fail), before anything changes.
        self.eligible_nodes(target).await?;
        let current = self.service(name).await?;
        // The watched files, stamped: what the tasks serve now, and what they are to serve (a
        // live task's baseline when its service rolls, else delivered through the agents).
        let previous = self.state.read_live(name)?;
        let watched = live::next_files(target, &previous, req.generation, req.hold_files);
        let (mut plan, entrypoint) = self
            .service_plan(target, reporter, &BTreeMap::new(), Some(&watched))
            .await?;
        let channel = matches!(&entrypoint, Entrypoint::Agent(a) if a.channel.is_some());
        if channel {
            // Tasks that start now dial it (and a task started by the rollout below catches up).
            self.hub().await?;
        }
        let same_spec = current.as_ref().and_then(service_hash) == Some(plan.hash.as_str())
            && current.as_ref().is_none_or(|s| drift(s, &plan).is_none());
        if let Some(what) = current.as_ref().and_then(|s| drift(s, &plan)) {
            reporter.event(Event::new(name, "note").message(format!(
                "service {} was changed by hand ({what}); updating it back",
                plan.name
            )));
        }
        let same_mode = current.as_ref().is_some_and(|s| {
            is_global(s) == target.proxy.placement.global
                && (target.proxy.placement.global
                    || service_replicas(s) == Some(i64::from(target.desired.replicas)))
        });
        let mut actions = PlanSummary::default();
        let rolled = !(same_spec && same_mode);
        if rolled {
            if !same_spec {
                // Envoy checks the new files before Swarm rolls anything.
                reporter.waiting(format!("{name}: validating the new config"));
                self.local.validate(target, reporter).await?;
            }
            self.state.write_spec(&target.desired)?;
            let ids = self.create_objects(name, &plan.files, reporter).await?;
            plan = self
                .service_plan(target, reporter, &ids, Some(&watched))
                .await?
                .0;
            if let (true, Some(s)) = (same_spec, &current) {
                // Only the count changes: the tasks keep the baseline they have.
                keep_files_of(&mut plan, s);
            }
            if channel && !same_spec {
                // The new tasks start from it: it is the current set from now on.
                self.state.write_live(name, &watched)?;
            }
            let before = current
                .as_ref()
                .and_then(|s| s.update_status.as_ref())
                .and_then(|u| u.started_at.clone());
            let tasks_before = match &current {
                Some(_) => self.running_tasks(name).await?.len(),
                None => 0,
            };
            let rolls = self.apply(&plan, current.as_ref()).await?;
            reporter.event(Event::new(name, "service").message(format!(
                "{} service {} (spec {})",
                if current.is_none() {
                    "created"
                } else if rolls {
                    "updating"
                } else {
                    "scaled"
                },
                plan.name,
                crate::core::replica::short_hash(&plan.hash)
            )));
            // A new spec rolls every task; without one only the count changes.
            let before = if rolls && current.is_some() {
                before.or_else(|| Some(String::new()))
            } else {
                None
            };
            if let Err(e) = self.await_rollout(target, &plan, before, reporter).await {
                if channel && !same_spec {
                    // Swarm's rollback brings back tasks of the previous baseline.
                    let _ = self.state.write_live(name, &previous);
                }
                return Err(e);
            }
            let after = self.running_tasks(name).await?.len();
            if current.is_none() {
                actions.create = after;
            } else if rolls {
                actions.replace = tasks_before.min(after);
                actions.create = after.saturating_sub(tasks_before);
                actions.remove = tasks_before.saturating_sub(after);
            } else {
                actions.create = after.saturating_sub(tasks_before);
                actions.remove = tasks_before.saturating_sub(after);
            }
            self.prune_objects(name).await?;
        }
        let delivery = if !channel {
            // Watched files are configs here: a change is a new spec, rolled above.
            Delivery::Unchanged
        } else if req.hold_files {
            Delivery::Held
        } else if rolled && !same_spec {
            match live::changed(&previous, &watched) {
                files if files.is_empty() => Delivery::Unchanged,
                files => Delivery::Written { files },
            }
        } else {
            self.deliver_live(target, &previous, &watched, req.confirm_timeout, reporter)
                .await?
        };
        let readiness = self.readiness(target).await?;
        Ok(Converged {
            delivery,
            actions,
            readiness,
        })
    }

    async fn remove(&self, proxy: &str, reporter: &Reporter) -> Result<usize, ConvergeError> {
        let tasks = self.running_tasks(proxy).await?.len();
        if let Some(s) = self.service(proxy).await? {
            let id = s.id.clone().unwrap_or_else(|| service::service_name(proxy));
            reporter.waiting(format!(
                "{proxy}: removing service {}",
                service::service_name(proxy)
            ));
            if let Err(e) = self.docker().delete_service(&id).await {
                return Err(self.refused(format!("remove service {id}"), e).await);
            }
            self.await_tasks_gone(proxy).await?;
        }
        self.prune_objects(proxy).await?;
        self.state.remove_proxy(proxy)?;
        Ok(tasks)
    }

    async fn prune_images(&self, reporter: &Reporter) -> Result<Vec<String>, ConvergeError> {
        images::prune(self.docker(), reporter).await
    }

    async fn status(
        &self,
        proxies: &BTreeSet<String>,
    ) -> Result<Vec<ReplicaStatus>, ConvergeError> {
        let mut rows = Vec::new();
        for p in proxies {
            rows.extend(self.rows(p).await?);
        }
        Ok(rows)
    }

    async fn envoy_metrics(&self, _proxies: &BTreeSet<String>) -> Vec<(String, String, String)> {
        // A task's admin socket lives in its own tmpfs, on whichever node runs it.
        Vec::new()
    }

    fn changes(&self) -> Changes {
        events::changes(
            self.engine.clone(),
            self.state_dir(),
            self.extra_labels.clone(),
        )
    }
}

impl Swarm {
    /// How many nodes can run the proxy's tasks now (its constraints met, available, ready): a
    /// global service runs one task on each. None at all is an error naming the constraints.
    pub(super) async fn eligible_nodes(&self, target: &Target) -> Result<usize, ConvergeError> {
        let nodes = match self
            .docker()
            .list_nodes(None::<bollard::query_parameters::ListNodesOptions>)
            .await
        {
            Ok(n) => n,
            Err(e) => return Err(self.refused("list nodes", e).await),
        };
        let facts: Vec<placement::NodeFacts> = nodes.iter().map(placement::NodeFacts::of).collect();
        placement::eligible(target.name(), &target.proxy.placement.constraints, &facts)
            .map(|n| n.len())
            .map_err(|problem| ConvergeError::Host { problem })
    }

    async fn readiness(&self, target: &Target) -> Result<ProxyReadiness, ConvergeError> {
        let rows = self.rows(target.name()).await?;
        let wanted = if target.proxy.placement.global {
            rows.len() as u32
        } else {
            target.desired.replicas
        };
        let ready = rows.iter().filter(|r| r.ready).count() as u32;
        Ok(ProxyReadiness {
            wanted,
            ready,
            not_ready: rows
                .iter()
                .filter(|r| !r.ready)
                .map(|r| {
                    (
                        r.container.clone(),
                        crate::envoy::readiness::Readiness::NotReady {
                            reason: crate::envoy::readiness::NotReady::Starting {
                                state: r.reason.clone().unwrap_or_else(|| r.state.to_string()),
                            },
                        },
                    )
                })
                .collect(),
        })
    }
}
