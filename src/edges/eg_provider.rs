//! Envoy Gateway's remote infrastructure provider: the gRPC service EG dials when its
//! infrastructure type is `Remote`.
//!
//! EG sends its infra IR for each proxy on every change ([`pb::CreateOrUpdateProxyInfraRequest`])
//! and when a Gateway goes away ([`pb::DeleteProxyInfraRequest`]). This module turns a request
//! into an [`EgProxy`] with [`crate::core::source::eg`], rejects bad input with `InvalidArgument`
//! before anything is applied, and hands good input to an [`Infrastructure`], the seam behind
//! which berth's rollout converges the proxy. Calls for one proxy are serialized: one rollout
//! per proxy at a time. berth runs no rate-limit service: `DeleteRateLimitInfra` (which EG
//! sends at every start when rate limiting is off) succeeds, `CreateOrUpdateRateLimitInfra`
//! answers `FailedPrecondition` saying what to do instead.
//!
//! The service listens on a Unix socket (mode 0600; EG connects without TLS, as it does for any
//! UDS) or on TCP ([`Listen`]) with TLS, mTLS when a client CA is given ([`Security`]); plain
//! TCP only with the explicit `remote_plaintext` opt-in.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures_util::Stream;
use tonic::{Request, Response, Status};

use crate::core::source::eg::{self, EgProxy, XdsDefaults};
pub use crate::core::source::remote::{Listen, Security, TlsFiles};

/// Code generated from `proto/remoteinfra/service.proto` (package `envoygateway.remoteinfra`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("envoygateway.remoteinfra");
}

use pb::envoy_gateway_remote_infrastructure_provider_server::{
    EnvoyGatewayRemoteInfrastructureProvider, EnvoyGatewayRemoteInfrastructureProviderServer,
};

/// What `CreateOrUpdateRateLimitInfra` answers (`FailedPrecondition`, which Envoy Gateway
/// logs as the reason its rate-limit infrastructure is missing).
pub const RATE_LIMIT_UNSUPPORTED: &str = "berth does not run Envoy Gateway's rate-limit \
     infrastructure (the envoyproxy/ratelimit deployment and the Redis it needs): run them \
     yourself and point EnvoyGateway rateLimit.backend at that Redis, or remove rateLimit from \
     the EnvoyGateway configuration";

/// The seam to berth's rollout: what the service does with a valid request.
#[tonic::async_trait]
pub trait Infrastructure: Send + Sync + 'static {
    /// Converge this proxy (idempotent; goes through berth's rolling path).
    async fn create_or_update(&self, proxy: EgProxy) -> anyhow::Result<()>;
    /// Drain and remove the proxy and its state.
    async fn delete(&self, eg_name: &str, berth_name: &str) -> anyhow::Result<()>;
}

/// Wrap an [`Infrastructure`] error in this to answer `Unavailable`, which EG retries (by
/// default 4 attempts, 100 ms–1 s backoff). Any other error answers `Internal`, which EG only
/// logs; its next IR change drives the proxy again.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct Transient(pub anyhow::Error);

/// Wrap an [`Infrastructure`] error in this to answer `InvalidArgument`: the request cannot be
/// applied as it is (e.g. its proxy name or a port is taken on this host). Nothing changed.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct Invalid(pub anyhow::Error);

/// The tonic service implementation. Build one with [`RemoteInfraService::new`] and serve it
/// with [`RemoteInfraService::into_server`], or use [`serve`].
pub struct RemoteInfraService<I: Infrastructure> {
    infra: Arc<I>,
    xds: XdsDefaults,
    /// One lock per berth proxy name: calls for a proxy run one at a time.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl<I: Infrastructure> RemoteInfraService<I> {
    pub fn new(infra: Arc<I>, xds: XdsDefaults) -> Self {
        RemoteInfraService {
            infra,
            xds,
            locks: Mutex::new(HashMap::new()),
        }
    }

    pub fn into_server(self) -> EnvoyGatewayRemoteInfrastructureProviderServer<Self> {
        EnvoyGatewayRemoteInfrastructureProviderServer::new(self)
    }

