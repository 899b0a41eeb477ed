//! What one agent command works with, resolved once from flags and the environment
//! (`cli::agent` parses them; [`super::service_env`] is the environment a service sets).

use std::path::{Path, PathBuf};

use crate::core::ir::Shutdown;
use crate::envoy::readiness::Expect;

/// The file, beside the admin socket, where `berth agent health` leaves its last verdict.
pub const HEALTH_FILE: &str = "agent-health.json";

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Envoy's admin socket (the bootstrap's `admin.address.pipe.path`).
    pub admin_socket: PathBuf,
    /// What a ready Envoy shows: LIVE and these listener ports bound.
    pub expect: Expect,
    /// The drain on the stop signal.
    pub shutdown: Shutdown,
    /// The version of the config the replica was given (e.g. berth's spec hash), reported by
    /// `health`.
    pub config_version: Option<String>,
}

impl Settings {
    /// Where `health` writes its verdict: beside the admin socket, in the replica's run
    /// directory (writable even with a read-only root filesystem).
    pub fn health_file(&self) -> PathBuf {
        self.admin_socket
            .parent()
            .unwrap_or(Path::new("."))
            .join(HEALTH_FILE)
    }
}
