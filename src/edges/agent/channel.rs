//! The agent's end of the channel to the manager (DESIGN decision 15, on a Swarm): it dials
//! the manager's address (an IP: the agent runs in images without a resolver) with its proxy's
//! client certificate, says which files its Envoy serves, and applies each stage the manager
//! sends exactly as berth applies one on a single host ([`crate::infra::delivery::apply`]: renames
//! into the watched directory, then the confirmation from its own Envoy's admin socket), and
//! answers with the verdict. When the manager is away the agent keeps its files and dials
//! again every [`REDIAL`]; its Envoy never notices.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::core::agent_wire::{
    self as wire, agent_message, manager_message, stage_result::Verdict,
};
use crate::envoy::admin::Admin;
use crate::infra::delivery::{self, Ack, Replica};

/// How soon the agent dials again after the manager went away or could not be reached.
pub const REDIAL: Duration = Duration::from_secs(1);
/// How long a starting agent waits for the manager's current files before it starts Envoy
/// from the baseline the service spec carries.
pub const STARTUP_SYNC: Duration = Duration::from_secs(3);

pub use crate::core::agent::channel::*;

/// What the channel needs, from the environment the service sets.
#[derive(Debug, Clone)]
pub struct ChannelSettings {
    pub manager: SocketAddr,
    pub proxy: String,
    /// The task's name (Envoy's `--service-node`).
    pub task: String,
    pub watched: PathBuf,
    pub baseline: PathBuf,
    pub credentials: PathBuf,
    /// Where the certificate copies go (`tls/…` files of the live set); None: the task's
    /// service carries none.
    pub tls: Option<PathBuf>,
    pub admin_socket: PathBuf,
}

impl ChannelSettings {
    /// From the environment; None when the task's files do not come through the channel.
    pub fn from_env(admin_socket: PathBuf) -> Result<Option<ChannelSettings>> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let Some(manager) = var(ENV_MANAGER) else {
            return Ok(None);
        };
        let manager = manager
            .parse()
            .with_context(|| format!("{ENV_MANAGER}={manager}: not an IP:port"))?;
        let need = |k: &str| var(k).with_context(|| format!("{k} is not set"));
        Ok(Some(ChannelSettings {
            manager,
            proxy: need(ENV_PROXY)?,
            task: var(crate::core::agent::ENV_SERVICE_NODE)
                .unwrap_or_else(|| "unknown-task".into()),
            watched: need(ENV_WATCHED)?.into(),
            baseline: need(ENV_BASELINE)?.into(),
            credentials: need(ENV_CREDENTIALS)?.into(),
            tls: var(ENV_TLS).map(PathBuf::from),
            admin_socket,
        }))
    }
}

/// Copies the baseline (the files the service spec carries) into the empty watched directory,
/// and its certificate copies (`<baseline>/tls/<owner>/<file>`) into the TLS directory: what
/// Envoy serves until the manager says otherwise.
pub fn seed_watched(settings: &ChannelSettings) -> Result<()> {
    if let Some(tls) = &settings.tls {
        if read_tls(tls)?.is_empty() {
            let copies = read_tls(&settings.baseline.join("tls"))?;
            write_tls(tls, &copies)?;
        }
    }
    let mut have = read_files(&settings.watched)?;
    if !have.is_empty() {
        return Ok(());
    }
    have = read_files(&settings.baseline)?;
    let stage = delivery::Stage {
        what: "baseline",
        write: have,
        remove: Vec::new(),
    };
    delivery::write_stage(&settings.watched, &stage).map(|_| ())
}

/// The certificate copies under a TLS directory, as the live set names them
/// (`tls/<owner>/<file>`).
fn read_tls(dir: &std::path::Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let owners = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    for owner in owners {
        let owner = owner?;
        if !owner.path().is_dir() {
            continue;
        }
        let name = owner.file_name().to_string_lossy().into_owned();
        for (file, text) in read_files(&owner.path())? {
            out.insert(format!("{TLS_PREFIX}{name}/{file}"), text);
        }
    }
    Ok(out)
}

/// Writes certificate copies (`tls/<owner>/<file>` → text) into the TLS directory, each by an
/// atomic rename; keys readable by this user only.
fn write_tls(dir: &std::path::Path, copies: &BTreeMap<String, String>) -> Result<()> {
    for (name, text) in copies {
        let path = tls_path(dir, name)?;
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
        let mode = if file.is_some_and(|f| f.starts_with("key")) {
            0o400
        } else {
            0o444
        };
        crate::state::write_atomic(&path, text.as_bytes(), mode)?;
    }
    Ok(())
}

