//! The pure mapping of a proxy to Swarm objects, without a Swarm.

use std::collections::BTreeMap;
use std::path::Path;

use bollard::models::{ServiceSpecUpdateConfigFailureActionEnum, ServiceSpecUpdateConfigOrderEnum};

use super::service::{self, Context, Entrypoint, ServicePlan};
use crate::core::render::Renderer;
use crate::core::target::{self, Target};

const PROXY: &str = r#"
engine = "swarm"

[[proxy]]
name = "edge"
image = "envoyproxy/envoy:v1.36.2"
replicas = 3
{extra}

[proxy.rollout]
min_ready = "3s"
on_failure = "{on_failure}"

[[proxy.listener]]
name = "web"
port = 8080
protocol = "http"

[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "{body}" }
"#;

fn target_of(replicas: u32, body: &str, on_failure: &str, extra: &str) -> Target {
    let text = PROXY
        .replace("{extra}", extra)
        .replace("{on_failure}", on_failure)
        .replace("{body}", body)
        .replace("replicas = 3", &format!("replicas = {replicas}"));
    let config = crate::core::source::file::parse(Path::new("/tmp/berth.toml"), &text).unwrap();
    let mut t = target::targets(
        &config.infra,
        &Renderer::builtin(),
        Path::new("/var/lib/b"),
        2,
        crate::core::certificates::Placeholders::InMemory,
    )
    .unwrap();
    t.remove(0)
}

fn plan_of(t: &Target, entrypoint: &Entrypoint) -> ServicePlan {
    let extra = BTreeMap::from([("io.berth.test".to_string(), "1".to_string())]);
    let cx = Context {
        host_network: "host-id",
        image_id: "sha256:abc",
        state_dir: "/var/lib/b",
        extra_labels: &extra,
        entrypoint,
        watched: None,
    };
    service::plan(t, &cx, &BTreeMap::new())
}

#[test]
fn scaling_is_not_an_update_but_a_new_file_is() {
    let three = plan_of(&target_of(3, "hi", "rollback", ""), &Entrypoint::Plain);
    let five = plan_of(&target_of(5, "hi", "rollback", ""), &Entrypoint::Plain);
    assert_eq!(three.hash, five.hash);
    assert_eq!(
        five.spec.mode.unwrap().replicated.unwrap().replicas,
        Some(5)
    );
    let changed = plan_of(&target_of(3, "bye", "rollback", ""), &Entrypoint::Plain);
    assert_ne!(three.hash, changed.hash);
    // Only the routes changed: the same bootstrap object, a new rds object.
    let names = |p: &ServicePlan| -> BTreeMap<String, String> {
        p.files
            .iter()
            .map(|f| (f.target.clone(), f.name.clone()))
            .collect()
    };
    let (a, b) = (names(&three), names(&changed));
    assert_eq!(
        a["/etc/berth/bootstrap/bootstrap.yaml"],
        b["/etc/berth/bootstrap/bootstrap.yaml"]
    );
    let routes = |m: &BTreeMap<String, String>| -> Vec<String> {
        m.iter()
            .filter(|(path, _)| path.starts_with("/etc/berth/xds/rds"))
            .map(|(_, name)| name.clone())
            .collect()
    };
    assert!(!routes(&a).is_empty());
    assert_ne!(routes(&a), routes(&b));
    // The same input, the same hash.
    assert_eq!(
        three.hash,
        plan_of(&target_of(3, "hi", "rollback", ""), &Entrypoint::Plain).hash
    );
}

#[test]
fn updates_are_start_first_one_at_a_time_with_the_configured_failure_action() {
    let p = plan_of(&target_of(3, "hi", "pause", ""), &Entrypoint::Plain);
    let u = p.spec.update_config.unwrap();
    assert_eq!(u.parallelism, Some(1));
    assert_eq!(u.order, Some(ServiceSpecUpdateConfigOrderEnum::START_FIRST));
    assert_eq!(
        u.failure_action,
        Some(ServiceSpecUpdateConfigFailureActionEnum::PAUSE)
    );
    assert_eq!(u.monitor, Some(3_000_000_000));
    let r = plan_of(&target_of(3, "hi", "rollback", ""), &Entrypoint::Plain);
    assert_eq!(
        r.spec.update_config.unwrap().failure_action,
        Some(ServiceSpecUpdateConfigFailureActionEnum::ROLLBACK)
    );
}

