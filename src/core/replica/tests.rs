//! Unit tests for the desired container spec, plus fixtures the planner's tests share.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::core::ir::{
    EnvoyProxy, InfraMetadata, ListenerPort, ListenerRouting, LogLevel, Logging, Protocol,
    ProxyInfra, ProxyListener, Resources, RolloutPolicy, Routing, Shutdown, Standalone, TlsFiles,
    Traffic, XdsServer,
};

pub(crate) const STATE: &str = "/var/lib/berth";
pub(crate) const BOOTSTRAP: &str =
    "admin:\n  address:\n    pipe:\n      path: /run/berth/admin.sock\n";

/// A standalone proxy with one HTTP listener per port, named `l<port>`.
pub(crate) fn proxy_infra(name: &str, replicas: u32, ports: &[u16]) -> ProxyInfra {
    ProxyInfra {
        metadata: InfraMetadata::default(),
        name: name.to_string(),
        namespace: String::new(),
        config: EnvoyProxy {
            image: "envoyproxy/envoy:v1.36.2".into(),
            replicas,
            resources: Resources::default(),
            env: BTreeMap::new(),
            concurrency: None,
            extra_args: Vec::new(),
            logging: Logging::default(),
            shutdown: Shutdown::default(),
            bootstrap: None,
            pull: Default::default(),
        },
        listeners: ports
            .iter()
            .map(|&p| ProxyListener {
                name: format!("l{p}"),
                ports: vec![ListenerPort {
                    name: format!("http-{p}"),
                    protocol: Protocol::Http,
                    service_port: p,
                    container_port: p,
                }],
                address: None,
            })
            .collect(),
        addresses: Vec::new(),
        rollout: RolloutPolicy::default(),
        placement: Default::default(),
        routing: Routing::Standalone(Standalone {
            listeners: ports
                .iter()
                .map(|&p| ListenerRouting {
                    listener: format!("l{p}"),
                    tls: None,
                    acme: None,
                    traffic: Traffic::Http {
                        virtual_hosts: Vec::new(),
                    },
                    websocket: false,
                    access_log: Default::default(),
                })
                .collect(),
            backends: Vec::new(),
        }),
        service_cluster: None,
    }
}

/// `desired_proxy` of a proxy with the default bootstrap, state dir and 2 host CPUs.
pub(crate) fn desired_of(p: &ProxyInfra) -> DesiredProxy {
    desired_proxy(p, BOOTSTRAP, Path::new(STATE), 2)
}

pub(crate) fn desired(name: &str, replicas: u32, ports: &[u16]) -> DesiredProxy {
    desired_of(&proxy_infra(name, replicas, ports))
}

fn hash_of(p: &ProxyInfra) -> String {
    desired_of(p).hash
}

