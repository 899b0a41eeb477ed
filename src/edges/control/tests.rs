use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;

/// A serve stand-in: every apply sends `events` events, then (optionally after a pause)
/// fails or succeeds; it counts the applies that ran to their end.
struct Fake {
    events: usize,
    pause: Duration,
    finished: AtomicUsize,
}

impl Handler for Fake {
    fn info(&self) -> ServeInfo {
        ServeInfo {
            pid: 42,
            version: "test".into(),
            config: "/etc/berth/berth.toml".into(),
            state_dir: "/var/lib/berth".into(),
        }
    }

    async fn apply(&self, req: ApplyRequest, events: mpsc::UnboundedSender<Event>) -> Outcome {
        for i in 0..self.events {
            let _ = events.send(Event::new("edge", "ready").slot(i as u32));
        }
        tokio::time::sleep(self.pause).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        if req.config != self.info().config {
            return Outcome::failed(2, format!("serve manages {}", self.info().config.display()));
        }
        Outcome::ok()
    }
}

fn request(config: &str) -> ApplyRequest {
    ApplyRequest {
        verb: Verb::Up,
        config: config.into(),
        force: false,
        labels: Default::default(),
    }
}

async fn start(
    fake: Fake,
) -> (
    tempfile::TempDir,
    Client,
    Arc<Fake>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(dir.path());
    let listener = bind(&path).unwrap();
    let fake = Arc::new(fake);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (fake, cancel) = (fake.clone(), cancel.clone());
        async move { serve(listener, fake, cancel).await.unwrap() }
    });
    (dir, Client::new(&path), fake, cancel, task)
}

fn fake(events: usize, pause_ms: u64) -> Fake {
    Fake {
        events,
        pause: Duration::from_millis(pause_ms),
        finished: AtomicUsize::new(0),
    }
}

#[tokio::test]
async fn apply_streams_every_event_then_the_outcome() {
    let (_dir, client, _fake, cancel, task) = start(fake(500, 0)).await;
    assert_eq!(client.info().await.unwrap().pid, 42);
    let mut slots = Vec::new();
    let outcome = client
        .apply(&request("/etc/berth/berth.toml"), |e| {
            slots.push(e.slot.unwrap())
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::ok());
    assert_eq!(slots, (0..500).collect::<Vec<u32>>(), "in order, none lost");
    let refused = client
        .apply(&request("/tmp/other.toml"), |_| {})
        .await
        .unwrap();
    assert_eq!(refused.exit_code, 2);
    assert!(refused.error.unwrap().contains("/etc/berth/berth.toml"));
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn the_pass_goes_on_when_the_client_goes_away() {
    let (_dir, client, fake, cancel, task) = start(fake(1, 300)).await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        client.apply(&request("/etc/berth/berth.toml"), |_| {}),
    )
    .await;
    assert!(gave_up.is_err(), "the client stopped waiting");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.finished.load(Ordering::SeqCst), 1);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn bad_requests_are_answered_with_what_is_wrong() {
    let (_dir, client, _fake, cancel, task) = start(fake(0, 0)).await;
    let stream = tokio::net::UnixStream::connect(client.socket())
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post("/v1/apply")
        .header("host", "berth")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            "{\"verb\":\"sideways\"}",
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 400);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_dead_serves_socket_is_replaced_and_removed_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(dir.path());
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a socket file left behind");
    let listener = bind(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let cancel = CancellationToken::new();
    cancel.cancel();
    serve(listener, Arc::new(fake(0, 0)), cancel).await.unwrap();
    assert!(!path.exists());
    // Nothing else is replaced.
    std::fs::write(&path, "not a socket").unwrap();
    assert!(bind(&path)
        .unwrap_err()
        .to_string()
        .contains("not a socket"));
}

#[tokio::test]
async fn no_serve_is_an_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(&dir.path().join(SOCKET_FILE));
    let err = format!("{:#}", client.info().await.unwrap_err());
    assert!(err.contains("serve.sock"), "{err}");
}

#[test]
fn long_state_dirs_put_the_socket_in_the_temp_directory() {
    assert_eq!(
        socket_path(std::path::Path::new("/var/lib/berth")),
        std::path::Path::new("/var/lib/berth/serve.sock")
    );
    let long = std::path::PathBuf::from(format!("/tmp/{}", "d".repeat(120)));
    let p = socket_path(&long);
    assert!(
        p.as_os_str().len() <= 100 && p.starts_with(std::env::temp_dir()),
        "{p:?}"
    );
    assert_eq!(p, socket_path(&long), "stable");
}

#[tokio::test]
async fn up_hands_its_request_to_the_serve_holding_the_lock_or_waits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let crate::state::lock::Attempt::Locked(mut serve_lock) =
        StateLock::try_acquire(&root, Role::Serve).unwrap()
    else {
        panic!("free")
    };
    // A serve without its API yet: up waits, saying for whom.
    let waiting = tokio::spawn({
        let root = root.clone();
        async move {
            let mut said = None;
            let w = writer(&root, Role::Up, true, |h| {
                said = Some(waiting_message(&root, h))
            })
            .await
            .unwrap();
            (w, said)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    // Now it listens: up gets a client.
    let path = socket_path(&root);
    let listener = bind(&path).unwrap();
    let cancel = CancellationToken::new();
    let server = tokio::spawn(serve(listener, Arc::new(fake(0, 0)), cancel.clone()));
    serve_lock.advertise_api(&path).unwrap();
    let (w, said) = waiting.await.unwrap();
    let said = said.unwrap();
    assert!(
        said.contains(&format!("berth serve (pid {})", std::process::id())),
        "{said}"
    );
    assert!(matches!(w, Writer::Serve { ref holder, .. } if holder.role == Role::Serve));
    // `down` does not delegate: it waits until serve lets go.
    let down = tokio::spawn({
        let root = root.clone();
        async move { writer(&root, Role::Down, false, |_| {}).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!down.is_finished());
    drop(serve_lock);
    assert!(matches!(down.await.unwrap(), Writer::Locked(_)));
    cancel.cancel();
    server.await.unwrap().unwrap();
}
