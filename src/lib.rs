//! berth runs Envoy proxy fleets as Docker containers on hosts without Kubernetes.
//!
//! Data flows one way, each stage a module:
//! [`source`] (TOML, EG IR) → [`ir`] → [`render`] (bootstrap and xDS files) → [`spec`]
//! (what each replica container must be) → [`plan`] (pure: desired vs observed → actions).
//! [`docker`] is the only module that talks to the engine; [`admin`] is the client for a
//! replica's Envoy admin API over its Unix socket.
//! [`cli`] is the thin front.

pub mod admin;
pub mod cli;
pub mod crashpoint;
pub mod desired;
pub mod docker;
pub mod host;
pub mod ir;
pub mod layout;
pub mod live;
pub mod metrics;
pub mod plan;
pub mod preflight;
pub mod progress;
pub mod remote;
pub mod render;
pub mod rollout;
pub mod runner;
pub mod source;
pub mod spec;
pub mod state;
pub mod status;
