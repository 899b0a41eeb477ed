//! The manager's end of the agent channel: a gRPC server (mTLS, berth's CA from [`super::pki`])
//! that the agents of every task dial. The berth holding the state directory holds it: `berth
//! serve` for its life, or `berth up` while it runs (a task that starts meanwhile catches up on
//! attach; one that starts while no berth runs serves its baseline and catches up when one
//! does). An agent is known by the proxy its certificate names and the task it says it is.
//!
//! On attach the hub brings the agent's files to the proxy's current set (the state
//! directory's watched files) in make-before-break stages, then says Synced: a starting agent
//! starts Envoy only then, so a task started while the manager is reachable serves the current
//! set before it can count as ready.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use futures_util::Stream;
use tokio::sync::{mpsc, oneshot, Notify};
use tonic::{Request, Response, Status, Streaming};

use super::pki;
use crate::core::agent_wire::{
    self as wire, agent_message, manager_message, stage_result::Verdict,
};
use crate::infra::delivery::{self, Ack};
use crate::state::StateDir;

/// How long the manager waits for an agent's verdict beyond the stage's own timeout.
const VERDICT_MARGIN: Duration = Duration::from_secs(3);

/// One attached agent.
#[derive(Clone)]
struct Attached {
    proxy: String,
    /// Tells this connection from a later one of the same task.
    connection: u64,
    tx: mpsc::Sender<Result<wire::ManagerMessage, Status>>,
    /// The files it serves, as far as the manager knows (its hello, then each stage it took).
    files: Arc<Mutex<BTreeMap<String, String>>>,
    since: SystemTime,
    rss_bytes: u64,
    cpu_seconds: f64,
    /// The node's hostname and kernel settings, as its hello said.
    node: String,
    kernel: BTreeMap<String, u64>,
}

/// What status shows of an attached agent.
#[derive(Debug, Clone)]
pub struct AgentView {
    pub task: String,
    pub files: BTreeMap<String, String>,
    pub since: SystemTime,
    pub rss_bytes: u64,
    pub cpu_seconds: f64,
    pub node: String,
    pub kernel: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Shared {
    agents: Mutex<HashMap<String, Attached>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<wire::StageResult>>>,
    next_id: AtomicU64,
    changed: Notify,
}

/// The agent channel's server, running for as long as this value lives.
pub struct Hub {
    shared: Arc<Shared>,
    state: StateDir,
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Hub {
    /// Listens on `address` with the state directory's manager certificate.
    pub async fn start(state: &StateDir, address: SocketAddr) -> anyhow::Result<Hub> {
        let authority = pki::Authority::open(state)?;
        let manager = authority.manager()?;
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &manager.cert,
                &manager.key,
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(authority.ca_pem()));
        let listener = tokio::net::TcpListener::bind(address).await.with_context(|| {
            format!(
                "cannot listen for the Swarm agents on {address} (another berth with another state directory? set `[swarm] agent_address = \"IP:PORT\"`)"
            )
        })?;
        let shared = Arc::new(Shared::default());
        let service = Service {
            shared: shared.clone(),
            state: state.clone(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = futures_util::stream::unfold(listener, |l| async move {
            let next = l.accept().await.map(|(s, _)| s);
            if next.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some((next, l))
        });
        let router = tonic::transport::Server::builder()
            .tls_config(tls)
            .context("the agent channel's TLS settings")?
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .add_service(wire::agent_channel_server::AgentChannelServer::new(service));
        tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::warn!(error = %e, "the agent channel stopped");
            }
        });
        Ok(Hub {
            shared,
            state: state.clone(),
            address,
            stop: Some(stop),
        })
    }

    /// The attached agents of `proxy`, by task.
    pub fn agents(&self, proxy: &str) -> BTreeMap<String, AgentView> {
        let agents = lock(&self.shared.agents);
        agents
            .iter()
            .filter(|(_, a)| a.proxy == proxy)
            .map(|(task, a)| {
                (
                    task.clone(),
                    AgentView {
                        task: task.clone(),
                        files: lock(&a.files).clone(),
                        since: a.since,
                        rss_bytes: a.rss_bytes,
                        cpu_seconds: a.cpu_seconds,
                        node: a.node.clone(),
                        kernel: a.kernel.clone(),
                    },
                )
            })
            .collect()
    }