fn args_of(d: &DesiredProxy) -> Vec<&str> {
    d.spec.args.iter().map(String::as_str).collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

// ---- args ------------------------------------------------------------------------------

#[test]
fn args_are_egs_in_order() {
    let d = desired("edge", 2, &[8080]);
    assert_eq!(
        args_of(&d),
        [
            "-c",
            "/etc/berth/bootstrap/bootstrap.yaml",
            "--disable-hot-restart",
            "--service-cluster",
            "edge",
            "--log-level",
            "warn",
            "--drain-strategy",
            "immediate",
            "--drain-time-s",
            "60",
            "--concurrency",
            "1",
        ]
    );
}

#[test]
fn log_levels_component_levels_drain_time_and_extra_args_last() {
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.logging.level = BTreeMap::from([
        ("default".to_string(), LogLevel::Info),
        ("upstream".to_string(), LogLevel::Debug),
        ("http".to_string(), LogLevel::Trace),
    ]);
    p.config.shutdown.drain_timeout = Duration::from_millis(1500);
    p.config.extra_args = vec!["--base-id".into(), "7".into()];
    let d = desired_of(&p);
    let args = &d.spec.args;
    assert_eq!(flag(args, "--log-level"), Some("info"));
    // BTreeMap order: sorted by component.
    assert_eq!(
        flag(args, "--component-log-level"),
        Some("http:trace,upstream:debug")
    );
    // Rounded up: never shorter than configured.
    assert_eq!(flag(args, "--drain-time-s"), Some("2"));
    assert_eq!(&args[args.len() - 2..], ["--base-id", "7"]);
}

#[test]
fn no_component_log_level_flag_without_components() {
    let d = desired("edge", 1, &[8080]);
    assert!(!d.spec.args.iter().any(|a| a == "--component-log-level"));
}

#[test]
fn concurrency_defaults_to_host_cpus_over_replicas_at_least_one() {
    let p = |replicas, conc| {
        let mut p = proxy_infra("edge", replicas, &[8080]);
        p.config.concurrency = conc;
        p
    };
    let conc = |p: &ProxyInfra, cpus| {
        flag(
            &desired_proxy(p, BOOTSTRAP, Path::new(STATE), cpus)
                .spec
                .args,
            "--concurrency",
        )
        .unwrap()
        .to_string()
    };
    assert_eq!(conc(&p(2, None), 8), "4");
    assert_eq!(conc(&p(3, None), 8), "2");
    assert_eq!(conc(&p(3, None), 2), "1");
    assert_eq!(conc(&p(1, None), 1), "1");
    assert_eq!(conc(&p(1, None), 0), "1");
    // Zero replicas does not divide by zero.
    assert_eq!(conc(&p(0, None), 4), "4");
    // Explicit wins.
    assert_eq!(conc(&p(3, Some(6)), 2), "6");
}

// ---- resources, env, ports, caps, labels -----------------------------------------------

#[test]
fn resources_env_and_labels() {
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.resources.cpus = Some(1.5);
    p.config.resources.memory = Some(512 * 1024 * 1024);
    p.config.env = BTreeMap::from([("A".into(), "1".into())]);
    p.metadata.labels = BTreeMap::from([("team".into(), "web".into())]);
    let d = desired_of(&p);
    assert_eq!(d.spec.nano_cpus, Some(1_500_000_000));
    assert_eq!(d.spec.memory, Some(536_870_912));
    assert_eq!(d.spec.env["A"], "1");
    assert_eq!(d.spec.labels["team"], "web");
    assert_eq!(d.spec.image, "envoyproxy/envoy:v1.36.2");
    assert_eq!(d.replicas, 1);
    assert_eq!(d.name(), "edge");

    p.config.resources.cpus = Some(0.3333333333);
    assert_eq!(desired_of(&p).spec.nano_cpus, Some(333_333_333));
    p.config.resources.memory = Some(u64::MAX);
    assert_eq!(desired_of(&p).spec.memory, Some(i64::MAX));
}

#[test]
fn no_limits_when_unset() {
    let d = desired("edge", 1, &[8080]);
    assert_eq!(d.spec.nano_cpus, None);
    assert_eq!(d.spec.memory, None);
}

#[test]
fn ports_sorted_deduped_and_bind_cap_only_below_1024() {
    let mut p = proxy_infra("edge", 1, &[9090, 8080]);
    // The same port under a second listener.
    let dup = p.listeners[0].ports[0].clone();
    p.listeners[1].ports.push(dup);
    let d = desired_of(&p);
    assert_eq!(d.spec.ports, [8080, 9090]);
    assert!(d.spec.cap_add.is_empty());

    let d = desired("edge", 1, &[8443, 80]);
    assert_eq!(d.spec.ports, [80, 8443]);
    assert_eq!(d.spec.cap_add, ["NET_BIND_SERVICE"]);

    assert!(desired("edge", 1, &[1024]).spec.cap_add.is_empty());
    assert_eq!(
        desired("edge", 1, &[1023]).spec.cap_add,
        ["NET_BIND_SERVICE"]
    );
}

// ---- mounts ------------------------------------------------------------------------------

fn mount(source: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        source: PathBuf::from(source),
        target: target.to_string(),
        read_only,
    }
}

