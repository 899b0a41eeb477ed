//! berth runs Envoy proxy fleets as Docker containers on hosts without Kubernetes.
//!
//! Data flows one way, each stage a module:
//! [`source`] (berth.toml, Envoy Gateway IR) → [`ir`] → [`render`] (bootstrap and watched
//! files) → [`target`] (one proxy's desired state: IR, rendered files, [`replica`] spec and
//! hash) → [`plan`] (pure: desired vs observed → actions).
//! [`engine`] is the only module that talks to the container engine; [`admin`] is the client
//! for a replica's Envoy admin API over its Unix socket; [`delivery`] puts new watched files in
//! front of running replicas and waits for each to confirm them.
//! [`serve`] is the long-running manager; [`eg_provider`] is Envoy Gateway's remote
//! infrastructure service; [`status`] is what runs now; [`cli`] is the thin front.
//! [`lock`] keeps one writer per state directory; [`control`] is serve's local API, to which
//! `up` hands its request while serve holds the lock; [`exit`] says how a command ends (exit
//! code and text), the same whether it ran locally or in serve. [`acme`] obtains and renews
//! listener certificates from an ACME CA, answering its challenges through the proxy itself.
//! [`agent`] is `berth agent`, the entrypoint of replicas that an orchestrator stops (Swarm):
//! it drains its Envoy with the sequence in [`drain`], which berth itself uses on one host.

pub mod acme;
pub mod admin;
pub mod agent;
pub mod backend_tls;
pub mod certificates;
pub mod cli;
pub mod control;
pub mod crashpoint;
pub mod delivery;
pub mod drain;
pub mod eg_provider;
pub mod engine;
pub mod envoy_log;
pub mod exit;
pub mod host;
pub mod infrastructure;
pub mod ir;
pub mod layout;
pub mod lock;
pub mod logs;
pub mod metrics;
pub mod operations;
pub mod plan;
pub mod preflight;
pub mod progress;
pub mod readiness;
pub mod render;
pub mod replica;
pub mod rollout;
pub mod rollout_files;
pub mod serve;
pub mod source;
pub mod state;
pub mod status;
pub mod target;
pub mod traffic;
