//! The single Docker host: berth rolls each proxy's replicas itself, as containers on one
//! engine (DESIGN decisions 1–9), through the [`ContainerEngine`] seam.
//!
//! One converge: observe the proxy's containers (one list by label; a command inspects only
//! those the engine's recent events say changed since its last look, serve inspects each), probe
//! the running ones ([`crate::envoy::readiness`]), plan ([`crate::core::plan::plan_with`]: every decision is
//! the planner's), make the image present and validate a spec no replica has proven (a fresh
//! proxy's new replicas are their own check; Envoy's verdict is sought if one fails), write
//! the bootstrap generation, deliver the watched files live ([`crate::infra::delivery`]), then execute
//! the actions one replica at a time, start-first and health-gated, with rollback.
//!
//! Files: `ahead` (the probes and host reads a command starts before the engine answers),
//! `prepare` (the host's preparation for the fleet), `execute` (the
//! actions), `gate` (a new replica and its readiness gate), `retire` (the drain sequence),
//! `files` (validation and the files replicas read), `observe` (containers, probes, status
//! rows).

mod ahead;
mod canary;
mod execute;
mod files;
mod gate;
mod observe;
mod prepare;
mod retire;
#[cfg(test)]
mod tests;
mod traffic_gate;
mod waves;

pub use ahead::Ahead;
pub use gate::{Gate, GateFailure};
pub use prepare::HostReads;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;

use super::{
    Changed, Changes, ConvergeError, ConvergeRequest, Converged, Delivery, Infrastructure,
};
use crate::core::plan::{self, Action, Plan};
use crate::core::progress::{Event, Reporter};
use crate::core::replica::{LABEL_MANAGED_BY, LABEL_PROXY, MANAGED_BY_VALUE};
use crate::core::target::Target;
use crate::engine::{ContainerEngine, LabelFilter, ObservedContainer};
use crate::envoy::admin::AdminConnector;
use crate::infra::{ReplicaLook, ReplicaStatus};
use crate::state::StateDir;

/// Time Envoy gets to exit after SIGTERM when it could not be drained.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// berth's replicas on one container engine.
pub struct DockerHost {
    pub(crate) engine: Arc<dyn ContainerEngine>,
    pub(crate) admins: Arc<dyn AdminConnector>,
    pub(crate) state: StateDir,
    /// Labels put on every container berth creates here and required of every container it
    /// touches (the test suite's `io.berth.test`; serves with different labels on one host
    /// leave each other alone).
    pub(crate) extra_labels: BTreeMap<String, String>,
    /// One observation of all this berth's containers, reused until berth changes a container
    /// or it is older than `reuse_for` (see [`DockerHost::reusing_observations`]).
    pub(crate) snapshot:
        std::sync::Mutex<Option<(tokio::time::Instant, Arc<Vec<ObservedContainer>>)>>,
    pub(crate) reuse_for: Duration,
    /// A command's probes and host reads started before the engine answered ([`ahead`]).
    pub(crate) ahead: Option<Ahead>,
}

const _: fn() = || {
    fn is_infrastructure<T: Infrastructure>() {}
    is_infrastructure::<DockerHost>();
};

impl DockerHost {
    pub fn new(
        engine: Arc<dyn ContainerEngine>,
        admins: Arc<dyn AdminConnector>,
        state: StateDir,
        extra_labels: BTreeMap<String, String>,
    ) -> DockerHost {
        DockerHost {
            engine,
            admins,
            state,
            extra_labels,
            snapshot: std::sync::Mutex::new(None),
            reuse_for: Duration::ZERO,
            ahead: None,
        }
    }

    /// Uses, where the first observation vouches for them, the answers of probes a command
    /// started before the engine answered, and its host reads while fresh ([`Ahead`]).
    pub fn with_ahead(mut self, ahead: Ahead) -> DockerHost {
        self.ahead = Some(ahead);
        self
    }

    /// Lets one command reuse an observation for up to `d` while it changes nothing, so a
    /// no-op `up` asks the engine once (one list, one look at recent events) however many
    /// steps look. serve does not: every pass sees the engine as it is.
    pub fn reusing_observations(mut self, d: Duration) -> DockerHost {
        self.reuse_for = d;
        self
    }

    pub fn engine(&self) -> &Arc<dyn ContainerEngine> {
        &self.engine
    }

    pub fn state(&self) -> &StateDir {
        &self.state
    }

    /// The filter every observation starts from: berth's containers.
    fn managed() -> LabelFilter {
        LabelFilter::default().with(LABEL_MANAGED_BY, Some(MANAGED_BY_VALUE))
    }
}

#[async_trait]
impl Infrastructure for DockerHost {
    fn describe(&self) -> String {
        format!("Docker host ({})", self.engine.describe())
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
    ) -> Result<crate::infra::HostPreparation, ConvergeError> {
        self.prepare_host(fleet, policy).await
    }

