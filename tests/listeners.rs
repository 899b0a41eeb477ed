//! The listener side of the standalone data plane (issue 11 C), end to end with real clients
//! through 127.0.0.1 (and [::1]): a WebSocket echo through berth, kept open through a rollout
//! until the old replica's drain window has passed; a listener bound to 127.0.0.1 only (`ss`);
//! an IPv6 listener; JSON access log lines in `berth logs`; two certificates on one HTTPS
//! listener chosen by SNI, one rotated under load with no failed request, and both listed by
//! `berth status`. Bad listener settings are refused naming the line.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use common::config as cfg;
use common::fleet::{assert_no_failures, Fleet, NEW, OLD, PROXY};
use common::load::Load;
use common::tls::{pair, pair_for, replace, served_serials_for};

/// The drain window of the WebSocket test's replicas.
const DRAIN: Duration = Duration::from_secs(4);

async fn run(fleet: &Fleet, args: &[&str]) -> Output {
    let out = fleet
        .berth(&[])
        .args(args)
        .output()
        .await
        .expect("running berth");
    common::show(&format!("berth {args:?}"), &out);
    out
}

/// A WebSocket echo server on 127.0.0.1 (any path); its port.
async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn has_ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// The local addresses of the listening TCP sockets on `port` (`ss -Hltn`).
fn ss_listening(port: u16) -> Vec<String> {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2)");
    assert!(out.status.success(), "ss failed");
    let mut addrs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

