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
//! **Make before break.** Replicas reload each subscription on its own, so renaming a new
//! route file and `cds.yaml` one after the other (or swapping them together) can leave a route
//! naming a cluster a replica does not have yet, for a moment: requests get a 503. [`update`]
//! therefore goes in stages, each confirmed by every replica before the next: (on a Swarm) the
//! certificate copies the secrets name; new and changed secrets and other files; clusters as the union of old and new; the new and changed route
//! configurations (one file each: `rds-<listener>.yaml`); the new listeners; the route
//! configurations no longer named; the new clusters; then the other files no longer wanted go.
//! At every moment each replica's listeners name route
//! configurations it has, and its routes name clusters it has. Intermediate files are stamped
//! `<generation>.<stage>`. A file whose only change is its stamp (every file of a new
//! generation is restamped) goes with the last stage, so a route-only change is one stage.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::time::Instant;

use crate::core::layout::{is_rds_file, CDS_FILE, LDS_FILE};
use crate::envoy::admin::AdminApi;
use crate::state::{write_atomic, StateDir};

/// How long replicas get to confirm a change unless told otherwise.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How often replicas are asked while waiting.
const POLL: Duration = Duration::from_millis(20);
/// Timeout of one admin call while waiting.
pub const ADMIN_TIMEOUT: Duration = Duration::from_millis(500);
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

/// The version a file is stamped with, if any.
fn stamp_of(text: &str) -> Option<String> {
    let line = text.strip_prefix(VERSION_KEY)?.lines().next()?;
    Some(line.trim().trim_matches(['"', '\'']).to_string())
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
#[derive(Clone)]
pub struct Replica {
    /// The container name (for messages and status).
    pub name: String,
    pub admin: Arc<dyn AdminApi>,
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
    /// Files that changed (empty: nothing had changed).
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
    /// The stage that failed, e.g. "clusters (old and new)".
    pub stage: String,
    pub replicas: BTreeMap<String, Ack>,
    /// What happened to the previous files.
    pub restored: String,
}

impl LiveRejected {
    /// Some replica refused the files (as opposed to not answering in time): the same files
    /// will be refused again.
    pub fn refused(&self) -> bool {
        self.replicas
            .values()
            .any(|a| matches!(a, Ack::Rejected { .. }))
    }
}

impl std::fmt::Display for LiveRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gen = self
            .generation
            .map(|g| format!(" (generation {g})"))
            .unwrap_or_default();
        write!(
            f,
            "route/cluster update of {}{gen} not confirmed by every replica at stage {}:",
            self.proxy, self.stage
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

/// Why [`update`] did not finish.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// A replica refused or did not confirm; the previous files are back.
    #[error(transparent)]
    Rejected(LiveRejected),
    /// The watched directory could not be read or written.
    #[error("{0:#}")]
    Io(anyhow::Error),
}

/// One step of a make-before-break update: files written (by rename) and files removed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stage {
    pub what: &'static str,
    pub write: BTreeMap<String, String>,
    pub remove: Vec<String>,
}

