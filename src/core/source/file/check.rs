//! Pure value checks. Each returns a message saying what is wrong and what is allowed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// Longest duration accepted anywhere.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Longest direct_response body.
pub const MAX_BODY: usize = 64 * 1024;
/// Longest path (route match, redirect, health check).
pub const MAX_PATH: usize = 1024;
/// Longest header value, label value, annotation value, env value.
pub const MAX_VALUE: usize = 4096;

/// A value quoted for a message: escaped (no control characters survive), truncated.
pub fn show(s: &str) -> String {
    const MAX: usize = 60;
    let mut out: String = s.chars().take(MAX).collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    format!("\"{}\"", out.escape_debug())
}

/// RFC 1123 DNS label, lowercase.
pub fn dns_label(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "must be a DNS label: 1–63 characters of a–z, 0–9 and '-', starting and ending with a letter or digit; got {}",
            show(s)
        ))
    }
}

/// No control characters (newline, tab, NUL, DEL, …) and at most `max` bytes.
pub fn plain(s: &str, max: usize) -> Result<(), String> {
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!(
            "must not contain control characters (found {:?}); got {}",
            c,
            show(s)
        ));
    }
    if s.len() > max {
        return Err(format!("must be at most {max} bytes, got {}", s.len()));
    }
    Ok(())
}

fn dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// An IP address or a DNS name (no port).
pub fn host(s: &str) -> Result<(), String> {
    if s.parse::<IpAddr>().is_ok() || dns_name(s) {
        Ok(())
    } else {
        Err(format!(
            "must be an IP address or a DNS name (letters, digits, '-', '_' and dots; at most 253 characters); got {}",
            show(s)
        ))
    }
}

/// `host:port`, `[v6]:port`.
pub fn endpoint(s: &str) -> Result<(String, u16), String> {
    let allowed = "must be host:port (an IPv4 address, a DNS name or [IPv6] followed by :1–65535)";
    let fail = || format!("{allowed}; got {}", show(s));
    let (h, p) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(fail)?;
        h.parse::<Ipv6Addr>().map_err(|_| fail())?;
        (h, p)
    } else {
        let (h, p) = s.rsplit_once(':').ok_or_else(fail)?;
        if h.contains(':') {
            return Err(format!(
                "{allowed}; write IPv6 addresses in brackets, e.g. [::1]:9000; got {}",
                show(s)
            ));
        }
        host(h).map_err(|_| fail())?;
        (h, p)
    };
    let port: u16 = p.parse().map_err(|_| fail())?;
    if port == 0 {
        return Err(fail());
    }
    Ok((h.to_string(), port))
}

/// A virtual host domain as Envoy matches it: `*`, `example.com`, `*.example.com`,
/// `*-api.example.com`, `example.*`, optionally with `:port`.
pub fn domain(s: &str) -> Result<(), String> {
    let fail = || {
        format!(
            "must be \"*\" or a host name with an optional leading or trailing '*' wildcard and optional :port (e.g. \"api.example.com\", \"*.example.org\", \"example.*\"); got {}",
            show(s)
        )
    };
    if s == "*" {
        return Ok(());
    }
    if s.len() > 253 {
        return Err(fail());
    }
    let mut name = s;
    if let Some(rest) = s.strip_prefix('[') {
        // [v6] or [v6]:port
        let (h, tail) = rest.split_once(']').ok_or_else(fail)?;
        h.parse::<Ipv6Addr>().map_err(|_| fail())?;
        return match tail {
            "" => Ok(()),
            t => match t.strip_prefix(':').map(str::parse::<u16>) {
                Some(Ok(p)) if p > 0 => Ok(()),
                _ => Err(fail()),
            },
        };
    }
    if let Some((h, p)) = s.rsplit_once(':') {
        match p.parse::<u16>() {
            Ok(p) if p > 0 => name = h,
            _ => return Err(fail()),
        }
    }
    let core = if let Some(r) = name.strip_prefix('*') {
        // "*.example.com" or "*-suffix.example.com"
        if !(r.starts_with('.') || r.starts_with('-')) {
            return Err(fail());
        }
        &r[1..]
    } else if let Some(l) = name.strip_suffix('*') {
        if !(l.ends_with('.') || l.ends_with('-')) {
            return Err(fail());
        }
        &l[..l.len() - 1]
    } else {
        name
    };
    if core.parse::<Ipv4Addr>().is_ok() || dns_name(core) {
        Ok(())
    } else {
        Err(fail())
    }
}

