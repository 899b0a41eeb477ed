//! The credentials of the agent channel: berth's own CA in `<state>/agents/`, the manager's
//! server certificate, and one client certificate per proxy. The agents of a proxy get its
//! certificate and key as Swarm secrets and the CA as a config; the manager accepts only client
//! certificates its CA signed and takes the proxy from the certificate, never from what an
//! agent says. Everything is made once and kept (a new certificate would be a new secret, and so
//! a rolling update); the keys are readable by root only.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::state::StateDir;

pub use crate::core::agent::channel::MANAGER_NAME;

/// The name in a proxy's agent certificate.
pub fn agent_name(proxy: &str) -> String {
    format!("berth-agent.{proxy}")
}

/// The proxy an agent certificate's name stands for.
pub fn proxy_of(name: &str) -> Option<&str> {
    name.strip_prefix("berth-agent.")
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pair { .. }")
    }
}

/// berth's agent CA in a state directory.
pub struct Authority {
    dir: PathBuf,
    ca_cert: String,
    ca_key: KeyPair,
}

impl Authority {
    /// The CA of `state`, made on first use.
    pub fn open(state: &StateDir) -> Result<Authority> {
        let dir = state.root().join("agents");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .with_context(|| format!("cannot restrict {}", dir.display()))?;
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        let (ca_cert, ca_key) = if key_path.exists() && cert_path.exists() {
            let key = read(&key_path)?;
            let key = KeyPair::from_pem(&key)
                .with_context(|| format!("{} is not a private key", key_path.display()))?;
            (read(&cert_path)?, key)
        } else {
            let key = KeyPair::generate()?;
            let cert = ca_params()?.self_signed(&key)?;
            write(&key_path, &key.serialize_pem())?;
            write(&cert_path, &cert.pem())?;
            (cert.pem(), key)
        };
        Ok(Authority {
            dir,
            ca_cert,
            ca_key,
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_cert
    }

    /// The manager's server certificate.
    pub fn manager(&self) -> Result<Pair> {
        self.pair("manager", MANAGER_NAME, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// The client certificate of `proxy`'s agents.
    pub fn agent(&self, proxy: &str) -> Result<Pair> {
        self.pair(
            &format!("agent-{proxy}"),
            &agent_name(proxy),
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn pair(&self, file: &str, name: &str, usage: ExtendedKeyUsagePurpose) -> Result<Pair> {
        let (cert_path, key_path) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        if cert_path.exists() && key_path.exists() {
            return Ok(Pair {
                cert: read(&cert_path)?,
                key: read(&key_path)?,
            });
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![name.to_string()])?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let issuer = Issuer::new(ca_params()?, &self.ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        write(&key_path, &key.serialize_pem())?;
        write(&cert_path, &cert.pem())?;
        Ok(Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The CA's parameters: the same every time, so a CA key read back issues certificates that
/// chain to the CA certificate on disk.
fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "berth agent channel CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(params)
}

fn read(p: &Path) -> Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
}

fn write(p: &Path, text: &str) -> Result<()> {
    crate::state::write_atomic(p, text.as_bytes(), 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        let a = Authority::open(&state).unwrap();
        let agent = a.agent("edge").unwrap();
        let again = Authority::open(&state).unwrap();
        assert_eq!(a.ca_pem(), again.ca_pem());
        assert_eq!(again.agent("edge").unwrap().cert, agent.cert);
        assert_ne!(again.agent("other").unwrap().cert, agent.cert);
        let mode = std::fs::metadata(dir.path().join("agents/ca.key"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert_eq!(proxy_of(&agent_name("edge")), Some("edge"));
    }
}
