//! Images: inspect, pull with the Docker client's registry credentials, build, tag, push.

use super::*;

impl DockerEngine {
    /// Pulls `image` with the Docker client's credentials for its registry, drawing a byte
    /// progress bar on stderr when `progress`. Errors are classified and name the image and
    /// the registry, never a credential.
    pub(super) async fn pull_from_registry(&self, image: &str, progress: bool) -> EngineResult<()> {
        use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
        let registry = crate::engine::credentials::registry_of(image).to_string();
        let failed = |failure, detail: String, with_credentials| {
            // On a host without a registry the usual fix is a locally built image.
            let hint = if registry == "docker.io" {
                let version = image_version_hint(image);
                format!(
                    "\nhint: on a host without a registry, build a local Envoy image with \
                     `scripts/envoy-image.sh {version}` and use berth/envoy:{version}"
                )
            } else {
                String::new()
            };
            EngineError::Pull(PullError {
                image: image.to_string(),
                registry: registry.clone(),
                failure,
                detail,
                with_credentials,
                hint,
            })
        };
        let lookup = registry.clone();
        let credentials =
            tokio::task::spawn_blocking(move || crate::engine::credentials::lookup(&lookup))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r)
                .map_err(|detail| failed(PullFailure::Credentials, detail, false))?;
        let with_credentials = credentials.is_some();
        let (repo, tag) = split_image(image);
        let opts = CreateImageOptionsBuilder::default()
            .from_image(repo)
            .tag(tag)
            .build();
        let target = if progress {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(0), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        bar.set_message(format!("pulling {image}"));
        // Per layer: (current, total) bytes; the bar shows the sum.
        let mut layers: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut stream = self.docker.create_image(Some(opts), None, credentials);
        while let Some(info) = stream.next().await {
            let info = match info {
                Ok(info) => info,
                Err(e) => {
                    bar.abandon_with_message(format!("pulling {image} failed"));
                    if is_connection_error(&e) {
                        return Err(EngineError::Unreachable {
                            endpoint: self.endpoint.clone(),
                            message: e.to_string(),
                        });
                    }
                    let detail = match e {
                        BollardError::DockerResponseServerError { message, .. } => message,
                        BollardError::DockerStreamError { error } => error,
                        other => other.to_string(),
                    };
                    return Err(failed(
                        PullFailure::classify(&detail),
                        detail,
                        with_credentials,
                    ));
                }
            };
            if let Some(err) = info.error_detail.and_then(|d| d.message) {
                bar.abandon_with_message(format!("pulling {image} failed"));
                return Err(failed(PullFailure::classify(&err), err, with_credentials));
            }
            if let (Some(id), Some(detail)) = (info.id, info.progress_detail) {
                let entry = layers.entry(id).or_default();
                if let Some(total) = detail.total.filter(|t| *t > 0) {
                    entry.1 = total as u64;
                }
                if let Some(current) = detail.current {
                    entry.0 = current as u64;
                }
                bar.set_length(layers.values().map(|l| l.1).sum());
                bar.set_position(layers.values().map(|l| l.0.min(l.1)).sum());
            }
        }
        bar.finish_with_message(format!("pulled {image}"));
        Ok(())
    }
}

pub(super) async fn image_id(engine: &DockerEngine, image: &str) -> EngineResult<Option<String>> {
    match engine.docker.inspect_image(image).await {
        Ok(img) => Ok(img.id),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(engine.refused(format!("inspect image {image}"), e).await),
    }
}

pub(super) async fn ensure_image(
    engine: &DockerEngine,
    image: &str,
    progress: bool,
) -> EngineResult<String> {
    if let Some(id) = engine.image_id(image).await? {
        return Ok(id);
    }
    engine.pull(image, progress).await
}

pub(super) async fn pull(
    engine: &DockerEngine,
    image: &str,
    progress: bool,
) -> EngineResult<String> {
    engine.pull_from_registry(image, progress).await?;
    engine
        .image_id(image)
        .await?
        .ok_or_else(|| EngineError::ImageUnavailable {
            image: image.to_string(),
            message: "it was pulled but is not present afterwards".to_string(),
            hint: String::new(),
        })
}

pub(super) async fn image_entrypoint(
    engine: &DockerEngine,
    image: &str,
) -> EngineResult<Option<Vec<String>>> {
    match engine.docker.inspect_image(image).await {
        Ok(img) => Ok(Some(
            img.config.and_then(|c| c.entrypoint).unwrap_or_default(),
        )),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(engine.refused(format!("inspect image {image}"), e).await),
    }
}

