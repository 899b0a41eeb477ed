//! Listener certificates, checked before they reach a replica.
//!
//! A listener's certificate and key are read once ([`load`]), checked (PEM, X.509, validity
//! period, the key matches the certificate) and kept in memory: what is checked is exactly what
//! is copied into the state directory and served. Each pair is named by a digest of its content
//! ([`Certificate::version`]); the replicas read it through a file-based SDS secret that names
//! the versioned files, so one atomic rename of the secret switches certificate and key
//! together (see `templates/sds-listener.yaml.tera`).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::core::ir;

/// What locating an ACME listener's certificate (`ops::acme::locate`) does when it has no usable
/// certificate yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// Writes a placeholder into the state directory: for the state directory's one writer.
    Write,
    /// Makes one in memory and writes nothing: for a command that does not hold the state
    /// directory. A serve may be installing an issued pair at that moment (key first, then
    /// certificate), and a reader that saw the two mismatch and "repaired" them would destroy
    /// the new certificate.
    InMemory,
}

/// A placeholder pair made in memory ([`Placeholders::InMemory`]), standing at the paths the
/// listener was pointed at.
#[derive(Clone)]
pub struct Placeholder {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for Placeholder {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placeholder")
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

/// One listener certificate's chain and key, checked.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct Certificate {
    pub listener: String,
    /// Its SDS secret's name (see [`ir::ListenerRouting::certificates`]).
    pub secret: String,
    /// Its directory under the state's `tls/`: the secret's name, or the listener's for a
    /// TLS-ALPN-01 challenge certificate.
    #[serde(skip)]
    pub dir: String,
    /// The SNI names that choose it; empty for the listener's default certificate.
    pub server_names: Vec<String>,
    /// The DNS names (and IP addresses) the leaf certificate is for: its subjectAltName, else
    /// its common name.
    pub names: Vec<String>,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The leaf's serial number, lowercase hex without leading zeros (as Envoy's `/certs`).
    pub serial: String,
    /// SHA-256 of the leaf certificate (DER), hex.
    pub sha256: String,
    pub subject: String,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// The first 16 hex digits of SHA-256 over certificate and key files: names the copies.
    pub version: String,
    #[serde(skip)]
    pub cert_pem: Vec<u8>,
    #[serde(skip)]
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for Certificate {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("listener", &self.listener)
            .field("secret", &self.secret)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Certificate {
    /// The copy of the chain replicas read, in the listener's TLS directory.
    pub fn cert_name(&self) -> String {
        format!("cert-{}.pem", self.version)
    }

    pub fn key_name(&self) -> String {
        format!("key-{}.pem", self.version)
    }
}

/// Reads and checks every listener certificate of a proxy (standalone mode; none in xds mode).
/// Every problem is reported, each naming its file. The pairs in `in_memory` stand in for the
/// files at their paths (ACME placeholders made by a command that does not hold the state
/// directory, see [`Placeholders`]).
pub fn load(
    proxy: &ir::ProxyInfra,
    now: SystemTime,
    in_memory: &[Placeholder],
) -> Result<Vec<Certificate>> {
    let ir::Routing::Standalone(s) = &proxy.routing else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for l in &s.listeners {
        for lc in l.certificates() {
            let tls = lc.files;
            let checked = match in_memory.iter().find(|p| p.cert_file == tls.cert_file) {
                Some(p) => check_pem(
                    &l.listener,
                    &p.cert_file,
                    &p.key_file,
                    &p.cert_pem,
                    &p.key_pem,
                    now,
                ),
                None => check(&l.listener, &tls.cert_file, &tls.key_file, now),
            };
            match checked {
                Ok(mut c) => {
                    c.secret = lc.secret;
                    c.dir = lc.dir;
                    c.server_names = lc.server_names;
                    out.push(c)
                }
                Err(e) if lc.server_names.is_empty() => {
                    errors.push(format!("listener {:?}: {e:#}", l.listener))
                }
                Err(e) => errors.push(format!(
                    "listener {:?}, certificate for {}: {e:#}",
                    l.listener,
                    lc.server_names.join(", ")
                )),
            }
        }
    }
    if !errors.is_empty() {
        bail!(
            "refused; nothing was changed and the current certificates keep serving:\n{}",
            errors.join("\n")
        );
    }
    Ok(out)
}

/// Reads one certificate/key pair and checks it.
pub fn check(
    listener: &str,
    cert_file: &Path,
    key_file: &Path,
    now: SystemTime,
) -> Result<Certificate> {
    let cert_pem =
        std::fs::read(cert_file).with_context(|| format!("cannot read {}", cert_file.display()))?;
    let key_pem =
        std::fs::read(key_file).with_context(|| format!("cannot read {}", key_file.display()))?;
    check_pem(listener, cert_file, key_file, &cert_pem, &key_pem, now)
}

/// Checks one certificate/key pair given as PEM (named by the files it stands for).
pub fn check_pem(
    listener: &str,
    cert_file: &Path,
    key_file: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
    now: SystemTime,
) -> Result<Certificate> {
    let mut c = inspect(cert_pem, key_pem, now)
        .map_err(|e| anyhow!("{}", e.message(cert_file, key_file)))?;
    c.listener = listener.to_string();
    c.secret = listener.to_string();
    c.dir = listener.to_string();
    c.cert_file = cert_file.to_path_buf();
    c.key_file = key_file.to_path_buf();
    Ok(c)
}

/// What is wrong with a pair, and in which file.
#[derive(Debug)]
enum Problem {
    Cert(String),
    Key(String),
}

impl Problem {
    fn message(&self, cert: &Path, key: &Path) -> String {
        match self {
            Problem::Cert(m) => format!("{}: {m}", cert.display()),
            Problem::Key(m) => format!("{}: {m}", key.display()),
        }
    }
}

fn inspect(cert_pem: &[u8], key_pem: &[u8], now: SystemTime) -> Result<Certificate, Problem> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Problem::Cert(format!("not a PEM certificate file ({e})")))?;
    let Some(leaf) = chain.first() else {
        return Err(Problem::Cert(
            "not a PEM certificate file: no -----BEGIN CERTIFICATE----- block".into(),
        ));
    };
    let (_, x509) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| Problem::Cert(format!("the first certificate is not valid X.509 ({e})")))?;
    for (i, der) in chain.iter().enumerate().skip(1) {
        x509_parser::parse_x509_certificate(der).map_err(|e| {
            Problem::Cert(format!(
                "certificate {} of the chain is not valid X.509 ({e})",
                i + 1
            ))
        })?;
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        Problem::Key(format!(
            "not a PEM private key file (PKCS#8, PKCS#1 or SEC1): {e}"
        ))
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| Problem::Key(format!("unsupported private key: {e}")))?;
    // rustls parses the leaf with webpki, which refuses critical extensions it does not know
    // (a TLS-ALPN-01 challenge certificate's acmeIdentifier): compare the public keys then.
    let same_key = signing
        .public_key()
        .is_some_and(|k| k.as_ref() == x509.public_key().raw);
    let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
    let unparsed = |e: &rustls::Error| matches!(e, rustls::Error::InvalidCertificate(_));
    if let Err(e) = certified.keys_match().or_else(|e| {
        if unparsed(&e) && same_key {
            Ok(())
        } else {
            Err(e)
        }
    }) {
        return Err(Problem::Key(match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                "this key does not match the certificate (their public keys differ)".to_string()
            }
            other => format!("cannot check that this key matches the certificate: {other}"),
        }));
    }
    let validity = x509.validity();
    let not_before = validity.not_before.timestamp();
    let not_after = validity.not_after.timestamp();
    let now_s = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if now_s > not_after {
        return Err(Problem::Cert(format!(
            "the certificate expired at {} (not_after)",
            validity.not_after
        )));
    }
    if now_s < not_before {
        return Err(Problem::Cert(format!(
            "the certificate is not valid yet: not_before is {}",
            validity.not_before
        )));
    }
    let serial = serial(&x509);
    let mut h = Sha256::new();
    h.update(cert_pem);
    h.update([0]);
    h.update(key_pem);
    let version = hex::encode(h.finalize())[..16].to_string();
    Ok(Certificate {
        listener: String::new(),
        secret: String::new(),
        dir: String::new(),
        server_names: Vec::new(),
        names: names(&x509),
        cert_file: PathBuf::new(),
        key_file: PathBuf::new(),
        serial,
        sha256: hex::encode(Sha256::digest(leaf.as_ref())),
        subject: x509.subject().to_string(),
        not_before,
        not_after,
        version,
        cert_pem: cert_pem.to_vec(),
        key_pem: key_pem.to_vec(),
    })
}

