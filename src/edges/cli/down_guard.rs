//! `berth down` must not be an accident. Typed in a directory without a config, with no PROXY
//! named, it would drain every proxy of the state directory (on a server: the production
//! fleet). Then it refuses unless `--all` is given, saying what it would remove; on a terminal
//! it asks instead. A config file (`-f FILE` or `./berth.toml`), a named PROXY or `--all` say
//! what is meant, and scripts keep using them without a question.

use std::io::{BufRead, Write};
use std::path::Path;

/// What `down` would remove: each proxy with its replica count.
pub type Removal = Vec<(String, usize)>;

/// What `down` does about its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Proceed,
    /// Ask on the terminal with this question; proceed only on yes.
    Ask(String),
    /// Refuse with this message (exit 2, nothing changed).
    Refuse(String),
}

/// How `down` was asked.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub has_config: bool,
    pub proxy_named: bool,
    pub all: bool,
    /// stdin and stderr are a terminal.
    pub interactive: bool,
    pub state_dir: &'a Path,
}

pub fn decide(ask: Ask<'_>, removal: &Removal) -> Decision {
    if ask.has_config || ask.proxy_named || ask.all || removal.is_empty() {
        return Decision::Proceed;
    }
    let what = describe(removal);
    let dir = ask.state_dir.display();
    if ask.interactive {
        return Decision::Ask(format!(
            "No config file here and no PROXY named: this drains and removes every proxy of \
             state directory {dir}: {what}.\nRemove them all? [y/N] "
        ));
    }
    Decision::Refuse(format!(
        "no config file (berth.toml or -f FILE) and no PROXY named: `down` would drain and \
         remove every proxy of state directory {dir}: {what}. Give --all to remove them all, \
         name one (berth down PROXY), or name the config (berth -f FILE down)"
    ))
}

/// "edge (3 replicas), api (no replicas)"
pub fn describe(removal: &Removal) -> String {
    removal
        .iter()
        .map(|(name, n)| match n {
            0 => format!("{name} (state only, no replicas)"),
            1 => format!("{name} (1 replica)"),
            n => format!("{name} ({n} replicas)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Asks `question` on `out` and reads one answer from `input`: true only for y or yes.
pub fn confirm(question: &str, input: &mut impl BufRead, out: &mut impl Write) -> bool {
    let _ = write!(out, "{question}");
    let _ = out.flush();
    let mut answer = String::new();
    if input.read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(has_config: bool, proxy_named: bool, all: bool, interactive: bool) -> Ask<'static> {
        Ask {
            has_config,
            proxy_named,
            all,
            interactive,
            state_dir: Path::new("/var/lib/berth"),
        }
    }

    fn fleet() -> Removal {
        vec![("api".into(), 2), ("edge".into(), 1), ("old".into(), 0)]
    }

    #[test]
    fn a_config_a_proxy_or_all_proceed() {
        for (c, p, a) in [
            (true, false, false),
            (false, true, false),
            (false, false, true),
        ] {
            assert_eq!(decide(ask(c, p, a, false), &fleet()), Decision::Proceed);
            assert_eq!(decide(ask(c, p, a, true), &fleet()), Decision::Proceed);
        }
    }

    #[test]
    fn nothing_to_remove_proceeds() {
        assert_eq!(
            decide(ask(false, false, false, false), &vec![]),
            Decision::Proceed
        );
    }

    #[test]
    fn without_a_config_scripts_are_refused_with_what_would_go() {
        let Decision::Refuse(msg) = decide(ask(false, false, false, false), &fleet()) else {
            panic!("expected a refusal")
        };
        for part in [
            "/var/lib/berth",
            "api (2 replicas)",
            "edge (1 replica)",
            "old (state only, no replicas)",
            "--all",
            "berth down PROXY",
            "-f FILE",
        ] {
            assert!(msg.contains(part), "{part:?} missing from: {msg}");
        }
    }

    #[test]
    fn without_a_config_a_terminal_is_asked() {
        let Decision::Ask(q) = decide(ask(false, false, false, true), &fleet()) else {
            panic!("expected a question")
        };
        assert!(
            q.contains("api (2 replicas)") && q.ends_with("[y/N] "),
            "{q}"
        );
    }

    #[test]
    fn only_yes_confirms() {
        for (answer, yes) in [
            ("y\n", true),
            ("YES\n", true),
            (" yes \n", true),
            ("\n", false),
            ("n\n", false),
            ("yep\n", false),
            ("", false),
        ] {
            let mut out = Vec::new();
            assert_eq!(
                confirm("sure? ", &mut answer.as_bytes(), &mut out),
                yes,
                "{answer:?}"
            );
            assert_eq!(out, b"sure? ");
        }
    }
}
