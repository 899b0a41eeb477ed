//! Acceptance corpus: Envoy Gateway's own inputs (tests/eg_corpus/README.md says where they come
//! from). Each is accepted, or refused with a reason that is outside what one host can realize;
//! every accepted proxy renders a bootstrap that keeps `xds_cluster` and berth's admin socket,
//! and replica arguments and limits that match what EG gives its Deployment:
//!
//! - `--service-cluster` is EG's IR key (`<namespace>/<name>` in gateway-namespace mode);
//! - `--log-level` is `logging.level.default` (EG's default: warn);
//! - `--drain-time-s` is `shutdown.drainTimeout` (default 60), whole seconds;
//! - `--concurrency` is `spec.concurrency` when set;
//! - extra arguments come last, as given;
//! - the memory limit is `resources.limits.memory` and nothing else (requests never cap), the
//!   heap cap 80% of it; the CPU quota is `resources.limits.cpu`.
//!
//! `envoy --mode validate` on these bootstraps is tests/eg_corpus_envoy.rs (needs Docker).

use std::path::{Path, PathBuf};

use berth::core::render::Renderer;
use berth::core::replica;
use berth::core::source::eg::{self, EgProxy, XdsDefaults};
use serde_json::Value;

pub fn xds() -> XdsDefaults {
    XdsDefaults {
        address: "127.0.0.1".into(),
        port: eg::DEFAULT_XDS_PORT,
        ca_file: "/etc/berth/eg/ca.pem".into(),
        cert_file: "/etc/berth/eg/cert.pem".into(),
        key_file: "/etc/berth/eg/key.pem".into(),
    }
}

fn corpus(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/eg_corpus")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// A docs EnvoyProxy example as the IR of a Gateway with one HTTP listener.
fn ir_of_example(envoy_proxy: &str) -> String {
    let config: Value = serde_yaml::from_str(envoy_proxy).unwrap();
    serde_json::json!({"proxy": {
        "name": "default/eg",
        "namespace": "envoy-gateway-system",
        "metadata": {"ownerReference": {"kind": "GatewayClass", "name": "eg"}},
        "config": config,
        "listeners": [{"name": "default/eg/http", "ports": [
            {"name": "http-8080", "protocol": "HTTP", "servicePort": 8080, "containerPort": 8080}]}]
    }})
    .to_string()
}

/// The EnvoyProxy spec of one IR proxy in its raw form (for the expectations).
fn raw_spec(text: &str, eg_name: &str) -> Value {
    let doc: Value = serde_yaml::from_str(text).unwrap();
    let proxy = match doc.get("infraIR") {
        Some(map) => map
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["proxy"].clone())
            .find(|p| {
                let key = eg::ir_key(
                    p["name"].as_str().unwrap_or_default(),
                    p["namespace"].as_str().unwrap_or_default(),
                    p.pointer("/metadata/ownerReference/kind")
                        .and_then(Value::as_str),
                );
                key == eg_name
            })
            .unwrap(),
        None => doc["proxy"].clone(),
    };
    proxy
        .pointer("/config/spec")
        .cloned()
        .unwrap_or(Value::Null)
}

fn quantity(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => eg::parse_quantity(s).ok(),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(String::as_str)
}

