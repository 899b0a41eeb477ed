//! Backends real apps need (issue 11 C, backend side), end to end through the real binary, real
//! Envoy replicas and real clients on 127.0.0.1:
//!
//! - gRPC: `protocol = "h2"`; a unary call and a server-streaming call through berth to a tonic
//!   service the test starts; a stream open during a rollout lives through the old replica's
//!   drain window (longer than Envoy's default 15 s route timeout, which h2 routes turn off) and
//!   is closed only when the drain window ends;
//! - backend TLS: HTTPS to a rustls backend verified against the configured CA (and its SNI
//!   name); a wrong CA answers 503; a backend that requires a client certificate gets berth's;
//!   a renewed CA and client certificate replaced on disk reach the running replicas without a
//!   restart; an expired CA is refused and the old files keep being used.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::config as cfg;
use common::fleet::{ensure_images, stderr, Fleet, NEW, OLD, PROXY};
use common::serve::http_get;
use common::tls::replace;
use common::upstream::{echo, echo_client, grpc_echo, https_backend, Pki};
use tokio::io::AsyncBufReadExt;

fn grpc_config(image: &str, port: u16, backend: u16, drain: &str) -> String {
    cfg::Proxy::test(PROXY, image, 1)
        .set("shutdown.drain_timeout", drain)
        .listener(cfg::Listener::http("grpc", port).route(cfg::Route::backend("/", "echo")))
        .backend(cfg::Backend::local("echo", backend).set("protocol", "h2"))
        .to_toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn grpc_unary_and_server_streaming_calls_through_berth() {
    ensure_images();
    let fleet = Fleet::new("grpc").await;
    let (backend, _server) = grpc_echo().await;
    std::fs::write(fleet.config(), grpc_config(NEW, fleet.port, backend, "5s")).unwrap();
    fleet.up_ok().await;

    let mut client = echo_client(fleet.port).await;
    let reply = client
        .say(echo::Text {
            text: "hello".into(),
        })
        .await
        .expect("unary call through berth")
        .into_inner();
    assert_eq!(reply.text, "hello (via envoy: true)");

    let mut stream = client
        .count(echo::CountRequest {
            count: 5,
            interval_ms: 50,
        })
        .await
        .expect("server-streaming call through berth")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = stream.message().await.expect("stream message") {
        got.push(m.text);
    }
    assert_eq!(
        got,
        ["0", "1", "2", "3", "4"],
        "every message, in order, then OK"
    );

    // The same backend spoken to as HTTP/1.1 cannot serve gRPC: the setting is what works.
    let http1 = grpc_config(NEW, fleet.port, backend, "5s").replace("protocol = \"h2\"\n", "");
    std::fs::write(fleet.config(), http1).unwrap();
    fleet.up_ok().await;
    let mut client = echo_client(fleet.port).await;
    let err = client
        .say(echo::Text { text: "x".into() })
        .await
        .expect_err("gRPC to an HTTP/1.1 backend fails");
    eprintln!("gRPC through an http1 backend: {err}");
}

/// `berth up` with its JSON events read as they come: each event with the time it arrived.
async fn up_streaming(fleet: &Fleet) -> (Vec<(Instant, serde_json::Value)>, bool) {
    let mut child = fleet
        .berth(&["--output", "json", "up"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("running berth");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut events = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        eprintln!("berth up: {line}");
        if let Ok(v) = serde_json::from_str(&line) {
            events.push((Instant::now(), v));
        }
    }
    let ok = child.wait().await.unwrap().success();
    (events, ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_grpc_stream_open_during_a_rollout_lasts_the_drain_window() {
    ensure_images();
    let fleet = Fleet::new("grpcdrain").await;
    let (backend, _server) = grpc_echo().await;
    // Long enough that the stream outlives Envoy's default route timeout (15 s) too.
    let drain = Duration::from_secs(14);
    let config = |image| grpc_config(image, fleet.port, backend, "14s");
    std::fs::write(fleet.config(), config(OLD)).unwrap();
    fleet.up_ok().await;
    let old = fleet.ids().await;

    let mut client = echo_client(fleet.port).await;
    let opened = Instant::now();
    let mut stream = client
        .count(echo::CountRequest {
            count: 100_000,
            interval_ms: 100,
        })
        .await
        .expect("stream through berth")
        .into_inner();
    let reader = tokio::spawn(async move {
        let mut times = Vec::new();
        let end = loop {
            match stream.message().await {
                Ok(Some(_)) => times.push(Instant::now()),
                Ok(None) => break "ended with OK".to_string(),
                Err(e) => break format!("ended: {e}"),
            }
        };
        (times, end)
    });
    tokio::time::sleep(Duration::from_secs(2)).await;

    std::fs::write(fleet.config(), config(NEW)).unwrap();
    let (events, ok) = up_streaming(&fleet).await;
    assert!(ok, "the rollout succeeds");
    assert_ne!(fleet.ids().await, old, "the replica was replaced");
    let at = |name: &str| {
        events
            .iter()
            .find(|(_, e)| e["event"] == name)
            .unwrap_or_else(|| panic!("no {name} event"))
            .clone()
    };
    let (draining, _) = at("draining");
    let (drained, drained_event) = at("drained");
    let (times, end) = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the stream ends once the old replica is gone")
        .unwrap();
    let last = *times.last().expect("messages");
    let after_drain_began = times.iter().filter(|t| **t > draining).count();
    eprintln!(
        "gRPC stream: {} messages, {after_drain_began} after the drain began; lived {:?} \
         ({:?} of it after the drain began); {end}; drained event: {}",
        times.len(),
        last - opened,
        last.saturating_duration_since(draining),
        drained_event["message"]
    );
    // berth waited the drain window for this stream's connection instead of cutting it…
    assert!(
        drained_event["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("1 connection(s) left")),
        "{drained_event}"
    );
    // …and the stream kept flowing until the window ended (messages every 100 ms). The slack
    // covers a busy host's stalls (the gap is printed above); a stream cut when the drain
    // began would end the whole 14 s window earlier.
    assert!(
        last + Duration::from_secs(2) >= drained,
        "the stream stopped {:?} before the drain window ended",
        drained.saturating_duration_since(last)
    );
    assert!(drained.duration_since(draining) >= drain - Duration::from_millis(500));
    assert!(
        last - opened > Duration::from_secs(15),
        "the stream outlived Envoy's default route timeout"
    );

    // A new stream is served by the new replica.
    let mut client = echo_client(fleet.port).await;
    let reply = client
        .say(echo::Text { text: "new".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.text, "new (via envoy: true)");
}

fn tls_config(port: u16, backends: Vec<cfg::Backend>) -> String {
    let web = cfg::Listener::http("web", port)
        .route(cfg::Route::backend("/mtls", "mtls"))
        .route(cfg::Route::backend("/", "api"));
    backends
        .into_iter()
        .fold(cfg::Proxy::test(PROXY, NEW, 2).listener(web), |p, b| {
            p.backend(b)
        })
        .to_toml()
}

fn get(port: u16, path: &str) -> (u16, String) {
    http_get(port, path).expect("an HTTP answer through berth")
}

/// Until every one of 8 requests is answered `want` (replicas reload their secrets on their
/// own, after `berth up` returned; the bound only ends a hang); the answers seen last
/// otherwise. Prints how long it took.
async fn wait_answer(port: u16, path: &str, want: &(u16, String)) {
    let start = Instant::now();
    loop {
        let seen: Vec<(u16, String)> = (0..8).map(|_| get(port, path)).collect();
        if seen.iter().all(|s| s == want) {
            eprintln!(
                "{path}: answered {want:?} {:?} after berth up",
                start.elapsed()
            );
            return;
        }
        assert!(
            start.elapsed() < common::EVENTUALLY,
            "{path}: wanted {want:?}, got {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn https_to_tls_backends_verified_with_client_certificates_rotated_live() {
    ensure_images();
    let fleet = Fleet::new("backtls").await;
    let pki = Pki::new(&fleet.dir.path().join("pki"));
    let ca = pki.ca("ca");
    let _other = pki.ca("other-ca");
    let (cert, key) = pki.leaf(&ca, "api", &["api.internal"], 0xa1);
    let (api, _api) = https_backend("api", &cert, &key, None).await;
    // The mTLS backend trusts client certificates signed by `ca`.
    let (mcert, mkey) = pki.leaf(&ca, "mtls", &["mtls.internal"], 0xb1);
    let (mtls, _mtls) = https_backend("mtls", &mcert, &mkey, Some(&pki.path("ca.pem"))).await;
    pki.leaf(&ca, "client", &["berth-client"], 0xc1);
    let trust = pki.path("trusted.pem");
    std::fs::copy(pki.path("ca.pem"), &trust).unwrap();
    // The api backend verified with `api_ca` and SNI `api_sni`; the mTLS one on `mtls_port`,
    // with berth's client certificate when `client`.
    let backends = |api_ca: &str, api_sni: &str, client: bool, mtls_port: u16| {
        let mut mtls_tls = cfg::Backend::local("mtls", mtls_port)
            .set("tls.ca_file", "pki/trusted.pem")
            .set("tls.sni", "mtls.internal");
        if client {
            mtls_tls = mtls_tls
                .set("tls.cert_file", "pki/client.pem")
                .set("tls.key_file", "pki/client-key.pem");
        }
        vec![
            cfg::Backend::local("api", api)
                .set("tls.ca_file", api_ca)
                .set("tls.sni", api_sni),
            mtls_tls,
        ]
    };
    let write_up = |api_ca: &str, api_sni: &str, client: bool, mtls_port: u16| {
        fleet.write_toml(&tls_config(
            fleet.port,
            backends(api_ca, api_sni, client, mtls_port),
        ));
        fleet.up_ok()
    };
    let ok = |body: &str| (200, body.to_string());

    // No client certificate: the mTLS backend refuses the handshake.
    write_up("pki/trusted.pem", "api.internal", false, mtls).await;
    let ids = fleet.ids().await;
    assert_eq!(get(fleet.port, "/"), ok("api client=none\n"));
    let (status, _) = get(fleet.port, "/mtls");
    assert_eq!(
        status, 503,
        "a backend requiring a client certificate got none"
    );

    // With one: served, and the backend saw berth's client certificate.
    write_up("pki/trusted.pem", "api.internal", true, mtls).await;
    assert_eq!(get(fleet.port, "/mtls"), ok("mtls client=c1\n"));

    // A CA that did not sign the backend's certificate: 503, verified, never served.
    write_up("pki/other-ca.pem", "api.internal", true, mtls).await;
    let (status, body) = get(fleet.port, "/");
    assert_eq!(status, 503, "{body}");
    assert!(!body.contains("api client"), "{body}");

    // The SNI name must be among the certificate's names: a right CA, a wrong name, 503.
    write_up("pki/trusted.pem", "other.internal", true, mtls).await;
    assert_eq!(get(fleet.port, "/").0, 503, "SAN mismatch");

    // Live rotation: the mTLS backend now trusts only a new CA's clients and presents a
    // certificate of it; renewing trusted.pem and the client pair on disk (by rename, as
    // certbot does) and `berth up` switches every replica, in place.
    write_up("pki/trusted.pem", "api.internal", true, mtls).await;
    assert_eq!(get(fleet.port, "/"), ok("api client=none\n"));
    let renewed = pki.ca("renewed-ca");
    let (rcert, rkey) = pki.leaf(&renewed, "mtls2", &["mtls.internal"], 0xb2);
    let (mtls2, _mtls2) =
        https_backend("mtls2", &rcert, &rkey, Some(&pki.path("renewed-ca.pem"))).await;
    write_up("pki/trusted.pem", "api.internal", true, mtls2).await;
    assert_eq!(
        get(fleet.port, "/mtls").0,
        503,
        "the old CA does not trust mtls2"
    );
    let (new_client, new_key) = pki.leaf(&renewed, "client-new", &["berth-client"], 0xc2);
    let bundle = format!(
        "{}{}",
        std::fs::read_to_string(pki.path("ca.pem")).unwrap(),
        std::fs::read_to_string(pki.path("renewed-ca.pem")).unwrap()
    );
    replace(&trust, &bundle);
    replace(
        &pki.path("client.pem"),
        &std::fs::read_to_string(new_client).unwrap(),
    );
    replace(
        &pki.path("client-key.pem"),
        &std::fs::read_to_string(new_key).unwrap(),
    );
    let changed = Instant::now();
    fleet.up_ok().await;
    wait_answer(fleet.port, "/mtls", &ok("mtls2 client=c2\n")).await;
    eprintln!(
        "backend CA and client certificate rotation: every replica used them {:?} after the \
         file change (berth up included)",
        changed.elapsed()
    );
    assert_eq!(
        fleet.ids().await,
        ids,
        "no replica was replaced by any TLS change"
    );

    // An expired CA is refused before anything changes, naming the file.
    let expired = expired_ca(&pki.dir);
    replace(&trust, &expired);
    let out = fleet.up().await;
    assert!(!out.status.success(), "an expired CA is refused");
    let err = stderr(&out);
    assert!(
        err.contains(&trust.display().to_string()) && err.contains("expired"),
        "{err}"
    );
    assert_eq!(get(fleet.port, "/mtls"), ok("mtls2 client=c2\n"));
    assert_eq!(fleet.ids().await, ids);
}

fn expired_ca(_dir: &Path) -> String {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    p.self_signed(&key).unwrap().pem()
}
