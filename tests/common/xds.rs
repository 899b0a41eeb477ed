//! A small xDS server standing in for Envoy Gateway's: delta ADS (Envoy's
//! `AggregatedDiscoveryService.DeltaAggregatedResources`, the API type EG's bootstrap uses) over
//! gRPC with mTLS (TLS 1.3, client certificates required and checked against a CA, as EG's
//! server does), serving one snapshot of listeners, routes, clusters and endpoints named as EG
//! names them, to the streams whose `node.cluster` is the snapshot's key (EG's snapshot cache
//! matches on it). It records what each node ACKed and NACKed.
//!
//! Protocol, per stream: the first request carries the node; a request for a type with no names
//! subscribes to all of that type (wildcard; LDS and CDS); RDS and EDS subscribe by name. Every
//! response gets a fresh nonce; a request carrying a nonce and no `error_detail` is an ACK, one
//! with `error_detail` a NACK. A new snapshot sends each stream the resources that changed and
//! the names that went away.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::{Stream, StreamExt};
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// The resources of one proxy, by type URL then name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The node cluster (`--service-cluster`) these resources are for: EG's IR key.
    pub key: String,
    pub version: String,
    pub resources: BTreeMap<&'static str, BTreeMap<String, Any>>,
}

impl Snapshot {
    pub fn add<M: Message + prost::Name>(&mut self, type_url: &'static str, name: &str, m: &M) {
        self.resources.entry(type_url).or_default().insert(
            name.to_string(),
            Any {
                type_url: M::type_url(),
                value: m.encode_to_vec(),
            },
        );
    }
}

/// What a node told the server about one response.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Ack { type_url: String },
    Nack { type_url: String, message: String },
}

#[derive(Default)]
struct Shared {
    replies: Mutex<Vec<(String, Reply)>>,
    /// Node ids with a stream open now.
    connected: Mutex<BTreeSet<String>>,
    /// Every node id that ever opened a stream.
    seen: Mutex<BTreeSet<String>>,
}

/// The mTLS files of a test: a CA, the server's certificate, a client certificate the server
/// trusts, and one signed by another CA that it does not trust.
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client-key.pem")
    }
    pub fn untrusted_cert(&self) -> PathBuf {
        self.dir.join("untrusted.pem")
    }
    pub fn untrusted_key(&self) -> PathBuf {
        self.dir.join("untrusted-key.pem")
    }

    /// Generates every file into `dir`. The server certificate names `envoy-gateway` (what EG's
    /// proxies check) and 127.0.0.1.
    pub fn generate(dir: &Path) -> Certs {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let ca = |cn: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, cn.to_string());
            CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
        };
        let leaf = |names: Vec<String>, issuer: &CertifiedIssuer<'_, KeyPair>| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(names).unwrap();
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "berth-test");
            let cert = p.signed_by(&key, issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let trusted = ca("envoy-gateway");
        let other = ca("someone-else");
        let (server, server_key) = leaf(vec!["envoy-gateway".into(), "127.0.0.1".into()], &trusted);
        let (client, client_key) = leaf(vec!["envoy".into()], &trusted);
        let (untrusted, untrusted_key) = leaf(vec!["envoy".into()], &other);
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in [
            ("ca.pem", trusted.pem()),
            ("server.pem", server),
            ("server-key.pem", server_key),
            ("client.pem", client),
            ("client-key.pem", client_key),
            ("untrusted.pem", untrusted),
            ("untrusted-key.pem", untrusted_key),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        // Replicas run as uid 101 and read the copies berth makes; the originals stay 0644.
        Certs {
            dir: dir.to_path_buf(),
        }
    }
}

