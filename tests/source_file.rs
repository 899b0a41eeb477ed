//! `berth.toml` → IR: the examples, defaults, path resolution and error positions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth::core::ir::*;
use berth::core::source::file::{self, ConfigError};

fn example(name: &str) -> file::Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    file::load(&path).unwrap_or_else(|e| panic!("{name}:\n{e}"))
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// Parses text as if it were the file `berth.toml` in `dir`.
fn parse_in(dir: &Path, text: &str) -> Result<file::Config, file::ConfigErrors> {
    file::parse(&dir.join("berth.toml"), text)
}

fn errors(text: &str) -> Vec<ConfigError> {
    match parse_in(&examples_dir(), text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.0,
    }
}

/// (line, column, field) of each error.
fn positions(errs: &[ConfigError]) -> Vec<(usize, usize, &str)> {
    errs.iter()
        .map(|e| (e.line, e.column, e.field.as_str()))
        .collect()
}

fn standalone(p: &ProxyInfra) -> &Standalone {
    match &p.routing {
        Routing::Standalone(s) => s,
        Routing::Xds(_) => panic!("{} is in xds mode", p.name),
    }
}

fn http_vhosts(r: &ListenerRouting) -> &[VirtualHost] {
    match &r.traffic {
        Traffic::Http { virtual_hosts } => virtual_hosts,
        Traffic::Tcp { .. } => panic!("{} is tcp", r.listener),
    }
}

#[test]
fn quickstart_is_exactly_this_ir() {
    let c = example("quickstart.toml");
    assert_eq!(c.state_dir, None);
    let expected = Infra {
        proxies: vec![ProxyInfra {
            metadata: InfraMetadata::default(),
            name: "quickstart".into(),
            namespace: "default".into(),
            config: EnvoyProxy {
                image: "berth/envoy:1.40.0".into(),
                replicas: 2,
                resources: Resources::default(),
                env: BTreeMap::new(),
                concurrency: None,
                extra_args: vec![],
                logging: Logging::default(),
                shutdown: Shutdown::default(),
                bootstrap: None,
                pull: Default::default(),
            },
            listeners: vec![ProxyListener {
                name: "web".into(),
                ports: vec![ListenerPort {
                    name: "http-10080".into(),
                    protocol: Protocol::Http,
                    service_port: 10080,
                    container_port: 10080,
                }],
                address: None,
            }],
            addresses: vec![],
            rollout: RolloutPolicy::default(),
            placement: Default::default(),
            routing: Routing::Standalone(Standalone {
                listeners: vec![ListenerRouting {
                    listener: "web".into(),
                    tls: None,
                    acme: None,
                    traffic: Traffic::Http {
                        virtual_hosts: vec![VirtualHost {
                            name: "web".into(),
                            domains: vec!["*".into()],
                            routes: vec![
                                Route {
                                    matcher: RouteMatch {
                                        path: PathMatch::Prefix("/api".into()),
                                        headers: vec![],
                                    },
                                    action: RouteAction::Forward {
                                        backends: vec![WeightedBackend {
                                            name: "api".into(),
                                            weight: 1,
                                        }],
                                    },
                                    timeout: Some(Duration::from_secs(5)),
                                    retries: None,
                                },
                                Route {
                                    matcher: RouteMatch {
                                        path: PathMatch::Prefix("/".into()),
                                        headers: vec![],
                                    },
                                    action: RouteAction::DirectResponse {
                                        status: 200,
                                        body: "hello from berth\n".into(),
                                    },
                                    timeout: None,
                                    retries: None,
                                },
                            ],
                            tls: None,
                        }],
                    },
                    websocket: false,
                    access_log: AccessLog::Text,
                }],
                backends: vec![Backend {
                    name: "api".into(),
                    endpoints: vec![Endpoint {
                        host: "127.0.0.1".into(),
                        port: 10090,
                    }],
                    lb_policy: LbPolicy::RoundRobin,
                    connect_timeout: Duration::from_secs(5),
                    health_check: None,
                    protocol: BackendProtocol::Http1,
                    tls: None,
                }],
            }),
            service_cluster: None,
        }],
    };
    assert_eq!(c.infra, expected);
}

