//! Property tests of the config parser and the renderer (proptest).
//!
//! Generated berth.toml files mix well-formed values with hostile ones (newlines, quotes, YAML
//! and tera syntax, anchors, very long strings, dangling references, out-of-range numbers).
//! Required: the parser never panics; a rejected file gets positioned errors; every accepted
//! file renders, every rendered file is one YAML mapping; and a sample of the accepted files
//! passes the real `envoy --mode validate` (bootstrap with the watched resources inlined).

mod common;

use std::path::Path;
use std::process::Command;

use berth::core::render::{self, Renderer};
use berth::core::source::file;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};

const HOSTILE: &[&str] = &[
    "a\nb: c",
    "x: y",
    "{{ name }}",
    "{% raw %}",
    "# comment",
    "&anchor",
    "*alias",
    "'single'",
    "\"double\"",
    "---",
    "tab\there",
    "é-ünïcode",
    "back\\slash",
    "!!python/object",
    "",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        30 => "[a-z][a-z0-9-]{0,10}[a-z0-9]",
        1 => prop::sample::select(HOSTILE).prop_map(str::to_string),
        1 => Just("z".repeat(300)),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => "[ -~]{0,40}",
        2 => prop::sample::select(HOSTILE).prop_map(str::to_string),
        1 => Just("long ".repeat(2000)),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "/[a-z0-9/_.-]{0,20}",
        1 => prop::sample::select(HOSTILE).prop_map(|s| format!("/{s}")),
    ]
}

fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => (1u32..120).prop_map(|n| format!("{n}s")),
        4 => (1u32..900).prop_map(|n| format!("{n}ms")),
        1 => prop::sample::select(&["0s", "-1s", "5 parsecs", "", "1h30m", "25h"][..]).prop_map(str::to_string),
    ]
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[derive(Debug, Clone)]
struct Route {
    path: String,
    exact: bool,
    header: Option<(String, String)>,
    action: u8,
    target: String,
    body: String,
    timeout: Option<String>,
}

fn route() -> impl Strategy<Value = Route> {
    (
        path(),
        any::<bool>(),
        prop::option::of(("[a-z][a-z-]{0,8}", text())),
        0u8..4,
        word(),
        text(),
        prop::option::of(duration()),
    )
        .prop_map(
            |(path, exact, header, action, target, body, timeout)| Route {
                path,
                exact,
                header,
                action,
                target,
                body,
                timeout,
            },
        )
}

#[derive(Debug, Clone)]
struct Proxy {
    name: String,
    replicas: i64,
    memory: Option<String>,
    tcp: bool,
    port: i64,
    domains: Vec<String>,
    routes: Vec<Route>,
    backends: Vec<(String, String, u16)>,
}

fn proxy() -> impl Strategy<Value = Proxy> {
    (
        word(),
        prop_oneof![30 => 1i64..5, 1 => -2i64..100],
        prop::option::of(prop::sample::select(&["64Mi", "1Gi", "128Mi", "2Gi", "512M", "12", "lots"][..])),
        prop::bool::weighted(0.2),
        prop_oneof![30 => 20000i64..30000, 1 => -5i64..70000],
        prop::collection::vec(
            prop_oneof![16 => "[a-z]{1,8}\\.example\\.com", 4 => Just("*".to_string()), 1 => text()],
            1..3,
        ),
        prop::collection::vec(route(), 1..4),
        prop::collection::vec(
            (
                word(),
                prop_oneof![
                    8 => Just("127.0.0.1".to_string()),
                    8 => Just("localhost".to_string()),
                    1 => text()
                ],
                1u16..65535,
            ),
            1..3,
        ),
    )
        .prop_map(|(name, replicas, memory, tcp, port, domains, routes, backends)| Proxy {
            name,
            replicas,
            memory: memory.map(str::to_string),
            tcp,
            port,
            domains,
            routes,
            backends,
        })
}