    /// Waits until every task in `tasks` has an attached agent of `proxy`, or `within` passed;
    /// returns the tasks still missing.
    pub async fn await_attached(
        &self,
        proxy: &str,
        tasks: &[String],
        within: Duration,
    ) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.shared.changed.notified();
            let missing: Vec<String> = {
                let agents = lock(&self.shared.agents);
                tasks
                    .iter()
                    .filter(|t| agents.get(*t).is_none_or(|a| a.proxy != proxy))
                    .cloned()
                    .collect()
            };
            if missing.is_empty() || tokio::time::Instant::now() >= deadline {
                return missing;
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }

    /// Sends one stage to `task`'s agent and waits for its verdict.
    pub async fn stage(
        &self,
        task: &str,
        stage: &delivery::Stage,
        serials: &[String],
        timeout: Duration,
    ) -> Ack {
        let agent = lock(&self.shared.agents).get(task).cloned();
        match agent {
            Some(a) => send_stage(&self.shared, &a, stage, serials, timeout).await,
            None => Ack::NoAnswer {
                detail: format!(
                    "its agent is not connected to the manager at {}",
                    self.address
                ),
            },
        }
    }

    /// The state directory's current files of a proxy: what attaching agents are brought to.
    pub fn current(&self, proxy: &str) -> BTreeMap<String, String> {
        self.state.read_live(proxy).unwrap_or_default()
    }

    /// Brings every attached agent of `proxy` whose files are not `files` up to them (agents
    /// that attached during a delivery), best effort.
    pub async fn catch_up(&self, proxy: &str, timeout: Duration) {
        let files = self.current(proxy);
        let behind: Vec<Attached> = lock(&self.shared.agents)
            .values()
            .filter(|a| a.proxy == proxy && *lock(&a.files) != files)
            .cloned()
            .collect();
        for a in behind {
            bring_up(&self.shared, &a, &files, timeout).await;
        }
    }
}

/// Sends `stage` and waits for the verdict; what the manager knows of the agent's files
/// follows every stage sent.
async fn send_stage(
    shared: &Shared,
    agent: &Attached,
    stage: &delivery::Stage,
    serials: &[String],
    timeout: Duration,
) -> Ack {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let (tx, rx) = oneshot::channel();
    lock(&shared.pending).insert(id, tx);
    let message = wire::ManagerMessage {
        message: Some(manager_message::Message::Stage(wire::Stage {
            id,
            what: stage.what.to_string(),
            write: stage.write.clone().into_iter().collect(),
            remove: stage.remove.clone(),
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            serials: serials.to_vec(),
        })),
    };
    if agent.tx.send(Ok(message)).await.is_err() {
        lock(&shared.pending).remove(&id);
        return Ack::NoAnswer {
            detail: "its agent disconnected".into(),
        };
    }
    // Sent: the agent renames it in whatever its Envoy says, now or (a stalled agent) later,
    // so a restore must take it back from there.
    {
        let mut files = lock(&agent.files);
        for (n, c) in &stage.write {
            files.insert(n.clone(), c.clone());
        }
        for n in &stage.remove {
            files.remove(n);
        }
    }
    let verdict = tokio::time::timeout(timeout + VERDICT_MARGIN, rx).await;
    lock(&shared.pending).remove(&id);
    match verdict {
        Ok(Ok(r)) => match Verdict::try_from(r.verdict).unwrap_or(Verdict::NoAnswer) {
            Verdict::Confirmed => Ack::Confirmed { millis: r.millis },
            Verdict::Rejected => Ack::Rejected { detail: r.detail },
            Verdict::NoAnswer => Ack::NoAnswer { detail: r.detail },
        },
        Ok(Err(_)) => Ack::NoAnswer {
            detail: "its agent disconnected before it answered".into(),
        },
        Err(_) => Ack::NoAnswer {
            detail: format!(
                "no verdict within {}",
                humantime::format_duration(timeout + VERDICT_MARGIN)
            ),
        },
    }
}

