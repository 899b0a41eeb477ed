#![allow(dead_code)]
//! Host settings a test changes (kernel sysctls, berth's test drop-in), put back when the guard
//! is dropped, also when the test panics.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::locks::FileLock;

/// The sysctls berth manages, as `/proc/sys` paths.
pub const MIGRATE_REQ: &str = "net/ipv4/tcp_migrate_req";
pub const PORT_START: &str = "net/ipv4/ip_unprivileged_port_start";
pub const INOTIFY_INSTANCES: &str = "fs/inotify/max_user_instances";
pub const INOTIFY_WATCHES: &str = "fs/inotify/max_user_watches";
const ALL: [&str; 4] = [MIGRATE_REQ, PORT_START, INOTIFY_INSTANCES, INOTIFY_WATCHES];

fn path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key)
}

/// The current value of a sysctl (`net/ipv4/...` form), if this kernel has it.
pub fn get(key: &str) -> Option<u64> {
    std::fs::read_to_string(path(key)).ok()?.trim().parse().ok()
}

/// Sets a sysctl. Turning `tcp_migrate_req` off needs [`SysctlLock::exclusive`] held.
pub fn set(key: &str, value: u64) {
    assert!(
        !(key == MIGRATE_REQ && value == 0) || MIGRATE_REQ_OFF_HOLDERS.load(Ordering::SeqCst) > 0,
        "turning {key} off disturbs every loss test on this host: hold \
         host::SysctlLock::exclusive() while it is off"
    );
    std::fs::write(path(key), value.to_string())
        .unwrap_or_else(|e| panic!("cannot set {key} = {value}: {e}"));
}

/// `/tmp/berth-locks/sysctl.lock`: held exclusively while a test turns `tcp_migrate_req` off
/// (a negative control: connections queued on a closing listener are then reset, host-wide),
/// shared by tests that count lost requests ([`super::load::Load`] takes it).
pub struct SysctlLock {
    exclusive: bool,
    _lock: FileLock,
}

const SYSCTL_LOCK: &str = "sysctl.lock";
static MIGRATE_REQ_OFF_HOLDERS: AtomicUsize = AtomicUsize::new(0);

impl SysctlLock {
    /// Take it before the [`HostGuard`] that restores the setting, so that it is released
    /// after the restore.
    pub fn exclusive() -> SysctlLock {
        let lock = FileLock::take(SYSCTL_LOCK, false);
        MIGRATE_REQ_OFF_HOLDERS.fetch_add(1, Ordering::SeqCst);
        SysctlLock {
            exclusive: true,
            _lock: lock,
        }
    }

    /// For a test that counts lost requests: waits while a negative control elsewhere has
    /// `tcp_migrate_req` off (a no-op in the process that holds it exclusively).
    pub fn shared() -> SysctlLock {
        SysctlLock {
            exclusive: false,
            _lock: FileLock::take(SYSCTL_LOCK, true),
        }
    }
}

impl Drop for SysctlLock {
    fn drop(&mut self) {
        if self.exclusive {
            MIGRATE_REQ_OFF_HOLDERS.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Restores every sysctl berth manages and the test drop-in to what they were at [`HostGuard::new`].
pub struct HostGuard {
    values: Vec<(&'static str, u64)>,
    dropin: Option<Vec<u8>>,
}

impl HostGuard {
    pub fn new() -> HostGuard {
        HostGuard {
            values: ALL.into_iter().filter_map(|k| Some((k, get(k)?))).collect(),
            dropin: std::fs::read(super::TEST_SYSCTL_DROPIN).ok(),
        }
    }

    /// What `key` was when the guard was made.
    pub fn original(&self, key: &str) -> Option<u64> {
        self.values.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

impl Default for HostGuard {
    fn default() -> Self {
        HostGuard::new()
    }
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        for (key, value) in &self.values {
            if get(key) != Some(*value) {
                if let Err(e) = std::fs::write(path(key), value.to_string()) {
                    eprintln!("could not restore {key} = {value}: {e}");
                }
            }
        }
        let dropin = Path::new(super::TEST_SYSCTL_DROPIN);
        let _ = match &self.dropin {
            Some(bytes) => std::fs::write(dropin, bytes),
            None => std::fs::remove_file(dropin).or(Ok(())),
        };
    }
}
