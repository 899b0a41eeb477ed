//! A listener's `tls.acme.challenge` and, for DNS-01, `tls.acme.dns` (see `crate::ops::acme::dns`).
//!
//! ```toml
//! [proxy.listener.tls.acme]
//! challenge = "dns-01"                 # or "http-01" (default), "tls-alpn-01"
//! [proxy.listener.tls.acme.dns]
//! provider = "rfc2136"                 # RFC 2136 update signed with TSIG
//! server = "192.0.2.53:53"
//! zone = "example.com"
//! key_name = "berth-acme"
//! algorithm = "hmac-sha256"
//! secret_file = "acme-tsig.key"        # the base64 secret, or tsig-keygen's key file
//! # provider = "hook": command = ["/usr/local/bin/dns-hook"], env_file = "dns.env", timeout = "60s"
//! resolvers = ["192.0.2.53:53"]        # optional: asked for the record instead of the zone's NS
//! propagation_timeout = "2m"
//! propagation_interval = "2s"
//! ttl = 60
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::check::{self, show};
use super::doc::{self, Ctx, Tbl};
use super::fields::duration;
use crate::core::ir;

const DNS_KEYS: &[&str] = &[
    "provider",
    "server",
    "zone",
    "key_name",
    "algorithm",
    "secret_file",
    "command",
    "env_file",
    "timeout",
    "resolvers",
    "propagation_timeout",
    "propagation_interval",
    "ttl",
];
const RFC2136_KEYS: &[&str] = &["server", "zone", "key_name", "algorithm", "secret_file"];
const HOOK_KEYS: &[&str] = &["command", "env_file", "timeout"];
pub const ALGORITHMS: &[&str] = &["hmac-sha256", "hmac-sha384", "hmac-sha512"];

/// `challenge` (and `dns` for DNS-01) of a `tls.acme` table; None when it has errors (reported).
pub(super) fn challenge(cx: &mut Ctx, a: &Tbl) -> Option<ir::AcmeChallenge> {
    let allowed = "\"http-01\", \"tls-alpn-01\" or \"dns-01\"";
    let kind = match a.str(cx, "challenge") {
        None if a.get("challenge").is_some() => return None,
        None => "http-01",
        Some(c) => match c.v {
            "http-01" | "tls-alpn-01" | "dns-01" => c.v,
            other => {
                c.err(cx, format!("must be {allowed}; got {}", show(other)));
                return None;
            }
        },
    };
    if kind != "dns-01" {
        if a.get("dns").is_some() {
            cx.err(
                &a.key_span("dns"),
                &a.field("dns"),
                format!("only with challenge = \"dns-01\" (this listener answers {kind})"),
            );
            return None;
        }
        return Some(if kind == "http-01" {
            ir::AcmeChallenge::Http01
        } else {
            ir::AcmeChallenge::TlsAlpn01
        });
    }
    a.require(
        cx,
        "dns",
        "a [proxy.listener.tls.acme.dns] table naming provider = \"rfc2136\" or \"hook\"",
    )?;
    let d = a.sub(cx, "dns", DNS_KEYS)?;
    dns(cx, &d).map(ir::AcmeChallenge::Dns01)
}

