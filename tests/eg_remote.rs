//! Envoy Gateway interop end to end: `berth serve` (a child process) with its remote
//! infrastructure provider on a Unix socket, driven by a tonic client, its replicas configured
//! by the test xDS server (tests/common/xds.rs, mTLS, delta ADS) so that they serve and a
//! changed image rolls through the serving gate; and `berth up --ir` with no xDS server at
//! all, where replicas stay PRE_INITIALIZING and only the first-install rule lets them in
//! (nothing serves yet: the gate asks only that they run and their admin answers).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth::edges::eg_provider::pb;
use berth::edges::eg_provider::pb::envoy_gateway_remote_infrastructure_provider_client::EnvoyGatewayRemoteInfrastructureProviderClient as Client;
use common::eg::gateway_proxy;
use common::xds::{self, Certs, XdsServer};
use common::{ensure_test_image, free_port, short_tempdir, Cleanup};
use serde_json::Value;
use tonic::transport::Channel;
use tonic::Code;

const OLD_IMAGE: &str = "berth-test/envoy:1.39.3";
const PROXY: &str = "default-eg";

fn certs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/certs")
}

/// `berth serve` with the remote provider on `<dir>/r.sock`; killed on drop.
struct Serve {
    child: Child,
    log: PathBuf,
    socket: PathBuf,
    /// serve's status server (`/status`).
    status_port: u16,
}

