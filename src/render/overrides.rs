//! EG's bootstrap override (`config.bootstrap`): Merge, Replace or JSONPatch, applied to the
//! rendered bootstrap.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::ir::{BootstrapOverride, BootstrapOverrideKind};

/// Applies `ov` to the rendered bootstrap (YAML text) and returns the resulting YAML.
pub fn apply(rendered: &str, ov: &BootstrapOverride) -> Result<String> {
    let user: Value = serde_yaml::from_str(&ov.value).with_context(|| {
        format!(
            "bootstrap override ({:?}): the value is not valid YAML or JSON",
            ov.kind
        )
    })?;
    let result = match ov.kind {
        BootstrapOverrideKind::Replace => {
            if !user.is_object() {
                bail!("bootstrap override (Replace): the value must be a YAML mapping (a whole Envoy bootstrap), got {}", kind_of(&user));
            }
            user
        }
        BootstrapOverrideKind::Merge => {
            if !user.is_object() {
                bail!("bootstrap override (Merge): the value must be a YAML mapping to merge into the bootstrap, got {}", kind_of(&user));
            }
            let mut base = parse_rendered(rendered)?;
            merge(&mut base, user);
            base
        }
        BootstrapOverrideKind::JSONPatch => {
            let mut base = parse_rendered(rendered)?;
            json_patch(&mut base, &user).context("bootstrap override (JSONPatch)")?;
            base
        }
    };
    serde_yaml::to_string(&result).context("bootstrap override: serializing the result as YAML")
}

fn parse_rendered(rendered: &str) -> Result<Value> {
    serde_yaml::from_str(rendered).context("bootstrap override: the rendered bootstrap is not valid YAML (a template override is broken?)")
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Deep merge: mappings merge recursively; any other value (lists included) replaces.
pub fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Applies an RFC 6902 JSON Patch (a list of operations) to `doc`. All or nothing: on error
/// `doc` is left unchanged.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<()> {
    let ops = patch.as_array().ok_or_else(|| {
        anyhow!(
            "the value must be a list of JSON Patch operations, got {}",
            kind_of(patch)
        )
    })?;
    let mut work = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        apply_op(&mut work, op).with_context(|| format!("operation {i} ({})", op_summary(op)))?;
    }
    *doc = work;
    Ok(())
}

fn op_summary(op: &Value) -> String {
    let name = op.get("op").and_then(Value::as_str).unwrap_or("?");
    let path = op.get("path").and_then(Value::as_str).unwrap_or("?");
    format!("{name} {path}")
}

fn str_field<'a>(op: &'a Value, field: &str) -> Result<&'a str> {
    op.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("missing string field {field:?}"))
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<()> {
    if !op.is_object() {
        bail!("an operation must be a mapping with op and path");
    }
    let name = str_field(op, "op")?;
    let path = str_field(op, "path")?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| anyhow!("missing field \"value\""))
    };
    match name {
        "add" => add(doc, path, value()?),
        "remove" => remove(doc, path).map(drop),
        "replace" => {
            let target = pointer_mut(doc, path)?;
            *target = value()?;
            Ok(())
        }
        "move" => {
            let from = str_field(op, "from")?;
            if path != from && path.starts_with(from) && path[from.len()..].starts_with('/') {
                bail!("cannot move {from} into its own child {path}");
            }
            let v = remove(doc, from)?;
            add(doc, path, v)
        }
        "copy" => {
            let from = str_field(op, "from")?;
            let v = pointer_mut(doc, from)?.clone();
            add(doc, path, v)
        }
        "test" => {
            let expected = value()?;
            let actual = pointer_mut(doc, path)?;
            if *actual != expected {
                bail!("test failed: the value at {path} is {actual}, not {expected}");
            }
            Ok(())
        }
        other => bail!("unknown op {other:?} (allowed: add, remove, replace, move, copy, test)"),
    }
}

/// Splits an RFC 6901 pointer into its unescaped tokens.
fn tokens(path: &str) -> Result<Vec<String>> {
    if path.is_empty() {
        return Ok(vec![]);
    }
    let Some(rest) = path.strip_prefix('/') else {
        bail!("path {path:?} must be empty or start with '/'");
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn index(arr: &[Value], tok: &str, path: &str, allow_end: bool) -> Result<usize> {
    if allow_end && tok == "-" {
        return Ok(arr.len());
    }
    let valid = !tok.is_empty()
        && tok.bytes().all(|b| b.is_ascii_digit())
        && (tok == "0" || !tok.starts_with('0'));
    let i: usize = if valid { tok.parse().ok() } else { None }
        .ok_or_else(|| anyhow!("{path}: {tok:?} is not a list index"))?;
    let max = if allow_end {
        arr.len()
    } else {
        arr.len().saturating_sub(1)
    };
    if i > max || (!allow_end && arr.is_empty()) {
        bail!(
            "{path}: index {i} is out of range (the list has {} items)",
            arr.len()
        );
    }
    Ok(i)
}

fn pointer_mut<'a>(doc: &'a mut Value, path: &str) -> Result<&'a mut Value> {
    let mut cur = doc;
    for tok in tokens(path)? {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(&tok)
                .ok_or_else(|| anyhow!("{path}: no key {tok:?}"))?,
            Value::Array(a) => {
                let i = index(a, &tok, path, false)?;
                &mut a[i]
            }
            _ => bail!("{path}: cannot descend into a scalar at {tok:?}"),
        };
    }
    Ok(cur)
}

