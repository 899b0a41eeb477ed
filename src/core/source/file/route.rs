//! Routes: path and header match, one action (forward, direct response, redirect), timeout, retries.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::ir;

use super::check::{self, show};
use super::doc::{self, Ctx, Item, Tbl};
use super::fields::{duration, unique, BackendRef};

const ROUTE_KEYS: &[&str] = &[
    "path_prefix",
    "path",
    "headers",
    "backend",
    "backends",
    "direct_response",
    "redirect",
    "timeout",
    "retries",
];
const ACTIONS: &[&str] = &["backend", "backends", "direct_response", "redirect"];
const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];
pub const MAX_WEIGHT: i64 = 1_000_000;

pub(super) fn routes(cx: &mut Ctx, parent: &Tbl, refs: &mut Vec<BackendRef>) -> Vec<ir::Route> {
    parent
        .tables(cx, "route", ROUTE_KEYS)
        .iter()
        .map(|r| route(cx, r, refs))
        .collect()
}

fn route(cx: &mut Ctx, t: &Tbl, refs: &mut Vec<BackendRef>) -> ir::Route {
    // Path: exactly one of path_prefix, path.
    let prefix = t.str(cx, "path_prefix");
    let exact = t.str(cx, "path");
    let path = match (prefix, exact) {
        (Some(p), None) => Some((p, true)),
        (None, Some(p)) => Some((p, false)),
        (Some(_), Some(p)) => {
            cx.err(
                &t.key_span("path"),
                &p.field,
                "give exactly one of path_prefix or path (exact match), not both",
            );
            None
        }
        (None, None) => {
            if t.get("path_prefix").is_none() && t.get("path").is_none() {
                cx.err(
                    &t.span,
                    &t.field("path_prefix"),
                    "a route needs a path match: path_prefix = \"/\" (prefix) or path = \"/exact\"",
                );
            }
            None
        }
    };
    let path = match path {
        Some((p, is_prefix)) => {
            if let Err(m) = check::url_path(p.v, false) {
                p.err(cx, m);
            }
            if is_prefix {
                ir::PathMatch::Prefix(p.v.to_string())
            } else {
                ir::PathMatch::Exact(p.v.to_string())
            }
        }
        None => ir::PathMatch::Prefix("/".to_string()),
    };
    let mut headers = Vec::new();
    let mut seen = BTreeMap::new();
    if let Some(v) = t.get("headers") {
        for (k, val) in doc::string_map(cx, v, t.field("headers")).unwrap_or_default() {
            if let Err(m) = check::header_name(k.v) {
                k.err(cx, m);
                continue;
            }
            if let Err(m) = check::plain(val.v, check::MAX_VALUE) {
                val.err(cx, m);
                continue;
            }
            // Header names are case-insensitive: "X-A" and "x-a" are the same header.
            let lower = Item::new(k.v.to_ascii_lowercase(), k.span.clone(), k.field.clone());
            unique(cx, &mut seen, &lower, "header (case-insensitive)");
            headers.push(ir::HeaderMatch {
                name: k.v.to_ascii_lowercase(),
                value: val.v.to_string(),
            });
        }
    }
    // Action: exactly one.
    let present: Vec<&str> = ACTIONS
        .iter()
        .copied()
        .filter(|a| t.get(a).is_some())
        .collect();
    if present.is_empty() {
        cx.err(
            &t.span,
            &t.field("backend"),
            "a route needs one action: backend = \"name\", backends = [{ name, weight }], direct_response = { status, body } or redirect = { … }",
        );
    }
    if present.len() > 1 {
        cx.err(
            &t.key_span(present[1]),
            &t.field(present[1]),
            format!(
                "a route has exactly one action, found {}; keep one",
                present.join(" and ")
            ),
        );
    }
    let action = match present.first().copied() {
        Some("backend") => forward_one(cx, t, refs),
        Some("backends") => forward_weighted(cx, t, refs),
        Some("direct_response") => direct_response(cx, t),
        Some("redirect") => redirect(cx, t),
        _ => ir::RouteAction::DirectResponse {
            status: 404,
            body: String::new(),
        },
    };
    let forwards = matches!(action, ir::RouteAction::Forward { .. });
    for key in ["timeout", "retries"] {
        if t.get(key).is_some() && !forwards && !present.is_empty() {
            cx.err(
                &t.key_span(key),
                &t.field(key),
                format!("{key} applies only to routes that forward to backend or backends"),
            );
        }
    }
    // "0s" turns Envoy's 15 s route timeout off (long gRPC or download streams).
    let timeout = t
        .get("timeout")
        .map(|_| duration(cx, t, "timeout", Duration::ZERO, true));
    ir::Route {
        matcher: ir::RouteMatch { path, headers },
        action,
        timeout,
        retries: retries(cx, t),
    }
}

fn forward_one(cx: &mut Ctx, t: &Tbl, refs: &mut Vec<BackendRef>) -> ir::RouteAction {
    let mut backends = Vec::new();
    if let Some(b) = t.str(cx, "backend") {
        backends.push(ir::WeightedBackend {
            name: b.v.to_string(),
            weight: 1,
        });
        refs.push(BackendRef {
            name: Item::new(b.v.to_string(), b.span, b.field),
        });
    }
    ir::RouteAction::Forward { backends }
}