pub(super) async fn build_image(
    engine: &DockerEngine,
    build: &ImageBuild,
    progress: bool,
) -> EngineResult<String> {
    let operation = format!("build image {}", build.tag);
    let opts = BuildImageOptionsBuilder::default()
        .t(&build.tag)
        .dockerfile("Dockerfile")
        .rm(true)
        .forcerm(true)
        .labels(&build.labels.clone().into_iter().collect::<HashMap<_, _>>())
        .build();
    let body = bollard::body_full(build.context.clone().into());
    let mut stream = engine.docker.build_image(opts, None, Some(body));
    let mut log = String::new();
    while let Some(info) = stream.next().await {
        let info = match info {
            Ok(info) => info,
            Err(e) => return Err(engine.refused(operation, e).await),
        };
        if let Some(message) = info.error_detail.and_then(|d| d.message) {
            return Err(EngineError::Refused {
                engine: engine.describe(),
                operation,
                status: 0,
                message: format!("{message}\n{log}").trim_end().to_string(),
            });
        }
        if let Some(line) = info.stream {
            if progress {
                eprint!("{line}");
            }
            log.push_str(&line);
        }
    }
    engine
        .image_id(&build.tag)
        .await?
        .ok_or_else(|| EngineError::Refused {
            engine: engine.describe(),
            operation,
            status: 0,
            message: format!(
                "the build ended without an image tagged {}: {log}",
                build.tag
            ),
        })
}

pub(super) async fn tag_image(
    engine: &DockerEngine,
    image: &str,
    target: &str,
) -> EngineResult<()> {
    let (repo, tag) = split_image(target);
    let opts = TagImageOptionsBuilder::default()
        .repo(repo)
        .tag(tag)
        .build();
    match engine.docker.tag_image(image, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(e) => Err(engine
            .refused(format!("tag image {image} as {target}"), e)
            .await),
    }
}

pub(super) async fn push_image(
    engine: &DockerEngine,
    image: &str,
    progress: bool,
) -> EngineResult<String> {
    let registry = crate::engine::credentials::registry_of(image).to_string();
    let operation = format!("push image {image} to registry {registry}");
    let refused = |message: String| EngineError::Refused {
        engine: engine.describe(),
        operation: operation.clone(),
        status: 0,
        message,
    };
    let lookup = registry.clone();
    let credentials =
        tokio::task::spawn_blocking(move || crate::engine::credentials::lookup(&lookup))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|e| refused(format!("the credentials could not be read: {e}")))?;
    let with_credentials = credentials.is_some();
    let (repo, tag) = split_image(image);
    let opts = PushImageOptionsBuilder::default().tag(tag).build();
    // The engine wants an X-Registry-Auth header on a push, empty or not.
    let mut stream =
        engine
            .docker
            .push_image(repo, Some(opts), Some(credentials.unwrap_or_default()));
    let failed = |detail: String| {
        let config = crate::engine::credentials::config_file()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "~/.docker/config.json".into());
        let hint = match PullFailure::classify(&detail) {
            PullFailure::Unauthorized if with_credentials => format!(
                "; the registry refused the credentials from {config}: run `docker login {registry}` as the user berth runs as (or set DOCKER_CONFIG)"
            ),
            PullFailure::Unauthorized => format!(
                "; {config} has no credentials for {registry}: run `docker login {registry}` as the user berth runs as (or set DOCKER_CONFIG)"
            ),
            PullFailure::Unreachable => format!("; is registry {registry} up and reachable from this host?"),
            _ => String::new(),
        };
        refused(format!("{detail}{hint}"))
    };
    while let Some(info) = stream.next().await {
        let info = match info {
            Ok(info) => info,
            Err(e) if is_connection_error(&e) => {
                return Err(EngineError::Unreachable {
                    endpoint: engine.endpoint.clone(),
                    message: e.to_string(),
                })
            }
            Err(BollardError::DockerResponseServerError { message, .. })
            | Err(BollardError::DockerStreamError { error: message }) => {
                return Err(failed(message))
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        if let Some(message) = info.error_detail.and_then(|d| d.message) {
            return Err(failed(message));
        }
        if progress {
            if let Some(status) = info.status {
                eprintln!("push {image}: {status}");
            }
        }
    }
    let inspected = match engine.docker.inspect_image(image).await {
        Ok(i) => i,
        Err(e) => return Err(engine.refused(format!("inspect image {image}"), e).await),
    };
    inspected
        .repo_digests
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.split_once('@').is_some_and(|(r, _)| r == repo))
        .ok_or_else(|| {
            refused(format!(
                "the push ended without a digest of {repo} on the image"
            ))
        })
}

/// Splits "repo[:tag][@digest]" into what the pull API wants. A digest reference is passed
/// whole as the repository with an empty tag; no tag means "latest".
pub fn split_image(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// The Envoy version an image name suggests ("envoyproxy/envoy:v1.36.2" → "1.36.2"), for the
/// hint to build a local image; "1.40.0" when the tag says nothing.
pub(super) fn image_version_hint(image: &str) -> String {
    let (_, tag) = split_image(image);
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let looks_like_version = tag.split('.').count() == 3
        && tag
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    if looks_like_version {
        tag.to_string()
    } else {
        "1.40.0".to_string()
    }
}
