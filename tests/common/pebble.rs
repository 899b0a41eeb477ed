//! Debian's pebble (an ACME test CA) on 127.0.0.1 with its own HTTPS certificate (trusted
//! through `ca_file`), and pebble-challtestsrv: a DNS server answering 127.0.0.1 for every
//! name, whose TXT records a test sets through its management API (`/set-txt`, `/clear-txt`).
//! Pebble resolves through challtestsrv, or through another DNS server a test runs
//! ([`Pebble::start_with`]). Both are killed when dropped; a panicking test prints pebble's log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub const PEBBLE: &str = "/usr/bin/pebble";
pub const CHALLTESTSRV: &str = "/usr/bin/pebble-challtestsrv";

/// Whether pebble and challtestsrv are installed; `test` fails under CI, is skipped elsewhere.
pub fn installed(test: &str) -> bool {
    if Path::new(PEBBLE).exists() && Path::new(CHALLTESTSRV).exists() {
        return true;
    }
    super::skip::skip(
        test,
        "pebble is not installed: apt-get install pebble (.ci/run does)",
    );
    false
}

/// What pebble is started with.
#[derive(Debug, Clone)]
pub struct Options {
    /// The port pebble validates HTTP-01 at (the proxy's plain-HTTP listener).
    pub http_port: u16,
    /// The port pebble validates TLS-ALPN-01 at (the proxy's HTTPS listener).
    pub tls_port: u16,
    /// The DNS server pebble asks ("127.0.0.1:port"); None: challtestsrv.
    pub dns: Option<String>,
    /// Certificate lifetime in seconds; None: pebble's default (years).
    pub validity_s: Option<u64>,
}

impl Options {
    pub fn new() -> Options {
        Options {
            http_port: free_port(),
            tls_port: free_port(),
            dns: None,
            validity_s: None,
        }
    }
}

pub struct Pebble {
    pub dir: PathBuf,
    pub port: u16,
    /// challtestsrv's DNS port on 127.0.0.1.
    pub dns_port: u16,
    /// challtestsrv's management API port on 127.0.0.1.
    pub management_port: u16,
    options: Options,
    pebble: Option<Child>,
    dns: Child,
}

impl Pebble {
    /// HTTP-01 validated at `http_port`, names resolved by challtestsrv, the given lifetime.
    pub fn start(dir: &Path, http_port: u16, validity_s: u64) -> Pebble {
        let mut o = Options::new();
        o.http_port = http_port;
        o.validity_s = Some(validity_s);
        Pebble::start_with(dir, o)
    }

    pub fn start_with(dir: &Path, options: Options) -> Pebble {
        let certs = super::xds::Certs::generate(&dir.join("pebble-certs"));
        let dns_port = free_port();
        let management_port = free_port();
        let dns = Command::new(CHALLTESTSRV)
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .arg("-dns01")
            .arg(format!("127.0.0.1:{dns_port}"))
            .arg("-management")
            .arg(format!("127.0.0.1:{management_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv");
        let mut p = Pebble {
            dir: certs.dir.clone(),
            port: free_port(),
            dns_port,
            management_port,
            options,
            pebble: None,
            dns,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", management_port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pebble-challtestsrv did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p.start_pebble();
        p
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.port)
    }

    /// challtestsrv's management API, e.g. for a hook that sets TXT records.
    pub fn management(&self) -> String {
        format!("http://127.0.0.1:{}", self.management_port)
    }

    pub fn start_pebble(&mut self) {
        let config = self.dir.join("pebble.json");
        let mut json = serde_json::json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{}", self.port),
            "managementListenAddress": format!("127.0.0.1:{}", free_port()),
            "certificate": self.dir.join("server.pem"),
            "privateKey": self.dir.join("server-key.pem"),
            "httpPort": self.options.http_port,
            "tlsPort": self.options.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        if let Some(v) = self.options.validity_s {
            json["pebble"]["certificateValidityPeriod"] = v.into();
        }
        std::fs::write(&config, json.to_string()).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pebble.log"))
            .unwrap();
        let dns = self
            .options
            .dns
            .clone()
            .unwrap_or(format!("127.0.0.1:{}", self.dns_port));
        let child = Command::new(PEBBLE)
            .arg("-config")
            .arg(&config)
            .arg("-dnsserver")
            .arg(dns)
            .args(["-strict=false"])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_AUTHZREUSE", "0")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("pebble");
        self.pebble = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pebble did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stop_pebble(&mut self) {
        if let Some(mut c) = self.pebble.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pebble.log")).unwrap_or_default()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop_pebble();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
        if std::thread::panicking() {
            eprintln!("--- pebble log\n{}", self.log());
        }
    }
}

/// The `tls.acme` table of a listener certified by `pebble`: `domains`, a contact, pebble's
/// directory and CA, then `extra` (`challenge`, `dns`, …).
pub fn acme_table(pebble: &Pebble, domains: &[&str], extra: &[(&str, toml::Value)]) -> toml::Value {
    let mut t = toml::Table::new();
    t.insert("domains".into(), domains.to_vec().into());
    t.insert("email".into(), "ops@berth.test".into());
    t.insert("directory".into(), pebble.directory().into());
    t.insert("ca_file".into(), pebble.ca().display().to_string().into());
    for (k, v) in extra {
        t.insert(k.to_string(), v.clone());
    }
    toml::Value::Table(t)
}

/// The status.json berth keeps for the ACME listener `https` of the test proxy.
pub fn listener_status(fleet: &super::fleet::Fleet) -> serde_json::Value {
    let path = fleet
        .state()
        .join("acme")
        .join(super::fleet::PROXY)
        .join("https")
        .join("status.json");
    serde_json::from_slice(&std::fs::read(path).expect("status.json")).unwrap()
}

/// The ACME listener `https`'s certificate as serve's /status shows it.
pub fn serve_status(serve: &super::serve::Serve) -> serde_json::Value {
    serve.proxy(super::fleet::PROXY)["certificates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["listener"] == "https"))
        .map(|c| c["acme"].clone())
        .unwrap_or_default()
}

/// Until 16 new connections in a row with SNI `name` are served one serial issued by pebble
/// other than `not` (so every replica serves it); that serial. `berth up` returns once every
/// replica confirmed it, so this is at once (the bound only ends a hang).
pub async fn wait_issued(port: u16, name: &str, not: &str) -> String {
    let start = Instant::now();
    loop {
        let (serial, issuer) = super::tls::served_by_name(port, name).await.unwrap();
        let all = super::tls::served_serials_for(port, name, 16).await;
        if issuer.contains("Pebble") && serial != not && all == [serial.clone()] {
            eprintln!(
                "{serial} from pebble served by every replica {:?} after berth up returned",
                start.elapsed()
            );
            return serial;
        }
        assert!(
            start.elapsed() < super::EVENTUALLY,
            "not served by every replica: {serial} from {issuer}; {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The 1-minute load average, for the figures a test prints.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_string()
}