/// Takes one agent from the files it has to `files`, stage by stage; the first stage not
/// confirmed ends it.
async fn bring_up(
    shared: &Shared,
    agent: &Attached,
    files: &BTreeMap<String, String>,
    timeout: Duration,
) -> Ack {
    let have = lock(&agent.files).clone();
    let mut last = Ack::Confirmed { millis: 0 };
    for stage in delivery::stages(&have, files) {
        last = send_stage(shared, agent, &stage, &[], timeout).await;
        if !matches!(last, Ack::Confirmed { .. }) {
            break;
        }
    }
    last
}

#[derive(Clone)]
struct Service {
    shared: Arc<Shared>,
    state: StateDir,
}

type Outbound = Pin<Box<dyn Stream<Item = Result<wire::ManagerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl wire::agent_channel_server::AgentChannel for Service {
    type AttachStream = Outbound;

    async fn attach(
        &self,
        request: Request<Streaming<wire::AgentMessage>>,
    ) -> Result<Response<Outbound>, Status> {
        let proxy = certified_proxy(&request)?;
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(wire::AgentMessage {
                message: Some(agent_message::Message::Hello(h)),
            }) => h,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be a Hello",
                ))
            }
        };
        if hello.proxy != proxy {
            return Err(Status::permission_denied(format!(
                "this certificate is proxy {proxy}'s, not {}'s",
                hello.proxy
            )));
        }
        let (tx, rx) = mpsc::channel(16);
        let connection = self.shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let agent = Attached {
            proxy: proxy.clone(),
            connection,
            tx,
            files: Arc::new(Mutex::new(hello.files.into_iter().collect())),
            since: SystemTime::now(),
            rss_bytes: hello.rss_bytes,
            cpu_seconds: hello.cpu_seconds,
            node: hello.node.clone(),
            kernel: hello.kernel.into_iter().collect(),
        };
        let task = hello.task.clone();
        tracing::info!(%proxy, %task, starting = hello.starting, "agent attached");
        lock(&self.shared.agents).insert(task.clone(), agent.clone());
        // Verdicts come back on the agent's stream; its end detaches it.
        let shared = self.shared.clone();
        let reader_task = task.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(agent_message::Message::Result(r)) = m.message {
                    if let Some(waiter) = lock(&shared.pending).remove(&r.id) {
                        let _ = waiter.send(r);
                    }
                }
            }
            let mut agents = lock(&shared.agents);
            if agents
                .get(&reader_task)
                .is_some_and(|a| a.connection == connection)
            {
                agents.remove(&reader_task);
            }
            drop(agents);
            tracing::info!(task = %reader_task, "agent detached");
            shared.changed.notify_waiters();
        });
        // Bring it to the current files, then let it start Envoy (or go on serving).
        let shared = self.shared.clone();
        let state = self.state.clone();
        tokio::spawn(async move {
            let files = state.read_live(&proxy).unwrap_or_default();
            if !files.is_empty() {
                let ack =
                    bring_up(&shared, &agent, &files, delivery::DEFAULT_CONFIRM_TIMEOUT).await;
                if !matches!(ack, Ack::Confirmed { .. }) {
                    tracing::warn!(%proxy, %task, ?ack, "an attaching agent did not take the current files");
                }
            }
            let _ = agent
                .tx
                .send(Ok(wire::ManagerMessage {
                    message: Some(manager_message::Message::Synced(wire::Synced {})),
                }))
                .await;
            shared.changed.notify_waiters();
        });
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// The proxy the client certificate (signed by berth's CA: the TLS layer checked that) names.
fn certified_proxy<T>(request: &Request<T>) -> Result<String, Status> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let der = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|_| Status::unauthenticated("an unreadable client certificate"))?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or_else(|| Status::unauthenticated("a client certificate without a name"))?;
    pki::proxy_of(name)
        .map(str::to_string)
        .ok_or_else(|| Status::permission_denied("not an agent certificate"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
