//! The scheduler: turns triggers into at most one pass per proxy at a time (kube-rs'
//! controller runner, in small). Generic over the pass, so it is unit-tested on tokio's paused
//! clock without an engine.
//!
//! Triggers mark proxies dirty; a dirty proxy that is not busy gets a task at once, one that is
//! busy runs again when its task ends (so any number of triggers during a rollout coalesce into
//! one more pass). Proxies are independent: a long rollout of one never delays another. A pass
//! returns an [`Action`]: [`Action::Requeue`] schedules another pass after a backoff (1 s,
//! doubling to 30 s, reset by the first pass that asks for none).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why a pass was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// Every proxy (startup, config change, resync, events reconnect).
    All(&'static str),
    /// One proxy (an engine event, a remote request, a requeue).
    Proxy(String, &'static str),
}

impl Trigger {
    pub fn source(&self) -> &'static str {
        match self {
            Trigger::All(s) | Trigger::Proxy(_, s) => s,
        }
    }
}

/// What a pass asks of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until the next trigger.
    AwaitChange,
    /// Look again after the backoff.
    Requeue,
}

/// The first requeue's delay; each one in a row doubles it, up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The delay of the `n`-th requeue in a row (0-based).
pub fn backoff(n: u32) -> Duration {
    (MIN_BACKOFF * 2u32.saturating_pow(n.min(16))).min(MAX_BACKOFF)
}