fn config_text(proxies: &[Proxy]) -> String {
    let mut out = String::new();
    for p in proxies {
        out.push_str(&format!(
            "[[proxy]]\nname = {}\nimage = \"berth-test/envoy:1.40.0\"\nreplicas = {}\n",
            toml_str(&p.name),
            p.replicas
        ));
        if let Some(m) = &p.memory {
            out.push_str(&format!("[proxy.resources]\nmemory = {}\n", toml_str(m)));
        }
        let proto = if p.tcp { "tcp" } else { "http" };
        out.push_str(&format!(
            "[[proxy.listener]]\nname = \"l\"\nport = {}\nprotocol = \"{proto}\"\n",
            p.port
        ));
        if p.tcp {
            let backend = p
                .backends
                .first()
                .map(|b| b.0.clone())
                .unwrap_or("none".into());
            out.push_str(&format!("backend = {}\n", toml_str(&backend)));
        } else {
            let domains: Vec<String> = p.domains.iter().map(|d| toml_str(d)).collect();
            out.push_str(&format!(
                "[[proxy.listener.virtual_host]]\nname = \"vh\"\ndomains = [{}]\n",
                domains.join(", ")
            ));
            for r in &p.routes {
                out.push_str("[[proxy.listener.virtual_host.route]]\n");
                let key = if r.exact { "path" } else { "path_prefix" };
                out.push_str(&format!("{key} = {}\n", toml_str(&r.path)));
                if let Some((name, value)) = &r.header {
                    out.push_str(&format!(
                        "headers = {{ {} = {} }}\n",
                        toml_str(name),
                        toml_str(value)
                    ));
                }
                // Mostly a backend that exists; now and then a dangling (or hostile) name.
                let target = match p.backends.first() {
                    Some(b) if !r.target.starts_with('z') => b.0.clone(),
                    _ => r.target.clone(),
                };
                match r.action {
                    0 => out.push_str(&format!("backend = {}\n", toml_str(&target))),
                    1 => out.push_str(&format!(
                        "direct_response = {{ status = 200, body = {} }}\n",
                        toml_str(&r.body)
                    )),
                    2 => out.push_str(&format!(
                        "redirect = {{ path = {}, status = 302 }}\n",
                        toml_str(&r.path)
                    )),
                    _ => out.push_str(&format!(
                        "backends = [{{ name = {}, weight = 3 }}]\n",
                        toml_str(&target)
                    )),
                }
                if let Some(t) = &r.timeout {
                    out.push_str(&format!("timeout = {}\n", toml_str(t)));
                }
            }
        }
        for (name, host, port) in &p.backends {
            out.push_str(&format!(
                "[[proxy.backend]]\nname = {}\nendpoints = [{}]\n",
                toml_str(name),
                toml_str(&format!("{host}:{port}"))
            ));
        }
    }
    out
}

/// Parses and renders; returns the validation bootstraps of an accepted config.
fn check(text: &str) -> Result<Option<Vec<String>>, TestCaseError> {
    let path = Path::new("fuzz.toml");
    let config = match file::parse(path, text) {
        Ok(config) => config,
        Err(errors) => {
            prop_assert!(!errors.0.is_empty());
            for e in &errors.0 {
                prop_assert!(e.line >= 1 && e.column >= 1, "unpositioned error {e:?}");
                prop_assert!(!e.message.is_empty() && !e.field.is_empty());
            }
            return Ok(None);
        }
    };
    let renderer = Renderer::builtin();
    let mut bootstraps = Vec::new();
    for proxy in &config.infra.proxies {
        let rendered = renderer.render(proxy).map_err(|e| {
            TestCaseError::fail(format!("accepted config does not render: {e:#}\n{text}"))
        })?;
        for content in std::iter::once(&rendered.bootstrap).chain(rendered.xds.values()) {
            let doc: serde_yaml::Value = serde_yaml::from_str(content)
                .map_err(|e| TestCaseError::fail(format!("rendered YAML does not parse: {e}")))?;
            prop_assert!(doc.is_mapping());
        }
        bootstraps.push(
            render::validation_bootstrap(&rendered)
                .map_err(|e| TestCaseError::fail(format!("{e:#}")))?,
        );
    }
    Ok(Some(bootstraps))
}