    async fn owned(&self) -> Result<BTreeSet<String>, ConvergeError> {
        let mut names: BTreeSet<String> = self.state.proxies()?.into_iter().collect();
        names.extend(
            self.observe_all()
                .await?
                .iter()
                .filter_map(|c| c.proxy().map(str::to_string)),
        );
        Ok(names)
    }

    async fn diff(&self, targets: &[Target]) -> Result<Plan, ConvergeError> {
        let mut observed = Vec::new();
        let mut facts = plan::Facts::new();
        for t in targets {
            let mine = self.observe_proxy(t.name()).await?;
            facts.insert(
                t.name().to_string(),
                self.facts(&t.desired, &mine).await.planner,
            );
            observed.extend(mine);
        }
        let wanted: BTreeSet<&str> = targets.iter().map(|t| t.name()).collect();
        for gone in self.owned().await? {
            if !wanted.contains(gone.as_str()) {
                observed.extend(self.observe_proxy(&gone).await?);
            }
        }
        let desired: Vec<_> = targets.iter().map(|t| t.desired.clone()).collect();
        let mut plan = plan::plan_with(&desired, &observed, &facts);
        for t in targets {
            let on_disk = self
                .state
                .read_xds(t.name())
                .map_err(ConvergeError::State)?;
            let on_disk = crate::infra::delivery::unstamp(&on_disk);
            if on_disk.is_empty() {
                // A proxy that never ran: its files come with its first replicas.
                continue;
            }
            plan.live.extend(plan::LiveUpdate::between(
                t.name(),
                &on_disk,
                &t.rendered.xds,
            ));
        }
        Ok(plan)
    }

    async fn resolve_image(
        &self,
        image: &str,
        pull: bool,
        reporter: &Reporter,
    ) -> Result<Option<String>, ConvergeError> {
        let progress = reporter.shows_progress();
        let id = if pull {
            self.engine.pull(image, progress).await?
        } else {
            self.engine.ensure_image(image, progress).await?
        };
        Ok(Some(id))
    }

    async fn validate(&self, target: &Target, reporter: &Reporter) -> Result<(), ConvergeError> {
        self.engine
            .ensure_image(&target.desired.spec.image, reporter.shows_progress())
            .await?;
        let never = tokio_util::sync::CancellationToken::new();
        self.run(reporter, &never).validate_target(target).await
    }

    async fn converge(&self, req: ConvergeRequest<'_>) -> Result<Converged, ConvergeError> {
        let target = req.target;
        let name = target.name();
        let desired = &target.desired;
        let mut observed = self.observe_proxy(name).await?;
        // `berth rollout undo` after a finished rollout: back to the previous spec first; the
        // plan then holds it (see `waves`).
        let undone = self
            .run(req.reporter, &req.cancel)
            .undo_finished(target, &observed)
            .await?;
        if undone > 0 {
            self.forget_observation();
            observed = self.observe_proxy(name).await?;
        }
        let facts = self.facts(desired, &observed).await;
        tracing::debug!(target: "berth::phase", "{name}: observed and probed");
        let fresh = !facts.any_ready;
        let probes = facts.probes;
        let plan = plan::plan_with(
            std::slice::from_ref(desired),
            &observed,
            &plan::Facts::from([(name.to_string(), facts.planner)]),
        );
        let actions: Vec<&Action> = plan.for_proxy(name).collect();
        for note in &plan.notes {
            req.reporter
                .event(Event::new(name, "note").message(note.to_string()));
        }
        let run = self.run(req.reporter, &req.cancel);
        let prepare = plan::prepare(desired, &observed, &actions);
        let image_id = if prepare.image {
            req.reporter
                .waiting(format!("{name}: image {}", desired.spec.image));
            let id = self
                .engine
                .ensure_image(&desired.spec.image, req.reporter.shows_progress())
                .await?;
            crate::core::crashpoint::reached("after-pull");
            id
        } else {
            String::new()
        };
        // Only empty slots to fill, nothing to protect: the new replicas are the check (a
        // replica that serves proves its config more than `envoy --mode validate` can), and
        // Envoy's verdict is sought only when one fails, so that a refused config reads as
        // one. Otherwise validation comes first.
        let by_replicas =
            prepare.validate && actions.iter().all(|a| matches!(a, Action::Create { .. }));
        if prepare.validate && !by_replicas {
            run.validate_target(target).await?;
            crate::core::crashpoint::reached("after-validate");
        } else {
            run.copy_tls(target)?;
        }
        run.write_generation(target).await?;
        let delivery = if req.hold_files {
            Delivery::Held
        } else {
            run.deliver(target, &observed, req.generation, req.confirm_timeout)
                .await?
        };
        if !actions.is_empty() {
            self.forget_observation();
        }
        let result = if by_replicas {
            match run
                .execute(target, &actions, &observed, &image_id, fresh)
                .await
            {
                Err(failed @ ConvergeError::Gate(_)) => match run.validate_target(target).await {
                    // Envoy refuses the config, or the engine its check: that is the answer.
                    Err(refused) => {
                        run.remove_new(target).await;
                        Err(refused)
                    }
                    Ok(()) => Err(failed),
                },
                other => other,
            }
        } else {
            run.execute(target, &actions, &observed, &image_id, fresh)
                .await
        };
        if !actions.is_empty() {
            self.forget_observation();
        }
        let mut done = result?;
        done.replace += undone;
        if !actions.is_empty() {
            run.prune(target).await?;
        }
        // Nothing changed since the facts were probed: their probes are the readiness.
        // A spec `berth rollout undo` rolled back from is held: readiness is the held spec's.
        let held = canary::held_spec(&run, target, &observed);
        let desired = held.as_ref().unwrap_or(desired);
        let readiness = if actions.is_empty() && matches!(delivery, Delivery::Unchanged) {
            observe::tally(desired, &observed, &probes)
        } else {
            self.readiness(desired, actions.is_empty().then_some(observed.as_slice()))
                .await?
        };
        Ok(Converged {
            delivery,
            actions: done,
            readiness,
        })
    }

