//! One row per replica, as an implementation of the seam reports it (`Infrastructure::status`);
//! `status` shows the rows.

use serde::Serialize;

use crate::engine::RunState;

/// One replica as it runs now.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaStatus {
    pub proxy: String,
    pub slot: Option<u32>,
    pub container: String,
    /// The Swarm node running it (a Swarm task); None on one Docker host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Envoy's node id (`--service-node`) when it is not the container's name: a Swarm task's
    /// own (`<service>.<slot>.<task id>`), given by the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_node: Option<String>,
    pub state: RunState,
    /// Ready by the one probe ([`crate::envoy::readiness`]): LIVE and every listener port bound.
    pub ready: bool,
    /// Envoy's own `/ready` answer (LIVE, DRAINING, …), or "-" when it cannot answer.
    pub envoy: String,
    /// Why it is not ready, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub image: String,
    pub spec: String,
    pub uptime_seconds: Option<u64>,
    pub connections: Option<u64>,
    /// The config generation this replica has accepted (the `version_info` of its watched
    /// files, which `berth serve` stamps), when it reports one.
    pub observed_generation: Option<u64>,
    /// xDS mode: the config version it accepted from the xDS server and the updates it
    /// rejected, from its own stats ([`crate::envoy::xds`]); None in standalone mode or when its admin
    /// does not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xds: Option<crate::envoy::xds::XdsConfig>,
}
