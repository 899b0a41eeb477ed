//! The renderer's unit tests: hostile values never change a document's structure, user templates
//! replace builtins and are escaped too, errors name the template, the heap cap.

use super::*;
use crate::core::ir::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// A proxy exercising every user string the templates print; `s(field)` makes each value.
fn standalone_fixture(s: &dyn Fn(&str) -> String) -> ProxyInfra {
    let port = |n: u16, p| ListenerPort {
        name: format!("p{n}"),
        protocol: p,
        service_port: n,
        container_port: n,
    };
    let route = |matcher, action| Route {
        matcher,
        action,
        timeout: Some(Duration::from_millis(1500)),
        retries: Some(Retries {
            attempts: 2,
            on: vec![s("retry-on")],
            per_try_timeout: Some(Duration::from_secs(1)),
        }),
    };
    ProxyInfra {
        metadata: InfraMetadata::default(),
        name: s("proxy"),
        namespace: s("namespace"),
        config: EnvoyProxy {
            image: "img".into(),
            replicas: 1,
            resources: Resources {
                cpus: None,
                memory: Some(1 << 30),
            },
            env: BTreeMap::new(),
            concurrency: None,
            extra_args: vec![],
            logging: Logging::default(),
            shutdown: Shutdown::default(),
            bootstrap: None,
            pull: Default::default(),
        },
        listeners: vec![
            ProxyListener {
                name: s("http-listener"),
                ports: vec![port(8080, Protocol::Https)],
                address: None,
            },
            ProxyListener {
                name: s("tcp-listener"),
                ports: vec![port(9000, Protocol::Tcp)],
                address: None,
            },
        ],
        addresses: vec![],
        rollout: RolloutPolicy::default(),
        placement: Default::default(),
        routing: Routing::Standalone(Standalone {
            listeners: vec![
                ListenerRouting {
                    listener: s("http-listener"),
                    tls: Some(TlsFiles {
                        cert_file: "/c".into(),
                        key_file: "/k".into(),
                    }),
                    acme: None,
                    traffic: Traffic::Http {
                        virtual_hosts: vec![VirtualHost {
                            name: s("vhost"),
                            domains: vec![s("domain-a"), s("domain-b")],
                            routes: vec![
                                route(
                                    RouteMatch {
                                        path: PathMatch::Prefix(s("prefix")),
                                        headers: vec![HeaderMatch {
                                            name: s("header-name"),
                                            value: s("header-value"),
                                        }],
                                    },
                                    RouteAction::Forward {
                                        backends: vec![
                                            WeightedBackend {
                                                name: s("backend-a"),
                                                weight: 1,
                                            },
                                            WeightedBackend {
                                                name: s("backend-b"),
                                                weight: 2,
                                            },
                                        ],
                                    },
                                ),
                                route(
                                    RouteMatch {
                                        path: PathMatch::Exact(s("exact")),
                                        headers: vec![],
                                    },
                                    RouteAction::DirectResponse {
                                        status: 200,
                                        body: s("body"),
                                    },
                                ),
                                route(
                                    RouteMatch {
                                        path: PathMatch::Prefix(s("prefix-2")),
                                        headers: vec![],
                                    },
                                    RouteAction::Redirect(Redirect {
                                        scheme: Some(s("scheme")),
                                        host: Some(s("redirect-host")),
                                        port: Some(443),
                                        path: Some(s("redirect-path")),
                                        status: 301,
                                    }),
                                ),
                            ],
                            tls: None,
                        }],
                    },
                    websocket: true,
                    access_log: AccessLog::Json,
                },
                ListenerRouting {
                    listener: s("tcp-listener"),
                    tls: None,
                    acme: None,
                    traffic: Traffic::Tcp {
                        backend: s("backend-a"),
                    },
                    websocket: false,
                    access_log: AccessLog::Text,
                },
            ],
            backends: ["backend-a", "backend-b"]
                .iter()
                .map(|b| Backend {
                    protocol: match *b {
                        "backend-a" => BackendProtocol::H2,
                        _ => BackendProtocol::Http1,
                    },
                    tls: (*b == "backend-a").then(|| BackendTls {
                        ca_file: "/ca".into(),
                        sni: s("sni"),
                        client: Some(TlsFiles {
                            cert_file: "/c".into(),
                            key_file: "/k".into(),
                        }),
                    }),
                    name: s(b),
                    endpoints: vec![Endpoint {
                        host: s(&format!("{b}-host")),
                        port: 80,
                    }],
                    lb_policy: LbPolicy::RoundRobin,
                    connect_timeout: Duration::from_secs(1),
                    health_check: Some(HealthCheck {
                        path: s(&format!("{b}-hc-path")),
                        interval: Duration::from_secs(5),
                        timeout: Duration::from_secs(1),
                        healthy_threshold: 1,
                        unhealthy_threshold: 2,
                    }),
                })
                .collect(),
        }),
        service_cluster: None,
    }
}

