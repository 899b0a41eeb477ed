//! Shared helpers for tests against the real Docker engine and a real Envoy.
//!
//! Every container a test creates carries `io.berth.test=1` and a per-test
//! `io.berth.test.case=<unique>` label; a [`Cleanup`] guard removes the test's containers when
//! it is dropped, also when the test panics. Temporary directories are short and under /tmp,
//! because an admin socket path must fit in 108 bytes (`sun_path`).
#![allow(dead_code)]

pub mod agent;
pub mod bind;
pub mod config;
pub mod eg;
pub mod fleet;
pub mod host;
pub mod load;
pub mod locks;
pub mod pebble;
pub mod registry;
pub mod serve;
pub mod skip;
pub mod swarm;
pub mod swarm_nodes;
pub mod tls;
pub mod upstream;
pub mod xds;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use skip::skip;

use berth::core::layout;
use berth::core::replica::{
    Mount, ReplicaContainer, LABEL_IMAGE_ID, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PROXY, LABEL_SLOT,
    LABEL_SPEC_HASH, LABEL_TEST, MANAGED_BY_VALUE,
};
use berth::envoy::admin::{Admin, ReadyState};

pub const TEST_IMAGE: &str = "berth-test/envoy:1.40.0";
pub const TEST_VERSION: &str = "1.40.0";
/// Per-test label, so a test removes its own containers and nobody else's.
pub const LABEL_TEST_CASE: &str = "io.berth.test.case";

/// How long a test waits for what follows at once from an event it has seen (a certificate
/// served after `berth up` confirmed it from every replica, a reloaded secret used, a closed
/// connection counted): a bound against a hang, not a measure of speed, so it is far above
/// what a busy 2-core host needs; a test prints the time it took as a figure.
pub const EVENTUALLY: Duration = Duration::from_secs(30);

/// Where berth writes its sysctl drop-in during tests (never /etc/sysctl.d of the test host).
pub const TEST_SYSCTL_DROPIN: &str = "/tmp/berth-test-sysctl.d/60-berth.conf";

/// Makes sure the local test image exists (builds it once per test binary; the script is
/// idempotent).
pub fn ensure_test_image() -> &'static str {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/envoy-image.sh");
        let out = Command::new(&script)
            .arg(TEST_VERSION)
            .output()
            .expect("running scripts/envoy-image.sh");
        assert!(
            out.status.success(),
            "scripts/envoy-image.sh {TEST_VERSION} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    TEST_IMAGE
}

/// A unique, Docker-name-safe id for one test.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{:x}", std::process::id(), nanos)
}

/// Removes every container of one test case on drop (blocking `docker rm -f`; Drop cannot
/// be async).
pub struct Cleanup {
    pub case: String,
}

impl Cleanup {
    pub fn new(name: &str) -> Cleanup {
        Cleanup { case: unique(name) }
    }

    /// The labels every container of this test carries.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_TEST.to_string(), "1".to_string()),
            (LABEL_TEST_CASE.to_string(), self.case.clone()),
        ])
    }

    pub fn filter(&self) -> String {
        format!("{LABEL_TEST_CASE}={}", self.case)
    }

    /// [`Cleanup::filter`] for the engine seam.
    pub fn label_filter(&self) -> berth::engine::LabelFilter {
        berth::engine::LabelFilter::default().with(LABEL_TEST_CASE, Some(&self.case))
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label={}", self.filter()))
            .output();
        let Ok(out) = out else { return };
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&ids)
                .output();
        }
    }
}

/// The berth under test with its test environment: its sysctl drop-in under /tmp (never
/// /etc/sysctl.d) and, with a state directory and a test case, `--state-dir` and the test's
/// container labels (so [`Cleanup`] finds what it made).
pub fn berth_command(state: Option<&Path>, case: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.env("BERTH_SYSCTL_DROPIN", TEST_SYSCTL_DROPIN);
    if let Some(state) = state {
        cmd.arg("--state-dir").arg(state);
    }
    if let Some(case) = case {
        cmd.args(["--container-label", "io.berth.test=1"])
            .arg("--container-label")
            .arg(format!("{LABEL_TEST_CASE}={case}"));
    }
    cmd
}

/// [`berth_command`] on `config` (`-f`), `state` and the test case `case`.
pub fn berth_on(config: &Path, state: &Path, case: &str) -> Command {
    let mut cmd = berth_command(Some(state), Some(case));
    cmd.arg("-f").arg(config);
    cmd
}

