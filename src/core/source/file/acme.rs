//! A listener's `tls.acme`: the certificate is obtained from an ACME server (see `crate::ops::acme`).
//!
//! ```toml
//! tls = { acme = { domains = ["example.com"], email = "ops@example.com",
//!                  directory = "https://acme-v02.api.letsencrypt.org/directory",
//!                  ca_file = "acme-ca.pem",            # optional: the directory's CA
//!                  challenge_listener = "web" } }       # optional if one plain-HTTP listener
//! ```

use super::backend::pem;
use super::check::{self, show};
use super::doc::{self, Ctx, Tbl};
use crate::core::ir;

const KEYS: &[&str] = &[
    "domains",
    "email",
    "directory",
    "ca_file",
    "challenge_listener",
    "challenge",
    "dns",
];

/// `tls.acme` of a listener (`tls` is its table); None when it has errors (reported).
pub(super) fn acme(cx: &mut Ctx, tls: &Tbl) -> Option<ir::Acme> {
    for key in ["cert_file", "key_file"] {
        if tls.get(key).is_some() {
            cx.err(
                &tls.key_span(key),
                &tls.field(key),
                "not allowed with acme: berth obtains the certificate and key itself; use either cert_file and key_file, or acme",
            );
        }
    }
    let a = tls.sub(cx, "acme", KEYS)?;
    let errors_before = cx.error_count();
    let challenge = super::acme_dns::challenge(cx, &a);
    let wildcards = matches!(challenge, Some(ir::AcmeChallenge::Dns01(_)));
    let mut domains = Vec::new();
    if a.require(
        cx,
        "domains",
        "an array of DNS names like [\"example.com\"]",
    )
    .is_some()
    {
        if let Some((items, span, field)) = a.array(cx, "domains") {
            if items.is_empty() {
                cx.err(
                    &span,
                    &field,
                    "must list at least one DNS name, e.g. [\"example.com\"]",
                );
            }
            for (i, d) in items.iter().enumerate() {
                let Some(d) = doc::string(cx, d, format!("{field}[{i}]")) else {
                    continue;
                };
                match domain(d.v, wildcards) {
                    Ok(()) if domains.contains(&d.v.to_ascii_lowercase()) => {
                        d.err(cx, format!("{} is listed twice", show(d.v)))
                    }
                    Ok(()) => domains.push(d.v.to_ascii_lowercase()),
                    Err(m) => d.err(cx, m),
                }
            }
        }
    }
    let email = a.str(cx, "email").and_then(|e| match email(e.v) {
        Ok(()) => Some(e.v.to_string()),
        Err(m) => {
            e.err(cx, m);
            None
        }
    });
    let directory = a
        .req_str(
            cx,
            "directory",
            "the ACME directory URL, e.g. \"https://acme-v02.api.letsencrypt.org/directory\"",
        )
        .and_then(|d| match directory(d.v) {
            Ok(()) => Some(d.v.to_string()),
            Err(m) => {
                d.err(cx, m);
                None
            }
        });
    let ca_file = a
        .get("ca_file")
        .map(|_| pem(cx, &a, "ca_file", "CERTIFICATE"));
    let challenge_listener = a
        .str(cx, "challenge_listener")
        .map(|l| l.v.to_string())
        .unwrap_or_default();
    if let Some(c) = challenge
        .as_ref()
        .filter(|c| **c != ir::AcmeChallenge::Http01)
    {
        if a.get("challenge_listener").is_some() {
            cx.err(
                &a.key_span("challenge_listener"),
                &a.field("challenge_listener"),
                format!(
                    "only with challenge = \"http-01\"; {} is answered {}",
                    c.name(),
                    if *c == ir::AcmeChallenge::TlsAlpn01 {
                        "on this listener itself"
                    } else {
                        "in DNS"
                    }
                ),
            );
        }
    }
    if cx.error_count() > errors_before {
        return None;
    }
    Some(ir::Acme {
        domains,
        email,
        directory: directory?,
        ca_file,
        challenge_listener,
        challenge: challenge?,
        alpn_answers: Vec::new(),
    })
}

