//! Liveness on a single-node Docker Swarm (issue 25, its Swarm item), against the real engine
//! and real Envoy, under connection-per-request load with a per-request timeout through
//! 127.0.0.1:<port> (a hung request is a failure):
//!
//! - one task's Envoy stopped by SIGSTOP (its agent still runs): the agent kills it, the task
//!   exits and Swarm replaces it; asserted: the agent's log line, the task out of the port within
//!   a generous 15 s, all tasks ready again. Time to out-of-port and failed fraction are printed;
//! - one task container frozen (`docker pause`: the agent frozen too): only Swarm's health check
//!   could act; how long until the task was out of the port and replaced is printed (a figure:
//!   on Engine 20.10 never, as the engine runs no health check on a paused container).
//!
//! Run it on its own (it takes the Swarm's lock itself): `cargo test --test swarm_liveness`.

mod common;

use std::time::{Duration, Instant};

use common::fleet::{ensure_images, OLD};
use common::free_port;
use common::load::Load;
use common::swarm::*;

const SERVICE: &str = "berth-swlive";
const CLIENTS: usize = 8;
/// The safety bound of the issue: a hung task is out of the port well within this.
const OUT_OF_PORT_BOUND: Duration = Duration::from_secs(15);
/// How long a frozen task is watched for Swarm to act (it did not within 90 s on Engine
/// 20.10: the engine stops a paused container's health checks, so no unhealthy event comes).
const PAUSE_WATCHED: Duration = Duration::from_secs(30);

fn proxy_toml(port: u16) -> String {
    format!(
        r#"
[[proxy]]
name = "swlive"
image = "{OLD}"
replicas = 3
concurrency = 1

[proxy.resources]
memory = "256Mi"

[proxy.shutdown]
drain_timeout = "3s"
min_drain_duration = "0s"

[proxy.rollout]
startup_deadline = "10s"
min_ready = "1s"

[[proxy.listener]]
name = "web"
port = {port}
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "hello from swarm\n" }}
"#
    )
}

fn scenario(test: &str) -> Option<SwarmGuard> {
    ensure_images();
    std::env::set_var("BERTH_AGENT_BINARY", agent_binary());
    SwarmGuard::new(test)
}

/// The host pid of the Envoy in task container `id` (the agent's child).
fn envoy_host_pid(id: &str) -> u32 {
    let top = docker_ok(&["top", id, "-eo", "pid,comm"]);
    top.lines()
        .skip(1)
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let pid = f.next()?;
            (f.next()? == "envoy").then(|| pid.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no envoy process in {id}: {top}"))
}

fn all_ready(case: &SwarmCase) -> bool {
    let rows = case.status();
    rows.len() == 3 && rows.iter().all(|r| r["ready"] == true)
}

/// Waits until `port` has `want` listening sockets (one per task: concurrency 1), returns how
/// long that took from `since`.
fn sockets_reach(port: u16, want: usize, since: Instant, within: Duration, what: &str) -> Duration {
    wait_until_fast(what, within, || listening_sockets(port) == want);
    since.elapsed()
}

/// [`wait_until`] polling every 50 ms (the figures are tenths of seconds).
fn wait_until_fast(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_envoy_is_killed_by_its_agent_and_its_task_replaced() {
    let Some(guard) = scenario("a_hung_envoy_is_killed_by_its_agent_and_its_task_replaced") else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let port = free_port();
    case.write(&proxy_toml(port));
    case.up_ok();
    wait_until("3 ready tasks", Duration::from_secs(30), || {
        all_ready(&case)
    });
    assert_eq!(listening_sockets(port), 3, "one socket per task");

    // SIGSTOP of one task's Envoy: the agent still runs.
    let load = Load::start_per_request(port, "/", CLIENTS, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = task_containers(SERVICE)[0].clone();
    let pid = envoy_host_pid(&victim);
    let stopped_at = Instant::now();
    // SAFETY: kill(2) with a valid signal; the pid is the victim's Envoy, just read.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    let out_of_port = sockets_reach(
        port,
        2,
        stopped_at,
        OUT_OF_PORT_BOUND,
        "the stopped Envoy out of the port",
    );
    wait_until("Swarm replaces the task", Duration::from_secs(60), || {
        let now = task_containers(SERVICE);
        now.len() == 3 && !now.contains(&victim)
    });
    wait_until("all tasks ready again", Duration::from_secs(60), || {
        all_ready(&case)
    });
    let replaced = stopped_at.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    let logs = docker(&["logs", &victim]);
    let logs = String::from_utf8_lossy(&logs.stderr).to_string();
    let line = logs
        .lines()
        .find(|l| l.contains("killed:"))
        .unwrap_or_else(|| panic!("no kill line in the victim's log: {logs}"));
    assert!(
        line.starts_with("berth agent: Envoy (pid ")
            && line.contains("killed: its Envoy is stopped by a signal (silent for "),
        "{line}"
    );
    assert!(
        logs.contains("Envoy exited: signal: 9"),
        "the agent passes on Envoy's end: {logs}"
    );
    let exit = docker_ok(&["inspect", "-f", "{{.State.ExitCode}}", &victim]);
    assert_eq!(exit, "137", "the task ends with Envoy's status");
    assert!(report.ok > 0, "{}", report.summary());
    eprintln!(
        "FIGURE swarm SIGSTOP of one task's Envoy: out of the port after {:.1} s, replaced and all ready after {:.1} s; {} of {} requests failed ({:.2}%); load average {}; {line}; load: {}",
        out_of_port.as_secs_f64(),
        replaced.as_secs_f64(),
        report.failed,
        report.ok + report.failed,
        100.0 * report.failed as f64 / (report.ok + report.failed).max(1) as f64,
        load_average(),
        report.summary()
    );

    // A frozen task: only Swarm's health check can act (a figure only).
    let load = Load::start_per_request(port, "/", CLIENTS, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = task_containers(SERVICE)[0].clone();
    let paused_at = Instant::now();
    docker_ok(&["pause", &victim]);
    let mut out_of_port = None;
    let mut replaced = None;
    while paused_at.elapsed() < PAUSE_WATCHED && replaced.is_none() {
        if out_of_port.is_none() && listening_sockets(port) == 2 {
            out_of_port = Some(paused_at.elapsed());
        }
        let now = task_containers(SERVICE);
        if !now.contains(&victim) && now.len() == 3 {
            replaced = Some(paused_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = load.stop().await;
    let health = docker(&["inspect", "-f", "{{json .State.Health}}", &victim]);
    let secs = |d: Option<Duration>| {
        d.map(|d| format!("{:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| format!("not within {PAUSE_WATCHED:?}"))
    };
    eprintln!(
        "FIGURE swarm docker pause of one task: out of the port after {}, replaced after {}; {} of {} requests failed ({:.2}%); load average {}; health: {}",
        secs(out_of_port),
        secs(replaced),
        report.failed,
        report.ok + report.failed,
        100.0 * report.failed as f64 / (report.ok + report.failed).max(1) as f64,
        load_average(),
        String::from_utf8_lossy(&health.stdout).chars().take(600).collect::<String>()
    );
    // Whatever Swarm did, the victim must not stay frozen for the next scenario.
    let _ = docker(&["unpause", &victim]);
    wait_until(
        "all tasks ready at the end",
        Duration::from_secs(90),
        || all_ready(&case),
    );
}
