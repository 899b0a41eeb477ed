//! `berth logs`, the pure part: which replicas a `PROXY[/SLOT]` selects, what `--since` and
//! `--tail` mean, how one replica's byte chunks become lines, and how lines of several replicas
//! are merged and prefixed like `docker compose logs`. The engine side is in `cli::logs`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::core::replica::ObservedContainer;

/// `PROXY` or `PROXY/SLOT`: which replicas to show (none: every proxy's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub proxy: Option<String>,
    pub slot: Option<u32>,
}

impl Selector {
    pub fn parse(s: Option<&str>) -> Result<Selector, String> {
        let Some(s) = s else {
            return Ok(Selector::default());
        };
        let (proxy, slot) = match s.split_once('/') {
            None => (s, None),
            Some((proxy, slot)) => {
                let slot = slot.parse::<u32>().map_err(|_| {
                    format!("{s:?}: expected PROXY or PROXY/SLOT with SLOT a replica number, like edge/1")
                })?;
                (proxy, Some(slot))
            }
        };
        if proxy.is_empty() {
            return Err(format!("{s:?}: the proxy name is empty"));
        }
        Ok(Selector {
            proxy: Some(proxy.to_string()),
            slot,
        })
    }

    pub fn matches(&self, c: &ObservedContainer) -> bool {
        self.proxy.as_deref().is_none_or(|p| c.proxy() == Some(p))
            && self.slot.is_none_or(|s| c.slot() == Some(s))
    }
}

/// `--since`: a duration back from now ("10m", "1h30m") or a point in time (RFC 3339, like
/// "2025-06-01T12:00:00Z", or Unix seconds). Returns Unix seconds, what the engine takes.
pub fn parse_since(s: &str, now: SystemTime) -> Result<i64, String> {
    let s = s.trim();
    let at = if let Ok(secs) = s.parse::<u64>() {
        UNIX_EPOCH + Duration::from_secs(secs)
    } else if let Ok(d) = humantime::parse_duration(s) {
        now.checked_sub(d).unwrap_or(UNIX_EPOCH)
    } else if let Ok(t) = humantime::parse_rfc3339_weak(s.trim_end_matches('Z')) {
        t
    } else {
        return Err(format!(
            "--since {s:?}: expected a duration back from now (10m, 1h30m), a time \
             (2025-06-01T12:00:00Z) or Unix seconds"
        ));
    };
    Ok(at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0))
}

/// `--tail`: "all" or a number of lines per replica.
pub fn parse_tail(s: &str) -> Result<String, String> {
    match s.trim() {
        "all" => Ok("all".into()),
        n if n.parse::<u64>().is_ok() => Ok(n.into()),
        other => Err(format!(
            "--tail {other:?}: expected a number of lines or \"all\""
        )),
    }
}

/// One log line of one replica, with the engine's timestamp when it gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub replica: String,
    pub at: Option<SystemTime>,
    /// The timestamp as the engine wrote it (shown with `--timestamps`).
    pub stamp: Option<String>,
    pub text: String,
}

/// Splits a replica's output into lines. The engine sends chunks that usually are one line
/// each, but a long line can come in pieces: text after the last newline waits for the next
/// chunk (or [`LineSplitter::finish`]).
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            out.push(text_of(&line[..line.len() - 1]));
        }
        out
    }

    /// What is left without a final newline.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let rest = std::mem::take(&mut self.pending);
        Some(text_of(&rest))
    }
}

fn text_of(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    s.strip_suffix('\r').unwrap_or(&s).to_string()
}

/// Splits the timestamp the engine puts before each line (`timestamps=true`: RFC 3339 with
/// nanoseconds, then one space) from the text.
pub fn split_stamp(line: &str) -> (Option<String>, Option<SystemTime>, &str) {
    if let Some((stamp, text)) = line.split_once(' ') {
        if let Ok(at) = humantime::parse_rfc3339(stamp) {
            return (Some(stamp.to_string()), Some(at), text);
        }
    }
    (None, None, line)
}

/// Merges the lines of several replicas by time, keeping each replica's own order: a line
/// without a timestamp counts as logged with the line before it; ties go to the replica given
/// first.
pub fn merge(per_replica: Vec<Vec<Line>>) -> Vec<Line> {
    let mut queues: Vec<std::collections::VecDeque<Line>> =
        per_replica.into_iter().map(Into::into).collect();
    let mut clocks = vec![UNIX_EPOCH; queues.len()];
    let mut out = Vec::with_capacity(queues.iter().map(|q| q.len()).sum());
    loop {
        let next = queues
            .iter()
            .enumerate()
            .filter_map(|(r, q)| q.front().map(|l| (l.at.unwrap_or(clocks[r]), r)))
            .min();
        let Some((at, r)) = next else { break };
        clocks[r] = at;
        out.extend(queues[r].pop_front());
    }
    out
}

/// How lines are printed: `replica  | text`, the prefix padded to the longest replica name
/// and coloured per replica on a terminal, as `docker compose logs` does.
#[derive(Debug, Clone)]
pub struct Printer {
    prefix: bool,
    timestamps: bool,
    color: bool,
    width: usize,
    colors: BTreeMap<String, &'static str>,
}

const PALETTE: [&str; 10] = ["36", "33", "32", "35", "34", "96", "93", "92", "95", "94"];

impl Printer {
    pub fn new(prefix: bool, timestamps: bool, color: bool) -> Printer {
        Printer {
            prefix,
            timestamps,
            color,
            width: 0,
            colors: BTreeMap::new(),
        }
    }

    /// Makes room for a replica's name (its colour is fixed from now on).
    pub fn add_replica(&mut self, name: &str) {
        self.width = self.width.max(name.chars().count());
        let next = PALETTE[self.colors.len() % PALETTE.len()];
        self.colors.entry(name.to_string()).or_insert(next);
    }

