//! The test harness keeps its promises (no Docker, no Envoy):
//! - a test that cannot run fails under CI, saying why, and elsewhere is counted as skipped
//!   after the harness's own count line (`common::skip`);
//! - every `#[ignore]`d test is run by a CI script with `--ignored`, so ignoring a test never
//!   takes it out of CI;
//! - a wait for a machine-wide lock is bounded and names the holder.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

const REASON: &str = "the peer this test needs is not here";

/// Runs this very test in a child process with `env` (CI set or not); its exit status and its
/// stdout and stderr as one text, in the order they were written.
fn run_child(ci: Option<&str>, skip_log: &Path) -> (bool, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    // One open file for both (a shared offset), so the text keeps the order of the writes.
    let both = out.reopen().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "a_skip_fails_under_ci_and_is_counted_elsewhere",
        "--test-threads",
        "1",
    ])
    .env("BERTH_TEST_CHILD", "1")
    .env("BERTH_SKIP_LOG", skip_log)
    .stdin(Stdio::null())
    .stdout(both.try_clone().unwrap())
    .stderr(both);
    match ci {
        Some(v) => cmd.env("CI", v),
        None => cmd.env_remove("CI"),
    };
    let status = cmd.status().unwrap();
    (
        status.success(),
        std::fs::read_to_string(out.path()).unwrap(),
    )
}

#[test]
fn a_skip_fails_under_ci_and_is_counted_elsewhere() {
    if std::env::var_os("BERTH_TEST_CHILD").is_some() {
        return common::skip("the child", REASON);
    }
    let dir = common::short_tempdir();
    let log = dir.path().join("skips");

    for ci in ["1", "true"] {
        let (ok, text) = run_child(Some(ci), &log);
        assert!(!ok, "CI={ci}: a skip must fail the test:\n{text}");
        assert!(
            text.contains(&format!("the child cannot run here: {REASON}")),
            "CI={ci}: says why:\n{text}"
        );
        assert!(text.contains("test result: FAILED"), "{text}");
    }
    assert!(!log.exists(), "nothing is logged as skipped under CI");

    for ci in [None, Some(""), Some("0"), Some("false")] {
        let (ok, text) = run_child(ci, &log);
        assert!(ok, "CI={ci:?}: a skip passes outside CI:\n{text}");
        let said = text
            .find(&format!("SKIPPED the child: {REASON}"))
            .unwrap_or_else(|| panic!("CI={ci:?}: says SKIPPED at once:\n{text}"));
        let count = text.find("test result: ok. 1 passed").expect(&text);
        let summary = text
            .find("1 of the tests counted as passed above did not run")
            .unwrap_or_else(|| panic!("CI={ci:?}: a summary of the skips:\n{text}"));
        assert!(said < count && count < summary, "in that order:\n{text}");
        assert!(
            text[summary..].contains(&format!("SKIPPED the child: {REASON}")),
            "{text}"
        );
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged.lines().collect::<Vec<_>>(),
        vec![format!("SKIPPED the child: {REASON}"); 4],
        "BERTH_SKIP_LOG lists every skip"
    );
}

/// The CI scripts' command lines, continuation lines joined, podman-tests.sh's
/// `run_tests BINARY FLAGS NAME...` written as the `cargo test` it runs.
fn ci_command_lines(root: &Path) -> Vec<String> {
    ["scripts/test.sh", "scripts/podman-tests.sh", ".ci/run"]
        .iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(root.join(p)).unwrap();
            text.replace("\\\n", " ")
                .lines()
                .map(str::trim)
                .filter(|l| !l.starts_with('#'))
                .map(|l| {
                    let words: Vec<&str> = l.split_whitespace().collect();
                    match words.iter().position(|w| *w == "run_tests") {
                        Some(i) if words.len() > i + 2 => format!(
                            "cargo test --test {} -- {} {}",
                            words[i + 1],
                            words[i + 2].trim_matches('"'),
                            words[i + 3..].join(" ")
                        ),
                        _ => l.to_string(),
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every `#[ignore]`d test: (test file stem, test name, the ignore line).
fn ignored_tests(root: &Path) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("#[ignore") {
                continue;
            }
            let name = lines[i..]
                .iter()
                .find_map(|l| {
                    let l = l.trim_start();
                    let rest = l
                        .strip_prefix("async fn ")
                        .or_else(|| l.strip_prefix("fn "))?;
                    Some(rest.split('(').next().unwrap().to_string())
                })
                .unwrap_or_else(|| panic!("{stem}.rs:{}: no test after #[ignore]", i + 1));
            found.push((stem.clone(), name, line.trim().to_string()));
        }
    }
    found
}

#[test]
fn every_ignored_test_is_run_by_a_ci_script() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commands = ci_command_lines(root);
    let ignored = ignored_tests(root);
    assert!(!ignored.is_empty(), "the scan finds the ignored tests");
    let mut missing = Vec::new();
    for (stem, name, attr) in &ignored {
        assert!(
            attr.starts_with("#[ignore = \""),
            "{stem}.rs {name}: an ignored test says why and which CI job runs it: {attr}"
        );
        let runs = |l: &&String| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.windows(2).any(|w| w == ["--test", stem.as_str()])
                && (words.contains(&"--ignored") || words.contains(&"--include-ignored"))
                && !words.contains(&"--skip")
                && {
                    // No name filter, or one that this test's name contains.
                    let filters: Vec<&&str> = words
                        .iter()
                        .skip_while(|w| **w != "--")
                        .skip(1)
                        .take_while(|w| !w.contains(['|', '>', ';', '&']))
                        .filter(|w| !w.starts_with('-'))
                        .collect();
                    filters.is_empty() || filters.iter().any(|f| name.contains(**f))
                }
        };
        if !commands.iter().any(|l| runs(&l)) {
            missing.push(format!("{stem}.rs {name} ({attr})"));
        }
    }
    assert!(
        missing.is_empty(),
        "ignored tests no CI script runs with --ignored (scripts/test.sh, \
         scripts/podman-tests.sh, .ci/run):\n{}",
        missing.join("\n")
    );
}

