//! Build-time code generation, all of it from protos compiled by `protox` (pure Rust), so
//! building berth needs no `protoc`:
//!
//! - the Envoy Gateway remote-infrastructure gRPC code from `proto/remoteinfra/service.proto`
//!   (and the tests' echo service from `tests/proto/echo.proto`);
//! - the descriptors of Envoy's `envoy.config.bootstrap.v3.Bootstrap` and every message it
//!   reaches, from the Envoy API protos vendored in `proto/envoy-api/` (from the `envoy-types`
//!   crate: scripts/vendor-envoy-protos.sh). berth merges a user's bootstrap into its own with
//!   protobuf semantics ([`core::render::overrides`]), which needs to know which fields are lists,
//!   maps, oneofs and well-known types.
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
    let descriptors = protox::compile([proto, test_proto], ["proto", "tests/proto"])?;
    tonic_prost_build::configure()
        .build_client(true) // tests and `berth` tooling dial the service too
        .build_server(true)
        .compile_fds(descriptors)?;

    let envoy_api = "proto/envoy-api";
    println!("cargo:rerun-if-changed={envoy_api}");
    let includes =
        ["data-plane-api", "xds", "protoc-gen-validate"].map(|d| format!("{envoy_api}/{d}"));
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
