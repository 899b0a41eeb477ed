//! Checks made before `up` creates anything: no other process holds a listener port, the
//! fleet's memory limits fit the host, and what the fleet needs of the host's kernel settings
//! ([`host_needs`], checked and prepared by [`crate::host::prepare`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use anyhow::{bail, Result};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::ir::Infra;

/// What the whole fleet of `targets` needs of the host (ports, replicas, inotify), for
/// [`crate::host::prepare`].
pub fn host_needs(targets: &[crate::target::Target]) -> crate::host::Needs {
    crate::host::Needs {
        proxies: targets
            .iter()
            .map(|t| {
                crate::host::ProxyNeeds::of(
                    t.name(),
                    t.proxy.config.replicas,
                    t.proxy.host_ports(),
                    &t.rendered.bootstrap,
                    &t.rendered.xds,
                )
            })
            .collect(),
    }
}

/// A TCP port some process listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    pub port: u16,
    /// The owning processes, when /proc lets us see them.
    pub pids: BTreeSet<u32>,
}

/// Fails when a listener port of `infra` is held by a process that is not one of berth's
/// replicas (`replica_pids`). The message names the port and, where it can, the process.
pub fn check_ports(infra: &Infra, replica_pids: &BTreeSet<u32>) -> Result<()> {
    let wanted: BTreeMap<u16, &str> = infra
        .proxies
        .iter()
        .flat_map(|p| {
            p.host_ports()
                .into_iter()
                .map(move |port| (port, p.name.as_str()))
        })
        .collect();
    let busy = listening_tcp_ports(&wanted.keys().copied().collect())?;
    let mut problems = Vec::new();
    for held in busy {
        let foreign: Vec<u32> = held.pids.difference(replica_pids).copied().collect();
        if held.pids.is_empty() && !replica_pids.is_empty() {
            // We cannot see the owner (not root); with replicas running, assume it is ours.
            continue;
        }
        if !held.pids.is_empty() && foreign.is_empty() {
            continue;
        }
        let proxy = wanted[&held.port];
        let owner = if foreign.is_empty() {
            "another process (run as root to see which)".to_string()
        } else {
            describe_processes(&foreign)
        };
        problems.push(format!(
            "port {} (proxy {proxy}) is already in use by {owner}",
            held.port
        ));
    }
    if !problems.is_empty() {
        bail!(
            "{}\nstop that process or choose another port; nothing was changed",
            problems.join("\n")
        );
    }
    Ok(())
}

/// Fails when replicas × memory over all proxies exceeds the host's memory, unless forced.
pub fn check_memory(infra: &Infra, force: bool) -> Result<()> {
    let mut sys = System::new();
    sys.refresh_memory();
    let total = sys.total_memory();
    let wanted: u64 = infra
        .proxies
        .iter()
        .map(|p| u64::from(p.config.replicas) * p.config.resources.memory.unwrap_or(0))
        .sum();
    if wanted > total && !force {
        let detail: Vec<String> = infra
            .proxies
            .iter()
            .filter_map(|p| {
                let m = p.config.resources.memory?;
                Some(format!(
                    "{} {} × {}",
                    p.name,
                    p.config.replicas,
                    human_bytes(m)
                ))
            })
            .collect();
        bail!(
            "the fleet's memory limits add up to {} ({}), more than this host's {}; lower \
             replicas or memory, or pass --force",
            human_bytes(wanted),
            detail.join(" + "),
            human_bytes(total)
        );
    }
    Ok(())
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn describe_processes(pids: &[u32]) -> String {
    let mut sys = System::new();
    let wanted: Vec<Pid> = pids.iter().map(|p| Pid::from_u32(*p)).collect();
    sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(&wanted),
        true,
        ProcessRefreshKind::nothing(),
    );
    pids.iter()
        .map(|pid| match sys.process(Pid::from_u32(*pid)) {
            Some(p) => format!("{} (pid {pid})", p.name().to_string_lossy()),
            None => format!("pid {pid}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The listening TCP sockets (v4 and v6) on the given ports, with their owning processes.
pub fn listening_tcp_ports(ports: &BTreeSet<u16>) -> Result<Vec<Listening>> {
    let mut inodes: BTreeMap<u64, u16> = BTreeMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for (port, inode) in parse_listen_table(&text) {
            if ports.contains(&port) {
                inodes.insert(inode, port);
            }
        }
    }
    let mut by_port: BTreeMap<u16, BTreeSet<u32>> = BTreeMap::new();
    for port in inodes.values() {
        by_port.entry(*port).or_default();
    }
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    for (pid, inode) in socket_inodes_by_pid() {
        if let Some(port) = inodes.get(&inode) {
            by_port.entry(*port).or_default().insert(pid);
        }
    }
    Ok(by_port
        .into_iter()
        .map(|(port, pids)| Listening { port, pids })
        .collect())
}

/// (local port, socket inode) of each LISTEN row of a /proc/net/tcp{,6} table.
fn parse_listen_table(text: &str) -> Vec<(u16, u64)> {
    const LISTEN: &str = "0A";
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 || cols[3] != LISTEN {
                return None;
            }
            let port = u16::from_str_radix(cols[1].rsplit(':').next()?, 16).ok()?;
            let inode = cols[9].parse().ok()?;
            Some((port, inode))
        })
        .collect()
}

fn socket_inodes_by_pid() -> Vec<(u32, u64)> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .flat_map(|pid| socket_inodes(pid).into_iter().map(move |i| (pid, i)))
        .collect()
}

/// The inodes of the sockets process `pid` holds (empty when /proc does not let us look).
fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|e| e.ok())
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            target
                .to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse().ok())
        })
        .collect()
}

/// The TCP ports process `pid` listens on (v4 and v6). With host networking a replica's
/// sockets are in the host's tables, so this shows exactly what a replica exposes.
pub fn tcp_ports_listened_by(pid: u32) -> BTreeSet<u16> {
    let inodes: BTreeSet<u64> = socket_inodes(pid).into_iter().collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| fs::read_to_string(table).ok())
        .flat_map(|text| parse_listen_table(&text))
        .filter(|(_, inode)| inodes.contains(inode))
        .map(|(port, _)| port)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_rows_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1F91 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 12346 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(parse_listen_table(table), vec![(8080, 12345)]);
    }

    #[test]
    fn finds_a_port_this_process_listens_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let found = listening_tcp_ports(&BTreeSet::from([port])).unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].pids.contains(&std::process::id()));
    }

    #[test]
    fn names_the_ports_one_process_listens_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(tcp_ports_listened_by(std::process::id()).contains(&port));
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(512 * 1024 * 1024), "512.0 MiB");
    }
}
