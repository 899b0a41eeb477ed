//! Fast rollouts (issue 22) against the real Docker engine and real Envoy, under load on
//! 127.0.0.1 that counts every failed request: replacements in waves of `max_surge`, the gate
//! judging a new replica's own traffic by default, and a surge the host cannot hold lowered.
//!
//! One fleet of 4 replicas goes through every step, so the binary starts Envoys only for what
//! it checks. Each step runs two loads at once: keep-alive clients (what a rollout must not
//! break) and clients opening a new connection per request (SO_REUSEPORT hands new
//! connections to new replicas: what gives a new replica traffic to be judged by).

mod common;

use std::time::Duration;

use common::fleet::*;
use common::load::{Load, LoadReport};

const REPLICAS: u32 = 4;
const PER_REQUEST_CLIENTS: usize = 8;

/// A JSON patch that keeps every Envoy setting but the heap limit of the overload manager's
/// fixed-heap monitor (berth sets it to 4/5 of the memory limit): one byte. The new spec passes
/// `envoy --mode validate`, starts, is LIVE with every listener bound, and answers every request
/// with 503 (`stop_accepting_requests`): a change only its traffic tells apart.
const SERVES_503: &str = "- op: replace\n  path: /overload_manager/resource_monitors/1/typed_config/max_heap_size_bytes\n  value: 1\n";

/// Runs `berth up` on `s` under both loads; up's output and what each load saw.
async fn up_under_loads(
    fleet: &Fleet,
    s: &Settings,
) -> (std::process::Output, LoadReport, LoadReport) {
    let per_request = Load::start_per_request(
        fleet.port,
        "/",
        PER_REQUEST_CLIENTS,
        Duration::from_secs(300),
    );
    let (out, keep_alive) = fleet.up_under_load(s).await;
    (out, keep_alive, per_request.stop().await)
}

/// (fewest ready, most running) over up's events, from `replicas` ready and running before:
/// a new replica counts as ready from its `ready` event, an old one stops counting from its
/// `draining` event; a container runs from `created` to `removed`.
fn capacity(out: &std::process::Output, replicas: i64) -> (i64, i64) {
    let (mut ready, mut running) = (replicas, replicas);
    let (mut fewest_ready, mut most_running) = (ready, running);
    for e in events(out) {
        match e["event"].as_str().unwrap_or_default() {
            "ready" => ready += 1,
            "draining" => ready -= 1,
            "created" => running += 1,
            "removed" => running -= 1,
            _ => {}
        }
        fewest_ready = fewest_ready.min(ready);
        most_running = most_running.max(running);
    }
    (fewest_ready, most_running)
}