fn ws_config(fleet: &Fleet, image: &str, echo: u16, v6_port: Option<u16>) -> String {
    let web = cfg::Listener::new("web", fleet.port)
        .set("address", "127.0.0.1")
        .set("websocket", true)
        .set("access_log", "json")
        .route(cfg::Route::direct("/plain", 200, "plain\n"))
        .route(cfg::Route::backend("/", "echo"));
    let mut proxy = cfg::Proxy::test(PROXY, image, 1)
        .set("shutdown.drain_timeout", format!("{}s", DRAIN.as_secs()))
        .listener(web);
    // A TCP listener on [::1] to the same echo server: the WebSocket passes through it too.
    if let Some(p) = v6_port {
        proxy = proxy.listener(
            cfg::Listener::new("v6", p)
                .set("protocol", "tcp")
                .set("address", "::1")
                .set("access_log", "off")
                .set("backend", "echo"),
        );
    }
    proxy.backend(cfg::Backend::local("echo", echo)).to_toml()
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends `text` and waits (at most 2 s) for its echo.
async fn echo(ws: &mut Ws, text: &str) -> Result<(), String> {
    ws.send(Message::text(text))
        .await
        .map_err(|e| format!("send: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
        Err(_) => Err("no echo within 2 s".into()),
        Ok(None) => Err("closed".into()),
        Ok(Some(Err(e))) => Err(format!("read: {e}")),
        Ok(Some(Ok(m))) if m.to_text().ok() == Some(text) => Ok(()),
        Ok(Some(Ok(m))) => Err(format!("unexpected message {m:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn websocket_through_a_loopback_listener_with_json_access_logs_survives_a_drain() {
    let fleet = Fleet::new("listeners-ws").await;
    let echo_port = echo_server().await;
    let v6_port = if has_ipv6_loopback() {
        Some(common::free_port())
    } else {
        common::skip(
            "websocket_through_a_loopback_listener…: the IPv6 listener",
            "this host has no IPv6 loopback ([::1] cannot be bound)",
        );
        None
    };
    std::fs::write(fleet.config(), ws_config(&fleet, OLD, echo_port, v6_port)).unwrap();
    let out = run(&fleet, &["--output", "json", "up"]).await;
    assert!(out.status.success(), "berth up failed");

    // Bound on 127.0.0.1 only: nothing on 0.0.0.0 or [::].
    assert_eq!(
        ss_listening(fleet.port),
        [format!("127.0.0.1:{}", fleet.port)],
        "the listener binds only its address"
    );
    if let Some(p) = v6_port {
        assert_eq!(ss_listening(p), [format!("[::1]:{p}")]);
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://[::1]:{p}/"))
            .await
            .unwrap();
        echo(&mut ws, "hello over IPv6").await.unwrap();
    }

    // A WebSocket echo through berth.
    let url = format!("ws://127.0.0.1:{}/chat", fleet.port);
    let (mut ws, response) = tokio_tungstenite::connect_async(&url).await.unwrap();
    assert_eq!(response.status(), 101);
    echo(&mut ws, "hello through berth").await.unwrap();

    // A plain request, then its JSON access log line in `berth logs`.
    let (status, body) = common::serve::http_get(fleet.port, "/plain").expect("GET /plain");
    assert_eq!((status, body.as_str()), (200, "plain\n"));
    let logged = |out: &Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.find('{').map(|i| &l[i..]))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let out = run(&fleet, &["logs", PROXY]).await;
        assert!(out.status.success(), "berth logs failed");
        if let Some(l) = logged(&out)
            .into_iter()
            .find(|l| l["x-envoy-origin-path"] == "/plain")
        {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "no JSON access log line for /plain"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(line["method"], "GET");
    assert_eq!(line["response_code"], 200);
    assert!(line["start_time"].is_string(), "{line}");

    // A rollout (new image): the open WebSocket keeps working until the old replica's drain
    // starts and through the whole drain window; berth then removes the old replica.
    let before = fleet.ids().await;
    std::fs::write(fleet.config(), ws_config(&fleet, NEW, echo_port, v6_port)).unwrap();
    let mut up = fleet
        .berth(&[])
        .args(["--output", "json", "up"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = BufReader::new(up.stdout.take().unwrap()).lines();
    let (tx, mut draining) = tokio::sync::oneshot::channel::<Instant>();
    let reader = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut all = Vec::new();
        while let Ok(Some(line)) = events.next_line().await {
            if line.contains("\"draining\"") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Instant::now());
                }
            }
            all.push(line);
        }
        all
    });
    let mut drain_started = None;
    let mut closed_at = None;
    let mut i = 0;
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        if drain_started.is_none() {
            if let Ok(at) = draining.try_recv() {
                drain_started = Some(at);
            }
        }
        i += 1;
        if let Err(e) = echo(&mut ws, &format!("message {i}")).await {
            eprintln!("websocket ended after {i} messages: {e}");
            closed_at = Some(Instant::now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = up.wait().await.unwrap();
    let lines = reader.await.unwrap();
    eprintln!("berth up (rollout):\n{}", lines.join("\n"));
    assert!(status.success(), "the rollout failed");
    let drain_started = drain_started
        .or_else(|| draining.try_recv().ok())
        .expect("the old replica drained");
    let closed_at = closed_at.expect("the WebSocket closes once its replica is removed");
    assert!(
        closed_at >= drain_started + DRAIN,
        "the WebSocket was cut {:?} after the drain started, before the {DRAIN:?} drain window",
        closed_at.saturating_duration_since(drain_started)
    );
    eprintln!(
        "websocket: open through the rollout until {:?} after its replica's drain began (window {DRAIN:?})",
        closed_at - drain_started
    );
    let after = fleet.ids().await;
    assert_eq!(after.len(), 1);
    assert_ne!(before, after, "the replica was replaced");
    // A new WebSocket goes to the new replica.
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    echo(&mut ws, "hello again").await.unwrap();
}

fn sni_config(fleet: &Fleet) -> String {
    let https = cfg::Listener::https("https", fleet.port, cfg::tls_files("cert.pem", "key.pem"))
        .virtual_host(
            cfg::VirtualHost::new("app", &["app.localhost"])
                .set("tls", cfg::tls_files("app.pem", "app-key.pem"))
                .route(cfg::Route::direct("/", 200, "app\n")),
        )
        .virtual_host(
            cfg::VirtualHost::new("other", &["*"]).route(cfg::Route::direct("/", 200, "other\n")),
        );
    cfg::Proxy::test(PROXY, NEW, 2).listener(https).to_toml()
}

fn put(dir: &Path, cert: &str, key: &str, (c, k): &(String, String)) {
    replace(&dir.join(cert), c);
    replace(&dir.join(key), k);
}

/// Until 16 new connections in a row with SNI `name` are served `serial`; the time it took
/// and how many rounds of 16 handshakes.
async fn wait_served(port: u16, name: &str, serial: &str, within: Duration) -> (Duration, u32) {
    let start = Instant::now();
    for round in 1.. {
        let seen = served_serials_for(port, name, 16).await;
        if seen == [serial] {
            return (start.elapsed(), round);
        }
        assert!(
            start.elapsed() < within,
            "{name}: serial {serial} not served by every replica within {within:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn two_sni_names_get_two_certificates_and_one_rotates_under_load() {
    let fleet = Fleet::new("listeners-sni").await;
    let dir = fleet.dir.path();
    put(dir, "cert.pem", "key.pem", &pair(0x2001, 2020, 2090));
    put(
        dir,
        "app.pem",
        "app-key.pem",
        &pair_for("app.localhost", 0x3001, 2020, 2090),
    );
    std::fs::write(fleet.config(), sni_config(&fleet)).unwrap();
    assert!(
        run(&fleet, &["up"]).await.status.success(),
        "berth up failed"
    );
    let before = fleet.ids().await;
    assert_eq!(
        served_serials_for(fleet.port, "localhost", 16).await,
        ["2001"]
    );
    assert_eq!(
        served_serials_for(fleet.port, "app.localhost", 16).await,
        ["3001"]
    );

    // `berth status` lists both, with their names, serials and days left.
    let out = run(&fleet, &["status"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("DAYS LEFT") && table.contains("2001") && table.contains("3001"),
        "{table}"
    );
    let out = run(&fleet, &["--output", "json", "status"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let certs = json["certificates"].as_array().expect("certificates");
    let app = certs
        .iter()
        .find(|c| c["serial"] == "3001")
        .expect("the app certificate");
    assert_eq!(app["listener"], "https");
    assert_eq!(app["server_names"], serde_json::json!(["app.localhost"]));
    assert_eq!(app["names"], serde_json::json!(["app.localhost"]));
    assert!(app["days_left"].as_i64().unwrap() > 365, "{app}");
    let default = certs.iter().find(|c| c["serial"] == "2001").unwrap();
    assert_eq!(default["server_names"], serde_json::json!([]));

    // Rotate the app certificate under HTTPS load on both names.
    let app_load = Load::start_tls_named(
        fleet.port,
        "/",
        6,
        Duration::from_secs(300),
        "app.localhost",
    );
    let default_load = Load::start_tls(fleet.port, "/", 2, Duration::from_secs(300));
    tokio::time::sleep(Duration::from_millis(500)).await;
    put(
        dir,
        "app.pem",
        "app-key.pem",
        &pair_for("app.localhost", 0x3002, 2020, 2090),
    );
    let changed = Instant::now();
    let out = run(&fleet, &["up"]).await;
    assert!(out.status.success(), "berth up failed");
    // Order: up returns once every replica's Envoy lists the new serial, so new handshakes
    // get it (the bound only ends a hang).
    let printed = String::from_utf8_lossy(&out.stderr);
    assert!(
        printed.contains("confirmed by 2 replica(s)"),
        "berth up confirms the new files from every replica: {printed}"
    );
    let (serving, rounds) =
        wait_served(fleet.port, "app.localhost", "3002", common::EVENTUALLY).await;
    eprintln!(
        "SNI rotation: every replica served app.localhost's new serial {:?} after the file change (berth up, then {serving:?} and {rounds} round(s) of 16 handshakes until all 16 saw it)",
        changed.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let app_report = app_load.stop().await;
    let default_report = default_load.stop().await;
    eprintln!(
        "load during the rotation: app.localhost {}; localhost {}",
        app_report.summary(),
        default_report.summary()
    );
    assert_no_failures(
        "rotating the app.localhost certificate (app.localhost load)",
        &app_report,
    );
    assert_no_failures(
        "rotating the app.localhost certificate (localhost load)",
        &default_report,
    );
    assert_eq!(
        served_serials_for(fleet.port, "localhost", 16).await,
        ["2001"]
    );
    assert_eq!(fleet.ids().await, before, "no replica was replaced");
}

#[test]
fn certificates_by_sni_and_listener_settings_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (c, k) = pair(1, 2020, 2090);
    std::fs::write(dir.path().join("c.pem"), c).unwrap();
    std::fs::write(dir.path().join("k.pem"), k).unwrap();
    let parse = |listener: &str, vhosts: &str| {
        let text = format!(
            "[[proxy]]\nname = \"p\"\n[[proxy.listener]]\nname = \"l\"\nport = 18443\n{listener}\n{vhosts}"
        );
        berth::core::source::file::parse(&dir.path().join("berth.toml"), &text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let vhost = |domains: &str| {
        format!(
            "[[proxy.listener.virtual_host]]\nname = \"a\"\ndomains = {domains}\ntls = {{ cert_file = \"c.pem\", key_file = \"k.pem\" }}\n[[proxy.listener.virtual_host.route]]\npath_prefix = \"/\"\ndirect_response = {{ status = 200 }}\n"
        )
    };
    let https = "protocol = \"https\"\ntls = { cert_file = \"c.pem\", key_file = \"k.pem\" }";
    assert_eq!(
        parse(https, &vhost("[\"a.example.com\", \"*.b.example.com\"]")),
        ""
    );
    let e = parse(https, &vhost("[\"*\"]"));
    assert!(
        e.contains("domains[0]") && e.contains("no server name"),
        "{e}"
    );
    let e = parse(https, &vhost("[\"a.example.com:8443\"]"));
    assert!(e.contains("without a port"), "{e}");
    let e = parse(https, &vhost("[\"example.*\"]"));
    assert!(e.contains("leading \"*.\" wildcard"), "{e}");
    let two = format!(
        "{}{}",
        vhost("[\"a.example.com\"]"),
        vhost("[\"A.example.com\"]").replace("name = \"a\"", "name = \"b\"")
    );
    let e = parse(https, &two);
    assert!(
        e.contains("already appears at line"),
        "overlapping names: {e}"
    );
    let e = parse("protocol = \"http\"", &vhost("[\"a.example.com\"]"));
    assert!(e.contains("needs protocol = \"https\""), "{e}");
    let route =
        "[[proxy.listener.route]]\npath_prefix = \"/\"\ndirect_response = { status = 200 }\n";
    let e = parse("address = \"localhost\"", route);
    assert!(
        e.contains("proxy[0].listener[0].address") && e.contains("must be an IP address"),
        "{e}"
    );
    let e = parse("access_log = \"yes\"", route);
    assert!(e.contains("text, json, off"), "{e}");
    let e = parse("websocket = \"yes\"", route);
    assert!(e.contains("true or false"), "{e}");
    assert_eq!(
        parse(
            "address = \"::1\"\nwebsocket = true\naccess_log = \"off\"",
            route
        ),
        ""
    );
}
