//! Template injection corpus (issue 7 §5): hostile strings in every user field that reaches a
//! rendered Envoy file. Each either fails validation with positioned errors that all name that
//! field, or renders files whose YAML has exactly the keys a benign twin renders (same
//! structure, plain value of the same length), with the hostile string read back verbatim as a
//! YAML string where it lands. Every field renders at least one hostile value, so none passes
//! by refusing everything.

use std::collections::BTreeSet;
use std::path::Path;

use berth::core::render::Renderer;
use berth::core::source::file;
use serde_yaml::Value;

const HOSTILE: &[&str] = &[
    "a\nb: c",
    "x\n- y",
    "k: v",
    "\"quoted\"",
    "'single'",
    "{{ proxy.name }}",
    "{% if true %}x{% endif %}",
    "{# comment #}",
    "# not a comment",
    "&anchor",
    "*alias",
    "<<: *merge",
    "!!binary AAAA",
    "---",
    "...",
    "@at `tick`",
    "|\n  block",
    ">\n  folded",
    "tab\tinside",
    "nul\0byte",
    "\u{2028}line separator",
    "é",
    // YAML scalars that are not strings when unquoted, and pass a strict name syntax.
    "null",
    "true",
    "no",
    "off",
    "1e3",
    "0x1f",
    "0o17",
    "007",
    "1_000",
    "-.inf",
];

const ROUTE: &str = "proxy[0].listener[0].virtual_host[0].route";

/// Fields that end up in rendered files: (name, template key to put the value in, the config
/// paths a refusal of a hostile value may name). (Labels are not here: they go to the
/// container, never to a rendered file.)
fn fields() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let route = |i: usize, rest: &str| format!("{ROUTE}[{i}].{rest}");
    vec![
        ("proxy name", "name", vec!["proxy[0].name".into()]),
        (
            "listener name",
            "listener",
            vec!["proxy[0].listener[0].name".into()],
        ),
        (
            "virtual host name",
            "vhost",
            vec!["proxy[0].listener[0].virtual_host[0].name".into()],
        ),
        (
            "domain",
            "domain",
            vec!["proxy[0].listener[0].virtual_host[0].domains[0]".into()],
        ),
        ("header name", "hname", vec![route(0, "headers")]),
        ("header value", "hvalue", vec![route(0, "headers")]),
        ("path prefix", "prefix", vec![route(0, "path_prefix")]),
        ("exact path", "exact", vec![route(1, "path")]),
        (
            "direct response body",
            "body",
            vec![route(1, "direct_response.body")],
        ),
        ("redirect host", "rhost", vec![route(2, "redirect.host")]),
        ("redirect path", "rpath", vec![route(2, "redirect.path")]),
        (
            "backend name",
            "backend",
            vec!["proxy[0].backend[0].name".into(), route(0, "backend")],
        ),
        (
            "endpoint host",
            "endpoint",
            vec!["proxy[0].backend[0].endpoints[0]".into()],
        ),
    ]
}

/// A single-line TOML basic string (escapes, never a multi-line string), so that every hostile
/// value parses as TOML, also as a key, and reaches berth's own validation.
fn q(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The config with `value` in `field`; a path gets a leading `/` (a path without one is refused
/// for that alone), an endpoint host its port.
fn config(field: &str, value: &str) -> String {
    let v = |f: &str, default: &str| {
        if f == field && ["prefix", "exact", "rpath"].contains(&f) {
            format!("/{value}")
        } else if f == field {
            value.to_string()
        } else {
            default.to_string()
        }
    };
    format!(
        r#"[[proxy]]
name = {name}
image = "berth-test/envoy:1.40.0"
[[proxy.listener]]
name = {listener}
port = 18080
[[proxy.listener.virtual_host]]
name = {vhost}
domains = [{domain}]
[[proxy.listener.virtual_host.route]]
path_prefix = {prefix}
headers = {{ {hname} = {hvalue} }}
backend = {backend}
[[proxy.listener.virtual_host.route]]
path = {exact}
direct_response = {{ status = 200, body = {body} }}
[[proxy.listener.virtual_host.route]]
path_prefix = "/r"
redirect = {{ host = {rhost}, path = {rpath}, status = 302 }}
[[proxy.backend]]
name = {backend}
endpoints = [{endpoint}]
"#,
        name = q(&v("name", "edge")),
        listener = q(&v("listener", "web")),
        vhost = q(&v("vhost", "main")),
        domain = q(&v("domain", "example.com")),
        prefix = q(&v("prefix", "/api")),
        hname = q(&v("hname", "x-canary")),
        hvalue = q(&v("hvalue", "yes")),
        backend = q(&v("backend", "api")),
        exact = q(&v("exact", "/hello")),
        body = q(&v("body", "hello")),
        rhost = q(&v("rhost", "example.org")),
        rpath = q(&v("rpath", "/new")),
        endpoint = q(&if field == "endpoint" {
            format!("{value}:9000")
        } else {
            "127.0.0.1:9000".to_string()
        }),
    )
}

/// Every key path in a YAML document; sequence positions are kept so a smuggled list item
/// shows up too.
fn key_paths(v: &Value, at: String, out: &mut BTreeSet<String>) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                let key = match k {
                    Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                let path = format!("{at}.{key}");
                out.insert(path.clone());
                key_paths(v, path, out);
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                key_paths(item, format!("{at}[{i}]"), out);
            }
        }
        Value::Tagged(t) => key_paths(&t.value, format!("{at}!{}", t.tag), out),
        _ => {}
    }
}

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Mapping(m) => m.iter().for_each(|(k, v)| {
            strings(k, out);
            strings(v, out);
        }),
        Value::Sequence(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Tagged(t) => strings(&t.value, out),
        _ => {}
    }
}

