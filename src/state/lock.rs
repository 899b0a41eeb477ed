//! One writer per state directory (DESIGN decision 10).
//!
//! A writer holds an exclusive `flock(2)` on `<state>/berth.lock` while it changes anything:
//! `berth serve` for its whole life, `up`/`down` for one run. The kernel drops the lock when
//! its holder exits, however it exits, so a lock can never be left behind by a crash. After
//! taking the lock, the holder writes who it is (pid, role, and for serve the address of its
//! local API) into the file, so that a process that finds the lock taken can say by whom, and
//! `up` can hand its request to a running serve ([`crate::edges::control`]). Read-only commands
//! (`status`, `diff`, `render`) never take the lock.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The lock file, in the state directory's root.
pub const LOCK_FILE: &str = "berth.lock";

/// How often a waiting writer tries the lock again.
const RETRY: Duration = Duration::from_millis(100);

/// What a writer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Serve,
    Up,
    Down,
    /// Written by a newer berth.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Serve => "berth serve",
            Role::Up => "berth up",
            Role::Down => "berth down",
            Role::Other => "another berth process",
        })
    }
}

/// Who holds (or last held) a state directory's lock, as the holder wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub role: Role,
    /// serve's local API socket, when it offers one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<PathBuf>,
}

impl Holder {
    /// This process in `role`.
    pub fn me(role: Role) -> Holder {
        Holder {
            pid: std::process::id(),
            role,
            api: None,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.role, self.pid)
    }
}

/// An exclusive hold on a state directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StateLock {
    file: File,
    path: PathBuf,
    holder: Holder,
}

/// The outcome of one attempt.
#[derive(Debug)]
pub enum Attempt {
    Locked(StateLock),
    /// Someone else holds it. `None`: the holder has not said who it is yet (it is starting),
    /// or it wrote a record this berth cannot read.
    Held(Option<Holder>),
}

impl StateLock {
    /// Takes the lock of the state directory at `root` if it is free, creating the directory
    /// (0700) and the lock file (0600) when missing. Never blocks.
    pub fn try_acquire(root: &Path, role: Role) -> Result<Attempt> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .with_context(|| format!("cannot create state directory {}", root.display()))?;
        let path = root.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: flock on a file descriptor we own; no memory is shared with the kernel.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == ErrorKind::WouldBlock {
                return Ok(Attempt::Held(read_holder(&path)));
            }
            return Err(err).with_context(|| format!("cannot lock {}", path.display()));
        }
        let mut lock = StateLock {
            file,
            path,
            holder: Holder::me(role),
        };
        lock.record()?;
        Ok(Attempt::Locked(lock))
    }

    /// Takes the lock, waiting as long as someone else holds it. `on_wait` is called once,
    /// with the holder, if there is a wait (to tell the user who is being waited for).
    pub async fn acquire(
        root: &Path,
        role: Role,
        on_wait: impl FnOnce(Option<&Holder>),
    ) -> Result<StateLock> {
        let mut on_wait = Some(on_wait);
        loop {
            match StateLock::try_acquire(root, role)? {
                Attempt::Locked(lock) => return Ok(lock),
                Attempt::Held(holder) => {
                    if let Some(f) = on_wait.take() {
                        f(holder.as_ref());
                    }
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records serve's local API socket, for `up`/`down` to find.
    pub fn advertise_api(&mut self, socket: &Path) -> Result<()> {
        self.holder.api = Some(socket.to_path_buf());
        self.record()
    }

    fn record(&mut self) -> Result<()> {
        let mut line = serde_json::to_vec(&self.holder)?;
        line.push(b'\n');
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            std::io::Seek::rewind(f)?;
            f.write_all(&line)
        };
        write(&mut self.file).with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// Who holds the lock of the state directory at `root` now, if anyone: for read-only commands
/// and messages. Never takes or waits for the lock. A record whose process is gone is a lock
/// that was released (the kernel drops a lock with its process), so it is not reported.
pub fn current_holder(root: &Path) -> Option<Holder> {
    let holder = read_holder(&root.join(LOCK_FILE))?;
    process_alive(holder.pid).then_some(holder)
}

fn read_holder(path: &Path) -> Option<Holder> {
    let text = fs::read_to_string(path).ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// Whether a process with this pid exists (in this pid namespace).
pub fn process_alive(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locked(a: Attempt) -> StateLock {
        match a {
            Attempt::Locked(l) => l,
            Attempt::Held(h) => panic!("held by {h:?}"),
        }
    }

    #[test]
    fn a_second_writer_finds_the_first_and_gets_the_lock_once_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let mut serve = locked(StateLock::try_acquire(&root, Role::Serve).unwrap());
        serve.advertise_api(&root.join("serve.sock")).unwrap();
        // flock locks belong to open file descriptions: a second open in this process
        // conflicts just as another process would.
        match StateLock::try_acquire(&root, Role::Up).unwrap() {
            Attempt::Held(Some(h)) => {
                assert_eq!(h.pid, std::process::id());
                assert_eq!(h.role, Role::Serve);
                assert_eq!(h.api.as_deref(), Some(root.join("serve.sock").as_path()));
            }
            other => panic!("expected the serve holder, got {other:?}"),
        }
        assert_eq!(current_holder(&root).map(|h| h.role), Some(Role::Serve));
        drop(serve);
        let up = locked(StateLock::try_acquire(&root, Role::Up).unwrap());
        assert_eq!(up.holder().role, Role::Up);
        assert_eq!(current_holder(&root).unwrap().api, None);
        let mode = fs::metadata(up.path()).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
    }

    #[test]
    fn a_dead_holders_record_is_no_holder() {
        let dir = tempfile::tempdir().unwrap();
        let record = serde_json::json!({"pid": 0x7fff_fff0u32, "role": "serve"});
        fs::write(dir.path().join(LOCK_FILE), record.to_string()).unwrap();
        assert_eq!(current_holder(dir.path()), None);
        // Nobody holds the flock, so the stale record does not stop a writer.
        locked(StateLock::try_acquire(dir.path(), Role::Up).unwrap());
    }

    #[test]
    fn unknown_roles_from_a_newer_berth_still_read() {
        let h: Holder = serde_json::from_str(r#"{"pid":1,"role":"agent","x":2}"#).unwrap();
        assert_eq!(h.role, Role::Other);
    }

    #[tokio::test]
    async fn acquire_waits_for_the_holder_and_says_whom_it_waits_for() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let first = locked(StateLock::try_acquire(&root, Role::Down).unwrap());
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(first);
        });
        let mut waited_for = None;
        let started = std::time::Instant::now();
        let lock = StateLock::acquire(&root, Role::Up, |h| waited_for = h.cloned())
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(250));
        assert_eq!(waited_for.map(|h| h.role), Some(Role::Down));
        assert_eq!(lock.holder().role, Role::Up);
        release.await.unwrap();
    }

    #[test]
    fn the_lock_goes_with_a_killed_process() {
        // A child process takes the lock and is killed: the kernel releases it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        fs::write(&path, "").unwrap();
        let mut child = std::process::Command::new("flock")
            .arg("--no-fork")
            .arg(&path)
            .args(["sleep", "30"])
            .spawn()
            .expect("flock(1) from util-linux");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(
            StateLock::try_acquire(dir.path(), Role::Up).unwrap(),
            Attempt::Locked(_)
        ) {
            assert!(
                std::time::Instant::now() < deadline,
                "flock(1) never locked"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        locked(StateLock::try_acquire(dir.path(), Role::Up).unwrap());
    }
}
