//! Config kinds and policies that several layers read: which infrastructure the config asks
//! for ([`EngineKind`], [`SwarmSettings`], parsed by `source`, acted on by `infra`) and how an
//! entry point wants the host treated ([`HostPolicy`], given by the edges, applied by `infra`).

use serde::Serialize;

/// Which infrastructure the config asks for (`engine` at the top of berth.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// berth rolls containers on the Docker host behind `DOCKER_HOST` (or the local socket).
    #[default]
    Docker,
    /// A Swarm service per proxy, on the Swarm whose manager is that engine.
    Swarm,
}

/// The top-level `[swarm]` of berth.toml: what every proxy on a Swarm shares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SwarmSettings {
    /// `registry = "host[:port][/path]"`: where berth pushes the derived agent image so every
    /// node can pull it (required on a Swarm of more than one node).
    pub registry: Option<String>,
}

/// How an entry point wants the host treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPolicy {
    /// `tune_host`: berth may change host settings (as root).
    pub tune: bool,
    /// Start even when the fleet's memory limits exceed the host's memory.
    pub force_memory: bool,
}

impl Default for HostPolicy {
    fn default() -> Self {
        HostPolicy {
            tune: true,
            force_memory: false,
        }
    }
}
