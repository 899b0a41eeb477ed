//! A proxy's rollout files in the state directory, beside its specs: `rollout.json`, the
//! rollout under way as whoever runs it (`up` or serve) records it, and the requests
//! `berth rollout pause|resume|promote|undo` leaves for it (empty marker files, looked at every
//! second by the running rollout). `rollout.undone` holds the spec hash an undo rolled back
//! from: that spec is not rolled out again until the config asks for another one.
//! `rollout.previous` names the last finished rollout's specs (from, to): what an undo after it
//! goes back to (that spec stays recorded while the file names it).

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::core::layout::ProxyDirs;
use crate::core::rollout::canary::RolloutRecord;

pub const RECORD: &str = "rollout.json";
const PAUSED: &str = "rollout.paused";
const PROMOTE: &str = "rollout.promote";
const UNDO: &str = "rollout.undo";
const UNDONE: &str = "rollout.undone";
const PREVIOUS: &str = "rollout.previous";

/// Seconds since the Unix epoch: the clock records are kept in (they outlive the process).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What `berth rollout` asks of a running rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Pause,
    Resume,
    Promote,
    Undo,
}

/// One proxy's rollout files.
#[derive(Debug, Clone)]
pub struct RolloutFiles {
    dir: PathBuf,
}

impl RolloutFiles {
    pub fn new(state_dir: &Path, proxy: &str) -> RolloutFiles {
        RolloutFiles {
            dir: ProxyDirs::new(state_dir, proxy).root().to_path_buf(),
        }
    }

    pub fn record_path(&self) -> PathBuf {
        self.dir.join(RECORD)
    }

    pub fn read(&self) -> Option<RolloutRecord> {
        let text = std::fs::read_to_string(self.record_path()).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn write(&self, record: &RolloutRecord) -> Result<()> {
        let json = serde_json::to_vec_pretty(record)?;
        crate::state::write_atomic(&self.record_path(), &json, 0o600)
    }

    /// The rollout is over: its record and any request left for it go.
    pub fn forget(&self) {
        for f in [RECORD, PAUSED, PROMOTE, UNDO] {
            let _ = std::fs::remove_file(self.dir.join(f));
        }
    }

    /// Leaves `request` for the running rollout.
    pub fn request(&self, request: Request) -> Result<()> {
        let marker = |name: &str| crate::state::write_atomic(&self.dir.join(name), b"", 0o600);
        match request {
            Request::Pause => marker(PAUSED),
            Request::Resume => {
                let _ = std::fs::remove_file(self.dir.join(PAUSED));
                Ok(())
            }
            Request::Promote => marker(PROMOTE),
            Request::Undo => marker(UNDO),
        }
    }

    pub fn paused(&self) -> bool {
        self.dir.join(PAUSED).exists()
    }

    /// Takes a one-shot request (promote, undo): true when it was there.
    pub fn take(&self, request: Request) -> bool {
        let name = match request {
            Request::Promote => PROMOTE,
            Request::Undo => UNDO,
            Request::Pause | Request::Resume => return false,
        };
        std::fs::remove_file(self.dir.join(name)).is_ok()
    }

    /// A one-shot request still waiting to be taken.
    pub fn take_pending(&self, request: Request) -> bool {
        match request {
            Request::Promote => self.dir.join(PROMOTE).exists(),
            Request::Undo => self.dir.join(UNDO).exists(),
            Request::Pause | Request::Resume => false,
        }
    }

    /// The spec hash an undo rolled back from, if any.
    pub fn undone(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.dir.join(UNDONE)).ok()?;
        Some(text.trim().to_string()).filter(|h| !h.is_empty())
    }

    pub fn set_undone(&self, hash: &str) -> Result<()> {
        crate::state::write_atomic(&self.dir.join(UNDONE), hash.as_bytes(), 0o600)
    }

    pub fn clear_undone(&self) {
        let _ = std::fs::remove_file(self.dir.join(UNDONE));
    }

    /// The last finished rollout: (the spec hash it went from, the one it went to).
    pub fn previous(&self) -> Option<(String, String)> {
        let text = std::fs::read_to_string(self.dir.join(PREVIOUS)).ok()?;
        let (from, to) = text.trim().split_once(' ')?;
        Some((from.to_string(), to.to_string())).filter(|(f, t)| !f.is_empty() && !t.is_empty())
    }

    pub fn set_previous(&self, from: &str, to: &str) -> Result<()> {
        crate::state::write_atomic(
            &self.dir.join(PREVIOUS),
            format!("{from} {to}\n").as_bytes(),
            0o600,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_left_taken_and_forgotten() {
        let d = tempfile::tempdir().unwrap();
        let f = RolloutFiles::new(d.path(), "edge");
        std::fs::create_dir_all(&f.dir).unwrap();
        assert!(f.read().is_none() && !f.paused());
        f.request(Request::Pause).unwrap();
        f.request(Request::Promote).unwrap();
        assert!(f.paused());
        assert!(f.take(Request::Promote) && !f.take(Request::Promote));
        f.request(Request::Resume).unwrap();
        assert!(!f.paused());
        f.write(&RolloutRecord {
            to_hash: "abc".into(),
            ..RolloutRecord::default()
        })
        .unwrap();
        assert_eq!(f.read().unwrap().to_hash, "abc");
        f.set_undone("abc").unwrap();
        f.forget();
        assert!(f.read().is_none());
        assert_eq!(
            f.undone().as_deref(),
            Some("abc"),
            "an undo outlives the rollout"
        );
        f.clear_undone();
        assert!(f.undone().is_none());
        assert!(f.previous().is_none());
        f.set_previous("old", "new").unwrap();
        f.forget();
        assert_eq!(f.previous(), Some(("old".into(), "new".into())));
    }
}
