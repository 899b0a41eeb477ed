//! ACME DNS-01 end to end (issue 23 A) against Debian's pebble, started here on 127.0.0.1 with
//! its own HTTPS certificate (trusted through `ca_file`), resolving through a DNS server this
//! test runs: Debian's bind9 with a TSIG key for the rfc2136 solver, pebble-challtestsrv (TXT
//! records set through its management API by the test's hook script) for the hook solver. The
//! proxy has no plain-HTTP listener at all. Covered: a wildcard certificate over each solver,
//! served by SNI to two subdomains; the record removed afterwards; a forced renewal under HTTPS
//! load with no failed request; a refused TSIG key, a record that never becomes visible and a
//! failing hook each give a clear error naming the solver while the old certificate (or the
//! placeholder) keeps serving; serve retries after the backoff.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::bind::{Named, KEY_NAME};
use common::config::{table, Listener, Proxy, Route};
use common::fleet::{stderr, Fleet, PROXY};
use common::load::{assert_no_failures, Load};
use common::pebble::{Options, Pebble};
use common::serve::Serve;
use common::tls::{served_by_name, served_serials_for};
use common::TEST_IMAGE;

const ZONE: &str = "berth.test";
const WILDCARD: &str = "*.berth.test";

fn config(https: u16, pebble: &Pebble, domains: &[&str], dns: toml::Value) -> String {
    let acme = table([
        ("domains", domains.to_vec().into()),
        ("email", "ops@berth.test".into()),
        ("directory", pebble.directory().into()),
        ("ca_file", pebble.ca().display().to_string().into()),
        ("challenge", "dns-01".into()),
        ("dns", dns),
    ]);
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

fn rfc2136(named: &Named, secret_file: &Path) -> toml::Value {
    table([
        ("provider", "rfc2136".into()),
        ("server", named.addr().into()),
        ("zone", ZONE.into()),
        ("key_name", KEY_NAME.into()),
        ("algorithm", "hmac-sha256".into()),
        ("secret_file", secret_file.display().to_string().into()),
        ("propagation_interval", "200ms".into()),
        ("propagation_timeout", "20s".into()),
    ])
}

fn status(fleet: &Fleet) -> serde_json::Value {
    let path = fleet
        .state()
        .join("acme")
        .join(PROXY)
        .join("https")
        .join("status.json");
    serde_json::from_slice(&std::fs::read(path).expect("status.json")).unwrap()
}

/// The DNS names of the certificate one connection with SNI `name` is served.
async fn served_names(port: u16, name: &str) -> Vec<String> {
    use rustls::pki_types::ServerName;
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let sni = ServerName::try_from(name.to_string()).unwrap();
    let tls = common::tls::connector().connect(sni, stream).await.unwrap();
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    berth::ops::acme::dns_names(
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64_lines(leaf.as_ref())
        )
        .as_bytes(),
    )
    .unwrap()
}

