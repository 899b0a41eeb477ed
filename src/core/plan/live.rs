//! The watched files a plan changes without touching a container: routes, clusters, listeners
//! and secrets reach running replicas live (DESIGN decision 3), so `diff` lists them beside the
//! container actions instead of saying "No changes".

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One proxy's watched files that differ between what its replicas have and what it should have.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LiveUpdate {
    pub proxy: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

impl LiveUpdate {
    /// The files of `to` that `from` lacks or holds with other text, and those only `from` has;
    /// `None` when they are the same. Both are unstamped (no `version_info`).
    pub fn between(
        proxy: &str,
        from: &BTreeMap<String, String>,
        to: &BTreeMap<String, String>,
    ) -> Option<LiveUpdate> {
        let mut u = LiveUpdate {
            proxy: proxy.to_string(),
            ..LiveUpdate::default()
        };
        for (name, text) in to {
            match from.get(name) {
                None => u.added.push(name.clone()),
                Some(old) if old != text => u.changed.push(name.clone()),
                Some(_) => {}
            }
        }
        u.removed = from
            .keys()
            .filter(|n| !to.contains_key(*n))
            .cloned()
            .collect();
        let empty = u.added.is_empty() && u.changed.is_empty() && u.removed.is_empty();
        (!empty).then_some(u)
    }
}

/// "~ web: live update, no restart (changed rds-http.yaml; added cds.yaml)".
impl fmt::Display for LiveUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ("changed", &self.changed),
            ("added", &self.added),
            ("removed", &self.removed),
        ]
        .into_iter()
        .filter(|(_, files)| !files.is_empty())
        .map(|(what, files)| format!("{what} {}", files.join(", ")))
        .collect();
        write!(
            f,
            "~ {}: live update, no restart ({})",
            self.proxy,
            parts.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn same_files_are_no_update() {
        let a = files(&[("cds.yaml", "x"), ("rds-http.yaml", "y")]);
        assert_eq!(LiveUpdate::between("web", &a, &a), None);
    }

    #[test]
    fn lists_changed_added_and_removed_files() {
        let from = files(&[("cds.yaml", "x"), ("rds-http.yaml", "y"), ("old.yaml", "z")]);
        let to = files(&[
            ("cds.yaml", "x"),
            ("rds-http.yaml", "y2"),
            ("new.yaml", "n"),
        ]);
        let u = LiveUpdate::between("web", &from, &to).unwrap();
        assert_eq!(u.changed, ["rds-http.yaml"]);
        assert_eq!(u.added, ["new.yaml"]);
        assert_eq!(u.removed, ["old.yaml"]);
        assert_eq!(
            u.to_string(),
            "~ web: live update, no restart (changed rds-http.yaml; added new.yaml; removed old.yaml)"
        );
    }
}
