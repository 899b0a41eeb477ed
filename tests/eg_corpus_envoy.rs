//! The real Envoy on the acceptance corpus (tests/eg_corpus.rs): every accepted proxy's
//! bootstrap passes `envoy --mode validate`, run as berth runs it before a rollout (the
//! validation bootstrap, the replica's own arguments from `replica::validation_args`, the files
//! laid out and mounted where a replica finds them, read-only root, no capabilities, no
//! network).
//!
//! The corpus has hundreds of proxies but far fewer distinct bootstraps: each distinct
//! (bootstrap, arguments) pair is validated once, the `--service-cluster` value left out of the
//! key (it is a name Envoy does not check; the first proxy's real arguments are used), several
//! at a time. The image is the test image of Envoy 1.39 (EG v1.9.0 runs 1.39.0), not the one
//! an input names (no registry here). Needs Docker (`scripts/test-images.sh`).

mod common;
#[path = "eg_corpus.rs"]
#[allow(dead_code)]
mod corpus;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use berth::core::layout;
use berth::core::render::{self, Renderer};
use berth::core::replica;

const IMAGE: &str = "berth-test/envoy:1.39.3";
/// Validations at a time.
const PARALLEL: usize = 4;

struct Case {
    what: String,
    /// How many corpus proxies it stands for.
    proxies: usize,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The files as a replica sees them, the bootstrap being the validation bootstrap (as berth's
/// validation step writes it).
fn lay_out(
    validation_bootstrap: &str,
    xds: &BTreeMap<String, String>,
    tls: &(String, String),
) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    };
    write(
        &format!("bootstrap/{}", layout::BOOTSTRAP_FILE),
        validation_bootstrap,
    );
    for (name, text) in xds {
        write(&format!("xds/{name}"), text);
    }
    std::fs::create_dir_all(root.join("xds")).unwrap();
    std::fs::create_dir_all(root.join("run")).unwrap();
    write("tls/xds/cert.pem", &tls.0);
    write("tls/xds/key.pem", &tls.1);
    write("tls/xds/ca.pem", &tls.0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            set_mode(&p, 0o755);
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            set_mode(&p, 0o644);
        }
    }
    set_mode(&root.join("run"), 0o777);
    tmp
}

fn validate(case: &Case, label: &str) -> Result<(), String> {
    let dir = case.dir.path();
    let mount = |host: &str, container: &str, ro: bool| {
        format!(
            "{}:{container}{}",
            dir.join(host).display(),
            if ro { ":ro" } else { "" }
        )
    };
    let out = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--label",
            "io.berth.test=1",
            "--label",
            label,
        ])
        .args(["--network", "none", "--read-only", "--cap-drop", "ALL"])
        .args(["--security-opt", "no-new-privileges", "--user", "101:101"])
        .args([
            "-v",
            &mount("bootstrap", layout::CONTAINER_BOOTSTRAP_DIR, true),
        ])
        .args(["-v", &mount("xds", layout::CONTAINER_XDS_DIR, true)])
        .args(["-v", &mount("tls", layout::CONTAINER_TLS_DIR, true)])
        .args(["-v", &mount("run", layout::CONTAINER_RUN_DIR, false)])
        .arg(IMAGE)
        .args(["--mode", "validate"])
        .args(&case.args)
        .output()
        .expect("running docker");
    if out.status.success() {
        return Ok(());
    }
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = log.lines().collect();
    Err(format!(
        "{} (args {:?}): envoy --mode validate failed:\n{}",
        case.what,
        case.args,
        lines[lines.len().saturating_sub(8)..].join("\n")
    ))
}

#[test]
fn envoy_validates_every_accepted_corpus_bootstrap() {
    common::fleet::ensure_images();
    let cleanup = common::Cleanup::new("eg-corpus-envoy");
    let label = format!("{}={}", common::LABEL_TEST_CASE, cleanup.case);
    // A self-signed pair for the xDS client files every bootstrap reads through SDS.
    let tls = common::tls::pair(1, 2025, 2035);
    let renderer = Renderer::builtin();
    // (validation bootstrap, watched files, args with the service cluster blanked) → case.
    let mut cases: BTreeMap<(String, String, Vec<String>), Case> = BTreeMap::new();
    let mut proxies = 0;
    for (file, _, result) in corpus::results() {
        let Ok(ps) = result else { continue };
        for p in ps.into_iter().filter(|p| !p.is_empty()) {
            let Ok(rendered) = renderer.render(&p.proxy) else {
                continue; // refused at render: eg_corpus.rs checks the reason
            };
            proxies += 1;
            let desired = replica::desired_proxy(&p.proxy, &rendered.bootstrap, Path::new("/s"), 4);
            let args = replica::validation_args(&desired.spec);
            let mut key_args = args.clone();
            if let Some(i) = key_args.iter().position(|a| a == "--service-cluster") {
                if let Some(v) = key_args.get_mut(i + 1) {
                    v.clear();
                }
            }
            let boot = render::validation_bootstrap(&rendered).unwrap();
            let xds = serde_json::to_string(&rendered.xds).unwrap();
            let key = (boot.clone(), xds, key_args);
            cases
                .entry(key)
                .or_insert_with(|| Case {
                    what: format!("{} ({})", file.display(), p.eg_name),
                    proxies: 0,
                    args,
                    dir: lay_out(&boot, &rendered.xds, &tls),
                })
                .proxies += 1;
        }
    }
    assert!(proxies >= 300, "the corpus is there: {proxies} proxies");

    let started = Instant::now();
    let cases: Vec<Case> = cases.into_values().collect();
    let next = Mutex::new(0usize);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    *n += 1;
                    *n - 1
                };
                let Some(case) = cases.get(i) else { break };
                if let Err(e) = validate(case, &label) {
                    failures.lock().unwrap().push(e);
                }
            });
        }
    });
    let took = started.elapsed();
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "FIGURES: envoy --mode validate ({IMAGE}) on {} distinct bootstraps standing for {} \
         corpus proxies, {PARALLEL} at a time: {} failed, in {:.1}s",
        cases.len(),
        cases.iter().map(|c| c.proxies).sum::<usize>(),
        failures.len(),
        took.as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The harness is not vacuous: a corpus bootstrap with a field Envoy does not know fails.
#[test]
fn a_bootstrap_envoy_refuses_fails_the_harness() {
    common::fleet::ensure_images();
    let cleanup = common::Cleanup::new("eg-corpus-envoy-bad");
    let label = format!("{}={}", common::LABEL_TEST_CASE, cleanup.case);
    let (file, _, result) = corpus::results().into_iter().find(|r| r.2.is_ok()).unwrap();
    let p = result.unwrap().into_iter().find(|p| !p.is_empty()).unwrap();
    let rendered = Renderer::builtin().render(&p.proxy).unwrap();
    let desired = replica::desired_proxy(&p.proxy, &rendered.bootstrap, Path::new("/s"), 4);
    let boot = render::validation_bootstrap(&rendered).unwrap();
    let case = Case {
        what: file.display().to_string(),
        proxies: 1,
        args: replica::validation_args(&desired.spec),
        dir: lay_out(
            &format!("{boot}\nnot_a_bootstrap_field: 1\n"),
            &rendered.xds,
            &common::tls::pair(2, 2025, 2035),
        ),
    };
    let err = validate(&case, &label).expect_err("Envoy accepted an unknown field");
    assert!(err.contains("not_a_bootstrap_field"), "{err}");
}
