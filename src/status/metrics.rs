//! Prometheus text exposition (format 0.0.4) for `berth serve`: berth's own counters and
//! histograms, and each replica's Envoy stats relabelled with `proxy` and `replica`.
//!
//! Hand-written and small: counters, gauges and one histogram kind are all berth needs. Envoy's
//! `/stats/prometheus` output of several replicas is merged family by family, so every
//! `# TYPE` line appears once however many replicas report the family (strict parsers reject a
//! family split in two).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Bucket bounds (seconds) of the duration histograms: from a live route update (tens of
/// milliseconds) to a slow rollout (minutes).
pub const BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// The most Envoy samples one scrape carries (all replicas together); the rest is cut, and
/// `berth_envoy_samples_dropped` says how many.
pub const MAX_ENVOY_SAMPLES: usize = 50_000;

type Labels = Vec<(String, String)>;

#[derive(Debug, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: &'static str,
    values: BTreeMap<Labels, f64>,
    histograms: BTreeMap<Labels, Histogram>,
}

/// berth's own metrics. Cheap to update from any task.
#[derive(Debug, Default)]
pub struct Metrics {
    families: Mutex<BTreeMap<&'static str, Family>>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    fn with<F: FnOnce(&mut Family)>(
        &self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        f: F,
    ) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let fam = families.entry(name).or_insert_with(|| Family {
            help,
            kind,
            values: BTreeMap::new(),
            histograms: BTreeMap::new(),
        });
        f(fam);
    }

    /// Adds 1 to a counter.
    pub fn inc(&self, name: &'static str, help: &'static str, l: &[(&str, &str)]) {
        self.with(name, "counter", help, |f| {
            *f.values.entry(labels(l)).or_default() += 1.0;
        });
    }

    /// Sets a gauge.
    pub fn set(&self, name: &'static str, help: &'static str, l: &[(&str, &str)], v: f64) {
        self.with(name, "gauge", help, |f| {
            f.values.insert(labels(l), v);
        });
    }

    /// Removes every series of a family whose labels include `key=value` (a removed proxy).
    pub fn forget(&self, key: &str, value: &str) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let has = |l: &Labels| l.iter().any(|(k, v)| k == key && v == value);
        for fam in families.values_mut() {
            if fam.kind == "gauge" {
                fam.values.retain(|l, _| !has(l));
            }
        }
    }

    /// Removes every series of a gauge family (one recomputed in full, e.g. per scrape).
    pub fn clear(&self, name: &str) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fam) = families.get_mut(name).filter(|f| f.kind == "gauge") {
            fam.values.clear();
        }
    }

    /// Records one observation in a histogram (seconds).
    pub fn observe(&self, name: &'static str, help: &'static str, l: &[(&str, &str)], d: Duration) {
        let secs = d.as_secs_f64();
        self.with(name, "histogram", help, |f| {
            let h = f.histograms.entry(labels(l)).or_insert_with(|| Histogram {
                counts: vec![0; BUCKETS.len()],
                ..Default::default()
            });
            for (i, bound) in BUCKETS.iter().enumerate() {
                if secs <= *bound {
                    h.counts[i] += 1;
                }
            }
            h.sum += secs;
            h.count += 1;
        });
    }

    /// A counter's value (for tests and status).
    pub fn value(&self, name: &str, l: &[(&str, &str)]) -> Option<f64> {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        families.get(name)?.values.get(&labels(l)).copied()
    }

    /// The text exposition of berth's own metrics.
    pub fn render(&self) -> String {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (name, fam) in families.iter() {
            let _ = writeln!(out, "# HELP {name} {}", fam.help);
            let _ = writeln!(out, "# TYPE {name} {}", fam.kind);
            for (l, v) in &fam.values {
                let _ = writeln!(out, "{name}{} {}", label_text(l, None), number(*v));
            }
            for (l, h) in &fam.histograms {
                for (bound, c) in BUCKETS.iter().zip(&h.counts) {
                    let le = number(*bound);
                    let _ = writeln!(out, "{name}_bucket{} {c}", label_text(l, Some(("le", &le))));
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    label_text(l, Some(("le", "+Inf"))),
                    h.count
                );
                let _ = writeln!(out, "{name}_sum{} {}", label_text(l, None), number(h.sum));
                let _ = writeln!(out, "{name}_count{} {}", label_text(l, None), h.count);
            }
        }
        out
    }
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// `{k="v",…}` with values escaped, or "" without labels.
fn label_text(l: &Labels, extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{}\"", escape(v)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Escapes a label value: backslash, double quote, newline.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Merges the `/stats/prometheus` answers of several replicas, each given as
/// `(proxy, replica, text)`, into one exposition where every sample carries `proxy` and
/// `replica` labels. At most `max_samples` samples are kept; returns the text and how many were
/// dropped.
pub fn merge_envoy(replicas: &[(String, String, String)], max_samples: usize) -> (String, usize) {
    // family name → (TYPE line, samples)
    let mut families: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut kept = 0usize;
    let mut dropped = 0usize;
    for (proxy, replica, text) in replicas {
        let extra = format!(
            "proxy=\"{}\",replica=\"{}\"",
            escape(proxy),
            escape(replica)
        );
        let mut current: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split_whitespace().next().unwrap_or("").to_string();
                families
                    .entry(name.clone())
                    .or_insert_with(|| (line.to_string(), Vec::new()));
                current = Some(name);
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some(sample) = relabel(line, &extra) else {
                continue;
            };
            if kept >= max_samples {
                dropped += 1;
                continue;
            }
            let key = current
                .clone()
                .unwrap_or_else(|| line.split(['{', ' ']).next().unwrap_or("").to_string());
            families
                .entry(key)
                .or_insert_with(|| (String::new(), Vec::new()))
                .1
                .push(sample);
            kept += 1;
        }
    }
    let mut out = String::new();
    for (_, (type_line, samples)) in families {
        if samples.is_empty() {
            continue;
        }
        if !type_line.is_empty() {
            out.push_str(&type_line);
            out.push('\n');
        }
        for s in samples {
            out.push_str(&s);
            out.push('\n');
        }
    }
    (out, dropped)
}