#[test]
fn multi_maps_every_section() {
    let c = example("multi.toml");
    assert_eq!(c.state_dir, Some(PathBuf::from("/var/lib/berth")));
    assert_eq!(c.infra.proxies.len(), 2);
    let edge = c.infra.proxy("edge").unwrap();
    assert_eq!(edge.config.replicas, 3);
    assert_eq!(edge.config.concurrency, Some(1));
    assert_eq!(edge.config.resources.cpus, Some(1.5));
    assert_eq!(edge.config.resources.memory, Some(512 * 1024 * 1024));
    assert_eq!(edge.config.logging.default_level(), LogLevel::Info);
    assert_eq!(
        edge.config.logging.component_levels().collect::<Vec<_>>(),
        vec![("upstream", LogLevel::Debug)]
    );
    assert_eq!(edge.metadata.labels["team"], "web");
    assert_eq!(edge.metadata.labels["com.example.tier"], "edge");
    assert_eq!(edge.metadata.annotations["owner"], "platform@example.com");
    assert_eq!(edge.config.env["ENVOY_EXTRA"], "1");
    assert_eq!(
        edge.config.shutdown,
        Shutdown {
            drain_timeout: Duration::from_secs(30),
            min_drain_duration: Duration::from_secs(5),
            health_check_failure_delay: Duration::ZERO,
        }
    );
    assert_eq!(
        edge.rollout,
        RolloutPolicy {
            startup_deadline: Duration::from_secs(45),
            min_ready: Duration::from_secs(3),
            on_failure: OnFailure::Pause,
            ..RolloutPolicy::default()
        }
    );
    assert_eq!(edge.host_ports(), vec![10081, 15432]);
    assert_eq!(edge.listeners[1].ports[0].name, "tcp-15432");
    assert_eq!(edge.listeners[1].ports[0].protocol, Protocol::Tcp);

    let s = standalone(edge);
    let web = &s.listeners[0];
    let vhosts = http_vhosts(web);
    assert_eq!(vhosts.len(), 2);
    assert_eq!(vhosts[0].name, "api");
    assert_eq!(
        vhosts[0].domains,
        vec!["api.example.com", "*.api.example.com"]
    );
    let canary = &vhosts[0].routes[0];
    assert_eq!(
        canary.matcher.headers,
        vec![HeaderMatch {
            name: "x-canary".into(),
            value: "1".into()
        }]
    );
    assert_eq!(canary.timeout, Some(Duration::from_secs(2)));
    let split = &vhosts[0].routes[1];
    assert_eq!(
        split.action,
        RouteAction::Forward {
            backends: vec![
                WeightedBackend {
                    name: "api".into(),
                    weight: 90
                },
                WeightedBackend {
                    name: "api-canary".into(),
                    weight: 10
                },
            ]
        }
    );
    assert_eq!(
        split.retries,
        Some(Retries {
            attempts: 3,
            on: vec!["5xx".into(), "connect-failure".into()],
            per_try_timeout: Some(Duration::from_secs(1)),
        })
    );
    assert_eq!(
        vhosts[1].routes[0].matcher.path,
        PathMatch::Exact("/old".into())
    );
    assert_eq!(
        vhosts[1].routes[0].action,
        RouteAction::Redirect(Redirect {
            path: Some("/new".into()),
            status: 308,
            ..Default::default()
        })
    );
    assert_eq!(
        s.listeners[1].traffic,
        Traffic::Tcp {
            backend: "postgres".into()
        }
    );
    let api = s.backend("api").unwrap();
    assert_eq!(api.lb_policy, LbPolicy::LeastRequest);
    assert_eq!(api.connect_timeout, Duration::from_secs(2));
    assert_eq!(
        api.health_check,
        Some(HealthCheck {
            path: "/healthz".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
        })
    );
    assert!(!s.backend("api-canary").unwrap().endpoints[0].is_ip());

    let internal = c.infra.proxy("internal").unwrap();
    assert_eq!(internal.config.replicas, 1);
    assert_eq!(internal.config.logging.default_level(), LogLevel::Warn);
    assert_eq!(internal.listeners[0].ports[0].protocol, Protocol::Http);
    let ui = standalone(internal).backend("ui").unwrap();
    assert_eq!(
        ui.endpoints,
        vec![Endpoint {
            host: "::1".into(),
            port: 9100
        }]
    );
    assert_eq!(ui.lb_policy, LbPolicy::Random);
}