fn xds_fixture(s: &dyn Fn(&str) -> String) -> ProxyInfra {
    let mut p = standalone_fixture(s);
    p.routing = Routing::Xds(XdsServer {
        address: s("xds-address"),
        port: 18000,
        ca_file: "/ca".into(),
        cert_file: "/cert".into(),
        key_file: "/key".into(),
    });
    p
}

const FIELDS: &[&str] = &[
    "proxy",
    "http-listener",
    "tcp-listener",
    "vhost",
    "domain-a",
    "domain-b",
    "prefix",
    "prefix-2",
    "exact",
    "header-name",
    "header-value",
    "backend-a",
    "backend-b",
    "backend-a-host",
    "backend-b-host",
    "backend-a-hc-path",
    "backend-b-hc-path",
    "body",
    "scheme",
    "redirect-host",
    "redirect-path",
    "retry-on",
    "sni",
];

const HOSTILE: &[&str] = &[
    "a\nkey: injected",
    "\"quoted\": \"x\"",
    "colon: value",
    "{{ proxy.name }}",
    "{% if true %}x{% endif %}",
    "# not a comment",
    "&anchor",
    "*alias",
    "---\n...\n",
    "!!python/object x",
    "- [list, item]\n- other",
    "tab\tcr\rnul\0 nel\u{85} ls\u{2028}",
    "\\\"; }\n  admin: {}",
];

/// Every key path (with list positions) in a document.
fn key_paths(v: &serde_yaml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, v) in m {
                let k = match k {
                    serde_yaml::Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                let p = format!("{prefix}/{k}");
                out.insert(p.clone());
                key_paths(v, &p, out);
            }
        }
        serde_yaml::Value::Sequence(s) => {
            for (i, v) in s.iter().enumerate() {
                key_paths(v, &format!("{prefix}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn strings(v: &serde_yaml::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_yaml::Value::String(s) => {
            out.insert(s.clone());
        }
        serde_yaml::Value::Mapping(m) => m.values().for_each(|v| strings(v, out)),
        serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| strings(v, out)),
        _ => {}
    }
}

fn files(r: &Rendered) -> BTreeMap<String, serde_yaml::Value> {
    let mut all = r.xds.clone();
    all.insert("bootstrap.yaml".into(), r.bootstrap.clone());
    all.insert(
        "validation".into(),
        validation_bootstrap(r).expect("validation bootstrap"),
    );
    all.into_iter()
        .map(|(n, t)| {
            let v = serde_yaml::from_str(&t).unwrap_or_else(|e| panic!("{n}: {e}\n{t}"));
            (n, v)
        })
        .collect()
}

#[test]
fn hostile_values_never_change_the_document_structure() {
    let renderer = Renderer::builtin();
    let long = "x{{#&*: \n".repeat(2000);
    let mut hostile: Vec<&str> = HOSTILE.to_vec();
    hostile.push(&long);
    for fixture in [standalone_fixture, xds_fixture] {
        for h in &hostile {
            // The benign twin: same structure, plain values of the same length.
            let plain = "p".repeat(h.len());
            let benign = files(
                &renderer
                    .render(&fixture(&|f| format!("{plain}<{f}>")))
                    .unwrap(),
            );
            let make = |f: &str| format!("{h}<{f}>");
            let rendered = renderer
                .render(&fixture(&make))
                .unwrap_or_else(|e| panic!("render with {h:?}: {e:#}"));
            let hostile_files = files(&rendered);
            // Secret and route files are named after the listener or backend (by a digest
            // of an unusual name).
            let named = |f: &BTreeMap<String, serde_yaml::Value>| {
                let named: BTreeMap<String, serde_yaml::Value> = f
                    .iter()
                    .map(|(k, v)| {
                        let k = if let Some(rest) = k.strip_prefix("sds-backend.") {
                            let kind = rest.trim_end_matches(".yaml").rsplit('.').next();
                            format!("sds-backend.<backend>.{}", kind.unwrap_or(""))
                        } else if k.starts_with("sds-") && !k.starts_with("sds-xds") {
                            "sds-<listener>".to_string()
                        } else if k.starts_with("rds-") {
                            "rds-<listener>".to_string()
                        } else {
                            k.clone()
                        };
                        (k, v.clone())
                    })
                    .collect();
                assert_eq!(named.len(), f.len(), "{:?}", f.keys());
                named
            };
            let (benign_named, hostile_named) = (named(&benign), named(&hostile_files));
            assert_eq!(
                benign_named.keys().collect::<Vec<_>>(),
                hostile_named.keys().collect::<Vec<_>>()
            );
            let mut all_strings = BTreeSet::new();
            for (name, doc) in &hostile_named {
                let (mut want, mut got) = (BTreeSet::new(), BTreeSet::new());
                key_paths(&benign_named[name], "", &mut want);
                key_paths(doc, "", &mut got);
                assert_eq!(want, got, "{name}: keys differ with value {h:?}");
                strings(doc, &mut all_strings);
            }
            let fields: &[&str] = if rendered.xds.contains_key(layout::LDS_FILE) {
                FIELDS
            } else {
                &["proxy", "xds-address"]
            };
            for f in fields {
                assert!(
                    all_strings.contains(&make(f)),
                    "{f}: the value {:?} does not round-trip",
                    make(f)
                );
            }
        }
    }
}

