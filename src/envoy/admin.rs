//! A client for one Envoy replica's admin API, spoken as HTTP/1.1 over the replica's admin Unix
//! socket (DESIGN decision 2: no TCP admin port exists).
//!
//! Every call opens a fresh connection and is bounded by a timeout ([`DEFAULT_TIMEOUT`] unless
//! set with [`Admin::with_timeout`]); connection errors name the socket and say what they mean.
//!
//! "Connections still open" ([`Admin::downstream_connections`]) is the sum of the per-listener
//! gauges `listener.<listener>.downstream_cx_active`, leaving out the admin listener
//! (`listener.admin.*`) and the per-worker breakdowns (`listener.<l>.worker_<n>.…`, which would
//! count each connection twice). These gauges move the moment a connection is accepted or
//! closed and cover every protocol (HTTP and TCP proxy alike). `server.total_connections`,
//! which Envoy Gateway's shutdown manager polls, counts the same worker connections but is only
//! refreshed at each stats flush (`stats_flush_interval`, 5 s by default), so a drain that polls
//! it waits up to one flush interval too long (measured on Envoy 1.40.0: with one connection
//! open, `listener.127.0.0.1_<port>.downstream_cx_active` was 1 and `server.total_connections`
//! still 0).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// The timeout of each admin call unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Envoy's server state as `/ready` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyState {
    Live,
    Draining,
    PreInitializing,
    Initializing,
    Other(String),
}

impl ReadyState {
    pub fn parse(body: &str) -> ReadyState {
        match body.trim() {
            "LIVE" => ReadyState::Live,
            "DRAINING" => ReadyState::Draining,
            "PRE_INITIALIZING" => ReadyState::PreInitializing,
            "INITIALIZING" => ReadyState::Initializing,
            other => ReadyState::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            ReadyState::Live => "LIVE",
            ReadyState::Draining => "DRAINING",
            ReadyState::PreInitializing => "PRE_INITIALIZING",
            ReadyState::Initializing => "INITIALIZING",
            ReadyState::Other(s) => s,
        }
    }
}

impl std::fmt::Display for ReadyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The admin API of one replica, reached through its socket.
#[derive(Debug, Clone)]
pub struct Admin {
    socket: PathBuf,
    timeout: Duration,
}