    async fn remove(&self, proxy: &str, reporter: &Reporter) -> Result<usize, ConvergeError> {
        let mine = self.observe_proxy(proxy).await?;
        let never = tokio_util::sync::CancellationToken::new();
        let run = self.run(reporter, &never);
        // The whole proxy goes away: drain its replicas at once, not one after the other.
        let results = futures_util::future::join_all(mine.iter().map(|c| {
            let (run, mine) = (&run, &mine);
            async move {
                let (shutdown, policy) = run.drain_settings(proxy, c);
                run.retire(proxy, &plan::ContainerRef::of(c), mine, &shutdown, &policy)
                    .await
            }
        }))
        .await;
        self.forget_observation();
        let removed = results.iter().filter(|r| r.is_ok()).count();
        if let Some(err) = results.into_iter().find_map(Result::err) {
            return Err(err);
        }
        self.state.remove_proxy(proxy)?;
        Ok(removed)
    }

    async fn status(
        &self,
        proxies: &BTreeSet<String>,
    ) -> Result<Vec<ReplicaStatus>, ConvergeError> {
        let mut observed = Vec::new();
        for p in proxies {
            observed.extend(self.observe_proxy(p).await?);
        }
        Ok(self.rows(&observed).await)
    }

    async fn envoy_metrics(&self, proxies: &BTreeSet<String>) -> Vec<(String, String, String)> {
        let mut running = Vec::new();
        for p in proxies {
            if let Ok(mine) = self.observe_proxy(p).await {
                running.extend(
                    mine.into_iter()
                        .filter(|c| c.state == crate::engine::RunState::Running),
                );
            }
        }
        let mut scraped: Vec<(String, String, String)> =
            futures_util::stream::iter(running.into_iter().map(|c| async move {
                let proxy = c.proxy().unwrap_or_default().to_string();
                let run = c.recorded_name().unwrap_or(&c.name).to_string();
                let admin = self.admin(&proxy, &run, crate::envoy::readiness::STATUS_TIMEOUT);
                match admin.get("/stats/prometheus?usedonly").await {
                    Ok((200, body)) => Some((proxy, c.name.clone(), body)),
                    _ => None,
                }
            }))
            .buffer_unordered(8)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        scraped.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        scraped
    }

    async fn look(&self, proxies: &BTreeSet<String>) -> Result<Vec<ReplicaLook>, ConvergeError> {
        self.look_at(proxies).await
    }

    async fn kill(&self, container: &str) -> Result<(), ConvergeError> {
        self.engine.kill(container).await?;
        self.forget_observation();
        Ok(())
    }

    fn changes(&self) -> Changes {
        let state_dir = self.state.root().to_path_buf();
        let extra = self.extra_labels.clone();
        self.engine
            .events(&Self::managed())
            .filter_map(move |e| {
                let changed = match e {
                    Err(e) => Some(Err(e)),
                    Ok(e) => {
                        let mine = e
                            .labels
                            .get(crate::core::replica::LABEL_STATE_DIR)
                            .is_none_or(|d| std::path::Path::new(d) == state_dir)
                            && extra.iter().all(|(k, v)| e.labels.get(k) == Some(v));
                        e.labels.get(LABEL_PROXY).filter(|_| mine).map(|p| {
                            Ok(Changed {
                                proxy: p.clone(),
                                what: e.action.clone(),
                            })
                        })
                    }
                };
                async move { changed }
            })
            .boxed()
    }
}
