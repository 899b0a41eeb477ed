//! `berth agent health`: Docker's HEALTHCHECK for a replica running the agent. Healthy (exit 0)
//! only when [`readiness::probe`] says ready: Envoy LIVE and every expected listener port bound
//! (one probe for berth and the agent alike, DESIGN decision 11).
//!
//! It prints one line, which Docker keeps in the container's `State.Health.Log` (and a Swarm
//! task's container alike), so status can tell which config each replica's Envoy runs without
//! reaching its admin socket:
//!
//! ```text
//! ready config=3f9a1c2b lds=7 cds=7
//! not-ready config=3f9a1c2b lds=- cds=- reason: Envoy is LIVE but not listening on port(s) 8080 …
//! ```
//!
//! `config` is the version the replica was given ([`super::ENV_CONFIG_VERSION`]); `lds` and
//! `cds` are the versions Envoy accepted (its `listener_manager.lds.version_text` and
//! `cluster_manager.cds.version_text`), `-` when it has none (static resources, xDS not yet
//! answered). The same verdict is written as JSON beside the admin socket
//! ([`Settings::health_file`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::settings::Settings;
use crate::envoy::admin::{percent_encode, Admin};
use crate::envoy::readiness::{self, Readiness, STATUS_TIMEOUT};

/// The stats naming the versions Envoy accepted.
const LDS_VERSION: &str = "listener_manager.lds.version_text";
const CDS_VERSION: &str = "cluster_manager.cds.version_text";

/// One health check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub ready: bool,
    /// Why not, when not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The config version the replica was given.
    pub config: Option<String>,
    /// The listener (LDS) version Envoy accepted.
    pub lds: Option<String>,
    /// The cluster (CDS) version Envoy accepted.
    pub cds: Option<String>,
}

impl Report {
    /// The one line Docker keeps (see the module docs).
    pub fn line(&self) -> String {
        let v = |v: &Option<String>| match v.as_deref() {
            Some(s) if !s.is_empty() => s.split_whitespace().collect::<Vec<_>>().join("_"),
            _ => "-".to_string(),
        };
        let versions = format!(
            "config={} lds={} cds={}",
            v(&self.config),
            v(&self.lds),
            v(&self.cds)
        );
        match (&self.ready, &self.reason) {
            (true, _) => format!("ready {versions}"),
            (false, reason) => format!(
                "not-ready {versions} reason: {}",
                reason.as_deref().unwrap_or("unknown").replace('\n', " ")
            ),
        }
    }

    /// Reads back a [`Report::line`] (e.g. from `State.Health.Log[].Output`); None when the
    /// text is not one.
    pub fn parse(text: &str) -> Option<Report> {
        let line = text.trim();
        let (ready, rest) = if let Some(rest) = line.strip_prefix("ready ") {
            (true, rest)
        } else {
            (false, line.strip_prefix("not-ready ")?)
        };
        let (versions, reason) = match rest.split_once(" reason: ") {
            Some((v, r)) => (v, Some(r.to_string())),
            None => (rest, None),
        };
        let mut fields = BTreeMap::new();
        for pair in versions.split_whitespace() {
            let (k, v) = pair.split_once('=')?;
            fields.insert(k, (v != "-").then(|| v.to_string()));
        }
        let mut take = |k: &str| fields.remove(k).flatten();
        Some(Report {
            ready,
            reason: if ready { None } else { reason },
            config: take("config"),
            lds: take("lds"),
            cds: take("cds"),
        })
    }
}

/// Probes the replica's Envoy and reads the versions it accepted.
pub async fn check(settings: &Settings) -> Report {
    let admin = Admin::new(&settings.admin_socket).with_timeout(STATUS_TIMEOUT);
    let verdict = readiness::probe(&admin, &settings.expect).await;
    let (lds, cds) = match accepted_versions(&admin).await {
        Some(mut v) => (v.remove(LDS_VERSION), v.remove(CDS_VERSION)),
        None => (None, None),
    };
    let (ready, reason) = match verdict {
        Readiness::Ready => (true, None),
        Readiness::NotReady { reason } => (false, Some(reason.to_string())),
    };
    Report {
        ready,
        reason,
        config: settings.config_version.clone(),
        lds: lds.filter(|v| !v.is_empty()),
        cds: cds.filter(|v| !v.is_empty()),
    }
}

/// Runs one health check: prints the line, writes the JSON file (a failure to write it is said
/// on stderr and changes nothing else) and returns the exit code: 0 ready, 1 not.
pub async fn command(settings: &Settings) -> i32 {
    let report = check(settings).await;
    println!("{}", report.line());
    let file = settings.health_file();
    let json = serde_json::to_vec(&report).unwrap_or_default();
    if let Err(e) = crate::state::write_atomic(&file, &json, 0o644) {
        eprintln!("berth agent health: {e:#}");
    }
    if report.ready {
        0
    } else {
        1
    }
}

/// The text readouts naming the accepted LDS/CDS versions; None when the admin socket does not
/// answer.
async fn accepted_versions(admin: &Admin) -> Option<BTreeMap<String, String>> {
    let filter = r"^(listener_manager\.lds|cluster_manager\.cds)\.version_text$";
    let path = format!("/stats?format=json&filter={}", percent_encode(filter));
    let (status, body) = admin.get(&path).await.ok()?;
    if status != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(text_readouts(&json))
}

/// String-valued entries of Envoy's `/stats?format=json` answer (text readouts).
fn text_readouts(json: &serde_json::Value) -> BTreeMap<String, String> {
    json.get("stats")
        .and_then(|s| s.as_array())
        .into_iter()
        .flatten()
        .filter_map(|s| {
            Some((
                s.get("name")?.as_str()?.to_string(),
                s.get("value")?.as_str()?.to_string(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ready: bool) -> Report {
        Report {
            ready,
            reason: (!ready).then(|| "Envoy is LIVE but not listening on port(s) 80".to_string()),
            config: Some("3f9a1c2b".into()),
            lds: Some("v 7".into()),
            cds: None,
        }
    }

    #[test]
    fn the_line_says_the_verdict_and_the_versions() {
        assert_eq!(report(true).line(), "ready config=3f9a1c2b lds=v_7 cds=-");
        assert_eq!(
            report(false).line(),
            "not-ready config=3f9a1c2b lds=v_7 cds=- reason: Envoy is LIVE but not listening on port(s) 80"
        );
    }

    #[test]
    fn a_line_reads_back() {
        for ready in [true, false] {
            let mut want = report(ready);
            want.lds = Some("v_7".into());
            assert_eq!(Report::parse(&report(ready).line()), Some(want));
        }
        assert_eq!(Report::parse("OCI runtime exec failed"), None);
        assert_eq!(Report::parse("ready config"), None);
    }

    #[test]
    fn text_readouts_are_the_string_stats() {
        let json = serde_json::json!({"stats": [
            {"name": "listener_manager.lds.version_text", "value": "7"},
            {"name": "listener_manager.lds.version", "value": 123},
            {"histograms": {}}
        ]});
        assert_eq!(
            text_readouts(&json),
            BTreeMap::from([("listener_manager.lds.version_text".into(), "7".into())])
        );
    }
}
