//! Serve's ACME component: sleeps until the next ACME listener certificate is due (two thirds
//! of its lifetime, or the end of a failure's backoff; at most a minute, so config changes are
//! seen) and then triggers a pass of its proxy. The pass obtains the certificate
//! ([`renew`]), so it never runs beside another pass of the same proxy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Shared, Trigger};
use crate::core::progress::Reporter;
use crate::core::target::Target;
use crate::ops::acme::{self, ListenerFiles};

/// The longest sleep: config changes (new ACME listeners) are seen within it.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// A proxy triggered for ACME is not triggered again sooner (its pass may still be running);
/// its status is looked at again then.
const RETRIGGER: Duration = Duration::from_secs(10);

pub async fn run(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let mut triggered: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let targets: Vec<Target> = shared
            .desired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .targets
            .values()
            .cloned()
            .collect();
        let now = SystemTime::now();
        let mut next: Option<i64> = None;
        for t in &targets {
            let due = acme::listeners(&t.proxy)
                .into_iter()
                .map(|(l, a)| {
                    acme::due_at(
                        &ListenerFiles::new(shared.state.root(), t.name(), l),
                        a,
                        now,
                    )
                })
                .min();
            let Some(mut due) = due else { continue };
            // Since the last trigger: the pass may still be running; look again after it.
            let quiet = triggered
                .get(t.name())
                .map(|at| RETRIGGER.saturating_sub(at.elapsed()))
                .filter(|left| !left.is_zero());
            if due <= acme::unix(now) {
                match quiet {
                    None => {
                        triggered.insert(t.name().to_string(), Instant::now());
                        shared.trigger(Trigger::Proxy(t.name().to_string(), "acme"));
                        due = acme::unix(now) + RETRIGGER.as_secs() as i64;
                    }
                    Some(left) => due = acme::unix(now) + left.as_secs() as i64,
                }
            }
            next = Some(next.map_or(due, |n| n.min(due)));
        }
        let wait = next
            .map(|n| Duration::from_secs((n - acme::unix(now)).max(1) as u64))
            .unwrap_or(MAX_SLEEP)
            .min(MAX_SLEEP);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
}

/// Obtains the due ACME certificates of `target` (after a successful converge in its pass):
/// failures wait out their backoff. A new certificate is served before this returns; the
/// config is then re-rendered so the desired state names it. Returns the first failure.
pub async fn renew(shared: &Shared, target: &Target, reporter: &Reporter) -> Option<String> {
    if acme::listeners(&target.proxy).is_empty() || !shared.settings.acme {
        return None;
    }
    let renderer = match super::renderer(&shared.opts) {
        Ok(r) => r,
        Err(e) => return Some(format!("{e:#}")),
    };
    let renewals = acme::renew_due(
        &acme::Converger {
            ops: &shared.ops,
            renderer: &renderer,
            state_dir: shared.state.root(),
            host_cpus: crate::core::target::host_cpus(),
            confirm_timeout: shared.settings.confirm_timeout,
            reporter,
        },
        std::slice::from_ref(&target.proxy),
        true,
    )
    .await;
    if renewals.iter().any(|r| r.result.is_ok()) {
        match shared.reload() {
            Ok(_) => shared.trigger(Trigger::Proxy(target.name().to_string(), "acme")),
            Err(e) => super::log(shared.opts.mode, &format!("{e:#}")),
        }
    }
    renewals.into_iter().find_map(|r| r.result.err())
}
