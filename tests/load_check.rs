//! The load checks every test under load makes (`common::load`) can fail: against a local HTTP
//! server that answers slowly or stalls, a stall that ends in a 200 is a timeout, a stall of
//! one connection that the others' answers hide from the outage is a long wait, and too few
//! requests for the time and connections are refused. No Docker, no Envoy.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::load::{assert_no_failures, Load, LoadReport, MAX_GAP, MAX_WAIT, REQUEST_TIMEOUT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A keep-alive HTTP/1.1 server on 127.0.0.1 answering 200 to every request after `delay`;
/// while `stall` is set, an answer waits for it to clear first.
async fn server(delay: Duration, stall: Arc<AtomicBool>) -> u16 {
    server_stalling_one(delay, stall, Arc::default()).await
}

/// [`server`], where the next answer after `one` is set (one answer on one connection) waits
/// that long first.
async fn server_stalling_one(
    delay: Duration,
    stall: Arc<AtomicBool>,
    one: Arc<Mutex<Option<Duration>>>,
) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let stall = stall.clone();
            let one = one.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        tokio::time::sleep(delay).await;
                        while stall.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        let once = one.lock().unwrap().take();
                        if let Some(wait) = once {
                            tokio::time::sleep(wait).await;
                        }
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    port
}

fn check(report: &LoadReport) -> Result<(), String> {
    std::panic::catch_unwind(|| assert_no_failures("negative control", report)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic".into())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_server_passes() {
    let port = server(Duration::ZERO, Arc::default()).await;
    let load = Load::start(port, "/", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = load.stop().await;
    check(&report).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_that_ends_in_200_is_a_failure() {
    let stall = Arc::new(AtomicBool::new(false));
    let port = server(Duration::ZERO, stall.clone()).await;
    let load = Load::start(port, "/", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stall.store(true, Ordering::Relaxed);
    tokio::time::sleep(REQUEST_TIMEOUT + Duration::from_millis(500)).await;
    stall.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.stop().await;
    assert!(report.timeouts >= 4, "{}", report.summary());
    assert!(report.longest_gap > REQUEST_TIMEOUT, "{}", report.summary());
    let err = check(&report).unwrap_err();
    assert!(err.contains("no answer within"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_timeout_is_a_gap() {
    let stall = Arc::new(AtomicBool::new(false));
    let port = server(Duration::ZERO, stall.clone()).await;
    let load = Load::start(port, "/", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stall.store(true, Ordering::Relaxed);
    tokio::time::sleep(MAX_GAP + (REQUEST_TIMEOUT - MAX_GAP) / 2).await;
    stall.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.stop().await;
    assert_eq!(report.failed, 0, "{}", report.summary());
    let err = check(&report).unwrap_err();
    assert!(err.contains("no successful response for"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_are_too_few_requests() {
    // 5 answers per second and connection: no failure, no long gap, but half the floor.
    let port = server(Duration::from_millis(200), Arc::default()).await;
    let load = Load::start(port, "/", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = load.stop().await;
    assert_eq!(report.failed, 0, "{}", report.summary());
    let err = check(&report).unwrap_err();
    assert!(err.contains("the load barely ran"), "{err}");
}

/// One connection waits 1.5 s for its answer (no timeout) while the other three keep being
/// answered: no outage, no failure, but a long wait.
async fn one_stalled(per_request: bool) {
    let one = Arc::new(Mutex::new(None));
    let port = server_stalling_one(Duration::ZERO, Arc::default(), one.clone()).await;
    let start = if per_request {
        Load::start_per_request
    } else {
        Load::start
    };
    let load = start(port, "/", 4, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stall = MAX_WAIT + (REQUEST_TIMEOUT - MAX_WAIT) / 2;
    *one.lock().unwrap() = Some(stall);
    tokio::time::sleep(REQUEST_TIMEOUT + Duration::from_millis(500)).await;
    let report = load.stop().await;
    assert_eq!(report.failed, 0, "{}", report.summary());
    assert!(
        report.longest_gap < stall,
        "the others answered: {}",
        report.summary()
    );
    assert!(report.longest_wait >= stall, "{}", report.summary());
    let err = check(&report).unwrap_err();
    assert!(
        err.contains("waited") && err.contains("for an answer (at most"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stalled_keep_alive_connection_is_a_long_wait() {
    one_stalled(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stalled_connection_per_request_is_a_long_wait() {
    one_stalled(true).await;
}
