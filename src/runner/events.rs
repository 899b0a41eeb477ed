//! The Docker event watcher: a die, destroy, stop, kill, oom, update or rename of a berth
//! container triggers a reconcile of its proxy. When the engine goes away the stream ends; the
//! watcher reconnects with exponential backoff and then asks for a full reconcile (events may
//! have been missed meanwhile).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger};
use crate::spec::{LABEL_MANAGED_BY, MANAGED_BY_VALUE};

/// The container actions that can leave a proxy short of a replica or drifted.
pub const ACTIONS: &[&str] = &["die", "destroy", "update", "rename", "stop", "kill", "oom"];
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let filter = format!("{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}");
    let mut backoff = MIN_BACKOFF;
    let mut reconnecting = false;
    loop {
        let mut stream = Box::pin(shared.engine.events(&filter, ACTIONS));
        let mut got_any = false;
        let why = loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                next = stream.next() => next,
            };
            match next {
                Some(Ok(ev)) => {
                    if !got_any && reconnecting {
                        log(shared.opts.mode, "docker events: reconnected");
                        shared.trigger(Trigger::All("docker-reconnect"));
                    }
                    got_any = true;
                    backoff = MIN_BACKOFF;
                    reconnecting = false;
                    shared.metrics.inc(
                        "berth_docker_events_total",
                        "Container events seen, by action.",
                        &[("action", ev.action.as_str())],
                    );
                    if let Some(proxy) = ev.proxy {
                        tracing::debug!("docker event {} on {:?} ({proxy})", ev.action, ev.name);
                        shared.trigger(Trigger::Proxy(proxy, "docker"));
                    }
                }
                Some(Err(e)) => break format!("{e:#}"),
                None => break "the engine closed the event stream".to_string(),
            }
        };
        if !reconnecting {
            log(
                shared.opts.mode,
                &format!("docker events: {why}; reconnecting"),
            );
        }
        reconnecting = true;
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        // A reconnect that yields no event for a while is still a reconnect: a full reconcile
        // after each backoff repairs whatever happened while the engine was away.
        shared.trigger(Trigger::All("docker-reconnect"));
    }
}
