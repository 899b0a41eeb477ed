//! Checks made before `up` creates anything: no other process holds a listener port, the
//! fleet's memory limits fit the host, and what the fleet needs of the host's kernel settings
//! ([`host_needs`], checked and prepared by [`crate::host::prepare`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
    pub address: IpAddr,
    pub port: u16,
    /// The owning processes, when /proc lets us see them.
    pub pids: BTreeSet<u32>,
}

/// Fails when a listener port of `infra` is held by a process that is not one of berth's
/// replicas (`replica_pids`). The message names the port and, where it can, the process.
pub fn check_ports(infra: &Infra, replica_pids: &BTreeSet<u32>) -> Result<()> {
    let wanted: BTreeMap<u16, (IpAddr, &str)> = infra
        .proxies
        .iter()
        .flat_map(|p| {
            p.host_binds()
                .into_iter()
                .map(move |(address, port)| (port, (address, p.name.as_str())))
        })
        .collect();
    let busy = listening_tcp_ports(&wanted.keys().copied().collect())?;
    let mut problems = Vec::new();
    for held in busy {
        let (address, proxy) = wanted[&held.port];
        if !binds_collide(address, held.address) {
            continue;
        }
        let foreign: Vec<u32> = held.pids.difference(replica_pids).copied().collect();
        if held.pids.is_empty() && !replica_pids.is_empty() {
            // We cannot see the owner (not root); with replicas running, assume it is ours.
            continue;
        }
        if !held.pids.is_empty() && foreign.is_empty() {
            continue;
        }
        let owner = if foreign.is_empty() {
            "another process (run as root to see which)".to_string()
        } else {
            describe_processes(&foreign)
        };
        problems.push(format!(
            "port {} on {} (proxy {proxy}) is already in use on {} by {owner}",
            held.port,
            shown(address),
            shown(held.address)
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

/// Whether a listener bound on `want` cannot coexist with a socket another process holds on
/// `held` (same port): the same address, or a wildcard that covers the other. `::` counts as
/// covering IPv4 too (berth binds it dual-stack; other programs usually do as well).
fn binds_collide(want: IpAddr, held: IpAddr) -> bool {
    let covers = |wild: IpAddr, other: IpAddr| match wild {
        IpAddr::V4(w) => {
            w.is_unspecified() && (other.is_ipv4() || other == IpAddr::V6(Ipv6Addr::UNSPECIFIED))
        }
        IpAddr::V6(w) => w.is_unspecified(),
    };
    want == held || covers(want, held) || covers(held, want)
}

fn shown(a: IpAddr) -> String {
    match a {
        IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }
}

/// The listening TCP sockets (v4 and v6) on the given ports, with their owning processes.
pub fn listening_tcp_ports(ports: &BTreeSet<u16>) -> Result<Vec<Listening>> {
    let mut inodes: BTreeMap<u64, (IpAddr, u16)> = BTreeMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for (address, port, inode) in parse_listen_table(&text) {
            if ports.contains(&port) {
                inodes.insert(inode, (address, port));
            }
        }
    }
    let mut by_bind: BTreeMap<(IpAddr, u16), BTreeSet<u32>> = BTreeMap::new();
    for bind in inodes.values() {
        by_bind.entry(*bind).or_default();
    }
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    for (pid, inode) in socket_inodes_by_pid() {
        if let Some(bind) = inodes.get(&inode) {
            by_bind.entry(*bind).or_default().insert(pid);
        }
    }
    Ok(by_bind
        .into_iter()
        .map(|((address, port), pids)| Listening {
            address,
            port,
            pids,
        })
        .collect())
}

/// A local address of /proc/net/tcp{,6}: hex of the address in 32-bit words, each in host
/// (little-endian) byte order.
fn parse_proc_address(hex: &str) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes).ok()?,
        ))),
        _ => None,
    }
}

/// (local address, local port, socket inode) of each LISTEN row of a /proc/net/tcp{,6} table.
fn parse_listen_table(text: &str) -> Vec<(IpAddr, u16, u64)> {
    const LISTEN: &str = "0A";
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 || cols[3] != LISTEN {
                return None;
            }
            let (address, port) = cols[1].split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let inode = cols[9].parse().ok()?;
            Some((parse_proc_address(address)?, port, inode))
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
        .filter(|(_, _, inode)| inodes.contains(inode))
        .map(|(_, port, _)| port)
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
        assert_eq!(
            parse_listen_table(table),
            vec![("0.0.0.0".parse().unwrap(), 8080, 12345)]
        );
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(
            parse_listen_table(v6),
            vec![("::1".parse().unwrap(), 8080, 777)]
        );
        assert_eq!(
            parse_proc_address("0100007F"),
            Some("127.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn binds_collide_on_the_same_address_or_a_covering_wildcard() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(binds_collide(ip("127.0.0.1"), ip("127.0.0.1")));
        assert!(binds_collide(ip("0.0.0.0"), ip("127.0.0.1")));
        assert!(binds_collide(ip("127.0.0.1"), ip("0.0.0.0")));
        assert!(binds_collide(ip("::"), ip("127.0.0.1")));
        assert!(binds_collide(ip("::1"), ip("::")));
        assert!(!binds_collide(ip("127.0.0.1"), ip("127.0.0.2")));
        assert!(!binds_collide(ip("127.0.0.1"), ip("::1")));
        assert!(!binds_collide(ip("0.0.0.0"), ip("::1")));
    }

    #[test]
    fn a_port_held_on_another_address_is_free_for_a_bound_listener() {
        let other = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = other.local_addr().unwrap().port();
        let found = listening_tcp_ports(&BTreeSet::from([port])).unwrap();
        assert_eq!(found[0].address, "127.0.0.2".parse::<IpAddr>().unwrap());
        assert!(!binds_collide(
            "127.0.0.1".parse().unwrap(),
            found[0].address
        ));
        assert!(binds_collide("0.0.0.0".parse().unwrap(), found[0].address));
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
