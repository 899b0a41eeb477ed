//! The Envoy API protos vendored in `proto/envoy-api/` (build.rs compiles the bootstrap's
//! descriptors from them) are byte for byte those of the `envoy-types` version in Cargo.lock,
//! the crate whose generated types the tests' xDS server uses: after bumping envoy-types, run
//! `scripts/vendor-envoy-protos.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// envoy-types' `proto/` directory, through `cargo metadata` (the package is downloaded: this
/// test depends on it).
fn envoy_types_protos() -> PathBuf {
    // Offline, the host's packages are there; another platform's (android_system_properties…)
    // may never have been downloaded.
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host_triple()])
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let manifest = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("cargo metadata lists envoy-types");
    Path::new(manifest).parent().unwrap().join("proto")
}

/// The host's target triple, as rustc names it.
fn host_triple() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("running rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

fn protos(dir: &Path, under: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            protos(&path, under, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path.strip_prefix(under).unwrap().to_path_buf());
        }
    }
}

#[test]
fn vendored_envoy_protos_are_those_of_envoy_types() {
    let vendored = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/envoy-api");
    let upstream = envoy_types_protos();
    let mut files = Vec::new();
    protos(&vendored, &vendored, &mut files);
    assert!(
        files.len() > 50,
        "only {} protos in {}",
        files.len(),
        vendored.display()
    );
    let mut differ = Vec::new();
    for f in &files {
        let ours = std::fs::read(vendored.join(f)).unwrap();
        match std::fs::read(upstream.join(f)) {
            Ok(theirs) if theirs == ours => {}
            Ok(_) => differ.push(format!("{} differs", f.display())),
            Err(e) => differ.push(format!("{}: not in envoy-types ({e})", f.display())),
        }
    }
    assert!(
        differ.is_empty(),
        "proto/envoy-api is not envoy-types' ({}): {}; run scripts/vendor-envoy-protos.sh",
        upstream.display(),
        differ.join(", ")
    );
    // And nothing the bootstrap imports is missing (build.rs would fail to compile it anyway).
    for f in &files {
        let text = std::fs::read_to_string(vendored.join(f)).unwrap();
        for line in text.lines() {
            let Some(import) = line.strip_prefix("import ").map(|l| {
                l.trim_start_matches("public ")
                    .trim_matches(|c| c == '"' || c == ';')
            }) else {
                continue;
            };
            if import.starts_with("google/protobuf/") {
                continue;
            }
            let root = f.components().next().unwrap();
            let found = ["data-plane-api", "xds", "protoc-gen-validate"]
                .iter()
                .any(|r| vendored.join(r).join(import).is_file());
            assert!(
                found,
                "{} (under {root:?}) imports {import}, which is not vendored",
                f.display()
            );
        }
    }
}
