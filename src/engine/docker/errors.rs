//! Error classification: the engine's refusals said to be the engine's, not-found and
//! connection failures told apart.

use super::*;

impl DockerEngine {
    /// The engine's error, said to be the engine's.
    pub async fn refused(&self, operation: impl Into<String>, e: BollardError) -> EngineError {
        let operation = operation.into();
        let (status, message) = match e {
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => (status_code, message),
            BollardError::DockerStreamError { error } => (0, error),
            BollardError::DockerContainerWaitError { error, code } => {
                (0, format!("{error} (exit code {code})"))
            }
            other if is_connection_error(&other) => {
                return EngineError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    message: other.to_string(),
                }
            }
            other => (0, other.to_string()),
        };
        // Podman answers a name in use with 500 ("… is already in use"); Docker with 409.
        let status = if status == 500 && message.contains("is already in use") {
            409
        } else {
            status
        };
        EngineError::Refused {
            engine: self.describe(),
            operation,
            status,
            message,
        }
    }
}

pub(super) fn is_not_found(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// A failure to reach the engine at all, as opposed to an answer from it.
pub(super) fn is_connection_error(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::HyperResponseError { .. }
            | BollardError::IOError { .. }
            | BollardError::RequestTimeoutError
            | BollardError::SocketNotFoundError(_)
    )
}
