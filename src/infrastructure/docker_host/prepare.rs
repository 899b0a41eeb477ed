//! Preparing this host for the fleet before any replica starts (DESIGN decision 12): memory,
//! listener ports held by other processes, and the kernel settings replicas depend on
//! ([`crate::host`]: set them, keep them across reboots, or refuse with the numbers).

use std::collections::BTreeSet;

use super::DockerHost;
use crate::infrastructure::{ConvergeError, HostPreparation};
use crate::ir::Infra;
use crate::operations::HostPolicy;
use crate::preflight;
use crate::target::Target;

impl DockerHost {
    pub(super) async fn prepare_host(
        &self,
        fleet: &[Target],
        policy: HostPolicy,
    ) -> Result<HostPreparation, ConvergeError> {
        let refuse = |problem: String| ConvergeError::Host { problem };
        let infra = Infra {
            proxies: fleet.iter().map(|t| t.proxy.clone()).collect(),
        };
        preflight::check_memory(&infra, policy.force_memory)
            .map_err(|e| refuse(format!("{e:#}")))?;
        // Listing the replica user's processes reads every process's status, and the host's
        // settings are read from /proc/sys and the sysctl files: both done on the blocking
        // pool while the engine is asked for the containers.
        let uid = crate::replica::replica_user().uid;
        let tune = policy.tune;
        let host_reads = tokio::task::spawn_blocking(move || {
            let settings = crate::host::Settings::for_host(tune, BTreeSet::new());
            (
                crate::host::inotify::processes_of(uid),
                crate::host::observe_settings(&settings),
            )
        });
        // Ports (and inotify instances) used by this berth's own replicas are the fleet's,
        // not someone else's.
        let observed = self.observe_all().await;
        let (user_processes, host_settings) = match host_reads.await {
            Ok((pids, read)) => (Some(pids), Some(read)),
            Err(_) => (None, None),
        };
        let fleet_pids: BTreeSet<u32> = observed?.iter().filter_map(|c| c.info.pid).collect();
        tracing::debug!(target: "berth::phase", "containers observed");
        // When nothing but the replicas runs as their user, the sockets of that user on the
        // fleet's ports are the replicas' (no descriptor needs reading to tell).
        let fleet_uid = match &user_processes {
            Some(pids) if !pids.is_empty() && pids.iter().all(|p| fleet_pids.contains(p)) => {
                Some(uid)
            }
            _ => None,
        };
        preflight::check_ports(&infra, &fleet_pids, fleet_uid)
            .map_err(|e| refuse(format!("{e:#}")))?;
        tracing::debug!(target: "berth::phase", "listener ports checked");
        let mut settings = crate::host::Settings::for_host(policy.tune, fleet_pids);
        if let Some(pids) = user_processes {
            settings = settings.with_user_processes(pids);
        }
        let needs = preflight::host_needs(fleet);
        let prepared = match host_settings {
            Some(read) => crate::host::prepare_observed(&needs, &settings, read),
            None => crate::host::prepare(&needs, &settings),
        }
        .map_err(|r| refuse(r.to_string()))?;
        Ok(HostPreparation {
            notes: prepared.change_lines(),
            degraded: prepared
                .degraded()
                .map(|(reason, message)| (reason.to_string(), message))
                .into_iter()
                .collect(),
        })
    }
}
