use super::*;
use crate::core::ir;
use std::time::Duration;

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
        "registry.local/envoy:distroless-v1.39.0"
    );
}

#[test]
fn limits_cap_and_requests_never_do() {
    let resources = |r: &str| {
        let p = parse_ir(
            &with_config(&format!(
                r#"{{"spec":{{"provider":{{"kubernetes":{{"envoyDeployment":{{"container":{{"resources":{r}}}}}}}}}}}}}"#
            )),
            &xds(),
        )
        .unwrap();
        p[0].proxy.config.resources.clone()
    };
    let r = resources(r#"{"limits":{"memory":"1Gi"},"requests":{"cpu":"250m","memory":"512Mi"}}"#);
    assert_eq!(r.memory, Some(1 << 30));
    assert_eq!(r.cpus, None, "a CPU request is no CPU limit");
    // EG's default requests (100m, 512Mi) alone: no quota, no memory limit, no heap cap.
    let r = resources(r#"{"requests":{"cpu":"100m","memory":"512Mi"}}"#);
    assert_eq!(r, ir::Resources::default());
    let r = resources(r#"{"limits":{"cpu":"2","memory":"2G"}}"#);
    assert_eq!((r.cpus, r.memory), (Some(2.0), Some(2_000_000_000)));
}

#[test]
fn default_image_follows_the_eg_release() {
    assert_eq!(EG_RELEASE, "v1.9.0");
    assert_eq!(
        DEFAULT_IMAGE,
        "docker.io/envoyproxy/envoy:distroless-v1.39.0"
    );
    assert_eq!(default_image_tag(), "distroless-v1.39.0");
}

#[test]
fn concurrency_zero_is_passed_through_as_eg_does() {
    let p = parse_ir(&with_config(r#"{"spec":{"concurrency":0}}"#), &xds()).unwrap();
    assert_eq!(p[0].proxy.config.concurrency, Some(0));
}

fn extra(args: &str, spec_more: &str) -> Result<ir::EnvoyProxy, String> {
    parse_ir(
        &with_config(&format!(r#"{{"spec":{{"extraArgs":{args}{spec_more}}}}}"#)),
        &xds(),
    )
    .map(|p| p[0].proxy.config.clone())
    .map_err(|e| e.to_string())
}

#[test]
fn extra_args_that_eg_allows_win_over_berth_defaults() {
    // EG passes no --concurrency without spec.concurrency: the user's value is the one.
    let c = extra(r#"["--concurrency","4","--enable-core-dump"]"#, "").unwrap();
    assert_eq!(c.concurrency, Some(4));
    assert_eq!(c.extra_args, vec!["--enable-core-dump"]);
    let c = extra(r#"["--concurrency=3"]"#, "").unwrap();
    assert_eq!(c.concurrency, Some(3));
    assert!(c.extra_args.is_empty());
    // berth always passes --disable-hot-restart: a duplicate is dropped.
    let c = extra(r#"["--disable-hot-restart","-l","x"]"#, "");
    assert!(c.is_err());
    let c = extra(r#"["--disable-hot-restart"]"#, "").unwrap();
    assert!(c.extra_args.is_empty());
    // --component-log-level is the user's when logging names no component.
    let c = extra(r#"["--component-log-level","upstream:debug"]"#, "").unwrap();
    assert_eq!(
        c.extra_args,
        vec!["--component-log-level", "upstream:debug"]
    );
}

#[test]
fn extra_args_that_repeat_a_flag_eg_sets_are_refused_with_their_path() {
    for (args, more, at, needle) in [
        (
            r#"["--log-level","debug"]"#,
            "",
            0,
            "--log-level cannot be given here",
        ),
        (
            r#"["--foo","--drain-time-s=5"]"#,
            "",
            1,
            "--drain-time-s cannot",
        ),
        (
            r#"["--service-cluster","x"]"#,
            "",
            0,
            "--service-cluster cannot",
        ),
        (r#"["--cpuset-threads"]"#, "", 0, "--cpuset-threads cannot"),
        (r#"["--base-id","3"]"#, "", 0, "--disable-hot-restart"),
        (
            r#"["--concurrency","4"]"#,
            r#","concurrency":2"#,
            0,
            "repeats spec.concurrency",
        ),
        (r#"["--concurrency","four"]"#, "", 0, "needs a number"),
        (r#"["--concurrency"]"#, "", 0, "needs a value"),
        (
            r#"["--component-log-level","http:info"]"#,
            r#","logging":{"level":{"upstream":"debug"}}"#,
            0,
            "repeats spec.logging.level",
        ),
    ] {
        let e = extra(args, more).unwrap_err();
        let want = format!("proxy.config.spec.extraArgs[{at}]: ");
        assert!(e.starts_with(&want) && e.contains(needle), "{args}: {e}");
    }
}

#[test]
fn gateway_namespace_mode_serves_namespace_slash_name() {
    let p = parse_ir(
        &format!(
            r#"{{"proxy":{{"name":"gw","namespace":"team-a","metadata":{{"ownerReference":{{"kind":"Gateway","name":"gw"}}}},{LISTENER}}}}}"#
        ),
        &xds(),
    )
    .unwrap();
    assert_eq!(p[0].eg_name, "team-a/gw");
    assert_eq!(p[0].proxy.service_cluster(), "team-a/gw");
    assert_eq!(p[0].proxy.name, berth_name("team-a/gw"));
    // The usual mode: the name is the key.
    let p = parse_ir(
        &format!(
            r#"{{"proxy":{{"name":"ns/gw","namespace":"envoy-gateway-system","metadata":{{"ownerReference":{{"kind":"GatewayClass","name":"eg"}}}},{LISTENER}}}}}"#
        ),
        &xds(),
    )
    .unwrap();
    assert_eq!(p[0].proxy.service_cluster(), "ns/gw");
}

#[test]
fn shutdown_settings_are_eg_s() {
    let p = parse_ir(
        &with_config(
            r#"{"spec":{"shutdown":{"drainTimeout":"90s","minDrainDuration":"20s","healthCheckFailureDelay":"5s"}}}"#,
        ),
        &xds(),
    )
    .unwrap();
    let s = &p[0].proxy.config.shutdown;
    assert_eq!(s.drain_timeout, Duration::from_secs(90));
    assert_eq!(s.min_drain_duration, Duration::from_secs(20));
    assert_eq!(s.health_check_failure_delay, Duration::from_secs(5));
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
