//! Raw HTTP over the engine's Unix socket, for Podman's `stopped` state, a word the Engine API
//! (and bollard's typed answers) does not have: read as `exited`.

use super::*;

impl DockerEngine {
    /// Podman's inspect of a container that exited and whose cleanup (or restart by policy) is
    /// still pending says `State.Status: "stopped"`, a word of Podman's own that the Engine API
    /// (and bollard's typed answer) does not have. Read the answer raw, as "exited".
    pub(super) async fn inspect_stopped(
        &self,
        id: &str,
        typed: BollardError,
    ) -> EngineResult<Option<ContainerInspectResponse>> {
        let Some(socket) = self.endpoint.strip_prefix("unix://") else {
            return Err(self.refused(format!("inspect container {id}"), typed).await);
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        let path = format!("/v{}/containers/{id}/json", self.api_version());
        let refused = |message: String| EngineError::Refused {
            engine: self.describe(),
            operation: format!("inspect container {id}"),
            status: 0,
            message,
        };
        let (status, body) = crate::envoy::admin::Admin::new(socket)
            .with_timeout(REQUEST_TIMEOUT)
            .get(&path)
            .await
            .map_err(|e| refused(format!("{e:#}")))?;
        match status {
            404 => return Ok(None),
            200 => {}
            _ => return Err(refused(format!("HTTP {status}: {}", body.trim()))),
        }
        let mut value: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| refused(e.to_string()))?;
        if let Some(state) = value.pointer_mut("/State/Status") {
            if state == "stopped" {
                *state = "exited".into();
            }
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| refused(e.to_string()))
    }

    /// Podman lists a container that exited and awaits its cleanup as `State: "stopped"`
    /// (see [`DockerEngine::inspect_stopped`]); read the list raw, with those as "exited".
    pub(super) async fn list_with_stopped(
        &self,
        filters: &HashMap<&str, Vec<&str>>,
        typed: BollardError,
    ) -> EngineResult<Vec<bollard::models::ContainerSummary>> {
        let Some(socket) = self.endpoint.strip_prefix("unix://") else {
            return Err(self.refused("list containers", typed).await);
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        let refused = |message: String| EngineError::Refused {
            engine: self.describe(),
            operation: "list containers".into(),
            status: 0,
            message,
        };
        let filters = serde_json::to_string(filters).map_err(|e| refused(e.to_string()))?;
        let path = format!(
            "/v{}/containers/json?all=1&filters={}",
            self.api_version(),
            crate::envoy::admin::percent_encode(&filters)
        );
        let (status, body) = crate::envoy::admin::Admin::new(socket)
            .with_timeout(REQUEST_TIMEOUT)
            .get(&path)
            .await
            .map_err(|e| refused(format!("{e:#}")))?;
        if status != 200 {
            return Err(refused(format!("HTTP {status}: {}", body.trim())));
        }
        let mut value: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| refused(e.to_string()))?;
        for container in value.as_array_mut().into_iter().flatten() {
            if let Some(state) = container.get_mut("State") {
                if state == "stopped" {
                    *state = "exited".into();
                }
            }
        }
        serde_json::from_value(value).map_err(|e| refused(e.to_string()))
    }
}
