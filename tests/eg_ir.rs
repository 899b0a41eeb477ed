//! Golden tests for Envoy Gateway infra IR → berth IR.
//!
//! Each directory under `tests/golden_eg/` holds `ir.yaml` or `ir.json` in the shape Envoy
//! Gateway prints it and `expected.json`, the serde JSON of the resulting `Vec<EgProxy>`.
//! `BERTH_BLESS=1 cargo test --test eg_ir` rewrites the expected files.

use std::path::{Path, PathBuf};

use berth::core::source::eg::{self, XdsDefaults};

fn xds() -> XdsDefaults {
    XdsDefaults {
        address: "envoy-gateway.example.internal".into(),
        port: eg::DEFAULT_XDS_PORT,
        ca_file: "/etc/berth/eg/ca.crt".into(),
        cert_file: "/etc/berth/eg/tls.crt".into(),
        key_file: "/etc/berth/eg/tls.key".into(),
    }
}

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_eg");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 5,
        "golden cases missing under {}",
        root.display()
    );
    dirs
}

fn input(dir: &Path) -> String {
    for name in ["ir.yaml", "ir.json"] {
        if let Ok(text) = std::fs::read_to_string(dir.join(name)) {
            return text;
        }
    }
    panic!("{}: no ir.yaml or ir.json", dir.display());
}

#[test]
fn golden() {
    let bless = bless();
    let mut failed = Vec::new();
    for dir in cases() {
        let proxies =
            eg::parse_ir(&input(&dir), &xds()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let got = serde_json::to_string_pretty(&proxies).unwrap() + "\n";
        let expected_path = dir.join("expected.json");
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != want {
            eprintln!("--- {} differs; got:\n{got}", expected_path.display());
            failed.push(dir.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(
        failed.is_empty(),
        "golden mismatch in {failed:?}; run with BERTH_BLESS=1 to accept"
    );
}

#[test]
fn egctl_output_maps_replicas_and_env_and_requests_cap_nothing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_eg/egctl-envoyproxy-valid");
    let p = eg::parse_ir(&input(&dir), &xds()).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].eg_name, "envoy-gateway/gateway-1");
    let c = &p[0].proxy.config;
    assert_eq!(c.replicas, 2);
    assert_eq!(c.image, "envoyproxy/envoy:distroless-dev");
    assert_eq!(c.env["env_a"], "env_a_value");
    // Its container asks for requests (100m, 512Mi) and sets no limits: nothing is capped,
    // as in EG's Deployment.
    assert_eq!(c.resources.cpus, None);
    assert_eq!(c.resources.memory, None);
    assert_eq!(p[0].proxy.listeners[0].name, "envoy-gateway/gateway-1/http");
    assert_eq!(p[0].proxy.host_ports(), vec![10080]);
}

#[test]
fn full_envoyproxy_maps_every_honoured_field() {
    use berth::core::ir::{BootstrapOverrideKind, LogLevel};
    use std::time::Duration;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_eg/full-envoyproxy");
    let p = eg::parse_ir(&input(&dir), &xds()).unwrap();
    let c = &p[0].proxy.config;
    assert_eq!(c.replicas, 4);
    assert_eq!(c.resources.cpus, Some(1.5));
    assert_eq!(c.resources.memory, Some(1_000_000_000));
    assert_eq!(c.concurrency, Some(2));
    assert_eq!(c.extra_args.len(), 2);
    assert_eq!(c.logging.default_level(), LogLevel::Info);
    assert_eq!(c.logging.level["upstream"], LogLevel::Debug);
    assert_eq!(c.shutdown.drain_timeout, Duration::from_secs(90));
    assert_eq!(c.shutdown.min_drain_duration, Duration::from_secs(5));
    let b = c.bootstrap.as_ref().unwrap();
    assert_eq!(b.kind, BootstrapOverrideKind::Merge);
    assert!(b.value.starts_with("stats_flush_interval: 10s"));
    // valueFrom cannot be resolved off Kubernetes: skipped.
    assert!(!c.env.contains_key("POD_IP"));
    assert_eq!(p[0].proxy.addresses, vec!["192.0.2.10"]);
    assert_eq!(p[0].proxy.name, "edge-public");
}

#[test]
fn no_listeners_parses_but_is_empty() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden_eg/no-listeners");
    let p = eg::parse_ir(&input(&dir), &xds()).unwrap();
    assert!(p[0].is_empty());
    for dir in cases().into_iter().filter(|d| !d.ends_with("no-listeners")) {
        let p = eg::parse_ir(&input(&dir), &xds()).unwrap();
        assert!(p.iter().all(|p| !p.is_empty()), "{}", dir.display());
    }
}

/// `BERTH_BLESS=1` rewrites the expected files; unset, empty or `0` compares (the same rule in
/// every golden test file).
fn bless() -> bool {
    std::env::var_os("BERTH_BLESS").is_some_and(|v| !v.is_empty() && v != "0")
}
