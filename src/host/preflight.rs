//! Checks made before `up` creates anything: no other process holds a listener port, the
//! fleet's memory limits fit the host, and what the fleet needs of the host's kernel settings
//! ([`host_needs`], checked and prepared by [`crate::host::prepare`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{bail, Result};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::core::ir::Infra;

/// What the whole fleet of `targets` needs of the host (ports, replicas, inotify), for
/// [`crate::host::prepare`].
pub fn host_needs(targets: &[crate::core::target::Target]) -> crate::host::Needs {
    crate::host::Needs {
        proxies: targets
            .iter()
            .map(|t| crate::host::ProxyNeeds {
                name: t.name().to_string(),
                replicas: t.proxy.config.replicas,
                ports: t.proxy.host_ports(),
                inotify_per_replica: t.rendered.inotify_per_replica,
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
/// replicas: neither a replica's main process (`replica_pids`) nor a process `is_fleet` says
/// belongs to one of the fleet's containers (the engine's answer from the process's cgroup:
/// a replica paused, restarting or stopped by a signal is still the fleet's, whatever pid the
/// engine reports for it). The message names the port and, where it can, the process.
/// `fleet_uid`: see [`listening_tcp_ports_owned`].
pub fn check_ports(
    infra: &Infra,
    replica_pids: &BTreeSet<u32>,
    fleet_uid: Option<u32>,
    is_fleet: &dyn Fn(u32) -> bool,
) -> Result<()> {
    let wanted = wanted_binds(infra);
    let busy =
        listening_tcp_ports_owned(&wanted.keys().copied().collect(), replica_pids, fleet_uid)?;
    let problems = port_problems(&wanted, &busy, replica_pids, is_fleet);
    if !problems.is_empty() {
        bail!(
            "{}\nstop that process or choose another port; nothing was changed",
            problems.join("\n")
        );
    }
    Ok(())
}

/// Each listener port of `infra` with the address it binds and its proxy.
fn wanted_binds(infra: &Infra) -> BTreeMap<u16, (IpAddr, &str)> {
    infra
        .proxies
        .iter()
        .flat_map(|p| {
            p.host_binds()
                .into_iter()
                .map(move |(address, port)| (port, (address, p.name.as_str())))
        })
        .collect()
}

/// The ports of `wanted` that `busy` shows held by a process of neither the fleet's replicas
/// nor its containers, one line each.
fn port_problems(
    wanted: &BTreeMap<u16, (IpAddr, &str)>,
    busy: &[Listening],
    replica_pids: &BTreeSet<u32>,
    is_fleet: &dyn Fn(u32) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for held in busy {
        let Some(&(address, proxy)) = wanted.get(&held.port) else {
            continue;
        };
        if !binds_collide(address, held.address) {
            continue;
        }
        let foreign: Vec<u32> = held
            .pids
            .iter()
            .copied()
            .filter(|pid| !replica_pids.contains(pid) && !is_fleet(*pid))
            .collect();
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
    problems
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
    listening_tcp_ports_owned(ports, &BTreeSet::new(), None)
}

/// Like [`listening_tcp_ports`], looking first at the file descriptors of `likely_owners`
/// (the fleet's own replicas, which hold its ports on a converged host): only sockets none of
/// them holds send the search through every other process (each fd of each process is a
/// readlink, thousands on a busy host). A socket is owned by the process that holds it; one
/// also held by a foreign process through an inherited descriptor is not looked for.
///
/// `fleet_uid`: a user whose every process is one of `likely_owners` (the replicas' user, when
/// nothing else runs as it). Its sockets are the fleet's and are left out without reading a
/// descriptor: a socket belongs to the user that opened it, and only the fleet runs as that
/// user.
pub fn listening_tcp_ports_owned(
    ports: &BTreeSet<u16>,
    likely_owners: &BTreeSet<u32>,
    fleet_uid: Option<u32>,
) -> Result<Vec<Listening>> {
    let mut inodes: BTreeMap<u64, (IpAddr, u16)> = BTreeMap::new();
    for (address, port, inode, uid) in listen_sockets() {
        if ports.contains(&port) && Some(uid) != fleet_uid {
            inodes.insert(inode, (address, port));
        }
    }
    let mut by_bind: BTreeMap<(IpAddr, u16), BTreeSet<u32>> = BTreeMap::new();
    for bind in inodes.values() {
        by_bind.entry(*bind).or_default();
    }
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    let mut unowned: BTreeSet<u64> = inodes.keys().copied().collect();
    for &pid in likely_owners {
        for inode in socket_inodes(pid) {
            if let Some(bind) = inodes.get(&inode) {
                by_bind.entry(*bind).or_default().insert(pid);
                unowned.remove(&inode);
            }
        }
    }
    if !unowned.is_empty() {
        for (pid, inode) in socket_inodes_by_pid(likely_owners) {
            if let Some(bind) = inodes.get(&inode) {
                by_bind.entry(*bind).or_default().insert(pid);
            }
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

/// (local address, local port, socket inode) of every listening TCP socket, v4 and v6: asked
/// of the kernel through sock_diag netlink, which walks only the listening sockets, else read
/// from /proc/net/tcp{,6}. Those files cost a walk of the whole established-connection hash
/// table (hundreds of thousands of buckets on a host with memory, ~2 ms) for every read call.
pub fn listen_sockets() -> Vec<Sock> {
    if let Some(found) = diag::listening_tcp() {
        return found;
    }
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| read_proc_table(table))
        .flat_map(|text| parse_listen_rows(&text))
        .collect()
}

/// A listening socket: local address, local port, inode, and the uid it belongs to.
pub type Sock = (IpAddr, u16, u64, u32);

/// A /proc/net table, read in large chunks: each read() restarts the kernel's walk.
fn read_proc_table(path: &str) -> Option<String> {
    use std::io::Read;
    let mut f = fs::File::open(path).ok()?;
    let mut buf = Vec::with_capacity(1 << 16);
    f.read_to_end(&mut buf).ok()?;
    String::from_utf8(buf).ok()
}

/// The listening TCP sockets through the kernel's sock_diag netlink interface (what `ss -lt`
/// uses): one dump request per address family, answered from the listening hash only.
mod diag {
    use netlink_packet_core::{
        NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
    };
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};

    use super::Sock;

    /// None when netlink is not available (then /proc is read instead).
    pub fn listening_tcp() -> Option<Vec<Sock>> {
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            out.extend(dump(family)?);
        }
        Some(out)
    }

    fn dump(family: u8) -> Option<Vec<Sock>> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).ok()?;
        socket.bind_auto().ok()?;
        socket.connect(&SocketAddr::new(0, 0)).ok()?;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let socket_id = if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::LISTEN,
                socket_id,
            })
            .into(),
        );
        request.finalize();
        let mut sent = vec![0; request.buffer_len()];
        request.serialize(&mut sent);
        socket.send(&sent, 0).ok()?;
        let mut out = Vec::new();
        let mut received = vec![0u8; 1 << 16];
        loop {
            let n = socket.recv(&mut &mut received[..], 0).ok()?;
            let mut at = 0;
            while at < n {
                let message =
                    NetlinkMessage::<SockDiagMessage>::deserialize(&received[at..n]).ok()?;
                match message.payload {
                    NetlinkPayload::Done(_) => return Some(out),
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        let id = &r.header.socket_id;
                        out.push((
                            id.source_address,
                            id.source_port,
                            u64::from(r.header.inode),
                            r.header.uid,
                        ));
                    }
                    NetlinkPayload::Error(_) | NetlinkPayload::Overrun(_) => return None,
                    _ => {}
                }
                let len = message.header.length as usize;
                if len == 0 {
                    return None;
                }
                // Messages in one datagram are 4-byte aligned.
                at += (len + 3) & !3;
            }
            if n == 0 {
                return None;
            }
        }
    }
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
#[cfg(test)]
fn parse_listen_table(text: &str) -> Vec<(IpAddr, u16, u64)> {
    parse_listen_rows(text)
        .into_iter()
        .map(|(address, port, inode, _)| (address, port, inode))
        .collect()
}

