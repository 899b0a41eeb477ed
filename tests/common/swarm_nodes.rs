//! The Swarm a test binary runs on: made once per binary by `scripts/test-swarm.sh hold N` and
//! kept until the binary exits, shared by its scenarios one at a time ([`Nodes::shared`] with
//! [`Turn`]).
//!
//! One node: the host's engine as a single-node Swarm. Two nodes: the host's engine as the
//! manager on 10.231.0.1 and a second dockerd in a network namespace as a worker on 10.231.0.2,
//! with a TLS registry on 10.231.0.1:5000 both trust (the script says how).
//!
//! The script, not this process, owns the Swarm's life: it takes `/tmp/berth-locks/swarm.lock`,
//! sweeps what a crashed run left, makes the Swarm, prints its facts and tears everything down
//! when its stdin ends. This process holds the write end of that pipe: at a normal exit an
//! `atexit` handler closes it and waits for the teardown; when the process dies any other way the
//! kernel closes it, and the script tears down on its own. (libtest has no hook after the last
//! test, and statics are never dropped.) The same script makes the benchmark's Swarm.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// The lock every user of the host engine's Swarm holds for the Swarm's life.
pub const SWARM_LOCK: &str = "/tmp/berth-locks/swarm.lock";
/// Where the script writes what it does (kept after the run, appended to).
pub const HOLD_LOG: &str = "/tmp/berth-swarmnet.log";

/// The facts of a Swarm the script made (its ready line).
#[derive(Debug, Clone)]
pub struct Nodes {
    pub count: usize,
    facts: BTreeMap<String, String>,
    /// Seconds from the script's start to ready, lock wait excluded.
    pub setup_seconds: u64,
    /// Seconds this process waited for the Swarm (lock wait included).
    pub waited_seconds: f64,
}

/// The script's process and the write end of its stdin.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
}

static HOLDER: Mutex<Option<Holder>> = Mutex::new(None);
static SHARED: OnceLock<Result<Nodes, String>> = OnceLock::new();
static TURN: Mutex<()> = Mutex::new(());

