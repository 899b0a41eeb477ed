//! `berth up/down/status/diff` as a user runs them: the real binary, the real Docker engine,
//! real Envoy 1.40.0 replicas, HTTP through 127.0.0.1.
//!
//! Each test has its own state directory, ports and proxy names, and tags every container
//! with `io.berth.test.case=<unique>` (through the hidden `--container-label`), so tests run
//! in parallel and [`Cleanup`] removes what a failed test left.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth::envoy::admin::Admin;
use berth::host::preflight::tcp_ports_listened_by;
use common::config as cfg;
use common::describe;
use common::{ensure_test_image, free_port, short_tempdir, Cleanup, TEST_IMAGE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One berth installation for one test: its config file, state directory and containers.
struct Fleet {
    // Dropped first: containers go before their state directory.
    cleanup: Cleanup,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn new(name: &str) -> Fleet {
        ensure_test_image();
        Fleet {
            cleanup: Cleanup::new(name),
            dir: short_tempdir(),
        }
    }

    fn cfg(&self) -> PathBuf {
        self.dir.path().join("berth.toml")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("s")
    }

    fn write(&self, toml: &str) {
        std::fs::write(self.cfg(), toml).unwrap();
    }

    fn command(&self) -> Command {
        let mut cmd = common::berth_on(&self.cfg(), &self.state(), &self.cleanup.case);
        cmd.env_remove("BERTH_CONFIG").env_remove("BERTH_STATE_DIR");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    /// Runs berth and requires exit 0.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "berth {}: {}",
            args.join(" "),
            describe(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// This test's containers: name → (id, labels), any state.
    fn containers(&self) -> BTreeMap<String, (String, BTreeMap<String, String>)> {
        let out = docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label={}", self.cleanup.filter()),
            "--format",
            "{{.Names}} {{.ID}}",
        ]);
        out.lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(name, id)| {
                let labels = docker(&["inspect", "-f", "{{json .Config.Labels}}", id]);
                let labels: BTreeMap<String, String> = serde_json::from_str(labels.trim()).unwrap();
                (name.to_string(), (id.to_string(), labels))
            })
            .collect()
    }

    /// Names and full IDs of the containers of one proxy.
    fn replicas(&self, proxy: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (name, (id, labels)) in self.containers() {
            if labels.get("io.berth.proxy").map(String::as_str) == Some(proxy)
                && labels.contains_key("io.berth.managed-by")
            {
                let full = docker(&["inspect", "-f", "{{.Id}}", &id]);
                out.insert(name, full.trim().to_string());
            }
        }
        out
    }

    fn admin(&self, proxy: &str, container: &str) -> Admin {
        Admin::new(
            self.state()
                .join("proxies")
                .join(proxy)
                .join("run")
                .join(container)
                .join("admin.sock"),
        )
    }
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {}: {}",
        args.join(" "),
        describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A short proxy name unique to this test (proxy names are in container names and socket
/// paths, which must stay short).
fn proxy_name(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{tag}{:x}", (std::process::id() << 20) ^ nanos)
}

/// One proxy: `replicas` replicas of `image` on `port`, answering "hello <name>" on every path.
fn proxy_toml(name: &str, port: u16, replicas: u32, image: &str) -> String {
    cfg::Proxy::new(name, image, replicas)
        .set("concurrency", 1)
        .set("rollout.min_ready", "0s")
        .set("shutdown.min_drain_duration", "0s")
        .listener(cfg::Listener::http("web", port).route(cfg::Route::direct(
            "/",
            200,
            &format!("hello {name}\n"),
        )))
        .to_toml()
}

/// One HTTP/1.1 request on a fresh connection to 127.0.0.1:port; the status code and body.
async fn get(port: u16) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("timed out"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// `n` requests, each on its own connection, `parallel` at a time. Returns the failures.
async fn fresh_connections(port: u16, n: usize, parallel: usize, body: &str) -> Vec<String> {
    use futures_util::StreamExt;
    futures_util::stream::iter(0..n)
        .map(|_| async move { get(port).await })
        .buffer_unordered(parallel)
        .filter_map(|r| async move {
            match r {
                Ok((200, b)) if b == body => None,
                Ok((status, b)) => Some(format!("{status} {b:?}")),
                Err(e) => Some(e.to_string()),
            }
        })
        .collect()
        .await
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Container events of this test between two times (`docker events --since --until`).
fn container_events(fleet: &Fleet, since: f64, until: f64) -> Vec<String> {
    docker(&[
        "events",
        "--since",
        &format!("{since:.3}"),
        "--until",
        &format!("{until:.3}"),
        "--filter",
        "type=container",
        "--filter",
        &format!("label={}", fleet.cleanup.filter()),
        "--format",
        "{{.Action}} {{.Actor.Attributes.name}}",
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

#[tokio::test]
async fn up_three_replicas_behind_one_port_all_serve() {
    let fleet = Fleet::new("up3");
    let (proxy, port) = (proxy_name("a"), free_port());
    fleet.write(&proxy_toml(&proxy, port, 3, TEST_IMAGE));
    let table = fleet.ok(&["up"]);
    let replicas = fleet.replicas(&proxy);
    assert_eq!(replicas.len(), 3, "{replicas:?}");
    // `up` prints the status table: one row per replica, each LIVE.
    for name in replicas.keys() {
        let row = table
            .lines()
            .find(|l| l.contains(name.as_str()))
            .unwrap_or_else(|| panic!("no row for {name} in:\n{table}"));
        assert!(row.contains("running") && row.contains("LIVE"), "{row}");
    }

    let body = format!("hello {proxy}\n");
    let failures = fresh_connections(port, 300, 30, &body).await;
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        failures
    );

    // Every replica answered some of them: its own stats, read over its own admin socket.
    let mut per_replica = BTreeMap::new();
    for name in replicas.keys() {
        let stats = fleet.admin(&proxy, name).stats().await.unwrap();
        let served = stats
            .get("http.web.downstream_rq_completed")
            .copied()
            .unwrap_or(0);
        per_replica.insert(name.clone(), served);
    }
    let total: u64 = per_replica.values().sum();
    assert!(total >= 300, "{per_replica:?}");
    assert!(
        per_replica.values().all(|n| *n > 0),
        "every replica serves: {per_replica:?}"
    );
}

#[tokio::test]
async fn replica_admin_is_only_a_socket() {
    let fleet = Fleet::new("adm");
    let (proxy, port) = (proxy_name("b"), free_port());
    fleet.write(&proxy_toml(&proxy, port, 1, TEST_IMAGE));
    fleet.ok(&["-q", "up"]);
    let replicas = fleet.replicas(&proxy);
    let (name, id) = replicas.iter().next().expect("one replica");
    let pid: u32 = docker(&["inspect", "-f", "{{.State.Pid}}", id])
        .trim()
        .parse()
        .unwrap();
    assert!(pid > 0);
    // Exactly the listener port is bound; no TCP admin port.
    assert_eq!(tcp_ports_listened_by(pid), BTreeSet::from([port]));
    // The admin answers on its socket, which only root and the replica user may open.
    let admin = fleet.admin(&proxy, name);
    assert_eq!(
        admin.ready().await.unwrap(),
        berth::envoy::admin::ReadyState::Live
    );
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(admin.socket()).unwrap();
    assert!(md.file_type().is_socket());
    assert_eq!(md.mode() & 0o777, 0o600, "admin socket mode");
}

#[tokio::test]
async fn second_up_makes_no_container_changes() {
    let fleet = Fleet::new("noop");
    let (proxy, port) = (proxy_name("c"), free_port());
    fleet.write(&proxy_toml(&proxy, port, 2, TEST_IMAGE));
    fleet.ok(&["-q", "up"]);
    let before = fleet.replicas(&proxy);
    assert_eq!(before.len(), 2);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let since = now();
    let out = fleet.ok(&["--output", "json", "up"]);
    let until = now() + 0.5;
    tokio::time::sleep(Duration::from_millis(600)).await;

    assert_eq!(fleet.replicas(&proxy), before, "same containers, same IDs");
    let events = container_events(&fleet, since, until);
    assert!(
        events.is_empty(),
        "container events during a no-op up: {events:?}"
    );
    // The JSON stream says nothing happened but the final count of engine requests.
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["event"], "summary");
    let calls: u64 = lines[0]["message"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Version negotiation, one list, one look at the engine's recent events: no inspect,
    // since the engine reports no change to these containers since the first up (which left
    // its observation in the state directory). Docker keeps its last 256 events; only that
    // many events on the host within this test's 200 ms would make it inspect them all.
    // Podman keeps its events elsewhere, so there it is observed in full: one inspect each.
    let engine = berth::engine::DockerEngine::connect().await.unwrap();
    let most = match engine.flavor() {
        berth::engine::Flavor::Podman => 2 + before.len() as u64,
        _ => 3,
    };
    assert!(calls <= most, "{calls} engine API requests: {out}");
}

#[tokio::test]
async fn status_and_diff_describe_the_fleet() {
    let fleet = Fleet::new("stat");
    let (proxy, port) = (proxy_name("d"), free_port());
    fleet.write(&proxy_toml(&proxy, port, 2, TEST_IMAGE));
    fleet.ok(&["-q", "up"]);
    let replicas = fleet.replicas(&proxy);

    let json: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["status", "--output", "json"])).unwrap();
    let rows = json["replicas"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{json:#}");
    let mut slots = BTreeSet::new();
    for row in rows {
        assert_eq!(row["proxy"], proxy.as_str());
        assert!(
            replicas.contains_key(row["container"].as_str().unwrap()),
            "{row}"
        );
        assert_eq!(row["state"], "running", "{row}");
        assert_eq!(row["ready"], true, "{row}");
        assert_eq!(row["envoy"], "LIVE", "{row}");
        assert_eq!(row["image"], TEST_IMAGE, "{row}");
        let spec = row["spec"].as_str().unwrap();
        assert_eq!(spec.len(), 12, "short spec hash: {row}");
        assert!(spec.chars().all(|c| c.is_ascii_hexdigit()), "{row}");
        slots.insert(row["slot"].as_u64().unwrap());
    }
    assert_eq!(slots, BTreeSet::from([0, 1]));

    let table = fleet.ok(&["status"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("PROXY"), "{table}");
    assert_eq!(lines.len(), 3, "{table}");
    for line in &lines[1..] {
        assert!(
            line.contains("running") && line.contains("LIVE") && line.contains(TEST_IMAGE),
            "{line}"
        );
    }

    let diff = fleet.ok(&["diff"]);
    assert!(diff.contains("No changes"), "{diff}");
    let diff: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["diff", "--output", "json"])).unwrap();
    assert_eq!(diff["actions"], serde_json::json!([]), "{diff:#}");

    // One more replica wanted: the plan creates slot 2 and touches nothing else.
    fleet.write(&proxy_toml(&proxy, port, 3, TEST_IMAGE));
    let diff = fleet.ok(&["diff"]);
    assert!(
        diff.contains("create") && diff.contains(&format!("{proxy}/2")),
        "{diff}"
    );
    assert!(
        diff.contains("1 to create, 0 to start, 0 to replace, 0 to remove"),
        "{diff}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["diff", "--output", "json"])).unwrap();
    let actions = json["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 1, "{json:#}");
    assert_eq!(actions[0]["action"], "create", "{json:#}");
    assert_eq!(actions[0]["slot"], 2, "{json:#}");

    // Only a route changes: no container action, but the live file update is listed.
    let new_route = cfg::Proxy::new(&proxy, TEST_IMAGE, 2)
        .set("concurrency", 1)
        .set("rollout.min_ready", "0s")
        .set("shutdown.min_drain_duration", "0s")
        .listener(cfg::Listener::http("web", port).route(cfg::Route::direct("/", 200, "moved\n")))
        .to_toml();
    fleet.write(&new_route);
    let diff = fleet.ok(&["diff"]);
    assert!(!diff.contains("No changes"), "{diff}");
    assert!(
        diff.contains(&format!(
            "~ {proxy}: live update, no restart (changed rds-web.yaml)"
        )),
        "{diff}"
    );
    assert!(
        diff.contains("0 to replace, 0 to remove; 1 proxy updated live."),
        "{diff}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&fleet.ok(&["diff", "--output", "json"])).unwrap();
    assert_eq!(json["actions"], serde_json::json!([]), "{json:#}");
    assert_eq!(json["live"][0]["proxy"], proxy.as_str(), "{json:#}");
    assert_eq!(
        json["live"][0]["changed"],
        serde_json::json!(["rds-web.yaml"]),
        "{json:#}"
    );
    // diff changed nothing.
    assert_eq!(fleet.replicas(&proxy), replicas);
    assert_eq!(get(port).await.unwrap().1, format!("hello {proxy}\n"));
}

#[tokio::test]
async fn down_removes_what_berth_made_and_spares_a_lookalike() {
    let fleet = Fleet::new("down");
    let (proxy, port) = (proxy_name("e"), free_port());
    fleet.write(&proxy_toml(&proxy, port, 3, TEST_IMAGE));
    fleet.ok(&["-q", "up"]);
    assert_eq!(fleet.replicas(&proxy).len(), 3);
    // A container that looks like a replica (name, proxy label) but lacks managed-by.
    let foreign = format!("berth-{proxy}-0-foreign");
    docker(&[
        "create",
        "--name",
        &foreign,
        "--label",
        "io.berth.test=1",
        "--label",
        &format!("io.berth.test.case={}", fleet.cleanup.case),
        "--label",
        &format!("io.berth.proxy={proxy}"),
        TEST_IMAGE,
        "--version",
    ]);
    let proxy_state = fleet.state().join("proxies").join(&proxy);
    assert!(proxy_state.is_dir());

    let started = std::time::Instant::now();
    let out = fleet.ok(&["--output", "json", "down"]);
    eprintln!("down of 3 replicas took {:?}", started.elapsed());
    // Replicas drain concurrently: every one was draining before any was removed.
    let steps: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "draining" || e["event"] == "removed")
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["container"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let draining: BTreeSet<&str> = steps
        .iter()
        .filter(|s| s.0 == "draining")
        .map(|s| s.1.as_str())
        .collect();
    let removed: BTreeSet<&str> = steps
        .iter()
        .filter(|s| s.0 == "removed")
        .map(|s| s.1.as_str())
        .collect();
    assert_eq!(draining.len(), 3, "{out}");
    assert_eq!(removed, draining, "{out}");
    let first_removal = steps.iter().position(|s| s.0 == "removed").unwrap();
    assert!(
        steps[..first_removal].iter().all(|s| s.0 == "draining") && first_removal == 3,
        "a replica was removed before every replica was draining: {steps:?}"
    );
    let left: Vec<String> = fleet.containers().into_keys().collect();
    assert_eq!(left, vec![foreign], "only the look-alike survives");
    assert!(
        !proxy_state.exists(),
        "{} survived down",
        proxy_state.display()
    );
    assert!(
        get(port).await.is_err(),
        "nothing listens on {port} any more"
    );
}

#[tokio::test]
async fn port_held_by_another_process_refuses_up() {
    let fleet = Fleet::new("port");
    let holder = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let proxy = proxy_name("f");
    fleet.write(&proxy_toml(&proxy, port, 2, TEST_IMAGE));
    let out = fleet.run(&["up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        err.contains(&format!("port {port}")),
        "names the port: {err}"
    );
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "names the process: {err}"
    );
    assert!(
        fleet.containers().is_empty(),
        "created: {:?}",
        fleet.containers()
    );
    assert!(!fleet.state().join("proxies").join(&proxy).exists());
    drop(holder);
}

#[tokio::test]
async fn missing_image_refuses_up_clearly() {
    let fleet = Fleet::new("img");
    let (proxy, port) = (proxy_name("g"), free_port());
    let image = "berth-test/envoy:does-not-exist";
    fleet.write(&proxy_toml(&proxy, port, 2, image));
    let out = fleet.run(&["up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(err.contains(image), "names the image: {err}");
    assert!(
        err.contains("scripts/envoy-image.sh"),
        "says how to build one: {err}"
    );
    assert!(
        fleet.containers().is_empty(),
        "created: {:?}",
        fleet.containers()
    );
    assert!(!fleet.state().join("proxies").join(&proxy).exists());
}

#[tokio::test]
async fn removing_a_proxy_from_the_config_removes_only_it() {
    let fleet = Fleet::new("two");
    let (keep, gone) = (proxy_name("h"), proxy_name("i"));
    let (keep_port, gone_port) = (free_port(), free_port());
    fleet.write(&format!(
        "{}{}",
        proxy_toml(&keep, keep_port, 2, TEST_IMAGE),
        proxy_toml(&gone, gone_port, 2, TEST_IMAGE)
    ));
    fleet.ok(&["-q", "up"]);
    // Both serve, each on its own port.
    assert_eq!(
        get(keep_port).await.unwrap(),
        (200, format!("hello {keep}\n"))
    );
    assert_eq!(
        get(gone_port).await.unwrap(),
        (200, format!("hello {gone}\n"))
    );
    let kept = fleet.replicas(&keep);
    let removed = fleet.replicas(&gone);
    assert_eq!((kept.len(), removed.len()), (2, 2));

    fleet.write(&proxy_toml(&keep, keep_port, 2, TEST_IMAGE));
    let out = fleet.ok(&["--output", "json", "up"]);
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |proxy: &str, event: &str| -> BTreeSet<String> {
        events
            .iter()
            .filter(|e| e["proxy"] == proxy && e["event"] == event)
            .filter_map(|e| e["container"].as_str().map(str::to_string))
            .collect()
    };
    let names: BTreeSet<String> = removed.keys().cloned().collect();
    assert_eq!(of(&gone, "draining"), names, "{out}");
    assert_eq!(of(&gone, "removed"), names, "{out}");
    assert!(
        events.iter().all(|e| e["proxy"] != keep.as_str()),
        "the kept proxy was touched: {out}"
    );
    assert_eq!(
        fleet.replicas(&keep),
        kept,
        "kept proxy's containers unchanged"
    );
    assert!(fleet.replicas(&gone).is_empty());
    assert_eq!(
        get(keep_port).await.unwrap(),
        (200, format!("hello {keep}\n"))
    );
    assert!(
        get(gone_port).await.is_err(),
        "the removed proxy's port is closed"
    );
    assert!(
        !fleet.state().join("proxies").join(&gone).exists(),
        "the removed proxy's state survived"
    );
}

#[tokio::test]
async fn a_route_change_is_live_and_confirmed_by_every_replica() {
    let fleet = Fleet::new("live");
    let (proxy, port) = (proxy_name("l"), free_port());
    fleet.write(&proxy_toml(&proxy, port, 2, TEST_IMAGE));
    fleet.ok(&["-q", "up"]);
    let before = fleet.replicas(&proxy);
    assert_eq!(get(port).await.unwrap().1, format!("hello {proxy}\n"));

    fleet.write(&proxy_toml(&proxy, port, 2, TEST_IMAGE).replace("hello ", "changed "));
    let out = fleet.ok(&["--output", "json", "up"]);
    assert!(
        out.lines()
            .any(|l| l.contains(r#""event":"files""#) && l.contains("confirmed by 2 replica(s)")),
        "the new files are confirmed by both replicas:\n{out}"
    );
    assert_eq!(fleet.replicas(&proxy), before, "no container was replaced");
    for _ in 0..20 {
        assert_eq!(get(port).await.unwrap().1, format!("changed {proxy}\n"));
    }
}