#[test]
fn standalone_mounts_generation_xds_and_tls_sorted() {
    let mut p = proxy_infra("edge", 1, &[8443, 8080]);
    if let Routing::Standalone(s) = &mut p.routing {
        s.listeners[0].tls = Some(TlsFiles {
            cert_file: "/certs/web.crt".into(),
            key_file: "/certs/web.key".into(),
        });
    }
    let d = desired_of(&p);
    let sha = sha256_hex(BOOTSTRAP.as_bytes());
    assert_eq!(d.spec.bootstrap_sha256, sha);
    let mut want = vec![
        mount(
            &format!("/var/lib/berth/proxies/edge/generations/{sha}"),
            "/etc/berth/bootstrap",
            true,
        ),
        mount("/var/lib/berth/proxies/edge/xds", "/etc/berth/xds", true),
        // TLS files are copied into the state directory and mounted as a directory.
        mount(
            "/var/lib/berth/proxies/edge/tls/l8443",
            "/etc/berth/tls/l8443",
            true,
        ),
    ];
    want.sort();
    assert_eq!(d.spec.mounts, want);
    let mut sorted = d.spec.mounts.clone();
    sorted.sort();
    assert_eq!(d.spec.mounts, sorted);
}

fn xds_proxy() -> ProxyInfra {
    let mut p = proxy_infra("gw", 1, &[8080]);
    p.routing = Routing::Xds(XdsServer {
        address: "127.0.0.1".into(),
        port: 18000,
        ca_file: "/pki/ca.pem".into(),
        cert_file: "/pki/envoy.pem".into(),
        key_file: "/pki/envoy-key.pem".into(),
    });
    p
}

#[test]
fn xds_mode_mounts_client_certs_and_the_sds_directory() {
    let p = xds_proxy();
    let d = desired_of(&p);
    let targets: Vec<(&Path, &str)> = d
        .spec
        .mounts
        .iter()
        .map(|m| {
            assert!(m.read_only);
            (m.source.as_path(), m.target.as_str())
        })
        .collect();
    // The client certificate's directory is named by its contents (here: by the paths, which
    // do not exist), so a new certificate is a new spec that goes through the gate.
    let xds_dir = tls_files(&p)[0].dir.clone();
    assert!(
        xds_dir.starts_with("xds-") && xds_dir.len() == 16,
        "{xds_dir}"
    );
    let source = PathBuf::from("/var/lib/berth/proxies/gw/tls").join(&xds_dir);
    assert!(targets.contains(&(source.as_path(), "/etc/berth/tls/xds")));
    assert!(targets.iter().any(|(_, t)| *t == "/etc/berth/bootstrap"));
    // The watched directory holds the SDS files for the client certificate.
    assert!(targets.iter().any(|(_, t)| *t == "/etc/berth/xds"));
    assert_eq!(targets.len(), 3);
    let files: Vec<(String, &str, PathBuf)> = tls_files(&p)
        .into_iter()
        .map(|f| (f.owner, f.file, f.source))
        .collect();
    assert_eq!(
        files,
        vec![
            ("xds".to_string(), "ca.pem", PathBuf::from("/pki/ca.pem")),
            (
                "xds".to_string(),
                "cert.pem",
                PathBuf::from("/pki/envoy.pem")
            ),
            (
                "xds".to_string(),
                "key.pem",
                PathBuf::from("/pki/envoy-key.pem")
            ),
        ]
    );
}

#[test]
fn a_new_xds_client_certificate_is_a_new_spec() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = xds_proxy();
    let Routing::Xds(x) = &mut p.routing else {
        unreachable!()
    };
    for (f, name) in [
        (&mut x.ca_file, "ca.pem"),
        (&mut x.cert_file, "cert.pem"),
        (&mut x.key_file, "key.pem"),
    ] {
        *f = dir.path().join(name);
        std::fs::write(&*f, name).unwrap();
    }
    let before = desired_of(&p);
    assert_eq!(desired_of(&p).hash, before.hash, "stable");
    std::fs::write(dir.path().join("cert.pem"), "another certificate").unwrap();
    let after = desired_of(&p);
    assert_ne!(after.hash, before.hash);
    // The old replicas keep their own directory; the new one gets its own.
    assert_ne!(after.spec.mounts, before.spec.mounts);
}

// ---- the hash ----------------------------------------------------------------------------

