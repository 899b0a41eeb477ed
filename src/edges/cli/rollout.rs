//! `berth rollout status|pause|resume|promote|undo [PROXY]`: what is rolling, and steering it.
//!
//! Whoever runs a rollout (a foreground `berth up`, or serve) records it in the proxy's
//! `rollout.json` in the state directory and looks, every second, for the requests this
//! command leaves beside it ([`crate::state::rollout`]): the same for both, and no socket to
//! find. A request nobody picks up within a few seconds is reported as such.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Subcommand;

use super::settings::Resolved;
use super::{Cli, Output};
use crate::core::rollout::Sample;
use crate::state::rollout::{Request, RolloutFiles};

#[derive(Debug, Clone, Subcommand)]
pub enum Verb {
    /// What is rolling: the spec it goes to, a canary's hold and its numbers against the old
    /// replicas, time left, pause.
    Status { proxy: Option<String> },
    /// Hold the rollout: a canary's hold stops counting; waves stop before the next one.
    Pause { proxy: Option<String> },
    /// Go on after a pause.
    Resume { proxy: Option<String> },
    /// End a canary's hold now and roll the rest.
    Promote { proxy: Option<String> },
    /// Back to the previous spec: the canaries (or the replicas replaced so far) drain and the
    /// old spec stays, also on later passes, until the config asks for another spec. With
    /// nothing rolling, the last finished rollout is undone: its replicas go back lossless,
    /// `max_surge` at a time, as `berth up` runs them (through serve when serve holds the state
    /// directory).
    Undo { proxy: Option<String> },
}

/// How long a request may wait to be picked up before the command says so.
const PICK_UP: Duration = Duration::from_secs(10);

