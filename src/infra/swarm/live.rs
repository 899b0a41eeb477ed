//! A live change of a proxy's watched files on a Swarm (DESIGN decision 15): the manager sends
//! the make-before-break stages ([`delivery::stages`], the same as on one host) to the agent of
//! every running task, on every node, and waits for each task's own Envoy to confirm each
//! stage. Each task goes through its stages on its own (each has its own watched directory);
//! when any task refuses or does not answer, every task is taken back to the previous files the
//! same way, and the proxy is Degraded with Envoy's reason. No task restarts, no rolling update.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

use super::hub::Hub;
use crate::core::agent::channel::TLS_PREFIX;
use crate::core::progress::Event;
use crate::infra::delivery::{self, Ack, LiveOutcome, LiveRejected};
use crate::infra::{ConvergeError, Delivery};

/// How long the manager waits for every running task's agent to be attached (agents dial again
/// every the agent's redial interval, 1 s).
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);

/// Takes every task in `tasks` from `previous` to `files` (both stamped), confirming each
/// stage; on a refusal puts `previous` back on all of them.
pub async fn deliver(
    hub: &Hub,
    proxy: &str,
    tasks: &[String],
    previous: &BTreeMap<String, String>,
    files: &BTreeMap<String, String>,
    serials: &[String],
    timeout: Duration,
) -> Result<LiveOutcome, LiveRejected> {
    let generation = delivery::generation_of(files);
    let written: Vec<String> = files
        .iter()
        .filter(|(n, c)| previous.get(*n) != Some(*c))
        .map(|(n, _)| n.clone())
        .chain(previous.keys().filter(|n| !files.contains_key(*n)).cloned())
        .collect();
    let missing = hub.await_attached(proxy, tasks, ATTACH_TIMEOUT).await;
    if !missing.is_empty() {
        let replicas = tasks
            .iter()
            .map(|t| {
                let ack = if missing.contains(t) {
                    Ack::NoAnswer {
                        detail: format!(
                            "its agent did not connect to the manager at {} within {}",
                            hub.address,
                            humantime::format_duration(ATTACH_TIMEOUT)
                        ),
                    }
                } else {
                    Ack::Confirmed { millis: 0 }
                };
                (t.clone(), ack)
            })
            .collect();
        return Err(LiveRejected {
            proxy: proxy.to_string(),
            generation,
            stage: "agents connected".to_string(),
            replicas,
            restored: "nothing was changed".to_string(),
        });
    }
    let started = Instant::now();
    let agents = hub.agents(proxy);
    let one = |task: String| {
        let have = agents
            .get(&task)
            .map(|a| a.files.clone())
            .unwrap_or_default();
        async move {
            let stages = delivery::stages(&have, files);
            let last = stages.len().saturating_sub(1);
            let mut ack = Ack::Confirmed {
                millis: started.elapsed().as_millis() as u64,
            };
            for (i, stage) in stages.iter().enumerate() {
                // The certificates must be served once the last stage is in.
                let serials: &[String] = if i == last { serials } else { &[] };
                ack = hub.stage(&task, stage, serials, timeout).await;
                if !matches!(ack, Ack::Confirmed { .. }) {
                    return (task, ack, Some(stage.what));
                }
            }
            if let Ack::Confirmed { .. } = ack {
                ack = Ack::Confirmed {
                    millis: started.elapsed().as_millis() as u64,
                };
            }
            (task, ack, None)
        }
    };
    let results = futures_util::future::join_all(tasks.iter().cloned().map(one)).await;
    let failed_stage = results.iter().find_map(|(_, _, s)| *s);
    let replicas: BTreeMap<String, Ack> = results.into_iter().map(|(t, a, _)| (t, a)).collect();
    let Some(stage) = failed_stage else {
        return Ok(LiveOutcome {
            proxy: proxy.to_string(),
            generation,
            written,
            replicas,
            elapsed: started.elapsed(),
        });
    };
    let restored = restore(hub, proxy, tasks, previous, timeout).await;
    Err(LiveRejected {
        proxy: proxy.to_string(),
        generation,
        stage: stage.to_string(),
        replicas,
        restored,
    })
}

/// Takes every task back to `previous`; says how that went.
async fn restore(
    hub: &Hub,
    proxy: &str,
    tasks: &[String],
    previous: &BTreeMap<String, String>,
    timeout: Duration,
) -> String {
    let agents = hub.agents(proxy);
    let one = |task: String| {
        let have = agents
            .get(&task)
            .map(|a| a.files.clone())
            .unwrap_or_default();
        async move {
            for stage in delivery::stages(&have, previous) {
                if !matches!(
                    hub.stage(&task, &stage, &[], timeout).await,
                    Ack::Confirmed { .. }
                ) {
                    return Some(task);
                }
            }
            None
        }
    };
    let not_back: Vec<String> = futures_util::future::join_all(tasks.iter().cloned().map(one))
        .await
        .into_iter()
        .flatten()
        .collect();
    delivery::restored_summary(previous, &not_back, " on every task", "each serves them")
}

