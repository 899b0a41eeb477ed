//! ACME DNS-01 end to end (issue 23 A) against Debian's pebble, started here on 127.0.0.1 with
//! its own HTTPS certificate (trusted through `ca_file`), resolving through a DNS server this
//! test runs: Debian's bind9 with a TSIG key for the rfc2136 solver, pebble-challtestsrv (TXT
//! records set through its management API by the test's hook script) for the hook solver. The
//! proxy has no plain-HTTP listener at all. Covered: a wildcard certificate over each solver,
//! served by SNI to two subdomains; the record removed afterwards; a forced renewal under HTTPS
//! load with no failed request (over each solver); a refused TSIG key, a record that never
//! becomes visible, a failing hook and a hanging one (killed at its timeout) each give a clear
//! error naming the solver while the old certificate (or the placeholder) keeps serving; serve
//! retries after the backoff.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::bind::{Named, KEY_NAME};
use common::config::table;
use common::fleet::{stderr, Fleet};
use common::load::assert_no_failures;
use common::pebble::{
    acme_table, https_proxy, listener_status, load_average, renew_under_load, serve_status,
    wait_issued, Options, Pebble,
};
use common::serve::Serve;
use common::tls::{served_by_name, served_serials_for};

const ZONE: &str = "berth.test";
const WILDCARD: &str = "*.berth.test";

fn config(https: u16, pebble: &Pebble, domains: &[&str], dns: toml::Value) -> String {
    let extra = [("challenge", "dns-01".into()), ("dns", dns)];
    https_proxy(https, acme_table(pebble, domains, &extra))
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
    let first = wait_issued(https, "a.berth.test", "").await;
    assert_wildcard_by_sni(https, &first).await;
    let st = listener_status(&fleet);
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
    let (renewal, second, report) = renew_under_load(&fleet, https, "a.berth.test", &first, || {
        write(&[WILDCARD, ZONE], rfc2136(&named, &secret))
    })
    .await;
    eprintln!(
        "rfc2136: wildcard issuance (berth up) {issuance:?}, forced renewal under load {renewal:?}; {}; load average {}",
        report.summary(),
        load_average()
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
    let st = listener_status(&fleet);
    assert_eq!(st["failures"], 2, "{st}");
}

/// The test's hook: sets and clears TXT records through challtestsrv's management API, whose
/// address and a token come from the env file (the token stands for a provider credential).
/// While `fail` exists it fails, printing the token (which berth must blank out); while `hang`
/// exists it hangs (berth kills it at its timeout).
const HOOK: &str = r#"#!/bin/sh
set -eu
echo "$BERTH_ACME_ACTION $BERTH_ACME_DOMAIN $BERTH_ACME_FQDN" >> "$HOOK_LOG"
if [ -e "$HOOK_HANG" ]; then
  sleep 60
fi
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

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn hook_wildcard_fails_is_retried_by_serve_renewed_under_load_and_a_hang_times_out() {
    let test = "hook_wildcard_fails_is_retried_by_serve_renewed_under_load_and_a_hang_times_out";
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
    let (fail, hang, log) = (
        dir.join("hook-fails"),
        dir.join("hook-hangs"),
        dir.join("hook.log"),
    );
    std::fs::write(&fail, "").unwrap();
    std::fs::write(
        dir.join("dns.env"),
        format!(
            "CHALLTESTSRV={}\nPROVIDER_TOKEN={TOKEN}\nHOOK_FAIL={}\nHOOK_HANG={}\nHOOK_LOG={}\n",
            pebble.management(),
            fail.display(),
            hang.display(),
            log.display()
        ),
    )
    .unwrap();
    let dns = |timeout: &str| {
        table([
            ("provider", "hook".into()),
            ("command", vec!["./dns-hook.sh"].into()),
            ("env_file", "dns.env".into()),
            ("timeout", timeout.into()),
            (
                "resolvers",
                vec![format!("127.0.0.1:{}", pebble.dns_port)].into(),
            ),
            ("propagation_interval", "200ms".into()),
        ])
    };
    let write = |domains: &[&str], timeout: &str| {
        std::fs::write(
            fleet.config(),
            config(https, &pebble, domains, dns(timeout)),
        )
        .unwrap()
    };
    write(&[WILDCARD], "20s");
    let serve = Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);

    // The hook fails: its words in /status, the token blanked, the placeholder serving.
    serve.wait_for(
        "the failed attempt in /status",
        Duration::from_secs(60),
        |s| serve_status(s)["failures"] == 1,
    );
    let st = serve_status(&serve);
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
        |s| serve_status(s)["issued_at"].is_i64(),
    );
    let serial = wait_issued(https, "a.berth.test", "").await;
    assert_wildcard_by_sni(https, &serial).await;
    let st = serve_status(&serve);
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
        load_average()
    );
    drop(serve);

    // A forced renewal (one more name, the zone's apex) over the hook under HTTPS load by SNI.
    let (renewal, second, report) =
        renew_under_load(&fleet, https, "a.berth.test", &serial, || {
            write(&[WILDCARD, ZONE], "20s")
        })
        .await;
    eprintln!(
        "hook: forced renewal under load {renewal:?}; {}; load average {}",
        report.summary(),
        load_average()
    );
    assert_no_failures("hook renewal", &report);
    assert!(served_names(https, ZONE).await.contains(&ZONE.to_string()));

    // A hook that hangs: killed at its timeout, a clear error naming the solver, the old
    // certificate serving, the next attempt planned after the backoff (serve makes it).
    std::fs::write(&hang, "").unwrap();
    write(&[WILDCARD], "1s");
    let started = Instant::now();
    let out = fleet.up().await;
    assert!(!out.status.success(), "up fails when the hook hangs");
    let err = stderr(&out);
    assert!(
        err.contains("dns-01 solver hook")
            && err.contains("did not finish within its timeout of 1s and was killed")
            && err.contains("the current certificate keeps serving"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the hang was cut short"
    );
    assert_eq!(
        served_serials_for(https, "b.berth.test", 8).await,
        [second.as_str()]
    );
    let st = listener_status(&fleet);
    assert_eq!(st["failures"], 1, "{st}");
    let (next, last) = (st["next_renewal"].as_i64(), st["last_attempt"].as_i64());
    assert!(
        next.zip(last).is_some_and(|(n, l)| n >= l + 30),
        "the next attempt waits out the backoff: {st}"
    );
}