/// An HTTP header name (RFC 9110 token).
pub fn header_name(s: &str) -> Result<(), String> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if !s.is_empty() && s.len() <= 256 && s.bytes().all(tchar) {
        Ok(())
    } else {
        Err(format!(
            "must be an HTTP header name: 1–256 characters of letters, digits and !#$%&'*+-.^_`|~; got {}",
            show(s)
        ))
    }
}

/// A request path: starts with '/', URL path characters only. `query` also allows '?'.
pub fn url_path(s: &str, query: bool) -> Result<(), String> {
    let ok_char = |c: char| {
        c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c) || (query && c == '?')
    };
    let allowed = if query {
        "must start with '/' and contain only URL path and query characters (letters, digits, -._~!$&'()*+,;=:@/%?)"
    } else {
        "must start with '/' and contain only URL path characters (letters, digits, -._~!$&'()*+,;=:@/%; no spaces, quotes, '?' or '#')"
    };
    if !s.starts_with('/') || !s.chars().all(ok_char) {
        return Err(format!("{allowed}; got {}", show(s)));
    }
    if s.len() > MAX_PATH {
        return Err(format!("must be at most {MAX_PATH} bytes, got {}", s.len()));
    }
    Ok(())
}

/// "5s", "500ms", "1m30s", "1h", "1.5s".
pub fn duration(s: &str) -> Result<Duration, String> {
    let allowed =
        "must be a duration like \"5s\", \"500ms\", \"1m30s\" or \"1h\" (units: ms, s, m, h)";
    let fail = || format!("{allowed}; got {}", show(s));
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(fail());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(fail)?;
        if num_len == 0 {
            return Err(fail());
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| fail())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(fail()),
        };
        total += n * secs;
        rest = &rest[unit_len..];
    }
    let d = Duration::from_secs_f64(total);
    if d > MAX_DURATION {
        return Err(format!("must be at most 24h, got {}", show(s)));
    }
    Ok(d)
}

/// "512Mi", "1Gi", "500M", "1G", "1024" (bytes).
pub fn size(s: &str) -> Result<u64, String> {
    let allowed = "must be a size like \"512Mi\", \"1Gi\", \"500M\" or \"1G\", or a whole number of bytes (suffixes: Ki, Mi, Gi, Ti, K, M, G, T)";
    let fail = || format!("{allowed}; got {}", show(s));
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| fail())?;
    let mult: u64 = match unit {
        "" => 1,
        "K" | "k" => 1000,
        "M" => 1000 * 1000,
        "G" => 1000 * 1000 * 1000,
        "T" => 1000 * 1000 * 1000 * 1000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(fail()),
    };
    let bytes = n * mult as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 / 2.0 {
        return Err(fail());
    }
    Ok(bytes as u64)
}

/// An HTTP-ish status code check.
pub fn status_in(status: i64, allowed: &[i64]) -> Result<(), String> {
    if allowed.contains(&status) {
        Ok(())
    } else {
        let list: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        Err(format!("must be one of {}, got {status}", list.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(duration("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "5", "s", "5x", "-1s", "1d", "5 s s", "25h"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(size("512Mi").unwrap(), 512 << 20);
        assert_eq!(size("1G").unwrap(), 1_000_000_000);
        assert_eq!(size("1024").unwrap(), 1024);
        for bad in ["", "Mi", "1mb", "-1", "1 Gi x"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn domains() {
        for ok in [
            "*",
            "a.b",
            "*.example.org",
            "*-api.x.com",
            "example.*",
            "a.b:8080",
            "[::1]:80",
            "10.0.0.1",
        ] {
            assert!(domain(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a b", "*.", "a*b", "**", "a.b:0", "x\ny", "a.b:", "{{x}}", "*a.com",
        ] {
            assert!(domain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint("127.0.0.1:9000").unwrap(),
            ("127.0.0.1".into(), 9000)
        );
        assert_eq!(endpoint("[::1]:80").unwrap(), ("::1".into(), 80));
        assert_eq!(
            endpoint("api.internal:9000").unwrap(),
            ("api.internal".into(), 9000)
        );
        for bad in ["x", "x:0", "x:70000", "::1:80", "a b:80", ":80", "x:\n"] {
            assert!(endpoint(bad).is_err(), "{bad}");
        }
    }
}
