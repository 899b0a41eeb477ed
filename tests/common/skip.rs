//! A test that cannot run here: under CI it fails, elsewhere it is counted as skipped.
//!
//! Stable libtest cannot mark a test ignored once it runs, and counts a test that returns early
//! as passed. So [`skip`] panics under CI (`CI` set, as `.ci/run` does): a green CI run means
//! that every test ran. Elsewhere it prints `SKIPPED name: why` at once, and again after the
//! harness's count line ("test result: ok. N passed"), where it says how many of those passed
//! tests did not run; with `BERTH_SKIP_LOG` set (scripts/test.sh sets it) it also appends the
//! line to that file, so the whole suite's skips are listed at its end.
//!
//! Tests that belong to another CI job (the Podman job, the engine restart, the negative
//! controls) are `#[ignore = "…"]`d with the job's name instead, and that job runs them with
//! `--ignored`; tests/harness.rs checks that every ignored test is run so by a CI script.

use std::io::Write;
use std::sync::{Mutex, Once};

/// Whether this runs under CI: `CI` set to anything but "", "0" or "false".
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SUMMARY: Once = Once::new();

/// `test` cannot run here, for `why`. Under CI: panics (the test fails, saying why). Elsewhere:
/// says so on the real stderr (the harness captures `eprintln!` of passing tests) and in the
/// summary after the count line; the caller then returns.
pub fn skip(test: &str, why: &str) {
    if under_ci() {
        panic!(
            "{test} cannot run here: {why}\n(under CI a test that cannot run fails; \
             outside CI, without CI set, it is counted as skipped)"
        );
    }
    let line = format!("SKIPPED {test}: {why}");
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    if let Some(log) = std::env::var_os("BERTH_SKIP_LOG") {
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| writeln!(f, "{line}"));
    }
    SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    SUMMARY.call_once(|| {
        // SAFETY: registers a plain function with no arguments, run by exit(3) after libtest
        // has printed its count line and returned from main.
        unsafe { libc::atexit(print_summary) };
    });
}

extern "C" fn print_summary() {
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{} of the tests counted as passed above did not run (set CI=1 to make that a failure):",
        skipped.len()
    );
    for line in skipped.iter() {
        let _ = writeln!(err, "  {line}");
    }
}
