#![allow(dead_code)]
//! An HTTP load generator for 127.0.0.1 (or an address of a namespace the test made) that
//! counts every failed request, the longest time without a successful response on any
//! connection (the outage) and the longest time any one client waited for an answer (a stall
//! of one connection, which the others' answers hide from the outage): keep-alive clients
//! ([`Load::start`]), clients that open a new connection for every request
//! ([`Load::start_per_request`]: what catches connections queued on a closing listener), or
//! connections that each run until the server closes them ([`Load::start_until_closed_to`]:
//! what tells a graceful end from a reset).
//! Bounded: it stops when told, or at `max_time`. While it runs it holds the sysctl lock
//! shared ([`super::host::SysctlLock::shared`]): no negative control elsewhere turns
//! `tcp_migrate_req` off under it. [`assert_no_failures`] is the one check every test under
//! load makes.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// A request (connect included) that takes longer fails: a stall that ends in a 200 is a stall.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest stretch without a successful response that [`assert_no_failures`] accepts.
pub const MAX_GAP: Duration = Duration::from_secs(1);
/// The longest time one client may wait for an answer in [`assert_no_failures`].
pub const MAX_WAIT: Duration = Duration::from_secs(1);
/// The fewest successful requests per second and connection [`assert_no_failures`] accepts:
/// far below what a direct response on 127.0.0.1 sustains even on a busy 2-core host, so it
/// only fails when connections sat idle or stalled.
pub const MIN_RATE_PER_CONNECTION: f64 = 10.0;

#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub ok: u64,
    /// Connect errors, broken connections mid-request, non-2xx answers, timeouts.
    pub failed: u64,
    pub non_2xx: u64,
    /// Requests that got no complete answer within [`REQUEST_TIMEOUT`] (also in `failed`).
    pub timeouts: u64,
    pub connections: usize,
    pub errors: Vec<String>,
    /// The longest stretch with no successful response, across all connections.
    pub longest_gap: Duration,
    /// The longest time one client waited for an answer: from its start or its previous
    /// successful answer to the next one (or to the stop), and which client (0-based).
    pub longest_wait: Duration,
    pub longest_waiting_client: usize,
    pub elapsed: Duration,
    /// Connections the server closed between requests (`connection: close`, or closed while
    /// idle): a graceful end. Counted in every mode; only [`Load::start_until_closed_to`]'s
    /// connections stay closed.
    pub closed_gracefully: u64,
}

impl LoadReport {
    pub fn summary(&self) -> String {
        format!(
            "{} ok, {} failed ({} non-2xx, {} timeouts), longest gap {:?}, longest wait of one client {:?} (client {}), over {:.1}s on {} connections; first errors: {:?}",
            self.ok,
            self.failed,
            self.non_2xx,
            self.timeouts,
            self.longest_gap,
            self.longest_wait,
            self.longest_waiting_client,
            self.elapsed.as_secs_f64(),
            self.connections,
            &self.errors[..self.errors.len().min(5)]
        )
    }

    /// The fewest successful requests this run must have: [`MIN_RATE_PER_CONNECTION`] per
    /// second and connection.
    pub fn min_ok(&self) -> u64 {
        (self.elapsed.as_secs_f64() * self.connections as f64 * MIN_RATE_PER_CONNECTION) as u64
    }
}

/// No request failed or timed out, no stretch without a success was longer than [`MAX_GAP`],
/// no client waited longer than [`MAX_WAIT`] for an answer, and the load ran at least
/// [`LoadReport::min_ok`] requests.
pub fn assert_no_failures(what: &str, report: &LoadReport) {
    eprintln!("{what}: {}", report.summary());
    assert_eq!(report.failed, 0, "{what}: {}", report.summary());
    assert!(
        report.longest_gap <= MAX_GAP,
        "{what}: no successful response for {:?} (at most {MAX_GAP:?}): {}",
        report.longest_gap,
        report.summary()
    );
    assert!(
        report.longest_wait <= MAX_WAIT,
        "{what}: client {} waited {:?} for an answer (at most {MAX_WAIT:?}): {}",
        report.longest_waiting_client,
        report.longest_wait,
        report.summary()
    );
    assert!(
        report.ok >= report.min_ok(),
        "{what}: the load barely ran ({} ok, at least {} expected): {}",
        report.ok,
        report.min_ok(),
        report.summary()
    );
}

struct Shared {
    stop: AtomicBool,
    closed_gracefully: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    non_2xx: AtomicU64,
    timeouts: AtomicU64,
    errors: Mutex<Vec<String>>,
    last_ok: Mutex<Instant>,
    longest_gap: Mutex<Duration>,
    /// The longest wait of one client, and which, each client's as it ends.
    longest_wait: Mutex<(Duration, usize)>,
}

pub struct Load {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    started: Instant,
    connections: usize,
    _sysctl: super::host::SysctlLock,
}

impl Load {
    /// Starts `connections` keep-alive clients sending `GET path` to 127.0.0.1:port.
    pub fn start(port: u16, path: &str, connections: usize, max_time: Duration) -> Load {
        Load::start_to(loopback(port), path, connections, max_time)
    }

