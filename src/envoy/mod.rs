//! Talking to one replica's Envoy: [`admin`] is the client for its admin API over its Unix
//! socket, [`readiness`] the one probe (LIVE and every listener bound), [`drain`] the sequence
//! that retires a replica without losing a request, [`log`] finds why a replica failed in its
//! log.
//!
//! May use: core. Knows no container engine: whoever runs Envoy (berth on one host, the agent
//! in a Swarm task) calls it.

pub mod admin;
pub mod drain;
pub mod log;
pub mod readiness;
pub mod traffic;
pub mod xds;
