//! The status server: HTTP/1.1 on a loopback address by default.
//!
//! - `GET /healthz`: 200 "ok" while serve runs;
//! - `GET /status`: JSON: the config as last loaded and, per proxy, the desired generation, each
//!   replica's observed generation and liveness (the watcher's latest verdict), conditions and
//!   the last rollout;
//! - `GET /metrics`: Prometheus text: berth's own metrics, then every replica's Envoy stats
//!   (`/stats/prometheus?usedonly` over its admin socket) labelled `proxy` and `replica`.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::core::replica::RunState;
use crate::status::metrics::{merge_envoy, MAX_ENVOY_SAMPLES};
use crate::status::record::{Condition, RolloutRecord};

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
    /// The listener certificates of the config, checked (every replica confirmed serving them
    /// unless a condition says otherwise).
    pub certificates: Vec<CertificateStatus>,
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
    /// Ready by the one probe: LIVE and every listener port bound.
    pub ready: bool,
    /// Envoy's own `/ready` answer (LIVE, DRAINING, …), or "-".
    pub envoy: String,
    /// Why it is not ready, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The liveness watcher's latest verdict (absent until it has looked, or when it is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub liveness: Option<super::liveness::LiveView>,
    pub spec: String,
    /// The generation this replica has confirmed: the version its Envoy accepted for every
    /// watched file, capped by the generation its container spec was first desired at.
    pub observed_generation: Option<u64>,
    /// xDS mode: the version it accepted from the xDS server and the updates it rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xds: Option<crate::envoy::xds::XdsConfig>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    pub listener: String,
    /// The SNI names choosing it; empty for the listener's default certificate.
    pub server_names: Vec<String>,
    /// The names it is for (subjectAltName, else common name).
    pub names: Vec<String>,
    pub file: PathBuf,
    pub subject: String,
    /// Lowercase hex, as Envoy's admin `/certs`.
    pub serial: String,
    pub sha256: String,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// RFC 3339.
    pub expires: String,
    /// ACME listeners: the next renewal, the last error (never a key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acme: Option<crate::ops::acme::AcmeStatus>,
}

impl From<&crate::core::certificates::Certificate> for CertificateStatus {
    fn from(c: &crate::core::certificates::Certificate) -> Self {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(c.not_after.max(0) as u64);
        CertificateStatus {
            listener: c.listener.clone(),
            server_names: c.server_names.clone(),
            names: c.names.clone(),
            file: c.cert_file.clone(),
            subject: c.subject.clone(),
            serial: c.serial.clone(),
            sha256: c.sha256.clone(),
            not_before: c.not_before,
            not_after: c.not_after,
            expires: humantime::format_rfc3339_seconds(at).to_string(),
            acme: None,
        }
    }
}

/// A target's certificates, with the ACME state of those berth obtains.
fn certificates(
    t: &crate::core::target::Target,
    state_dir: &std::path::Path,
) -> Vec<CertificateStatus> {
    let acme = crate::ops::acme::listeners(&t.proxy);
    t.certificates
        .iter()
        .map(|c| {
            let mut s = CertificateStatus::from(c);
            if acme.iter().any(|(l, _)| *l == c.listener) {
                let files = crate::ops::acme::ListenerFiles::new(state_dir, t.name(), &c.listener);
                s.acme = Some(crate::ops::acme::AcmeStatus::read(&files.status()));
            }
            s
        })
        .collect()
}

