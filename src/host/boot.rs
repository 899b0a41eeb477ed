//! What the boot sets: the sysctl configuration files systemd-sysctl (or `sysctl --system`)
//! applies, in its order, so berth can tell whether a setting survives a reboot.
//!
//! Order (sysctl.d(5)): every `*.conf` in /usr/lib/sysctl.d, /run/sysctl.d and /etc/sysctl.d,
//! a name in a later directory replacing the same name in an earlier one, read in name order,
//! then /etc/sysctl.conf; a later assignment wins.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::sysctl::Key;

/// A value the boot sets, and the file it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub value: u64,
    pub file: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootConfig {
    /// Directories of `*.conf` files, earliest first.
    pub dirs: Vec<PathBuf>,
    /// Read last.
    pub conf: PathBuf,
    /// berth's drop-in when it lives outside `dirs` (tests): read as if it were in the last one.
    pub extra: Option<PathBuf>,
}

impl BootConfig {
    pub fn standard() -> BootConfig {
        BootConfig {
            dirs: ["/usr/lib/sysctl.d", "/run/sysctl.d", "/etc/sysctl.d"]
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            conf: PathBuf::from("/etc/sysctl.conf"),
            extra: None,
        }
    }

    /// Counts berth's drop-in at `path` even when it is not in a standard directory.
    pub fn with_dropin(mut self, path: &Path) -> BootConfig {
        if !self.dirs.iter().any(|d| path.parent() == Some(d.as_path())) {
            self.extra = Some(path.to_path_buf());
        }
        self
    }

    /// The files, in the order the boot reads them.
    fn files(&self) -> Vec<PathBuf> {
        let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
        for dir in &self.dirs {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for e in entries.filter_map(|e| e.ok()) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".conf") {
                    by_name.insert(name, e.path());
                }
            }
        }
        if let Some(extra) = &self.extra {
            if let Some(name) = extra.file_name() {
                by_name.insert(name.to_string_lossy().into_owned(), extra.clone());
            }
        }
        let mut files: Vec<PathBuf> = by_name.into_values().collect();
        files.push(self.conf.clone());
        files
    }

    /// berth's settings as the boot leaves them.
    pub fn read(&self) -> BTreeMap<Key, Setting> {
        let mut values = BTreeMap::new();
        for file in self.files() {
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            for line in text.lines().map(str::trim) {
                if line.starts_with('#') || line.starts_with(';') {
                    continue;
                }
                // A leading '-' only means "ignore errors".
                let line = line.strip_prefix('-').unwrap_or(line);
                let Some((k, v)) = line.split_once('=') else {
                    continue;
                };
                let name = k.trim().replace('/', ".");
                let (Some(key), Ok(value)) = (Key::from_name(&name), v.trim().parse()) else {
                    continue;
                };
                values.insert(
                    key,
                    Setting {
                        value,
                        file: file.clone(),
                    },
                );
            }
        }
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_files_win_and_etc_replaces_a_same_named_vendor_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = |d: &str| {
            let p = root.path().join(d);
            fs::create_dir_all(&p).unwrap();
            p
        };
        let (usr, etc) = (dir("usr"), dir("etc"));
        fs::write(
            usr.join("50-default.conf"),
            "net.ipv4.tcp_migrate_req = 1\n",
        )
        .unwrap();
        fs::write(
            usr.join("70-vendor.conf"),
            "fs.inotify.max_user_instances = 512\n",
        )
        .unwrap();
        fs::write(etc.join("70-vendor.conf"), "# masked\n").unwrap();
        fs::write(etc.join("99-local.conf"), "-net/ipv4/tcp_migrate_req=0\n").unwrap();
        let conf = root.path().join("sysctl.conf");
        fs::write(&conf, "; nothing\n").unwrap();
        let boot = BootConfig {
            dirs: vec![usr, etc.clone()],
            conf,
            extra: None,
        };
        let read = boot.read();
        assert_eq!(read[&Key::TcpMigrateReq].value, 0);
        assert_eq!(read[&Key::TcpMigrateReq].file, etc.join("99-local.conf"));
        assert!(
            !read.contains_key(&Key::InotifyInstances),
            "etc's file masks the vendor's"
        );
        let elsewhere = root.path().join("60-berth.conf");
        fs::write(&elsewhere, "fs.inotify.max_user_instances = 1024\n").unwrap();
        let read = boot.with_dropin(&elsewhere).read();
        assert_eq!(read[&Key::InotifyInstances].value, 1024);
    }
}
