//! Retiring a replica without losing a request (DESIGN decision 6).

use std::time::Duration;

use anyhow::Result;

use super::execute::{run_dir_name, Run};
use crate::core::crashpoint;
use crate::core::ir::{RolloutPolicy, Shutdown};
use crate::core::plan::ContainerRef;
use crate::core::progress::{Event, Reporter};
use crate::engine::{ObservedContainer, RunState};
use crate::envoy::admin::AdminApi;
use crate::infra::ConvergeError;

/// Timeout of one admin call while draining.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

impl Run<'_> {
    /// Retires a replica without losing a request: fail health checks, drain gracefully until
    /// its connections are gone, close the listen sockets (see [`crate::envoy::drain`] for the order
    /// and why), then stop and remove.
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

/// Drains a replica with the shared sequence ([`crate::envoy::drain`]), reporting progress and the
/// outcome as events of `container`.
pub(super) async fn drain(
    admin: &dyn AdminApi,
    shutdown: &Shutdown,
    reporter: &Reporter,
    proxy: &str,
    container: &str,
) -> Result<()> {
    let drained = crate::envoy::drain::drain(admin, shutdown, |open| {
        reporter.waiting(format!(
            "{proxy}: draining {container}, {open} connection(s) open"
        ))
    })
    .await?;
    reporter.event(
        Event::new(proxy, "drained")
            .container(container)
            .message(format!(
                "{} connection(s) left after {:.1}s",
                drained.left,
                drained.elapsed.as_secs_f64()
            )),
    );
    Ok(())
}
