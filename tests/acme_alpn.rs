//! ACME TLS-ALPN-01 end to end (issue 23 B) against Debian's pebble (names resolved to
//! 127.0.0.1 by pebble-challtestsrv): the proxy has only its HTTPS listener and nothing listens
//! on the port pebble would ask HTTP-01 at, so the CA can only validate on the HTTPS listener
//! itself (ALPN `acme-tls/1`), through the host port. Covered: first issuance; a forced renewal
//! (one more name) under HTTPS load whose SNI is a challenged name, with no failed request and
//! no replica replaced; the challenge chains gone afterwards.

mod common;

use std::time::{Duration, Instant};

use common::config::{table, Listener, Proxy, Route};
use common::fleet::{Fleet, PROXY};
use common::load::{assert_no_failures, Load};
use common::pebble::{acme_table, listener_status, load_average, wait_issued, Options, Pebble};
use common::tls::served_by_name;
use common::TEST_IMAGE;

const DOMAIN: &str = "edge.berth.test";

fn config(https: u16, pebble: &Pebble, domains: &[&str]) -> String {
    let acme = acme_table(pebble, domains, &[("challenge", "tls-alpn-01".into())]);
    Proxy::test(PROXY, TEST_IMAGE, 2)
        .listener(
            Listener::https("https", https, table([("acme", acme)])).route(Route::direct(
                "/",
                200,
                "hello over TLS\n",
            )),
        )
        .to_toml()
}

/// Every listener file berth delivered, concatenated.
fn delivered_listeners(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "lds.yaml") {
                out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn tls_alpn_01_issues_with_port_80_unused_and_renews_under_https_load() {
    let test = "tls_alpn_01_issues_with_port_80_unused_and_renews_under_https_load";
    if !common::pebble::installed(test) {
        return;
    }
    let fleet = Fleet::new("acmealpn").await;
    let https = fleet.port;
    let mut o = Options::new();
    o.tls_port = https;
    let http_port = o.http_port;
    let pebble = Pebble::start_with(fleet.dir.path(), o);
    std::fs::write(fleet.config(), config(https, &pebble, &[DOMAIN])).unwrap();

    let started = Instant::now();
    fleet.up_ok().await;
    let issuance = started.elapsed();
    let first = wait_issued(https, DOMAIN, "").await;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", http_port)).is_err(),
        "nothing answers where pebble would ask HTTP-01"
    );
    let st = listener_status(&fleet);
    assert_eq!(st["solver"], "tls-alpn-01", "{st}");
    let replicas = fleet.ids().await;

    // Forced renewal (one more name) under load whose SNI is a challenged name.
    let load = Load::start_tls_named(https, "/", 8, Duration::from_secs(120), DOMAIN);
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(
        fleet.config(),
        config(https, &pebble, &[DOMAIN, "www.berth.test"]),
    )
    .unwrap();
    let started = Instant::now();
    fleet.up_ok().await;
    let renewal = started.elapsed();
    let second = wait_issued(https, DOMAIN, &first).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.stop().await;
    eprintln!(
        "tls-alpn-01: issuance (berth up) {issuance:?}, forced renewal under load {renewal:?}; {}; load average {}",
        report.summary(),
        load_average()
    );
    assert_no_failures("tls-alpn-01 renewal", &report);
    assert_eq!(
        fleet.ids().await,
        replicas,
        "the challenge replaced no replica"
    );
    let (www, issuer) = served_by_name(https, "www.berth.test").await.unwrap();
    assert!(www == second && issuer.contains("Pebble"), "{www} {issuer}");
    let lds = delivered_listeners(&fleet.state());
    assert!(!lds.is_empty(), "no lds.yaml under the state directory");
    assert!(!lds.contains("acme-tls/1"), "challenge chains are removed");
}
