//! Before replicas change: validation by the real Envoy, TLS copies, and the files replicas
//! read (bootstrap generations, recorded specs, live-updated watched files).

use super::*;

impl Rollout<'_> {
    /// Runs `envoy --mode validate` on the target's bootstrap and resources in a throw-away
    /// container of its image.
    pub async fn validate_target(&self, target: &Target) -> Result<()> {
        let name = target.name();
        self.copy_tls(target)?;
        self.reporter
            .waiting(format!("{name}: envoy --mode validate"));
        let dir = crate::state::validation_scratch_dir(self.state.root())?;
        let bootstrap = render::validation_bootstrap(&target.rendered)?;
        let path = dir.path().join(crate::layout::BOOTSTRAP_FILE);
        crate::state::write_atomic(&path, bootstrap.as_bytes(), 0o644)?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let mut mounts: Vec<replica::Mount> = target
            .desired
            .spec
            .mounts
            .iter()
            // The validation bootstrap inlines the watched files, so only TLS is mounted.
            .filter(|m| {
                m.target != crate::layout::CONTAINER_BOOTSTRAP_DIR
                    && m.target != crate::layout::CONTAINER_XDS_DIR
            })
            .cloned()
            .collect();
        mounts.push(replica::Mount {
            source: dir.path().to_path_buf(),
            target: crate::layout::CONTAINER_BOOTSTRAP_DIR.to_string(),
            read_only: true,
        });
        self.engine
            .validate_with_args(
                &target.desired.spec.image,
                &mounts,
                &replica::validation_args(&target.desired.spec),
                &self.extra_labels,
            )
            .await
            .with_context(|| {
                format!(
                    "envoy --mode validate rejected the new config of proxy {name} (image {}); no replica was changed",
                    target.desired.spec.image
                )
            })?;
        self.reporter
            .event(Event::new(name, "validated").message(&target.desired.spec.image));
        Ok(())
    }

    /// Copies the TLS files the replicas (and validation) mount.
    pub(super) fn copy_tls(&self, target: &Target) -> Result<()> {
        let name = target.name();
        let tls = self
            .state
            .write_tls(name, &replica::tls_files(&target.proxy))?;
        if !tls.is_empty() {
            self.reporter
                .event(Event::new(name, "files").message(format!("copied {}", tls.join(", "))));
        }
        Ok(())
    }

    pub(super) async fn write_files(
        &self,
        target: &Target,
        observed: &[ObservedContainer],
    ) -> Result<()> {
        let name = target.name();
        self.state.write_spec(&target.desired)?;
        self.state.write_generation(
            name,
            &target.desired.spec.bootstrap_sha256,
            &target.rendered.bootstrap,
        )?;
        let on_disk = self.state.read_xds(name)?;
        let files = if delivery::generation_of(&target.rendered.xds).is_some() {
            // `berth serve` stamps its own generations.
            target.rendered.xds.clone()
        } else if delivery::unstamp(&on_disk) == target.rendered.xds {
            on_disk.clone()
        } else {
            let next = delivery::generation_of(&on_disk).unwrap_or(0) + 1;
            delivery::stamp(&target.rendered.xds, next)
        };
        if files == on_disk {
            return Ok(());
        }
        // Routes, clusters and backends change live: every running replica must confirm the
        // new files, or the previous ones come back and nothing else is changed.
        let mut replicas = delivery::replicas(self.state, name, observed);
        if delivery::subscriptions(&files).is_empty() {
            // xds mode: only SDS files here, which Envoy Gateway's config does not version.
            replicas.clear();
        }
        let written = if replicas.is_empty() {
            self.state.write_xds(name, &files)?
        } else {
            self.reporter.waiting(format!(
                "{name}: {} replica(s) confirming the new files",
                replicas.len()
            ));
            let outcome = delivery::update(
                self.state,
                name,
                &files,
                &replicas,
                delivery::DEFAULT_CONFIRM_TIMEOUT,
            )
            .await
            .with_context(|| format!("live update of proxy {name}'s routes, clusters and backends; the previous files are back and no replica was changed"))?;
            outcome.written
        };
        if !written.is_empty() {
            self.reporter
                .event(Event::new(name, "files").message(format!(
                    "wrote {}{}",
                    written.join(", "),
                    if replicas.is_empty() {
                        String::new()
                    } else {
                        format!("; confirmed by {} replica(s)", replicas.len())
                    }
                )));
        }
        Ok(())
    }
}
