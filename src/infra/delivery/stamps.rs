//! Stamps: each DiscoveryResponse-shaped file carries `version_info: "<generation>"`, which
//! the replicas report back once they took it.

use super::*;

pub(super) const VERSION_KEY: &str = "version_info:";

/// Stamps each DiscoveryResponse-shaped file (a top-level `resources:` key) with
/// `version_info: "<generation>"`, replacing an earlier stamp. Other files are left as they are.
pub fn stamp(files: &BTreeMap<String, String>, generation: u64) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(name, text)| {
            let body = unstamped(text);
            let stamped = if body.starts_with("resources:") || body.contains("\nresources:") {
                format!("{VERSION_KEY} \"{generation}\"\n{body}")
            } else {
                body.to_string()
            };
            (name.clone(), stamped)
        })
        .collect()
}

/// The text without berth's stamp line.
pub(super) fn unstamped(text: &str) -> &str {
    match text.strip_prefix(VERSION_KEY) {
        Some(rest) => rest.split_once('\n').map_or("", |(_, body)| body),
        None => text,
    }
}

/// The files without berth's stamp: what was rendered.
pub fn unstamp(files: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(k, v)| (k.clone(), unstamped(v).to_string()))
        .collect()
}

/// The version a file is stamped with, if any.
pub(super) fn stamp_of(text: &str) -> Option<String> {
    let line = text.strip_prefix(VERSION_KEY)?.lines().next()?;
    Some(line.trim().trim_matches(['"', '\'']).to_string())
}

/// The generation the files are stamped with (the stamp of `lds.yaml`, else of any file).
pub fn generation_of(files: &BTreeMap<String, String>) -> Option<u64> {
    let parse = |text: &String| {
        let line = text.strip_prefix(VERSION_KEY)?.lines().next()?;
        line.trim().trim_matches('"').parse().ok()
    };
    files
        .get(LDS_FILE)
        .and_then(parse)
        .or_else(|| files.values().find_map(parse))
}