/// The stages that take the watched files from `from` to `to` without a moment in which a
/// listener names a route configuration, or a route a cluster, that the replica lacks (see the
/// module docs). Stages that change nothing are left out.
pub fn stages(from: &BTreeMap<String, String>, to: &BTreeMap<String, String>) -> Vec<Stage> {
    let xds = |n: &str| n == LDS_FILE || n == CDS_FILE || is_rds_file(n);
    let version = to
        .get(LDS_FILE)
        .or_else(|| to.values().next())
        .and_then(|t| stamp_of(t))
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut disk = from.clone();
    // Files whose only change is their stamp: the same resources, so no order matters for
    // them. They ride along with the last stage instead of costing a confirmed stage each.
    let mut restamped: BTreeMap<String, String> = BTreeMap::new();
    let mut step = |what: &'static str, write: BTreeMap<String, String>, remove: Vec<String>| {
        let (only_stamp, write): (BTreeMap<String, String>, BTreeMap<String, String>) = write
            .into_iter()
            .filter(|(n, c)| disk.get(n) != Some(c))
            .partition(|(n, c)| disk.get(n).is_some_and(|d| unstamped(d) == unstamped(c)));
        for n in write.keys() {
            restamped.remove(n);
        }
        restamped.extend(only_stamp);
        let remove: Vec<String> = remove
            .into_iter()
            .filter(|n| disk.contains_key(n))
            .collect();
        if write.is_empty() && remove.is_empty() {
            return;
        }
        for (n, c) in &write {
            disk.insert(n.clone(), c.clone());
        }
        for n in &remove {
            disk.remove(n);
        }
        out.push(Stage {
            what,
            write,
            remove,
        });
    };
    // A Swarm task's certificate copies (`tls/<owner>/<file>`, see
    // [`crate::core::agent::channel::TLS_PREFIX`]) go first: the secrets name them.
    let tls = |n: &str| n.starts_with(crate::core::agent::channel::TLS_PREFIX);
    let copies: BTreeMap<String, String> = to
        .iter()
        .filter(|(n, _)| tls(n))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    step("certificate files", copies, Vec::new());
    let others: BTreeMap<String, String> = to
        .iter()
        .filter(|(n, _)| !xds(n) && !tls(n))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    step("secrets and other files", others, Vec::new());
    // Old and new together; just the new file when it removes nothing (then it is the union).
    let union_of = |file: &str, n: u32| -> BTreeMap<String, String> {
        let text = match (from.get(file), to.get(file)) {
            (Some(old), Some(new)) => match union(old, new, &format!("{version}.{n}")) {
                Some(Union::Removes(u)) => u,
                Some(Union::Adds) => new.clone(),
                None => return BTreeMap::new(),
            },
            (None, Some(new)) => new.clone(),
            _ => return BTreeMap::new(),
        };
        BTreeMap::from([(file.to_string(), text)])
    };
    let cds_union = union_of(CDS_FILE, 1);
    step("clusters (old and new)", cds_union, Vec::new());
    // One route configuration per file: the new and changed ones go before the listeners that
    // name them, the unused ones after the listeners that named them.
    let routes: BTreeMap<String, String> = to
        .iter()
        .filter(|(n, _)| is_rds_file(n))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    step("route configurations (old and new)", routes, Vec::new());
    let only = |file: &str| -> BTreeMap<String, String> {
        to.get(file)
            .map(|c| BTreeMap::from([(file.to_string(), c.clone())]))
            .unwrap_or_default()
    };
    let gone = |file: &str| -> Vec<String> {
        if to.contains_key(file) {
            Vec::new()
        } else {
            vec![file.to_string()]
        }
    };
    step("listeners", only(LDS_FILE), gone(LDS_FILE));
    let unused_routes: Vec<String> = from
        .keys()
        .filter(|n| is_rds_file(n) && !to.contains_key(*n))
        .cloned()
        .collect();
    step("route configurations", BTreeMap::new(), unused_routes);
    step("clusters", only(CDS_FILE), gone(CDS_FILE));
    let unwanted: Vec<String> = from
        .keys()
        .filter(|n| !xds(n) && !to.contains_key(*n))
        .cloned()
        .collect();
    step("files no longer used", BTreeMap::new(), unwanted);
    restamped.retain(|n, c| disk.get(n) != Some(c));
    if !restamped.is_empty() {
        match out.last_mut() {
            Some(last) => last.write.extend(restamped),
            None => out.push(Stage {
                what: "versions",
                write: restamped,
                remove: Vec::new(),
            }),
        }
    }
    out
}

enum Union {
    /// `new` drops resources `old` has: their union, as a DiscoveryResponse.
    Removes(String),
    /// `new` only adds or changes resources: it is the union itself.
    Adds,
}

