//! The Envoy Gateway remote-infrastructure gRPC layer, end to end over real sockets with a tonic
//! client, against a recording fake of the rollout seam. (The real-Docker test drives the same
//! service with berth's rollout behind it.)

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::core::ir::{LogLevel, Protocol};
use berth::core::source::eg::{EgProxy, XdsDefaults};
use berth::edges::eg_provider::pb::envoy_gateway_remote_infrastructure_provider_client::EnvoyGatewayRemoteInfrastructureProviderClient as Client;
use berth::edges::eg_provider::{self, pb, Infrastructure, Listen, Security, TlsFiles, Transient};
use common::eg::{gateway_proxy, unix_client};
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

#[derive(Debug, Clone, PartialEq)]
enum Call {
    CreateOrUpdate(Box<EgProxy>),
    Delete { eg_name: String, berth_name: String },
}

/// Records every call; optionally fails or is held until released, and tracks overlap per
/// proxy.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    finished: AtomicUsize,
    fail: Mutex<Option<&'static str>>,
    /// While set, a call's work does not finish.
    hold: AtomicBool,
    in_flight: Mutex<std::collections::HashMap<String, usize>>,
    max_overlap_same_proxy: AtomicUsize,
    max_overlap_total: AtomicUsize,
}

impl Fake {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn in_flight(&self) -> usize {
        self.in_flight.lock().unwrap().values().sum()
    }

    async fn work(&self, name: &str, call: Call) -> anyhow::Result<()> {
        self.calls.lock().unwrap().push(call);
        {
            let mut m = self.in_flight.lock().unwrap();
            *m.entry(name.to_string()).or_default() += 1;
            let same = m[name];
            let total: usize = m.values().sum();
            self.max_overlap_same_proxy
                .fetch_max(same, Ordering::SeqCst);
            self.max_overlap_total.fetch_max(total, Ordering::SeqCst);
        }
        while self.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        *self.in_flight.lock().unwrap().get_mut(name).unwrap() -= 1;
        self.finished.fetch_add(1, Ordering::SeqCst);
        match *self.fail.lock().unwrap() {
            None => Ok(()),
            Some("transient") => Err(anyhow::Error::new(Transient(anyhow::anyhow!(
                "docker engine unreachable"
            )))),
            Some(msg) => Err(anyhow::anyhow!("{msg}")),
        }
    }
}

#[tonic::async_trait]
impl Infrastructure for Fake {
    async fn create_or_update(&self, proxy: EgProxy) -> anyhow::Result<()> {
        let name = proxy.proxy.name.clone();
        self.work(&name, Call::CreateOrUpdate(Box::new(proxy)))
            .await
    }

    async fn delete(&self, eg_name: &str, berth_name: &str) -> anyhow::Result<()> {
        let call = Call::Delete {
            eg_name: eg_name.into(),
            berth_name: berth_name.into(),
        };
        self.work(berth_name, call).await
    }
}

fn xds() -> XdsDefaults {
    XdsDefaults {
        address: "127.0.0.1".into(),
        port: 18000,
        ca_file: "/etc/berth/eg/ca.crt".into(),
        cert_file: "/etc/berth/eg/tls.crt".into(),
        key_file: "/etc/berth/eg/tls.key".into(),
    }
}

struct Server {
    fake: Arc<Fake>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }
}

/// Serves on `listen`; TCP in plain text (the explicit opt-in), for the tests of the service
/// itself. [`start_secured`] serves with TLS.
async fn start(listen: Listen) -> (Server, Option<std::net::SocketAddr>) {
    start_secured(listen, &Security::Plaintext).await
}

async fn start_secured(
    listen: Listen,
    security: &Security,
) -> (Server, Option<std::net::SocketAddr>) {
    let fake = Arc::new(Fake::default());
    let bound = eg_provider::bind(&listen, security).await.unwrap();
    let addr = bound.local_addr();
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(bound.serve(fake.clone(), xds(), async {
        let _ = rx.await;
    }));
    let server = Server {
        fake,
        stop: Some(tx),
        task,
    };
    (server, addr)
}

async fn tcp_client(addr: std::net::SocketAddr) -> Client<Channel> {
    Client::connect(format!("http://{addr}")).await.unwrap()
}

