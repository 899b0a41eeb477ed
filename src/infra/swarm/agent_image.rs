//! The derived image: the configured Envoy image plus the static agent binary at
//! [`AGENT_PATH`], built through the engine seam ([`ContainerEngine::build_image`], an
//! in-memory build context) so every node that has the image can run the agent.
//!
//! ```dockerfile
//! FROM <base image ID>
//! COPY berth-agent /usr/local/bin/berth-agent
//! HEALTHCHECK --interval=1s --timeout=2s --retries=2 CMD ["/usr/local/bin/berth-agent","agent","health"]
//! ENTRYPOINT ["/usr/local/bin/berth-agent","agent","run","--", <the base image's ENTRYPOINT>]
//! ```
//!
//! The base image's ENTRYPOINT (`/usr/local/bin/envoy`, or `/docker-entrypoint.sh` in Envoy's
//! Debian image) comes after `--`, so a container of the derived image takes exactly the
//! arguments a container of the base image takes: berth passes the same Envoy flags either way.
//! The user, environment and working directory stay the base image's.
//!
//! The tag is derived from both inputs, `berth-agent/envoy:<16 hex of sha256(base image ID,
//! binary sha256)>`: a new Envoy image or a new agent binary yields a new tag, and an image
//! already built is reused as it is.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::agent_binary as binary;
use crate::core::agent::{AGENT_PATH, HEALTH_INTERVAL, HEALTH_RETRIES, HEALTH_TIMEOUT};
use crate::engine::{ContainerEngine, ImageBuild};

/// The repository of derived images.
pub const REPOSITORY: &str = "berth-agent/envoy";

/// Labels on a derived image.
pub const LABEL_BASE: &str = "io.berth.agent.base";
pub const LABEL_BASE_ID: &str = "io.berth.agent.base-id";
pub const LABEL_BINARY: &str = "io.berth.agent.binary-sha256";

/// Makes sure the derived image of `base_image` exists (pulling the base when absent, building
/// when the derived image is absent) and returns its tag. The agent binary is
/// [`binary::locate`]'s.
pub async fn ensure(
    engine: &dyn ContainerEngine,
    base_image: &str,
    progress: bool,
) -> Result<String> {
    let path = binary::locate()?;
    let agent = std::fs::read(&path)
        .with_context(|| format!("cannot read the agent binary {}", path.display()))?;
    ensure_with(engine, base_image, &agent, progress).await
}

/// [`ensure`] with the agent binary given.
pub async fn ensure_with(
    engine: &dyn ContainerEngine,
    base_image: &str,
    agent: &[u8],
    progress: bool,
) -> Result<String> {
    let base_id = engine.ensure_image(base_image, progress).await?;
    let binary_sha = hex::encode(Sha256::digest(agent));
    let tag = tag(&base_id, &binary_sha);
    if engine.image_id(&tag).await?.is_some() {
        return Ok(tag);
    }
    let entrypoint = engine
        .image_entrypoint(base_image)
        .await?
        .with_context(|| format!("image {base_image} disappeared while berth read it"))?;
    if entrypoint.is_empty() {
        bail!(
            "image {base_image} has no ENTRYPOINT; berth passes Envoy's flags after the image's \
             entrypoint (Envoy's images have /usr/local/bin/envoy or /docker-entrypoint.sh): \
             use an image whose ENTRYPOINT starts Envoy"
        );
    }
    if progress {
        eprintln!("building {tag}: {base_image} with the berth agent");
    }
    let build = ImageBuild {
        tag: tag.clone(),
        context: context(&dockerfile(&base_id, &entrypoint)?, agent)?,
        labels: BTreeMap::from([
            (LABEL_BASE.to_string(), base_image.to_string()),
            (LABEL_BASE_ID.to_string(), base_id.clone()),
            (LABEL_BINARY.to_string(), binary_sha),
        ]),
    };
    engine
        .build_image(&build, progress)
        .await
        .with_context(|| format!("cannot build the agent image of {base_image}"))?;
    Ok(tag)
}

/// The name of the derived image `local` (`berth-agent/envoy:<hash>`) under `registry`
/// (`host[:port][/path]`): `<registry>/berth-agent/envoy:<hash>`.
pub fn in_registry(local: &str, registry: &str) -> String {
    format!("{}/{local}", registry.trim_end_matches('/'))
}

/// Tags the derived image `local` under `registry` and pushes it there with the Docker
/// client's credentials; returns the reference tasks run, by tag and digest
/// (`<registry>/berth-agent/envoy:<hash>@sha256:…`), so every node runs the same bytes.
pub async fn publish(
    engine: &dyn ContainerEngine,
    local: &str,
    registry: &str,
    progress: bool,
) -> Result<String> {
    let remote = in_registry(local, registry);
    engine.tag_image(local, &remote).await?;
    let by_digest = engine.push_image(&remote, progress).await?;
    let digest = by_digest
        .split_once('@')
        .map(|(_, d)| d)
        .with_context(|| format!("the push of {remote} named no digest ({by_digest})"))?;
    Ok(format!("{remote}@{digest}"))
}

