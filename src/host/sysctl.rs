//! Kernel settings by their sysctl names, read and written under `/proc/sys`, and the
//! drop-in file berth owns under `/etc/sysctl.d` so that the settings survive a reboot.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The drop-in berth writes (as root, with `tune_host = true`). systemd-sysctl (or
/// `sysctl --system`) applies /etc/sysctl.d at boot, before Docker restarts the replicas.
pub const DEFAULT_DROPIN: &str = "/etc/sysctl.d/60-berth.conf";

/// Overrides [`DEFAULT_DROPIN`] (tests, hosts with another layout).
pub const DROPIN_ENV: &str = "BERTH_SYSCTL_DROPIN";

/// The settings berth manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    TcpMigrateReq,
    UnprivilegedPortStart,
    InotifyInstances,
    InotifyWatches,
}

impl Key {
    pub const ALL: [Key; 4] = [
        Key::TcpMigrateReq,
        Key::UnprivilegedPortStart,
        Key::InotifyInstances,
        Key::InotifyWatches,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Key::TcpMigrateReq => "net.ipv4.tcp_migrate_req",
            Key::UnprivilegedPortStart => "net.ipv4.ip_unprivileged_port_start",
            Key::InotifyInstances => "fs.inotify.max_user_instances",
            Key::InotifyWatches => "fs.inotify.max_user_watches",
        }
    }

    pub fn from_name(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Which way is "more permissive": berth only ever moves a setting that way.
    pub fn lower_is_looser(self) -> bool {
        self == Key::UnprivilegedPortStart
    }

    /// The looser of two values.
    pub fn looser(self, a: u64, b: u64) -> u64 {
        if self.lower_is_looser() {
            a.min(b)
        } else {
            a.max(b)
        }
    }

    /// Why replicas need it, for the drop-in's comments and messages.
    pub fn purpose(self) -> &'static str {
        match self {
            Key::TcpMigrateReq => {
                "connections still queued on a retiring replica's listener move to a sibling \
                 replica instead of being reset"
            }
            Key::UnprivilegedPortStart => {
                "replicas run as a non-root user and must bind the proxies' ports below 1024"
            }
            Key::InotifyInstances => {
                "every replica watches its files with inotify; all replicas run as one user \
                 and share this per-user limit"
            }
            Key::InotifyWatches => "one inotify watch per watched directory, per replica",
        }
    }

    pub fn command(self, value: u64) -> String {
        format!("sysctl -w {}={value}", self.name())
    }
}

/// The kernel's settings under a `/proc/sys` root (overridable for tests).
#[derive(Debug, Clone)]
pub struct Sysctls {
    root: PathBuf,
}

impl Default for Sysctls {
    fn default() -> Self {
        Sysctls::at(Path::new("/proc/sys"))
    }
}

impl Sysctls {
    pub fn at(root: &Path) -> Sysctls {
        Sysctls {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, key: Key) -> PathBuf {
        self.root.join(key.name().replace('.', "/"))
    }

    /// The current value; None when this kernel has no such setting (or hides it).
    pub fn get(&self, key: Key) -> Option<u64> {
        fs::read_to_string(self.path(key)).ok()?.trim().parse().ok()
    }

    pub fn set(&self, key: Key, value: u64) -> Result<()> {
        let path = self.path(key);
        fs::write(&path, value.to_string())
            .with_context(|| format!("cannot set {} = {value} ({})", key.name(), path.display()))
    }
}

/// The drop-in's settings, as berth last wrote them (berth's own keys only).
pub fn read_dropin(path: &Path) -> BTreeMap<Key, u64> {
    let Ok(text) = fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((Key::from_name(k.trim())?, v.trim().parse().ok()?))
        })
        .collect()
}

/// The drop-in's text: every setting with a comment saying why replicas need it.
pub fn render_dropin(values: &BTreeMap<Key, u64>) -> String {
    let mut text = String::from(
        "# Written by berth: kernel settings its Envoy replicas need, applied at boot (by\n\
         # systemd-sysctl or `sysctl --system`) before Docker restarts the replicas.\n\
         # berth rewrites this file whenever it prepares the host, and only ever loosens a\n\
         # setting; to stop it, set `tune_host = false` in berth.toml. Deleting the file\n\
         # returns the kernel defaults at the next boot.\n",
    );
    for (key, value) in values {
        text.push_str(&format!(
            "\n# {}\n{} = {value}\n",
            key.purpose(),
            key.name()
        ));
    }
    text
}

/// Writes the drop-in atomically (temp file, fsync, rename) when its content changes.
/// Returns whether it was written.
pub fn write_dropin(path: &Path, values: &BTreeMap<Key, u64>) -> Result<bool> {
    let text = render_dropin(values);
    if fs::read_to_string(path).ok().as_deref() == Some(text.as_str()) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    crate::state::write_atomic(path, text.as_bytes(), 0o644)?;
    Ok(true)
}

/// The drop-in's path: [`DROPIN_ENV`] or [`DEFAULT_DROPIN`].
pub fn dropin_path() -> PathBuf {
    std::env::var_os(DROPIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DROPIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropin_reads_back_what_it_wrote_and_ignores_foreign_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sysctl.d/60-berth.conf");
        let values = BTreeMap::from([(Key::TcpMigrateReq, 1), (Key::UnprivilegedPortStart, 80)]);
        assert!(write_dropin(&path, &values).unwrap());
        assert!(
            !write_dropin(&path, &values).unwrap(),
            "unchanged: not rewritten"
        );
        assert_eq!(read_dropin(&path), values);
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("net.ipv4.ip_unprivileged_port_start = 80\n"),
            "{text}"
        );
        fs::write(
            &path,
            format!("{text}\nvm.swappiness = 10\n; comment = 3\n"),
        )
        .unwrap();
        assert_eq!(read_dropin(&path), values);
        let mode = fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o644
        );
    }

    #[test]
    fn sysctls_map_dotted_names_to_proc_paths() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Sysctls::at(dir.path());
        assert_eq!(sys.get(Key::InotifyInstances), None);
        fs::create_dir_all(dir.path().join("fs/inotify")).unwrap();
        fs::write(dir.path().join("fs/inotify/max_user_instances"), "128\n").unwrap();
        assert_eq!(sys.get(Key::InotifyInstances), Some(128));
        sys.set(Key::InotifyInstances, 1024).unwrap();
        assert_eq!(sys.get(Key::InotifyInstances), Some(1024));
        assert!(sys.set(Key::TcpMigrateReq, 1).is_err(), "no such file");
    }

    #[test]
    fn looser_goes_the_permissive_way() {
        assert_eq!(Key::UnprivilegedPortStart.looser(1024, 80), 80);
        assert_eq!(Key::InotifyInstances.looser(128, 1024), 1024);
    }
}
