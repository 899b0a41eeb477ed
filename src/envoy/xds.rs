//! xDS mode: what one replica's own stats say about the config its xDS server (Envoy Gateway)
//! sent it. EG never surfaces a NACK, so this is where a rejected update shows.

use std::collections::BTreeSet;
use std::fmt;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::envoy::admin::AdminApi;

/// The replica's config from its xDS server, by its admin `/stats`.
///
/// Field names are single words, so `berth status` (snake_case) and serve's `/status`
/// (camelCase) show them alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct XdsConfig {
    /// `control_plane.connected_state`: its ADS stream to the xDS server is up now.
    pub connected: bool,
    /// `listener_manager.lds.version_text`: the listener version it accepted last ("" before
    /// any).
    pub listeners: String,
    /// `cluster_manager.cds.version_text`: the cluster version it accepted last.
    pub clusters: String,
    /// `update_rejected` over LDS, CDS and every RDS subscription: the updates it refused
    /// (each one a NACK) since it started.
    pub rejected: u64,
    /// The subscriptions that refused an update (`listener_manager.lds`,
    /// `cluster_manager.cds`, `http.<prefix>.rds.<route config>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejecting: Vec<String>,
}

const FILTER: &str = r"^(control_plane\.connected_state|(listener_manager\.lds|cluster_manager\.cds|http\..*\.rds\..*)\.(version_text|update_rejected))$";

/// Reads it from the replica's admin API.
pub async fn read(admin: &dyn AdminApi) -> Result<XdsConfig> {
    let (status, body) = admin
        .get(&format!(
            "/stats?format=json&filter={}",
            crate::envoy::admin::percent_encode(FILTER)
        ))
        .await?;
    if status != 200 {
        bail!("GET /stats answered {status}: {}", body.trim());
    }
    let json: serde_json::Value = serde_json::from_str(&body).context("/stats is not JSON")?;
    Ok(parse(&json))
}

/// Parses `/stats?format=json` (filtered as [`read`] filters it).
pub fn parse(json: &serde_json::Value) -> XdsConfig {
    let mut out = XdsConfig::default();
    let mut by = BTreeSet::new();
    let stats = json.get("stats").and_then(|s| s.as_array());
    for s in stats.into_iter().flatten() {
        let (Some(name), Some(value)) = (s.get("name").and_then(|n| n.as_str()), s.get("value"))
        else {
            continue;
        };
        let text = || value.as_str().unwrap_or_default().to_string();
        match name {
            "control_plane.connected_state" => out.connected = value.as_u64() == Some(1),
            "listener_manager.lds.version_text" => out.listeners = text(),
            "cluster_manager.cds.version_text" => out.clusters = text(),
            _ => {
                if let Some(sub) = name.strip_suffix(".update_rejected") {
                    let n = value.as_u64().unwrap_or(0);
                    out.rejected += n;
                    if n > 0 {
                        by.insert(sub.to_string());
                    }
                }
            }
        }
    }
    out.rejecting = by.into_iter().collect();
    out
}

impl fmt::Display for XdsConfig {
    /// Short, for the status table: `v3`, `lds v3/cds v2`, `v3, 1 rejected`, `disconnected`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or_dash = |v: &str| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.to_string()
            }
        };
        if self.listeners == self.clusters {
            f.write_str(&or_dash(&self.listeners))?;
        } else {
            write!(
                f,
                "lds {}/cds {}",
                or_dash(&self.listeners),
                or_dash(&self.clusters)
            )?;
        }
        if self.rejected > 0 {
            write!(f, ", {} rejected", self.rejected)?;
        }
        if !self.connected {
            f.write_str(", disconnected")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_versions_rejections_and_the_connection() {
        let json = serde_json::json!({"stats": [
            {"name": "cluster_manager.cds.update_rejected", "value": 2},
            {"name": "cluster_manager.cds.version_text", "value": "v1"},
            {"name": "control_plane.connected_state", "value": 1},
            {"name": "http.http-10080.rds.default/eg/http.update_rejected", "value": 0},
            {"name": "listener_manager.lds.update_rejected", "value": 0},
            {"name": "listener_manager.lds.version_text", "value": "v2"},
        ]});
        let x = parse(&json);
        assert_eq!(
            x,
            XdsConfig {
                connected: true,
                listeners: "v2".into(),
                clusters: "v1".into(),
                rejected: 2,
                rejecting: vec!["cluster_manager.cds".into()],
            }
        );
        assert_eq!(x.to_string(), "lds v2/cds v1, 2 rejected");
    }

    #[test]
    fn nothing_yet_and_disconnected() {
        let x = parse(&serde_json::json!({"stats": [
            {"name": "control_plane.connected_state", "value": 0},
        ]}));
        assert_eq!(x.to_string(), "-, disconnected");
        let ok = parse(&serde_json::json!({"stats": [
            {"name": "control_plane.connected_state", "value": 1},
            {"name": "cluster_manager.cds.version_text", "value": "7"},
            {"name": "listener_manager.lds.version_text", "value": "7"},
        ]}));
        assert_eq!(ok.to_string(), "7");
    }
}
