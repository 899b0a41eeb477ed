//! Whether a replica is alive (DESIGN decision 14): the pure judge. Replicas share their port
//! through SO_REUSEPORT, so the kernel keeps handing new connections to a replica that holds
//! its socket and answers nothing; only closing that socket takes it out. Whoever watches the
//! replicas (serve, `up` waiting on a rollout) feeds one [`Tracker`] per replica a [`Probe`]
//! each look (every [`CADENCE`]) and kills the replica the moment the verdict is
//! [`Verdict::Dead`].
//!
//! A replica is dead when its admin `/ready` has not answered for [`Thresholds::silence`]
//! (2 s) **and** something says it is not merely slow: the engine reports it paused, its
//! Envoy was stopped by a signal (state `T` in `/proc/PID/stat`), or it used less than
//! [`Thresholds::idle_cpu_per_second`] (1 ms) of CPU per second over the last 2 s. Without a
//! CPU reading, only [`Thresholds::silence_without_cpu`] (10 s) of silence will do.
//!
//! Why those numbers, from measurements on this kind of host (2 cores, Envoy 1.40):
//! - an idle Envoy uses about 2.5 ms of CPU per second (its timers, stats flush and the
//!   dispatchers' wake-ups), so a process that uses less than 1 ms/s is not running at all:
//!   frozen, stopped, or stuck in the kernel. A busy one uses far more;
//! - an Envoy starved to 0.01 CPU by a cgroup quota (`docker update --cpus 0.01`) still
//!   answered `/ready` in 0.68 s: a replica that is merely starved answers within the 2 s of
//!   silence, and when it does not, it uses its whole quota (10 ms/s), ten times the bar;
//! - 2 s is two looks at a 1 s cadence: one lost or late answer never kills, and a hung
//!   replica is out of the port within about 3 s of its last answer (the goal is 5 s).
//!
//! A replica that has never answered since it was first seen is starting (the rollout gate
//! judges those): only the engine's pause or a stopping signal condemns it.

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often a watcher looks at every replica.
pub const CADENCE: Duration = Duration::from_secs(1);

/// How long one look waits for `/ready`: an answer later than this counts as none.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The judge's thresholds (see the module's documentation for why these defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Silence that, with a sign of a dead process, makes a replica dead.
    pub silence: Duration,
    /// Silence that alone makes a replica dead when no CPU reading is available.
    pub silence_without_cpu: Duration,
    /// Below this CPU use per second over the silence, a replica is not running.
    pub idle_cpu_per_second: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            silence: Duration::from_secs(2),
            silence_without_cpu: Duration::from_secs(10),
            idle_cpu_per_second: Duration::from_millis(1),
        }
    }
}

/// One look at a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probe {
    /// Its admin `/ready` answered (any status: an answer means Envoy's main thread runs).
    pub answered: bool,
    /// The engine reports the container paused (frozen).
    pub paused: bool,
    /// Its Envoy process is stopped by a signal (SIGSTOP, SIGTSTP, …).
    pub stopped_by_signal: bool,
    /// The CPU time it has used so far (cumulative), when it can be read.
    pub cpu: Option<Duration>,
}

/// Why a replica was judged dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum DeadReason {
    /// The engine froze it (`docker pause`).
    Paused,
    /// Its Envoy was stopped by a signal.
    StoppedBySignal,
    /// Its admin API has not answered for `silent_ms` while it used no CPU (or none could be
    /// read and the silence passed the longer bar).
    NotAnswering { silent_ms: u64 },
}

impl DeadReason {
    /// The metric label (`berth_replica_repairs_total{reason}`).
    pub fn label(&self) -> &'static str {
        match self {
            DeadReason::Paused => "paused",
            DeadReason::StoppedBySignal => "stopped",
            DeadReason::NotAnswering { .. } => "not_answering",
        }
    }
}

impl fmt::Display for DeadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeadReason::Paused => write!(f, "frozen by the engine"),
            DeadReason::StoppedBySignal => write!(f, "its Envoy is stopped by a signal"),
            DeadReason::NotAnswering { silent_ms } => {
                write!(f, "not answering for {:.1} s", *silent_ms as f64 / 1000.0)
            }
        }
    }
}

/// What the judge says of a replica after a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It answered.
    Live,
    /// It has not answered since it was first seen, and nothing says it is dead.
    Starting,
    /// It has not answered for this long, but is not dead (yet, or busy: its CPU moves).
    Quiet { silent: Duration, busy: bool },
    /// Kill it.
    Dead(DeadReason),
}

