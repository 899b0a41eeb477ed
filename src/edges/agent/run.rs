//! `berth agent run -- <envoy argv…>`: the replica's entrypoint. Envoy runs as the agent's
//! child (its own process group, so a terminal's Ctrl-C reaches only the agent), with stdout
//! inherited and stderr too, or (with the agent channel) passed through the agent line by line
//! ([`super::envoy_log`]).
//!
//! - Envoy exits on its own: the agent exits with its code (128 + N when signal N killed it).
//! - Envoy hangs (stopped by a signal, or silent while it uses no CPU): the liveness watch
//!   ([`super::liveness`]) kills its process group; the agent exits 137 and Swarm replaces the
//!   task. The watch ends when a drain starts.
//! - SIGTERM or SIGINT (`docker stop`, Swarm retiring a task): the agent drains Envoy with the
//!   sequence berth uses on one host ([`crate::envoy::drain`]: fail health checks, graceful drain,
//!   wait for 0 downstream connections or the drain timeout, close the listeners), then sends
//!   Envoy SIGTERM (SIGKILL after [`ENVOY_EXIT_TIMEOUT`]) and exits with Envoy's status. A
//!   second SIGTERM/SIGINT cuts the drain short. The whole stop takes at most the drain timeout
//!   plus [`super::STOP_MARGIN`]: the service's stop grace period ([`super::stop_grace_period`]).
//! - SIGHUP, SIGQUIT, SIGUSR1 (Envoy reopens its access logs), SIGUSR2: forwarded to Envoy.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use super::settings::Settings;
use crate::envoy::admin::Admin;

/// How long Envoy gets to exit after SIGTERM once drained, before SIGKILL.
pub const ENVOY_EXIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of one admin call while draining.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the drain's progress is logged at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Runs Envoy (`envoy[0]` with the rest as its arguments) until it exits or the agent is told
/// to stop; returns the exit code the agent ends with (Envoy's).
pub async fn run(settings: &Settings, envoy: &[String]) -> Result<i32> {
    let (program, args) = envoy
        .split_first()
        .context("no Envoy command given after `--`")?;
    // Handlers first: a stop signal that comes while Envoy starts must still drain it.
    let mut stop = Stops::new()?;
    let mut forwarded = Forwarded::new()?;
    // With the agent channel: the watched files come from the manager (the baseline the
    // service spec carries until it answers), and Envoy starts once they are current.
    let (envoy_up, envoy_up_rx) = tokio::sync::watch::channel(false);
    let mut live = false;
    if let Some(channel) = super::channel::ChannelSettings::from_env(settings.admin_socket.clone())?
    {
        super::channel::seed_watched(&channel)?;
        let (synced, mut synced_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(super::channel::keep(channel, synced, envoy_up_rx));
        let _ =
            tokio::time::timeout(super::channel::STARTUP_SYNC, synced_rx.wait_for(|s| *s)).await;
        live = true;
    }
    let mut command = Command::new(program);
    command.args(args).process_group(0);
    if live {
        // Through the agent, which keeps its recent lines for the manager (Envoy's reason
        // when it refuses a stage).
        command.stderr(std::process::Stdio::piped());
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot start Envoy ({program})"))?;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(super::envoy_log::tee(stderr));
    }
    let pid = child
        .id()
        .context("Envoy exited before it could be watched")? as i32;
    say(&format!("started Envoy ({program}), pid {pid}"));
    let _ = envoy_up.send(true);

    let mut liveness = std::pin::pin!(super::liveness::watch(&settings.admin_socket, pid as u32));
    let mut watching = true;
    let why = loop {
        tokio::select! {
            status = child.wait() => return Ok(ended(status?, "")),
            // Killed: its end comes through `child.wait()`.
            _ = &mut liveness, if watching => watching = false,
            why = stop.next() => break why,
            sig = forwarded.next() => {
                // SAFETY: kill(2) with our child's pid and a valid signal.
                unsafe { libc::kill(pid, sig) };
            }
        }
    };
    say(&format!(
        "{why}: draining Envoy (drain timeout {}, minimum {})",
        humantime::format_duration(settings.shutdown.drain_timeout),
        humantime::format_duration(settings.shutdown.min_drain_duration)
    ));
    let admin = Admin::new(&settings.admin_socket).with_timeout(ADMIN_TIMEOUT);
    let mut last_said = Instant::now();
    let drain = crate::envoy::drain::drain(&admin, &settings.shutdown, |open| {
        if last_said.elapsed() >= PROGRESS_EVERY {
            say(&format!("draining: {open} connection(s) open"));
            last_said = Instant::now();
        }
    });
    tokio::select! {
        drained = drain => match drained {
            Ok(d) => say(&format!(
                "drained: {} connection(s) left after {:.1}s; stopping Envoy",
                d.left,
                d.elapsed.as_secs_f64()
            )),
            Err(e) => say(&format!("could not drain Envoy: {e:#}; stopping it")),
        },
        status = child.wait() => return Ok(ended(status?, " while draining")),
        why = stop.next() => say(&format!("{why} again: stopping Envoy without waiting")),
    }
    stop_envoy(&mut child, pid).await
}

/// Envoy's command line with `--service-node` set to `node` (the value after an existing
/// `--service-node` replaced, else the flag added at the end); unchanged when `node` is None
/// or empty.
pub fn with_service_node(envoy: &[String], node: Option<&str>) -> Vec<String> {
    let mut out = envoy.to_vec();
    let Some(node) = node.filter(|n| !n.is_empty()) else {
        return out;
    };
    match out.iter().position(|a| a == "--service-node") {
        Some(i) if i + 1 < out.len() => out[i + 1] = node.to_string(),
        Some(_) => out.push(node.to_string()),
        None => out.extend(["--service-node".to_string(), node.to_string()]),
    }
    out
}

/// SIGTERM, then SIGKILL after [`ENVOY_EXIT_TIMEOUT`]; Envoy's exit code.
async fn stop_envoy(child: &mut Child, pid: i32) -> Result<i32> {
    // SAFETY: kill(2) with our child's pid and a valid signal.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = match tokio::time::timeout(ENVOY_EXIT_TIMEOUT, child.wait()).await {
        Ok(status) => status?,
        Err(_) => {
            say(&format!(
                "Envoy did not exit within {ENVOY_EXIT_TIMEOUT:?} of SIGTERM: killing it"
            ));
            child.kill().await?;
            child.wait().await?
        }
    };
    Ok(ended(status, ""))
}

