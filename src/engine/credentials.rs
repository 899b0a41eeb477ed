//! The registry credentials the host's Docker client already has: its config file
//! (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`) with `auths`, `credsStore` and
//! `credHelpers` (`docker-credential-<helper> get`), read as the docker CLI reads them
//! (the `docker_credential` crate).
//!
//! Secrets never leave this module except inside the [`DockerCredentials`] handed to the engine
//! (the `X-Registry-Auth` header of one pull): no error, log line or label carries them. Errors
//! name the config file, the registry and the helper, never a username or a secret.

use std::path::{Path, PathBuf};

use bollard::auth::DockerCredentials;
use docker_credential::{CredentialRetrievalError, DockerCredential};

/// The server address Docker Hub's credentials are stored under.
const DOCKER_HUB_SERVER: &str = "https://index.docker.io/v1/";

/// The registry an image reference names: its first path component when that looks like a
/// host (has a '.' or a ':', or is `localhost`), else Docker Hub ("docker.io").
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// Where the Docker client keeps its config: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json`.
pub fn config_file() -> Option<PathBuf> {
    std::env::var_os("DOCKER_CONFIG")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".docker")))
        .map(|dir| dir.join("config.json"))
}

/// The credentials the Docker client config has for `registry`, or None (pull anonymously)
/// when there is no config file or it has nothing for this registry. Runs a credential
/// helper when the config names one: call it off the async runtime.
pub fn lookup(registry: &str) -> Result<Option<DockerCredentials>, String> {
    let Some(path) = config_file() else {
        return Ok(None);
    };
    lookup_in(&path, registry)
}

fn lookup_in(path: &Path, registry: &str) -> Result<Option<DockerCredentials>, String> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let server = if registry == "docker.io" {
        DOCKER_HUB_SERVER
    } else {
        registry
    };
    let found = docker_credential::get_credential_from_reader(text.as_slice(), server);
    let helper = || helper_for(&text, server);
    match found {
        Ok(DockerCredential::UsernamePassword(username, password)) => Ok(Some(DockerCredentials {
            username: Some(username),
            password: Some(password),
            serveraddress: Some(server.to_string()),
            ..Default::default()
        })),
        Ok(DockerCredential::IdentityToken(token)) => Ok(Some(DockerCredentials {
            identitytoken: Some(token),
            serveraddress: Some(server.to_string()),
            ..Default::default()
        })),
        Err(CredentialRetrievalError::NoCredentialConfigured) => Ok(None),
        // What the helpers answer when they hold nothing for the server: pull anonymously, as
        // the docker CLI does.
        Err(CredentialRetrievalError::HelperFailure { stdout, stderr, .. })
            if format!("{stdout}{stderr}").contains("credentials not found") =>
        {
            Ok(None)
        }
        Err(CredentialRetrievalError::HelperFailure { stdout, stderr, .. }) => {
            let said = first_line(&stderr).or_else(|| first_line(&stdout));
            Err(format!(
                "the credential helper `docker-credential-{} get` for {registry} (named in {}) failed{}",
                helper(),
                path.display(),
                said.map(|s| format!(": {s}")).unwrap_or_default()
            ))
        }
        Err(CredentialRetrievalError::HelperCommunicationError) => Err(format!(
            "cannot run the credential helper `docker-credential-{}` for {registry} (named in {}); is it installed and on PATH?",
            helper(),
            path.display()
        )),
        Err(CredentialRetrievalError::MalformedHelperResponse) => Err(format!(
            "the credential helper `docker-credential-{}` for {registry} (named in {}) answered something other than {{\"ServerURL\", \"Username\", \"Secret\"}} JSON",
            helper(),
            path.display()
        )),
        Err(CredentialRetrievalError::ConfigReadError | CredentialRetrievalError::ConfigNotFound) => {
            Err(format!(
                "{} is not a Docker client config (JSON with auths, credsStore, credHelpers)",
                path.display()
            ))
        }
        Err(CredentialRetrievalError::CredentialDecodingError) => Err(format!(
            "{}: auths.\"{server}\".auth must be base64 of user:password",
            path.display()
        )),
        Err(CredentialRetrievalError::CredentialMismatchError) => Err(format!(
            "{}: auths.\"{server}\" has an auth field that disagrees with its username and password",
            path.display()
        )),
    }
}

