//! The xDS subscriptions (stat prefixes) a file set defines, each with the file it reads and
//! the version it must report once it took the files.

use super::*;

/// The version each subscription must report once it has taken `files`: the stamp of the
/// file it reads (None where the file carries none: then only "reloaded without a refusal"
/// can be checked).
pub(super) fn expected_versions(
    files: &BTreeMap<String, String>,
) -> BTreeMap<String, Option<String>> {
    subscription_files(files)
        .into_iter()
        .map(|(sub, file)| (sub, files.get(&file).and_then(|t| stamp_of(t))))
        .collect()
}

/// The subscriptions (stat prefixes) the files define: LDS and CDS when their file exists,
/// one RDS subscription per HTTP connection manager in `lds.yaml`, and one SDS subscription
/// (`sds.<secret>`) per secret a listener (`lds.yaml`) or a backend's cluster (`cds.yaml`)
/// reads from a file here.
pub fn subscriptions(files: &BTreeMap<String, String>) -> Vec<String> {
    subscription_files(files)
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

/// Each subscription with the watched file it reads.
fn subscription_files(files: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let mut subs = Vec::new();
    if files.contains_key(LDS_FILE) {
        subs.push(("listener_manager.lds".to_string(), LDS_FILE.to_string()));
    }
    if files.contains_key(CDS_FILE) {
        subs.push(("cluster_manager.cds".to_string(), CDS_FILE.to_string()));
    }
    if let Some(lds) = files.get(LDS_FILE) {
        if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(lds) {
            collect_rds(&doc, &mut subs);
            collect_sds(&doc, files, &mut subs);
        }
    }
    // Backends' TLS secrets (CA, client certificate) are named by their clusters.
    if let Some(cds) = files.get(CDS_FILE) {
        if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(cds) {
            collect_sds(&doc, files, &mut subs);
        }
    }
    subs.sort();
    subs.dedup();
    subs
}

/// Finds every `{name, sds_config: {path_config_source: {path}}}` whose file is one of
/// `files`.
fn collect_sds(
    v: &serde_yaml::Value,
    files: &BTreeMap<String, String>,
    out: &mut Vec<(String, String)>,
) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            let name = m.get("name").and_then(|p| p.as_str());
            let path = m
                .get("sds_config")
                .and_then(|c| c.get("path_config_source"))
                .and_then(|p| p.get("path"))
                .and_then(|p| p.as_str());
            if let (Some(name), Some(path)) = (name, path) {
                let file = path.rsplit('/').next().unwrap_or(path);
                if files.contains_key(file) {
                    out.push((format!("sds.{name}"), file.to_string()));
                }
            }
            for v in m.values() {
                collect_sds(v, files, out);
            }
        }
        serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| collect_sds(v, files, out)),
        _ => {}
    }
}

/// Finds every `{stat_prefix, rds: {route_config_name, config_source}}` mapping in a document:
/// the subscription and the file it reads.
fn collect_rds(v: &serde_yaml::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_yaml::Value::Mapping(m) => {
            let prefix = m.get("stat_prefix").and_then(|p| p.as_str());
            let rds = m.get("rds");
            let route = rds
                .and_then(|r| r.get("route_config_name"))
                .and_then(|n| n.as_str());
            let file = rds
                .and_then(|r| r.get("config_source"))
                .and_then(|c| c.get("path_config_source"))
                .and_then(|p| p.get("path"))
                .and_then(|p| p.as_str())
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
            if let (Some(prefix), Some(route)) = (prefix, route) {
                let file = file.unwrap_or_else(|| crate::core::layout::rds_file(route));
                out.push((format!("http.{prefix}.rds.{route}"), file));
            }
            for v in m.values() {
                collect_rds(v, out);
            }
        }
        serde_yaml::Value::Sequence(s) => s.iter().for_each(|v| collect_rds(v, out)),
        _ => {}
    }
}