/// The live set the tasks are to serve: the stamped watched files and the certificate copies
/// they name. `previous` when held or when nothing but the stamp would change; else the
/// rendered files stamped with `generation`, or the next one after `previous`'s.
pub fn next_files(
    target: &crate::core::target::Target,
    previous: &BTreeMap<String, String>,
    generation: Option<u64>,
    hold: bool,
) -> BTreeMap<String, String> {
    if hold && !previous.is_empty() {
        return previous.clone();
    }
    let previous_watched: BTreeMap<String, String> = previous
        .iter()
        .filter(|(n, _)| !n.starts_with(TLS_PREFIX))
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    let mut next = match generation {
        Some(g) => delivery::stamp(&target.rendered.xds, g),
        None if !previous_watched.is_empty()
            && delivery::unstamp(&previous_watched) == target.rendered.xds =>
        {
            previous_watched
        }
        None => {
            let next = delivery::generation_of(&previous_watched).unwrap_or(0) + 1;
            delivery::stamp(&target.rendered.xds, next)
        }
    };
    next.extend(tls_copies(target));
    next
}

/// The certificate copies a target's watched files name, as the live set carries them
/// (`tls/<owner>/<file>`): listener certificates and keys, backends' CAs and client pairs.
pub fn tls_copies(target: &crate::core::target::Target) -> BTreeMap<String, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut out = BTreeMap::new();
    for c in &target.certificates {
        out.insert(
            format!("{TLS_PREFIX}{}/{}", c.dir, c.cert_name()),
            text(&c.cert_pem),
        );
        out.insert(
            format!("{TLS_PREFIX}{}/{}", c.dir, c.key_name()),
            text(&c.key_pem),
        );
    }
    for b in &target.backend_tls {
        for (name, content, _) in b.copies() {
            out.insert(format!("{TLS_PREFIX}{}/{name}", b.owner()), text(content));
        }
    }
    out
}

/// The files that differ between two sets (written or gone).
pub fn changed(from: &BTreeMap<String, String>, to: &BTreeMap<String, String>) -> Vec<String> {
    to.iter()
        .filter(|(n, c)| from.get(*n) != Some(*c))
        .map(|(n, _)| n.clone())
        .chain(from.keys().filter(|n| !to.contains_key(*n)).cloned())
        .collect()
}

impl super::Swarm {
    /// The agent channel, started on first use.
    pub(super) async fn hub(&self) -> Result<&Hub, ConvergeError> {
        self.hub
            .get_or_try_init(|| Hub::start(&self.state, self.agent_address))
            .await
            .map_err(|e| ConvergeError::Host {
                problem: format!("{e:#}"),
            })
    }

    /// The channel settings of `proxy`'s tasks: where they dial and their credentials (made
    /// when `create`; a `diff` before the first `up` shows them as they will be).
    pub(super) fn channel(
        &self,
        proxy: &str,
        create: bool,
    ) -> anyhow::Result<super::service::Channel> {
        let agents = self.state.root().join("agents");
        if !create && !agents.join("ca.key").exists() {
            return Ok(super::service::Channel {
                manager: self.agent_address,
                ca: String::new(),
                cert: String::new(),
                key: String::new(),
            });
        }
        let authority = super::pki::Authority::open(&self.state)
            .with_context(|| format!("the agent channel's CA in {}", agents.display()))?;
        let pair = authority.agent(proxy)?;
        Ok(super::service::Channel {
            manager: self.agent_address,
            ca: authority.ca_pem().to_string(),
            cert: pair.cert,
            key: pair.key,
        })
    }

    /// Delivers `watched` to every running task through its agent (see the module docs).
    pub(super) async fn deliver_live(
        &self,
        target: &crate::core::target::Target,
        previous: &BTreeMap<String, String>,
        watched: &BTreeMap<String, String>,
        timeout: Duration,
        reporter: &crate::core::progress::Reporter,
    ) -> Result<Delivery, ConvergeError> {
        let name = target.name();
        if watched == previous {
            return Ok(Delivery::Unchanged);
        }
        let hub = self.hub().await?;
        let tasks: Vec<String> = self
            .running_tasks(name)
            .await?
            .into_iter()
            .filter(|t| t.running())
            .map(|t| t.service_node)
            .collect();
        if tasks.is_empty() {
            self.state.write_live(name, watched)?;
            return Ok(Delivery::Written {
                files: changed(previous, watched),
            });
        }
        reporter.waiting(format!(
            "{name}: {} task(s) confirming the new files through their agents",
            tasks.len()
        ));
        let serials: Vec<String> = target
            .certificates
            .iter()
            .map(|c| c.serial.clone())
            .chain(target.backend_tls.iter().flat_map(|b| b.serials()))
            .collect();
        match deliver(hub, name, &tasks, previous, watched, &serials, timeout).await {
            Ok(outcome) => {
                self.state.write_live(name, watched)?;
                reporter.event(Event::new(name, "files").message(format!(
                    "wrote {}; confirmed by {} task(s) through their agents",
                    outcome.written.join(", "),
                    tasks.len()
                )));
                // Agents that attached meanwhile.
                hub.catch_up(name, timeout).await;
                Ok(Delivery::Confirmed {
                    files: outcome.written,
                    replicas: tasks.len(),
                    elapsed: outcome.elapsed,
                })
            }
            Err(r) => {
                reporter.event(Event::new(name, "files-rejected").message(r.to_string()));
                Ok(Delivery::Failed(r))
            }
        }
    }
}
