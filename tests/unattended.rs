//! Hosts nobody watches (issue 10, parts C, D, G and H): `berth serve` prepares the host
//! itself, tells the truth about replicas that cannot bind their port after a reboot and
//! repairs them, and one host runs 100+ replicas.
//!
//! These tests change kernel settings of the host (restored by [`HostGuard`], also on
//! failure), so they run one at a time ([`HOST`]); containers are removed by label
//! ([`common::Cleanup`]) even when a test fails.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::config as cfg;
use common::host::{self, HostGuard};
use common::load::Load;
use common::serve::*;
use serde_json::Value;

/// The host's kernel settings are shared: one test at a time.
static HOST: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    HOST.lock().unwrap_or_else(|e| e.into_inner())
}

/// `berth <args>` against the case's config and state directory, with its test labels.
fn berth(case: &Case, args: &[&str]) -> Output {
    common::berth_on(&case.config, case.state_dir.path(), &case.cleanup.case)
        .args(args)
        .output()
        .expect("running berth")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `berth status --output json`.
fn status_json(case: &Case) -> Value {
    let out = berth(case, &["status", "--output", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `berth_replica_ready` samples of serve's `/metrics`: (proxy, replica, value).
fn replica_ready_metrics(serve: &Serve) -> Vec<(String, String, f64)> {
    let (code, body) = serve.get("/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{body}");
    let label = |line: &str, key: &str| {
        let start = line.find(&format!("{key}=\""))? + key.len() + 2;
        let end = start + line[start..].find('"')?;
        Some(line[start..end].to_string())
    };
    body.lines()
        .filter(|l| l.starts_with("berth_replica_ready{"))
        .filter_map(|l| {
            Some((
                label(l, "proxy")?,
                label(l, "replica")?,
                l.rsplit(' ').next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Whether 127.0.0.1:port accepts a connection and answers a request.
fn serving(port: u16) -> bool {
    http_get(port, "/").is_some_and(|(code, _)| code == 200)
}

/// A proxy config with a rollout-relevant `log_level`.
fn proxy_toml(name: &str, replicas: u32, port: u16, log_level: &str) -> String {
    cfg::Proxy::new(name, common::TEST_IMAGE, replicas)
        .set("log_level", log_level)
        .set("resources.memory", "128Mi")
        .set("rollout.min_ready", "1s")
        .set("shutdown.drain_timeout", "5s")
        .set("shutdown.min_drain_duration", "0s")
        .listener(cfg::Listener::http("web", port).route(cfg::Route::direct(
            "/",
            200,
            &format!("{name}\n"),
        )))
        .to_toml()
}

// ---------------------------------------------------------------------------------------------
// 1. A serve-driven rollout on a host with tcp_migrate_req = 0, under connection-per-request load.

/// Clients of the connection-per-request load: enough that connections are often queued on a
/// listener when it closes (what the control must catch).
const CLIENTS: usize = 48;

/// One rollout of [`serve_rollouts_under_per_request_load`]: its load report, how long serve
/// took (config write to converged on new containers) and the tcp_migrate_req it ran with.
struct Round {
    report: common::load::LoadReport,
    took: Duration,
    migrate_req: u64,
}

/// Starts serve on a host with tcp_migrate_req = 0 and rolls the proxy under
/// connection-per-request load (a fresh load each rollout), until `enough` says so after a
/// rollout, or `rounds` rollouts. The caller holds [`host::SysctlLock::exclusive`].
fn serve_rollouts_under_per_request_load(
    test: &str,
    tune_host: bool,
    rounds: usize,
    enough: impl Fn(&Round) -> bool,
) -> Vec<Round> {
    let _host = HostGuard::new();
    let case = Case::new(test);
    let header = format!("tune_host = {tune_host}\n");
    let levels = ["info", "warn"];
    write_config(
        &case.config,
        &format!(
            "{header}{}",
            proxy_toml(&case.name, 3, case.port, levels[0])
        ),
    );
    // A host where only the service ever ran: nobody has set it.
    host::set(host::MIGRATE_REQ, 0);
    let serve = case.serve(&[]);
    serve.wait_for("3 ready replicas", Duration::from_secs(90), |s| {
        s.converged(&case.name, 3)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut done = Vec::new();
    for round in 1..=rounds {
        // Set back to 0 behind serve's back (a reboot, another tool): the rollout's own pass
        // must prepare the host again, not only serve's start.
        host::set(host::MIGRATE_REQ, 0);
        let before: BTreeSet<String> = case.containers().into_iter().map(|c| c.1).collect();
        let load = rt.block_on(async {
            Load::start_per_request(case.port, "/", CLIENTS, Duration::from_secs(120))
        });
        std::thread::sleep(Duration::from_millis(500));
        let started = Instant::now();
        let level = levels[round % 2];
        write_config(
            &case.config,
            &format!("{header}{}", proxy_toml(&case.name, 3, case.port, level)),
        );
        let took = serve.wait_for(
            "the rollout to the new spec",
            Duration::from_secs(120),
            |s| {
                s.converged(&case.name, 3)
                    && case.containers().iter().all(|c| !before.contains(&c.1))
            },
        );
        std::thread::sleep(Duration::from_millis(500));
        let migrate_req = host::get(host::MIGRATE_REQ).unwrap_or(0);
        let report = rt.block_on(load.stop());
        eprintln!(
            "{test} round {round}: serve rolled 3 replicas in {took:?} (config write to \
             converged; {:?} in all) with tcp_migrate_req={migrate_req}; load: {}",
            started.elapsed(),
            report.summary()
        );
        assert_eq!(case.containers().len(), 3);
        done.push(Round {
            report,
            took,
            migrate_req,
        });
        if enough(done.last().unwrap()) {
            break;
        }
    }
    done
}

#[test]
fn serve_rollout_on_a_host_with_migrate_req_off_loses_nothing() {
    let _serial = serial();
    let _off = host::SysctlLock::exclusive();
    let rounds = serve_rollouts_under_per_request_load("unatt-migrate", true, 1, |_| true);
    let round = &rounds[0];
    assert_eq!(
        round.migrate_req, 1,
        "serve's pass prepared the host before rolling"
    );
    common::load::assert_no_failures("serve's rollout, a connection per request", &round.report);
}

/// Rollouts the negative control runs at most; it ends at the first that loses a request
/// (`BERTH_CONTROL_ALL_ROUNDS=1`: runs them all, for the figures). Measured on this 2-core host
/// (load average 7-9): 5 of 10 rollouts lost requests (1-12 each), so 10 rounds all without a
/// loss would happen about once in a thousand runs of a working control.
const CONTROL_ROUNDS: usize = 10;

/// The negative control of the test above: the same rollouts with `tune_host = false`, so
/// tcp_migrate_req stays 0 and connections queued on a closing listener are reset. Losing
/// requests is probabilistic (a connection must be queued at the moment a listener closes), so
/// it rolls up to [`CONTROL_ROUNDS`] times and is broken only when no rollout lost a request:
/// then the scenario above could not tell berth's fix from its absence.
#[test]
#[ignore = "a negative control that turns tcp_migrate_req off host-wide; CI runs it: scripts/test.sh"]
fn control_serve_rollout_with_migrate_req_off_and_tune_host_off() {
    let _serial = serial();
    let _off = host::SysctlLock::exclusive();
    let rounds =
        serve_rollouts_under_per_request_load("unatt-control", false, CONTROL_ROUNDS, |r| {
            r.report.failed > 0 && std::env::var_os("BERTH_CONTROL_ALL_ROUNDS").is_none()
        });
    let figures: Vec<String> = rounds
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "round {}: {} failed of {} requests, rollout {:?}",
                i + 1,
                r.report.failed,
                r.report.ok + r.report.failed,
                r.took
            )
        })
        .collect();
    eprintln!("control figures: {}", figures.join("; "));
    assert!(
        rounds.iter().all(|r| r.migrate_req == 0),
        "tune_host = false left tcp_migrate_req at 0"
    );
    assert!(
        rounds.iter().any(|r| r.report.failed > 0),
        "the control lost no request in {} rollouts with tcp_migrate_req=0, so the scenario \
         cannot show what berth's host tuning prevents: {}",
        rounds.len(),
        figures.join("; ")
    );
}

// ---------------------------------------------------------------------------------------------
// 2. A reboot: a proxy on a port below 1024 after the kernel forgot the setting.

/// A port below 1024 that nothing listens on.
fn free_low_port() -> u16 {
    (900..1000)
        .find(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
        .expect("a free port in 900..1000")
}

/// What a reboot does to the host and the replicas: the kernel settings are back to their
/// defaults, and Docker starts the replicas again by restart policy (here: `docker restart`).
/// Returns once every replica is LIVE again (by `berth status`, which probes) and the port
/// is dead.
fn reboot(case: &Case) -> Vec<String> {
    host::set(host::PORT_START, 1024);
    let ids: Vec<String> = case.containers().into_iter().map(|c| c.0).collect();
    let out = Command::new("docker")
        .args(["restart", "-t", "10"])
        .args(&ids)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let start = Instant::now();
    loop {
        let st = status_json(case);
        let rows = st["replicas"].as_array().cloned().unwrap_or_default();
        if rows.len() == ids.len() && rows.iter().all(|r| r["envoy"] == "LIVE") {
            // LIVE, but nothing can bind the port: nothing may say ready.
            for r in &rows {
                assert_eq!(r["ready"], false, "{st:#}");
                let reason = r["reason"].as_str().unwrap_or_default();
                assert!(reason.contains(&format!("port(s) {}", case.port)), "{st:#}");
            }
            let ready = condition(&st["proxies"][&case.name], "Ready");
            assert_ne!(ready["status"], "True", "berth status: {st:#}");
            assert!(!serving(case.port));
            return ids;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the replicas did not come back LIVE: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Samples serve's `/status`, its `/metrics` and `berth status` in turn until the port serves
/// again, checking the port after each sample. A sample that says ready followed by a dead
/// port is a lie (here the port only goes from dead to serving). Returns the time until the
/// port served and how many samples were taken while it was dead.
fn watch_repair(case: &Case, serve: &Serve, within: Duration) -> (Duration, u32) {
    let start = Instant::now();
    // Every turn takes one sample, taken while the port was dead unless it serves after it.
    for turn in 0u32.. {
        let lie = match turn % 3 {
            0 => {
                let p = serve.proxy(&case.name);
                let ready = condition(&p, "Ready")["status"] == "True"
                    || p["replicas"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|r| r["ready"] == true);
                ready.then(|| format!("/status: {p:#}"))
            }
            1 => {
                let metrics = replica_ready_metrics(serve);
                metrics
                    .iter()
                    .any(|(proxy, _, v)| proxy == &case.name && *v != 0.0)
                    .then(|| format!("/metrics berth_replica_ready: {metrics:?}"))
            }
            _ => {
                let cli = status_json(case);
                let ready = condition(&cli["proxies"][&case.name], "Ready")["status"] == "True"
                    || cli["replicas"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|r| r["ready"] == true);
                ready.then(|| format!("berth status: {cli:#}"))
            }
        };
        if serving(case.port) {
            return (start.elapsed(), turn);
        }
        if let Some(lie) = lie {
            panic!(
                "says ready while port {} is dead: {lie}\nserve log:\n{}",
                case.port,
                serve.log_text()
            );
        }
        assert!(
            start.elapsed() < within,
            "the port was not serving after {within:?}\nstatus: {:#}\nserve log:\n{}",
            serve.proxy(&case.name),
            serve.log_text()
        );
    }
    unreachable!()
}

/// Replicas restored by Docker after the reboot were replaced, and the proxy is whole again.
fn assert_repaired(case: &Case, serve: &Serve, restarted: &[String]) {
    serve.wait_for("2 ready replicas again", Duration::from_secs(90), |s| {
        s.converged(&case.name, 2)
    });
    let now: Vec<String> = case.containers().into_iter().map(|c| c.0).collect();
    assert!(
        now.iter().all(|id| !restarted.contains(id)),
        "every replica that could not bind was replaced: {restarted:?} → {now:?}"
    );
    assert!(serving(case.port));
    assert!(host::get(host::PORT_START).unwrap() <= u64::from(case.port));
}

#[test]
fn after_a_reboot_serve_brings_a_low_port_back_and_nothing_says_ready_until_then() {
    let _serial = serial();
    let _host = HostGuard::new();
    let mut case = Case::new("unatt-reboot");
    case.port = free_low_port();
    write_config(&case.config, &proxy_toml(&case.name, 2, case.port, "info"));
    host::set(host::PORT_START, 1024);
    let mut serve = case.serve(&[]);
    serve.wait_for("2 ready replicas", Duration::from_secs(90), |s| {
        s.converged(&case.name, 2)
    });
    assert!(serving(case.port));
    assert!(host::get(host::PORT_START).unwrap() <= u64::from(case.port));
    let dropin = std::fs::read_to_string(common::TEST_SYSCTL_DROPIN).unwrap();
    assert!(
        dropin.contains(&format!(
            "net.ipv4.ip_unprivileged_port_start = {}",
            case.port
        )),
        "{dropin}"
    );

    // (a) serve keeps running, but misses the moment (frozen while the host reboots, as if
    // it were slow to notice): when it wakes up, the record of its last pass says Ready.
    serve.signal(libc::SIGSTOP);
    let restarted = reboot(&case);
    serve.signal(libc::SIGCONT);
    let (repaired, samples) = watch_repair(&case, &serve, Duration::from_secs(90));
    assert_repaired(&case, &serve, &restarted);
    eprintln!(
        "reboot with serve running: port {} serving {repaired:?} after serve resumed \
         ({samples} samples while it was dead)",
        case.port
    );

    // (b) serve starts after the reboot, as its systemd unit would: it puts the settings back
    // before anything else, then repairs the replicas Docker restored.
    serve.signal(libc::SIGTERM);
    let (exit, _) = serve.wait_exit(Duration::from_secs(60));
    assert!(exit.success(), "{}", serve.log_text());
    let first_log = serve.log_text();
    drop(serve);
    let restarted = reboot(&case);
    let started = Instant::now();
    let serve = case.serve(&[]);
    // The status server binds after the host is prepared.
    assert!(
        host::get(host::PORT_START).unwrap() <= u64::from(case.port),
        "serve answered before preparing the host"
    );
    let (repaired, samples) = watch_repair(&case, &serve, Duration::from_secs(90));
    assert_repaired(&case, &serve, &restarted);
    let log = serve.log_text();
    let log = &log[first_log.len().min(log.len())..];
    let set_at = log
        .find(&format!(
            "net.ipv4.ip_unprivileged_port_start 1024 → {}",
            case.port
        ))
        .unwrap_or_else(|| panic!("serve says what it set:\n{log}"));
    let first_step = ["replacing", "creating", "created", "removing"]
        .iter()
        .filter_map(|w| log.find(w))
        .min()
        .unwrap_or_else(|| panic!("serve replaced the replicas:\n{log}"));
    assert!(set_at < first_step, "host prepared before any step:\n{log}");
    eprintln!(
        "reboot, then serve: port {} serving {repaired:?} after /healthz answered, {:?} after \
         serve was started ({samples} samples while it was dead)",
        case.port,
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 3. 100+ replicas on one host.

const PROXIES: usize = 34;
const REPLICAS: u32 = 3;

fn fleet_config(case: &Case, ports: &[u16], header: &str) -> String {
    let mut text = header.to_string();
    for (i, port) in ports.iter().enumerate() {
        text.push_str(&proxy_toml(
            &format!("{}-{i:02}", case.name),
            REPLICAS,
            *port,
            "info",
        ));
        text.push('\n');
    }
    text
}

fn distinct_free_ports(n: usize) -> Vec<u16> {
    // Hold them all while picking, so no two are the same.
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

#[test]
fn a_hundred_and_two_replicas_on_one_host() {
    let _serial = serial();
    let _host = HostGuard::new();
    let case = Case::new("unatt-scale");
    let ports = distinct_free_ports(PROXIES);
    write_config(&case.config, &fleet_config(&case, &ports, ""));
    // The default: 128 instances, which 34 × 3 replicas (3 each) exceed.
    host::set(host::INOTIFY_INSTANCES, 128);
    let total = PROXIES * REPLICAS as usize;

    let t = Instant::now();
    let out = berth(&case, &["up"]);
    let up = t.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    let instances = host::get(host::INOTIFY_INSTANCES).unwrap();
    assert!(
        instances >= (PROXIES as u64) * u64::from(REPLICAS + 1) * 3,
        "berth raised fs.inotify.max_user_instances: {instances}"
    );
    let dropin = std::fs::read_to_string(common::TEST_SYSCTL_DROPIN).unwrap();
    assert!(
        dropin.contains(&format!("fs.inotify.max_user_instances = {instances}")),
        "{dropin}"
    );
    assert_eq!(case.containers().len(), total);
    for port in &ports {
        assert!(serving(*port), "port {port}");
    }

    let t = Instant::now();
    let st = status_json(&case);
    let status_cli = t.elapsed();
    let rows = st["replicas"].as_array().unwrap();
    assert_eq!(rows.len(), total);
    assert!(rows.iter().all(|r| r["ready"] == true), "{st:#}");

    let t = Instant::now();
    let noop = berth(&case, &["up"]);
    let up_noop = t.elapsed();
    assert!(noop.status.success(), "{}", text(&noop));

    let t = Instant::now();
    let serve = case.serve(&[]);
    let names: Vec<String> = (0..PROXIES)
        .map(|i| format!("{}-{i:02}", case.name))
        .collect();
    eprintln!("scale: up {up:?}, berth status {status_cli:?}, no-op up {up_noop:?}");
    let converged = serve.wait_for("34 converged proxies", Duration::from_secs(120), |s| {
        let asked = Instant::now();
        // Slow while serve's first passes run: not yet, not a failure.
        let Some((200, body)) = s.get("/status") else {
            eprintln!("scale: /status gave no answer in {:?}", asked.elapsed());
            return false;
        };
        let st: Value = serde_json::from_str(&body).unwrap();
        names.iter().all(|n| {
            st["proxies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == n.as_str())
                .is_some_and(|p| {
                    let reps = p["replicas"].as_array().cloned().unwrap_or_default();
                    reps.len() == REPLICAS as usize
                        && reps.iter().all(|r| r["ready"] == true)
                        && condition(p, "Ready")["status"] == "True"
                        && p["busy"].is_null()
                })
        })
    });
    let serve_ready = t.elapsed();
    assert_eq!(case.containers().len(), total, "serve replaced nothing");

    let t = Instant::now();
    let metrics = replica_ready_metrics(&serve);
    let scrape = t.elapsed();
    let ready: Vec<_> = metrics
        .iter()
        .filter(|(p, _, v)| names.contains(p) && *v == 1.0)
        .collect();
    assert_eq!(ready.len(), total, "{metrics:?}");
    let t = Instant::now();
    let _ = serve.status();
    let status_http = t.elapsed();
    drop(serve);

    let t = Instant::now();
    let out = berth(&case, &["down"]);
    let down = t.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    assert!(case.containers().is_empty());
    eprintln!(
        "{total} replicas ({PROXIES} proxies × {REPLICAS}): up {up:?}, no-op up {up_noop:?}, \
         berth status {status_cli:?}, serve converged {serve_ready:?} ({converged:?} after \
         /healthz), /status {status_http:?}, /metrics {scrape:?}, down {down:?}; \
         fs.inotify.max_user_instances 128 → {instances}"
    );
}

#[test]
fn preflight_refuses_a_fleet_the_inotify_limit_cannot_hold_and_changes_nothing() {
    let _serial = serial();
    let _host = HostGuard::new();
    let case = Case::new("unatt-refuse");
    let ports = distinct_free_ports(PROXIES);
    write_config(
        &case.config,
        &fleet_config(&case, &ports, "tune_host = false\n"),
    );
    host::set(host::INOTIFY_INSTANCES, 128);
    let dropin_before = std::fs::read(common::TEST_SYSCTL_DROPIN).ok();
    let out = berth(&case, &["up"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let need = PROXIES as u64 * u64::from(REPLICAS + 1) * 3;
    for want in [
        "fs.inotify.max_user_instances".to_string(),
        format!("{need} inotify instances"),
        "is 128".to_string(),
        "sysctl -w fs.inotify.max_user_instances=".to_string(),
        "tune_host".to_string(),
        "nothing was changed".to_string(),
    ] {
        assert!(err.contains(&want), "{want:?} missing from:\n{err}");
    }
    assert_eq!(host::get(host::INOTIFY_INSTANCES), Some(128));
    assert!(case.containers().is_empty());
    let all = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label={}", case.cleanup.filter()))
        .output()
        .unwrap();
    assert!(all.stdout.is_empty(), "no container was created");
    assert_eq!(
        std::fs::read(common::TEST_SYSCTL_DROPIN).ok(),
        dropin_before,
        "the drop-in is untouched"
    );
    assert!(
        !Path::new(case.state_dir.path()).join("proxies").exists()
            || std::fs::read_dir(case.state_dir.path().join("proxies"))
                .unwrap()
                .next()
                .is_none(),
        "no proxy state was written"
    );
    eprintln!("refusal:\n{err}");
}
