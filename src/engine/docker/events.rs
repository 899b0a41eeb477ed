//! The engine's container event stream, with Podman's names read as Docker's.

use super::*;

/// The container actions [`ContainerEngine::events`] reports.
/// `died` and `remove` are Podman's names for `die` and `destroy` ([`Flavor`]); Docker
/// matches its own names only, so asking for both is harmless.
const EVENT_ACTIONS: &[&str] = &[
    "create", "start", "restart", "die", "died", "destroy", "remove", "update", "rename", "stop",
    "kill", "oom", "pause", "unpause",
];

pub(super) fn events(engine: &DockerEngine, filter: &LabelFilter) -> Events {
    let labels = filter.engine_values();
    let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
    filters.insert("type", vec!["container"]);
    filters.insert("label", labels.iter().map(String::as_str).collect());
    filters.insert("event", EVENT_ACTIONS.to_vec());
    let opts = EventsOptionsBuilder::default().filters(&filters).build();
    let endpoint = engine.endpoint.clone();
    // bollard's timeout bounds only the response headers, which /events sends at once.
    engine
        .docker
        .events(Some(opts))
        .map(move |r| {
            let e = r.map_err(|e| EngineError::Unreachable {
                endpoint: endpoint.clone(),
                message: format!("the event stream broke: {e}"),
            })?;
            let mut labels: BTreeMap<String, String> = e
                .actor
                .as_ref()
                .and_then(|a| a.attributes.clone())
                .unwrap_or_default()
                .into_iter()
                .collect();
            let name = labels.remove("name");
            labels.remove("image");
            let action = match e.action.unwrap_or_default() {
                a if a == "remove" => "destroy".to_string(),
                a => a,
            };
            Ok(ContainerEvent {
                action,
                id: e.actor.and_then(|a| a.id).unwrap_or_default(),
                labels,
                name,
            })
        })
        .boxed()
}
