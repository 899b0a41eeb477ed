//! Fault injection for the crash-safety tests: when the environment variable `BERTH_CRASH_AT`
//! names a step, berth kills itself with SIGKILL on reaching it, exactly as an operator's
//! `kill -9` or a power cut would. Unset (always, outside tests), a crash point costs one
//! read of a cached value.

use std::sync::OnceLock;

/// The environment variable naming the step to die at.
pub const ENV: &str = "BERTH_CRASH_AT";

/// Every step a crash point marks, in the order a rollout passes them.
pub const STEPS: &[&str] = &[
    "after-pull",
    "after-validate",
    "mid-state-write",
    "after-create",
    "after-ready",
    "mid-drain",
    "after-remove",
    "mid-rollback",
];

fn target() -> Option<&'static str> {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    TARGET
        .get_or_init(|| std::env::var(ENV).ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Dies with SIGKILL when `BERTH_CRASH_AT` names this step.
pub fn reached(step: &str) {
    debug_assert!(STEPS.contains(&step), "unknown crash point {step}");
    if target() == Some(step) {
        eprintln!("berth: crash point {step} reached, killing myself (SIGKILL)");
        // SAFETY: kill(2) on our own pid with a valid signal has no memory-safety concerns.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