fn total_memory() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surge_waves_traffic_gate_and_a_lowered_surge() {
    let _serial = SERIAL.lock().await;
    let mut s = Settings::new(OLD, REPLICAS);
    s.max_surge = Some(2);
    let (fleet, _) = Fleet::up_on("surge", &s).await;

    // 1. 4 replicas, max_surge 2: two waves of two; never fewer than 4 ready, never more than
    //    6 running, no request lost.
    s.image = NEW;
    let started = std::time::Instant::now();
    let (out, keep_alive, per_request) = up_under_loads(&fleet, &s).await;
    eprintln!(
        "surge figures: 4 replicas, max_surge 2, 1.39.3 → 1.40.0 in {:.1}s (with 1s of load \
         before and after)",
        started.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let surge: Vec<_> = events(&out)
        .into_iter()
        .filter(|e| e["event"] == "surge")
        .collect();
    assert!(
        surge.len() == 1
            && surge[0]["message"]
                .as_str()
                .unwrap()
                .contains("replacing 4 replica(s), 2 at a time"),
        "{surge:?}"
    );
    let kinds: Vec<String> = events(&out)
        .iter()
        .filter(|e| ["created", "removed"].contains(&e["event"].as_str().unwrap_or_default()))
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        ["created", "created", "removed", "removed", "created", "created", "removed", "removed"],
        "two waves of two"
    );
    let (fewest_ready, most_running) = capacity(&out, 4);
    assert!(fewest_ready >= 4, "{fewest_ready} ready at one point");
    assert!(most_running <= 6, "{most_running} running at one point");
    assert_no_failures("surge rollout, keep-alive", &keep_alive);
    assert_no_failures("surge rollout, a connection per request", &per_request);
    fleet.assert_serving(REPLICAS, "1.40.0").await;

    // 2. A change whose new replicas answer every request with 503, with the default gate:
    //    the first wave fails on its traffic, nothing old is touched, up exits 1.
    let before = fleet.ids().await;
    let mut bad = s.clone();
    bad.max_surge = None;
    bad.set("bootstrap.type", "json_patch");
    bad.set("bootstrap.value", SERVES_503);
    let (out, keep_alive, per_request) = up_under_loads(&fleet, &bad).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("did not answer its traffic as well as its siblings")
            && err.contains("failed requests: ")
            && err.contains("points allowed")
            && err.contains("no replica had been replaced; the old replicas keep serving"),
        "{err}"
    );
    assert_eq!(fleet.ids().await, before, "the old replicas stay");
    // The failed requests are the new replicas' share of new connections while they were
    // gated: a figure, and the keep-alive clients (on the old replicas) lost nothing.
    eprintln!(
        "error-serving change: per-request clients saw {} failed of {} during the gate",
        per_request.failed,
        per_request.failed + per_request.ok
    );
    assert!(
        per_request.non_2xx > 0,
        "the new replicas got traffic: {}",
        per_request.summary()
    );
    assert_no_failures("error-serving change, keep-alive", &keep_alive);
    fleet.assert_serving(REPLICAS, "1.40.0").await;

    // 3. A surge this host cannot hold: memory limits of a fifth of its memory leave room for
    //    one more replica beside the 4, so max_surge 2 is lowered to 1, and said so.
    let fifth = total_memory() / 5;
    s.image = OLD;
    s.set("resources.memory", fifth as i64);
    let (out, keep_alive, per_request) = up_under_loads(&fleet, &s).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let lowered: Vec<_> = events(&out)
        .into_iter()
        .filter(|e| e["event"] == "surge-lowered")
        .collect();
    let message = lowered
        .first()
        .and_then(|e| e["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        message.starts_with("max_surge 2 lowered to 1: memory: 4 running replica(s)"),
        "{lowered:?}"
    );
    let (_, most_running) = capacity(&out, 4);
    assert!(most_running <= 5, "{most_running} running at one point");
    assert_no_failures("lowered surge, keep-alive", &keep_alive);
    assert_no_failures("lowered surge, a connection per request", &per_request);
    fleet.assert_serving(REPLICAS, "1.39.3").await;
}

fn canary_settings(image: &'static str, hold: &str) -> Settings {
    let mut s = Settings::new(image, 3);
    // The hold is what these steps test: the gate's own judge (during min_ready) would stop an
    // error-serving canary before its hold begins.
    s.set("rollout.judge_traffic", false);
    s.set("rollout.canary.replicas", 1);
    s.set("rollout.canary.hold", hold);
    s.set("rollout.canary.min_requests", 30);
    s
}