/// Prints what a command (`what`) did: its exit status, stdout and stderr (captured by the
/// harness, shown when the test fails).
pub fn show(what: &str, out: &std::process::Output) {
    eprintln!(
        "{what}: {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A process's exit status, stdout and stderr, for an assertion message.
pub fn describe(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A short temporary directory under /tmp (socket paths are limited to 108 bytes).
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bt")
        .tempdir_in("/tmp")
        .expect("tempdir")
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal valid bootstrap: admin on the socket in /run/berth (mode 0600), one listener on
/// 127.0.0.1:`port` answering every request with a direct response.
pub fn bootstrap_yaml(port: u16) -> String {
    format!(
        r#"admin:
  address:
    pipe:
      path: {sock}
      mode: 384
static_resources:
  listeners:
  - name: web
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {port} }}
    enable_reuse_port: true
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: web
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response:
                  status: 200
                  body: {{ inline_string: "hello from berth\n" }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
        sock = layout::CONTAINER_ADMIN_SOCKET
    )
}

/// One test replica's host files: a bootstrap directory and a run directory.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Fixture {
    pub fn new(port: u16) -> Fixture {
        let dir = short_tempdir();
        let f = Fixture { dir, port };
        f.write_bootstrap(&bootstrap_yaml(port));
        f
    }

    pub fn bootstrap_dir(&self) -> PathBuf {
        self.dir.path().join("b")
    }

    /// Writes the bootstrap (world-readable: Envoy runs as uid 101).
    pub fn write_bootstrap(&self, yaml: &str) {
        std::fs::create_dir_all(self.bootstrap_dir()).unwrap();
        std::fs::write(self.bootstrap_dir().join(layout::BOOTSTRAP_FILE), yaml).unwrap();
    }

    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join("r").join(name)
    }

    pub fn admin(&self, name: &str) -> Admin {
        Admin::new(self.run_dir(name).join(layout::ADMIN_SOCKET_FILE))
    }

    pub fn bootstrap_mount(&self) -> Mount {
        Mount {
            source: self.bootstrap_dir(),
            target: layout::CONTAINER_BOOTSTRAP_DIR.to_string(),
            read_only: true,
        }
    }

    /// A replica of proxy `proxy` in `slot`, named `name`, with its run directory made as berth
    /// makes it (owned by uid 101, mode 0700: Envoy creates its admin socket there).
    pub fn replica(&self, proxy: &str, slot: u32, name: &str, image: &str) -> ReplicaContainer {
        {
            use std::os::unix::fs::PermissionsExt;
            let dir = self.run_dir(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::chown(&dir, Some(101), Some(101)).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let labels = BTreeMap::from([
            (LABEL_MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
            (LABEL_PROXY.to_string(), proxy.to_string()),
            (LABEL_SLOT.to_string(), slot.to_string()),
            (LABEL_SPEC_HASH.to_string(), "test-hash".to_string()),
            (LABEL_IMAGE_ID.to_string(), "test-image-id".to_string()),
            (LABEL_NAME.to_string(), name.to_string()),
        ]);
        ReplicaContainer {
            name: name.to_string(),
            slot,
            image: image.to_string(),
            args: [
                "-c",
                layout::CONTAINER_BOOTSTRAP,
                "--disable-hot-restart",
                "--service-cluster",
                proxy,
                "--service-node",
                name,
                "--concurrency",
                "1",
                "--drain-time-s",
                "2",
                "--drain-strategy",
                "immediate",
            ]
            .into_iter()
            .map(str::to_string)
            .collect(),
            env: BTreeMap::new(),
            nano_cpus: Some(500_000_000),
            memory: Some(256 * 1024 * 1024),
            mounts: vec![
                self.bootstrap_mount(),
                Mount {
                    source: self.run_dir(name),
                    target: layout::CONTAINER_RUN_DIR.to_string(),
                    read_only: false,
                },
            ],
            labels,
            hardening: berth::core::replica::Hardening {
                user: berth::core::replica::REPLICA_USER,
                read_only_rootfs: true,
                cap_drop_all: true,
                cap_add: vec![],
                no_new_privileges: true,
            },
            network: berth::core::replica::Network::Host,
            restart_policy: berth::core::replica::RESTART_POLICY.to_string(),
        }
    }
}

/// Creates and starts `replica` with the test's labels; returns its ID.
pub async fn run_replica(
    engine: &berth::engine::DockerEngine,
    mut replica: ReplicaContainer,
    cleanup: &Cleanup,
) -> String {
    use berth::engine::ContainerEngine;
    replica.labels.extend(cleanup.labels());
    let id = engine.create(&replica).await.expect("create");
    engine.start(&id).await.expect("start");
    id
}

/// Waits until the replica's admin says LIVE.
pub async fn wait_live(admin: &Admin, deadline: Duration) -> ReadyState {
    let start = Instant::now();
    loop {
        match admin.ready().await {
            Ok(ReadyState::Live) => return ReadyState::Live,
            Ok(other) if start.elapsed() > deadline => return other,
            Err(e) if start.elapsed() > deadline => panic!("replica never became ready: {e:#}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
