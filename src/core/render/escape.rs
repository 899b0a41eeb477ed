//! Quoting user values for YAML.
//!
//! Every string a template prints goes through [`quote`] (it is the tera escape function, and
//! autoescape is on for every template), so it always becomes one double-quoted scalar. The
//! result is valid as a JSON string and as a YAML 1.1/1.2 double-quoted scalar: no input can
//! end the scalar early, add a key, start a comment, an anchor, an alias, a tag, a document
//! marker, or fold a line. Characters YAML does not allow raw (C0/C1 controls, DEL, U+FFFE/F)
//! and the ones YAML 1.1 parsers treat as line breaks (U+0085, U+2028, U+2029) are written as
//! `\uXXXX` escapes, which both JSON and YAML understand.

use std::fmt::Write;

/// `s` as a double-quoted scalar, valid in JSON and YAML.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                // Only BMP characters need escaping (see `needs_escape`).
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn needs_escape(c: char) -> bool {
    matches!(c as u32,
        0x00..=0x1f | 0x7f..=0x9f | 0x2028 | 0x2029 | 0xfeff | 0xfffe | 0xffff)
}

#[cfg(test)]
mod tests {
    use super::quote;

    fn roundtrip(s: &str) {
        let q = quote(s);
        assert!(!q.contains('\n'), "quoted form must be one line: {q}");
        let yaml: String = serde_yaml::from_str(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
        assert_eq!(yaml, s, "YAML round trip of {q}");
        let json: String = serde_json::from_str(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
        assert_eq!(json, s, "JSON round trip of {q}");
        // As a value inside a mapping, it stays exactly one key.
        let doc = format!("a: {q}\nb: 1\n");
        let map: std::collections::BTreeMap<String, serde_yaml::Value> =
            serde_yaml::from_str(&doc).unwrap();
        assert_eq!(map.len(), 2);
        assert_eq!(map["a"], serde_yaml::Value::String(s.to_string()));
    }

    #[test]
    fn hostile_strings_round_trip() {
        for s in [
            "",
            "plain",
            "a\nb: injected",
            "x\"\ny: 1",
            "colon: value",
            "{{ name }}",
            "{% if true %}",
            "# comment",
            "&anchor value",
            "*alias",
            "---\nkey: v\n...",
            "!!binary AAAA",
            "- item",
            "[1, 2]",
            "{a: b}",
            "back\\slash \\n not newline",
            "tab\there",
            "cr\rlf",
            "nul\0byte",
            "del\x7f",
            "nel\u{85}ls\u{2028}ps\u{2029}",
            "bom\u{feff}",
            "c1\u{9b}",
            "noncharacter\u{fffe}\u{ffff}",
            "emoji 🦀 and ünïcödé",
            "yes",
            "null",
            "~",
            "0x10",
            "1e3",
            " leading and trailing ",
            "'single'",
            "%TAG ! tag:x",
            "@at `backtick` |pipe >fold",
        ] {
            roundtrip(s);
        }
        roundtrip(&"long{{&*#:\n".repeat(5000));
    }
}
