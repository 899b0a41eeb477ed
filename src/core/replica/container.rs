//! The container a replica is, in engine-neutral terms: what to create ([`ReplicaContainer`],
//! hardening, mounts, network) and what an engine reports of one ([`ObservedContainer`],
//! [`RunState`]). Part of the replica's spec, so it lives in the core; the engine adapters
//! translate it to and from their API.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A bind mount of a host path into a container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// A numeric user and group a container's process runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

/// The network a container joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// The host's network namespace (replicas share ports through SO_REUSEPORT).
    Host,
    /// No network at all (validation containers).
    None,
}

/// What a container is confined to. Every field is explicit: the adapters add nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hardening {
    pub user: User,
    pub read_only_rootfs: bool,
    /// Drop every capability, then add `cap_add`.
    pub cap_drop_all: bool,
    pub cap_add: Vec<String>,
    pub no_new_privileges: bool,
}

/// Restart policy names as the Engine API spells them.
pub const RESTART_UNLESS_STOPPED: &str = "unless-stopped";
pub const RESTART_NO: &str = "no";

/// One container to create, fully described.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaContainer {
    pub name: String,
    pub slot: u32,
    pub image: String,
    /// Arguments after the image's entrypoint.
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    pub mounts: Vec<Mount>,
    pub labels: BTreeMap<String, String>,
    pub hardening: Hardening,
    pub network: Network,
    /// "unless-stopped" for replicas ([`RESTART_UNLESS_STOPPED`]).
    pub restart_policy: String,
}

/// The engine's view of one container, as list and inspect show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservedContainer {
    pub id: String,
    /// The live name, without Docker's leading '/'.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub state: RunState,
    pub live: LiveSettings,
    /// What the engine reports beyond what the planner needs, for status and preflight.
    #[serde(default)]
    pub info: ContainerInfo,
}

/// Facts about a container that the planner does not use.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// The image reference the container was created from.
    pub image: String,
    /// The main process on the host, while running.
    pub pid: Option<u32>,
    /// RFC 3339 start time, while running.
    pub started_at: Option<String>,
}

/// Settings someone can change on a live container (`docker update`, `docker rename`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveSettings {
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    /// The engine's restart policy name, e.g. "unless-stopped".
    pub restart_policy: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Created,
    Running,
    Paused,
    Restarting,
    Exited,
    Dead,
    Removing,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Created => "created",
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Restarting => "restarting",
            RunState::Exited => "exited",
            RunState::Dead => "dead",
            RunState::Removing => "removing",
        }
    }

    /// Parses the engine's `State.Status` ("running", "exited", …).
    pub fn parse(status: &str) -> Option<RunState> {
        Some(match status {
            "created" | "configured" | "initialized" => RunState::Created,
            "running" | "stopping" => RunState::Running,
            "paused" => RunState::Paused,
            "restarting" => RunState::Restarting,
            "exited" | "stopped" => RunState::Exited,
            "dead" => RunState::Dead,
            "removing" => RunState::Removing,
            _ => return None,
        })
    }

    /// Not running and `start` can start it again (Created or Exited; not Dead).
    pub fn is_startable(self) -> bool {
        matches!(self, RunState::Created | RunState::Exited)
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
