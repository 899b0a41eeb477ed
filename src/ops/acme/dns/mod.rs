//! DNS-01 answers (RFC 8555 8.4): a TXT record `_acme-challenge.<domain>` holding the key
//! authorization's digest, set through the listener's solver ([`rfc2136`] or [`hook`]),
//! checked visible ([`propagation`]) before the CA is asked to look, and removed afterwards,
//! also when the order failed. Every error names the solver.

pub mod hook;
pub mod propagation;
pub mod rfc2136;

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use crate::core::ir::{Dns01, DnsProvider};

/// One TXT record to present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxtRecord {
    /// The name proved, without a wildcard's `*.`.
    pub domain: String,
    /// `_acme-challenge.<domain>`.
    pub fqdn: String,
    /// base64url(SHA-256(key authorization)): public once set, so no secret.
    pub value: String,
}

impl TxtRecord {
    pub fn new(domain: &str, value: String) -> TxtRecord {
        let domain = domain.trim_start_matches("*.").to_ascii_lowercase();
        TxtRecord {
            fqdn: format!("_acme-challenge.{domain}"),
            domain,
            value,
        }
    }
}

/// The solver as errors name it: `dns-01 solver rfc2136 (server 192.0.2.53:53, zone example.com)`.
pub fn describe(dns: &Dns01) -> String {
    match &dns.provider {
        DnsProvider::Rfc2136 { server, zone, .. } => {
            format!("dns-01 solver rfc2136 (server {server}, zone {zone})")
        }
        DnsProvider::Hook { command, .. } => format!(
            "dns-01 solver hook ({})",
            command.first().map(String::as_str).unwrap_or_default()
        ),
    }
}

/// Sets the records and waits until every one is visible. On failure, the records set so far
/// are the caller's to [`cleanup`] (it always calls it).
pub async fn present(dns: &Dns01, records: &[TxtRecord]) -> Result<()> {
    let solver = describe(dns);
    set(dns, records, true)
        .await
        .map_err(|e| anyhow!("{solver}: {e:#}"))?;
    wait_visible(dns, records)
        .await
        .map_err(|e| anyhow!("{solver}: {e:#}"))
}

/// Removes the records (those never set are no error for either solver).
pub async fn cleanup(dns: &Dns01, records: &[TxtRecord]) -> Result<()> {
    set(dns, records, false)
        .await
        .map_err(|e| anyhow!("{}: removing the TXT records: {e:#}", describe(dns)))
}

async fn set(dns: &Dns01, records: &[TxtRecord], add: bool) -> Result<()> {
    match &dns.provider {
        DnsProvider::Rfc2136 {
            server,
            zone,
            key_name,
            algorithm,
            secret_file,
        } => {
            let secret = crate::core::source::file::read_tsig_secret(secret_file)?;
            let server = rfc2136::Server {
                addr: *server,
                zone,
                key_name,
                algorithm,
                secret,
            };
            rfc2136::update(&server, records, dns.ttl, add).await
        }
        DnsProvider::Hook {
            command,
            env_file,
            timeout,
        } => {
            let hook = hook::Hook {
                command,
                env_file: env_file.as_deref(),
                timeout: *timeout,
            };
            let action = if add { "present" } else { "cleanup" };
            let mut first_error = None;
            for r in records {
                // Cleanup tries every record even after one failed.
                if let Err(e) = hook.run(action, r).await {
                    if add {
                        return Err(e);
                    }
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        }
    }
}

/// Until each record's value is seen at every server asked (the settings' resolvers, the
/// rfc2136 server, or the zone's authoritative servers), within the propagation timeout.
async fn wait_visible(dns: &Dns01, records: &[TxtRecord]) -> Result<()> {
    let start = Instant::now();
    let mut servers: Vec<(SocketAddr, &TxtRecord)> = Vec::new();
    for r in records {
        let asked = match (&dns.resolvers[..], &dns.provider) {
            ([], DnsProvider::Rfc2136 { server, .. }) => vec![*server],
            ([], DnsProvider::Hook { .. }) => propagation::authoritative(&r.fqdn).await?,
            (resolvers, _) => resolvers.to_vec(),
        };
        servers.extend(asked.into_iter().map(|s| (s, r)));
    }
    loop {
        let mut missing = Vec::new();
        for (server, r) in &servers {
            match propagation::txt(*server, &r.fqdn).await {
                Ok(values) if values.contains(&r.value) => {}
                Ok(values) => missing.push(format!(
                    "{server} has {} TXT {}",
                    r.fqdn,
                    if values.is_empty() {
                        "none".to_string()
                    } else {
                        format!("{} other value(s)", values.len())
                    }
                )),
                Err(e) => missing.push(format!("{server}: {e:#}")),
            }
        }
        if missing.is_empty() {
            tracing::info!(
                "dns-01: TXT records visible at {} server(s) after {:?}",
                servers.len(),
                start.elapsed()
            );
            return Ok(());
        }
        if start.elapsed() + dns.propagation_interval > dns.propagation_timeout {
            bail!(
                "the TXT record did not become visible within propagation_timeout {:?}: {}",
                dns.propagation_timeout,
                missing.join("; ")
            );
        }
        tokio::time::sleep(dns.propagation_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_is_proved_at_its_base_name() {
        let r = TxtRecord::new("*.Example.com", "v".into());
        assert_eq!(r.domain, "example.com");
        assert_eq!(r.fqdn, "_acme-challenge.example.com");
    }
}