    fn lock_for(&self, berth_name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(berth_name.to_string()).or_default().clone()
    }

    /// Runs `work` under the proxy's lock in its own task, so that a client that gives up
    /// (deadline, cancelled call, EG restart) cannot abandon a rollout halfway through.
    async fn run_locked<F>(&self, berth_name: &str, work: F) -> Result<(), Status>
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let lock = self.lock_for(berth_name);
        let task = tokio::spawn(async move {
            let _guard = lock.lock().await;
            work.await
        });
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(seam_status(&e)),
            Err(join) => Err(Status::internal(format!("berth task failed: {join}"))),
        }
    }
}

fn seam_status(err: &anyhow::Error) -> Status {
    let msg = format!("{err:#}");
    if err.chain().any(|e| e.is::<Invalid>()) {
        Status::invalid_argument(msg)
    } else if err.chain().any(|e| e.is::<Transient>()) {
        Status::unavailable(msg)
    } else {
        Status::internal(msg)
    }
}

fn invalid(e: eg::EgError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The request's `infra.proxy`, or InvalidArgument naming what is missing.
fn proxy_of(infra: Option<pb::Infra>) -> Result<pb::ProxyInfra, Status> {
    infra
        .ok_or_else(|| Status::invalid_argument("infra: required"))?
        .proxy
        .ok_or_else(|| Status::invalid_argument("infra.proxy: required"))
}

/// Converts the protobuf `ProxyInfra` to the parts [`eg::from_proto_parts`] maps.
pub fn proxy_parts(p: pb::ProxyInfra) -> eg::ProxyParts {
    let (labels, annotations, owner_kind) = match p.metadata {
        Some(m) => (
            sorted(m.labels),
            sorted(m.annotations),
            m.owner_reference.map(|o| o.kind).filter(|k| !k.is_empty()),
        ),
        None => Default::default(),
    };
    eg::ProxyParts {
        name: p.name,
        namespace: p.namespace,
        labels,
        annotations,
        config_json: p.config,
        listeners: p
            .listeners
            .into_iter()
            .map(|l| eg::ListenerParts {
                name: l.name,
                http3: l.http3.is_some(),
                ports: l
                    .ports
                    .into_iter()
                    .map(|port| eg::PortParts {
                        name: port.name,
                        protocol: port.protocol,
                        service_port: port.service_port.into(),
                        container_port: port.container_port.into(),
                    })
                    .collect(),
            })
            .collect(),
        addresses: p.addresses,
        owner_kind,
    }
}

fn sorted(m: HashMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter().collect()
}

#[tonic::async_trait]
impl<I: Infrastructure> EnvoyGatewayRemoteInfrastructureProvider for RemoteInfraService<I> {
    async fn create_or_update_proxy_infra(
        &self,
        request: Request<pb::CreateOrUpdateProxyInfraRequest>,
    ) -> Result<Response<pb::CreateOrUpdateProxyInfraResponse>, Status> {
        let proxy = proxy_of(request.into_inner().infra)?;
        let proxy =
            eg::from_proto_parts(proxy_parts(proxy), "infra.proxy", &self.xds).map_err(|e| {
                tracing::warn!(error = %e, "rejecting CreateOrUpdateProxyInfra");
                invalid(e)
            })?;
        if proxy.is_empty() {
            // EG's own backends do the same: an IR without listeners (an invalid or half-edited
            // Gateway) must not tear the running proxy down.
            tracing::info!(
                proxy = %proxy.eg_name,
                "infra IR has no listeners; leaving the proxy as it is"
            );
            return Ok(Response::new(pb::CreateOrUpdateProxyInfraResponse {}));
        }
        let (eg_name, berth_name) = (proxy.eg_name.clone(), proxy.proxy.name.clone());
        tracing::info!(proxy = %eg_name, berth_name = %berth_name, "CreateOrUpdateProxyInfra");
        let infra = self.infra.clone();
        self.run_locked(&berth_name, async move { infra.create_or_update(proxy).await })
            .await
            .inspect_err(|s| tracing::warn!(proxy = %eg_name, error = %s.message(), "CreateOrUpdateProxyInfra failed"))?;
        Ok(Response::new(pb::CreateOrUpdateProxyInfraResponse {}))
    }

    async fn delete_proxy_infra(
        &self,
        request: Request<pb::DeleteProxyInfraRequest>,
    ) -> Result<Response<pb::DeleteProxyInfraResponse>, Status> {
        // Only the name matters for a delete: do not reject a teardown over a config berth
        // would not accept.
        let proxy = proxy_of(request.into_inner().infra)?;
        if proxy.name.trim().is_empty() {
            return Err(Status::invalid_argument(
                "infra.proxy.name: must not be empty",
            ));
        }
        let owner_kind = proxy
            .metadata
            .as_ref()
            .and_then(|m| m.owner_reference.as_ref())
            .map(|o| o.kind.as_str());
        let eg_name = eg::ir_key(&proxy.name, &proxy.namespace, owner_kind);
        let berth_name = eg::berth_name(&eg_name);
        tracing::info!(proxy = %eg_name, berth_name = %berth_name, "DeleteProxyInfra");
        let infra = self.infra.clone();
        let (e, b) = (eg_name.clone(), berth_name.clone());
        self.run_locked(&berth_name, async move { infra.delete(&e, &b).await })
            .await
            .inspect_err(|s| tracing::warn!(proxy = %eg_name, error = %s.message(), "DeleteProxyInfra failed"))?;
        Ok(Response::new(pb::DeleteProxyInfraResponse {}))
    }

    async fn create_or_update_rate_limit_infra(
        &self,
        _request: Request<pb::CreateOrUpdateRateLimitInfraRequest>,
    ) -> Result<Response<pb::CreateOrUpdateRateLimitInfraResponse>, Status> {
        tracing::warn!("CreateOrUpdateRateLimitInfra refused: {RATE_LIMIT_UNSUPPORTED}");
        Err(Status::failed_precondition(RATE_LIMIT_UNSUPPORTED))
    }

    /// Envoy Gateway calls this at every start when rate limiting is off: berth runs no
    /// rate-limit infrastructure, so there is nothing to delete, and deleting nothing succeeds.
    async fn delete_rate_limit_infra(
        &self,
        _request: Request<pb::DeleteRateLimitInfraRequest>,
    ) -> Result<Response<pb::DeleteRateLimitInfraResponse>, Status> {
        Ok(Response::new(pb::DeleteRateLimitInfraResponse {}))
    }
}

// ---------------------------------------------------------------------------------------------
// Listening

/// A bound listener, not yet serving. Binding first lets a caller learn the port of
/// `Listen::Tcp(127.0.0.1:0)` and report bind errors before anything else starts.
pub struct Bound {
    inner: BoundInner,
    tls: Option<tonic::transport::ServerTlsConfig>,
}

enum BoundInner {
    Unix {
        listener: tokio::net::UnixListener,
        path: PathBuf,
    },
    Tcp(tokio::net::TcpListener),
}

/// Binds `listen`. For a Unix socket: refuses a path where another process is serving, removes a
/// stale socket file, creates the socket and sets its mode to 0600. TCP is served with TLS
/// (mTLS when `security` names a client CA), or in plain text only when `security` is
/// [`Security::Plaintext`], the explicit opt-in; the TLS files are read here, so a missing or
/// broken one fails before anything serves.
pub async fn bind(listen: &Listen, security: &Security) -> anyhow::Result<Bound> {
    let tls = match (listen, security) {
        (Listen::Unix(_), _) => None,
        (Listen::Tcp(_), Security::Tls(files)) => Some(server_tls(files)?),
        (Listen::Tcp(_), Security::Plaintext) => {
            tracing::warn!(
                "serving Envoy Gateway's remote infrastructure over plain-text TCP \
                 (remote_plaintext = true): anyone who can reach {listen} can create, change \
                 and delete proxies on this host"
            );
            None
        }
        (Listen::Tcp(_), Security::None) => anyhow::bail!(
            "the remote infrastructure service on {listen} would be plain-text TCP: set \
             remote_cert_file and remote_key_file in [envoy_gateway] (and remote_client_ca_file \
             to require Envoy Gateway's client certificate), listen on a Unix socket \
             (unix:///path), or set remote_plaintext = true to accept that anyone who can reach \
             the port can create and delete proxies on this host"
        ),
    };
    let inner = match listen {
        Listen::Tcp(addr) => BoundInner::Tcp(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?,
        ),
        Listen::Unix(path) => {
            remove_stale_socket(path).await?;
            let listener = tokio::net::UnixListener::bind(path)
                .with_context(|| format!("cannot create the Unix socket {}", path.display()))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot set mode 0600 on {}", path.display()))?;
            BoundInner::Unix {
                listener,
                path: path.clone(),
            }
        }
    };
    Ok(Bound { inner, tls })
}

/// The server side of TLS for the remote provider (TLS 1.2+, rustls), requiring a client
/// certificate signed by `client_ca` when one is given.
fn server_tls(files: &TlsFiles) -> anyhow::Result<tonic::transport::ServerTlsConfig> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()));
    let identity = tonic::transport::Identity::from_pem(read(&files.cert)?, read(&files.key)?);
    let mut tls = tonic::transport::ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &files.client_ca {
        tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    Ok(tls)
}

async fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        anyhow::bail!(
            "{} exists and is not a socket; refusing to replace it (choose another listen path \
             or remove the file)",
            path.display()
        );
    }
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        anyhow::bail!(
            "another process is already serving on {}; stop it or choose another listen path",
            path.display()
        );
    }
    std::fs::remove_file(path)
        .with_context(|| format!("cannot remove the stale socket {}", path.display()))
}

impl Bound {
    /// The TCP address actually bound (`None` for a Unix socket).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.inner {
            BoundInner::Tcp(l) => l.local_addr().ok(),
            BoundInner::Unix { .. } => None,
        }
    }

    /// Serves the remote-infrastructure service until `shutdown` resolves, then lets in-flight
    /// calls finish. A Unix socket file is removed afterwards.
    pub async fn serve<I: Infrastructure>(
        self,
        infra: Arc<I>,
        xds: XdsDefaults,
        shutdown: impl Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        let service = RemoteInfraService::new(infra, xds).into_server();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = self.tls {
            builder = builder
                .tls_config(tls)
                .context("the remote infrastructure service's TLS settings")?;
        }
        let router = builder.add_service(service);
        match self.inner {
            BoundInner::Tcp(listener) => {
                let addr = listener.local_addr().ok();
                tracing::info!(?addr, "serving Envoy Gateway remote infrastructure (TCP)");
                router
                    .serve_with_incoming_shutdown(accept_stream(listener), shutdown)
                    .await
                    .context("remote infrastructure service failed")
            }
            BoundInner::Unix { listener, path } => {
                tracing::info!(path = %path.display(), "serving Envoy Gateway remote infrastructure (Unix socket)");
                let result = router
                    .serve_with_incoming_shutdown(accept_stream(listener), shutdown)
                    .await
                    .context("remote infrastructure service failed");
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::debug!(path = %path.display(), error = %e, "could not remove socket");
                }
                result
            }
        }
    }
}

/// Serves until `shutdown` resolves: [`bind`] then [`Bound::serve`].
pub async fn serve<I: Infrastructure>(
    listen: Listen,
    security: &Security,
    infra: Arc<I>,
    xds: XdsDefaults,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    bind(&listen, security)
        .await?
        .serve(infra, xds, shutdown)
        .await
}

trait Accept: Send + 'static {
    type Io: Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        let (io, _) = tokio::net::TcpListener::accept(self).await?;
        let _ = io.set_nodelay(true);
        Ok(io)
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self)
            .await
            .map(|(io, _)| io)
    }
}

type Incoming<Io> = Pin<Box<dyn Stream<Item = std::io::Result<Io>> + Send>>;

fn accept_stream<L: Accept>(listener: L) -> Incoming<L::Io> {
    Box::pin(futures_util::stream::unfold(listener, |l| async move {
        let next = l.accept().await;
        if let Err(e) = &next {
            // E.g. out of file descriptors: do not spin; tonic skips the error and asks again.
            tracing::warn!(error = %e, "accepting a connection failed");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Some((next, l))
    }))
}
