//! Reading JSON values with field paths: every error names the field it is about, as a path
//! from the top of the input (`proxy.listeners[1].ports[0].protocol`).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{EgError, Result};

pub(super) fn parse_document(text: &str) -> Result<Value> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(text).map_err(|e| EgError::new("", format!("malformed JSON: {e}")))
    } else {
        serde_yaml::from_str::<Value>(text)
            .map_err(|e| EgError::new("", format!("malformed YAML: {e}")))
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A value and the path that leads to it.
#[derive(Clone)]
pub(super) struct Node<'a> {
    pub(super) value: &'a Value,
    pub(super) path: String,
}

impl<'a> Node<'a> {
    pub(super) fn root(value: &'a Value, path: &str) -> Self {
        Node {
            value,
            path: path.to_string(),
        }
    }

    pub(super) fn child(&self, key: &str, value: &'a Value) -> Node<'a> {
        Node {
            value,
            path: join(&self.path, key),
        }
    }

    /// A map entry whose key may contain dots or slashes: `infraIR["ns/gw"]`.
    pub(super) fn key(&self, key: &str, value: &'a Value) -> Node<'a> {
        if key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            self.child(key, value)
        } else {
            Node {
                value,
                path: format!("{}[{key:?}]", self.path),
            }
        }
    }

    pub(super) fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(super) fn err(&self, message: impl Into<String>) -> EgError {
        EgError::new(self.path.clone(), message)
    }

    pub(super) fn object(&self) -> Result<&'a Map<String, Value>> {
        match self.value {
            Value::Object(m) => Ok(m),
            other => Err(self.err(format!("expected an object, got {}", kind(other)))),
        }
    }

    pub(super) fn array(&self) -> Result<&'a Vec<Value>> {
        match self.value {
            Value::Array(a) => Ok(a),
            other => Err(self.err(format!("expected a list, got {}", kind(other)))),
        }
    }

    pub(super) fn str(&self) -> Result<&'a str> {
        match self.value {
            Value::String(s) => Ok(s),
            other => Err(self.err(format!("expected a string, got {}", kind(other)))),
        }
    }

    /// A field of this object; absent and `null` (Go's nil) are the same.
    pub(super) fn get(&self, key: &str) -> Option<Node<'a>> {
        match self.value {
            Value::Object(m) => m
                .get(key)
                .filter(|v| !v.is_null())
                .map(|v| self.child(key, v)),
            _ => None,
        }
    }

    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key).map(|n| n.str()).transpose()
    }

    pub(super) fn opt_int(&self, key: &str) -> Result<Option<i64>> {
        let Some(n) = self.get(key) else {
            return Ok(None);
        };
        match n.value {
            Value::Number(num) => match num.as_i64() {
                Some(i) => Ok(Some(i)),
                None => Err(n.err(format!("expected an integer, got {num}"))),
            },
            other => Err(n.err(format!("expected an integer, got {}", kind(other)))),
        }
    }

    pub(super) fn opt_array(&self, key: &str) -> Result<Vec<Node<'a>>> {
        let Some(n) = self.get(key) else {
            return Ok(Vec::new());
        };
        let items = n.array()?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, v)| Node {
                value: v,
                path: format!("{}[{i}]", n.path),
            })
            .collect())
    }

    pub(super) fn string_map(&self, key: &str) -> Result<BTreeMap<String, String>> {
        let Some(n) = self.get(key) else {
            return Ok(BTreeMap::new());
        };
        let mut out = BTreeMap::new();
        for (k, v) in n.object()? {
            let s = match v {
                Value::String(s) => s.clone(),
                // YAML may read `version: 2` or `enabled: true` as non-strings.
                Value::Number(num) => num.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(n
                        .key(k, v)
                        .err(format!("expected a string, got {}", kind(other))))
                }
            };
            out.insert(k.clone(), s);
        }
        Ok(out)
    }
}

/// Logs, at debug level, every field of `obj` berth does not read.
pub(super) fn log_ignored(at: &Node<'_>, obj: &Map<String, Value>, known: &[&str]) {
    for key in obj.keys().filter(|k| !known.contains(&k.as_str())) {
        tracing::debug!(field = %join(&at.path, key), "ignoring field berth does not use");
    }
}