#[test]
fn tasks_are_hardened_on_the_host_network_and_labelled() {
    let p = plan_of(&target_of(3, "hi", "rollback", ""), &Entrypoint::Plain);
    let labels = p.spec.labels.clone().unwrap();
    assert_eq!(labels["io.berth.managed-by"], "berth");
    assert_eq!(labels["io.berth.state-dir"], "/var/lib/b");
    assert_eq!(labels["io.berth.test"], "1");
    assert_eq!(labels["io.berth.spec-hash"], p.hash);
    let task = p.spec.task_template.unwrap();
    assert_eq!(task.networks.unwrap()[0].target.as_deref(), Some("host-id"));
    let c = task.container_spec.unwrap();
    assert_eq!(c.user.as_deref(), Some("101:101"));
    assert_eq!(c.read_only, Some(true));
    assert_eq!(c.capability_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(c.privileges.unwrap().no_new_privileges, Some(true));
    let args = c.args.unwrap();
    let node = args.iter().position(|a| a == "--service-node").unwrap();
    assert_eq!(args[node + 1], "berth-edge");
    assert_eq!(c.labels.unwrap()["io.berth.spec-hash"], p.hash);
    // No health check and no grace period without the agent.
    assert!(c.health_check.is_none() && c.stop_grace_period.is_none());
}

#[test]
fn the_agent_brings_its_image_health_check_and_grace_period() {
    let agent = Entrypoint::Agent(service::AgentSettings {
        image: "berth-agent/envoy:0123".into(),
        env: BTreeMap::from([("BERTH_AGENT_PORTS".to_string(), "8080".to_string())]),
        health_test: vec!["CMD".into(), "/usr/local/bin/berth-agent".into()],
        stop_grace_period: std::time::Duration::from_secs(70),
        channel: None,
    });
    let t = target_of(3, "hi", "rollback", "");
    let plain = plan_of(&t, &Entrypoint::Plain);
    let p = plan_of(&t, &agent);
    assert_ne!(plain.hash, p.hash);
    let c = p.spec.task_template.unwrap().container_spec.unwrap();
    assert_eq!(c.image.as_deref(), Some("berth-agent/envoy:0123"));
    assert!(c
        .env
        .unwrap()
        .contains(&"BERTH_AGENT_PORTS=8080".to_string()));
    assert_eq!(c.stop_grace_period, Some(70_000_000_000));
    let health = c.health_check.unwrap();
    assert_eq!(
        health.start_period,
        Some(t.desired.rollout.startup_deadline.as_nanos() as i64)
    );
    // A task the agent cannot help (frozen but for Envoy's socket) is unhealthy within 6 s.
    assert_eq!(
        (health.interval, health.timeout, health.retries),
        (Some(1_000_000_000), Some(2_000_000_000), Some(2))
    );
    assert_eq!(
        crate::core::agent::health_bound(),
        std::time::Duration::from_secs(6)
    );
}

#[test]
fn each_task_gets_its_own_node_id_through_a_template() {
    let agent = Entrypoint::Agent(service::AgentSettings {
        image: "berth-agent/envoy:0123".into(),
        env: BTreeMap::new(),
        health_test: vec!["CMD".into()],
        stop_grace_period: std::time::Duration::from_secs(70),
        channel: None,
    });
    let t = target_of(3, "hi", "rollback", "");
    let c = plan_of(&t, &agent)
        .spec
        .task_template
        .unwrap()
        .container_spec
        .unwrap();
    assert!(c
        .env
        .unwrap()
        .contains(&"BERTH_AGENT_SERVICE_NODE={{.Task.Name}}".to_string()));
    // The arguments hold the service's name, which the agent replaces.
    let args = c.args.unwrap();
    let i = args.iter().position(|a| a == "--service-node").unwrap();
    assert_eq!(args[i + 1], "berth-edge");
}

#[test]
fn an_image_pinned_by_digest_hashes_as_its_tag() {
    let agent = |image: &str| {
        Entrypoint::Agent(service::AgentSettings {
            image: image.into(),
            env: BTreeMap::new(),
            health_test: vec!["CMD".into()],
            stop_grace_period: std::time::Duration::from_secs(70),
            channel: None,
        })
    };
    let t = target_of(3, "hi", "rollback", "");
    let tag = "r.example:5000/b/berth-agent/envoy:0123";
    let pinned = plan_of(&t, &agent(&format!("{tag}@sha256:{}", "a".repeat(64))));
    assert_eq!(pinned.hash, plan_of(&t, &agent(tag)).hash);
    assert_ne!(
        pinned.hash,
        plan_of(&t, &agent("r.example:5000/b/berth-agent/envoy:4567")).hash
    );
    // The service itself runs the pinned reference.
    assert!(pinned
        .spec
        .task_template
        .unwrap()
        .container_spec
        .unwrap()
        .image
        .unwrap()
        .contains("@sha256:"));
}

#[test]
fn global_mode_and_constraints_come_from_the_config() {
    let extra = "[proxy.swarm]\nmode = \"global\"\nconstraints = [\"node.labels.edge==true\"]\n";
    let t = target_of(3, "hi", "rollback", extra);
    let p = plan_of(&t, &Entrypoint::Plain);
    let mode = p.spec.mode.unwrap();
    assert!(mode.global.is_some() && mode.replicated.is_none());
    assert_eq!(
        p.spec.task_template.unwrap().placement.unwrap().constraints,
        Some(vec!["node.labels.edge == true".to_string()])
    );
}

#[test]
fn swarm_settings_need_engine_swarm() {
    let text = PROXY
        .replace("engine = \"swarm\"\n", "")
        .replace("{extra}", "[proxy.swarm]\nmode = \"global\"\n")
        .replace("{on_failure}", "rollback")
        .replace("{body}", "hi");
    let errs = crate::core::source::file::parse(Path::new("/tmp/berth.toml"), &text).unwrap_err();
    assert!(
        errs.to_string()
            .contains("proxy[0].swarm: applies only with engine = \"swarm\""),
        "{errs}"
    );
    let bad = PROXY
        .replace("engine = \"swarm\"", "engine = \"k8s\"")
        .replace("{extra}", "")
        .replace("{on_failure}", "rollback")
        .replace("{body}", "hi");
    let errs = crate::core::source::file::parse(Path::new("/tmp/berth.toml"), &bad).unwrap_err();
    assert!(
        errs.to_string().contains("engine: must be \"docker\""),
        "{errs}"
    );
}

#[test]
fn the_registry_is_a_top_level_swarm_setting() {
    let with = |head: &str| {
        PROXY
            .replace("engine = \"swarm\"\n", head)
            .replace("{extra}", "")
            .replace("{on_failure}", "rollback")
            .replace("{body}", "hi")
    };
    let ok = crate::core::source::file::parse(
        Path::new("/tmp/berth.toml"),
        &with("engine = \"swarm\"\n[swarm]\nregistry = \"127.0.0.1:5000/berth\"\n"),
    )
    .unwrap();
    assert_eq!(ok.swarm.registry.as_deref(), Some("127.0.0.1:5000/berth"));
    // File, line, field and what is allowed.
    let errs = crate::core::source::file::parse(
        Path::new("/tmp/berth.toml"),
        &with("engine = \"swarm\"\n[swarm]\nregistry = \"https://r.example\"\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        errs.contains("/tmp/berth.toml:4")
            && errs.contains("swarm.registry: must be a registry host"),
        "{errs}"
    );
    let errs = crate::core::source::file::parse(
        Path::new("/tmp/berth.toml"),
        &with("[swarm]\nregistry = \"127.0.0.1:5000\"\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        errs.contains("swarm: applies only with engine = \"swarm\""),
        "{errs}"
    );
    let errs = crate::core::source::file::parse(
        Path::new("/tmp/berth.toml"),
        &with("engine = \"swarm\"\n[swarm]\nregistery = \"x\"\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(errs.contains("registery"), "{errs}");
}

#[test]
fn with_the_agent_channel_a_route_change_is_no_new_spec() {
    let live = Entrypoint::Agent(service::AgentSettings {
        image: "berth-agent/envoy:0123".into(),
        env: BTreeMap::new(),
        health_test: vec!["CMD".into()],
        stop_grace_period: std::time::Duration::from_secs(70),
        channel: Some(service::Channel {
            manager: "10.0.0.1:7950".parse().unwrap(),
            ca: "ca".into(),
            cert: "cert".into(),
            key: "key".into(),
        }),
    });
    let hi = plan_of(&target_of(3, "hi", "rollback", ""), &live);
    let bye = plan_of(&target_of(3, "bye", "rollback", ""), &live);
    assert_eq!(
        hi.hash, bye.hash,
        "the watched files are the baseline, outside the hash"
    );
    assert_ne!(
        hi.files
            .iter()
            .filter(|f| f.baseline)
            .map(|f| &f.name)
            .collect::<Vec<_>>(),
        bye.files
            .iter()
            .filter(|f| f.baseline)
            .map(|f| &f.name)
            .collect::<Vec<_>>(),
    );
    let c = hi.spec.task_template.unwrap().container_spec.unwrap();
    let env = c.env.unwrap();
    assert!(
        env.contains(&"BERTH_AGENT_MANAGER=10.0.0.1:7950".to_string()),
        "{env:?}"
    );
    // The watched directory is a tmpfs the agent writes; the baseline and credentials are
    // files of the spec, the key a secret.
    let mounts: Vec<_> = c
        .mounts
        .unwrap()
        .into_iter()
        .filter_map(|m| m.target)
        .collect();
    assert!(
        mounts.contains(&crate::core::layout::CONTAINER_XDS_DIR.to_string()),
        "{mounts:?}"
    );
    let targets: Vec<String> = c
        .configs
        .unwrap()
        .into_iter()
        .filter_map(|r| r.file?.name)
        .collect();
    assert!(
        targets.iter().any(|t| t == "/etc/berth/baseline/lds.yaml"),
        "{targets:?}"
    );
    assert!(
        targets.iter().any(|t| t == "/etc/berth/agent/ca.pem"),
        "{targets:?}"
    );
    let secrets: Vec<String> = c
        .secrets
        .unwrap()
        .into_iter()
        .filter_map(|r| r.file?.name)
        .collect();
    assert!(
        secrets.iter().any(|t| t == "/etc/berth/agent/key.pem"),
        "{secrets:?}"
    );
    // Without the channel a route change is a new spec, as before.
    let plain_hi = plan_of(&target_of(3, "hi", "rollback", ""), &Entrypoint::Plain);
    let plain_bye = plan_of(&target_of(3, "bye", "rollback", ""), &Entrypoint::Plain);
    assert_ne!(plain_hi.hash, plain_bye.hash);
}