const CONFIG: &str = r#"{
  "apiVersion": "gateway.envoyproxy.io/v1alpha1",
  "kind": "EnvoyProxy",
  "metadata": {"name": "proxy-config", "namespace": "default"},
  "spec": {
    "provider": {"type": "Kubernetes", "kubernetes": {"envoyDeployment": {
      "replicas": 2,
      "container": {"image": "berth-envoy:1.39.3",
                    "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}}}},
    "logging": {"level": {"default": "info", "upstream": "debug"}},
    "someFutureField": {"x": 1}
  }
}"#;

/// What EG sends for a Gateway "default/eg" with an HTTP and a TCP listener.
fn realistic(config: &str) -> pb::ProxyInfra {
    gateway_proxy(config, 18080, 15432, "TCP")
}

fn create(proxy: pb::ProxyInfra) -> pb::CreateOrUpdateProxyInfraRequest {
    pb::CreateOrUpdateProxyInfraRequest {
        infra: Some(pb::Infra { proxy: Some(proxy) }),
    }
}

fn delete(name: &str) -> pb::DeleteProxyInfraRequest {
    pb::DeleteProxyInfraRequest {
        infra: Some(pb::Infra {
            proxy: Some(pb::ProxyInfra {
                name: name.into(),
                ..Default::default()
            }),
        }),
    }
}

fn assert_realistic(call: &Call) {
    let Call::CreateOrUpdate(p) = call else {
        panic!("expected CreateOrUpdate, got {call:?}");
    };
    assert_eq!(p.eg_name, "default/eg");
    assert_eq!(p.proxy.name, "default-eg");
    assert_eq!(p.proxy.namespace, "envoy-gateway-system");
    assert_eq!(
        p.proxy.metadata.labels["gateway.envoyproxy.io/owning-gateway-name"],
        "eg"
    );
    let c = &p.proxy.config;
    assert_eq!(c.replicas, 2);
    assert_eq!(c.image, "berth-envoy:1.39.3");
    assert_eq!(c.resources.cpus, Some(0.5));
    assert_eq!(c.resources.memory, Some(256 << 20));
    assert_eq!(c.logging.default_level(), LogLevel::Info);
    assert_eq!(c.logging.level["upstream"], LogLevel::Debug);
    let ls = &p.proxy.listeners;
    assert_eq!(ls.len(), 2);
    assert_eq!(ls[0].name, "default/eg/http");
    assert_eq!(ls[0].ports[0].protocol, Protocol::Http);
    assert_eq!(ls[0].ports[0].container_port, 18080);
    assert_eq!(ls[1].name, "default/eg/tcp");
    assert_eq!(ls[1].ports[0].protocol, Protocol::Tcp);
    assert_eq!(p.proxy.host_ports(), vec![18080, 15432]);
    match &p.proxy.routing {
        berth::core::ir::Routing::Xds(x) => {
            assert_eq!((x.address.as_str(), x.port), ("127.0.0.1", 18000))
        }
        other => panic!("expected xDS routing, got {other:?}"),
    }
}

#[tokio::test]
async fn unix_socket_is_0600_and_maps_a_realistic_ir() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("remote-infra.sock");
    // A stale socket file from a crashed run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let (server, _) = start(Listen::Unix(sock.clone())).await;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");

    let mut client = unix_client(sock.clone()).await;
    client
        .create_or_update_proxy_infra(create(realistic(CONFIG)))
        .await
        .unwrap();
    // The same request again reaches the seam again, unchanged: idempotency is the seam's job.
    client
        .create_or_update_proxy_infra(create(realistic(CONFIG)))
        .await
        .unwrap();
    let calls = server.fake.calls();
    assert_eq!(calls.len(), 2);
    assert_realistic(&calls[0]);
    assert_eq!(calls[0], calls[1]);

    client
        .delete_proxy_infra(delete("default/eg"))
        .await
        .unwrap();
    assert_eq!(
        server.fake.calls()[2],
        Call::Delete {
            eg_name: "default/eg".into(),
            berth_name: "default-eg".into()
        }
    );

    // A second server on a live socket is refused rather than stealing it.
    let err = eg_provider::bind(&Listen::Unix(sock.clone()), &Security::None)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("already serving"), "{err:#}");

    server.stop().await;
    assert!(!sock.exists(), "socket file left behind");
}

#[tokio::test]
async fn refuses_to_replace_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-socket");
    std::fs::write(&path, "data").unwrap();
    let err = eg_provider::bind(&Listen::Unix(path.clone()), &Security::None)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("not a socket"), "{err:#}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
}

