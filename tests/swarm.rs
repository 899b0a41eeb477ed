//! berth on a single-node Docker Swarm (issue 13 C), against the real engine and real Envoy:
//! one scenario per test, taking turns on the one Swarm this binary shares
//! ([`common::swarm::SwarmGuard`]; made and left by `scripts/test-swarm.sh hold 1` unless the
//! engine manages one already, under `/tmp/berth-locks/swarm.lock` for its whole life).
//! The scenarios: 3 tasks on one port, their spec, and `down`; rolling upgrades under
//! keep-alive and under connection-per-request load with 0 failed requests; an image that exits
//! at start (Swarm rolls back, the old tasks keep serving, berth names the task's error); a task
//! killed by hand (replaced) and a service changed by hand (put back); the agent image pushed to
//! a registry; global mode and a placement constraint (one that matches, one that cannot);
//! Envoy Gateway's remote provider (`berth serve`) creating an xDS-driven proxy and deleting it.
//! The two-node scenarios are in tests/swarm_nodes.rs.
//!
//! Run it on its own (it takes the lock itself; an ancestor holding it is recognized):
//! `cargo test --test swarm`.

mod common;

use std::time::Duration;

use common::fleet::{ensure_images, BROKEN, NEW, OLD};
use common::load::{assert_no_failures, Load};
use common::swarm::*;
use common::{free_port, tls};

use berth::edges::eg_provider::pb;
use common::eg::gateway_proxy;
use common::xds::{self, Certs, XdsServer};

const CONNECTIONS: usize = 30;

fn proxy_toml(name: &str, image: &str, replicas: u32, port: u16, extra: &str) -> String {
    format!(
        r#"
[[proxy]]
name = "{name}"
image = "{image}"
replicas = {replicas}
concurrency = 1
{extra}
[proxy.resources]
memory = "256Mi"

[proxy.shutdown]
drain_timeout = "5s"
min_drain_duration = "0s"

[proxy.rollout]
startup_deadline = "10s"
min_ready = "1s"
on_failure = "rollback"

[[proxy.listener]]
name = "web"
port = {port}
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200, body = "hello from swarm\n" }}
"#
    )
}

/// A TLS-terminating TCP listener in front of the HTTP one (its key becomes a Swarm secret).
fn tls_listener(port: u16, web: u16, cert: &str, key: &str) -> String {
    format!(
        r#"
[[proxy.listener]]
name = "secure"
port = {port}
protocol = "tcp"
backend = "web"
tls = {{ cert_file = "{cert}", key_file = "{key}" }}

[[proxy.backend]]
name = "web"
endpoints = ["127.0.0.1:{web}"]
"#
    )
}

fn get(port: u16) -> Option<u16> {
    common::serve::http_get(port, "/").map(|(status, _)| status)
}

fn running_images(service: &str) -> Vec<String> {
    task_containers(service)
        .iter()
        .map(|id| {
            docker_ok(&[
                "inspect",
                "-f",
                "{{index .Config.Labels \"io.berth.image\"}}",
                id,
            ])
        })
        .collect()
}

