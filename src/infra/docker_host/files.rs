//! Before replicas change: validation by the real Envoy, TLS copies, the files replicas read
//! (bootstrap generations, recorded specs, live-delivered watched files) and the host
//! directories a replica's bind mounts need.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::execute::Run;
use crate::core::layout;
use crate::core::progress::Event;
use crate::core::render;
use crate::core::replica::{self, Mount, ReplicaContainer};
use crate::core::target::Target;
use crate::engine::{Hardening, ObservedContainer, OneShot};
use crate::infra::delivery;
use crate::infra::{ConvergeError, Delivery};

/// How long `envoy --mode validate` may take before it is abandoned.
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Label on validation containers, so a leftover one can be recognised.
pub const LABEL_VALIDATE: &str = "io.berth.validate";

impl Run<'_> {
    /// Runs `envoy --mode validate` on the target's bootstrap and resources in a throw-away
    /// container of its image, with the arguments its replicas run with.
    pub(super) async fn validate_target(&self, target: &Target) -> Result<(), ConvergeError> {
        let name = target.name();
        self.copy_tls(target)?;
        self.reporter
            .waiting(format!("{name}: envoy --mode validate"));
        let dir = crate::state::validation_scratch_dir(self.state.root())?;
        let bootstrap = render::validation_bootstrap(&target.rendered)?;
        let path = dir.path().join(layout::BOOTSTRAP_FILE);
        crate::state::write_atomic(&path, bootstrap.as_bytes(), 0o644)?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .context("making the validation directory readable")?;
        let spec = &target.desired.spec;
        let mut mounts: Vec<Mount> = spec
            .mounts
            .iter()
            // The validation bootstrap inlines the watched files, so only TLS is mounted.
            .filter(|m| {
                m.target != layout::CONTAINER_BOOTSTRAP_DIR && m.target != layout::CONTAINER_XDS_DIR
            })
            .cloned()
            .collect();
        mounts.push(Mount {
            source: dir.path().to_path_buf(),
            target: layout::CONTAINER_BOOTSTRAP_DIR.to_string(),
            read_only: true,
        });
        for m in &mounts {
            check_readable_by(&m.source, spec.user.uid, spec.user.gid)?;
        }
        let mut labels = self.extra_labels.clone();
        labels.insert(LABEL_VALIDATE.into(), "1".into());
        let job = OneShot {
            image: spec.image.clone(),
            args: ["--mode".to_string(), "validate".to_string()]
                .into_iter()
                .chain(replica::validation_args(spec))
                .collect(),
            mounts,
            labels,
            hardening: Hardening {
                cap_add: Vec::new(),
                ..replica::hardening(spec)
            },
            timeout: VALIDATE_TIMEOUT,
        };
        let exited = self.engine.run_to_completion(&job).await?;
        if exited.code != 0 {
            let mut why = crate::envoy::log::why(&exited.output);
            if why.is_empty() {
                why = exited
                    .output
                    .lines()
                    .rev()
                    .take(20)
                    .map(str::to_string)
                    .collect();
                why.reverse();
            }
            return Err(ConvergeError::Rejected {
                proxy: name.to_string(),
                image: spec.image.clone(),
                why: format!("exit code {}:\n{}", exited.code, why.join("\n")),
            });
        }
        self.reporter
            .event(Event::new(name, "validated").message(&spec.image));
        Ok(())
    }

    /// Copies the TLS files the replicas (and validation) mount.
    pub(super) fn copy_tls(&self, target: &Target) -> Result<()> {
        let name = target.name();
        let tls = match target.proxy.routing {
            crate::core::ir::Routing::Xds(_) => self
                .state
                .write_tls(name, &replica::tls_files(&target.proxy))?,
            crate::core::ir::Routing::Standalone(_) => {
                // Keep the copies the watched files on disk name: replicas serve them until
                // the new secrets are delivered (or come back when they are refused). Keep the
                // target's own too: TLS-ALPN-01 challenge certificates share their listener's
                // directory.
                let on_disk = self.state.read_xds(name)?;
                let keep = |file: &str| {
                    on_disk.values().any(|text| text.contains(file))
                        || target
                            .certificates
                            .iter()
                            .any(|c| c.cert_name() == file || c.key_name() == file)
                };
                let mut written = Vec::new();
                for cert in &target.certificates {
                    written.extend(self.state.write_certificate(name, cert, &keep)?);
                }
                for b in &target.backend_tls {
                    written.extend(self.state.write_tls_copies(
                        name,
                        &b.owner(),
                        &b.copies(),
                        &keep,
                    )?);
                }
                written
            }
        };
        if !tls.is_empty() {
            self.reporter
                .event(Event::new(name, "files").message(format!("copied {}", tls.join(", "))));
        }
        Ok(())
    }

    /// Records the desired spec (for rollbacks and drains) and writes its bootstrap
    /// generation (rewriting a tampered one).
    pub(super) async fn write_generation(&self, target: &Target) -> Result<()> {
        let state = self.state.clone();
        let desired = target.desired.clone();
        let bootstrap = target.rendered.bootstrap.clone();
        let name = target.name().to_string();
        blocking(move || {
            state.write_spec(&desired)?;
            state.write_generation(&name, &desired.spec.bootstrap_sha256, &bootstrap)
        })
        .await
    }

    /// Routes, clusters, listeners and secrets change live: every running replica must confirm
    /// the new watched files, or the previous ones come back.
    pub(super) async fn deliver(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
        generation: Option<u64>,
        confirm_timeout: Duration,
    ) -> Result<Delivery, ConvergeError> {
        let name = target.name();
        let on_disk = self.state.read_xds(name)?;
        let files = match generation {
            Some(g) => delivery::stamp(&target.rendered.xds, g),
            None if delivery::unstamp(&on_disk) == target.rendered.xds => on_disk.clone(),
            None => {
                let next = delivery::generation_of(&on_disk).unwrap_or(0) + 1;
                delivery::stamp(&target.rendered.xds, next)
            }
        };
        if files == on_disk {
            return Ok(Delivery::Unchanged);
        }
        let mut replicas: Vec<delivery::Replica> = observed
            .iter()
            .filter(|c| c.state == crate::engine::RunState::Running)
            .map(|c| delivery::Replica {
                name: c.name.clone(),
                admin: self.admins.connect(
                    &self
                        .state
                        .proxy(name)
                        .admin_socket(c.recorded_name().unwrap_or(&c.name)),
                    delivery::ADMIN_TIMEOUT,
                ),
            })
            .collect();
        if delivery::subscriptions(&files).is_empty() {
            // xDS mode: only SDS files here, which Envoy Gateway's config does not version.
            replicas.clear();
        }
        if replicas.is_empty() {
            let (state, proxy) = (self.state.clone(), name.to_string());
            let written = blocking(move || state.write_xds(&proxy, &files)).await?;
            if !written.is_empty() {
                self.reporter.event(
                    Event::new(name, "files").message(format!("wrote {}", written.join(", "))),
                );
            }
            return Ok(Delivery::Written { files: written });
        }
        self.reporter.waiting(format!(
            "{name}: {} replica(s) confirming the new files",
            replicas.len()
        ));
        let serials: Vec<String> = target
            .certificates
            .iter()
            .map(|c| c.serial.clone())
            .chain(target.backend_tls.iter().flat_map(|b| b.serials()))
            .collect();
        match delivery::update(
            self.state,
            name,
            &files,
            &replicas,
            &serials,
            confirm_timeout,
        )
        .await
        {
            Ok(outcome) => {
                self.reporter
                    .event(Event::new(name, "files").message(format!(
                        "wrote {}; confirmed by {} replica(s)",
                        outcome.written.join(", "),
                        replicas.len()
                    )));
                Ok(Delivery::Confirmed {
                    files: outcome.written,
                    replicas: replicas.len(),
                    elapsed: outcome.elapsed,
                })
            }
            Err(delivery::UpdateError::Rejected(r)) => {
                self.reporter
                    .event(Event::new(name, "files-rejected").message(r.to_string()));
                Ok(Delivery::Failed(r))
            }
            Err(delivery::UpdateError::Io(e)) => Err(ConvergeError::State(e)),
        }
    }

    /// The host side of a replica's mounts: its own admin-socket directory, owned by the
    /// replica's user, mode 0700 (Envoy, non-root on a read-only root filesystem, creates its
    /// socket there, and nobody else can reach it); every read-only source readable by it.
    pub(super) fn prepare_host_dirs(&self, replica: &ReplicaContainer) -> Result<()> {
        let user = replica.hardening.user;
        if let Some(dir) = replica
            .mounts
            .iter()
            .find(|m| m.target == layout::CONTAINER_RUN_DIR)
            .map(|m| m.source.clone())
        {
            let sock = dir.join(layout::ADMIN_SOCKET_FILE);
            if sock.as_os_str().len() > layout::MAX_SOCKET_PATH {
                bail!(
                    "the admin socket path {} is {} bytes, longer than Unix sockets allow \
                     ({}); use a shorter state directory",
                    sock.display(),
                    sock.as_os_str().len(),
                    layout::MAX_SOCKET_PATH
                );
            }
            prepare_run_dir(&dir, user.uid, user.gid)?;
            // A socket file left by an earlier container of the same name is stale: the name
            // was free, so no live replica owns it.
            let _ = std::fs::remove_file(&sock);
        }
        for m in replica.mounts.iter().filter(|m| m.read_only) {
            check_readable_by(&m.source, user.uid, user.gid)?;
        }
        Ok(())
    }
}