fn dns(cx: &mut Ctx, d: &Tbl) -> Option<ir::Dns01> {
    let errors_before = cx.error_count();
    let provider = d.req_str(cx, "provider", "\"rfc2136\" or \"hook\"")?;
    let (own, other) = match provider.v {
        "rfc2136" => (RFC2136_KEYS, HOOK_KEYS),
        "hook" => (HOOK_KEYS, RFC2136_KEYS),
        p => {
            provider.err(cx, format!("must be \"rfc2136\" (a dynamic update signed with TSIG) or \"hook\" (a command you provide); got {}", show(p)));
            return None;
        }
    };
    for key in other {
        if d.get(key).is_some() {
            cx.err(
                &d.key_span(key),
                &d.field(key),
                format!(
                    "not a setting of provider = {}; its settings: {}",
                    show(provider.v),
                    own.join(", ")
                ),
            );
        }
    }
    let provider = if provider.v == "rfc2136" {
        rfc2136(cx, d)
    } else {
        hook(cx, d)
    };
    let mut resolvers = Vec::new();
    if let Some((items, _, field)) = d.array(cx, "resolvers") {
        for (i, r) in items.iter().enumerate() {
            let Some(r) = doc::string(cx, r, format!("{field}[{i}]")) else {
                continue;
            };
            match socket_addr(r.v) {
                Ok(a) => resolvers.push(a),
                Err(m) => r.err(cx, m),
            }
        }
    }
    let propagation_timeout = duration(
        cx,
        d,
        "propagation_timeout",
        Duration::from_secs(120),
        false,
    );
    let propagation_interval =
        duration(cx, d, "propagation_interval", Duration::from_secs(2), false);
    let ttl = d.int(cx, "ttl", 1, 86400).map_or(60, |t| t.v as u32);
    if cx.error_count() > errors_before {
        return None;
    }
    Some(ir::Dns01 {
        provider: provider?,
        resolvers,
        propagation_timeout,
        propagation_interval,
        ttl,
    })
}

fn rfc2136(cx: &mut Ctx, d: &Tbl) -> Option<ir::DnsProvider> {
    let server = d
        .req_str(
            cx,
            "server",
            "the zone's primary server as \"address:port\", e.g. \"192.0.2.53:53\"",
        )
        .and_then(|s| socket_addr(s.v).map_err(|m| s.err(cx, m)).ok());
    let zone = d
        .req_str(cx, "zone", "the zone updated, e.g. \"example.com\"")
        .and_then(|z| {
            let name = z.v.trim_end_matches('.').to_ascii_lowercase();
            match check::domain(&name) {
                Ok(()) if !name.contains('*') && !name.is_empty() => Some(name),
                _ => {
                    z.err(
                        cx,
                        format!("must be a DNS zone like \"example.com\"; got {}", show(z.v)),
                    );
                    None
                }
            }
        });
    let key_name = d
        .req_str(cx, "key_name", "the TSIG key's name, as the server knows it")
        .and_then(|k| match check::domain(k.v.trim_end_matches('.')) {
            Ok(()) if !k.v.is_empty() => Some(k.v.trim_end_matches('.').to_string()),
            _ => {
                k.err(
                    cx,
                    format!(
                        "must be a DNS name like \"berth-acme\" (letters, digits, '-' and '.'); got {}",
                        show(k.v)
                    ),
                );
                None
            }
        });
    let algorithm = match d.str(cx, "algorithm") {
        None => Some("hmac-sha256".to_string()),
        Some(a) if ALGORITHMS.contains(&a.v.to_ascii_lowercase().as_str()) => {
            Some(a.v.to_ascii_lowercase())
        }
        Some(a) => {
            a.err(
                cx,
                format!(
                    "must be one of {}; got {}",
                    ALGORITHMS.join(", "),
                    show(a.v)
                ),
            );
            None
        }
    };
    let secret_file = d
        .req_str(
            cx,
            "secret_file",
            "a file holding the TSIG key's base64 secret (or tsig-keygen's key file)",
        )
        .and_then(|s| {
            let path = cx.named_file(s.v);
            match read_tsig_secret(&path) {
                Ok(_) => Some(path),
                Err(e) => {
                    s.err(
                        cx,
                        format!("{e:#}; relative paths are relative to the config file"),
                    );
                    None
                }
            }
        });
    Some(ir::DnsProvider::Rfc2136 {
        server: server?,
        zone: zone?,
        key_name: key_name?,
        algorithm: algorithm?,
        secret_file: secret_file?,
    })
}

