//! EG's bootstrap `JSONPatch`: RFC 6902 operations as Envoy Gateway applies them
//! (`internal/utils/jsonpatch`, with evanphx/json-patch v5):
//!
//! - each operation names its target by `path` (a JSON pointer), or by `jsonPath` (a JSONPath
//!   query; the operation then applies at every match, with `path`, when given, appended to
//!   each match as a relative pointer). A `jsonPath` that matches nothing is an error, as is
//!   one that selects only the root;
//! - `add` creates missing parents (EG's `EnsurePathExistsOnAdd`): an object, or a list when
//!   the next token is an index or `-`, padded with nulls up to that index;
//! - EG checks each operation's fields: `add`, `replace` and `test` need a `value` and take no
//!   `from`; `move` and `copy` need a `from` and take no `value`; `remove` takes neither.
//!
//! All or nothing: the first failing operation is the error and the document is unchanged
//! (EG applies the others and then fails the whole bootstrap, so nothing runs either way).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use serde_json_path::JsonPath;

use super::kind_of;

/// Applies the JSON Patch `patch` (a list of operations) to `doc`.
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
    match (
        op.get("jsonPath").and_then(Value::as_str),
        op.get("path").and_then(Value::as_str),
    ) {
        (Some(jp), Some(p)) => format!("{name} {jp} {p}"),
        (Some(jp), None) => format!("{name} {jp}"),
        (None, p) => format!("{name} {}", p.unwrap_or("?")),
    }
}

fn str_field<'a>(op: &'a Value, field: &str) -> Result<Option<&'a str>> {
    match op.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => bail!("{field} must be a string, got {}", kind_of(other)),
    }
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<()> {
    if !op.is_object() {
        bail!("an operation must be a mapping with op and path (or jsonPath)");
    }
    let name = str_field(op, "op")?.ok_or_else(|| anyhow!("missing string field \"op\""))?;
    let path = str_field(op, "path")?;
    let json_path = str_field(op, "jsonPath")?;
    let from = str_field(op, "from")?;
    let value = op.get("value");
    // EG's ir.JSONPatchOperation.Validate.
    if path.is_none() && json_path.is_none() {
        bail!("a patch operation must specify a path or jsonPath");
    }
    match name {
        "add" | "replace" | "test" => {
            if value.is_none() {
                bail!("the {name} operation requires a value");
            }
            if from.is_some() {
                bail!("the {name} operation doesn't support a from attribute");
            }
        }
        "remove" => {
            if from.is_some() || value.is_some() {
                bail!("value and from can't be specified with the remove operation");
            }
        }
        "move" | "copy" => {
            if from.is_none() {
                bail!("the {name} operation requires a valid from attribute");
            }
            if value.is_some() {
                bail!("the {name} operation doesn't support a value attribute");
            }
        }
        other => bail!("unknown op {other:?} (allowed: add, remove, replace, move, copy, test)"),
    }
    let pointers = match json_path {
        None => vec![path.unwrap_or_default().to_string()],
        Some(expr) => pointers_of(doc, expr, path.unwrap_or_default())?,
    };
    for pointer in pointers {
        let applied = apply_at(doc, name, &pointer, from, value);
        if json_path.is_some() {
            applied.with_context(|| format!("at {pointer}"))?;
        } else {
            applied?;
        }
    }
    Ok(())
}

/// The JSON pointers a `jsonPath` selects, each with `relative` appended.
fn pointers_of(doc: &Value, expr: &str, relative: &str) -> Result<Vec<String>> {
    let query = JsonPath::parse(expr).map_err(|e| anyhow!("jsonPath {expr:?}: {e}"))?;
    if expr.trim() == "$" {
        bail!("using only the root ('$') in a jsonPath is not allowed");
    }
    let matches = query.query_located(doc);
    let mut out: Vec<String> = matches
        .locations()
        .map(|loc| {
            let pointer = loc.to_json_pointer();
            if relative.is_empty() {
                pointer
            } else {
                format!(
                    "{}/{}",
                    pointer.trim_end_matches('/'),
                    relative.trim_start_matches('/')
                )
            }
        })
        .collect();
    if out.is_empty() {
        bail!(
            "no element matches the jsonPath {expr:?}; make sure what it selects exists (to add \
             a property that does not exist yet, use path)"
        );
    }
    out.dedup();
    Ok(out)
}

