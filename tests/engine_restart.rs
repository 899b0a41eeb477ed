//! The Docker engine restarts under a running fleet (issue 7 §2): the replicas come back through
//! their restart policy, and `berth serve` reconnects to the event stream with backoff and
//! reconciles afterwards (proved with the periodic resync off: a replica removed after the
//! restart is put back, which only the reconnected event stream can trigger).
//!
//! Restarting the engine needs root and a dockerd this test can stop and start again (systemd,
//! or a plain `dockerd` process whose command line it can repeat). Where that is not possible
//! the test prints why, on the terminal past the test harness' capture, and skips.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::serve::*;

/// Prints on the real stderr: the harness captures `eprintln!` of passing tests.
fn say(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{message}");
}

fn docker_answers() -> bool {
    Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn wait(what: &str, within: Duration, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "waited {within:?} for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How this host's engine can be restarted, or why it cannot.
enum Restart {
    Systemd,
    Process { pid: i32, argv: Vec<String> },
}

fn how_to_restart() -> Result<Restart, String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root".into());
    }
    let systemd = Command::new("systemctl")
        .args(["is-active", "--quiet", "docker"])
        .status()
        .is_ok_and(|s| s.success());
    if systemd {
        return Ok(Restart::Systemd);
    }
    let out = Command::new("pidof")
        .arg("dockerd")
        .output()
        .map_err(|e| format!("pidof: {e}"))?;
    let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let [pid] = pids[..] else {
        return Err(format!("expected one dockerd process, found {pids:?}"));
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| format!("reading dockerd's command line: {e}"))?;
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if argv.is_empty() {
        return Err("dockerd's command line is empty".into());
    }
    Ok(Restart::Process { pid, argv })
}

fn restart_engine(how: &Restart) {
    match how {
        Restart::Systemd => {
            let ok = Command::new("systemctl")
                .args(["restart", "docker"])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "systemctl restart docker failed");
        }
        Restart::Process { pid, argv } => {
            unsafe {
                libc::kill(*pid, libc::SIGTERM);
            }
            wait("dockerd to exit", Duration::from_secs(90), || {
                !std::path::Path::new(&format!("/proc/{pid}")).exists()
            });
            let log = std::fs::File::create("/tmp/berth-test-dockerd.log").unwrap();
            // `setsid --fork`: the new daemon leaves this process group at once and must not
            // die with the test, so there is nothing to wait for here.
            let status = Command::new("setsid")
                .arg("--fork")
                .args(argv)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .status()
                .expect("starting dockerd again");
            assert!(status.success(), "setsid --fork dockerd failed: {status}");
        }
    }
    wait(
        "the engine to answer again",
        Duration::from_secs(90),
        docker_answers,
    );
}

#[test]
fn replicas_and_serve_survive_an_engine_restart() {
    let how = match how_to_restart() {
        Ok(how) => how,
        Err(why) => {
            say(&format!(
                "SKIPPED replicas_and_serve_survive_an_engine_restart: the Docker engine cannot be restarted here ({why})"
            ));
            return;
        }
    };
    let case = Case::new("engine-restart");
    case.write(common::TEST_IMAGE, 2, "before restart", "500ms");
    let serve = case.serve(&["--resync", "0"]);
    serve.wait_for("2 LIVE replicas", Duration::from_secs(60), |s| {
        s.converged(&case.name, 2)
    });
    let before = case.containers();
    assert_eq!(before.len(), 2);

    restart_engine(&how);

    // The restart policy brings the same containers back, and they serve again.
    wait("the replicas to run again", Duration::from_secs(60), || {
        case.containers() == before
    });
    serve.wait_for(
        "2 LIVE replicas after the restart",
        Duration::from_secs(60),
        |s| s.converged(&case.name, 2),
    );
    assert_eq!(case.body(), "before restart");

    // With the periodic resync off, only the reconnected event stream can notice this.
    let victim = &before[0].0;
    let rm = Command::new("docker")
        .args(["rm", "-f", victim])
        .status()
        .unwrap();
    assert!(rm.success());
    serve.wait_for(
        "the removed replica to be recreated after the restart",
        Duration::from_secs(60),
        |s| s.converged(&case.name, 2),
    );
    let after = case.containers();
    assert_eq!(after.len(), 2);
    assert!(!after.iter().any(|c| &c.0 == victim));
    let log = serve.log_text();
    assert!(
        log.to_lowercase().contains("reconnect"),
        "serve logs its reconnection:\n{log}"
    );
    say("engine restarted: replicas came back by restart policy; serve reconnected and reconciled");
}