    /// [`Load::start`] to `addr` (an address of a namespace the test made).
    pub fn start_to(addr: SocketAddr, path: &str, connections: usize, max_time: Duration) -> Load {
        Load::spawn(addr, path, connections, max_time, Mode::KeepAlive, None)
    }

    /// `connections` keep-alive connections to `addr` that each send `GET path` until the
    /// server closes the connection between two requests (a graceful end, counted in
    /// [`LoadReport::closed_gracefully`]); a connection the server breaks mid-request is a
    /// failure, and none is opened again. [`Load::open_connections`] says how many still run.
    pub fn start_until_closed_to(
        addr: SocketAddr,
        path: &str,
        connections: usize,
        max_time: Duration,
    ) -> Load {
        Load::spawn(addr, path, connections, max_time, Mode::UntilClosed, None)
    }

    /// Like [`Load::start`] over HTTPS (any server certificate accepted, SNI "localhost");
    /// each connection sends 20 requests, then a new handshake follows.
    pub fn start_tls(port: u16, path: &str, connections: usize, max_time: Duration) -> Load {
        Load::start_tls_named(port, path, connections, max_time, "localhost")
    }

    /// [`Load::start_tls`] to `addr` (an address of a namespace the test made).
    pub fn start_tls_to(
        addr: SocketAddr,
        path: &str,
        connections: usize,
        max_time: Duration,
    ) -> Load {
        let tls = Some(Tls {
            connector: super::tls::connector(),
            name: "localhost".to_string(),
        });
        Load::spawn(addr, path, connections, max_time, Mode::KeepAlive, tls)
    }

    /// Like [`Load::start_tls`] with `name` as SNI and Host header.
    pub fn start_tls_named(
        port: u16,
        path: &str,
        connections: usize,
        max_time: Duration,
        name: &str,
    ) -> Load {
        let tls = Some(Tls {
            connector: super::tls::connector(),
            name: name.to_string(),
        });
        Load::spawn(
            loopback(port),
            path,
            connections,
            max_time,
            Mode::KeepAlive,
            tls,
        )
    }

    /// Starts `clients` clients that each open a connection, send one `GET path` with
    /// `connection: close`, read the answer, and start over.
    pub fn start_per_request(port: u16, path: &str, clients: usize, max_time: Duration) -> Load {
        Load::start_per_request_to(loopback(port), path, clients, max_time)
    }

    /// [`Load::start_per_request`] to `addr` (an address of a namespace the test made).
    pub fn start_per_request_to(
        addr: SocketAddr,
        path: &str,
        clients: usize,
        max_time: Duration,
    ) -> Load {
        Load::spawn(addr, path, clients, max_time, Mode::PerRequest, None)
    }

    fn spawn(
        addr: SocketAddr,
        path: &str,
        connections: usize,
        max_time: Duration,
        mode: Mode,
        tls: Option<Tls>,
    ) -> Load {
        let sysctl = super::host::SysctlLock::shared();
        let now = Instant::now();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            closed_gracefully: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            non_2xx: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            last_ok: Mutex::new(now),
            longest_gap: Mutex::new(Duration::ZERO),
            longest_wait: Mutex::new((Duration::ZERO, 0)),
        });
        let deadline = now + max_time;
        let tasks = (0..connections)
            .map(|i| {
                let shared = shared.clone();
                let path = path.to_string();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let mut waits = Waits::new();
                    client(addr, path, &shared, deadline, mode, tls, &mut waits).await;
                    let longest = waits.end();
                    let mut worst = shared.longest_wait.lock().unwrap();
                    if longest > worst.0 {
                        *worst = (longest, i);
                    }
                })
            })
            .collect();
        Load {
            shared,
            tasks,
            started: now,
            connections,
            _sysctl: sysctl,
        }
    }

    pub fn ok_so_far(&self) -> u64 {
        self.shared.ok.load(Ordering::Relaxed)
    }

    /// How many clients still run (all of them, but for [`Load::start_until_closed_to`]'s
    /// connections the server closed).
    pub fn open_connections(&self) -> usize {
        self.tasks.iter().filter(|t| !t.is_finished()).count()
    }

    /// Stops the clients and returns what they saw.
    pub async fn stop(self) -> LoadReport {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let s = &self.shared;
        let tail = s.last_ok.lock().unwrap().elapsed();
        let longest = (*s.longest_gap.lock().unwrap()).max(tail);
        let (longest_wait, longest_waiting_client) = *s.longest_wait.lock().unwrap();
        LoadReport {
            ok: s.ok.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            non_2xx: s.non_2xx.load(Ordering::Relaxed),
            timeouts: s.timeouts.load(Ordering::Relaxed),
            connections: self.connections,
            errors: s.errors.lock().unwrap().clone(),
            longest_gap: longest,
            longest_wait,
            longest_waiting_client,
            elapsed: self.started.elapsed(),
            closed_gracefully: s.closed_gracefully.load(Ordering::Relaxed),
        }
    }
}

