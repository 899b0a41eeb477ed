//! The Docker implementation of the container-engine seam against the real engine and the
//! local Envoy image.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use berth::core::layout;
use berth::core::replica::{
    Mount, ReplicaContainer, RunState, LABEL_MANAGED_BY, LABEL_PROXY, LABEL_TEST, MANAGED_BY_VALUE,
    REPLICA_USER,
};
use berth::engine::{ContainerEngine, DockerEngine, EngineError, Flavor, LabelFilter, OneShot};
use bollard::models::{ContainerCreateBody, RestartPolicyNameEnum};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use common::{ensure_test_image, free_port, unique, Cleanup, Fixture};

#[tokio::test]
async fn connect_negotiates_the_api_version() {
    let engine = DockerEngine::connect().await.expect("connect");
    let v = engine.api_version();
    let (major, minor) = v.split_once('.').unwrap();
    let (major, minor): (u32, u32) = (major.parse().unwrap(), minor.parse().unwrap());
    assert!(
        major == 1 && minor <= 41,
        "negotiated {v}, expected ≤ 1.41 here"
    );
    assert_eq!(engine.api_calls(), 1, "negotiation is one request");
    // And calls work at that version.
    engine
        .image_id(ensure_test_image())
        .await
        .expect("a call after negotiation");
    assert_eq!(engine.api_calls(), 2);
}

#[tokio::test]
async fn ensure_image_present_and_absent() {
    let image = ensure_test_image();
    let engine = DockerEngine::connect().await.unwrap();
    let id = engine
        .ensure_image(image, false)
        .await
        .expect("present image");
    assert!(id.starts_with("sha256:"), "{id}");
    assert_eq!(engine.image_id(image).await.unwrap(), Some(id));

    let missing = "berth-test/does-not-exist:1";
    assert_eq!(engine.image_id(missing).await.unwrap(), None);
    let err = engine
        .ensure_image(missing, false)
        .await
        .expect_err("absent image cannot be pulled here");
    let msg = format!("{err:#}");
    assert!(msg.contains(missing), "names the image: {msg}");
    assert!(
        msg.contains("scripts/envoy-image.sh"),
        "suggests the script: {msg}"
    );
}

/// The replica with the test's labels on.
fn labelled(mut replica: ReplicaContainer, cleanup: &Cleanup) -> ReplicaContainer {
    replica.labels.extend(cleanup.labels());
    replica
}

async fn state(engine: &DockerEngine, id: &str) -> Option<RunState> {
    engine.status(id).await.unwrap().map(|s| s.state)
}

