//! A replica that stops answering while it keeps its socket (issue 25, DESIGN decision 14),
//! against the real Docker engine and real Envoy: berth never takes the fleet's own frozen
//! replica for a stranger holding the port, and replaces it.

mod common;

use std::time::{Duration, Instant};

use berth::core::replica::RunState;
use common::fleet::*;

/// `docker pause` of one of 2 replicas: the paused Envoy still holds its socket on the port,
/// and the engine reports no pid for it. `berth up` must see it as the fleet's own (never
/// "already in use by envoy (pid N)"), and replace it: a frozen replica never blocks
/// reconciling the rest of its proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_is_the_fleets_own_and_up_replaces_it() {
    let _serial = SERIAL.lock().await;
    let s = Settings::new(NEW, 2);
    let (fleet, ids) = Fleet::up_on("paused", &s).await;
    let (_, paused) = ids[0].clone();
    docker(&["pause", &paused]);
    let out = fleet.up().await;
    let err = stderr(&out);
    assert!(
        !err.contains("already in use"),
        "the fleet's own paused replica was taken for a stranger:\n{err}"
    );
    assert!(out.status.success(), "berth up failed:\n{err}");
    let now = fleet.replicas().await;
    assert!(
        now.iter().all(|c| c.id != paused),
        "the paused replica is still there: {now:#?}"
    );
    assert_eq!(
        now.iter().filter(|c| c.state == RunState::Running).count(),
        2,
        "{now:#?}"
    );
}

/// How a test makes one replica stop serving while it keeps its socket.
#[derive(Clone, Copy)]
enum Fault {
    /// `docker pause`: the engine freezes the whole container (its cgroup).
    Pause,
    /// `kill -STOP` of the replica's Envoy process, from the host: no engine event at all.
    StopEnvoy,
}