#[test]
fn tls_paths_resolve_against_the_config_file() {
    let c = example("tls.toml");
    let p = &c.infra.proxies[0];
    assert_eq!(p.listeners[0].ports[0].protocol, Protocol::Https);
    assert_eq!(p.listeners[0].ports[0].name, "https-10443");
    let tls = standalone(p).listeners[0].tls.clone().unwrap();
    assert!(tls.cert_file.is_absolute());
    assert_eq!(tls.cert_file, examples_dir().join("certs/cert.pem"));
    assert_eq!(tls.key_file, examples_dir().join("certs/key.pem"));
}

#[test]
fn relative_paths_in_a_temp_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pki")).unwrap();
    for f in ["cert.pem", "key.pem"] {
        std::fs::copy(
            examples_dir().join("certs").join(f),
            dir.path().join("pki").join(f),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("merge.yaml"), "stats_flush_interval: 5s\n").unwrap();
    let text = r#"
state_dir = "state"
[[proxy]]
name = "t"
[proxy.bootstrap]
file = "merge.yaml"
[[proxy.listener]]
name = "tls"
port = 10999
protocol = "tcp"
backend = "b"
tls = { cert_file = "pki/cert.pem", key_file = "pki/key.pem" }
[[proxy.backend]]
name = "b"
endpoints = ["127.0.0.1:1"]
"#;
    let c = parse_in(dir.path(), text).unwrap();
    let abs = std::path::absolute(dir.path()).unwrap();
    assert_eq!(c.state_dir, Some(abs.join("state")));
    let p = &c.infra.proxies[0];
    assert_eq!(p.listeners[0].ports[0].protocol, Protocol::Tls);
    assert_eq!(p.listeners[0].ports[0].name, "tls-10999");
    let tls = standalone(p).listeners[0].tls.clone().unwrap();
    assert_eq!(tls.cert_file, abs.join("pki/cert.pem"));
    assert_eq!(tls.key_file, abs.join("pki/key.pem"));
    assert_eq!(
        p.config.bootstrap,
        Some(BootstrapOverride {
            kind: BootstrapOverrideKind::Merge,
            value: "stats_flush_interval: 5s\n".into(),
        })
    );
}

#[test]
fn xds_mode() {
    let c = example("xds.toml");
    let p = &c.infra.proxies[0];
    assert_eq!(p.namespace, "envoy-gateway-system");
    assert_eq!(p.host_ports(), vec![10180, 10543]);
    assert_eq!(
        p.routing,
        Routing::Xds(XdsServer {
            address: "127.0.0.1".into(),
            port: 18000,
            ca_file: examples_dir().join("certs/cert.pem"),
            cert_file: examples_dir().join("certs/cert.pem"),
            key_file: examples_dir().join("certs/key.pem"),
        })
    );
}

