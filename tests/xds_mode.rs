//! xDS mode against a live xDS server: berth's replicas get their listeners, routes, clusters
//! and endpoints from a delta-ADS server with mTLS (tests/common/xds.rs, standing in for Envoy
//! Gateway's), become LIVE, serve through the host port, and a rolling upgrade under load loses
//! nothing. Real Docker, real Envoy, the real `berth` binary with `--ir`.
//!
//! Prints the figures the issue asks for: time from container start to LIVE, and failed
//! requests during the rollout.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use berth::core::layout;
use berth::core::replica::{ObservedContainer, RunState, LABEL_NAME};
use berth::engine::{ContainerEngine, DockerEngine as Engine};
use berth::envoy::admin::{Admin, ReadyState};
use common::fleet::assert_no_failures;
use common::load::Load;
use common::xds::{self, Certs, XdsServer};
use common::{free_port, short_tempdir, Cleanup};

const OLD_IMAGE: &str = "berth-test/envoy:1.39.3";
const NEW_IMAGE: &str = "berth-test/envoy:1.40.0";
/// EG's IR key of the Gateway, and so every replica's `--service-cluster`.
const KEY: &str = "default/eg";
const PROXY: &str = "default-eg";
const LISTENER: &str = "default/eg/http";

struct Gateway {
    cleanup: Cleanup,
    dir: tempfile::TempDir,
    certs: Certs,
    xds: XdsServer,
    engine: Engine,
    port: u16,
    ready_port: u16,
    backend_port: u16,
    _backend: tokio::task::JoinHandle<()>,
}

