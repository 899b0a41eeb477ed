//! The observation cache: inspect only the containers with an event since the last look, while
//! the engine's recent events still reach back to it.

use super::*;

impl DockerEngine {
    /// The last look's containers, when the engine reports no event for any container of
    /// `filter` since that look's witness: every change to a container (created, started,
    /// died, removed, renamed, updated) is an event, so the list would say the same. One
    /// request instead of a list and an events request. None when anything happened, or the
    /// witness is gone (evicted, or the engine restarted): then the caller lists.
    pub(super) async fn unchanged_since_last_look(
        &self,
        filter: &LabelFilter,
        cache: &mut ObservationCache,
    ) -> EngineResult<Option<Vec<ObservedContainer>>> {
        let (Some(found), Some(witness)) = (&cache.found, cache.witness.as_deref()) else {
            return Ok(None);
        };
        let (newest, changed) = self.events_since(filter, Some(witness)).await?;
        if !changed.is_some_and(|c| c.is_empty()) {
            return Ok(None);
        }
        let found = found.clone();
        cache.vouched = found.iter().map(|c| c.id.clone()).collect();
        if newest.is_some() {
            cache.witness = newest;
        }
        Ok(Some(found))
    }

    /// The engine's buffered container events matching `filter` from `witness` (inclusive) up
    /// to now: the newest event's token, and the containers with an event after the witness.
    /// `None` for the containers when the witness is absent or no longer buffered: nothing
    /// can be vouched for.
    pub(super) async fn events_since(
        &self,
        filter: &LabelFilter,
        witness: Option<&str>,
    ) -> EngineResult<(Option<String>, Option<BTreeSet<String>>)> {
        let labels = filter.engine_values();
        let mut filters: HashMap<&str, Vec<&str>> = HashMap::new();
        filters.insert("type", vec!["container"]);
        filters.insert("label", labels.iter().map(String::as_str).collect());
        let since = witness
            .and_then(|w| w.split_once(' '))
            .map_or("0".to_string(), |(nanos, _)| since_of(nanos));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let until = format!("{}.{:09}", now.as_secs(), now.subsec_nanos());
        let opts = EventsOptionsBuilder::default()
            .since(&since)
            .until(&until)
            .filters(&filters)
            .build();
        let events: Vec<bollard::models::EventMessage> =
            match self.docker.events(Some(opts)).try_collect().await {
                Ok(events) => events,
                Err(e) => return Err(self.refused("list recent events", e).await),
            };
        let tokens: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                let id = e
                    .actor
                    .as_ref()
                    .and_then(|a| a.id.clone())
                    .unwrap_or_default();
                let token = format!(
                    "{} {} {}",
                    e.time_nano.unwrap_or_default(),
                    id,
                    e.action.as_deref().unwrap_or_default()
                );
                (token, id)
            })
            .collect();
        let newest = tokens.last().map(|(t, _)| t.clone());
        let changed = witness.and_then(|w| {
            let at = tokens.iter().position(|(t, _)| t == w)?;
            Some(tokens[at + 1..].iter().map(|(_, id)| id.clone()).collect())
        });
        Ok((newest, changed))
    }
}

/// One list, one look at the engine's recent events matching `filter` (Docker keeps the
/// last 256 in memory), and an inspect of only the containers the cache cannot vouch for:
/// those it has never seen, and those with any event since its witness, the newest event
/// it had seen. The cache vouches for nothing when that witness is no longer among the
/// engine's events (evicted by newer ones, or the engine restarted and forgot them): then
/// every container is inspected, as [`ContainerEngine::observe`] does. `docker update`
/// (memory, CPUs, restart policy) is a container event, so it is always seen.
///
/// Podman keeps its events elsewhere, and a remote engine's clock is not this host's
/// (the events are asked for up to "now"): both are observed in full.
pub(super) async fn observe_cached(
    engine: &DockerEngine,
    filter: &LabelFilter,
    cache: &mut ObservationCache,
) -> EngineResult<Vec<ObservedContainer>> {
    let values = filter.engine_values();
    if engine.flavor != Flavor::Docker || !engine.endpoint.starts_with("unix://") {
        *cache = ObservationCache::default();
        return engine.observe(filter).await;
    }
    if cache.filter != values {
        *cache = ObservationCache {
            filter: values,
            ..Default::default()
        };
    }
    if let Some(found) = engine.unchanged_since_last_look(filter, cache).await? {
        return Ok(found);
    }
    let summaries = engine.list_matching(filter).await?;
    let (witness, changed) = engine
        .events_since(filter, cache.witness.as_deref())
        .await?;
    let trusted: BTreeMap<String, Inspected> = match &changed {
        Some(changed) => std::mem::take(&mut cache.inspected)
            .into_iter()
            .filter(|(id, _)| !changed.contains(id))
            .collect(),
        None => BTreeMap::new(),
    };
    let stale: Vec<String> = summaries
        .iter()
        .filter_map(|s| s.id.clone())
        .filter(|id| !trusted.contains_key(id))
        .collect();
    let mut inspected = engine.inspect_all(&stale).await?;
    let out = assemble(summaries, &mut inspected, &trusted, engine.flavor);
    cache.vouched = out
        .iter()
        .filter(|c| trusted.contains_key(&c.id))
        .map(|c| c.id.clone())
        .collect();
    cache.witness = witness;
    cache.inspected = inspected;
    cache.inspected.extend(
        trusted
            .into_iter()
            .filter(|(id, _)| out.iter().any(|c| &c.id == id)),
    );
    cache.found = Some(out.clone());
    Ok(out)
}

/// Docker's `since` for an event's `timeNano`: seconds and nanoseconds.
pub(super) fn since_of(nanos: &str) -> String {
    let n: u128 = nanos.parse().unwrap_or(0);
    format!("{}.{:09}", n / 1_000_000_000, n % 1_000_000_000)
}
