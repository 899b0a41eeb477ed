//! The readiness gate means serving, not only initialised: a replica whose listener cannot
//! bind reports /ready LIVE all the same (Envoy only logs a rejected LDS update), and berth must
//! refuse it. Preflight normally catches a held port, so this drives the infrastructure's
//! converge directly (no host preparation), as a port taken between preflight and start would.

mod common;

use std::path::Path;
use std::sync::Arc;

use berth::core::progress::Reporter;
use berth::core::render::Renderer;
use berth::core::source::file;
use berth::core::target;
use berth::engine::{ContainerEngine, DockerEngine};
use berth::envoy::admin::SocketConnector;
use berth::infra::docker_host::DockerHost;
use berth::infra::{ConvergeError, ConvergeRequest, Gate, Infrastructure};
use berth::state::StateDir;
use common::{free_port, short_tempdir, Cleanup};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_replica_that_cannot_bind_its_listener_fails_the_gate() {
    let image = common::ensure_test_image();
    let cleanup = Cleanup::new("gate-bind");
    let dir = short_tempdir();
    let port = free_port();
    // Held without SO_REUSEPORT, so Envoy's listener cannot join it.
    let _holder = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
    let text = format!(
        r#"
[[proxy]]
name = "gatebind"
image = "{image}"
replicas = 1
[proxy.rollout]
min_ready = "0s"
startup_deadline = "20s"
[[proxy.listener]]
name = "web"
port = {port}
[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200 }}
"#
    );
    let config = file::parse(Path::new("gate.toml"), &text).unwrap();
    let state_path = dir.path().join("s");
    let state = StateDir::open(&state_path).unwrap();
    let targets = target::targets(
        &config.infra,
        &Renderer::builtin(),
        &state_path,
        2,
        berth::ops::acme::Placeholders::Write,
    )
    .unwrap();
    let engine = DockerEngine::connect().await.unwrap();
    let host = DockerHost::new(
        Arc::new(engine.clone()),
        Arc::new(SocketConnector),
        state,
        cleanup.labels(),
    );
    let reporter = Reporter::quiet();
    let err = host
        .converge(ConvergeRequest {
            target: &targets[0],
            generation: None,
            hold_files: false,
            confirm_timeout: std::time::Duration::from_secs(5),
            reporter: &reporter,
            cancel: CancellationToken::new(),
        })
        .await
        .expect_err("a replica without its listener must not pass the gate");
    let ConvergeError::Gate(failure) = err else {
        panic!("expected a gate failure, got {err}");
    };
    assert_eq!(failure.gate, Gate::Listeners, "{failure}");
    assert!(
        failure.why.iter().any(|l| l.contains("cannot bind")),
        "the lines that say why show Envoy's reason: {:?}\n{}",
        failure.why,
        failure.log_tail
    );
    let left = engine.observe(&cleanup.label_filter()).await.unwrap();
    assert!(left.is_empty(), "the failed replica is removed: {left:?}");
}
