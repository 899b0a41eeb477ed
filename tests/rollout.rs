//! The rolling reconcile against the real Docker engine and real Envoy, each under continuous
//! keep-alive HTTP load on 127.0.0.1 that counts every failed request (issue 4, "Tests").
//!
//! The tests drive the real binary (`berth up`) on a config written per test, and serialize on
//! one lock: each runs several Envoys plus a load generator, and the host has 2 CPUs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use std::time::Duration;

use berth::admin::Admin;
use berth::docker::Engine;
use berth::layout;
use berth::spec::{ObservedContainer, RunState, LABEL_NAME};
use common::load::{Load, LoadReport};
use common::{free_port, short_tempdir, Cleanup, LABEL_TEST_CASE};

const OLD: &str = "berth-test/envoy:1.39.3";
const NEW: &str = "berth-test/envoy:1.40.0";
const BROKEN: &str = "berth-test/envoy:exits-at-start";
const PROXY: &str = "roll";
const CONNECTIONS: usize = 48;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ensure_images() {
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
struct Fleet {
    cleanup: Cleanup,
    dir: tempfile::TempDir,
    port: u16,
    engine: Engine,
}

/// What a config varies in these tests.
#[derive(Clone)]
struct Settings {
    image: &'static str,
    replicas: u32,
    /// Extra TOML appended to the `[[proxy]]` table (before its sub-tables).
    proxy_extra: String,
    on_failure: &'static str,
    min_ready: &'static str,
}

impl Settings {
    fn new(image: &'static str, replicas: u32) -> Settings {
        Settings {
            image,
            replicas,
            proxy_extra: String::new(),
            on_failure: "rollback",
            min_ready: "1s",
        }
    }
}

impl Fleet {
    async fn new(name: &str) -> Fleet {
        ensure_images();
        Fleet {
            cleanup: Cleanup::new(name),
            dir: short_tempdir(),
            port: free_port(),
            engine: Engine::connect().await.expect("docker"),
        }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("berth.toml")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("s")
    }

    fn write(&self, s: &Settings) {
        let toml = format!(
            r#"
[[proxy]]
name = "{PROXY}"
image = "{image}"
replicas = {replicas}
concurrency = 1
{extra}
[proxy.resources]
memory = "256Mi"

[proxy.rollout]
startup_deadline = "20s"
min_ready = "{min_ready}"
drain_timeout = "10s"
on_failure = "{on_failure}"

[[proxy.listener]]
name = "web"
port = {port}
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "hello from berth\n" }}
"#,
            image = s.image,
            replicas = s.replicas,
            extra = s.proxy_extra,
            min_ready = s.min_ready,
            on_failure = s.on_failure,
            port = self.port,
        );
        std::fs::write(self.config(), toml).unwrap();
    }

    /// `berth up` with `--output json`; returns the process output.
    async fn up(&self) -> Output {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("-f")
            .arg(self.config())
            .arg("--state-dir")
            .arg(self.state())
            .args(["--container-label", "io.berth.test=1"])
            .arg("--container-label")
            .arg(format!("{LABEL_TEST_CASE}={}", self.cleanup.case))
            .args(["--output", "json", "up"])
            .output()
            .await
            .expect("running berth");
        eprintln!(
            "berth up: {}\n--- stdout\n{}--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    async fn up_ok(&self) -> Output {
        let out = self.up().await;
        assert!(out.status.success(), "berth up failed");
        out
    }

    /// This test's replicas, by slot then name.
    async fn replicas(&self) -> Vec<ObservedContainer> {
        let mut cs = self
            .engine
            .observe_labelled(&self.cleanup.filter())
            .await
            .unwrap();
        cs.retain(|c| c.is_managed());
        cs.sort_by_key(|c| (c.slot(), c.name.clone()));
        cs
    }

    /// (slot, container ID) of every replica.
    async fn ids(&self) -> Vec<(Option<u32>, String)> {
        self.replicas()
            .await
            .into_iter()
            .map(|c| (c.slot(), c.id))
            .collect()
    }

    fn admin(&self, c: &ObservedContainer) -> Admin {
        let run = c.label(LABEL_NAME).unwrap_or(&c.name);
        Admin::new(
            layout::ProxyDirs::new(&self.state(), PROXY)
                .run(run)
                .join(layout::ADMIN_SOCKET_FILE),
        )
    }

    fn load(&self) -> Load {
        Load::start(self.port, "/", CONNECTIONS, Duration::from_secs(300))
    }

    /// Every replica runs, one per slot `0..n`, and all report `version` in /server_info.
    async fn assert_serving(&self, n: u32, version: &str) {
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

fn assert_no_failures(what: &str, report: &LoadReport) {
    eprintln!("{what}: {}", report.summary());
    assert!(
        report.ok > 100,
        "{what}: the load barely ran: {}",
        report.summary()
    );
    assert_eq!(report.failed, 0, "{what}: {}", report.summary());
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn events(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn count_events(out: &Output, event: &str) -> usize {
    events(out).iter().filter(|e| e["event"] == event).count()
}

/// Sleeps a little with the load running, so "during" covers some steady state.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_three_replicas_under_load_loses_no_request() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("upgrade").await;
    let mut s = Settings::new(OLD, 3);
    fleet.write(&s);
    fleet.up_ok().await;
    fleet.assert_serving(3, "1.39.3").await;

    let load = fleet.load();
    settle().await;
    s.image = NEW;
    fleet.write(&s);
    let out = fleet.up_ok().await;
    settle().await;
    let report = load.stop().await;

    assert_eq!(count_events(&out, "replacing"), 3);
    assert_eq!(count_events(&out, "removed"), 3);
    assert_no_failures("upgrade 1.39.3 → 1.40.0", &report);
    fleet.assert_serving(3, "1.40.0").await;
}

/// Starts `stop_new_in_slot` as a task: as soon as a replacement container appears in `slot`
/// (a name not in `before`), it is stopped (`docker stop -t 0`), so its gate fails there.
fn sabotage_slot(
    fleet: &Fleet,
    slot: u32,
    before: Vec<String>,
) -> tokio::task::JoinHandle<Option<String>> {
    let filter = fleet.cleanup.filter();
    tokio::spawn(async move {
        let engine = Engine::connect().await.unwrap();
        for _ in 0..600 {
            let cs = engine.observe_labelled(&filter).await.unwrap_or_default();
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

fn docker(args: &[&str]) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_envoy_rejects_changes_no_container() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("rejected").await;
    let mut s = Settings::new(NEW, 3);
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;

    let load = fleet.load();
    settle().await;
    s.proxy_extra = "[proxy.bootstrap]\ntype = \"merge\"\nvalue = \"\"\"\nstats_config:\n  \
                     berth_no_such_field: 1\n\"\"\"\n"
        .to_string();
    fleet.write(&s);
    let out = fleet.up().await;
    settle().await;
    let report = load.stop().await;

    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("envoy --mode validate rejected the new config of proxy roll")
            && err.contains("no replica was changed")
            && err.contains("berth_no_such_field"),
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
    let fleet = Fleet::new("exits").await;
    let mut s = Settings::new(NEW, 3);
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;

    let load = fleet.load();
    settle().await;
    s.image = BROKEN;
    fleet.write(&s);
    let out = fleet.up().await;
    settle().await;
    let report = load.stop().await;

    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("rollout of roll failed: replica roll/0 (berth-roll-0-")
            && err.contains("did not stay running: Envoy exited with code 1")
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
    let fleet = Fleet::new("rollback").await;
    let mut s = Settings::new(OLD, 3);
    s.min_ready = "3s";
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;
    let names: Vec<String> = fleet.replicas().await.into_iter().map(|c| c.name).collect();

    let load = fleet.load();
    settle().await;
    s.image = NEW;
    fleet.write(&s);
    let saboteur = sabotage_slot(&fleet, 1, names);
    let out = fleet.up().await;
    settle().await;
    let report = load.stop().await;
    let stopped = saboteur.await.unwrap().expect("slot 1 got a new container");

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
    let fleet = Fleet::new("pause").await;
    let mut s = Settings::new(OLD, 3);
    s.min_ready = "3s";
    s.on_failure = "pause";
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;
    let names: Vec<String> = fleet.replicas().await.into_iter().map(|c| c.name).collect();

    let load = fleet.load();
    settle().await;
    s.image = NEW;
    fleet.write(&s);
    let saboteur = sabotage_slot(&fleet, 1, names);
    let out = fleet.up().await;
    settle().await;
    let report = load.stop().await;
    saboteur.await.unwrap().expect("slot 1 got a new container");

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
    let fleet = Fleet::new("removed").await;
    let s = Settings::new(NEW, 3);
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;
    docker(&["rm", "-f", &before[1].1]);

    let load = fleet.load();
    settle().await;
    let out = fleet.up_ok().await;
    settle().await;
    let report = load.stop().await;

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

    let load = fleet.load();
    settle().await;
    let out = fleet.up_ok().await;
    settle().await;
    let report = load.stop().await;

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

    let load = fleet.load();
    settle().await;
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
    let out = fleet.up_ok().await;
    settle().await;
    let report = load.stop().await;
    assert_eq!(count_events(&out, "removed"), 3);
    assert_eq!(count_events(&out, "replacing"), 0);
    assert_eq!(fleet.ids().await[..], three[..2]);
    assert_no_failures("scale 3 → 5 → 2", &report);
    fleet.assert_serving(2, "1.40.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_put_back_stopped_renamed_and_tampered_files() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("drift").await;
    let s = Settings::new(NEW, 3);
    fleet.write(&s);
    fleet.up_ok().await;
    let before = fleet.ids().await;

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
    assert_eq!(std::fs::read_to_string(&lds).unwrap(), good);
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