#[test]
fn defaults_are_applied() {
    let text = r#"
[[proxy]]
name = "min"
[[proxy.listener]]
name = "web"
port = 10001
[[proxy.listener.route]]
path = "/"
direct_response = {}
[[proxy.listener.route]]
path_prefix = "/r"
redirect = { scheme = "https" }
[[proxy.listener.route]]
path_prefix = "/b"
backend = "b"
retries = { attempts = 2 }
[[proxy.backend]]
name = "b"
endpoints = ["b.internal:80"]
health_check = { path = "/h" }
"#;
    let c = parse_in(&examples_dir(), text).unwrap();
    let p = &c.infra.proxies[0];
    assert_eq!(p.config.image, file::DEFAULT_IMAGE);
    assert_eq!(p.config.replicas, 1);
    assert_eq!(p.namespace, "default");
    assert_eq!(p.config.shutdown, Shutdown::default());
    assert_eq!(p.rollout, RolloutPolicy::default());
    assert_eq!(p.config.logging, Logging::default());
    assert_eq!(p.config.bootstrap, None);
    let s = standalone(p);
    let routes = &http_vhosts(&s.listeners[0])[0].routes;
    assert_eq!(
        routes[0].action,
        RouteAction::DirectResponse {
            status: 200,
            body: String::new()
        }
    );
    assert_eq!(
        routes[1].action,
        RouteAction::Redirect(Redirect {
            scheme: Some("https".into()),
            status: 301,
            ..Default::default()
        })
    );
    let retries = routes[2].retries.clone().unwrap();
    assert_eq!(retries.attempts, 2);
    assert!(!retries.on.is_empty());
    assert_eq!(retries.per_try_timeout, None);
    let b = s.backend("b").unwrap();
    assert_eq!(b.connect_timeout, file::DEFAULT_CONNECT_TIMEOUT);
    assert_eq!(b.lb_policy, LbPolicy::RoundRobin);
    let hc = b.health_check.clone().unwrap();
    assert_eq!(
        (
            hc.interval,
            hc.timeout,
            hc.healthy_threshold,
            hc.unhealthy_threshold
        ),
        (Duration::from_secs(5), Duration::from_secs(1), 2, 3)
    );
}

#[test]
fn sizes_durations_and_log_levels() {
    let text = |mem: &str, timeout: &str| {
        format!(
            r#"
[[proxy]]
name = "p"
log_level = "debug"
[proxy.resources]
memory = {mem}
cpus = 2
[[proxy.listener]]
name = "web"
port = 10002
[[proxy.listener.route]]
path_prefix = "/"
backend = "b"
timeout = "{timeout}"
[[proxy.backend]]
name = "b"
endpoints = ["127.0.0.1:1"]
"#
        )
    };
    for (mem, bytes) in [
        ("\"1Gi\"", 1u64 << 30),
        ("\"500M\"", 500_000_000),
        ("\"1G\"", 1_000_000_000),
        ("67108864", 64 << 20),
        ("\"1.5Gi\"", 3 << 29),
    ] {
        let c = parse_in(&examples_dir(), &text(mem, "1m30s")).unwrap();
        let p = &c.infra.proxies[0];
        assert_eq!(p.config.resources.memory, Some(bytes), "{mem}");
        assert_eq!(p.config.resources.cpus, Some(2.0));
        assert_eq!(p.config.logging.default_level(), LogLevel::Debug);
        let route = &http_vhosts(&standalone(p).listeners[0])[0].routes[0];
        assert_eq!(route.timeout, Some(Duration::from_secs(90)));
    }
    let c = parse_in(&examples_dir(), &text("\"64Mi\"", "500ms")).unwrap();
    let route = &http_vhosts(&standalone(&c.infra.proxies[0]).listeners[0])[0].routes[0];
    assert_eq!(route.timeout, Some(Duration::from_millis(500)));
}

