//! The config watcher: watches the config file's directory (editors replace files by rename),
//! waits until the events stop for [`super::DEBOUNCE`], then re-loads and re-renders. A broken
//! edit is logged and recorded (Accepted=False, InvalidParameters, with file:line:col) and
//! ignored: the last good config keeps running.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger, DEBOUNCE};

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let file =
        std::path::absolute(&shared.opts.config).unwrap_or_else(|_| shared.opts.config.clone());
    let dir = file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let name = file.file_name().map(|n| n.to_os_string());
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(event) = res else { return };
        if event.kind.is_access() {
            return;
        }
        if event
            .paths
            .iter()
            .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
        {
            let _ = tx.send(());
        }
    })
    .context("cannot start the config file watcher")?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .with_context(|| format!("cannot watch {}", dir.display()))?;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            got = rx.recv() => if got.is_none() { return Ok(()) },
        }
        // Debounce: wait until no event came for DEBOUNCE.
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(DEBOUNCE) => break,
                _ = rx.recv() => continue,
            }
        }
        match shared.reload() {
            Ok(true) => {
                let gens = shared
                    .desired
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .generations
                    .iter()
                    .map(|(p, g)| format!("{p}@{g}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                log(shared.opts.mode, &format!("config changed: {gens}"));
                shared.trigger(Trigger::All("config"));
            }
            Ok(false) => {}
            Err(e) => log(
                shared.opts.mode,
                &format!("config edit refused, the last good config keeps running:\n{e:#}"),
            ),
        }
    }
}