/// Runs file writes (each synced to disk) on the blocking pool. The proxies of one `up`
/// converge side by side in one task: written in place, their syncs would queue one behind
/// the other (about a hundred for ten fresh proxies, before the first container is created);
/// on the pool they are in flight together and the filesystem commits them together.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("a state-directory write did not finish")?
}

/// Creates a replica's run directory: owned by `uid:gid`, mode 0700.
fn prepare_run_dir(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the replica run directory {}", dir.display()))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).with_context(|| {
        format!(
            "handing the run directory {} to uid {uid} (Envoy creates its admin socket there); \
             berth must run as root to do this",
            dir.display()
        )
    })?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("setting mode 0700 on {}", dir.display()))?;
    Ok(())
}

/// Envoy runs as `uid`: a mounted directory must be searchable and readable by it, and the
/// files directly in it readable, or Envoy fails later with a vague "unable to read file".
/// (The directories above a mount source do not matter: the engine resolves them as root.)
pub fn check_readable_by(source: &Path, uid: u32, gid: u32) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let allowed = |md: &std::fs::Metadata, need: u32| {
        let mode = md.mode();
        (mode & need) == need
            || (md.uid() == uid && (mode & (need << 6)) == need << 6)
            || (md.gid() == gid && (mode & (need << 3)) == need << 3)
    };
    let md =
        std::fs::metadata(source).with_context(|| format!("mount source {}", source.display()))?;
    let hint = format!(
        "Envoy runs as uid {uid}: make mounted directories 0755 and files 0644 (files written \
         through a temporary file are 0600 unless chmod-ed before the rename)"
    );
    if md.is_dir() {
        if !allowed(&md, 0o5) {
            bail!(
                "mount source {} (mode {:o}) is not readable by uid {uid}; {hint}",
                source.display(),
                md.mode() & 0o7777
            );
        }
        for entry in std::fs::read_dir(source)
            .with_context(|| format!("reading {}", source.display()))?
            .flatten()
        {
            let Ok(fmd) = entry.metadata() else { continue };
            let need = if fmd.is_dir() { 0o5 } else { 0o4 };
            if (fmd.is_file() || fmd.is_dir()) && !allowed(&fmd, need) {
                bail!(
                    "{} (mode {:o}) is not readable by uid {uid}; {hint}",
                    entry.path().display(),
                    fmd.mode() & 0o7777
                );
            }
        }
    } else if !allowed(&md, 0o4) {
        bail!(
            "mount source {} (mode {:o}) is not readable by uid {uid}; {hint}",
            source.display(),
            md.mode() & 0o7777
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_sources_must_be_readable_by_the_replica_user() {
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let check = |p: &Path| check_readable_by(p, 101, 101);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bootstrap.yaml");
        std::fs::write(&file, "x").unwrap();
        set(dir.path(), 0o755);
        set(&file, 0o644);
        check(dir.path()).unwrap();
        check(&file).unwrap();
        set(&file, 0o600);
        let err = check(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("bootstrap.yaml") && err.contains("600"),
            "{err}"
        );
        set(&file, 0o644);
        set(dir.path(), 0o700);
        let err = check(dir.path()).unwrap_err().to_string();
        assert!(err.contains("700"), "{err}");
        assert!(check(&dir.path().join("missing")).is_err());
    }
}
