//! Route and backend changes under load serve no error: renaming a backend (the route then
//! names a new cluster), adding a route with a new backend and removing it again. Each change
//! reaches the running replicas live (no container replaced) in make-before-break stages, so no
//! replica ever has a route naming a cluster it lacks. Through `berth up` and through
//! `berth serve` (a config edit), with real backends on 127.0.0.1.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use common::config as cfg;
use common::fleet::{assert_no_failures, ensure_images, Fleet, PROXY};
use common::load::Load;
use common::serve::Serve;
use common::TEST_IMAGE;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// An HTTP backend on 127.0.0.1 answering 200 with its name; stops when dropped.
struct Backend {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    async fn start(name: &'static str) -> Backend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| async move {
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(format!(
                            "backend {name}\n"
                        )))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Backend { port, task }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The config: `/` to `backend` at `port`; with `extra`, also `/x` to backend `c` at `c_port`.
fn config(listen: u16, backend: &str, port: u16, extra: Option<u16>) -> String {
    let mut web = cfg::Listener::new("web", listen);
    if extra.is_some() {
        web = web.route(cfg::Route::backend("/x", "c"));
    }
    let mut proxy = cfg::Proxy::test(PROXY, TEST_IMAGE, 2)
        .listener(web.route(cfg::Route::backend("/", backend)))
        .backend(cfg::Backend::local(backend, port));
    if let Some(c) = extra {
        proxy = proxy.backend(cfg::Backend::local("c", c));
    }
    proxy.to_toml()
}

/// The config: `/` to `backend` at `port`; with `extra`, also `/x` to backend `c` at `c_port`.
/// The changes, in order: rename a → b, add /x → c, remove /x and c, rename b → a.
fn changes(listen: u16, a: u16, b: u16, c: u16) -> Vec<(&'static str, String)> {
    vec![
        ("rename backend a to b", config(listen, "b", b, None)),
        (
            "add route /x with backend c",
            config(listen, "b", b, Some(c)),
        ),
        (
            "remove route /x and backend c",
            config(listen, "b", b, None),
        ),
        ("rename backend b to a", config(listen, "a", a, None)),
    ]
}

#[tokio::test]
async fn backend_and_route_changes_through_up_serve_no_error() {
    ensure_images();
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let fleet = Fleet::new("liveroutes").await;
    std::fs::write(fleet.config(), config(fleet.port, "a", a.port, None)).unwrap();
    fleet.up_ok().await;
    let before = fleet.ids().await;
    assert_eq!(before.len(), 2);

    let load = Load::start(fleet.port, "/", 8, Duration::from_secs(300));
    for (what, text) in changes(fleet.port, a.port, b.port, c.port) {
        std::fs::write(fleet.config(), text).unwrap();
        let out = fleet.up().await;
        assert!(out.status.success(), "{what}: berth up failed");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("confirmed by 2 replica(s)"),
            "{what}: both replicas confirmed the new files"
        );
        // Traffic between changes, so every change happens under load.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = load.stop().await;
    eprintln!("live route changes through up: {}", report.summary());
    assert_no_failures("backend and route changes through up", &report);
    assert_eq!(fleet.ids().await, before, "no container was replaced");
}

// Multi-threaded: waiting on serve's status blocks a thread, and must not stall the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn backend_and_route_changes_through_serve_serve_no_error() {
    ensure_images();
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let fleet = Fleet::new("liveserve").await;
    std::fs::write(fleet.config(), config(fleet.port, "a", a.port, None)).unwrap();
    fleet.up_ok().await;
    let before = fleet.ids().await;
    let serve = Serve::start(&fleet.config(), &fleet.state(), &fleet.cleanup, &[]);
    serve.wait_for("the proxy converged", Duration::from_secs(60), |s| {
        s.converged(PROXY, 2)
    });

    let load = Load::start(fleet.port, "/", 8, Duration::from_secs(300));
    for (what, text) in changes(fleet.port, a.port, b.port, c.port) {
        let generation = serve.proxy(PROXY)["desiredGeneration"].as_u64().unwrap();
        std::fs::write(fleet.config(), text).unwrap();
        tokio::task::block_in_place(|| {
            serve.wait_for(what, Duration::from_secs(60), |s| {
                let p = s.proxy(PROXY);
                p["desiredGeneration"].as_u64() > Some(generation) && s.converged(PROXY, 2)
            })
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = load.stop().await;
    eprintln!("live route changes through serve: {}", report.summary());
    assert_no_failures("backend and route changes through serve", &report);
    assert_eq!(fleet.ids().await, before, "no container was replaced");
    // The last change is what serves.
    let body = reqwest_like(fleet.port, "/").await;
    assert_eq!(body, "backend a\n");
}

/// One GET through the host port; the body.
async fn reqwest_like(port: u16, path: &str) -> String {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}
