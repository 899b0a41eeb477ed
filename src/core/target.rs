//! From a config to what each proxy should be: render its files and derive its container spec.

use std::path::Path;

use anyhow::{Context, Result};

use crate::core::backend_tls::{self, BackendTlsFiles};
use crate::core::certificates::{self, Certificate};
use crate::core::ir::{Infra, ProxyInfra};
use crate::core::render::{Rendered, Renderer};
use crate::core::replica::{self, DesiredProxy};
use crate::ops::acme::{Placeholder, Placeholders};

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
    /// ACME placeholders made in memory, not written ([`Placeholders::InMemory`]): a writer
    /// renders again once it holds the state directory.
    pub acme_placeholders: Vec<Placeholder>,
}

impl Target {
    pub fn name(&self) -> &str {
        &self.proxy.name
    }
}

/// Renders every proxy of `infra` and derives its spec. Pure apart from reading templates and
/// the listener certificates and backend TLS files (which are checked here, so a bad one
/// changes nothing), and, with [`Placeholders::Write`], from the placeholder an ACME listener
/// gets before its first certificate ([`crate::ops::acme::locate`]).
pub fn targets(
    infra: &Infra,
    renderer: &Renderer,
    state_dir: &Path,
    host_cpus: u32,
    placeholders: Placeholders,
) -> Result<Vec<Target>> {
    infra
        .proxies
        .iter()
        .map(|proxy| {
            let now = std::time::SystemTime::now();
            let mut proxy = proxy.clone();
            let acme_placeholders =
                crate::ops::acme::locate(&mut proxy, state_dir, now, placeholders)?;
            let proxy = &proxy;
            let certificates = certificates::load(proxy, now, &acme_placeholders)
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
                acme_placeholders,
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
    use std::path::Path;

    use super::{targets, Target};
    use crate::core::render::Renderer;
    use crate::ops::acme::Placeholders;

    const ACME: &str = r#"
[[proxy]]
name = "edge"
image = "envoyproxy/envoy:v1.31.0"

[[proxy.listener]]
name = "web"
port = 8080
protocol = "http"
[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "plain" }

[[proxy.listener]]
name = "https"
port = 8443
protocol = "https"
tls = { acme = { domains = ["edge.example"], directory = "https://ca.example/dir" } }
[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "tls" }
"#;

    fn edge(state: &Path, placeholders: Placeholders) -> Target {
        let config = crate::core::source::file::parse(Path::new("berth.toml"), ACME).unwrap();
        targets(&config.infra, &Renderer::builtin(), state, 2, placeholders)
            .unwrap()
            .remove(0)
    }

    /// A command that does not hold the state directory renders an ACME listener without its
    /// certificate and writes nothing there: a serve may be between writing an issued key and
    /// its certificate, and a "repair" would put a placeholder over them.
    #[test]
    fn only_the_writer_writes_an_acme_placeholder() {
        let dir = tempfile::tempdir().unwrap();
        let pair = dir.path().join("acme/edge/https");

        let read_only = edge(dir.path(), Placeholders::InMemory);
        assert!(
            !dir.path().join("acme").exists(),
            "a reader wrote into the state directory"
        );
        assert_eq!(read_only.acme_placeholders.len(), 1);
        assert_eq!(read_only.certificates.len(), 1);
        assert!(read_only.certificates[0]
            .subject
            .contains("berth ACME placeholder"));
        assert_eq!(read_only.certificates[0].cert_file, pair.join("cert.pem"));

        let written = edge(dir.path(), Placeholders::Write);
        assert!(written.acme_placeholders.is_empty());
        let cert = std::fs::read(pair.join("cert.pem")).unwrap();
        assert!(crate::ops::acme::AcmeStatus::read(&pair.join("status.json")).placeholder);
        assert_eq!(written.certificates[0].cert_pem, cert);

        // Halfway through installing an issued pair: a new key beside the old certificate.
        let other = edge(tempfile::tempdir().unwrap().path(), Placeholders::InMemory);
        std::fs::write(pair.join("key.pem"), &other.acme_placeholders[0].key_pem).unwrap();
        let reader = edge(dir.path(), Placeholders::InMemory);
        assert_eq!(reader.acme_placeholders.len(), 1);
        assert_eq!(std::fs::read(pair.join("cert.pem")).unwrap(), cert);
        assert_eq!(
            std::fs::read(pair.join("key.pem")).unwrap(),
            other.acme_placeholders[0].key_pem
        );
    }

    /// The default concurrency is part of every replica's spec: a different count would replace
    /// every replica once after an upgrade of berth.
    #[test]
    fn host_cpus_counts_what_sysinfo_counted() {
        let mut sys = sysinfo::System::new();
        sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
        assert_eq!(super::host_cpus(), (sys.cpus().len() as u32).max(1));
    }
}