#[tokio::test]
async fn tcp_bad_input_is_invalid_argument_and_reaches_nothing() {
    let (server, addr) = start(Listen::Tcp("127.0.0.1:0".parse().unwrap())).await;
    let mut client = tcp_client(addr.unwrap()).await;

    let negative = CONFIG.replace("\"replicas\": 2", "\"replicas\": -1");
    let mut unknown_protocol = realistic(CONFIG);
    unknown_protocol.listeners[1].ports[0].protocol = "SCTP".into();
    let mut bad_port = realistic(CONFIG);
    bad_port.listeners[0].ports[0].container_port = 70000;
    let mut no_name = realistic(CONFIG);
    no_name.name = String::new();
    let cases = [
        (
            create(realistic("{\"spec\": {")),
            "infra.proxy.config: malformed EnvoyProxy JSON",
        ),
        (
            create(realistic(&negative)),
            "infra.proxy.config.spec.provider.kubernetes.envoyDeployment.replicas: must be ≥ 0, got -1",
        ),
        (
            create(unknown_protocol),
            "infra.proxy.listeners[1].ports[0].protocol: unknown protocol \"SCTP\"",
        ),
        (
            create(bad_port),
            "infra.proxy.listeners[0].ports[0].containerPort: must be in 1..=65535, got 70000",
        ),
        (create(no_name), "infra.proxy.name: must not be empty"),
        (
            pb::CreateOrUpdateProxyInfraRequest { infra: None },
            "infra: required",
        ),
        (
            pb::CreateOrUpdateProxyInfraRequest {
                infra: Some(pb::Infra { proxy: None }),
            },
            "infra.proxy: required",
        ),
    ];
    for (req, want) in cases {
        let status = client.create_or_update_proxy_infra(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with(want),
            "got {:?}, want {want:?}…",
            status.message()
        );
    }
    let status = client.delete_proxy_infra(delete("")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(server.fake.calls().is_empty(), "{:?}", server.fake.calls());

    // No listeners: accepted, nothing applied, nothing torn down.
    let mut empty = realistic(CONFIG);
    empty.listeners.clear();
    client
        .create_or_update_proxy_infra(create(empty))
        .await
        .unwrap();
    assert!(server.fake.calls().is_empty());

    server.stop().await;
}

#[tokio::test]
async fn rate_limit_delete_succeeds_and_create_is_a_clear_failed_precondition() {
    let (server, addr) = start(Listen::Tcp("127.0.0.1:0".parse().unwrap())).await;
    let mut client = tcp_client(addr.unwrap()).await;
    // EG calls this at every start when rate limiting is off: deleting nothing succeeds.
    client
        .delete_rate_limit_infra(pb::DeleteRateLimitInfraRequest {})
        .await
        .unwrap();
    let s = client
        .create_or_update_rate_limit_infra(pb::CreateOrUpdateRateLimitInfraRequest {})
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert_eq!(s.message(), eg_provider::RATE_LIMIT_UNSUPPORTED);
    assert!(s.message().contains("rateLimit"), "{}", s.message());
    assert!(server.fake.calls().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn seam_errors_become_internal_or_unavailable() {
    let (server, addr) = start(Listen::Tcp("127.0.0.1:0".parse().unwrap())).await;
    let mut client = tcp_client(addr.unwrap()).await;

    *server.fake.fail.lock().unwrap() = Some("replica 1 never became ready; rolled back");
    let s = client
        .create_or_update_proxy_infra(create(realistic(CONFIG)))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Internal);
    assert!(
        s.message().contains("never became ready"),
        "{}",
        s.message()
    );

    *server.fake.fail.lock().unwrap() = Some("transient");
    let s = client
        .delete_proxy_infra(delete("default/eg"))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unavailable);
    assert!(
        s.message().contains("docker engine unreachable"),
        "{}",
        s.message()
    );
    server.stop().await;
}

/// Polls `ok` until it holds; fails after a deadline far beyond what it needs.
async fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited 30 s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn calls_for_one_proxy_run_one_at_a_time() {
    let (server, addr) = start(Listen::Tcp("127.0.0.1:0".parse().unwrap())).await;
    server.fake.hold.store(true, Ordering::SeqCst);
    let client = tcp_client(addr.unwrap()).await;

    let mut other = realistic(CONFIG);
    other.name = "default/other".into();
    let mut tasks = Vec::new();
    for req in [
        create(realistic(CONFIG)),
        create(realistic(CONFIG)),
        create(realistic(CONFIG)),
        create(other),
    ] {
        let mut c = client.clone();
        tasks.push(tokio::spawn(async move {
            c.create_or_update_proxy_infra(req).await.unwrap();
        }));
    }
    // Held: one call of each proxy runs, the other two of the first proxy wait for it.
    let fake = server.fake.clone();
    wait_until("one call of each proxy running", || fake.in_flight() == 2).await;
    assert_eq!(server.fake.calls().len(), 2);
    server.fake.hold.store(false, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(server.fake.calls().len(), 4);
    assert_eq!(server.fake.max_overlap_same_proxy.load(Ordering::SeqCst), 1);
    assert_eq!(server.fake.max_overlap_total.load(Ordering::SeqCst), 2);
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_gives_up_does_not_abort_the_rollout() {
    let (server, addr) = start(Listen::Tcp("127.0.0.1:0".parse().unwrap())).await;
    server.fake.hold.store(true, Ordering::SeqCst);
    let mut client = tcp_client(addr.unwrap()).await;
    let call = tokio::spawn(async move {
        client
            .create_or_update_proxy_infra(create(realistic(CONFIG)))
            .await
    });
    let fake = server.fake.clone();
    wait_until("the rollout to start", || fake.in_flight() == 1).await;
    // The client gives up while the rollout runs.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(server.fake.finished.load(Ordering::SeqCst), 0);
    server.fake.hold.store(false, Ordering::SeqCst);
    wait_until("the rollout to finish", || {
        fake.finished.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(server.fake.in_flight(), 0);
    server.stop().await;
}

/// TCP is TLS (mTLS with a client CA); plain text only with the explicit opt-in.
#[tokio::test]
async fn tcp_is_tls_and_mtls_checks_envoy_gateways_client_certificate() {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let tcp = || Listen::Tcp("127.0.0.1:0".parse().unwrap());
    let err = eg_provider::bind(&tcp(), &Security::None)
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("remote_plaintext = true"),
        "{err:#}"
    );

    let dir = tempfile::tempdir().unwrap();
    let certs = common::xds::Certs::generate(dir.path());
    let read = |p: PathBuf| std::fs::read(p).unwrap();
    let client = |addr: std::net::SocketAddr, identity: Option<(PathBuf, PathBuf)>| {
        let ca = read(certs.ca());
        async move {
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("envoy-gateway");
            if let Some((cert, key)) = identity {
                tls = tls.identity(Identity::from_pem(read(cert), read(key)));
            }
            let channel = Endpoint::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await?;
            let mut c = Client::new(channel);
            c.delete_rate_limit_infra(pb::DeleteRateLimitInfraRequest {})
                .await
                .map_err(anyhow::Error::from)?;
            anyhow::Ok(())
        }
    };
    let files = |client_ca: Option<PathBuf>| {
        Security::Tls(TlsFiles {
            cert: certs.dir.join("server.pem"),
            key: certs.dir.join("server-key.pem"),
            client_ca,
        })
    };

    // TLS: any client that trusts the server's CA.
    let (server, addr) = start_secured(tcp(), &files(None)).await;
    client(addr.unwrap(), None)
        .await
        .expect("TLS without a client certificate");
    // Plain text does not get in.
    let plain = Client::connect(format!("http://{}", addr.unwrap())).await;
    let plain_ok = match plain {
        Ok(mut c) => c
            .delete_rate_limit_infra(pb::DeleteRateLimitInfraRequest {})
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(!plain_ok, "a plain-text client reached the TLS service");
    server.stop().await;

    // mTLS: only a client certificate signed by the client CA.
    let (server, addr) = start_secured(tcp(), &files(Some(certs.ca()))).await;
    let addr = addr.unwrap();
    client(addr, Some((certs.client_cert(), certs.client_key())))
        .await
        .expect("the trusted client certificate");
    assert!(
        client(addr, None).await.is_err(),
        "no client certificate got in"
    );
    assert!(
        client(addr, Some((certs.untrusted_cert(), certs.untrusted_key())))
            .await
            .is_err(),
        "an untrusted client certificate got in"
    );
    assert!(server.fake.calls().is_empty());
    server.stop().await;
}
