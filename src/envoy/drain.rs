//! Draining one Envoy without losing a request (DESIGN decision 6): the sequence berth runs on
//! a retiring replica from outside (`infrastructure::docker_host::retire`) and `berth agent`
//! runs on its own Envoy from inside the container when it is told to stop (`agent::run`).
//!
//! The order, measured best under keep-alive load, with Envoy Gateway's shutdown settings
//! ([`Shutdown`]) as its shutdown manager reads them:
//!
//! 1. `/drain_listeners?graceful&skip_exit` and `/healthcheck/fail`: Envoy answers every
//!    request with `connection: close`; its listen sockets stay open. With a
//!    `health_check_failure_delay` the health check fails only that long after the drain began
//!    (EG's order), for load balancers that probe the replica.
//! 2. Wait for 0 downstream connections, not before `min_drain_duration` nor before the health
//!    check failed. A keep-alive client that reconnects lands on a sibling or, now and then, on
//!    this replica again and is closed after one response; once on a sibling it stays there,
//!    so the count falls to 0 within the minimum drain time and the listen socket is idle.
//! 3. `/drain_listeners`: close the listen sockets. Closing them while idle is what makes this
//!    order lose nothing even without `net.ipv4.tcp_migrate_req` (a connection still in a
//!    closing socket's accept queue is otherwise reset). Clients that open a new connection
//!    per request keep an open listener busy for ever, so after [`LISTEN_GRACE`] more the
//!    sockets are closed anyway (that relies on `tcp_migrate_req`, which berth sets).
//! 4. Wait for the remaining connections, at most `drain_timeout` (EG's drain window, also
//!    Envoy's `--drain-time-s`) in all.
//!
//! [`Schedule`] decides each step from the clock and the open connections alone (pure, unit
//! tested); [`drain`] performs the steps against an admin API.

use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use crate::core::crashpoint;
use crate::core::ir::Shutdown;
use crate::envoy::admin::AdminApi;

/// How often connection counts are polled while draining.
pub const POLL: Duration = Duration::from_millis(50);

/// How long a draining Envoy keeps its listen sockets open past the minimum drain time while
/// connections are still open, before they are closed anyway (step 3).
pub const LISTEN_GRACE: Duration = Duration::from_secs(2);

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Downstream connections still open when it ended (0 unless the drain timed out).
    pub left: u64,
    pub elapsed: Duration,
}

/// The next thing a drain does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `POST /healthcheck/fail` (its delay is over).
    FailHealthCheck,
    /// `POST /drain_listeners`: close the listen sockets.
    CloseListeners,
    /// Poll again after [`POLL`].
    Wait,
    /// The drain is over.
    Done,
}

/// The drain's deadlines and what has been done so far: decides each [`Step`].
#[derive(Debug, Clone)]
pub struct Schedule {
    started: Instant,
    fail_at: Instant,
    earliest: Instant,
    close_by: Instant,
    deadline: Instant,
    health_failed: bool,
    listening: bool,
}

impl Schedule {
    pub fn new(started: Instant, shutdown: &Shutdown) -> Schedule {
        let fail_at = started + shutdown.health_check_failure_delay;
        let deadline = started + shutdown.drain_timeout;
        let earliest = (started + shutdown.min_drain_duration).max(fail_at);
        Schedule {
            started,
            fail_at,
            earliest,
            close_by: (earliest + LISTEN_GRACE).min(deadline),
            deadline,
            health_failed: false,
            listening: true,
        }
    }

    /// Records a health check failed outside [`Schedule::step`] (at the start, without delay).
    pub fn health_check_failed(&mut self) {
        self.health_failed = true;
    }

    /// The step due at `now` with `open` downstream connections; the caller performs it. A
    /// step other than Wait and Done counts as done once returned.
    pub fn step(&mut self, now: Instant, open: u64) -> Step {
        if !self.health_failed && (now >= self.fail_at || now >= self.deadline) {
            self.health_failed = true;
            return Step::FailHealthCheck;
        }
        let idle = open == 0 && now >= self.earliest;
        if self.listening {
            if idle || now >= self.close_by {
                self.listening = false;
                return Step::CloseListeners;
            }
            return Step::Wait;
        }
        if idle || now >= self.deadline {
            return Step::Done;
        }
        Step::Wait
    }

    pub fn elapsed(&self, now: Instant) -> Duration {
        now - self.started
    }
}

/// Drains the Envoy behind `admin` (the module docs give the order and why). `waiting` is told
/// the open connections at every poll, for progress.
pub async fn drain(
    admin: &dyn AdminApi,
    shutdown: &Shutdown,
    mut waiting: impl FnMut(u64),
) -> Result<Drained> {
    let mut schedule = Schedule::new(Instant::now(), shutdown);
    if shutdown.health_check_failure_delay.is_zero() {
        admin.healthcheck_fail().await?;
        schedule.health_check_failed();
    }
    admin.drain_listeners(true).await?;
    crashpoint::reached("mid-drain");
    loop {
        let open = admin.downstream_connections().await.unwrap_or(0);
        let now = Instant::now();
        match schedule.step(now, open) {
            Step::FailHealthCheck => admin.healthcheck_fail().await?,
            Step::CloseListeners => admin.drain_listeners(false).await?,
            Step::Done => {
                return Ok(Drained {
                    left: open,
                    elapsed: schedule.elapsed(now),
                })
            }
            Step::Wait => {
                waiting(open);
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

#[cfg(test)]
mod tests;
