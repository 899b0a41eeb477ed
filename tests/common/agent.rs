#![allow(dead_code)]
//! The derived agent image for tests: the berth binary under test (statically linked, as every
//! build of berth is: .cargo/config.toml) put on a test Envoy image with `berth::infra::swarm::agent_image`.
//! The tag is derived from both, so every test binary shares one image per base image and binary.

use std::path::Path;

use berth::engine::ContainerEngine;

/// The berth binary under test, which is also the agent.
pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_berth"))
}

/// The derived image of `base` (which must be present), built if needed; its tag.
pub async fn image(engine: &dyn ContainerEngine, base: &str) -> String {
    let agent = std::fs::read(binary()).expect("reading the agent binary");
    berth::infra::swarm::agent_image::ensure_with(engine, base, &agent, false)
        .await
        .unwrap_or_else(|e| panic!("building the agent image of {base}: {e:#}"))
}

/// Removes the derived images the tests of this binary built once the last test using them
/// ends (also on failure): hold one for the whole test, declared first so it drops last (after
/// the test's containers are gone). A test that starts after the removal builds the image again.
pub struct ImagesGuard;

static USERS: std::sync::Mutex<(usize, Vec<String>)> = std::sync::Mutex::new((0, Vec::new()));

impl ImagesGuard {
    pub fn new() -> ImagesGuard {
        let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
        if users.0 == 0 {
            users.1 = agent_images();
        }
        users.0 += 1;
        ImagesGuard
    }
}

impl Drop for ImagesGuard {
    fn drop(&mut self) {
        let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
        users.0 -= 1;
        if users.0 == 0 {
            remove_agent_images_except(&users.1);
        }
    }
}

fn docker_stdout(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("running docker");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every name of a derived agent image (`berth-agent/envoy:*`, also under a registry), by its
/// label.
pub fn agent_images() -> Vec<String> {
    docker_stdout(&[
        "images",
        "--filter",
        &format!("label={}", berth::infra::swarm::agent_image::LABEL_BINARY),
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ])
    .lines()
    .filter(|l| !l.is_empty() && !l.ends_with(":<none>"))
    .map(str::to_string)
    .collect()
}

/// Removes the derived agent images not in `keep` (those a test built); an image still in use
/// stays.
pub fn remove_agent_images_except(keep: &[String]) {
    // An exited container the engine is still removing holds its image for a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let left: Vec<String> = agent_images()
            .into_iter()
            .filter(|i| !keep.contains(i))
            .collect();
        for image in &left {
            let _ = std::process::Command::new("docker")
                .args(["rmi", image])
                .output();
        }
        if left.is_empty() || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}