/// One scenario's turn on the shared Swarm: scenarios of one binary run one after the other
/// (a node drained by one must not surprise another).
pub struct Turn(MutexGuard<'static, ()>);

impl Nodes {
    /// The Swarm of `count` nodes this test binary shares (made at the first call), or why there
    /// is none. A binary uses one kind only: asking for the other is a bug in the test.
    pub fn shared(count: usize) -> Result<&'static Nodes, String> {
        let nodes = SHARED.get_or_init(|| Nodes::hold(count));
        match nodes {
            Ok(n) if n.count != count => panic!(
                "this test binary holds a Swarm of {} node(s) and asked for one of {count}: put scenarios of each kind in their own test file",
                n.count
            ),
            Ok(n) => Ok(n),
            Err(e) => Err(e.clone()),
        }
    }

    /// Waits for this binary's turn on the Swarm.
    pub fn turn(&self) -> Turn {
        Turn(TURN.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn hold(count: usize) -> Result<Nodes, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-swarm.sh");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(HOLD_LOG)
            .map_err(|e| format!("{HOLD_LOG}: {e}"))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new(&script);
        cmd.args(["hold", &count.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Not this process's stderr: the script outlives it when it dies, and a write to a
            // closed pipe would kill the teardown.
            .stderr(log);
        if super::locks::ancestor_holds(SWARM_LOCK) {
            // `flock swarm.lock cargo test …`: the lock is this run's already.
            cmd.env("BERTH_SWARM_LOCK_HELD", "1");
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        // The script prints nothing else on stdout; EOF means it failed.
        let _ = BufReader::new(stdout).read_line(&mut line);
        let Some(facts) = line.trim().strip_prefix("ready ") else {
            drop(stdin);
            let _ = child.wait();
            let text = std::fs::read(HOLD_LOG).unwrap_or_default();
            let start = (log_start as usize).min(text.len());
            return Err(format!(
                "scripts/test-swarm.sh hold {count} failed: {}",
                String::from_utf8_lossy(&text[start..]).trim()
            ));
        };
        let facts: BTreeMap<String, String> = facts
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        *HOLDER.lock().unwrap_or_else(|e| e.into_inner()) = Some(Holder { child, stdin });
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(release_at_exit) };
        let nodes = Nodes {
            count,
            setup_seconds: facts
                .get("setup_seconds")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            waited_seconds: started.elapsed().as_secs_f64(),
            facts,
        };
        eprintln!(
            "a Swarm of {count} node(s) in {:.1}s ({}s to make it): {:?}",
            nodes.waited_seconds, nodes.setup_seconds, nodes.facts
        );
        Ok(nodes)
    }

    fn fact(&self, key: &str) -> &str {
        self.facts
            .get(key)
            .unwrap_or_else(|| panic!("the Swarm of {} node(s) has no {key}", self.count))
    }

    /// The manager's address on the Swarm (10.231.0.1, or 127.0.0.1 for one node).
    pub fn manager_addr(&self) -> std::net::IpAddr {
        self.fact("manager_addr").parse().unwrap()
    }

    pub fn manager_node(&self) -> &str {
        self.fact("manager_node")
    }

    /// Whether the script made the Swarm (false: the engine managed one already).
    pub fn made(&self) -> bool {
        self.fact("made") == "1"
    }

    pub fn worker_addr(&self) -> std::net::IpAddr {
        self.fact("worker_addr").parse().unwrap()
    }

    pub fn worker_node(&self) -> &str {
        self.fact("worker_node")
    }

    /// The worker's hostname (its own UTS namespace): what Swarm and berth call the node.
    pub fn worker_hostname(&self) -> &str {
        self.fact("worker_hostname")
    }

    /// The network namespace the worker's dockerd and its host-network tasks live in.
    pub fn worker_netns(&self) -> &str {
        self.fact("worker_netns")
    }

    /// `host:port` of the registry both nodes trust.
    pub fn registry(&self) -> &str {
        self.fact("registry")
    }

    pub fn registry_password(&self) -> &str {
        self.fact("registry_password")
    }

    /// The CA that signed the registry's certificate.
    pub fn registry_ca(&self) -> PathBuf {
        PathBuf::from(self.fact("registry_ca"))
    }

    /// The registry's log: one "authorized request" line per request that carried valid
    /// credentials, with the client's address.
    pub fn registry_log(&self) -> String {
        std::fs::read_to_string(self.fact("registry_log")).unwrap_or_default()
    }

    /// A DOCKER_CONFIG logged in to [`Nodes::registry`] (berth's credentials for it).
    pub fn docker_config(&self) -> PathBuf {
        PathBuf::from(self.fact("docker_config"))
    }

    /// `docker <args>` against the worker's engine.
    pub fn worker_docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .args(["-H", self.fact("worker_host")])
            .args(args)
            .output()
            .expect("running docker")
    }

    /// `docker <args>` against the worker's engine, which must succeed; its stdout, trimmed.
    pub fn worker_docker_ok(&self, args: &[&str]) -> String {
        let out = self.worker_docker(args);
        assert!(
            out.status.success(),
            "docker (worker) {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A sysctl (`net.ipv4.…` form) in the worker's network namespace: the value the worker's
    /// host-network tasks live with.
    pub fn worker_sysctl(&self, key: &str) -> String {
        let out = self.in_worker_netns(&["sysctl", "-n", key]);
        assert!(
            out.status.success(),
            "sysctl -n {key} in the worker's namespace"
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn set_worker_sysctl(&self, key: &str, value: &str) {
        let out = self.in_worker_netns(&["sysctl", "-qw", &format!("{key}={value}")]);
        assert!(
            out.status.success(),
            "sysctl {key}={value} in the worker's namespace: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A command in the worker's network namespace (only: the mounts are the host's).
    pub fn in_worker_netns(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.worker_netns()))
            .args(args)
            .output()
            .expect("nsenter")
    }
}

/// Closes the script's stdin and waits for its teardown, at this process's normal exit.
extern "C" fn release_at_exit() {
    let holder = HOLDER.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(mut h) = holder {
        drop(h.stdin.take());
        let _ = h.child.wait();
    }
}
