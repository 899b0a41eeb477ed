//! The Docker event watcher: a start, restart, die, destroy, stop, kill, oom, update or rename
//! of a berth container triggers a reconcile of its proxy. When the engine goes away the stream ends; the
//! watcher reconnects with exponential backoff and then asks for a full reconcile (events may
//! have been missed meanwhile).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger};
use crate::replica::{LABEL_MANAGED_BY, MANAGED_BY_VALUE};

/// The container actions that can leave a proxy short of a replica or drifted, or change what
/// /status must show (a start after the engine restored a container is the only sign of it).
pub const ACTIONS: &[&str] = &[
    "start", "restart", "die", "destroy", "update", "rename", "stop", "kill", "oom",
];
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let filter = format!("{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}");
    let mut backoff = MIN_BACKOFF;
    let mut reconnecting = false;
    loop {
        let mut stream = Box::pin(shared.engine.events(&filter, ACTIONS));
        let why = loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                next = stream.next() => next,
            };
            match next {
                Some(Ok(ev)) => {
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
        // Wait, with backoff, until the engine answers again; then resubscribe and reconcile
        // everything, since events were missed meanwhile. (A fresh event stream is silent
        // until something happens, so it cannot tell that the engine is back.)
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            if shared.engine.ping().await {
                log(
                    shared.opts.mode,
                    "docker events: engine answers again, reconnected",
                );
                shared.trigger(Trigger::All("docker-reconnect"));
                break;
            }
        }
    }
}
