//! The engine-change watcher: a change someone else made to one of this berth's replicas (a
//! start, die, destroy, stop, kill, oom, update or rename) triggers a pass of its proxy. When
//! the engine goes away the stream ends; the watcher reconnects with exponential backoff and
//! then asks for a full reconcile (changes may have been missed meanwhile).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger};
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let mut backoff = MIN_BACKOFF;
    let mut reconnecting = false;
    loop {
        let mut stream = shared.ops.infra.changes();
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
                        &[("action", ev.what.as_str())],
                    );
                    tracing::debug!("engine event {} on {}", ev.what, ev.proxy);
                    shared.trigger(Trigger::Proxy(ev.proxy, "docker"));
                }
                Some(Err(e)) => break e.to_string(),
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
            if shared.ops.infra.ping().await {
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
