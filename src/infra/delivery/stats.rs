//! Reading a replica's subscriptions from its admin `/stats`: counters and accepted versions,
//! and the generation it has confirmed.

use super::*;

/// One subscription's counters and accepted version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubState {
    pub attempts: u64,
    /// update_rejected + update_failure.
    pub refused: u64,
    pub version: String,
}

/// Every xDS subscription's state on one replica, by stat prefix.
pub type Snapshot = BTreeMap<String, SubState>;

const SUB_FILTER: &str = r"^(listener_manager\.lds|cluster_manager\.cds|http\..*\.rds\..*|sds\..*)\.(version_text|update_attempt|update_rejected|update_failure)$";

/// Reads the subscriptions' counters and versions of one replica.
pub async fn snapshot(admin: &dyn AdminApi) -> Result<Snapshot> {
    let (status, body) = admin
        .get(&format!(
            "/stats?format=json&filter={}",
            crate::envoy::admin::percent_encode(SUB_FILTER)
        ))
        .await?;
    if status != 200 {
        anyhow::bail!("GET /stats answered {status}: {}", body.trim());
    }
    let json: serde_json::Value = serde_json::from_str(&body).context("/stats is not JSON")?;
    Ok(parse_snapshot(&json))
}

/// Parses `/stats?format=json` into subscription states.
pub fn parse_snapshot(json: &serde_json::Value) -> Snapshot {
    let mut out = Snapshot::new();
    let Some(stats) = json.get("stats").and_then(|s| s.as_array()) else {
        return out;
    };
    for s in stats {
        let Some(name) = s.get("name").and_then(|n| n.as_str()) else {
            continue;
        };
        let Some((prefix, stat)) = name.rsplit_once('.') else {
            continue;
        };
        let entry = out.entry(prefix.to_string()).or_default();
        let value = s.get("value");
        match stat {
            "version_text" => {
                entry.version = value.and_then(|v| v.as_str()).unwrap_or("").to_string()
            }
            "update_attempt" => entry.attempts = value.and_then(|v| v.as_u64()).unwrap_or(0),
            "update_rejected" | "update_failure" => {
                entry.refused += value.and_then(|v| v.as_u64()).unwrap_or(0)
            }
            _ => {}
        }
    }
    out
}

/// The generation a replica reports having accepted for `subs` (see [`confirmed_generation`]).
pub async fn observed_generation(admin: &dyn AdminApi, subs: &[String]) -> Option<u64> {
    let snap = snapshot(admin).await.ok()?;
    confirmed_generation(&snap, subs)
}

/// The generation a replica has confirmed: the version every listed subscription reports, when
/// they all report the same number.
pub fn confirmed_generation(snapshot: &Snapshot, subs: &[String]) -> Option<u64> {
    let mut versions = subs
        .iter()
        .map(|s| snapshot.get(s).map(|st| st.version.as_str()));
    let first = versions.next()??;
    if versions.all(|v| v == Some(first)) {
        first.parse().ok()
    } else {
        None
    }
}
