//! Make-before-break stages (see the module docs of [`super`]): the steps that take the watched
//! files from one set to another without a listener naming a route configuration, or a route a
//! cluster, that a replica lacks.

use super::*;

/// One step of a make-before-break update: files written (by rename) and files removed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stage {
    pub what: &'static str,
    pub write: BTreeMap<String, String>,
    pub remove: Vec<String>,
}

/// The stages that take the watched files from `from` to `to` without a moment in which a
/// listener names a route configuration, or a route a cluster, that the replica lacks (see the
/// module docs). Stages that change nothing are left out.
pub fn stages(from: &BTreeMap<String, String>, to: &BTreeMap<String, String>) -> Vec<Stage> {
    let xds = |n: &str| n == LDS_FILE || n == CDS_FILE || is_rds_file(n);
    let version = to
        .get(LDS_FILE)
        .or_else(|| to.values().next())
        .and_then(|t| stamp_of(t))
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut disk = from.clone();
    // Files whose only change is their stamp: the same resources, so no order matters for
    // them. They ride along with the last stage instead of costing a confirmed stage each.
    let mut restamped: BTreeMap<String, String> = BTreeMap::new();
    let mut step = |what: &'static str, write: BTreeMap<String, String>, remove: Vec<String>| {
        let (only_stamp, write): (BTreeMap<String, String>, BTreeMap<String, String>) = write
            .into_iter()
            .filter(|(n, c)| disk.get(n) != Some(c))
            .partition(|(n, c)| disk.get(n).is_some_and(|d| unstamped(d) == unstamped(c)));
        for n in write.keys() {
            restamped.remove(n);
        }
        restamped.extend(only_stamp);
        let remove: Vec<String> = remove
            .into_iter()
            .filter(|n| disk.contains_key(n))
            .collect();
        if write.is_empty() && remove.is_empty() {
            return;
        }
        for (n, c) in &write {
            disk.insert(n.clone(), c.clone());
        }
        for n in &remove {
            disk.remove(n);
        }
        out.push(Stage {
            what,
            write,
            remove,
        });
    };
    // A Swarm task's certificate copies (`tls/<owner>/<file>`, see
    // [`crate::core::agent::channel::TLS_PREFIX`]) go first: the secrets name them.
    let tls = |n: &str| n.starts_with(crate::core::agent::channel::TLS_PREFIX);
    let copies: BTreeMap<String, String> = to
        .iter()
        .filter(|(n, _)| tls(n))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    step("certificate files", copies, Vec::new());
    let others: BTreeMap<String, String> = to
        .iter()
        .filter(|(n, _)| !xds(n) && !tls(n))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    step("secrets and other files", others, Vec::new());
    // Old and new together; just the new file when it removes nothing (then it is the union).
    let union_of = |file: &str, n: u32| -> BTreeMap<String, String> {
        let text = match (from.get(file), to.get(file)) {
            (Some(old), Some(new)) => match union(old, new, &format!("{version}.{n}")) {
                Some(Union::Removes(u)) => u,
                Some(Union::Adds) => new.clone(),
                None => return BTreeMap::new(),
            },
            (None, Some(new)) => new.clone(),
            _ => return BTreeMap::new(),
        };
        BTreeMap::from([(file.to_string(), text)])
    };
    let cds_union = union_of(CDS_FILE, 1);
    step("clusters (old and new)", cds_union, Vec::new());
    // One route configuration per file: the new and changed ones go before the listeners that
    // name them, the unused ones after the listeners that named them.
    let routes: BTreeMap<String, String> = to
        .iter()
        .filter(|(n, _)| is_rds_file(n))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    step("route configurations (old and new)", routes, Vec::new());
    let only = |file: &str| -> BTreeMap<String, String> {
        to.get(file)
            .map(|c| BTreeMap::from([(file.to_string(), c.clone())]))
            .unwrap_or_default()
    };
    let gone = |file: &str| -> Vec<String> {
        if to.contains_key(file) {
            Vec::new()
        } else {
            vec![file.to_string()]
        }
    };
    step("listeners", only(LDS_FILE), gone(LDS_FILE));
    let unused_routes: Vec<String> = from
        .keys()
        .filter(|n| is_rds_file(n) && !to.contains_key(*n))
        .cloned()
        .collect();
    step("route configurations", BTreeMap::new(), unused_routes);
    step("clusters", only(CDS_FILE), gone(CDS_FILE));
    let unwanted: Vec<String> = from
        .keys()
        .filter(|n| !xds(n) && !to.contains_key(*n))
        .cloned()
        .collect();
    step("files no longer used", BTreeMap::new(), unwanted);
    restamped.retain(|n, c| disk.get(n) != Some(c));
    if !restamped.is_empty() {
        match out.last_mut() {
            Some(last) => last.write.extend(restamped),
            None => out.push(Stage {
                what: "versions",
                write: restamped,
                remove: Vec::new(),
            }),
        }
    }
    out
}

enum Union {
    /// `new` drops resources `old` has: their union, as a DiscoveryResponse.
    Removes(String),
    /// `new` only adds or changes resources: it is the union itself.
    Adds,
}

/// A DiscoveryResponse holding `old`'s resources with `new`'s added or replacing those of the
/// same name, stamped `version`. None when either does not parse as one.
fn union(old: &str, new: &str, version: &str) -> Option<Union> {
    use serde_yaml::{Mapping, Value};
    let resources = |text: &str| -> Option<Vec<Value>> {
        let doc: Value = serde_yaml::from_str(text).ok()?;
        doc.get("resources")?.as_sequence().cloned()
    };
    let name = |v: &Value| v.get("name").and_then(|n| n.as_str()).map(str::to_string);
    let (old, new) = (resources(old)?, resources(new)?);
    let mut merged: Vec<Value> = old
        .into_iter()
        .filter(|o| !new.iter().any(|n| name(n).is_some() && name(n) == name(o)))
        .collect();
    if merged.is_empty() {
        return Some(Union::Adds);
    }
    merged.extend(new);
    let mut doc = Mapping::new();
    doc.insert("resources".into(), Value::Sequence(merged));
    let body = serde_yaml::to_string(&doc).ok()?;
    // The stamp line as [`stamp`] writes it, so [`stamp_of`] reads it back the same.
    Some(Union::Removes(format!(
        "{VERSION_KEY} \"{version}\"\n{body}"
    )))
}
