//! `berth agent`: the replica's entrypoint where berth cannot drain replicas itself (Swarm: the
//! orchestrator stops tasks with a signal). It runs inside the container, as the parent of
//! Envoy:
//!
//! - [`run`]: starts Envoy as its child; on SIGTERM/SIGINT drains it with the sequence berth
//!   uses on one host ([`crate::envoy::drain`]), then stops it and exits with its status;
//! - [`liveness`]: every second, judges whether Envoy still serves; kills it when it hangs
//!   (stopped by a signal, or silent while it uses no CPU), so that Swarm replaces the task;
//! - [`health`]: Docker's HEALTHCHECK, the one readiness probe ([`crate::envoy::readiness`]), plus the
//!   config version Envoy accepted, on one line that Docker keeps in `State.Health.Log`;
//! - `infra::swarm::agent_image`: the derived image (the configured Envoy image plus the static agent binary,
//!   found by `infra::swarm::agent_binary`), built through the engine seam.
//!
//! Settings ([`settings`]) come from the environment a service sets ([`service_env`]), flags
//! overriding, so the image's HEALTHCHECK needs no arguments.

pub mod channel;
pub mod envoy_log;
pub mod health;
pub mod liveness;
pub mod run;
pub mod settings;

pub use crate::core::agent::*;