fn messages(out: &std::process::Output, event: &str) -> Vec<String> {
    events(out)
        .iter()
        .filter(|e| e["event"] == event)
        .map(|e| e["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_roll_back_promote_and_survive_serve_restarting() {
    let _serial = SERIAL.lock().await;
    let mut s = canary_settings(NEW, "4s");
    let (fleet, before) = Fleet::up_on("canary", &s).await;

    // 1. A canary answering 503: rolled back by itself during its hold, with the numbers; the
    //    old replicas served throughout; up exits 1.
    let mut bad = s.clone();
    bad.set("bootstrap.type", "json_patch");
    bad.set("bootstrap.value", SERVES_503);
    let (out, keep_alive, per_request) = up_under_loads(&fleet, &bad).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("did not pass its canary hold")
            && err.contains("failed requests: ")
            && err.contains("points allowed")
            && err.contains("the 1 canary replica(s) were drained and removed"),
        "{err}"
    );
    let rolled_back = messages(&out, "canary-rolled-back");
    eprintln!(
        "canary figures: {}; per-request clients: {} failed of {}",
        rolled_back.first().cloned().unwrap_or_default(),
        per_request.failed,
        per_request.failed + per_request.ok
    );
    assert_eq!(rolled_back.len(), 1, "{:?}", events(&out));
    assert_eq!(fleet.ids().await, before, "the old replicas stay");
    assert!(per_request.non_2xx > 0, "{}", per_request.summary());
    // The canary's share: 1 of 4 replicas for new connections, during its gate and hold only.
    assert!(
        per_request.failed * 2 < per_request.ok,
        "errors beyond the canary's share: {}",
        per_request.summary()
    );
    assert_no_failures("canary rolled back, keep-alive", &keep_alive);

    // 2. A healthy canary: promoted at the end of its hold, then the rest rolls; nothing lost.
    s.image = OLD;
    let (out, keep_alive, per_request) = up_under_loads(&fleet, &s).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let promoted = messages(&out, "canary-promoted");
    assert!(
        promoted.len() == 1 && promoted[0].starts_with("within the thresholds after "),
        "{promoted:?}"
    );
    assert_eq!(count_events(&out, "removed"), 3);
    assert_no_failures("canary promoted, keep-alive", &keep_alive);
    assert_no_failures("canary promoted, a connection per request", &per_request);
    fleet.assert_serving(3, "1.39.3").await;

    // 3. serve killed during a hold: the canary and every old replica keep running, the hold is
    //    on disk; the next serve resumes it with the same baseline and decides it.
    let mut s = canary_settings(NEW, "12s");
    s.min_ready = "1s";
    let per_request = Load::start_per_request(
        fleet.port,
        "/",
        PER_REQUEST_CLIENTS,
        Duration::from_secs(300),
    );
    let keep_alive = fleet.load();
    settle().await;
    fleet.write(&s);
    let record = fleet
        .state()
        .join("proxies")
        .join(PROXY)
        .join("rollout.json");
    let mut serve =
        common::serve::Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);
    serve.wait_for("the canary's hold", Duration::from_secs(60), |_| {
        record.exists()
    });
    serve.signal(libc::SIGKILL);
    serve.wait_exit(Duration::from_secs(10));
    assert_eq!(
        fleet.replicas().await.len(),
        4,
        "the canary beside the 3 old replicas"
    );
    assert!(record.exists());
    let serve = common::serve::Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);
    // /metrics during the resumed hold: under way, 1 replica on the new spec beside 3 old, the
    // canary's numbers against the old replicas'.
    let proxy = format!("proxy=\"{PROXY}\"");
    serve.wait_for("the resumed hold's numbers", Duration::from_secs(60), |s| {
        s.samples("berth_rollout_canary_requests")
            .get(&format!("{proxy},replicas=\"old\""))
            .is_some_and(|n| *n > 0.0)
    });
    assert_eq!(
        serve.samples("berth_rollout_in_progress").get(&proxy),
        Some(&1.0)
    );
    let on = serve.samples("berth_rollout_replicas");
    assert_eq!(
        (
            on.get(&format!("{proxy},spec=\"new\"")),
            on.get(&format!("{proxy},spec=\"old\""))
        ),
        (Some(&1.0), Some(&3.0)),
        "{on:?}"
    );
    assert!(serve
        .samples("berth_rollout_canary_failed")
        .contains_key(&format!("{proxy},replicas=\"canary\"")));
    serve.wait_for("the rollout to finish", Duration::from_secs(90), |s| {
        s.log_text().contains("canary-promoted") && s.converged(PROXY, 3)
    });
    let log = serve.log_text();
    assert!(log.contains("canary-resumed"), "{log}");
    // ... and after it: promoted, nothing under way, every replica on the new spec.
    assert_eq!(
        serve
            .samples("berth_rollout_decisions_total")
            .get(&format!("{proxy},result=\"promoted\"")),
        Some(&1.0)
    );
    assert_eq!(
        serve.samples("berth_rollout_in_progress").get(&proxy),
        Some(&0.0)
    );
    assert!(serve
        .samples("berth_rollout_canary_requests")
        .keys()
        .all(|l| !l.contains(&proxy)));
    let on = serve.samples("berth_rollout_replicas");
    assert_eq!(on.get(&format!("{proxy},spec=\"new\"")), Some(&3.0));
    assert_eq!(on.get(&format!("{proxy},spec=\"old\"")), Some(&0.0));
    drop(serve);
    settle().await;
    assert_no_failures(
        "serve restarted during a hold, keep-alive",
        &keep_alive.stop().await,
    );
    assert_no_failures(
        "serve restarted during a hold, a connection per request",
        &per_request.stop().await,
    );
    assert!(!record.exists(), "the hold is over");
    fleet.assert_serving(3, "1.40.0").await;
}

/// `berth rollout <args>` on the fleet's state directory.
async fn rollout(fleet: &Fleet, args: &[&str]) -> std::process::Output {
    let mut all = vec!["rollout"];
    all.extend_from_slice(args);
    let out = fleet.berth(&all).output().await.unwrap();
    common::show("berth rollout", &out);
    out
}