/// The derived image's tag for a base image ID and an agent binary's sha256.
pub fn tag(base_id: &str, binary_sha256: &str) -> String {
    let digest = Sha256::digest(format!("{base_id}\n{binary_sha256}\n"));
    format!("{REPOSITORY}:{}", &hex::encode(digest)[..16])
}

fn dockerfile(base_id: &str, entrypoint: &[String]) -> Result<String> {
    let mut run = vec![
        AGENT_PATH.to_string(),
        "agent".into(),
        "run".into(),
        "--".into(),
    ];
    run.extend(entrypoint.iter().cloned());
    let health = crate::core::agent::HEALTHCHECK_TEST[1..].to_vec();
    Ok(format!(
        "FROM {base_id}\n\
         COPY berth-agent {AGENT_PATH}\n\
         HEALTHCHECK --interval={}s --timeout={}s --retries={} CMD {}\n\
         ENTRYPOINT {}\n",
        HEALTH_INTERVAL.as_secs(),
        HEALTH_TIMEOUT.as_secs(),
        HEALTH_RETRIES,
        serde_json::to_string(&health)?,
        serde_json::to_string(&run)?,
    ))
}

/// The build context: a tar archive of the Dockerfile and the agent binary.
fn context(dockerfile: &str, agent: &[u8]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, content, mode) in [
        ("Dockerfile", dockerfile.as_bytes(), 0o644),
        ("berth-agent", agent, 0o755),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(mode);
        header.set_mtime(0);
        header.set_cksum();
        tar.append_data(&mut header, name, content)?;
    }
    Ok(tar.into_inner()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::{Behavior, FakeEngine};

    const BASE: &str = "envoyproxy/envoy:v1.40.0";

    #[tokio::test]
    async fn builds_once_then_reuses() {
        let engine = FakeEngine::new();
        engine.add_image(BASE, Behavior::healthy(&[8080]));
        let first = ensure_with(engine.as_ref(), BASE, b"agent v1", false)
            .await
            .unwrap();
        assert!(first.starts_with("berth-agent/envoy:"), "{first}");
        let again = ensure_with(engine.as_ref(), BASE, b"agent v1", false)
            .await
            .unwrap();
        assert_eq!(first, again);
        let builds = |e: &FakeEngine| {
            e.history()
                .iter()
                .filter(|h| h.starts_with("build "))
                .count()
        };
        assert_eq!(builds(&engine), 1);
        // A new agent binary is a new image.
        let newer = ensure_with(engine.as_ref(), BASE, b"agent v2", false)
            .await
            .unwrap();
        assert_ne!(newer, first);
        assert_eq!(builds(&engine), 2);
        // The derived image runs the agent with the base's entrypoint after `--`.
        assert_eq!(
            engine.image_entrypoint(&newer).await.unwrap().unwrap(),
            vec![AGENT_PATH, "agent", "run", "--", "/usr/local/bin/envoy"]
        );
    }

    #[tokio::test]
    async fn publishing_tags_under_the_registry_and_pins_the_digest() {
        let engine = FakeEngine::new();
        engine.add_image(BASE, Behavior::healthy(&[8080]));
        let local = ensure_with(engine.as_ref(), BASE, b"agent", false)
            .await
            .unwrap();
        let pinned = publish(engine.as_ref(), &local, "127.0.0.1:5000/team/", false)
            .await
            .unwrap();
        let remote = format!("127.0.0.1:5000/team/{local}");
        assert!(pinned.starts_with(&format!("{remote}@sha256:")), "{pinned}");
        assert!(engine.history().contains(&format!("push {remote}")));
        // What was pushed is the derived image.
        assert_eq!(
            engine.image_id(&remote).await.unwrap(),
            engine.image_id(&local).await.unwrap()
        );
    }

    #[tokio::test]
    async fn a_missing_base_image_is_an_error_naming_it() {
        let engine = FakeEngine::new();
        let e = ensure_with(engine.as_ref(), BASE, b"agent", false)
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains(BASE), "{e:#}");
    }

    #[test]
    fn the_tag_follows_both_inputs() {
        let t = tag("sha256:aa", "bb");
        assert_eq!(t, tag("sha256:aa", "bb"));
        assert_ne!(t, tag("sha256:ab", "bb"));
        assert_ne!(t, tag("sha256:aa", "bc"));
    }

    #[test]
    fn the_dockerfile_wraps_the_base_entrypoint() {
        let text = dockerfile("sha256:1", &["/docker-entrypoint.sh".to_string()]).unwrap();
        assert_eq!(
            text,
            "FROM sha256:1\n\
             COPY berth-agent /usr/local/bin/berth-agent\n\
             HEALTHCHECK --interval=1s --timeout=2s --retries=2 CMD [\"/usr/local/bin/berth-agent\",\"agent\",\"health\"]\n\
             ENTRYPOINT [\"/usr/local/bin/berth-agent\",\"agent\",\"run\",\"--\",\"/docker-entrypoint.sh\"]\n"
        );
    }
}