fn runner(cases: u32, seed: u8) -> TestRunner {
    TestRunner::new_with_rng(
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}

#[test]
fn generated_configs_never_panic_and_accepted_ones_render() {
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    runner(400, 7)
        .run(&prop::collection::vec(proxy(), 1..3), |proxies| {
            if check(&config_text(&proxies))?.is_some() {
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        })
        .unwrap();
    // The generator must exercise both sides, or the property says little.
    let accepted = accepted.into_inner();
    eprintln!("{accepted} of 400 generated configs accepted");
    assert!(
        accepted >= 40,
        "only {accepted} of 400 generated configs were accepted"
    );
    assert!(
        accepted <= 360,
        "{accepted} of 400 accepted: the hostile values are not biting"
    );
}

#[test]
fn mangled_bytes_never_panic() {
    let base =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/multi.toml"))
            .unwrap();
    runner(300, 11)
        .run(
            &(0..base.len(), any::<u8>(), 1usize..4),
            |(at, byte, times)| {
                let mut bytes = base.clone().into_bytes();
                for i in 0..times {
                    let pos = (at + i * 37) % bytes.len();
                    bytes[pos] = byte;
                }
                if let Ok(text) = String::from_utf8(bytes) {
                    check(&text)?;
                }
                Ok(())
            },
        )
        .unwrap();
}

/// The hostile values (of [`HOSTILE`]) that a rendered YAML file carries in its strings.
fn hostile_in(yaml: &str) -> Vec<&'static str> {
    fn strings(v: &serde_yaml::Value, out: &mut Vec<String>) {
        match v {
            serde_yaml::Value::String(s) => out.push(s.clone()),
            serde_yaml::Value::Mapping(m) => m.iter().for_each(|(k, v)| {
                strings(k, out);
                strings(v, out);
            }),
            serde_yaml::Value::Sequence(items) => items.iter().for_each(|i| strings(i, out)),
            serde_yaml::Value::Tagged(t) => strings(&t.value, out),
            _ => {}
        }
    }
    let mut all = Vec::new();
    strings(&serde_yaml::from_str(yaml).unwrap(), &mut all);
    HOSTILE
        .iter()
        .copied()
        .filter(|h| !h.is_empty() && all.iter().any(|s| s.contains(h)))
        .collect()
}

#[test]
fn a_sample_of_accepted_configs_passes_real_envoy_validate() {
    // Accepted configs whose rendered files carry hostile values (each one a value more), and
    // a few plain ones.
    let (mut hostile, mut plain): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let mut values = std::collections::BTreeSet::new();
    let mut rng_runner = runner(3000, 23);
    let strategy = prop::collection::vec(proxy(), 1..2);
    for _ in 0..3000 {
        if hostile.len() >= 10 && plain.len() >= 2 {
            break;
        }
        let tree = strategy.new_tree(&mut rng_runner).unwrap();
        let text = config_text(&tree.current());
        let bootstraps = match check(&text) {
            Ok(Some(bootstraps)) => bootstraps,
            Ok(None) => continue,
            Err(e) => panic!("a property failed: {e}\n{text}"),
        };
        for b in bootstraps {
            let found = hostile_in(&b);
            // Each hostile sample brings a value the others lack.
            if found.iter().any(|h| !values.contains(h)) && hostile.len() < 10 {
                values.extend(found);
                hostile.push(b);
            } else if found.is_empty() && plain.len() < 2 {
                plain.push(b);
            }
        }
    }
    eprintln!(
        "validating {} bootstraps with hostile values {values:?} and {} plain ones",
        hostile.len(),
        plain.len()
    );
    assert!(
        hostile.len() >= 6,
        "too few accepted configs with hostile values to sample: {} ({values:?})",
        hostile.len()
    );
    let sample: Vec<String> = hostile.into_iter().chain(plain).collect();
    let image = common::ensure_test_image();
    let dir = common::short_tempdir();
    for (i, bootstrap) in sample.iter().enumerate() {
        let file = dir.path().join(format!("b{i}.yaml"));
        std::fs::write(&file, bootstrap).unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
    }
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for (i, bootstrap) in sample.iter().enumerate() {
        let out = Command::new("docker")
            .args([
                "run",
                "--rm",
                "--network",
                "none",
                "--label",
                "io.berth.test=1",
            ])
            .arg("-v")
            .arg(format!("{}:/cfg:ro", dir.path().display()))
            .args([
                image,
                "--mode",
                "validate",
                "-c",
                &format!("/cfg/b{i}.yaml"),
            ])
            .output()
            .expect("running docker");
        assert!(
            out.status.success(),
            "envoy rejected an accepted config:\n{}\n{}",
            bootstrap,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
