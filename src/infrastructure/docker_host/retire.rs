//! Retiring a replica without losing a request (DESIGN decision 6).

use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use super::execute::{run_dir_name, Run};
use crate::admin::AdminApi;
use crate::crashpoint;
use crate::engine::{ObservedContainer, RunState};
use crate::infrastructure::ConvergeError;
use crate::ir::{RolloutPolicy, Shutdown};
use crate::plan::ContainerRef;
use crate::progress::{Event, Reporter};

/// How often connection counts are polled while draining.
const POLL: Duration = Duration::from_millis(50);
/// Timeout of one admin call while draining.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

impl Run<'_> {
    /// Retires a replica without losing a request: fail health checks, drain gracefully until
    /// its connections are gone, close the listen sockets (see [`drain`] for the order and
    /// why), then stop and remove.
    pub(super) async fn retire(
        &self,
        proxy: &str,
        container: &ContainerRef,
        observed: &[ObservedContainer],
        shutdown: &Shutdown,
        _policy: &RolloutPolicy, // the drain window is `shutdown.drain_timeout`
    ) -> Result<(), ConvergeError> {
        let run_name = run_dir_name(container, observed);
        let running = matches!(
            self.engine.status(&container.id).await?,
            Some(s) if s.state == RunState::Running
        );
        if running {
            let admin = self.host.admin(proxy, &run_name, ADMIN_TIMEOUT);
            self.reporter
                .event(Event::new(proxy, "draining").container(&container.name));
            let drained = drain(
                admin.as_ref(),
                shutdown,
                self.reporter,
                proxy,
                &container.name,
            )
            .await;
            // A drained replica has closed its listeners and has no connection left: removing
            // it (SIGKILL) loses nothing and saves a stop round trip. Without a drain, Envoy
            // gets its SIGTERM first.
            if drained.is_err() {
                self.reporter.event(
                    Event::new(proxy, "drain-skipped")
                        .container(&container.name)
                        .message("admin socket did not answer; stopping directly"),
                );
                self.engine.stop(&container.id, super::STOP_TIMEOUT).await?;
            }
        }
        self.engine.remove(&container.id).await?;
        self.host.forget_observation();
        crashpoint::reached("after-remove");
        let _ = std::fs::remove_dir_all(self.state.proxy(proxy).run(&run_name));
        self.reporter
            .event(Event::new(proxy, "removed").container(&container.name));
        Ok(())
    }
}

/// How long a retiring replica keeps its listen sockets open past the minimum drain time while
/// connections are still open, before they are closed anyway (see [`drain`]).
const LISTEN_GRACE: Duration = Duration::from_secs(2);

/// The drain sequence of DESIGN decision 6, in the order measured best under keep-alive load,
/// with Envoy Gateway's shutdown settings (`shutdown` of the IR) as its shutdown manager reads
/// them:
///
/// 1. `/drain_listeners?graceful&skip_exit` and `/healthcheck/fail`: Envoy answers every
///    request with `connection: close`; its listen sockets stay open. With a
///    `health_check_failure_delay` the health check fails only that long after the drain began
///    (EG's order), for load balancers that probe the replica.
/// 2. Wait for 0 downstream connections, not before `min_drain_duration` nor before the health
///    check failed. A keep-alive client that reconnects lands on a sibling or, now and then, on
///    this replica again and is closed after one response; once on a sibling it stays there,
///    so the count falls to 0 within the minimum drain time and the listen socket is idle.
/// 3. `/drain_listeners`: close the listen sockets. Closing them while idle is what makes this
///    order lose nothing even without `net.ipv4.tcp_migrate_req` (a connection still in a
///    closing socket's accept queue is otherwise reset). Clients that open a new connection
///    per request keep an open listener busy for ever, so after `LISTEN_GRACE` more the
///    sockets are closed anyway (that relies on `tcp_migrate_req`, which berth sets).
/// 4. Wait for the remaining connections, at most `drain_timeout` (EG's drain window, also
///    Envoy's `--drain-time-s`) in all.
pub(super) async fn drain(
    admin: &dyn AdminApi,
    shutdown: &Shutdown,
    reporter: &Reporter,
    proxy: &str,
    container: &str,
) -> Result<()> {
    let started = Instant::now();
    let fail_at = started + shutdown.health_check_failure_delay;
    let mut health_failed = false;
    if shutdown.health_check_failure_delay.is_zero() {
        admin.healthcheck_fail().await?;
        health_failed = true;
    }
    admin.drain_listeners(true).await?;
    crashpoint::reached("mid-drain");
    let deadline = started + shutdown.drain_timeout;
    let earliest = (started + shutdown.min_drain_duration).max(fail_at);
    let close_by = (earliest + LISTEN_GRACE).min(deadline);
    let mut listening = true;
    loop {
        let now = Instant::now();
        if !health_failed && (now >= fail_at || now >= deadline) {
            admin.healthcheck_fail().await?;
            health_failed = true;
        }
        let open = admin.downstream_connections().await.unwrap_or(0);
        if listening && ((open == 0 && now >= earliest) || now >= close_by) {
            admin.drain_listeners(false).await?;
            listening = false;
            continue;
        }
        if !listening && ((open == 0 && now >= earliest) || now >= deadline) {
            reporter.event(
                Event::new(proxy, "drained")
                    .container(container)
                    .message(format!(
                        "{} connection(s) left after {:.1}s",
                        open,
                        started.elapsed().as_secs_f64()
                    )),
            );
            return Ok(());
        }
        reporter.waiting(format!(
            "{proxy}: draining {container}, {open} connection(s) open"
        ));
        tokio::time::sleep(POLL).await;
    }
}