fn split_parent(path: &str) -> Result<(String, String)> {
    let mut toks = tokens(path)?;
    let last = toks
        .pop()
        .ok_or_else(|| anyhow!("the whole document cannot be the target here"))?;
    let parent = toks
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect();
    Ok((parent, last))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<()> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_parent(path)?;
    match pointer_mut(doc, &parent)? {
        Value::Object(m) => {
            m.insert(last, value);
        }
        Value::Array(a) => {
            let i = index(a, &last, path, true)?;
            a.insert(i, value);
        }
        _ => bail!("{path}: the parent is not a mapping or a list"),
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value> {
    let (parent, last) = split_parent(path)?;
    match pointer_mut(doc, &parent)? {
        Value::Object(m) => m
            .remove(&last)
            .ok_or_else(|| anyhow!("{path}: no key {last:?}")),
        Value::Array(a) => {
            let i = index(a, &last, path, false)?;
            Ok(a.remove(i))
        }
        _ => bail!("{path}: the parent is not a mapping or a list"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_is_deep_for_maps_and_replaces_the_rest() {
        let mut base = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
        merge(
            &mut base,
            json!({"a": {"c": [3], "e": {"f": true}}, "d": {"now": "map"}}),
        );
        assert_eq!(
            base,
            json!({"a": {"b": 1, "c": [3], "e": {"f": true}}, "d": {"now": "map"}})
        );
    }

    #[test]
    fn patch_ops() {
        let mut doc = json!({"a": {"b": [1, 2]}, "x~/y": 1});
        let patch = json!([
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "add", "path": "/a/b/0", "value": 0},
            {"op": "replace", "path": "/x~0~1y", "value": 2},
            {"op": "test", "path": "/x~0~1y", "value": 2},
            {"op": "copy", "from": "/a/b", "path": "/c"},
            {"op": "move", "from": "/c", "path": "/d"},
            {"op": "remove", "path": "/a/b/1"},
        ]);
        json_patch(&mut doc, &patch).unwrap();
        assert_eq!(
            doc,
            json!({"a": {"b": [0, 2, 3]}, "x~/y": 2, "d": [0, 1, 2, 3]})
        );
    }

    #[test]
    fn patch_errors_name_the_operation_and_leave_the_doc_alone() {
        let orig = json!({"a": 1});
        for (patch, needle) in [
            (
                json!([{"op": "remove", "path": "/b"}]),
                "operation 0 (remove /b)",
            ),
            (
                json!([{"op": "add", "path": "/a", "value": 2}, {"op": "test", "path": "/a", "value": 3}]),
                "operation 1 (test /a)",
            ),
            (json!([{"op": "frob", "path": "/a"}]), "unknown op"),
            (
                json!([{"op": "replace", "path": "a", "value": 1}]),
                "must be empty or start with '/'",
            ),
            (json!({"op": "add"}), "list of JSON Patch operations"),
        ] {
            let mut doc = orig.clone();
            let err = format!("{:#}", json_patch(&mut doc, &patch).unwrap_err());
            assert!(err.contains(needle), "{err} should contain {needle}");
            assert_eq!(doc, orig);
        }
    }

    #[test]
    fn apply_each_kind() {
        let rendered = "admin:\n  address: {pipe: {path: \"/x\"}}\nnode:\n  cluster: \"edge\"\n";
        let merged = apply(
            rendered,
            &BootstrapOverride {
                kind: BootstrapOverrideKind::Merge,
                value: "node: {id: n1}\n".into(),
            },
        )
        .unwrap();
        let v: Value = serde_yaml::from_str(&merged).unwrap();
        assert_eq!(v["node"], json!({"cluster": "edge", "id": "n1"}));
        assert_eq!(v["admin"]["address"]["pipe"]["path"], "/x");

        let replaced = apply(
            rendered,
            &BootstrapOverride {
                kind: BootstrapOverrideKind::Replace,
                value: "{node: {cluster: other}}".into(),
            },
        )
        .unwrap();
        let v: Value = serde_yaml::from_str(&replaced).unwrap();
        assert_eq!(v, json!({"node": {"cluster": "other"}}));

        let patched = apply(
            rendered,
            &BootstrapOverride {
                kind: BootstrapOverrideKind::JSONPatch,
                value: r#"[{"op": "remove", "path": "/admin"}]"#.into(),
            },
        )
        .unwrap();
        let v: Value = serde_yaml::from_str(&patched).unwrap();
        assert_eq!(v, json!({"node": {"cluster": "edge"}}));

        let err = apply(
            rendered,
            &BootstrapOverride {
                kind: BootstrapOverrideKind::Merge,
                value: "- a list".into(),
            },
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("Merge"), "{err:#}");
        let err = apply(
            rendered,
            &BootstrapOverride {
                kind: BootstrapOverrideKind::Merge,
                value: "a: [unclosed".into(),
            },
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("not valid YAML"), "{err:#}");
    }
}
