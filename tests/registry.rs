//! Images from a real registry: Debian's `docker-registry` (the distribution registry 2.8)
//! started by the test on 127.0.0.1 with htpasswd auth over plain HTTP (Docker allows
//! 127.0.0.0/8 registries without TLS; the registry's htpasswd backend does not insist on it).
//! Two builds are pushed under one tag with `docker login` into a DOCKER_CONFIG the test owns;
//! `berth up` with `pull = "always"` pulls with those credentials (wrong ones: a clear error
//! and nothing changes), `berth diff` shows the moved tag by ID, and the re-tag rolls out
//! under load with no failed request. A credential helper (`credHelpers`) is used last.
//!
//! Cleanup, also on failure: the registry process and its storage (a temp dir), the local
//! registry tag, the DOCKER_CONFIG dirs, and the replicas (by label).

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::fleet::{
    assert_no_failures, docker, ensure_images, events, stderr, Fleet, Settings, NEW, OLD,
};
use common::short_tempdir;

use common::registry::{Registry, REGISTRY, USER};

fn image_id(image: &str) -> String {
    let out = Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}", image])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `berth <args>` on the fleet's config and state, with `env` (awaited: the load generator
/// runs on the same runtime meanwhile).
async fn berth(fleet: &Fleet, env: &[(&str, &Path)], args: &[&str]) -> Output {
    let out = fleet
        .berth(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .output()
        .await
        .unwrap();
    common::show(&format!("berth {args:?}"), &out);
    out
}

fn output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn images_from_a_private_registry_pull_with_the_clients_credentials_and_a_moved_tag_rolls_out(
) {
    for tool in [REGISTRY, "/usr/bin/htpasswd"] {
        if !Path::new(tool).exists() {
            common::skip(
                "registry",
                &format!("{tool} is missing (.ci/run installs docker-registry and apache2-utils)"),
            );
            return;
        }
    }
    ensure_images();
    let _serial = common::fleet::SERIAL.lock().await;
    let registry = Registry::start();
    let config = registry.login();
    registry.push(OLD, config.path());
    let (old_id, new_id) = (image_id(OLD), image_id(NEW));

    let fleet = Fleet::new("registry").await;
    let image: &'static str = Box::leak(registry.image.clone().into_boxed_str());
    let mut settings = Settings::new(image, 2);
    settings.set("pull", "always");
    fleet.write(&settings);

    // Wrong credentials: a clear error naming the image and the registry, nothing changed,
    // and the password sent appears nowhere.
    let wrong = short_tempdir();
    let bad_password = format!("not-{}", registry.password);
    std::fs::write(
        wrong.path().join("config.json"),
        serde_json::json!({"auths": {registry.host.clone(): {"auth": base64(&format!("{USER}:{bad_password}"))}}})
            .to_string(),
    )
    .unwrap();
    let refused = berth(&fleet, &[("DOCKER_CONFIG", wrong.path())], &["up"]).await;
    let said = output(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("unauthorized") && said.contains(image) && said.contains(&registry.host),
        "{said}"
    );
    assert!(said.contains("docker login"), "says how to fix it: {said}");
    assert!(
        !said.contains(&bad_password),
        "the password was printed: {said}"
    );
    assert!(fleet.replicas().await.is_empty(), "nothing may change");
    assert!(
        !fleet.state().join("proxies").exists(),
        "nothing may change"
    );

    // The client's credentials: pulled, and up.
    let started = Instant::now();
    let out = berth(
        &fleet,
        &[("DOCKER_CONFIG", config.path())],
        &["--output", "json", "up"],
    )
    .await;
    let first_up = started.elapsed();
    assert!(out.status.success(), "{}", output(&out));
    assert!(
        events(&out)
            .iter()
            .any(|e| e["event"] == "pulled" && e["message"].as_str().unwrap_or("").contains(image)),
        "{}",
        output(&out)
    );
    assert!(
        !output(&out).contains(&registry.password),
        "the password was printed"
    );
    fleet.assert_serving(2, "1.39.3").await;
    for c in fleet.replicas().await {
        assert_eq!(c.image_id(), Some(old_id.as_str()), "{}", c.name);
        assert!(
            c.labels.values().all(|v| !v.contains(&registry.password)),
            "a label carries the password"
        );
    }

    // The second build under the same tag. The local tag still names the first: only the
    // registry knows.
    registry.push(NEW, config.path());
    docker(&["tag", OLD, image]);
    let diff = berth(&fleet, &[("DOCKER_CONFIG", config.path())], &["diff"]).await;
    let shown = String::from_utf8_lossy(&diff.stdout);
    assert!(diff.status.success(), "{}", output(&diff));
    let moved = format!("image {image}: {} -> {}", &old_id[..19], &new_id[..19]);
    assert!(shown.contains(&moved), "diff shows {moved:?}: {shown}");
    assert!(shown.contains("2 to replace"), "{shown}");

    // The re-tag rolls out under load with no failed request.
    let load = fleet.load();
    common::fleet::settle().await;
    let started = Instant::now();
    let out = berth(
        &fleet,
        &[("DOCKER_CONFIG", config.path())],
        &["--output", "json", "up"],
    )
    .await;
    let rollout = started.elapsed();
    common::fleet::settle().await;
    let report = load.stop().await;
    assert!(out.status.success(), "{}", output(&out));
    assert_no_failures("re-tag rollout", &report);
    fleet.assert_serving(2, "1.40.0").await;
    for c in fleet.replicas().await {
        assert_eq!(c.image_id(), Some(new_id.as_str()), "{}", c.name);
    }

    // Through a credential helper (`credHelpers`): the tag has not moved, nothing changes.
    let helper = short_tempdir();
    let script = helper.path().join("docker-credential-berthtest");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nread server\nprintf '{{\"ServerURL\":\"%s\",\"Username\":\"{USER}\",\"Secret\":\"{}\"}}' \"$server\"\n",
            registry.password
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        helper.path().join("config.json"),
        serde_json::json!({"credHelpers": {registry.host.clone(): "berthtest"}}).to_string(),
    )
    .unwrap();
    docker(&["rmi", image]);
    let path = format!(
        "{}:{}",
        helper.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let before = fleet.ids().await;
    let out = berth(
        &fleet,
        &[("DOCKER_CONFIG", helper.path()), ("PATH", Path::new(&path))],
        &["--output", "json", "up"],
    )
    .await;
    assert!(out.status.success(), "{}", output(&out));
    assert_eq!(image_id(image), new_id, "pulled through the helper");
    assert_eq!(fleet.ids().await, before, "an unmoved tag changes nothing");

    // serve pulls on its resync: the tag moves back to the first build and serve rolls the
    // replicas to it, under load, with no failed request. serve reads DOCKER_CONFIG from its
    // environment (this test binary has no other test).
    std::env::set_var("DOCKER_CONFIG", config.path());
    let serve = common::serve::Serve::start(
        &fleet.config(),
        &fleet.state(),
        &fleet.cleanup,
        &["--resync", "2s"],
    );
    let load = fleet.load();
    common::fleet::settle().await;
    registry.push(OLD, config.path());
    let pushed = Instant::now();
    loop {
        let ids: Vec<Option<String>> = fleet
            .replicas()
            .await
            .iter()
            .filter(|c| c.state == berth::engine::RunState::Running)
            .map(|c| c.image_id().map(str::to_string))
            .collect();
        if ids == vec![Some(old_id.clone()), Some(old_id.clone())] {
            break;
        }
        assert!(
            pushed.elapsed() < Duration::from_secs(90),
            "serve did not roll the moved tag out: {ids:?}\n{}",
            serve.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let picked_up = pushed.elapsed();
    common::fleet::settle().await;
    let serve_report = load.stop().await;
    assert_no_failures("re-tag rollout by serve", &serve_report);
    let log = serve.log_text();
    assert!(log.contains("the tag names another image now"), "{log}");
    assert!(!log.contains(&registry.password), "the password was logged");
    drop(serve);

    eprintln!(
        "FIGURES registry: serve (resync 2s) had the moved tag rolled out {:.2}s after the push, {} failed of {} requests",
        picked_up.as_secs_f64(),
        serve_report.failed,
        serve_report.ok + serve_report.failed
    );
    eprintln!(
        "FIGURES registry: first up (pull through the registry + 2 replicas) {:.2}s; re-tag rollout of 2 replicas {:.2}s with {} failed of {} requests",
        first_up.as_secs_f64(),
        rollout.as_secs_f64(),
        report.failed,
        report.ok + report.failed
    );
}

/// Standard base64 (what `docker login` writes into `auths`).
fn base64(s: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = s.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
