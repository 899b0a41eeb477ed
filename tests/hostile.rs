//! The hostile-config corpus: every file in tests/hostile/ must be rejected with
//! FILE:LINE:COL messages that contain the substring named in its first line
//! (`# expect: <substring>`).

use std::path::{Path, PathBuf};

use berth::core::source::file;

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/hostile exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn expectation(text: &str, path: &Path) -> String {
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{} must start with `# expect: <substring>`", path.display()))
        .to_string()
}

#[test]
fn corpus_is_large_enough() {
    assert!(
        corpus().len() >= 30,
        "only {} hostile files",
        corpus().len()
    );
}

#[test]
fn every_hostile_file_is_rejected_with_positions() {
    let mut failures = Vec::new();
    for path in corpus() {
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        let expect = expectation(&text, &path);
        let errors = match file::load(&path) {
            Ok(_) => {
                failures.push(format!("{}: parsed without error", path.display()));
                continue;
            }
            Err(e) => e,
        };
        assert!(!errors.0.is_empty(), "{}: empty error list", path.display());
        let out = errors.to_string();
        for e in &errors.0 {
            if e.line < 1 || e.column < 1 {
                failures.push(format!("{}: error without position: {e}", path.display()));
            }
            if e.message.contains('\n') || e.field.contains('\n') {
                failures.push(format!("{}: multi-line error: {e:?}", path.display()));
            }
            let prefix = format!("{}:{}:{}: ", path.display(), e.line, e.column);
            if !out.contains(&prefix) {
                failures.push(format!("{}: output lacks {prefix}", path.display()));
            }
        }
        // One error per output line.
        assert_eq!(out.lines().count(), errors.0.len(), "{}", path.display());
        if !out.contains(&expect) {
            failures.push(format!(
                "{}: output does not contain {expect:?}:\n{out}",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn unreadable_file_is_one_error_at_line_zero() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/does-not-exist.toml");
    let errors = file::load(&path).unwrap_err();
    assert_eq!(errors.0.len(), 1);
    assert_eq!((errors.0[0].line, errors.0[0].column), (0, 0));
    assert!(errors
        .to_string()
        .contains("does-not-exist.toml:0:0: file: cannot read"));
}

/// One-character deletions and substitutions (at every third position) of the examples either parses or fails with
/// positioned, single-line errors; nothing panics.
#[test]
fn mutated_examples_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for name in ["quickstart.toml", "multi.toml", "tls.toml", "xds.toml"] {
        let path = dir.join(name);
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        let chars: Vec<char> = text.chars().collect();
        for i in (0..chars.len()).step_by(3) {
            for replacement in [None, Some('"'), Some('\n'), Some('é')] {
                let mut mutated: String = chars[..i].iter().collect();
                mutated.extend(replacement);
                mutated.extend(&chars[i + 1..]);
                if let Err(errors) = file::parse(&path, &mutated) {
                    for e in &errors.0 {
                        assert!(e.line >= 1 && e.column >= 1, "{name} @{i}: {e}");
                        assert!(!e.message.contains('\n'), "{name} @{i}: {e:?}");
                    }
                }
            }
        }
    }
}
