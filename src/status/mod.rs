//! What runs now: one row per replica, read from the engine and each replica's admin socket.

pub mod record;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::admin::Admin;
use crate::delivery;
use crate::replica::{self, ObservedContainer, RunState, LABEL_NAME};
use crate::state::StateDir;
use record::Record;

/// How long one replica's admin may take to answer before it is shown as unknown.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize)]
pub struct ReplicaStatus {
    pub proxy: String,
    pub slot: Option<u32>,
    pub container: String,
    pub state: RunState,
    /// `/ready` as the replica reports it (LIVE, DRAINING, …), or "-" when it cannot answer.
    pub ready: String,
    pub image: String,
    pub spec: String,
    pub uptime_seconds: Option<u64>,
    pub connections: Option<u64>,
    /// The config generation this replica has accepted (the `version_info` of its watched
    /// files, which `berth serve` stamps), when it reports one.
    pub observed_generation: Option<u64>,
}

/// The status of every berth replica, sorted by proxy and slot.
pub async fn collect(state: &StateDir, observed: &[ObservedContainer]) -> Vec<ReplicaStatus> {
    // The subscriptions each proxy's watched files define, read once per proxy.
    let subscriptions: BTreeMap<&str, Vec<String>> = observed
        .iter()
        .filter_map(|c| c.proxy())
        .map(|p| {
            (
                p,
                delivery::subscriptions(&state.read_xds(p).unwrap_or_default()),
            )
        })
        .collect();
    let subscriptions = &subscriptions;
    let rows = observed
        .iter()
        .filter(|c| c.is_managed())
        .map(|c| async move {
            let proxy = c.proxy().unwrap_or("?").to_string();
            let run_name = c.label(LABEL_NAME).unwrap_or(&c.name);
            let admin = Admin::new(state.proxy(&proxy).admin_socket(run_name));
            let (ready, connections, observed_generation) = if c.state == RunState::Running {
                let ready = tokio::time::timeout(ADMIN_TIMEOUT, admin.ready()).await;
                let conns =
                    tokio::time::timeout(ADMIN_TIMEOUT, admin.downstream_connections()).await;
                let subs = subscriptions
                    .get(proxy.as_str())
                    .map_or(&[][..], Vec::as_slice);
                let generation = tokio::time::timeout(ADMIN_TIMEOUT, delivery::snapshot(&admin))
                    .await
                    .ok()
                    .and_then(|r| r.ok())
                    .and_then(|snap| delivery::confirmed_generation(&snap, subs));
                (
                    match ready {
                        Ok(Ok(r)) => r.to_string(),
                        _ => "-".to_string(),
                    },
                    conns.ok().and_then(|r| r.ok()),
                    generation,
                )
            } else {
                ("-".to_string(), None, None)
            };
            ReplicaStatus {
                proxy,
                slot: c.slot(),
                container: c.name.clone(),
                state: c.state,
                ready,
                image: c.info.image.clone(),
                spec: replica::short_hash(c.spec_hash().unwrap_or("")).to_string(),
                uptime_seconds: c.uptime_seconds(),
                connections,
                observed_generation,
            }
        });
    let mut rows = futures_util::future::join_all(rows).await;
    rows.sort_by(|a, b| (&a.proxy, a.slot).cmp(&(&b.proxy, b.slot)));
    rows
}

/// A kubectl-style table of replicas.
pub fn table(rows: &[ReplicaStatus]) -> String {
    let header = [
        "PROXY",
        "SLOT",
        "CONTAINER",
        "STATE",
        "READY",
        "IMAGE",
        "SPEC",
        "GEN",
        "UPTIME",
        "CONNS",
    ];
    let dash = || "-".to_string();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.proxy.clone(),
                r.slot.map(|s| s.to_string()).unwrap_or_else(dash),
                r.container.clone(),
                r.state.to_string(),
                r.ready.clone(),
                r.image.clone(),
                r.spec.clone(),
                r.observed_generation
                    .map(|g| g.to_string())
                    .unwrap_or_else(dash),
                r.uptime_seconds.map(uptime).unwrap_or_else(dash),
                r.connections.map(|c| c.to_string()).unwrap_or_else(dash),
            ]
        })
        .collect();
    columns(&header, cells)
}

/// A table of what `berth serve` recorded per proxy: generation, conditions, last rollout.
pub fn proxies_table(record: &Record) -> String {
    let header = ["PROXY", "GENERATION", "CONDITIONS", "LAST ROLLOUT"];
    let cells = record
        .proxies
        .iter()
        .map(|(name, p)| {
            let conditions: Vec<String> = p
                .conditions
                .iter()
                .filter(|c| c.status == "True")
                .map(|c| c.type_.clone())
                .collect();
            let last = p.last_rollout.as_ref().map_or_else(
                || "-".to_string(),
                |r| {
                    format!(
                        "{} {} (gen {}) at {}",
                        r.kind, r.outcome, r.generation, r.finished_at
                    )
                },
            );
            vec![
                name.clone(),
                p.generation.to_string(),
                conditions.join(","),
                last,
            ]
        })
        .collect();
    columns(&header, cells)
}

fn columns(header: &[&str], cells: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: Vec<String>| {
        row.iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.extend(cells.into_iter().map(line));
    out.join("\n")
}

fn uptime(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_is_short() {
        assert_eq!(uptime(5), "5s");
        assert_eq!(uptime(300), "5m");
        assert_eq!(uptime(10_000), "2h");
        assert_eq!(uptime(500_000), "5d");
    }
}
