//! berth runs Envoy proxy fleets as Docker containers on hosts without Kubernetes.
//!
//! The tree is in layers, each a folder whose opening comment says what it holds and what it
//! may use (tests/layers.rs keeps those rules):
//!
//! - [`core`]: pure data and decisions: the IR, the sources that produce it (berth.toml, Envoy
//!   Gateway IR), rendering, one proxy's desired state (target, replica spec and hash), the plan.
//! - [`envoy`]: talking to one replica's Envoy: the admin client over its Unix socket, the one
//!   readiness probe, the drain sequence, reading its log.
//! - [`host`]: kernel settings a fleet needs and preflight. [`state`]: the state directory and
//!   its one-writer lock.
//! - [`engine`]: the container-engine seam and its adapters (the only bollard user).
//! - [`infra`]: the infrastructure seam and its implementations (one Docker host, Swarm), and
//!   delivery of watched files to running replicas.
//! - [`ops`]: the use cases (`up`, `down`, `validate`, ...; ACME issuance), over the seam.
//! - [`status`]: what runs now (rows, records, metrics).
//! - [`edges`]: the fronts: the CLI, `berth serve`, its control API, Envoy Gateway's remote
//!   provider, and `berth agent` (a Swarm replica's entrypoint).

pub mod core;
pub mod edges;
pub mod engine;
pub mod envoy;
pub mod host;
pub mod infra;
pub mod ops;
pub mod state;
pub mod status;
