//! What each replica container of a proxy must be: pure data derived from the IR and the
//! rendered files, and the spec hash that says when a container must be replaced.
//!
//! A [`ProxySpec`] is shared by every replica of a proxy; its hash covers everything that needs
//! a new container (image, args, env, resources, bootstrap content, mounts, ports) and not the
//! replica count. The few per-replica parts (container name, `--service-node`, admin socket
//! directory) come from [`ReplicaContainer::new`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Marks every container berth manages; berth never touches a container without it.
pub const LABEL_MANAGED_BY: &str = "io.berth.managed-by";
pub const MANAGED_BY_VALUE: &str = "berth";
pub const LABEL_PROXY: &str = "io.berth.proxy";
pub const LABEL_SLOT: &str = "io.berth.slot";
pub const LABEL_SPEC_HASH: &str = "io.berth.spec-hash";
pub const LABEL_IMAGE_ID: &str = "io.berth.image-id";
/// The name berth gave the container; a different live name is drift.
pub const LABEL_NAME: &str = "io.berth.name";
/// Set on everything the test suite creates, so it can clean up by label.
pub const LABEL_TEST: &str = "io.berth.test";

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// Everything that requires a new container when it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxySpec {
    pub proxy: String,
    pub image: String,
    /// Envoy's arguments after the entrypoint, without the per-replica `--service-node`.
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// 1e9 = one CPU.
    pub nano_cpus: Option<i64>,
    /// Bytes.
    pub memory: Option<i64>,
    /// Mounts shared by all replicas (bootstrap generation, watched xDS directory, TLS files).
    pub mounts: Vec<Mount>,
    pub ports: Vec<u16>,
    /// Capabilities added after dropping ALL: NET_BIND_SERVICE when a port is below 1024.
    pub cap_add: Vec<String>,
    /// sha256 of the rendered bootstrap.
    pub bootstrap_sha256: String,
    /// The user's metadata labels, copied onto each container.
    pub labels: BTreeMap<String, String>,
}

/// A proxy as it should be: its spec, that spec's hash, and how many replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesiredProxy {
    pub spec: ProxySpec,
    pub hash: String,
    pub replicas: u32,
}

/// One replica container, ready to hand to the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaContainer {
    pub name: String,
    pub slot: u32,
    pub image: String,
    /// Full Envoy arguments, including `--service-node <name>`.
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    /// Shared mounts plus this replica's own admin socket directory.
    pub mounts: Vec<Mount>,
    pub cap_add: Vec<String>,
    /// berth's labels (managed-by, proxy, slot, spec hash, image ID, name) and the user's.
    pub labels: BTreeMap<String, String>,
}

/// The engine's view of one berth container, as list and inspect show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservedContainer {
    pub id: String,
    /// The live name, without Docker's leading '/'.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub state: RunState,
    pub live: LiveSettings,
}

impl ObservedContainer {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    pub fn is_managed(&self) -> bool {
        self.label(LABEL_MANAGED_BY) == Some(MANAGED_BY_VALUE)
    }

    pub fn proxy(&self) -> Option<&str> {
        self.label(LABEL_PROXY)
    }

    pub fn slot(&self) -> Option<u32> {
        self.label(LABEL_SLOT).and_then(|s| s.parse().ok())
    }

    pub fn spec_hash(&self) -> Option<&str> {
        self.label(LABEL_SPEC_HASH)
    }
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

/// Settings someone can change on a live container (`docker update`, `docker rename`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveSettings {
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    /// Docker's restart policy name, e.g. "unless-stopped".
    pub restart_policy: String,
}

/// The restart policy every replica has (DESIGN decision 8).
pub const RESTART_POLICY: &str = "unless-stopped";