/// One client's longest wait for an answer.
struct Waits {
    since: Instant,
    longest: Duration,
}

impl Waits {
    fn new() -> Waits {
        Waits {
            since: Instant::now(),
            longest: Duration::ZERO,
        }
    }

    fn answered(&mut self) {
        self.longest = self.longest.max(self.since.elapsed());
        self.since = Instant::now();
    }

    /// The longest wait, the one since the last answer included.
    fn end(self) -> Duration {
        self.longest.max(self.since.elapsed())
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn record_ok(shared: &Shared) {
    shared.ok.fetch_add(1, Ordering::Relaxed);
    let mut last = shared.last_ok.lock().unwrap();
    let gap = last.elapsed();
    let mut longest = shared.longest_gap.lock().unwrap();
    if gap > *longest {
        *longest = gap;
    }
    *last = Instant::now();
}

fn record_failure(shared: &Shared, what: String) {
    shared.failed.fetch_add(1, Ordering::Relaxed);
    let mut errors = shared.errors.lock().unwrap();
    if errors.len() < 50 {
        errors.push(what);
    }
}

fn record_timeout(shared: &Shared, what: &str) {
    shared.timeouts.fetch_add(1, Ordering::Relaxed);
    record_failure(
        shared,
        format!("{what}: no answer within {REQUEST_TIMEOUT:?}"),
    );
}

/// A TLS client and the name it sends (SNI and Host).
#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: String,
}

/// Opens a keep-alive HTTP/1.1 connection, within [`REQUEST_TIMEOUT`].
/// A plain or TLS stream.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// Opens a keep-alive HTTP/1.1 connection (over TLS with `tls`), within [`REQUEST_TIMEOUT`].
async fn connect(
    addr: SocketAddr,
    shared: &Shared,
    tls: Option<&Tls>,
) -> Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let open = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let stream: Box<dyn Stream> = match tls {
            None => Box::new(stream),
            Some(tls) => Box::new(
                tls.connector
                    .connect(super::tls::server_name(&tls.name), stream)
                    .await
                    .map_err(|e| format!("tls handshake: {e}"))?,
            ),
        };
        hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, open).await {
        Err(_) => {
            record_timeout(shared, "connect");
            None
        }
        Ok(Err(e)) => {
            record_failure(shared, e);
            tokio::time::sleep(Duration::from_millis(10)).await;
            None
        }
        Ok(Ok((sender, conn))) => {
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Some(sender)
        }
    }
}

/// How a client uses connections.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Keep-alive; a new connection when the server closes one.
    KeepAlive,
    /// One request per connection (`connection: close`).
    PerRequest,
    /// One keep-alive connection, until the server closes it.
    UntilClosed,
}

async fn client(
    addr: SocketAddr,
    path: String,
    shared: &Shared,
    deadline: Instant,
    mode: Mode,
    tls: Option<Tls>,
    waits: &mut Waits,
) {
    let close = mode == Mode::PerRequest;
    let once = mode == Mode::UntilClosed;
    // The server ended the connection between requests: a graceful end.
    let closed = || {
        shared.closed_gracefully.fetch_add(1, Ordering::Relaxed);
    };
    'connection: while !shared.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let Some(mut sender) = connect(addr, shared, tls.as_ref()).await else {
            if once {
                return;
            }
            continue;
        };
        // Over TLS, new handshakes keep coming (a rotation must not fail one).
        let mut left = if tls.is_some() { 20 } else { u64::MAX };
        while !shared.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            if left == 0 {
                continue 'connection;
            }
            left -= 1;
            if sender.ready().await.is_err() {
                // The server closed the connection between requests (after `connection:
                // close`): not a failed request, open a new connection.
                closed();
                if once {
                    return;
                }
                continue 'connection;
            }
            let host = tls.as_ref().map_or("localhost", |t| t.name.as_str());
            let mut request = hyper::Request::get(path.as_str()).header("host", host);
            if close {
                request = request.header("connection", "close");
            }
            let request = request.body(Empty::<Bytes>::new()).expect("valid request");
            let exchange = async {
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| format!("request: {e}"))?;
                let status = response.status();
                let closed_by_server = response
                    .headers()
                    .get("connection")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("body: {e}"))?;
                Ok::<_, String>((status, closed_by_server))
            };
            match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
                Ok(Ok((status, closed_by_server))) => {
                    if status.is_success() {
                        record_ok(shared);
                        waits.answered();
                    } else {
                        shared.non_2xx.fetch_add(1, Ordering::Relaxed);
                        record_failure(shared, format!("status {status}"));
                    }
                    if close {
                        continue 'connection;
                    }
                    if closed_by_server {
                        closed();
                        if once {
                            return;
                        }
                        continue 'connection;
                    }
                }
                Ok(Err(e)) => {
                    record_failure(shared, e);
                    if once {
                        return;
                    }
                    continue 'connection;
                }
                Err(_) => {
                    // The connection may still deliver the late answer: drop it.
                    record_timeout(shared, "request");
                    if once {
                        return;
                    }
                    continue 'connection;
                }
            }
        }
    }
}