/// The subjectAltName DNS names and IP addresses of a certificate, else its common names.
fn names(x509: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let mut out = Vec::new();
    if let Ok(Some(san)) = x509.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => out.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => out.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())
                            .to_string(),
                    ),
                    16 => out.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())
                            .to_string(),
                    ),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    if out.is_empty() {
        out.extend(
            x509.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok().map(str::to_string)),
        );
    }
    out
}

/// What a delivered certificate copy is (no key needed, expired ones too): for status.
pub fn describe(cert_pem: &[u8]) -> Result<Certificate> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("not a PEM certificate file ({e})"))?;
    let leaf = chain
        .first()
        .ok_or_else(|| anyhow!("no -----BEGIN CERTIFICATE----- block"))?;
    let (_, x509) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| anyhow!("not valid X.509 ({e})"))?;
    Ok(Certificate {
        listener: String::new(),
        secret: String::new(),
        dir: String::new(),
        server_names: Vec::new(),
        names: names(&x509),
        cert_file: PathBuf::new(),
        key_file: PathBuf::new(),
        serial: serial(&x509),
        sha256: hex::encode(Sha256::digest(leaf.as_ref())),
        subject: x509.subject().to_string(),
        not_before: x509.validity().not_before.timestamp(),
        not_after: x509.validity().not_after.timestamp(),
        version: String::new(),
        cert_pem: cert_pem.to_vec(),
        key_pem: Vec::new(),
    })
}