/// The scenarios' proxy: 3 tasks of `image` on `port`, with a TLS listener on `tls_port`
/// whose key becomes a Swarm secret.
struct Edge {
    port: u16,
    tls_port: u16,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl Edge {
    fn new(case: &SwarmCase) -> Edge {
        let (cert, key) = tls::pair(7, 2020, 2099);
        let edge = Edge {
            port: free_port(),
            tls_port: free_port(),
            cert: case.dir.path().join("cert.pem"),
            key: case.dir.path().join("key.pem"),
        };
        std::fs::write(&edge.cert, cert).unwrap();
        std::fs::write(&edge.key, key).unwrap();
        edge
    }

    fn toml(&self, image: &str) -> String {
        let mut t = proxy_toml("swedge", image, 3, self.port, "");
        t.push_str(&tls_listener(
            self.tls_port,
            self.port,
            &path_str(&self.cert),
            &path_str(&self.key),
        ));
        t
    }
}

/// The scenario's turn on the Swarm, or None when no Swarm runs here.
fn scenario(test: &str) -> Option<SwarmGuard> {
    ensure_images();
    // Every berth a scenario starts (serve included) finds the agent here.
    std::env::set_var("BERTH_AGENT_BINARY", agent_binary());
    SwarmGuard::new(test)
}

#[test]
fn three_tasks_serve_on_one_port_and_down_removes_them() {
    let Some(guard) = scenario("three_tasks_serve_on_one_port_and_down_removes_them") else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let edge = Edge::new(&case);
    three_tasks_serve_on_one_port(&case, &edge.toml(OLD), edge.port, edge.tls_port);
    down_removes_services_configs_and_secrets(&case);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_upgrades_lose_no_request() {
    let Some(guard) = scenario("rolling_upgrades_lose_no_request") else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let edge = Edge::new(&case);
    case.write(&edge.toml(OLD));
    case.up_ok();
    rolling_upgrades_under_load(&case, &|image| edge.toml(image), edge.port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_image_that_exits_at_start_is_rolled_back() {
    let Some(guard) = scenario("an_image_that_exits_at_start_is_rolled_back") else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let edge = Edge::new(&case);
    case.write(&edge.toml(OLD));
    case.up_ok();
    rolled_back(&case, &|image| edge.toml(image), edge.port).await;
}

#[test]
fn a_task_killed_or_a_service_changed_by_hand_is_put_back() {
    let Some(guard) = scenario("a_task_killed_or_a_service_changed_by_hand_is_put_back") else {
        return;
    };
    let case = SwarmCase::new(&guard);
    let edge = Edge::new(&case);
    case.write(&edge.toml(OLD));
    case.up_ok();
    a_task_killed_by_hand_is_replaced(&case);
    a_service_changed_by_hand_is_put_back(&case);
}

#[test]
fn the_agent_image_is_pushed_to_the_registry() {
    let Some(guard) = scenario("the_agent_image_is_pushed_to_the_registry") else {
        return;
    };
    pushed_to_the_registry(&guard);
}

#[test]
fn global_mode_and_placement_constraints() {
    let Some(guard) = scenario("global_mode_and_placement_constraints") else {
        return;
    };
    global_mode_and_placement(&guard);
}

#[test]
fn the_example_works_as_its_steps_say() {
    let Some(guard) = scenario("the_example_works_as_its_steps_say") else {
        return;
    };
    example_steps(&guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_eg_remote_provider_creates_a_proxy_on_the_swarm() {
    let Some(guard) = scenario("the_eg_remote_provider_creates_a_proxy_on_the_swarm") else {
        return;
    };
    eg_remote_provider(&guard).await;
}

fn three_tasks_serve_on_one_port(case: &SwarmCase, toml: &str, port: u16, tls_port: u16) {
    case.write(toml);
    case.up_ok();
    let rows = case.status();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows {
        assert_eq!(r["state"], "running", "{r}");
        assert_eq!(r["ready"], true, "{r}");
        assert_eq!(r["envoy"], "healthy", "the agent's HEALTHCHECK: {r}");
        assert!(r["node"].as_str().is_some_and(|n| !n.is_empty()), "{r}");
        assert_eq!(r["image"], OLD, "{r}");
    }
    each_envoy_has_its_own_node_id(case, &rows);
    // One socket per task (concurrency 1), all bound to the one port with SO_REUSEPORT.
    assert_eq!(listening_sockets(port), 3);
    assert_eq!(listening_sockets(tls_port), 3);
    assert_eq!(get(port), Some(200));

    let s = service("berth-swedge");
    let spec = &s["Spec"];
    assert_eq!(spec["Mode"]["Replicated"]["Replicas"], 3);
    assert_eq!(spec["UpdateConfig"]["Parallelism"], 1);
    assert_eq!(spec["UpdateConfig"]["Order"], "start-first");
    assert_eq!(spec["UpdateConfig"]["FailureAction"], "rollback");
    assert_eq!(spec["UpdateConfig"]["Monitor"], 1_000_000_000i64);
    assert_eq!(spec["RollbackConfig"]["Order"], "start-first");
    assert_eq!(spec["RollbackConfig"]["FailureAction"], "pause");
    let task = &spec["TaskTemplate"];
    assert_eq!(task["RestartPolicy"]["Condition"], "any");
    let c = &task["ContainerSpec"];
    assert_eq!(c["User"], "101:101");
    assert_eq!(c["ReadOnly"], true);
    assert_eq!(c["CapabilityDrop"], serde_json::json!(["ALL"]));
    // The agent: its HEALTHCHECK, and a grace period above the drain window (5s + 10s).
    assert_eq!(
        c["Healthcheck"]["Test"],
        serde_json::json!(berth::edges::agent::HEALTHCHECK_TEST)
    );
    assert_eq!(c["StopGracePeriod"], 15_000_000_000i64);
    assert_eq!(c["StopSignal"], "SIGTERM");
    for id in task_containers("berth-swedge") {
        let mode = docker_ok(&["inspect", "-f", "{{.HostConfig.NetworkMode}}", &id]);
        assert_eq!(mode, "host");
    }
    // The rendered files as configs (the watched ones, certificates included, as the baseline
    // the agent starts from), the agent channel's CA and certificate too; the keys (the
    // listener's, in the baseline, and the agent channel's) as secrets readable by uid 101 only.
    let configs: Vec<&str> = c["Configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["File"]["Name"].as_str().unwrap())
        .collect();
    for want in [
        "/etc/berth/bootstrap/bootstrap.yaml",
        "/etc/berth/baseline/lds.yaml",
        "/etc/berth/baseline/rds-web.yaml",
        "/etc/berth/baseline/cds.yaml",
        "/etc/berth/agent/ca.pem",
        "/etc/berth/agent/cert.pem",
    ] {
        assert!(configs.contains(&want), "{want} not in {configs:?}");
    }
    assert!(
        configs
            .iter()
            .any(|n| n.starts_with("/etc/berth/baseline/tls/secure/cert-")),
        "{configs:?}"
    );
    let secrets = c["Secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 2, "{secrets:?}");
    for secret in secrets {
        assert_eq!(secret["File"]["Mode"], 0o400);
        assert_eq!(secret["File"]["UID"], "101");
    }
    let names: Vec<&str> = secrets
        .iter()
        .map(|s| s["File"]["Name"].as_str().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("/etc/berth/baseline/tls/secure/key-"))
            && names.contains(&"/etc/berth/agent/key.pem"),
        "{names:?}"
    );
    let (services, _, secret_objects) = case.guard.objects();
    assert_eq!(services, vec!["berth-swedge".to_string()]);
    assert_eq!(secret_objects.len(), 2);

    // A second `up` changes nothing: the service keeps its version.
    let version = s["Version"]["Index"].clone();
    case.up_ok();
    assert_eq!(service("berth-swedge")["Version"]["Index"], version);
    let diff = case.berth(&["diff"]);
    assert!(diff.status.success());
}

/// Every task's Envoy runs with its own `--service-node` (Swarm's task name, which the agent
/// puts in from the `{{.Task.Name}}` template), and `berth status` shows it.
fn each_envoy_has_its_own_node_id(case: &SwarmCase, rows: &[serde_json::Value]) {
    let shown: std::collections::BTreeSet<String> = rows
        .iter()
        .map(|r| r["service_node"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(shown.len(), rows.len(), "one node id per task: {rows:?}");
    assert!(
        shown.iter().all(|n| n.starts_with("berth-swedge.")),
        "{shown:?}"
    );
    // What the Envoy processes on this host were started with.
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    let running: std::collections::BTreeSet<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| !l.contains("berth-agent"))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "--service-node")?;
            words
                .next()
                .filter(|n| n.starts_with("berth-swedge."))
                .map(str::to_string)
        })
        .collect();
    assert_eq!(running, shown, "the node ids Envoy runs with");
    let table = case.berth(&["status"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("ENVOY-NODE"), "{table}");
    for node in &shown {
        assert!(table.contains(node.as_str()), "{table}");
    }
}

async fn rolling_upgrades_under_load(
    case: &SwarmCase<'_>,
    edge: &dyn Fn(&str) -> String,
    port: u16,
) {
    for (from, to, per_request) in [(OLD, NEW, false), (NEW, OLD, true)] {
        let load = if per_request {
            Load::start_per_request(port, "/", 8, Duration::from_secs(240))
        } else {
            Load::start(port, "/", CONNECTIONS, Duration::from_secs(240))
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        case.write(&edge(to));
        let started = std::time::Instant::now();
        case.up_ok();
        let took = started.elapsed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let report = load.stop().await;
        let what = format!(
            "Swarm rolling upgrade {from} → {to} ({}) in {:.1}s",
            if per_request {
                "connection per request"
            } else {
                "keep-alive"
            },
            took.as_secs_f64()
        );
        assert_no_failures(&what, &report);
        // The last replaced task may still be draining its connections.
        wait_until(
            "the old tasks drained and gone",
            Duration::from_secs(30),
            || running_images("berth-swedge") == vec![to.to_string(); 3],
        );
        let rows = case.status();
        assert_eq!(rows.len(), 3);
        assert!(
            rows.iter().all(|r| r["ready"] == true && r["image"] == to),
            "{rows:?}"
        );
    }
}

async fn rolled_back(case: &SwarmCase<'_>, edge: &dyn Fn(&str) -> String, port: u16) {
    let load = Load::start(port, "/", CONNECTIONS, Duration::from_secs(240));
    case.write(&edge(BROKEN));
    let out = case.berth(&["up"]);
    let report = load.stop().await;
    assert_eq!(out.status.code(), Some(1), "up must fail");
    let err = stderr(&out);
    assert!(err.contains("rolled service berth-swedge back"), "{err}");
    assert!(err.contains("non-zero exit"), "the task's error: {err}");
    assert_no_failures("an image that exits at start", &report);
    // The old spec kept serving. (Swarm's rollback may still replace the failed slot's old
    // task by a fresh one of the old spec; with the agent it drains first.)
    wait_until("the failed task gone", Duration::from_secs(20), || {
        task_containers("berth-swedge").len() == 3
    });
    assert_eq!(running_images("berth-swedge"), vec![OLD.to_string(); 3]);
    assert_eq!(get(port), Some(200));
    // Back to the good config: converged again without a rollout.
    case.write(&edge(OLD));
    case.up_ok();
    assert_eq!(task_containers("berth-swedge").len(), 3);
}

fn a_task_killed_by_hand_is_replaced(case: &SwarmCase) {
    let before = task_containers("berth-swedge");
    let victim = before[0].clone();
    docker_ok(&["kill", &victim]);
    wait_until(
        "Swarm replaces the killed task",
        Duration::from_secs(60),
        || {
            let now = task_containers("berth-swedge");
            now.len() == 3 && !now.contains(&victim)
        },
    );
    wait_until(
        "berth status shows 3 ready tasks",
        Duration::from_secs(30),
        || {
            let rows = case.status();
            rows.len() == 3 && rows.iter().all(|r| r["ready"] == true)
        },
    );
}

fn a_service_changed_by_hand_is_put_back(case: &SwarmCase) {
    docker_ok(&[
        "service",
        "update",
        "--quiet",
        "--no-resolve-image",
        "--env-add",
        "BY_HAND=1",
        "berth-swedge",
    ]);
    let out = case.up_ok();
    let err = stderr(&out);
    assert!(err.contains("changed by hand (environment)"), "{err}");
    let env = service("berth-swedge")["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"].clone();
    assert!(
        !env.to_string().contains("BY_HAND"),
        "the hand-made variable is gone: {env}"
    );
}

fn down_removes_services_configs_and_secrets(case: &SwarmCase) {
    let (services, configs, secrets) = case.guard.objects();
    assert_eq!(services.len(), 1);
    assert!(configs.len() >= 5, "{configs:?}");
    assert_eq!(secrets.len(), 2, "{secrets:?}");
    let image = service("berth-swedge")["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(image.starts_with("berth-agent/envoy:"), "{image}");
    // Without the config, `down` finds the Swarm's services too (the engine manages a Swarm):
    // without --all it names what it would remove and refuses, as on one host.
    let out = case.berth_with(&[], false, &["down"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("swedge (3 replicas)") && err.contains("--all"),
        "{err}"
    );
    assert_eq!(case.guard.objects().0, vec!["berth-swedge".to_string()]);
    let out = case.berth_with(&[], false, &["down", "--all"]);
    assert!(out.status.success());
    assert_eq!(case.guard.objects(), (vec![], vec![], vec![]));
    assert!(task_containers("berth-swedge").is_empty());
    // The agent image it built, unused now, went with it.
    assert!(
        !agent_images().contains(&image),
        "{image} is left: {:?}",
        agent_images()
    );
}

/// `[swarm] registry`: berth tags the agent image under the registry, pushes it with the Docker
/// client's credentials (a DOCKER_CONFIG logged in to a real registry on 127.0.0.1), and the
/// service runs it by digest; a registry that cannot be reached is a clear error and the
/// running tasks stay.
fn pushed_to_the_registry(guard: &SwarmGuard) {
    for tool in [common::registry::REGISTRY, "/usr/bin/htpasswd"] {
        if !std::path::Path::new(tool).exists() {
            common::skip(
                "registry push",
                &format!("{tool} is missing (.ci/run installs docker-registry and apache2-utils)"),
            );
            return;
        }
    }
    let registry = common::registry::Registry::start();
    let login = registry.login();
    let env = [("DOCKER_CONFIG", login.path())];
    let case = SwarmCase::new(guard);
    let port = free_port();
    let toml = |registry: &str, image: &str| {
        format!(
            "[swarm]\nregistry = \"{registry}\"\n{}",
            proxy_toml("swreg", image, 2, port, "")
        )
    };
    case.write(&toml(&format!("{}/berth-test", registry.host), OLD));
    let out = case.berth_with(&env, true, &["up"]);
    assert!(out.status.success(), "up with a registry");
    let image = service("berth-swreg")["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        .as_str()
        .unwrap()
        .to_string();
    let repo = format!("{}/berth-test/berth-agent/envoy", registry.host);
    let (tagged, digest) = image.split_once('@').expect("pinned by digest");
    let tag = tagged
        .strip_prefix(&format!("{repo}:"))
        .unwrap_or_else(|| panic!("{image} is not under {repo}"));
    // The registry serves that tag with that digest.
    let (status, head) = registry.api(
        &format!("/v2/berth-test/berth-agent/envoy/manifests/{tag}"),
        "application/vnd.docker.distribution.manifest.v2+json",
    );
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("docker-content-digest: {digest}")),
        "{head}"
    );
    // Every task runs the registry's reference.
    let tasks = task_containers("berth-swreg");
    assert_eq!(tasks.len(), 2);
    for id in &tasks {
        assert_eq!(
            docker_ok(&["inspect", "-f", "{{.Config.Image}}", id]),
            image
        );
    }
    assert_eq!(get(port), Some(200));
    // A registry nobody answers at: berth says which setting, and nothing rolls.
    case.write(&toml("127.0.0.1:1/berth-test", NEW));
    let out = case.berth_with(&env, true, &["up"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("[swarm] registry 127.0.0.1:1/berth-test"),
        "{err}"
    );
    assert_eq!(task_containers("berth-swreg"), tasks);
    let out = case.berth_with(&env, true, &["down"]);
    assert!(out.status.success());
    assert!(
        agent_images()
            .iter()
            .all(|i| !i.starts_with(&registry.host)),
        "{:?}",
        agent_images()
    );
}

fn global_mode_and_placement(guard: &SwarmGuard) {
    guard.label_node("berth-test-edge", "true");
    let case = SwarmCase::new(guard);
    let port = free_port();
    let placed = "[proxy.swarm]\nmode = \"global\"\nconstraints = [\"node.labels.berth-test-edge == true\"]\n";
    case.write(&proxy_toml("swglobal", NEW, 1, port, placed));
    case.up_ok();
    let s = service("berth-swglobal");
    assert!(
        s["Spec"]["Mode"]["Global"].is_object(),
        "{}",
        s["Spec"]["Mode"]
    );
    assert_eq!(
        s["Spec"]["TaskTemplate"]["Placement"]["Constraints"],
        serde_json::json!(["node.labels.berth-test-edge == true"])
    );
    let rows = case.status();
    assert_eq!(rows.len(), 1, "one task on the one node: {rows:?}");
    assert_eq!(rows[0]["ready"], true);
    assert_eq!(get(port), Some(200));

    // A constraint no node meets, replicated or global: berth says so before it creates
    // anything (a global service would have no task to fail), naming the constraint and the
    // command that labels a node.
    for mode in ["replicated", "global"] {
        let nowhere = format!("[proxy.swarm]\nmode = \"{mode}\"\nconstraints = [\"node.labels.berth-test-nowhere == true\"]\n");
        let port2 = free_port();
        let mut both = proxy_toml("swglobal", NEW, 1, port, placed);
        both.push_str(&proxy_toml("swnowhere", NEW, 1, port2, &nowhere));
        case.write(&both);
        let out = case.berth(&["up"]);
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(
            err.contains("proxy swnowhere: Swarm cannot place its tasks: no node of this Swarm"),
            "{mode}: {err}"
        );
        assert!(
            err.contains("node.labels.berth-test-nowhere == true")
                && err.contains("docker node update --label-add berth-test-nowhere=true NODE"),
            "{mode}: {err}"
        );
        assert!(
            !case
                .guard
                .objects()
                .0
                .contains(&"berth-swnowhere".to_string()),
            "{mode}: nothing is created for it"
        );
    }
    let out = case.berth(&["down"]);
    assert!(out.status.success());
    let (services, configs, secrets): (Vec<String>, Vec<String>, Vec<String>) =
        case.guard.objects();
    assert!(services.is_empty() && configs.is_empty() && secrets.is_empty());
}

async fn eg_remote_provider(guard: &SwarmGuard) {
    let case = SwarmCase::new(guard);
    let dir = case.dir.path();
    let (http, tcp, ready) = (free_port(), free_port(), free_port());
    let certs = Certs::generate(&dir.join("certs"));
    let (backend, _backend) = xds::backend("hello from eg\n").await;
    let snapshot = xds::eg_http_and_tcp_snapshot(http, tcp, backend, ready);
    let xds_server = XdsServer::start(&certs, snapshot).await;
    let socket = dir.join("r.sock");
    case.write(&format!(
        r#"[envoy_gateway]
xds_address = "127.0.0.1"
xds_port = {xds}
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"
remote = "unix://{sock}"
"#,
        xds = xds_server.addr.port(),
        ca = path_str(&certs.ca()),
        cert = path_str(&certs.client_cert()),
        key = path_str(&certs.client_key()),
        sock = path_str(&socket),
    ));
    let serve = common::serve::Serve::start(&case.config(), &case.state(), &guard.cleanup, &[]);
    wait_until("the remote socket", Duration::from_secs(20), || {
        socket.exists()
    });
    let mut client = common::eg::unix_client(socket.clone()).await;
    let envoy_proxy = serde_json::json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyProxy",
        "spec": {
            "provider": {"type": "Kubernetes", "kubernetes": {"envoyDeployment": {
                "replicas": 2, "container": {"image": NEW}}}},
            "shutdown": {"drainTimeout": "5s", "minDrainDuration": "0s"}
        }
    })
    .to_string();
    let infra = |config: &str| pb::Infra {
        proxy: Some(gateway_proxy(config, http, tcp, "TCP")),
    };
    client
        .create_or_update_proxy_infra(pb::CreateOrUpdateProxyInfraRequest {
            infra: Some(infra(&envoy_proxy)),
        })
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nserve log:\n{}", serve.log_text()));
    // Two tasks, healthy only once EG's xDS server gave them their listeners.
    let s = service("berth-default-eg");
    assert_eq!(s["Spec"]["Mode"]["Replicated"]["Replicas"], 2);
    let c = &s["Spec"]["TaskTemplate"]["ContainerSpec"];
    let secrets: Vec<&str> = c["Secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["File"]["Name"].as_str().unwrap())
        .collect();
    assert_eq!(
        secrets,
        vec!["/etc/berth/tls/xds/key.pem"],
        "the xDS client key"
    );
    let rows = case.status();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["ready"] == true && r["envoy"] == "healthy"),
        "{rows:?}"
    );
    assert_eq!(
        common::serve::http_get(http, "/"),
        Some((200, "hello from eg\n".to_string()))
    );
    // Each task's Envoy connects to the xDS server with its own node id, the one status shows.
    let nodes: std::collections::BTreeSet<String> = rows
        .iter()
        .map(|r| r["service_node"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(nodes.len(), 2, "{rows:?}");
    assert!(
        nodes.iter().all(|n| n.starts_with("berth-default-eg.")),
        "{nodes:?}"
    );
    assert!(
        xds_server.nodes_seen().is_superset(&nodes),
        "{:?}",
        xds_server.nodes_seen()
    );

    client
        .delete_proxy_infra(pb::DeleteProxyInfraRequest {
            infra: Some(infra("")),
        })
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nserve log:\n{}", serve.log_text()));
    assert_eq!(case.guard.objects(), (vec![], vec![], vec![]));
    drop(serve);
}

/// examples/swarm.toml's steps (the comment at its top), run as written on this single-node
/// Swarm, by a berth without `BERTH_AGENT_BINARY` (it is its own agent); the example's ports
/// are swapped for free ones. Before them: a berth that cannot provide the agent refuses, and
/// without the node label `up` says at once which constraint no node meets.
fn example_steps(guard: &SwarmGuard) {
    let case = SwarmCase::new(guard);
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/swarm.toml"))
        .unwrap();
    let (web, edge_web) = (free_port(), free_port());
    let config = text
        .replace("port = 10080", &format!("port = {web}"))
        .replace("port = 10081", &format!("port = {edge_web}"));
    assert_ne!(config.matches(&web.to_string()).count(), 0);
    assert_ne!(config.matches(&edge_web.to_string()).count(), 0);
    std::fs::write(case.config(), &config).unwrap();
    let steps: Vec<String> = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("#   "))
        .map(|l| l.split("  #").next().unwrap().trim().to_string())
        .collect();
    assert!(steps[0].starts_with("docker swarm init"), "{steps:?}");
    let config_arg = path_str(&case.config());
    let berth_args = |step: &str| -> Vec<String> {
        step.split_whitespace()
            .skip(1)
            .map(|a| {
                if a == "examples/swarm.toml" {
                    config_arg.clone()
                } else {
                    a.to_string()
                }
            })
            .collect()
    };

    // A berth that cannot provide the agent refuses before anything changes, saying the fix.
    let dynamic = [("BERTH_AGENT_BINARY", std::path::Path::new("/bin/sh"))];
    let out = case.berth_with(&dynamic, true, &["up"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("not a statically linked") && err.contains("[swarm] agent = false"),
        "{err}"
    );
    assert!(
        guard.objects().0.is_empty(),
        "nothing is created: {:?}",
        guard.objects()
    );

    // Without the label the steps give the node, the global proxy is refused at once.
    let out = case.berth(&["up"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("proxy edge-global: Swarm cannot place its tasks")
            && err.contains("node.labels.edge == true")
            && err.contains("--label-add edge=true"),
        "{err}"
    );

    // The steps as written (the Swarm exists: the harness made it fresh, without labels).
    for step in &steps[1..] {
        let out = if step.starts_with("docker ") {
            let out = std::process::Command::new("sh")
                .args(["-c", step])
                .output()
                .unwrap();
            if let Some(label) = step.split("--label-add ").nth(1) {
                let key = label.split('=').next().unwrap();
                guard.labelled(guard.nodes.manager_node(), key);
            }
            out
        } else {
            assert!(
                step.starts_with("berth "),
                "a step of berth or docker: {step}"
            );
            let args = berth_args(step);
            case.berth_as_user(&args.iter().map(String::as_str).collect::<Vec<_>>())
        };
        assert!(out.status.success(), "{step}: {}", stderr(&out));
        if step.ends_with(" up") {
            assert_eq!(
                common::serve::http_get(web, "/").map(|r| r.1),
                Some("hello from a Swarm\n".into())
            );
            assert_eq!(
                common::serve::http_get(edge_web, "/").map(|r| r.1),
                Some("hello from every edge node\n".into())
            );
            // The default is the agent: the tasks run the derived image.
            for s in ["berth-edge", "berth-edge-global"] {
                let image = service(s)["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"].clone();
                assert!(
                    image.as_str().unwrap().starts_with("berth-agent/envoy:"),
                    "{s}: {image}"
                );
            }
        }
    }
    assert!(steps.last().unwrap().ends_with(" down"), "{steps:?}");
    assert!(guard.objects().0.is_empty(), "{:?}", guard.objects());
}
