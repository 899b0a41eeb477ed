//! Listener certificates obtained and renewed over ACME (RFC 8555, listener `tls.acme`).
//!
//! berth keeps each ACME listener's certificate and key in the state directory and points the
//! listener's `tls` at them, so part A's checks, SDS delivery and per-replica confirmation
//! serve it like any named pair. Until the first issuance (or after the stored one expired) a
//! self-signed placeholder stands in, so the proxy can start and answer the challenge itself:
//! HTTP-01 responses are live routes (`direct_response` with the key authorization) on a
//! plain-HTTP listener of the same proxy, delivered through the watched files and removed
//! after ([`challenge`]). Renewal is due at two thirds of the lifetime; failures back off.
//!
//! ```text
//! <state_dir>/acme/                                0700
//!   accounts/<sha of directory and email>.json     account credentials (0600)
//!   <proxy>/<listener>/cert.pem, key.pem           the served pair (key 0600)
//!   <proxy>/<listener>/status.json                 next renewal, last error, failures
//! ```
//!
//! Account keys and certificate keys never reach labels, logs, events or status.

pub mod alpn;
pub mod challenge;
pub mod dns;
mod issue;
mod solve;
mod status;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::core::ir::{self, ProxyInfra};

pub use crate::core::certificates::{Placeholder, Placeholders};
pub use issue::{due_at, renew_due, Converger, Renewal};
pub use solve::solver_name;
pub use status::AcmeStatus;

/// The first retry after a failure; doubled per failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(30);
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Where one ACME listener's files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerFiles {
    pub dir: PathBuf,
}

impl ListenerFiles {
    pub fn new(state_dir: &Path, proxy: &str, listener: &str) -> ListenerFiles {
        ListenerFiles {
            dir: state_dir.join("acme").join(proxy).join(listener),
        }
    }
    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }
    pub fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }
    pub fn status(&self) -> PathBuf {
        self.dir.join("status.json")
    }
}

/// A proxy's ACME listeners, by name.
pub fn listeners(proxy: &ProxyInfra) -> Vec<(&str, &ir::Acme)> {
    match &proxy.routing {
        ir::Routing::Standalone(s) => s
            .listeners
            .iter()
            .filter_map(|l| l.acme.as_ref().map(|a| (l.listener.as_str(), a)))
            .collect(),
        ir::Routing::Xds(_) => Vec::new(),
    }
}

/// The directory of account credentials.
pub fn accounts_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("acme").join("accounts")
}

/// Points every ACME listener of `proxy` at berth's copies in `state_dir`. Where there is no
/// usable certificate yet (none, unreadable, mismatched or expired) a self-signed placeholder
/// stands in: written there, or returned, as `placeholders` says.
pub fn locate(
    proxy: &mut ProxyInfra,
    state_dir: &Path,
    now: SystemTime,
    placeholders: Placeholders,
) -> Result<Vec<Placeholder>> {
    let name = proxy.name.clone();
    let ir::Routing::Standalone(s) = &mut proxy.routing else {
        return Ok(Vec::new());
    };
    let mut in_memory = Vec::new();
    for l in &mut s.listeners {
        let Some(acme) = &l.acme else { continue };
        let files = ListenerFiles::new(state_dir, &name, &l.listener);
        // Other domains: the old certificate serves until the new one is issued.
        if crate::core::certificates::check("", &files.cert(), &files.key(), now).is_err() {
            let context = || {
                format!(
                    "proxy {name}, listener {}: making a placeholder certificate",
                    l.listener
                )
            };
            let (cert_pem, key_pem) = placeholder(acme).with_context(context)?;
            match placeholders {
                Placeholders::Write => {
                    write_placeholder(&files, &cert_pem, &key_pem).with_context(context)?
                }
                Placeholders::InMemory => in_memory.push(Placeholder {
                    cert_file: files.cert(),
                    key_file: files.key(),
                    cert_pem,
                    key_pem,
                }),
            }
        }
        l.tls = Some(ir::TlsFiles {
            cert_file: files.cert(),
            key_file: files.key(),
        });
    }
    Ok(in_memory)
}

/// The stored pair is valid now and covers exactly the wanted domains.
fn usable(files: &ListenerFiles, acme: &ir::Acme, now: SystemTime) -> bool {
    let Ok(c) = crate::core::certificates::check("", &files.cert(), &files.key(), now) else {
        return false;
    };
    let Ok(names) = dns_names(&c.cert_pem) else {
        return false;
    };
    let mut want = acme.domains.clone();
    want.sort();
    names == want
}

/// The leaf's DNS subject alternative names, sorted.
pub fn dns_names(cert_pem: &[u8]) -> Result<Vec<String>> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let der = CertificateDer::from_pem_slice(cert_pem).context("not a PEM certificate")?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der).context("not X.509")?;
    let mut names: Vec<String> = x509
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    Ok(names)
}

/// A self-signed certificate (and its key) for the domains, valid for a day: the listener can
/// start before the first issuance.
fn placeholder(acme: &ir::Acme) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut params = rcgen::CertificateParams::new(acme.domains.clone())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "berth ACME placeholder");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(1);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem().into_bytes(), key.serialize_pem().into_bytes()))
}

/// Installs a placeholder pair. Its status says it is a placeholder, so it is replaced at once.
fn write_placeholder(files: &ListenerFiles, cert_pem: &[u8], key_pem: &[u8]) -> Result<()> {
    crate::state::create_dir(&files.dir, 0o700)?;
    write_pair(files, cert_pem, key_pem)?;
    let mut st = AcmeStatus::read(&files.status());
    st.placeholder = true;
    st.write(&files.status())
}

/// Key first, then certificate: each by atomic rename (the key 0600). A reader that sees the
/// new certificate with the old key refuses the pair and keeps serving (part A's check).
pub fn write_pair(files: &ListenerFiles, cert_pem: &[u8], key_pem: &[u8]) -> Result<()> {
    crate::state::write_atomic(&files.key(), key_pem, 0o600)?;
    crate::state::write_atomic(&files.cert(), cert_pem, 0o644)
}

/// When a certificate valid from `not_before` to `not_after` (Unix seconds) is due for renewal:
/// at two thirds of its lifetime.
pub fn renewal_time(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before) * 2 / 3
}

/// The wait after `failures` failed attempts in a row.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

pub fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_at_two_thirds_and_backoff_doubles_to_an_hour() {
        assert_eq!(renewal_time(0, 90), 60);
        assert_eq!(renewal_time(1000, 1000 + 90 * 86400), 1000 + 60 * 86400);
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_secs(30));
        assert_eq!(backoff(2), Duration::from_secs(60));
        assert_eq!(backoff(3), Duration::from_secs(120));
        assert_eq!(backoff(20), MAX_BACKOFF);
    }
}
