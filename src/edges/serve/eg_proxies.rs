//! Envoy Gateway's remote infrastructure provider as a component of `berth serve`.
//!
//! A `CreateOrUpdateProxyInfra` puts the proxy in serve's desired set (next to the config's
//! proxies, in a map of its own so config reloads leave it alone), persists its IR in
//! `<state>/remote/<berth name>.json` (a restarted serve keeps it), and triggers the same
//! reconcile as a config edit: one pass per proxy at a time, through [`crate::ops`]. The
//! call returns when a pass that saw the request has ended, with its error if it failed. The
//! same request twice yields the same generation and an empty plan: nothing is touched.
//! `DeleteProxyInfra` drops the proxy from the desired set and its persisted IR; the reconcile
//! then drains and removes its replicas and state.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

use super::{log, Shared, Trigger};
use crate::core::source::eg::{EgProxy, XdsDefaults};
use crate::core::target::{self, Target};
use crate::edges::eg_provider::{Infrastructure, Invalid, Transient};
use crate::state::{write_atomic, StateDir};

/// A proxy Envoy Gateway asked for, and what berth made of it.
#[derive(Debug, Clone)]
pub struct Managed {
    pub eg: EgProxy,
    pub target: Target,
}

/// Where a remote-managed proxy's IR is persisted.
pub fn persisted_path(state: &StateDir, berth_name: &str) -> PathBuf {
    state
        .root()
        .join("remote")
        .join(format!("{berth_name}.json"))
}

fn persist(state: &StateDir, eg: &EgProxy) -> Result<()> {
    let path = persisted_path(state, &eg.proxy.name);
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    write_atomic(&path, &serde_json::to_vec_pretty(eg)?, 0o600)
}

fn forget(state: &StateDir, berth_name: &str) -> Result<()> {
    let path = persisted_path(state, berth_name);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => Ok(()),
    }
}

fn render(shared: &Shared, eg: &EgProxy) -> Result<Target> {
    let infra = crate::core::ir::Infra {
        proxies: vec![eg.proxy.clone()],
    };
    let mut targets = target::targets(
        &infra,
        &super::renderer(&shared.opts)?,
        shared.state.root(),
        target::host_cpus(),
        crate::ops::acme::Placeholders::Write,
    )?;
    targets.pop().context("rendering produced no target")
}

/// Loads the proxies an earlier serve was asked for (`<state>/remote/*.json`) into the remote
/// map. Their xDS server becomes the config's current one (`xds`), when there is one.
pub fn restore(shared: &Shared, xds: Option<&XdsDefaults>) -> Result<()> {
    let dir = shared.state.root().join("remote");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let mut restored = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let parsed = std::fs::read(&path)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(serde_json::from_slice::<EgProxy>(&b)?));
        let mut eg = match parsed {
            Ok(eg) => eg,
            Err(e) => {
                log(
                    shared.opts.mode,
                    &format!("ignoring {}: {e:#}", path.display()),
                );
                continue;
            }
        };
        if let Some(xds) = xds {
            eg.proxy.routing = crate::core::ir::Routing::Xds(xds.server());
        }
        match render(shared, &eg) {
            Ok(target) => {
                restored.push(eg.proxy.name.clone());
                shared
                    .remote
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(eg.proxy.name.clone(), Managed { eg, target });
            }
            Err(e) => log(
                shared.opts.mode,
                &format!("cannot render {}: {e:#}", path.display()),
            ),
        }
    }
    if !restored.is_empty() {
        log(
            shared.opts.mode,
            &format!(
                "restored {} proxies from Envoy Gateway: {}",
                restored.len(),
                restored.join(", ")
            ),
        );
    }
    Ok(())
}

/// [`Infrastructure`] for `berth serve`.
pub struct Provider {
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl Provider {
    pub fn new(shared: Arc<Shared>, cancel: CancellationToken) -> Self {
        Provider { shared, cancel }
    }

    /// Refuses a proxy whose name or a host port another proxy of this serve has.
    fn check_clash(&self, target: &Target) -> Result<()> {
        let name = target.name();
        if self
            .shared
            .config_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
        {
            return Err(anyhow::Error::new(Invalid(anyhow::anyhow!(
                "infra.proxy.name: berth proxy {name:?} is defined in the config {}; it cannot also be managed by Envoy Gateway",
                self.shared.opts.config.display()
            ))));
        }
        let mine = target.proxy.host_ports();
        let others = self
            .shared
            .desired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .targets
            .values()
            .filter(|t| t.name() != name)
            .flat_map(|t| {
                t.proxy
                    .host_ports()
                    .into_iter()
                    .map(|p| (p, t.name().to_string()))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>();
        if let Some((port, other)) = others.iter().find(|(p, _)| mine.contains(p)) {
            return Err(anyhow::Error::new(Invalid(anyhow::anyhow!(
                "infra.proxy.listeners: port {port} is already used by proxy {other:?} on this host; each listener needs its own port"
            ))));
        }
        Ok(())
    }

    /// Triggers a pass of `name` and waits for one that saw `epoch`.
    async fn converge(&self, name: &str, epoch: u64) -> Result<()> {
        self.shared
            .trigger(Trigger::Proxy(name.to_string(), "remote"));
        match self.shared.wait_pass(name, epoch, &self.cancel).await {
            None => Ok(()),
            Some((msg, true)) => Err(anyhow::Error::new(Transient(anyhow::anyhow!(msg)))),
            Some((msg, false)) => Err(anyhow::anyhow!(msg)),
        }
    }
}

#[tonic::async_trait]
impl Infrastructure for Provider {
    async fn create_or_update(&self, eg: EgProxy) -> Result<()> {
        let name = eg.proxy.name.clone();
        let target = render(&self.shared, &eg).context("rendering the proxy")?;
        self.check_clash(&target)?;
        persist(&self.shared.state, &eg)
            .map_err(|e| anyhow::Error::new(Transient(e.context("persisting the request"))))?;
        super::create_proxy_dir(&self.shared.state, &name)
            .map_err(|e| anyhow::Error::new(Transient(e)))?;
        self.shared
            .remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone(), Managed { eg, target });
        let (_, epoch) = self.shared.publish(Some(&name));
        self.converge(&name, epoch).await
    }

    async fn delete(&self, eg_name: &str, berth_name: &str) -> Result<()> {
        if self
            .shared
            .config_targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(berth_name)
        {
            return Err(anyhow::Error::new(Invalid(anyhow::anyhow!(
                "infra.proxy.name: {eg_name:?} is berth proxy {berth_name:?}, which the config {} defines; berth leaves it to the config",
                self.shared.opts.config.display()
            ))));
        }
        forget(&self.shared.state, berth_name).map_err(|e| anyhow::Error::new(Transient(e)))?;
        self.shared
            .remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(berth_name);
        let (_, epoch) = self.shared.publish(Some(berth_name));
        // Nothing on this host: nothing to remove (a delete is idempotent too).
        if !self
            .shared
            .state
            .proxies()
            .unwrap_or_default()
            .iter()
            .any(|p| p == berth_name)
        {
            return Ok(());
        }
        self.converge(berth_name, epoch).await
    }
}
