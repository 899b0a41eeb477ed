//! Updating a proxy's service: its plan (image, entrypoint, configs and secrets), applying it,
//! and awaiting Swarm's start-first rolling update.

use super::*;

impl Swarm {
    /// The service plan of `target`, the image made present first.
    pub(super) async fn service_plan(
        &self,
        target: &Target,
        reporter: &Reporter,
        ids: &BTreeMap<String, String>,
        watched: Option<&BTreeMap<String, String>>,
    ) -> Result<(ServicePlan, Entrypoint), ConvergeError> {
        let image_id = self
            .engine
            .ensure_image(&target.desired.spec.image, reporter.shows_progress())
            .await?;
        let entrypoint = self.entrypoint(target, reporter, true).await?;
        let state_dir = self.state_dir();
        let cx = service::Context {
            host_network: &self.host_network,
            image_id: &image_id,
            state_dir: &state_dir,
            extra_labels: &self.extra_labels,
            entrypoint: &entrypoint,
            watched,
        };
        Ok((service::plan(target, &cx, ids), entrypoint))
    }

    /// Creates or updates the service to `plan`; returns whether the tasks roll (a new spec)
    /// and the update state seen before, to tell this update's end from an earlier one's.
    pub(super) async fn apply(
        &self,
        plan: &ServicePlan,
        current: Option<&Service>,
    ) -> Result<bool, ConvergeError> {
        match current {
            None => {
                if let Err(e) = self
                    .docker()
                    .create_service(plan.spec.clone(), self.registry_auth().await?)
                    .await
                {
                    return Err(self
                        .refused(format!("create service {}", plan.name), e)
                        .await);
                }
                Ok(true)
            }
            Some(s) => {
                let version = s
                    .version
                    .as_ref()
                    .and_then(|v| v.index)
                    .ok_or_else(|| anyhow!("service {} has no version", plan.name))?;
                let rolls = service_hash(s) != Some(plan.hash.as_str()) || drift(s, plan).is_some();
                let options = UpdateServiceOptionsBuilder::default()
                    .version(version as i32)
                    .build();
                if let Err(e) = self
                    .docker()
                    .update_service(
                        &plan.name,
                        plan.spec.clone(),
                        options,
                        self.registry_auth().await?,
                    )
                    .await
                {
                    return Err(self
                        .refused(format!("update service {}", plan.name), e)
                        .await);
                }
                Ok(rolls)
            }
        }
    }

    /// Waits until Swarm finished rolling `plan` out (or rolled it back, or paused), then
    /// until the tasks of the desired spec run.
    pub(super) async fn await_rollout(
        &self,
        target: &Target,
        plan: &ServicePlan,
        before: Option<String>,
        reporter: &Reporter,
    ) -> Result<(), ConvergeError> {
        let name = target.name();
        let rollout = &target.desired.rollout;
        let per_task = rollout.startup_deadline
            + rollout.min_ready
            + target.desired.shutdown.drain_timeout
            + Duration::from_secs(15);
        let started_at = tokio::time::Instant::now();
        let deadline =
            started_at + per_task * target.desired.replicas.max(1) + Duration::from_secs(30);
        loop {
            let Some(s) = self.service(name).await? else {
                return Err(ConvergeError::Host {
                    problem: format!("service {} was removed during its rollout", plan.name),
                });
            };
            let status = s.update_status.as_ref();
            let started = status.and_then(|u| u.started_at.clone());
            let state = status.and_then(|u| u.state);
            if before.is_none() || started != before {
                match state {
                    Some(ServiceUpdateStatusStateEnum::COMPLETED) | None
                        if self.tasks_ready(target, &plan.hash).await? =>
                    {
                        return Ok(());
                    }
                    Some(ServiceUpdateStatusStateEnum::ROLLBACK_COMPLETED)
                    | Some(ServiceUpdateStatusStateEnum::ROLLBACK_PAUSED)
                    | Some(ServiceUpdateStatusStateEnum::PAUSED) => {
                        let message = status.and_then(|u| u.message.clone()).unwrap_or_default();
                        return Err(self.failure(target, plan, state, message).await);
                    }
                    _ => {}
                }
            }
            let past_deadline = started_at.elapsed() > rollout.startup_deadline;
            if let Some(stuck) = self
                .stuck(target, &plan.hash, before.is_none(), past_deadline)
                .await?
            {
                return Err(self.failure(target, plan, None, stuck).await);
            }
            if tokio::time::Instant::now() > deadline {
                let message = format!(
                    "Swarm did not finish updating service {} within {:?} (update state: {})",
                    plan.name,
                    per_task * target.desired.replicas.max(1),
                    state
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "none".into())
                );
                return Err(self.failure(target, plan, None, message).await);
            }
            reporter.waiting(format!("{name}: Swarm rolling service {}", plan.name));
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The version of the files a task is given (its agent reports it in every health check):
/// the first 12 hex of sha256 over the bootstrap and, unless they come through the agent
/// channel (`live`: Envoy's accepted versions say which it serves), the watched files.
pub(super) fn config_version(target: &Target, live: bool) -> String {
    let mut all = target.rendered.bootstrap.clone();
    let watched = if live {
        BTreeMap::new()
    } else {
        target.rendered.xds.clone()
    };
    for (name, text) in &watched {
        all.push('\0');
        all.push_str(name);
        all.push('\0');
        all.push_str(text);
    }
    crate::core::replica::sha256_hex(all.as_bytes())[..12].to_string()
}

/// Whether a proxy's watched files reach its tasks through the agent channel: routes and
/// clusters of its own (standalone). An xDS-mode proxy gets them from its xDS server.
pub(super) fn live(target: &Target) -> bool {
    matches!(
        target.proxy.routing,
        crate::core::ir::Routing::Standalone(_)
    )
}

/// Keeps the service's own config and secret references in `plan` (same spec: only the count
/// changes, and the baseline must not, or Swarm would roll every task).
pub(super) fn keep_files_of(plan: &mut ServicePlan, s: &Service) {
    let live = s
        .spec
        .as_ref()
        .and_then(|s| s.task_template.as_ref())
        .and_then(|t| t.container_spec.as_ref());
    let want = plan
        .spec
        .task_template
        .as_mut()
        .and_then(|t| t.container_spec.as_mut());
    if let (Some(live), Some(want)) = (live, want) {
        want.configs = live.configs.clone();
        want.secrets = live.secrets.clone();
    }
}
