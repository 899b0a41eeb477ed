//! `berth agent` in real containers: the derived image (a real Envoy image plus the static berth
//! binary) running `berth agent run` as its entrypoint, with its `berth agent health`
//! HEALTHCHECK, on the real Docker engine; traffic only to 127.0.0.1.
//!
//! - Docker's health status turns healthy only once Envoy has bound the expected listener (an
//!   LDS file delivered later), is unhealthy while it has not, and the health output carries
//!   the config versions;
//! - `docker stop` of a replica with a sibling on the same port loses no request, under
//!   keep-alive and under connection-per-request load: the agent drains Envoy first;
//! - Envoy killed: the agent exits with 128+9; an image whose entrypoint fails: its code.
//!
//! The derived images these tests built are removed when the last of them ends.

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use berth::core::ir::Shutdown;
use berth::core::layout;
use berth::core::replica::{Mount, ReplicaContainer};
use berth::edges::agent;
use berth::engine::RESTART_NO;
use berth::engine::{ContainerEngine, DockerEngine, RunState};
use berth::envoy::readiness::Expect;
use common::fleet::{ensure_images, BROKEN, NEW};
use common::host::{self, HostGuard};
use common::load::{assert_no_failures, Load};
use common::{free_port, run_replica, Cleanup, Fixture};

/// The drain settings of these replicas: a drain window well above what a drain takes here.
fn shutdown() -> Shutdown {
    Shutdown {
        drain_timeout: Duration::from_secs(10),
        min_drain_duration: Duration::from_secs(1),
        health_check_failure_delay: Duration::ZERO,
    }
}

async fn engine() -> DockerEngine {
    ensure_images();
    DockerEngine::connect().await.expect("docker")
}

/// A replica of the derived image: the fixture's Envoy flags (what the base image would be
/// given), the agent's settings in its environment, as a service sets them.
fn agent_replica(
    fixture: &Fixture,
    image: &str,
    name: &str,
    ports: &[u16],
    config_version: &str,
) -> ReplicaContainer {
    let mut r = fixture.replica("agent", 0, name, image);
    let drain_time = shutdown().drain_timeout.as_secs().to_string();
    if let Some(i) = r.args.iter().position(|a| a == "--drain-time-s") {
        r.args[i + 1] = drain_time;
    }
    // The fixture's listeners bind 127.0.0.1.
    let expect = Expect {
        ports: ports.to_vec(),
        addresses: ports
            .iter()
            .map(|p| (*p, IpAddr::from([127, 0, 0, 1])))
            .collect(),
    };
    r.env = agent::service_env(&shutdown(), &expect, config_version);
    r
}

/// Docker's health status of a container and the output of its last health check.
async fn health(engine: &DockerEngine, id: &str) -> (String, String) {
    let c = engine
        .client()
        .inspect_container(id, None)
        .await
        .expect("inspect");
    let h = c.state.and_then(|s| s.health).unwrap_or_default();
    let status = h.status.map(|s| s.to_string()).unwrap_or_default();
    let last = h
        .log
        .unwrap_or_default()
        .last()
        .and_then(|r| r.output.clone())
        .unwrap_or_default();
    (status, last.trim().to_string())
}

