//! One writer per state directory (issue 10 E, symptom 3), against the real Docker engine
//! and real Envoy: `up` while `serve` manages the same state directory is handed to serve and
//! converges once with no error under load; a failing `up` handed to serve ends with the exit
//! code of a local one; two `up`s on one state directory take turns, the second saying whom it
//! waits for; read-only commands never wait for a writer.

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::fleet::*;
use common::serve::Serve;
use tokio::io::{AsyncBufReadExt, BufReader};

/// `berth <args>` on the fleet's config and state directory, with the test's labels.
fn berth(fleet: &Fleet, args: &[&str]) -> tokio::process::Command {
    let mut cmd = fleet.berth(args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// serve on the fleet's config and state directory, config watching off: only what the test
/// asks for happens.
fn start_serve(fleet: &Fleet) -> Serve {
    tokio::task::block_in_place(|| {
        Serve::start(
            &fleet.config(),
            &fleet.state(),
            &fleet.cleanup,
            &["--no-watch"],
        )
    })
}

/// The lock record: (pid, role) of the holder written in `<state>/berth.lock`.
fn lock_record(fleet: &Fleet) -> Option<(u32, String)> {
    let text = std::fs::read_to_string(fleet.state().join("berth.lock")).ok()?;
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    Some((v["pid"].as_u64()? as u32, v["role"].as_str()?.to_string()))
}

/// The value of a counter in serve's /metrics whose labels include every one of `labels`.
fn metric(serve: &Serve, name: &str, labels: &[&str]) -> f64 {
    let (_, text) = serve.get("/metrics").expect("GET /metrics");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Symptom 3: `up` while serve runs on the same state directory used to race serve (Docker
/// 409 on a container name, a slot rolled back, serve's validation directory swept). Now the
/// request goes to serve: one rollout, its events on up's stdout, exit 0, no failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_during_serve_is_handed_to_serve_and_converges_once_under_load() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("one-writer-serve").await;
    let mut s = Settings::new(OLD, 2);
    fleet.write(&s);
    fleet.up_ok().await;
    let serve = start_serve(&fleet);
    let serve_pid = serve.child.as_ref().unwrap().id();
    tokio::task::block_in_place(|| {
        serve.wait_for("serve's first pass", Duration::from_secs(60), |s| {
            s.converged(PROXY, 2)
        })
    });
    assert_eq!(lock_record(&fleet), Some((serve_pid, "serve".into())));
    let before = fleet.ids().await;

    let load = fleet.load();
    settle().await;
    s.image = NEW;
    fleet.write(&s);
    let out = berth(&fleet, &["--output", "json", "up"])
        .output()
        .await
        .unwrap();
    common::show("berth up (handed to serve)", &out);
    settle().await;
    let report = load.stop().await;

    assert!(out.status.success(), "up through serve failed");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "berth serve (pid {serve_pid}) manages the state directory"
        )),
        "{err}"
    );
    // serve's pass, as up prints its own: validated once, each slot replaced once.
    assert_eq!(count_events(&out, "validated"), 1);
    assert_eq!(count_events(&out, "replacing"), 2);
    assert_eq!(count_events(&out, "rolled-back"), 0);
    assert_eq!(count_events(&out, "failed"), 0);
    assert_eq!(
        count_events(&out, "summary"),
        1,
        "as a local up --output json ends"
    );
    assert_no_failures("up handed to serve", &report);
    fleet.assert_serving(2, "1.40.0").await;
    let after = fleet.ids().await;
    assert!(
        after.iter().all(|id| !before.contains(id)),
        "{before:?} {after:?}"
    );
    // Converged once, and serve saw no failure of any kind.
    let proxy = format!("proxy=\"{PROXY}\"");
    assert_eq!(
        metric(
            &serve,
            "berth_rollouts_total",
            &[&proxy, "outcome=\"succeeded\""]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &serve,
            "berth_rollouts_total",
            &[&proxy, "outcome=\"failed\""]
        ),
        0.0
    );
    assert_eq!(
        metric(
            &serve,
            "berth_reconcile_total",
            &[&proxy, "result=\"error\""]
        ),
        0.0
    );
    // The rollout gate's traffic figures count failures ("0 failed"); a zero count is no failure.
    let log = serve.log_text().replace(" 0 failed", " 0 not-ok");
    for bad in [
        "Conflict",
        "already in use",
        "rejected",
        "rolled",
        "failed",
        "error",
    ] {
        assert!(!log.contains(bad), "serve's log says {bad:?}:\n{log}");
    }
    assert!(serve.converged(PROXY, 2), "{}", serve.status());

    // `down` does not hand its request over (serve would start the proxies again): it waits
    // for serve to stop, saying so, and changes nothing meanwhile.
    let mut down = berth(&fleet, &["down"]).spawn().unwrap();
    let mut lines = BufReader::new(down.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("waiting") {
                return line;
            }
        }
        panic!("down ended without saying it waits");
    })
    .await
    .expect("down neither waited nor ended");
    assert!(
        said.contains(&format!(
            "berth serve (pid {serve_pid}) is changing the state directory"
        )) && said.contains("until it stops"),
        "{said}"
    );
    assert_eq!(fleet.ids().await, after);
    down.kill().await.unwrap();

    // A second serve on the same state directory refuses to start, naming the first.
    let second = tokio::time::timeout(
        Duration::from_secs(60),
        berth(&fleet, &["serve", "--listen", "off", "--no-watch"]).output(),
    )
    .await
    .expect("a second serve neither refused nor ended")
    .unwrap();
    common::show("a second serve", &second);
    assert_eq!(second.status.code(), Some(1));
    assert!(stderr(&second).contains(&format!(
        "berth serve (pid {serve_pid}) already manages the state directory"
    )));
    assert_eq!(lock_record(&fleet), Some((serve_pid, "serve".into())));
}

