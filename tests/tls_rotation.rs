//! Listener certificates rotate live (issue 11 A): a renewed certificate and key, replaced on
//! disk by rename as certbot does, are served by every replica after `berth up` (and after
//! `berth serve` notices the files changed), under HTTPS load with no failed request and no
//! container replaced. A key that does not match its certificate, or an expired certificate,
//! is refused before delivery and the old certificate keeps serving. Serials are read from
//! real TLS handshakes through the host port.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::config::{tls_files, Listener, Proxy, Route};
use common::fleet::{assert_no_failures, ensure_images, stderr, Fleet, PROXY};
use common::load::Load;
use common::serve::Serve;
use common::tls::{pair, replace, served_serials};
use common::EVENTUALLY;
use common::TEST_IMAGE;

fn config(port: u16) -> String {
    Proxy::test(PROXY, TEST_IMAGE, 2)
        .listener(
            Listener::https("https", port, tls_files("cert.pem", "key.pem")).route(Route::direct(
                "/",
                200,
                "hello over TLS\n",
            )),
        )
        .to_toml()
}

struct Files {
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    fn new(fleet: &Fleet) -> Files {
        Files {
            cert: fleet.dir.path().join("cert.pem"),
            key: fleet.dir.path().join("key.pem"),
        }
    }

    /// Certificate first, then key, each by rename (as certbot).
    fn put(&self, (cert, key): &(String, String)) {
        replace(&self.cert, cert);
        replace(&self.key, key);
    }
}

/// Until 16 new connections in a row are served `serial`; the time it took and how many
/// rounds of 16 handshakes.
async fn wait_served(port: u16, serial: &str, within: Duration) -> (Duration, u32) {
    let start = Instant::now();
    for round in 1.. {
        let seen = served_serials(port, 16).await;
        if seen == [serial] {
            return (start.elapsed(), round);
        }
        assert!(
            start.elapsed() < within,
            "serial {serial} not served by every replica within {within:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_renewed_certificate_is_served_after_up_and_bad_ones_are_refused() {
    ensure_images();
    let fleet = Fleet::new("tlsrotate").await;
    let files = Files::new(&fleet);
    files.put(&pair(0x1001, 2020, 2090));
    std::fs::write(fleet.config(), config(fleet.port)).unwrap();
    fleet.up_ok().await;
    let before = fleet.ids().await;
    assert_eq!(before.len(), 2);
    assert_eq!(served_serials(fleet.port, 16).await, ["1001"]);

    let load = Load::start_tls(fleet.port, "/", 8, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_millis(500)).await;
    files.put(&pair(0x1002, 2020, 2090));
    let changed = Instant::now();
    let out = fleet.up().await;
    assert!(out.status.success(), "berth up failed");
    let up_took = changed.elapsed();
    // Order: up returns once every replica's Envoy lists the new serial...
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("confirmed by 2 replica(s)"),
        "berth up confirms the new files from every replica: {printed}"
    );
    // ...so new handshakes get it (the bound only ends a hang).
    let (serving, rounds) = wait_served(fleet.port, "1002", EVENTUALLY).await;
    eprintln!(
        "rotation through up: every replica served the new serial {:?} after the file change \
         (berth up took {up_took:?}, then {serving:?} and {rounds} round(s) of 16 handshakes)",
        up_took + serving
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A key of another pair: refused, naming the key file; the old certificate keeps serving.
    let (cert, _) = pair(0x1003, 2020, 2090);
    let (_, other_key) = pair(0x1004, 2020, 2090);
    files.put(&(cert, other_key));
    let out = fleet.up().await;
    assert!(!out.status.success(), "a mismatched key is refused");
    let err = stderr(&out);
    assert!(
        err.contains(&files.key.display().to_string()) && err.contains("does not match"),
        "{err}"
    );
    assert_eq!(served_serials(fleet.port, 16).await, ["1002"]);

    // An expired certificate: refused, naming the certificate file.
    files.put(&pair(0x1005, 2001, 2002));
    let out = fleet.up().await;
    assert!(!out.status.success(), "an expired certificate is refused");
    let err = stderr(&out);
    assert!(
        err.contains(&files.cert.display().to_string()) && err.contains("expired"),
        "{err}"
    );
    // Not PEM at all.
    std::fs::write(&files.cert, "not a certificate\n").unwrap();
    let out = fleet.up().await;
    assert!(!out.status.success(), "a non-PEM file is refused");
    assert!(stderr(&out).contains("not a PEM"), "{}", stderr(&out));
    assert_eq!(served_serials(fleet.port, 16).await, ["1002"]);

    let report = load.stop().await;
    assert_no_failures("certificate rotation through up", &report);
    assert_eq!(fleet.ids().await, before, "no container was replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn serve_notices_a_renewed_certificate_and_serves_it() {
    ensure_images();
    let fleet = Fleet::new("tlsserve").await;
    let files = Files::new(&fleet);
    files.put(&pair(0x2001, 2020, 2090));
    std::fs::write(fleet.config(), config(fleet.port)).unwrap();
    fleet.up_ok().await;
    let before = fleet.ids().await;
    let serve = Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);
    serve.wait_for("the proxy converged", Duration::from_secs(60), |s| {
        s.converged(PROXY, 2)
    });

    let load = Load::start_tls(fleet.port, "/", 8, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_millis(500)).await;
    files.put(&pair(0x2002, 2020, 2090));
    let (took, rounds) = wait_served(fleet.port, "2002", EVENTUALLY).await;
    eprintln!(
        "rotation through serve: every replica served the new serial {took:?} after the file \
         change ({rounds} round(s) of 16 handshakes)"
    );
    tokio::task::block_in_place(|| {
        serve.wait_for("converged", Duration::from_secs(30), |s| {
            s.converged(PROXY, 2)
        })
    });
    // Status shows the certificate's expiry.
    let p = serve.proxy(PROXY);
    let certs = p["certificates"].as_array().cloned().unwrap_or_default();
    assert!(
        certs.iter().any(|c| c["serial"] == "2002"
            && c["listener"] == "https"
            && c["notAfter"].is_number()),
        "{p:#}"
    );
    let metrics = serve.get("/metrics").expect("metrics").1;
    assert!(
        metrics.lines().any(
            |l| l.starts_with("berth_certificate_expiry_timestamp_seconds{")
                && l.contains("serial=\"2002\"")
        ),
        "{metrics}"
    );

    // A mismatched key: refused, the old certificate keeps serving.
    let (cert, _) = pair(0x2003, 2020, 2090);
    let (_, other_key) = pair(0x2004, 2020, 2090);
    files.put(&(cert, other_key));
    tokio::task::block_in_place(|| {
        serve.wait_for("the edit refused", Duration::from_secs(30), |s| {
            s.log_text().contains("does not match")
        })
    });
    assert_eq!(served_serials(fleet.port, 16).await, ["2002"]);

    let report = load.stop().await;
    assert_no_failures("certificate rotation through serve", &report);
    assert_eq!(fleet.ids().await, before, "no container was replaced");
}