impl Admin {
    pub fn new(socket: impl Into<PathBuf>) -> Admin {
        Admin {
            socket: socket.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Admin {
        self.timeout = timeout;
        self
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /ready`: Envoy's state. A 503 carrying a state (DRAINING, INITIALIZING, …) is an
    /// answer, not an error.
    pub async fn ready(&self) -> Result<ReadyState> {
        let (status, body) = self.get("/ready").await?;
        match status {
            200 | 503 => Ok(ReadyState::parse(&body)),
            _ => bail!(
                "{}: GET /ready answered {status}: {}",
                self.where_(),
                body.trim()
            ),
        }
    }

    /// `GET /server_info` → `.version`, e.g. "<sha>/1.40.0/Clean/RELEASE/BoringSSL".
    pub async fn server_version(&self) -> Result<String> {
        let info = self.get_json("/server_info").await?;
        info.get("version")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{}: /server_info has no version", self.where_()))
    }

    /// Every counter and gauge (`GET /stats?format=json`); histograms and text readouts are
    /// left out.
    pub async fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let json = self.get_json("/stats?format=json").await?;
        Ok(parse_stats(&json))
    }

    /// One counter or gauge by exact name, None when Envoy has no such stat.
    pub async fn stat(&self, name: &str) -> Result<Option<u64>> {
        let filter = format!("^{}$", regex_escape(name));
        let json = self
            .get_json(&format!(
                "/stats?format=json&filter={}",
                percent_encode(&filter)
            ))
            .await?;
        Ok(parse_stats(&json).remove(name))
    }

    /// Downstream connections this replica still has open on its listeners (see the module
    /// docs for which gauge and why).
    pub async fn downstream_connections(&self) -> Result<u64> {
        let filter = r"^listener\..*\.downstream_cx_active$";
        let json = self
            .get_json(&format!(
                "/stats?format=json&filter={}",
                percent_encode(filter)
            ))
            .await?;
        Ok(sum_listener_connections(&parse_stats(&json)))
    }

    /// `GET /listeners?format=json`: the listeners Envoy has bound, with their ports.
    pub async fn listeners(&self) -> Result<Vec<BoundListener>> {
        let json = self.get_json("/listeners?format=json").await?;
        Ok(parse_listeners(&json))
    }

    /// `POST /healthcheck/fail`: Envoy reports DRAINING from now on.
    pub async fn healthcheck_fail(&self) -> Result<()> {
        self.post_ok("/healthcheck/fail").await
    }

    /// `POST /drain_listeners?graceful&skip_exit` (`graceful_skip_exit`: start the graceful
    /// drain, keep accepting, do not exit) or `POST /drain_listeners` (stop the listeners now).
    pub async fn drain_listeners(&self, graceful_skip_exit: bool) -> Result<()> {
        if graceful_skip_exit {
            self.post_ok("/drain_listeners?graceful&skip_exit").await
        } else {
            self.post_ok("/drain_listeners").await
        }
    }

    /// A raw GET: status and body.
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        self.request(Method::GET, path).await
    }

    /// A raw POST: status and body.
    pub async fn post(&self, path: &str) -> Result<(u16, String)> {
        self.request(Method::POST, path).await
    }

    async fn post_ok(&self, path: &str) -> Result<()> {
        let (status, body) = self.post(path).await?;
        if status != 200 {
            bail!(
                "{}: POST {path} answered {status}: {}",
                self.where_(),
                body.trim()
            );
        }
        Ok(())
    }

    async fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let (status, body) = self.get(path).await?;
        if status != 200 {
            bail!(
                "{}: GET {path} answered {status}: {}",
                self.where_(),
                body.trim()
            );
        }
        serde_json::from_str(&body)
            .with_context(|| format!("{}: GET {path} did not return JSON", self.where_()))
    }

    fn where_(&self) -> String {
        format!("admin socket {}", self.socket.display())
    }

    async fn request(&self, method: Method, path: &str) -> Result<(u16, String)> {
        let what = format!("{}: {method} {path}", self.where_());
        match tokio::time::timeout(self.timeout, self.exchange(method.clone(), path)).await {
            Ok(r) => r,
            Err(_) => bail!("{what}: no answer within {:?}", self.timeout),
        }
    }

    async fn exchange(&self, method: Method, path: &str) -> Result<(u16, String)> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| anyhow!("{}: {}", self.where_(), connect_error(&e)))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("{}: HTTP handshake", self.where_()))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, "envoy-admin")
            .body(Full::new(Bytes::new()))
            .with_context(|| format!("building {method} {path}"))?;
        let result = async {
            let resp = sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, String::from_utf8_lossy(&body).into_owned()))
        }
        .await;
        driver.abort();
        result.with_context(|| format!("{}: {method} {path}", self.where_()))
    }
}

/// A listener Envoy reports in `/listeners`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BoundListener {
    pub name: String,
    /// The port of its local address (0 for a pipe or an address without one).
    pub port: u16,
    /// The IP of its local address, when Envoy reports one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::IpAddr>,
}

/// What berth asks of a replica's Envoy: the seam between the executor and the admin socket,
/// so the rollout can be unit-tested against the in-memory engine's Envoy.
#[async_trait::async_trait]
pub trait AdminApi: Send + Sync {
    /// Where this replica's admin is, for messages.
    fn location(&self) -> String;
    async fn ready(&self) -> Result<ReadyState>;
    async fn listeners(&self) -> Result<Vec<BoundListener>>;
    async fn downstream_connections(&self) -> Result<u64>;
    async fn healthcheck_fail(&self) -> Result<()>;
    async fn drain_listeners(&self, graceful_skip_exit: bool) -> Result<()>;
    /// A raw GET: status and body.
    async fn get(&self, path: &str) -> Result<(u16, String)>;
}

#[async_trait::async_trait]
impl AdminApi for Admin {
    fn location(&self) -> String {
        self.where_()
    }
    async fn ready(&self) -> Result<ReadyState> {
        Admin::ready(self).await
    }
    async fn listeners(&self) -> Result<Vec<BoundListener>> {
        Admin::listeners(self).await
    }
    async fn downstream_connections(&self) -> Result<u64> {
        Admin::downstream_connections(self).await
    }
    async fn healthcheck_fail(&self) -> Result<()> {
        Admin::healthcheck_fail(self).await
    }
    async fn drain_listeners(&self, graceful_skip_exit: bool) -> Result<()> {
        Admin::drain_listeners(self, graceful_skip_exit).await
    }
    async fn get(&self, path: &str) -> Result<(u16, String)> {
        Admin::get(self, path).await
    }
}

/// Opens the admin API of the replica whose socket is at a path.
pub trait AdminConnector: Send + Sync {
    fn connect(&self, socket: &Path, timeout: Duration) -> std::sync::Arc<dyn AdminApi>;
}

/// The real connector: HTTP over the Unix socket.
#[derive(Debug, Clone, Copy, Default)]
pub struct SocketConnector;

impl AdminConnector for SocketConnector {
    fn connect(&self, socket: &Path, timeout: Duration) -> std::sync::Arc<dyn AdminApi> {
        std::sync::Arc::new(Admin::new(socket).with_timeout(timeout))
    }
}

fn connect_error(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => {
            "no such socket (Envoy has not created it yet, or the replica is gone)".into()
        }
        io::ErrorKind::ConnectionRefused => {
            "connection refused (no Envoy is listening on it: the replica is not running)".into()
        }
        io::ErrorKind::PermissionDenied => format!(
            "permission denied (the socket is mode 0600, owned by uid {}; run berth as that \
             user or as root)",
            crate::core::replica::replica_user().uid
        ),
        io::ErrorKind::InvalidInput => format!(
            "{e} (a Unix socket path may be at most {} bytes: use a shorter state directory)",
            crate::core::layout::MAX_SOCKET_PATH
        ),
        _ => e.to_string(),
    }
}

/// Counters and gauges from Envoy's `/stats?format=json` answer:
/// `{"stats":[{"name":…,"value":…},…,{"histograms":…}]}`.
pub fn parse_stats(json: &serde_json::Value) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(stats) = json.get("stats").and_then(|s| s.as_array()) else {
        return out;
    };
    for s in stats {
        if let (Some(name), Some(value)) = (
            s.get("name").and_then(|n| n.as_str()),
            s.get("value").and_then(|v| v.as_u64()),
        ) {
            out.insert(name.to_string(), value);
        }
    }
    out
}

/// Envoy's `/listeners?format=json` answer:
/// `{"listener_statuses":[{"name":…,"local_address":{"socket_address":{"port_value":…}}}]}`.
pub fn parse_listeners(json: &serde_json::Value) -> Vec<BoundListener> {
    json.get("listener_statuses")
        .and_then(|l| l.as_array())
        .map(|list| {
            list.iter()
                .map(|l| BoundListener {
                    name: l
                        .get("name")
                        .and_then(|n| n.as_str())
                        .unwrap_or_default()
                        .to_string(),
                    port: l
                        .pointer("/local_address/socket_address/port_value")
                        .and_then(|p| p.as_u64())
                        .and_then(|p| u16::try_from(p).ok())
                        .unwrap_or(0),
                    address: l
                        .pointer("/local_address/socket_address/address")
                        .and_then(|a| a.as_str())
                        .and_then(|a| a.parse().ok()),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Sum of `listener.<l>.downstream_cx_active` without the admin listener and without the
/// per-worker gauges.
pub fn sum_listener_connections(stats: &BTreeMap<String, u64>) -> u64 {
    stats
        .iter()
        .filter(|(name, _)| is_listener_cx_active(name))
        .map(|(_, v)| *v)
        .sum()
}

fn is_listener_cx_active(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("listener.") else {
        return false;
    };
    let Some(listener) = rest.strip_suffix(".downstream_cx_active") else {
        return false;
    };
    if listener == "admin" || listener.starts_with("admin.") {
        return false;
    }
    // Per-worker breakdown: "<listener>.worker_<n>".
    let last = listener.rsplit('.').next().unwrap_or("");
    let per_worker = last
        .strip_prefix("worker_")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    !per_worker
}

/// "1.40.0" from a `/server_info` version such as "<sha>/1.40.0/Clean/RELEASE/BoringSSL".
pub fn version_number(server_version: &str) -> Option<&str> {
    server_version
        .split('/')
        .nth(1)
        .filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Percent-encodes everything but RFC 3986's unreserved characters (for query values).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_states() {
        assert_eq!(ReadyState::parse("LIVE\n"), ReadyState::Live);
        assert_eq!(ReadyState::parse("DRAINING\n"), ReadyState::Draining);
        assert_eq!(
            ReadyState::parse("PRE_INITIALIZING"),
            ReadyState::PreInitializing
        );
        assert_eq!(ReadyState::parse("INITIALIZING"), ReadyState::Initializing);
        assert_eq!(ReadyState::parse("x"), ReadyState::Other("x".into()));
    }

    #[test]
    fn version_from_server_info() {
        assert_eq!(
            version_number("3ad5d5b/1.40.0/Clean/RELEASE/BoringSSL"),
            Some("1.40.0")
        );
        assert_eq!(version_number("garbage"), None);
    }

    #[test]
    fn listener_connection_gauges() {
        let stats: BTreeMap<String, u64> = [
            ("listener.127.0.0.1_8080.downstream_cx_active", 3),
            ("listener.127.0.0.1_8080.worker_0.downstream_cx_active", 2),
            ("listener.127.0.0.1_8080.worker_1.downstream_cx_active", 1),
            ("listener.[__]_9090.downstream_cx_active", 4),
            ("listener.admin.downstream_cx_active", 1),
            ("listener.admin.main_thread.downstream_cx_active", 1),
            ("http.web.downstream_cx_active", 3),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(sum_listener_connections(&stats), 7);
    }

    #[test]
    fn stats_json() {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"stats":[{"name":"a.b","value":3},{"name":"t","value":"text"},
                {"histograms":{"supported_quantiles":[0]}}]}"#,
        )
        .unwrap();
        let s = parse_stats(&json);
        assert_eq!(s.len(), 1);
        assert_eq!(s["a.b"], 3);
    }

    #[test]
    fn listeners_json() {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"listener_statuses":[{"name":"web","local_address":{"socket_address":
                {"address":"0.0.0.0","port_value":10080}}},{"name":"p","local_address":
                {"pipe":{"path":"/x"}}}]}"#,
        )
        .unwrap();
        assert_eq!(
            parse_listeners(&json),
            vec![
                BoundListener {
                    name: "web".into(),
                    port: 10080,
                    address: Some("0.0.0.0".parse().unwrap()),
                },
                BoundListener {
                    name: "p".into(),
                    port: 0,
                    address: None,
                }
            ]
        );
    }

    #[test]
    fn filter_encoding() {
        assert_eq!(regex_escape("server.state"), r"server\.state");
        assert_eq!(percent_encode(r"^a\.b$"), "%5Ea%5C.b%24");
    }
}
