//! Swarm scenarios driven by the real `berth` binary: [`SwarmGuard`] is one scenario's turn on
//! the Swarm its test binary shares ([`super::swarm_nodes::Nodes`]: one node, or two with a
//! worker in a network namespace), and [`SwarmCase`] one berth config and state directory on it.
//!
//! On drop (also on panic) a guard removes what its scenario made on the Swarm (services,
//! configs, secrets by the case's label, their task containers on every node gone), the node
//! labels it added, the availability and worker sysctls it changed, the derived agent images
//! built during it; host sysctls berth changes are put back by the [`HostGuard`] it holds.
//! Scenarios of one binary take turns; the Swarm itself goes when the binary exits.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use super::agent::{agent_images, remove_agent_images_except};
use super::host::HostGuard;
pub use super::swarm_nodes::Nodes;
use super::swarm_nodes::Turn;
use super::{short_tempdir, Cleanup, LABEL_TEST_CASE};

/// `docker <args>`; its output.
pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("running docker")
}

/// `docker <args>`, which must succeed; its stdout, trimmed.
pub fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One scenario on the test binary's Swarm.
pub struct SwarmGuard {
    pub nodes: &'static Nodes,
    /// `(node, key)` of labels the scenario added (removed on drop).
    node_labels: Mutex<Vec<(String, String)>>,
    /// Nodes whose availability the scenario changed (active again on drop).
    availability: Mutex<Vec<String>>,
    /// Worker sysctls the scenario changed, with their values before (restored on drop).
    worker_sysctls: Mutex<Vec<(String, String)>>,
    /// The derived agent images present before the scenario (those built during it go on drop).
    images_before: Vec<String>,
    pub cleanup: Cleanup,
    started: Instant,
    _host: HostGuard,
    /// Dropped last: the next scenario starts once this one's leftovers are gone.
    _turn: Turn,
}

impl SwarmGuard {
    /// A scenario on a single-node Swarm; None (after saying why) when there can be none here.
    pub fn new(test: &str) -> Option<SwarmGuard> {
        SwarmGuard::on(1, test)
    }

    /// A scenario on the two-node Swarm (the manager and a worker in a network namespace).
    pub fn two_nodes(test: &str) -> Option<SwarmGuard> {
        SwarmGuard::on(2, test)
    }

    fn on(count: usize, test: &str) -> Option<SwarmGuard> {
        let nodes = match Nodes::shared(count) {
            Ok(n) => n,
            Err(why) => {
                super::skip(test, &format!("no Swarm of {count} node(s) here: {why}"));
                return None;
            }
        };
        let turn = nodes.turn();
        Some(SwarmGuard {
            nodes,
            node_labels: Mutex::default(),
            availability: Mutex::default(),
            worker_sysctls: Mutex::default(),
            images_before: agent_images(),
            cleanup: Cleanup::new(test),
            started: Instant::now(),
            _host: HostGuard::new(),
            _turn: turn,
        })
    }

    /// Adds a label to this (the manager's) node (removed again on drop).
    pub fn label_node(&self, key: &str, value: &str) {
        let me = self.nodes.manager_node().to_string();
        self.label(&me, key, value);
    }

    /// Adds a label to `node` (removed again on drop).
    pub fn label(&self, node: &str, key: &str, value: &str) {
        docker_ok(&[
            "node",
            "update",
            "--label-add",
            &format!("{key}={value}"),
            node,
        ]);
        locked(&self.node_labels).push((node.to_string(), key.to_string()));
    }

    /// Records a label something else added to `node` (removed on drop like the others).
    pub fn labelled(&self, node: &str, key: &str) {
        locked(&self.node_labels).push((node.to_string(), key.to_string()));
    }

    /// `docker node update --availability <availability> <node>` (active again on drop).
    pub fn set_availability(&self, node: &str, availability: &str) {
        docker_ok(&["node", "update", "--availability", availability, node]);
        locked(&self.availability).push(node.to_string());
    }

    /// Sets a sysctl in the worker's network namespace (restored on drop).
    pub fn set_worker_sysctl(&self, key: &str, value: &str) {
        let before = self.nodes.worker_sysctl(key);
        self.nodes.set_worker_sysctl(key, value);
        locked(&self.worker_sysctls).push((key.to_string(), before));
    }

    /// What the scenario made on the Swarm: `(services, configs, secrets)` by name.
    pub fn objects(&self) -> (Vec<String>, Vec<String>, Vec<String>) {
        let filter = format!("label={}", self.cleanup.filter());
        let names = |kind: &str| -> Vec<String> {
            docker_ok(&[kind, "ls", "--filter", &filter, "--format", "{{.Name}}"])
                .lines()
                .map(str::to_string)
                .filter(|l| !l.is_empty())
                .collect()
        };
        (names("service"), names("config"), names("secret"))
    }

    /// The scenario's task containers on every node (running or not).
    pub fn task_containers_anywhere(&self) -> usize {
        let filter = format!("label={}", self.cleanup.filter());
        let args = ["ps", "-aq", "--filter", filter.as_str()];
        let mut n = docker_ok(&args).lines().count();
        if self.nodes.count > 1 {
            n += self.nodes.worker_docker_ok(&args).lines().count();
        }
        n
    }

    fn remove_objects(&self) {
        let (services, configs, secrets) = self.objects();
        if !services.is_empty() {
            let mut args = vec!["service", "rm"];
            args.extend(services.iter().map(String::as_str));
            let _ = docker(&args);
        }
        // Task containers go after their grace period; configs stay in use until then.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && self.task_containers_anywhere() > 0 {
            std::thread::sleep(Duration::from_millis(250));
        }
        for (kind, names) in [("config", configs), ("secret", secrets)] {
            if !names.is_empty() {
                let mut args = vec![kind, "rm"];
                args.extend(names.iter().map(String::as_str));
                let _ = docker(&args);
            }
        }
    }
}

