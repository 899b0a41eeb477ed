//! Reading an Envoy log for the reason a replica failed: the lines that say *why*, which are
//! usually near the start (the first critical or error line), not in the tail (a stack trace,
//! or the shutdown that followed).
//!
//! For example, a replica past the host's inotify limit says `assert failure: inotify_fd_ >= 0.
//! Details: Consider increasing value of fs.inotify.max_user_watches and/or
//! fs.inotify.max_user_instances via sysctl` and then prints 30 lines of stack trace; a replica
//! that may not bind its port says `cannot bind '0.0.0.0:81': Permission denied`. The samples
//! under `log/samples/` are real logs of real failures (Envoy 1.40.0).

/// The most lines [`why`] returns.
pub const WHY_LINES: usize = 8;

/// Lines of a failed Envoy's log that say why, in order: its critical and error lines (any
/// bracketed `[critical]`/`[error]` level) and command-line parse errors, without stack traces
/// or the crash handler's own lines, without repeats, at most [`WHY_LINES`]. With none of those,
/// its warnings that config was rejected or something could not be done. Empty when the log
/// has neither.
pub fn why(log: &str) -> Vec<String> {
    let lines: Vec<Line> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(Line::parse)
        .filter(|l| !l.is_noise())
        .collect();
    let pick = |wanted: &dyn Fn(&Line) -> bool| {
        let mut picked: Vec<&Line> = Vec::new();
        for l in lines.iter().filter(|l| wanted(l)) {
            if picked.len() < WHY_LINES && !picked.iter().any(|p| p.message == l.message) {
                picked.push(l);
            }
        }
        picked
            .iter()
            .map(|l| l.text.to_string())
            .collect::<Vec<_>>()
    };
    let errors = pick(&|l| {
        matches!(l.level, Some(Level::Critical | Level::Error))
            || l.text.starts_with("PARSE ERROR")
            || l.text.starts_with("error initializing configuration")
    });
    if !errors.is_empty() {
        return errors;
    }
    pick(&|l| l.level == Some(Level::Warning) && l.says_something_failed())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Critical,
    Error,
    Warning,
    Other,
}

/// One log line in Envoy's default format `[time][thread][level][logger] [file:line] message`
/// (in other formats a bracketed level before the message still counts).
struct Line<'a> {
    text: &'a str,
    level: Option<Level>,
    logger: &'a str,
    message: &'a str,
}

impl<'a> Line<'a> {
    fn parse(text: &'a str) -> Line<'a> {
        let text = text.trim_end();
        let mut rest = text.trim_start();
        let mut groups = Vec::new();
        while let Some(inner) = rest.strip_prefix('[') {
            let Some(end) = inner.find(']') else { break };
            groups.push(&inner[..end]);
            rest = inner[end + 1..].trim_start();
        }
        let level_at = groups.iter().position(|g| level(g).is_some());
        Line {
            text,
            level: level_at.and_then(|i| level(groups[i])),
            logger: level_at
                .and_then(|i| groups.get(i + 1))
                .copied()
                .unwrap_or(""),
            message: rest,
        }
    }

    /// Stack traces and the crash handler's own lines: how Envoy died, not why.
    fn is_noise(&self) -> bool {
        let m = self.message;
        self.logger == "backtrace"
            || m.starts_with("stacktrace for envoy bug")
            || (m.starts_with('#') && m[1..].starts_with(|c: char| c.is_ascii_digit()))
            || m.starts_with("Our FatalActions triggered")
            || m.starts_with("caught ENVOY_SIGTERM")
    }

    fn says_something_failed(&self) -> bool {
        let m = self.message.to_ascii_lowercase();
        ["rejected", "cannot", "failed", "error", "denied", "unable"]
            .iter()
            .any(|w| m.contains(w))
    }
}

fn level(group: &str) -> Option<Level> {
    Some(match group {
        "critical" | "fatal" => Level::Critical,
        "error" => Level::Error,
        "warning" | "warn" => Level::Warning,
        "info" | "debug" | "trace" => Level::Other,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inotify_limit_crash_names_the_sysctl_not_the_stack() {
        let why = why(include_str!("log/samples/inotify-limit.log"));
        assert_eq!(why.len(), 1, "{why:#?}");
        assert!(
            why[0].contains("fs.inotify.max_user_instances via sysctl"),
            "{why:#?}"
        );
    }

    #[test]
    fn a_port_it_may_not_bind_is_the_reason() {
        let why = why(include_str!("log/samples/port-denied.log"));
        assert_eq!(why.len(), 1, "{why:#?}");
        assert!(
            why[0].contains("cannot bind '0.0.0.0:81': Permission denied"),
            "{why:#?}"
        );
    }

    #[test]
    fn a_rejected_config_says_what_is_wrong() {
        let why = why(include_str!("log/samples/validate-rejected.log"));
        assert_eq!(why.len(), 1);
        assert!(
            why[0].ends_with("route: unknown cluster 'missing'"),
            "{why:#?}"
        );
    }

    #[test]
    fn any_bracketed_level_counts() {
        assert_eq!(
            why(include_str!("log/samples/exits-at-start.log")),
            vec!["[critical] berth-test: this image exits at start on purpose"]
        );
    }

    #[test]
    fn without_errors_warnings_of_rejected_config_are_the_reason() {
        let why = why(include_str!("log/samples/started.log"));
        assert_eq!(why.len(), 3, "an identical message once: {why:#?}");
        assert!(why.iter().all(|l| l.contains("rejected")));
    }

    #[test]
    fn picks_the_first_critical_and_error_lines_without_the_backtrace() {
        let log = "\
[2026-11-30 10:00:00.001][1][info][main] [source/server/server.cc:430] initializing epoch 0
[2026-11-30 10:00:00.002][1][critical][main] [source/server/server.cc:131] error initializing configuration '/etc/envoy/bootstrap.yaml': inotify_init1: Too many open files (raise fs.inotify.max_user_instances)
[2026-11-30 10:00:00.003][1][info][main] [source/server/server.cc:1000] exiting
[2026-11-30 10:00:00.004][1][critical][backtrace] Caught Segmentation fault, suspect faulting address 0x0
[2026-11-30 10:00:00.005][1][critical][backtrace] Backtrace (use tools/stack_decode.py to get line numbers):
";
        let why = why(log);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].contains("fs.inotify.max_user_instances"), "{why:?}");
    }

    #[test]
    fn parse_errors_count_and_quiet_logs_give_nothing() {
        assert_eq!(
            why("PARSE ERROR: Argument: --concurrency\n             Argument already set!\n"),
            vec!["PARSE ERROR: Argument: --concurrency".to_string()]
        );
        assert!(why("[x][1][info][main] all fine\n").is_empty());
        assert!(why("").is_empty());
    }
}
