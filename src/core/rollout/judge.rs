//! Judging a new replica by its own traffic against its siblings' (the old replicas'): the share
//! of its answers that failed (5xx answers and streams Envoy reset) and its upstream connect
//! failures per request. A replica fails when the Wilson lower bound of its failure share is
//! above the siblings' upper bound plus the allowed excess: a few unlucky requests, or
//! siblings that fail as often (a backend down for everyone), never fail it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// z for a two-sided 95% Wilson score interval.
const Z: f64 = 1.96;

/// What one or more replicas answered over some time, from Envoy's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// `http.<listener>.downstream_rq_completed`, over every listener.
    pub requests: u64,
    /// `http.<listener>.downstream_rq_5xx`.
    pub errors_5xx: u64,
    /// `http.<listener>.downstream_rq_tx_reset`: streams Envoy reset towards the client.
    pub resets: u64,
    /// `cluster.<backend>.upstream_cx_connect_fail`.
    pub connect_failures: u64,
}

impl Sample {
    /// Requests that failed: 5xx answers and reset streams (at most every request).
    pub fn failed(&self) -> u64 {
        (self.errors_5xx + self.resets).min(self.requests)
    }

    pub fn failed_ratio(&self) -> f64 {
        ratio(self.failed(), self.requests)
    }

    /// What `self` counted since `earlier` (counters only grow; a restart reads as 0).
    pub fn since(&self, earlier: &Sample) -> Sample {
        Sample {
            requests: self.requests.saturating_sub(earlier.requests),
            errors_5xx: self.errors_5xx.saturating_sub(earlier.errors_5xx),
            resets: self.resets.saturating_sub(earlier.resets),
            connect_failures: self
                .connect_failures
                .saturating_sub(earlier.connect_failures),
        }
    }

    pub fn add(&mut self, other: &Sample) {
        self.requests += other.requests;
        self.errors_5xx += other.errors_5xx;
        self.resets += other.resets;
        self.connect_failures += other.connect_failures;
    }
}

/// "412 requests, 398 failed (96.6%: 398 5xx, 0 resets), 0 upstream connect failures".
impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests, {} failed ({:.1}%: {} 5xx, {} resets), {} upstream connect failures",
            self.requests,
            self.failed(),
            100.0 * self.failed_ratio(),
            self.errors_5xx,
            self.resets,
            self.connect_failures
        )
    }
}

/// When a replica's numbers decide.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    /// Fewer requests than this decide nothing.
    pub min_requests: u64,
    /// How much larger than the siblings' its failure share (and connect failures per
    /// request) may be, as a fraction: 0.5 means "fails when it answers mostly errors where
    /// the siblings do not".
    pub max_error_ratio: f64,
}

impl Thresholds {
    /// The gate's default without any canary settings: only a replica answering mostly errors
    /// where its siblings do not fails.
    pub const GATE: Thresholds = Thresholds {
        min_requests: 20,
        max_error_ratio: 0.5,
    };
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds::GATE
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Within the thresholds, on enough requests.
    Pass,
    /// Fewer requests than `min_requests`: nothing decided.
    TooFew { requests: u64, needed: u64 },
    /// Worse than its siblings beyond the thresholds: why, with the numbers.
    Fail(String),
}

/// `candidate` (the new replica's numbers) against `baseline` (its siblings' over the same
/// time).
pub fn judge(candidate: &Sample, baseline: &Sample, t: &Thresholds) -> Verdict {
    if candidate.requests < t.min_requests {
        return Verdict::TooFew {
            requests: candidate.requests,
            needed: t.min_requests,
        };
    }
    let mut why = Vec::new();
    let checks = [
        ("failed requests", candidate.failed(), baseline.failed()),
        (
            "upstream connect failures per request",
            candidate.connect_failures.min(candidate.requests),
            baseline.connect_failures.min(baseline.requests),
        ),
    ];
    for (what, bad, base_bad) in checks {
        let low = wilson(bad, candidate.requests).0;
        let high = if baseline.requests == 0 {
            0.0
        } else {
            wilson(base_bad, baseline.requests).1
        };
        if low > high + t.max_error_ratio {
            why.push(format!(
                "{what}: {:.1}% here (at least {:.1}% at 95% confidence) against {:.1}% on its \
                 siblings (at most {:.1}%), more than the {:.0} points allowed",
                100.0 * ratio(bad, candidate.requests),
                100.0 * low,
                100.0 * ratio(base_bad, baseline.requests),
                100.0 * high,
                100.0 * t.max_error_ratio
            ));
        }
    }
    if why.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(format!(
            "{}; it: {candidate}; its siblings over the same time: {baseline}",
            why.join("; ")
        ))
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The Wilson score interval (low, high) of `k` successes in `n` trials at [`Z`].
pub fn wilson(k: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = Z * Z;
    let centre = p + z2 / (2.0 * n);
    let spread = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    let denominator = 1.0 + z2 / n;
    (
        ((centre - spread) / denominator).max(0.0),
        ((centre + spread) / denominator).min(1.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(requests: u64, errors_5xx: u64) -> Sample {
        Sample {
            requests,
            errors_5xx,
            ..Sample::default()
        }
    }

    #[test]
    fn wilson_bounds_are_known_values() {
        let (low, high) = wilson(0, 10);
        assert!(low == 0.0 && (high - 0.2775).abs() < 1e-3, "{high}");
        let (low, high) = wilson(50, 100);
        assert!((low - 0.4038).abs() < 1e-3 && (high - 0.5962).abs() < 1e-3);
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    #[test]
    fn a_replica_answering_mostly_errors_fails_with_its_numbers() {
        let v = judge(&s(400, 400), &s(4000, 0), &Thresholds::GATE);
        let Verdict::Fail(why) = v else {
            panic!("{v:?}")
        };
        assert!(why.contains("failed requests: 100.0% here"), "{why}");
        assert!(why.contains("against 0.0% on its siblings"), "{why}");
        assert!(why.contains("it: 400 requests, 400 failed"), "{why}");
    }

    #[test]
    fn too_few_requests_decide_nothing() {
        assert_eq!(
            judge(&s(5, 5), &s(1000, 0), &Thresholds::GATE),
            Verdict::TooFew {
                requests: 5,
                needed: 20
            }
        );
    }

    #[test]
    fn siblings_failing_as_often_or_a_few_errors_pass() {
        assert_eq!(
            judge(&s(400, 400), &s(4000, 3900), &Thresholds::GATE),
            Verdict::Pass
        );
        assert_eq!(
            judge(&s(400, 20), &s(4000, 0), &Thresholds::GATE),
            Verdict::Pass
        );
        let strict = Thresholds {
            min_requests: 100,
            max_error_ratio: 0.01,
        };
        assert!(matches!(
            judge(&s(400, 40), &s(4000, 0), &strict),
            Verdict::Fail(_)
        ));
        assert_eq!(judge(&s(400, 0), &s(0, 0), &strict), Verdict::Pass);
    }

    #[test]
    fn connect_failures_and_resets_count() {
        let c = Sample {
            requests: 100,
            connect_failures: 100,
            ..Sample::default()
        };
        let v = judge(&c, &s(1000, 0), &Thresholds::GATE);
        assert!(
            matches!(&v, Verdict::Fail(w) if w.contains("upstream connect failures")),
            "{v:?}"
        );
        let r = Sample {
            requests: 100,
            resets: 90,
            ..Sample::default()
        };
        assert!(matches!(
            judge(&r, &s(1000, 0), &Thresholds::GATE),
            Verdict::Fail(_)
        ));
        assert_eq!(s(10, 3).since(&s(4, 1)), s(6, 2));
    }
}
