//! berth is one statically linked binary, and still resolves host names. Static glibc resolves
//! through `files` (/etc/hosts) and `dns` (/etc/resolv.conf) only: no NSS modules (mdns,
//! systemd-resolved's `resolve`, LDAP, myhostname) are loaded. The names berth itself looks up
//! (the engine's DOCKER_HOST, an ACME directory) go through that one resolver (getaddrinfo, by
//! hyper-util's resolver in both clients); image registries are resolved by the engine and
//! backends by Envoy, not by berth.
//!
//! The checks run the real test build of berth with DOCKER_HOST=tcp://NAME:PORT, NAME resolved
//! once from a hosts file and once from a DNS server started here, in a private mount namespace
//! whose /etc/hosts, /etc/nsswitch.conf and /etc/resolv.conf are bind-mounted over (the host's
//! files are never changed). PORT is a TCP relay to the Docker socket that counts connections:
//! `berth status` exits 0 only if it reached the real engine through the name.

mod common;

use std::net::UdpSocket;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NAME: &str = "berth-engine.test";

/// Whether the ELF file has a program interpreter (PT_INTERP): a dynamically linked program.
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not a 64-bit ELF file");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let at = phoff + i * size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3
    })
}

#[test]
fn the_berth_under_test_is_statically_linked() {
    let berth = std::fs::read(env!("CARGO_BIN_EXE_berth")).unwrap();
    assert!(
        !has_interpreter(&berth),
        "{} asks for a program interpreter (dynamically linked)",
        env!("CARGO_BIN_EXE_berth")
    );
    // The check itself can fail: this test's own binary is linked the same way, so look at a
    // dynamically linked program of the host's.
    let sh = std::fs::read(std::fs::canonicalize("/bin/sh").unwrap()).unwrap();
    assert!(has_interpreter(&sh), "/bin/sh has no interpreter?");
}

/// A TCP relay on 127.0.0.1 to the Docker socket, counting the connections it relayed.
async fn engine_relay() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut unix) = tokio::net::UnixStream::connect("/var/run/docker.sock").await
                {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
            });
        }
    });
    (port, count)
}

/// A DNS server on `addr`:53 (UDP) answering A queries for NAME with 127.0.0.1, other types of
/// NAME with no records, other names with NXDOMAIN; records every name it was asked.
fn dns_server(addr: &str) -> Arc<Mutex<Vec<String>>> {
    let socket = UdpSocket::bind((addr, 53))
        .unwrap_or_else(|e| panic!("binding a DNS server on {addr}:53: {e}"));
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            if let Some((name, answer)) = dns_answer(&buf[..n]) {
                log.lock().unwrap().push(name);
                let _ = socket.send_to(&answer, from);
            }
        }
    });
    asked
}

/// The answer to one DNS query, and the name it asked for ("name.test/TYPE").
fn dns_answer(query: &[u8]) -> Option<(String, Vec<u8>)> {
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = &query[12..at + 4];
    let name = labels.join(".");
    let ours = name == NAME;
    let a = ours && qtype == 1;
    let mut out = Vec::new();
    out.extend_from_slice(&query[..2]); // id
    out.extend_from_slice(&[0x81, if ours { 0x80 } else { 0x83 }]); // response, RD, RA; NXDOMAIN
    out.extend_from_slice(&[0, 1, 0, a as u8, 0, 0, 0, 0]);
    out.extend_from_slice(question);
    if a {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]);
    }
    Some((format!("{name}/{qtype}"), out))
}

/// `berth status` with DOCKER_HOST=tcp://NAME:port, in a mount namespace where /etc/hosts,
/// /etc/nsswitch.conf and /etc/resolv.conf are the given texts.
async fn status_by_name(
    dir: &Path,
    port: u16,
    hosts: &str,
    nsswitch: &str,
    resolv: &str,
) -> std::process::Output {
    for (file, text) in [
        ("hosts", hosts),
        ("nsswitch.conf", nsswitch),
        ("resolv.conf", resolv),
    ] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let script = "mount --bind \"$1/hosts\" /etc/hosts && \
                  mount --bind \"$1/nsswitch.conf\" /etc/nsswitch.conf && \
                  mount --bind \"$1/resolv.conf\" /etc/resolv.conf && shift && exec \"$@\"";
    tokio::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(dir)
        .arg(env!("CARGO_BIN_EXE_berth"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("status")
        .current_dir(dir)
        .env("DOCKER_HOST", format!("tcp://{NAME}:{port}"))
        .env("BERTH_SYSCTL_DROPIN", common::TEST_SYSCTL_DROPIN)
        .output()
        .await
        .expect("unshare(1) from util-linux")
}

fn needs_root(test: &str) -> bool {
    if unsafe { libc::geteuid() } != 0 {
        common::skip(test, "a private mount namespace needs root");
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_reaches_the_engine_by_a_name_from_etc_hosts() {
    if !needs_root("berth_reaches_the_engine_by_a_name_from_etc_hosts") {
        return;
    }
    let (port, relayed) = engine_relay().await;
    let dir = tempfile::tempdir().unwrap();
    // Only `files`, and no DNS server at all: the name can come from the hosts file alone.
    let hosts = format!("127.0.0.1 localhost\n127.0.0.1 {NAME}\n");
    let out = status_by_name(
        dir.path(),
        port,
        &hosts,
        "hosts: files\n",
        "nameserver 127.0.0.254\n",
    )
    .await;
    common::show("berth status", &out);
    assert_eq!(out.status.code(), Some(0), "{}", common::describe(&out));
    assert!(
        relayed.load(Ordering::SeqCst) > 0,
        "berth never reached the relay"
    );

    // The control: the same command, the name in no file and `files` only, fails naming it.
    let out = status_by_name(
        dir.path(),
        port,
        "127.0.0.1 localhost\n",
        "hosts: files\n",
        "nameserver 127.0.0.254\n",
    )
    .await;
    assert_ne!(out.status.code(), Some(0), "{}", common::describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(NAME),
        "the error names the engine's address: {}",
        common::describe(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_reaches_the_engine_by_a_name_from_dns() {
    if !needs_root("berth_reaches_the_engine_by_a_name_from_dns") {
        return;
    }
    let (port, relayed) = engine_relay().await;
    // An address of its own on the loopback network (resolv.conf cannot name a port).
    let server = format!("127.53.{}.1", std::process::id() % 250);
    let asked = dns_server(&server);
    let dir = tempfile::tempdir().unwrap();
    let out = status_by_name(
        dir.path(),
        port,
        "127.0.0.1 localhost\n",
        "hosts: files dns\n",
        &format!("nameserver {server}\noptions timeout:2 attempts:2\n"),
    )
    .await;
    common::show("berth status", &out);
    let asked = asked.lock().unwrap().clone();
    eprintln!("the DNS server was asked: {asked:?}");
    assert_eq!(out.status.code(), Some(0), "{}", common::describe(&out));
    assert!(
        asked.iter().any(|q| q == &format!("{NAME}/1")),
        "no A query for {NAME}: {asked:?}"
    );
    assert!(
        relayed.load(Ordering::SeqCst) > 0,
        "berth never reached the relay"
    );
}
