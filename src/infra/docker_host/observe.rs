//! What runs: this berth's containers, the one readiness probe on each running replica, and
//! the status rows built from both.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::ahead::LastLook;
use super::DockerHost;
use crate::core::plan::ProxyFacts;
use crate::core::replica::{self, DesiredProxy, LABEL_NAME};
use crate::engine::{LabelFilter, ObservedContainer, RunState};
use crate::envoy::admin::AdminApi;
use crate::envoy::readiness::{self, Expect, NotReady, Readiness};
use crate::infra::delivery;
use crate::infra::ReplicaStatus;
use crate::infra::{ConvergeError, ProxyReadiness};

/// Where a command keeps its [`ObservationCache`], in the state directory.
pub const OBSERVATION_CACHE_FILE: &str = "observed.json";

/// What a converge learns before planning.
pub(super) struct Observation {
    pub planner: ProxyFacts,
    /// Some replica of the proxy (any spec) is ready: it serves now.
    pub any_ready: bool,
    /// The probe of every running container, by id: what a converge that changed nothing
    /// reports as the proxy's readiness, without asking each Envoy again.
    pub probes: BTreeMap<String, Readiness>,
}

impl DockerHost {
    /// The label filter of this berth's containers: berth's, made with this state directory
    /// and carrying every extra label. The engine filters; nothing else is even inspected.
    fn mine(&self) -> LabelFilter {
        let mut f = Self::managed().with(
            crate::core::replica::LABEL_STATE_DIR,
            Some(&self.state.root().display().to_string()),
        );
        for (k, v) in &self.extra_labels {
            f = f.with(k, Some(v));
        }
        f
    }

