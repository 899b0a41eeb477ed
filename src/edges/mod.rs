//! The fronts, each thin: [`cli`] (parse, resolve settings, call operations, print),
//! [`serve`] (the long-running manager), [`control`] (serve's local API, to which `up` hands
//! its request), [`eg_provider`] (Envoy Gateway's remote infrastructure service), [`agent`]
//! (`berth agent`, a Swarm replica's entrypoint), [`exit`] (how a command ends).
//!
//! May use: ops, status, envoy, state, host, core, and the infrastructure seam's own types
//! (`infra`'s mod.rs). Never the engine or an implementation (docker_host, swarm, delivery).

pub mod agent;
pub mod cli;
pub mod control;
pub mod eg_provider;
pub mod exit;
pub mod serve;
