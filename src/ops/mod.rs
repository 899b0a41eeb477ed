//! Layer ops: the use cases, and [`acme`] issuance. May use: core, envoy, host, state, status,
//! and the infrastructure seam (infra's mod.rs), never an implementation.
//!
//! The one place a use case is orchestrated. `up`, `down`, `validate`, `diff`, `status`, serve's
//! reconciler and Envoy Gateway's remote provider all call these; none re-implements a step.
//! Whatever `up` guarantees (the host prepared before any replica starts, validation, drain
//! with each proxy's own settings, readiness by the one probe), `serve` guarantees.

pub mod acme;
pub mod liveness;

pub use crate::core::policy::HostPolicy;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::core::plan::Plan;
use crate::core::progress::Reporter;
use crate::core::target::Target;
use crate::infra::ReplicaStatus;
use crate::infra::{ConvergeError, ConvergeRequest, Converged, HostPreparation, Infrastructure};

/// Proxies `up` converges at once.
const PROXIES_AT_ONCE: usize = 16;

/// How fresh the image IDs of proxies with pull policy "always" must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagCheck {
    /// Ask the registry: pull.
    Registry,
    /// What the tag names locally (pulled only when absent).
    Local,
}

/// What `up` did.
#[derive(Debug, Default)]
pub struct UpReport {
    pub host: HostPreparation,
    pub converged: Vec<(String, Converged)>,
    /// Proxies no longer wanted that were removed, with their replica counts.
    pub removed: Vec<(String, usize)>,
}

/// The operations, over one infrastructure.
#[derive(Clone)]
pub struct Operations {
    pub infra: Arc<dyn Infrastructure>,
}

impl Operations {
    pub fn new(infra: Arc<dyn Infrastructure>) -> Operations {
        Operations { infra }
    }

    /// Brings the host to what the whole fleet needs before any replica starts (sysctls,
    /// limits), and refuses, with numbers and the fix, what it cannot hold. Every entry point
    /// that can start or replace a replica calls this first.
    pub async fn prepare_host(
        &self,
        fleet: &[Target],
        policy: HostPolicy,
    ) -> Result<HostPreparation, ConvergeError> {
        self.infra.prepare(fleet, policy).await
    }

    /// Converges one proxy (the host is prepared by the caller, once for the fleet).
    pub async fn converge(&self, request: ConvergeRequest<'_>) -> Result<Converged, ConvergeError> {
        self.infra.converge(request).await
    }

    /// Pins every target whose pull policy is "always" to the image ID its tag names
    /// ([`crate::core::replica::DesiredProxy::pin_image`]): with [`TagCheck::Registry`] each image is
    /// pulled first (once, however many proxies share it), so a tag that moved is a new spec.
    /// A pull that fails is the answer: nothing has been changed yet.
    pub async fn pin_images(
        &self,
        targets: &mut [Target],
        check: TagCheck,
        reporter: &Reporter,
    ) -> Result<(), ConvergeError> {
        let mut ids: std::collections::BTreeMap<String, Option<String>> = Default::default();
        for t in targets.iter_mut() {
            if t.proxy.config.pull != crate::core::ir::PullPolicy::Always {
                continue;
            }
            let image = t.desired.spec.image.clone();
            let id = match ids.get(&image) {
                Some(id) => id.clone(),
                None => {
                    reporter.waiting(format!("{}: pulling {image}", t.name()));
                    let pull = check == TagCheck::Registry;
                    let id = self.infra.resolve_image(&image, pull, reporter).await?;
                    if let (true, Some(id)) = (pull, &id) {
                        reporter.event(
                            crate::core::progress::Event::new(t.name(), "pulled").message(format!(
                                "{image} is {}",
                                crate::core::plan::short_image_id(id)
                            )),
                        );
                    }
                    ids.insert(image, id.clone());
                    id
                }
            };
            if let Some(id) = id {
                t.desired.pin_image(&id);
            }
        }
        Ok(())
    }

