//! The hook solver: a command the user provides sets or removes the TXT record at any DNS
//! provider. berth runs it once per record with its parameters in the environment (never on
//! the command line, where `ps` shows them):
//!
//! ```text
//! BERTH_ACME_ACTION   present | cleanup
//! BERTH_ACME_DOMAIN   the name proved, without "*." (example.com for *.example.com)
//! BERTH_ACME_FQDN     the record's name: _acme-challenge.example.com
//! BERTH_ACME_VALUE    the TXT value
//! ```
//!
//! plus the variables of `env_file` (credentials). Exit 0 is success. The command runs in its
//! own process group, killed whole when the timeout passes; its output is logged with the
//! env file's values blanked out.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::AsyncReadExt;

use super::TxtRecord;

/// The most of a hook's output kept for the log and the error.
const OUTPUT_LIMIT: usize = 16 * 1024;

pub struct Hook<'a> {
    pub command: &'a [String],
    pub env_file: Option<&'a Path>,
    pub timeout: Duration,
}

impl Hook<'_> {
    /// Runs the hook for `action` ("present" or "cleanup") of one record.
    pub async fn run(&self, action: &str, record: &TxtRecord) -> Result<()> {
        let env = match self.env_file {
            Some(f) => crate::core::source::file::read_env_file(f)?,
            None => Vec::new(),
        };
        let Some((program, args)) = self.command.split_first() else {
            bail!("the hook command is empty");
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("BERTH_ACME_ACTION", action)
            .env("BERTH_ACME_DOMAIN", &record.domain)
            .env("BERTH_ACME_FQDN", &record.fqdn)
            .env("BERTH_ACME_VALUE", &record.value)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run {program}"))?;
        let pid = child.id();
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let read = async {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let mut so = (&mut stdout).take(OUTPUT_LIMIT as u64);
            let mut se = (&mut stderr).take(OUTPUT_LIMIT as u64);
            let _ = tokio::join!(so.read_to_end(&mut out), se.read_to_end(&mut err));
            (out, err)
        };
        let waited = tokio::time::timeout(self.timeout, async {
            let (out, err) = read.await;
            (child.wait().await, out, err)
        })
        .await;
        let Ok((status, out, err)) = waited else {
            if let Some(pid) = pid {
                // The whole group: a shell's children too.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            bail!(
                "{action} for {} did not finish within its timeout of {:?} and was killed",
                record.fqdn,
                self.timeout
            );
        };
        let redact = |b: &[u8]| {
            let mut s = String::from_utf8_lossy(b).trim_end().to_string();
            for (_, v) in &env {
                if v.len() >= 4 {
                    s = s.replace(v.as_str(), "[redacted]");
                }
            }
            s
        };
        let (out, err) = (redact(&out), redact(&err));
        let status = status.context("waiting for the hook")?;
        if !out.is_empty() || !err.is_empty() {
            tracing::info!(
                "dns-01 hook {program} {action} {}: stdout: {out:?} stderr: {err:?}",
                record.fqdn
            );
        }
        if !status.success() {
            let said = match (out.is_empty(), err.is_empty()) {
                (_, false) => format!("; it said: {}", last_lines(&err)),
                (false, true) => format!("; it said: {}", last_lines(&out)),
                _ => String::new(),
            };
            bail!("{action} for {} failed ({status}){said}", record.fqdn);
        }
        Ok(())
    }
}

fn last_lines(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" / ")
}
