//! berth is one statically linked binary, and still resolves host names. Static glibc resolves
//! through `files` (/etc/hosts) and `dns` (/etc/resolv.conf) only: no NSS modules (mdns,
//! systemd-resolved's `resolve`, LDAP, myhostname) are loaded. The names berth itself looks up
//! (the engine's DOCKER_HOST, an ACME directory) go through that one resolver (getaddrinfo, by
//! hyper-util's resolver in both clients); image registries are resolved by the engine and
//! backends by Envoy, not by berth.
//!
//! The checks run the real test build of berth in a private mount namespace whose /etc/hosts,
//! /etc/nsswitch.conf and /etc/resolv.conf are bind-mounted over (the host's files are never
//! changed): with DOCKER_HOST=tcp://NAME:PORT, NAME resolved once from a hosts file and once
//! from a DNS server started here, PORT a TCP relay to the Docker socket that counts
//! connections (`berth status` exits 0 only if it reached the real engine through the name);
//! and `berth up` with an ACME directory given by a name from the hosts file. A fleet whose
//! image comes from a registry named `localhost` (berth finds its credentials by that name, the
//! engine resolves it) and whose backend is `localhost:PORT` (Envoy resolves it) shows the
//! names berth hands on.

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

/// The name-service files of a private mount namespace: /etc/hosts, /etc/nsswitch.conf and
/// /etc/resolv.conf.
struct Names<'a> {
    hosts: &'a str,
    nsswitch: &'a str,
    resolv: &'a str,
}

/// The berth under test with `args`, in a mount namespace whose name-service files are `names`.
async fn berth_with(
    dir: &Path,
    names: &Names<'_>,
    args: &[&str],
    env: &[(&str, String)],
) -> std::process::Output {
    for (file, text) in [
        ("hosts", names.hosts),
        ("nsswitch.conf", names.nsswitch),
        ("resolv.conf", names.resolv),
    ] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let script = "mount --bind \"$1/hosts\" /etc/hosts && \
                  mount --bind \"$1/nsswitch.conf\" /etc/nsswitch.conf && \
                  mount --bind \"$1/resolv.conf\" /etc/resolv.conf && shift && exec \"$@\"";
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args([
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
    .args(args)
    .current_dir(dir)
    .env("BERTH_SYSCTL_DROPIN", common::TEST_SYSCTL_DROPIN);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("unshare(1) from util-linux")
}

/// `berth status` with DOCKER_HOST=tcp://NAME:port, under `names`.
async fn status_by_name(
    dir: &Path,
    port: u16,
    hosts: &str,
    nsswitch: &str,
    resolv: &str,
) -> std::process::Output {
    let state = dir.join("state").display().to_string();
    let names = Names {
        hosts,
        nsswitch,
        resolv,
    };
    let docker_host = ("DOCKER_HOST", format!("tcp://{NAME}:{port}"));
    berth_with(
        dir,
        &names,
        &["--state-dir", &state, "status"],
        &[docker_host],
    )
    .await
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

/// An HTTPS server on 127.0.0.1 with a certificate for `name` (from the returned CA, PEM),
/// answering 404 to every request and recording each request's line and Host header.
async fn https_recorder(name: &str) -> (u16, String, Arc<Mutex<Vec<String>>>) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, log) = (acceptor.clone(), log.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let line = head.lines().next().unwrap_or_default().to_string();
                let host = head
                    .lines()
                    .find_map(|l| l.strip_prefix("host: ").or(l.strip_prefix("Host: ")))
                    .unwrap_or_default()
                    .to_string();
                log.lock().unwrap().push(format!("{line} host={host}"));
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, ca.pem(), seen)
}

/// An ACME directory given by a name from /etc/hosts: berth's ACME client (hyper-util's
/// resolver, as the engine client's) reaches it. The server is a recorder answering 404, so
/// `berth up` fails to obtain the certificate, naming the directory, once it asked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_reaches_an_acme_directory_by_a_name_from_etc_hosts() {
    use common::config::{table, Listener, Proxy, Route};
    if !needs_root("berth_reaches_an_acme_directory_by_a_name_from_etc_hosts") {
        return;
    }
    const ACME: &str = "berth-acme.test";
    let (port, ca, asked) = https_recorder(ACME).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca).unwrap();
    let directory = format!("https://{ACME}:{port}/dir");
    let acme = table([
        ("domains", vec!["app.berth.test"].into()),
        ("email", "ops@berth.test".into()),
        ("directory", directory.clone().into()),
        (
            "ca_file",
            dir.path().join("ca.pem").display().to_string().into(),
        ),
    ]);
    let config = Proxy::test("names", common::TEST_IMAGE, 1)
        .listener(Listener::http("web", common::free_port()).route(Route::direct("/", 200, "\n")))
        .listener(
            Listener::https("https", common::free_port(), table([("acme", acme)]))
                .route(Route::direct("/", 200, "tls\n")),
        )
        .to_toml();
    std::fs::write(dir.path().join("berth.toml"), config).unwrap();
    common::fleet::ensure_images();
    let cleanup = common::Cleanup::new("static_names");
    let case = format!("{}={}", common::LABEL_TEST_CASE, cleanup.case);
    let state = dir.path().join("state").display().to_string();
    let names = Names {
        hosts: &format!("127.0.0.1 localhost\n127.0.0.1 {ACME}\n"),
        nsswitch: "hosts: files\n",
        resolv: "nameserver 127.0.0.254\n",
    };
    let args = [
        "-f",
        "berth.toml",
        "--state-dir",
        &state,
        "--container-label",
        "io.berth.test=1",
        "--container-label",
        &case,
        "up",
    ];
    let out = berth_with(dir.path(), &names, &args, &[]).await;
    common::show("berth up", &out);
    let asked = asked.lock().unwrap().clone();
    eprintln!("the directory was asked: {asked:?}");
    assert!(
        asked
            .iter()
            .any(|r| r.starts_with("GET /dir ") && r.ends_with(&format!("host={ACME}:{port}"))),
        "berth never asked {directory}: {asked:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&directory),
        "up fails naming the directory: {}",
        common::describe(&out)
    );
}

