//! What engine answers at a unix socket, from the headers of one `GET /_ping`: the API version
//! it speaks, and whether it is Docker or Podman. Both set `API-Version` on that answer, and
//! Podman adds `Libpod-API-Version` and `Server: Libpod/<version>` (Docker: `Server:
//! Docker/<version>`). `/version` says the same but makes Docker run `runc --version` and
//! `docker-init --version` first: about 6 ms of every command, where the ping takes 0.5 ms.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::Flavor;

/// What the ping said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinged {
    /// "1.41".
    pub api_version: String,
    /// "Docker Engine 20.10.24", "Podman Engine 4.3.1".
    pub product: String,
    pub flavor: Flavor,
}

/// Pings the engine at the unix socket `path`; None when it cannot be reached, times out or
/// does not say its API version (the caller then asks `/version`, and reports its error).
pub async fn unix(path: &str, timeout: Duration) -> Option<Pinged> {
    tokio::time::timeout(timeout, ask(path))
        .await
        .ok()
        .flatten()
}

async fn ask(path: &str) -> Option<Pinged> {
    let stream = tokio::net::UnixStream::connect(path).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let driving = tokio::spawn(connection);
    let request = hyper::Request::get("/_ping")
        .header(hyper::header::HOST, "docker")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let answer = sender.send_request(request).await;
    driving.abort();
    let answer = answer.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    from_headers(
        header("api-version")?,
        header("libpod-api-version"),
        header("server"),
    )
}

fn from_headers(
    api_version: String,
    libpod: Option<String>,
    server: Option<String>,
) -> Option<Pinged> {
    if let Some(libpod) = libpod {
        return Some(Pinged {
            api_version,
            product: format!("Podman Engine {libpod}"),
            flavor: Flavor::Podman,
        });
    }
    // "Docker/20.10.24+dfsg1 (linux)"
    let version = server
        .as_deref()
        .and_then(|s| s.strip_prefix("Docker/"))
        .and_then(|s| s.split_whitespace().next())
        .map(str::to_string);
    Some(Pinged {
        api_version,
        product: match version {
            Some(v) => format!("Docker Engine {v}"),
            None => "Docker Engine".to_string(),
        },
        flavor: Flavor::Docker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_docker_and_podman_from_their_headers() {
        let docker = from_headers(
            "1.41".into(),
            None,
            Some("Docker/20.10.24+dfsg1 (linux)".into()),
        )
        .unwrap();
        assert_eq!(docker.product, "Docker Engine 20.10.24+dfsg1");
        assert_eq!(docker.flavor, Flavor::Docker);
        let podman = from_headers(
            "1.41".into(),
            Some("4.3.1".into()),
            Some("Libpod/4.3.1 (linux)".into()),
        )
        .unwrap();
        assert_eq!(podman.product, "Podman Engine 4.3.1");
        assert_eq!(podman.flavor, Flavor::Podman);
        assert_eq!(podman.api_version, "1.41");
    }

    /// Against the engine of this host, when there is one: the ping says what `/version` says.
    #[tokio::test]
    async fn the_ping_agrees_with_version_on_this_host() {
        let Some(pinged) = unix("/var/run/docker.sock", Duration::from_secs(5)).await else {
            eprintln!("skipped: no engine answers at /var/run/docker.sock");
            return;
        };
        let docker = bollard::Docker::connect_with_unix_defaults().unwrap();
        let version = docker.version().await.unwrap();
        assert_eq!(Some(pinged.api_version), version.api_version);
        assert!(
            pinged
                .product
                .ends_with(version.version.as_deref().unwrap_or("?")),
            "{} vs {:?}",
            pinged.product,
            version.version
        );
    }
}
