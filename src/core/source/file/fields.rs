//! Field helpers shared by every table of the config: names, durations, host ports.

use std::collections::BTreeMap;
use std::time::Duration;

use super::check::{self, show};
use super::doc::{self, Ctx, Item, Span, Tbl};

/// Envoy does not run in less.
pub const MIN_MEMORY: u64 = 32 << 20;

/// The host ports claimed so far, with the field and span that claimed each.
pub(super) struct Ports(pub(super) Vec<(u16, String, Span)>);

impl Ports {
    pub fn claim(&mut self, cx: &mut Ctx, port: &Item<i64>) {
        let p = port.v as u16;
        if let Some((_, field, span)) = self.0.iter().find(|(q, _, _)| *q == p) {
            let (line, col) = cx.position(span.start);
            port.err(
                cx,
                format!("port {p} is already used by {field} (line {line}, column {col}); each listener on the host needs its own port"),
            );
        } else {
            self.0.push((p, port.field.clone(), port.span.clone()));
        }
    }

    /// Claims a port that has no spanned value of its own (an IR file's listener): errors point
    /// at `span` and name `field`.
    pub fn claim_at(&mut self, cx: &mut Ctx, p: u16, field: &str, span: &Span) {
        if let Some((_, first, first_span)) = self.0.iter().find(|(q, _, _)| *q == p) {
            let (line, col) = cx.position(first_span.start);
            cx.err(
                span,
                field,
                format!("port {p} is already used by {first} (line {line}, column {col}); each listener on the host needs its own port"),
            );
        } else {
            self.0.push((p, field.to_string(), span.clone()));
        }
    }
}

/// Reports a duplicate name (first occurrence wins); `what` is e.g. "proxy".
pub(super) fn unique(
    cx: &mut Ctx,
    seen: &mut BTreeMap<String, Span>,
    name: &Item<String>,
    what: &str,
) {
    if name.v.is_empty() {
        return;
    }
    if let Some(first) = seen.get(&name.v) {
        let (line, col) = cx.position(first.start);
        name.err(
            cx,
            format!("duplicate {what} name {}; first defined at line {line}, column {col}; names must be unique", show(&name.v)),
        );
    } else {
        seen.insert(name.v.clone(), name.span.clone());
    }
}

/// A required DNS-label `name`.
pub(super) fn name(cx: &mut Ctx, t: &Tbl, example: &str) -> Item<String> {
    let what = format!("a DNS label like \"{example}\"");
    match t.req_str(cx, "name", &what) {
        Some(n) => {
            if let Err(m) = check::dns_label(n.v) {
                n.err(cx, m);
            }
            Item::new(n.v.to_string(), n.span, n.field)
        }
        None => Item::new(String::new(), t.span.clone(), t.field("name")),
    }
}

/// An optional duration field. `allow_zero` false rejects "0s".
pub(super) fn duration(
    cx: &mut Ctx,
    t: &Tbl,
    key: &str,
    default: Duration,
    allow_zero: bool,
) -> Duration {
    let Some(v) = t.get(key) else {
        return default;
    };
    let field = t.field(key);
    let Some(s) = v.get_ref().as_str() else {
        cx.err(
            &v.span(),
            &field,
            format!(
                "must be a duration string like \"5s\", \"500ms\" or \"1m30s\", got {}",
                doc::kind(v.get_ref())
            ),
        );
        return default;
    };
    match check::duration(s) {
        Ok(d) if d.is_zero() && !allow_zero => {
            cx.err(
                &v.span(),
                &field,
                format!("must be longer than 0s, got {}", show(s)),
            );
            default
        }
        Ok(d) => d,
        Err(m) => {
            cx.err(&v.span(), &field, m);
            default
        }
    }
}

/// A backend named by a route or a tcp listener, checked once the proxy's backends are known.
pub(super) struct BackendRef {
    pub name: Item<String>,
}
