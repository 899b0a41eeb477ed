//! The machine-wide locks under /tmp/berth-locks that tests of several checkouts share
//! (flock(2), released when the file closes, also when the test process dies).

use std::os::fd::AsRawFd;

pub const DIR: &str = "/tmp/berth-locks";

/// A held flock; released on drop.
pub struct FileLock {
    _file: Option<std::fs::File>,
}

impl FileLock {
    /// Takes `DIR/name` exclusively (`shared`: shared), waiting for it and saying so, unless an
    /// ancestor of this process already holds it (`flock DIR/name cargo test …`), which would
    /// otherwise deadlock: then the ancestor's lock stands for this process.
    pub fn take(name: &str, shared: bool) -> FileLock {
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
        eprintln!(
            "waiting for {path} ({}; another test holds it)",
            if shared { "shared" } else { "exclusive" }
        );
        // SAFETY: as above.
        let r = unsafe { libc::flock(file.as_raw_fd(), mode) };
        assert_eq!(r, 0, "flock {path}");
        FileLock { _file: Some(file) }
    }
}

/// Whether a process among this one's ancestors holds a flock on `path` (from /proc/locks).
pub fn ancestor_holds(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let inode = meta.ino().to_string();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let holders: Vec<u32> = locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (kind, pid, dev) = (f.get(1)?, f.get(4)?, f.get(5)?);
            (*kind == "FLOCK" && dev.rsplit(':').next() == Some(inode.as_str()))
                .then(|| pid.parse().ok())
                .flatten()
        })
        .collect();
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
