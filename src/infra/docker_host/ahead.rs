//! Work a command starts before the engine answers: readiness probes, and the reads of the
//! host its preparation needs ([`super::prepare::HostReads`]).
//!
//! A command knows from its last look ([`super::observe::OBSERVATION_CACHE_FILE`]) which
//! replicas ran and where their admin sockets are, so it probes them while the engine is asked
//! for its version, the containers and the recent events. An answer is used only for a
//! container that the command's first observation finds running under the same ID with no
//! engine event since the last look (the engine vouches for it: same container, same admin
//! socket), probed with the same expectation; anything else is probed again, as before. Every
//! answer is newer than the command's start, and a replica that stopped serving since the last
//! command fails this probe as it would fail a later one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::core::replica::LABEL_NAME;
use crate::core::target::Target;
use crate::engine::{ObservationCache, ObservedContainer, RunState};
use crate::envoy::admin::AdminConnector;
use crate::envoy::readiness::{self, Expect, Readiness};
use crate::state::StateDir;

/// What a command keeps of its last look in the state directory: the engine's cache, and
/// where each running replica's admin socket was.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct LastLook {
    #[serde(flatten)]
    pub engine: ObservationCache,
    /// Running containers, by ID.
    #[serde(default)]
    pub running: BTreeMap<String, RunningReplica>,
}

/// A running replica as the last look saw it: enough to find and probe its admin socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct RunningReplica {
    pub proxy: String,
    /// The name its run directory was made under.
    pub run: String,
    pub spec: Option<String>,
}

impl LastLook {
    pub fn read(path: &Path) -> (Vec<u8>, LastLook) {
        let before = std::fs::read(path).unwrap_or_default();
        let look = serde_json::from_slice(&before).unwrap_or_default();
        (before, look)
    }

    /// The running ones among `found`.
    pub fn running_of(found: &[ObservedContainer]) -> BTreeMap<String, RunningReplica> {
        found
            .iter()
            .filter(|c| c.state == RunState::Running)
            .filter_map(|c| {
                Some((
                    c.id.clone(),
                    RunningReplica {
                        proxy: c.proxy()?.to_string(),
                        run: c.label(LABEL_NAME).unwrap_or(&c.name).to_string(),
                        spec: c.spec_hash().map(str::to_string),
                    },
                ))
            })
            .collect()
    }
}

struct Probe {
    socket: PathBuf,
    expect: Expect,
    answer: JoinHandle<Readiness>,
}

#[derive(Default)]
struct Probes {
    by_id: BTreeMap<String, Probe>,
    /// The first observation has said which answers may be used.
    settled: bool,
}

/// Probes in flight since the command started, by container ID, and the host reads.
#[derive(Default)]
pub struct Ahead {
    inner: Mutex<Probes>,
    host: Mutex<Option<super::prepare::HostReads>>,
}

impl Ahead {
    /// Starts one probe per replica the last look in `state` saw running, of a proxy among
    /// `targets`, expecting what a converge of it would expect.
    pub fn start(state: &StateDir, targets: &[Target], admins: Arc<dyn AdminConnector>) -> Ahead {
        let (_, look) = LastLook::read(&state.root().join(super::observe::OBSERVATION_CACHE_FILE));
        let by_id = look
            .running
            .into_iter()
            .filter_map(|(id, r)| {
                let desired = &targets.iter().find(|t| t.name() == r.proxy)?.desired;
                let socket = state.proxy(&r.proxy).admin_socket(&r.run);
                let expect =
                    super::observe::expect_for(state, &r.proxy, r.spec.as_deref(), Some(desired));
                let admin = admins.connect(&socket, readiness::STATUS_TIMEOUT);
                let asked = expect.clone();
                let answer =
                    tokio::spawn(async move { readiness::probe(admin.as_ref(), &asked).await });
                Some((
                    id,
                    Probe {
                        socket,
                        expect,
                        answer,
                    },
                ))
            })
            .collect();
        Ahead {
            inner: Mutex::new(Probes {
                by_id,
                settled: false,
            }),
            host: Mutex::new(None),
        }
    }

    /// With the host reads a command started ([`super::prepare::HostReads::start`]).
    pub fn with_host_reads(self, reads: super::prepare::HostReads) -> Ahead {
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = Some(reads);
        self
    }

    /// The host reads, once.
    pub(super) fn take_host_reads(&self) -> Option<super::prepare::HostReads> {
        self.host.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Probes> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An observation was made: the first one keeps the answers of the containers it vouches
    /// for; any later one (the first may be older than its successor's events) keeps none.
    pub(super) fn observed(&self, vouched: &BTreeSet<String>) {
        let mut p = self.lock();
        let first = !p.settled;
        p.settled = true;
        p.by_id.retain(|id, probe| {
            let keep = first && vouched.contains(id);
            if !keep {
                probe.answer.abort();
            }
            keep
        });
    }

    /// berth changed a container: no answer from before may stand for what runs now.
    pub(super) fn forget(&self) {
        self.observed(&BTreeSet::new());
    }

    /// The answer for `id` when it was probed at `socket` with `expect` and the first
    /// observation vouched for it; taken, so it is used once.
    pub(super) fn take(
        &self,
        id: &str,
        socket: &Path,
        expect: &Expect,
    ) -> Option<JoinHandle<Readiness>> {
        let mut p = self.lock();
        if !p.settled {
            return None;
        }
        match p.by_id.get(id) {
            Some(probe) if probe.socket == socket && probe.expect == *expect => {
                p.by_id.remove(id).map(|probe| probe.answer)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
impl Ahead {
    pub(super) fn is_empty(&self) -> bool {
        self.lock().by_id.is_empty()
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        for probe in self.lock().by_id.values() {
            probe.answer.abort();
        }
    }
}