#[tokio::test]
async fn replica_runs_hardened_and_is_observed() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("hard");
    let engine = DockerEngine::connect().await.unwrap();
    let fx = Fixture::new(free_port());
    let proxy = unique("p");
    let name = format!("berth-{}-0", cleanup.case);
    let replica = labelled(fx.replica(&proxy, 0, &name, image), &cleanup);

    let id = engine.create(&replica).await.expect("create");
    engine.start(&id).await.expect("start");

    // Inspect with bollard and check every setting.
    let inspect = engine
        .client()
        .inspect_container(&id, None)
        .await
        .expect("inspect");
    let hc = inspect.host_config.clone().unwrap();
    assert_eq!(hc.network_mode.as_deref(), Some("host"));
    assert_eq!(hc.readonly_rootfs, Some(true));
    // Podman lists every capability it dropped instead of "ALL"; the process's effective set
    // (checked below) is the proof on both engines.
    if engine.flavor() == Flavor::Docker {
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    }
    assert!(hc.cap_add.unwrap_or_default().is_empty());
    // Podman reads it back as "no-new-privileges"; /proc below is the proof on both.
    let no_new_privileges = match engine.flavor() {
        Flavor::Docker => "no-new-privileges:true",
        Flavor::Podman => "no-new-privileges",
    };
    assert_eq!(hc.security_opt, Some(vec![no_new_privileges.to_string()]));
    // Podman's podman-restart.service brings back only `always` containers after a reboot.
    let policy = match engine.flavor() {
        Flavor::Docker => RestartPolicyNameEnum::UNLESS_STOPPED,
        Flavor::Podman => RestartPolicyNameEnum::ALWAYS,
    };
    assert_eq!(hc.restart_policy.unwrap().name, Some(policy));
    assert_eq!(hc.memory, Some(256 * 1024 * 1024));
    assert_eq!(hc.nano_cpus, Some(500_000_000));
    // The container's mount points (HostConfig.Mounts is what was asked; Podman leaves it out
    // of inspect).
    let mounts = inspect.mounts.clone().unwrap_or_default();
    let mount = |target: &str| {
        mounts
            .iter()
            .find(|m| m.destination.as_deref() == Some(target))
            .unwrap_or_else(|| panic!("no mount at {target}: {mounts:#?}"))
    };
    assert_eq!(
        mount(layout::CONTAINER_RUN_DIR).rw,
        Some(true),
        "run dir is writable"
    );
    assert_eq!(mount(layout::CONTAINER_BOOTSTRAP_DIR).rw, Some(false));
    let config = inspect.config.clone().unwrap();
    assert_eq!(config.user, Some(REPLICA_USER.to_string()));
    assert_eq!(config.cmd.as_ref(), Some(&replica.args));
    assert_eq!(
        config.entrypoint,
        Some(vec!["/usr/local/bin/envoy".to_string()]),
        "entrypoint comes from the image"
    );
    let labels = config.labels.unwrap();
    for (k, v) in replica.labels.iter().chain(cleanup.labels().iter()) {
        assert_eq!(labels.get(k), Some(v), "label {k}");
    }
    assert_eq!(inspect.name.as_deref(), Some(format!("/{name}").as_str()));

    // It runs (and keeps running).
    let status = engine.status(&id).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Running, "{status:?}");
    let pid = status.pid.expect("a running replica has a pid");
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cap_eff = proc_status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim);
    assert_eq!(cap_eff, Some("0000000000000000"), "no capability at all");
    assert!(
        proc_status.lines().any(|l| l == "NoNewPrivs:\t1"),
        "no new privileges:\n{proc_status}"
    );

    // Logs: Envoy logs at start-up.
    let start = Instant::now();
    let logs = loop {
        let logs = engine.logs(&id, Some(5)).await.unwrap();
        if !logs.trim().is_empty() || start.elapsed() > Duration::from_secs(10) {
            break logs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!logs.trim().is_empty(), "logs_tail returned nothing");
    assert!(logs.lines().count() <= 5, "tail 5 gave:\n{logs}");

    // A foreign container with a look-alike name, without berth's managed-by label.
    let foreign = format!("berth-{}-0-foreign", cleanup.case);
    let mut foreign_labels: HashMap<String, String> = cleanup.labels().into_iter().collect();
    foreign_labels.insert(LABEL_PROXY.into(), proxy.clone());
    engine
        .client()
        .create_container(
            Some(
                CreateContainerOptionsBuilder::default()
                    .name(&foreign)
                    .build(),
            ),
            ContainerCreateBody {
                image: Some(image.into()),
                cmd: Some(vec!["--version".into()]),
                labels: Some(foreign_labels),
                ..Default::default()
            },
        )
        .await
        .expect("create foreign container");
    engine.start(&foreign).await.unwrap();

    let calls_before = engine.api_calls();
    let observed = engine
        .observe(&LabelFilter::default().with(LABEL_MANAGED_BY, Some(MANAGED_BY_VALUE)))
        .await
        .expect("observe");
    let calls = engine.api_calls() - calls_before;
    assert!(
        observed.iter().all(|c| c.is_managed()),
        "observe returned an unmanaged container"
    );
    assert!(
        !observed.iter().any(|c| c.name == foreign),
        "observe returned the foreign look-alike"
    );
    assert_eq!(
        calls,
        1 + observed.len() as u64,
        "one list call plus one inspect per container"
    );
    let mine = observed
        .iter()
        .find(|c| c.id == id)
        .expect("observe finds the replica");
    assert_eq!(mine.name, name, "name without the leading '/'");
    assert_eq!(mine.state, RunState::Running);
    assert_eq!(mine.proxy(), Some(proxy.as_str()));
    assert_eq!(mine.slot(), Some(0));
    assert_eq!(mine.spec_hash(), Some("test-hash"));
    assert_eq!(mine.label(LABEL_TEST), Some("1"));
    assert_eq!(mine.live.memory, Some(256 * 1024 * 1024));
    assert_eq!(mine.live.nano_cpus, Some(500_000_000));
    assert_eq!(mine.live.restart_policy, "unless-stopped");

    // The test's own label filter sees both.
    let mine_all = engine.observe(&cleanup.label_filter()).await.unwrap();
    assert_eq!(mine_all.len(), 2);

    // Stop, state, start again.
    engine.stop(&id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(state(&engine, &id).await, Some(RunState::Exited));
    engine
        .stop(&id, Duration::from_secs(5))
        .await
        .expect("stop twice");
    engine.start(&id).await.unwrap();
    assert_eq!(state(&engine, &id).await, Some(RunState::Running));

    // Remove is idempotent; a removed container has no state.
    engine.remove(&id).await.unwrap();
    engine.remove(&id).await.expect("remove twice");
    assert_eq!(state(&engine, &id).await, None);

    // A second create of the same name works (stale run directory reused).
    let id2 = engine.create(&replica).await.expect("re-create");
    assert_ne!(id, id2);
    assert_eq!(
        engine
            .remove_matching(&cleanup.label_filter())
            .await
            .unwrap(),
        2
    );
    assert_eq!(state(&engine, &id2).await, None);
}

#[tokio::test]
async fn create_with_a_taken_name_fails_clearly() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("dup");
    let engine = DockerEngine::connect().await.unwrap();
    let fx = Fixture::new(free_port());
    let name = format!("berth-{}-0", cleanup.case);
    let replica = labelled(fx.replica("dup", 0, &name, image), &cleanup);
    engine.create(&replica).await.unwrap();
    let err = engine.create(&replica).await.expect_err("name taken");
    assert!(err.is_conflict(), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&name) && msg.contains(&engine.describe()) && msg.contains("refused"),
        "the engine says it refused, in its own words: {msg}"
    );
}

