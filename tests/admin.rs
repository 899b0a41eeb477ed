//! admin.rs against a real Envoy replica started through the Engine.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth::engine::{ContainerEngine, DockerEngine};
use berth::envoy::admin::{version_number, Admin, ReadyState};
use berth::host::preflight::tcp_ports_listened_by;
use common::{ensure_test_image, free_port, wait_live, Cleanup, Fixture, TEST_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 keep-alive request on an open connection; returns status, headers and body.
async fn http_get(conn: &mut TcpStream, path: &str) -> (u16, String, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before a full response");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                let body = text[end + 4..end + 4 + len].to_string();
                return (status, head.to_string(), body);
            }
        }
    }
}

async fn connect(port: u16) -> std::io::Result<TcpStream> {
    TcpStream::connect(("127.0.0.1", port)).await
}

/// Polls `f` until it returns true or `deadline` passes.
async fn eventually<F, Fut>(deadline: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return true;
        }
        if start.elapsed() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn admin_over_the_socket_of_a_real_replica() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("adm");
    let engine = DockerEngine::connect().await.unwrap();
    let port = free_port();
    let fx = Fixture::new(port);
    let name = format!("berth-{}-0", cleanup.case);
    let replica = fx.replica("adm", 0, &name, image);
    let id = common::run_replica(&engine, replica, &cleanup).await;
    let admin = fx.admin(&name);

    assert_eq!(
        wait_live(&admin, Duration::from_secs(30)).await,
        ReadyState::Live,
        "logs:\n{}",
        engine.logs(&id, Some(20)).await.unwrap_or_default()
    );

    // The socket is 0600 and owned by the replica's user.
    {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let md = std::fs::metadata(admin.socket()).unwrap();
        assert!(md.file_type().is_socket());
        assert_eq!(md.mode() & 0o777, 0o600, "admin socket mode");
        assert_eq!(md.uid(), 101);
    }

    // Version.
    let version = admin.server_version().await.unwrap();
    assert!(version.contains(TEST_VERSION), "{version}");
    assert_eq!(version_number(&version), Some(TEST_VERSION));

    // No TCP admin port: the only TCP socket Envoy listens on is the listener's.
    let pid = engine.status(&id).await.unwrap().unwrap().pid.unwrap();
    assert_eq!(tcp_ports_listened_by(pid as u32), BTreeSet::from([port]));

    // Traffic through the listener on 127.0.0.1, on a keep-alive connection.
    assert_eq!(admin.downstream_connections().await.unwrap(), 0);
    let mut conn = connect(port).await.unwrap();
    let (status, _, body) = http_get(&mut conn, "/").await;
    assert_eq!((status, body.as_str()), (200, "hello from berth\n"));
    let (status, _, _) = http_get(&mut conn, "/again").await;
    assert_eq!(status, 200);

    // The requests are counted.
    let stats = admin.stats().await.unwrap();
    assert!(
        stats
            .get("http.web.downstream_rq_2xx")
            .copied()
            .unwrap_or(0)
            >= 2,
        "http.web.downstream_rq_2xx: {:?}",
        stats.get("http.web.downstream_rq_2xx")
    );
    assert!(stats.contains_key("server.total_connections"));
    assert!(
        admin
            .stat("http.web.downstream_rq_completed")
            .await
            .unwrap()
            .unwrap_or(0)
            >= 2
    );
    assert_eq!(admin.stat("no.such.stat").await.unwrap(), None);

    // Connections: one open now, none after it closes (the gauge is live).
    assert_eq!(admin.downstream_connections().await.unwrap(), 1);
    let mut second = connect(port).await.unwrap();
    http_get(&mut second, "/").await;
    assert_eq!(admin.downstream_connections().await.unwrap(), 2);
    drop(second);
    drop(conn);
    assert!(
        eventually(common::EVENTUALLY, || async {
            admin.downstream_connections().await.unwrap() == 0
        })
        .await,
        "connections did not fall to 0"
    );

    // The drain sequence: fail health checks, graceful drain without exit, then stop
    // listeners.
    let mut kept = connect(port).await.unwrap();
    http_get(&mut kept, "/").await;
    admin.healthcheck_fail().await.unwrap();
    assert_eq!(admin.ready().await.unwrap(), ReadyState::Draining);
    let (code, body) = admin.get("/ready").await.unwrap();
    assert_eq!((code, body.trim()), (503, "DRAINING"));
    admin.drain_listeners(true).await.unwrap();
    assert_eq!(admin.ready().await.unwrap(), ReadyState::Draining);
    // Still accepting during the graceful drain; responses now close the connection.
    let mut during = connect(port).await.expect("still accepting");
    let (status, head, _) = http_get(&mut during, "/").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "drained HTTP/1 responses close the connection:\n{head}"
    );
    let (status, head, _) = http_get(&mut kept, "/").await;
    assert_eq!(status, 200);
    assert!(head.to_ascii_lowercase().contains("connection: close"));
    drop(during);
    drop(kept);
    assert!(
        eventually(common::EVENTUALLY, || async {
            admin.downstream_connections().await.unwrap() == 0
        })
        .await
    );
    // Stop the listeners: new connections are refused, the admin still answers.
    admin.drain_listeners(false).await.unwrap();
    assert!(
        eventually(common::EVENTUALLY, || async {
            connect(port).await.is_err()
        })
        .await,
        "listener still accepting after /drain_listeners"
    );
    assert_eq!(admin.ready().await.unwrap(), ReadyState::Draining);

    // Once the replica is stopped the socket file remains but nobody answers.
    engine.stop(&id, Duration::from_secs(5)).await.unwrap();
    let err = admin.ready().await.expect_err("stopped replica");
    let msg = format!("{err:#}");
    assert!(
        msg.contains(&admin.socket().display().to_string()) && msg.contains("connection refused"),
        "{msg}"
    );
}

