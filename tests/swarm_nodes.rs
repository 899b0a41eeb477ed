//! berth on a two-node Docker Swarm (issue 20 E), against real engines and real Envoy: the
//! host's engine as the manager (10.231.0.1) and a second dockerd in a network namespace as a
//! worker (10.231.0.2), a TLS registry with htpasswd on 10.231.0.1:5000 that both trust,
//! made once for this binary by `scripts/test-swarm.sh hold 2` (under
//! `/tmp/berth-locks/swarm.lock`) and removed when it exits, also when a test fails; the
//! scenarios take turns on it ([`common::swarm::SwarmGuard::two_nodes`]).
//!
//! Every scenario has tasks on both nodes and sends its load to both nodes' addresses:
//! - a rolling upgrade 1.39.3 → 1.40.0 under load: 0 failed requests on either node;
//! - the worker pulls the derived agent image from the registry with the credentials berth
//!   forwards with the service (it cannot pull it without them);
//! - `docker node update --availability drain` of the worker: its tasks drain (their
//!   connections end gracefully, none is reset) and stop there (global) or move to the
//!   manager (replicated), while the manager's tasks serve on;
//! - a route change and a certificate rotation under load on both nodes reach both tasks live
//!   through their agents, each task's Envoy confirming it: 0 failed requests, no task
//!   replaced, no new spec; a change Envoy refuses is taken back on every task;
//! - a worker without `net.ipv4.tcp_migrate_req = 1` (berth sets it on the manager only) is
//!   named, with the command, as a Degraded warning; once set, it is not.
//!
//! Run it on its own: `cargo test --test swarm_nodes` (as root: it makes a network namespace
//! and a second engine).

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::fleet::{ensure_images, NEW, OLD};
use common::free_port;
use common::load::{assert_no_failures, Load, LoadReport};
use common::swarm::*;
use common::tls::{pair, replace, served_serial_at};

/// Keep-alive connections per node.
const CONNECTIONS: usize = 12;

fn proxy_toml(name: &str, image: &str, port: u16, placement: &str) -> String {
    format!(
        r#"
[[proxy]]
name = "{name}"
image = "{image}"
replicas = 2
concurrency = 1

[proxy.swarm]
{placement}

[proxy.resources]
memory = "256Mi"

[proxy.shutdown]
drain_timeout = "5s"
min_drain_duration = "0s"

[proxy.rollout]
startup_deadline = "20s"
min_ready = "1s"
on_failure = "rollback"

[[proxy.listener]]
name = "web"
port = {port}
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "hello from two nodes\n" }}
"#
    )
}

const GLOBAL: &str = "mode = \"global\"";
const REPLICATED: &str = "mode = \"replicated\"";

fn scenario(test: &str) -> Option<SwarmGuard> {
    ensure_images();
    std::env::set_var("BERTH_AGENT_BINARY", agent_binary());
    SwarmGuard::two_nodes(test)
}

/// The status of one GET to `addr:port`.
fn get(addr: IpAddr, port: u16) -> Option<u16> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://{addr}:{port}/"))
        .output()
        .ok()?;
    // curl says 000 when nothing answered.
    String::from_utf8_lossy(&out.stdout)
        .parse()
        .ok()
        .filter(|s| *s != 0)
}