/// `berth up` in the background, once the hold it starts is recorded.
async fn up_until_holding(fleet: &Fleet) -> tokio::task::JoinHandle<std::process::Output> {
    let child = fleet
        .berth(&["--output", "json", "up"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let up = tokio::spawn(async move { child.wait_with_output().await.unwrap() });
    let record = fleet
        .state()
        .join("proxies")
        .join(PROXY)
        .join("rollout.json");
    for _ in 0..600 {
        let out = rollout(fleet, &["--output", "json", "status"]).await;
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if record.exists() && rows[0]["phase"] == "canary" {
            return up;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no canary hold recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_pause_resume_promote_and_undo() {
    let _serial = SERIAL.lock().await;
    let mut s = canary_settings(NEW, "10m");
    let (fleet, _) = Fleet::up_on("steer", &s).await;
    let per_request = Load::start_per_request(
        fleet.port,
        "/",
        PER_REQUEST_CLIENTS,
        Duration::from_secs(300),
    );
    let keep_alive = fleet.load();
    settle().await;

    // pause, resume, promote: a 10-minute hold ends by hand, and the rest rolls.
    s.image = OLD;
    fleet.write(&s);
    let up = up_until_holding(&fleet).await;
    assert!(rollout(&fleet, &["pause"]).await.status.success());
    let out = rollout(&fleet, &["--output", "json", "status", PROXY]).await;
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["phase"], "paused", "{rows}");
    // `status` reads the request file; the holding `up` looks at it once a second. Resuming
    // before its next look would leave no pause for it to see (and no canary-paused event).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(rollout(&fleet, &["resume"]).await.status.success());
    let promoted = rollout(&fleet, &["promote", PROXY]).await;
    assert!(
        String::from_utf8_lossy(&promoted.stdout).contains("promoted"),
        "{promoted:?}"
    );
    let out = up.await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let msgs = messages(&out, "canary-promoted");
    assert!(
        msgs.len() == 1 && msgs[0].starts_with("promoted by hand"),
        "{msgs:?}"
    );
    assert_eq!(messages(&out, "canary-paused").len(), 1);
    fleet.assert_serving(3, "1.39.3").await;

    // undo: the canary drains, up fails, and the next pass keeps the previous spec.
    let before = fleet.ids().await;
    s.image = NEW;
    fleet.write(&s);
    let up = up_until_holding(&fleet).await;
    assert!(rollout(&fleet, &["undo"]).await.status.success());
    let out = up.await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("undone by hand"), "{}", stderr(&out));
    assert_eq!(fleet.ids().await, before);
    let out = fleet.up().await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(messages(&out, "held").len(), 1, "{:?}", events(&out));
    assert_eq!(
        fleet.ids().await,
        before,
        "the undone spec is not rolled again"
    );
    let out = rollout(&fleet, &["--output", "json", "status", PROXY]).await;
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(rows[0]["undone"].is_string(), "{rows}");
    assert_eq!(
        rollout(&fleet, &["undo"]).await.status.code(),
        Some(1),
        "nothing is rolling, and the config asks for the undone spec, not the last rolled one"
    );

    // undo after a finished rollout: every replica goes back to the spec it came from,
    // lossless, and stays there on the next pass; a second undo has nothing to do.
    // (Another spec than the undone one: rollout settings alone are not part of a spec.)
    let mut plain = Settings::new(NEW, 3);
    plain.max_surge = Some(2);
    plain.set("env.BERTH_TEST_UNDO", "finished");
    fleet.write(&plain);
    let out = fleet.up().await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(count_events(&out, "removed"), 3, "{:?}", events(&out));
    fleet.assert_serving(3, "1.40.0").await;
    let out = rollout(&fleet, &["--output", "json", "undo"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(messages(&out, "undoing").len(), 1, "{:?}", events(&out));
    assert_eq!(count_events(&out, "rolled-back"), 3, "{:?}", events(&out));
    fleet.assert_serving(3, "1.39.3").await;
    let back = fleet.ids().await;
    let out = fleet.up().await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(messages(&out, "held").len(), 1, "{:?}", events(&out));
    assert_eq!(
        fleet.ids().await,
        back,
        "the undone spec is not rolled again"
    );
    let again = rollout(&fleet, &["undo"]).await;
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("undone already"),
        "{}",
        stderr(&again)
    );

    settle().await;
    assert_no_failures("steered rollouts, keep-alive", &keep_alive.stop().await);
    assert_no_failures(
        "steered rollouts, a connection per request",
        &per_request.stop().await,
    );
    fleet.assert_serving(3, "1.39.3").await;
}
