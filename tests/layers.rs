//! The layering of src/ (docs/how-it-works.md, "The tree in layers"): each folder under src/
//! is a layer, and a layer may use only the layers its row of [`RULES`] names. This test reads
//! every src/**.rs, collects each `crate::<layer>` path (in `use` statements, `use` groups and
//! inline paths, comments left out) and each `bollard::` path, and fails naming file:line for
//! every one a rule forbids. Pure and fast: no Docker, no build of berth needed.
//!
//! Known breaks that a later change removes are listed in [`ALLOWED`], each with its reason;
//! an entry that no longer matches anything fails the test too, so the list only shrinks.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `(layer, layers it may use)`. Every layer may use itself. `infra` counts as two: its seam
/// (`infra/mod.rs`: the trait, its types, the constructor that picks an implementation) and its
/// implementations ([`INFRA_IMPLEMENTATIONS`]), which only `infra` itself may name.
const RULES: &[(&str, &[&str])] = &[
    ("core", &[]),
    ("envoy", &["core"]),
    ("host", &["core", "state"]),
    ("state", &["core"]),
    ("engine", &["core"]),
    ("infra", &["core", "envoy", "host", "state", "engine"]),
    ("ops", &["core", "envoy", "host", "state", "infra"]),
    ("status", &["core", "envoy", "state", "infra"]),
    (
        "edges",
        &["core", "envoy", "host", "state", "infra", "ops", "status"],
    ),
];

/// The implementations behind the infrastructure seam: only `infra` names them.
const INFRA_IMPLEMENTATIONS: &[&str] = &["docker_host", "swarm", "delivery"];

/// The only layer that talks to the container engine's API client.
const BOLLARD_LAYER: &str = "engine";

/// Breaks known today, each `(file under src/, path prefix it uses, why it is still there)`.
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "core/target.rs",
        "ops::acme",
        "target locates the ACME placeholders itself; the caller (ops) hands them in instead",
    ),
    (
        "edges/cli/commands.rs",
        "engine",
        "the CLI connects DockerEngine itself and reads EngineError::Unreachable; the seam's constructor and typed errors take that over",
    ),
    (
        "edges/cli/commands.rs",
        "infra::docker_host",
        "HostReads (observations started ahead of the work) is the docker host's; the seam offers it",
    ),
    (
        "edges/cli/commands.rs",
        "infra::delivery",
        "DEFAULT_CONFIRM_TIMEOUT is delivery's; it belongs to the seam's settings",
    ),
    (
        "edges/cli/settings.rs",
        "engine",
        "settings starts the engine connection ahead (DockerEngine, EngineResult); the seam's constructor takes that over",
    ),
    (
        "edges/cli/settings.rs",
        "infra::docker_host",
        "settings starts docker_host::Ahead; the seam offers it",
    ),
    (
        "edges/cli/logs.rs",
        "engine",
        "berth logs lists containers through the engine itself; it goes through ops",
    ),
    (
        "edges/cli/logs.rs",
        "bollard::",
        "berth logs streams container logs with bollard; the engine's logs call takes it over",
    ),
    (
        "engine/docker/raw_http.rs",
        "envoy::admin",
        "the Docker adapter speaks HTTP over the Docker socket with Envoy's admin client; it gets its own",
    ),
    (
        "engine/fake.rs",
        "envoy::admin",
        "the fake engine (compiled for unit tests only) answers its Envoy's admin calls through envoy's AdminApi",
    ),
    (
        "infra/docker_host/tests.rs",
        "ops",
        "unit tests of the use cases over the fake engine; they move to ops",
    ),
    (
        "infra/swarm/events.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/images.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/mod.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/diff.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/entrypoint.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/placement.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "edges/agent/channel.rs",
        "infra::delivery",
        "a Swarm task's agent applies and confirms a stage with the one-host delivery code (stages, renames, Envoy's confirmation); that part of delivery moves to envoy",
    ),
    (
        "infra/swarm/objects.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/service.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/tasks.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
    (
        "infra/swarm/tests.rs",
        "bollard::",
        "the Swarm API is called through bollard here; an engine adapter for Swarm objects (services, tasks, configs, secrets, nodes) takes it over",
    ),
];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Use {
    file: String,
    line: usize,
    /// `crate::a::b::c` without `crate::`, or `bollard::...`.
    path: String,
}

#[test]
fn every_layer_uses_only_what_its_rule_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 50,
        "found only {} files under src/",
        files.len()
    );

    let layers: BTreeSet<&str> = RULES.iter().map(|(l, _)| *l).collect();
    let mut broken = Vec::new();
    let mut used_allowances = BTreeSet::new();
    for path in &files {
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let Some(layer) = rel.split('/').next().filter(|l| layers.contains(l)) else {
            continue; // lib.rs, main.rs
        };
        let text = std::fs::read_to_string(path).unwrap();
        for u in uses(&rel, &text) {
            let Some(why) = forbidden(layer, &u.path) else {
                continue;
            };
            match ALLOWED
                .iter()
                .position(|(f, prefix, _)| *f == rel && u.path.starts_with(prefix))
            {
                Some(i) => {
                    used_allowances.insert(i);
                }
                None => broken.push(format!("src/{}:{}: {why} ({})", u.file, u.line, u.path)),
            }
        }
    }
    let mut report = String::new();
    for b in &broken {
        writeln!(report, "{b}").unwrap();
    }
    for (i, (f, prefix, _)) in ALLOWED.iter().enumerate() {
        if !used_allowances.contains(&i) {
            writeln!(
                report,
                "stale allowance: src/{f} no longer uses {prefix}: remove it from ALLOWED"
            )
            .unwrap();
        }
    }
    assert!(
        report.is_empty(),
        "layer rules broken (tests/layers.rs):\n{report}"
    );
}

