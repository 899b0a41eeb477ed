//! Crash safety (issue 7 §1): berth is killed with SIGKILL at each distinct step of a rollout
//! (`BERTH_CRASH_AT`, see `berth::core::crashpoint`), then `berth up` runs again. Required after each
//! kill: the fleet converges to the desired spec, no orphaned container remains, every state
//! file is whole, and, sampled throughout under keep-alive load, the proxy never has fewer than
//! N−1 ready replicas (and no request fails).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth::core::crashpoint;
use berth::core::layout;
use berth::core::replica::{ObservedContainer, LABEL_NAME};
use berth::engine::{ContainerEngine, DockerEngine};
use berth::envoy::admin::{Admin, ReadyState};
use common::fleet::*;
use common::load::Load;

const N: usize = 3;

/// Samples the number of LIVE replicas every 50 ms; returns the minimum and the sample count.
fn sample_ready(fleet: &Fleet, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(usize, usize)> {
    let filter = fleet.cleanup.label_filter();
    let state = fleet.state();
    tokio::spawn(async move {
        let engine = DockerEngine::connect().await.unwrap();
        let min = AtomicUsize::new(usize::MAX);
        let mut samples = 0;
        while !stop.load(Ordering::Relaxed) {
            let cs = engine.observe(&filter).await.unwrap_or_default();
            let mut live = 0;
            for c in cs.iter().filter(|c| c.is_managed()) {
                let run = c.label(LABEL_NAME).unwrap_or(&c.name);
                let admin = Admin::new(layout::ProxyDirs::new(&state, PROXY).admin_socket(run));
                if matches!(admin.ready().await, Ok(ReadyState::Live)) {
                    live += 1;
                }
            }
            min.fetch_min(live, Ordering::Relaxed);
            samples += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (min.into_inner(), samples)
    })
}

/// Every file under the state directory is whole: YAML and JSON parse, no temp file is left.
fn assert_state_whole(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type().unwrap();
        assert!(
            !(name.starts_with('.') && name.contains(".tmp")),
            "a temp file was left: {}",
            path.display()
        );
        assert!(
            !name.starts_with("berth-validate-"),
            "a validation dir was left: {}",
            path.display()
        );
        if kind.is_dir() {
            assert_state_whole(&path);
        } else if name.ends_with(".yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            serde_yaml::from_str::<serde_yaml::Value>(&text)
                .unwrap_or_else(|e| panic!("{} is not whole YAML: {e}", path.display()));
        } else if name.ends_with(".json") {
            let text = std::fs::read_to_string(&path).unwrap();
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{} is not whole JSON: {e}", path.display()));
        }
    }
}

/// After a crash at `step`: the next `up` succeeds, every replica serves `version`, there are
/// exactly N containers and every state file is whole. Returns the containers.
async fn assert_recovered(fleet: &Fleet, version: &str, step: &str) -> Vec<ObservedContainer> {
    let again = fleet.up().await;
    assert!(again.status.success(), "up after a crash at {step} failed");
    fleet.assert_serving(N as u32, version).await;
    let all = fleet
        .engine
        .observe(&fleet.cleanup.label_filter())
        .await
        .unwrap();
    assert_eq!(all.len(), N, "orphans after a crash at {step}: {all:#?}");
    assert_state_whole(&fleet.state());
    all
}

/// Stops the sampler and the load: never fewer than N−1 replicas were ready, no request failed.
async fn assert_served_throughout(
    what: &str,
    stop: Arc<AtomicBool>,
    sampler: tokio::task::JoinHandle<(usize, usize)>,
    load: Load,
) {
    stop.store(true, Ordering::Relaxed);
    let (min_ready, samples) = sampler.await.unwrap();
    let report = load.stop().await;
    eprintln!(
        "fewest ready replicas in {samples} samples: {min_ready}; load: {}",
        report.summary()
    );
    // One sample per 50 ms plus the probes (about 4 a second here): one a second is a floor
    // that only a stuck or failing sampler misses.
    let floor = report.elapsed.as_secs_f64() as usize;
    assert!(
        samples >= floor.max(1),
        "the readiness sampler took only {samples} samples over {:?}",
        report.elapsed
    );
    assert!(
        min_ready >= N - 1,
        "only {min_ready} of {N} replicas were ready at one point"
    );
    assert_no_failures(what, &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_every_rollout_step_then_up_converges() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("crash").await;
    let mut s = Settings::new(OLD, N as u32);
    s.min_ready = "300ms";
    fleet.write(&s);
    fleet.up_ok().await;
    fleet.assert_serving(N as u32, "1.39.3").await;

    let load = fleet.load();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_ready(&fleet, stop.clone());
    settle().await;

    let steps: Vec<&str> = crashpoint::STEPS
        .iter()
        .copied()
        .filter(|s| *s != "mid-rollback")
        .collect();
    for (i, step) in steps.iter().enumerate() {
        let (image, version) = if i % 2 == 0 {
            (NEW, "1.40.0")
        } else {
            (OLD, "1.39.3")
        };
        s.image = image;
        fleet.write(&s);
        let killed = fleet.up_with(&[(crashpoint::ENV, step)]).await;
        assert_eq!(
            killed.status.signal(),
            Some(libc::SIGKILL),
            "berth should have died at {step}: {}",
            killed.status
        );
        let all = assert_recovered(&fleet, version, step).await;
        let hashes: std::collections::BTreeSet<_> =
            all.iter().filter_map(|c| c.spec_hash()).collect();
        assert_eq!(hashes.len(), 1, "one spec after a crash at {step}");
        let quiet = fleet.up().await;
        assert_eq!(
            count_events(&quiet, "created"),
            0,
            "a third up changes nothing ({step})"
        );
        assert_eq!(
            count_events(&quiet, "removed"),
            0,
            "a third up changes nothing ({step})"
        );
        eprintln!("crash at {step}: converged to {version}");
    }
    assert_served_throughout("crashes", stop, sampler, load).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_rollback_then_up_converges() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("crash-rollback").await;
    let mut s = Settings::new(OLD, N as u32);
    s.min_ready = "3s";
    fleet.write(&s);
    fleet.up_ok().await;
    let names: Vec<String> = fleet.replicas().await.into_iter().map(|c| c.name).collect();

    let load = fleet.load();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_ready(&fleet, stop.clone());
    settle().await;
    s.image = NEW;
    fleet.write(&s);
    // Slot 1's new replica is stopped during its minimum ready time: slot 0 (already
    // replaced) is being rolled back when berth dies.
    let saboteur = sabotage_slot(&fleet, 1, names);
    let killed = fleet.up_with(&[(crashpoint::ENV, "mid-rollback")]).await;
    saboteur.await.unwrap().expect("slot 1 got a new container");
    assert_eq!(
        killed.status.signal(),
        Some(libc::SIGKILL),
        "{}",
        killed.status
    );

    assert_recovered(&fleet, "1.40.0", "mid-rollback").await;
    assert_served_throughout("crash during rollback", stop, sampler, load).await;
}
