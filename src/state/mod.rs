//! Layer state: the state directory and its one-writer [`lock`]. May use: core.
//!
//! berth's state directory: the rendered files per proxy and per bootstrap generation, written
//! atomically (temp file, fsync, rename) so a crash at any point leaves whole files behind.
//!
//! Layout: see [`crate::core::layout`]. The root is 0700; files replicas read are 0644 and directories
//! 0755 below it (bind mounts do not need the parents to be traversable by the container user).

pub mod lock;
pub mod rollout;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::core::layout::{ProxyDirs, BOOTSTRAP_FILE};
use crate::core::replica::{DesiredProxy, TlsFile};

#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Opens the state directory, creating it (mode 0700) when missing.
    pub fn open(root: &Path) -> Result<StateDir> {
        create_dir(root, 0o700)
            .with_context(|| format!("cannot create state directory {}", root.display()))?;
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot set mode 0700 on {}", root.display()))?;
        sweep_leftover_temps(root, 4)?;
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    /// The state directory at `root`, without creating it (for reading).
    pub fn at(root: &Path) -> StateDir {
        StateDir {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn proxy(&self, name: &str) -> ProxyDirs {
        ProxyDirs::new(&self.root, name)
    }

    /// Writes the bootstrap of one generation. Generations are content-addressed, so an
    /// existing one with the same content is left alone.
    pub fn write_generation(
        &self,
        proxy: &str,
        bootstrap_sha: &str,
        bootstrap: &str,
    ) -> Result<()> {
        let dir = self.proxy(proxy).generation(bootstrap_sha);
        create_dir(&dir, 0o755)?;
        let path = dir.join(BOOTSTRAP_FILE);
        if fs::read_to_string(&path).ok().as_deref() != Some(bootstrap) {
            write_atomic(&path, bootstrap.as_bytes(), 0o644)?;
        }
        Ok(())
    }

    /// Writes the watched xDS files of a proxy, each by an atomic rename into the directory
    /// Envoy watches. Only files whose content differs are written; files that are no longer
    /// rendered are removed. Returns the names of the files that changed.
    pub fn write_xds(&self, proxy: &str, files: &BTreeMap<String, String>) -> Result<Vec<String>> {
        let dir = self.proxy(proxy).xds();
        create_dir(&dir, 0o755)?;
        let mut changed = Vec::new();
        for (name, content) in files {
            let path = dir.join(name);
            if fs::read(&path).ok().as_deref() != Some(content.as_bytes()) {
                write_atomic(&path, content.as_bytes(), 0o644)?;
                changed.push(name.clone());
            }
        }
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if is_leftover_temp(&name) {
                // A temp file of a write that a crash interrupted before its rename.
                fs::remove_file(dir.join(&name))?;
            } else if !files.contains_key(&name) && !name.starts_with('.') {
                fs::remove_file(dir.join(&name))?;
                changed.push(name);
            }
        }
        Ok(changed)
    }

    /// Copies the proxy's TLS files into its state (readable only by the replica user for
    /// keys), each by an atomic rename, so a renewed listener certificate reaches running
    /// replicas through their directory mounts (the xDS client certificate's directory is
    /// named by its contents instead: [`TlsFile::dir`]). Returns the files that changed.
    pub fn write_tls(&self, proxy: &str, files: &[TlsFile]) -> Result<Vec<String>> {
        let dirs = self.proxy(proxy);
        let mut changed = Vec::new();
        for f in files {
            let content = fs::read(&f.source)
                .with_context(|| format!("cannot read TLS file {}", f.source.display()))?;
            let dir = dirs.tls(&f.dir);
            create_dir(&dir, 0o755)?;
            let path = dir.join(f.file);
            if fs::read(&path).ok().as_deref() == Some(content.as_slice()) {
                continue;
            }
            let mode = if f.file == "key.pem" { 0o400 } else { 0o444 };
            write_atomic(&path, &content, mode)?;
            let user = crate::core::replica::replica_user();
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))
                .with_context(|| format!("cannot hand {} to uid {}", path.display(), user.uid))?;
            changed.push(format!("{}/{}", f.owner, f.file));
        }
        Ok(changed)
    }

    /// Copies a checked listener certificate into `tls/<dir>/` under names carrying its
    /// version (the key readable only by the replica user). Other versions are removed unless
    /// `keep` names them (the ones the watched files on disk still point at). Returns the files
    /// written.
    pub fn write_certificate(
        &self,
        proxy: &str,
        cert: &crate::core::certificates::Certificate,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>> {
        let dir = self.proxy(proxy).tls(&cert.dir);
        create_dir(&dir, 0o755)?;
        let (cert_name, key_name) = (cert.cert_name(), cert.key_name());
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let versioned =
                (name.starts_with("cert-") || name.starts_with("key-")) && name.ends_with(".pem");
            if (versioned && name != cert_name && name != key_name && !keep(&name))
                || is_leftover_temp(&name)
            {
                fs::remove_file(dir.join(&name))?;
            }
        }
        let mut changed = Vec::new();
        for (name, content, mode) in [
            (&cert_name, &cert.cert_pem, 0o444),
            (&key_name, &cert.key_pem, 0o400),
        ] {
            let path = dir.join(name);
            if fs::read(&path).ok().as_deref() == Some(content.as_slice()) {
                continue;
            }
            write_atomic(&path, content, mode)?;
            let user = crate::core::replica::replica_user();
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))
                .with_context(|| format!("cannot hand {} to uid {}", path.display(), user.uid))?;
            changed.push(format!("{}/{name}", cert.dir));
        }
        Ok(changed)
    }

    /// Writes checked copies (name, content, mode) into `tls/<owner>/`, owned by the replica
    /// user, each by an atomic rename, and removes the other `*.pem` files there unless `keep`
    /// names them (the ones the watched files on disk still point at). Returns the files
    /// written.
    pub fn write_tls_copies(
        &self,
        proxy: &str,
        owner: &str,
        copies: &[(String, &[u8], u32)],
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>> {
        let dir = self.proxy(proxy).tls(owner);
        create_dir(&dir, 0o755)?;
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let wanted = copies.iter().any(|(n, _, _)| *n == name);
            if (name.ends_with(".pem") && !wanted && !keep(&name)) || is_leftover_temp(&name) {
                fs::remove_file(dir.join(&name))?;
            }
        }
        let mut changed = Vec::new();
        for (name, content, mode) in copies {
            let path = dir.join(name);
            if fs::read(&path).ok().as_deref() == Some(*content) {
                continue;
            }
            write_atomic(&path, content, *mode)?;
            let user = crate::core::replica::replica_user();
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))
                .with_context(|| format!("cannot hand {} to uid {}", path.display(), user.uid))?;
            changed.push(format!("{owner}/{name}"));
        }
        Ok(changed)
    }

    /// On a Swarm, the live set its tasks were last given: the watched files and the
    /// certificate copies (`tls/<owner>/<file>`, see
    /// [`crate::core::agent::channel::TLS_PREFIX`]).
    pub fn read_live(&self, proxy: &str) -> Result<BTreeMap<String, String>> {
        let mut files = self.read_xds(proxy)?;
        let dir = self.proxy(proxy).live_tls();
        let Ok(owners) = fs::read_dir(&dir) else {
            return Ok(files);
        };
        for owner in owners {
            let owner = owner?;
            if !owner.file_type()?.is_dir() {
                continue;
            }
            let name = owner.file_name().to_string_lossy().into_owned();
            for entry in fs::read_dir(owner.path())? {
                let entry = entry?;
                let file = entry.file_name().to_string_lossy().into_owned();
                if !file.starts_with('.') && entry.file_type()?.is_file() {
                    files.insert(
                        format!("{}{name}/{file}", crate::core::agent::channel::TLS_PREFIX),
                        fs::read_to_string(entry.path())?,
                    );
                }
            }
        }
        Ok(files)
    }

    /// Records the live set of a Swarm proxy ([`StateDir::read_live`]): the watched files as
    /// [`StateDir::write_xds`] does, the certificate copies under `live-tls/` (0600; others
    /// removed). Returns the names that changed.
    pub fn write_live(&self, proxy: &str, files: &BTreeMap<String, String>) -> Result<Vec<String>> {
        let prefix = crate::core::agent::channel::TLS_PREFIX;
        let (copies, watched): (BTreeMap<String, String>, BTreeMap<String, String>) = files
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .partition(|(n, _)| n.starts_with(prefix));
        let mut changed = self.write_xds(proxy, &watched)?;
        let dir = self.proxy(proxy).live_tls();
        let before = self.read_live(proxy)?;
        for (name, text) in &copies {
            let rest = &name[prefix.len()..];
            let Some((owner, file)) = rest.split_once('/') else {
                anyhow::bail!("not a certificate copy's name: {name:?}");
            };
            if [owner, file]
                .iter()
                .any(|p| p.is_empty() || p.starts_with('.') || p.contains('/'))
            {
                anyhow::bail!("not a certificate copy's name: {name:?}");
            }
            if before.get(name) == Some(text) {
                continue;
            }
            create_dir(&dir, 0o700)?;
            create_dir(&dir.join(owner), 0o700)?;
            write_atomic(&dir.join(owner).join(file), text.as_bytes(), 0o600)?;
            changed.push(name.clone());
        }
        for name in before.keys().filter(|n| n.starts_with(prefix)) {
            if !copies.contains_key(name) {
                let rest = &name[prefix.len()..];
                let _ = fs::remove_file(dir.join(rest));
                if let Some((owner, _)) = rest.split_once('/') {
                    let _ = fs::remove_dir(dir.join(owner));
                }
                changed.push(name.clone());
            }
        }
        Ok(changed)
    }

    /// Reads the watched xDS files as they are on disk.
    pub fn read_xds(&self, proxy: &str) -> Result<BTreeMap<String, String>> {
        let dir = self.proxy(proxy).xds();
        let mut files = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(files);
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && entry.file_type()?.is_file() {
                files.insert(name, fs::read_to_string(entry.path())?);
            }
        }
        Ok(files)
    }

    /// Records a desired proxy under its spec hash, so that a later run can roll back to it.
    pub fn write_spec(&self, desired: &DesiredProxy) -> Result<()> {
        let dir = self.proxy(&desired.spec.proxy).root().join("specs");
        create_dir(&dir, 0o700)?;
        let path = dir.join(format!("{}.json", desired.hash));
        if !path.exists() {
            write_atomic(&path, &serde_json::to_vec_pretty(desired)?, 0o600)?;
        }
        Ok(())
    }

    /// The desired proxy recorded under a spec hash, if any.
    pub fn read_spec(&self, proxy: &str, hash: &str) -> Option<DesiredProxy> {
        let path = self
            .proxy(proxy)
            .root()
            .join("specs")
            .join(format!("{hash}.json"));
        serde_json::from_slice(&fs::read(path).ok()?).ok()
    }

    /// Removes recorded specs not in `keep`.
    pub fn prune_specs(&self, proxy: &str, keep: &[&str]) -> Result<()> {
        let dir = self.proxy(proxy).root().join("specs");
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(());
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let hash = name.trim_end_matches(".json");
            if !keep.contains(&hash) {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    /// Reads one generation's bootstrap, if it is on disk.
    pub fn read_generation(&self, proxy: &str, bootstrap_sha: &str) -> Option<String> {
        fs::read_to_string(
            self.proxy(proxy)
                .generation(bootstrap_sha)
                .join(BOOTSTRAP_FILE),
        )
        .ok()
    }

    /// Removes the run directories of containers that no longer exist.
    pub fn prune_run_dirs(&self, proxy: &str, live_containers: &[&str]) -> Result<()> {
        prune_children(&self.proxy(proxy).root().join("run"), live_containers)
    }

    /// Removes bootstrap generations not in `keep`.
    pub fn prune_generations(&self, proxy: &str, keep: &[&str]) -> Result<()> {
        prune_children(&self.proxy(proxy).generations(), keep)
    }

    /// Removes everything berth keeps for a proxy.
    pub fn remove_proxy(&self, proxy: &str) -> Result<()> {
        let root = self.proxy(proxy).root().to_path_buf();
        match fs::remove_dir_all(&root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", root.display()))
            }
            _ => Ok(()),
        }
    }

    /// Names of the proxies that have state on disk.
    pub fn proxies(&self) -> Result<Vec<String>> {
        let dir = self.root.join("proxies");
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Scratch directories `envoy --mode validate` runs on: `berth-validate-<pid>-<random>`.
pub const VALIDATION_DIR_PREFIX: &str = "berth-validate-";

/// A scratch directory for one validation under `root`, named with this process's pid so
/// that a sweep by another berth process leaves it alone while this one lives.
pub fn validation_scratch_dir(root: &Path) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("{VALIDATION_DIR_PREFIX}{}-", std::process::id()))
        .tempdir_in(root)
        .with_context(|| format!("cannot create a validation directory in {}", root.display()))
}

