//! Live updates of the watched resource files (DESIGN decision 3), confirmed by every replica.
//!
//! Routes, clusters and listeners (standalone mode) reach running replicas as files in the
//! directory they all mount read-only and Envoy watches (`path_config_source` +
//! `watched_directory`): no container restarts. [`update`] writes the new files atomically (temp
//! file, fsync, rename into the watched directory), then asks **each replica** over its admin
//! socket whether it took them, and only reports success when all did. When a replica rejects
//! the change, or does not confirm it within the deadline, the previous files are put back and
//! the error names the replicas and what they said.
//!
//! **How a replica confirms.** Every file is a DiscoveryResponse (`resources: [...]`); berth
//! stamps it with `version_info: "<generation>"` ([`stamp`]). Envoy then reports, per
//! subscription, the version it last *accepted* as the text readout `<prefix>.version_text`, and
//! counts `update_attempt`, `update_rejected` (the config was refused) and `update_failure` (the
//! file could not be read or parsed). Names checked on Envoy 1.40.0: `listener_manager.lds.*`,
//! `cluster_manager.cds.*` and `http.<stat_prefix>.rds.<route_config_name>.*` per HTTP
//! listener. Every rename into the watched directory makes *every* subscription of that
//! directory reload once (also measured), so after `n` renames a subscription whose
//! `update_attempt` grew by `n` has seen the final files: if its `version_text` is then not the
//! new generation, the replica refused them.
//!
//! Files are renamed in xDS order, clusters before listeners before routes, so a route never
//! names a cluster a replica does not have yet.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::admin::Admin;
use crate::layout::{CDS_FILE, LDS_FILE, RDS_FILE};
use crate::replica::{ObservedContainer, RunState, LABEL_NAME};
use crate::state::{write_atomic, StateDir};

/// How long replicas get to confirm a change unless told otherwise.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How often replicas are asked while waiting.
const POLL: Duration = Duration::from_millis(20);
/// Timeout of one admin call while waiting.
const ADMIN_TIMEOUT: Duration = Duration::from_millis(500);
const VERSION_KEY: &str = "version_info:";

/// Stamps each DiscoveryResponse-shaped file (a top-level `resources:` key) with
/// `version_info: "<generation>"`, replacing an earlier stamp. Other files are left as they are.
pub fn stamp(files: &BTreeMap<String, String>, generation: u64) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(name, text)| {
            let body = unstamped(text);
            let stamped = if body.starts_with("resources:") || body.contains("\nresources:") {
                format!("{VERSION_KEY} \"{generation}\"\n{body}")
            } else {
                body.to_string()
            };
            (name.clone(), stamped)
        })
        .collect()
}

/// The text without berth's stamp line.
fn unstamped(text: &str) -> &str {
    match text.strip_prefix(VERSION_KEY) {
        Some(rest) => rest.split_once('\n').map_or("", |(_, body)| body),
        None => text,
    }
}

/// The files without berth's stamp: what was rendered.
pub fn unstamp(files: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(k, v)| (k.clone(), unstamped(v).to_string()))
        .collect()
}

/// The generation the files are stamped with (the stamp of `lds.yaml`, else of any file).
pub fn generation_of(files: &BTreeMap<String, String>) -> Option<u64> {
    let parse = |text: &String| {
        let line = text.strip_prefix(VERSION_KEY)?.lines().next()?;
        line.trim().trim_matches('"').parse().ok()
    };
    files
        .get(LDS_FILE)
        .and_then(parse)
        .or_else(|| files.values().find_map(parse))
}

/// One replica that must confirm a change.
#[derive(Debug, Clone)]
pub struct Replica {
    /// The container name (for messages and status).
    pub name: String,
    pub admin: Admin,
}

/// The replicas of `proxy` that must confirm a change of its files: every running container of
/// the proxy (they all mount the same directory).
pub fn replicas(state: &StateDir, proxy: &str, observed: &[ObservedContainer]) -> Vec<Replica> {
    observed
        .iter()
        .filter(|c| c.is_managed() && c.proxy() == Some(proxy) && c.state == RunState::Running)
        .map(|c| {
            let run = c.label(LABEL_NAME).unwrap_or(&c.name);
            Replica {
                name: c.name.clone(),
                admin: Admin::new(state.proxy(proxy).admin_socket(run)).with_timeout(ADMIN_TIMEOUT),
            }
        })
        .collect()
}

/// What one replica said about a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Ack {
    /// Every subscription reports the new version.
    Confirmed { millis: u64 },
    /// A subscription processed the final files and kept its old version.
    Rejected { detail: String },
    /// No verdict before the deadline (the replica is stuck, or its admin does not answer).
    NoAnswer { detail: String },
}

