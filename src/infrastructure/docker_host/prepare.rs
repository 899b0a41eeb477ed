//! Preparing this host for the fleet before any replica starts: memory, listener ports held
//! by other processes, and the kernel settings replicas depend on (DESIGN decision 12).

use std::collections::BTreeSet;

use super::DockerHost;
use crate::host::{self, MigrateReq, PortStart};
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
        let refuse = |e: anyhow::Error| ConvergeError::Host {
            problem: format!("{e:#}"),
        };
        let infra = Infra {
            proxies: fleet.iter().map(|t| t.proxy.clone()).collect(),
        };
        preflight::check_memory(&infra, policy.force_memory).map_err(refuse)?;
        // Ports held by this berth's own replicas are fine: they are the ones being replaced.
        let replica_pids: BTreeSet<u32> = self
            .observe_all()
            .await?
            .iter()
            .filter_map(|c| c.info.pid)
            .collect();
        preflight::check_ports(&infra, &replica_pids).map_err(refuse)?;
        let mut out = HostPreparation::default();
        match host::ensure_tcp_migrate_req(policy.tune) {
            MigrateReq::Off(warning) => out.degraded.push(warning),
            MigrateReq::Set => out
                .notes
                .push("net.ipv4.tcp_migrate_req set to 1".to_string()),
            MigrateReq::On | MigrateReq::Unsupported => {}
        }
        let lowest_port = infra.proxies.iter().flat_map(|p| p.host_ports()).min();
        if let PortStart::Lowered { from, to } =
            host::ensure_unprivileged_port_start(lowest_port, policy.tune).map_err(refuse)?
        {
            out.notes.push(format!(
                "net.ipv4.ip_unprivileged_port_start lowered from {from} to {to} so non-root \
                 replicas can bind port {to}"
            ));
        }
        Ok(out)
    }
}
