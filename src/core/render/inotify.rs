//! How many inotify instances one replica of a proxy holds, counted from its rendered files
//! (a pure count; [`crate::host::inotify`] compares it with the host's limits).

use std::collections::BTreeSet;

use serde_yaml::Value;

/// The inotify instances (and watches: one each) one replica of a proxy holds, counted from
/// its bootstrap and watched files as parsed (the renderer parses each file it renders).
pub fn per_replica(docs: &[Value]) -> u32 {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for doc in docs {
        collect(doc, None, &mut seen);
    }
    seen.len() as u32
}

/// Walks `v` (whose parent mapping is `parent`), recording one entry per watcher Envoy would
/// create. Envoy shares a subscription between identical uses (same route config or secret
/// name and config source), so each is keyed by the mapping that names it.
fn collect(v: &Value, parent: Option<&Value>, seen: &mut BTreeSet<String>) {
    match v {
        Value::Mapping(m) => {
            for (k, child) in m {
                let key = k.as_str().unwrap_or_default();
                let watches = match key {
                    "path_config_source" => true,
                    // A data source's directory; inside a path_config_source it is that
                    // subscription's one watcher, already counted.
                    "watched_directory" => !m.contains_key("path"),
                    _ => false,
                };
                if watches {
                    let yaml = |x: Option<&Value>| {
                        x.map(|x| serde_yaml::to_string(x).unwrap_or_default())
                            .unwrap_or_default()
                    };
                    seen.insert(format!("{key}:{}|{}", yaml(parent), yaml(Some(v))));
                }
                collect(child, Some(v), seen);
            }
        }
        Value::Sequence(items) => items.iter().for_each(|i| collect(i, parent, seen)),
        _ => {}
    }
}