/// The helper the config names for `server` (`credHelpers`, else `credsStore`), for messages.
fn helper_for(config: &[u8], server: &str) -> String {
    let v: serde_json::Value = serde_json::from_slice(config).unwrap_or_default();
    v.pointer("/credHelpers")
        .and_then(|h| h.get(server))
        .or_else(|| v.get("credsStore"))
        .and_then(|h| h.as_str())
        .unwrap_or("?")
        .to_string()
}

/// The first non-empty line, cut to 200 characters.
fn first_line(s: &str) -> Option<String> {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_of_image_references() {
        assert_eq!(registry_of("envoyproxy/envoy:v1.36.2"), "docker.io");
        assert_eq!(registry_of("envoy"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5000/envoy:edge"), "127.0.0.1:5000");
        assert_eq!(registry_of("ghcr.io/org/envoy@sha256:ab"), "ghcr.io");
        assert_eq!(registry_of("localhost/envoy"), "localhost");
        assert_eq!(registry_of("berth-test/envoy:1.40.0"), "docker.io");
    }

    fn config(dir: &tempfile::TempDir, json: &str) -> PathBuf {
        let path = dir.path().join("config.json");
        std::fs::write(&path, json).unwrap();
        path
    }

    #[test]
    fn auths_give_user_and_password_for_their_registry_only() {
        let dir = tempfile::tempdir().unwrap();
        // base64("alice:s3cret")
        let path = config(
            &dir,
            r#"{"auths":{"127.0.0.1:5000":{"auth":"YWxpY2U6czNjcmV0"}}}"#,
        );
        let c = lookup_in(&path, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(c.username.as_deref(), Some("alice"));
        assert_eq!(c.password.as_deref(), Some("s3cret"));
        assert_eq!(c.serveraddress.as_deref(), Some("127.0.0.1:5000"));
        assert!(lookup_in(&path, "ghcr.io").unwrap().is_none());
        assert!(lookup_in(&dir.path().join("absent.json"), "ghcr.io")
            .unwrap()
            .is_none());
    }

    #[test]
    fn docker_hub_is_looked_up_under_its_index_address() {
        let dir = tempfile::tempdir().unwrap();
        let path = config(
            &dir,
            r#"{"auths":{"https://index.docker.io/v1/":{"auth":"Ym9iOmh1Ygo="}}}"#,
        );
        let c = lookup_in(&path, registry_of("envoyproxy/envoy:v1.36.2"))
            .unwrap()
            .unwrap();
        assert_eq!(c.username.as_deref(), Some("bob"));
    }

    #[test]
    fn errors_name_the_file_and_helper_but_never_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = config(&dir, "{not json");
        let e = lookup_in(&path, "r.example").unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");

        let path = config(
            &dir,
            r#"{"credHelpers":{"r.example":"berth-absent-helper"},"auths":{"other":{"auth":"YWxpY2U6czNjcmV0"}}}"#,
        );
        let e = lookup_in(&path, "r.example").unwrap_err();
        assert!(e.contains("docker-credential-berth-absent-helper"), "{e}");
        assert!(e.contains("r.example"), "{e}");
        assert!(
            !e.contains("s3cret") && !e.contains("YWxpY2U6czNjcmV0"),
            "{e}"
        );

        let path = config(&dir, r#"{"auths":{"r.example":{"auth":"!!"}}}"#);
        let e = lookup_in(&path, "r.example").unwrap_err();
        assert!(e.contains("base64"), "{e}");
    }
}