/// The config builder (tests/common/config.rs) writes what a typed-out fixture says.
#[test]
fn the_config_builder_writes_what_a_fixture_types_out() {
    use common::config::{tls_files, Backend, Listener, Proxy, Route, VirtualHost};
    let built = Proxy::test("roll", "img:1", 2)
        .set("shutdown.drain_timeout", "4s")
        .listener(
            Listener::https("https", 8443, tls_files("cert.pem", "key.pem"))
                .virtual_host(
                    VirtualHost::new("app", &["app.localhost"])
                        .set("tls", tls_files("app.pem", "app-key.pem"))
                        .route(Route::direct("/", 200, "app\n")),
                )
                .route(Route::backend("/api", "api")),
        )
        .listener(Listener::new("web", 8080).route(Route::direct("/", 204, "")))
        .backend(Backend::local("api", 9000).set("protocol", "h2"))
        .to_toml();
    let typed = r#"
[[proxy]]
name = "roll"
image = "img:1"
replicas = 2
concurrency = 1

[proxy.shutdown]
drain_timeout = "4s"

[proxy.rollout]
startup_deadline = "20s"
min_ready = "1s"

[[proxy.listener]]
name = "https"
port = 8443
protocol = "https"
tls = { cert_file = "cert.pem", key_file = "key.pem" }

[[proxy.listener.virtual_host]]
name = "app"
domains = ["app.localhost"]
tls = { cert_file = "app.pem", key_file = "app-key.pem" }

[[proxy.listener.virtual_host.route]]
path_prefix = "/"
direct_response = { status = 200, body = "app\n" }

[[proxy.listener.route]]
path_prefix = "/api"
backend = "api"

[[proxy.listener]]
name = "web"
port = 8080

[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 204, body = "" }

[[proxy.backend]]
name = "api"
endpoints = ["127.0.0.1:9000"]
protocol = "h2"
"#;
    assert!(
        common::config::same_toml(&built, typed),
        "built:\n{built}\ntyped:\n{typed}"
    );
}

/// A lock wait is bounded and names the holder (tests/common/locks.rs), so a stuck holder fails
/// the waiting test instead of hanging the suite.
#[test]
fn a_lock_wait_gives_up_naming_the_holder() {
    let name = format!("harness-{}.lock", std::process::id());
    let path = format!("{}/{name}", common::locks::DIR);
    std::fs::create_dir_all(common::locks::DIR).unwrap();
    // Its own process group: `sleep` inherits the locked descriptor, so both must go.
    let mut holder = Command::new("flock")
        .args([&path, "sleep", "30"])
        .process_group(0)
        .spawn()
        .expect("flock(1) from util-linux");
    // The holder has the lock once /proc/locks says so.
    let held = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        !common::locks::holders(&path).is_empty()
    });
    let waited = std::panic::catch_unwind(|| {
        common::locks::FileLock::take_within(&name, false, std::time::Duration::from_secs(1))
    });
    // SAFETY: a signal to the process group this test made.
    unsafe { libc::kill(-(holder.id() as i32), libc::SIGKILL) };
    let _ = holder.wait();
    assert!(held, "flock never took {path}");
    let why = waited.err().expect("the wait gave up");
    let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        why.contains("gave up after 1s") && why.contains(&format!("pid {}", holder.id())),
        "{why}"
    );
    assert!(
        why.contains("sleep 30"),
        "names the holder's command: {why}"
    );
    // Once the holder is gone the lock is free.
    drop(common::locks::FileLock::take_within(
        &name,
        false,
        std::time::Duration::from_secs(1),
    ));
    let _ = std::fs::remove_file(&path);
}

/// docs/benchmarks.md quotes bench/results/*.txt, and names the commit of each file it quotes
/// (the benchmark scripts write the commit into the file's header).
#[test]
fn the_benchmark_page_names_the_commit_of_each_result_it_quotes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
    let mut unnamed = Vec::new();
    for entry in std::fs::read_dir(root.join("bench/results")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if !page.contains(&format!("bench/results/{file}")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let commit = text
            .lines()
            .find_map(|l| l.strip_prefix("commit:"))
            .map(|c| c.trim().chars().take(7).collect::<String>())
            .unwrap_or_else(|| panic!("{file} has no commit line: the scripts write one"));
        if !page.contains(&commit) {
            unnamed.push(format!("{file} (commit {commit})"));
        }
    }
    assert!(
        unnamed.is_empty(),
        "docs/benchmarks.md quotes these without naming their commit: {}",
        unnamed.join(", ")
    );
}
