//! What `berth serve` watches on a Swarm: events of berth's services (an update, a rollback,
//! a removal by hand) and of their task containers on this node (a task died or was killed),
//! each naming the proxy to look at.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bollard::query_parameters::EventsOptionsBuilder;
use futures_util::StreamExt;

use super::service::LABEL_SWARM;
use crate::engine::{ContainerEngine, DockerEngine, EngineError, LabelFilter};
use crate::infra::{Changed, Changes};

/// Service actions worth a look.
const SERVICE_ACTIONS: &[&str] = &["create", "update", "remove"];

pub(super) fn changes(
    engine: Arc<DockerEngine>,
    _state_dir: String,
    extra_labels: BTreeMap<String, String>,
) -> Changes {
    let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
    filters.insert("type", vec!["service"]);
    filters.insert("event", SERVICE_ACTIONS.to_vec());
    let endpoint = engine.describe();
    let services = engine
        .client()
        .events(Some(
            EventsOptionsBuilder::default().filters(&filters).build(),
        ))
        .filter_map(move |r| {
            let changed = match r {
                Err(e) => Some(Err(EngineError::Unreachable {
                    endpoint: endpoint.clone(),
                    message: format!("the event stream broke: {e}"),
                })),
                Ok(e) => {
                    let name = e
                        .actor
                        .as_ref()
                        .and_then(|a| a.attributes.as_ref())
                        .and_then(|a| a.get("name"))
                        .cloned()
                        .unwrap_or_default();
                    name.strip_prefix("berth-").map(|proxy| {
                        Ok(Changed {
                            proxy: proxy.to_string(),
                            what: format!("service {}", e.action.unwrap_or_default()),
                        })
                    })
                }
            };
            async move { changed }
        });
    let containers = engine
        .events(&LabelFilter::default().with(LABEL_SWARM, None))
        .filter_map(move |e| {
            let changed = match e {
                Err(e) => Some(Err(e)),
                Ok(e) => {
                    let mine = extra_labels.iter().all(|(k, v)| e.labels.get(k) == Some(v));
                    e.labels.get(LABEL_SWARM).filter(|_| mine).map(|p| {
                        Ok(Changed {
                            proxy: p.clone(),
                            what: format!("task {}", e.action),
                        })
                    })
                }
            };
            async move { changed }
        });
    futures_util::stream::select(services, containers).boxed()
}
