//! Walking a spanned TOML document: error collection, positions, typed getters.

use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::de::{DeArray, DeTable, DeValue};
use toml::Spanned;

use super::check::show;
use super::errors::{ConfigError, ConfigErrors};

pub(super) type Val<'i> = Spanned<DeValue<'i>>;
pub(super) type Span = Range<usize>;

/// Collects errors for one file and turns byte offsets into line:column.
pub(super) struct Ctx {
    file: PathBuf,
    /// Absolute directory of the config file; relative paths inside resolve against it.
    pub dir: PathBuf,
    text: String,
    line_starts: Vec<usize>,
    errors: Vec<ConfigError>,
    /// Every file the config names (certificates, keys, IR and bootstrap files).
    named: std::cell::RefCell<Vec<PathBuf>>,
}

impl Ctx {
    pub fn new(file: &Path, text: &str) -> Ctx {
        let parent = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::path::absolute(&parent).unwrap_or(parent);
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Ctx {
            file: file.to_path_buf(),
            dir,
            text: text.to_string(),
            line_starts,
            errors: Vec::new(),
            named: Default::default(),
        }
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset);
        let start = self.line_starts[line - 1];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        (line, column)
    }

    pub fn err(&mut self, span: &Span, field: &str, message: impl Into<String>) {
        let (line, column) = self.position(span.start);
        let message: String = message.into();
        // Messages never span lines: one error per output line.
        let message = message.replace(['\n', '\r'], " ");
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line,
            column,
            field: field.to_string(),
            message,
        });
    }

    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// Errors so far (to tell whether a part added any).
    pub fn error_count(&self) -> usize {
        self.errors.len()
    }

    pub fn finish(mut self) -> ConfigErrors {
        self.errors.sort_by_key(|e| (e.line, e.column));
        self.errors.dedup();
        ConfigErrors(self.errors)
    }

    /// A file the config names (resolved as [`Ctx::resolve`]), remembered so `serve` can
    /// watch it.
    pub fn named_file(&self, p: &str) -> PathBuf {
        let path = self.resolve(p);
        self.named.borrow_mut().push(path.clone());
        path
    }

    /// The files [`Ctx::named_file`] resolved, sorted.
    pub fn named_files(&self) -> Vec<PathBuf> {
        let mut files = self.named.borrow().clone();
        files.sort();
        files.dedup();
        files
    }

    /// A file path from the config, relative to the config file's directory.
    pub fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }
}

