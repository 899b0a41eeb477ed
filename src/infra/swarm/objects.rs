//! A proxy's configs and secrets on the Swarm: created when missing (names carry the content
//! hash, so an existing name already holds the right bytes), removed once neither the
//! service's spec nor a task Swarm wants running refers to them. (So after a finished update
//! the previous spec's objects are gone, and `docker service rollback` by hand cannot go back
//! to it; berth's own rollback happens during the update, before anything is removed.)

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use bollard::models::{ConfigSpec, SecretSpec};
use bollard::query_parameters::{ListConfigsOptionsBuilder, ListSecretsOptionsBuilder};

use super::service::{self, FileObject, LABEL_TARGET};
use super::Swarm;
use crate::core::progress::{Event, Reporter};
use crate::infra::ConvergeError;

/// A config or secret of this berth on the Swarm.
struct Existing {
    id: String,
    name: String,
    secret: bool,
}

impl Swarm {
    fn object_filters(&self, proxy: &str) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_string(),
            vec![format!("{}={proxy}", service::LABEL_SWARM)],
        )])
    }

    /// This berth's configs and secrets of one proxy.
    async fn existing(&self, proxy: &str) -> Result<Vec<Existing>, ConvergeError> {
        let filters = self.object_filters(proxy);
        let configs = match self
            .docker()
            .list_configs(Some(
                ListConfigsOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
        {
            Ok(c) => c,
            Err(e) => return Err(self.refused("list configs", e).await),
        };
        let secrets = match self
            .docker()
            .list_secrets(Some(
                ListSecretsOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
        {
            Ok(s) => s,
            Err(e) => return Err(self.refused("list secrets", e).await),
        };
        let mut out = Vec::new();
        for c in configs {
            let spec = c.spec.unwrap_or_default();
            if self.mine(spec.labels.as_ref()) {
                out.push(Existing {
                    id: c.id.unwrap_or_default(),
                    name: spec.name.unwrap_or_default(),
                    secret: false,
                });
            }
        }
        for s in secrets {
            let spec = s.spec.unwrap_or_default();
            if self.mine(spec.labels.as_ref()) {
                out.push(Existing {
                    id: s.id.unwrap_or_default(),
                    name: spec.name.unwrap_or_default(),
                    secret: true,
                });
            }
        }
        Ok(out)
    }

    /// Makes every object of `files` exist; returns name → ID.
    pub(super) async fn create_objects(
        &self,
        proxy: &str,
        files: &[FileObject],
        reporter: &Reporter,
    ) -> Result<BTreeMap<String, String>, ConvergeError> {
        let mut ids: BTreeMap<String, String> = self
            .existing(proxy)
            .await?
            .into_iter()
            .map(|e| (e.name, e.id))
            .collect();
        let mut made = Vec::new();
        let missing: Vec<&FileObject> = files
            .iter()
            .filter(|f| !ids.contains_key(&f.name))
            .collect();
        for f in missing {
            let mut labels =
                service::ownership_labels(proxy, &self.state_dir(), &self.extra_labels);
            labels.insert(LABEL_TARGET.into(), f.target.clone());
            let data = Some(base64::engine::general_purpose::STANDARD.encode(&f.data));
            let created = if f.secret {
                self.docker()
                    .create_secret(SecretSpec {
                        name: Some(f.name.clone()),
                        labels: Some(labels),
                        data,
                        ..Default::default()
                    })
                    .await
            } else {
                self.docker()
                    .create_config(ConfigSpec {
                        name: Some(f.name.clone()),
                        labels: Some(labels),
                        data,
                        ..Default::default()
                    })
                    .await
            };
            match created {
                Ok(r) => {
                    ids.insert(f.name.clone(), r.id);
                    made.push(format!(
                        "{} {}",
                        if f.secret { "secret" } else { "config" },
                        f.target
                    ));
                }
                Err(e) => {
                    let kind = if f.secret { "secret" } else { "config" };
                    return Err(self
                        .refused(format!("create {kind} {} ({})", f.name, f.target), e)
                        .await);
                }
            }
        }
        if !made.is_empty() {
            reporter
                .event(Event::new(proxy, "files").message(format!("created {}", made.join(", "))));
        }
        Ok(ids)
    }

    /// Removes the proxy's objects no spec of its service (current or previous) names. With
    /// no service left, that is all of them.
    pub(super) async fn prune_objects(&self, proxy: &str) -> Result<usize, ConvergeError> {
        let mut used = BTreeSet::new();
        if let Some(s) = self.service(proxy).await? {
            if let Some(c) = s
                .spec
                .as_ref()
                .and_then(|s| s.task_template.as_ref())
                .and_then(|t| t.container_spec.as_ref())
            {
                used.extend(
                    c.configs
                        .iter()
                        .flatten()
                        .filter_map(|r| r.config_name.clone()),
                );
                used.extend(
                    c.secrets
                        .iter()
                        .flatten()
                        .filter_map(|r| r.secret_name.clone()),
                );
            }
            used.extend(self.objects_of_running_tasks(proxy).await?);
        }
        let mut removed = 0;
        for e in self.existing(proxy).await? {
            if used.contains(&e.name) {
                continue;
            }
            let result = if e.secret {
                self.docker().delete_secret(&e.id).await
            } else {
                self.docker().delete_config(&e.id).await
            };
            match result {
                Ok(()) => removed += 1,
                // Gone already, or still in use by a task being removed: the next pass.
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404 | 400,
                    ..
                }) => {}
                Err(e2) => {
                    return Err(self.refused(format!("remove {}", e.name), e2).await);
                }
            }
        }
        Ok(removed)
    }
}
