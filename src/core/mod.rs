//! The core: pure data and decisions, no I/O beyond reading the files a config names.
//! [`source`] (berth.toml, Envoy Gateway IR) → [`ir`] → [`render`] (bootstrap and watched
//! files) → [`target`] (one proxy's desired state: IR, rendered files, [`replica`] spec and
//! hash) → [`plan`] (desired vs observed → actions). [`layout`] says where files live,
//! [`certificates`] and [`backend_tls`] check TLS files, [`progress`] is how long work reports.
//!
//! May use: nothing else of berth. Every other layer may use it.

pub mod agent;
pub mod agent_wire;
pub mod backend_tls;
pub mod certificates;
pub mod crashpoint;
pub mod expect;
pub mod ir;
pub mod layout;
pub mod liveness;
pub mod plan;
pub mod policy;
pub mod progress;
pub mod render;
pub mod replica;
pub mod rollout;
pub mod source;
pub mod target;
