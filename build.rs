//! Build-time code generation, all of it from protos compiled by `protox` (pure Rust), so
//! building berth needs no `protoc`:
//!
//! - the Envoy Gateway remote-infrastructure gRPC code from `proto/remoteinfra/service.proto`
//!   (and the tests' echo service from `tests/proto/echo.proto`);
//! - the descriptors of Envoy's `envoy.config.bootstrap.v3.Bootstrap` and every message it
//!   reaches, from the data-plane-api protos that the `envoy-types` crate ships. berth merges a
//!   user's bootstrap into its own with protobuf semantics ([`render::overrides`]), which needs
//!   to know which fields are lists, maps, oneofs and well-known types.
//!
//! It also records the git commit berth is built from (`BERTH_GIT_COMMIT`, for `berth
//! version`): the environment's `BERTH_GIT_COMMIT` when set (builds from a tarball), else
//! `git rev-parse`, else "unknown".

use std::path::PathBuf;
use std::process::Command;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/remoteinfra/service.proto";
    // The backend tests' gRPC echo service (generated beside it, included only by tests).
    let test_proto = "tests/proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed={test_proto}");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let descriptors = protox::compile([proto, test_proto], ["proto", "tests/proto"])?;
    tonic_prost_build::configure()
        .build_client(true) // tests and `berth` tooling dial the service too
        .build_server(true)
        .compile_fds(descriptors)?;

    let root = envoy_types_protos()?;
    let includes: Vec<PathBuf> = std::fs::read_dir(&root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    let bootstrap = protox::compile(["envoy/config/bootstrap/v3/bootstrap.proto"], &includes)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy_bootstrap_descriptors.bin");
    std::fs::write(out, bootstrap.encode_to_vec())?;
    git_commit();
    Ok(())
}

/// Sets `BERTH_GIT_COMMIT` for the crate and reruns when HEAD moves.
fn git_commit() {
    println!("cargo:rerun-if-env-changed=BERTH_GIT_COMMIT");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !s.is_empty()).then_some(s)
    };
    let commit = std::env::var("BERTH_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            // HEAD, and the branch file it points at (a commit moves the branch, not HEAD).
            // Only existing files: a missing one would rerun this script on every build.
            let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])?];
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watched.push(git(&["rev-parse", "--git-path", &branch])?);
            }
            watched.push(git(&["rev-parse", "--git-path", "packed-refs"])?);
            for path in watched {
                if std::path::Path::new(&path).exists() {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=BERTH_GIT_COMMIT={commit}");
}

/// The `proto/` directory of the `envoy-types` package berth depends on, found through
/// `cargo metadata` (offline first: the package is downloaded before build scripts run).
fn envoy_types_protos() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO")?;
    let dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let target = std::env::var("TARGET")?;
    let mut last_error = String::new();
    for offline in [true, false] {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(&dir).args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ]);
        if offline {
            cmd.arg("--offline");
        }
        let out = cmd.output()?;
        if !out.status.success() {
            last_error = String::from_utf8_lossy(&out.stderr).into_owned();
            continue;
        }
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let manifest = meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "envoy-types")
            .and_then(|p| p["manifest_path"].as_str())
            .ok_or("cargo metadata lists no envoy-types package")?;
        let protos = PathBuf::from(manifest)
            .parent()
            .ok_or("envoy-types has no package directory")?
            .join("proto");
        println!("cargo:rerun-if-changed={}", protos.display());
        return Ok(protos);
    }
    Err(format!("cargo metadata failed: {last_error}").into())
}
