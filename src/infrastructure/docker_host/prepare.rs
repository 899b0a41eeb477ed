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
        // Ports (and inotify instances) used by this berth's own replicas are the fleet's,
        // not someone else's.
        let fleet_pids: BTreeSet<u32> = self
            .observe_all()
            .await?
            .iter()
            .filter_map(|c| c.info.pid)
            .collect();
        preflight::check_ports(&infra, &fleet_pids).map_err(|e| refuse(format!("{e:#}")))?;
        let settings = crate::host::Settings::for_host(policy.tune, fleet_pids);
        let prepared = crate::host::prepare(&preflight::host_needs(fleet), &settings)
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
