//! `max_surge`: how many new replicas a rollout starts (and gates) together before it retires as
//! many old ones, as Kubernetes' Deployment `maxSurge`; `maxUnavailable` is always 0 here, so
//! a proxy never serves on fewer than its replica count.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A count of replicas, or a percentage of the proxy's replica count (rounded up, at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxSurge {
    Count(u32),
    Percent(u32),
}

/// The default: see docs/configuration.md (`max_surge`) for the measurements behind it.
pub const DEFAULT: MaxSurge = MaxSurge::Percent(50);

impl Default for MaxSurge {
    fn default() -> Self {
        DEFAULT
    }
}

impl MaxSurge {
    /// Parses `"25%"`; a count comes from TOML as an integer ([`MaxSurge::Count`]).
    pub fn parse_percent(s: &str) -> Result<MaxSurge, String> {
        let digits = s.strip_suffix('%').ok_or_else(|| {
            format!("must be a count (e.g. 2) or a percentage (e.g. \"50%\"), got {s:?}")
        })?;
        match digits.trim().parse::<u32>() {
            Ok(p) if (1..=100).contains(&p) => Ok(MaxSurge::Percent(p)),
            _ => Err(format!("must be a percentage from 1% to 100%, got {s:?}")),
        }
    }

    /// How many new replicas may run at once beside the old ones of a proxy of `replicas`:
    /// at least 1, at most `replicas` (a wave never holds more than the whole proxy).
    pub fn resolve(&self, replicas: u32) -> u32 {
        let n = match *self {
            MaxSurge::Count(n) => n,
            MaxSurge::Percent(p) => (u64::from(replicas) * u64::from(p)).div_ceil(100) as u32,
        };
        n.clamp(1, replicas.max(1))
    }
}

impl fmt::Display for MaxSurge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxSurge::Count(n) => write!(f, "{n}"),
            MaxSurge::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// The sizes of the waves that replace `n` replicas, `surge` at a time.
pub fn waves(n: usize, surge: u32) -> Vec<usize> {
    let surge = surge.max(1) as usize;
    (0..n)
        .step_by(surge)
        .map(|start| surge.min(n - start))
        .collect()
}

/// Why the host lowered a surge, one limit each: what it allows and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub allows: u32,
    pub why: String,
}

/// The surge the host can hold: the smallest of `limits` (at least 1, never more than
/// `wanted`), and the message saying what lowered it when any did.
pub fn fit(wanted: u32, limits: &[Limit]) -> (u32, Option<String>) {
    let lowest = limits.iter().min_by_key(|l| l.allows);
    match lowest {
        Some(l) if l.allows < wanted => {
            let to = l.allows.max(1);
            let why: Vec<&str> = limits
                .iter()
                .filter(|l| l.allows < wanted)
                .map(|l| l.why.as_str())
                .collect();
            (
                to,
                Some(format!(
                    "max_surge {wanted} lowered to {to}: {}",
                    why.join("; ")
                )),
            )
        }
        _ => (wanted, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_percentages_resolve_within_the_replica_count() {
        assert_eq!(MaxSurge::Count(2).resolve(4), 2);
        assert_eq!(MaxSurge::Count(9).resolve(4), 4);
        assert_eq!(MaxSurge::Count(0).resolve(4), 1);
        assert_eq!(MaxSurge::Percent(50).resolve(3), 2);
        assert_eq!(MaxSurge::Percent(25).resolve(32), 8);
        assert_eq!(MaxSurge::Percent(1).resolve(3), 1);
        assert_eq!(MaxSurge::Percent(100).resolve(3), 3);
        assert_eq!(MaxSurge::Percent(100).resolve(0), 1);
    }

    #[test]
    fn percentages_parse_and_say_what_is_allowed() {
        assert_eq!(MaxSurge::parse_percent("50%"), Ok(MaxSurge::Percent(50)));
        assert!(MaxSurge::parse_percent("0%")
            .unwrap_err()
            .contains("1% to 100%"));
        assert!(MaxSurge::parse_percent("150%").is_err());
        assert!(MaxSurge::parse_percent("two")
            .unwrap_err()
            .contains("a count"));
        assert_eq!(MaxSurge::Percent(25).to_string(), "25%");
    }

    #[test]
    fn waves_cover_every_replica_once() {
        assert_eq!(waves(4, 2), [2, 2]);
        assert_eq!(waves(3, 2), [2, 1]);
        assert_eq!(waves(3, 1), [1, 1, 1]);
        assert_eq!(waves(3, 0), [1, 1, 1]);
        assert!(waves(0, 2).is_empty());
    }

    #[test]
    fn the_lowest_limit_wins_and_is_named() {
        let limits = [
            Limit {
                allows: 3,
                why: "memory: 3 more fit".into(),
            },
            Limit {
                allows: 1,
                why: "inotify: 1 more fits".into(),
            },
        ];
        let (to, msg) = fit(4, &limits);
        assert_eq!(to, 1);
        let msg = msg.unwrap();
        assert!(msg.starts_with("max_surge 4 lowered to 1: "), "{msg}");
        assert!(msg.contains("memory") && msg.contains("inotify"), "{msg}");
        assert_eq!(fit(2, &limits[..1]), (2, None));
        assert_eq!(
            fit(
                2,
                &[Limit {
                    allows: 0,
                    why: "x".into()
                }]
            )
            .0,
            1
        );
    }
}