#[test]
fn hash_is_sha256_hex_and_desired_hash_is_spec_hash() {
    let d = desired("edge", 2, &[8080]);
    assert_eq!(d.hash.len(), 64);
    assert!(d
        .hash
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(d.hash, d.spec.hash());
}

/// A golden value: the hash must be the same in every run and every berth build. If this
/// fails you changed what goes into the hash, which replaces every replica of every proxy on
/// upgrade; do it only on purpose (and bump SPEC_FORMAT if the change is outside ProxySpec).
#[test]
fn hash_is_stable_across_runs() {
    let d = desired("edge", 2, &[8080]);
    // The canonical form, spelled out: compact serde_json of {format, spec}.
    let sha = sha256_hex(BOOTSTRAP.as_bytes());
    let canonical = format!(
        concat!(
            r#"{{"format":1,"spec":{{"proxy":"edge","image":"envoyproxy/envoy:v1.36.2","#,
            r#""args":["-c","/etc/berth/bootstrap/bootstrap.yaml","--disable-hot-restart","#,
            r#""--service-cluster","edge","--log-level","warn","--drain-strategy","immediate","#,
            r#""--drain-time-s","60","--concurrency","1"],"env":{{}},"nano_cpus":null,"#,
            r#""memory":null,"mounts":[{{"source":"/var/lib/berth/proxies/edge/generations/{sha}","#,
            r#""target":"/etc/berth/bootstrap","read_only":true}},"#,
            r#"{{"source":"/var/lib/berth/proxies/edge/xds","target":"/etc/berth/xds","#,
            r#""read_only":true}}],"ports":[8080],"cap_add":[],"bootstrap_sha256":"{sha}","#,
            r#""labels":{{}}}}}}"#
        ),
        sha = sha
    );
    assert_eq!(d.hash, sha256_hex(canonical.as_bytes()));
    assert_eq!(
        d.hash,
        "285164bc0ab1a3e662ec0e9700768eba1c306025ac2bc52d58ad8fa21d268d38"
    );
}

#[test]
fn hash_does_not_depend_on_map_insertion_or_mount_order() {
    let mut a = proxy_infra("edge", 1, &[8080, 9090]);
    let mut b = proxy_infra("edge", 1, &[9090, 8080]);
    if let (Routing::Standalone(sa), Routing::Standalone(sb)) = (&mut a.routing, &mut b.routing) {
        sb.listeners.reverse();
        let _ = sa;
    }
    for (k, v) in [("A", "1"), ("B", "2"), ("C", "3")] {
        a.config.env.insert(k.into(), v.into());
        a.metadata.labels.insert(k.into(), v.into());
    }
    for (k, v) in [("C", "3"), ("A", "1"), ("B", "2")] {
        b.config.env.insert(k.into(), v.into());
        b.metadata.labels.insert(k.into(), v.into());
    }
    // Also through a std HashMap, whose iteration order is random per process.
    let hm: std::collections::HashMap<String, String> = a.config.env.clone().into_iter().collect();
    b.config.env = hm.into_iter().collect();
    assert_eq!(hash_of(&a), hash_of(&b));

    // A hand-built spec with shuffled mounts, ports and caps hashes like the sorted one.
    let d = desired_of(&a);
    let mut s = d.spec.clone();
    s.mounts.reverse();
    s.ports.reverse();
    assert_eq!(s.hash(), d.hash);
}

#[test]
fn every_container_setting_changes_the_hash() {
    let base = proxy_infra("edge", 3, &[8080]);
    let h0 = hash_of(&base);
    let mut changed: Vec<(&str, String)> = Vec::new();
    let mut check = |what: &'static str, f: &dyn Fn(&mut ProxyInfra)| {
        let mut p = base.clone();
        f(&mut p);
        changed.push((what, hash_of(&p)));
    };
    check("image", &|p| {
        p.config.image = "envoyproxy/envoy:v1.37.0".into()
    });
    check("extra_args", &|p| p.config.extra_args = vec!["--x".into()]);
    check("env", &|p| {
        p.config.env.insert("K".into(), "v".into());
    });
    check("memory", &|p| p.config.resources.memory = Some(1 << 28));
    check("cpus", &|p| p.config.resources.cpus = Some(0.5));
    check("port", &|p| p.listeners[0].ports[0].container_port = 8081);
    check("second port", &|p| {
        let mut l = p.listeners[0].clone();
        l.name = "other".into();
        l.ports[0].container_port = 9000;
        p.listeners.push(l);
    });
    check("log level", &|p| {
        p.config
            .logging
            .level
            .insert("default".into(), LogLevel::Debug);
    });
    check("component log level", &|p| {
        p.config
            .logging
            .level
            .insert("router".into(), LogLevel::Debug);
    });
    check("drain timeout", &|p| {
        p.config.shutdown.drain_timeout = Duration::from_secs(5)
    });
    check("explicit concurrency", &|p| p.config.concurrency = Some(4));
    check("labels", &|p| {
        p.metadata.labels.insert("team".into(), "web".into());
    });
    check("tls files", &|p| {
        if let Routing::Standalone(s) = &mut p.routing {
            s.listeners[0].tls = Some(TlsFiles {
                cert_file: "/c".into(),
                key_file: "/k".into(),
            });
        }
    });
    check("proxy name", &|p| p.name = "edge2".into());
    check("routing mode", &|p| p.routing = xds_proxy().routing);

    let mut seen = std::collections::BTreeSet::from([h0.clone()]);
    for (what, h) in &changed {
        assert_ne!(*h, h0, "{what} must change the hash");
        assert!(
            seen.insert(h.clone()),
            "{what} collides with another change"
        );
    }

    // The bootstrap content.
    let other = desired_proxy(&base, "admin: {}\n", Path::new(STATE), 2);
    assert_ne!(other.hash, h0);
    assert_ne!(
        other.spec.bootstrap_sha256,
        desired_of(&base).spec.bootstrap_sha256
    );
    // The state directory moves the mounts.
    let other = desired_proxy(&base, BOOTSTRAP, Path::new("/srv/berth"), 2);
    assert_ne!(other.hash, h0);
}

