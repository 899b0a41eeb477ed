use super::*;
use crate::ir;

fn xds() -> XdsDefaults {
    XdsDefaults {
        address: "127.0.0.1".into(),
        port: DEFAULT_XDS_PORT,
        ca_file: "/etc/berth/xds/ca.crt".into(),
        cert_file: "/etc/berth/xds/tls.crt".into(),
        key_file: "/etc/berth/xds/tls.key".into(),
    }
}

fn err(text: &str) -> String {
    parse_ir(text, &xds()).unwrap_err().to_string()
}

const LISTENER: &str = r#""listeners":[{"name":"ns/gw/http","ports":[{"name":"http-80","protocol":"HTTP","servicePort":80,"containerPort":80}]}]"#;

fn with_config(config: &str) -> String {
    format!(r#"{{"proxy":{{"name":"ns/gw","config":{config},{LISTENER}}}}}"#)
}

#[test]
fn berth_names() {
    assert_eq!(berth_name("ns/gw"), "ns-gw");
    assert_eq!(berth_name("default/eg"), "default-eg");
    assert_eq!(berth_name("eg"), "eg");
    assert_eq!(berth_name("edge-1"), "edge-1");
    // Ambiguous or lossy mappings get a hash.
    let a = berth_name("a-b/c");
    let b = berth_name("a/b-c");
    assert_ne!(a, b);
    assert!(
        a.starts_with("a-b-c-") && a.len() == "a-b-c-".len() + 8,
        "{a}"
    );
    let upper = berth_name("NS/Gw");
    assert!(upper.starts_with("ns-gw-"), "{upper}");
    assert_ne!(upper, berth_name("ns/gw"));
    assert!(berth_name("/x/").starts_with("x-"));
    assert_eq!(berth_name("").len(), 8);
    let long = berth_name(&"a".repeat(100));
    assert_eq!(long.len(), 63);
    assert!(long.starts_with(&"a".repeat(54)));
    for n in ["a.b/c_d", "ns/gw", &"x/".repeat(40), "Ünïcode/gw"] {
        let l = berth_name(n);
        assert!(l.len() <= 63 && !l.is_empty(), "{l}");
        assert!(!l.starts_with('-') && !l.ends_with('-'), "{l}");
        assert!(
            l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{l}"
        );
    }
}

#[test]
fn minimal_bare_proxy_gets_eg_defaults() {
    let p = parse_ir(&format!(r#"{{"name":"ns/gw",{LISTENER}}}"#), &xds()).unwrap();
    assert_eq!(p.len(), 1);
    let c = &p[0].proxy.config;
    assert_eq!(c.image, DEFAULT_IMAGE);
    assert_eq!(c.replicas, 1);
    assert_eq!(c.resources, ir::Resources::default());
    assert_eq!(c.shutdown, ir::Shutdown::default());
    assert_eq!(p[0].eg_name, "ns/gw");
    assert_eq!(p[0].proxy.name, "ns-gw");
    assert!(matches!(&p[0].proxy.routing, ir::Routing::Xds(x) if x.port == 18000));
}

#[test]
fn no_listeners_is_empty_not_an_error() {
    let p = parse_ir("proxy:\n  name: ns/gw\n", &xds()).unwrap();
    assert!(p[0].is_empty());
    let p = parse_ir(r#"{"proxy":{"name":"ns/gw","listeners":null}}"#, &xds()).unwrap();
    assert!(p[0].is_empty());
}

#[test]
fn image_repository_gets_default_tag() {
    let p = parse_ir(
        &with_config(
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"imageRepository":"registry.local/envoy"}}}}}}"#,
        ),
        &xds(),
    )
    .unwrap();
    assert_eq!(
        p[0].proxy.config.image,
        "registry.local/envoy:distroless-dev"
    );
}

#[test]
fn requests_stand_in_for_missing_limits() {
    let p = parse_ir(
        &with_config(
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"resources":{"limits":{"memory":"1Gi"},"requests":{"cpu":"250m","memory":"512Mi"}}}}}}}}"#,
        ),
        &xds(),
    )
    .unwrap();
    let r = &p[0].proxy.config.resources;
    assert_eq!(r.memory, Some(1 << 30));
    assert_eq!(r.cpus, Some(0.25));
}