fn base64_lines(der: &[u8]) -> String {
    use base64::Engine;
    let b = base64::engine::general_purpose::STANDARD.encode(der);
    b.as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Until every new connection with SNI `name` is served one serial issued by pebble other than
/// `not`, on every replica; that serial.
async fn wait_pebble_serial(port: u16, name: &str, not: &str) -> String {
    let start = Instant::now();
    loop {
        let (serial, issuer) = served_by_name(port, name).await.unwrap();
        let all = served_serials_for(port, name, 16).await;
        if issuer.contains("Pebble") && serial != not && all == [serial.clone()] {
            return serial;
        }
        assert!(
            start.elapsed() < common::EVENTUALLY,
            "not served by every replica: {serial} from {issuer}; {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Both subdomains are served the same wildcard certificate from pebble (real handshakes
/// through the host port, by SNI).
async fn assert_wildcard_by_sni(port: u16, serial: &str) {
    for name in ["a.berth.test", "b.berth.test"] {
        let (s, issuer) = served_by_name(port, name).await.unwrap();
        assert_eq!(s, serial, "{name}");
        assert!(issuer.contains("Pebble"), "{name}: {issuer}");
        assert!(
            served_names(port, name)
                .await
                .contains(&WILDCARD.to_string()),
            "{name}"
        );
    }
}

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn rfc2136_wildcard_served_by_sni_renewed_under_load_and_refusals_keep_the_old_one() {
    let test = "rfc2136_wildcard_served_by_sni_renewed_under_load_and_refusals_keep_the_old_one";
    if !common::pebble::installed(test) || !common::bind::installed(test) {
        return;
    }
    let fleet = Fleet::new("acmedns").await;
    let https = fleet.port;
    let named = Named::start(fleet.dir.path(), ZONE);
    let mut o = Options::new();
    o.dns = Some(named.addr());
    let pebble = Pebble::start_with(fleet.dir.path(), o);
    let secret = fleet.dir.path().join("tsig.key");
    std::fs::copy(named.key_file(), &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let write = |domains: &[&str], dns: toml::Value| {
        std::fs::write(fleet.config(), config(https, &pebble, domains, dns)).unwrap()
    };
    write(&[WILDCARD], rfc2136(&named, &secret));

    // First issuance: a wildcard over RFC 2136, no port 80 anywhere.
    let started = Instant::now();
    let out = fleet.up_ok().await;
    let issuance = started.elapsed();
    let first = wait_pebble_serial(https, "a.berth.test", "").await;
    assert_wildcard_by_sni(https, &first).await;
    let st = status(&fleet);
    assert_eq!(st["solver"], "dns-01 rfc2136", "{st}");
    assert!(st["last_error"].is_null(), "{st}");
    assert!(
        named.txt("_acme-challenge.berth.test").is_empty(),
        "the TXT record is removed after issuance"
    );
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let key_text = std::fs::read_to_string(&secret).unwrap();
    let secret_b64 = key_text.split('"').nth(3).unwrap();
    assert!(
        !printed.contains(secret_b64),
        "the TSIG secret is never printed"
    );

    // A forced renewal (one more name, the zone's apex) under HTTPS load by SNI.
    let load = Load::start_tls_named(https, "/", 8, Duration::from_secs(120), "a.berth.test");
    tokio::time::sleep(Duration::from_millis(500)).await;
    write(&[WILDCARD, ZONE], rfc2136(&named, &secret));
    let started = Instant::now();
    fleet.up_ok().await;
    let renewal = started.elapsed();
    let second = wait_pebble_serial(https, "a.berth.test", &first).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.stop().await;
    eprintln!(
        "rfc2136: wildcard issuance (berth up) {issuance:?}, forced renewal under load {renewal:?}; {}; load average {}",
        report.summary(),
        load_avg()
    );
    assert_no_failures("rfc2136 renewal", &report);
    assert!(served_names(https, ZONE).await.contains(&ZONE.to_string()));
    assert!(named.txt("_acme-challenge.berth.test").is_empty());

    // A TSIG key the server refuses: a clear error naming the solver; the old one serves.
    std::fs::write(&secret, "c2VjcmV0IHRoZSBzZXJ2ZXIgZG9lcyBub3Qga25vdw==\n").unwrap();
    write(&[WILDCARD], rfc2136(&named, &secret));
    let out = fleet.up().await;
    assert!(!out.status.success(), "up fails when the key is refused");
    let err = stderr(&out);
    assert!(
        err.contains("dns-01 solver rfc2136")
            && err.contains("refused the update")
            && err.contains("BADSIG")
            && err.contains("the current certificate keeps serving"),
        "{err}"
    );
    assert_eq!(
        served_serials_for(https, "b.berth.test", 8).await,
        [second.as_str()]
    );

    // A record that never becomes visible where berth looks: bounded, named, cleaned up.
    std::fs::copy(named.key_file(), &secret).unwrap();
    let mut dns = rfc2136(&named, &secret);
    let t = dns.as_table_mut().unwrap();
    t.insert(
        "resolvers".into(),
        vec![format!("127.0.0.1:{}", pebble.dns_port)].into(),
    );
    t.insert("propagation_timeout".into(), "2s".into());
    write(&[WILDCARD], dns);
    let out = fleet.up().await;
    assert!(
        !out.status.success(),
        "up fails when the record never shows"
    );
    let err = stderr(&out);
    assert!(
        err.contains("dns-01 solver rfc2136")
            && err.contains("did not become visible within propagation_timeout 2s"),
        "{err}"
    );
    assert!(
        named.txt("_acme-challenge.berth.test").is_empty(),
        "the record is removed after a failure too"
    );
    assert_eq!(
        served_serials_for(https, "b.berth.test", 8).await,
        [second.as_str()]
    );
    let st = status(&fleet);
    assert_eq!(st["failures"], 2, "{st}");
}

/// The test's hook: sets and clears TXT records through challtestsrv's management API, whose
/// address and a token come from the env file (the token stands for a provider credential).
/// While `fail` exists it fails, printing the token (which berth must blank out).
const HOOK: &str = r#"#!/bin/sh
set -eu
echo "$BERTH_ACME_ACTION $BERTH_ACME_DOMAIN $BERTH_ACME_FQDN" >> "$HOOK_LOG"
if [ -e "$HOOK_FAIL" ]; then
  echo "the provider refused token $PROVIDER_TOKEN" >&2
  exit 3
fi
case "$BERTH_ACME_ACTION" in
  present) curl -sf -X POST -d "{\"host\":\"$BERTH_ACME_FQDN.\",\"value\":\"$BERTH_ACME_VALUE\"}" "$CHALLTESTSRV/set-txt" ;;
  cleanup) curl -sf -X POST -d "{\"host\":\"$BERTH_ACME_FQDN.\"}" "$CHALLTESTSRV/clear-txt" ;;
esac
"#;
const TOKEN: &str = "tok-3f9a1c77e2";

fn acme_status(serve: &Serve) -> serde_json::Value {
    serve.proxy(PROXY)["certificates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["listener"] == "https"))
        .map(|c| c["acme"].clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn hook_wildcard_under_serve_fails_clearly_then_is_retried_and_served_by_sni() {
    let test = "hook_wildcard_under_serve_fails_clearly_then_is_retried_and_served_by_sni";
    if !common::pebble::installed(test) {
        return;
    }
    let fleet = Fleet::new("acmehook").await;
    let https = fleet.port;
    let pebble = Pebble::start_with(fleet.dir.path(), Options::new());
    let dir = fleet.dir.path();
    let hook = dir.join("dns-hook.sh");
    std::fs::write(&hook, HOOK).unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (fail, log) = (dir.join("hook-fails"), dir.join("hook.log"));
    std::fs::write(&fail, "").unwrap();
    std::fs::write(
        dir.join("dns.env"),
        format!(
            "CHALLTESTSRV={}\nPROVIDER_TOKEN={TOKEN}\nHOOK_FAIL={}\nHOOK_LOG={}\n",
            pebble.management(),
            fail.display(),
            log.display()
        ),
    )
    .unwrap();
    let dns = table([
        ("provider", "hook".into()),
        ("command", vec!["./dns-hook.sh"].into()),
        ("env_file", "dns.env".into()),
        ("timeout", "20s".into()),
        (
            "resolvers",
            vec![format!("127.0.0.1:{}", pebble.dns_port)].into(),
        ),
        ("propagation_interval", "200ms".into()),
    ]);
    std::fs::write(fleet.config(), config(https, &pebble, &[WILDCARD], dns)).unwrap();
    let serve = Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);

    // The hook fails: its words in /status, the token blanked, the placeholder serving.
    serve.wait_for(
        "the failed attempt in /status",
        Duration::from_secs(60),
        |s| acme_status(s)["failures"] == 1,
    );
    let st = acme_status(&serve);
    let error = st["last_error"].as_str().unwrap_or_default().to_string();
    assert!(
        error.contains("dns-01 solver hook")
            && error.contains("dns-hook.sh")
            && error.contains("the provider refused token [redacted]")
            && !error.contains(TOKEN),
        "{st}"
    );
    assert_eq!(st["solver"], "dns-01 hook", "{st}");
    let (_, issuer) = served_by_name(https, "a.berth.test").await.unwrap();
    assert!(issuer.contains("berth ACME placeholder"), "{issuer}");

    // Fixed: serve retries after the backoff by itself.
    std::fs::remove_file(&fail).unwrap();
    let retry = serve.wait_for(
        "the retry after the backoff",
        Duration::from_secs(90),
        |s| acme_status(s)["issued_at"].is_i64(),
    );
    let serial = wait_pebble_serial(https, "a.berth.test", "").await;
    assert_wildcard_by_sni(https, &serial).await;
    let st = acme_status(&serve);
    assert!(st["last_error"].is_null() && st["failures"] == 0, "{st}");
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(
        calls.contains("present berth.test _acme-challenge.berth.test")
            && calls.contains("cleanup berth.test _acme-challenge.berth.test"),
        "{calls}"
    );
    let took = serve
        .log_text()
        .lines()
        .rev()
        .filter_map(|l| l.split("served by every replica in ").nth(1))
        .map(|t| t.split(['"', ' ']).next().unwrap_or_default().to_string())
        .next()
        .unwrap_or_default();
    assert!(
        !serve.log_text().contains(TOKEN),
        "the token is never logged"
    );
    eprintln!(
        "hook: issued {retry:?} after the hook was fixed (first backoff 30s); issuance {took}; load average {}",
        load_avg()
    );
}