/// A change every replica confirmed.
#[derive(Debug, Clone, Serialize)]
pub struct LiveOutcome {
    pub proxy: String,
    pub generation: Option<u64>,
    /// Files renamed into the watched directory (empty: nothing had changed).
    pub written: Vec<String>,
    pub replicas: BTreeMap<String, Ack>,
    /// From the first rename to the last confirmation.
    pub elapsed: Duration,
}

/// A change not every replica confirmed; the previous files were put back.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRejected {
    pub proxy: String,
    pub generation: Option<u64>,
    pub replicas: BTreeMap<String, Ack>,
    /// What happened to the previous files.
    pub restored: String,
}

impl std::fmt::Display for LiveRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gen = self
            .generation
            .map(|g| format!(" (generation {g})"))
            .unwrap_or_default();
        write!(
            f,
            "route/cluster update of {}{gen} not confirmed by every replica:",
            self.proxy
        )?;
        for (name, ack) in &self.replicas {
            match ack {
                Ack::Confirmed { .. } => {}
                Ack::Rejected { detail } => write!(f, " {name} rejected it ({detail});")?,
                Ack::NoAnswer { detail } => write!(f, " {name} did not confirm ({detail});")?,
            }
        }
        write!(f, " {}", self.restored)
    }
}

impl std::error::Error for LiveRejected {}

/// Writes `files` (normally [`stamp`]ed) into the proxy's watched directory and waits until
/// every replica in `replicas` confirms them, at most `timeout`. When one does not, the previous
/// files are written back (and their confirmation awaited, best effort) and the error is a
/// [`LiveRejected`]. With no change on disk it returns at once with nothing written.
pub async fn update(
    state: &StateDir,
    proxy: &str,
    files: &BTreeMap<String, String>,
    replicas: &[Replica],
    timeout: Duration,
) -> Result<LiveOutcome> {
    let previous = state.read_xds(proxy)?;
    let generation = generation_of(files);
    if &previous == files {
        return Ok(LiveOutcome {
            proxy: proxy.to_string(),
            generation,
            written: Vec::new(),
            replicas: BTreeMap::new(),
            elapsed: Duration::ZERO,
        });
    }
    let subs = subscriptions(files);
    let baselines =
        futures_util::future::join_all(replicas.iter().map(|r| snapshot(&r.admin))).await;
    let started = Instant::now();
    let dir = state.proxy(proxy).xds();
    let written = write_files(&dir, files, &previous)?;
    let acks = confirm(
        replicas,
        &baselines,
        &subs,
        generation,
        written.len() as u64,
        started,
        timeout,
    )
    .await;
    let elapsed = started.elapsed();
    if acks.values().all(|a| matches!(a, Ack::Confirmed { .. })) {
        return Ok(LiveOutcome {
            proxy: proxy.to_string(),
            generation,
            written,
            replicas: acks,
            elapsed,
        });
    }
    // Put the previous files back, and wait for the replicas to be on them again.
    let restored = match restore(&dir, &previous, files) {
        Err(e) => format!("restoring the previous files failed too: {e:#}"),
        Ok(n) => {
            let baselines =
                futures_util::future::join_all(replicas.iter().map(|r| snapshot(&r.admin))).await;
            let back = confirm(
                replicas,
                &baselines,
                &subscriptions(&previous),
                generation_of(&previous),
                n,
                Instant::now(),
                timeout,
            )
            .await;
            let not_back: Vec<&str> = back
                .iter()
                .filter(|(_, a)| !matches!(a, Ack::Confirmed { .. }))
                .map(|(n, _)| n.as_str())
                .collect();
            let what = match generation_of(&previous) {
                Some(g) => format!("the previous files (generation {g}) were restored"),
                None => "the previous files were restored".to_string(),
            };
            if not_back.is_empty() {
                format!("{what}; every replica serves them")
            } else {
                format!("{what}; not confirmed yet by {}", not_back.join(", "))
            }
        }
    };
    Err(anyhow::Error::new(LiveRejected {
        proxy: proxy.to_string(),
        generation,
        replicas: acks,
        restored,
    }))
}

/// The order files are renamed in: clusters, listeners, routes, then anything else.
fn rename_order(name: &str) -> (u8, &str) {
    let rank = match name {
        CDS_FILE => 0,
        LDS_FILE => 1,
        RDS_FILE => 2,
        _ => 3,
    };
    (rank, name)
}

