//! The IR's ACME certificates: what a listener's certificate is obtained with (RFC 8555) and
//! the challenge (HTTP-01, TLS-ALPN-01, DNS-01) that proves it.

use super::*;

/// A listener certificate berth obtains and renews over ACME (RFC 8555), answering the CA's
/// challenges itself: HTTP-01 through a plain-HTTP listener of the same proxy, TLS-ALPN-01 on
/// the listener itself, or DNS-01 through a DNS solver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Acme {
    /// DNS names the certificate covers; the first is its subject.
    pub domains: Vec<String>,
    /// Contact for the account (expiry and revocation notices).
    #[serde(default)]
    pub email: Option<String>,
    /// The ACME directory URL.
    pub directory: String,
    /// CA certificates (PEM) that the directory's HTTPS certificate chains to, instead of the
    /// system roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The plain-HTTP listener of this proxy that answers HTTP-01 challenges (empty for the
    /// other challenges).
    pub challenge_listener: String,
    /// Which challenge berth answers.
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// TLS-ALPN-01 challenge certificates served while the CA validates (set by issuance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alpn_answers: Vec<AlpnAnswer>,
}

/// One TLS-ALPN-01 challenge certificate (RFC 8737), in the state directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlpnAnswer {
    pub domain: String,
    pub files: TlsFiles,
}

/// The ACME challenge a listener's certificate is proved with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcmeChallenge {
    /// `http-01`: an answer route on a plain-HTTP listener (port 80 for a public CA).
    #[default]
    Http01,
    /// `tls-alpn-01`: a challenge certificate on the listener itself for ALPN `acme-tls/1`.
    TlsAlpn01,
    /// `dns-01`: a `_acme-challenge` TXT record (the only one allowing wildcards).
    Dns01(Dns01),
}

impl AcmeChallenge {
    /// As the config spells it.
    pub fn name(&self) -> &'static str {
        match self {
            AcmeChallenge::Http01 => "http-01",
            AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            AcmeChallenge::Dns01(_) => "dns-01",
        }
    }
}

/// How DNS-01 TXT records are set and checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dns01 {
    pub provider: DnsProvider,
    /// Servers asked whether the record is visible; empty: the zone's authoritative servers.
    #[serde(default)]
    pub resolvers: Vec<std::net::SocketAddr>,
    /// The longest wait for the record to be visible before the CA is asked to validate.
    #[serde(with = "humantime_serde")]
    pub propagation_timeout: Duration,
    /// The pause between two visibility checks.
    #[serde(with = "humantime_serde")]
    pub propagation_interval: Duration,
    /// The TXT record's TTL in seconds.
    pub ttl: u32,
}

/// Who sets the TXT record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum DnsProvider {
    /// RFC 2136 dynamic updates signed with TSIG, sent to the zone's primary server.
    Rfc2136 {
        server: std::net::SocketAddr,
        /// The zone updated, e.g. `example.com`.
        zone: String,
        key_name: String,
        /// `hmac-sha256`, `hmac-sha384` or `hmac-sha512`.
        algorithm: String,
        /// The key's base64 secret, or a `tsig-keygen` key file; read at each issuance.
        secret_file: PathBuf,
    },
    /// A command run with `BERTH_ACME_*` variables to present and clean up the record.
    Hook {
        command: Vec<String>,
        /// `NAME=value` lines added to the command's environment (credentials).
        #[serde(default)]
        env_file: Option<PathBuf>,
        #[serde(with = "humantime_serde")]
        timeout: Duration,
    },
}

impl DnsProvider {
    /// As the config spells it.
    pub fn name(&self) -> &'static str {
        match self {
            DnsProvider::Rfc2136 { .. } => "rfc2136",
            DnsProvider::Hook { .. } => "hook",
        }
    }
}