/// One replica's history, as far as the judge needs it.
#[derive(Debug, Clone)]
pub struct Tracker {
    thresholds: Thresholds,
    /// When it last answered (or, until it has, when it was first seen).
    since: Option<Instant>,
    answered_ever: bool,
    /// (when, cumulative CPU) of the looks since `since`, oldest first; the last one older
    /// than the silence window is kept as the window's start.
    samples: Vec<(Instant, Duration)>,
}

impl Tracker {
    pub fn new(thresholds: Thresholds) -> Tracker {
        Tracker {
            thresholds,
            since: None,
            answered_ever: false,
            samples: Vec::new(),
        }
    }

    /// When it last answered, if it ever did.
    pub fn last_answer(&self) -> Option<Instant> {
        self.since.filter(|_| self.answered_ever)
    }

    /// Takes one look into account and judges.
    pub fn observe(&mut self, now: Instant, probe: Probe) -> Verdict {
        let t = self.thresholds;
        if let Some(cpu) = probe.cpu {
            self.samples.push((now, cpu));
        } else {
            self.samples.clear();
        }
        if probe.answered && !probe.paused && !probe.stopped_by_signal {
            self.since = Some(now);
            self.answered_ever = true;
            self.samples.retain(|(at, _)| *at == now);
            return Verdict::Live;
        }
        let since = *self.since.get_or_insert(now);
        let silent = now.saturating_duration_since(since);
        // Keep one sample at least `silence` old: the start of the CPU window.
        while self.samples.len() > 2
            && now.saturating_duration_since(self.samples[1].0) >= t.silence
        {
            self.samples.remove(0);
        }
        if silent < t.silence {
            return if self.answered_ever {
                Verdict::Quiet {
                    silent,
                    busy: false,
                }
            } else {
                Verdict::Starting
            };
        }
        if probe.paused {
            return Verdict::Dead(DeadReason::Paused);
        }
        if probe.stopped_by_signal {
            return Verdict::Dead(DeadReason::StoppedBySignal);
        }
        if !self.answered_ever {
            return Verdict::Starting;
        }
        let not_answering = DeadReason::NotAnswering {
            silent_ms: silent.as_millis() as u64,
        };
        match self.cpu_per_second(now) {
            Some(rate) if rate < t.idle_cpu_per_second => Verdict::Dead(not_answering),
            Some(_) => Verdict::Quiet { silent, busy: true },
            None if silent >= t.silence_without_cpu => Verdict::Dead(not_answering),
            None => Verdict::Quiet {
                silent,
                busy: false,
            },
        }
    }