#[test]
fn all_errors_are_reported_with_exact_positions() {
    let text = r#"[[proxy]]
name = "Edge"
replicas = 99
colour = "blue"

[[proxy.listener]]
name = "web"
port = 70000

[[proxy.listener.route]]
path_prefix = "api"
backend = "nope"

[[proxy.backend]]
name = "api"
endpoints = ["127.0.0.1"]
connect_timeout = "5 s"

[[proxy]]
name = "two"

[[proxy.listener]]
name = "web"
port = 10080

[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 99 }

[[proxy]]
name = "three"

[[proxy.listener]]
name = "web"
port = 10080
protocol = "tcp"
backend = "x"

[[proxy.backend]]
name = "x"
endpoints = ["[::1]:1"]
"#;
    let errs = errors(text);
    assert_eq!(
        positions(&errs),
        vec![
            (2, 8, "proxy[0].name"),
            (3, 12, "proxy[0].replicas"),
            (4, 1, "proxy[0].colour"),
            (8, 8, "proxy[0].listener[0].port"),
            (11, 15, "proxy[0].listener[0].route[0].path_prefix"),
            (12, 11, "proxy[0].listener[0].route[0].backend"),
            (16, 14, "proxy[0].backend[0].endpoints[0]"),
            (17, 19, "proxy[0].backend[0].connect_timeout"),
            (
                28,
                30,
                "proxy[1].listener[0].route[0].direct_response.status"
            ),
            (35, 8, "proxy[2].listener[0].port"),
        ],
        "{}",
        file::ConfigErrors(errs.clone())
    );
    assert!(errs[3].message.contains("must be 1–65535, got 70000"));
    assert!(errs[5]
        .message
        .contains("defined backends in this proxy: api"));
    assert!(errs[9]
        .message
        .contains("already used by proxy[1].listener[0].port (line 24, column 8)"));
}

#[test]
fn display_is_one_error_per_line() {
    let errs = file::parse(
        Path::new("conf/berth.toml"),
        "[[proxy]]\nname = \"a\\nb\"\nreplicas = 0\n",
    )
    .unwrap_err();
    let out = errs.to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), errs.0.len());
    assert!(
        lines[0].starts_with("conf/berth.toml:1:1: proxy[0].listener: "),
        "{out}"
    );
    assert!(
        lines[1].starts_with("conf/berth.toml:2:8: proxy[0].name: must be a DNS label"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("conf/berth.toml:3:12: proxy[0].replicas: must be 1–32, got 0"),
        "{out}"
    );
}

#[test]
fn syntax_errors_have_positions() {
    let errs = errors("[[proxy]]\nname = \"edge\nreplicas = 2\n");
    assert_eq!(errs[0].field, "syntax");
    assert_eq!((errs[0].line, errs[0].column), (2, 13));
    let errs = errors("[[proxy]]\nname = \"a\"\nname = \"b\"\n");
    assert_eq!((errs[0].line, errs[0].column), (3, 1));
    assert!(
        errs[0].message.contains("duplicate key \"name\""),
        "{}",
        errs[0].message
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    let errs = errors("[[proxy]]\nname = \"é\" # é\nname2 = 1\n");
    assert_eq!(
        positions(&errs)[1..],
        [(2, 8, "proxy[0].name"), (3, 1, "proxy[0].name2")]
    );
    let errs = errors("[[proxy]]\nlabels = { \"ü\" = \"x\", \"é\" = \"y\" }\nname = \"p\"\n");
    let label_errs: Vec<_> = errs
        .iter()
        .filter(|e| e.field.starts_with("proxy[0].labels"))
        .collect();
    // `ü` is two bytes but one column.
    assert_eq!((label_errs[0].line, label_errs[0].column), (2, 12));
    assert_eq!((label_errs[1].line, label_errs[1].column), (2, 23));
}

#[test]
fn direct_response_body_is_capped() {
    let body = "x".repeat(64 * 1024 + 1);
    let text = format!(
        "[[proxy]]\nname = \"p\"\n[[proxy.listener]]\nname = \"w\"\nport = 10003\n[[proxy.listener.route]]\npath_prefix = \"/\"\ndirect_response = {{ body = \"{body}\" }}\n"
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].message.contains("at most 65536 bytes"),
        "{}",
        errs[0].message
    );
    // Newlines in the body are fine.
    let ok = text.replace(&body, "line one\\nline two\\n");
    let c = parse_in(&examples_dir(), &ok).unwrap();
    let route = &http_vhosts(&standalone(&c.infra.proxies[0]).listeners[0])[0].routes[0];
    assert_eq!(
        route.action,
        RouteAction::DirectResponse {
            status: 200,
            body: "line one\nline two\n".into()
        }
    );
}

