//! The serve side of the local API.

use std::convert::Infallible;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ApplyRequest, Message, Outcome, ServeInfo};
use crate::core::progress::Event;

/// The largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// What serve does for the local API.
pub trait Handler: Send + Sync + 'static {
    fn info(&self) -> ServeInfo;

    /// Carries out `req`, sending the progress events of the work as they happen, and returns
    /// how it ended. Runs to the end even when the client goes away.
    fn apply(
        &self,
        req: ApplyRequest,
        events: mpsc::UnboundedSender<Event>,
    ) -> impl Future<Output = Outcome> + Send;
}

/// Binds the socket at `path` (mode 0600), replacing a socket file a previous serve left.
/// Call it only while holding the state directory's lock: the file it replaces can then only
/// be a dead serve's.
pub fn bind(path: &Path) -> Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove the old socket {}", path.display()))?;
        }
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; berth serve will not replace it",
            path.display()
        ),
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot set mode 0600 on {}", path.display()))?;
    Ok(listener)
}

/// Answers the local API on `listener` until `cancel`; then removes the socket file.
pub async fn serve<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
    cancel: CancellationToken,
) -> Result<()> {
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf));
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("local API: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handle(handler, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = cancel.cancelled() => {}
            }
        });
    }
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn reply(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed_unsync())
        .expect("static response parts")
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    reply(
        status,
        serde_json::json!({ "error": message.to_string() }).to_string() + "\n",
    )
}

async fn handle<H: Handler>(
    handler: Arc<H>,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/v1/info") => reply(
            StatusCode::OK,
            serde_json::to_string(&handler.info()).unwrap_or_default() + "\n",
        ),
        (&Method::POST, "/v1/apply") => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return error(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
            };
            match serde_json::from_slice::<ApplyRequest>(&body) {
                Ok(apply) => stream_apply(handler, apply),
                Err(e) => error(
                    StatusCode::BAD_REQUEST,
                    format!("not an apply request: {e}"),
                ),
            }
        }
        (_, "/v1/info" | "/v1/apply") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /v1/info, POST /v1/apply",
        ),
        _ => error(StatusCode::NOT_FOUND, "try GET /v1/info or POST /v1/apply"),
    }
}

/// Runs the request in its own task and streams its events, then its outcome, as JSON lines.
fn stream_apply<H: Handler>(handler: Arc<H>, req: ApplyRequest) -> Response<Body> {
    let (lines_tx, lines_rx) = mpsc::unbounded_channel::<Bytes>();
    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<Event>();
    let line = |m: &Message| {
        let mut v = serde_json::to_vec(m).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    };
    let mut work = tokio::spawn(async move { handler.apply(req, events_tx).await });
    tokio::spawn(async move {
        let joined = loop {
            tokio::select! {
                biased;
                Some(event) = events_rx.recv() => {
                    let _ = lines_tx.send(line(&Message::Event(event)));
                }
                joined = &mut work => break joined,
            }
        };
        while let Ok(event) = events_rx.try_recv() {
            let _ = lines_tx.send(line(&Message::Event(event)));
        }
        let outcome = joined.unwrap_or_else(|e| {
            Outcome::failed(
                1,
                format!("berth serve failed while applying the request: {e}"),
            )
        });
        let _ = lines_tx.send(line(&Message::Done(outcome)));
    });
    let frames = futures_util::stream::unfold(lines_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
        .body(BodyExt::boxed_unsync(StreamBody::new(frames)))
        .expect("static response parts")
}
