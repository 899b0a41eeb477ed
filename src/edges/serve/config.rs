//! The config watcher: watches the config file and every file it names (certificates, keys,
//! CA, IR and bootstrap files) through their directories (editors and certbot replace files by
//! rename),
//! waits until the events stop for [`super::DEBOUNCE`], then re-loads and re-renders. A broken
//! edit is logged and recorded (Accepted=False, InvalidParameters, with file:line:col) and
//! ignored: the last good config keeps running.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger, DEBOUNCE};

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let file =
        std::path::absolute(&shared.opts.config).unwrap_or_else(|_| shared.opts.config.clone());
    let watched: Arc<Mutex<BTreeSet<PathBuf>>> =
        Arc::new(Mutex::new(BTreeSet::from([file.clone()])));
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let matches = watched.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(event) = res else { return };
        if event.kind.is_access() {
            return;
        }
        let files = matches.lock().unwrap_or_else(|e| e.into_inner());
        if event.paths.iter().any(|p| files.contains(p)) {
            let _ = tx.send(());
        }
    })
    .context("cannot start the config file watcher")?;
    let mut dirs = BTreeSet::new();
    watch_named(&shared, &file, &watched, &mut dirs, &mut watcher)?;
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
        let reloaded = shared.reload();
        if let Err(e) = watch_named(&shared, &file, &watched, &mut dirs, &mut watcher) {
            log(shared.opts.mode, &format!("{e:#}"));
        }
        match reloaded {
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

/// Watches the config file and every file it names (certificates, keys, CA, IR and bootstrap
/// files): their directories, since editors and certbot replace files by rename. The names
/// come from the config as it parses now (the last good list when it does not).
fn watch_named(
    shared: &Shared,
    config: &Path,
    watched: &Mutex<BTreeSet<PathBuf>>,
    dirs: &mut BTreeSet<PathBuf>,
    watcher: &mut notify::RecommendedWatcher,
) -> Result<()> {
    let mut files = BTreeSet::from([config.to_path_buf()]);
    match crate::core::source::file::load(&shared.opts.config) {
        Ok(c) => files.extend(
            c.files
                .iter()
                .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone())),
        ),
        Err(_) => files.extend(
            watched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        ),
    }
    for f in &files {
        let dir = f
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        if !dirs.contains(&dir) {
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .with_context(|| format!("cannot watch {} (for {})", dir.display(), f.display()))?;
            dirs.insert(dir);
        }
    }
    *watched.lock().unwrap_or_else(|e| e.into_inner()) = files;
    Ok(())
}