/// Where a `tls/<owner>/<file>` name lives under the TLS directory; anything else (another
/// depth, `..`) is refused.
fn tls_path(dir: &std::path::Path, name: &str) -> Result<PathBuf> {
    let rest = name.strip_prefix(TLS_PREFIX).unwrap_or(name);
    let parts: Vec<&str> = rest.split('/').collect();
    let plain = |p: &str| !p.is_empty() && p != "." && p != ".." && !p.starts_with('.');
    match parts.as_slice() {
        [owner, file] if plain(owner) && plain(file) => Ok(dir.join(owner).join(file)),
        _ => anyhow::bail!("not a certificate copy's name: {name:?}"),
    }
}

/// The watched files (the names Envoy reads) and their text.
fn read_files(dir: &std::path::Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Swarm mounts configs as files; temp files of an interrupted write start with a dot.
        if name.starts_with('.') || !entry.path().is_file() {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())
            .with_context(|| format!("cannot read {}", entry.path().display()))?;
        out.insert(name, text);
    }
    Ok(out)
}

/// Keeps the channel: dials, serves the manager's stages, dials again when it ends. `synced`
/// is set once the manager said the files are current (a starting agent waits for it);
/// `envoy_up` says whether Envoy runs (before, stages are written without confirmation).
pub async fn keep(
    settings: ChannelSettings,
    synced: watch::Sender<bool>,
    envoy_up: watch::Receiver<bool>,
) {
    let mut said_away = false;
    loop {
        match session(&settings, &synced, &envoy_up).await {
            Ok(()) => {
                say(&format!(
                    "the manager at {} closed the channel",
                    settings.manager
                ));
                said_away = false;
            }
            Err(e) => {
                if !said_away {
                    say(&format!(
                        "no channel to the manager at {} ({e:#}); serving the files it has, dialing again every {}s",
                        settings.manager,
                        REDIAL.as_secs()
                    ));
                    said_away = true;
                }
                // Nobody to wait for: a starting agent goes on with the baseline.
                let _ = synced.send(true);
            }
        }
        tokio::time::sleep(REDIAL).await;
    }
}

async fn session(
    settings: &ChannelSettings,
    synced: &watch::Sender<bool>,
    envoy_up: &watch::Receiver<bool>,
) -> Result<()> {
    let read = |f: &str| {
        let p = settings.credentials.join(f);
        std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))
    };
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(CA_FILE)?))
        .identity(Identity::from_pem(read(CERT_FILE)?, read(KEY_FILE)?))
        .domain_name(MANAGER_NAME);
    let channel = Endpoint::from_shared(format!("https://{}", settings.manager))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(2))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect()
        .await
        .context("cannot connect")?;
    let mut client = wire::agent_channel_client::AgentChannelClient::new(channel);
    let (tx, rx) = mpsc::channel::<wire::AgentMessage>(16);
    let mut files = read_files(&settings.watched)?;
    if let Some(tls) = &settings.tls {
        files.extend(read_tls(tls)?);
    }
    let (rss_bytes, cpu_seconds) = own_cost();
    let starting = !*envoy_up.borrow();
    tx.send(wire::AgentMessage {
        message: Some(agent_message::Message::Hello(wire::Hello {
            proxy: settings.proxy.clone(),
            task: settings.task.clone(),
            node: hostname(),
            files: files.into_iter().collect(),
            starting,
            rss_bytes,
            cpu_seconds,
            kernel: kernel_settings(),
        })),
    })
    .await?;
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client
        .attach(outbound)
        .await
        .context("the manager refused the channel")?
        .into_inner();
    say(&format!(
        "channel to the manager at {} open",
        settings.manager
    ));
    let admin: Arc<dyn crate::envoy::admin::AdminApi> =
        Arc::new(Admin::new(&settings.admin_socket).with_timeout(delivery::ADMIN_TIMEOUT));
    while let Some(message) = inbound.message().await? {
        match message.message {
            Some(manager_message::Message::Synced(_)) => {
                let _ = synced.send(true);
            }
            Some(manager_message::Message::Stage(stage)) => {
                let up = *envoy_up.borrow();
                let result = apply(settings, &admin, &stage, up).await;
                tx.send(wire::AgentMessage {
                    message: Some(agent_message::Message::Result(result)),
                })
                .await?;
            }
            None => {}
        }
    }
    Ok(())
}

