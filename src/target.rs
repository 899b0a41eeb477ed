//! From a config to what each proxy should be: render its files and derive its container spec.

use std::path::Path;

use anyhow::{Context, Result};

use crate::backend_tls::{self, BackendTlsFiles};
use crate::certificates::{self, Certificate};
use crate::ir::{Infra, ProxyInfra};
use crate::render::{Rendered, Renderer};
use crate::replica::{self, DesiredProxy};

/// One proxy as it should be, with the files its replicas read.
#[derive(Debug, Clone)]
pub struct Target {
    pub proxy: ProxyInfra,
    pub desired: DesiredProxy,
    pub rendered: Rendered,
    /// The listener certificates, checked; their copies are what the rendered secrets name.
    pub certificates: Vec<Certificate>,
    /// The backends' TLS files (CA, client certificate), checked likewise.
    pub backend_tls: Vec<BackendTlsFiles>,
}

impl Target {
    pub fn name(&self) -> &str {
        &self.proxy.name
    }
}

/// Renders every proxy of `infra` and derives its spec. Pure apart from reading templates and
/// the listener certificates and backend TLS files (which are checked here, so a bad one
/// changes nothing), and from the placeholder an ACME listener gets before its first
/// certificate ([`crate::acme::locate`]).
pub fn targets(
    infra: &Infra,
    renderer: &Renderer,
    state_dir: &Path,
    host_cpus: u32,
) -> Result<Vec<Target>> {
    infra
        .proxies
        .iter()
        .map(|proxy| {
            let now = std::time::SystemTime::now();
            let mut proxy = proxy.clone();
            crate::acme::locate(&mut proxy, state_dir, now)?;
            let proxy = &proxy;
            let certificates = certificates::load(proxy, now)
                .with_context(|| format!("proxy {}: listener certificates", proxy.name))?;
            let backend_tls = backend_tls::load(proxy, now)
                .with_context(|| format!("proxy {}: backend TLS files", proxy.name))?;
            let versions = certificates
                .iter()
                .map(|c| (c.secret.clone(), c.version.clone()))
                .chain(backend_tls.iter().map(|b| (b.owner(), b.version.clone())))
                .collect();
            let rendered = renderer
                .render_with_certificates(proxy, &versions)
                .with_context(|| format!("rendering proxy {}", proxy.name))?;
            let desired = replica::desired_proxy(proxy, &rendered.bootstrap, state_dir, host_cpus);
            Ok(Target {
                proxy: proxy.clone(),
                desired,
                rendered,
                certificates,
                backend_tls,
            })
        })
        .collect()
}

/// The number of CPUs the host has online, for the default Envoy concurrency: the count
/// sysinfo gave (the `cpuN` lines of /proc/stat), from one sysconf call instead of reading
/// /proc/stat and /proc/cpuinfo.
pub fn host_cpus() -> u32 {
    // SAFETY: sysconf only reads system configuration.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(online).unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    /// The default concurrency is part of every replica's spec: a different count would replace
    /// every replica once after an upgrade of berth.
    #[test]
    fn host_cpus_counts_what_sysinfo_counted() {
        let mut sys = sysinfo::System::new();
        sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
        assert_eq!(super::host_cpus(), (sys.cpus().len() as u32).max(1));
    }
}
