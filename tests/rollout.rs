//! The rolling reconcile against the real Docker engine and real Envoy, each under continuous
//! keep-alive HTTP load on 127.0.0.1 that counts every failed request (issue 4, "Tests").
//!
//! The tests drive the real binary (`berth up`) on a config written per test, and serialize on
//! one lock: each runs several Envoys plus a load generator, and the host has 2 CPUs.

mod common;

use berth::core::layout;
use berth::engine::{ContainerEngine, Flavor};
use common::fleet::*;
use common::skip;

/// Writes `s` and runs `berth up` under load while slot `slot`'s new container is stopped as
/// soon as it appears ([`sabotage_slot`]): up's output, the stopped container's name, the load.
async fn sabotaged_rollout(
    fleet: &Fleet,
    s: &Settings,
    slot: u32,
) -> (
    std::process::Output,
    Option<String>,
    common::load::LoadReport,
) {
    let names = fleet.names().await;
    let ((out, saboteur), report) = fleet
        .under_load(async {
            fleet.write(s);
            let saboteur = sabotage_slot(fleet, slot, names);
            (fleet.up().await, saboteur)
        })
        .await;
    (out, saboteur.await.unwrap(), report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_three_replicas_under_load_loses_no_request() {
    let _serial = SERIAL.lock().await;
    let mut s = Settings::new(OLD, 3);
    let (fleet, _) = Fleet::up_on("upgrade", &s).await;
    fleet.assert_serving(3, "1.39.3").await;

    s.image = NEW;
    let ((out, rollout), report) = fleet
        .under_load(async {
            fleet.write(&s);
            let started = std::time::Instant::now();
            let out = fleet.up_ok().await;
            (out, started.elapsed())
        })
        .await;
    // A figure for notes and the Podman job, not asserted.
    eprintln!(
        "rollout figures ({}): 3 replicas 1.39.3 → 1.40.0 in {:.1}s; load: {}",
        fleet.engine.describe(),
        rollout.as_secs_f64(),
        report.summary()
    );

    assert_eq!(count_events(&out, "replacing"), 3);
    assert_eq!(count_events(&out, "removed"), 3);
    assert_no_failures("upgrade 1.39.3 → 1.40.0", &report);
    fleet.assert_serving(3, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_envoy_rejects_changes_no_container() {
    let _serial = SERIAL.lock().await;
    let mut s = Settings::new(NEW, 3);
    let (fleet, before) = Fleet::up_on("rejected", &s).await;

    // A field Envoy's schema knows (a merge drops unknown fields, as EG's does) with a value
    // only Envoy itself can refuse: a stats tag whose regex does not compile.
    s.set("bootstrap.type", "merge");
    s.set(
        "bootstrap.value",
        "stats_config:\n  stats_tags:\n  - tag_name: berth_bad_tag\n    regex: \"((\"\n",
    );
    let (out, report) = fleet.up_under_load(&s).await;

    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("envoy --mode validate rejected the new config of proxy roll")
            && err.contains("no replica was changed")
            && err.contains("Invalid regex '(('"),
        "{err}"
    );
    assert_eq!(count_events(&out, "created"), 0);
    assert_eq!(fleet.ids().await, before, "no container may change");
    assert_no_failures("rejected bootstrap", &report);
    fleet.assert_serving(3, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_exits_at_start_is_refused_and_the_old_replicas_serve() {
    let _serial = SERIAL.lock().await;
    let mut s = Settings::new(NEW, 3);
    let (fleet, before) = Fleet::up_on("exits", &s).await;

    s.image = BROKEN;
    let (out, report) = fleet.up_under_load(&s).await;

    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    // The gate inspects every 250 ms. If the restart policy has already started the container
    // again, Docker and Podman both report exit code 0 and only the restart count tells.
    let exited = "did not stay running: Envoy exited";
    assert!(
        err.contains("rollout of roll failed: replica roll/0 (berth-roll-0-")
            && err.contains(exited)
            && (err.contains("with code 1") || err.contains("the engine restarted it"))
            && err.contains("no replica had been replaced; the old replicas keep serving")
            && err.contains("last 20 lines of its log:")
            && err.contains("this image exits at start on purpose"),
        "{err}"
    );
    assert_eq!(count_events(&out, "failed"), 1);
    assert_eq!(fleet.ids().await, before, "the old replicas stay");
    assert_no_failures("image exits at start", &report);
    fleet.assert_serving(3, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_at_slot_1_rolls_slot_0_back() {
    let _serial = SERIAL.lock().await;
    let mut s = Settings::new(OLD, 3);
    s.min_ready = "3s";
    let (fleet, before) = Fleet::up_on("rollback", &s).await;

    s.image = NEW;
    let (out, saboteur, report) = sabotaged_rollout(&fleet, &s, 1).await;
    let stopped = saboteur.expect("slot 1 got a new container");

    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("replica roll/1 ({stopped}) did not stay running"))
            && err.contains("rolled back the replaced replicas: slot 0: rolled back to spec"),
        "{err}"
    );
    assert_eq!(count_events(&out, "rolled-back"), 1);
    let after = fleet.ids().await;
    assert_ne!(after[0], before[0], "slot 0 was replaced, then rolled back");
    assert_eq!(after[1..], before[1..], "slots 1 and 2 were never replaced");
    assert_no_failures("rollback", &report);
    fleet.assert_serving(3, "1.39.3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_at_slot_1_with_on_failure_pause_leaves_slot_0_on_the_new_spec() {
    let _serial = SERIAL.lock().await;
    let mut s = Settings::new(OLD, 3);
    s.min_ready = "3s";
    s.on_failure = "pause";
    let (fleet, before) = Fleet::up_on("pause", &s).await;

    s.image = NEW;
    let (out, saboteur, report) = sabotaged_rollout(&fleet, &s, 1).await;
    saboteur.expect("slot 1 got a new container");

    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("rollout paused: 1 replica(s) already run the new spec"),
        "{err}"
    );
    assert_eq!(count_events(&out, "rolled-back"), 0);
    let after = fleet.ids().await;
    assert_ne!(after[0], before[0]);
    assert_eq!(after[1..], before[1..]);
    assert_no_failures("pause", &report);
    let cs = fleet.replicas().await;
    let v0 = fleet.admin(&cs[0]).server_version().await.unwrap();
    let v1 = fleet.admin(&cs[1]).server_version().await.unwrap();
    assert!(
        v0.contains("/1.40.0/") && v1.contains("/1.39.3/"),
        "{v0} {v1}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_removed_by_hand_is_restored() {
    let _serial = SERIAL.lock().await;
    let (fleet, before) = Fleet::up_on("removed", &Settings::new(NEW, 3)).await;
    docker(&["rm", "-f", &before[1].1]);

    let (out, report) = fleet.under_load(fleet.up_ok()).await;

    assert_eq!(count_events(&out, "created"), 1);
    let after = fleet.ids().await;
    assert_eq!(after[0], before[0]);
    assert_eq!(after[2], before[2]);
    assert_ne!(after[1], before[1]);
    assert_no_failures("restore a removed replica", &report);
    fleet.assert_serving(3, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_update_memory_replaces_that_replica_only() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("update").await;
    if fleet.engine.flavor() == Flavor::Podman {
        skip(
            "docker_update_memory_replaces_that_replica_only",
            "Podman's compatible API has no container update (POST /containers/{id}/update \
             answers 404 in 4.3), so nobody can change a replica's memory that way there",
        );
        return;
    }
    let s = Settings::new(NEW, 3);
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;
    docker(&[
        "update",
        "--memory",
        "200m",
        "--memory-swap",
        "400m",
        &before[2].1,
    ]);

    let (out, report) = fleet.under_load(fleet.up_ok()).await;

    let replacing: Vec<_> = events(&out)
        .into_iter()
        .filter(|e| e["event"] == "replacing")
        .collect();
    assert_eq!(replacing.len(), 1, "{replacing:?}");
    assert!(
        replacing[0]["message"]
            .as_str()
            .unwrap()
            .contains("drifted: memory"),
        "{replacing:?}"
    );
    let after = fleet.ids().await;
    assert_eq!(after[..2], before[..2]);
    assert_ne!(after[2], before[2]);
    assert_no_failures("docker update --memory", &report);
    fleet.assert_serving(3, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_3_to_5_to_2_loses_no_request() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("scale").await;
    let mut s = Settings::new(NEW, 3);
    fleet.write(&s);
    let out = fleet.up_ok().await;
    // A fresh install creates its replicas at once: every one is created before any is ready.
    let kinds: Vec<String> = events(&out)
        .iter()
        .filter(|e| e["event"] == "created" || e["event"] == "ready")
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        ["created", "created", "created", "ready", "ready", "ready"]
    );
    let three = fleet.ids().await;

    let (out, report) = fleet
        .under_load(async {
            s.replicas = 5;
            fleet.write(&s);
            let out = fleet.up_ok().await;
            settle().await;
            assert_eq!(count_events(&out, "created"), 2);
            assert_eq!(count_events(&out, "replacing"), 0);
            assert_eq!(fleet.ids().await[..3], three[..]);
            fleet.assert_serving(5, "1.40.0").await;

            s.replicas = 2;
            fleet.write(&s);
            fleet.up_ok().await
        })
        .await;
    assert_eq!(count_events(&out, "removed"), 3);
    assert_eq!(count_events(&out, "replacing"), 0);
    assert_eq!(fleet.ids().await[..], three[..2]);
    assert_no_failures("scale 3 → 5 → 2", &report);
    fleet.assert_serving(2, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_put_back_stopped_renamed_and_tampered_files() {
    let _serial = SERIAL.lock().await;
    let (fleet, before) = Fleet::up_on("drift", &Settings::new(NEW, 3)).await;

    // A stopped replica is started again (same container).
    docker(&["stop", "-t", "1", &before[2].1]);
    let load = fleet.load();
    settle().await;
    let out = fleet.up_ok().await;
    assert_eq!(count_events(&out, "started"), 1);
    assert_eq!(fleet.ids().await, before);
    fleet.assert_serving(3, "1.40.0").await;

    // A renamed replica is replaced.
    docker(&[
        "rename",
        &before[0].1,
        &format!("{}-renamed", fleet.cleanup.case),
    ]);
    let out = fleet.up_ok().await;
    assert_eq!(count_events(&out, "replacing"), 1);
    let renamed = fleet.ids().await;
    assert_ne!(renamed[0], before[0]);
    assert_eq!(renamed[1..], before[1..]);

    // Tampered xDS files are rewritten; nothing is replaced.
    let xds = layout::ProxyDirs::new(&fleet.state(), PROXY).xds();
    let lds = xds.join(layout::LDS_FILE);
    let good = std::fs::read_to_string(&lds).unwrap();
    std::fs::write(&lds, format!("# tampered\n{good}")).unwrap();
    let out = fleet.up_ok().await;
    assert_eq!(count_events(&out, "replacing"), 0);
    assert!(
        events(&out)
            .iter()
            .any(|e| e["event"] == "files" && e["message"].as_str().unwrap().contains("lds.yaml")),
        "the xds file is rewritten"
    );
    // Rewritten as rendered, under a new generation stamp (the first line) every replica
    // confirmed.
    let rewritten = std::fs::read_to_string(&lds).unwrap();
    let body = |s: &str| s.split_once('\n').map(|(_, b)| b.to_string()).unwrap();
    assert!(rewritten.starts_with("version_info: "), "{rewritten}");
    assert_eq!(body(&rewritten), body(&good));
    assert_eq!(fleet.ids().await, renamed);

    // A tampered bootstrap is rewritten and every replica using it replaced.
    let generations = layout::ProxyDirs::new(&fleet.state(), PROXY).generations();
    let generation = std::fs::read_dir(&generations)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join(layout::BOOTSTRAP_FILE);
    let good = std::fs::read_to_string(&generation).unwrap();
    std::fs::write(&generation, format!("{good}\n# tampered\n")).unwrap();
    let out = fleet.up_ok().await;
    settle().await;
    let report = load.stop().await;
    assert_eq!(count_events(&out, "replacing"), 3);
    assert_eq!(std::fs::read_to_string(&generation).unwrap(), good);
    let after = fleet.ids().await;
    for (a, b) in after.iter().zip(&renamed) {
        assert_ne!(a.1, b.1);
    }
    assert_no_failures("drift", &report);
    fleet.assert_serving(3, "1.40.0").await;
    // Converged: another run changes nothing.
    let out = fleet.up_ok().await;
    assert!(events(&out).iter().all(|e| e["event"] != "created"));
}