struct Rendered {
    keys: BTreeSet<String>,
    strings: Vec<String>,
}

fn render(text: &str) -> Result<Rendered, file::ConfigErrors> {
    let config = file::parse(Path::new("injection.toml"), text)?;
    let renderer = Renderer::builtin();
    let mut keys = BTreeSet::new();
    let mut all = Vec::new();
    for proxy in &config.infra.proxies {
        let rendered = renderer.render(proxy).expect("an accepted config renders");
        let files = std::iter::once(("bootstrap", &rendered.bootstrap))
            .chain(rendered.xds.iter().map(|(k, v)| (k.as_str(), v)));
        for (name, content) in files {
            let doc: Value = serde_yaml::from_str(content).expect("rendered YAML parses");
            // Route files are named after their listener (`rds-<listener>.yaml`): the name is
            // a DNS label, so a listener name may change the file name, never a key in it.
            let file = if name.starts_with("rds-") {
                "rds-<listener>.yaml"
            } else {
                name
            };
            key_paths(&doc, file.to_string(), &mut keys);
            strings(&doc, &mut all);
        }
    }
    Ok(Rendered { keys, strings: all })
}

#[test]
fn hostile_values_are_refused_or_rendered_inert() {
    let mut refused = 0;
    let mut rendered_inert = 0;
    for (what, field, paths) in fields() {
        let mut inert_here = 0;
        for hostile in HOSTILE.iter().map(|s| s.to_string()).chain([
            "x".repeat(70_000),
            format!("long {}", "{{ y }}".repeat(3000)),
        ]) {
            let text = config(field, &hostile);
            match render(&text) {
                Err(errors) => {
                    refused += 1;
                    let shown = errors.to_string();
                    assert!(
                        shown.contains("injection.toml:"),
                        "{what}: errors name the file: {shown}"
                    );
                    for e in &errors.0 {
                        assert!(e.line >= 1 && e.column >= 1, "{what}: unpositioned {e:?}");
                        assert!(!e.message.is_empty(), "{what}: empty message");
                        assert!(
                            paths.iter().any(|p| e.field.starts_with(p.as_str())),
                            "{what} = {hostile:?}: the refusal names {:?}, not the hostile field ({paths:?}): {shown}",
                            e.field
                        );
                    }
                }
                Ok(got) => {
                    rendered_inert += 1;
                    inert_here += 1;
                    let twin_value: String = "a".repeat(hostile.chars().count().max(1));
                    let twin = render(&config(field, &twin_value)).unwrap_or_else(|e| {
                        panic!("{what}: the benign twin {twin_value:?} must be accepted: {e}")
                    });
                    assert_eq!(
                        got.keys, twin.keys,
                        "{what} = {hostile:?} changed the rendered keys"
                    );
                    assert!(
                        got.strings.iter().any(|s| s.contains(hostile.as_str())),
                        "{what} = {hostile:?} does not read back verbatim"
                    );
                }
            }
        }
        // A field whose every hostile value is refused says nothing about rendering.
        assert!(
            inert_here >= 1,
            "{what}: no hostile value was rendered, so none was shown inert in a file"
        );
    }
    eprintln!("{refused} refused naming the field, {rendered_inert} rendered inert and read back");
    // Both outcomes must occur, or the corpus is not testing what it claims.
    assert!(refused > 50, "refused only {refused}");
    assert!(rendered_inert > 10, "rendered only {rendered_inert}");
}