impl Gateway {
    async fn start(name: &str) -> Gateway {
        common::fleet::ensure_images();
        let dir = short_tempdir();
        let certs = Certs::generate(&dir.path().join("certs"));
        let (backend_port, backend) = xds::backend("hello from the backend\n").await;
        let port = free_port();
        let ready_port = free_port();
        let snapshot = xds::eg_snapshot(KEY, LISTENER, port, backend_port, ready_port, "v1", "v1");
        let xds = XdsServer::start(&certs, snapshot).await;
        Gateway {
            cleanup: Cleanup::new(name),
            dir,
            certs,
            xds,
            engine: Engine::connect().await.expect("docker"),
            port,
            ready_port,
            backend_port,
            _backend: backend,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("s")
    }

    /// EG's infra IR for the Gateway, as `egctl x translate --to ir` prints it.
    fn write_ir(&self, image: &str, replicas: u32, marker: &str) -> PathBuf {
        let ir = format!(
            r#"infraIR:
  {KEY}:
    proxy:
      name: {KEY}
      namespace: envoy-gateway-system
      metadata:
        labels:
          gateway.envoyproxy.io/owning-gateway-name: eg
          gateway.envoyproxy.io/owning-gateway-namespace: default
        ownerReference:
          kind: GatewayClass
          name: eg
      config:
        apiVersion: gateway.envoyproxy.io/v1alpha1
        kind: EnvoyProxy
        metadata: {{name: proxy-config, namespace: default}}
        spec:
          concurrency: 1
          shutdown: {{drainTimeout: 10s, minDrainDuration: 1s}}
          provider:
            type: Kubernetes
            kubernetes:
              envoyDeployment:
                replicas: {replicas}
                container:
                  image: {image}
                  env: [{{name: ROLLOUT_MARKER, value: "{marker}"}}]
                  resources: {{limits: {{memory: 256Mi}}}}
      listeners:
      - name: {LISTENER}
        ports:
        - {{name: http-{port}, protocol: HTTP, servicePort: {port}, containerPort: {port}}}
"#,
            port = self.port
        );
        let path = self.dir.path().join("gw.yaml");
        std::fs::write(&path, ir).unwrap();
        path
    }

    async fn berth(&self, args: &[&str], cert: &Path, key: &Path) -> Output {
        let out = tokio::process::Command::from(common::berth_command(
            Some(&self.state()),
            Some(&self.cleanup.case),
        ))
        .current_dir(self.dir.path())
        .arg("--ir")
        .arg(self.dir.path().join("gw.yaml"))
        .args(["--xds-address", "127.0.0.1", "--xds-port"])
        .arg(self.xds.addr.port().to_string())
        .arg("--xds-ca")
        .arg(self.certs.ca())
        .arg("--xds-cert")
        .arg(cert)
        .arg("--xds-key")
        .arg(key)
        .args(args)
        .output()
        .await
        .expect("running berth");
        common::show(&format!("berth {args:?}"), &out);
        out
    }

    async fn up(&self) -> Output {
        self.berth(
            &["--output", "json", "up"],
            &self.certs.client_cert(),
            &self.certs.client_key(),
        )
        .await
    }

    async fn replicas(&self) -> Vec<ObservedContainer> {
        let mut cs = self
            .engine
            .observe(&self.cleanup.label_filter())
            .await
            .unwrap();
        cs.retain(|c| c.is_managed() && c.state == RunState::Running);
        cs.sort_by_key(|c| (c.slot(), c.name.clone()));
        cs
    }

    fn admin(&self, c: &ObservedContainer) -> Admin {
        let run = c.label(LABEL_NAME).unwrap_or(&c.name);
        Admin::new(
            layout::ProxyDirs::new(&self.state(), PROXY)
                .run(run)
                .join(layout::ADMIN_SOCKET_FILE),
        )
        .with_timeout(Duration::from_secs(2))
    }

    async fn get(&self, path: &str) -> Option<(u16, String, Option<String>)> {
        let url = format!("127.0.0.1:{}", self.port);
        let stream = tokio::net::TcpStream::connect(&url).await.ok()?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .ok()?;
        tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header("host", "www.example.com")
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        let snapshot = resp
            .headers()
            .get("x-snapshot")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        use http_body_util::BodyExt;
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((
            status,
            String::from_utf8_lossy(&body).into_owned(),
            snapshot,
        ))
    }
}

/// Watches the test's containers and records, per container, when it started (the engine's
/// `StartedAt`) and when its admin first answered LIVE.
/// Per container name: started at, first seen LIVE at.
type Seen = Arc<Mutex<BTreeMap<String, (SystemTime, Option<SystemTime>)>>>;

struct LiveWatch {
    seen: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl LiveWatch {
    fn start(gw: &Gateway) -> LiveWatch {
        let seen: Seen = Arc::default();
        let filter = gw.cleanup.label_filter();
        let state = gw.state();
        let out = seen.clone();
        let task =
            tokio::spawn(async move {
                let engine = Engine::connect().await.unwrap();
                loop {
                    for c in engine.observe(&filter).await.unwrap_or_default() {
                        if !c.is_managed() || c.state != RunState::Running {
                            continue;
                        }
                        let live = out
                            .lock()
                            .unwrap()
                            .get(&c.name)
                            .is_some_and(|(_, l)| l.is_some());
                        if live {
                            continue;
                        }
                        let Some(started) = c.info.started_at.as_deref().and_then(|s| {
                            humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok()
                        }) else {
                            continue;
                        };
                        let run = c.label(LABEL_NAME).unwrap_or(&c.name).to_string();
                        let admin = Admin::new(
                            layout::ProxyDirs::new(&state, PROXY)
                                .run(&run)
                                .join(layout::ADMIN_SOCKET_FILE),
                        )
                        .with_timeout(Duration::from_millis(500));
                        let now_live = matches!(admin.ready().await, Ok(ReadyState::Live));
                        let at = SystemTime::now();
                        out.lock()
                            .unwrap()
                            .entry(c.name.clone())
                            .or_insert((started, None))
                            .1 = now_live.then_some(at);
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            });
        LiveWatch { seen, task }
    }

    /// Start → LIVE of every container that became LIVE.
    fn times(&self) -> Vec<(String, Duration)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(n, (s, l))| Some((n.clone(), l.as_ref()?.duration_since(*s).ok()?)))
            .collect()
    }
}

impl Drop for LiveWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn wait_until<F, Fut>(what: &str, within: Duration, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !ok().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_get_config_from_a_live_xds_server_and_roll_without_loss() {
    let gw = Gateway::start("xds-live").await;
    gw.write_ir(OLD_IMAGE, 2, "one");
    let watch = LiveWatch::start(&gw);
    let out = gw.up().await;
    assert!(out.status.success(), "berth up failed");

    // Both replicas connect with their client certificate, ACK EG's listeners and turn LIVE.
    let cs = gw.replicas().await;
    assert_eq!(cs.len(), 2, "{cs:#?}");
    for c in &cs {
        let admin = gw.admin(c);
        wait_until("LIVE", Duration::from_secs(20), || async {
            matches!(admin.ready().await, Ok(ReadyState::Live))
        })
        .await;
    }
    wait_until(
        "both nodes ACK their listeners",
        Duration::from_secs(10),
        || async { gw.xds.nodes_acked_listeners().len() == 2 },
    )
    .await;
    let acked = gw.xds.nodes_acked_listeners();
    for c in &cs {
        assert!(acked.contains(&c.name), "{} did not ACK: {acked:?}", c.name);
    }
    assert!(gw.xds.nacks().is_empty(), "{:?}", gw.xds.nacks());

    // Through the host port to the backend, by EG's route.
    let (status, body, snapshot) = gw.get("/anything").await.expect("a response");
    assert_eq!((status, body.as_str()), (200, "hello from the backend\n"));
    assert_eq!(snapshot.as_deref(), Some("v1"));

    // A route change is pushed, not rolled: every replica serves it, no container replaced.
    let ids: Vec<String> = cs.iter().map(|c| c.id.clone()).collect();
    gw.xds.set(xds::eg_snapshot(
        KEY,
        LISTENER,
        gw.port,
        gw.backend_port,
        gw.ready_port,
        "v2",
        "v2",
    ));
    wait_until(
        "the v2 route on every connection",
        Duration::from_secs(10),
        || async {
            let mut all = true;
            for _ in 0..6 {
                all &= gw.get("/").await.and_then(|r| r.2).as_deref() == Some("v2");
            }
            all
        },
    )
    .await;
    let after: Vec<String> = gw.replicas().await.into_iter().map(|c| c.id).collect();
    assert_eq!(after, ids);

    // A rolling upgrade (new image) under keep-alive load loses nothing: each new replica gets
    // its config from the xDS server before the old one is drained.
    let load = Load::start(gw.port, "/", 16, Duration::from_secs(300));
    wait_until("load flowing", Duration::from_secs(10), || async {
        load.ok_so_far() > 100
    })
    .await;
    gw.write_ir(NEW_IMAGE, 2, "two");
    let started = Instant::now();
    let out = gw.up().await;
    let rollout = started.elapsed();
    assert!(out.status.success(), "the rollout failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    let new = gw.replicas().await;
    assert_eq!(new.len(), 2);
    for c in &new {
        assert!(!ids.contains(&c.id), "{} was not replaced", c.name);
        assert!(matches!(gw.admin(c).ready().await, Ok(ReadyState::Live)));
    }

    let times = watch.times();
    eprintln!("FIGURES: container start → LIVE (xDS mode, live xDS server, mTLS, delta ADS):");
    for (name, d) in &times {
        eprintln!("FIGURES:   {name}: {:.0} ms", d.as_secs_f64() * 1e3);
    }
    eprintln!(
        "FIGURES: rollout of 2 replicas under load in {:.1}s: {}",
        rollout.as_secs_f64(),
        report.summary()
    );
    assert!(times.len() >= 4, "every replica's start → LIVE: {times:?}");
    assert_no_failures("the xDS-mode rollout", &report);
}

impl Gateway {
    /// `berth status --output json`: the replica rows.
    async fn status(&self) -> Vec<serde_json::Value> {
        let out = self
            .berth(
                &["--output", "json", "status"],
                &self.certs.client_cert(),
                &self.certs.client_key(),
            )
            .await;
        assert!(out.status.success(), "berth status failed");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["replicas"].as_array().cloned().unwrap_or_default()
    }

    async fn up_and_serving(&self) -> Vec<ObservedContainer> {
        self.write_ir(OLD_IMAGE, 2, "one");
        let out = self.up().await;
        assert!(out.status.success(), "berth up failed");
        let cs = self.replicas().await;
        assert_eq!(cs.len(), 2, "{cs:#?}");
        wait_until(
            "both nodes ACK their listeners",
            Duration::from_secs(20),
            || async { self.xds.nodes_acked_listeners().len() == 2 },
        )
        .await;
        let (status, _, snapshot) = self.get("/").await.expect("a response");
        assert_eq!((status, snapshot.as_deref()), (200, Some("v1")));
        cs
    }
}

/// Item 10: each replica's config status comes from its own stats: the version it accepted,
/// and an update it rejected (a NACK, which EG never surfaces) shows as rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_shows_the_accepted_version_and_a_rejected_update() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let gw = Gateway::start("xds-status").await;
    let cs = gw.up_and_serving().await;
    let rows = gw.status().await;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    for r in &rows {
        let x = &r["xds"];
        assert_eq!(x["connected"], true, "{r:#}");
        assert_eq!(
            (x["listeners"].as_str(), x["clusters"].as_str()),
            (Some("v1"), Some("v1")),
            "{r:#}"
        );
        assert_eq!(x["rejected"], 0, "{r:#}");
    }

    // A snapshot with a cluster Envoy refuses (connect_timeout must be > 0): every replica
    // NACKs it, keeps serving what it had, and its status says it rejected an update.
    let mut bad = xds::eg_snapshot(
        KEY,
        LISTENER,
        gw.port,
        gw.backend_port,
        gw.ready_port,
        "v2-bad",
        "v1",
    );
    bad.add(
        xds::CLUSTER,
        "bad",
        &Cluster {
            name: "bad".into(),
            connect_timeout: Some(PbDuration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        },
    );
    gw.xds.set(bad);
    wait_until("both nodes NACK", Duration::from_secs(20), || async {
        let nacked: std::collections::BTreeSet<String> =
            gw.xds.nacks().into_iter().map(|(n, _)| n).collect();
        cs.iter().all(|c| nacked.contains(&c.name))
    })
    .await;
    let rows = gw.status().await;
    for r in &rows {
        let x = &r["xds"];
        assert_eq!(
            x["clusters"], "v1",
            "the rejected version is not accepted: {r:#}"
        );
        assert!(x["rejected"].as_u64() >= Some(1), "{r:#}");
        assert_eq!(
            x["rejecting"],
            serde_json::json!(["cluster_manager.cds"]),
            "{r:#}"
        );
    }
    let (status, _, _) = gw.get("/").await.expect("still serving");
    assert_eq!(status, 200);
    // The table says so too.
    let out = gw
        .berth(&["status"], &gw.certs.client_cert(), &gw.certs.client_key())
        .await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("XDS") && table.contains("v1, 1 rejected"),
        "{table}"
    );
    assert!(table.contains("rejected 1 xDS update(s)"), "{table}");
}

/// Item 9: a rollout whose replicas cannot get config from the xDS server (a client
/// certificate it does not trust) fails at the gate: the new replica never serves, the old
/// ones are not touched and serve throughout, `berth up` exits non-zero and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_untrusted_client_certificate_fails_the_rollout_and_the_old_replicas_keep_serving() {
    let gw = Gateway::start("xds-untrusted").await;
    let old = gw.up_and_serving().await;
    let old_ids: Vec<String> = old.iter().map(|c| c.id.clone()).collect();

    let load = Load::start(gw.port, "/", 16, Duration::from_secs(300));
    wait_until("load flowing", Duration::from_secs(10), || async {
        load.ok_so_far() > 100
    })
    .await;
    // Only the client certificate changes: that is a new spec (its TLS directory is named by
    // its contents), so it goes through the gate like a new image.
    let started = Instant::now();
    let out = gw
        .berth(
            &["up"],
            &gw.certs.untrusted_cert(),
            &gw.certs.untrusted_key(),
        )
        .await;
    let took = started.elapsed();
    let report = load.stop().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "berth up must fail");
    assert!(
        stderr.contains("did not become ready within the startup deadline")
            && stderr.contains("PRE_INITIALIZING")
            && stderr.contains("does it trust the client certificate"),
        "a clear reason: {stderr}"
    );

    let now: Vec<String> = gw.replicas().await.into_iter().map(|c| c.id).collect();
    assert_eq!(now, old_ids, "the old replicas were not touched");
    for c in &old {
        let admin = gw.admin(c);
        assert!(matches!(admin.ready().await, Ok(ReadyState::Live)));
    }
    // The untrusted replica never got a stream to the server, so never any config.
    let seen = gw.xds.nodes_seen();
    assert!(
        seen.iter().all(|n| old.iter().any(|c| &c.name == n)),
        "only the old replicas reached the server: {seen:?}"
    );
    let (status, _, snapshot) = gw.get("/").await.expect("still serving");
    assert_eq!((status, snapshot.as_deref()), (200, Some("v1")));
    eprintln!(
        "FIGURES: rollout with an untrusted client certificate refused in {:.1}s under load: {}",
        took.as_secs_f64(),
        report.summary()
    );
    assert_no_failures("the refused xDS-mode rollout", &report);
}