/// How old a scratch directory without an owner pid (made by a berth before pids were part of
/// the name) must be before a sweep takes it for a dead process's.
const UNOWNED_SCRATCH_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes what dead processes left, `depth` levels down: temp files of writes interrupted
/// before their rename, and validation scratch directories. Each carries its writer's pid;
/// a living writer's are left alone (`berth validate` or a serve working beside this process).
fn sweep_leftover_temps(dir: &Path, depth: u32) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() && name.starts_with(VALIDATION_DIR_PREFIX) {
            if scratch_is_dead(&name, &path) {
                fs::remove_dir_all(&path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            }
        } else if kind.is_file() && is_leftover_temp(&name) {
            fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        } else if kind.is_dir() && depth > 0 && name != "run" {
            sweep_leftover_temps(&path, depth - 1)?;
        }
    }
    Ok(())
}

fn scratch_is_dead(name: &str, path: &Path) -> bool {
    let owner = name[VALIDATION_DIR_PREFIX.len()..]
        .split_once('-')
        .and_then(|(pid, _)| pid.parse::<u32>().ok());
    match owner {
        Some(pid) => !crate::state::lock::process_alive(pid),
        None => fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > UNOWNED_SCRATCH_AGE),
    }
}

/// A temp file of [`write_atomic`] (`.<name>.tmp<pid>`) whose writer is gone.
fn is_leftover_temp(name: &str) -> bool {
    if !name.starts_with('.') {
        return false;
    }
    let Some((_, pid)) = name.rsplit_once(".tmp") else {
        return false;
    };
    match pid.parse::<u32>() {
        Ok(pid) => !crate::state::lock::process_alive(pid),
        Err(_) => false,
    }
}