/// `envoy --mode validate` as a throw-away container: Envoy's verdict is an exit code with its
/// output; the engine's own failure is an error of the engine.
fn validate_job(image: &str, mounts: Vec<Mount>, config: &str, cleanup: &Cleanup) -> OneShot {
    OneShot {
        image: image.to_string(),
        args: [
            "--mode",
            "validate",
            "-c",
            config,
            "--service-node",
            "v",
            "--service-cluster",
            "v",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        mounts,
        labels: cleanup.labels(),
        hardening: berth::core::replica::Hardening {
            user: REPLICA_USER,
            read_only_rootfs: true,
            cap_drop_all: true,
            cap_add: Vec::new(),
            no_new_privileges: true,
        },
        timeout: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn one_shot_containers_report_envoys_verdict() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("val");
    let engine = DockerEngine::connect().await.unwrap();
    let fx = Fixture::new(free_port());
    let mounts = vec![fx.bootstrap_mount()];
    let ok = engine
        .run_to_completion(&validate_job(
            image,
            mounts.clone(),
            layout::CONTAINER_BOOTSTRAP,
            &cleanup,
        ))
        .await
        .expect("it ran");
    assert_eq!(ok.code, 0, "the good bootstrap validates: {}", ok.output);

    // A listener with an unknown field: Envoy rejects it.
    let broken = common::bootstrap_yaml(fx.port).replace(
        "enable_reuse_port: true",
        "enable_reuse_port: true\n    no_such_field: 1",
    );
    fx.write_bootstrap(&broken);
    let bad = engine
        .run_to_completion(&validate_job(
            image,
            mounts,
            layout::CONTAINER_BOOTSTRAP,
            &cleanup,
        ))
        .await
        .expect("it ran");
    assert_eq!(bad.code, 1, "{}", bad.output);
    assert!(
        bad.output.contains("no_such_field"),
        "Envoy's message: {}",
        bad.output
    );

    // A missing file is Envoy's error too.
    let missing = engine
        .run_to_completion(&validate_job(
            image,
            vec![Mount {
                source: fx.bootstrap_dir(),
                target: "/cfg".into(),
                read_only: false,
            }],
            "/cfg/missing.yaml",
            &cleanup,
        ))
        .await
        .expect("it ran");
    assert_ne!(missing.code, 0);
    assert!(
        missing.output.contains("missing.yaml"),
        "{}",
        missing.output
    );

    // An image the engine does not have is the engine's failure, not Envoy's verdict.
    let err = engine
        .run_to_completion(&validate_job(
            "berth-test/does-not-exist:1",
            Vec::new(),
            "/x.yaml",
            &cleanup,
        ))
        .await
        .expect_err("no such image");
    assert!(matches!(err, EngineError::Refused { .. }), "{err:?}");

    // Every validate container was removed.
    let left = engine.observe(&cleanup.label_filter()).await.unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Runs in a child process (DOCKER_HOST is process-wide): the error names the socket and asks
/// whether dockerd runs.
#[tokio::test]
async fn unreachable_engine_is_a_clear_error() {
    if std::env::var("BERTH_TEST_CHILD").is_ok() {
        let err = DockerEngine::connect()
            .await
            .err()
            .expect("no engine there");
        println!("ERROR: {err:#}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unreachable_engine_is_a_clear_error",
            "--nocapture",
        ])
        .env("BERTH_TEST_CHILD", "1")
        .env("DOCKER_HOST", "unix:///tmp/berth-no-such-docker.sock")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("ERROR: ")).unwrap();
    assert!(
        line.contains("/tmp/berth-no-such-docker.sock") && line.contains("is it running?"),
        "{line}"
    );
}

/// A cached observation inspects only what the engine's events say changed, asks for nothing
/// but the events when none happened, and sees `docker update` (memory, restart policy) and a
/// removal as surely as a full one.
#[tokio::test]
async fn a_cached_observation_inspects_only_what_changed() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("cached");
    let engine = DockerEngine::connect().await.unwrap();
    if engine.flavor() == Flavor::Podman {
        return common::skip(
            "a_cached_observation_inspects_only_what_changed",
            "Podman keeps its events elsewhere, so observe_cached observes in full there \
             (nothing is cached to check)",
        );
    }
    let fx = Fixture::new(free_port());
    let proxy = unique("p");
    let mut ids = Vec::new();
    for slot in 0..3 {
        let name = format!("berth-{}-{slot}", cleanup.case);
        let replica = labelled(fx.replica(&proxy, slot, &name, image), &cleanup);
        let id = engine.create(&replica).await.expect("create");
        engine.start(&id).await.expect("start");
        ids.push(id);
    }
    let filter = cleanup.label_filter();
    let mut cache = berth::engine::ObservationCache::default();
    let counted = |engine: &DockerEngine| engine.api_calls();

    // First look: list, events, and an inspect of each container, like a full observe.
    let before = counted(&engine);
    let first = engine.observe_cached(&filter, &mut cache).await.unwrap();
    assert_eq!(
        counted(&engine) - before,
        2 + 3,
        "list + events + 3 inspects"
    );
    assert_eq!(first, engine.observe(&filter).await.unwrap());
    assert!(cache.witness.is_some(), "the starts are its witness");

    // Nothing changed: the events alone say so, and the answer is what a full look says.
    let before = counted(&engine);
    let again = engine.observe_cached(&filter, &mut cache).await.unwrap();
    assert_eq!(counted(&engine) - before, 1, "events only");
    assert_eq!(again, first);
    assert_eq!(again, engine.observe(&filter).await.unwrap());
    assert_eq!(cache.vouched.len(), 3);

    // docker update on one replica: only it is inspected, and its new settings are seen.
    let out = std::process::Command::new("docker")
        .args(["update", "--memory", "300m", "--memory-swap", "600m"])
        .args(["--restart", "no", &ids[1]])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let before = counted(&engine);
    let updated = engine.observe_cached(&filter, &mut cache).await.unwrap();
    assert_eq!(
        counted(&engine) - before,
        1 + 3,
        "events (one changed), then list + events + 1 inspect"
    );
    let one = updated.iter().find(|c| c.id == ids[1]).unwrap();
    assert_eq!(one.live.memory, Some(300 * 1024 * 1024));
    assert_eq!(one.live.restart_policy, "no");
    assert_eq!(updated, engine.observe(&filter).await.unwrap());

    // A witness the engine no longer holds (evicted, or the engine restarted): full again.
    cache.witness = Some("1 gone start".to_string());
    let before = counted(&engine);
    let full = engine.observe_cached(&filter, &mut cache).await.unwrap();
    assert_eq!(counted(&engine) - before, 1 + 2 + 3, "nothing vouched for");
    assert_eq!(full, updated);

    // A removed container leaves the answer and the cache.
    engine.remove(&ids[0]).await.unwrap();
    let after = engine.observe_cached(&filter, &mut cache).await.unwrap();
    assert_eq!(after.len(), 2);
    assert_eq!(after, engine.observe(&filter).await.unwrap());
    assert!(!cache.inspected.contains_key(&ids[0]));
    engine.remove_matching(&filter).await.unwrap();
}
