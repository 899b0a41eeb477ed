//! The `berth` binary as a user runs it: exit codes, messages, `render`, `validate`, `--help`.
//! Most of these need no Docker; the bad-input tests prove that no Docker call is made by
//! pointing DOCKER_HOST at a socket that does not exist (a Docker call would exit 1, not 2).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ensure_test_image, short_tempdir, Cleanup};

const NO_DOCKER: &str = "unix:///nonexistent/docker.sock";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn berth() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.env("BERTH_SYSCTL_DROPIN", common::TEST_SYSCTL_DROPIN);
    cmd.current_dir(root())
        .env_remove("BERTH_CONFIG")
        .env_remove("BERTH_STATE_DIR");
    cmd
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn describe(out: &Output) -> String {
    let (o, e) = text(out);
    format!(
        "exit {:?}\n--- stdout\n{o}\n--- stderr\n{e}",
        out.status.code()
    )
}

fn hostile_corpus() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("tests/hostile"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

/// Every hostile file: `validate` and `up` exit 2 with FILE:LINE:COL and the expected text,
/// before any Docker call (DOCKER_HOST points nowhere, which would be exit 1).
#[test]
fn hostile_configs_exit_2_with_positions_and_no_docker_call() {
    let corpus = hostile_corpus();
    assert!(corpus.len() >= 25, "only {} hostile files", corpus.len());
    let state = short_tempdir();
    let mut failures = Vec::new();
    for path in &corpus {
        let rel = path.strip_prefix(root()).unwrap();
        let first = String::from_utf8_lossy(&std::fs::read(path).unwrap())
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        let expect = first
            .strip_prefix("# expect: ")
            .unwrap_or_else(|| panic!("{} lacks `# expect:`", rel.display()));
        for args in [&["validate"][..], &["up"][..]] {
            let out = berth()
                .env("DOCKER_HOST", NO_DOCKER)
                .arg("-f")
                .arg(rel)
                .arg("--state-dir")
                .arg(state.path().join("s"))
                .args(args)
                .output()
                .unwrap();
            let (_, err) = text(&out);
            let positioned = err.lines().any(|l| {
                l.strip_prefix(&format!("{}:", rel.display()))
                    .and_then(|rest| {
                        let mut it = rest.splitn(3, ':');
                        let line: u32 = it.next()?.parse().ok()?;
                        let col: u32 = it.next()?.parse().ok()?;
                        Some(line >= 1 && col >= 1)
                    })
                    .unwrap_or(false)
            });
            if out.status.code() != Some(2) || !positioned || !err.contains(expect) {
                failures.push(format!(
                    "berth -f {} {}: want exit 2, FILE:LINE:COL and {expect:?}; got {}",
                    rel.display(),
                    args.join(" "),
                    describe(&out)
                ));
            }
        }
    }
    assert!(
        !state.path().join("s").exists(),
        "`up` of a bad config created the state directory"
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn missing_config_file_exits_2_naming_it() {
    for cmd in ["validate", "render", "up", "diff", "status", "down"] {
        let out = berth()
            .env("DOCKER_HOST", NO_DOCKER)
            .args([
                "-f",
                "does/not/exist.toml",
                "--state-dir",
                "/tmp/berth-nonexistent-x",
            ])
            .arg(cmd)
            .output()
            .unwrap();
        let (_, err) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {}", describe(&out));
        assert!(err.contains("does/not/exist.toml"), "{cmd}: {err}");
    }
}

#[test]
fn bad_arguments_exit_2() {
    let out = berth().args(["up", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = berth()
        .args(["--output", "yaml", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn help_of_each_command_says_what_it_does() {
    let cases = [
        (None, "Envoy proxy fleets"),
        (Some("up"), "Converge every proxy"),
        (Some("down"), "Drain and remove"),
        (Some("status"), "one row per replica"),
        (Some("diff"), "what `up` would do"),
        (Some("render"), "rendered Envoy files"),
        (Some("validate"), "envoy --mode validate"),
        (Some("logs"), "interleaved and prefixed by replica"),
        (Some("completions"), "shell completion script"),
        (Some("man"), "manual page"),
        (Some("agent"), "proxy agent"),
    ];
    for (cmd, purpose) in cases {
        let out = berth().args(cmd).arg("--help").output().unwrap();
        let (o, _) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{cmd:?}: {}", describe(&out));
        assert!(
            o.to_lowercase().contains(&purpose.to_lowercase()),
            "`berth {} --help` does not mention {purpose:?}:\n{o}",
            cmd.unwrap_or("")
        );
    }
}

#[test]
fn render_prints_bootstrap_and_resources() {
    for example in examples() {
        let out = berth()
            .env("DOCKER_HOST", NO_DOCKER)
            .arg("-f")
            .arg(&example)
            .arg("render")
            .output()
            .unwrap();
        let (o, _) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(o.contains("bootstrap.yaml"), "{}: {o}", example.display());
        assert!(o.contains("admin:"), "{}", example.display());
        let standalone = !o.contains("ads_config");
        if standalone {
            for file in ["lds.yaml", "rds-", "cds.yaml"] {
                assert!(o.contains(file), "{}: no {file}", example.display());
            }
        }

        let out = berth()
            .env("DOCKER_HOST", NO_DOCKER)
            .arg("-f")
            .arg(&example)
            .args(["render", "--output", "json"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{}: not JSON ({e}): {}", example.display(), describe(&out))
        });
        let proxies = json.as_object().expect("an object keyed by proxy");
        assert!(!proxies.is_empty());
        for (name, files) in proxies {
            let bootstrap = files["bootstrap.yaml"].as_str().unwrap_or_default();
            assert!(bootstrap.contains("admin:"), "{name}: {bootstrap}");
            if standalone {
                for file in ["lds.yaml", "cds.yaml"] {
                    assert!(files[file].is_string(), "{name}: no {file}");
                }
                let routes = files
                    .as_object()
                    .unwrap()
                    .keys()
                    .any(|f| f.starts_with("rds-"));
                assert!(routes, "{name}: no rds-<listener>.yaml");
            }
        }
    }
}

#[test]
fn render_of_an_unknown_proxy_exits_1_naming_it() {
    let out = berth()
        .args(["-f", "examples/quickstart.toml", "render", "NOPROXY"])
        .output()
        .unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        err.contains("NOPROXY") && err.contains("quickstart"),
        "{err}"
    );
}

#[test]
fn validate_without_envoy_needs_no_docker() {
    for example in examples() {
        let out = berth()
            .env("DOCKER_HOST", NO_DOCKER)
            .arg("-f")
            .arg(&example)
            .args(["validate", "--no-envoy"])
            .output()
            .unwrap();
        let (o, _) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(o.contains("valid"), "{o}");
    }
}

/// With Docker: real Envoy accepts every example (the TLS and xDS ones mount examples/certs).
#[test]
fn validate_runs_real_envoy_on_every_example() {
    ensure_test_image();
    let cleanup = Cleanup::new("cliv");
    for example in examples() {
        let out = berth()
            .arg("-f")
            .arg(&example)
            .args(labels(&cleanup))
            .arg("validate")
            .output()
            .unwrap();
        let (o, _) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            example.display(),
            describe(&out)
        );
        assert!(o.contains("Envoy accepts it"), "{}: {o}", example.display());
    }
}

/// A bootstrap override berth accepts but Envoy rejects: validate exits 1 with Envoy's words.
#[test]
fn validate_reports_what_envoy_rejects() {
    ensure_test_image();
    let cleanup = Cleanup::new("clir");
    let dir = short_tempdir();
    let cfg = dir.path().join("berth.toml");
    std::fs::write(
        &cfg,
        r#"
[[proxy]]
name = "rejected"
image = "berth-test/envoy:1.40.0"

[[proxy.listener]]
name = "web"
port = 18999

[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "x" }

[proxy.bootstrap]
type = "merge"
value = """
static_resources:
  clusters:
  - name: broken
    type: STATIC
    load_assignment:
      cluster_name: broken
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: { address: "not-an-ip-address", port_value: 1 }
"""
"#,
    )
    .unwrap();
    let out = berth()
        .arg("-f")
        .arg(&cfg)
        .args(labels(&cleanup))
        .arg("validate")
        .output()
        .unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(err.contains("rejected"), "{err}");
    assert!(
        err.contains("not-an-ip-address"),
        "Envoy's own message is shown: {err}"
    );
}

fn labels(cleanup: &Cleanup) -> Vec<String> {
    vec![
        "--container-label".into(),
        "io.berth.test=1".into(),
        "--container-label".into(),
        format!("io.berth.test.case={}", cleanup.case),
    ]
}

// `berth agent` as a process, with a stand-in for Envoy (the real one: tests/agent.rs).

#[test]
fn agent_run_passes_its_childs_end_on() {
    let out = berth()
        .args(["agent", "run", "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let out = berth()
        .args(["agent", "run", "--", "sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137), "{}", describe(&out));
    assert!(
        text(&out).1.contains("Envoy exited: signal: 9"),
        "{}",
        describe(&out)
    );
    let out = berth()
        .args(["agent", "run", "--", "/nonexistent/envoy"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out)
            .1
            .contains("cannot start Envoy (/nonexistent/envoy)"),
        "{}",
        describe(&out)
    );
    for bad in [
        &["agent", "run"][..],
        &["agent", "run", "--port", "0", "--", "envoy"],
        &["agent", "run", "--drain-timeout", "soon", "--", "envoy"],
    ] {
        let out = berth().args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", describe(&out));
    }
}

#[test]
fn agent_run_stops_its_child_on_sigterm_even_when_it_cannot_drain() {
    let dir = short_tempdir();
    let socket = dir.path().join("admin.sock");
    let child = berth()
        .args(["agent", "run", "--admin-socket"])
        .arg(&socket)
        .args(["--", "sleep", "30"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // Wait until the agent has started its child (and so has its signal handlers).
    let started = std::time::Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: kill(2) of the child this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    // No admin socket: nothing to drain; the child gets SIGTERM at once and dies of it.
    assert_eq!(out.status.code(), Some(143), "{}", describe(&out));
    let (_, e) = text(&out);
    assert!(
        e.contains("SIGTERM: draining Envoy") && e.contains("could not drain Envoy"),
        "{e}"
    );
}

#[test]
fn agent_health_without_envoy_is_not_ready_and_says_why() {
    let dir = short_tempdir();
    let out = berth()
        .args(["agent", "health", "--port", "8080", "--admin-socket"])
        .arg(dir.path().join("admin.sock"))
        .env("BERTH_AGENT_CONFIG_VERSION", "v1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let (o, _) = text(&out);
    assert!(
        o.starts_with("not-ready config=v1 lds=- cds=- reason: its admin socket does not answer"),
        "{o}"
    );
    let saved = std::fs::read_to_string(dir.path().join("agent-health.json")).unwrap();
    assert!(saved.contains(r#""ready":false"#), "{saved}");
}
