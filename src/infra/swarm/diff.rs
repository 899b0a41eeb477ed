//! What `diff` shows on a Swarm: each target against its service, with the drift of a
//! service's live spec from its plan.

use super::*;

pub(super) async fn diff(swarm: &Swarm, targets: &[Target]) -> Result<Plan, ConvergeError> {
    let mut plan = Plan::default();
    let services = swarm.services().await?;
    for t in targets {
        let name = t.name().to_string();
        let image_id = swarm
            .engine
            .image_id(&t.desired.spec.image)
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        let entrypoint = swarm.entrypoint(t, &Reporter::quiet(), false).await?;
        let state_dir = swarm.state_dir();
        let cx = service::Context {
            host_network: &swarm.host_network,
            image_id: &image_id,
            state_dir: &state_dir,
            extra_labels: &swarm.extra_labels,
            entrypoint: &entrypoint,
            watched: None,
        };
        let want = service::plan(t, &cx, &BTreeMap::new());
        let tasks = match services.get(&name) {
            Some(_) => swarm.running_tasks(&name).await?,
            None => Vec::new(),
        };
        let wanted = if t.proxy.placement.global {
            swarm.eligible_nodes(t).await.unwrap_or(0) as u32
        } else {
            t.desired.replicas
        };
        let current = services.get(&name).and_then(service_hash);
        for task in &tasks {
            let slot = task.slot.unwrap_or(0);
            if !t.proxy.placement.global && slot >= wanted {
                plan.actions.push(Action::Remove {
                    proxy: name.clone(),
                    slot: Some(slot),
                    container: task.reference(),
                    reason: RemoveReason::ScaleDown,
                });
            } else if current != Some(want.hash.as_str()) {
                plan.actions.push(Action::Replace {
                    proxy: name.clone(),
                    slot,
                    old: task.reference(),
                    new_name: format!("{}.{}", want.name, slot + 1),
                    reason: ReplaceReason::SpecChanged {
                        from: current.unwrap_or_default().to_string(),
                        to: want.hash.clone(),
                    },
                });
            }
        }
        // Routes, clusters and certificates the agents will take live (no restart).
        if matches!(&entrypoint, Entrypoint::Agent(a) if a.channel.is_some()) {
            let on_record = crate::infra::delivery::unstamp(&swarm.state.read_live(&name)?);
            if !on_record.is_empty() {
                let mut to = t.rendered.xds.clone();
                to.extend(live::tls_copies(t));
                plan.live.extend(crate::core::plan::LiveUpdate::between(
                    &name, &on_record, &to,
                ));
            }
        }
        let have = tasks.len() as u32;
        for slot in have..wanted {
            plan.actions.push(Action::Create {
                proxy: name.clone(),
                slot,
                name: format!("{}.{}", want.name, slot + 1),
            });
        }
    }
    let wanted: BTreeSet<&str> = targets.iter().map(|t| t.name()).collect();
    for (proxy, _) in services
        .iter()
        .filter(|(p, _)| !wanted.contains(p.as_str()))
    {
        for task in swarm.running_tasks(proxy).await? {
            plan.actions.push(Action::Remove {
                proxy: proxy.clone(),
                slot: task.slot,
                container: task.reference(),
                reason: RemoveReason::ProxyRemoved,
            });
        }
    }
    Ok(plan)
}

/// The spec hash a service carries.
pub(super) fn service_hash(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()?
        .labels
        .as_ref()?
        .get(LABEL_SPEC_HASH)
        .map(String::as_str)
}

/// What of the task template differs from berth's although the spec hash label matches: a
/// `docker service update` by hand (image, arguments, environment, files).
pub(super) fn drift(s: &Service, plan: &ServicePlan) -> Option<String> {
    let live = s
        .spec
        .as_ref()?
        .task_template
        .as_ref()?
        .container_spec
        .as_ref()?;
    let want = plan.spec.task_template.as_ref()?.container_spec.as_ref()?;
    let names = |c: &bollard::models::TaskSpecContainerSpec| {
        let mut n: Vec<String> = c
            .configs
            .iter()
            .flatten()
            // A live task's baseline follows the deliveries only at the next rolling update.
            .filter(|r| !service::is_baseline(r.file.as_ref().and_then(|f| f.name.as_deref())))
            .filter_map(|r| r.config_name.clone())
            .chain(
                c.secrets
                    .iter()
                    .flatten()
                    .filter(|r| {
                        !service::is_baseline(r.file.as_ref().and_then(|f| f.name.as_deref()))
                    })
                    .filter_map(|r| r.secret_name.clone()),
            )
            .collect();
        n.sort();
        n
    };
    let image = |c: &bollard::models::TaskSpecContainerSpec| {
        // The CLI pins a resolved digest after the tag.
        c.image
            .as_deref()
            .map(|i| i.split('@').next().unwrap_or(i).to_string())
    };
    let mut what = Vec::new();
    if image(live) != image(want) {
        what.push(format!(
            "image {} instead of {}",
            live.image.as_deref().unwrap_or("-"),
            want.image.as_deref().unwrap_or("-")
        ));
    }
    if live.args != want.args {
        what.push("arguments".to_string());
    }
    let sorted = |e: &Option<Vec<String>>| {
        let mut e = e.clone().unwrap_or_default();
        e.sort();
        e
    };
    if sorted(&live.env) != sorted(&want.env) {
        what.push("environment".to_string());
    }
    if names(live) != names(want) {
        what.push("configs or secrets".to_string());
    }
    (!what.is_empty()).then(|| what.join(", "))
}

pub(super) fn service_replicas(s: &Service) -> Option<i64> {
    s.spec
        .as_ref()?
        .mode
        .as_ref()?
        .replicated
        .as_ref()?
        .replicas
}

pub(super) fn is_global(s: &Service) -> bool {
    s.spec
        .as_ref()
        .and_then(|s| s.mode.as_ref())
        .is_some_and(|m| m.global.is_some())
}
