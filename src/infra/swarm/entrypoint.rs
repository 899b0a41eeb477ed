//! How each task starts Envoy: through the agent in the derived image, or the image's own
//! entrypoint; and the registry credentials every node pulls the agent image with.

use super::*;

impl Swarm {
    /// How each task starts Envoy: through the agent in the derived image (built when `build`,
    /// else only named, for `diff`), or the image's own entrypoint when the config says
    /// `[swarm] agent = false`. Without a static agent binary, converging refuses (a lossy
    /// mode is never what a user gets by not knowing a setting); `diff` says so and goes on.
    pub(super) async fn entrypoint(
        &self,
        target: &Target,
        reporter: &Reporter,
        build: bool,
    ) -> Result<Entrypoint, ConvergeError> {
        let name = target.name();
        if self.no_agent {
            return Ok(Entrypoint::Plain);
        }
        let binary = match crate::infra::swarm::agent_binary::locate() {
            Ok(b) => b,
            Err(e) if build => {
                return Err(ConvergeError::Host {
                    problem: format!(
                        "proxy {name}: the berth agent drains each task Swarm replaces and answers its health check, and berth cannot provide it: {e:#}; or, knowing that every rolling update then cuts the replaced tasks' connections, set `[swarm] agent = false`"
                    ),
                })
            }
            Err(e) => {
                reporter.event(Event::new(name, "note").message(format!(
                    "`up` will refuse: no agent binary ({e:#})"
                )));
                return Ok(Entrypoint::Plain);
            }
        };
        let base = &target.desired.spec.image;
        if self.nodes > 1 && self.registry.is_none() {
            return Err(ConvergeError::Host {
                problem: format!(
                    "this Swarm has {} nodes and the agent image berth builds for proxy {name} ({} from {base}) exists only on this manager: set a registry every node can pull from, `[swarm] registry = \"host[:port][/path]\"` in the config, and `docker login` to it as the user berth runs as (berth pushes the image there and the nodes pull it with the same credentials)",
                    self.nodes,
                    crate::infra::swarm::agent_image::REPOSITORY
                ),
            });
        }
        let image = if build {
            reporter.waiting(format!("{name}: image {base} with the berth agent"));
            let local = crate::infra::swarm::agent_image::ensure(
                &*self.engine,
                base,
                reporter.shows_progress(),
            )
            .await
            .map_err(|e| ConvergeError::Host {
                problem: format!("the derived image of {base} (Envoy + berth agent): {e:#}"),
            })?;
            match &self.registry {
                None => local,
                Some(registry) => {
                    let known = self
                        .pushed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&local)
                        .cloned();
                    if let Some(pinned) = known {
                        return self.agent_entrypoint(target, pinned, true).map_err(host);
                    }
                    reporter.waiting(format!("{name}: pushing the agent image to {registry}"));
                    let pinned = crate::infra::swarm::agent_image::publish(
                        &*self.engine,
                        &local,
                        registry,
                        reporter.shows_progress(),
                    )
                    .await
                    .map_err(|e| ConvergeError::Host {
                        problem: format!(
                            "the agent image {local} could not be pushed to [swarm] registry {registry}: {e:#}"
                        ),
                    })?;
                    self.pushed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(local, pinned.clone());
                    pinned
                }
            }
        } else {
            let base_id = self
                .engine
                .image_id(base)
                .await
                .ok()
                .flatten()
                .unwrap_or_default();
            let bytes = std::fs::read(&binary).unwrap_or_default();
            let local = crate::infra::swarm::agent_image::tag(
                &base_id,
                &crate::core::replica::sha256_hex(&bytes),
            );
            // The digest is left out of the spec hash: the tag already names the content.
            match &self.registry {
                None => local,
                Some(registry) => crate::infra::swarm::agent_image::in_registry(&local, registry),
            }
        };
        self.agent_entrypoint(target, image, build).map_err(host)
    }

    /// The agent's settings for `target`'s tasks, running `image`; with the agent channel for a
    /// proxy whose routes and clusters are watched files (its credentials made when `create`).
    pub(super) fn agent_entrypoint(
        &self,
        target: &Target,
        image: String,
        create: bool,
    ) -> anyhow::Result<Entrypoint> {
        let channel = if live(target) {
            Some(self.channel(target.name(), create)?)
        } else {
            None
        };
        let version = config_version(target, channel.is_some());
        Ok(Entrypoint::Agent(service::AgentSettings {
            image,
            env: crate::core::agent::service_env(
                &target.desired.shutdown,
                &target.desired.expect(),
                &version,
            ),
            health_test: crate::core::agent::HEALTHCHECK_TEST
                .iter()
                .map(|s| s.to_string())
                .collect(),
            stop_grace_period: crate::core::agent::stop_grace_period(&target.desired.shutdown),
            channel,
        }))
    }

    /// The Docker client's credentials for `[swarm] registry`, sent with a service's spec so
    /// that every node can pull the agent image (`docker service create --with-registry-auth`).
    pub(super) async fn registry_auth(
        &self,
    ) -> Result<Option<bollard::auth::DockerCredentials>, ConvergeError> {
        let Some(registry) = &self.registry else {
            return Ok(None);
        };
        let host = crate::engine::credentials::registry_of(&format!("{registry}/x")).to_string();
        let lookup = host.clone();
        tokio::task::spawn_blocking(move || crate::engine::credentials::lookup(&lookup))
            .await
            .map_err(|e| anyhow!("{e}"))?
            .map_err(|e| ConvergeError::Host {
                problem: format!("the credentials for [swarm] registry {host}: {e}"),
            })
    }
}