/// A failing `up` handed to serve ends as a local one: the same exit code and error, after
/// the same rollback. serve is then killed, and the next `up` runs locally (the kernel
/// dropped serve's lock with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_up_handed_to_serve_exits_as_a_local_up() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("one-writer-fail").await;
    let mut s = Settings::new(OLD, 1);
    s.min_ready = "0s";
    fleet.write(&s);
    fleet.up_ok().await;
    let mut serve = start_serve(&fleet);
    tokio::task::block_in_place(|| {
        serve.wait_for("serve's first pass", Duration::from_secs(60), |s| {
            s.converged(PROXY, 1)
        })
    });

    s.image = BROKEN;
    fleet.write(&s);
    let through_serve = berth(&fleet, &["--output", "json", "up"])
        .output()
        .await
        .unwrap();
    common::show("failing up handed to serve", &through_serve);
    assert!(stderr(&through_serve).contains("manages the state directory"));
    fleet.assert_serving(1, "1.39.3").await;

    let mut child = serve.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let local = berth(&fleet, &["--output", "json", "up"])
        .output()
        .await
        .unwrap();
    common::show("the same up, locally", &local);
    assert!(!stderr(&local).contains("manages the state directory"));
    fleet.assert_serving(1, "1.39.3").await;

    assert_ne!(local.status.code(), Some(0));
    assert_eq!(through_serve.status.code(), local.status.code());
    // The same error line up to the name of the container that failed: what follows it may
    // differ, as an exit code read after the restart policy started the container again is 0.
    let error_line = |o: &Output| {
        stderr(o)
            .lines()
            .find(|l| l.starts_with("error: "))
            .map(|l| l.split(" (berth-").next().unwrap_or(l).to_string())
    };
    assert!(error_line(&local).is_some(), "{}", stderr(&local));
    assert_eq!(error_line(&through_serve), error_line(&local));
    assert_eq!(count_events(&through_serve, "failed"), 1);
    assert_eq!(count_events(&local, "failed"), 1);
}

/// Two `up`s on one state directory without serve: the second waits, naming the first's pid,
/// then finds nothing to do. Meanwhile `status`, `diff` and `render` answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ups_take_turns_and_read_only_commands_do_not_wait() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("one-writer-two-ups").await;
    let mut s = Settings::new(OLD, 2);
    // Long enough that the second up and the read-only commands start while the first runs.
    s.min_ready = "4s";
    fleet.write(&s);

    let first = berth(&fleet, &["--output", "json", "up"]).spawn().unwrap();
    let first_pid = first.id().unwrap();
    for _ in 0..200 {
        if lock_record(&fleet) == Some((first_pid, "up".into())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lock_record(&fleet), Some((first_pid, "up".into())));
    let second = berth(&fleet, &["--output", "json", "up"]).spawn().unwrap();

    // Read-only commands while the first up holds the lock: each ends while it still runs.
    let mut first = first;
    for args in [&["status"][..], &["--output", "json", "diff"], &["render"]] {
        let out = berth(&fleet, args).output().await.unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first up ended before `berth {args:?}` answered: the test proves nothing"
        );
        assert_eq!(lock_record(&fleet), Some((first_pid, "up".into())));
    }

    let first = first.wait_with_output().await.unwrap();
    let second = second.wait_with_output().await.unwrap();
    common::show("first up", &first);
    common::show("second up", &second);
    assert!(first.status.success());
    assert!(second.status.success());
    let waited = stderr(&second);
    assert!(
        waited.contains(&format!(
            "berth up (pid {first_pid}) is changing the state directory"
        )),
        "{waited}"
    );
    // Converged once: the first created both replicas, the second found them as wanted.
    assert_eq!(count_events(&first, "created"), 2);
    assert_eq!(count_events(&second, "created"), 0);
    assert_eq!(count_events(&second, "replacing"), 0);
    fleet.assert_serving(2, "1.39.3").await;
    assert_eq!(fleet.replicas().await.len(), 2);
}