/// The host pid of the Envoy process in container `id` (from `docker top`).
fn envoy_pid(id: &str) -> i32 {
    let out = std::process::Command::new("docker")
        .args(["top", id, "-eo", "pid,comm"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .skip(1)
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let pid = it.next()?;
            (it.next()? == "envoy").then(|| pid.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no envoy process in {id}:\n{text}"))
}

/// `docker inspect -f FORMAT id`, trimmed ("" when the container is gone).
fn inspect(id: &str, format: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", format, id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn rfc3339(s: &str) -> std::time::SystemTime {
    humantime::parse_rfc3339_weak(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// Who may take the hung replica out of the port in a test.
#[derive(Clone, Copy, PartialEq)]
enum Repairer {
    /// serve's liveness watcher: it kills the replica, then its proxy's pass starts it again.
    Watcher,
    /// The watcher, or the pass the engine's `pause` event triggers (which replaces a paused
    /// replica start-first: the replacement created and ready, then the paused one removed),
    /// whichever comes first.
    WatcherOrPass,
}

/// serve manages 3 replicas under connection-per-request load; one replica stops serving
/// (`fault`) while it keeps its socket. It must be out of the port (its process gone, so its
/// socket closed) within a generous 15 s (goal: 5 s); when the watcher took it out: killed
/// before it runs again or a replacement is created, the kill in serve's log (proxy,
/// container, reason, silence) and in `berth_replica_repairs_total{reason}`. Never is the port
/// blamed on a stranger, and the proxy converges back to 3 ready replicas. Prints the time to
/// out-of-port and the failed fraction of the requests.
fn a_hung_replica_leaves_the_port(fault: Fault, repairer: Repairer, test: &str, flags: &[&str]) {
    use common::load::Load;
    use common::serve::Case;
    let _serial = SERIAL.blocking_lock();
    let case = Case::new(test);
    case.write(common::TEST_IMAGE, 3, "live\n", "0s");
    let serve = case.serve(flags);
    serve.wait_for("3 ready replicas", Duration::from_secs(90), |s| {
        s.converged(&case.name, 3)
    });
    let before = case.containers();
    let (victim, victim_name) = (before[1].0.clone(), before[1].1.clone());
    let first_start = inspect(&victim, "{{.State.StartedAt}}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load =
        rt.block_on(async { Load::start_per_request(case.port, "/", 8, Duration::from_secs(90)) });
    std::thread::sleep(Duration::from_secs(2));
    let (reason, label) = match fault {
        Fault::Pause => ("frozen by the engine", "paused"),
        Fault::StopEnvoy => ("stopped by a signal", "stopped"),
    };
    let pid = match fault {
        Fault::Pause => 0,
        Fault::StopEnvoy => envoy_pid(&victim),
    };
    let started = Instant::now();
    match fault {
        Fault::Pause => docker(&["pause", &victim]),
        Fault::StopEnvoy => assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0),
    }
    // Out of the port: the hung process is gone (killed, or its container removed), so its
    // socket is closed; a container started again has a new process.
    let out_of_port = loop {
        let state = inspect(&victim, "{{.State.Status}} {{.State.StartedAt}}");
        let alive =
            state == format!("running {first_start}") || state == format!("paused {first_start}");
        if !alive {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the hung replica {victim_name} is still {state} 15 s after the fault\nserve log:\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let back = serve.wait_for("3 ready replicas again", Duration::from_secs(90), |s| {
        s.converged(&case.name, 3)
    });
    std::thread::sleep(Duration::from_secs(1));
    let report = rt.block_on(load.stop());
    if let Fault::StopEnvoy = fault {
        // Had it not been killed after all: never leave a stopped process behind.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let log = serve.log_text();
    let killed_line = log
        .lines()
        .position(|l| l.contains(&format!("replica {victim_name} killed: ")));
    let total = report.ok + report.failed;
    eprintln!(
        "liveness {label}{}: out of the port {:.2} s after the fault (goal 5 s) by {}, 3 ready again {:.1} s later; failed requests {} of {} ({:.2} %); load: {}; load average {}",
        if flags.is_empty() { String::new() } else { format!(" ({})", flags.join(" ")) },
        out_of_port.as_secs_f64(),
        match killed_line {
            Some(_) => "the watcher's kill",
            None => "the pass's replacement",
        },
        back.as_secs_f64(),
        report.failed,
        total,
        100.0 * report.failed as f64 / total.max(1) as f64,
        report.summary(),
        common::pebble::load_average()
    );
    assert!(
        !log.contains("already in use"),
        "the fleet's own hung replica was taken for a stranger:\n{log}"
    );
    let now = case.containers();
    let fresh: Vec<_> = now.iter().filter(|c| !before.contains(c)).collect();
    let repairs = serve.samples("berth_replica_repairs_total");
    let series = format!("proxy=\"{}\",reason=\"{label}\"", case.name);
    match killed_line {
        Some(at) => {
            let line = log.lines().nth(at).unwrap();
            assert!(
                line.contains(&case.name) && line.contains(reason) && line.contains("silent for"),
                "{line}"
            );
            let replacing_first = log
                .lines()
                .take(at)
                .any(|l| l.contains("replacing") && l.contains(victim_name.as_str()));
            if replacing_first {
                // Both: the pause event's pass had begun its start-first replacement, and the
                // watcher did not wait for the replacement's gate to take the frozen one out.
                assert!(
                    repairer == Repairer::WatcherOrPass,
                    "a replacement began before the kill:\n{log}"
                );
                assert_eq!(fresh.len(), 1, "{before:?} → {now:?}");
            } else {
                // Killed first: its container started again, or replaced, only after the kill.
                let finished = rfc3339(&inspect(&victim, "{{.State.FinishedAt}}"));
                let again = match fresh.as_slice() {
                    [] => inspect(&victim, "{{.State.StartedAt}}"),
                    [new] => inspect(&new.0, "{{.Created}}"),
                    more => panic!("more than one replacement: {more:?}"),
                };
                assert!(
                    finished <= rfc3339(&again),
                    "the hung replica was killed after it ran again or was replaced ({again})"
                );
                let after: Vec<&str> = log.lines().skip(at + 1).collect();
                assert!(
                    after
                        .iter()
                        .any(|l| l.contains("started") || l.contains("created")),
                    "no replacement after the kill:\n{log}"
                );
            }
            assert_eq!(repairs.get(&series), Some(&1.0), "{repairs:?}");
        }
        None => {
            assert!(
                repairer == Repairer::WatcherOrPass,
                "no kill of {victim_name} ({reason}) in serve's log:\n{log}"
            );
            assert!(
                log.contains(&format!("removed      {victim_name}")) && fresh.len() == 1,
                "neither killed nor replaced:\n{log}"
            );
            assert_eq!(repairs.get(&series), None, "{repairs:?}");
        }
    }
    let live = serve.samples("berth_replica_live");
    assert_eq!(live.len(), 3, "{live:?}");
    assert!(live.values().all(|v| *v == 1.0), "{live:?}");
    assert!(
        report.ok > report.failed,
        "the load barely got through: {}",
        report.summary()
    );
}

/// With the engine's events on, as serve runs by default: the `pause` event's pass or the
/// watcher, whichever comes first.
#[test]
fn serve_takes_a_paused_replica_out_of_the_port() {
    a_hung_replica_leaves_the_port(Fault::Pause, Repairer::WatcherOrPass, "live-pause", &[]);
}

/// Without the engine's events (missed, or the engine's stream away), the watcher alone.
#[test]
fn the_watcher_kills_a_paused_replica() {
    a_hung_replica_leaves_the_port(
        Fault::Pause,
        Repairer::Watcher,
        "live-pause-watch",
        &["--no-engine-events"],
    );
}

/// A stopped Envoy makes no engine event: the watcher alone.
#[test]
fn the_watcher_kills_a_replica_whose_envoy_is_stopped() {
    a_hung_replica_leaves_the_port(Fault::StopEnvoy, Repairer::Watcher, "live-stop", &[]);
}

/// Limits the cgroup of process `pid` to `quota_us` of CPU per `period_us` (cgroup v1 or v2).
fn starve(pid: &i32, quota_us: u64, period_us: u64) {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let (file, text) = if controllers.is_empty() {
            (
                format!("/sys/fs/cgroup{path}/cpu.max"),
                format!("{quota_us} {period_us}"),
            )
        } else if controllers.split(',').any(|c| c == "cpu") {
            let dir = format!("/sys/fs/cgroup/{controllers}{path}");
            std::fs::write(format!("{dir}/cpu.cfs_period_us"), period_us.to_string()).unwrap();
            (format!("{dir}/cpu.cfs_quota_us"), quota_us.to_string())
        } else {
            continue;
        };
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{file}: {e}"));
        return;
    }
    panic!("no cpu cgroup for pid {pid}:\n{cgroups}");
}

/// A replica starved of CPU (a CFS quota of 0.01 CPU on its cgroup) answers slowly, maybe later than the
/// watcher's 1 s, but it runs: in 15 s under load it is never killed, and serve replaces
/// nothing.
#[test]
fn serve_never_kills_a_replica_that_is_merely_busy() {
    use common::load::Load;
    use common::serve::Case;
    let _serial = SERIAL.blocking_lock();
    let case = Case::new("live-busy");
    case.write(common::TEST_IMAGE, 3, "busy\n", "0s");
    let serve = case.serve(&[]);
    serve.wait_for("3 ready replicas", Duration::from_secs(90), |s| {
        s.converged(&case.name, 3)
    });
    let before = case.containers();
    let starved = before[0].0.clone();
    // Behind the engine's back (a `docker update` is drift, and the pass would replace it):
    // a CFS quota of 10 ms per second (0.01 CPU, in bursts: it stalls up to 0.99 s at a time)
    // on its cgroup.
    starve(&envoy_pid(&starved), 10_000, 1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load =
        rt.block_on(async { Load::start_per_request(case.port, "/", 8, Duration::from_secs(30)) });
    let started = Instant::now();
    let mut not_live = 0;
    let mut looks = 0;
    while started.elapsed() < Duration::from_secs(15) {
        let p = serve.proxy(&case.name);
        if let Some(r) = p["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["container"] == before[0].1.as_str())
        {
            looks += 1;
            if r["liveness"]["live"] == false {
                not_live += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let report = rt.block_on(load.stop());
    eprintln!(
        "liveness busy: the starved replica looked not live in {not_live} of {looks} /status polls over 15 s; load: {}; load average {}",
        report.summary(),
        common::pebble::load_average()
    );
    assert_eq!(case.containers(), before, "a busy replica was replaced");
    assert_eq!(inspect(&starved, "{{.State.Status}}"), "running");
    let log = serve.log_text();
    assert!(!log.contains(" killed: "), "{log}");
    assert!(serve.samples("berth_replica_repairs_total").is_empty());
}
