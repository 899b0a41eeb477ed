//! The everyday commands as an operator types them: a `down` that cannot be an accident,
//! `logs` (interleaved, prefixed, following a rollout), `completions`, `man` and `version`.
//! The `down` and `logs` tests drive the real binary against the real engine and real Envoy.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::describe;
use common::fleet::*;
use common::short_tempdir;
use tokio::io::{AsyncBufReadExt, BufReader};

const NO_DOCKER: &str = "unix:///nonexistent/docker.sock";

/// The binary, run in `cwd` (where there may be no berth.toml), with no config from the
/// environment.
fn berth_in(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.current_dir(cwd)
        .env_remove("BERTH_CONFIG")
        .env_remove("BERTH_STATE_DIR")
        .stdin(Stdio::null());
    cmd
}

/// Runs berth with `args` on a terminal (a pty from `script`), typing `input`.
fn on_terminal(cwd: &Path, args: &[&str], input: &str) -> Output {
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_berth"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let mut child = Command::new("script")
        .current_dir(cwd)
        .env_remove("BERTH_CONFIG")
        .env_remove("BERTH_STATE_DIR")
        .args(["-qec", &quoted.join(" "), "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs a command on a pty");
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    // Type the answer once the question is up (the pty drops input typed too early only on
    // some systems; waiting costs little).
    std::thread::sleep(Duration::from_millis(1500));
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_without_a_config_refuses_asks_or_takes_all() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("downguard").await;
    fleet.write(&Settings::new(NEW, 2));
    fleet.up_ok().await;
    let before = fleet.ids().await;
    assert_eq!(before.len(), 2);
    let state = fleet.state().to_string_lossy().into_owned();
    // A directory without berth.toml, as a user who typed `berth down` in the wrong place.
    let elsewhere = short_tempdir();

    // A script: refused (exit 2), told what would be removed and how to say what it means.
    let out = berth_in(elsewhere.path())
        .args(["--state-dir", &state, "down"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let what = format!("{PROXY} (2 replicas)");
    for part in [what.as_str(), &state, "--all", "nothing was changed"] {
        assert!(err.contains(part), "{part:?} missing: {err}");
    }
    assert_eq!(fleet.ids().await, before, "a refused down changed replicas");

    // A terminal: asked; anything but yes keeps the fleet.
    let out = on_terminal(elsewhere.path(), &["--state-dir", &state, "down"], "n\n");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("Remove them all? [y/N]"),
        "{}",
        describe(&out)
    );
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert_eq!(
        fleet.ids().await,
        before,
        "an unconfirmed down changed replicas"
    );

    // Yes removes them.
    let out = on_terminal(elsewhere.path(), &["--state-dir", &state, "down"], "y\n");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(fleet.ids().await.is_empty());
    assert!(!fleet.state().join("proxies").join(PROXY).exists());

    // Scripts keep --all.
    fleet.up_ok().await;
    assert_eq!(fleet.ids().await.len(), 2);
    let out = berth_in(elsewhere.path())
        .args(["--state-dir", &state, "down", "--all"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(fleet.ids().await.is_empty());
}

/// One printed line: (replica, timestamp, text) from `replica  | stamp text`.
fn parse_line(line: &str) -> (String, String, String) {
    let (prefix, rest) = line
        .split_once(" | ")
        .unwrap_or_else(|| panic!("no replica prefix: {line:?}"));
    let (stamp, text) = rest.split_once(' ').unwrap_or((rest, ""));
    (prefix.trim_end().to_string(), stamp.into(), text.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_interleave_replicas_and_follow_a_rollout() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("logs").await;
    let mut s = Settings::new(OLD, 2);
    s.set("log_level", "info");
    s.min_ready = "0s";
    fleet.write(&s);
    fleet.up_ok().await;
    let old: Vec<String> = fleet.replicas().await.into_iter().map(|c| c.name).collect();
    let berth = |args: &[&str]| {
        let out = berth_in(fleet.dir.path())
            .arg("--state-dir")
            .arg(fleet.state())
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // Everything: both replicas, every line prefixed, merged in time order.
    let all = berth(&["logs", "--timestamps"]);
    let lines: Vec<_> = all.lines().map(parse_line).collect();
    for name in &old {
        let n = lines.iter().filter(|(r, _, _)| r == name).count();
        assert!(n > 5, "{name}: {n} lines in\n{all}");
        assert!(
            lines
                .iter()
                .any(|(r, _, t)| r == name && t.contains("starting main dispatch loop")),
            "{all}"
        );
    }
    assert!(lines.iter().all(|(r, _, _)| old.contains(r)), "{all}");
    let stamps: Vec<_> = lines
        .iter()
        .map(|(_, s, _)| humantime::parse_rfc3339(s).unwrap())
        .collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "not in time order:\n{all}"
    );

    // --tail N is per replica; PROXY/SLOT is one replica; no prefix on request.
    let tail = berth(&["logs", "--tail", "1"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    let one = berth(&["logs", &format!("{PROXY}/1")]);
    assert!(one.lines().all(|l| parse_line(l).0 == old[1]), "{one}");
    let bare = berth(&[
        "logs",
        "--no-log-prefix",
        "--tail",
        "1",
        &format!("{PROXY}/0"),
    ]);
    assert!(!bare.contains(" | ") && bare.lines().count() == 1, "{bare}");

    // Following through a rolling upgrade: the new replicas join the stream.
    let mut follower = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .current_dir(fleet.dir.path())
        .arg("--state-dir")
        .arg(fleet.state())
        .args(["logs", "-f", PROXY])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let seen = seen.clone();
        let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                seen.lock().unwrap().push(l);
            }
        })
    };
    let started = |name: &str| {
        seen.lock().unwrap().iter().any(|l| {
            l.starts_with(&format!("{name} ")) && l.contains("starting main dispatch loop")
        })
    };
    // The follower is attached (it printed every old replica's start) before the rollout
    // begins; otherwise a slow start on a loaded host could miss the old replicas entirely.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !old.iter().all(|n| started(n)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.image = NEW;
    fleet.write(&s);
    fleet.up_ok().await;
    let new: Vec<String> = fleet.replicas().await.into_iter().map(|c| c.name).collect();
    assert!(new.iter().all(|n| !old.contains(n)), "{old:?} → {new:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !new.iter().all(|n| started(n)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shown = seen.lock().unwrap().join("\n");
    for name in old.iter().chain(&new) {
        assert!(
            started(name),
            "{name} missing from the followed logs:\n{shown}"
        );
    }
    // Ctrl-C ends it cleanly.
    let pid = follower.id().unwrap() as i32;
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = tokio::time::timeout(Duration::from_secs(10), follower.wait())
        .await
        .expect("logs -f exits on SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    reader.await.unwrap();
}

/// `berth ARGS` in `dir` with no engine to reach, which must succeed; its stdout.
fn stdout_without_engine(dir: &Path, args: &[&str]) -> String {
    let out = berth_in(dir)
        .env("DOCKER_HOST", NO_DOCKER)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn completions_and_man_need_no_engine() {
    let dir = short_tempdir();
    let run = |args: &[&str]| stdout_without_engine(dir.path(), args);
    assert!(run(&["completions", "bash"]).contains("complete -F _berth"));
    assert!(run(&["completions", "zsh"]).starts_with("#compdef berth"));
    assert!(run(&["completions", "fish"]).contains("complete -c berth"));
    assert!(run(&["man"]).contains(".TH berth 1"));
    assert!(run(&["man", "down"]).contains("\\-\\-all"));
}

#[test]
fn version_names_the_commit_and_the_envoy_gateway_release() {
    let dir = short_tempdir();
    let run = |args: &[&str]| stdout_without_engine(dir.path(), args);
    let json: serde_json::Value = serde_json::from_str(&run(&["version", "-o", "json"])).unwrap();
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["envoy_gateway"], berth::core::source::eg::EG_RELEASE);
    assert_eq!(json["envoy_image"], berth::core::source::eg::DEFAULT_IMAGE);
    let commit = json["commit"].as_str().unwrap();
    // Built from this checkout (no BERTH_GIT_COMMIT given): the commit is its HEAD.
    let head = Command::new("git")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    match (std::env::var_os("BERTH_GIT_COMMIT"), head) {
        (None, Some(head)) => assert_eq!(commit, String::from_utf8_lossy(&head.stdout).trim()),
        _ => assert!(!commit.is_empty()),
    }
    let table = run(&["version"]);
    assert!(
        table.starts_with(&format!("berth {}\n", env!("CARGO_PKG_VERSION"))),
        "{table}"
    );
    assert!(
        table.contains(commit) && table.contains(berth::core::source::eg::EG_RELEASE),
        "{table}"
    );
}

#[test]
fn bad_logs_and_down_arguments_exit_2_before_the_engine() {
    let dir = short_tempdir();
    for args in [
        &["logs", "edge/x"][..],
        &["logs", "--since", "yesterday"],
        &["logs", "--tail", "some"],
        &["down", "--all", "edge"],
        &["completions", "tcsh"],
    ] {
        let out = berth_in(dir.path())
            .env("DOCKER_HOST", NO_DOCKER)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
    }
}