/// Checks one accepted proxy against EG's Deployment; returns its bootstrap, or why berth
/// refuses to render it.
pub fn check_proxy(file: &Path, text: &str, p: &EgProxy) -> Result<String, String> {
    let what = format!("{} ({})", file.display(), p.eg_name);
    let rendered = Renderer::builtin()
        .render(&p.proxy)
        .map_err(|e| format!("{e:#}"))?;
    let boot: Value = serde_yaml::from_str(&rendered.bootstrap).unwrap();
    assert_eq!(
        boot.pointer("/admin/address/pipe/path")
            .and_then(Value::as_str),
        Some(berth::core::layout::CONTAINER_ADMIN_SOCKET),
        "{what}: berth's admin socket"
    );
    let clusters = boot
        .pointer("/static_resources/clusters")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{what}: no static clusters"));
    assert!(
        clusters.iter().any(|c| c["name"] == "xds_cluster"),
        "{what}: xds_cluster kept"
    );

    let desired = replica::desired_proxy(&p.proxy, &rendered.bootstrap, Path::new("/s"), 4);
    let args = &desired.spec.args;
    let spec = raw_spec(text, &p.eg_name);
    assert_eq!(
        flag(args, "--service-cluster"),
        Some(p.eg_name.as_str()),
        "{what}"
    );
    let level = spec
        .pointer("/logging/level/default")
        .and_then(Value::as_str)
        .unwrap_or("warn");
    assert_eq!(flag(args, "--log-level"), Some(level), "{what}");
    let drain = spec
        .pointer("/shutdown/drainTimeout")
        .and_then(Value::as_str)
        .map(|d| eg::parse_go_duration(d).unwrap().as_secs_f64().ceil() as u64)
        .unwrap_or(60);
    assert_eq!(
        flag(args, "--drain-time-s"),
        Some(drain.to_string().as_str()),
        "{what}"
    );
    if let Some(n) = spec.get("concurrency").and_then(Value::as_i64) {
        assert_eq!(
            flag(args, "--concurrency"),
            Some(n.to_string().as_str()),
            "{what}"
        );
    }
    let extra: Vec<String> = spec
        .get("extraArgs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if !extra.is_empty() && !extra.iter().any(|a| a.starts_with("--concurrency")) {
        assert!(args.ends_with(&extra), "{what}: extra args last: {args:?}");
    }
    let container = spec
        .pointer("/provider/kubernetes/envoyDeployment/container")
        .or_else(|| spec.pointer("/provider/kubernetes/envoyDaemonSet/container"))
        .cloned()
        .unwrap_or(Value::Null);
    let limit = |k: &str| {
        container
            .pointer(&format!("/resources/limits/{k}"))
            .and_then(quantity)
    };
    assert_eq!(
        desired.spec.memory,
        limit("memory").map(|m| m.ceil() as i64),
        "{what}: memory limit from limits only"
    );
    assert_eq!(
        desired.spec.nano_cpus,
        limit("cpu").map(|c| (c * 1e9).round() as i64),
        "{what}: CPU quota from limits only"
    );
    let heap = boot
        .pointer("/overload_manager/resource_monitors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|m| {
            m.pointer("/typed_config/max_heap_size_bytes")
                .and_then(Value::as_u64)
        });
    assert_eq!(
        heap,
        limit("memory").map(|m| (m * 0.8) as u64),
        "{what}: heap cap at 80% of the memory limit"
    );
    Ok(rendered.bootstrap)
}

/// Every corpus input: (file, its text as IR, berth's result).
pub fn results() -> Vec<(PathBuf, String, Result<Vec<EgProxy>, String>)> {
    let mut out = Vec::new();
    for file in corpus("gatewayapi") {
        let text = std::fs::read_to_string(&file).unwrap();
        let r = eg::parse_ir(&text, &xds()).map_err(|e| e.to_string());
        out.push((file, text, r));
    }
    for file in corpus("docs") {
        let text = ir_of_example(&std::fs::read_to_string(&file).unwrap());
        let r = eg::parse_ir(&text, &xds()).map_err(|e| e.to_string());
        out.push((file, text, r));
    }
    out
}

/// Why berth may refuse an input: a reason one host cannot realize, or one EG refuses too.
const LEGITIMATE: &[&str] = &[
    // EG's own validation refuses these too (CEL / BuildProxyArgs would make Envoy exit).
    "cannot be given here",
    "repeats spec.",
    // A TCP admin address: N replicas share one host, and berth's admin is a Unix socket.
    "admin listens on its Unix socket",
];

#[test]
fn every_input_is_accepted_or_refused_for_a_legitimate_reason() {
    let (mut accepted, mut refused, mut proxies, mut empty) = (0, 0, 0, 0);
    let mut bootstraps = std::collections::BTreeSet::new();
    let refuse = |file: &Path, e: &str| {
        eprintln!("CORPUS refused {}: {e}", file.display());
        assert!(
            LEGITIMATE.iter().any(|r| e.contains(r)),
            "{}: refused for a reason berth should not have: {e}",
            file.display()
        );
    };
    for (file, text, result) in results() {
        let ps = match result {
            Ok(ps) => ps,
            Err(e) => {
                refused += 1;
                refuse(&file, &e);
                continue;
            }
        };
        let mut ok = true;
        for p in ps {
            if p.is_empty() {
                empty += 1;
                continue;
            }
            match check_proxy(&file, &text, &p) {
                Ok(b) => {
                    proxies += 1;
                    bootstraps.insert(b);
                }
                Err(e) => {
                    ok = false;
                    refuse(&file, &e);
                }
            }
        }
        if ok {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    eprintln!(
        "CORPUS: {accepted} inputs accepted ({proxies} proxies checked against EG's Deployment, \
         {empty} without listeners skipped as EG skips them, {} distinct bootstraps), {refused} \
         refused",
        bootstraps.len()
    );
    assert!(accepted >= 200, "the corpus is there");
}
