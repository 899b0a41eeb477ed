//! What long work tells the user while it runs: one line per replica step, a spinner on a
//! terminal, or one JSON event per line for scripts (`--output json`).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

/// One step of a rollout or teardown.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    pub proxy: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// What happened, e.g. "pull", "validated", "created", "ready", "draining", "removed",
    /// "failed", "rolled-back".
    pub event: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Event {
    pub fn new(proxy: &str, event: &str) -> Event {
        Event {
            proxy: proxy.to_string(),
            slot: None,
            container: None,
            event: event.to_string(),
            message: String::new(),
        }
    }

    pub fn slot(mut self, slot: u32) -> Event {
        self.slot = Some(slot);
        self
    }

    pub fn container(mut self, name: &str) -> Event {
        self.container = Some(name.to_string());
        self
    }

    pub fn message(mut self, message: impl Into<String>) -> Event {
        self.message = message.into();
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Human lines on stderr, with a spinner when stderr is a terminal.
    Human,
    /// One JSON object per line on stdout.
    Json,
    /// Nothing.
    Quiet,
}

/// Called with every event, whatever the mode (serve records progress with it).
type Hook = Box<dyn Fn(&Event) + Send + Sync>;

pub struct Reporter {
    mode: Mode,
    spinner: Option<ProgressBar>,
    hook: Option<Hook>,
}

impl Reporter {
    pub fn new(mode: Mode) -> Reporter {
        let spinner = (mode == Mode::Human && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Reporter {
            mode,
            spinner,
            hook: None,
        }
    }

    /// Also calls `hook` with every event.
    pub fn on_event(mut self, hook: impl Fn(&Event) + Send + Sync + 'static) -> Reporter {
        self.hook = Some(Box::new(hook));
        self
    }

    pub fn quiet() -> Reporter {
        Reporter::new(Mode::Quiet)
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether image pulls may draw their own progress bar.
    pub fn shows_progress(&self) -> bool {
        self.spinner.is_some()
    }

    /// Reports a finished step.
    pub fn event(&self, event: Event) {
        if let Some(hook) = &self.hook {
            hook(&event);
        }
        match self.mode {
            Mode::Quiet => {}
            Mode::Json => {
                if let Ok(line) = serde_json::to_string(&event) {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{line}");
                }
            }
            Mode::Human => {
                let line = human_line(&event);
                match &self.spinner {
                    Some(bar) => bar.println(line),
                    None => eprintln!("{line}"),
                }
            }
        }
    }

    /// Shows what is being waited for, on the spinner only.
    pub fn waiting(&self, what: impl Into<String>) {
        if let Some(bar) = &self.spinner {
            bar.set_message(what.into());
        }
    }

    /// Turns the spinner into a bar of `done` of `total` steps (e.g. replicas of a rollout).
    pub fn steps(&self, done: usize, total: usize) {
        if let Some(bar) = &self.spinner {
            if bar.length() != Some(total as u64) {
                bar.set_style(
                    ProgressStyle::with_template(
                        "{spinner} {elapsed:>4} [{bar:24}] {pos}/{len} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar.set_length(total as u64);
            }
            bar.set_position(done as u64);
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(bar) = &self.spinner {
            bar.finish_and_clear();
        }
    }
}

fn human_line(e: &Event) -> String {
    let mut target = e.proxy.clone();
    if let Some(slot) = e.slot {
        target.push_str(&format!("/{slot}"));
    }
    let mut line = format!("{target:<16} {:<12}", e.event);
    if let Some(c) = &e.container {
        line.push_str(&format!(" {c}"));
    }
    if !e.message.is_empty() {
        line.push_str(&format!("  {}", e.message));
    }
    line.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_events_carry_only_what_is_set() {
        let e = Event::new("edge", "ready")
            .slot(1)
            .container("berth-edge-1-abc");
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"proxy": "edge", "slot": 1, "container": "berth-edge-1-abc", "event": "ready"})
        );
    }

    #[test]
    fn human_lines_name_the_replica() {
        let e = Event::new("edge", "created").slot(0).message("in 0.8s");
        assert_eq!(human_line(&e), "edge/0           created       in 0.8s");
    }
}
