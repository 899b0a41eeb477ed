//! The `up` side of the local API.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::{ApplyRequest, Message, Outcome, ServeInfo};
use crate::core::progress::Event;

/// How long connecting and a short request (info) may take.
const SHORT: Duration = Duration::from_secs(5);

/// A connection target: serve's socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: &Path) -> Client {
        Client {
            socket: socket.to_path_buf(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let stream = tokio::time::timeout(SHORT, UnixStream::connect(&self.socket))
            .await
            .map_err(|_| anyhow!("no answer within {SHORT:?}"))
            .and_then(|r| r.map_err(anyhow::Error::from))
            .with_context(|| {
                format!(
                    "cannot reach berth serve's local API at {}",
                    self.socket.display()
                )
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("local API handshake")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.send_request(req).await.context("local API request")
    }

    /// What the serve behind the socket says about itself.
    pub async fn info(&self) -> Result<ServeInfo> {
        let req = Request::builder()
            .method(Method::GET)
            .uri("/v1/info")
            .header(hyper::header::HOST, "berth")
            .body(Full::new(Bytes::new()))?;
        let resp = tokio::time::timeout(SHORT, async {
            let resp = self.send(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, anyhow::Error>((status, body))
        })
        .await
        .map_err(|_| anyhow!("berth serve did not answer /v1/info within {SHORT:?}"))??;
        if resp.0 != StatusCode::OK {
            bail!("berth serve answered {}: {}", resp.0, error_text(&resp.1));
        }
        serde_json::from_slice(&resp.1).context("berth serve's /v1/info")
    }

    /// Asks serve to carry out `request`, handing each progress event to `on_event` as it
    /// comes, and returns the outcome serve reports. An error means the request could not be
    /// made or serve stopped before it ended: nothing is known about the outcome.
    pub async fn apply(
        &self,
        request: &ApplyRequest,
        mut on_event: impl FnMut(Event),
    ) -> Result<Outcome> {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/v1/apply")
            .header(hyper::header::HOST, "berth")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(request)?)))?;
        let resp = self.send(req).await?;
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            bail!(
                "berth serve refused the request ({status}): {}",
                error_text(&body)
            );
        }
        let mut body = resp.into_body();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.context("berth serve stopped answering")?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                match serde_json::from_slice::<Message>(&line) {
                    Ok(Message::Event(e)) => on_event(e),
                    Ok(Message::Done(outcome)) => return Ok(outcome),
                    Err(e) => tracing::warn!("local API: unreadable line ({e})"),
                }
            }
        }
        bail!(
            "berth serve ended the stream before the pass was done (did it stop?); \
             `berth status` shows where the proxies are"
        )
    }
}

fn error_text(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string())
}
