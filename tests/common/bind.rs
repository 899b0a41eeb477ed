//! Debian's bind9 (`named`) on 127.0.0.1, authoritative for one zone that accepts RFC 2136
//! updates of TXT records signed with a TSIG key made by `tsig-keygen`. Runs from a temporary
//! directory in the foreground; killed when dropped (its log printed if the test panicked).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub const NAMED: &str = "/usr/sbin/named";
pub const TSIG_KEYGEN: &str = "/usr/sbin/tsig-keygen";
pub const KEY_NAME: &str = "berth-acme";

/// Whether bind9 is installed; `test` fails under CI, is skipped elsewhere.
pub fn installed(test: &str) -> bool {
    if Path::new(NAMED).exists() && Path::new(TSIG_KEYGEN).exists() {
        return true;
    }
    super::skip::skip(
        test,
        "bind9 is not installed: apt-get install bind9 (.ci/run does)",
    );
    false
}

pub struct Named {
    pub dir: PathBuf,
    pub port: u16,
    pub zone: String,
    child: Child,
}

impl Named {
    pub fn start(dir: &Path, zone: &str) -> Named {
        let dir = dir.join("named");
        std::fs::create_dir_all(&dir).unwrap();
        let key = Command::new(TSIG_KEYGEN)
            .args(["-a", "hmac-sha256", KEY_NAME])
            .output()
            .expect("tsig-keygen");
        assert!(key.status.success(), "tsig-keygen failed");
        std::fs::write(dir.join("key.conf"), &key.stdout).unwrap();
        std::fs::write(
            dir.join("zone.db"),
            format!(
                "$TTL 60\n@ IN SOA ns1.{zone}. hostmaster.{zone}. 1 60 60 600 60\n@ IN NS ns1.{zone}.\nns1 IN A 127.0.0.1\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let d = dir.display();
        std::fs::write(
            dir.join("named.conf"),
            format!(
                r#"include "{d}/key.conf";
options {{
  directory "{d}"; pid-file "{d}/named.pid"; session-keyfile "{d}/session.key";
  managed-keys-directory "{d}";
  listen-on port {port} {{ 127.0.0.1; }}; listen-on-v6 {{ none; }};
  recursion no; dnssec-validation no;
}};
controls {{ }};
zone "{zone}" {{
  type primary; file "{d}/zone.db";
  update-policy {{ grant {KEY_NAME} zonesub TXT; }};
}};
"#
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("named.log")).unwrap();
        let child = Command::new(NAMED)
            .args(["-g", "-c"])
            .arg(dir.join("named.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("named");
        let n = Named {
            dir,
            port,
            zone: zone.to_string(),
            child,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "named did not listen: {}",
                n.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        n
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// tsig-keygen's key file: what berth's `secret_file` names.
    pub fn key_file(&self) -> PathBuf {
        self.dir.join("key.conf")
    }

    /// The TXT values at `name` as named answers them (`dig`).
    pub fn txt(&self, name: &str) -> Vec<String> {
        let out = Command::new("dig")
            .args([
                "@127.0.0.1",
                "-p",
                &self.port.to_string(),
                "+short",
                name,
                "TXT",
            ])
            .output()
            .expect("dig");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim_matches('"').to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("named.log")).unwrap_or_default()
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- named log\n{}", self.log());
        }
    }
}
