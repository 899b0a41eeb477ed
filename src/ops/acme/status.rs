//! What berth remembers about one ACME listener between runs: shown by status, read by the
//! renewal schedule. Never a key.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcmeStatus {
    /// The served certificate is berth's self-signed stand-in, not yet issued.
    #[serde(default)]
    pub placeholder: bool,
    /// Unix seconds of the last issuance.
    #[serde(default)]
    pub issued_at: Option<i64>,
    /// Unix seconds: when the next attempt is due (renewal time, or a retry after backoff).
    #[serde(default)]
    pub next_renewal: Option<i64>,
    /// Unix seconds of the last attempt, successful or not.
    #[serde(default)]
    pub last_attempt: Option<i64>,
    /// Why the last attempt failed; cleared by a success.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Failed attempts in a row (for backoff).
    #[serde(default)]
    pub failures: u32,
    /// How the last attempt answered the CA: "http-01", "tls-alpn-01", "dns-01 rfc2136", …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solver: Option<String>,
}

impl AcmeStatus {
    /// The recorded status, or the default when there is none (or it is unreadable).
    pub fn read(path: &Path) -> AcmeStatus {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_vec_pretty(self)?;
        crate::state::write_atomic(path, &json, 0o600)
    }
}
