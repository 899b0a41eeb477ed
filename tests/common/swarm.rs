//! A single-node Swarm for the tests, and proxies on it driven by the real `berth` binary.
//!
//! [`SwarmGuard`] holds `/tmp/berth-docker.lock` for as long as the Swarm exists (other test
//! files create plain containers; a Swarm must not surprise them), initializes a Swarm on the
//! local engine (`--advertise-addr 127.0.0.1`) only when the engine is in none, and on drop
//! (also on panic) removes what the test made on it (services, configs, secrets by label) and
//! leaves the Swarm it made, restoring the engine as found. Host sysctls berth changes are put
//! back by the [`HostGuard`] it holds.
#![allow(dead_code)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use super::agent::{agent_images, remove_agent_images_except};
use super::host::HostGuard;
use super::{short_tempdir, Cleanup, LABEL_TEST_CASE};

pub const DOCKER_LOCK: &str = "/tmp/berth-docker.lock";

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

fn node_state() -> (String, bool) {
    let out = docker_ok(&[
        "info",
        "--format",
        "{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}",
    ]);
    let (state, manager) = out.split_once(' ').unwrap_or((&out, "false"));
    (state.to_string(), manager == "true")
}

/// The single-node Swarm of one test file.
pub struct SwarmGuard {
    lock: Option<std::fs::File>,
    /// The test made the Swarm (and leaves it on drop).
    made: bool,
    /// `swarm init` made the `docker_gwbridge` network, which leaving the Swarm keeps (removed
    /// on drop).
    made_gwbridge: bool,
    /// Labels the test added to this node (removed on drop).
    node_labels: Vec<String>,
    /// The derived agent images present before the test (those built during it go on drop).
    images_before: Vec<String>,
    pub cleanup: Cleanup,
    _host: HostGuard,
}

impl SwarmGuard {
    /// None (after saying why) when the engine cannot become a Swarm manager here.
    pub fn new(test: &str) -> Option<SwarmGuard> {
        let lock = take_docker_lock();
        let host = HostGuard::new();
        let (state, manager) = node_state();
        let gwbridge_before = gwbridge_exists();
        let made = match state.as_str() {
            "inactive" => {
                let out = docker(&["swarm", "init", "--advertise-addr", "127.0.0.1"]);
                if !out.status.success() {
                    super::skip(
                        test,
                        &format!(
                            "the engine cannot become a Swarm manager: {}",
                            String::from_utf8_lossy(&out.stderr).trim()
                        ),
                    );
                    return None;
                }
                true
            }
            "active" if manager => false,
            other => {
                super::skip(
                    test,
                    &format!("the engine is in a Swarm as a non-manager (state {other}); berth needs a manager"),
                );
                return None;
            }
        };
        Some(SwarmGuard {
            lock,
            made,
            made_gwbridge: made && !gwbridge_before,
            node_labels: Vec::new(),
            images_before: agent_images(),
            cleanup: Cleanup::new(test),
            _host: host,
        })
    }

    /// Adds a label to this node (removed again on drop).
    pub fn label_node(&mut self, key: &str, value: &str) {
        let me = docker_ok(&["info", "--format", "{{.Swarm.NodeID}}"]);
        docker_ok(&[
            "node",
            "update",
            "--label-add",
            &format!("{key}={value}"),
            &me,
        ]);
        self.node_labels.push(key.to_string());
    }

    /// What the test made on the Swarm: `(services, configs, secrets)` by name.
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

    fn remove_objects(&self) {
        let (services, configs, secrets) = self.objects();
        if !services.is_empty() {
            let mut args = vec!["service", "rm"];
            args.extend(services.iter().map(String::as_str));
            let _ = docker(&args);
            // Task containers go after their grace period; configs stay in use until then.
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline
                && !docker_ok(&[
                    "ps",
                    "-q",
                    "--filter",
                    &format!("label={}", self.cleanup.filter()),
                ])
                .is_empty()
            {
                std::thread::sleep(Duration::from_millis(250));
            }
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
        let me = docker_ok(&["info", "--format", "{{.Swarm.NodeID}}"]);
        for key in &self.node_labels {
            let _ = docker(&["node", "update", "--label-rm", key, &me]);
        }
        if self.made {
            let out = docker(&["swarm", "leave", "--force"]);
            if !out.status.success() {
                eprintln!(
                    "could not leave the Swarm the test made: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        if self.made_gwbridge {
            let out = docker(&["network", "rm", GWBRIDGE]);
            if !out.status.success() {
                eprintln!(
                    "could not remove the {GWBRIDGE} network the test's Swarm made: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        // Exited task containers still hold the images until the Swarm is left.
        remove_agent_images_except(&self.images_before);
        drop(self.lock.take());
    }
}

/// The bridge `docker swarm init` creates for the node's overlay traffic.
const GWBRIDGE: &str = "docker_gwbridge";

fn gwbridge_exists() -> bool {
    docker(&["network", "inspect", GWBRIDGE]).status.success()
}

/// Takes the Docker lock for this process, unless an ancestor (`flock -o … cargo test`)
/// already holds it, which would otherwise deadlock.
fn take_docker_lock() -> Option<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(DOCKER_LOCK)
        .expect("opening the docker lock");
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Some(file);
    }
    if ancestor_holds(DOCKER_LOCK) {
        return None;
    }
    eprintln!("waiting for {DOCKER_LOCK} (another test run holds it)");
    // SAFETY: as above.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock {DOCKER_LOCK}");
    Some(file)
}

/// Whether a process among this one's ancestors holds a flock on `path` (from /proc/locks).
fn ancestor_holds(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let inode = meta.ino().to_string();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let holders: Vec<u32> = locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (kind, pid, dev) = (f.get(1)?, f.get(4)?, f.get(5)?);
            (*kind == "FLOCK" && dev.rsplit(':').next() == Some(inode.as_str()))
                .then(|| pid.parse().ok())
                .flatten()
        })
        .collect();
    let mut pid = std::process::id();
    while pid > 1 {
        if holders.contains(&pid) {
            return true;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The fields after the command name (which may hold spaces) start with state, ppid.
        pid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(1);
    }
    false
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

    pub fn write(&self, toml: &str) {
        std::fs::write(self.config(), format!("engine = \"swarm\"\n{toml}")).unwrap();
    }

    /// `berth <args>` on this case's config and state, with the test's labels.
    pub fn berth(&self, args: &[&str]) -> Output {
        self.berth_with(&[], true, args)
    }

    /// `berth <args>` with `env` set; with `-f <config>` when `config`, else from a directory
    /// without a berth.toml (the state directory still named).
    pub fn berth_with(&self, env: &[(&str, &Path)], config: bool, args: &[&str]) -> Output {
        let elsewhere = short_tempdir();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.env("BERTH_SYSCTL_DROPIN", super::TEST_SYSCTL_DROPIN)
            .env("BERTH_AGENT_BINARY", agent_binary())
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())));
        if config {
            cmd.arg("-f").arg(self.config());
        } else {
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
