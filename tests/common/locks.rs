//! The machine-wide locks under /tmp/berth-locks that tests of several checkouts share
//! (flock(2), released when the file closes, also when the test process dies).

use std::os::fd::AsRawFd;
use std::path::Path;

pub const DIR: &str = "/tmp/berth-locks";

/// A held flock; released on drop.
pub struct FileLock {
    _file: Option<std::fs::File>,
}

impl FileLock {
    /// Takes `DIR/name` exclusively (`shared`: shared), waiting for it and saying so, unless an
    /// ancestor of this process already holds it (`flock DIR/name cargo test …`), which would
    /// otherwise deadlock: then the ancestor's lock stands for this process.
    /// The wait is bounded by BERTH_LOCK_WAIT seconds (default 1800): a stuck holder fails the
    /// test, naming it, instead of hanging the suite.
    pub fn take(name: &str, shared: bool) -> FileLock {
        let wait = std::env::var("BERTH_LOCK_WAIT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1800);
        Self::take_within(name, shared, std::time::Duration::from_secs(wait))
    }

    /// [`FileLock::take`], waiting at most `wait`.
    pub fn take_within(name: &str, shared: bool, wait: std::time::Duration) -> FileLock {
        let path = format!("{DIR}/{name}");
        std::fs::create_dir_all(DIR).expect("creating the lock directory");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {path}: {e}"));
        let mode = if shared { libc::LOCK_SH } else { libc::LOCK_EX };
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } == 0 {
            return FileLock { _file: Some(file) };
        }
        if ancestor_holds(&path) {
            return FileLock { _file: None };
        }
        let kind = if shared { "shared" } else { "exclusive" };
        eprintln!(
            "waiting up to {}s for {path} ({kind}); held by: {}",
            wait.as_secs(),
            holders(&path).join("; ")
        );
        let start = std::time::Instant::now();
        loop {
            // SAFETY: as above.
            if unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } == 0 {
                break;
            }
            if start.elapsed() >= wait {
                panic!(
                    "gave up after {}s waiting for {path} ({kind}); still held by: {} \
                     (stop it if it is stuck; BERTH_LOCK_WAIT=SECONDS waits longer)",
                    wait.as_secs(),
                    holders(&path).join("; ")
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        FileLock { _file: Some(file) }
    }
}

/// The processes that took a flock on `path` (from /proc/locks).
fn holder_pids(path: &str) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let inode = meta.ino().to_string();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (kind, pid, dev) = (f.get(1)?, f.get(4)?, f.get(5)?);
            (*kind == "FLOCK" && dev.rsplit(':').next() == Some(inode.as_str()))
                .then(|| pid.parse().ok())
                .flatten()
        })
        .collect()
}

/// "pid N (command line)" for each holder of a flock on `path`. /proc/locks names the process
/// that took the lock, but with flock(1) on an inherited descriptor (`flock -n 9` in a script)
/// that one exits at once and the lock stays with whoever shares the descriptor: so the holders
/// are the processes with the file open, but for this one, the waiters and their parents.
pub fn holders(path: &str) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(inode) = std::fs::metadata(path).map(|m| m.ino().to_string()) else {
        return Vec::new();
    };
    let ppid = |pid: u32| -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(1)
    };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let mut skip = vec![std::process::id()];
    for l in locks.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) == Some(&"->") && f.get(6).and_then(|d| d.rsplit(':').next()) == Some(&inode) {
            if let Some(pid) = f.get(5).and_then(|p| p.parse().ok()) {
                skip.extend([pid, ppid(pid)]);
            }
        }
    }
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !skip.contains(pid))
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == Path::new(path)))
        })
        .collect();
    if pids.is_empty() {
        pids = holder_pids(path);
    }
    pids.into_iter()
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            format!("pid {pid} ({})", cmd.trim())
        })
        .collect()
}

/// Whether a process among this one's ancestors holds a flock on `path` (from /proc/locks).
pub fn ancestor_holds(path: &str) -> bool {
    let holders = holder_pids(path);
    if holders.is_empty() {
        return false;
    }
    let mut pid = std::process::id();
    while pid > 1 {
        if holders.contains(&pid) {
            return true;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command name (which may hold spaces) start with state, ppid.
        pid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(1);
    }
    false
}