/// A DiscoveryResponse holding `old`'s resources with `new`'s added or replacing those of the
/// same name, stamped `version`. None when either does not parse as one.
fn union(old: &str, new: &str, version: &str) -> Option<Union> {
    use serde_yaml::{Mapping, Value};
    let resources = |text: &str| -> Option<Vec<Value>> {
        let doc: Value = serde_yaml::from_str(text).ok()?;
        doc.get("resources")?.as_sequence().cloned()
    };
    let name = |v: &Value| v.get("name").and_then(|n| n.as_str()).map(str::to_string);
    let (old, new) = (resources(old)?, resources(new)?);
    let mut merged: Vec<Value> = old
        .into_iter()
        .filter(|o| !new.iter().any(|n| name(n).is_some() && name(n) == name(o)))
        .collect();
    if merged.is_empty() {
        return Some(Union::Adds);
    }
    merged.extend(new);
    let mut doc = Mapping::new();
    doc.insert("resources".into(), Value::Sequence(merged));
    let body = serde_yaml::to_string(&doc).ok()?;
    // The stamp line as [`stamp`] writes it, so [`stamp_of`] reads it back the same.
    Some(Union::Removes(format!(
        "{VERSION_KEY} \"{version}\"\n{body}"
    )))
}

/// Writes `files` (normally [`stamp`]ed) into the proxy's watched directory in
/// make-before-break [`stages`], each confirmed by every replica in `replicas` (each stage at
/// most `timeout`); then, when `serials` are given, until each replica's admin `/certs` lists
/// them (the new certificates are served). When a replica refuses or does not confirm, the
/// previous files are put
/// back the same way (their confirmation awaited, best effort) and the error is a
/// [`LiveRejected`]. With no change on disk it returns at once with nothing written.
pub async fn update(
    state: &StateDir,
    proxy: &str,
    files: &BTreeMap<String, String>,
    replicas: &[Replica],
    serials: &[String],
    timeout: Duration,
) -> std::result::Result<LiveOutcome, UpdateError> {
    let dir = state.proxy(proxy).xds();
    let previous = state.read_xds(proxy).map_err(UpdateError::Io)?;
    let generation = generation_of(files);
    let written: Vec<String> = files
        .iter()
        .filter(|(n, c)| previous.get(*n) != Some(*c))
        .map(|(n, _)| n.clone())
        .chain(previous.keys().filter(|n| !files.contains_key(*n)).cloned())
        .collect();
    let started = Instant::now();
    let mut acks = BTreeMap::new();
    for stage in stages(&previous, files) {
        match apply(&dir, &stage, replicas, timeout).await {
            Ok(a) => acks = a,
            Err(StageError::Io(e)) => return Err(UpdateError::Io(e)),
            Err(StageError::Unconfirmed(replies)) => {
                let restored = restore(state, proxy, &dir, &previous, replicas, timeout).await;
                return Err(UpdateError::Rejected(LiveRejected {
                    proxy: proxy.to_string(),
                    generation,
                    stage: stage.what.to_string(),
                    replicas: replies,
                    restored,
                }));
            }
        }
    }
    if !serials.is_empty() && !written.is_empty() {
        let served = certificates_served(replicas, serials, started, timeout).await;
        if !served.values().all(|a| matches!(a, Ack::Confirmed { .. })) {
            let restored = restore(state, proxy, &dir, &previous, replicas, timeout).await;
            return Err(UpdateError::Rejected(LiveRejected {
                proxy: proxy.to_string(),
                generation,
                stage: "certificates served (admin /certs)".to_string(),
                replicas: served,
                restored,
            }));
        }
        acks = served;
    }
    Ok(LiveOutcome {
        proxy: proxy.to_string(),
        generation,
        written,
        replicas: acks,
        elapsed: started.elapsed(),
    })
}

/// Waits until every replica's admin `/certs` lists each of `serials` (the listener
/// certificates it must serve), until `timeout` after the last stage.
pub async fn certificates_served(
    replicas: &[Replica],
    serials: &[String],
    started: Instant,
    timeout: Duration,
) -> BTreeMap<String, Ack> {
    let deadline = Instant::now() + timeout;
    let one = |r: &Replica| {
        let r = r.clone();
        async move {
            loop {
                let last = match r.admin.get("/certs").await {
                    Ok((200, body)) => match serde_json::from_str(&body) {
                        Ok(json) => {
                            let served = crate::core::certificates::served_serials(&json);
                            let missing: Vec<&String> =
                                serials.iter().filter(|s| !served.contains(s)).collect();
                            if missing.is_empty() {
                                let millis = started.elapsed().as_millis() as u64;
                                return (r.name, Ack::Confirmed { millis });
                            }
                            format!("serves serials {served:?}, not yet {missing:?}")
                        }
                        Err(e) => format!("/certs is not JSON: {e}"),
                    },
                    Ok((status, body)) => format!("GET /certs answered {status}: {}", body.trim()),
                    Err(e) => format!("{e:#}"),
                };
                if Instant::now() >= deadline {
                    let detail = format!(
                        "nothing after {}: {last}",
                        humantime::format_duration(timeout)
                    );
                    return (r.name, Ack::NoAnswer { detail });
                }
                tokio::time::sleep(POLL).await;
            }
        }
    };
    futures_util::future::join_all(replicas.iter().map(one))
        .await
        .into_iter()
        .collect()
}

