//! Host settings replicas depend on.
//!
//! `net.ipv4.tcp_migrate_req = 1` makes the kernel move connections still waiting in a closing
//! listener's accept queue to a sibling listener on the same port (SO_REUSEPORT). Without it,
//! a connection that arrives in the instant a retiring replica closes its listener is reset.

use std::fs;
use std::path::Path;

const TCP_MIGRATE_REQ: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateReq {
    /// Already 1.
    On,
    /// berth set it to 1.
    Set,
    /// It is 0 and berth did not (or could not) change it: the warning to show.
    Off(String),
    /// This kernel has no such setting.
    Unsupported,
}

/// Checks `net.ipv4.tcp_migrate_req`, setting it to 1 when `allowed` and running as root.
pub fn ensure_tcp_migrate_req(allowed: bool) -> MigrateReq {
    check(Path::new(TCP_MIGRATE_REQ), allowed, is_root())
}

fn check(path: &Path, allowed: bool, root: bool) -> MigrateReq {
    let Ok(value) = fs::read_to_string(path) else {
        return MigrateReq::Unsupported;
    };
    if value.trim() == "1" {
        return MigrateReq::On;
    }
    if allowed && root && fs::write(path, "1").is_ok() {
        return MigrateReq::Set;
    }
    let why = if !allowed {
        "the config sets tune_host = false"
    } else {
        "berth is not running as root"
    };
    MigrateReq::Off(format!(
        "net.ipv4.tcp_migrate_req is 0 ({why}): a connection arriving while a replica closes \
         its listener may be reset. Run: sysctl -w net.ipv4.tcp_migrate_req=1 (and add it to \
         /etc/sysctl.d/ to keep it)"
    ))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_only_when_allowed_and_root() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tcp_migrate_req");
        fs::write(&path, "0\n").unwrap();
        assert!(matches!(check(&path, false, true), MigrateReq::Off(m) if m.contains("sysctl -w")));
        assert!(
            matches!(check(&path, true, false), MigrateReq::Off(m) if m.contains("not running as root"))
        );
        assert_eq!(check(&path, true, true), MigrateReq::Set);
        assert_eq!(check(&path, true, true), MigrateReq::On);
        assert_eq!(
            check(&dir.path().join("missing"), true, true),
            MigrateReq::Unsupported
        );
    }
}