/// Renames every file of `files` that differs from `previous` into `dir`, in xDS order, and
/// removes the files no longer wanted. Returns the names written.
fn write_files(
    dir: &Path,
    files: &BTreeMap<String, String>,
    previous: &BTreeMap<String, String>,
) -> Result<Vec<String>> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut names: Vec<&String> = files
        .iter()
        .filter(|(n, c)| previous.get(*n) != Some(*c))
        .map(|(n, _)| n)
        .collect();
    names.sort_by_key(|n| rename_order(n));
    let mut written = Vec::new();
    for name in names {
        write_atomic(&dir.join(name), files[name].as_bytes(), 0o644)?;
        written.push(name.clone());
    }
    for name in previous.keys().filter(|n| !files.contains_key(*n)) {
        let _ = std::fs::remove_file(dir.join(name));
    }
    Ok(written)
}

/// Writes `previous` back over `current`; returns how many files were renamed in.
fn restore(
    dir: &Path,
    previous: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
) -> Result<u64> {
    Ok(write_files(dir, previous, current)?.len() as u64)
}

/// The subscriptions (stat prefixes) the files define: LDS and CDS when their file exists, and
/// one RDS subscription per HTTP connection manager in `lds.yaml`.
pub fn subscriptions(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut subs = Vec::new();
    if files.contains_key(LDS_FILE) {
        subs.push("listener_manager.lds".to_string());
    }
    if files.contains_key(CDS_FILE) {
        subs.push("cluster_manager.cds".to_string());
    }
    if let Some(lds) = files.get(LDS_FILE) {
        if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(lds) {
            collect_rds(&doc, &mut subs);
        }
    }
    subs.sort();
    subs.dedup();
    subs
}

/// Finds every `{stat_prefix, rds: {route_config_name}}` mapping in a document.
fn collect_rds(v: &serde_yaml::Value, out: &mut Vec<String>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            let prefix = m.get("stat_prefix").and_then(|p| p.as_str());
            let route = m
                .get("rds")
                .and_then(|r| r.get("route_config_name"))
                .and_then(|n| n.as_str());
            if let (Some(prefix), Some(route)) = (prefix, route) {
                out.push(format!("http.{prefix}.rds.{route}"));
            }
            for v in m.values() {
                collect_rds(v, out);
            }
        }
        serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| collect_rds(v, out)),
        _ => {}
    }
}

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

const SUB_FILTER: &str = r"^(listener_manager\.lds|cluster_manager\.cds|http\..*\.rds\..*)\.(version_text|update_attempt|update_rejected|update_failure)$";

