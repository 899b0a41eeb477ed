//! The commands about berth itself: `completions`, `man` and `version`. The first two are
//! derived from the one clap definition of the command line, so they cannot drift from it.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::CommandFactory;

use super::{Cli, Output};
use crate::core::source::eg::{DEFAULT_IMAGE, EG_RELEASE};

/// What `berth version` prints.
#[derive(Debug, serde::Serialize)]
struct Version {
    version: &'static str,
    commit: &'static str,
    envoy_gateway: &'static str,
    envoy_image: &'static str,
}

/// `berth version`: berth's version, its git commit and the targeted Envoy Gateway release.
pub fn version(output: Output, out: &mut impl Write) -> Result<()> {
    let v = Version {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("BERTH_GIT_COMMIT"),
        envoy_gateway: EG_RELEASE,
        envoy_image: DEFAULT_IMAGE,
    };
    match output {
        Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?,
        Output::Table => {
            writeln!(out, "berth {}", v.version)?;
            writeln!(out, "commit:        {}", v.commit)?;
            writeln!(
                out,
                "envoy gateway: {} (its default Envoy image: {})",
                v.envoy_gateway, v.envoy_image
            )?;
        }
    }
    Ok(())
}

/// `berth completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell, out: &mut impl Write) {
    clap_complete::generate(shell, &mut Cli::command(), "berth", out);
}

/// `berth man [COMMAND]`: the manual page (roff) of berth or of one command; with `dir`,
/// writes berth.1 and one berth-COMMAND.1 per command there.
pub fn man(command: Option<&str>, dir: Option<&Path>, out: &mut impl Write) -> Result<()> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        clap_mangen::generate_to(cli, dir)
            .with_context(|| format!("writing manual pages to {}", dir.display()))?;
        return Ok(());
    }
    let page = match command {
        None => cli,
        Some(name) => match cli.find_subcommand(name) {
            Some(sub) => sub.clone(),
            None => {
                let known: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
                bail!("no command named {name:?}; berth has: {}", known.join(", "));
            }
        },
    };
    clap_mangen::Man::new(page).render(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_know_every_command() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            completions(shell, &mut out);
            let script = String::from_utf8(out).unwrap();
            for cmd in Cli::command().get_subcommands() {
                assert!(
                    script.contains(cmd.get_name()),
                    "{shell}: {} missing",
                    cmd.get_name()
                );
            }
        }
    }

    #[test]
    fn man_pages_for_berth_and_each_command() {
        let mut page = Vec::new();
        man(None, None, &mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains(".TH berth 1"), "{page}");
        assert!(
            page.contains("Exit codes"),
            "the examples and exit codes belong in the page"
        );
        let mut up = Vec::new();
        man(Some("logs"), None, &mut up).unwrap();
        let up = String::from_utf8(up).unwrap();
        assert!(
            up.contains(".TH berth-logs 1") && up.contains("\\-\\-follow"),
            "{up}"
        );
        assert!(man(Some("nope"), None, &mut Vec::new())
            .unwrap_err()
            .to_string()
            .contains("berth has: up"));
        let dir = tempfile::tempdir().unwrap();
        man(None, Some(dir.path()), &mut Vec::new()).unwrap();
        for file in ["berth.1", "berth-up.1", "berth-down.1", "berth-logs.1"] {
            assert!(dir.path().join(file).exists(), "{file}");
        }
    }
}
