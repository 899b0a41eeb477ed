#![allow(dead_code)]
//! A keep-alive HTTP load generator for 127.0.0.1 that counts every failed request and the
//! longest time without a successful response. Bounded: it stops when told, or at `max_time`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub ok: u64,
    /// Connect errors, broken connections mid-request, non-2xx answers.
    pub failed: u64,
    pub non_2xx: u64,
    pub errors: Vec<String>,
    /// The longest stretch with no successful response, across all connections.
    pub longest_gap: Duration,
    pub elapsed: Duration,
}

impl LoadReport {
    pub fn summary(&self) -> String {
        format!(
            "{} ok, {} failed ({} non-2xx), longest gap {:?}, over {:.1}s; first errors: {:?}",
            self.ok,
            self.failed,
            self.non_2xx,
            self.longest_gap,
            self.elapsed.as_secs_f64(),
            &self.errors[..self.errors.len().min(5)]
        )
    }
}

struct Shared {
    stop: AtomicBool,
    ok: AtomicU64,
    failed: AtomicU64,
    non_2xx: AtomicU64,
    errors: Mutex<Vec<String>>,
    last_ok: Mutex<Instant>,
    longest_gap: Mutex<Duration>,
}

pub struct Load {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    started: Instant,
}

impl Load {
    /// Starts `connections` keep-alive clients sending `GET path` to 127.0.0.1:port.
    pub fn start(port: u16, path: &str, connections: usize, max_time: Duration) -> Load {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            non_2xx: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            last_ok: Mutex::new(now),
            longest_gap: Mutex::new(Duration::ZERO),
        });
        let deadline = now + max_time;
        let tasks = (0..connections)
            .map(|_| {
                let shared = shared.clone();
                let path = path.to_string();
                tokio::spawn(async move { client(port, path, shared, deadline).await })
            })
            .collect();
        Load {
            shared,
            tasks,
            started: now,
        }
    }

    pub fn ok_so_far(&self) -> u64 {
        self.shared.ok.load(Ordering::Relaxed)
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
        LoadReport {
            ok: s.ok.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            non_2xx: s.non_2xx.load(Ordering::Relaxed),
            errors: s.errors.lock().unwrap().clone(),
            longest_gap: longest,
            elapsed: self.started.elapsed(),
        }
    }
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

async fn client(port: u16, path: String, shared: Arc<Shared>, deadline: Instant) {
    'connection: while !shared.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let stream = match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => s,
            Err(e) => {
                record_failure(&shared, format!("connect: {e}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(pair) => pair,
                Err(e) => {
                    record_failure(&shared, format!("handshake: {e}"));
                    continue;
                }
            };
        tokio::spawn(async move {
            let _ = conn.await;
        });
        while !shared.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            if sender.ready().await.is_err() {
                // The server closed the connection between requests (after `connection:
                // close`): not a failed request, open a new connection.
                continue 'connection;
            }
            let request = hyper::Request::get(path.as_str())
                .header("host", "localhost")
                .body(Empty::<Bytes>::new())
                .expect("valid request");
            match sender.send_request(request).await {
                Ok(response) => {
                    let status = response.status();
                    let close = response
                        .headers()
                        .get("connection")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                    match response.into_body().collect().await {
                        Ok(_) if status.is_success() => record_ok(&shared),
                        Ok(_) => {
                            shared.non_2xx.fetch_add(1, Ordering::Relaxed);
                            record_failure(&shared, format!("status {status}"));
                        }
                        Err(e) => record_failure(&shared, format!("body: {e}")),
                    }
                    if close {
                        continue 'connection;
                    }
                }
                Err(e) => {
                    record_failure(&shared, format!("request: {e}"));
                    continue 'connection;
                }
            }
        }
    }
}
