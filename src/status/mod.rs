//! Layer status: rows, records, [`metrics`]. May use: core, envoy, state, and the infrastructure
//! seam's types (infra's mod.rs), never an implementation or the engine.
//!
//! What runs now: one row per replica (the infrastructure collects them, with the one
//! readiness probe), and what `berth serve` records per proxy ([`record`]); the tables both
//! are shown as.

pub mod certificates;
pub mod metrics;
pub mod record;

use crate::engine::RunState;
pub use crate::infra::ReplicaStatus;
use record::Record;

/// A kubectl-style table of replicas.
pub fn table(rows: &[ReplicaStatus]) -> String {
    let mut header = vec![
        "PROXY",
        "SLOT",
        "CONTAINER",
        "STATE",
        "READY",
        "ENVOY",
        "IMAGE",
        "SPEC",
        "GEN",
        "XDS",
        "UPTIME",
        "CONNS",
    ];
    let dash = || "-".to_string();
    // Swarm tasks say which node runs them.
    let nodes = rows.iter().any(|r| r.node.is_some());
    if nodes {
        header.insert(3, "NODE");
    }
    let service_nodes = rows.iter().any(|r| r.service_node.is_some());
    if service_nodes {
        header.insert(if nodes { 4 } else { 3 }, "ENVOY-NODE");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut cells = vec![
                r.proxy.clone(),
                r.slot.map(|s| s.to_string()).unwrap_or_else(dash),
                r.container.clone(),
                r.state.to_string(),
                if r.ready { "yes" } else { "no" }.to_string(),
                r.envoy.clone(),
                r.image.clone(),
                r.spec.clone(),
                r.observed_generation
                    .map(|g| g.to_string())
                    .unwrap_or_else(dash),
                r.xds.as_ref().map(|x| x.to_string()).unwrap_or_else(dash),
                r.uptime_seconds.map(uptime).unwrap_or_else(dash),
                r.connections.map(|c| c.to_string()).unwrap_or_else(dash),
            ];
            if nodes {
                cells.insert(3, r.node.clone().unwrap_or_else(dash));
            }
            if service_nodes {
                cells.insert(
                    if nodes { 4 } else { 3 },
                    r.service_node.clone().unwrap_or_else(dash),
                );
            }
            cells
        })
        .collect();
    let mut out = columns(&header, cells);
    for r in rows.iter().filter(|r| r.state == RunState::Running) {
        if let Some(reason) = &r.reason {
            out.push_str(&format!("\n{}: not ready: {reason}", r.container));
        }
        if let Some(x) = r.xds.as_ref().filter(|x| x.rejected > 0) {
            out.push_str(&format!(
                "\n{}: rejected {} xDS update(s) since it started ({}); its log says why",
                r.container,
                x.rejected,
                x.rejecting.join(", ")
            ));
        }
    }
    out
}

/// The Ready condition serve recorded, checked against the replicas as they are now (DESIGN
/// decision 11). The record holds what the last pass saw; after a reboot the replicas Docker
/// restarted are LIVE but cannot bind their ports, and until the next pass ends the record
/// would still say Ready. A recorded Ready=True stands only while the one probe finds `wanted`
/// replicas of `proxy` ready in `rows` (None: every running one, and at least one).
pub fn live_ready(
    conditions: &mut Vec<record::Condition>,
    rows: &[ReplicaStatus],
    proxy: &str,
    wanted: Option<u32>,
) {
    let recorded = conditions
        .iter()
        .any(|c| c.type_ == record::READY && c.status == "True");
    if !recorded {
        return;
    }
    let mine: Vec<&ReplicaStatus> = rows.iter().filter(|r| r.proxy == proxy).collect();
    let ready = mine.iter().filter(|r| r.ready).count();
    let enough = match wanted {
        Some(n) => ready >= n as usize,
        None => ready > 0 && mine.iter().all(|r| r.ready || r.state != RunState::Running),
    };
    if enough {
        return;
    }
    let why: Vec<String> = mine
        .iter()
        .filter(|r| !r.ready)
        .map(|r| match &r.reason {
            Some(reason) => format!("{}: {reason}", r.container),
            None => format!("{}: {}", r.container, r.state),
        })
        .collect();
    let of = wanted.map_or_else(|| mine.len().to_string(), |n| n.to_string());
    record::set_condition(
        conditions,
        record::READY,
        false,
        "ReplicasNotReady",
        &format!("{ready}/{of} replicas ready now; {}", why.join("; ")),
    );
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

    fn row(container: &str, ready: bool) -> ReplicaStatus {
        ReplicaStatus {
            proxy: "edge".into(),
            service_node: None,
            slot: Some(0),
            container: container.into(),
            node: None,
            state: RunState::Running,
            ready,
            envoy: "LIVE".into(),
            reason: (!ready).then(|| "Envoy is LIVE but not listening on port(s) 80".into()),
            image: "envoy".into(),
            spec: "abc".into(),
            uptime_seconds: None,
            connections: None,
            observed_generation: None,
            xds: None,
        }
    }

    fn recorded_ready() -> Vec<record::Condition> {
        let mut c = Vec::new();
        record::set_condition(&mut c, record::READY, true, "AllReplicasReady", "2/2");
        c
    }

    #[test]
    fn a_recorded_ready_does_not_outlive_the_replicas_probe() {
        let mut c = recorded_ready();
        live_ready(&mut c, &[row("a", true), row("b", true)], "edge", Some(2));
        assert_eq!(c[0].status, "True");
        // During a start-first rollout a starting third replica does not matter.
        live_ready(
            &mut c,
            &[row("a", true), row("b", true), row("c", false)],
            "edge",
            Some(2),
        );
        assert_eq!(c[0].status, "True");
        live_ready(&mut c, &[row("a", false), row("b", false)], "edge", Some(2));
        assert_eq!(c[0].status, "False");
        assert_eq!(c[0].reason, "ReplicasNotReady");
        assert!(c[0].message.contains("0/2 replicas ready now"), "{c:?}");
        assert!(c[0].message.contains("a: Envoy is LIVE but not listening"));

        let mut c = recorded_ready();
        live_ready(&mut c, &[row("a", true), row("b", false)], "edge", None);
        assert_eq!(c[0].status, "False");
        let mut c = recorded_ready();
        live_ready(&mut c, &[], "edge", None);
        assert_eq!(c[0].status, "False", "no replica at all is not ready");
    }
}