#[test]
fn things_outside_the_container_do_not_change_the_hash() {
    let base = proxy_infra("edge", 3, &[8080]);
    let h0 = hash_of(&base);
    let mut p = base.clone();
    p.rollout.min_ready = Duration::from_secs(9);
    p.rollout.on_failure = crate::core::ir::OnFailure::Pause;
    p.metadata.annotations.insert("note".into(), "hello".into());
    p.namespace = "prod".into();
    p.addresses = vec!["10.0.0.1".into()];
    // Routes and backends travel in the watched files, not in the container.
    if let Routing::Standalone(s) = &mut p.routing {
        s.listeners[0].traffic = Traffic::Tcp {
            backend: "db".into(),
        };
    }
    assert_eq!(hash_of(&p), h0);
}

#[test]
fn replica_count_does_not_change_the_hash() {
    // Explicit concurrency: any replica count, same hash.
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.concurrency = Some(2);
    let h = hash_of(&p);
    for replicas in [0, 2, 3, 5, 50] {
        p.config.replicas = replicas;
        assert_eq!(hash_of(&p), h, "replicas = {replicas}");
    }
}

#[test]
fn scaling_keeps_the_hash_while_the_default_concurrency_stays_the_same() {
    // On a 2-CPU host, 3 → 5 replicas computes 1 worker either way: same args, same hash.
    let mut p = proxy_infra("edge", 3, &[8080]);
    let three = desired_proxy(&p, BOOTSTRAP, Path::new(STATE), 2);
    p.config.replicas = 5;
    let five = desired_proxy(&p, BOOTSTRAP, Path::new(STATE), 2);
    assert_eq!(three.hash, five.hash);
    assert_eq!(flag(&five.spec.args, "--concurrency"), Some("1"));
    assert_eq!((three.replicas, five.replicas), (3, 5));
}

#[test]
fn scaling_that_changes_the_default_concurrency_changes_the_hash() {
    // Documented choice: on an 8-CPU host, 2 → 4 replicas moves 4 → 2 workers each, so the
    // replicas are rolled to the new worker count.
    let mut p = proxy_infra("edge", 2, &[8080]);
    let two = desired_proxy(&p, BOOTSTRAP, Path::new(STATE), 8);
    p.config.replicas = 4;
    let four = desired_proxy(&p, BOOTSTRAP, Path::new(STATE), 8);
    assert_ne!(two.hash, four.hash);
    assert_eq!(flag(&two.spec.args, "--concurrency"), Some("4"));
    assert_eq!(flag(&four.spec.args, "--concurrency"), Some("2"));
}

// ---- names -------------------------------------------------------------------------------

