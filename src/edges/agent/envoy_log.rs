//! Envoy's log, passed through the agent: every line of Envoy's stderr goes on to the agent's
//! own (the task's log, as before), and the last [`KEPT`] are kept, so that a stage this
//! task's Envoy refuses is answered with Envoy's own words (its "rejected: …" line), not only
//! with the counters that say it refused.

use std::collections::VecDeque;
use std::sync::Mutex;

use std::io::Write as _;

use tokio::io::AsyncBufReadExt;

/// Lines kept.
pub const KEPT: usize = 256;

struct Recent {
    lines: VecDeque<String>,
    /// Lines seen since the start.
    total: u64,
}

static RECENT: Mutex<Recent> = Mutex::new(Recent {
    lines: VecDeque::new(),
    total: 0,
});

fn recent() -> std::sync::MutexGuard<'static, Recent> {
    RECENT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the log is now: [`since`] gives the lines after it.
pub fn mark() -> u64 {
    recent().total
}

/// The lines Envoy logged after `mark` (as many as are still kept).
pub fn since(mark: u64) -> Vec<String> {
    let r = recent();
    let new = r.total.saturating_sub(mark) as usize;
    let skip = r.lines.len().saturating_sub(new);
    r.lines.iter().skip(skip).cloned().collect()
}

/// Why Envoy refused something, from the lines it logged after `mark`: its error lines, else
/// its warnings that config was rejected (see [`crate::envoy::log::why`]), joined.
pub fn why_since(mark: u64) -> Option<String> {
    let lines = since(mark).join("\n");
    let why: Vec<String> = crate::envoy::log::why(&lines)
        .iter()
        .map(|l| message(l).to_string())
        .collect();
    (!why.is_empty()).then(|| why.join(" | "))
}

/// A log line without Envoy's `[time][thread][level][logger] [file:line]` prefix.
fn message(line: &str) -> &str {
    let mut rest = line.trim_start();
    while let Some(inner) = rest.strip_prefix('[') {
        match inner.find(']') {
            Some(end) => rest = inner[end + 1..].trim_start(),
            None => break,
        }
    }
    if rest.is_empty() {
        line
    } else {
        rest
    }
}

/// Copies Envoy's stderr to the agent's, line by line, keeping the recent lines; ends with
/// the pipe.
pub async fn tee(from: tokio::process::ChildStderr) {
    let mut reader = tokio::io::BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // A line at a time to the agent's own stderr (unbuffered, as Envoy's was).
        let _ = std::io::stderr().lock().write_all(&line);
        keep(String::from_utf8_lossy(&line).trim_end().to_string());
    }
}

fn keep(line: String) {
    let mut r = recent();
    if r.lines.len() == KEPT {
        r.lines.pop_front();
    }
    r.lines.push_back(line);
    r.total += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_after_a_mark_say_why() {
        let m = mark();
        keep("[2026-12-02 08:00:00.000][1][info][config] [x.cc:1] loaded".into());
        keep("[2026-12-02 08:00:00.000][1][warning][config] [x.cc:2] Filesystem config update rejected: Invalid regex '(': missing )".into());
        assert_eq!(since(m).len(), 2);
        let why = why_since(m).unwrap();
        assert_eq!(
            why,
            "Filesystem config update rejected: Invalid regex '(': missing )"
        );
        assert!(why_since(mark()).is_none());
    }
}