fn apply_at(
    doc: &mut Value,
    name: &str,
    path: &str,
    from: Option<&str>,
    value: Option<&Value>,
) -> Result<()> {
    let value = || {
        value
            .cloned()
            .ok_or_else(|| anyhow!("missing field \"value\""))
    };
    match name {
        "add" => {
            ensure_parents(doc, path)?;
            add(doc, path, value()?)
        }
        "remove" => remove(doc, path).map(drop),
        "replace" => {
            let target = pointer_mut(doc, path)?;
            *target = value()?;
            Ok(())
        }
        "move" => {
            let from = from.unwrap_or_default();
            if path != from && path.starts_with(from) && path[from.len()..].starts_with('/') {
                bail!("cannot move {from} into its own child {path}");
            }
            let v = remove(doc, from)?;
            add(doc, path, v)
        }
        "copy" => {
            let v = pointer_mut(doc, from.unwrap_or_default())?.clone();
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
        other => bail!("unknown op {other:?}"),
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

/// EG's `EnsurePathExistsOnAdd`: creates the missing parents of `path`: an object, or a list
/// (padded with nulls up to the index) when the next token is an index or "-".
fn ensure_parents(doc: &mut Value, path: &str) -> Result<()> {
    let toks = tokens(path)?;
    let Some((_, parents)) = toks.split_last() else {
        return Ok(());
    };
    let mut cur = doc;
    for (i, tok) in parents.iter().enumerate() {
        let next = &toks[i + 1];
        let next_is_index = next == "-" || next.parse::<usize>().is_ok();
        let fresh = || {
            if next_is_index {
                let n = next.parse::<usize>().unwrap_or(0);
                Value::Array(vec![Value::Null; n])
            } else {
                Value::Object(serde_json::Map::new())
            }
        };
        cur = match cur {
            Value::Object(m) => m.entry(tok.clone()).or_insert_with(fresh),
            Value::Array(a) => {
                let Ok(at) = tok.parse::<usize>() else {
                    // "-" or not an index: add reports it.
                    return Ok(());
                };
                while a.len() <= at {
                    a.push(Value::Null);
                }
                if a[at].is_null() {
                    a[at] = fresh();
                }
                &mut a[at]
            }
            _ => return Ok(()),
        };
    }
    Ok(())
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
    fn add_creates_missing_parents_as_eg_does() {
        let mut doc = json!({"a": 1});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/overload_manager/resource_monitors/-", "value": {"name": "m"}},
                {"op": "add", "path": "/layers/2/name", "value": "x"},
                {"op": "add", "path": "/stats_config/stats_tags/0/tag_name", "value": "t"},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"a": 1,
                "overload_manager": {"resource_monitors": [{"name": "m"}]},
                "layers": [null, null, {"name": "x"}],
                "stats_config": {"stats_tags": [{"tag_name": "t"}]}})
        );
        // replace and remove still need their target.
        let e = json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/no/such", "value": 1}]),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("no key \"no\""), "{e:#}");
    }

    #[test]
    fn json_path_applies_at_every_match_with_a_relative_path() {
        let mut doc = json!({"static_resources": {"clusters": [
            {"name": "xds_cluster", "connect_timeout": "10s"},
            {"name": "other", "connect_timeout": "1s"},
            {"name": "third", "connect_timeout": "1s"}]}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "replace", "jsonPath": "$.static_resources.clusters[?(@.name == 'xds_cluster')]",
                 "path": "/connect_timeout", "value": "5s"},
                {"op": "add", "jsonPath": "$.static_resources.clusters[?(@.name != 'xds_cluster')]",
                 "path": "lb_policy", "value": "RANDOM"},
            ]),
        )
        .unwrap();
        let c = &doc["static_resources"]["clusters"];
        assert_eq!(c[0]["connect_timeout"], "5s");
        assert!(c[0].get("lb_policy").is_none());
        assert_eq!(c[1]["lb_policy"], "RANDOM");
        assert_eq!(c[2]["lb_policy"], "RANDOM");

        for (op, needle) in [
            (
                json!({"op": "remove", "jsonPath": "$.nothing[*]"}),
                "no element matches",
            ),
            (json!({"op": "remove", "jsonPath": "$"}), "root"),
            (
                json!({"op": "remove", "jsonPath": "$[[["}),
                "jsonPath \"$[[[\"",
            ),
        ] {
            let e = json_patch(&mut doc.clone(), &json!([op])).unwrap_err();
            assert!(format!("{e:#}").contains(needle), "{e:#}");
        }
    }

    #[test]
    fn operations_are_checked_as_eg_checks_them() {
        for (op, needle) in [
            (
                json!({"op": "add", "path": "/a"}),
                "the add operation requires a value",
            ),
            (
                json!({"op": "replace", "path": "/a", "value": 1, "from": "/b"}),
                "doesn't support a from",
            ),
            (
                json!({"op": "remove", "path": "/a", "value": 1}),
                "can't be specified with the remove",
            ),
            (json!({"op": "copy", "path": "/a"}), "requires a valid from"),
            (
                json!({"op": "move", "path": "/a", "from": "/b", "value": 1}),
                "doesn't support a value",
            ),
            (
                json!({"op": "add", "value": 1}),
                "must specify a path or jsonPath",
            ),
        ] {
            let e = json_patch(&mut json!({"a": 1, "b": 2}), &json!([op])).unwrap_err();
            assert!(format!("{e:#}").contains(needle), "{e:#}");
        }
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
}