/// Adds labels to one sample line: `name{a="b"} 1` → `name{a="b",<extra>} 1`.
fn relabel(line: &str, extra: &str) -> Option<String> {
    if let Some(open) = line.find('{') {
        // Label values may contain '}' only escaped inside quotes; Envoy's never do, but find
        // the closing brace after the last quote to be safe.
        let close = line[open..].rfind('}')? + open;
        let inner = &line[open + 1..close];
        let sep = if inner.trim().is_empty() { "" } else { "," };
        Some(format!(
            "{}{{{inner}{sep}{extra}}}{}",
            &line[..open],
            &line[close + 1..]
        ))
    } else {
        let (name, rest) = line.split_once(' ')?;
        Some(format!("{name}{{{extra}}} {rest}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_histograms() {
        let m = Metrics::new();
        m.inc("berth_x_total", "X.", &[("proxy", "a")]);
        m.inc("berth_x_total", "X.", &[("proxy", "a")]);
        m.set("berth_g", "G.", &[], 2.5);
        m.observe(
            "berth_d_seconds",
            "D.",
            &[("proxy", "a\"b")],
            Duration::from_millis(30),
        );
        let text = m.render();
        assert!(text.contains("# TYPE berth_x_total counter\nberth_x_total{proxy=\"a\"} 2\n"));
        assert!(text.contains("berth_g 2.5\n"));
        assert!(text.contains("berth_d_seconds_bucket{proxy=\"a\\\"b\",le=\"0.05\"} 1\n"));
        assert!(text.contains("berth_d_seconds_bucket{proxy=\"a\\\"b\",le=\"0.025\"} 0\n"));
        assert!(text.contains("berth_d_seconds_count{proxy=\"a\\\"b\"} 1\n"));
        assert_eq!(m.value("berth_x_total", &[("proxy", "a")]), Some(2.0));
    }

    #[test]
    fn merges_replicas_family_by_family() {
        let a = "# TYPE envoy_a counter\nenvoy_a{} 1\n# TYPE envoy_b gauge\nenvoy_b{x=\"1\"} 2\n";
        let b = "# TYPE envoy_a counter\nenvoy_a{} 3\n";
        let (text, dropped) = merge_envoy(
            &[
                ("p".into(), "r0".into(), a.into()),
                ("p".into(), "r1".into(), b.into()),
            ],
            100,
        );
        assert_eq!(dropped, 0);
        assert_eq!(
            text,
            "# TYPE envoy_a counter\nenvoy_a{proxy=\"p\",replica=\"r0\"} 1\n\
             envoy_a{proxy=\"p\",replica=\"r1\"} 3\n# TYPE envoy_b gauge\n\
             envoy_b{x=\"1\",proxy=\"p\",replica=\"r0\"} 2\n"
        );
        let (_, dropped) = merge_envoy(&[("p".into(), "r0".into(), a.into())], 1);
        assert_eq!(dropped, 1);
    }
}
