//! The kernel settings of the nodes other than the manager. berth sets them on the manager it
//! runs on only; each task's agent says in its hello what its node has, and a node short of
//! `net.ipv4.tcp_migrate_req = 1` makes the proxy Degraded, naming the node and the command.
//! Only running tasks on other nodes are asked: their agents dial the channel within a second,
//! so `up` waits at most [`ASK_TIMEOUT`] for them (nothing when every task is on the manager).

use std::collections::BTreeMap;
use std::time::Duration;

use super::hub::AgentView;
use crate::core::target::Target;
use crate::host::sysctl::Key;

/// How long the manager waits for the agents of tasks on other nodes to attach.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(2500);

/// The Degraded reason of a node without `tcp_migrate_req`.
pub const REASON: &str = "TcpMigrateReqOff";

/// `(reason, message)` for each node whose agents report `tcp_migrate_req` 0, once per node.
pub fn short_nodes(agents: &[AgentView]) -> Vec<(String, String)> {
    let mut nodes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for a in agents {
        if a.kernel.get(Key::TcpMigrateReq.name()) == Some(&0) {
            nodes
                .entry(a.node.as_str())
                .or_default()
                .push(a.task.as_str());
        }
    }
    nodes
        .into_iter()
        .map(|(node, tasks)| {
            (
                REASON.to_string(),
                format!(
                    "node {node}: net.ipv4.tcp_migrate_req is 0 there (its task {} says so): \
                     connections still queued on a task there that stops are reset instead of \
                     moving to a sibling. berth sets host settings on the manager only; on \
                     {node} run: {} (and keep it in {})",
                    tasks[0],
                    Key::TcpMigrateReq.command(1),
                    crate::host::sysctl::DEFAULT_DROPIN
                ),
            )
        })
        .collect()
}

impl super::Swarm {
    /// The nodes other than this one whose tasks of `fleet` run without `tcp_migrate_req`.
    pub(super) async fn kernel_concerns(&self, fleet: &[Target]) -> Vec<(String, String)> {
        if self.no_agent {
            return Vec::new();
        }
        let mut remote: Vec<(String, Vec<String>)> = Vec::new();
        for t in fleet {
            let tasks: Vec<String> = self
                .running_tasks(t.name())
                .await
                .unwrap_or_default()
                .into_iter()
                .filter(|task| task.running() && task.node_id != self.node_id)
                .map(|task| task.service_node)
                .collect();
            if !tasks.is_empty() {
                remote.push((t.name().to_string(), tasks));
            }
        }
        if remote.is_empty() {
            return Vec::new();
        }
        let Ok(hub) = self.hub().await else {
            return Vec::new();
        };
        let mut agents = Vec::new();
        for (proxy, tasks) in remote {
            hub.await_attached(&proxy, &tasks, ASK_TIMEOUT).await;
            let attached = hub.agents(&proxy);
            agents.extend(tasks.iter().filter_map(|t| attached.get(t).cloned()));
        }
        short_nodes(&agents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(task: &str, node: &str, migrate: Option<u64>) -> AgentView {
        AgentView {
            task: task.into(),
            files: BTreeMap::new(),
            since: std::time::SystemTime::now(),
            rss_bytes: 0,
            cpu_seconds: 0.0,
            node: node.into(),
            kernel: migrate
                .map(|v| (Key::TcpMigrateReq.name().to_string(), v))
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn a_node_without_migrate_req_is_named_once_with_the_command() {
        let agents = [
            agent("e.1.a", "worker-1", Some(0)),
            agent("e.2.b", "worker-1", Some(0)),
            agent("e.3.c", "worker-2", Some(1)),
            agent("e.4.d", "old-kernel", None),
        ];
        let short = short_nodes(&agents);
        assert_eq!(short.len(), 1, "{short:?}");
        let (reason, message) = &short[0];
        assert_eq!(reason, REASON);
        assert!(message.starts_with("node worker-1: net.ipv4.tcp_migrate_req is 0"));
        assert!(message.contains("e.1.a"), "{message}");
        assert!(
            message.contains("sysctl -w net.ipv4.tcp_migrate_req=1"),
            "{message}"
        );
    }
}
