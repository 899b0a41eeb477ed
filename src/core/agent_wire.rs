//! The agent channel's messages and gRPC service, generated from `proto/berth/agent.proto`
//! (package `berth.agent.v1`): what the manager and the agents in Swarm tasks say to each other.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("berth.agent.v1");
}

pub use pb::*;
