//! ACME on a single-node Docker Swarm (issue 20 D) against Debian's pebble, with the real engine
//! and real Envoy: a TLS-ALPN-01 listener is issued its certificate with nothing on the HTTP-01
//! port (the CA reaches the tasks' HTTPS listener through the host port, so the challenge
//! certificates reached every task), and a forced renewal under HTTPS load reaches every task
//! through the agent: no failed request, no task replaced.
//!
//! Run it on its own: `cargo test --test swarm_acme` (it takes its turn on the binary's Swarm
//! like tests/swarm.rs).

mod common;

use std::time::Instant;

use common::fleet::{ensure_images, PROXY};
use common::free_port;
use common::load::{assert_no_failures, Load};
use common::pebble::{acme_table, https_proxy, load_average, wait_issued, Options, Pebble};
use common::swarm::*;
use common::tls::served_by_name;

const DOMAIN: &str = "edge.berth.test";

fn config(https: u16, pebble: &Pebble, domains: &[&str]) -> String {
    let extra = [("challenge", "tls-alpn-01".into())];
    https_proxy(https, acme_table(pebble, domains, &extra))
}

fn status_json(case: &SwarmCase) -> serde_json::Value {
    let path = case
        .state()
        .join("acme")
        .join(PROXY)
        .join("https")
        .join("status.json");
    serde_json::from_slice(&std::fs::read(path).expect("status.json")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_alpn_01_issues_and_renews_through_the_agent_on_every_task() {
    let test = "tls_alpn_01_issues_and_renews_through_the_agent_on_every_task";
    if !common::pebble::installed(test) {
        return;
    }
    ensure_images();
    std::env::set_var("BERTH_AGENT_BINARY", agent_binary());
    let Some(guard) = SwarmGuard::new(test) else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let https = free_port();
    let mut o = Options::new();
    o.tls_port = https;
    let http_port = o.http_port;
    let pebble = Pebble::start_with(case.dir.path(), o);
    case.write(&config(https, &pebble, &[DOMAIN]));

    let started = Instant::now();
    case.up_ok();
    let issuance = started.elapsed();
    let first = wait_issued(https, DOMAIN, "").await;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", http_port)).is_err(),
        "nothing answers where pebble would ask HTTP-01"
    );
    assert_eq!(status_json(&case)["solver"], "tls-alpn-01");
    let service = format!("berth-{PROXY}");
    let tasks = task_containers(&service);
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    let spec_before = spec_hash(&service);

    // Forced renewal (one more name) under load whose SNI is a challenged name.
    let load = Load::start_tls_named(https, "/", 8, std::time::Duration::from_secs(120), DOMAIN);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    case.write(&config(https, &pebble, &[DOMAIN, "www.berth.test"]));
    let started = Instant::now();
    let out = case.up_ok();
    let renewal = started.elapsed();
    let second = wait_issued(https, DOMAIN, &first).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let report = load.stop().await;
    eprintln!(
        "Swarm tls-alpn-01: issuance (berth up) {issuance:?}, forced renewal under load {renewal:?}; {}; load average {}",
        report.summary(),
        load_average()
    );
    assert_no_failures("tls-alpn-01 renewal on a Swarm", &report);
    assert_eq!(task_containers(&service), tasks, "no task was replaced");
    assert_eq!(
        spec_hash(&service),
        spec_before,
        "no new spec: the certificate went live through the agents, not as a rolling update"
    );
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(said.contains("through their agents"), "{said}");
    let (www, issuer) = served_by_name(https, "www.berth.test").await.unwrap();
    assert!(www == second && issuer.contains("Pebble"), "{www} {issuer}");

    let out = case.berth(&["down"]);
    assert!(out.status.success(), "berth down failed");
}

fn spec_hash(name: &str) -> serde_json::Value {
    service(name)["Spec"]["Labels"]["io.berth.spec-hash"].clone()
}
