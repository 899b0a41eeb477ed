//! serve's side of the local API ([`crate::edges::control`]): a `berth up` that finds this serve
//! holding the state directory hands its request here instead of racing the reconciler.
//!
//! An apply re-reads the config (as an edit would), then asks the scheduler for one pass of
//! every proxy `up` would touch (the config's, and those with state here that nothing wants
//! any more), forwards the progress events of exactly those passes, and answers with what
//! `up` itself would have printed and its exit code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{log, PassOutcome, Shared, Trigger, Unfinished};
use crate::core::progress::Event;
use crate::edges::control::{ApplyRequest, Handler, Outcome, ServeInfo, Verb};

/// How often a waiting apply looks whether a proxy it waits for is still there (a proxy
/// removed by a pass that started before the request gets no pass of its own).
const RECHECK: Duration = Duration::from_secs(1);

pub struct Api {
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl Api {
    pub fn new(shared: Arc<Shared>, cancel: CancellationToken) -> Api {
        Api { shared, cancel }
    }

    fn config(&self) -> PathBuf {
        canonical(&self.shared.opts.config)
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

fn refused(why: String) -> Outcome {
    Outcome::failed(2, format!("error: {why}; nothing was changed"))
}

impl Handler for Api {
    fn info(&self) -> ServeInfo {
        ServeInfo {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            config: self.config(),
            state_dir: self.shared.state.root().to_path_buf(),
        }
    }

    async fn apply(&self, req: ApplyRequest, events: mpsc::UnboundedSender<Event>) -> Outcome {
        let shared = &self.shared;
        let me = format!("berth serve (pid {})", std::process::id());
        let state = shared.state.root().display();
        match req.verb {
            Verb::Up => {}
        }
        if canonical(&req.config) != self.config() {
            return refused(format!(
                "{me} manages the state directory {state} from {}, not {}: edit that file \
                 (serve applies it), or stop serve to use another config here",
                self.config().display(),
                req.config.display()
            ));
        }
        if req.labels != shared.opts.extra_labels {
            return refused(format!(
                "{me} manages the state directory {state} with other container labels than \
                 this command's; stop serve, or run up without --container-label changes"
            ));
        }
        if req.force {
            return refused(format!(
                "{me} manages the state directory {state} and does not take --force (its \
                 passes check the host's memory); stop serve to force an up"
            ));
        }
        if let Err(e) = shared.reload() {
            let (code, text) = crate::edges::exit::report(&e);
            return Outcome::failed(code, text);
        }
        log(
            shared.opts.mode,
            "berth up handed its request over: one pass of every proxy",
        );
        let names = proxies(shared);
        let calls = shared.ops.infra.api_calls();
        let (epochs, watcher) = shared.watch(&names, events);
        for name in &names {
            shared.trigger(Trigger::Proxy(name.clone(), "up"));
        }
        let mut outcomes = Vec::new();
        for (name, epoch) in &epochs {
            match self.wait(name, *epoch).await {
                Some(o) => outcomes.push((name.clone(), o)),
                None => {
                    shared.unwatch(watcher);
                    return Outcome::failed(
                        1,
                        "error: berth serve stopped before the pass ended; the next serve \
                         (or up) completes it",
                    );
                }
            }
        }
        shared.unwatch(watcher);
        let mut outcome = summarize(&outcomes);
        // As `up`, which counts only when every proxy converged.
        if outcomes.iter().all(|(_, o)| o.error.is_none()) {
            outcome.api_requests = Some(shared.ops.infra.api_calls().saturating_sub(calls));
        }
        outcome
    }
}

impl Api {
    /// The outcome of a pass of `name` that read `epoch` or later; a default (success) when
    /// the proxy is gone before one ran (removed by an earlier pass); None when serve stops.
    async fn wait(&self, name: &str, epoch: u64) -> Option<PassOutcome> {
        loop {
            match tokio::time::timeout(RECHECK, self.shared.wait_outcome(name, epoch, &self.cancel))
                .await
            {
                Ok(outcome) => return outcome,
                Err(_) => {
                    if !super::reconciler::owned(&self.shared).contains(name) {
                        return Some(PassOutcome::default());
                    }
                }
            }
        }
    }
}

/// What `up` converges: the config's proxies, and the proxies with state here that neither
/// the config nor Envoy Gateway wants (`up` removes them).
fn proxies(shared: &Shared) -> Vec<String> {
    let mut names: BTreeSet<String> = shared
        .config_targets
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect();
    let desired: BTreeSet<String> = shared
        .desired
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .targets
        .keys()
        .cloned()
        .collect();
    names.extend(
        shared
            .state
            .proxies()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !desired.contains(p)),
    );
    names.into_iter().collect()
}

/// `up`'s verdict on the passes, in its order: the first error (by proxy name), then failed
/// live updates, then replicas that are not ready.
pub fn summarize(outcomes: &[(String, PassOutcome)]) -> Outcome {
    let mut outcome = verdict(outcomes);
    // Each pass prepares the host for its proxy: the same warning may come from several.
    let mut seen = BTreeSet::new();
    outcome.notes = outcomes
        .iter()
        .flat_map(|(_, o)| o.notes.iter())
        .filter(|line| seen.insert(line.as_str()))
        .cloned()
        .collect();
    outcome
}

fn verdict(outcomes: &[(String, PassOutcome)]) -> Outcome {
    if let Some((msg, _)) = outcomes.iter().find_map(|(_, o)| o.error.as_ref()) {
        return Outcome::failed(1, format!("error: {msg}"));
    }
    let delivery: Vec<&str> = outcomes
        .iter()
        .filter_map(|(_, o)| match &o.unfinished {
            Some(Unfinished::Delivery(m)) => Some(m.as_str()),
            _ => None,
        })
        .collect();
    if !delivery.is_empty() {
        return Outcome::failed(1, format!("error: {}", delivery.join("\n")));
    }
    let not_ready: Vec<&str> = outcomes
        .iter()
        .filter_map(|(_, o)| match &o.unfinished {
            Some(Unfinished::NotReady(m)) => Some(m.as_str()),
            _ => None,
        })
        .collect();
    if !not_ready.is_empty() {
        return Outcome::failed(
            1,
            format!(
                "error: not every replica is ready:\n{}",
                not_ready.join("\n")
            ),
        );
    }
    Outcome::ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(error: Option<&str>, unfinished: Option<Unfinished>) -> PassOutcome {
        PassOutcome {
            epoch: 1,
            error: error.map(|e| (e.to_string(), false)),
            unfinished,
            notes: vec!["warning: tcp_migrate_req is 0".into()],
        }
    }

    #[test]
    fn a_watcher_gets_the_events_of_the_passes_it_asked_for() {
        let watchers = super::super::Watchers::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let from = [("a".to_string(), 3), ("b".to_string(), 1)].into();
        let id = watchers.add(from, tx);
        let event = |p: &str, what: &str| Event::new(p, what);
        watchers.forward("a", 2, &event("a", "older pass"));
        watchers.forward("a", 3, &event("a", "ours"));
        watchers.forward("a", 4, &event("a", "later"));
        watchers.forward("b", 1, &event("b", "ours"));
        watchers.forward("c", 9, &event("c", "not asked for"));
        watchers.remove(id);
        watchers.forward("a", 5, &event("a", "after the request"));
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push(format!("{} {}", e.proxy, e.event));
        }
        assert_eq!(got, ["a ours", "a later", "b ours"]);
    }

    #[test]
    fn the_verdict_is_ups() {
        assert_eq!(summarize(&[]), Outcome::ok());
        let all = vec![
            (
                "a".to_string(),
                o(
                    None,
                    Some(Unfinished::NotReady("proxy a: 1/2 ready".into())),
                ),
            ),
            (
                "b".to_string(),
                o(None, Some(Unfinished::Delivery("b: refused".into()))),
            ),
            ("c".to_string(), o(Some("gate failed"), None)),
            ("d".to_string(), o(Some("later"), None)),
        ];
        let mut failed = Outcome::failed(1, "error: gate failed");
        failed.notes = vec!["warning: tcp_migrate_req is 0".into()];
        assert_eq!(summarize(&all), failed, "one warning, said once");
        let all: Vec<_> = all
            .into_iter()
            .map(|(n, mut o)| {
                o.notes.clear();
                (n, o)
            })
            .collect();
        assert_eq!(
            summarize(&all[..2]),
            Outcome::failed(1, "error: b: refused")
        );
        assert_eq!(
            summarize(&all[..1]),
            Outcome::failed(1, "error: not every replica is ready:\nproxy a: 1/2 ready")
        );
    }
}