fn serial(x509: &x509_parser::certificate::X509Certificate<'_>) -> String {
    let hex = hex::encode(x509.raw_serial());
    let trimmed = hex.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_string()
    } else {
        trimmed.to_string()
    }
}

/// A CA bundle (a backend's trust anchors), checked: every block PEM X.509, valid now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaBundle {
    pub file: PathBuf,
    /// Each certificate's serial, as [`Certificate::serial`].
    pub serials: Vec<String>,
    /// The earliest `notAfter` of the bundle, Unix seconds.
    pub not_after: i64,
    #[serde(skip)]
    pub pem: Vec<u8>,
}

/// Reads a CA file and checks it: at least one PEM certificate, each valid X.509 and within
/// its validity period (an expired CA would fail every handshake to the backend).
pub fn check_ca(file: &Path, now: SystemTime) -> Result<CaBundle> {
    let pem = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let fail = |m: String| anyhow!("{}: {m}", file.display());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| fail(format!("not a PEM certificate file ({e})")))?;
    if chain.is_empty() {
        return Err(fail(
            "not a PEM certificate file: no -----BEGIN CERTIFICATE----- block".into(),
        ));
    }
    let now_s = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut serials = Vec::new();
    let mut not_after = i64::MAX;
    for (i, der) in chain.iter().enumerate() {
        let (_, x509) = x509_parser::parse_x509_certificate(der).map_err(|e| {
            fail(format!(
                "certificate {} of the file is not valid X.509 ({e})",
                i + 1
            ))
        })?;
        let validity = x509.validity();
        let which = format!("certificate {} ({})", i + 1, x509.subject());
        if now_s > validity.not_after.timestamp() {
            return Err(fail(format!(
                "{which} expired at {} (not_after)",
                validity.not_after
            )));
        }
        if now_s < validity.not_before.timestamp() {
            return Err(fail(format!(
                "{which} is not valid yet: not_before is {}",
                validity.not_before
            )));
        }
        serials.push(normalize_serial(&hex::encode(x509.raw_serial())));
        not_after = not_after.min(validity.not_after.timestamp());
    }
    Ok(CaBundle {
        file: file.to_path_buf(),
        serials,
        not_after,
        pem,
    })
}