    /// `up`: pull the images whose policy is "always", prepare the host, converge every target
    /// in turn (the first failure stops), then drain and remove the proxies this berth owns
    /// that are no longer wanted.
    pub async fn up(
        &self,
        targets: &[Target],
        policy: HostPolicy,
        confirm_timeout: Duration,
        reporter: &Reporter,
    ) -> Result<UpReport, ConvergeError> {
        let mut pinned = targets.to_vec();
        self.pin_images(&mut pinned, TagCheck::Registry, reporter)
            .await?;
        let targets = pinned.as_slice();
        let mut report = UpReport {
            host: self.prepare_host(targets, policy).await?,
            ..Default::default()
        };
        tracing::debug!(target: "berth::phase", "host prepared");
        for note in &report.host.notes {
            reporter.event(crate::core::progress::Event::new("berth", "host").message(note));
        }
        // Proxies are independent: converge them side by side (each one replica at a time).
        let results: Vec<(String, Result<Converged, ConvergeError>)> =
            futures_util::stream::iter(targets.iter().map(|target| async move {
                let result = self
                    .converge(ConvergeRequest {
                        target,
                        generation: None,
                        hold_files: false,
                        confirm_timeout,
                        reporter,
                        cancel: CancellationToken::new(),
                    })
                    .await;
                (target.name().to_string(), result)
            }))
            .buffer_unordered(PROXIES_AT_ONCE)
            .collect()
            .await;
        let mut failures = Vec::new();
        for (name, result) in results {
            match result {
                Ok(c) => report.converged.push((name, c)),
                Err(e) => failures.push((name, e)),
            }
        }
        report.converged.sort_by(|a, b| a.0.cmp(&b.0));
        failures.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some((_, first)) = failures.into_iter().next() {
            // Every proxy was tried; the first failure (by name) is the answer, the others
            // were reported as they happened.
            return Err(first);
        }
        let wanted: BTreeSet<&str> = targets.iter().map(|t| t.name()).collect();
        for gone in self.infra.owned().await? {
            if !wanted.contains(gone.as_str()) {
                let n = self.remove(&gone, reporter).await?;
                report.removed.push((gone, n));
            }
        }
        Ok(report)
    }

    /// Drains and removes one proxy, each replica with the drain settings of the spec it runs.
    pub async fn remove(&self, proxy: &str, reporter: &Reporter) -> Result<usize, ConvergeError> {
        self.infra.remove(proxy, reporter).await
    }

    /// After `down`: the images berth built that nothing uses any more, removed.
    pub async fn prune_images(&self, reporter: &Reporter) -> Result<Vec<String>, ConvergeError> {
        self.infra.prune_images(reporter).await
    }

    /// The proxies this berth owns (replicas or state).
    pub async fn owned(&self) -> Result<BTreeSet<String>, ConvergeError> {
        self.infra.owned().await
    }

    /// Runs the real Envoy's check on every target; nothing is changed.
    pub async fn validate(
        &self,
        targets: &[Target],
        reporter: &Reporter,
    ) -> Result<(), ConvergeError> {
        for t in targets {
            self.infra.validate(t, reporter).await?;
        }
        Ok(())
    }

    /// What `up` would do. Images whose pull policy is "always" are pulled first, as `up`
    /// would (a pull changes no replica), so a tag that moved shows as replacements and a
    /// note, old image ID -> new.
    pub async fn diff(
        &self,
        targets: &[Target],
        reporter: &Reporter,
    ) -> Result<Plan, ConvergeError> {
        let mut pinned = targets.to_vec();
        self.pin_images(&mut pinned, TagCheck::Registry, reporter)
            .await?;
        self.infra.diff(&pinned).await
    }

    /// One row per replica of `proxies`.
    pub async fn status(
        &self,
        proxies: &BTreeSet<String>,
    ) -> Result<Vec<ReplicaStatus>, ConvergeError> {
        self.infra.status(proxies).await
    }
}
