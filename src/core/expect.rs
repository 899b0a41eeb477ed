//! What the one readiness probe ([`crate::envoy::readiness`]) must see of a proxy's replica: a
//! part of the proxy's desired state, so it lives with it.

use serde::Serialize;

/// What a ready replica of a proxy must show.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Expect {
    /// Every listener port the proxy declares (standalone: berth's listeners; xDS mode: the
    /// ports of the IR's listeners, which Envoy Gateway pushes).
    pub ports: Vec<u16>,
    /// The address a port must be bound on, where it is not 0.0.0.0.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub addresses: std::collections::BTreeMap<u16, std::net::IpAddr>,
}