/// The running tasks of `service` by node hostname: `(node, image label)`.
fn tasks_by_node(case: &SwarmCase) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = case
        .status()
        .iter()
        .filter(|r| r["state"] == "running")
        .map(|r| {
            (
                r["node"].as_str().unwrap_or_default().to_string(),
                r["image"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// `(node, image)` of one task of `image` on each node, as [`tasks_by_node`] orders them.
fn one_on_each(guard: &SwarmGuard, image: &str) -> Vec<(String, String)> {
    let (manager, worker) = hostnames(guard);
    let mut want = vec![(manager, image.to_string()), (worker, image.to_string())];
    want.sort();
    want
}

/// `berth up` of a proxy with one task of `image` per node, then those tasks.
fn up_on_both(case: &SwarmCase, image: &str) {
    case.up_ok();
    // `up` waits for a running task on every eligible node; status reads them back.
    wait_until("one task on each node", Duration::from_secs(30), || {
        tasks_by_node(case) == one_on_each(case.guard, image)
    });
}

/// The hostnames of both nodes: (manager, worker).
fn hostnames(guard: &SwarmGuard) -> (String, String) {
    let name = |id: &str| docker_ok(&["node", "inspect", "-f", "{{.Description.Hostname}}", id]);
    (
        name(guard.nodes.manager_node()),
        name(guard.nodes.worker_node()),
    )
}

/// Load on both nodes' addresses: (manager's, worker's).
fn load_on_both(guard: &SwarmGuard, port: u16, per_request: bool) -> (Load, Load) {
    let max = Duration::from_secs(240);
    let start = |addr| {
        if per_request {
            Load::start_per_request_to((addr, port).into(), "/", CONNECTIONS / 2, max)
        } else {
            Load::start_to((addr, port).into(), "/", CONNECTIONS, max)
        }
    };
    (
        start(guard.nodes.manager_addr()),
        start(guard.nodes.worker_addr()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_upgrade_on_both_nodes_loses_no_request() {
    let Some(guard) = scenario("a_rolling_upgrade_on_both_nodes_loses_no_request") else {
        return;
    };
    let (manager, worker) = hostnames(&guard);
    let case = SwarmCase::new(&guard);
    let port = free_port();
    case.write(&proxy_toml("twoup", OLD, port, GLOBAL));
    let started = Instant::now();
    up_on_both(&case, OLD);
    eprintln!("up of a global proxy on two nodes: {:?}", started.elapsed());
    for (from, to, per_request) in [(OLD, NEW, false), (NEW, OLD, true)] {
        let (on_manager, on_worker) = load_on_both(&guard, port, per_request);
        tokio::time::sleep(Duration::from_secs(1)).await;
        case.write(&proxy_toml("twoup", to, port, GLOBAL));
        let started = Instant::now();
        case.up_ok();
        let took = started.elapsed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let kind = if per_request {
            "connection per request"
        } else {
            "keep-alive"
        };
        let what = |node: &str| {
            format!(
                "rolling upgrade {from} → {to} ({kind}) in {:.1}s, load on {node}",
                took.as_secs_f64()
            )
        };
        assert_no_failures(&what(&manager), &on_manager.stop().await);
        assert_no_failures(&what(&worker), &on_worker.stop().await);
        wait_until(
            "one task of the new image on each node",
            Duration::from_secs(30),
            || tasks_by_node(&case) == one_on_each(&guard, to),
        );
    }
}

#[test]
fn a_worker_without_migrate_req_is_named_with_the_command() {
    let Some(guard) = scenario("a_worker_without_migrate_req_is_named_with_the_command") else {
        return;
    };
    let (manager, worker) = hostnames(&guard);
    let case = SwarmCase::new(&guard);
    case.write(&proxy_toml("twokern", OLD, free_port(), GLOBAL));
    up_on_both(&case, OLD);
    let said = |out: &std::process::Output| {
        assert!(out.status.success(), "berth up failed");
        stderr(out)
    };

    guard.set_worker_sysctl("net.ipv4.tcp_migrate_req", "0");
    let started = Instant::now();
    let warned = said(&case.berth(&["up"]));
    eprintln!("up asking the worker's agent: {:?}", started.elapsed());
    let want = format!("warning: node {worker}: net.ipv4.tcp_migrate_req is 0 there");
    assert!(warned.contains(&want), "{want} not in: {warned}");
    assert!(
        warned.contains("sysctl -w net.ipv4.tcp_migrate_req=1"),
        "{warned}"
    );
    assert!(!warned.contains(&format!("node {manager}:")), "{warned}");

    guard.set_worker_sysctl("net.ipv4.tcp_migrate_req", "1");
    let quiet = said(&case.berth(&["up"]));
    assert!(!quiet.contains("tcp_migrate_req is 0"), "{quiet}");
}

#[test]
fn the_worker_pulls_the_agent_image_with_the_forwarded_credentials() {
    let Some(guard) = scenario("the_worker_pulls_the_agent_image_with_the_forwarded_credentials")
    else {
        return;
    };
    let (_, worker) = hostnames(&guard);
    let case = SwarmCase::new(&guard);
    let port = free_port();
    case.write(&proxy_toml("twopull", NEW, port, GLOBAL));
    up_on_both(&case, NEW);
    let image = service("berth-twopull")["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        .as_str()
        .unwrap()
        .to_string();
    let repo = format!("{}/berth-agent/envoy:", case.registry());
    assert!(
        image.starts_with(&repo) && image.contains("@sha256:"),
        "{image}: not pinned under {repo}"
    );
    // The worker's own engine pulled it from the registry and runs it.
    let on_worker = guard.nodes.worker_docker_ok(&[
        "ps",
        "--filter",
        "label=com.docker.swarm.service.name=berth-twopull",
        "--format",
        "{{.Image}}",
    ]);
    let (tagged, _) = image.split_once('@').unwrap();
    assert_eq!(
        on_worker, tagged,
        "the worker's task runs the registry's image"
    );
    let pulled = guard.nodes.worker_docker_ok(&[
        "images",
        "--digests",
        "--format",
        "{{.Repository}}@{{.Digest}}",
    ]);
    // Pulled by digest (the spec pins it): the worker's image has no tag of its own.
    let (repository, _) = tagged.rsplit_once(':').unwrap();
    let digest = image.split_once('@').unwrap().1;
    assert!(
        pulled
            .lines()
            .any(|l| l == format!("{repository}@{digest}")),
        "{image} not among the worker's images:\n{pulled}"
    );
    assert_eq!(get(guard.nodes.worker_addr(), port), Some(200));
    // The worker fetched the manifest with credentials (the registry authorized the request
    // from its address)...
    let manifest =
        format!("http.request.uri=\"/v2/berth-test/berth-agent/envoy/manifests/{digest}\"");
    let log = guard.nodes.registry_log();
    assert!(
        log.lines().any(|l| l.contains("msg=\"authorized request\"")
            && l.contains(&format!(
                "http.request.remoteaddr=\"{}:",
                guard.nodes.worker_addr()
            ))
            && l.contains(&manifest)),
        "no authorized request for {manifest} from the worker in the registry's log:\n{log}"
    );
    // ... which it has from the service only: on its own it cannot pull from the registry.
    let anonymous = guard.nodes.worker_docker(&["pull", tagged]);
    assert!(!anonymous.status.success(), "an anonymous pull must fail");
    let err = stderr(&anonymous);
    assert!(err.contains("no basic auth credentials"), "{err}");
    let rows = case.status();
    assert!(
        rows.iter()
            .any(|r| r["node"] == worker.as_str() && r["ready"] == true),
        "{rows:?}"
    );
}

/// Drains the worker under load on both nodes; the load on the worker is connections that each
/// run until the server closes them. Returns (manager's report, worker's report).
async fn drain_the_worker(guard: &SwarmGuard, port: u16) -> (LoadReport, LoadReport) {
    let max = Duration::from_secs(120);
    let on_manager = Load::start_to(
        (guard.nodes.manager_addr(), port).into(),
        "/",
        CONNECTIONS,
        max,
    );
    let on_worker = Load::start_until_closed_to(
        (guard.nodes.worker_addr(), port).into(),
        "/",
        CONNECTIONS,
        max,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(on_worker.open_connections(), CONNECTIONS);
    let worker = guard.nodes.worker_node().to_string();
    guard.set_availability(&worker, "drain");
    let deadline = Instant::now() + Duration::from_secs(60);
    while on_worker.open_connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} connections to the drained worker still open after 60 s",
            on_worker.open_connections()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        "the worker's task containers gone",
        Duration::from_secs(60),
        || {
            guard
                .nodes
                .worker_docker_ok(&[
                    "ps",
                    "-q",
                    "--filter",
                    &format!("label={}", guard.cleanup.filter()),
                ])
                .is_empty()
        },
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    (on_manager.stop().await, on_worker.stop().await)
}

fn assert_closed_gracefully(what: &str, report: &LoadReport) {
    eprintln!("{what}: {}", report.summary());
    assert_eq!(report.failed, 0, "{what}: {}", report.summary());
    assert_eq!(
        report.closed_gracefully,
        CONNECTIONS as u64,
        "{what}: every connection ends by the server's graceful close: {}",
        report.summary()
    );
    assert!(report.ok > 0, "{what}: {}", report.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_the_worker_stops_a_global_proxy_there_gracefully() {
    let Some(guard) = scenario("draining_the_worker_stops_a_global_proxy_there_gracefully") else {
        return;
    };
    let (manager, _) = hostnames(&guard);
    let case = SwarmCase::new(&guard);
    let port = free_port();
    case.write(&proxy_toml("twodrain", NEW, port, GLOBAL));
    up_on_both(&case, NEW);
    let (on_manager, on_worker) = drain_the_worker(&guard, port).await;
    assert_no_failures("the manager's task while the worker drains", &on_manager);
    assert_closed_gracefully("the drained worker's connections", &on_worker);
    assert_eq!(
        get(guard.nodes.worker_addr(), port),
        None,
        "nothing serves on the worker"
    );
    assert_eq!(get(guard.nodes.manager_addr(), port), Some(200));
    let nodes: Vec<String> = tasks_by_node(&case).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        nodes,
        vec![manager],
        "the global proxy stays on the manager only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_the_worker_moves_a_replicated_proxy_gracefully() {
    let Some(guard) = scenario("draining_the_worker_moves_a_replicated_proxy_gracefully") else {
        return;
    };
    let (manager, _) = hostnames(&guard);
    let case = SwarmCase::new(&guard);
    let port = free_port();
    case.write(&proxy_toml("twomove", NEW, port, REPLICATED));
    case.up_ok();
    assert_eq!(
        tasks_by_node(&case),
        one_on_each(&guard, NEW),
        "spread over both"
    );
    let (on_manager, on_worker) = drain_the_worker(&guard, port).await;
    assert_no_failures("the manager's task while the worker drains", &on_manager);
    assert_closed_gracefully("the drained worker's connections", &on_worker);
    wait_until("both tasks on the manager", Duration::from_secs(60), || {
        let rows = case.status();
        rows.len() == 2
            && rows
                .iter()
                .all(|r| r["node"] == manager.as_str() && r["ready"] == true)
    });
    assert_eq!(get(guard.nodes.worker_addr(), port), None);
}

/// The body of one GET to `addr:port`.
fn body(addr: IpAddr, port: u16) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", "-m", "3"])
        .arg(format!("http://{addr}:{port}/"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The tasks of the case's proxy (Envoy node ids: `<service>.<node id>.<task id>`), sorted.
fn task_names(case: &SwarmCase) -> Vec<String> {
    let mut names: Vec<String> = case
        .status()
        .iter()
        .filter_map(|r| r["service_node"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// The serial each node's tasks serve over HTTPS on `port`: one handshake per node and round,
/// until both serve `serial` 8 times in a row (each node may run several tasks) or `within`.
async fn wait_served_on_both(guard: &SwarmGuard, port: u16, serial: &str, within: Duration) {
    let started = Instant::now();
    let addrs = [guard.nodes.manager_addr(), guard.nodes.worker_addr()];
    let mut in_a_row = 0;
    loop {
        let mut seen = Vec::new();
        for addr in addrs {
            seen.push(served_serial_at((addr, port).into(), "localhost").await);
        }
        if seen.iter().all(|s| s.as_deref() == Ok(serial)) {
            in_a_row += 1;
            if in_a_row == 8 {
                return;
            }
        } else {
            in_a_row = 0;
            assert!(
                started.elapsed() < within,
                "serial {serial} not served on both nodes within {within:?}: {seen:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One Swarm, several live changes (each reaching the tasks on both nodes through their
/// agents, confirmed by each task's Envoy, no task replaced, no new spec): a route change and a
/// certificate rotation under load on both nodes, 0 failed requests; then a change every
/// task's Envoy refuses, taken back on every task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_change_reaches_both_nodes_live_without_a_rolling_update() {
    let Some(guard) = scenario("a_route_change_reaches_both_nodes_live_without_a_rolling_update")
    else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let port = free_port();
    let tls_port = free_port();
    let (cert, key) = (
        case.dir.path().join("cert.pem"),
        case.dir.path().join("key.pem"),
    );
    let put = |(c, k): (String, String)| {
        replace(&cert, &c);
        replace(&key, &k);
    };
    put(pair(0x2001, 2020, 2090));
    let toml = |text: &str| {
        proxy_toml("twolive", NEW, port, GLOBAL).replace("hello from two nodes", text)
            + &format!(
                r#"
[[proxy.listener]]
name = "secure"
port = {tls_port}
protocol = "https"
tls = {{ cert_file = "{}", key_file = "{}" }}

[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "secure\n" }}
"#,
                cert.display(),
                key.display()
            )
    };
    case.write(&toml("before"));
    up_on_both(&case, NEW);
    let (m, w) = (guard.nodes.manager_addr(), guard.nodes.worker_addr());
    assert_eq!(
        (body(m, port), body(w, port)),
        ("before\n".into(), "before\n".into())
    );
    wait_served_on_both(&guard, tls_port, "2001", Duration::from_secs(10)).await;
    let tasks = task_names(&case);
    let spec = || service("berth-twolive")["Spec"]["Labels"]["io.berth.spec-hash"].clone();
    let spec_before = spec();

    // A route change under load on both nodes: delivered through the agents, confirmed by
    // each task's Envoy before `up` returns; no task replaced, no new spec.
    let (on_manager, on_worker) = load_on_both(&guard, port, false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    case.write(&toml("after"));
    let started = Instant::now();
    let out = case.up_ok();
    let took = started.elapsed();
    assert_eq!(
        (body(m, port), body(w, port)),
        ("after\n".into(), "after\n".into())
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let what = |node: &str| {
        format!(
            "a live route change in {:.2}s, load on {node}",
            took.as_secs_f64()
        )
    };
    assert_no_failures(&what("the manager"), &on_manager.stop().await);
    assert_no_failures(&what("the worker"), &on_worker.stop().await);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        said.contains("confirmed by 2 task(s) through their agents"),
        "{said}"
    );
    assert_eq!(task_names(&case), tasks, "no task replaced");
    assert_eq!(spec(), spec_before, "no new spec: no rolling update");

    // A certificate rotation under HTTPS load on both nodes: the new copies and the secret
    // that names them go through the agents too, and `up` returns once every task's Envoy
    // serves the new serial (its /certs).
    let max = Duration::from_secs(120);
    let on_manager = Load::start_tls_to((m, tls_port).into(), "/", CONNECTIONS, max);
    let on_worker = Load::start_tls_to((w, tls_port).into(), "/", CONNECTIONS, max);
    tokio::time::sleep(Duration::from_secs(1)).await;
    put(pair(0x2002, 2021, 2091));
    let started = Instant::now();
    let out = case.up_ok();
    let took = started.elapsed();
    wait_served_on_both(&guard, tls_port, "2002", Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let what = |node: &str| {
        format!(
            "a live certificate rotation in {:.2}s, HTTPS load on {node}",
            took.as_secs_f64()
        )
    };
    assert_no_failures(&what("the manager"), &on_manager.stop().await);
    assert_no_failures(&what("the worker"), &on_worker.stop().await);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        said.contains("confirmed by 2 task(s) through their agents"),
        "{said}"
    );
    assert_eq!(task_names(&case), tasks, "no task replaced");
    assert_eq!(spec(), spec_before, "no new spec: no rolling update");

    // A change Envoy refuses (a route template with an invalid regex, which only Envoy
    // checks): every task refuses it, `up` fails naming Envoy's reason, and every task is
    // back on the previous files.
    let templates = case.dir.path().join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    let rds = berth::core::render::builtin_template("rds.yaml.tera")
        .unwrap()
        .replace("prefix: {{ r.prefix }}", "safe_regex: { regex: \"(\" }");
    std::fs::write(templates.join("rds.yaml.tera"), rds).unwrap();
    let generation = |file: &str| {
        std::fs::read_to_string(case.state().join("proxies/twolive/xds").join(file))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    let before = generation("rds-web.yaml");
    case.write(&toml("refused"));
    let out = case.berth(&["--templates", &path_str(&templates), "up"]);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!out.status.success(), "a refused change fails `up`: {said}");
    assert!(
        said.contains("Envoy: Filesystem config update rejected: missing ): ("),
        "Envoy's reason: {said}"
    );
    assert!(
        said.contains("were restored on every task; each serves them"),
        "{said}"
    );
    assert_eq!(
        (body(m, port), body(w, port)),
        ("after\n".into(), "after\n".into()),
        "both nodes serve the previous routes"
    );
    assert_eq!(
        generation("rds-web.yaml"),
        before,
        "the previous files on record"
    );
    assert_eq!(task_names(&case), tasks, "no task replaced");
    assert_eq!(spec(), spec_before, "no new spec: no rolling update");
}