#[tokio::test]
async fn missing_socket_is_a_clear_error() {
    let admin = Admin::new("/tmp/berth-no-such-dir/admin.sock");
    let msg = format!("{:#}", admin.ready().await.unwrap_err());
    assert!(
        msg.contains("admin socket /tmp/berth-no-such-dir/admin.sock") && msg.contains("no such"),
        "{msg}"
    );
}

#[tokio::test]
async fn too_long_socket_path_says_so() {
    let long = format!("/tmp/{}/admin.sock", "x".repeat(120));
    let msg = format!("{:#}", Admin::new(long).ready().await.unwrap_err());
    assert!(msg.contains("at most 107 bytes"), "{msg}");
}

#[tokio::test]
async fn a_silent_socket_times_out() {
    // A Unix socket that accepts but never answers.
    let dir = common::short_tempdir();
    let path = dir.path().join("s.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let admin = Admin::new(&path).with_timeout(Duration::from_millis(300));
    // The harness' own bound is only there so a missing timeout fails instead of hanging: the
    // error must be berth's, naming its 300 ms.
    let answer = tokio::time::timeout(Duration::from_secs(60), admin.ready())
        .await
        .expect("the admin client's own timeout never fired");
    let msg = format!("{:#}", answer.unwrap_err());
    assert!(msg.contains("no answer within 300ms"), "{msg}");
    hold.abort();
}

/// DESIGN decision 1 through this API: two replicas (uid 101, host network, reuse_port) on
/// one port both become LIVE and both serve.
#[tokio::test]
async fn two_replicas_share_one_port() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("two");
    let engine = DockerEngine::connect().await.unwrap();
    let port = free_port();
    let fx = Fixture::new(port);
    let mut admins = Vec::new();
    for slot in 0..2 {
        let name = format!("berth-{}-{slot}", cleanup.case);
        let replica = fx.replica("two", slot, &name, image);
        common::run_replica(&engine, replica, &cleanup).await;
        admins.push(fx.admin(&name));
    }
    for admin in &admins {
        assert_eq!(
            wait_live(admin, Duration::from_secs(30)).await,
            ReadyState::Live
        );
    }
    // Fresh connections are spread by the kernel; 64 are enough to reach both.
    for _ in 0..64 {
        let mut c = connect(port).await.unwrap();
        assert_eq!(http_get(&mut c, "/").await.0, 200);
    }
    for admin in &admins {
        let served = admin
            .stat("http.web.downstream_rq_2xx")
            .await
            .unwrap()
            .unwrap_or(0);
        assert!(served > 0, "a replica served nothing");
    }
}