/// Waits until Docker says `want`; returns the last health output then.
async fn wait_health(engine: &DockerEngine, id: &str, want: &str, within: Duration) -> String {
    let start = Instant::now();
    loop {
        let (status, last) = health(engine, id).await;
        if status == want {
            return last;
        }
        assert!(
            start.elapsed() < within,
            "container {id} not {want} within {within:?}: {status}, last check said {last:?}; log:\n{}",
            engine.logs(id, Some(30)).await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_exited(engine: &DockerEngine, id: &str, within: Duration) -> i64 {
    let start = Instant::now();
    loop {
        let s = engine.status(id).await.unwrap().expect("container exists");
        if s.state == RunState::Exited {
            return s.exit_code.unwrap_or_default();
        }
        assert!(start.elapsed() < within, "{id} still {:?}", s.state);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn lds(version: &str, port: Option<u16>) -> String {
    let Some(port) = port else {
        return format!("version_info: \"{version}\"\nresources: []\n");
    };
    // The fixture's static listener, as an LDS resource.
    let listener = common::bootstrap_yaml(port);
    let listener = listener
        .split_once("  listeners:\n")
        .unwrap()
        .1
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let listener = listener.replacen(
        "- name: web",
        "- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name: web",
        1,
    );
    format!("version_info: \"{version}\"\nresources:\n{listener}\n")
}

/// Atomically replaces a watched file (Envoy reloads on the rename).
fn deliver(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

#[tokio::test]
async fn healthy_only_once_the_listener_is_bound_and_the_versions_are_reported() {
    let _images = common::agent::ImagesGuard::new();
    let engine = engine().await;
    let image = common::agent::image(&engine, NEW).await;
    let cleanup = Cleanup::new("agent-health");
    let port = free_port();
    let fixture = Fixture::new(port);
    // Listeners from a watched LDS file, empty at first: Envoy turns LIVE without them.
    let xds = fixture.dir.path().join("x");
    std::fs::create_dir_all(&xds).unwrap();
    deliver(&xds, layout::LDS_FILE, &lds("v0", None));
    let bootstrap = format!(
        "admin:\n  address:\n    pipe:\n      path: {sock}\n      mode: 384\n\
         dynamic_resources:\n  lds_config:\n    resource_api_version: V3\n    \
         path_config_source:\n      path: {dir}/{lds}\n      watched_directory:\n        \
         path: {dir}\n",
        sock = layout::CONTAINER_ADMIN_SOCKET,
        dir = layout::CONTAINER_XDS_DIR,
        lds = layout::LDS_FILE,
    );
    fixture.write_bootstrap(&bootstrap);
    let mut replica = agent_replica(&fixture, &image, &cleanup.case, &[port], "spec-1");
    replica.mounts.push(Mount {
        source: xds.clone(),
        target: layout::CONTAINER_XDS_DIR.to_string(),
        read_only: true,
    });
    let id = run_replica(&engine, replica, &cleanup).await;

    // LIVE, listener missing: unhealthy, saying which port.
    let last = wait_health(&engine, &id, "unhealthy", Duration::from_secs(30)).await;
    assert!(
        last.starts_with("not-ready config=spec-1 lds=v0 ")
            && last.contains(&format!("not listening on port(s) {port}")),
        "{last}"
    );
    assert!(
        common::serve::http_get(port, "/").is_none(),
        "nothing should serve {port} yet"
    );

    // The listener arrives: healthy, and serving.
    deliver(&xds, layout::LDS_FILE, &lds("v1", Some(port)));
    let last = wait_health(&engine, &id, "healthy", Duration::from_secs(30)).await;
    assert_eq!(last, "ready config=spec-1 lds=v1 cds=-");
    let answer = common::serve::http_get(port, "/").expect("serving once healthy");
    assert_eq!(answer.0, 200);
    let report = agent::health::Report::parse(&last).unwrap();
    assert!(report.ready);
    assert_eq!(report.lds.as_deref(), Some("v1"));

    // The verdict beside the admin socket, for whoever reads the run directory.
    let file = fixture
        .run_dir(&cleanup.case)
        .join(agent::settings::HEALTH_FILE);
    let saved: agent::health::Report =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(saved.ready, "{saved:?}");
    assert_eq!(saved.config.as_deref(), Some("spec-1"));
}

/// Stops `id` as the engine would (SIGTERM, SIGKILL after the grace period) and returns how
/// long it took and the exit code.
async fn stop(engine: &DockerEngine, id: &str) -> (Duration, i64) {
    let start = Instant::now();
    engine
        .stop(id, agent::stop_grace_period(&shutdown()))
        .await
        .expect("stop");
    let took = start.elapsed();
    (took, wait_exited(engine, id, Duration::from_secs(5)).await)
}

#[tokio::test]
async fn docker_stop_drains_with_a_sibling_on_the_port_and_loses_nothing() {
    let _images = common::agent::ImagesGuard::new();
    let _host = HostGuard::new();
    // What berth prepares on every host: queued connections of a closing listener move to a
    // sibling (connection-per-request clients keep a listener busy until it closes).
    host::set(host::MIGRATE_REQ, 1);
    let engine = engine().await;
    let image = common::agent::image(&engine, NEW).await;
    let cleanup = Cleanup::new("agent-stop");
    let port = free_port();
    let fixture = Fixture::new(port);
    let start = |n: usize| {
        let name = format!("{}-{n}", cleanup.case);
        agent_replica(&fixture, &image, &name, &[port], "spec-1")
    };
    let (a, b, c) = (start(0), start(1), start(2));
    let a = run_replica(&engine, a, &cleanup).await;
    let b = run_replica(&engine, b, &cleanup).await;
    for id in [&a, &b] {
        wait_health(&engine, id, "healthy", Duration::from_secs(30)).await;
    }

    // Keep-alive clients spread over both replicas; one is stopped.
    let load = Load::start(port, "/", 16, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (took, code) = stop(&engine, &a).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    eprintln!("keep-alive: docker stop took {took:?}, exit code {code}");
    assert_no_failures("docker stop under keep-alive load", &report);
    assert_eq!(code, 0, "Envoy stopped after the drain exits 0");
    let log = engine.logs(&a, None).await.unwrap();
    assert!(
        log.contains("berth agent: SIGTERM: draining Envoy")
            && log.contains("berth agent: drained: 0 connection(s) left"),
        "{log}"
    );

    // A replacement joins; clients opening a connection per request; the other one stops.
    let c = run_replica(&engine, c, &cleanup).await;
    wait_health(&engine, &c, "healthy", Duration::from_secs(30)).await;
    let load = Load::start_per_request(port, "/", 8, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (took, code) = stop(&engine, &b).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    eprintln!("connection-per-request: docker stop took {took:?}, exit code {code}");
    assert_no_failures("docker stop under connection-per-request load", &report);
    assert_eq!(code, 0);
    assert_eq!(
        common::serve::http_get(port, "/").map(|a| a.0),
        Some(200),
        "the remaining replica serves"
    );
}

/// Envoy's host pid: the only child of the container's main process (the agent).
fn envoy_pid(agent_pid: i64) -> i32 {
    let children =
        std::fs::read_to_string(format!("/proc/{agent_pid}/task/{agent_pid}/children")).unwrap();
    let pids: Vec<i32> = children
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "the agent has one child, Envoy: {pids:?}");
    pids[0]
}

#[tokio::test]
async fn envoy_killed_or_failing_at_start_ends_the_agent_with_its_status() {
    let _images = common::agent::ImagesGuard::new();
    let engine = engine().await;
    let image = common::agent::image(&engine, NEW).await;
    let cleanup = Cleanup::new("agent-exit");
    let port = free_port();
    let fixture = Fixture::new(port);
    let mut replica = agent_replica(&fixture, &image, &cleanup.case, &[port], "spec-1");
    replica.restart_policy = RESTART_NO.to_string();
    let id = run_replica(&engine, replica, &cleanup).await;
    wait_health(&engine, &id, "healthy", Duration::from_secs(30)).await;
    let agent_pid = engine.status(&id).await.unwrap().unwrap().pid.unwrap();
    let envoy = envoy_pid(agent_pid);
    // SAFETY: kill(2) of a process this test found as the container's Envoy.
    assert_eq!(unsafe { libc::kill(envoy, libc::SIGKILL) }, 0);
    let code = wait_exited(&engine, &id, Duration::from_secs(10)).await;
    assert_eq!(code, 137, "128 + SIGKILL");
    let log = engine.logs(&id, None).await.unwrap();
    assert!(log.contains("Envoy exited: signal: 9"), "{log}");

    // An image whose entrypoint fails at start: the agent passes its exit code on.
    let broken = common::agent::image(&engine, BROKEN).await;
    let name = format!("{}-broken", cleanup.case);
    let mut replica = agent_replica(&fixture, &broken, &name, &[port], "spec-1");
    replica.restart_policy = RESTART_NO.to_string();
    let id = run_replica(&engine, replica, &cleanup).await;
    assert_eq!(wait_exited(&engine, &id, Duration::from_secs(10)).await, 1);
    let log = engine.logs(&id, None).await.unwrap();
    assert!(log.contains("exits at start on purpose"), "{log}");
    let labels: BTreeMap<String, String> = engine
        .client()
        .inspect_image(&broken)
        .await
        .unwrap()
        .config
        .and_then(|c| c.labels)
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert_eq!(
        labels
            .get(berth::infra::swarm::agent_image::LABEL_BASE)
            .map(String::as_str),
        Some(BROKEN)
    );
}