pub(super) async fn command(cli: &Cli, verb: &Verb) -> Result<()> {
    let resolved = Resolved::load_optional(cli)?;
    let state = resolved.state_dir.as_path();
    let (proxy, request) = match verb {
        Verb::Status { proxy } => return status(cli, state, proxy.as_deref()),
        Verb::Pause { proxy } => (proxy, Request::Pause),
        Verb::Resume { proxy } => (proxy, Request::Resume),
        Verb::Promote { proxy } => (proxy, Request::Promote),
        Verb::Undo { proxy } => (proxy, Request::Undo),
    };
    let now_rolling = rolling(state);
    let finished = match proxy {
        Some(p) => !now_rolling.contains(p),
        None => now_rolling.is_empty(),
    };
    if request == Request::Undo && finished {
        return undo_finished(cli, &resolved, proxy.as_deref()).await;
    }
    let name = one_rolling(state, proxy.as_deref())?;
    let files = RolloutFiles::new(state, &name);
    if request == Request::Promote && files.read().is_none_or(|r| r.canaries.is_empty()) {
        bail!("{name}: no canary is holding; promote ends a canary's hold");
    }
    files.request(request)?;
    let said = match request {
        Request::Pause => {
            "paused (the hold stops counting; waves stop before the next one)".to_string()
        }
        Request::Resume => "resumed".to_string(),
        Request::Promote | Request::Undo => {
            let started = std::time::Instant::now();
            while files.take_pending(request) && started.elapsed() < PICK_UP {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if files.take_pending(request) {
                format!(
                    "requested, not picked up within {}s: is the berth running this rollout \
                     (up or serve) still there?",
                    PICK_UP.as_secs()
                )
            } else if request == Request::Promote {
                "promoted: the rest of the rollout goes on".to_string()
            } else {
                "undone: the new replicas drain, the previous spec stays until the config asks \
                 for another one"
                    .to_string()
            }
        }
    };
    if !cli.quiet {
        println!("{name}: {said}");
    }
    Ok(())
}

/// `undo` with nothing rolling: the last finished rollout of PROXY (or of the only proxy that
/// has one) goes back to the spec it came from. The undone spec is recorded as held, and the
/// config is applied as `berth up` does (through serve when serve holds the state directory):
/// the replicas go back lossless, `max_surge` at a time, each gated, and stay there until the
/// config asks for another spec.
async fn undo_finished(cli: &Cli, resolved: &Resolved, named: Option<&str>) -> Result<()> {
    let state = resolved.state_dir.as_path();
    let name = match named {
        Some(n) => n.to_string(),
        None => {
            let with: Vec<String> = resolved
                .targets
                .iter()
                .map(|t| t.name().to_string())
                .filter(|n| RolloutFiles::new(state, n).previous().is_some())
                .collect();
            match with.as_slice() {
                [one] => one.clone(),
                [] => bail!(
                    "nothing is rolling in {}, and no proxy of the config has a finished \
                     rollout to undo",
                    state.display()
                ),
                many => bail!(
                    "nothing is rolling; several proxies have a finished rollout to undo ({}): \
                     name one",
                    many.join(", ")
                ),
            }
        }
    };
    let files = RolloutFiles::new(state, &name);
    let Some((from, to)) = files.previous() else {
        bail!("{name}: nothing is rolling, and no finished rollout is recorded to undo");
    };
    let short = crate::core::replica::short_hash;
    if files.undone().as_deref() == Some(to.as_str()) {
        bail!(
            "{name}: the rollout to spec {} is undone already; the replicas stay on spec {} \
             until the config asks for another one",
            short(&to),
            short(&from)
        );
    }
    let Some(target) = resolved.targets.iter().find(|t| t.name() == name) else {
        bail!("{name}: not in the config");
    };
    if target.desired.hash != to {
        bail!(
            "{name}: the config asks for spec {} now, not spec {} that the last rollout rolled \
             out: nothing to undo (edit the config instead)",
            short(&target.desired.hash),
            short(&to)
        );
    }
    if crate::state::StateDir::at(state)
        .read_spec(&name, &from)
        .is_none()
    {
        bail!(
            "{name}: the previous spec {} is no longer recorded; edit the config back instead",
            short(&from)
        );
    }
    files.set_undone(&to)?;
    if !cli.quiet {
        eprintln!(
            "{name}: undoing the rollout to spec {}: back to spec {}, held until the config \
             asks for another one",
            short(&to),
            short(&from)
        );
    }
    super::commands::up(cli, false).await
}

/// The proxy a steering verb is for: `named`, which must be rolling, or the only one rolling.
fn one_rolling(state: &Path, named: Option<&str>) -> Result<String> {
    let rolling = rolling(state);
    match named {
        Some(n) if rolling.iter().any(|r| r == n) => Ok(n.to_string()),
        Some(n) => bail!("{n}: nothing is rolling (no rollout.json in its state directory)"),
        None => match rolling.as_slice() {
            [one] => Ok(one.clone()),
            [] => bail!("nothing is rolling in {}", state.display()),
            many => bail!(
                "several proxies are rolling ({}): name one",
                many.join(", ")
            ),
        },
    }
}

/// The proxies of `state` with a rollout under way.
fn rolling(state: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(state.join("proxies")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| RolloutFiles::new(state, n).read().is_some())
        .collect();
    names.sort();
    names
}

/// A canary's (or its baseline's) numbers since the hold began, for `-o json`.
fn numbers(s: &Sample) -> serde_json::Value {
    serde_json::json!({
        "requests": s.requests,
        "failed": s.failed(),
        "errors5xx": s.errors_5xx,
        "resets": s.resets,
        "upstreamConnectFailures": s.connect_failures,
    })
}

fn status(cli: &Cli, state: &Path, proxy: Option<&str>) -> Result<()> {
    let now = crate::state::rollout::now_secs();
    let names: Vec<String> = match proxy {
        Some(p) => vec![p.to_string()],
        None => rolling(state),
    };
    let rows: Vec<serde_json::Value> = names
        .iter()
        .map(|n| {
            let files = RolloutFiles::new(state, n);
            let r = files.read();
            let phase = match &r {
                None => "idle",
                Some(r) if files.paused() || r.paused_at.is_some() => "paused",
                Some(r) if !r.canaries.is_empty() => "canary",
                Some(_) => "rolling",
            };
            serde_json::json!({
                "proxy": n,
                "phase": phase,
                "toSpec": r.as_ref().map(|r| crate::core::replica::short_hash(&r.to_hash).to_string()),
                "canaries": r.as_ref().map(|r| r.canaries.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>()),
                "heldSeconds": r.as_ref().filter(|r| !r.canaries.is_empty()).map(|r| r.held(now).as_secs()),
                "holdSeconds": r.as_ref().filter(|r| !r.canaries.is_empty()).map(|r| r.hold_secs),
                "canaryNumbers": r.as_ref().and_then(|r| r.canary_numbers.as_ref()).map(numbers),
                "baselineNumbers": r.as_ref().and_then(|r| r.baseline_numbers.as_ref()).map(numbers),
                "last": r.as_ref().map(|r| r.last.clone()),
                "undone": files.undone().map(|h| crate::core::replica::short_hash(&h).to_string()),
            })
        })
        .collect();
    if cli.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("nothing is rolling");
        return Ok(());
    }
    println!(
        "{:<16} {:<8} {:<13} {:<10} LAST",
        "PROXY", "PHASE", "TO SPEC", "HELD"
    );
    for r in &rows {
        let held = match (r["heldSeconds"].as_u64(), r["holdSeconds"].as_u64()) {
            (Some(h), Some(of)) => format!("{h}s/{of}s"),
            _ => "-".to_string(),
        };
        let mut last = r["last"].as_str().unwrap_or("").to_string();
        if let Some(u) = r["undone"].as_str() {
            last = format!("spec {u} undone, held on the previous one; {last}");
        }
        println!(
            "{:<16} {:<8} {:<13} {:<10} {}",
            r["proxy"].as_str().unwrap_or(""),
            r["phase"].as_str().unwrap_or(""),
            r["toSpec"].as_str().unwrap_or("-"),
            held,
            last
        );
    }
    Ok(())
}
