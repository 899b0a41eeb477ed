//! A real registry for the tests: Debian's `docker-registry` (the distribution registry 2.8)
//! started on 127.0.0.1 with htpasswd auth over plain HTTP (Docker allows 127.0.0.0/8
//! registries without TLS), and `docker login` into a DOCKER_CONFIG the test owns. On drop the
//! process and its storage go, with the local tags of what was pushed under its address.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, short_tempdir, unique};

fn docker(args: &[&str]) {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {}", stderr(&out));
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

pub const REGISTRY: &str = "/usr/bin/docker-registry";
pub const USER: &str = "berth";

/// The registry process and its storage; killed and removed on drop, with the local tag.
pub struct Registry {
    child: Child,
    pub dir: tempfile::TempDir,
    pub host: String,
    /// The tag the test pushes, `<host>/envoy:edge`.
    pub image: String,
    pub password: String,
}

impl Registry {
    /// `curl -u` against the registry's API: (HTTP status, headers and body).
    pub fn api(&self, path: &str, accept: &str) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-i", "-u", &format!("{USER}:{}", self.password)])
            .args(["-H", &format!("Accept: {accept}")])
            .arg(format!("http://{}{path}", self.host))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    pub fn start() -> Registry {
        Registry::start_as("127.0.0.1")
    }

    /// [`Registry::start`] on 127.0.0.1, named `name` in its image references (`localhost`:
    /// the engine resolves it, and Docker trusts plain HTTP to what resolves into 127.0.0.0/8).
    pub fn start_as(name: &str) -> Registry {
        let dir = short_tempdir();
        let port = free_port();
        let host = format!("{name}:{port}");
        let listen = format!("127.0.0.1:{port}");
        let password = format!("pw-{}", unique("r"));
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", USER, &password])
            .output()
            .expect("htpasswd (apache2-utils)");
        assert!(htpasswd.status.success());
        std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout).unwrap();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\nhttp:\n  addr: {listen}\nauth:\n  htpasswd:\n    realm: berth-test\n    path: {root}/htpasswd\n",
            root = dir.path().display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry");
        let registry = Registry {
            child,
            image: format!("{host}/envoy:edge"),
            host,
            dir,
            password,
        };
        // Up when /v2/ asks for credentials.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
                .arg(format!("http://{}/v2/", registry.host))
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout) == "401" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the registry did not start: {}",
                std::fs::read_to_string(registry.dir.path().join("registry.log"))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }

    /// Pushes `local` under the test's tag, logged in through `config`, then points the local
    /// tag back at `OLD`: only a pull from the registry can tell that the tag moved.
    pub fn push(&self, local: &str, config: &Path) {
        docker(&["tag", local, &self.image]);
        let out = Command::new("docker")
            .env("DOCKER_CONFIG", config)
            .args(["push", &self.image])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker push: {}", stderr(&out));
        docker(&["rmi", &self.image]);
    }

    /// A Docker client config dir logged in to this registry with `docker login`.
    pub fn login(&self) -> tempfile::TempDir {
        let config = short_tempdir();
        let mut login = Command::new("docker")
            .env("DOCKER_CONFIG", config.path())
            .args(["login", "-u", USER, "--password-stdin", &self.host])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        login
            .stdin
            .take()
            .unwrap()
            .write_all(self.password.as_bytes())
            .unwrap();
        let out = login.wait_with_output().unwrap();
        assert!(out.status.success(), "docker login: {}", stderr(&out));
        config
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("docker").args(["rmi", &self.image]).output();
        // Pulled images keep a digest reference (`<host>/envoy@sha256:…`) once untagged.
        let repo = self.image.rsplit_once(':').map_or(&*self.image, |(r, _)| r);
        if let Ok(out) = Command::new("docker")
            .args([
                "images",
                "--digests",
                "--format",
                "{{.Repository}}@{{.Digest}}",
            ])
            .arg(repo)
            .output()
        {
            for reference in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rmi", reference]).output();
            }
        }
    }
}