impl Serve {
    fn start(dir: &Path, cleanup: &Cleanup, xds: &XdsServer, c: &Certs) -> Serve {
        let socket = dir.join("r.sock");
        let config = dir.join("berth.toml");
        std::fs::write(
            &config,
            format!(
                r#"[envoy_gateway]
xds_address = "127.0.0.1"
xds_port = {xds}
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"
remote = "unix://{sock}"
"#,
                xds = xds.addr.port(),
                ca = c.ca().display(),
                cert = c.client_cert().display(),
                key = c.client_key().display(),
                sock = socket.display()
            ),
        )
        .unwrap();
        let log = dir.join("serve.log");
        let status_port = free_port();
        let child = common::berth_on(&config, &dir.join("s"), &cleanup.case)
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{status_port}"))
            .args(["--resync", "300s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting berth serve");
        let s = Serve {
            child,
            log,
            socket,
            status_port,
        };
        let start = Instant::now();
        while !s.socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no remote socket; serve log:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn client(&self) -> Client<Channel> {
        common::eg::unix_client(self.socket.clone()).await
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An EnvoyProxy as EG marshals it: 2 replicas, an image, resources, log levels.
fn envoy_proxy(image: &str, replicas: i64) -> String {
    serde_json::json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyProxy",
        "metadata": {"name": "proxy-config", "namespace": "default"},
        "spec": {
            "provider": {"type": "Kubernetes", "kubernetes": {"envoyDeployment": {
                "replicas": replicas,
                "container": {
                    "image": image,
                    "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                                  "requests": {"cpu": "100m", "memory": "128Mi"}}
                }
            }}},
            "logging": {"level": {"default": "info", "upstream": "debug"}},
            "shutdown": {"drainTimeout": "5s", "minDrainDuration": "0s"},
            "someFutureField": {"x": 1}
        }
    })
    .to_string()
}

/// What EG sends for Gateway "default/eg" with an HTTP and a TCP listener.
fn infra(config: &str, http: u16, tcp: u16, protocol: &str) -> pb::Infra {
    pb::Infra {
        proxy: Some(gateway_proxy(config, http, tcp, protocol)),
    }
}

fn create(i: pb::Infra) -> pb::CreateOrUpdateProxyInfraRequest {
    pb::CreateOrUpdateProxyInfraRequest { infra: Some(i) }
}

/// The test's containers (id → inspect JSON), by label.
fn containers(cleanup: &Cleanup) -> Vec<Value> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--no-trunc", "--filter"])
        .arg(format!("label={}", cleanup.filter()))
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
        .arg("inspect")
        .args(&ids)
        .output()
        .unwrap();
    let mut all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    all.sort_by_key(|c| c["Id"].as_str().unwrap_or("").to_string());
    all
}

fn ids(cs: &[Value]) -> Vec<String> {
    cs.iter()
        .map(|c| c["Id"].as_str().unwrap().to_string())
        .collect()
}

/// Container lifecycle events of this test since `since` (unix seconds).
fn events_since(cleanup: &Cleanup, since: u64) -> Vec<String> {
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1;
    let out = Command::new("docker")
        .args(["events", "--since"])
        .arg(since.to_string())
        .arg("--until")
        .arg(until.to_string())
        .args(["--filter", "type=container", "--filter"])
        .arg(format!("label={}", cleanup.filter()))
        .args(["--format", "{{.Action}}"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|a| {
            [
                "create", "start", "destroy", "die", "stop", "kill", "rename",
            ]
            .contains(&a.as_str())
        })
        .collect()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn args(c: &Value) -> Vec<String> {
    c["Args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_provider_drives_serve_end_to_end() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("eg-remote");
    let dir = short_tempdir();
    let state = dir.path().join("s");
    let (http, tcp) = (free_port(), free_port());
    // EG's xDS server for Gateway default/eg: a listener on each of the IR's ports.
    let certs = Certs::generate(&dir.path().join("certs"));
    let (backend, _backend) = xds::backend("hello\n").await;
    let ready = free_port();
    let snapshot = xds::eg_http_and_tcp_snapshot(http, tcp, backend, ready);
    let xds_server = XdsServer::start(&certs, snapshot).await;
    let serve = Serve::start(dir.path(), &cleanup, &xds_server, &certs);
    let mut client = serve.client().await;
    let persisted = state.join("remote").join(format!("{PROXY}.json"));

    // Malformed requests: InvalidArgument naming the field; nothing on the host.
    let bad = [
        (
            infra("{not json", http, tcp, "TCP"),
            "infra.proxy.config",
            "malformed EnvoyProxy JSON",
        ),
        (
            infra(&envoy_proxy(image, -1), http, tcp, "TCP"),
            "envoyDeployment.replicas",
            "",
        ),
        (
            infra(&envoy_proxy(image, 2), http, tcp, "SCTP"),
            "infra.proxy.listeners[1].ports[0].protocol",
            "SCTP",
        ),
    ];
    for (req, field, what) in bad {
        let err = client
            .create_or_update_proxy_infra(create(req))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
        assert!(err.message().contains(what), "{what}: {}", err.message());
    }
    assert!(containers(&cleanup).is_empty());
    assert!(!state.join("proxies").join(PROXY).exists());
    assert!(!persisted.exists());

    // A realistic IR: 2 replicas as specified.
    let good = infra(&envoy_proxy(image, 2), http, tcp, "TCP");
    let t0 = Instant::now();
    client
        .create_or_update_proxy_infra(create(good.clone()))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nserve log:\n{}", serve.log_text()));
    eprintln!("created in {:?}", t0.elapsed());
    let first = containers(&cleanup);
    assert_eq!(first.len(), 2, "serve log:\n{}", serve.log_text());
    let mut nodes = Vec::new();
    for c in &first {
        assert_eq!(c["State"]["Running"], true);
        assert_eq!(c["Config"]["Image"], image);
        let labels = &c["Config"]["Labels"];
        assert_eq!(labels["io.berth.proxy"], PROXY);
        assert_eq!(labels["io.berth.managed-by"], "berth");
        assert_eq!(labels["gateway.envoyproxy.io/owning-gateway-name"], "eg");
        assert_eq!(c["HostConfig"]["Memory"], 256 << 20);
        assert_eq!(c["HostConfig"]["NanoCpus"], 500_000_000);
        let a = args(c);
        assert_eq!(after(&a, "--service-cluster"), Some("default/eg"), "{a:?}");
        assert_eq!(after(&a, "--log-level"), Some("info"), "{a:?}");
        assert_eq!(
            after(&a, "--component-log-level"),
            Some("upstream:debug"),
            "{a:?}"
        );
        nodes.push(after(&a, "--service-node").unwrap().to_string());
    }
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "--service-node is unique per replica");
    assert!(persisted.exists());

    // `berth status`: both replicas got EG's config (version v1, nothing rejected) and serve.
    // A first install is gated only on a started Envoy, so this may take a moment after the
    // call returned.
    let status = || {
        let out = common::berth_command(Some(&state), None)
            .args(["-o", "json", "status"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        rows["replicas"].as_array().unwrap().clone()
    };
    let start = Instant::now();
    let rows = loop {
        let rows = status();
        let serving = |r: &Value| r["ready"] == true && r["xds"]["listeners"] == "v1";
        if rows.len() == 2 && rows.iter().all(serving) {
            break rows;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not serving: {rows:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for r in &rows {
        assert_eq!(r["envoy"], "LIVE", "{r}");
        assert_eq!(r["xds"]["connected"], true, "{r}");
        assert_eq!(r["xds"]["rejected"], 0, "{r}");
    }
    // serve's /status says the same per replica.
    let (code, body) = common::serve::http_get(serve.status_port, "/status").expect("/status");
    assert_eq!(code, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    let proxy = served["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == PROXY)
        .cloned()
        .unwrap_or_else(|| panic!("{PROXY} in /status: {served:#}"));
    let replicas = proxy["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2, "{proxy:#}");
    for r in replicas {
        assert_eq!(r["xds"]["listeners"], "v1", "{r}");
        assert_eq!(r["xds"]["clusters"], "v1", "{r}");
        assert_eq!(r["xds"]["rejected"], 0, "{r}");
    }

    // The same request again changes nothing.
    let since = now_secs();
    client
        .create_or_update_proxy_infra(create(good.clone()))
        .await
        .unwrap();
    assert_eq!(ids(&containers(&cleanup)), ids(&first));
    std::thread::sleep(Duration::from_millis(500));
    let events = events_since(&cleanup, since);
    assert!(events.is_empty(), "container events: {events:?}");

    // A changed image rolls the replicas, each new one serving before an old one goes.
    let changed = infra(&envoy_proxy(OLD_IMAGE, 2), http, tcp, "TCP");
    client
        .create_or_update_proxy_infra(create(changed))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nserve log:\n{}", serve.log_text()));
    let rolled = containers(&cleanup);
    assert_eq!(rolled.len(), 2, "serve log:\n{}", serve.log_text());
    for c in &rolled {
        assert!(!ids(&first).contains(&c["Id"].as_str().unwrap().to_string()));
        assert_eq!(c["Config"]["Image"], OLD_IMAGE);
    }
    let rows = status();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    for r in &rows {
        assert_eq!(r["ready"], true, "the serving gate let it in: {r}");
        assert_eq!(r["xds"]["listeners"], "v1", "{r}");
    }

    // A malformed update changes nothing either.
    let err = client
        .create_or_update_proxy_infra(create(infra(&envoy_proxy(image, -3), http, tcp, "TCP")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(ids(&containers(&cleanup)), ids(&rolled));

    // Delete leaves nothing behind.
    client
        .delete_proxy_infra(pb::DeleteProxyInfraRequest {
            infra: Some(infra("", 0, 0, "TCP")),
        })
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nserve log:\n{}", serve.log_text()));
    assert!(containers(&cleanup).is_empty());
    assert!(!state.join("proxies").join(PROXY).exists());
    assert!(!persisted.exists());
    // And a second delete is fine.
    client
        .delete_proxy_infra(pb::DeleteProxyInfraRequest {
            infra: Some(infra("", 0, 0, "TCP")),
        })
        .await
        .unwrap();
}

/// `berth up --ir` with a golden IR (image and ports made local) and the xDS flags; `down`
/// removes it. A bad IR is exit 2 with the field path. No xDS server answers, so this is the
/// first-install rule: nothing serves yet, and a started replica is accepted.
#[test]
fn up_ir_brings_a_proxy_up_and_down_removes_it() {
    let image = ensure_test_image();
    let cleanup = Cleanup::new("eg-up-ir");
    let dir = short_tempdir();
    let state = dir.path().join("s");
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_eg/merged-gateways/ir.yaml");
    let mut ir: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let proxy = &mut ir["infraIR"]["merged-eg"]["proxy"];
    let deployment = &mut proxy["config"]["spec"]["provider"]["kubernetes"]["envoyDeployment"];
    deployment["replicas"] = 1.into();
    deployment["container"] = serde_yaml::from_str(&format!("image: {image}")).unwrap();
    for l in proxy["listeners"].as_sequence_mut().unwrap() {
        let p = free_port();
        for port in l["ports"].as_sequence_mut().unwrap() {
            port["containerPort"] = p.into();
            port["servicePort"] = p.into();
        }
    }
    let ir_path = dir.path().join("ir.yaml");
    std::fs::write(&ir_path, serde_yaml::to_string(&ir).unwrap()).unwrap();
    let c = certs();
    let run = |args: &[&str], ir: &Path| {
        common::berth_command(Some(&state), Some(&cleanup.case))
            .current_dir(dir.path())
            .arg("--ir")
            .arg(ir)
            .args(["--xds-address", "127.0.0.1", "--xds-port"])
            .arg(free_port().to_string())
            .arg("--xds-ca")
            .arg(c.join("cert.pem"))
            .arg("--xds-cert")
            .arg(c.join("cert.pem"))
            .arg("--xds-key")
            .arg(c.join("key.pem"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["up"], &ir_path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cs = containers(&cleanup);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0]["Config"]["Labels"]["io.berth.proxy"], "merged-eg");
    assert_eq!(after(&args(&cs[0]), "--service-cluster"), Some("merged-eg"));
    assert!(state.join("proxies/merged-eg").exists());

    // Bad IR: exit 2, the field path, nothing changed.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&ir_path)
            .unwrap()
            .replace("protocol: TCP", "protocol: SCTP"),
    )
    .unwrap();
    let out = run(&["up"], &bad);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("infraIR.merged-eg.proxy.listeners[2].ports[0].protocol"),
        "{err}"
    );
    assert_eq!(ids(&containers(&cleanup)), ids(&cs));

    let out = run(&["down"], &ir_path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(containers(&cleanup).is_empty());
    assert!(!state.join("proxies/merged-eg").exists());
}

/// `berth validate` runs `envoy --mode validate` on xDS-mode bootstraps: examples/xds.toml and
/// the golden IR files that name an image (made local).
#[test]
fn envoy_accepts_xds_mode_bootstraps() {
    let image = ensure_test_image();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = short_tempdir();
    let c = certs();
    let validate = |args: &[&std::ffi::OsStr]| {
        let out = common::berth_command(None, None)
            .current_dir(dir.path())
            .args(["--container-label", "io.berth.test=1", "-q"])
            .args(args)
            .arg("validate")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Not "Envoy check skipped": Envoy ran and accepted every proxy.
        assert!(
            stdout.contains("config is valid and Envoy accepts it (")
                && !stdout.contains("(0 proxies)"),
            "{args:?}: Envoy did not check it: {stdout}"
        );
    };
    let example = std::fs::read_to_string(root.join("examples/xds.toml"))
        .unwrap()
        .replace("berth/envoy:1.40.0", image)
        .replace("certs/", &format!("{}/", c.display()));
    let toml = dir.path().join("xds.toml");
    std::fs::write(&toml, example).unwrap();
    validate(&["-f".as_ref(), toml.as_os_str()]);

    for case in ["full-envoyproxy", "egctl-envoyproxy-valid", "json-infra"] {
        let case_dir = root.join("tests/golden_eg").join(case);
        let (name, text) = ["ir.yaml", "ir.json"]
            .iter()
            .find_map(|n| {
                std::fs::read_to_string(case_dir.join(n))
                    .ok()
                    .map(|t| (*n, t))
            })
            .unwrap();
        let local: String = text
            .lines()
            .map(|l| {
                let t = l.trim_start();
                let indent = &l[..l.len() - t.len()];
                if t.starts_with("image: ") {
                    format!("{indent}image: {image}")
                } else if t.starts_with("\"image\": ") {
                    let comma = if t.ends_with(',') { "," } else { "" };
                    format!("{indent}\"image\": \"{image}\"{comma}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            local.contains(image),
            "{case}: names no image to make local, so Envoy would not be the test image"
        );
        let ir = dir.path().join(format!("{case}-{name}"));
        std::fs::write(&ir, local).unwrap();
        let (ca, key) = (c.join("cert.pem"), c.join("key.pem"));
        validate(&[
            "--ir".as_ref(),
            ir.as_os_str(),
            "--xds-address".as_ref(),
            "127.0.0.1".as_ref(),
            "--xds-ca".as_ref(),
            ca.as_os_str(),
            "--xds-cert".as_ref(),
            ca.as_os_str(),
            "--xds-key".as_ref(),
            key.as_os_str(),
        ]);
    }
}
