//! `[serve]`: which components `berth serve` runs and how. Every key is optional; a component
//! set to "off" (or `false`) is not started. `berth serve`'s flags override these.
//!
//! ```toml
//! [serve]
//! listen = "127.0.0.1:9477"     # status server (/healthz, /status, /metrics), or "off"
//! resync = "30s"                # periodic full reconcile, or "0s" for none
//! confirm_timeout = "5s"        # how long replicas get to confirm new watched files
//! watch = true                  # watch the config file and the files it names
//! engine_events = true          # react to the engine's container events
//! acme = true                   # obtain and renew ACME listener certificates when due
//! liveness = true               # kill (then replace) a replica that stops serving
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use super::check::show;
use super::doc::{self, Ctx, Tbl};
use super::fields::duration;

const KEYS: &[&str] = &[
    "listen",
    "resync",
    "confirm_timeout",
    "watch",
    "engine_events",
    "acme",
    "liveness",
];

/// The default address of the status server: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9477";
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// `[serve]` as given (defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSection {
    /// None: no status server.
    pub listen: Option<SocketAddr>,
    /// None: no periodic resync.
    pub resync: Option<Duration>,
    pub confirm_timeout: Duration,
    pub watch: bool,
    pub engine_events: bool,
    /// Renew ACME listener certificates when due (and retry failures after their backoff).
    pub acme: bool,
    /// Watch every replica's liveness each second; kill and replace the dead.
    pub liveness: bool,
}

impl Default for ServeSection {
    fn default() -> Self {
        ServeSection {
            listen: Some(DEFAULT_LISTEN.parse().expect("a valid default address")),
            resync: Some(DEFAULT_RESYNC),
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            watch: true,
            engine_events: true,
            acme: true,
            liveness: true,
        }
    }
}

/// Parses a status server address: `HOST:PORT` with an IP literal, or "off".
pub fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    match s {
        "off" | "none" | "" => Ok(None),
        addr => addr.parse().map(Some).map_err(|_| {
            format!(
                "must be an IP address with a port like \"127.0.0.1:9477\", or \"off\"; got {}",
                show(addr)
            )
        }),
    }
}

pub(super) fn section(cx: &mut Ctx, root: &Tbl) -> ServeSection {
    let mut out = ServeSection::default();
    let Some(t) = root.sub(cx, "serve", KEYS) else {
        return out;
    };
    if let Some(l) = t.str(cx, "listen") {
        match parse_listen(l.v) {
            Ok(addr) => out.listen = addr,
            Err(m) => l.err(cx, m),
        }
    }
    let resync = duration(cx, &t, "resync", DEFAULT_RESYNC, true);
    out.resync = (!resync.is_zero()).then_some(resync);
    out.confirm_timeout = duration(cx, &t, "confirm_timeout", DEFAULT_CONFIRM_TIMEOUT, false);
    out.watch = flag(cx, &t, "watch");
    out.engine_events = flag(cx, &t, "engine_events");
    out.acme = flag(cx, &t, "acme");
    out.liveness = flag(cx, &t, "liveness");
    out
}

fn flag(cx: &mut Ctx, t: &Tbl, key: &str) -> bool {
    match t.get(key) {
        None => true,
        Some(v) => match v.get_ref() {
            toml::de::DeValue::Boolean(b) => *b,
            other => {
                cx.err(
                    &v.span(),
                    &t.field(key),
                    format!("must be true or false, got {}", doc::kind(other)),
                );
                true
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::core::source::file::parse;
    use std::path::Path;
    use std::time::Duration;

    const PROXY: &str = "[[proxy]]\nname = \"p\"\n[[proxy.listener]]\nname = \"web\"\nport = 8080\n[[proxy.listener.route]]\npath_prefix = \"/\"\ndirect_response = { status = 200 }\n";

    #[test]
    fn every_component_runs_unless_the_config_leaves_it_out() {
        let path = Path::new("b.toml");
        let all = parse(path, PROXY).unwrap().serve;
        assert_eq!(all, super::ServeSection::default());
        let text = format!(
            "[serve]\nlisten = \"off\"\nresync = \"0s\"\nconfirm_timeout = \"2s\"\nwatch = false\nengine_events = false\nacme = false\nliveness = false\n{PROXY}"
        );
        let s = parse(path, &text).unwrap().serve;
        assert_eq!(s.listen, None);
        assert_eq!(s.resync, None);
        assert_eq!(s.confirm_timeout, Duration::from_secs(2));
        assert!(!s.watch && !s.engine_events && !s.acme && !s.liveness);
    }

    #[test]
    fn bad_values_name_the_field() {
        let path = Path::new("b.toml");
        let text = format!("[serve]\nlisten = \"localhost\"\nwatch = \"yes\"\nport = 1\n{PROXY}");
        let errs = parse(path, &text).unwrap_err().0;
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"serve.listen"), "{errs:?}");
        assert!(fields.contains(&"serve.watch"), "{errs:?}");
        assert!(fields.contains(&"serve.port"), "{errs:?}");
        assert!(errs.iter().all(|e| e.line > 0), "{errs:?}");
    }
}