#[test]
fn the_examples_roundtrip_through_json() {
    for name in ["quickstart.toml", "multi.toml", "tls.toml", "xds.toml"] {
        let c = example(name);
        let json = serde_json::to_string(&c.infra).unwrap();
        let back: Infra = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c.infra, "{name}");
    }
}

#[test]
fn backend_protocol_and_tls() {
    let text = r#"
[[proxy]]
name = "t"
[[proxy.listener]]
name = "web"
port = 10998
protocol = "http"
[[proxy.listener.route]]
path_prefix = "/"
backend = "grpc"
[[proxy.backend]]
name = "grpc"
endpoints = ["grpc.internal:8443", "grpc.internal:8444"]
protocol = "h2"
tls = { ca_file = "certs/cert.pem", cert_file = "certs/cert.pem", key_file = "certs/key.pem" }
[[proxy.backend]]
name = "plain"
endpoints = ["127.0.0.1:1"]
"#;
    let c = parse_in(&examples_dir(), text).unwrap();
    let s = standalone(&c.infra.proxies[0]);
    let grpc = s.backend("grpc").unwrap();
    assert_eq!(grpc.protocol, BackendProtocol::H2);
    let tls = grpc.tls.clone().unwrap();
    assert_eq!(
        tls.sni, "grpc.internal",
        "the SNI defaults to the one DNS name"
    );
    assert_eq!(tls.ca_file, examples_dir().join("certs/cert.pem"));
    assert_eq!(
        tls.client,
        Some(TlsFiles {
            cert_file: examples_dir().join("certs/cert.pem"),
            key_file: examples_dir().join("certs/key.pem"),
        })
    );
    let plain = s.backend("plain").unwrap();
    assert_eq!(
        (plain.protocol, plain.tls.clone()),
        (BackendProtocol::Http1, None)
    );
    assert!(c.files.contains(&examples_dir().join("certs/key.pem")));

    let errs = errors(
        r#"
[[proxy]]
name = "t"
[[proxy.listener]]
name = "web"
port = 10998
protocol = "http"
[[proxy.listener.route]]
path_prefix = "/"
timeout = "0s"
backend = "a"
[[proxy.backend]]
name = "a"
endpoints = ["127.0.0.1:1"]
protocol = "http2"
tls = { ca_file = "certs/key.pem", cert_file = "certs/cert.pem", verify = false }
[[proxy.backend]]
name = "b"
endpoints = ["127.0.0.1:1"]
tls = { ca_file = "certs/cert.pem", sni = "10.0.0.1" }
"#,
    );
    let shown: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        positions(&errs),
        vec![
            (15, 12, "proxy[0].backend[0].protocol"),
            (16, 7, "proxy[0].backend[0].tls.sni"),
            (16, 19, "proxy[0].backend[0].tls.ca_file"),
            (16, 36, "proxy[0].backend[0].tls.key_file"),
            (16, 66, "proxy[0].backend[0].tls.verify"),
            (20, 43, "proxy[0].backend[1].tls.sni"),
        ],
        "{shown:#?}"
    );
    assert!(shown[0].contains("http1, h2"), "{}", shown[0]);
    assert!(shown[1].contains("is required when"), "{}", shown[1]);
    assert!(shown[2].contains("not a PEM certificate"), "{}", shown[2]);
    assert!(
        shown[3].contains("is required with cert_file"),
        "{}",
        shown[3]
    );
    assert!(shown[5].contains("not an IP address"), "{}", shown[5]);
}