/// Why a stage did not go through.
pub enum StageError {
    Io(anyhow::Error),
    Unconfirmed(BTreeMap<String, Ack>),
}

/// Writes one stage and waits for every replica to confirm it (a Swarm task's agent does the
/// same for its own Envoy).
pub async fn apply(
    dir: &Path,
    stage: &Stage,
    replicas: &[Replica],
    timeout: Duration,
) -> std::result::Result<BTreeMap<String, Ack>, StageError> {
    let baselines =
        futures_util::future::join_all(replicas.iter().map(|r| snapshot(r.admin.as_ref()))).await;
    let started = Instant::now();
    let renames = write_stage(dir, stage).map_err(StageError::Io)?;
    let on_disk = read_dir_files(dir).map_err(StageError::Io)?;
    let expected = expected_versions(&on_disk);
    let acks = confirm(replicas, &baselines, &expected, renames, started, timeout).await;
    if acks.values().all(|a| matches!(a, Ack::Confirmed { .. })) {
        Ok(acks)
    } else {
        Err(StageError::Unconfirmed(acks))
    }
}

/// Puts `previous` back (in stages, confirmed best effort); says how that went.
async fn restore(
    state: &StateDir,
    proxy: &str,
    dir: &Path,
    previous: &BTreeMap<String, String>,
    replicas: &[Replica],
    timeout: Duration,
) -> String {
    let now = match state.read_xds(proxy) {
        Ok(now) => now,
        Err(e) => return format!("restoring the previous files failed: {e:#}"),
    };
    let mut not_back = Vec::new();
    for stage in stages(&now, previous) {
        match apply(dir, &stage, replicas, timeout).await {
            Ok(_) => {}
            Err(StageError::Io(e)) => {
                return format!("restoring the previous files failed too: {e:#}")
            }
            Err(StageError::Unconfirmed(acks)) => not_back.extend(
                acks.into_iter()
                    .filter(|(_, a)| !matches!(a, Ack::Confirmed { .. }))
                    .map(|(n, _)| n),
            ),
        }
    }
    not_back.sort();
    not_back.dedup();
    let what = match generation_of(previous) {
        Some(g) => format!("the previous files (generation {g}) were restored"),
        None => "the previous files were restored".to_string(),
    };
    if not_back.is_empty() {
        format!("{what}; every replica serves them")
    } else {
        format!("{what}; not confirmed yet by {}", not_back.join(", "))
    }
}

/// Renames a stage's files into `dir` and removes its removals. Returns the renames made.
pub fn write_stage(dir: &Path, stage: &Stage) -> Result<u64> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, content) in &stage.write {
        write_atomic(&dir.join(name), content.as_bytes(), 0o644)?;
    }
    for name in &stage.remove {
        let _ = std::fs::remove_file(dir.join(name));
    }
    Ok(stage.write.len() as u64)
}

fn read_dir_files(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(files);
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.file_type()?.is_file() {
            files.insert(name, std::fs::read_to_string(entry.path())?);
        }
    }
    Ok(files)
}

/// The version each subscription must report once it has taken `files`: the stamp of the
/// file it reads (None where the file carries none: then only "reloaded without a refusal"
/// can be checked).
fn expected_versions(files: &BTreeMap<String, String>) -> BTreeMap<String, Option<String>> {
    subscription_files(files)
        .into_iter()
        .map(|(sub, file)| (sub, files.get(&file).and_then(|t| stamp_of(t))))
        .collect()
}

