//! The periodic resync: every proxy is reconciled at a fixed interval, whatever the events
//! said, so a missed event is repaired within one interval.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use super::{Shared, Trigger};

pub async fn run(shared: Arc<Shared>, every: Duration, cancel: CancellationToken) -> Result<()> {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tick.tick() => shared.trigger(Trigger::All("resync")),
        }
    }
}
