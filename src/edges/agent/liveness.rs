//! The agent's liveness watch (DESIGN decision 14, on a Swarm): a task's Envoy that stops
//! serving while it keeps its socket is a black hole in the port its siblings share
//! (SO_REUSEPORT), and the agent, which still runs, is the one that can see it at once. Every
//! [`CADENCE`] (1 s) it asks its Envoy's admin `/ready` (timeout [`PROBE_TIMEOUT`], 1 s) and
//! reads Envoy's state and CPU from `/proc/<pid>` (state `T`: stopped by a signal; the CPU of
//! Envoy's own threads, not the container's, which holds the agent too), and feeds the one
//! judge ([`crate::core::liveness::Tracker`]). Judged dead, Envoy's process group gets
//! SIGKILL and the agent logs one line:
//!
//! ```text
//! berth agent: Envoy (pid 7) killed: its Envoy is stopped by a signal (silent for 2.0 s)
//! ```
//!
//! The agent then exits with Envoy's status (137), as whenever Envoy ends, and Swarm
//! replaces the task (restart condition `any`). The watch never kills an Envoy that has not
//! answered yet (starting: the health check's start period covers that), and it ends when the agent starts draining (a drain is the
//! agent's own doing, and its admin calls would compete with the probe).
//!
//! A frozen task (`docker pause`: the agent frozen too) is out of the agent's reach: only
//! Swarm's health check acts there (see `infra::swarm::service`'s health config).

use std::path::Path;
use std::time::Duration;

use crate::core::liveness::{
    DeadReason, Probe, Thresholds, Tracker, Verdict, CADENCE, PROBE_TIMEOUT,
};
use crate::envoy::admin::Admin;
use crate::host::process;

/// Why Envoy was killed and how long it had been silent, once the watch acted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Killed {
    pub reason: DeadReason,
    pub silent: Option<Duration>,
}

/// Watches Envoy (`pid`, the leader of its own process group) until it is judged dead, then
/// kills its process group and returns why. Runs forever while Envoy lives: the caller drops
/// it when Envoy exits or the agent starts draining.
pub async fn watch(admin_socket: &Path, pid: u32) -> Killed {
    let admin = Admin::new(admin_socket).with_timeout(PROBE_TIMEOUT);
    let mut tracker = Tracker::new(Thresholds::default());
    let mut tick = tokio::time::interval(CADENCE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // State and CPU before the probe: the window then ends where the silence is measured.
        let stopped_by_signal = process::stopped_by_signal(pid);
        let cpu = process::process_cpu_time(pid);
        let answered = admin.ready().await.is_ok();
        let probe = Probe {
            answered,
            paused: false,
            stopped_by_signal,
            cpu,
        };
        let now = tokio::time::Instant::now().into_std();
        let verdict = tracker.observe(now, probe);
        // Never while Envoy starts: until it has answered once, the health check's start
        // period and Swarm judge it.
        let (Verdict::Dead(reason), Some(last)) = (verdict, tracker.last_answer()) else {
            continue;
        };
        {
            let silent = Some(now.saturating_duration_since(last));
            kill_group(pid);
            let killed = Killed { reason, silent };
            eprintln!("berth agent: {}", killed.line(pid));
            return killed;
        }
    }
}

impl Killed {
    /// The log line (after `berth agent: `).
    pub fn line(&self, pid: u32) -> String {
        let silent = match self.silent {
            Some(d) => format!("{:.1} s", d.as_secs_f64()),
            None => "ever since it started".to_string(),
        };
        format!(
            "Envoy (pid {pid}) killed: {} (silent for {silent})",
            self.reason
        )
    }
}

/// SIGKILL to Envoy's process group (Envoy and anything it started; a stopped process dies
/// of SIGKILL too).
fn kill_group(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    // SAFETY: kill(2) with a negative pid (a process group we created) and a valid signal.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_pid_the_reason_and_the_silence() {
        let k = Killed {
            reason: DeadReason::StoppedBySignal,
            silent: Some(Duration::from_millis(2040)),
        };
        assert_eq!(
            k.line(7),
            "Envoy (pid 7) killed: its Envoy is stopped by a signal (silent for 2.0 s)"
        );
    }

    /// Answers every admin call on `socket` with 200 LIVE until `stop`.
    fn fake_admin(socket: &Path) -> tokio_util::sync::CancellationToken {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::UnixListener::bind(socket).expect("bind the fake admin");
        let stop = tokio_util::sync::CancellationToken::new();
        let cancelled = stop.clone();
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = tokio::select! {
                    _ = cancelled.cancelled() => return,
                    c = listener.accept() => c.expect("accept"),
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf).await;
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nLIVE")
                        .await;
                });
            }
        });
        stop
    }

    fn sleep() -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .expect("sleep runs")
    }

    fn sigstop(child: &std::process::Child) {
        // SAFETY: kill(2) with our child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    }

    /// A process that answered (a fake admin socket) and then stops (the socket gone, the
    /// process SIGSTOPped): judged dead after 2 s of silence, its process group killed.
    #[tokio::test]
    async fn a_process_that_answered_then_stopped_is_killed_with_its_group() {
        use std::os::unix::process::ExitStatusExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("admin.sock");
        let admin = fake_admin(&socket);
        let mut child = sleep();
        let pid = child.id();
        let watching = tokio::spawn({
            let socket = socket.clone();
            async move { watch(&socket, pid).await }
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        admin.cancel();
        let _ = std::fs::remove_file(&socket);
        sigstop(&child);
        let silent_from = std::time::Instant::now();
        let killed = tokio::time::timeout(Duration::from_secs(10), watching)
            .await
            .expect("judged within 10 s")
            .unwrap();
        assert_eq!(killed.reason, DeadReason::StoppedBySignal);
        let silent = killed.silent.expect("it answered once");
        assert!(silent >= Duration::from_secs(2), "{killed:?}");
        assert!(silent_from.elapsed() < Duration::from_secs(5), "{killed:?}");
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    /// Stopped before it ever answered: starting, never killed by the watch.
    #[tokio::test]
    async fn a_process_that_never_answered_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = sleep();
        sigstop(&child);
        let pid = child.id();
        let waited = tokio::time::timeout(
            Duration::from_millis(3500),
            watch(&dir.path().join("admin.sock"), pid),
        )
        .await;
        assert!(waited.is_err(), "killed while starting: {waited:?}");
        assert!(
            process::stopped_by_signal(pid),
            "still there, still stopped"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
