//! Security audit of what berth creates (issue 7 §4 and §6), against the real engine and a real
//! Envoy: every replica runs as a non-root user with a read-only root filesystem, drops every
//! capability (adding NET_BIND_SERVICE only for a port below 1024), sets no-new-privileges,
//! opens no TCP port but its listeners, keeps its admin socket at 0600; the state directory is
//! 0700; TLS keys are mounted read-only and never show up in labels, logs or status output.
//! Also: a fleet whose memory limits exceed the host's is refused unless `--force`.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use berth::host::preflight::tcp_ports_listened_by;
use common::config as cfg;
use common::{free_port, short_tempdir, Cleanup};
use serde_json::Value;

fn berth(config: &Path, state: &Path, cleanup: &Cleanup, args: &[&str]) -> Output {
    common::berth_on(config, state, &cleanup.case)
        .args(args)
        .output()
        .expect("running berth")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn inspect(cleanup: &Cleanup) -> Vec<Value> {
    let ids = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label={}", cleanup.filter()))
        .output()
        .unwrap();
    let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(!ids.is_empty(), "no containers found for the test");
    let out = Command::new("docker")
        .arg("inspect")
        .args(&ids)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A free port below 1024, for the NET_BIND_SERVICE case.
fn free_low_port() -> u16 {
    (900..1000)
        .find(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
        .expect("a free port below 1024")
}

fn key_body() -> String {
    let key =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/certs/key.pem"))
            .unwrap();
    // The base64 body's first line identifies the key without the PEM armour.
    key.lines()
        .find(|l| !l.starts_with("-----") && l.len() > 20)
        .unwrap()
        .to_string()
}

/// Puts `net.ipv4.ip_unprivileged_port_start` back as it was: berth lowers it for the
/// low-port proxy, and a test should not leave the host changed.
struct RestoreSysctl(Option<String>);

const PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

impl Drop for RestoreSysctl {
    fn drop(&mut self) {
        if let Some(v) = &self.0 {
            let _ = fs::write(PORT_START, v.trim());
        }
    }
}

#[test]
fn replicas_are_locked_down_and_secrets_stay_secret() {
    let _restore = RestoreSysctl(fs::read_to_string(PORT_START).ok());
    let image = common::ensure_test_image();
    let cleanup = Cleanup::new("security");
    let dir = short_tempdir();
    let state = dir.path().join("s");
    let certs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/certs");
    let (tls_port, high_port, low_port) = (free_port(), free_port(), free_low_port());
    let config = dir.path().join("berth.toml");
    let tls = cfg::tls_files(
        &certs.join("cert.pem").display().to_string(),
        &certs.join("key.pem").display().to_string(),
    );
    let high = cfg::Proxy::new("sec-high", image, 2)
        .set("rollout.min_ready", "0s")
        .listener(
            cfg::Listener::https("https", tls_port, tls)
                .route(cfg::Route::direct("/", 200, "tls\n")),
        )
        .listener(
            cfg::Listener::http("plain", high_port).route(cfg::Route::direct("/", 200, "plain\n")),
        );
    let low = cfg::Proxy::new("sec-low", image, 1)
        .set("rollout.min_ready", "0s")
        .listener(
            cfg::Listener::http("low", low_port).route(cfg::Route::direct("/", 200, "low\n")),
        );
    fs::write(&config, cfg::config(&Default::default(), &[high, low])).unwrap();

    let up = berth(&config, &state, &cleanup, &["up"]);
    assert!(up.status.success(), "up failed:\n{}", text(&up));
    let up_json = berth(&config, &state, &cleanup, &["--output", "json", "up"]);
    let status = berth(&config, &state, &cleanup, &["status"]);
    let status_json = berth(&config, &state, &cleanup, &["--output", "json", "status"]);
    let key = key_body();

    // The state directory is 0700; copied TLS keys are 0400 and owned by the replica user.
    let mode = fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "state directory mode");
    // Named by a digest of the pair (key-<version>.pem), so a renewal never overwrites it.
    let copied_key = fs::read_dir(state.join("proxies/sec-high/tls/https"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("key-"))
        .expect("a copied key");
    let md = fs::metadata(&copied_key).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o400, "copied key mode");
    assert_eq!(md.uid(), berth::core::replica::REPLICA_UID);

    let containers = inspect(&cleanup);
    assert_eq!(containers.len(), 3);
    for c in &containers {
        let name = c["Name"].as_str().unwrap().trim_start_matches('/');
        let proxy = c["Config"]["Labels"]["io.berth.proxy"].as_str().unwrap();
        let host = &c["HostConfig"];
        let user = c["Config"]["User"].as_str().unwrap();
        assert!(
            !user.is_empty() && !user.starts_with("0") && user != "root",
            "{name}: user {user:?}"
        );
        assert_eq!(
            host["ReadonlyRootfs"],
            Value::Bool(true),
            "{name}: read-only rootfs"
        );
        assert_eq!(
            host["CapDrop"],
            serde_json::json!(["ALL"]),
            "{name}: CapDrop"
        );
        let cap_add = host["CapAdd"].as_array().cloned().unwrap_or_default();
        if proxy == "sec-low" {
            assert_eq!(
                cap_add,
                vec![Value::from("NET_BIND_SERVICE")],
                "{name}: CapAdd"
            );
        } else {
            assert!(
                cap_add.is_empty(),
                "{name}: CapAdd {cap_add:?} without a low port"
            );
        }
        let secopt: Vec<&str> = host["SecurityOpt"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            secopt.iter().any(|o| o.starts_with("no-new-privileges")),
            "{name}: {secopt:?}"
        );
        assert_eq!(host["Privileged"], Value::Bool(false));

        // No TCP port but the listeners: in particular no admin port.
        let pid = c["State"]["Pid"].as_u64().unwrap() as u32;
        let want: BTreeSet<u16> = if proxy == "sec-low" {
            BTreeSet::from([low_port])
        } else {
            BTreeSet::from([tls_port, high_port])
        };
        assert_eq!(
            tcp_ports_listened_by(pid),
            want,
            "{name}: listening TCP ports"
        );

        // The admin socket is 0600.
        let run_name = c["Config"]["Labels"]["io.berth.name"].as_str().unwrap();
        let socket = state.join(format!("proxies/{proxy}/run/{run_name}/admin.sock"));
        let mode = fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}: admin socket mode");

        // TLS material is mounted read-only.
        for m in c["Mounts"].as_array().unwrap() {
            let dest = m["Destination"].as_str().unwrap();
            if dest.starts_with("/etc/berth/") {
                assert_eq!(
                    m["RW"],
                    Value::Bool(false),
                    "{name}: {dest} must be read-only"
                );
            }
        }

        // The key never appears in labels or logs.
        let labels = c["Config"]["Labels"].to_string();
        assert!(!labels.contains(&key), "{name}: key material in labels");
        let logs = Command::new("docker")
            .args(["logs", name])
            .output()
            .unwrap();
        assert!(!text(&logs).contains(&key), "{name}: key material in logs");
        assert!(!c["Config"]["Env"].to_string().contains(&key));
    }
    for (what, out) in [
        ("up", &up),
        ("up json", &up_json),
        ("status", &status),
        ("status json", &status_json),
    ] {
        assert!(out.status.success(), "{what} failed:\n{}", text(out));
        assert!(!text(out).contains(&key), "key material in `{what}` output");
    }

    let down = berth(&config, &state, &cleanup, &["down"]);
    assert!(down.status.success(), "down failed:\n{}", text(&down));
}

#[test]
fn memory_beyond_the_host_is_refused_unless_forced() {
    let image = common::ensure_test_image();
    let cleanup = Cleanup::new("memory");
    let dir = short_tempdir();
    let state = dir.path().join("s");
    let port = free_port();
    let config = dir.path().join("berth.toml");
    let greedy = cfg::Proxy::new("greedy", image, 2)
        .set("resources.memory", "64Ti")
        .set("rollout.min_ready", "0s")
        .listener(cfg::Listener::new("web", port).route(cfg::Route::status("/", 200)));
    fs::write(&config, greedy.to_toml()).unwrap();
    let refused = berth(&config, &state, &cleanup, &["up"]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    let message = text(&refused);
    assert!(
        message.contains("128.0 TiB"),
        "the total is named: {message}"
    );
    assert!(
        message.contains("greedy 2 × 64.0 TiB"),
        "the parts are named: {message}"
    );
    assert!(
        message.contains("--force"),
        "the way out is named: {message}"
    );
    let none = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label={}", cleanup.filter()))
        .output()
        .unwrap();
    assert!(
        none.stdout.is_empty(),
        "nothing may be created when refused"
    );

    let forced = berth(&config, &state, &cleanup, &["up", "--force"]);
    assert!(
        forced.status.success(),
        "up --force failed:\n{}",
        text(&forced)
    );
    assert_eq!(inspect(&cleanup).len(), 2);
    let down = berth(&config, &state, &cleanup, &["down"]);
    assert!(down.status.success(), "down failed:\n{}", text(&down));
}