#[test]
fn user_templates_replace_builtins_and_are_escaped_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cds.yaml.tera"),
        "resources: []\nnote: {{ proxy.name }}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("README.md"), "ignored").unwrap();
    let r = Renderer::with_overrides(dir.path()).unwrap();
    let out = r
        .render(&standalone_fixture(&|f| format!("evil\nkey: 1 {f}")))
        .unwrap();
    let cds: serde_yaml::Value = serde_yaml::from_str(&out.xds["cds.yaml"]).unwrap();
    assert_eq!(cds["note"].as_str(), Some("evil\nkey: 1 proxy"));
    assert!(cds.get("key").is_none());
    // The other templates are still the builtins.
    assert!(out.xds["lds.yaml"].contains("enable_reuse_port: true"));
}

#[test]
fn template_override_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bootstrp.yaml.tera"), "x: 1").unwrap();
    let err = format!("{:#}", Renderer::with_overrides(dir.path()).unwrap_err());
    assert!(
        err.contains("bootstrp.yaml.tera") && err.contains("bootstrap.yaml.tera"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lds.yaml.tera");
    std::fs::write(&path, "resources: [{% if %}").unwrap();
    let err = format!("{:#}", Renderer::with_overrides(dir.path()).unwrap_err());
    assert!(err.contains(&path.display().to_string()), "{err}");

    std::fs::write(&path, "resources:\n- a\n b: {{ proxy.name | safe }}\n").unwrap();
    let r = Renderer::with_overrides(dir.path()).unwrap();
    let err = format!(
        "{:#}",
        r.render(&standalone_fixture(&|f| f.to_string()))
            .unwrap_err()
    );
    assert!(
        err.contains("lds.yaml.tera") && err.contains("invalid YAML"),
        "{err}"
    );
}

#[test]
fn render_errors() {
    let mut p = standalone_fixture(&|f| f.to_string());
    if let Routing::Standalone(s) = &mut p.routing {
        s.backends.retain(|b| b.name != "backend-b");
    }
    let err = format!("{:#}", Renderer::builtin().render(&p).unwrap_err());
    assert!(err.contains("backend-b"), "{err}");

    let mut p = standalone_fixture(&|f| f.to_string());
    p.listeners[0].ports[0].protocol = Protocol::Udp;
    assert!(Renderer::builtin().render(&p).is_err());

    let mut p = standalone_fixture(&|f| f.to_string());
    p.config.bootstrap = Some(BootstrapOverride {
        kind: BootstrapOverrideKind::JSONPatch,
        value: r#"[{"op": "remove", "path": "/no/such"}]"#.into(),
    });
    let err = format!("{:#}", Renderer::builtin().render(&p).unwrap_err());
    assert!(
        err.contains("JSONPatch") && err.contains("/no/such"),
        "{err}"
    );
}

#[test]
fn heap_cap_is_80_percent_of_memory() {
    let p = standalone_fixture(&|f| f.to_string());
    let r = Renderer::builtin().render(&p).unwrap();
    assert!(r.bootstrap.contains("max_heap_size_bytes: 858993459"));
    let mut p = p;
    p.config.resources.memory = None;
    let r = Renderer::builtin().render(&p).unwrap();
    assert!(!r.bootstrap.contains("fixed_heap"));
}