/// Runs until `cancel` or the trigger channel closes; then waits for the running passes (which
/// see the same cancellation and stop between two steps). `owned` says which proxies exist
/// (for [`Trigger::All`] and to drop triggers of unknown proxies); `requeue` is the sender of
/// the same channel, for delayed requeues.
pub async fn run<P, Fut>(
    mut rx: mpsc::UnboundedReceiver<Trigger>,
    requeue: mpsc::UnboundedSender<Trigger>,
    cancel: CancellationToken,
    owned: impl Fn() -> BTreeSet<String>,
    pass: P,
) where
    P: Fn(String, CancellationToken) -> Fut,
    Fut: Future<Output = Action> + Send + 'static,
{
    let mut dirty: BTreeSet<String> = BTreeSet::new();
    let mut active: BTreeSet<String> = BTreeSet::new();
    let attempts: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let mut tasks: JoinSet<String> = JoinSet::new();
    let add = |dirty: &mut BTreeSet<String>, t: Trigger| match t {
        Trigger::All(_) => dirty.extend(owned()),
        Trigger::Proxy(p, _) => {
            if owned().contains(&p) {
                dirty.insert(p);
            }
        }
    };
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(name) = done {
                    active.remove(&name);
                }
            }
            t = rx.recv() => match t {
                None => break,
                Some(t) => add(&mut dirty, t),
            },
        }
        while let Ok(t) = rx.try_recv() {
            add(&mut dirty, t);
        }
        let ready: Vec<String> = dirty.difference(&active).cloned().collect();
        for name in ready {
            dirty.remove(&name);
            active.insert(name.clone());
            let fut = std::panic::AssertUnwindSafe(pass(name.clone(), cancel.clone()));
            let (attempts, requeue, cancel) = (attempts.clone(), requeue.clone(), cancel.clone());
            tasks.spawn(async move {
                // A panicking pass is a bug; it is retried like a transient error.
                let action = fut.catch_unwind().await.unwrap_or(Action::Requeue);
                let delay = {
                    let mut a = attempts.lock().unwrap_or_else(|e| e.into_inner());
                    match action {
                        Action::AwaitChange => {
                            a.remove(&name);
                            None
                        }
                        Action::Requeue => {
                            let n = a.entry(name.clone()).or_insert(0);
                            let d = backoff(*n);
                            *n += 1;
                            Some(d)
                        }
                    }
                };
                if let Some(delay) = delay {
                    let again = name.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = cancel.cancelled() => {}
                            _ = tokio::time::sleep(delay) => {
                                let _ = requeue.send(Trigger::Proxy(again, "requeue"));
                            }
                        }
                    });
                }
                name
            });
        }
    }
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::time::Instant;

    type Log = Arc<Mutex<Vec<(String, Duration)>>>;

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(16));
        assert_eq!(backoff(5), MAX_BACKOFF);
        assert_eq!(backoff(1000), MAX_BACKOFF);
    }

    /// Passes of "a" ask for a requeue `failures` times, then succeed: the requeues come after
    /// 1, 2, 4 s (paused clock), then stop.
    #[tokio::test(start_paused = true)]
    async fn requeues_back_off_and_stop_after_success() {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let log: Log = Arc::default();
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let (l, c) = (log.clone(), calls.clone());
        let sched = tokio::spawn(run(
            rx,
            tx.clone(),
            cancel.clone(),
            || names(&["a"]),
            move |name, _| {
                let (l, c) = (l.clone(), c.clone());
                async move {
                    l.lock().unwrap().push((name, start.elapsed()));
                    if c.fetch_add(1, Ordering::SeqCst) < 3 {
                        Action::Requeue
                    } else {
                        Action::AwaitChange
                    }
                }
            },
        ));
        tx.send(Trigger::All("startup")).unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
        cancel.cancel();
        sched.await.unwrap();
        let at: Vec<u64> = log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, d)| d.as_secs())
            .collect();
        assert_eq!(at, vec![0, 1, 3, 7], "passes at (s)");
    }

    /// Triggers while a pass runs coalesce into exactly one more pass; other proxies run
    /// meanwhile; unknown proxies are ignored.
    #[tokio::test(start_paused = true)]
    async fn triggers_coalesce_per_proxy() {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let log: Log = Arc::default();
        let start = Instant::now();
        let l = log.clone();
        let sched = tokio::spawn(run(
            rx,
            tx.clone(),
            cancel.clone(),
            || names(&["a", "b"]),
            move |name, _| {
                let l = l.clone();
                async move {
                    l.lock().unwrap().push((name.clone(), start.elapsed()));
                    if name == "a" {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                    }
                    Action::AwaitChange
                }
            },
        ));
        tx.send(Trigger::Proxy("a".into(), "test")).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for _ in 0..5 {
            tx.send(Trigger::Proxy("a".into(), "test")).unwrap();
        }
        tx.send(Trigger::Proxy("b".into(), "test")).unwrap();
        tx.send(Trigger::Proxy("zzz".into(), "test")).unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        cancel.cancel();
        sched.await.unwrap();
        let log = log.lock().unwrap().clone();
        let a: Vec<u64> = log
            .iter()
            .filter(|(n, _)| n == "a")
            .map(|(_, d)| d.as_secs())
            .collect();
        let b: Vec<u64> = log
            .iter()
            .filter(|(n, _)| n == "b")
            .map(|(_, d)| d.as_secs())
            .collect();
        assert_eq!(
            a,
            vec![0, 10],
            "five triggers during a's pass give one more pass"
        );
        assert_eq!(b, vec![1], "b is not delayed by a");
        assert!(log.iter().all(|(n, _)| n != "zzz"));
    }

    /// Cancellation reaches a running pass, and the scheduler waits for it to end.
    #[tokio::test(start_paused = true)]
    async fn cancellation_waits_for_the_running_pass() {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let ended = Arc::new(AtomicU32::new(0));
        let e = ended.clone();
        let sched = tokio::spawn(run(
            rx,
            tx.clone(),
            cancel.clone(),
            || names(&["a"]),
            move |_, c| {
                let e = e.clone();
                async move {
                    c.cancelled().await;
                    // "Finish the current step" before returning.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    e.fetch_add(1, Ordering::SeqCst);
                    Action::Requeue
                }
            },
        ));
        tx.send(Trigger::All("startup")).unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        cancel.cancel();
        sched.await.unwrap();
        assert_eq!(ended.load(Ordering::SeqCst), 1);
    }
}