fn forward_weighted(cx: &mut Ctx, t: &Tbl, refs: &mut Vec<BackendRef>) -> ir::RouteAction {
    let mut backends = Vec::new();
    let Some((items, span, field)) = t.array(cx, "backends") else {
        return ir::RouteAction::Forward { backends };
    };
    if items.is_empty() {
        cx.err(&span, &field, "must list at least one backend, e.g. [{ name = \"a\", weight = 90 }, { name = \"b\", weight = 10 }]");
    }
    let mut seen = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let Some(b) = Tbl::new(cx, item, format!("{field}[{i}]"), &["name", "weight"]) else {
            continue;
        };
        let Some(n) = b.req_str(cx, "name", "a backend name") else {
            continue;
        };
        let n = Item::new(n.v.to_string(), n.span, n.field);
        unique(cx, &mut seen, &n, "weighted backend");
        let weight = match b.get("weight") {
            Some(v) => doc::int(cx, v, b.field("weight"), 1, MAX_WEIGHT).map_or(1, |w| w.v as u32),
            None => 1,
        };
        backends.push(ir::WeightedBackend {
            name: n.v.clone(),
            weight,
        });
        refs.push(BackendRef { name: n });
    }
    ir::RouteAction::Forward { backends }
}

fn direct_response(cx: &mut Ctx, t: &Tbl) -> ir::RouteAction {
    let mut status = 200;
    let mut body = String::new();
    if let Some(d) = t.sub(cx, "direct_response", &["status", "body"]) {
        if let Some(s) = d.int(cx, "status", 200, 599) {
            status = s.v as u16;
        }
        if let Some(b) = d.str(cx, "body") {
            if b.v.len() > check::MAX_BODY {
                b.err(
                    cx,
                    format!(
                        "must be at most {} bytes (64 KiB), got {}",
                        check::MAX_BODY,
                        b.v.len()
                    ),
                );
            } else if let Some(c) =
                b.v.chars()
                    .find(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
            {
                b.err(cx, format!("must not contain control characters other than newline, carriage return and tab (found {c:?})"));
            }
            body = b.v.to_string();
        }
    }
    ir::RouteAction::DirectResponse { status, body }
}

fn redirect(cx: &mut Ctx, t: &Tbl) -> ir::RouteAction {
    let mut r = ir::Redirect {
        status: 301,
        ..Default::default()
    };
    let Some(d) = t.sub(
        cx,
        "redirect",
        &["scheme", "host", "port", "path", "status"],
    ) else {
        return ir::RouteAction::Redirect(r);
    };
    if let Some(s) = d.str(cx, "scheme") {
        if s.v == "http" || s.v == "https" {
            r.scheme = Some(s.v.to_string());
        } else {
            s.err(
                cx,
                format!("must be \"http\" or \"https\", got {}", show(s.v)),
            );
        }
    }
    if let Some(h) = d.str(cx, "host") {
        match check::host(h.v) {
            Ok(()) => r.host = Some(h.v.to_string()),
            Err(m) => h.err(cx, m),
        }
    }
    if let Some(p) = d.int(cx, "port", 1, 65535) {
        r.port = Some(p.v as u16);
    }
    if let Some(p) = d.str(cx, "path") {
        match check::url_path(p.v, true) {
            Ok(()) => r.path = Some(p.v.to_string()),
            Err(m) => p.err(cx, m),
        }
    }
    if let Some(v) = d.get("status") {
        if let Some(s) = doc::int(cx, v, d.field("status"), 0, 999) {
            match check::status_in(s.v, &[301, 302, 303, 307, 308]) {
                Ok(()) => r.status = s.v as u16,
                Err(m) => s.err(cx, m),
            }
        }
    }
    if ["scheme", "host", "port", "path"]
        .iter()
        .all(|k| d.get(k).is_none())
    {
        cx.err(
            &d.span,
            &d.path,
            "a redirect must change at least one of scheme, host, port, path",
        );
    }
    ir::RouteAction::Redirect(r)
}

fn retries(cx: &mut Ctx, t: &Tbl) -> Option<ir::Retries> {
    let r = t.sub(cx, "retries", &["attempts", "on", "per_try_timeout"])?;
    let attempts = match r.require(cx, "attempts", "1–10") {
        Some(v) => doc::int(cx, v, r.field("attempts"), 1, 10).map_or(1, |a| a.v as u32),
        None => 1,
    };
    let mut on = Vec::new();
    if let Some((items, span, field)) = r.array(cx, "on") {
        if items.is_empty() {
            cx.err(
                &span,
                &field,
                format!("must list at least one condition: {}", RETRY_ON.join(", ")),
            );
        }
        for (i, v) in items.iter().enumerate() {
            if let Some(s) = doc::string(cx, v, format!("{field}[{i}]")) {
                if RETRY_ON.contains(&s.v) {
                    on.push(s.v.to_string());
                } else {
                    s.err(
                        cx,
                        format!("must be one of {}; got {}", RETRY_ON.join(", "), show(s.v)),
                    );
                }
            }
        }
    } else if r.get("on").is_none() {
        on = vec![
            "connect-failure".to_string(),
            "refused-stream".to_string(),
            "5xx".to_string(),
        ];
    }
    let per_try_timeout = r
        .get("per_try_timeout")
        .map(|_| duration(cx, &r, "per_try_timeout", Duration::ZERO, false));
    Some(ir::Retries {
        attempts,
        on,
        per_try_timeout,
    })
}