fn hook(cx: &mut Ctx, d: &Tbl) -> Option<ir::DnsProvider> {
    let mut command = Vec::new();
    let what = "the command and its arguments, e.g. [\"/usr/local/bin/dns-hook\"]; berth adds BERTH_ACME_* variables";
    if d.require(cx, "command", what).is_some() {
        if let Some((items, span, field)) = d.array(cx, "command") {
            if items.is_empty() {
                cx.err(&span, &field, format!("must not be empty: {what}"));
            }
            for (i, c) in items.iter().enumerate() {
                if let Some(c) = doc::string(cx, c, format!("{field}[{i}]")) {
                    command.push(c.v.to_string());
                }
            }
        }
    }
    if let Some(program) = command.first_mut() {
        if program.contains('/') {
            let path = cx.named_file(program);
            if !path.is_file() {
                cx.err(
                    &d.key_span("command"),
                    &d.field("command[0]"),
                    format!(
                        "{} is not a file; relative paths are relative to the config file",
                        show(&path.display().to_string())
                    ),
                );
            }
            *program = path.display().to_string();
        }
    }
    let env_file = d.str(cx, "env_file").and_then(|e| {
        let path = cx.named_file(e.v);
        match read_env_file(&path) {
            Ok(_) => Some(path),
            Err(m) => {
                e.err(
                    cx,
                    format!("{m:#}; relative paths are relative to the config file"),
                );
                None
            }
        }
    });
    let timeout = duration(cx, d, "timeout", Duration::from_secs(60), false);
    if command.is_empty() || (d.get("env_file").is_some() && env_file.is_none()) {
        return None;
    }
    Some(ir::DnsProvider::Hook {
        command,
        env_file,
        timeout,
    })
}

fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        format!(
            "must be an IP address and port like \"192.0.2.53:53\" or \"[2001:db8::53]:53\"; got {}",
            show(s)
        )
    })
}