async fn status(shared: &Shared) -> Result<ServeStatus> {
    let record = shared.record.snapshot();
    let (targets, generations) = {
        let d = shared.desired.lock().unwrap_or_else(|e| e.into_inner());
        (d.targets.clone(), d.generations.clone())
    };
    let busy = shared
        .busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut names: BTreeSet<String> = targets.keys().cloned().collect();
    names.extend(record.proxies.keys().cloned());
    let rows = shared.ops.status(&names).await?;
    let live = shared
        .liveness
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut proxies = Vec::new();
    for name in names {
        let mut rec = record.proxies.get(&name).cloned().unwrap_or_default();
        crate::status::live_ready(
            &mut rec.conditions,
            &rows,
            &name,
            targets.get(&name).map(|t| t.desired.replicas),
        );
        let replicas = rows
            .iter()
            .filter(|r| r.proxy == name)
            .map(|r| {
                let spec_gen = rec
                    .specs
                    .iter()
                    .find(|(h, _)| crate::core::replica::short_hash(h) == r.spec)
                    .map(|(_, g)| *g);
                let current = targets
                    .get(&name)
                    .is_some_and(|t| crate::core::replica::short_hash(&t.desired.hash) == r.spec);
                ReplicaStatus {
                    container: r.container.clone(),
                    slot: r.slot,
                    state: r.state,
                    ready: r.ready,
                    envoy: r.envoy.clone(),
                    reason: r.reason.clone(),
                    liveness: live.get(&r.container).cloned(),
                    spec: r.spec.clone(),
                    // A replica of an older spec has not observed the generations after it.
                    observed_generation: if current {
                        r.observed_generation
                    } else {
                        r.observed_generation.zip(spec_gen).map(|(f, s)| f.min(s))
                    },
                    xds: r.xds.clone(),
                }
            })
            .collect();
        proxies.push(ProxyStatus {
            desired_generation: generations.get(&name).copied().unwrap_or(rec.generation),
            desired_replicas: targets.get(&name).map(|t| t.desired.replicas).unwrap_or(0),
            certificates: targets
                .get(&name)
                .map(|t| certificates(t, shared.state.root()))
                .unwrap_or_default(),
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

/// `berth_rollout_*` gauges, from the rollout files (whoever runs the rollout keeps them
/// current: [`crate::state::rollout`]) and the replicas' specs.
fn rollout_metrics(
    shared: &Shared,
    owned: &BTreeSet<String>,
    targets: &BTreeMap<String, crate::core::target::Target>,
    rows: &[crate::infra::ReplicaStatus],
) {
    let m = &shared.metrics;
    for family in [
        "berth_rollout_in_progress",
        "berth_rollout_replicas",
        "berth_rollout_canary_requests",
        "berth_rollout_canary_failed",
    ] {
        m.clear(family);
    }
    for p in owned {
        let record = crate::state::rollout::RolloutFiles::new(shared.state.root(), p).read();
        m.set(
            "berth_rollout_in_progress",
            "1 while a rollout of the proxy is under way (its rollout.json: waves or a canary's hold, also one a stopped berth left to resume).",
            &[("proxy", p)],
            if record.is_some() { 1.0 } else { 0.0 },
        );
        if let Some(desired) = targets.get(p).map(|t| &t.desired) {
            let new = crate::core::replica::short_hash(&desired.hash);
            let mine = rows
                .iter()
                .filter(|r| r.proxy == *p && r.state == RunState::Running);
            let on_new = mine.clone().filter(|r| r.spec == new).count();
            let on_old = mine.count() - on_new;
            for (spec, n) in [("new", on_new), ("old", on_old)] {
                m.set(
                    "berth_rollout_replicas",
                    "Running replicas of the proxy on the desired spec (new) and on any other (old).",
                    &[("proxy", p), ("spec", spec)],
                    n as f64,
                );
            }
        }
        let Some(r) = record.filter(|r| !r.canaries.is_empty()) else {
            continue;
        };
        for (on, sample) in [("canary", r.canary_numbers), ("old", r.baseline_numbers)] {
            let s = sample.unwrap_or_default();
            let l = [("proxy", p.as_str()), ("replicas", on)];
            m.set(
                "berth_rollout_canary_requests",
                "Requests the holding canaries (replicas=canary) and the old replicas (replicas=old) answered since the hold began, at its latest look.",
                &l,
                s.requests as f64,
            );
            m.set(
                "berth_rollout_canary_failed",
                "Of those, requests that failed (5xx answers and reset streams).",
                &l,
                s.failed() as f64,
            );
        }
    }
}

async fn metrics(shared: &Shared) -> String {
    let owned = super::reconciler::owned(shared);
    let scraped = shared.ops.infra.envoy_metrics(&owned).await;
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
    let rows = shared.ops.status(&owned).await.ok();
    if let Some(rows) = &rows {
        // Replicas that are gone drop out instead of keeping their last value.
        m.clear("berth_replica_ready");
        for r in rows {
            m.set(
                "berth_replica_ready",
                "1 when the replica is ready by the one probe (LIVE, every listener bound).",
                &[("proxy", &r.proxy), ("replica", &r.container)],
                if r.ready { 1.0 } else { 0.0 },
            );
        }
    }
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
    let targets = shared
        .desired
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .targets
        .clone();
    rollout_metrics(
        shared,
        &owned,
        &targets,
        rows.as_deref().unwrap_or_default(),
    );
    m.clear("berth_certificate_expiry_timestamp_seconds");
    for t in targets.values() {
        for c in &t.certificates {
            m.set(
                "berth_certificate_expiry_timestamp_seconds",
                "When a listener certificate expires (not_after), Unix seconds.",
                &[
                    ("proxy", t.name()),
                    ("listener", &c.listener),
                    ("secret", &c.secret),
                    ("serial", &c.serial),
                ],
                c.not_after as f64,
            );
        }
    }
    m.clear("berth_acme_next_renewal_timestamp_seconds");
    m.clear("berth_acme_failures");
    for t in targets.values() {
        for (listener, acme) in crate::ops::acme::listeners(&t.proxy) {
            let files =
                crate::ops::acme::ListenerFiles::new(shared.state.root(), t.name(), listener);
            let st = crate::ops::acme::AcmeStatus::read(&files.status());
            let solver = crate::ops::acme::solver_name(acme);
            let l = [
                ("proxy", t.name()),
                ("listener", listener),
                ("solver", &solver),
            ];
            let due = crate::ops::acme::due_at(&files, acme, std::time::SystemTime::now());
            m.set(
                "berth_acme_next_renewal_timestamp_seconds",
                "When the ACME listener certificate is next obtained (renewal or retry), Unix seconds.",
                &l,
                due as f64,
            );
            m.set(
                "berth_acme_failures",
                "Failed ACME attempts in a row for the listener (0 after a success).",
                &l,
                st.failures as f64,
            );
        }
    }
    let mut out = m.render();
    out.push_str(&envoy);
    out
}