#[test]
fn replica_names_and_short_hashes() {
    assert_eq!(
        replica_name("edge", 0, "1a2b3c4d5e6f7a8b9c"),
        "berth-edge-0-1a2b3c4d"
    );
    assert_eq!(replica_name("edge", 12, "abc"), "berth-edge-12-abc");
    assert_ne!(
        replica_name("edge", 1, &"a".repeat(64)),
        replica_name("edge", 1, &"b".repeat(64))
    );
    assert_ne!(
        replica_name("edge", 1, &"a".repeat(64)),
        replica_name("edge", 2, &"a".repeat(64))
    );
    assert_eq!(short_hash("0123456789abcdef"), "0123456789ab");
    assert_eq!(short_hash("0123"), "0123");
    assert_eq!(short_hash(""), "");
}

// ---- the replica container -----------------------------------------------------------------

#[test]
fn replica_container_adds_service_node_run_dir_and_berths_labels() {
    let mut p = proxy_infra("edge", 3, &[80, 8080]);
    p.metadata.labels = BTreeMap::from([
        ("team".to_string(), "web".to_string()),
        // A user label trying to pass for berth's: berth's wins.
        (LABEL_MANAGED_BY.to_string(), "someone-else".to_string()),
        (LABEL_SLOT.to_string(), "99".to_string()),
    ]);
    p.config.extra_args = vec!["--extra".into()];
    p.config.resources.memory = Some(1 << 29);
    p.config.resources.cpus = Some(1.0);
    p.config.env.insert("E".into(), "v".into());
    let d = desired_of(&p);
    let name = replica_name("edge", 2, &d.hash);
    let r = ReplicaContainer::new(
        &d,
        2,
        &name,
        "sha256:feed",
        Path::new(STATE),
        &Default::default(),
    );

    assert_eq!(r.name, name);
    assert_eq!(r.slot, 2);
    assert_eq!(r.image, "envoyproxy/envoy:v1.36.2");
    assert_eq!(r.memory, Some(1 << 29));
    assert_eq!(r.nano_cpus, Some(1_000_000_000));
    assert_eq!(r.env["E"], "v");
    assert_eq!(r.hardening.cap_add, ["NET_BIND_SERVICE"]);
    // Hardening is data the engine adapter only translates (DESIGN decision 9).
    assert_eq!(r.hardening.user, REPLICA_USER);
    assert!(r.hardening.read_only_rootfs && r.hardening.cap_drop_all);
    assert!(r.hardening.no_new_privileges);
    assert_eq!(r.network, crate::engine::Network::Host);
    assert_eq!(r.restart_policy, RESTART_POLICY);

    // --service-node right after --service-cluster; extra args still last.
    let i = r
        .args
        .iter()
        .position(|a| a == "--service-cluster")
        .unwrap();
    assert_eq!(
        &r.args[i..i + 4],
        ["--service-cluster", "edge", "--service-node", name.as_str()]
    );
    assert_eq!(r.args.last().unwrap(), "--extra");
    assert_eq!(r.args.len(), d.spec.args.len() + 2);

    // Its own admin directory, read-write; the shared mounts read-only; sorted.
    let run = r
        .mounts
        .iter()
        .find(|m| m.target == "/run/berth")
        .expect("run dir mounted");
    assert_eq!(
        run.source,
        PathBuf::from(format!("/var/lib/berth/proxies/edge/run/{name}"))
    );
    assert!(!run.read_only);
    assert_eq!(r.mounts.len(), d.spec.mounts.len() + 1);
    assert!(r
        .mounts
        .iter()
        .filter(|m| m.target != "/run/berth")
        .all(|m| m.read_only));
    let mut sorted = r.mounts.clone();
    sorted.sort();
    assert_eq!(r.mounts, sorted);

    assert_eq!(r.labels["team"], "web");
    assert_eq!(r.labels[LABEL_MANAGED_BY], "berth");
    assert_eq!(r.labels[LABEL_PROXY], "edge");
    assert_eq!(r.labels[LABEL_SLOT], "2");
    assert_eq!(r.labels[LABEL_SPEC_HASH], d.hash);
    assert_eq!(r.labels[LABEL_IMAGE_ID], "sha256:feed");
    assert_eq!(r.labels[LABEL_NAME], name);
    assert_eq!(r.labels[LABEL_STATE_DIR], "/var/lib/berth");
    assert_eq!(r.labels.len(), 8);
}

