//! One proxy managed by the real `berth` binary under test: its config, state directory, port
//! and containers, plus the helpers the rollout and crash tests share (load, sabotage).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use std::time::Duration;

use berth::core::layout;
use berth::core::replica::{ObservedContainer, RunState, LABEL_NAME};
use berth::engine::{ContainerEngine, DockerEngine};
use berth::envoy::admin::Admin;

use super::config as cfg;
#[allow(unused_imports)]
pub use super::load::assert_no_failures;
use super::load::{Load, LoadReport};
use super::{free_port, short_tempdir, Cleanup};

pub const OLD: &str = "berth-test/envoy:1.39.3";
pub const NEW: &str = "berth-test/envoy:1.40.0";
pub const BROKEN: &str = "berth-test/envoy:exits-at-start";
pub const PROXY: &str = "roll";
pub const CONNECTIONS: usize = 48;

pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn ensure_images() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-images.sh");
        let out = std::process::Command::new(&script)
            .output()
            .expect("running scripts/test-images.sh");
        assert!(
            out.status.success(),
            "scripts/test-images.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// One proxy managed by the real binary, with its own config, state directory and port.
pub struct Fleet {
    pub cleanup: Cleanup,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub engine: DockerEngine,
}

/// What a config varies in these tests.
#[derive(Clone)]
pub struct Settings {
    pub image: &'static str,
    pub replicas: u32,
    /// More fields of the `[[proxy]]` table, by dotted path (`"bootstrap.type"`).
    pub extra: Vec<(String, toml::Value)>,
    pub on_failure: &'static str,
    pub min_ready: &'static str,
    /// `rollout.max_surge`: 1 (one replica after another, the order most tests check) unless
    /// a test sets another, or None for berth's default.
    pub max_surge: Option<i64>,
}

impl Settings {
    pub fn new(image: &'static str, replicas: u32) -> Settings {
        Settings {
            image,
            replicas,
            extra: Vec::new(),
            on_failure: "rollback",
            min_ready: "1s",
            max_surge: Some(1),
        }
    }

    /// Sets one more field of the proxy, by its dotted path.
    pub fn set(&mut self, path: &str, value: impl Into<toml::Value>) {
        self.extra.push((path.to_string(), value.into()));
    }
}

impl Fleet {
    pub async fn new(name: &str) -> Fleet {
        ensure_images();
        Fleet {
            cleanup: Cleanup::new(name),
            dir: short_tempdir(),
            port: free_port(),
            engine: DockerEngine::connect().await.expect("docker"),
        }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("berth.toml")
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("s")
    }

    /// Writes `toml` as this fleet's config file.
    pub fn write_toml(&self, toml: &str) {
        std::fs::write(self.config(), toml).unwrap();
    }

    /// Writes the config of `s`: proxy [`PROXY`] on this fleet's port, answering
    /// "hello from berth".
    pub fn write(&self, s: &Settings) {
        let proxy = cfg::Proxy::new(PROXY, s.image, s.replicas)
            .set("concurrency", 1)
            .set("resources.memory", "256Mi")
            .set("shutdown.drain_timeout", "10s")
            .set("rollout.startup_deadline", "20s")
            .set("rollout.min_ready", s.min_ready)
            .set("rollout.on_failure", s.on_failure)
            .listener(
                cfg::Listener::http("web", self.port).route(cfg::Route::direct(
                    "/",
                    200,
                    "hello from berth\n",
                )),
            );
        let proxy = match s.max_surge {
            Some(n) => proxy.set("rollout.max_surge", n),
            None => proxy,
        };
        let proxy = s
            .extra
            .iter()
            .fold(proxy, |p, (path, value)| p.set(path, value.clone()));
        self.write_toml(&proxy.to_toml());
    }

    /// `berth <args>` on this fleet's config and state directory, with the test's labels.
    pub fn berth(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::from(super::berth_on(
            &self.config(),
            &self.state(),
            &self.cleanup.case,
        ));
        cmd.args(args);
        cmd
    }

    /// `berth up` with `--output json`; returns the process output.
    pub async fn up(&self) -> Output {
        self.up_with(&[]).await
    }

    /// `berth up --output json` with extra environment variables.
    pub async fn up_with(&self, env: &[(&str, &str)]) -> Output {
        let out = self
            .berth(&["--output", "json", "up"])
            .envs(env.iter().copied())
            .output()
            .await
            .expect("running berth");
        super::show("berth up", &out);
        out
    }

    pub async fn up_ok(&self) -> Output {
        let out = self.up().await;
        assert!(out.status.success(), "berth up failed");
        out
    }

    /// This test's replicas, by slot then name.
    pub async fn replicas(&self) -> Vec<ObservedContainer> {
        let mut cs = self
            .engine
            .observe(&self.cleanup.label_filter())
            .await
            .unwrap();
        cs.retain(|c| c.is_managed());
        cs.sort_by_key(|c| (c.slot(), c.name.clone()));
        cs
    }

    /// (slot, container ID) of every replica.
    pub async fn ids(&self) -> Vec<(Option<u32>, String)> {
        self.replicas()
            .await
            .into_iter()
            .map(|c| (c.slot(), c.id))
            .collect()
    }

    pub fn admin(&self, c: &ObservedContainer) -> Admin {
        let run = c.label(LABEL_NAME).unwrap_or(&c.name);
        Admin::new(
            layout::ProxyDirs::new(&self.state(), PROXY)
                .run(run)
                .join(layout::ADMIN_SOCKET_FILE),
        )
    }

    pub fn load(&self) -> Load {
        Load::start(self.port, "/", CONNECTIONS, Duration::from_secs(300))
    }

    /// A fleet up on `s` (`berth up` succeeded); it and the (slot, container ID) of its
    /// replicas.
    pub async fn up_on(name: &str, s: &Settings) -> (Fleet, Vec<(Option<u32>, String)>) {
        let fleet = Fleet::new(name).await;
        fleet.write(s);
        fleet.up_ok().await;
        let ids = fleet.ids().await;
        (fleet, ids)
    }

    /// Runs `work` under [`Fleet::load`], with [`settle`] before and after it; what `work`
    /// returned and what the load saw.
    pub async fn under_load<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> (T, LoadReport) {
        let load = self.load();
        settle().await;
        let done = work.await;
        settle().await;
        (done, load.stop().await)
    }

    /// Writes `s` and runs `berth up` under load; its output and what the load saw.
    pub async fn up_under_load(&self, s: &Settings) -> (Output, LoadReport) {
        self.under_load(async {
            self.write(s);
            self.up().await
        })
        .await
    }

    /// The names of this fleet's replicas.
    pub async fn names(&self) -> Vec<String> {
        self.replicas().await.into_iter().map(|c| c.name).collect()
    }

    /// Every replica runs, one per slot `0..n`, and all report `version` in /server_info.
    pub async fn assert_serving(&self, n: u32, version: &str) {
        let cs = self.replicas().await;
        let slots: Vec<Option<u32>> = cs.iter().map(|c| c.slot()).collect();
        assert_eq!(
            slots,
            (0..n).map(Some).collect::<Vec<_>>(),
            "one replica per slot: {cs:#?}"
        );
        for c in &cs {
            assert_eq!(c.state, RunState::Running, "{}", c.name);
            let v = self.admin(c).server_version().await.unwrap();
            assert!(v.contains(&format!("/{version}/")), "{}: {v}", c.name);
        }
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn events(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub fn count_events(out: &Output, event: &str) -> usize {
    events(out).iter().filter(|e| e["event"] == event).count()
}

/// Sleeps a little with the load running, so "during" covers some steady state.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Starts `stop_new_in_slot` as a task: as soon as a replacement container appears in `slot`
/// (a name not in `before`), it is stopped (`docker stop -t 0`), so its gate fails there.
pub fn sabotage_slot(
    fleet: &Fleet,
    slot: u32,
    before: Vec<String>,
) -> tokio::task::JoinHandle<Option<String>> {
    let filter = fleet.cleanup.label_filter();
    tokio::spawn(async move {
        let engine = DockerEngine::connect().await.unwrap();
        for _ in 0..600 {
            let cs = engine.observe(&filter).await.unwrap_or_default();
            if let Some(c) = cs
                .iter()
                .find(|c| c.slot() == Some(slot) && !before.contains(&c.name))
            {
                let out = tokio::process::Command::new("docker")
                    .args(["stop", "-t", "0", &c.id])
                    .output()
                    .await
                    .unwrap();
                assert!(out.status.success(), "docker stop failed");
                return Some(c.name.clone());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    })
}

pub fn docker(args: &[&str]) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
