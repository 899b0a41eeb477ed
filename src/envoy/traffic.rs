//! A replica's own traffic numbers, from its Envoy's counters over the admin socket: what the
//! rollout's traffic judge ([`crate::core::rollout::judge`]) compares between a new replica and its
//! siblings. Admin's own listener (`http.admin.*`) is left out.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

use crate::core::rollout::Sample;
use crate::envoy::admin::{parse_stats, percent_encode, AdminApi};

/// The counters a [`Sample`] is made of, as one `/stats` filter.
const FILTER: &str = r"^(http\.[^.]+\.downstream_rq_(completed|5xx|tx_reset)|cluster\.[^.]+\.upstream_cx_connect_fail)$";

/// The replica's counters now.
pub async fn sample(admin: &dyn AdminApi) -> Result<Sample> {
    let path = format!("/stats?format=json&filter={}", percent_encode(FILTER));
    let (status, body) = admin.get(&path).await?;
    if status != 200 {
        bail!("{}: GET /stats answered {status}", admin.location());
    }
    let json: serde_json::Value = serde_json::from_str(&body)?;
    Ok(from_stats(&parse_stats(&json)))
}

/// The [`Sample`] in a set of Envoy counters.
pub fn from_stats(stats: &BTreeMap<String, u64>) -> Sample {
    let mut s = Sample::default();
    for (name, value) in stats {
        if let Some(rest) = name.strip_prefix("http.") {
            let Some((listener, counter)) = rest.split_once('.') else {
                continue;
            };
            if listener == "admin" {
                continue;
            }
            match counter {
                "downstream_rq_completed" => s.requests += value,
                "downstream_rq_5xx" => s.errors_5xx += value,
                "downstream_rq_tx_reset" => s.resets += value,
                _ => {}
            }
        } else if name.starts_with("cluster.") && name.ends_with(".upstream_cx_connect_fail") {
            s.connect_failures += value;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_listener_and_cluster_but_admin() {
        let stats: BTreeMap<String, u64> = [
            ("http.web.downstream_rq_completed", 10),
            ("http.api.downstream_rq_completed", 5),
            ("http.admin.downstream_rq_completed", 99),
            ("http.web.downstream_rq_5xx", 3),
            ("http.admin.downstream_rq_5xx", 7),
            ("http.web.downstream_rq_tx_reset", 1),
            ("cluster.api.upstream_cx_connect_fail", 2),
            ("cluster.b.upstream_cx_connect_fail", 1),
            ("http.web.downstream_rq_2xx", 7),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let s = from_stats(&stats);
        assert_eq!(
            s,
            Sample {
                requests: 15,
                errors_5xx: 3,
                resets: 1,
                connect_failures: 3
            }
        );
    }
}
