//! ACME end to end (issue 11 B) against Debian's pebble, started here on 127.0.0.1 with its own
//! HTTPS certificate (trusted through `ca_file`) and pebble-challtestsrv as its DNS server, so
//! the test's names resolve to 127.0.0.1. Pebble validates HTTP-01 on the proxy's plain-HTTP
//! listener: berth answers through the proxy itself. Covered: first issuance served by every
//! replica (issuer is pebble); renewal at two thirds of a short lifetime under HTTPS load with no
//! failed request; pebble down → a clear error, the old certificate keeps serving, and the next
//! attempt succeeds once pebble is back. Pebble is killed when the test ends, even on failure.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::config::{table, Listener, Proxy, Route};
use common::fleet::{stderr, Fleet, PROXY};
use common::load::{assert_no_failures, Load};
use common::pebble::{
    acme_table, listener_status, serve_status, wait_issued, Pebble, CHALLTESTSRV, PEBBLE,
};
use common::serve::Serve;
use common::tls::{served_by_name, served_serials};
use common::{free_port, TEST_IMAGE};

const DOMAIN: &str = "edge.berth.test";
/// Pebble's certificate lifetime: renewal is due two thirds in.
const VALIDITY_S: u64 = 60;

fn config(http: u16, https: u16, pebble: &Pebble, domains: &[&str]) -> String {
    let acme = acme_table(pebble, domains, &[]);
    Proxy::test(PROXY, TEST_IMAGE, 2)
        .listener(Listener::http("web", http).route(Route::direct("/", 200, "plain\n")))
        .listener(
            Listener::https("https", https, table([("acme", acme)])).route(Route::direct(
                "/",
                200,
                "hello over TLS\n",
            )),
        )
        .to_toml()
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn certificates_are_issued_renewed_under_load_and_survive_the_ca_being_down() {
    assert!(
        Path::new(PEBBLE).exists() && Path::new(CHALLTESTSRV).exists(),
        "pebble is not installed: apt-get install pebble (.ci/run does)"
    );
    let fleet = Fleet::new("acme").await;
    let http = fleet.port;
    let https = free_port();
    let mut pebble = Pebble::start(fleet.dir.path(), http, VALIDITY_S);
    std::fs::write(fleet.config(), config(http, https, &pebble, &[DOMAIN])).unwrap();

    // First issuance: the proxy starts with a placeholder, answers the challenge, serves pebble's.
    let started = Instant::now();
    let out = fleet.up_ok().await;
    let issuance = started.elapsed();
    let first = wait_issued(https, DOMAIN, "").await;
    eprintln!(
        "first issuance: berth up took {issuance:?} (placeholder, converge, order, delivery)"
    );
    let st = listener_status(&fleet);
    assert_eq!(st["placeholder"], false, "{st}");
    assert!(st["last_error"].is_null(), "{st}");
    let acme_dir = fleet.state().join("acme");
    let key = acme_dir.join(PROXY).join("https").join("key.pem");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let accounts: Vec<_> = std::fs::read_dir(acme_dir.join("accounts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(accounts.len(), 1);
    assert_eq!(
        std::fs::metadata(&accounts[0])
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let key_text = std::fs::read_to_string(&key).unwrap();
    let key_body = key_text.lines().nth(1).unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!printed.contains(key_body), "the key is never printed");
    // The challenge route is gone again.
    let plain = reqwest_get(http, "/.well-known/acme-challenge/x").await;
    assert_eq!(plain, "plain\n");

    // Not due yet: up changes nothing.
    let out = fleet.up_ok().await;
    assert!(!String::from_utf8_lossy(&out.stdout).contains("\"acme\""));
    assert_eq!(served_serials(https, 8).await, [first.as_str()]);

    // Renewal at two thirds of the lifetime, under HTTPS load.
    let due = st["next_renewal"].as_i64().expect("next_renewal");
    let wait = (due - now_s()).max(0) as u64;
    assert!(wait <= VALIDITY_S, "renewal planned {wait}s ahead");
    tokio::time::sleep(Duration::from_secs(wait + 1)).await;
    let load = Load::start_tls(https, "/", 8, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    fleet.up_ok().await;
    let renewal = started.elapsed();
    let second = wait_issued(https, DOMAIN, &first).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.stop().await;
    eprintln!(
        "renewal under load: berth up took {renewal:?}; {}",
        report.summary()
    );
    assert_no_failures("renewal", &report);

    // The CA is down: a clear error naming it; the current certificate keeps serving.
    pebble.stop_pebble();
    std::fs::write(
        fleet.config(),
        config(http, https, &pebble, &[DOMAIN, "www.berth.test"]),
    )
    .unwrap();
    let out = fleet.up().await;
    assert!(!out.status.success(), "up fails while the CA is down");
    let err = stderr(&out);
    assert!(
        err.contains("could not obtain a certificate") && err.contains(&pebble.directory()),
        "{err}"
    );
    assert_eq!(served_serials(https, 16).await, [second.as_str()]);
    let st = listener_status(&fleet);
    assert_eq!(st["failures"], 1, "{st}");
    assert!(st["last_error"]
        .as_str()
        .unwrap()
        .contains(&pebble.directory()));

    // Back: the next attempt succeeds (pebble forgot the account; berth registers again).
    pebble.start_pebble();
    fleet.up_ok().await;
    let third = wait_issued(https, DOMAIN, &second).await;
    let (_, issuer) = served_by_name(https, "www.berth.test").await.unwrap();
    assert!(issuer.contains("Pebble"), "{issuer}");
    let st = listener_status(&fleet);
    assert_eq!(st["failures"], 0, "{st}");
    assert!(st["last_error"].is_null(), "{st}");
    eprintln!("serials: {first} → {second} → {third}");
}

/// The body of a plain GET to 127.0.0.1:port.
async fn reqwest_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {DOMAIN}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
}

/// `berth serve` obtains the certificate with no command: the CA is down at first (the error
/// is in /status, a placeholder serves), the attempt is retried after its backoff once the CA
/// is back, and the renewal component renews at two thirds of the lifetime by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn serve_retries_after_backoff_and_renews_when_due() {
    assert!(
        Path::new(PEBBLE).exists() && Path::new(CHALLTESTSRV).exists(),
        "pebble is not installed: apt-get install pebble (.ci/run does)"
    );
    let fleet = Fleet::new("acmeserve").await;
    let (http, https) = (fleet.port, free_port());
    let mut pebble = Pebble::start(fleet.dir.path(), http, VALIDITY_S);
    pebble.stop_pebble();
    std::fs::write(fleet.config(), config(http, https, &pebble, &[DOMAIN])).unwrap();
    let serve = Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);

    serve.wait_for(
        "the failed attempt in /status",
        Duration::from_secs(60),
        |s| serve_status(s)["failures"] == 1,
    );
    let st = serve_status(&serve);
    let error = st["last_error"].as_str().unwrap_or_default().to_string();
    assert!(error.contains(&pebble.directory()), "{st}");
    assert_eq!(st["placeholder"], true, "{st}");
    let (_, issuer) = served_by_name(https, DOMAIN).await.unwrap();
    assert!(issuer.contains("berth ACME placeholder"), "{issuer}");

    pebble.start_pebble();
    let retry = serve.wait_for(
        "the retry after the backoff",
        Duration::from_secs(90),
        |s| serve_status(s)["issued_at"].is_i64(),
    );
    eprintln!("serve: issued {retry:?} after pebble came back (first backoff 30s)");
    let first = wait_issued(https, DOMAIN, "").await;
    let st = serve_status(&serve);
    assert!(st["last_error"].is_null() && st["failures"] == 0, "{st}");

    let issued = st["issued_at"].as_i64().unwrap();
    serve.wait_for(
        "the renewal at two thirds",
        Duration::from_secs(VALIDITY_S + 30),
        |s| {
            serve_status(s)["issued_at"]
                .as_i64()
                .is_some_and(|t| t > issued)
        },
    );
    let second = wait_issued(https, DOMAIN, &first).await;
    eprintln!("serve renewed by itself: {first} → {second}");
}
