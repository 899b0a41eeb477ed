//! What only Podman needs proving (issue 14 A); the rest of the Podman job runs the Docker
//! tests through DOCKER_HOST (scripts/podman-tests.sh).
//!
//! - An engine that refuses to start a container for reasons of its own (Podman's default
//!   ulimits above the host's hard limit) is named and quoted, never taken for Envoy
//!   rejecting the config.
//! - A reboot: Podman has no daemon, so what brings replicas back is `podman-restart.service`
//!   (`podman start --all --filter restart-policy=always` at boot, `podman stop` of the same
//!   containers at shutdown). The test runs exactly those two commands around a restart of the
//!   API service: the replicas come back without berth, then `berth serve` reconciles.
//!
//! Both tests run in the Podman job (scripts/podman-tests.sh runs them with `--ignored`): each
//! needs root and the `podman` binary, the reboot test also the job's service of
//! scripts/podman-service.sh. Without them a test fails under CI and is skipped elsewhere
//! (`common::skip`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::serve::*;
use common::{describe, free_port, short_tempdir, skip, TEST_IMAGE};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/podman-service.sh")
}

/// Why Podman tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (the test service is a rootful Podman)".into());
    }
    let podman = Command::new("podman")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !podman.is_ok_and(|s| s.success()) {
        return Some("podman is not installed".into());
    }
    None
}

/// The private service of scripts/podman-service.sh that DOCKER_HOST points at, if it does.
fn ci_service() -> Result<PathBuf, String> {
    let dir = PathBuf::from(
        std::env::var("BERTH_PODMAN_DIR").unwrap_or_else(|_| "/run/berth-podman".into()),
    );
    let want = format!("unix://{}", dir.join("podman.sock").display());
    match std::env::var("DOCKER_HOST") {
        Ok(h) if h == want => Ok(dir),
        _ => Err(format!(
            "DOCKER_HOST is not the Podman service of scripts/podman-service.sh ({want}); \
             scripts/podman-tests.sh sets it"
        )),
    }
}

