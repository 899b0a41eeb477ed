//! The periodic resync: every proxy is reconciled at a fixed interval, whatever the events
//! said, so a missed event is repaired within one interval. Images whose pull policy is
//! "always" are pulled first ([`super::tags`]): a tag that moved is rolled out by that pass.

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
            _ = tick.tick() => {
                super::tags::check(&shared, super::tags::Which::All).await;
                shared.trigger(Trigger::All("resync"));
            }
        }
    }
}
