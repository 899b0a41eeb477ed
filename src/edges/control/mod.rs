//! serve's local API: how `berth up` hands its request to the `berth serve` that holds the
//! state directory ([`crate::state::lock`]) instead of racing it.
//!
//! HTTP/1.1 over a Unix socket (mode 0600) that serve advertises in the lock record:
//!
//! - `GET /v1/info` → [`ServeInfo`];
//! - `POST /v1/apply` with an [`ApplyRequest`] → a stream of JSON lines, each a [`Message`]:
//!   the progress events of the pass serve runs for the request, as `up` would print them,
//!   then exactly one `done` with the [`Outcome`] (error and exit code, as `up`'s own).
//!
//! The pass belongs to serve once asked for: a client that goes away (Ctrl-C on `up`) stops
//! watching, not the pass.

mod client;
mod server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub use client::Client;
pub use server::{bind, serve, Handler};

use crate::core::progress::Event;
use crate::state::lock::{Attempt, Holder, Role, StateLock};

/// The socket's file name in the state directory.
pub const SOCKET_FILE: &str = "serve.sock";

/// A Unix socket path must fit `sun_path` (108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 100;

/// Where serve puts its socket for the state directory at `root`: in the directory itself, or
/// (when that path is too long for a Unix socket) in the temp directory under a name derived
/// from the state directory's path. Clients find it in the lock record, not by this function.
pub fn socket_path(root: &Path) -> PathBuf {
    let inside = root.join(SOCKET_FILE);
    if inside.as_os_str().len() <= MAX_SOCKET_PATH {
        return inside;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
    std::env::temp_dir().join(format!("berth-serve-{}.sock", &hex::encode(digest)[..16]))
}

/// How a command that changes the state directory gets to: it holds the lock itself, or the
/// serve that holds it takes the request.
#[derive(Debug)]
pub enum Writer {
    Locked(StateLock),
    Serve { holder: Holder, client: Client },
}

/// Takes the state directory's lock for `role`; when a serve holds it and `delegate`, returns
/// that serve's client instead. Otherwise waits for the holder to let go, calling `on_wait`
/// once with it (to tell the user whom berth waits for: [`waiting_message`]).
pub async fn writer(
    root: &Path,
    role: Role,
    delegate: bool,
    on_wait: impl FnOnce(Option<&Holder>),
) -> Result<Writer> {
    let mut on_wait = Some(on_wait);
    loop {
        let holder = match StateLock::try_acquire(root, role)? {
            Attempt::Locked(lock) => return Ok(Writer::Locked(lock)),
            Attempt::Held(holder) => holder,
        };
        if let Some(h) = holder
            .as_ref()
            .filter(|h| delegate && h.role == Role::Serve)
        {
            if let Some(api) = &h.api {
                let client = Client::new(api);
                // A serve that is starting or stopping may not answer: then wait.
                if client.info().await.is_ok() {
                    return Ok(Writer::Serve {
                        holder: h.clone(),
                        client,
                    });
                }
            }
        }
        if let Some(f) = on_wait.take() {
            f(holder.as_ref());
        }
        tokio::time::sleep(WAIT_RETRY).await;
    }
}

/// How often [`writer`] looks again.
const WAIT_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// What a waiting command tells the user.
pub fn waiting_message(root: &Path, holder: Option<&Holder>) -> String {
    let who = holder.map_or_else(|| "another berth process".to_string(), Holder::to_string);
    let until = match holder.map(|h| h.role) {
        Some(Role::Serve) => "until it stops",
        _ => "for it to finish",
    };
    format!(
        "{who} is changing the state directory {}; waiting {until} (Ctrl-C stops waiting, \
         and changes nothing)",
        root.display()
    )
}

/// What a running serve says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeInfo {
    pub pid: u32,
    pub version: String,
    /// The config file serve manages the state directory from.
    pub config: PathBuf,
    pub state_dir: PathBuf,
}

/// What `up` (or `down`) asks of serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyRequest {
    pub verb: Verb,
    /// The config file the caller was given (absolute). serve applies only its own config:
    /// any other is refused with a message saying so.
    pub config: PathBuf,
    /// The caller's `--force` (preflight's memory check).
    #[serde(default)]
    pub force: bool,
    /// Labels the caller would put on the containers it creates; serve refuses a request
    /// whose labels differ from its own rather than ignoring them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// Re-read the config and converge every proxy once.
    Up,
}

/// How a request ended: what `up` itself would have printed as its error, and its exit code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The engine requests serve made while the request ran (`up --output json`'s summary;
    /// other work of serve's in that time counts too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_requests: Option<u64>,
    /// Lines `up` prints on stderr beside its verdict ("warning: …", "note: …").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Outcome {
    pub fn ok() -> Outcome {
        Outcome {
            exit_code: 0,
            error: None,
            api_requests: None,
            notes: Vec::new(),
        }
    }

    pub fn failed(exit_code: i32, error: impl Into<String>) -> Outcome {
        Outcome {
            exit_code,
            error: Some(error.into()),
            api_requests: None,
            notes: Vec::new(),
        }
    }
}

/// One line of an apply stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Message {
    Event(Event),
    Done(Outcome),
}

#[cfg(test)]
mod tests;