    /// CPU used per second of wall time over the last `silence` (from the newest sample at
    /// least that old to the newest one).
    fn cpu_per_second(&self, now: Instant) -> Option<Duration> {
        let (end_at, end) = *self.samples.last()?;
        let (start_at, start) = *self
            .samples
            .iter()
            .rev()
            .find(|(at, _)| now.saturating_duration_since(*at) >= self.thresholds.silence)?;
        let wall = end_at.saturating_duration_since(start_at).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        Some(Duration::from_secs_f64(
            end.saturating_sub(start).as_secs_f64() / wall,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Looks once a second from t0 on; `probe(i)` is look i's probe. Returns the verdicts.
    fn run(looks: usize, probe: impl Fn(usize) -> Probe) -> Vec<Verdict> {
        let t0 = Instant::now();
        let mut tracker = Tracker::new(Thresholds::default());
        (0..looks)
            .map(|i| tracker.observe(t0 + Duration::from_secs(i as u64), probe(i)))
            .collect()
    }

    fn answering(cpu_ms: u64) -> Probe {
        Probe {
            answered: true,
            cpu: Some(ms(cpu_ms)),
            ..Probe::default()
        }
    }

    #[test]
    fn an_answering_replica_is_live() {
        let v = run(5, |i| answering(3 * i as u64));
        assert!(v.iter().all(|v| *v == Verdict::Live), "{v:?}");
    }

    #[test]
    fn a_paused_replica_is_dead_after_two_seconds_of_silence() {
        // Answers at 0 and 1 s, then the engine freezes it.
        let v = run(5, |i| {
            if i < 2 {
                answering(3 * i as u64)
            } else {
                Probe {
                    paused: true,
                    cpu: Some(ms(3)),
                    ..Probe::default()
                }
            }
        });
        assert_eq!(
            v[2],
            Verdict::Quiet {
                silent: ms(1000),
                busy: false
            }
        );
        assert_eq!(v[3], Verdict::Dead(DeadReason::Paused));
    }

    #[test]
    fn a_stopped_envoy_is_dead_after_two_seconds_of_silence() {
        let v = run(4, |i| {
            if i == 0 {
                answering(0)
            } else {
                Probe {
                    stopped_by_signal: true,
                    cpu: Some(ms(1)),
                    ..Probe::default()
                }
            }
        });
        assert!(matches!(v[1], Verdict::Quiet { .. }), "{v:?}");
        assert_eq!(v[2], Verdict::Dead(DeadReason::StoppedBySignal));
    }

    #[test]
    fn a_silent_replica_that_uses_no_cpu_is_dead() {
        // A wedged process: no answer, CPU flat (below 1 ms/s).
        let v = run(5, |i| {
            if i == 0 {
                answering(10)
            } else {
                Probe {
                    cpu: Some(ms(10 + i as u64 / 2)),
                    ..Probe::default()
                }
            }
        });
        assert_eq!(
            v[2],
            Verdict::Dead(DeadReason::NotAnswering { silent_ms: 2000 })
        );
    }

    #[test]
    fn a_busy_replica_is_never_dead() {
        // Silent for a minute, but burning its 0.01 CPU quota (10 ms/s).
        let v = run(60, |i| {
            if i == 0 {
                answering(0)
            } else {
                Probe {
                    cpu: Some(ms(10 * i as u64)),
                    ..Probe::default()
                }
            }
        });
        assert!(v.iter().all(|v| !matches!(v, Verdict::Dead(_))), "{v:?}");
        assert_eq!(
            v[59],
            Verdict::Quiet {
                silent: Duration::from_secs(59),
                busy: true
            }
        );
    }

    #[test]
    fn a_replica_that_stops_after_a_busy_spell_is_judged_on_the_last_two_seconds() {
        // Busy (100 ms/s) until 3 s, answering until 1 s, then nothing at all.
        let v = run(8, |i| {
            let cpu = ms(100 * (i.min(3) as u64));
            if i <= 1 {
                Probe {
                    answered: true,
                    cpu: Some(cpu),
                    ..Probe::default()
                }
            } else {
                Probe {
                    cpu: Some(cpu),
                    ..Probe::default()
                }
            }
        });
        assert!(matches!(v[3], Verdict::Quiet { busy: true, .. }), "{v:?}");
        // From 3 s to 5 s the CPU did not move: dead at 5 s, 4 s after its last answer.
        assert_eq!(
            v[5],
            Verdict::Dead(DeadReason::NotAnswering { silent_ms: 4000 })
        );
    }

    #[test]
    fn without_a_cpu_reading_only_ten_seconds_of_silence_kill() {
        let v = run(12, |i| Probe {
            answered: i == 0,
            ..Probe::default()
        });
        assert!(
            v[1..10].iter().all(|v| matches!(v, Verdict::Quiet { .. })),
            "{v:?}"
        );
        assert_eq!(
            v[10],
            Verdict::Dead(DeadReason::NotAnswering { silent_ms: 10_000 })
        );
    }

    #[test]
    fn a_replica_that_never_answered_is_starting_unless_frozen_or_stopped() {
        let v = run(15, |_| Probe {
            cpu: Some(ms(0)),
            ..Probe::default()
        });
        assert!(v.iter().all(|v| *v == Verdict::Starting), "{v:?}");
        // Found paused (e.g. by a serve that just started): the engine's word is enough.
        let v = run(3, |_| Probe {
            paused: true,
            ..Probe::default()
        });
        assert_eq!(v[2], Verdict::Dead(DeadReason::Paused));
    }

    #[test]
    fn one_late_answer_does_not_kill() {
        // Misses one look (1 s of silence) with its CPU flat, then answers again.
        let v = run(4, |i| Probe {
            answered: i != 1,
            cpu: Some(ms(5)),
            ..Probe::default()
        });
        assert!(!v.iter().any(|v| matches!(v, Verdict::Dead(_))), "{v:?}");
    }

    #[test]
    fn reasons_read_well() {
        assert_eq!(DeadReason::Paused.to_string(), "frozen by the engine");
        assert_eq!(
            DeadReason::NotAnswering { silent_ms: 2400 }.to_string(),
            "not answering for 2.4 s"
        );
        assert_eq!(DeadReason::StoppedBySignal.label(), "stopped");
    }
}