    pub fn format(&self, line: &Line) -> String {
        let mut out = String::new();
        if self.prefix {
            let pad = self.width.saturating_sub(line.replica.chars().count());
            let name = format!("{}{}  |", line.replica, " ".repeat(pad));
            match self.colors.get(&line.replica).filter(|_| self.color) {
                Some(code) => out.push_str(&format!("\x1b[{code}m{name}\x1b[0m ")),
                None => {
                    out.push_str(&name);
                    out.push(' ');
                }
            }
        }
        if self.timestamps {
            if let Some(stamp) = &line.stamp {
                out.push_str(stamp);
                out.push(' ');
            }
        }
        out.push_str(&line.text);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, proxy: &str, slot: u32) -> ObservedContainer {
        use crate::core::replica::{LABEL_MANAGED_BY, LABEL_PROXY, LABEL_SLOT};
        ObservedContainer {
            id: name.into(),
            name: name.into(),
            labels: BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), "berth".to_string()),
                (LABEL_PROXY.to_string(), proxy.to_string()),
                (LABEL_SLOT.to_string(), slot.to_string()),
            ]),
            state: crate::core::replica::RunState::Running,
            live: crate::core::replica::LiveSettings {
                nano_cpus: None,
                memory: None,
                restart_policy: "unless-stopped".into(),
            },
            info: Default::default(),
        }
    }

    #[test]
    fn selectors() {
        let all = Selector::parse(None).unwrap();
        let edge = Selector::parse(Some("edge")).unwrap();
        let edge2 = Selector::parse(Some("edge/2")).unwrap();
        let (a1, a2, b1) = (
            container("a1", "edge", 1),
            container("a2", "edge", 2),
            container("b1", "api", 1),
        );
        assert!(all.matches(&a1) && all.matches(&b1));
        assert!(edge.matches(&a1) && edge.matches(&a2) && !edge.matches(&b1));
        assert!(!edge2.matches(&a1) && edge2.matches(&a2) && !edge2.matches(&b1));
        assert!(Selector::parse(Some("edge/x"))
            .unwrap_err()
            .contains("PROXY/SLOT"));
        assert!(Selector::parse(Some("/1")).is_err());
    }

    #[test]
    fn since_takes_durations_times_and_seconds() {
        let now = UNIX_EPOCH + Duration::from_secs(1_750_000_000);
        assert_eq!(parse_since("10m", now), Ok(1_750_000_000 - 600));
        assert_eq!(parse_since("1h30m", now), Ok(1_750_000_000 - 5400));
        assert_eq!(parse_since("1700000000", now), Ok(1_700_000_000));
        assert_eq!(parse_since("2025-06-01T00:00:00Z", now), Ok(1_748_736_000));
        assert_eq!(parse_since("2025-06-01T00:00:00", now), Ok(1_748_736_000));
        assert!(parse_since("yesterday", now)
            .unwrap_err()
            .contains("--since"));
    }

    #[test]
    fn tail_is_all_or_a_count() {
        assert_eq!(parse_tail("all").unwrap(), "all");
        assert_eq!(parse_tail("20").unwrap(), "20");
        assert!(parse_tail("-1").is_err());
        assert!(parse_tail("some").unwrap_err().contains("--tail"));
    }

    #[test]
    fn lines_split_across_chunks() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"one\ntw"), vec!["one"]);
        assert_eq!(s.push(b"o\r\nthree\n"), vec!["two", "three"]);
        assert_eq!(s.push(b"four"), Vec::<String>::new());
        assert_eq!(s.finish().as_deref(), Some("four"));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn stamps_are_split_from_text() {
        let (stamp, at, text) = split_stamp("2025-06-01T00:00:00.123456789Z [info] ready x");
        assert_eq!(stamp.as_deref(), Some("2025-06-01T00:00:00.123456789Z"));
        assert_eq!(
            at.unwrap().duration_since(UNIX_EPOCH).unwrap(),
            Duration::new(1_748_736_000, 123_456_789)
        );
        assert_eq!(text, "[info] ready x");
        assert_eq!(split_stamp("no stamp here"), (None, None, "no stamp here"));
    }

    fn line(replica: &str, secs: Option<u64>, text: &str) -> Line {
        Line {
            replica: replica.into(),
            at: secs.map(|s| UNIX_EPOCH + Duration::from_secs(s)),
            stamp: secs.map(|s| s.to_string()),
            text: text.into(),
        }
    }

    #[test]
    fn merge_interleaves_by_time_and_keeps_each_replicas_order() {
        let a = vec![
            line("a", Some(1), "a1"),
            line("a", Some(3), "a3"),
            line("a", None, "a?"),
        ];
        let b = vec![line("b", Some(2), "b2"), line("b", Some(3), "b3")];
        let texts: Vec<String> = merge(vec![a, b]).into_iter().map(|l| l.text).collect();
        assert_eq!(texts, ["a1", "b2", "a3", "a?", "b3"]);
    }

    #[test]
    fn printer_pads_and_colours_prefixes() {
        let mut p = Printer::new(true, false, false);
        p.add_replica("berth-edge-1-aaaa");
        p.add_replica("berth-e-2-b");
        assert_eq!(
            p.format(&line("berth-e-2-b", Some(5), "hi")),
            "berth-e-2-b        | hi"
        );
        let mut c = Printer::new(true, true, true);
        c.add_replica("r");
        assert_eq!(
            c.format(&line("r", Some(5), "hi")),
            "\x1b[36mr  |\x1b[0m 5 hi"
        );
        let bare = Printer::new(false, false, true);
        assert_eq!(bare.format(&line("r", Some(5), "hi")), "hi");
    }
}
