//! Template injection corpus (issue 7 §5): hostile strings in every user field that reaches a
//! rendered Envoy file. Each either fails validation with a positioned error naming the field,
//! or renders files whose YAML has exactly the keys a benign twin renders (same structure,
//! plain value of the same length), with the hostile string read back verbatim where it lands.

use std::collections::BTreeSet;
use std::path::Path;

use berth::render::Renderer;
use berth::source::file;
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
];

/// Fields that end up in rendered files, as (name, template line to put the value in).
const FIELDS: &[(&str, &str)] = &[
    ("proxy name", "name"),
    ("listener name", "listener"),
    ("virtual host name", "vhost"),
    ("domain", "domain"),
    ("header name", "hname"),
    ("header value", "hvalue"),
    ("path prefix", "prefix"),
    ("exact path", "exact"),
    ("direct response body", "body"),
    ("redirect host", "rhost"),
    ("redirect path", "rpath"),
    ("backend name", "backend"),
    ("endpoint host", "endpoint"),
    ("label value", "label"),
];

fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn config(field: &str, value: &str) -> String {
    let v = |f: &str, default: &str| {
        if f == field {
            value.to_string()
        } else {
            default.to_string()
        }
    };
    format!(
        r#"[[proxy]]
name = {name}
image = "berth-test/envoy:1.40.0"
labels = {{ team = {label} }}
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
        label = q(&v("label", "web")),
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
            key_paths(&doc, name.to_string(), &mut keys);
            strings(&doc, &mut all);
        }
    }
    Ok(Rendered { keys, strings: all })
}

#[test]
fn hostile_values_are_refused_or_rendered_inert() {
    let mut refused = 0;
    let mut rendered_inert = 0;
    for (what, field) in FIELDS {
        for hostile in HOSTILE.iter().map(|s| s.to_string()).chain([
            "x".repeat(70_000),
            format!("long {}", "{{ y }}".repeat(3000)),
        ]) {
            let text = config(field, &hostile);
            match render(&text) {
                Err(errors) => {
                    refused += 1;
                    for e in &errors.0 {
                        assert!(e.line >= 1 && e.column >= 1, "{what}: unpositioned {e:?}");
                        assert!(!e.message.is_empty(), "{what}: empty message");
                    }
                    let shown = errors.to_string();
                    assert!(
                        shown.contains("injection.toml:"),
                        "{what}: errors name the file: {shown}"
                    );
                }
                Ok(got) => {
                    rendered_inert += 1;
                    let twin_value: String = "a".repeat(hostile.chars().count().max(1));
                    let twin = render(&config(field, &twin_value)).unwrap_or_else(|e| {
                        panic!("{what}: the benign twin {twin_value:?} must be accepted: {e}")
                    });
                    assert_eq!(
                        got.keys, twin.keys,
                        "{what} = {hostile:?} changed the rendered keys"
                    );
                    if *field != "label" {
                        assert!(
                            got.strings.iter().any(|s| s.contains(hostile.as_str())),
                            "{what} = {hostile:?} does not read back verbatim"
                        );
                    }
                }
            }
        }
    }
    eprintln!("{refused} refused with positioned errors, {rendered_inert} rendered inert");
    // Both outcomes must occur, or the corpus is not testing what it claims.
    assert!(refused > 50, "refused only {refused}");
    assert!(rendered_inert > 10, "rendered only {rendered_inert}");
}