impl Drop for SwarmGuard {
    fn drop(&mut self) {
        self.remove_objects();
        for (node, key) in locked(&self.node_labels).iter() {
            let _ = docker(&["node", "update", "--label-rm", key, node]);
        }
        for node in locked(&self.availability).iter() {
            let _ = docker(&["node", "update", "--availability", "active", node]);
        }
        for (key, value) in locked(&self.worker_sysctls).iter().rev() {
            self.nodes.set_worker_sysctl(key, value);
        }
        // Exited task containers still hold the images until the service is gone.
        remove_agent_images_except(&self.images_before);
        // On the real stderr: what each scenario adds to the suite's time.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "Swarm scenario {} took {:.1}s (cleanup included)",
            self.cleanup.case,
            self.started.elapsed().as_secs_f64()
        );
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The static agent binary berth puts into the derived image: `BERTH_AGENT_BINARY` when set,
/// else the berth binary under test (every build of berth is static).
pub fn agent_binary() -> PathBuf {
    std::env::var_os("BERTH_AGENT_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::agent::binary().to_path_buf())
}

/// One berth config and state directory on the Swarm.
pub struct SwarmCase<'a> {
    pub guard: &'a SwarmGuard,
    pub dir: tempfile::TempDir,
}

impl<'a> SwarmCase<'a> {
    pub fn new(guard: &'a SwarmGuard) -> SwarmCase<'a> {
        SwarmCase {
            guard,
            dir: short_tempdir(),
        }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("berth.toml")
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("s")
    }

    /// Writes the config: `engine = "swarm"` and, on two nodes, `[swarm] registry` (the
    /// harness's, which both nodes trust), then `toml`.
    pub fn write(&self, toml: &str) {
        let registry = match self.guard.nodes.count {
            1 => String::new(),
            _ => format!("[swarm]\nregistry = \"{}\"\n", self.registry()),
        };
        std::fs::write(
            self.config(),
            format!("engine = \"swarm\"\n{registry}{toml}"),
        )
        .unwrap();
    }

    /// The `[swarm] registry` of a two-node case: a path under the harness's registry.
    pub fn registry(&self) -> String {
        format!("{}/berth-test", self.guard.nodes.registry())
    }

    /// `berth <args>` on this case's config and state, with the test's labels.
    pub fn berth(&self, args: &[&str]) -> Output {
        self.berth_with(&[], true, args)
    }

    /// `berth <args>` with `env` set; with `-f <config>` when `config`, else from a directory
    /// without a berth.toml (the state directory still named).
    pub fn berth_with(&self, env: &[(&str, &Path)], config: bool, args: &[&str]) -> Output {
        self.run_berth(env, config, true, args)
    }

    /// `berth <args>` as a user runs it: without `BERTH_AGENT_BINARY` (berth finds the agent
    /// itself), `-f` only when `args` say so.
    pub fn berth_as_user(&self, args: &[&str]) -> Output {
        self.run_berth(&[], false, false, args)
    }

    fn run_berth(
        &self,
        env: &[(&str, &Path)],
        config: bool,
        agent_binary_set: bool,
        args: &[&str],
    ) -> Output {
        let elsewhere = short_tempdir();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.env("BERTH_SYSCTL_DROPIN", super::TEST_SYSCTL_DROPIN);
        if agent_binary_set {
            cmd.env("BERTH_AGENT_BINARY", agent_binary());
        } else {
            cmd.env_remove("BERTH_AGENT_BINARY");
        }
        if self.guard.nodes.count > 1 {
            // Logged in to the harness's registry: berth pushes there and forwards these.
            cmd.env("DOCKER_CONFIG", self.guard.nodes.docker_config());
        }
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_os_str())));
        if config {
            cmd.arg("-f").arg(self.config());
        } else if agent_binary_set {
            cmd.current_dir(elsewhere.path());
        }
        let out = cmd
            .arg("--state-dir")
            .arg(self.state())
            .args(["--container-label", "io.berth.test=1"])
            .arg("--container-label")
            .arg(format!("{LABEL_TEST_CASE}={}", self.guard.cleanup.case))
            .args(args)
            .output()
            .expect("running berth");
        eprintln!(
            "berth {args:?}: {}\n--- stdout\n{}--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub fn up_ok(&self) -> Output {
        let out = self.berth(&["up"]);
        assert!(out.status.success(), "berth up failed");
        out
    }

    /// `berth status -o json` rows.
    pub fn status(&self) -> Vec<Value> {
        let out = self.berth(&["-o", "json", "status"]);
        assert!(out.status.success(), "berth status failed");
        let v: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        match v {
            Value::Array(rows) => rows,
            other => other["replicas"].as_array().cloned().unwrap_or_default(),
        }
    }
}

/// `docker service inspect` of a service.
pub fn service(name: &str) -> Value {
    let out = docker_ok(&["service", "inspect", name]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0].clone()
}

/// The IDs of a service's running task containers on this node.
pub fn task_containers(service: &str) -> Vec<String> {
    docker_ok(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=com.docker.swarm.service.name={service}"),
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

/// How many sockets listen on TCP `port` (every Envoy worker of every task has its own with
/// SO_REUSEPORT).
pub fn listening_sockets(port: u16) -> usize {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// Polls `f` until it is true, or panics after `within` saying what was awaited.
pub fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
