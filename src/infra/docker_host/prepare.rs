//! Preparing this host for the fleet before any replica starts (DESIGN decision 12): memory,
//! listener ports held by other processes, and the kernel settings replicas depend on
//! ([`crate::host`]: set them, keep them across reboots, or refuse with the numbers).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::DockerHost;
use crate::core::ir::Infra;
use crate::core::policy::HostPolicy;
use crate::core::target::Target;
use crate::host::preflight;
use crate::infra::{ConvergeError, HostPreparation};

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
        // pool while the engine is asked for the containers, or since the command started.
        let uid = crate::core::replica::replica_user().uid;
        let host_reads = self
            .ahead
            .as_ref()
            .and_then(|a| a.take_host_reads())
            .filter(HostReads::fresh)
            .unwrap_or_else(HostReads::start)
            .answer;
        // Ports (and inotify instances) used by this berth's own replicas are the fleet's,
        // not someone else's.
        let observed = self.observe_all().await;
        let (user_processes, host_settings) = match host_reads.await {
            Ok((pids, read)) => (Some(pids), Some(read)),
            Err(_) => (None, None),
        };
        let observed = observed?;
        let fleet_pids: BTreeSet<u32> = observed.iter().filter_map(|c| c.info.pid).collect();
        // Every container of the fleet, whatever its state: a paused, restarting or stopped
        // replica still holds its sockets, and the engine reports no pid for it.
        let fleet_ids: BTreeSet<&str> = observed.iter().map(|c| c.id.as_str()).collect();
        let is_fleet = |pid: u32| {
            self.engine
                .container_of_process(pid)
                .is_some_and(|id| fleet_ids.contains(id.as_str()))
        };
        tracing::debug!(target: "berth::phase", "containers observed");
        // When nothing but the replicas runs as their user, the sockets of that user on the
        // fleet's ports are the replicas' (no descriptor needs reading to tell).
        let fleet_uid = match &user_processes {
            Some(pids)
                if !pids.is_empty()
                    && pids.iter().all(|p| fleet_pids.contains(p) || is_fleet(*p)) =>
            {
                Some(uid)
            }
            _ => None,
        };
        preflight::check_ports(&infra, &fleet_pids, fleet_uid, &is_fleet)
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

/// The host reads preparation needs: the replica user's processes (a read of every process's
/// status, the slowest step of a no-op) and the host's settings. A command starts them at
/// once, on the blocking pool ([`super::Ahead::with_host_reads`]); preparation uses them
/// while they are [`HostReads::FRESH`], else reads again (a command that waited for the lock
/// or pulled an image first).
pub struct HostReads {
    started: Instant,
    answer: JoinHandle<(Vec<u32>, crate::host::Observed)>,
}

impl HostReads {
    const FRESH: Duration = Duration::from_secs(1);

    pub fn start() -> HostReads {
        let uid = crate::core::replica::replica_user().uid;
        HostReads {
            started: Instant::now(),
            answer: tokio::task::spawn_blocking(move || {
                // What is read does not depend on `tune` (only what is done about it).
                let settings = crate::host::Settings::for_host(false, BTreeSet::new());
                (
                    crate::host::inotify::processes_of(uid),
                    crate::host::observe_settings(&settings),
                )
            }),
        }
    }

    fn fresh(&self) -> bool {
        self.started.elapsed() < Self::FRESH
    }
}
