//! Golden-file tests for `render`: every directory under `tests/golden/` (except `certs`) holds
//! an `ir.json` (one serialized `ir::ProxyInfra`) and the files berth must render from it:
//! `bootstrap.yaml`, the watched-directory files (`lds.yaml`, `rds-<listener>.yaml`, `cds.yaml` in
//! standalone mode, the SDS secrets in xds mode) and `validation-bootstrap.yaml` (what
//! `render::validation_bootstrap` makes of them).
//!
//! To regenerate the expected files after an intended change, run
//!
//! ```sh
//! BERTH_BLESS=1 cargo test --test render_golden
//! ```
//!
//! and review the diff.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use berth::core::ir::ProxyInfra;
use berth::core::render::{self, Renderer};

pub const VALIDATION_BOOTSTRAP_FILE: &str = "validation-bootstrap.yaml";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("ir.json").is_file())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 6,
        "expected the golden cases, found {cases:?}"
    );
    cases
}

fn rendered_files(case: &Path) -> BTreeMap<String, String> {
    let ir = std::fs::read_to_string(case.join("ir.json")).unwrap();
    let proxy: ProxyInfra =
        serde_json::from_str(&ir).unwrap_or_else(|e| panic!("{}: ir.json: {e}", case.display()));
    let rendered = Renderer::builtin()
        .render(&proxy)
        .unwrap_or_else(|e| panic!("{}: render: {e:#}", case.display()));
    let mut files = rendered.xds.clone();
    files.insert("bootstrap.yaml".into(), rendered.bootstrap.clone());
    files.insert(
        VALIDATION_BOOTSTRAP_FILE.into(),
        render::validation_bootstrap(&rendered).unwrap(),
    );
    files
}

#[test]
fn golden() {
    let bless = bless();
    let mut failures = vec![];
    for case in cases() {
        let files = rendered_files(&case);
        let on_disk: Vec<String> = std::fs::read_dir(&case)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "ir.json")
            .collect();
        if bless {
            for stale in on_disk.iter().filter(|n| !files.contains_key(*n)) {
                std::fs::remove_file(case.join(stale)).unwrap();
            }
            for (name, text) in &files {
                std::fs::write(case.join(name), text).unwrap();
            }
            continue;
        }
        for stale in on_disk.iter().filter(|n| !files.contains_key(*n)) {
            failures.push(format!("{}: {stale} is no longer rendered", case.display()));
        }
        for (name, text) in &files {
            match std::fs::read_to_string(case.join(name)) {
                Ok(expected) if &expected == text => {}
                Ok(expected) => failures.push(format!(
                    "{}/{name} differs from what render produces:\n{}",
                    case.display(),
                    first_difference(&expected, text)
                )),
                Err(_) => failures.push(format!("{}/{name} is missing", case.display())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\n(if the change is intended: BERTH_BLESS=1 cargo test --test render_golden)",
        failures.join("\n")
    );
}

fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<_>, Vec<_>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        if e.get(i) != a.get(i) {
            return format!(
                "  line {}:\n  expected: {}\n  actual:   {}",
                i + 1,
                e.get(i).unwrap_or(&"<end of file>"),
                a.get(i).unwrap_or(&"<end of file>")
            );
        }
    }
    "  (trailing whitespace)".into()
}

/// Every rendered file is a YAML mapping, and the resource files are DiscoveryResponse-shaped.
#[test]
fn rendered_files_are_yaml_documents() {
    for case in cases() {
        for (name, text) in rendered_files(&case) {
            let v: serde_yaml::Value = serde_yaml::from_str(&text)
                .unwrap_or_else(|e| panic!("{}/{name}: {e}", case.display()));
            assert!(v.is_mapping(), "{}/{name}", case.display());
            if name != "bootstrap.yaml" && name != VALIDATION_BOOTSTRAP_FILE {
                assert!(
                    v.get("resources").is_some_and(|r| r.is_sequence()),
                    "{}/{name}: no resources list",
                    case.display()
                );
            }
        }
    }
}

/// The bootstrap carries nothing replica-specific: the node id comes from --service-node.
#[test]
fn bootstrap_has_no_node_id() {
    for case in cases() {
        let files = rendered_files(&case);
        let v: serde_yaml::Value = serde_yaml::from_str(&files["bootstrap.yaml"]).unwrap();
        assert!(
            v.get("node").and_then(|n| n.get("id")).is_none(),
            "{}: bootstrap sets node.id",
            case.display()
        );
    }
}

/// Every example config's proxies are golden cases too: `tests/golden/example-<file>-<proxy>/
/// ir.json` is what the TOML source makes of the example (repository paths shown as `<repo>`),
/// so the golden and real-Envoy tests above cover the examples through the parser.
#[test]
fn examples_are_golden_cases() {
    let bless = bless();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root.join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 4, "{examples:?}");
    let mut failures = vec![];
    for example in examples {
        let config = berth::core::source::file::load(&example)
            .unwrap_or_else(|e| panic!("{}: {e}", example.display()));
        let stem = example.file_stem().unwrap().to_string_lossy().into_owned();
        for proxy in &config.infra.proxies {
            let json = serde_json::to_string_pretty(proxy)
                .unwrap()
                .replace(&root.display().to_string(), "<repo>");
            let case = golden_dir().join(format!("example-{stem}-{}", proxy.name));
            let path = case.join("ir.json");
            if bless {
                std::fs::create_dir_all(&case).unwrap();
                std::fs::write(&path, format!("{json}\n")).unwrap();
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(&format!("{json}\n")) {
                failures.push(format!(
                    "{} no longer parses into {}",
                    example.display(),
                    path.display()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\n(if the change is intended: BERTH_BLESS=1 cargo test --test render_golden)",
        failures.join("\n")
    );
}

/// `BERTH_BLESS=1` rewrites the expected files; unset, empty or `0` compares (the same rule in
/// every golden test file).
fn bless() -> bool {
    std::env::var_os("BERTH_BLESS").is_some_and(|v| !v.is_empty() && v != "0")
}