fn service(dir: &Path, args: &[&str]) -> Output {
    Command::new(script())
        .env("BERTH_PODMAN_DIR", dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running scripts/podman-service.sh")
}

/// A Podman service of this test's own, stopped (with its containers) on drop.
struct OwnService {
    dir: tempfile::TempDir,
    docker_host: String,
}

impl OwnService {
    /// A service that keeps Podman's default container ulimits (`--default-ulimits`) on a host
    /// that cannot grant them, whatever this host's own limits: its hard open-files limit is
    /// below Podman's default and it may not raise it (no `CAP_SYS_RESOURCE`), so every
    /// container it starts is refused.
    fn start_refusing() -> OwnService {
        let dir = short_tempdir();
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        let nofile = now.rlim_max.min(HOST_NOFILE);
        let mut cmd = Command::new(script());
        cmd.env("BERTH_PODMAN_DIR", dir.path())
            .args(["start", "--default-ulimits"])
            .stdin(Stdio::null());
        // SAFETY: only async-signal-safe calls (setrlimit, prctl) between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0
                    || libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().expect("running scripts/podman-service.sh");
        assert!(out.status.success(), "{}", describe(&out));
        let docker_host = String::from_utf8_lossy(&out.stdout)
            .trim()
            .strip_prefix("export DOCKER_HOST=")
            .expect("the script prints the DOCKER_HOST line")
            .to_string();
        OwnService { dir, docker_host }
    }

    /// Copies `image` from the Docker engine (the host's, not DOCKER_HOST) into this store.
    fn load(&self, image: &str) {
        let mut save = Command::new("docker")
            .env_remove("DOCKER_HOST")
            .args(["save", image])
            .stdout(Stdio::piped())
            .spawn()
            .expect("docker save");
        let load = Command::new(script())
            .env("BERTH_PODMAN_DIR", self.dir.path())
            .args(["podman", "load", "-q"])
            .stdin(save.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(save.wait().unwrap().success(), "docker save {image} failed");
        assert!(load.status.success(), "podman load: {}", describe(&load));
    }
}

impl Drop for OwnService {
    fn drop(&mut self) {
        service(self.dir.path(), &["stop"]);
    }
}

/// Podman's built-in default container ulimit (containers.conf `default_ulimits`).
const PODMAN_DEFAULT_NOFILE: u64 = 1_048_576;
/// The highest open-files limit (soft and hard) of the refusing service: a common host's,
/// below [`PODMAN_DEFAULT_NOFILE`].
const HOST_NOFILE: u64 = 65_536;
const _: () = assert!(HOST_NOFILE < PODMAN_DEFAULT_NOFILE);
/// capability.h's number for the capability that lets a process raise its hard limits.
const CAP_SYS_RESOURCE: libc::c_ulong = 24;

#[test]
#[ignore = "the Podman job runs it: scripts/podman-tests.sh"]
fn an_engine_refusal_names_podman_and_quotes_it() {
    const NAME: &str = "an_engine_refusal_names_podman_and_quotes_it";
    if let Some(why) = unavailable() {
        return skip(NAME, &why);
    }
    let podman = OwnService::start_refusing();
    podman.load(TEST_IMAGE);
    let dir = short_tempdir();
    let cleanup = common::Cleanup::new("podman-refusal");
    let config = dir.path().join("berth.toml");
    write_config(
        &config,
        &common::serve::config("refused", TEST_IMAGE, 1, free_port(), "x", "1s"),
    );
    for command in ["validate", "up"] {
        let out = common::berth_on(&config, &dir.path().join("s"), &cleanup.case)
            .env("DOCKER_HOST", &podman.docker_host)
            .arg(command)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {}", describe(&out));
        assert!(
            err.contains("Podman Engine") && err.contains(&podman.docker_host),
            "{command}: names the engine and where: {err}"
        );
        assert!(
            err.contains("refused to start a throw-away container from") && err.contains("rlimit"),
            "{command}: quotes the engine: {err}"
        );
        assert!(
            !err.contains("envoy --mode validate rejected"),
            "{command}: not Envoy's verdict: {err}"
        );
        eprintln!("{command} on a Podman that refuses: {}", err.trim());
    }
}

fn wait(what: &str, within: Duration, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "waited {within:?} for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "the Podman job runs it against its service: scripts/podman-tests.sh"]
fn replicas_come_back_after_a_podman_reboot_and_serve_reconciles() {
    const NAME: &str = "replicas_come_back_after_a_podman_reboot_and_serve_reconciles";
    if let Some(why) = unavailable() {
        return skip(NAME, &why);
    }
    let dir = match ci_service() {
        Ok(dir) => dir,
        Err(why) => return skip(NAME, &why),
    };
    let case = Case::new("podman-reboot");
    case.write(TEST_IMAGE, 2, "before reboot", "500ms");
    let before = {
        let serve = case.serve(&["--resync", "0"]);
        serve.wait_for("2 LIVE replicas", Duration::from_secs(60), |s| {
            s.converged(&case.name, 2)
        });
        case.containers()
        // serve stops here, as it would at shutdown.
    };
    assert_eq!(before.len(), 2);
    let podman = |args: &[&str]| {
        let out = service(&dir, &[&["podman"], args].concat());
        assert!(out.status.success(), "podman {args:?}: {}", describe(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let always = podman(&[
        "container",
        "ls",
        "-q",
        "--no-trunc",
        "--filter",
        "restart-policy=always",
    ]);
    for (id, name, _) in &before {
        assert!(
            always.lines().any(|l| l.starts_with(id.as_str())),
            "{name} is not among the containers podman-restart.service starts at boot:\n{always}"
        );
    }

    // Shutdown: podman-restart.service's ExecStop (for this test's containers only: others may
    // share the service), then the API service goes away.
    let ids: Vec<&str> = before.iter().map(|c| c.0.as_str()).collect();
    podman(&[&["stop"], &ids[..]].concat());
    assert!(case.containers().is_empty(), "{:?}", case.containers());
    let pid: i32 = std::fs::read_to_string(dir.join("service.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    wait("the service to exit", Duration::from_secs(30), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    // Boot: the API service again, and podman-restart.service's ExecStart.
    let out = service(&dir, &["start"]);
    assert!(out.status.success(), "{}", describe(&out));
    podman(&["start", "--all", "--filter", "restart-policy=always"]);

    // Back without berth: the same containers, serving.
    wait(
        "the replicas to serve again without berth",
        Duration::from_secs(60),
        || case.containers() == before && case.body() == "before reboot",
    );

    // Then serve reconciles: with the periodic resync off, only the event stream can see this.
    let serve = case.serve(&["--resync", "0"]);
    serve.wait_for(
        "2 LIVE replicas after the reboot",
        Duration::from_secs(60),
        |s| s.converged(&case.name, 2),
    );
    let victim = &before[0].0;
    let rm = Command::new("docker")
        .args(["rm", "-f", victim])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{}", describe(&rm));
    serve.wait_for(
        "the removed replica to be recreated",
        Duration::from_secs(60),
        |s| s.converged(&case.name, 2) && !case.containers().iter().any(|c| &c.0 == victim),
    );
    assert_eq!(case.body(), "before reboot");
    eprintln!(
        "podman reboot: replicas came back by podman-restart.service's command; serve reconciled"
    );
}
