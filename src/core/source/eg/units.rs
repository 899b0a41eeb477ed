//! Go durations and Kubernetes quantities, as EnvoyProxy resources spell them.

use std::time::Duration;

use serde_json::Value;

use super::node::{kind, Node};
use super::Result;

pub(super) fn duration(at: &Node<'_>) -> Result<Duration> {
    let s = at.str()?;
    parse_go_duration(s)
        .map_err(|why| at.err(format!("{why} (got {s:?}; e.g. \"60s\", \"1m30s\")")))
}

/// Parses a Go/Kubernetes duration string: "60s", "1m30s", "1.5h", "250ms", "0".
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err("not a duration".into());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." {
            return Err("not a duration".into());
        }
        let n: f64 = num.parse().map_err(|_| "not a duration".to_string())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err("missing unit (ns, us, ms, s, m, h)".into()),
            u => return Err(format!("unknown unit {u:?} (ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        total += n * secs;
    }
    Duration::try_from_secs_f64(total).map_err(|_| "out of range".to_string())
}

/// A Kubernetes quantity as a number: "100m" → 0.1, "1.5" → 1.5, "512Mi" → 536870912,
/// "1G" → 1e9, "1e3" → 1000. JSON numbers are taken as they are.
pub fn parse_quantity(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (mut num, mut suffix) = s.split_at(num_end);
    // Decimal exponent ("1e3", "5E-2"), as opposed to the exa suffix "E".
    let mut exp = 0i32;
    if let Some(e) = suffix.strip_prefix(['e', 'E']) {
        if !e.is_empty()
            && e.trim_start_matches(['+', '-'])
                .chars()
                .all(|c| c.is_ascii_digit())
        {
            exp = e.parse().map_err(|_| "bad exponent".to_string())?;
            suffix = "";
        }
    }
    num = num.trim();
    if num.is_empty() {
        return Err("not a quantity".into());
    }
    let n: f64 = num.parse().map_err(|_| "not a quantity".to_string())?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        u => return Err(format!("unknown suffix {u:?}")),
    };
    let v = n * mult * 10f64.powi(exp);
    if !v.is_finite() {
        return Err("out of range".into());
    }
    Ok(v)
}

fn quantity(at: &Node<'_>) -> Result<f64> {
    let v = match at.value {
        Value::Number(n) => n.as_f64().ok_or_else(|| at.err("not a number"))?,
        Value::String(s) => parse_quantity(s).map_err(|why| {
            at.err(format!(
                "{why} (got {s:?}; e.g. \"500m\", \"1.5\", \"512Mi\", \"1G\")"
            ))
        })?,
        other => return Err(at.err(format!("expected a quantity, got {}", kind(other)))),
    };
    if v < 0.0 {
        return Err(at.err(format!("must be ≥ 0, got {v}")));
    }
    Ok(v)
}

pub(super) fn cpu_quantity(at: &Node<'_>) -> Result<f64> {
    quantity(at)
}

pub(super) fn memory_quantity(at: &Node<'_>) -> Result<u64> {
    let v = quantity(at)?.ceil();
    if v > u64::MAX as f64 {
        return Err(at.err("out of range"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let d = |s| parse_go_duration(s).unwrap();
        assert_eq!(d("60s"), Duration::from_secs(60));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("1h2m3s4ms"), Duration::from_millis(3_723_004));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "60", "-5s", "5 s", "1d", "s", ".s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quantities() {
        let q = |s| parse_quantity(s).unwrap();
        assert!((q("100m") - 0.1).abs() < 1e-12);
        assert_eq!(q("1.5"), 1.5);
        assert_eq!(q("2"), 2.0);
        assert_eq!(q("512Mi"), 536_870_912.0);
        assert_eq!(q("1G"), 1e9);
        assert_eq!(q("1Gi"), 1_073_741_824.0);
        assert_eq!(q("1e3"), 1000.0);
        assert_eq!(q("2E"), 2e18);
        assert!(parse_quantity("12XB").is_err());
        assert!(parse_quantity("Mi").is_err());
    }
}
