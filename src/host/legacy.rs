//! The host checks `up` makes today, kept until every entry point calls [`super::prepare`].
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

const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// What berth did about `net.ipv4.ip_unprivileged_port_start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortStart {
    /// Every listener port is already bindable by the replicas' non-root user.
    Fine,
    /// berth lowered the setting from `from` to `to`.
    Lowered { from: u16, to: u16 },
}

/// Replicas run as a non-root user, and Docker gives an added `NET_BIND_SERVICE` only to
/// root: a listener port below `net.ipv4.ip_unprivileged_port_start` (1024 by default) cannot
/// be bound. When `allowed` and running as root, berth lowers the setting to the lowest such
/// port (not further); otherwise it refuses with the command to run.
pub fn ensure_unprivileged_port_start(
    lowest_port: Option<u16>,
    allowed: bool,
) -> anyhow::Result<PortStart> {
    port_start(
        Path::new(UNPRIVILEGED_PORT_START),
        lowest_port,
        allowed,
        is_root(),
    )
}

fn port_start(
    path: &Path,
    lowest_port: Option<u16>,
    allowed: bool,
    root: bool,
) -> anyhow::Result<PortStart> {
    let Some(port) = lowest_port else {
        return Ok(PortStart::Fine);
    };
    let Ok(value) = fs::read_to_string(path) else {
        return Ok(PortStart::Fine);
    };
    let current: u16 = value.trim().parse().unwrap_or(1024);
    if port >= current {
        return Ok(PortStart::Fine);
    }
    if allowed && root && fs::write(path, port.to_string()).is_ok() {
        return Ok(PortStart::Lowered {
            from: current,
            to: port,
        });
    }
    let why = if !allowed {
        "the config sets tune_host = false"
    } else {
        "berth is not running as root"
    };
    anyhow::bail!(
        "port {port} is below net.ipv4.ip_unprivileged_port_start ({current}) and replicas run as a \
         non-root user, so Envoy could not bind it ({why}). Run: sysctl -w \
         net.ipv4.ip_unprivileged_port_start={port} (and add it to /etc/sysctl.d/), or use a port \
         of {current} or above; nothing was changed"
    )
}

#[cfg(test)]
mod port_start_tests {
    use super::*;

    #[test]
    fn lowers_only_as_far_as_needed_and_only_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ip_unprivileged_port_start");
        fs::write(&path, "1024\n").unwrap();
        assert_eq!(
            port_start(&path, None, true, true).unwrap(),
            PortStart::Fine
        );
        assert_eq!(
            port_start(&path, Some(8080), true, true).unwrap(),
            PortStart::Fine
        );
        let refused = port_start(&path, Some(443), false, true)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("port 443") && refused.contains("sysctl -w"),
            "{refused}"
        );
        assert!(port_start(&path, Some(443), true, false).is_err());
        assert_eq!(
            port_start(&path, Some(443), true, true).unwrap(),
            PortStart::Lowered {
                from: 1024,
                to: 443
            }
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "443");
        assert_eq!(
            port_start(&path, Some(8443), true, true).unwrap(),
            PortStart::Fine
        );
    }
}
