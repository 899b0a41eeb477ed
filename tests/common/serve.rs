//! `berth serve` as a child process for tests: its status server, its log, and a test case
//! (config, state directory, cleanup guard). Serve is killed on drop.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config as cfg;
use super::{ensure_test_image, free_port, short_tempdir, Cleanup};

/// A running `berth serve`; killed on drop.
pub struct Serve {
    pub child: Option<Child>,
    pub status_port: u16,
    pub log: PathBuf,
}

impl Serve {
    pub fn start(config: &Path, state: &Path, cleanup: &Cleanup, extra: &[&str]) -> Serve {
        let status_port = free_port();
        let log = state.with_extension("serve.log");
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = super::berth_on(config, state, &cleanup.case)
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{status_port}"))
            // A long resync unless the test sets its own: tests see what events trigger.
            .args(if extra.contains(&"--resync") {
                &[][..]
            } else {
                &["--resync", "300s"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("starting berth serve");
        let s = Serve {
            child: Some(child),
            status_port,
            log,
        };
        s.wait_for("the status server", Duration::from_secs(20), |s| {
            s.get("/healthz").map(|(c, _)| c == 200).unwrap_or(false)
        });
        s
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.status_port, path)
    }

    pub fn status(&self) -> Value {
        let (code, body) = self.get("/status").expect("GET /status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    pub fn proxy(&self, name: &str) -> Value {
        self.status()["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Polls until `ok`, or panics with serve's log and status.
    pub fn wait_for(&self, what: &str, within: Duration, ok: impl Fn(&Serve) -> bool) -> Duration {
        let start = Instant::now();
        loop {
            if ok(self) {
                return start.elapsed();
            }
            if start.elapsed() > within {
                panic!(
                    "waited {within:?} for {what}\nstatus: {}\nserve log:\n{}",
                    self.get("/status").map(|s| s.1).unwrap_or_default(),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every sample of the counter or gauge `name` on /metrics, by its label set as written
    /// (`source="docker"`; empty without labels).
    pub fn samples(&self, name: &str) -> std::collections::BTreeMap<String, f64> {
        let (code, text) = self.get("/metrics").expect("GET /metrics");
        assert_eq!(code, 200, "{text}");
        text.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                let (labels, value) = match rest.strip_prefix('{') {
                    Some(r) => r.split_once("} ")?,
                    None => ("", rest.strip_prefix(' ')?),
                };
                Some((labels.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// The proxy has `n` replicas of its desired generation, all LIVE, and Ready is True.
    pub fn converged(&self, name: &str, n: usize) -> bool {
        let p = self.proxy(name);
        let gen = p["desiredGeneration"].as_u64();
        let reps = p["replicas"].as_array().cloned().unwrap_or_default();
        reps.len() == n
            && reps
                .iter()
                .all(|r| r["ready"] == true && r["observedGeneration"].as_u64() == gen)
            && condition(&p, "Ready")["status"] == "True"
            && p["busy"].is_null()
    }

    pub fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        unsafe {
            libc::kill(pid, sig);
        }
    }

    /// Waits for serve to exit, at most `within`.
    pub fn wait_exit(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let start = Instant::now();
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return (status, start.elapsed());
            }
            if start.elapsed() > within {
                panic!(
                    "serve did not exit within {within:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn condition(proxy: &Value, type_: &str) -> Value {
    proxy["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// A plain HTTP/1.1 GET (one request, then close) to 127.0.0.1:port: status code and body.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// One proxy answering `body` on `port`, with a quick rollout and drain.
pub fn config(
    name: &str,
    image: &str,
    replicas: u32,
    port: u16,
    body: &str,
    min_ready: &str,
) -> String {
    cfg::Proxy::new(name, image, replicas)
        .set("rollout.min_ready", min_ready)
        .set("shutdown.drain_timeout", "5s")
        .set("shutdown.min_drain_duration", "0s")
        .listener(cfg::Listener::http("web", port).route(cfg::Route::direct("/", 200, body)))
        .to_toml()
}

/// Replaces the config file the way editors do: write a temp file, rename it over.
pub fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A test fixture: a config directory, a state directory, the cleanup guard.
pub struct Case {
    pub cleanup: Cleanup,
    pub _config_dir: tempfile::TempDir,
    pub state_dir: tempfile::TempDir,
    pub config: PathBuf,
    pub name: String,
    pub port: u16,
}

impl Case {
    pub fn new(test: &str) -> Case {
        ensure_test_image();
        let cleanup = Cleanup::new(test);
        let config_dir = short_tempdir();
        let state_dir = short_tempdir();
        let config = config_dir.path().join("berth.toml");
        Case {
            name: {
                let alnum: String = cleanup
                    .case
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric())
                    .collect();
                format!("s{}", &alnum[alnum.len() - 8..])
            },
            cleanup,
            _config_dir: config_dir,
            state_dir,
            config,
            port: free_port(),
        }
    }

    pub fn write(&self, image: &str, replicas: u32, body: &str, min_ready: &str) {
        write_config(
            &self.config,
            &config(&self.name, image, replicas, self.port, body, min_ready),
        );
    }

    pub fn serve(&self, extra: &[&str]) -> Serve {
        Serve::start(&self.config, self.state_dir.path(), &self.cleanup, extra)
    }

    /// The running containers of this case: (id, name, image).
    pub fn containers(&self) -> Vec<(String, String, String)> {
        let out = Command::new("docker")
            .args(["ps", "--filter"])
            .arg(format!("label={}", self.cleanup.filter()))
            .args(["--format", "{{.ID}} {{.Names}} {{.Image}}"])
            .output()
            .unwrap();
        let mut v: Vec<(String, String, String)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((
                    it.next()?.to_string(),
                    it.next()?.to_string(),
                    it.next()?.to_string(),
                ))
            })
            .filter(|(_, name, _)| name.starts_with("berth-"))
            .collect();
        v.sort_by(|a, b| a.1.cmp(&b.1));
        v
    }

    pub fn body(&self) -> String {
        http_get(self.port, "/").map(|r| r.1).unwrap_or_default()
    }

    pub fn xds(&self, file: &str) -> String {
        std::fs::read_to_string(
            self.state_dir
                .path()
                .join("proxies")
                .join(&self.name)
                .join("xds")
                .join(file),
        )
        .unwrap_or_default()
    }
}
