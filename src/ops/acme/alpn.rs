//! TLS-ALPN-01 answers (RFC 8737) on the ACME listener itself: for each name, a self-signed
//! certificate carrying the critical acmeIdentifier extension (the key authorization's
//! SHA-256), served only to clients that name it and offer ALPN `acme-tls/1` (the CA). They
//! reach the replicas as SDS secrets with the listener's filter chains, a filter-chain-only
//! update that leaves ordinary connections alone; the delivery after the order removes them.

use std::path::Path;

use anyhow::{Context, Result};

use super::ListenerFiles;
use crate::core::ir::{self, ProxyInfra};

/// `proxy` with a challenge certificate for each `(identifier, digest)` on `listener`, the
/// pairs written under the listener's ACME directory.
pub fn with_answers(
    state_dir: &Path,
    proxy: &ProxyInfra,
    listener: &str,
    answers: &[(String, Vec<u8>)],
) -> Result<ProxyInfra> {
    let files = ListenerFiles::new(state_dir, &proxy.name, listener);
    let mut made = Vec::new();
    for (i, (domain, digest)) in answers.iter().enumerate() {
        let (cert_pem, key_pem) = certificate(domain, digest)
            .with_context(|| format!("the tls-alpn-01 certificate for {domain}"))?;
        let pair = ListenerFiles {
            dir: files.dir.join("tls-alpn-01").join(i.to_string()),
        };
        crate::state::create_dir(&pair.dir, 0o700)?;
        super::write_pair(&pair, &cert_pem, &key_pem)?;
        made.push(ir::AlpnAnswer {
            domain: domain.clone(),
            files: ir::TlsFiles {
                cert_file: pair.cert(),
                key_file: pair.key(),
            },
        });
    }
    let mut out = proxy.clone();
    if let ir::Routing::Standalone(s) = &mut out.routing {
        for l in s.listeners.iter_mut().filter(|l| l.listener == listener) {
            if let Some(a) = &mut l.acme {
                a.alpn_answers = made.clone();
            }
        }
    }
    Ok(out)
}

/// A challenge certificate for `domain` (RFC 8737 3): its only name, the acmeIdentifier
/// extension (critical) holding `digest`.
fn certificate(domain: &str, digest: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut params = rcgen::CertificateParams::new(vec![domain.to_string()])?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "berth ACME tls-alpn-01 challenge",
    );
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(1);
    params
        .custom_extensions
        .push(rcgen::CustomExtension::new_acme_identifier(digest));
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem().into_bytes(), key.serialize_pem().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_challenge_certificate_names_the_domain_and_carries_the_digest_critically() {
        let digest = [7u8; 32];
        let (cert, key) = certificate("edge.example.com", &digest).unwrap();
        let c = crate::core::certificates::check_pem(
            "https",
            Path::new("/c"),
            Path::new("/k"),
            &cert,
            &key,
            std::time::SystemTime::now(),
        )
        .unwrap();
        assert_eq!(c.names, ["edge.example.com"]);
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let der = CertificateDer::from_pem_slice(&cert).unwrap();
        let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
        let ext = x509
            .extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == "1.3.6.1.5.5.7.1.31")
            .expect("acmeIdentifier");
        assert!(ext.critical);
        assert!(ext.value.ends_with(&digest));
    }
}
