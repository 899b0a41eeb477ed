//! Where files live: inside a replica container, and in berth's state directory on the host.
//!
//! ```text
//! <state_dir>/                                   0700
//!   proxies/<proxy>/
//!     generations/<bootstrap-sha>/bootstrap.yaml  one per bootstrap content, never rewritten
//!     xds/{lds,cds,rds-<listener>}.yaml          watched by Envoy, mounted read-only
//!     tls/<listener or xds>/{cert,key,ca}.pem     copies of the TLS files, mounted read-only
//!     live-tls/<owner>/<copy>.pem                 Swarm: the copies its tasks were last given
//!     specs/<spec-hash>.json                     recorded specs, for rollback
//!     run/<container-name>/admin.sock            each replica's admin socket directory
//! ```

use std::path::{Path, PathBuf};

/// Inside a replica: the bootstrap directory (mounted read-only).
pub const CONTAINER_BOOTSTRAP_DIR: &str = "/etc/berth/bootstrap";
/// Inside a replica: the bootstrap file Envoy is started with.
pub const CONTAINER_BOOTSTRAP: &str = "/etc/berth/bootstrap/bootstrap.yaml";
/// Inside a replica: the watched directory of listener and cluster files (read-only).
pub const CONTAINER_XDS_DIR: &str = "/etc/berth/xds";
/// Inside a replica: the directory holding the admin socket (read-write, per replica).
pub const CONTAINER_RUN_DIR: &str = "/run/berth";
/// Inside a replica: the admin socket.
pub const CONTAINER_ADMIN_SOCKET: &str = "/run/berth/admin.sock";
/// Inside a replica: TLS material, one directory per listener or `xds` (read-only).
pub const CONTAINER_TLS_DIR: &str = "/etc/berth/tls";

pub const BOOTSTRAP_FILE: &str = "bootstrap.yaml";
pub const LDS_FILE: &str = "lds.yaml";
pub const CDS_FILE: &str = "cds.yaml";
/// The single route file of state directories written before route files were per listener;
/// removed by the next delivery.
pub const RDS_FILE: &str = "rds.yaml";
pub const ADMIN_SOCKET_FILE: &str = "admin.sock";

/// Routes live in their own files (RDS) so a route change never drains a listener: one file
/// per route configuration (HTTP listener), because Envoy's file-based RDS subscription takes
/// exactly one resource ("Unexpected RDS resource length: 2" otherwise). Names that are not
/// plain get a digest, so two route configurations never share a file.
pub fn rds_file(route_config: &str) -> String {
    let plain = !route_config.is_empty()
        && route_config
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        return format!("rds-{route_config}.yaml");
    }
    use sha2::Digest;
    let safe: String = route_config
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let digest = hex::encode(sha2::Sha256::digest(route_config.as_bytes()));
    format!("rds-{safe}-{}.yaml", &digest[..8])
}

/// A route file: [`rds_file`]'s, or the older single [`RDS_FILE`].
pub fn is_rds_file(name: &str) -> bool {
    name == RDS_FILE || (name.starts_with("rds-") && name.ends_with(".yaml"))
}
/// The longest Unix socket path berth can connect to (`sun_path` is 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Host-side paths for one proxy under a state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyDirs {
    root: PathBuf,
}

impl ProxyDirs {
    pub fn new(state_dir: &Path, proxy: &str) -> Self {
        ProxyDirs {
            root: state_dir.join("proxies").join(proxy),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of one bootstrap generation, named by the bootstrap's content hash, so
    /// that a rollout never rewrites the file an old replica runs with.
    pub fn generation(&self, bootstrap_sha: &str) -> PathBuf {
        self.root.join("generations").join(bootstrap_sha)
    }

    pub fn generations(&self) -> PathBuf {
        self.root.join("generations")
    }

    pub fn xds(&self) -> PathBuf {
        self.root.join("xds")
    }

    /// TLS files of one listener (or "xds"), copied here and mounted as a directory.
    pub fn tls(&self, owner: &str) -> PathBuf {
        self.root.join("tls").join(owner)
    }

    /// On a Swarm: the certificate copies of the live set the manager last delivered (what
    /// attaching agents are brought to), `<owner>/<file>`; berth's own, keys 0600.
    pub fn live_tls(&self) -> PathBuf {
        self.root.join("live-tls")
    }

    pub fn run(&self, container_name: &str) -> PathBuf {
        self.root.join("run").join(container_name)
    }

    pub fn admin_socket(&self, container_name: &str) -> PathBuf {
        self.run(container_name).join(ADMIN_SOCKET_FILE)
    }
}

/// The default state directory (as root; see [`crate::host::default_state_dir`]).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/berth";

pub fn default_state_dir_for(
    root: bool,
    xdg_state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> PathBuf {
    if root {
        return PathBuf::from(DEFAULT_STATE_DIR);
    }
    // The XDG spec: a relative $XDG_STATE_HOME is invalid and ignored.
    if let Some(dir) = xdg_state_home
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        return dir.join("berth");
    }
    match home.map(PathBuf::from).filter(|h| h.is_absolute()) {
        Some(home) => home.join(".local/state/berth"),
        None => PathBuf::from(DEFAULT_STATE_DIR),
    }
}

/// Inside a replica: where a TLS file is mounted. `owner` is a listener name, or "xds" for
/// the xDS client certificates; `file` is "cert.pem", "key.pem" or "ca.pem".
pub fn container_tls_file(owner: &str, file: &str) -> String {
    format!("{CONTAINER_TLS_DIR}/{owner}/{file}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_state_dir_is_the_users_unless_root() {
        let some = |s: &str| Some(std::ffi::OsString::from(s));
        assert_eq!(
            default_state_dir_for(true, some("/home/a/.st"), some("/home/a")),
            PathBuf::from("/var/lib/berth")
        );
        assert_eq!(
            default_state_dir_for(false, some("/home/a/.st"), some("/home/a")),
            PathBuf::from("/home/a/.st/berth")
        );
        assert_eq!(
            default_state_dir_for(false, some("rel"), some("/home/a")),
            PathBuf::from("/home/a/.local/state/berth")
        );
        assert_eq!(
            default_state_dir_for(false, None, some("/home/a")),
            PathBuf::from("/home/a/.local/state/berth")
        );
        assert_eq!(
            default_state_dir_for(false, None, None),
            PathBuf::from("/var/lib/berth")
        );
    }
}