/// Reads the subscriptions' counters and versions of one replica.
pub async fn snapshot(admin: &Admin) -> Result<Snapshot> {
    let (status, body) = admin
        .get(&format!(
            "/stats?format=json&filter={}",
            crate::admin::percent_encode(SUB_FILTER)
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

/// A verdict on one replica given its state before and now, or None to keep waiting.
pub fn judge(
    before: Option<&Snapshot>,
    now: &Snapshot,
    subs: &[String],
    generation: Option<u64>,
    renames: u64,
) -> Option<Result<(), String>> {
    let empty = SubState::default();
    let mut all_done = true;
    let mut all_match = true;
    let mut refusals = Vec::new();
    for sub in subs {
        let Some(cur) = now.get(sub) else {
            // Not created yet (a new listener's routes): keep waiting.
            all_done = false;
            all_match = false;
            continue;
        };
        let base = before.and_then(|b| b.get(sub)).unwrap_or(&empty);
        let new_sub = before.is_some_and(|b| !b.contains_key(sub));
        let done = if new_sub {
            cur.attempts >= 1
        } else {
            cur.attempts >= base.attempts + renames
        };
        let matches = match generation {
            Some(g) => cur.version == g.to_string(),
            None => done && cur.refused == base.refused,
        };
        if cur.refused > base.refused && !matches {
            refusals.push(format!(
                "{sub}: update_rejected/update_failure +{}, still at version {:?}",
                cur.refused - base.refused,
                cur.version
            ));
        }
        all_done &= done;
        all_match &= matches;
    }
    if all_match {
        return Some(Ok(()));
    }
    if all_done && !refusals.is_empty() {
        return Some(Err(refusals.join("; ")));
    }
    None
}

async fn confirm(
    replicas: &[Replica],
    baselines: &[Result<Snapshot>],
    subs: &[String],
    generation: Option<u64>,
    renames: u64,
    started: Instant,
    timeout: Duration,
) -> BTreeMap<String, Ack> {
    let deadline = started + timeout;
    let one = |r: &Replica, base: Option<&Snapshot>| {
        let r = r.clone();
        let base = base.cloned();
        async move {
            let mut last: String;
            loop {
                match snapshot(&r.admin).await {
                    Ok(now) => match judge(base.as_ref(), &now, subs, generation, renames) {
                        Some(Ok(())) => {
                            return (
                                r.name,
                                Ack::Confirmed {
                                    millis: started.elapsed().as_millis() as u64,
                                },
                            )
                        }
                        Some(Err(detail)) => return (r.name, Ack::Rejected { detail }),
                        None => {
                            last = match generation {
                                Some(g) => format!(
                                    "versions {:?}, waiting for \"{g}\"",
                                    subs.iter()
                                        .map(|s| now
                                            .get(s)
                                            .map(|st| st.version.as_str())
                                            .unwrap_or("-"))
                                        .collect::<Vec<_>>()
                                ),
                                None => "waiting for every subscription to reload".into(),
                            }
                        }
                    },
                    Err(e) => last = format!("{e:#}"),
                }
                if Instant::now() >= deadline {
                    return (
                        r.name,
                        Ack::NoAnswer {
                            detail: format!(
                                "nothing after {}: {last}",
                                humantime::format_duration(timeout)
                            ),
                        },
                    );
                }
                tokio::time::sleep(POLL).await;
            }
        }
    };
    let acks = futures_util::future::join_all(
        replicas
            .iter()
            .zip(baselines)
            .map(|(r, b)| one(r, b.as_ref().ok())),
    )
    .await;
    acks.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                LDS_FILE.to_string(),
                "resources:\n- name: web\n  filter_chains:\n  - filters:\n    - typed_config:\n        stat_prefix: \"web\"\n        rds:\n          route_config_name: \"web\"\n".to_string(),
            ),
            (RDS_FILE.to_string(), "resources:\n- name: web\n".to_string()),
            (CDS_FILE.to_string(), "resources: []\n".to_string()),
        ])
    }

    #[test]
    fn stamps_replace_each_other_and_come_off() {
        let f = files();
        let one = stamp(&f, 1);
        assert!(one[RDS_FILE].starts_with("version_info: \"1\"\nresources:"));
        assert_eq!(generation_of(&one), Some(1));
        let two = stamp(&one, 2);
        assert_eq!(generation_of(&two), Some(2));
        assert_eq!(two[CDS_FILE], "version_info: \"2\"\nresources: []\n");
        assert_eq!(unstamp(&two), f);
        assert_eq!(generation_of(&f), None);
        let other = BTreeMap::from([("x.pem".to_string(), "---".to_string())]);
        assert_eq!(stamp(&other, 3), other);
    }

    #[test]
    fn subscriptions_from_listeners() {
        assert_eq!(
            subscriptions(&files()),
            vec![
                "cluster_manager.cds".to_string(),
                "http.web.rds.web".to_string(),
                "listener_manager.lds".to_string()
            ]
        );
    }

    #[test]
    fn parses_stats_and_judges() {
        let json: serde_json::Value = serde_json::from_str(
            r#"{"stats":[{"name":"http.web.rds.web.version_text","value":"7"},
            {"name":"listener_manager.lds.version_text","value":"7"},
            {"name":"http.web.rds.web.update_attempt","value":5},
            {"name":"http.web.rds.web.update_failure","value":1},
            {"name":"http.web.rds.web.update_rejected","value":2},
            {"name":"listener_manager.lds.update_attempt","value":5}]}"#,
        )
        .unwrap();
        let now = parse_snapshot(&json);
        assert_eq!(now["http.web.rds.web"].refused, 3);
        let subs = vec![
            "http.web.rds.web".to_string(),
            "listener_manager.lds".to_string(),
        ];
        assert_eq!(confirmed_generation(&now, &subs), Some(7));
        assert_eq!(judge(None, &now, &subs, Some(7), 1), Some(Ok(())));
        let mut before = now.clone();
        before.get_mut("http.web.rds.web").unwrap().refused = 1;
        before.get_mut("http.web.rds.web").unwrap().attempts = 4;
        before.get_mut("listener_manager.lds").unwrap().attempts = 4;
        // Generation 8 was written once; the routes refused it.
        let verdict = judge(Some(&before), &now, &subs, Some(8), 1);
        assert!(
            matches!(verdict, Some(Err(ref d)) if d.contains("http.web.rds.web")),
            "{verdict:?}"
        );
        // Two renames, only one processed: keep waiting.
        assert_eq!(judge(Some(&before), &now, &subs, Some(8), 2), None);
    }
}