#[test]
fn replicas_differ_only_in_their_own_parts() {
    let d = desired("edge", 2, &[8080]);
    let a = ReplicaContainer::new(
        &d,
        0,
        "berth-edge-0-x",
        "img",
        Path::new(STATE),
        &Default::default(),
    );
    let b = ReplicaContainer::new(
        &d,
        1,
        "berth-edge-1-x",
        "img",
        Path::new(STATE),
        &Default::default(),
    );
    assert_ne!(a.mounts, b.mounts);
    assert_eq!(a.mounts.len(), b.mounts.len());
    assert!(a.mounts.iter().filter(|m| b.mounts.contains(m)).count() == a.mounts.len() - 1);
    assert_eq!(a.hardening.cap_add, Vec::<String>::new());
    let strip = |r: &ReplicaContainer| {
        r.args
            .iter()
            .filter(|x| !x.starts_with("berth-edge-"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&a), strip(&b));
}

#[test]
fn observed_helpers_read_labels() {
    let o = ObservedContainer {
        id: "id".into(),
        name: "n".into(),
        labels: BTreeMap::from([
            (LABEL_MANAGED_BY.to_string(), "berth".to_string()),
            (LABEL_PROXY.to_string(), "edge".to_string()),
            (LABEL_SLOT.to_string(), "3".to_string()),
            (LABEL_SPEC_HASH.to_string(), "h".to_string()),
            (LABEL_NAME.to_string(), "n".to_string()),
            (LABEL_IMAGE_ID.to_string(), "i".to_string()),
        ]),
        state: RunState::Running,
        live: LiveSettings {
            nano_cpus: None,
            memory: None,
            restart_policy: RESTART_POLICY.into(),
        },
        info: Default::default(),
    };
    assert!(o.is_managed());
    assert_eq!(o.proxy(), Some("edge"));
    assert_eq!(o.slot(), Some(3));
    assert_eq!(o.spec_hash(), Some("h"));
    assert_eq!(o.recorded_name(), Some("n"));
    assert_eq!(o.image_id(), Some("i"));
    let mut o2 = o.clone();
    o2.labels.insert(LABEL_MANAGED_BY.into(), "Berth".into());
    assert!(!o2.is_managed());
    o2.labels.insert(LABEL_SLOT.into(), "-1".into());
    assert_eq!(o2.slot(), None);
}

#[test]
fn run_states_round_trip() {
    for s in [
        RunState::Created,
        RunState::Running,
        RunState::Paused,
        RunState::Restarting,
        RunState::Exited,
        RunState::Dead,
        RunState::Removing,
    ] {
        assert_eq!(RunState::parse(s.as_str()), Some(s));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            format!("\"{}\"", s.as_str())
        );
        assert_eq!(
            s.is_startable(),
            matches!(s, RunState::Created | RunState::Exited)
        );
    }
    assert_eq!(RunState::parse("bogus"), None);
}

#[test]
fn validation_runs_with_the_replicas_args() {
    let mut p = proxy_infra("edge", 2, &[8080]);
    p.config.extra_args = vec!["--enable-core-dump".into()];
    let d = desired_of(&p);
    let replica = ReplicaContainer::new(
        &d,
        0,
        "berth-edge-0-abc",
        "sha256:x",
        Path::new("/s"),
        &Default::default(),
    );
    let validate = validation_args(&d.spec);
    let node = |args: &[String]| flag(args, "--service-node").map(str::to_string);
    assert_eq!(node(&replica.args).as_deref(), Some("berth-edge-0-abc"));
    assert_eq!(node(&validate).as_deref(), Some(VALIDATION_NODE));
    let without_node = |args: &[String]| {
        let mut a = args.to_vec();
        let i = a.iter().position(|x| x == "--service-node").unwrap();
        a.drain(i..i + 2);
        a
    };
    assert_eq!(without_node(&replica.args), without_node(&validate));
    assert_eq!(
        validate.last().map(String::as_str),
        Some("--enable-core-dump")
    );
}

#[test]
fn concurrency_zero_is_passed_to_envoy_as_given() {
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.concurrency = Some(0);
    let d = desired_of(&p);
    assert_eq!(flag(&d.spec.args, "--concurrency"), Some("0"));
}
