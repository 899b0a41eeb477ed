//! Where `berth serve` offers Envoy Gateway's remote infrastructure provider service, and how
//! it is secured: a Unix socket (mode 0600), or TCP with TLS, mTLS when a client CA is given.
//! Plain-text TCP is an explicit opt-in (`remote_plaintext = true`): whoever reaches the port
//! can create, change and delete proxies on the host.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where the service listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A Unix socket, created with mode 0600 (EG's `remote.service.unix.path`).
    Unix(PathBuf),
    /// A TCP address (EG's `remote.service.ip`/`fqdn`), served with TLS ([`Security`]).
    Tcp(SocketAddr),
}

impl Listen {
    /// Parses `unix:///abs/path`, `unix://rel/path` (relative to `base`) or `tcp://IP:PORT`.
    pub fn parse(s: &str, base: &Path) -> Result<Listen, String> {
        let allowed = "must be \"unix:///path/to/socket\" or \"tcp://IP:PORT\" (e.g. \"tcp://127.0.0.1:9478\")";
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() || path.contains('\0') || path.len() > 107 {
                return Err(format!(
                    "{allowed}; a Unix socket path is 1–107 bytes, got {s:?}"
                ));
            }
            let path = Path::new(path);
            return Ok(Listen::Unix(if path.is_absolute() {
                path.to_path_buf()
            } else {
                base.join(path)
            }));
        }
        if let Some(addr) = s.strip_prefix("tcp://") {
            return addr.parse().map(Listen::Tcp).map_err(|_| {
                format!("{allowed}; the TCP address must be an IP literal with a port, got {s:?}")
            });
        }
        Err(format!("{allowed}; got {s:?}"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix://{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

/// How the service is secured on TCP (a Unix socket is guarded by its file mode).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Security {
    /// Nothing configured: a Unix socket is fine, TCP is refused.
    #[default]
    None,
    Tls(TlsFiles),
    /// `remote_plaintext = true`: plain-text gRPC on TCP, knowingly.
    Plaintext,
}

/// The service's certificate and key (PEM) and, for mTLS, the CA that signs Envoy Gateway's
/// client certificate (EG's `remote.tls.clientCertificateRef`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}