#[test]
fn daemonset_container_is_read_and_means_one_replica() {
    let p = parse_ir(
        &with_config(
            r#"{"spec":{"provider":{"kubernetes":{"envoyDaemonSet":{"container":{"image":"envoy:ds"}}}}}}"#,
        ),
        &xds(),
    )
    .unwrap();
    assert_eq!(p[0].proxy.config.image, "envoy:ds");
    assert_eq!(p[0].proxy.config.replicas, 1);
}

#[test]
fn json_patch_bootstrap_keeps_the_patch_list() {
    let p = parse_ir(
        &with_config(
            r#"{"spec":{"bootstrap":{"type":"JSONPatch","jsonPatches":[{"op":"add","path":"/a","value":1}]}}}"#,
        ),
        &xds(),
    )
    .unwrap();
    let b = p[0].proxy.config.bootstrap.as_ref().unwrap();
    assert_eq!(b.kind, ir::BootstrapOverrideKind::JSONPatch);
    assert_eq!(b.value, r#"[{"op":"add","path":"/a","value":1}]"#);
}

#[test]
fn bootstrap_type_defaults_to_replace() {
    let p = parse_ir(
        &with_config(r#"{"spec":{"bootstrap":{"value":"admin: {}"}}}"#),
        &xds(),
    )
    .unwrap();
    let b = p[0].proxy.config.bootstrap.as_ref().unwrap();
    assert_eq!(b.kind, ir::BootstrapOverrideKind::Replace);
}

#[test]
fn differing_container_port_wins() {
    let p = parse_ir(
        r#"{"name":"ns/gw","listeners":[{"name":"ns/gw/http","ports":[{"name":"http-80","protocol":"http","servicePort":80,"containerPort":10080}]}]}"#,
        &xds(),
    )
    .unwrap();
    let port = &p[0].proxy.listeners[0].ports[0];
    assert_eq!((port.service_port, port.container_port), (10080, 10080));
    assert_eq!(port.protocol, ir::Protocol::Http);
}

#[test]
fn negative_replicas() {
    assert_eq!(
        err(&with_config(
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":-1}}}}}"#
        )),
        "proxy.config.spec.provider.kubernetes.envoyDeployment.replicas: must be ≥ 0, got -1"
    );
}

#[test]
fn non_integer_replicas() {
    let e = err(&with_config(
        r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":"two"}}}}}"#,
    ));
    assert!(
        e.starts_with("proxy.config.spec.provider.kubernetes.envoyDeployment.replicas: "),
        "{e}"
    );
}

#[test]
fn unknown_protocol() {
    let e = err(
        r#"{"proxy":{"name":"ns/gw","listeners":[{"name":"l","ports":[{"name":"p","protocol":"SCTP","servicePort":80,"containerPort":80}]}]}}"#,
    );
    assert!(
        e.starts_with("proxy.listeners[0].ports[0].protocol: unknown protocol \"SCTP\""),
        "{e}"
    );
}

#[test]
fn port_out_of_range() {
    for (port, field) in [("0", "servicePort"), ("70000", "servicePort")] {
        let e = err(&format!(
            r#"{{"proxy":{{"name":"ns/gw","listeners":[{{"name":"l","ports":[{{"name":"p","protocol":"TCP","servicePort":{port},"containerPort":80}}]}}]}}}}"#
        ));
        assert_eq!(
            e,
            format!("proxy.listeners[0].ports[0].{field}: must be in 1..=65535, got {port}")
        );
    }
    let e = err(
        r#"{"proxy":{"name":"ns/gw","listeners":[{"name":"l","ports":[{"name":"p","protocol":"TCP","servicePort":80,"containerPort":-3}]}]}}"#,
    );
    assert_eq!(
        e,
        "proxy.listeners[0].ports[0].containerPort: must be in 1..=65535, got -3"
    );
}

#[test]
fn empty_names() {
    assert_eq!(
        err(&format!(r#"{{"proxy":{{"name":"",{LISTENER}}}}}"#)),
        "proxy.name: must not be empty"
    );
    assert_eq!(
        err(r#"{"proxy":{"name":"x","listeners":[{"name":"","ports":[]}]}}"#),
        "proxy.listeners[0].name: must not be empty"
    );
    assert_eq!(
        err(
            r#"{"proxy":{"name":"x","listeners":[{"name":"l","ports":[{"protocol":"TCP","servicePort":1,"containerPort":1}]}]}}"#
        ),
        "proxy.listeners[0].ports[0].name: must not be empty"
    );
    assert_eq!(
        err(r#"{"proxy":{"name":"x","listeners":[{"name":"l"}]}}"#),
        "proxy.listeners[0].ports: a listener needs at least one port"
    );
}

#[test]
fn bad_config_values_name_their_field() {
    let cases = [
        (
            r#"{"spec":{"logging":{"level":{"default":"loud"}}}}"#,
            "proxy.config.spec.logging.level.default: unknown log level",
        ),
        (
            r#"{"spec":{"shutdown":{"drainTimeout":"forever"}}}"#,
            "proxy.config.spec.shutdown.drainTimeout: ",
        ),
        (
            r#"{"spec":{"concurrency":-2}}"#,
            "proxy.config.spec.concurrency: must be ≥ 0, got -2",
        ),
        (
            r#"{"spec":{"bootstrap":{"type":"Patch","value":"x"}}}"#,
            "proxy.config.spec.bootstrap.type: unknown bootstrap type",
        ),
        (
            r#"{"spec":{"bootstrap":{"type":"Merge"}}}"#,
            "proxy.config.spec.bootstrap.value: required when type is Merge",
        ),
        (
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"resources":{"limits":{"memory":"lots"}}}}}}}}"#,
            "proxy.config.spec.provider.kubernetes.envoyDeployment.container.resources.limits.memory: ",
        ),
        (
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"resources":{"limits":{"cpu":"-1"}}}}}}}}"#,
            "proxy.config.spec.provider.kubernetes.envoyDeployment.container.resources.limits.cpu: must be ≥ 0",
        ),
        (
            r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"container":{"env":[{"value":"x"}]}}}}}}"#,
            "proxy.config.spec.provider.kubernetes.envoyDeployment.container.env[0].name: must not be empty",
        ),
        (
            r#"{"spec":{"extraArgs":"--foo"}}"#,
            "proxy.config.spec.extraArgs: expected a list, got a string",
        ),
        (
            r#""just a string""#,
            "proxy.config: expected an object, got a string",
        ),
    ];
    for (config, want) in cases {
        let e = err(&with_config(config));
        assert!(
            e.starts_with(want),
            "config {config}\n got: {e}\nwant: {want}…"
        );
    }
}