/// (local address, local port, socket inode, owner uid) of each LISTEN row.
fn parse_listen_rows(text: &str) -> Vec<Sock> {
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
            let uid = cols[7].parse().ok()?;
            let inode = cols[9].parse().ok()?;
            Some((parse_proc_address(address)?, port, inode, uid))
        })
        .collect()
}

/// The socket inodes of every process but those in `skip`.
fn socket_inodes_by_pid(skip: &BTreeSet<u32>) -> Vec<(u32, u64)> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| !skip.contains(pid))
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
    listen_sockets()
        .into_iter()
        .filter(|(_, _, inode, _)| inodes.contains(inode))
        .map(|(_, port, _, _)| port)
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
    fn netlink_and_proc_agree_on_listening_sockets() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::TcpListener::bind("[::1]:0").ok();
        let from_proc: BTreeSet<(IpAddr, u16, u64)> = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|t| read_proc_table(t))
            .flat_map(|text| parse_listen_table(&text))
            .collect();
        let from_netlink: BTreeSet<(IpAddr, u16, u64)> = diag::listening_tcp()
            .expect("sock_diag answers")
            .into_iter()
            .map(|(a, p, i, _)| (a, p, i))
            .collect();
        let port = v4.local_addr().unwrap().port();
        let mine = |set: &BTreeSet<(IpAddr, u16, u64)>| {
            set.iter()
                .filter(|(_, p, _)| {
                    *p == port || Some(*p) == v6.as_ref().map(|l| l.local_addr().unwrap().port())
                })
                .cloned()
                .collect::<BTreeSet<_>>()
        };
        assert!(!mine(&from_netlink).is_empty());
        assert_eq!(mine(&from_netlink), mine(&from_proc));
    }

    #[test]
    fn likely_owners_are_asked_first_and_any_other_holder_is_still_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        let found = listening_tcp_ports_owned(&BTreeSet::from([port]), &BTreeSet::from([me]), None)
            .unwrap();
        assert_eq!(found[0].pids, BTreeSet::from([me]));
        // Held by none of the likely owners: every process is searched.
        let found =
            listening_tcp_ports_owned(&BTreeSet::from([port]), &BTreeSet::from([1]), None).unwrap();
        assert!(found[0].pids.contains(&me), "{found:?}");
        // Sockets of a user only the fleet runs as are the fleet's: not even listed.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert!(
            listening_tcp_ports_owned(&BTreeSet::from([port]), &BTreeSet::new(), Some(uid))
                .unwrap()
                .is_empty()
        );
        let netlink = diag::listening_tcp().unwrap();
        assert!(netlink.iter().any(|(_, p, _, u)| *p == port && *u == uid));
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
    fn a_socket_of_the_fleets_own_container_is_never_a_strangers() {
        let wanted = BTreeMap::from([(10380, ("0.0.0.0".parse().unwrap(), "hflt"))]);
        let held = |pids: &[u32]| Listening {
            address: "0.0.0.0".parse().unwrap(),
            port: 10380,
            pids: pids.iter().copied().collect(),
        };
        let replicas = BTreeSet::from([100, 101]);
        // 102 is a paused replica's Envoy: the engine reports no pid for it, but its cgroup is
        // one of the fleet's containers.
        let fleet = |pid: u32| pid == 102;
        assert!(port_problems(&wanted, &[held(&[100, 101, 102])], &replicas, &fleet).is_empty());
        let problems = port_problems(&wanted, &[held(&[100, 4242])], &replicas, &fleet);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("port 10380 on 0.0.0.0 (proxy hflt) is already in use"),
            "{problems:?}"
        );
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(512 * 1024 * 1024), "512.0 MiB");
    }
}