    /// Every container of this berth (one list, one inspect each), or the last observation
    /// while it may be reused ([`DockerHost::reusing_observations`]).
    pub(crate) async fn observe_all(&self) -> Result<Arc<Vec<ObservedContainer>>, ConvergeError> {
        if !self.reuse_for.is_zero() {
            let cached = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, seen)) = cached.as_ref() {
                if at.elapsed() < self.reuse_for {
                    return Ok(seen.clone());
                }
            }
        }
        let mut found = self.observe_mine().await?;
        found.retain(|c| c.is_managed());
        let found = Arc::new(found);
        if !self.reuse_for.is_zero() {
            *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((tokio::time::Instant::now(), found.clone()));
        }
        Ok(found)
    }

    /// This berth's containers. A command keeps what it learned by inspecting them in the
    /// state directory ([`OBSERVATION_CACHE_FILE`]), so the next command inspects only those
    /// the engine reports a change for (see [`crate::engine::ContainerEngine::observe_cached`]),
    /// and where the running replicas' admin sockets were, so it can probe them at once
    /// ([`super::ahead`]).
    /// The cache is only an economy: unreadable, it is rebuilt; unwritable, it is skipped.
    async fn observe_mine(&self) -> Result<Vec<ObservedContainer>, ConvergeError> {
        let path = self.state.root().join(OBSERVATION_CACHE_FILE);
        let (before, mut look) = LastLook::read(&path);
        let found = self
            .engine
            .observe_cached(&self.mine(), &mut look.engine)
            .await?;
        if let Some(ahead) = &self.ahead {
            ahead.observed(&look.engine.vouched);
        }
        look.running = LastLook::running_of(&found);
        match serde_json::to_vec(&look) {
            Ok(after) if after != before && self.state.root().is_dir() => {
                // Not synced: a torn file after a crash does not parse, and is rebuilt.
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &after).is_err() || std::fs::rename(&tmp, &path).is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            _ => {}
        }
        Ok(found)
    }

    /// This berth's containers of one proxy.
    pub(crate) async fn observe_proxy(
        &self,
        proxy: &str,
    ) -> Result<Vec<ObservedContainer>, ConvergeError> {
        if self.reuse_for.is_zero() {
            let mut found = self
                .engine
                .observe(
                    &self
                        .mine()
                        .with(crate::core::replica::LABEL_PROXY, Some(proxy)),
                )
                .await?;
            found.retain(|c| c.is_managed());
            return Ok(found);
        }
        Ok(self
            .observe_all()
            .await?
            .iter()
            .filter(|c| c.proxy() == Some(proxy))
            .cloned()
            .collect())
    }

    /// Berth changed a container: the next look asks the engine.
    pub(crate) fn forget_observation(&self) {
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(ahead) = &self.ahead {
            ahead.forget();
        }
    }

    /// The admin API of a replica, by the name its run directory was made under.
    pub(super) fn admin(
        &self,
        proxy: &str,
        run_name: &str,
        timeout: Duration,
    ) -> Arc<dyn AdminApi> {
        self.admins
            .connect(&self.state.proxy(proxy).admin_socket(run_name), timeout)
    }

    fn admin_of(&self, c: &ObservedContainer) -> Arc<dyn AdminApi> {
        self.admins
            .connect(&self.socket_of(c), readiness::STATUS_TIMEOUT)
    }

    fn socket_of(&self, c: &ObservedContainer) -> std::path::PathBuf {
        let proxy = c.proxy().unwrap_or_default();
        let run = c.label(LABEL_NAME).unwrap_or(&c.name);
        self.state.proxy(proxy).admin_socket(run)
    }

    /// Probes every running container; the others are not ready by definition.
    async fn probe_all(
        &self,
        observed: &[ObservedContainer],
        expect_of: impl Fn(&ObservedContainer) -> Expect,
    ) -> BTreeMap<String, Readiness> {
        let probes = observed
            .iter()
            .filter(|c| c.state == RunState::Running)
            .map(|c| {
                let expect = expect_of(c);
                // Asked at the command's start, of this very container and socket.
                let ahead = self
                    .ahead
                    .as_ref()
                    .and_then(|a| a.take(&c.id, &self.socket_of(c), &expect));
                async move {
                    let answer = match ahead.map(|h| async { h.await.ok() }) {
                        Some(h) => h.await,
                        None => None,
                    };
                    let answer = match answer {
                        Some(answer) => answer,
                        None => readiness::probe(self.admin_of(c).as_ref(), &expect).await,
                    };
                    (c.id.clone(), answer)
                }
            });
        futures_util::future::join_all(probes)
            .await
            .into_iter()
            .collect()
    }

    /// Whether the desired bootstrap on disk was changed, which running replicas are LIVE but
    /// not serving, and whether any replica serves now.
    pub(super) async fn facts(
        &self,
        desired: &DesiredProxy,
        observed: &[ObservedContainer],
    ) -> Observation {
        let proxy = desired.name();
        let on_disk = self
            .state
            .read_generation(proxy, &desired.spec.bootstrap_sha256);
        // Nothing on disk yet is not tampering: the converge writes it.
        let bootstrap_tampered = on_disk.is_some_and(|text| {
            replica::sha256_hex(text.as_bytes()) != desired.spec.bootstrap_sha256
        });
        let probes = self
            .probe_all(observed, |c| self.expect_of(c, Some(desired)))
            .await;
        let not_serving = probes
            .iter()
            .filter_map(|(id, r)| match r {
                Readiness::NotReady {
                    reason: reason @ NotReady::ListenersNotBound { .. },
                } => Some((id.clone(), reason.to_string())),
                _ => None,
            })
            .collect();
        Observation {
            any_ready: probes.values().any(Readiness::is_ready),
            planner: ProxyFacts {
                bootstrap_tampered,
                not_serving,
            },
            probes,
        }
    }

    /// What a ready container must show: its own spec's ports (recorded with the spec), else
    /// the desired ones.
    fn expect_of(&self, c: &ObservedContainer, desired: Option<&DesiredProxy>) -> Expect {
        expect_for(
            &self.state,
            c.proxy().unwrap_or_default(),
            c.spec_hash(),
            desired,
        )
    }

    /// The desired spec's replicas, probed; `observed` when nothing changed since.
    pub(super) async fn readiness(
        &self,
        desired: &DesiredProxy,
        observed: Option<&[ObservedContainer]>,
    ) -> Result<ProxyReadiness, ConvergeError> {
        let all = match observed {
            Some(o) => o.to_vec(),
            None => self.observe_proxy(desired.name()).await?,
        };
        let mine: Vec<ObservedContainer> = all
            .into_iter()
            .filter(|c| c.spec_hash() == Some(desired.hash.as_str()))
            .collect();
        let probes = self.probe_all(&mine, |_| desired.expect()).await;
        Ok(tally(desired, &mine, &probes))
    }
}

/// What a ready replica of `proxy` running spec `spec` must show: that spec's ports (recorded
/// with the spec), else the desired ones.
pub(super) fn expect_for(
    state: &crate::state::StateDir,
    proxy: &str,
    spec: Option<&str>,
    desired: Option<&DesiredProxy>,
) -> Expect {
    match (spec, desired) {
        (Some(h), Some(d)) if h == d.hash => d.expect(),
        (Some(h), _) => state
            .read_spec(proxy, h)
            .map(|d| d.expect())
            .or_else(|| desired.map(DesiredProxy::expect))
            .unwrap_or_default(),
        (None, _) => desired.map(DesiredProxy::expect).unwrap_or_default(),
    }
}

/// The desired spec's replicas among `observed`, counted by their probes (a replica without a
/// probe is not running). The facts' probes expect of the desired spec's replicas what
/// [`DockerHost::readiness`] does, so a converge that changed nothing counts those.
pub(super) fn tally(
    desired: &DesiredProxy,
    observed: &[ObservedContainer],
    probes: &BTreeMap<String, Readiness>,
) -> ProxyReadiness {
    let mut out = ProxyReadiness {
        wanted: desired.replicas,
        ..Default::default()
    };
    for c in observed
        .iter()
        .filter(|c| c.spec_hash() == Some(desired.hash.as_str()))
    {
        match probes.get(&c.id) {
            Some(Readiness::Ready) => out.ready += 1,
            Some(other) => out.not_ready.push((c.name.clone(), other.clone())),
            None => out.not_ready.push((
                c.name.clone(),
                Readiness::NotReady {
                    reason: NotReady::AdminUnreachable {
                        detail: format!("the container is {}", c.state),
                    },
                },
            )),
        }
    }
    out
}