/// One stage: certificate copies written into the TLS directory first, the watched files
/// renamed into the watched directory and confirmed by this task's Envoy when it runs, copies
/// no longer used removed last; then, when the stage names serials, until Envoy serves them.
async fn apply(
    settings: &ChannelSettings,
    admin: &Arc<dyn crate::envoy::admin::AdminApi>,
    stage: &wire::Stage,
    envoy_up: bool,
) -> wire::StageResult {
    let timeout = Duration::from_millis(u64::from(stage.timeout_ms.max(1)));
    let started = tokio::time::Instant::now();
    let (v, detail, millis) = match apply_stage(settings, admin, stage, envoy_up, timeout).await {
        Ok(Ack::Confirmed { millis }) => (Verdict::Confirmed, String::new(), millis),
        Ok(Ack::Rejected { detail }) => (Verdict::Rejected, detail, 0),
        Ok(Ack::NoAnswer { detail }) => (Verdict::NoAnswer, detail, 0),
        Err(e) => (Verdict::NoAnswer, format!("{e:#}"), 0),
    };
    let millis = if v == Verdict::Confirmed && millis == 0 {
        started.elapsed().as_millis() as u64
    } else {
        millis
    };
    if v != Verdict::Confirmed {
        say(&format!("{}: {}: {detail}", stage.what, v.as_str_name()));
    }
    wire::StageResult {
        id: stage.id,
        verdict: v as i32,
        detail,
        millis,
    }
}

async fn apply_stage(
    settings: &ChannelSettings,
    admin: &Arc<dyn crate::envoy::admin::AdminApi>,
    stage: &wire::Stage,
    envoy_up: bool,
    timeout: Duration,
) -> Result<Ack> {
    let is_tls = |n: &String| n.starts_with(TLS_PREFIX);
    let (copies, write): (BTreeMap<String, String>, BTreeMap<String, String>) = stage
        .write
        .clone()
        .into_iter()
        .partition(|(n, _)| is_tls(n));
    let (unused, remove): (Vec<String>, Vec<String>) =
        stage.remove.iter().cloned().partition(is_tls);
    let tls = || {
        settings
            .tls
            .as_deref()
            .context("certificate copies, and this task has no TLS directory (BERTH_AGENT_TLS_DIR)")
    };
    if !copies.is_empty() {
        write_tls(tls()?, &copies)?;
    }
    let local = delivery::Stage {
        what: "stage",
        write,
        remove,
    };
    let me = [Replica {
        name: settings.task.clone(),
        admin: admin.clone(),
    }];
    let started = tokio::time::Instant::now();
    let log = super::envoy_log::mark();
    let mut ack = Ack::Confirmed { millis: 0 };
    if !local.write.is_empty() || !local.remove.is_empty() {
        if !envoy_up {
            delivery::write_stage(&settings.watched, &local)?;
        } else {
            ack = match delivery::apply(&settings.watched, &local, &me, timeout).await {
                Ok(mut acks) => acks
                    .remove(&settings.task)
                    .unwrap_or(Ack::Confirmed { millis: 0 }),
                Err(delivery::StageError::Unconfirmed(mut acks)) => {
                    acks.remove(&settings.task).unwrap_or(Ack::NoAnswer {
                        detail: "no verdict".into(),
                    })
                }
                Err(delivery::StageError::Io(e)) => return Err(e),
            };
        }
    }
    if let Ack::Rejected { detail } = &ack {
        // Envoy logs its reason as it refuses; the pipe may still hold it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(why) = super::envoy_log::why_since(log) {
            ack = Ack::Rejected {
                detail: format!("{detail}; Envoy: {why}"),
            };
        }
    }
    if !matches!(ack, Ack::Confirmed { .. }) {
        return Ok(ack);
    }
    if !unused.is_empty() {
        let dir = tls()?;
        for name in &unused {
            let _ = std::fs::remove_file(tls_path(dir, name)?);
        }
    }
    if envoy_up && !stage.serials.is_empty() {
        let mut served = delivery::certificates_served(&me, &stage.serials, started, timeout).await;
        ack = served.remove(&settings.task).unwrap_or(Ack::NoAnswer {
            detail: "no verdict".into(),
        });
    }
    Ok(ack)
}

/// The agent's resident memory (bytes) and CPU time so far (seconds), from /proc.
pub fn own_cost() -> (u64, f64) {
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * 4096)
        .unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command (which may hold spaces) in parentheses.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0);
    (rss, cpu)
}

/// The kernel settings berth tunes, as this task's namespaces show them.
fn kernel_settings() -> std::collections::HashMap<String, u64> {
    let sysctls = crate::host::sysctl::Sysctls::default();
    crate::host::sysctl::Key::ALL
        .into_iter()
        .filter_map(|k| Some((k.name().to_string(), sysctls.get(k)?)))
        .collect()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn say(what: &str) {
    eprintln!("berth agent: {what}");
}
