//! Backends' TLS files (the CA a backend's certificate must chain to, and an optional client
//! certificate), checked before they reach a replica, like listener certificates
//! ([`crate::core::certificates`]): a non-PEM file, an expired or not yet valid certificate, or a
//! client key that does not match its certificate is refused, naming the file, and nothing
//! changes. What is checked is what is copied: `tls/backend.<name>/{ca,cert,key}-<version>.pem`
//! in the state directory, named by a digest of all three, which the backend's SDS secrets in
//! the watched directory name (`templates/sds-backend.yaml.tera`). A renewed CA or client
//! certificate is therefore one rename of the secret files away from every replica, without a
//! restart.

use std::time::SystemTime;

use anyhow::{bail, Result};
use sha2::{Digest, Sha256};

use crate::core::certificates::{self, CaBundle, Certificate};
use crate::core::ir;
use crate::core::render::view::backend_tls_owner;

/// One backend's TLS files, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendTlsFiles {
    pub backend: String,
    pub ca: CaBundle,
    pub client: Option<Certificate>,
    /// The first 16 hex digits of SHA-256 over the files: names the copies.
    pub version: String,
}

impl BackendTlsFiles {
    /// The directory under the state's (and the replicas') `tls/`.
    pub fn owner(&self) -> String {
        backend_tls_owner(&self.backend)
    }

    /// The copies to write: (file name, content, mode); the key readable by its owner only.
    pub fn copies(&self) -> Vec<(String, &[u8], u32)> {
        let v = &self.version;
        let mut out = vec![(format!("ca-{v}.pem"), self.ca.pem.as_slice(), 0o444)];
        if let Some(c) = &self.client {
            out.push((format!("cert-{v}.pem"), c.cert_pem.as_slice(), 0o444));
            out.push((format!("key-{v}.pem"), c.key_pem.as_slice(), 0o400));
        }
        out
    }

    /// The serials each replica's admin `/certs` must list once it uses these files.
    pub fn serials(&self) -> Vec<String> {
        let mut out = self.ca.serials.clone();
        out.extend(self.client.iter().map(|c| c.serial.clone()));
        out
    }
}

/// Reads and checks the TLS files of every backend of a proxy that has them (standalone mode).
/// Every problem is reported, each naming its backend and file.
pub fn load(proxy: &ir::ProxyInfra, now: SystemTime) -> Result<Vec<BackendTlsFiles>> {
    let ir::Routing::Standalone(s) = &proxy.routing else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for b in &s.backends {
        let Some(tls) = &b.tls else { continue };
        let ca = certificates::check_ca(&tls.ca_file, now);
        let client = tls
            .client
            .as_ref()
            .map(|c| certificates::check(&b.name, &c.cert_file, &c.key_file, now))
            .transpose();
        match (ca, client) {
            (Ok(ca), Ok(client)) => {
                let mut h = Sha256::new();
                h.update(&ca.pem);
                if let Some(c) = &client {
                    h.update([0]);
                    h.update(&c.cert_pem);
                    h.update([0]);
                    h.update(&c.key_pem);
                }
                out.push(BackendTlsFiles {
                    backend: b.name.clone(),
                    ca,
                    client,
                    version: hex::encode(h.finalize())[..16].to_string(),
                });
            }
            (ca, client) => {
                for e in [ca.err(), client.err()].into_iter().flatten() {
                    errors.push(format!("backend {:?}: {e:#}", b.name));
                }
            }
        }
    }
    if !errors.is_empty() {
        bail!(
            "refused; nothing was changed and the current files keep being used:\n{}",
            errors.join("\n")
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, UNIX_EPOCH};

    /// 2030-01-01T00:00:00Z.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_893_456_000)
    }

    fn ca(dir: &Path, name: &str, from: i32, to: i32) -> PathBuf {
        let mut params = rcgen::CertificateParams::new(vec!["ca".into()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x0c, 0xa1]));
        let key = rcgen::KeyPair::generate().unwrap();
        let path = dir.join(name);
        std::fs::write(&path, params.self_signed(&key).unwrap().pem()).unwrap();
        path
    }

    fn proxy(ca_file: PathBuf, client: Option<ir::TlsFiles>) -> ir::ProxyInfra {
        let text = r#"{"name":"p","config":{"image":"i","replicas":1},"routing":{"standalone":
            {"listeners":[],"backends":[{"name":"api","endpoints":[{"host":"127.0.0.1","port":1}],
            "connectTimeout":"1s"}]}}}"#;
        let mut p: ir::ProxyInfra = serde_json::from_str(text).unwrap();
        if let ir::Routing::Standalone(s) = &mut p.routing {
            s.backends[0].tls = Some(ir::BackendTls {
                ca_file,
                sni: "api.internal".into(),
                client,
            });
        }
        p
    }

    #[test]
    fn a_good_ca_is_read_and_versioned_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let good = ca(dir.path(), "ca.pem", 2029, 2031);
        let files = load(&proxy(good.clone(), None), now()).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].ca.serials, ["ca1"]);
        assert_eq!(files[0].serials(), ["ca1"]);
        assert_eq!(files[0].owner(), "backend.api");
        let copies: Vec<String> = files[0].copies().into_iter().map(|c| c.0).collect();
        assert_eq!(copies, [format!("ca-{}.pem", files[0].version)]);
        let other = ca(dir.path(), "other.pem", 2029, 2031);
        let again = load(&proxy(other, None), now()).unwrap();
        assert_ne!(files[0].version, again[0].version);
    }

    #[test]
    fn expired_non_pem_and_mismatched_files_are_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let expired = ca(dir.path(), "old.pem", 2027, 2028);
        let err = format!(
            "{:#}",
            load(&proxy(expired.clone(), None), now()).unwrap_err()
        );
        assert!(
            err.contains(&expired.display().to_string()) && err.contains("expired"),
            "{err}"
        );
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        let err = format!("{:#}", load(&proxy(junk.clone(), None), now()).unwrap_err());
        assert!(
            err.contains("junk.pem") && err.contains("not a PEM"),
            "{err}"
        );

        let good = ca(dir.path(), "ca.pem", 2029, 2031);
        let pair = |name: &str| {
            let params = rcgen::CertificateParams::new(vec!["client".into()]).unwrap();
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = dir.path().join(format!("{name}.pem"));
            let key_file = dir.path().join(format!("{name}-key.pem"));
            std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).unwrap();
            std::fs::write(&key_file, key.serialize_pem()).unwrap();
            (cert, key_file)
        };
        let (cert, _) = pair("a");
        let (_, other_key) = pair("b");
        let client = ir::TlsFiles {
            cert_file: cert,
            key_file: other_key.clone(),
        };
        let err = format!("{:#}", load(&proxy(good, Some(client)), now()).unwrap_err());
        assert!(
            err.contains(&other_key.display().to_string()) && err.contains("does not match"),
            "{err}"
        );
    }
}
