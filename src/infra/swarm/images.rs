//! Removing the derived agent images (`berth-agent/envoy:*`, and their names under
//! `[swarm] registry`) that nothing uses any more, after `down`.
//!
//! An image stays while a Swarm service's spec names it (any service: another berth's, or one
//! made by hand) or a container uses it (the engine refuses to remove it then). The registry's
//! copy is not deleted: other nodes may still run tasks from it, and a registry keeps history.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use bollard::query_parameters::{ListImagesOptionsBuilder, RemoveImageOptionsBuilder};

use super::super::ConvergeError;
use crate::core::progress::{Event, Reporter};
use crate::infra::swarm::agent_image::LABEL_BINARY;

/// How long a removal is retried while the engine still counts an exited task container of a
/// removed service as a user of the image.
const IN_USE_GRACE: Duration = Duration::from_secs(15);

/// Removes every derived image that no service names and no container uses; returns the names
/// removed.
pub(super) async fn prune(
    docker: &bollard::Docker,
    reporter: &Reporter,
) -> Result<Vec<String>, ConvergeError> {
    let filters = HashMap::from([("label".to_string(), vec![LABEL_BINARY.to_string()])]);
    let derived = docker
        .list_images(Some(
            ListImagesOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| ConvergeError::Host {
            problem: format!("list the agent images: {e}"),
        })?;
    if derived.is_empty() {
        return Ok(Vec::new());
    }
    // What the Swarm's services still name, by tag (a pinned digest stripped).
    let services = docker
        .list_services(None::<bollard::query_parameters::ListServicesOptions>)
        .await
        .map_err(|e| ConvergeError::Host {
            problem: format!("list services: {e}"),
        })?;
    let named: BTreeSet<String> = services
        .iter()
        .filter_map(|s| {
            let image = s
                .spec
                .as_ref()?
                .task_template
                .as_ref()?
                .container_spec
                .as_ref()?
                .image
                .as_ref()?;
            Some(image.split('@').next().unwrap_or(image).to_string())
        })
        .collect();
    let mut removed = Vec::new();
    for image in derived {
        for tag in image.repo_tags.iter().filter(|t| !named.contains(*t)) {
            let deadline = tokio::time::Instant::now() + IN_USE_GRACE;
            loop {
                let opts = RemoveImageOptionsBuilder::default().build();
                match docker.remove_image(tag, Some(opts), None).await {
                    Ok(_) => {
                        reporter.event(
                            Event::new("swarm", "image").message(format!("removed image {tag}")),
                        );
                        removed.push(tag.clone());
                        break;
                    }
                    // In use by a container: an exited task of a service just removed goes
                    // shortly; anything else keeps it.
                    Err(bollard::errors::Error::DockerResponseServerError {
                        status_code: 409,
                        ..
                    }) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(_) => break,
                }
            }
        }
    }
    Ok(removed)
}