/// Says how Envoy ended and returns the exit code that passes it on.
fn ended(status: ExitStatus, when: &str) -> i32 {
    let code = exit_code(status);
    say(&format!("Envoy exited{when}: {status}; exiting {code}"));
    code
}

/// The shell's convention: the exit code, or 128 + N for a process killed by signal N.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn say(what: &str) {
    eprintln!("berth agent: {what}");
}

/// The stop signals.
struct Stops {
    term: Signal,
    int: Signal,
}

impl Stops {
    fn new() -> Result<Stops> {
        Ok(Stops {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// The signals passed on to Envoy.
struct Forwarded(Vec<(i32, Signal)>);

impl Forwarded {
    fn new() -> Result<Forwarded> {
        [libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2]
            .into_iter()
            .map(|sig| {
                signal(SignalKind::from_raw(sig))
                    .map(|s| (sig, s))
                    .with_context(|| format!("cannot handle signal {sig}"))
            })
            .collect::<Result<_>>()
            .map(Forwarded)
    }

    /// The next signal to forward.
    async fn next(&mut self) -> i32 {
        let waits = self.0.iter_mut().map(|(sig, s)| {
            let sig = *sig;
            Box::pin(async move {
                s.recv().await;
                sig
            })
        });
        futures_util::future::select_all(waits).await.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_node_is_replaced_or_added() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let envoy = argv(&["envoy", "--service-node", "berth-edge", "-l", "info"]);
        assert_eq!(
            with_service_node(&envoy, Some("berth-edge.2.abc")),
            argv(&["envoy", "--service-node", "berth-edge.2.abc", "-l", "info"])
        );
        assert_eq!(with_service_node(&envoy, None), envoy);
        assert_eq!(with_service_node(&envoy, Some("")), envoy);
        assert_eq!(
            with_service_node(&argv(&["envoy"]), Some("n")),
            argv(&["envoy", "--service-node", "n"])
        );
    }

    #[test]
    fn exit_codes_pass_on_envoys_end() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(1 << 8)), 1);
        // Killed by SIGKILL (9): 137, as a shell and Docker say.
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }
}
