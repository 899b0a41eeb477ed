//! The status server: HTTP/1.1 on a loopback address by default.
//!
//! - `GET /healthz`: 200 "ok" while serve runs;
//! - `GET /status`: JSON: the config as last loaded and, per proxy, the desired generation, each
//!   replica's observed generation, conditions and the last rollout;
//! - `GET /metrics`: Prometheus text: berth's own metrics, then every replica's Envoy stats
//!   (`/stats/prometheus?usedonly` over its admin socket) labelled `proxy` and `replica`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use futures_util::StreamExt;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::admin::Admin;
use crate::delivery;
use crate::metrics::{merge_envoy, MAX_ENVOY_SAMPLES};
use crate::replica::{ObservedContainer, RunState, LABEL_NAME};
use crate::status::record::{Condition, RolloutRecord};

/// How long one replica's admin may take to answer a scrape or a status query.
const ADMIN_TIMEOUT: Duration = Duration::from_millis(1000);

pub async fn run(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    cancel: CancellationToken,
) -> Result<()> {
    loop {
        let (stream, _) = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("status server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let shared = shared.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = cancel.cancelled() => {}
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

async fn handle(shared: &Shared, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/status" => match status(shared).await {
            Ok(s) => reply(
                StatusCode::OK,
                "application/json",
                serde_json::to_string_pretty(&s).unwrap_or_default() + "\n",
            ),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{e:#}\n"),
            ),
        },
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics(shared).await,
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /healthz, /status, /metrics\n".into(),
        ),
    }
}

/// `/status`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServeStatus {
    pub config: crate::status::record::ConfigRecord,
    pub proxies: Vec<ProxyStatus>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    pub name: String,
    pub desired_generation: u64,
    pub desired_replicas: u32,
    /// What the reconciler is doing for it now, if anything.
    pub busy: Option<String>,
    pub replicas: Vec<ReplicaStatus>,
    pub conditions: Vec<Condition>,
    pub last_rollout: Option<RolloutRecord>,
    pub last_reconcile: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub container: String,
    pub slot: Option<u32>,
    pub state: RunState,
    pub ready: String,
    pub spec: String,
    /// The generation this replica has confirmed: the version its Envoy accepted for every
    /// watched file, capped by the generation its container spec was first desired at.
    pub observed_generation: Option<u64>,
}

async fn status(shared: &Shared) -> Result<ServeStatus> {
    let record = shared
        .record
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (targets, generations) = {
        let d = shared.desired.lock().unwrap_or_else(|e| e.into_inner());
        (d.targets.clone(), d.generations.clone())
    };
    let busy = shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut observed = shared.engine.observe().await?;
    observed.retain(|c| shared.is_mine(c));
    let mut names: Vec<String> = targets.keys().cloned().collect();
    for p in record.proxies.keys() {
        if !names.contains(p) {
            names.push(p.clone());
        }
    }
    let mut proxies = Vec::new();
    for name in names {
        let rec = record.proxies.get(&name).cloned().unwrap_or_default();
        let files = shared.state.read_xds(&name).unwrap_or_default();
        let subs = delivery::subscriptions(&files);
        let desired_hash = targets.get(&name).map(|t| t.desired.hash.clone());
        let mine: Vec<&ObservedContainer> = observed
            .iter()
            .filter(|c| c.proxy() == Some(name.as_str()))
            .collect();
        let replicas = futures_util::future::join_all(mine.iter().map(|c| {
            let run = c.label(LABEL_NAME).unwrap_or(&c.name).to_string();
            let admin = Admin::new(shared.state.proxy(&name).admin_socket(&run))
                .with_timeout(ADMIN_TIMEOUT);
            let spec_gen = c.spec_hash().and_then(|h| rec.specs.get(h)).copied();
            let current = desired_hash.is_some() && c.spec_hash() == desired_hash.as_deref();
            let subs = subs.clone();
            async move {
                let (ready, files_gen) = if c.state == RunState::Running {
                    let ready = match admin.ready().await {
                        Ok(r) => r.to_string(),
                        Err(_) => "-".into(),
                    };
                    let gen = delivery::snapshot(&admin)
                        .await
                        .ok()
                        .and_then(|s| delivery::confirmed_generation(&s, &subs));
                    (ready, gen)
                } else {
                    ("-".to_string(), None)
                };
                ReplicaStatus {
                    container: c.name.clone(),
                    slot: c.slot(),
                    state: c.state,
                    ready,
                    spec: crate::replica::short_hash(c.spec_hash().unwrap_or("")).to_string(),
                    // A replica of an older spec has not observed the generations after it.
                    observed_generation: if current {
                        files_gen
                    } else {
                        files_gen.zip(spec_gen).map(|(f, s)| f.min(s))
                    },
                }
            }
        }))
        .await;
        proxies.push(ProxyStatus {
            desired_generation: generations.get(&name).copied().unwrap_or(rec.generation),
            desired_replicas: targets.get(&name).map(|t| t.desired.replicas).unwrap_or(0),
            busy: busy.get(&name).cloned(),
            name,
            replicas,
            conditions: rec.conditions,
            last_rollout: rec.last_rollout,
            last_reconcile: rec.last_reconcile,
        });
    }
    Ok(ServeStatus {
        config: record.config,
        proxies,
    })
}

async fn metrics(shared: &Shared) -> String {
    let mut observed = shared.engine.observe().await.unwrap_or_default();
    observed.retain(|c| shared.is_mine(c));
    let owned: Vec<String> = {
        let d = shared.desired.lock().unwrap_or_else(|e| e.into_inner());
        let mut n: Vec<String> = d.targets.keys().cloned().collect();
        n.extend(shared.state.proxies().unwrap_or_default());
        n
    };
    let running: Vec<(String, String, Admin)> = observed
        .iter()
        .filter(|c| c.state == RunState::Running)
        .filter_map(|c| {
            let proxy = c.proxy()?.to_string();
            if !owned.contains(&proxy) {
                return None;
            }
            let run = c.label(LABEL_NAME).unwrap_or(&c.name);
            let admin = Admin::new(shared.state.proxy(&proxy).admin_socket(run))
                .with_timeout(ADMIN_TIMEOUT);
            Some((proxy, c.name.clone(), admin))
        })
        .collect();
    let mut scraped: Vec<(String, String, String)> =
        futures_util::stream::iter(running.into_iter().map(|(p, r, admin)| async move {
            match admin.get("/stats/prometheus?usedonly").await {
                Ok((200, body)) => Some((p, r, body)),
                _ => None,
            }
        }))
        .buffer_unordered(8)
        .filter_map(|x| async move { x })
        .collect()
        .await;
    scraped.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let (envoy, dropped) = merge_envoy(&scraped, MAX_ENVOY_SAMPLES);
    let m = &shared.metrics;
    m.set(
        "berth_envoy_replicas_scraped",
        "Replicas whose Envoy stats are in this scrape.",
        &[],
        scraped.len() as f64,
    );
    m.set(
        "berth_envoy_samples_dropped",
        "Envoy samples left out of this scrape to keep it bounded.",
        &[],
        dropped as f64,
    );
    let busy: BTreeMap<String, String> = shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for p in &owned {
        m.set(
            "berth_proxy_reconciling",
            "1 while a reconcile of the proxy runs.",
            &[("proxy", p)],
            if busy.contains_key(p) { 1.0 } else { 0.0 },
        );
    }
    let mut out = m.render();
    out.push_str(&envoy);
    out
}
