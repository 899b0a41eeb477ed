//! The real Envoy checks every golden case: the rendered bootstrap as berth starts Envoy with
//! it, and `render::validation_bootstrap` (the watched-directory resources inlined as static
//! resources, since validate mode does not read `path_config_source` files), each with
//! `envoy --mode validate` in the local test image, `--network none`.
//!
//! The files are laid out as a replica sees them (`layout`): the bootstrap directory, the
//! watched xDS directory, the admin socket directory and self-signed TLS files (made with the
//! `openssl` CLI) under `/etc/berth/tls/<listener, backend.<name> or xds>/`. Needs Docker and
//! `scripts/envoy-image.sh` (run once per test process; fast when the image exists).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use berth::core::ir::{ProxyInfra, Routing};
use berth::core::layout;
use berth::core::render::{self, Rendered, Renderer};

const ENVOY_VERSION: &str = "1.40.0";
const VALIDATION_BOOTSTRAP: &str = "validation-bootstrap.yaml";

fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("scripts/envoy-image.sh"))
            .arg(ENVOY_VERSION)
            .output()
            .expect("running scripts/envoy-image.sh");
        assert!(
            out.status.success(),
            "scripts/envoy-image.sh {ENVOY_VERSION} failed (is Docker running?):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        format!("berth-test/envoy:{ENVOY_VERSION}")
    })
}

/// A self-signed certificate and key, made once per test process.
fn cert() -> &'static (String, String) {
    static CERT: OnceLock<(String, String)> = OnceLock::new();
    CERT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=berth-test"])
            .arg("-keyout")
            .arg(dir.path().join("key.pem"))
            .arg("-out")
            .arg(dir.path().join("cert.pem"))
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        (read("cert.pem"), read("key.pem"))
    })
}

fn golden_cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("ir.json").is_file())
        .collect();
    cases.sort();
    cases
}

fn load(case: &Path) -> ProxyInfra {
    let text = std::fs::read_to_string(case.join("ir.json")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", case.display()))
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes the files as a replica sees them; returns the temp dir (host side of the mounts).
fn lay_out(proxy: &ProxyInfra, rendered: &Rendered) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    };
    write("bootstrap/bootstrap.yaml", &rendered.bootstrap);
    write(
        &format!("bootstrap/{VALIDATION_BOOTSTRAP}"),
        &render::validation_bootstrap(rendered).unwrap(),
    );
    for (name, text) in &rendered.xds {
        write(&format!("xds/{name}"), text);
    }
    std::fs::create_dir_all(root.join("xds")).unwrap();
    std::fs::create_dir_all(root.join("run")).unwrap();
    // TLS material for every owner that might need it: each listener, and the xDS client.
    let (cert, key) = cert();
    let mut owners: Vec<String> = proxy.listeners.iter().map(|l| l.name.clone()).collect();
    match &proxy.routing {
        Routing::Standalone(s) => {
            owners.extend(
                s.listeners
                    .iter()
                    .flat_map(|l| l.certificates())
                    .map(|c| c.secret),
            );
            owners.extend(
                s.backends
                    .iter()
                    .filter(|b| b.tls.is_some())
                    .map(|b| berth::core::render::view::backend_tls_owner(&b.name)),
            );
        }
        Routing::Xds(_) => owners.push("xds".to_string()),
    }
    for owner in owners {
        write(&format!("tls/{owner}/cert.pem"), cert);
        write(&format!("tls/{owner}/key.pem"), key);
        write(&format!("tls/{owner}/ca.pem"), cert);
    }
    // The image runs Envoy as uid 101: everything readable, the run dir writable.
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

/// Runs `envoy --mode validate` on `bootstrap_file` (a file name in the bootstrap directory).
fn envoy_validate(proxy: &ProxyInfra, dir: &Path, bootstrap_file: &str) -> Result<String, String> {
    let mount = |host: &str, container: &str, ro: bool| {
        format!(
            "{}:{}{}",
            dir.join(host).display(),
            container,
            if ro { ":ro" } else { "" }
        )
    };
    let out = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--label",
            "io.berth.test=1",
            "--network",
            "none",
        ])
        .args([
            "-v",
            &mount("bootstrap", layout::CONTAINER_BOOTSTRAP_DIR, true),
        ])
        .args(["-v", &mount("xds", layout::CONTAINER_XDS_DIR, true)])
        .args(["-v", &mount("tls", layout::CONTAINER_TLS_DIR, true)])
        .args(["-v", &mount("run", layout::CONTAINER_RUN_DIR, false)])
        .arg(image())
        .args(["--mode", "validate", "-c"])
        .arg(format!(
            "{}/{bootstrap_file}",
            layout::CONTAINER_BOOTSTRAP_DIR
        ))
        .args(["--service-cluster", &proxy.name])
        .args(["--service-node", &format!("{}-0", proxy.name)])
        .output()
        .expect("running docker");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(log)
    } else {
        Err(log)
    }
}

fn last_lines(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn envoy_accepts_every_golden_case() {
    let renderer = Renderer::builtin();
    let mut failures = vec![];
    let cases = golden_cases();
    assert!(cases.len() >= 6, "golden cases: {cases:?}");
    for case in cases {
        let proxy = load(&case);
        let rendered = renderer.render(&proxy).unwrap();
        let dir = lay_out(&proxy, &rendered);
        for file in ["bootstrap.yaml", VALIDATION_BOOTSTRAP] {
            match envoy_validate(&proxy, dir.path(), file) {
                Ok(log) => {
                    if file == VALIDATION_BOOTSTRAP {
                        // The inlined resources really were loaded.
                        let listeners = rendered
                            .xds
                            .get(layout::LDS_FILE)
                            .map(|t| count_resources(t))
                            .unwrap_or(0);
                        if listeners > 0 {
                            assert!(
                                !log.contains("loading 0 listener(s)"),
                                "{}: validation bootstrap loaded no listeners:\n{log}",
                                case.display()
                            );
                        }
                    }
                }
                Err(log) => failures.push(format!(
                    "{} ({file}): envoy --mode validate failed:\n{}",
                    case.display(),
                    last_lines(&log, 5)
                )),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn count_resources(text: &str) -> usize {
    let v: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
    v.get("resources")
        .and_then(|r| r.as_sequence())
        .map_or(0, |s| s.len())
}

/// The harness is not vacuous: a resource Envoy rejects, in a watched-directory file that the
/// plain bootstrap validation never reads, fails the validation bootstrap.
#[test]
fn a_bad_resource_fails_validation() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/multi");
    let proxy = load(&case);
    let mut rendered = Renderer::builtin().render(&proxy).unwrap();
    let cds = rendered.xds.get_mut(layout::CDS_FILE).unwrap();
    *cds = cds.replace("\"LEAST_REQUEST\"", "\"NOT_A_POLICY\"");
    let dir = lay_out(&proxy, &rendered);
    let err = envoy_validate(&proxy, dir.path(), VALIDATION_BOOTSTRAP)
        .expect_err("Envoy accepted an unknown lb_policy");
    assert!(err.contains("NOT_A_POLICY"), "{}", last_lines(&err, 5));
}
