//! berth without root, like compose (issue 14 B): a member of the docker group, created by the
//! test (and removed after), runs the quickstart shape, a rolling upgrade under load with 0
//! failed requests, and `down`. Its replicas run as its own uid:gid and its state directory is
//! its own ($HOME/.local/state/berth without --state-dir).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::config as cfg;
use common::fleet::{NEW, OLD};
use common::load::{assert_no_failures, Load};
use common::{describe, free_port, skip, Cleanup, LABEL_TEST_CASE};

/// A system user in the docker group; removed on drop.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn create() -> Result<TestUser, String> {
        let name = format!("berth-t{}", std::process::id());
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--user-group",
                "--groups",
                "docker",
            ])
            .args(["--shell", "/usr/sbin/nologin", &name])
            .output()
            .map_err(|e| format!("useradd: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "useradd {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        Ok(TestUser {
            uid: id("-u"),
            gid: id("-g"),
            name,
        })
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

fn write_config(path: &Path, image: &str, port: u16) {
    let toml = cfg::Proxy::new("roll", image, 2)
        .set("rollout.min_ready", "1s")
        .set("shutdown.drain_timeout", "10s")
        .listener(cfg::Listener::http("web", port).route(cfg::Route::direct(
            "/",
            200,
            "hello from berth\n",
        )))
        .to_toml();
    std::fs::write(path, toml).unwrap();
}

/// berth as `user`, with only the environment a login would give it.
async fn berth_as(user: &TestUser, home: &Path, cleanup: &Cleanup, args: &[&str]) -> Output {
    let out = tokio::process::Command::new("setpriv")
        .args([
            "--reuid",
            &user.name,
            "--regid",
            &user.name,
            "--init-groups",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_berth"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .current_dir(home)
        .arg("-f")
        .arg(home.join("berth.toml"))
        .args(["--container-label", "io.berth.test=1", "--container-label"])
        .arg(format!("{LABEL_TEST_CASE}={}", cleanup.case))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    eprintln!("berth {args:?} as {}: {}", user.name, describe(&out));
    out
}

fn container_users(cleanup: &Cleanup) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label={}", cleanup.filter()),
        ])
        .output()
        .unwrap();
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.Config.User}}"])
        .args(&ids)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_group_member_runs_upgrades_and_removes_a_fleet() {
    const NAME: &str = "a_docker_group_member_runs_upgrades_and_removes_a_fleet";
    if unsafe { libc::geteuid() } != 0 {
        return skip(NAME, "creating a user needs root");
    }
    common::fleet::ensure_images();
    let user = match TestUser::create() {
        Ok(u) => u,
        Err(why) => return skip(NAME, &why),
    };
    let cleanup = Cleanup::new("rootless");
    let home = common::short_tempdir();
    std::os::unix::fs::chown(home.path(), Some(user.uid), Some(user.gid)).unwrap();
    let config = home.path().join("berth.toml");
    let port = free_port();
    write_config(&config, OLD, port);

    let out = berth_as(&user, home.path(), &cleanup, &["up"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let me = format!("{}:{}", user.uid, user.gid);
    assert_eq!(container_users(&cleanup), [me.clone(), me.clone()]);
    let state: PathBuf = home.path().join(".local/state/berth");
    assert_eq!(std::fs::metadata(&state).unwrap().uid(), user.uid);

    let load = Load::start(port, "/", 16, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(500)).await;
    write_config(&config, NEW, port);
    let out = berth_as(&user, home.path(), &cleanup, &["up"]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = load.stop().await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_no_failures("rolling upgrade as a docker-group member", &report);
    assert_eq!(container_users(&cleanup), [me.clone(), me]);

    let out = berth_as(&user, home.path(), &cleanup, &["down"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(container_users(&cleanup).is_empty());

    // A port below 1024 is refused before anything changes, saying why.
    write_config(&config, NEW, 81);
    let out = berth_as(&user, home.path(), &cleanup, &["up"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        err.contains("port 81") && err.contains("not running as root"),
        "{err}"
    );
    assert!(container_users(&cleanup).is_empty());
}
