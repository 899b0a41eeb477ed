//! Replica containers: create (hardening, network, bind mounts, restart policy), start, stop,
//! kill, remove, and which container a host process belongs to.

use super::*;

impl DockerEngine {
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

    /// The restart policy to create with, for berth's engine-neutral name.
    pub(super) fn restart_policy_for(&self, name: &str) -> RestartPolicyNameEnum {
        if self.flavor == Flavor::Podman && name == crate::engine::RESTART_UNLESS_STOPPED {
            return RestartPolicyNameEnum::ALWAYS;
        }
        restart_policy_of(name)
    }
}

pub(super) async fn create(engine: &DockerEngine, c: &ReplicaContainer) -> EngineResult<String> {
    let host_config = HostConfig {
        restart_policy: Some(RestartPolicy {
            name: Some(engine.restart_policy_for(&c.restart_policy)),
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
    match engine.docker.create_container(Some(opts), body).await {
        Ok(created) => Ok(created.id),
        Err(e) => Err(engine
            .refused(format!("create container {} from {}", c.name, c.image), e)
            .await),
    }
}

pub(super) async fn start(engine: &DockerEngine, id: &str) -> EngineResult<()> {
    match engine.docker.start_container(id, None).await {
        Ok(()) => Ok(()),
        // 304: already running.
        Err(BollardError::DockerResponseServerError {
            status_code: 304, ..
        }) => Ok(()),
        Err(e) => Err(engine.refused(format!("start container {id}"), e).await),
    }
}

pub(super) async fn stop(engine: &DockerEngine, id: &str, timeout: Duration) -> EngineResult<()> {
    let secs = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
    let opts = StopContainerOptionsBuilder::default().t(secs).build();
    // The request lasts as long as the stop: make the client wait longer than the engine.
    let docker = engine
        .docker
        .clone()
        .with_timeout(timeout + Duration::from_secs(30));
    match docker.stop_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(BollardError::DockerResponseServerError {
            status_code: 304, ..
        }) => Ok(()),
        Err(e) => Err(engine.refused(format!("stop container {id}"), e).await),
    }
}

pub(super) async fn kill(engine: &DockerEngine, id: &str) -> EngineResult<()> {
    let opts = bollard::query_parameters::KillContainerOptions {
        signal: "SIGKILL".to_string(),
    };
    match engine.docker.kill_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        // 409 "is not running": it is already down.
        Err(BollardError::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(engine.refused(format!("kill container {id}"), e).await),
    }
}

pub(super) async fn remove(engine: &DockerEngine, id: &str) -> EngineResult<()> {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match engine.docker.remove_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        // 409 "removal already in progress": it is going away.
        Err(BollardError::DockerResponseServerError {
            status_code: 409,
            message,
        }) if message.contains("already in progress") => Ok(()),
        Err(e) => Err(engine.refused(format!("remove container {id}"), e).await),
    }
}

/// What every container berth makes shares: hardening, network and bind mounts.
pub(super) fn host_config(h: &Hardening, network: Network, mounts: &[Mount]) -> HostConfig {
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

pub(super) fn restart_policy_of(name: &str) -> RestartPolicyNameEnum {
    match name {
        "always" => RestartPolicyNameEnum::ALWAYS,
        "unless-stopped" => RestartPolicyNameEnum::UNLESS_STOPPED,
        "on-failure" => RestartPolicyNameEnum::ON_FAILURE,
        _ => RestartPolicyNameEnum::NO,
    }
}

pub(super) fn bind_mount(m: &Mount) -> DockerMount {
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