/// Joins a field path and a key, quoting keys that are not plain identifiers.
pub(super) fn join(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if plain { key.to_string() } else { show(key) };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

/// A table whose unknown keys have been reported.
pub(super) struct Tbl<'t, 'i> {
    pub table: &'t DeTable<'i>,
    pub span: Span,
    pub path: String,
}

impl<'t, 'i> Tbl<'t, 'i> {
    pub fn root(table: &'t DeTable<'i>, span: Span) -> Tbl<'t, 'i> {
        Tbl {
            table,
            span,
            path: String::new(),
        }
    }

    /// `v` as a table with only `allowed` keys; reports a type error or each unknown key.
    pub fn new(
        cx: &mut Ctx,
        v: &'t Val<'i>,
        path: String,
        allowed: &[&str],
    ) -> Option<Tbl<'t, 'i>> {
        let Some(table) = v.get_ref().as_table() else {
            cx.err(
                &v.span(),
                &path,
                format!("must be a table, got {}", kind(v.get_ref())),
            );
            return None;
        };
        let t = Tbl {
            table,
            span: v.span(),
            path,
        };
        t.check_keys(cx, allowed);
        Some(t)
    }

    pub fn check_keys(&self, cx: &mut Ctx, allowed: &[&str]) {
        for (k, _) in self.table.iter() {
            if !allowed.contains(&k.get_ref().as_ref()) {
                let mut msg = format!(
                    "unknown field {}; allowed: {}",
                    show(k.get_ref()),
                    allowed.join(", ")
                );
                if let Some(s) = similar(k.get_ref(), allowed) {
                    msg = format!("{msg} (did you mean `{s}`?)");
                }
                cx.err(&k.span(), &join(&self.path, k.get_ref()), msg);
            }
        }
    }

    pub fn field(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn get(&self, key: &str) -> Option<&'t Val<'i>> {
        self.table.get(key)
    }

    /// The span of a key (for errors about the key itself rather than its value).
    pub fn key_span(&self, key: &str) -> Span {
        self.table
            .iter()
            .find(|(k, _)| k.get_ref() == key)
            .map_or(self.span.clone(), |(k, _)| k.span())
    }

    /// A required field; reports it missing at the table.
    pub fn require(&self, cx: &mut Ctx, key: &str, what: &str) -> Option<&'t Val<'i>> {
        let v = self.get(key);
        if v.is_none() {
            let msg = format!("missing required field `{key}` ({what})");
            cx.err(&self.span, &self.field(key), msg);
        }
        v
    }

    pub fn str(&self, cx: &mut Ctx, key: &str) -> Option<Item<&'t str>> {
        let v = self.get(key)?;
        string(cx, v, self.field(key))
    }

    pub fn req_str(&self, cx: &mut Ctx, key: &str, what: &str) -> Option<Item<&'t str>> {
        let v = self.require(cx, key, what)?;
        string(cx, v, self.field(key))
    }

    pub fn int(&self, cx: &mut Ctx, key: &str, min: i64, max: i64) -> Option<Item<i64>> {
        let v = self.get(key)?;
        int(cx, v, self.field(key), min, max)
    }

    pub fn bool(&self, cx: &mut Ctx, key: &str) -> Option<Item<bool>> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some(Item::new(*b, v.span(), self.field(key))),
            other => {
                let msg = format!("must be true or false, got {}", kind(other));
                cx.err(&v.span(), &self.field(key), msg);
                None
            }
        }
    }

    pub fn array(&self, cx: &mut Ctx, key: &str) -> Option<(&'t DeArray<'i>, Span, String)> {
        let v = self.get(key)?;
        let field = self.field(key);
        match v.get_ref() {
            DeValue::Array(a) => Some((a, v.span(), field)),
            other => {
                cx.err(
                    &v.span(),
                    &field,
                    format!("must be an array, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// An array of tables (`[[key]]`), each checked against `allowed`.
    pub fn tables(&self, cx: &mut Ctx, key: &str, allowed: &[&str]) -> Vec<Tbl<'t, 'i>> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        let field = self.field(key);
        let DeValue::Array(items) = v.get_ref() else {
            let hint = if v.get_ref().is_table() {
                let name = dotted_table_name(&field);
                format!("; write [[{name}]] (double brackets), one per item")
            } else {
                String::new()
            };
            cx.err(
                &v.span(),
                &field,
                format!(
                    "must be an array of tables, got {}{hint}",
                    kind(v.get_ref())
                ),
            );
            return Vec::new();
        };
        items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| Tbl::new(cx, item, format!("{field}[{i}]"), allowed))
            .collect()
    }

    /// An optional sub-table.
    pub fn sub(&self, cx: &mut Ctx, key: &str, allowed: &[&str]) -> Option<Tbl<'t, 'i>> {
        let v = self.get(key)?;
        Tbl::new(cx, v, self.field(key), allowed)
    }
}

/// `proxy[0].listener[1]` → `proxy.listener`, the TOML header name.
fn dotted_table_name(path: &str) -> String {
    path.split('.')
        .map(|p| p.split('[').next().unwrap_or(p))
        .collect::<Vec<_>>()
        .join(".")
}

/// A value with where it came from.
#[derive(Debug, Clone)]
pub(super) struct Item<T> {
    pub v: T,
    pub span: Span,
    pub field: String,
}

impl<T> Item<T> {
    pub fn new(v: T, span: Span, field: String) -> Self {
        Item { v, span, field }
    }

    pub fn err(&self, cx: &mut Ctx, message: impl Into<String>) {
        cx.err(&self.span, &self.field, message)
    }
}

pub(super) fn kind(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

pub(super) fn string<'t>(cx: &mut Ctx, v: &'t Val<'_>, field: String) -> Option<Item<&'t str>> {
    match v.get_ref() {
        DeValue::String(s) => Some(Item::new(s.as_ref(), v.span(), field)),
        other => {
            cx.err(
                &v.span(),
                &field,
                format!("must be a string, got {}", kind(other)),
            );
            None
        }
    }
}

pub(super) fn int(
    cx: &mut Ctx,
    v: &Val<'_>,
    field: String,
    min: i64,
    max: i64,
) -> Option<Item<i64>> {
    let n = match v.get_ref() {
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).ok(),
        other => {
            cx.err(
                &v.span(),
                &field,
                format!("must be an integer {min}–{max}, got {}", kind(other)),
            );
            return None;
        }
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Some(Item::new(n, v.span(), field)),
        _ => {
            let got = match v.get_ref() {
                DeValue::Integer(i) => i.to_string(),
                _ => String::new(),
            };
            cx.err(&v.span(), &field, format!("must be {min}–{max}, got {got}"));
            None
        }
    }
}

pub(super) fn float(cx: &mut Ctx, v: &Val<'_>, field: String) -> Option<Item<f64>> {
    let n = match v.get_ref() {
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
            .ok()
            .map(|n| n as f64),
        DeValue::Float(f) => f.as_str().replace('_', "").parse::<f64>().ok(),
        other => {
            cx.err(
                &v.span(),
                &field,
                format!("must be a number, got {}", kind(other)),
            );
            return None;
        }
    };
    match n {
        Some(n) => Some(Item::new(n, v.span(), field)),
        None => {
            cx.err(&v.span(), &field, "must be a finite number");
            None
        }
    }
}

/// A table of string → string (labels, env, headers), each entry's key and value spanned.
pub(super) type StrMap<'t> = Vec<(Item<&'t str>, Item<&'t str>)>;

pub(super) fn string_map<'t>(cx: &mut Ctx, v: &'t Val<'_>, field: String) -> Option<StrMap<'t>> {
    let Some(table) = v.get_ref().as_table() else {
        cx.err(
            &v.span(),
            &field,
            format!(
                "must be a table of strings like {{ key = \"value\" }}, got {}",
                kind(v.get_ref())
            ),
        );
        return None;
    };
    let mut out = Vec::new();
    for (k, val) in table.iter() {
        let f = join(&field, k.get_ref());
        if let Some(s) = string(cx, val, f.clone()) {
            out.push((Item::new(k.get_ref().as_ref(), k.span(), f), s));
        }
    }
    Some(out)
}

/// An allowed name that differs from `key` by a typo, for "did you mean".
fn similar<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    allowed
        .iter()
        .copied()
        .find(|a| edit_distance(key, a) <= 2 && key.len() > 2)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