impl DockerHost {
    /// One status row per container, probed, with its observed generation.
    pub(super) async fn rows(&self, observed: &[ObservedContainer]) -> Vec<ReplicaStatus> {
        // The subscriptions each proxy's watched files define, read once per proxy.
        let subscriptions: BTreeMap<&str, Vec<String>> = observed
            .iter()
            .filter_map(|c| c.proxy())
            .map(|p| {
                (
                    p,
                    delivery::subscriptions(&self.state.read_xds(p).unwrap_or_default()),
                )
            })
            .collect();
        let subscriptions = &subscriptions;
        let rows = observed.iter().map(|c| async move {
            let proxy = c.proxy().unwrap_or("?").to_string();
            let admin = self.admin_of(c);
            let expect = self.expect_of(c, None);
            let xds_mode = c
                .spec_hash()
                .and_then(|h| self.state.read_spec(&proxy, h))
                .is_some_and(|d| d.xds);
            let (readiness, envoy, connections, observed_generation, xds) =
                if c.state == RunState::Running {
                    let subs = subscriptions
                        .get(proxy.as_str())
                        .map_or(&[][..], Vec::as_slice);
                    // The probe's own /ready answer is the ENVOY column: one /ready per row.
                    let (readiness, connections, generation, xds) = tokio::join!(
                        readiness::probe(admin.as_ref(), &expect),
                        admin.downstream_connections(),
                        delivery::observed_generation(admin.as_ref(), subs),
                        async {
                            if xds_mode {
                                crate::envoy::xds::read(admin.as_ref()).await.ok()
                            } else {
                                None
                            }
                        },
                    );
                    let envoy = readiness.envoy_state().unwrap_or_else(|| "-".into());
                    (Some(readiness), envoy, connections.ok(), generation, xds)
                } else {
                    (None, "-".to_string(), None, None, None)
                };
            ReplicaStatus {
                proxy,
                slot: c.slot(),
                container: c.name.clone(),
                node: None,
                service_node: None,
                state: c.state,
                ready: readiness.as_ref().is_some_and(Readiness::is_ready),
                envoy,
                reason: match readiness {
                    Some(Readiness::NotReady { reason }) => Some(reason.to_string()),
                    Some(Readiness::Ready) => None,
                    None => Some(format!("the container is {}", c.state)),
                },
                image: c.info.image.clone(),
                spec: replica::short_hash(c.spec_hash().unwrap_or("")).to_string(),
                uptime_seconds: c.uptime_seconds(),
                connections,
                observed_generation,
                xds,
            }
        });
        let mut rows = futures_util::future::join_all(rows).await;
        rows.sort_by(|a, b| (&a.proxy, a.slot).cmp(&(&b.proxy, b.slot)));
        rows
    }
}

impl DockerHost {
    /// [`crate::infra::Infrastructure::look`]: one list of this berth's containers, then every
    /// running or paused replica of `proxies` at once: `/ready` over its admin socket (none for
    /// a paused one: it cannot answer), its process's state and its cgroup's CPU from /proc.
    pub(crate) async fn look_at(
        &self,
        proxies: &std::collections::BTreeSet<String>,
    ) -> Result<Vec<crate::infra::ReplicaLook>, ConvergeError> {
        use crate::core::liveness::{Probe, PROBE_TIMEOUT};
        use futures_util::StreamExt;
        let observed = self.observe_all().await?;
        let watched: Vec<ObservedContainer> = observed
            .iter()
            .filter(|c| c.proxy().is_some_and(|p| proxies.contains(p)))
            .filter(|c| matches!(c.state, RunState::Running | RunState::Paused))
            .cloned()
            .collect();
        let looks = futures_util::stream::iter(watched.into_iter().map(|c| async move {
            let proxy = c.proxy().unwrap_or_default().to_string();
            let paused = c.state == RunState::Paused;
            let answered = !paused && {
                let run = c.recorded_name().unwrap_or(&c.name);
                let admin = self.admin(&proxy, run, PROBE_TIMEOUT);
                matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, admin.ready()).await,
                    Ok(Ok(_))
                )
            };
            let (stopped_by_signal, cpu) = match c.info.pid {
                Some(pid) => (
                    crate::host::process::stopped_by_signal(pid),
                    crate::host::process::cpu_time(pid),
                ),
                None => (false, None),
            };
            crate::infra::ReplicaLook {
                proxy,
                container: c.id.clone(),
                name: c.name.clone(),
                probe: Probe {
                    answered,
                    paused,
                    stopped_by_signal,
                    cpu,
                },
            }
        }))
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
        Ok(looks)
    }
}