#[test]
fn not_an_ir() {
    assert!(err("- a\n- b\n").starts_with("expected an Envoy Gateway infra IR object"));
    assert!(err("foo: bar\n").starts_with("not an Envoy Gateway infra IR"));
    assert!(err("{\"proxy\": ").starts_with("malformed JSON"));
    assert!(err("proxy: [\n").starts_with("malformed YAML"));
}

#[test]
fn infra_ir_map_paths_quote_keys() {
    let e = err(
        "infraIR:\n  ns/gw:\n    proxy:\n      name: ns/gw\n      listeners:\n      - name: l\n        ports:\n        - {name: p, protocol: QUIC, servicePort: 1, containerPort: 1}\n",
    );
    assert!(
        e.starts_with(r#"infraIR["ns/gw"].proxy.listeners[0].ports[0].protocol: "#),
        "{e}"
    );
}

#[test]
fn proto_parts_map_like_the_file_form() {
    let parts = ProxyParts {
        name: "ns/gw".into(),
        namespace: "envoy-gateway-system".into(),
        config_json: br#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":3}}}}}"#
            .to_vec(),
        listeners: vec![ListenerParts {
            name: "ns/gw/http".into(),
            ports: vec![PortParts {
                name: "http-80".into(),
                protocol: "HTTP".into(),
                service_port: 80,
                container_port: 80,
            }],
            http3: false,
        }],
        ..Default::default()
    };
    let from_proto = from_proto_parts(parts, "infra.proxy", &xds()).unwrap();
    let from_file = parse_ir(
        &with_config(r#"{"spec":{"provider":{"kubernetes":{"envoyDeployment":{"replicas":3}}}}}"#)
            .replace(
                r#""name":"ns/gw","#,
                r#""name":"ns/gw","namespace":"envoy-gateway-system","#,
            ),
        &xds(),
    )
    .unwrap();
    assert_eq!(from_proto, from_file[0]);

    let bad = ProxyParts {
        name: "ns/gw".into(),
        config_json: b"{not json".to_vec(),
        ..Default::default()
    };
    let e = from_proto_parts(bad, "infra.proxy", &xds())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("infra.proxy.config: malformed EnvoyProxy JSON"),
        "{e}"
    );
}