/// The TSIG secret (decoded) in `path`: the base64 secret alone, or a `tsig-keygen` key file
/// (`key "name" { algorithm hmac-sha256; secret "..."; };`). Never shown in an error.
pub fn read_tsig_secret(path: &Path) -> Result<Vec<u8>> {
    use base64::Engine;
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {shown}"))?;
    if !meta.is_file() || meta.len() > 64 * 1024 {
        bail!("{shown} is not a TSIG secret file (a regular file of at most 64 KiB)");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {shown}"))?;
    let b64 = match text.find("secret") {
        Some(at) if text.contains('{') => text[at + "secret".len()..]
            .split('"')
            .nth(1)
            .unwrap_or_default()
            .to_string(),
        _ => text.trim().to_string(),
    };
    match base64::engine::general_purpose::STANDARD.decode(b64.trim()) {
        Ok(secret) if !secret.is_empty() => Ok(secret),
        _ => bail!("{shown} holds no TSIG secret: expected the base64 secret alone, or a tsig-keygen key file with secret \"...\""),
    }
}

/// The `NAME=value` lines of a hook's env file (blank lines and `#` comments skipped).
pub fn read_env_file(path: &Path) -> Result<Vec<(String, String)>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {shown}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        match line.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !k.starts_with("BERTH_ACME_") =>
            {
                let v = v.trim();
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(v);
                out.push((k.to_string(), v.to_string()));
            }
            _ => bail!(
                "{shown}, line {}: expected NAME=value (NAME of letters, digits and '_', not BERTH_ACME_*)",
                i + 1
            ),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::core::ir;

    const HEAD: &str = r#"
[[proxy]]
name = "edge"
[[proxy.listener]]
name = "https"
port = 8443
protocol = "https"
[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "a" }
[proxy.listener.tls.acme]
directory = "https://ca.example/dir"
"#;

    fn parse(dir: &std::path::Path, tail: &str) -> Result<ir::Acme, String> {
        let text = format!("{HEAD}{tail}");
        match crate::core::source::file::parse(&dir.join("berth.toml"), &text) {
            Ok(c) => {
                let ir::Routing::Standalone(s) = &c.infra.proxies[0].routing else {
                    panic!()
                };
                Ok(s.listeners[0].acme.clone().unwrap())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn rfc2136_reads_a_tsig_keygen_file_and_allows_wildcards() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("k.key"),
            "key \"berth-acme\" {\n\talgorithm hmac-sha256;\n\tsecret \"c2VjcmV0\";\n};\n",
        )
        .unwrap();
        let a = parse(
            dir.path(),
            r#"domains = ["*.example.com", "example.com"]
challenge = "dns-01"
[proxy.listener.tls.acme.dns]
provider = "rfc2136"
server = "127.0.0.1:53"
zone = "example.com."
key_name = "berth-acme"
secret_file = "k.key"
propagation_timeout = "30s"
"#,
        )
        .unwrap();
        let ir::AcmeChallenge::Dns01(d) = &a.challenge else {
            panic!("{a:?}")
        };
        assert_eq!(d.propagation_timeout, std::time::Duration::from_secs(30));
        assert_eq!(d.ttl, 60);
        let ir::DnsProvider::Rfc2136 {
            zone,
            algorithm,
            secret_file,
            ..
        } = &d.provider
        else {
            panic!()
        };
        assert_eq!(
            (zone.as_str(), algorithm.as_str()),
            ("example.com", "hmac-sha256")
        );
        assert_eq!(super::read_tsig_secret(secret_file).unwrap(), b"secret");
        assert_eq!(a.domains, ["*.example.com", "example.com"]);
        assert!(a.challenge_listener.is_empty());
    }

    #[test]
    fn errors_name_the_field_and_what_is_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let e = parse(dir.path(), "domains = [\"*.example.com\"]\n").unwrap_err();
        assert!(e.contains("domains[0]") && e.contains("dns-01"), "{e}");
        let e = parse(
            dir.path(),
            "domains = [\"*.example.com\"]\nchallenge = \"tls-alpn-01\"\n",
        )
        .unwrap_err();
        assert!(e.contains("wildcards need challenge"), "{e}");
        let e = parse(
            dir.path(),
            "domains = [\"a.example\"]\nchallenge = \"dns-02\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("berth.toml:")
                && e.contains("tls.acme.challenge")
                && e.contains("\"tls-alpn-01\""),
            "{e}"
        );
        let e = parse(
            dir.path(),
            "domains = [\"a.example\"]\nchallenge = \"dns-01\"\n",
        )
        .unwrap_err();
        assert!(e.contains("missing required field `dns`"), "{e}");
        let e = parse(
            dir.path(),
            "domains = [\"a.example\"]\nchallenge = \"dns-01\"\n[proxy.listener.tls.acme.dns]\nprovider = \"hook\"\ncommand = [\"./nope.sh\"]\nzone = \"a.example\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("dns.zone") && e.contains("not a setting of provider = \"hook\""),
            "{e}"
        );
        assert!(e.contains("nope.sh") && e.contains("is not a file"), "{e}");
        let e = parse(
            dir.path(),
            "domains = [\"a.example\"]\nchallenge = \"dns-01\"\n[proxy.listener.tls.acme.dns]\nprovider = \"rfc2136\"\nserver = \"ns.example:53\"\nzone = \"a.example\"\nkey_name = \"k\"\nalgorithm = \"hmac-md5\"\nsecret_file = \"missing.key\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("dns.server") && e.contains("IP address and port"),
            "{e}"
        );
        assert!(
            e.contains("dns.algorithm") && e.contains("hmac-sha512"),
            "{e}"
        );
        assert!(
            e.contains("dns.secret_file") && e.contains("missing.key"),
            "{e}"
        );
        // The listener has no plain-HTTP sibling: only http-01 needs one.
        let e = parse(dir.path(), "domains = [\"a.example\"]\n").unwrap_err();
        assert!(e.contains("plain-HTTP listener"), "{e}");
        assert!(parse(
            dir.path(),
            "domains = [\"a.example\"]\nchallenge = \"tls-alpn-01\"\n"
        )
        .is_ok());
    }

    #[test]
    fn env_files_are_name_value_lines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("e.env");
        std::fs::write(&f, "# c\nA=1\nexport B=\"two words\"\n\n").unwrap();
        assert_eq!(
            super::read_env_file(&f).unwrap(),
            [
                ("A".to_string(), "1".to_string()),
                ("B".into(), "two words".into())
            ]
        );
        std::fs::write(&f, "BERTH_ACME_VALUE=x\n").unwrap();
        assert!(super::read_env_file(&f)
            .unwrap_err()
            .to_string()
            .contains("line 1"));
    }
}
