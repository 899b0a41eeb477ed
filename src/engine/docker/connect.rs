//! Connecting to the engine: where it is ([`endpoint`]), the API version negotiated down to
//! what the daemon speaks, and which engine answers (Docker or Podman) from `/version`.

use super::*;

/// How long the first request may take before berth asks `/version` instead (which then says
/// why the engine does not answer).
const PING_TIMEOUT: Duration = Duration::from_secs(10);

impl DockerEngine {
    /// Connects to the engine at [`endpoint`] and negotiates the API version down to what it
    /// speaks, learning which engine it is from the same `/version` request.
    pub async fn connect() -> EngineResult<DockerEngine> {
        let endpoint = endpoint();
        let calls = Arc::new(AtomicU64::new(0));
        let unreachable = |e: BollardError| EngineError::Unreachable {
            endpoint: endpoint.clone(),
            message: e.to_string(),
        };
        let client = |version: &ClientVersion| -> Result<Docker, BollardError> {
            let counter = calls.clone();
            let docker = if endpoint.starts_with("unix://") {
                Docker::connect_with_unix(&endpoint, REQUEST_TIMEOUT.as_secs(), version)?
            } else if endpoint.starts_with("tcp://") || endpoint.starts_with("http://") {
                Docker::connect_with_http(&endpoint, REQUEST_TIMEOUT.as_secs(), version)?
            } else {
                Docker::connect_with_host(&endpoint)?
            };
            Ok(docker
                .with_timeout(REQUEST_TIMEOUT)
                .with_request_modifier(move |req| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    req
                }))
        };
        let docker = client(bollard::API_DEFAULT_VERSION).map_err(unreachable)?;
        let pinged = match endpoint.strip_prefix("unix://") {
            Some(path) => {
                calls.fetch_add(1, Ordering::Relaxed);
                crate::engine::ping::unix(path, PING_TIMEOUT).await
            }
            None => None,
        };
        let (product, flavor, api_version) = match pinged {
            Some(p) => (p.product, p.flavor, Some(p.api_version)),
            None => {
                let version = docker.version().await.map_err(unreachable)?;
                let (product, flavor) = product_of(&version);
                (product, flavor, version.api_version)
            }
        };
        let server = api_version
            .as_deref()
            .and_then(parse_api_version)
            .ok_or_else(|| EngineError::Unreachable {
                endpoint: endpoint.clone(),
                message: format!("{product} did not say which API version it speaks"),
            })?;
        let docker = if server < docker.client_version() {
            client(&server).map_err(unreachable)?
        } else {
            docker
        };
        Ok(DockerEngine {
            docker,
            endpoint,
            product,
            flavor,
            calls,
        })
    }

    /// The bollard client, for callers that need an engine call the seam does not have
    /// (tests inspecting what `create` made).
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// Docker or Podman.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// The API version in use after negotiation, e.g. "1.41".
    pub fn api_version(&self) -> String {
        let v = self.docker.client_version();
        format!("{}.{}", v.major_version, v.minor_version)
    }
}

/// Where the engine is expected, for messages.
/// Where the engine is: `DOCKER_HOST` when set (as for the docker CLI and compose; a Podman
/// service is chosen this way), else Docker's socket when it exists, else Podman's (rootful
/// `/run/podman/podman.sock`, then the user's `$XDG_RUNTIME_DIR/podman/podman.sock`), else
/// Docker's, so that "is dockerd running?" names the usual place.
pub fn endpoint() -> String {
    if let Ok(h) = std::env::var("DOCKER_HOST") {
        if !h.is_empty() {
            return h;
        }
    }
    const DOCKER: &str = "/var/run/docker.sock";
    let mut candidates = vec![std::path::PathBuf::from(DOCKER)];
    candidates.push("/run/podman/podman.sock".into());
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR") {
        candidates.push(std::path::Path::new(&run).join("podman/podman.sock"));
    }
    let found = candidates.into_iter().find(|p| p.exists());
    format!(
        "unix://{}",
        found
            .as_deref()
            .unwrap_or(std::path::Path::new(DOCKER))
            .display()
    )
}

/// The engine's product name and version, and which engine it is, from `/version`.
pub(super) fn product_of(v: &bollard::models::SystemVersion) -> (String, Flavor) {
    let components: Vec<&str> = v
        .components
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    if let Some(podman) = components.iter().find(|n| n.contains("Podman")) {
        let version = v.version.as_deref().unwrap_or_default();
        return (
            format!("{podman} {version}").trim().to_string(),
            Flavor::Podman,
        );
    }
    // Docker's own builds say "Docker Engine - Community"; Debian's leave the platform empty
    // and call the component "Engine".
    let product = v
        .platform
        .as_ref()
        .map(|p| p.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| match components.first() {
            None | Some(&"Engine") => "Docker Engine".to_string(),
            Some(other) => other.to_string(),
        });
    let product = match &v.version {
        Some(version) => format!("{product} {version}"),
        None => product,
    };
    (product, Flavor::Docker)
}

/// "1.41" as a client version.
pub(super) fn parse_api_version(v: &str) -> Option<ClientVersion> {
    let (major, minor) = v.split_once('.')?;
    Some(ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    })
}