/// A tiny HTTP/1.1 server on 127.0.0.1 answering `body` to every request.
async fn http_backend(body: &'static str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.windows(4).any(|w| w == b"\r\n\r\n") {
                        head.clear();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if tcp.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_from_a_registry_and_a_backend_given_by_name_serve() {
    use common::config::{Backend, Listener, Proxy, Route};
    use common::registry::{Registry, REGISTRY};
    for tool in [REGISTRY, "/usr/bin/htpasswd"] {
        if !Path::new(tool).exists() {
            return common::skip(
                "an_image_from_a_registry_and_a_backend_given_by_name_serve",
                &format!("{tool} is missing (.ci/run installs docker-registry and apache2-utils)"),
            );
        }
    }
    common::fleet::ensure_images();
    let registry = Registry::start_as("localhost");
    let login = registry.login();
    registry.push(common::TEST_IMAGE, login.path());
    let backend = http_backend("from the backend by name\n").await;
    let fleet = common::fleet::Fleet::new("static_names").await;
    fleet.write_toml(
        &Proxy::test("byname", &registry.image, 1)
            .listener(Listener::http("web", fleet.port).route(Route::backend("/", "api")))
            .backend(Backend::new("api", &[format!("localhost:{backend}")]))
            .to_toml(),
    );
    let out = fleet
        .berth(&["up"])
        .env("DOCKER_CONFIG", login.path())
        .output()
        .await
        .unwrap();
    common::show("berth up", &out);
    assert_eq!(out.status.code(), Some(0), "{}", common::describe(&out));
    let replicas = fleet.replicas().await;
    assert_eq!(replicas.len(), 1);
    let inspect = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Config.Image}}", &replicas[0].id])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&inspect.stdout).trim(),
        registry.image,
        "the replica runs the image pulled from the registry by its name"
    );
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", fleet.port))
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: byname\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("from the backend by name\n"),
        "through the proxy to localhost:{backend}: {answer}"
    );
}