/// A serial as Envoy's `/certs` prints it, comparable with [`Certificate::serial`].
pub fn normalize_serial(serial: &str) -> String {
    let s: String = serial
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .collect::<String>()
        .to_ascii_lowercase();
    let t = s.trim_start_matches('0');
    if t.is_empty() {
        "0".into()
    } else {
        t.into()
    }
}

/// The serials of the certificates a replica serves, from the admin `/certs` JSON: each TLS
/// context's leaf (`cert_chain`, listeners' and backends' client certificates) and each
/// certificate it trusts (`ca_cert`, backends' CAs). Contexts from SDS carry no secret name.
pub fn served_serials(certs_json: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for c in certs_json["certificates"].as_array().into_iter().flatten() {
        for leaf in c["cert_chain"].as_array().into_iter().flatten().take(1) {
            if let Some(s) = leaf["serial_number"].as_str() {
                out.push(normalize_serial(s));
            }
        }
        for ca in c["ca_cert"].as_array().into_iter().flatten() {
            if let Some(s) = ca["serial_number"].as_str() {
                out.push(normalize_serial(s));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// 2030-01-01T00:00:00Z.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_893_456_000)
    }

    fn pair(from_year: i32, to_year: i32) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from_year, 1, 1);
        params.not_after = rcgen::date_time_ymd(to_year, 1, 1);
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x00, 0x2a, 0x01]));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_good_pair_is_read_with_its_serial_and_expiry() {
        let (cert, key) = pair(2029, 2031);
        let c = inspect(cert.as_bytes(), key.as_bytes(), now()).unwrap();
        assert_eq!(c.serial, "2a01");
        assert!(c.not_after > c.not_before);
        assert_eq!(c.version.len(), 16);
        assert!(
            !format!("{c:?}").contains("PRIVATE"),
            "Debug never shows the key"
        );
    }

    #[test]
    fn mismatched_expired_future_and_non_pem_are_refused_naming_the_file() {
        let (cert, key) = pair(2029, 2031);
        let (_, other_key) = pair(2029, 2031);
        let now = now();
        let msg = |r: Result<Certificate, Problem>| {
            r.unwrap_err()
                .message(Path::new("/c.pem"), Path::new("/k.pem"))
        };
        let m = msg(inspect(cert.as_bytes(), other_key.as_bytes(), now));
        assert!(
            m.starts_with("/k.pem: ") && m.contains("does not match"),
            "{m}"
        );
        let (old, old_key) = pair(2028, 2029);
        let m = msg(inspect(old.as_bytes(), old_key.as_bytes(), now));
        assert!(m.starts_with("/c.pem: ") && m.contains("expired"), "{m}");
        let (new, new_key) = pair(2031, 2032);
        let m = msg(inspect(new.as_bytes(), new_key.as_bytes(), now));
        assert!(m.contains("not valid yet"), "{m}");
        let m = msg(inspect(b"hello", key.as_bytes(), now));
        assert!(m.starts_with("/c.pem: ") && m.contains("not a PEM"), "{m}");
        let m = msg(inspect(cert.as_bytes(), b"hello", now));
        assert!(
            m.starts_with("/k.pem: ") && m.contains("not a PEM private key"),
            "{m}"
        );
        // Valid now, expired two years later.
        let later = now + Duration::from_secs(2 * 366 * 86400);
        assert!(inspect(cert.as_bytes(), key.as_bytes(), later).is_err());
    }

    #[test]
    fn serials_compare_as_envoy_prints_them() {
        assert_eq!(normalize_serial("002A01"), "2a01");
        let json = serde_json::json!({"certificates":[{"cert_chain":[{"serial_number":"2a01"}],"ca_cert":[]}]});
        assert_eq!(served_serials(&json), ["2a01"]);
    }
}