fn prune_children(dir: &Path, keep: &[&str]) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !keep.contains(&name.as_str()) {
            fs::remove_dir_all(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    Ok(())
}

pub fn create_dir(dir: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// Writes `content` to `path` so that readers see either the old or the new file, never a
/// part: a temp file in the same directory, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, content: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{file_name}.tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(content)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        crate::core::crashpoint::reached("mid-state-write");
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("cannot write {}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xds_writes_only_changed_files_and_removes_stale_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open(tmp.path()).unwrap();
        let mut files = BTreeMap::from([
            ("lds.yaml".to_string(), "a".to_string()),
            ("cds.yaml".to_string(), "b".to_string()),
        ]);
        assert_eq!(state.write_xds("p", &files).unwrap().len(), 2);
        assert!(state.write_xds("p", &files).unwrap().is_empty());
        files.insert("cds.yaml".into(), "c".into());
        files.remove("lds.yaml");
        let changed = state.write_xds("p", &files).unwrap();
        assert_eq!(
            changed,
            vec!["cds.yaml".to_string(), "lds.yaml".to_string()]
        );
        assert_eq!(state.read_xds("p").unwrap(), files);
        let mode = fs::metadata(tmp.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn opening_sweeps_temp_files_a_crash_left() {
        let tmp = tempfile::tempdir().unwrap();
        let gen = tmp.path().join("proxies/p/generations/abc");
        fs::create_dir_all(&gen).unwrap();
        fs::write(gen.join(".bootstrap.yaml.tmp2147483601"), "half").unwrap();
        fs::write(gen.join("bootstrap.yaml"), "whole").unwrap();
        StateDir::open(tmp.path()).unwrap();
        assert!(!gen.join(".bootstrap.yaml.tmp2147483601").exists());
        assert!(gen.join("bootstrap.yaml").exists());
    }

    #[test]
    fn a_sweep_leaves_a_living_processes_scratch_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let mine = validation_scratch_dir(tmp.path()).unwrap();
        let dead = tmp
            .path()
            .join(format!("{VALIDATION_DIR_PREFIX}2147483600-abc"));
        fs::create_dir(&dead).unwrap();
        let xds = tmp.path().join("proxies/p/xds");
        fs::create_dir_all(&xds).unwrap();
        let live_temp = xds.join(format!(".lds.yaml.tmp{}", std::process::id()));
        fs::write(&live_temp, "being written").unwrap();
        StateDir::open(tmp.path()).unwrap();
        assert!(mine.path().exists(), "this process's scratch stays");
        assert!(live_temp.exists(), "this process's temp file stays");
        assert!(!dead.exists(), "a dead process's scratch goes");
    }

    #[test]
    fn generations_are_kept_apart_and_pruned() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open(tmp.path()).unwrap();
        state.write_generation("p", "aaa", "one").unwrap();
        state.write_generation("p", "bbb", "two").unwrap();
        assert_eq!(state.read_generation("p", "aaa").as_deref(), Some("one"));
        state.prune_generations("p", &["bbb"]).unwrap();
        assert_eq!(state.read_generation("p", "aaa"), None);
        assert_eq!(state.read_generation("p", "bbb").as_deref(), Some("two"));
        assert_eq!(state.proxies().unwrap(), vec!["p".to_string()]);
        state.remove_proxy("p").unwrap();
        assert!(state.proxies().unwrap().is_empty());
    }
}