/// A running xDS server; stops when dropped.
pub struct XdsServer {
    pub addr: SocketAddr,
    snapshot: watch::Sender<Snapshot>,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl XdsServer {
    pub async fn start(certs: &Certs, snapshot: Snapshot) -> XdsServer {
        let read = |f: &str| std::fs::read(certs.dir.join(f)).unwrap();
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(
                read("server.pem"),
                read("server-key.pem"),
            ))
            .client_ca_root(Certificate::from_pem(read("ca.pem")));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (snapshot_tx, snapshot_rx) = watch::channel(snapshot);
        let shared = Arc::new(Shared::default());
        let service = Ads {
            snapshot: snapshot_rx,
            shared: shared.clone(),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let incoming = tokio_stream_of(listener);
        tokio::spawn(async move {
            Server::builder()
                .tls_config(tls)
                .unwrap()
                .add_service(AggregatedDiscoveryServiceServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
        });
        XdsServer {
            addr,
            snapshot: snapshot_tx,
            shared,
            stop: Some(stop_tx),
        }
    }

    /// Serves a new snapshot to every stream.
    pub fn set(&self, snapshot: Snapshot) {
        self.snapshot.send_replace(snapshot);
    }

    pub fn replies(&self) -> Vec<(String, Reply)> {
        self.shared.replies.lock().unwrap().clone()
    }

    /// Nodes that ACKed a listener response.
    pub fn nodes_acked_listeners(&self) -> BTreeSet<String> {
        self.replies()
            .into_iter()
            .filter(|(_, r)| matches!(r, Reply::Ack { type_url } if type_url == LISTENER))
            .map(|(n, _)| n)
            .collect()
    }

    pub fn nacks(&self) -> Vec<(String, Reply)> {
        self.replies()
            .into_iter()
            .filter(|(_, r)| matches!(r, Reply::Nack { .. }))
            .collect()
    }

    /// Every node that ever opened a stream (a client the TLS handshake let in).
    pub fn nodes_seen(&self) -> BTreeSet<String> {
        self.shared.seen.lock().unwrap().clone()
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

type Incoming = Pin<Box<dyn Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send>>;

fn tokio_stream_of(listener: tokio::net::TcpListener) -> Incoming {
    Box::pin(futures_util::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| s);
        Some((next, l))
    }))
}

struct Ads {
    snapshot: watch::Receiver<Snapshot>,
    shared: Arc<Shared>,
}

type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;
type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<SotwStream>, Status> {
        Err(Status::unimplemented(
            "this server speaks delta ADS (DELTA_GRPC), as Envoy Gateway's bootstrap asks",
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let stream = DeltaSession {
            requests: request.into_inner(),
            snapshot: self.snapshot.clone(),
            shared: self.shared.clone(),
            tx,
            node: String::new(),
            cluster: String::new(),
            subs: HashMap::new(),
            nonce: 0,
        };
        tokio::spawn(stream.run());
        let out = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

/// One subscribed type on one stream.
#[derive(Default)]
struct Sub {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the node has: name → version sent.
    sent: BTreeMap<String, String>,
}

struct DeltaSession {
    requests: Streaming<DeltaDiscoveryRequest>,
    snapshot: watch::Receiver<Snapshot>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    node: String,
    cluster: String,
    subs: HashMap<String, Sub>,
    nonce: u64,
}

impl DeltaSession {
    async fn run(mut self) {
        loop {
            tokio::select! {
                req = self.requests.next() => match req {
                    Some(Ok(req)) => {
                        if !self.on_request(req).await {
                            break;
                        }
                    }
                    _ => break,
                },
                changed = self.snapshot.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let types: Vec<String> = self.subs.keys().cloned().collect();
                    for t in types {
                        if !self.push(&t).await {
                            break;
                        }
                    }
                }
            }
        }
        if !self.node.is_empty() {
            self.shared.connected.lock().unwrap().remove(&self.node);
        }
    }

    async fn on_request(&mut self, req: DeltaDiscoveryRequest) -> bool {
        if let Some(node) = &req.node {
            self.node = node.id.clone();
            self.cluster = node.cluster.clone();
            self.shared
                .connected
                .lock()
                .unwrap()
                .insert(self.node.clone());
            self.shared.seen.lock().unwrap().insert(self.node.clone());
        }
        if !req.response_nonce.is_empty() {
            let reply = match &req.error_detail {
                Some(e) => Reply::Nack {
                    type_url: req.type_url.clone(),
                    message: e.message.clone(),
                },
                None => Reply::Ack {
                    type_url: req.type_url.clone(),
                },
            };
            self.shared
                .replies
                .lock()
                .unwrap()
                .push((self.node.clone(), reply));
        }
        let first = !self.subs.contains_key(&req.type_url);
        let sub = self.subs.entry(req.type_url.clone()).or_default();
        for (name, version) in &req.initial_resource_versions {
            sub.sent.insert(name.clone(), version.clone());
        }
        let mut new_names = false;
        for name in &req.resource_names_subscribe {
            if name == "*" {
                sub.wildcard = true;
            } else {
                new_names |= sub.names.insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                sub.wildcard = false;
            }
            sub.names.remove(name);
            sub.sent.remove(name);
        }
        if first && req.resource_names_subscribe.is_empty() {
            sub.wildcard = true;
        }
        if first || new_names {
            return self.push(&req.type_url.clone()).await;
        }
        true
    }

    /// Sends what changed for `type_url` since the last response (nothing when nothing did,
    /// except the first response of a wildcard type, which may be empty).
    async fn push(&mut self, type_url: &str) -> bool {
        let snapshot = self.snapshot.borrow().clone();
        if snapshot.key != self.cluster {
            // EG's cache serves nothing to a node whose cluster is not a snapshot key.
            return true;
        }
        let all = snapshot
            .resources
            .get(type_url)
            .cloned()
            .unwrap_or_default();
        let Some(sub) = self.subs.get_mut(type_url) else {
            return true;
        };
        let wanted: BTreeMap<&String, &Any> = all
            .iter()
            .filter(|(n, _)| sub.wildcard || sub.names.contains(*n))
            .collect();
        let mut resources = Vec::new();
        for (name, any) in &wanted {
            let version = hex::encode(&Sha256::digest(&any.value)[..8]);
            if sub.sent.get(*name) != Some(&version) {
                sub.sent.insert((*name).clone(), version.clone());
                resources.push(Resource {
                    name: (*name).clone(),
                    version,
                    resource: Some((*any).clone()),
                    ..Default::default()
                });
            }
        }
        let removed: Vec<String> = sub
            .sent
            .keys()
            .filter(|n| !wanted.contains_key(n))
            .cloned()
            .collect();
        for n in &removed {
            sub.sent.remove(n);
        }
        if resources.is_empty() && removed.is_empty() && sub.sent.len() + resources.len() > 0 {
            return true;
        }
        self.nonce += 1;
        let response = DeltaDiscoveryResponse {
            system_version_info: snapshot.version.clone(),
            resources,
            type_url: type_url.to_string(),
            removed_resources: removed,
            nonce: self.nonce.to_string(),
            ..Default::default()
        };
        self.tx.send(Ok(response)).await.is_ok()
    }
}

/// EG's snapshot for Gateway default/eg with an HTTP listener on `http` and a TCP listener on
/// `tcp` (the IR's two ports), both to `backend`, version v1.
pub fn eg_http_and_tcp_snapshot(http: u16, tcp: u16, backend: u16, ready: u16) -> Snapshot {
    let mut snapshot = eg_snapshot(
        "default/eg",
        "default/eg/http",
        http,
        backend,
        ready,
        "v1",
        "v1",
    );
    let tcp_side = eg_snapshot(
        "default/eg",
        "default/eg/tcp",
        tcp,
        backend,
        ready,
        "v1",
        "v1",
    );
    for (t, rs) in tcp_side.resources {
        snapshot.resources.entry(t).or_default().extend(rs);
    }
    snapshot
}

/// An EG-shaped snapshot for one Gateway listener: the listener named as EG names it
/// (`<ns>/<gateway>/<listener>`) on `port`, its route configuration of the same name with one
/// virtual host and one route (`httproute/<ns>/<route>/rule/0/match/0/*`) to the EDS cluster
/// `httproute/<ns>/<route>/rule/0`, whose endpoint is `127.0.0.1:backend`; and EG's readiness
/// listener (`envoy-gateway-proxy-ready-0.0.0.0-<ready_port>`, `/ready` from the health check
/// filter). `header` is added to every response, so a test sees which snapshot served it.
pub fn eg_snapshot(
    key: &str,
    listener: &str,
    port: u16,
    backend: u16,
    ready_port: u16,
    version: &str,
    header: &str,
) -> Snapshot {
    use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
    use envoy_types::pb::envoy::config::core::v3::DataSource;
    use envoy_types::pb::envoy::config::core::v3::{
        address, config_source, socket_address, AggregatedConfigSource, ConfigSource, HeaderValue,
        HeaderValueOption, SocketAddress,
    };
    use envoy_types::pb::envoy::config::endpoint::v3::{
        lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
    };
    use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
    use envoy_types::pb::envoy::config::route::v3::{
        route, route_action, route_match, DirectResponseAction, Route, RouteAction,
        RouteConfiguration, RouteMatch, VirtualHost,
    };
    use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        http_connection_manager, http_filter, HttpConnectionManager, HttpFilter, Rds,
    };

    let any = |m: &dyn AnyOf| m.to_any();
    let address = |port: u16| envoy_types::pb::envoy::config::core::v3::Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: "0.0.0.0".into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port.into())),
            ..Default::default()
        })),
    };
    let ads = || ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: 2, // V3
        ..Default::default()
    };
    let router = HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(
            any(&Router::default()),
        )),
        ..Default::default()
    };
    let hcm = |prefix: &str, rds: Option<&str>, inline: Option<RouteConfiguration>, filters| {
        HttpConnectionManager {
            stat_prefix: prefix.into(),
            route_specifier: Some(match (rds, inline) {
                (Some(name), _) => http_connection_manager::RouteSpecifier::Rds(Rds {
                    config_source: Some(ads()),
                    route_config_name: name.into(),
                }),
                (None, Some(rc)) => http_connection_manager::RouteSpecifier::RouteConfig(rc),
                (None, None) => unreachable!(),
            }),
            http_filters: filters,
            ..Default::default()
        }
    };
    let listener_of = |name: &str, port: u16, hcm: HttpConnectionManager| Listener {
        name: name.into(),
        address: Some(address(port)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };

    let route_name = "httproute/default/backend/rule/0";
    let mut snap = Snapshot {
        key: key.into(),
        version: version.into(),
        ..Default::default()
    };
    let stat_prefix = format!("http-{port}");
    snap.add(
        LISTENER,
        listener,
        &listener_of(
            listener,
            port,
            hcm(&stat_prefix, Some(listener), None, vec![router.clone()]),
        ),
    );
    let ready = format!("envoy-gateway-proxy-ready-0.0.0.0-{ready_port}");
    let health = HttpFilter {
        name: "envoy.filters.http.health_check".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&HealthCheck {
            pass_through_mode: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
            headers: vec![envoy_types::pb::envoy::config::route::v3::HeaderMatcher {
                name: ":path".into(),
                header_match_specifier: Some(
                    envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier::StringMatch(
                        envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher {
                            match_pattern: Some(
                                envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                                    "/ready".into(),
                                ),
                            ),
                            ..Default::default()
                        },
                    ),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }))),
        ..Default::default()
    };
    let catch_all = RouteConfiguration {
        name: "ready_route".into(),
        virtual_hosts: vec![VirtualHost {
            name: "ready_route".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::DirectResponse(DirectResponseAction {
                    status: 500,
                    body: Some(DataSource {
                        specifier: Some(
                            envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                                "not ready\n".into(),
                            ),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    snap.add(
        LISTENER,
        &ready,
        &listener_of(
            &ready,
            ready_port,
            hcm("eg-ready-http", None, Some(catch_all), vec![health, router]),
        ),
    );
    snap.add(
        ROUTE,
        listener,
        &RouteConfiguration {
            name: listener.into(),
            virtual_hosts: vec![VirtualHost {
                name: format!("{listener}/*"),
                domains: vec!["*".into()],
                routes: vec![Route {
                    name: format!("{route_name}/match/0/*"),
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                            route_name.into(),
                        )),
                        ..Default::default()
                    })),
                    response_headers_to_add: vec![HeaderValueOption {
                        header: Some(HeaderValue {
                            key: "x-snapshot".into(),
                            value: header.into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    snap.add(
        CLUSTER,
        route_name,
        &Cluster {
            name: route_name.into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(cluster::EdsClusterConfig {
                eds_config: Some(ads()),
                service_name: route_name.into(),
            }),
            connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 10,
                nanos: 0,
            }),
            ..Default::default()
        },
    );
    snap.add(
        ENDPOINT,
        route_name,
        &ClusterLoadAssignment {
            cluster_name: route_name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(envoy_types::pb::envoy::config::core::v3::Address {
                            address: Some(address::Address::SocketAddress(SocketAddress {
                                address: "127.0.0.1".into(),
                                port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                    backend.into(),
                                )),
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    snap
}

trait AnyOf {
    fn to_any(&self) -> Any;
}

impl<M: Message + prost::Name> AnyOf for M {
    fn to_any(&self) -> Any {
        Any {
            type_url: M::type_url(),
            value: self.encode_to_vec(),
        }
    }
}

/// A plain HTTP/1.1 backend on 127.0.0.1 that answers every request with 200 and `body`.
pub async fn backend(body: &'static str) -> (u16, tokio::task::JoinHandle<()>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| async move {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(body.as_bytes()),
                    )))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (port, task)
}
