//! `berth serve` as a child process against the real Docker engine and real Envoy replicas.
//!
//! Every test writes its own config (ports from `free_port`), runs serve with a short state
//! directory and the test-case container labels (so [`Cleanup`] removes its containers even
//! when it fails), talks to serve's status server on 127.0.0.1, and kills serve on drop.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::load::{assert_no_failures, Load};
use common::serve::*;
use std::path::Path;

const OLD_IMAGE: &str = "berth-test/envoy:1.39.3";

#[test]
fn config_edit_scales_the_proxy() {
    let case = Case::new("serve-scale");
    case.write(common::TEST_IMAGE, 2, "one\n", "0s");
    let serve = case.serve(&[]);
    serve.wait_for("2 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    let gen = serve.proxy(&case.name)["desiredGeneration"]
        .as_u64()
        .unwrap();
    case.write(common::TEST_IMAGE, 3, "one\n", "0s");
    serve.wait_for("3 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 3)
    });
    let p = serve.proxy(&case.name);
    assert_eq!(p["desiredGeneration"].as_u64(), Some(gen + 1));
    assert_eq!(p["lastRollout"]["outcome"], "succeeded", "{p:#}");
    assert_eq!(case.containers().len(), 3);
    assert_eq!(case.body(), "one\n");

    // `berth status` shows the same: the generation, and each replica's observed generation.
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env("BERTH_SYSCTL_DROPIN", common::TEST_SYSCTL_DROPIN)
        .arg("-f")
        .arg(&case.config)
        .arg("--state-dir")
        .arg(case.state_dir.path())
        .args(["status", "--output", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        status["proxies"][&case.name]["generation"].as_u64(),
        Some(gen + 1),
        "{status:#}"
    );
    let replicas = status["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3);
    for r in replicas {
        assert_eq!(r["observed_generation"].as_u64(), Some(gen + 1), "{r}");
    }
}

#[test]
fn route_change_is_live_with_no_failed_request() {
    let case = Case::new("serve-route");
    case.write(common::TEST_IMAGE, 2, "before\n", "0s");
    let serve = case.serve(&[]);
    serve.wait_for("2 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    let before = case.containers();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let load = rt.block_on(async { Load::start(case.port, "/", 4, Duration::from_secs(60)) });
    std::thread::sleep(Duration::from_millis(500));
    case.write(common::TEST_IMAGE, 2, "after\n", "0s");
    // Every replica: enough requests that each of the two replicas answers several.
    let served = serve.wait_for("the new route", Duration::from_secs(20), |_| {
        (0..20).all(|_| case.body() == "after\n")
    });
    serve.wait_for("generation confirmed", Duration::from_secs(20), |s| {
        s.converged(&case.name, 2)
    });
    std::thread::sleep(Duration::from_millis(500));
    let report = rt.block_on(load.stop());
    eprintln!(
        "route update: new body everywhere {served:?} after the config write (debounce included); load: {}",
        report.summary()
    );
    assert_no_failures("route update through serve", &report);
    assert_eq!(case.containers(), before, "no container was replaced");
    let p = serve.proxy(&case.name);
    assert_eq!(p["lastRollout"]["kind"], "live", "{p:#}");
    assert!(case.xds("rds-web.yaml").contains("after"));
}

#[test]
fn removed_replica_is_recreated() {
    let case = Case::new("serve-drift");
    case.write(common::TEST_IMAGE, 2, "drift\n", "0s");
    let serve = case.serve(&[]);
    serve.wait_for("2 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    let victim = case.containers()[0].clone();
    let (triggers, events) = (
        serve.samples("berth_triggers_total"),
        serve.samples("berth_docker_events_total"),
    );
    let removed = Instant::now();
    let out = Command::new("docker")
        .args(["rm", "-f", &victim.0])
        .output()
        .unwrap();
    assert!(out.status.success());
    // The replacement has the victim's name (slot and spec make it): tell them apart by ID.
    let repaired = serve.wait_for("a ready replacement", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2) && {
            let now = case.containers();
            now.len() == 2 && !now.iter().any(|c| c.0 == victim.0)
        }
    });
    let total = removed.elapsed();
    eprintln!("drift repair: ready replacement {repaired:?} after docker rm -f returned ({total:?} in all)");
    // The engine's event stream saw the removal and its events were the only triggers (the
    // resync is 300 s here): the repair was event-driven, not a timer's.
    let grown = |before: &std::collections::BTreeMap<String, f64>, name: &str| {
        serve
            .samples(name)
            .into_iter()
            .filter(|(k, v)| v > before.get(k).unwrap_or(&0.0))
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    let new_events = grown(&events, "berth_docker_events_total");
    assert!(
        new_events.iter().any(|k| k.contains("destroy")),
        "{new_events:?}"
    );
    let new_triggers = grown(&triggers, "berth_triggers_total");
    assert_eq!(new_triggers, ["source=\"docker\""], "{new_triggers:?}");
    assert_eq!(case.containers().len(), 2);
    assert_eq!(case.body(), "drift\n");
}

#[test]
fn broken_edit_is_reported_and_the_old_config_keeps_serving() {
    let case = Case::new("serve-broken");
    case.write(common::TEST_IMAGE, 1, "good\n", "0s");
    let serve = case.serve(&[]);
    serve.wait_for("1 ready replica", Duration::from_secs(60), |s| {
        s.converged(&case.name, 1)
    });
    let gen = serve.proxy(&case.name)["desiredGeneration"].as_u64();
    let good = std::fs::read_to_string(&case.config).unwrap();
    // Port out of range: a validation error with a position, not a syntax error.
    write_config(
        &case.config,
        &good
            .replace(&format!("port = {}", case.port), "port = 70000")
            .replace("good", "bad"),
    );
    serve.wait_for("the error in /status", Duration::from_secs(10), |s| {
        s.status()["config"]["accepted"] == false
    });
    let st = serve.status();
    let errors = st["config"]["errors"].as_array().unwrap();
    let first = errors[0].as_str().unwrap();
    assert!(
        first.contains("berth.toml:") && first.contains("port"),
        "{st:#}"
    );
    let p = serve.proxy(&case.name);
    let accepted = condition(&p, "Accepted");
    assert_eq!(accepted["status"], "False", "{p:#}");
    assert_eq!(accepted["reason"], "InvalidParameters");
    assert!(accepted["message"].as_str().unwrap().contains("70000"));
    assert_eq!(p["desiredGeneration"].as_u64(), gen, "generation kept");
    assert_eq!(case.body(), "good\n");
    assert!(serve.log_text().contains("refused"));
    // Fixing the file is accepted again.
    write_config(&case.config, &good.replace("good", "fixed"));
    serve.wait_for("the fix served", Duration::from_secs(20), |_| {
        case.body() == "fixed\n"
    });
    let p = serve.proxy(&case.name);
    assert_eq!(condition(&p, "Accepted")["status"], "True");
    assert_eq!(serve.status()["config"]["accepted"], true);
}

#[test]
fn unconfirmed_route_change_is_rolled_back_and_reported() {
    // One replica's Envoy is frozen (SIGSTOP to its process; Docker still shows it running):
    // it cannot load the new files, so it never confirms them. berth must put the previous
    // files back (the other replica returns to them) and report the error, instead of leaving
    // the replicas on different routes. The liveness watcher is off: it would kill the stopped
    // replica within seconds (tests/liveness.rs tests that), and this test is about a replica
    // that stays and does not confirm.
    let case = Case::new("serve-reject");
    case.write(common::TEST_IMAGE, 2, "old\n", "0s");
    let serve = case.serve(&["--confirm-timeout", "2s", "--no-liveness"]);
    serve.wait_for("2 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    let gen = serve.proxy(&case.name)["desiredGeneration"]
        .as_u64()
        .unwrap();
    let frozen = case.containers()[1].clone();
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}", &frozen.0])
        .output()
        .unwrap();
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    struct Thaw(i32);
    impl Drop for Thaw {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    let thaw = Thaw(pid);
    case.write(common::TEST_IMAGE, 2, "new\n", "0s");
    serve.wait_for("the failure in /status", Duration::from_secs(30), |s| {
        let p = s.proxy(&case.name);
        condition(&p, "Degraded")["status"] == "True"
    });
    let p = serve.proxy(&case.name);
    let degraded = condition(&p, "Degraded");
    assert_eq!(degraded["reason"], "LiveUpdateRejected", "{p:#}");
    let msg = degraded["message"].as_str().unwrap();
    assert!(
        msg.contains(&frozen.1) && msg.contains("did not confirm") && msg.contains("restored"),
        "{msg}"
    );
    assert_eq!(p["desiredGeneration"].as_u64(), Some(gen + 1));
    assert_eq!(p["lastRollout"]["outcome"], "failed", "{p:#}");
    // The previous files are back on disk, and the replica that had taken the new ones is on
    // the previous generation again.
    let rds = case.xds("rds-web.yaml");
    assert!(rds.contains("old") && !rds.contains("new"), "{rds}");
    assert!(
        rds.starts_with(&format!("version_info: \"{gen}\"")),
        "{rds}"
    );
    let other = p["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["container"] != frozen.1.as_str())
        .cloned()
        .unwrap();
    assert_eq!(other["observedGeneration"].as_u64(), Some(gen), "{p:#}");
    assert!(serve.log_text().contains("not confirmed by every replica"));
    // Thawed, the frozen replica reads the (restored) files: both serve the old route.
    drop(thaw);
    serve.wait_for(
        "both replicas on the old generation",
        Duration::from_secs(20),
        |s| {
            let p = s.proxy(&case.name);
            let reps = p["replicas"].as_array().cloned().unwrap_or_default();
            reps.len() == 2
                && reps
                    .iter()
                    .all(|r| r["ready"] == true && r["observedGeneration"].as_u64() == Some(gen))
        },
    );
    for _ in 0..20 {
        assert_eq!(case.body(), "old\n");
    }
    assert_eq!(case.containers().len(), 2);
}

#[test]
fn sigterm_mid_rollout_exits_cleanly_and_the_next_serve_completes() {
    ensure_old_image();
    let case = Case::new("serve-sigterm");
    case.write(OLD_IMAGE, 2, "roll\n", "3s");
    let mut serve = case.serve(&[]);
    serve.wait_for("2 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    case.write(common::TEST_IMAGE, 2, "roll\n", "3s");
    // Wait until the first new replica exists: the rollout is mid-step.
    serve.wait_for("the first new replica", Duration::from_secs(60), |_| {
        case.containers().iter().any(|c| c.2 == common::TEST_IMAGE)
    });
    serve.signal(libc::SIGTERM);
    let (status, took) = serve.wait_exit(Duration::from_secs(30));
    let log = serve.log_text();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(log.contains("SIGTERM"), "{log}");
    eprintln!("serve exited {took:?} after SIGTERM");
    // No slot without a ready replica: every running replica reports LIVE, and both slots
    // have one.
    let running = case.containers();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut slots = std::collections::BTreeSet::new();
    for (_, name, _) in &running {
        let sock = case
            .state_dir
            .path()
            .join("proxies")
            .join(&case.name)
            .join("run")
            .join(name)
            .join("admin.sock");
        let ready = rt.block_on(berth::envoy::admin::Admin::new(sock).ready());
        assert_eq!(
            ready.ok(),
            Some(berth::envoy::admin::ReadyState::Live),
            "{name}: {running:?}"
        );
        slots.insert(name.split('-').nth(2).unwrap().to_string());
    }
    assert_eq!(slots.len(), 2, "{running:?}");
    assert_eq!(case.body(), "roll\n");
    let images: Vec<&str> = running.iter().map(|c| c.2.as_str()).collect();
    assert!(
        images.contains(&OLD_IMAGE),
        "the rollout was stopped before its end: {images:?}"
    );
    drop(serve);
    // The next serve completes the rollout.
    let serve = case.serve(&[]);
    serve.wait_for("the rollout completed", Duration::from_secs(90), |s| {
        s.converged(&case.name, 2) && case.containers().iter().all(|c| c.2 == common::TEST_IMAGE)
    });
    assert_eq!(case.containers().len(), 2);
}

#[test]
fn metrics_parse_and_carry_berth_and_envoy_stats() {
    let case = Case::new("serve-metrics");
    case.write(common::TEST_IMAGE, 2, "m\n", "0s");
    let serve = case.serve(&[]);
    serve.wait_for("2 ready replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    let _ = case.body();
    let (code, text) = serve.get("/metrics").unwrap();
    assert_eq!(code, 200);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    let with = |metric: &str| -> Vec<&prometheus_parse::Sample> {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .collect()
    };
    let reconciles = with("berth_reconcile_total");
    assert!(
        reconciles
            .iter()
            .any(|s| s.labels.get("proxy") == Some(case.name.as_str())
                && s.labels.get("result") == Some("success")),
        "{reconciles:?}"
    );
    assert!(!with("berth_reconcile_duration_seconds_count").is_empty());
    // Each replica's Envoy stats, labelled by proxy and replica.
    let containers = case.containers();
    for (_, name, _) in &containers {
        let live = with("envoy_server_live");
        assert!(
            live.iter()
                .any(|s| s.labels.get("proxy") == Some(case.name.as_str())
                    && s.labels.get("replica") == Some(name.as_str())),
            "no envoy_server_live for {name}: {live:?}"
        );
    }
    // Every family's TYPE appears once.
    let mut types: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let n = types.len();
    types.sort();
    types.dedup();
    assert_eq!(types.len(), n, "a metric family is split");
}

fn ensure_old_image() {
    let out = Command::new("docker")
        .args(["image", "inspect", OLD_IMAGE])
        .output()
        .unwrap();
    if !out.status.success() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/envoy-image.sh");
        let out = Command::new(script).arg("1.39.3").output().unwrap();
        assert!(out.status.success());
    }
}