/// Names (or checks) each ACME listener's challenge listener: a plain-HTTP listener of the
/// same proxy. `listeners` and `routings` are the proxy's, in the same order.
pub(super) fn challenge_listeners(
    cx: &mut Ctx,
    listeners: &[Tbl],
    routings: &mut [ir::ListenerRouting],
) {
    let plain: Vec<String> = routings
        .iter()
        .filter(|r| r.tls.is_none() && matches!(r.traffic, ir::Traffic::Http { .. }))
        .map(|r| r.listener.clone())
        .collect();
    for (t, r) in listeners.iter().zip(routings.iter_mut()) {
        let Some(acme) = &mut r.acme else { continue };
        if acme.challenge != ir::AcmeChallenge::Http01 {
            continue;
        }
        let field = format!("{}.acme.challenge_listener", t.field("tls"));
        let span = t.key_span("tls");
        if acme.challenge_listener.is_empty() {
            match plain.as_slice() {
                [one] => acme.challenge_listener = one.clone(),
                [] => cx.err(&span, &field, "ACME answers HTTP-01 challenges on a plain-HTTP listener of this proxy (port 80 for a public CA): add a [[proxy.listener]] with protocol = \"http\""),
                several => cx.err(&span, &field, format!("this proxy has several plain-HTTP listeners ({}): name the one that answers HTTP-01 challenges (port 80 for a public CA) with challenge_listener", several.join(", "))),
            }
        } else if !plain.contains(&acme.challenge_listener) {
            let allowed = if plain.is_empty() {
                "this proxy has none; add a [[proxy.listener]] with protocol = \"http\"".to_string()
            } else {
                format!("plain-HTTP listeners of this proxy: {}", plain.join(", "))
            };
            cx.err(
                &span,
                &field,
                format!(
                    "must name a plain-HTTP listener (protocol = \"http\", no tls) of this proxy; got {}; {allowed}",
                    show(&acme.challenge_listener)
                ),
            );
        }
    }
}

/// A DNS name a challenge can prove: no IP address, no port; a leading `*.` wildcard only
/// with DNS-01 (`wildcards`).
fn domain(s: &str, wildcards: bool) -> Result<(), String> {
    let fail = |why: &str| {
        format!(
            "must be a DNS name like \"example.com\" ({why}); got {}",
            show(s)
        )
    };
    if s.contains('*') {
        if !wildcards {
            return Err(fail(
                "wildcards need challenge = \"dns-01\": a CA proves them only through DNS",
            ));
        }
        let rest = s.strip_prefix("*.").unwrap_or("*");
        if rest.contains('*') {
            return Err(fail(
                "a wildcard is a leading \"*.\" only, as \"*.example.com\"",
            ));
        }
        return domain(rest, false);
    }
    if s.parse::<std::net::IpAddr>().is_ok() || s.starts_with('[') {
        return Err(fail("not an IP address"));
    }
    if s.contains(':') {
        return Err(fail("no port"));
    }
    check::domain(s).map_err(|_| fail("letters, digits, '-' and '.'"))?;
    if s.ends_with('.') || s.starts_with('.') || s.contains("..") {
        return Err(fail("no empty label"));
    }
    Ok(())
}

fn email(s: &str) -> Result<(), String> {
    check::plain(s, 254)?;
    match s.split_once('@') {
        Some((user, host)) if !user.is_empty() && host.contains('.') && !s.contains(' ') => Ok(()),
        _ => Err(format!(
            "must be an e-mail address like \"ops@example.com\"; got {}",
            show(s)
        )),
    }
}

fn directory(s: &str) -> Result<(), String> {
    check::plain(s, 2048)?;
    let ok = s
        .strip_prefix("https://")
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/') && !rest.contains(' '));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "must be an https:// URL of an ACME directory (RFC 8555 requires HTTPS), e.g. \"https://acme-v02.api.letsencrypt.org/directory\"; got {}",
            show(s)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_emails_and_directories_say_what_is_allowed() {
        assert!(domain("example.com", false).is_ok());
        assert!(domain("localhost", false).is_ok());
        assert!(domain("*.example.com", false)
            .unwrap_err()
            .contains("dns-01"));
        assert!(domain("*.example.com", true).is_ok());
        assert!(domain("a.*.example.com", true)
            .unwrap_err()
            .contains("leading"));
        assert!(domain("*.127.0.0.1", true).is_err());
        assert!(domain("127.0.0.1", false)
            .unwrap_err()
            .contains("IP address"));
        assert!(domain("example.com:443", false)
            .unwrap_err()
            .contains("no port"));
        assert!(domain("a..b", false).is_err());
        assert!(email("ops@example.com").is_ok());
        assert!(email("ops").unwrap_err().contains("e-mail"));
        assert!(directory("https://127.0.0.1:14000/dir").is_ok());
        assert!(directory("http://example.com/dir")
            .unwrap_err()
            .contains("https://"));
    }
}