/// Why `layer` may not use `path`, if it may not.
fn forbidden(layer: &str, path: &str) -> Option<String> {
    if path.starts_with("bollard::") {
        return (layer != BOLLARD_LAYER)
            .then(|| format!("{layer} uses bollard (only {BOLLARD_LAYER} may)"));
    }
    let mut segments = path.split("::");
    let target = segments.next().unwrap_or_default();
    if target == layer {
        return None;
    }
    let allowed = RULES
        .iter()
        .find(|(l, _)| *l == layer)
        .map(|(_, a)| *a)
        .unwrap_or_default();
    if !RULES.iter().any(|(l, _)| *l == target) {
        return None; // a crate-root item (none today) or a macro
    }
    if !allowed.contains(&target) {
        return Some(format!("{layer} uses {target}"));
    }
    if target == "infra" {
        if let Some(second) = segments.next() {
            if INFRA_IMPLEMENTATIONS.contains(&second) {
                return Some(format!(
                    "{layer} uses infra's implementation {second} (only the seam, infra/mod.rs)"
                ));
            }
        }
    }
    None
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of `text` with comments and string literals blanked (newlines kept, so line
/// numbers hold). Works on bytes: every delimiter is ASCII, so multi-byte characters pass
/// through whole.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let at = |i: usize, s: &str| b[i..].starts_with(s.as_bytes());
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let newlines = |out: &mut Vec<u8>, from: usize, to: usize| {
        out.extend(b[from..to].iter().filter(|c| **c == b'\n'));
    };
    let mut i = 0;
    while i < b.len() {
        if at(i, "//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            newlines(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' || at(i, "r#\"") || at(i, "r\"") {
            let raw = b[i] == b'r';
            let (close, start) = if raw {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                (format!("\"{}", "#".repeat(hashes)), i + 2 + hashes)
            } else {
                ("\"".to_string(), i + 1)
            };
            let mut j = start;
            while j < b.len() {
                if !raw && b[j] == b'\\' {
                    j += 2;
                    continue;
                }
                if at(j, &close) {
                    j += close.len();
                    break;
                }
                j += 1;
            }
            let j = j.min(b.len());
            out.push(b'"');
            newlines(&mut out, i, j);
            out.push(b'"');
            i = j;
        } else if b[i] == b'\''
            && i + 2 < b.len()
            && (b[i + 2] == b'\'' || (b[i + 1] == b'\\' && b.get(i + 3) == Some(&b'\'')))
        {
            // a char literal such as '"' or '\''
            i += if b[i + 1] == b'\\' { 4 } else { 3 };
            out.extend_from_slice(b"' '");
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII was removed")
}

/// Every `crate::...` path (each item of a `use crate::{...}` group on its own) and every
/// `bollard::...` path in `text`, with its line.
fn uses(file: &str, text: &str) -> Vec<Use> {
    let code = code_only(text);
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    for (root, keep_root) in [("crate::", false), ("bollard::", true)] {
        let mut from = 0;
        while let Some(at) = code[from..].find(root).map(|a| a + from) {
            from = at + root.len();
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
                continue;
            }
            let prefix = if keep_root { root } else { "" };
            for (offset, path) in paths_at(&code[from..]) {
                found.push(Use {
                    file: file.to_string(),
                    line: line_of(from + offset),
                    path: format!("{prefix}{path}"),
                });
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The paths that start at `rest` (just after `crate::`): one, or each top-level item of a
/// `{...}` group, with its offset in `rest`.
fn paths_at(rest: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect::<String>()
            .trim_end_matches(':')
            .to_string()
    };
    if !rest.starts_with('{') {
        return vec![(0, ident(rest))];
    }
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 1);
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                let item = &rest[start..i];
                let lead = item.len() - item.trim_start().len();
                let name = ident(item.trim_start());
                if !name.is_empty() {
                    items.push((start + lead, name));
                }
                start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    items
}

#[test]
fn the_reader_sees_groups_inline_paths_and_skips_comments() {
    let text = "use crate::{\n    core::ir,\n    engine::{A, B},\n};\n// crate::ops::x\nfn f() { crate::edges::cli::run(\"crate::ops\"); let _ = bollard::Docker::x; }\n";
    let got: Vec<(usize, String)> = uses("f.rs", text)
        .into_iter()
        .map(|u| (u.line, u.path))
        .collect();
    assert_eq!(
        got,
        vec![
            (2, "core::ir".to_string()),
            (3, "engine".to_string()),
            (6, "bollard::Docker::x".to_string()),
            (6, "edges::cli::run".to_string()),
        ]
    );
    assert_eq!(
        forbidden("core", "engine"),
        Some("core uses engine".to_string())
    );
    assert!(forbidden("edges", "infra::swarm::Swarm").is_some());
    assert!(forbidden("edges", "infra::Infrastructure").is_none());
    assert!(forbidden("status", "bollard::Docker").is_some());
    assert!(forbidden("engine", "bollard::Docker").is_none());
}
