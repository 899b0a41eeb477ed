//! SIGTERM and SIGINT cancel the run group.

use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::{log, Shared};

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let name = tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    let busy: Vec<String> = shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect();
    if busy.is_empty() {
        log(shared.opts.mode, &format!("{name}: stopping"));
    } else {
        log(
            shared.opts.mode,
            &format!(
                "{name}: stopping after the current step of {}",
                busy.join(", ")
            ),
        );
    }
    cancel.cancel();
    Ok(())
}