/// The subscriptions (stat prefixes) the files define: LDS and CDS when their file exists,
/// one RDS subscription per HTTP connection manager in `lds.yaml`, and one SDS subscription
/// (`sds.<secret>`) per secret a listener (`lds.yaml`) or a backend's cluster (`cds.yaml`)
/// reads from a file here.
pub fn subscriptions(files: &BTreeMap<String, String>) -> Vec<String> {
    subscription_files(files)
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

/// Each subscription with the watched file it reads.
fn subscription_files(files: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut subs = Vec::new();
    if files.contains_key(LDS_FILE) {
        subs.push(("listener_manager.lds".to_string(), LDS_FILE.to_string()));
    }
    if files.contains_key(CDS_FILE) {
        subs.push(("cluster_manager.cds".to_string(), CDS_FILE.to_string()));
    }
    if let Some(lds) = files.get(LDS_FILE) {
        if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(lds) {
            collect_rds(&doc, &mut subs);
            collect_sds(&doc, files, &mut subs);
        }
    }
    // Backends' TLS secrets (CA, client certificate) are named by their clusters.
    if let Some(cds) = files.get(CDS_FILE) {
        if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(cds) {
            collect_sds(&doc, files, &mut subs);
        }
    }
    subs.sort();
    subs.dedup();
    subs
}

/// Finds every `{name, sds_config: {path_config_source: {path}}}` whose file is one of
/// `files`.
fn collect_sds(
    v: &serde_yaml::Value,
    files: &BTreeMap<String, String>,
    out: &mut Vec<(String, String)>,
) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            let name = m.get("name").and_then(|p| p.as_str());
            let path = m
                .get("sds_config")
                .and_then(|c| c.get("path_config_source"))
                .and_then(|p| p.get("path"))
                .and_then(|p| p.as_str());
            if let (Some(name), Some(path)) = (name, path) {
                let file = path.rsplit('/').next().unwrap_or(path);
                if files.contains_key(file) {
                    out.push((format!("sds.{name}"), file.to_string()));
                }
            }
            for v in m.values() {
                collect_sds(v, files, out);
            }
        }
        serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| collect_sds(v, files, out)),
        _ => {}
    }
}

/// Finds every `{stat_prefix, rds: {route_config_name, config_source}}` mapping in a document:
/// the subscription and the file it reads.
fn collect_rds(v: &serde_yaml::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            let prefix = m.get("stat_prefix").and_then(|p| p.as_str());
            let rds = m.get("rds");
            let route = rds
                .and_then(|r| r.get("route_config_name"))
                .and_then(|n| n.as_str());
            let file = rds
                .and_then(|r| r.get("config_source"))
                .and_then(|c| c.get("path_config_source"))
                .and_then(|p| p.get("path"))
                .and_then(|p| p.as_str())
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
            if let (Some(prefix), Some(route)) = (prefix, route) {
                let file = file.unwrap_or_else(|| crate::core::layout::rds_file(route));
                out.push((format!("http.{prefix}.rds.{route}"), file));
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

/// A verdict on one replica given its state before and now, or None to keep waiting.
/// `expected` gives, per subscription, the version it must report (None: it must only have
/// reloaded `renames` more times without a new refusal).
pub fn judge(
    before: Option<&Snapshot>,
    now: &Snapshot,
    expected: &BTreeMap<String, Option<String>>,
    renames: u64,
) -> Option<Result<(), String>> {
    let empty = SubState::default();
    let mut all_done = true;
    let mut all_match = true;
    let mut refusals = Vec::new();
    for (sub, want) in expected {
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
        let matches = match want {
            Some(v) => cur.version == *v,
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
    expected: &BTreeMap<String, Option<String>>,
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
                match snapshot(r.admin.as_ref()).await {
                    Ok(now) => match judge(base.as_ref(), &now, expected, renames) {
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
                            last = format!(
                                "versions {:?}, waiting for {:?}",
                                expected
                                    .keys()
                                    .map(|s| now
                                        .get(s)
                                        .map(|st| st.version.as_str())
                                        .unwrap_or("-"))
                                    .collect::<Vec<_>>(),
                                expected.values().collect::<Vec<_>>()
                            )
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

    const RDS_FILE: &str = "rds-web.yaml";

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

    /// A route moved from cluster `a` to a new cluster `b`: clusters first as both, then the
    /// routes, then the clusters without `a` (never a route naming a missing cluster).
    #[test]
    fn a_renamed_backend_is_made_before_it_is_broken() {
        let gen = |g: u64, cds: &str, rds: &str| {
            stamp(
                &BTreeMap::from([
                    (
                        LDS_FILE.to_string(),
                        "resources:\n- name: web\n".to_string(),
                    ),
                    (CDS_FILE.to_string(), cds.to_string()),
                    (RDS_FILE.to_string(), rds.to_string()),
                ]),
                g,
            )
        };
        let from = gen(
            1,
            "resources:\n- name: a\n",
            "resources:\n- name: web\n  cluster: a\n",
        );
        let to = gen(
            2,
            "resources:\n- name: b\n",
            "resources:\n- name: web\n  cluster: b\n",
        );
        let stages = stages(&from, &to);
        let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
        assert_eq!(
            what,
            [
                "clusters (old and new)",
                "route configurations (old and new)",
                "clusters"
            ]
        );
        let union: serde_yaml::Value = serde_yaml::from_str(&stages[0].write[CDS_FILE]).unwrap();
        let names: Vec<&str> = union["resources"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(union["version_info"], "2.1");
        assert_eq!(stamp_of(&stages[0].write[CDS_FILE]).as_deref(), Some("2.1"));
        assert_eq!(
            stages[1].write[RDS_FILE], to[RDS_FILE],
            "routes switch in one go"
        );
        assert_eq!(stages[2].write[CDS_FILE], to[CDS_FILE], "then `a` goes");
        // The listeners changed only their stamp: they ride along with the last stage.
        assert_eq!(stages[2].write[LDS_FILE], to[LDS_FILE]);
        assert!(!stages[..2].iter().any(|s| s.write.contains_key(LDS_FILE)));
        // Applying every stage ends exactly at `to`.
        let mut disk = from.clone();
        for s in &stages {
            disk.extend(s.write.clone());
            for r in &s.remove {
                disk.remove(r);
            }
        }
        assert_eq!(disk, to);
        // No change, no stage; only additions: one stage per file, final content at once.
        assert!(super::stages(&to, &to).is_empty());
    }

    /// A rotated certificate on a Swarm: the new copies before the secret that names them,
    /// the old copies only after it switched.
    #[test]
    fn certificate_copies_come_before_their_secret_and_go_after_it() {
        let set = |v: &str| {
            BTreeMap::from([
                (
                    "sds-web.yaml".to_string(),
                    format!("resources:\n- name: web\n  cert: /etc/berth/tls/web/cert-{v}.pem\n"),
                ),
                (format!("tls/web/cert-{v}.pem"), format!("cert {v}")),
                (format!("tls/web/key-{v}.pem"), format!("key {v}")),
            ])
        };
        let (from, to) = (set("a"), set("b"));
        let stages = stages(&from, &to);
        let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
        assert_eq!(
            what,
            [
                "certificate files",
                "secrets and other files",
                "files no longer used"
            ]
        );
        assert_eq!(
            stages[0].write.keys().collect::<Vec<_>>(),
            ["tls/web/cert-b.pem", "tls/web/key-b.pem"]
        );
        assert_eq!(
            stages[2].remove,
            ["tls/web/cert-a.pem", "tls/web/key-a.pem"]
        );
    }

    /// Each route configuration has its own file: a new listener's file comes before the
    /// listeners, a removed listener's file (and the older single `rds.yaml`) after them.
    #[test]
    fn route_files_come_before_their_listeners_and_go_after_them() {
        let from = BTreeMap::from([
            (LDS_FILE.to_string(), "resources: [web]\n".to_string()),
            (
                "rds.yaml".to_string(),
                "resources: [web, api]\n".to_string(),
            ),
        ]);
        let to = BTreeMap::from([
            (LDS_FILE.to_string(), "resources: [web, api]\n".to_string()),
            ("rds-web.yaml".to_string(), "resources: [web]\n".to_string()),
            ("rds-api.yaml".to_string(), "resources: [api]\n".to_string()),
        ]);
        let stages = stages(&from, &to);
        let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
        assert_eq!(
            what,
            [
                "route configurations (old and new)",
                "listeners",
                "route configurations"
            ]
        );
        assert_eq!(stages[0].write.len(), 2);
        assert_eq!(stages[2].remove, ["rds.yaml"]);
    }

    /// A route-only change of a new generation is one stage: every other file changes only
    /// its stamp and goes with it.
    #[test]
    fn a_route_only_change_is_one_stage() {
        let with_route = |route: &str| {
            let mut f = files();
            f.insert(
                RDS_FILE.to_string(),
                format!("resources:\n- name: web\n  prefix: {route}\n"),
            );
            f.insert(
                "sds-web.yaml".to_string(),
                "resources: [cert]\n".to_string(),
            );
            f
        };
        let from = stamp(&with_route("/a"), 1);
        let to = stamp(&with_route("/b"), 2);
        let stages = stages(&from, &to);
        assert_eq!(stages.len(), 1, "{stages:#?}");
        assert_eq!(
            stages[0].write, to,
            "every file, the route and the new stamps"
        );
        // Only new stamps: one stage too.
        let restamped = stamp(&with_route("/a"), 3);
        let stages = super::stages(&from, &restamped);
        assert_eq!(stages.len(), 1);
        assert_eq!(stages[0].what, "versions");
        assert_eq!(stages[0].write, restamped);
    }

    #[test]
    fn new_secrets_come_before_the_listeners_and_old_ones_go_last() {
        let from = BTreeMap::from([
            (
                LDS_FILE.to_string(),
                "version_info: \"1\"\nresources: []\n".to_string(),
            ),
            ("sds-old.yaml".to_string(), "old".to_string()),
        ]);
        let to = BTreeMap::from([
            (
                LDS_FILE.to_string(),
                "version_info: \"2\"\nresources: [x]\n".to_string(),
            ),
            ("sds-new.yaml".to_string(), "new".to_string()),
        ]);
        let stages = stages(&from, &to);
        let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
        assert_eq!(
            what,
            [
                "secrets and other files",
                "listeners",
                "files no longer used"
            ]
        );
        assert_eq!(stages[2].remove, ["sds-old.yaml"]);
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
    fn subscriptions_from_backend_tls_secrets() {
        let cds = "resources:\n- name: api\n  transport_socket:\n    typed_config:\n      common_tls_context:\n        validation_context_sds_secret_config:\n          name: backend.api.ca\n          sds_config:\n            path_config_source:\n              path: /etc/berth/xds/sds-backend.api.ca.yaml\n";
        let mut files = BTreeMap::from([(CDS_FILE.to_string(), cds.to_string())]);
        assert_eq!(subscriptions(&files), ["cluster_manager.cds"]);
        files.insert("sds-backend.api.ca.yaml".into(), "resources: []".into());
        assert_eq!(
            subscriptions(&files),
            ["cluster_manager.cds", "sds.backend.api.ca"]
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
        let want = |v: &str| -> BTreeMap<String, Option<String>> {
            subs.iter()
                .map(|s| (s.clone(), Some(v.to_string())))
                .collect()
        };
        assert_eq!(judge(None, &now, &want("7"), 1), Some(Ok(())));
        let mut before = now.clone();
        before.get_mut("http.web.rds.web").unwrap().refused = 1;
        before.get_mut("http.web.rds.web").unwrap().attempts = 4;
        before.get_mut("listener_manager.lds").unwrap().attempts = 4;
        // Generation 8 was written once; the routes refused it.
        let verdict = judge(Some(&before), &now, &want("8"), 1);
        assert!(
            matches!(verdict, Some(Err(ref d)) if d.contains("http.web.rds.web")),
            "{verdict:?}"
        );
        // Two renames, only one processed: keep waiting.
        assert_eq!(judge(Some(&before), &now, &want("8"), 2), None);
    }
}
