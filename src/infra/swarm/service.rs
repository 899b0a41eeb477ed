//! One proxy as Swarm objects, pure: its service spec, and the configs and secrets its tasks
//! read (named by content hash, so a change yields new objects and a rolling update).
//!
//! The spec hash covers everything but the replica count (scaling is not an update), and is
//! carried as a service label: a service whose label matches is left alone.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::models::{
    HealthConfig, Limit, Mount, MountTmpfsOptions, MountType, NetworkAttachmentConfig, ServiceSpec,
    ServiceSpecMode, ServiceSpecModeReplicated, ServiceSpecRollbackConfig,
    ServiceSpecRollbackConfigFailureActionEnum, ServiceSpecRollbackConfigOrderEnum,
    ServiceSpecUpdateConfig, ServiceSpecUpdateConfigFailureActionEnum,
    ServiceSpecUpdateConfigOrderEnum, TaskSpec, TaskSpecContainerSpec,
    TaskSpecContainerSpecConfigs, TaskSpecContainerSpecFile, TaskSpecContainerSpecFile1,
    TaskSpecContainerSpecPrivileges, TaskSpecContainerSpecSecrets, TaskSpecPlacement,
    TaskSpecResources, TaskSpecRestartPolicy, TaskSpecRestartPolicyConditionEnum,
};
use serde::Serialize;

use crate::core::agent::channel::TLS_PREFIX;
use crate::core::ir::{OnFailure, Routing};
use crate::core::layout;
use crate::core::replica::{
    self, sha256_hex, LABEL_IMAGE_ID, LABEL_MANAGED_BY, LABEL_PROXY, LABEL_SPEC_HASH,
    LABEL_STATE_DIR, MANAGED_BY_VALUE,
};
use crate::core::target::Target;

/// Version of how berth maps a proxy to Swarm objects beyond the target's fields; part of
/// every Swarm spec hash, so changing the mapping rolls every service.
pub const SWARM_FORMAT: u32 = 1;
/// On every service, config, secret and task container berth makes on a Swarm: the proxy.
pub const LABEL_SWARM: &str = "io.berth.swarm";
/// On task containers: the Envoy image as configured (the task's image is the derived one
/// when the agent runs).
pub const LABEL_IMAGE: &str = "io.berth.image";
/// On configs and secrets: the path it is mounted at.
pub const LABEL_TARGET: &str = "io.berth.target";
/// Swarm restarts a task that exited after this delay (not instantly, so a crash loop does not
/// spin).
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// The admin socket directory of each task: a tmpfs of this size (the socket and the agent's
/// health file).
const RUN_TMPFS_BYTES: i64 = 1024 * 1024;

/// The service of a proxy: `berth-<proxy>`.
pub fn service_name(proxy: &str) -> String {
    format!("berth-{proxy}")
}

/// How each task starts Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entrypoint {
    /// The image's own entrypoint (Envoy): Swarm stops a task with SIGTERM and Envoy exits at
    /// once, cutting its connections. Used when the agent binary is not available.
    Plain,
    /// The derived image (Envoy image + `berth agent`): the agent drains on the stop signal and
    /// answers the HEALTHCHECK, so start-first waits for real readiness.
    Agent(AgentSettings),
}

/// What the agent needs from the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    /// The derived image's tag.
    pub image: String,
    pub env: BTreeMap<String, String>,
    pub health_test: Vec<String>,
    /// Above the drain window, so Swarm never kills a draining task.
    pub stop_grace_period: Duration,
    /// The watched files come through the agent channel (live), not as configs read once.
    pub channel: Option<Channel>,
}

/// Where a task's agent dials the manager, and its credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Channel {
    pub manager: std::net::SocketAddr,
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Channel {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("manager", &self.manager)
            .finish()
    }
}

/// Where a live task's service spec puts the watched files it starts from (its baseline); the
/// agent copies them into the watched directory, a tmpfs, before Envoy starts.
pub const BASELINE_DIR: &str = "/etc/berth/baseline";
/// Where a live task's agent finds its channel credentials.
pub const CREDENTIALS_DIR: &str = "/etc/berth/agent";
/// The watched directory's tmpfs.
const WATCHED_TMPFS_BYTES: i64 = 16 * 1024 * 1024;
/// The TLS directory's tmpfs (a live task's certificate copies, written by its agent).
const TLS_TMPFS_BYTES: i64 = 4 * 1024 * 1024;

impl Entrypoint {
    fn channel(&self) -> Option<&Channel> {
        match self {
            Entrypoint::Agent(a) => a.channel.as_ref(),
            Entrypoint::Plain => None,
        }
    }
}

/// A config or secret a task reads.
#[derive(Clone, PartialEq, Eq)]
pub struct FileObject {
    /// Unique per proxy, path and content: `berth-<proxy>-<sha 16>`.
    pub name: String,
    /// Where tasks see it.
    pub target: String,
    pub data: Vec<u8>,
    /// A private key: a Swarm secret (encrypted in the Raft log, tmpfs in the task), mode 0400.
    pub secret: bool,
    /// A watched file of the baseline a live task starts from: left out of the spec hash (a
    /// route change reaches the tasks through their agents, not as a rolling update).
    pub baseline: bool,
}

impl std::fmt::Debug for FileObject {
    // Never a key's bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileObject")
            .field("name", &self.name)
            .field("target", &self.target)
            .field("bytes", &self.data.len())
            .field("secret", &self.secret)
            .finish()
    }
}

/// Everything berth creates on a Swarm for one proxy.
#[derive(Debug, Clone)]
pub struct ServicePlan {
    pub proxy: String,
    pub name: String,
    /// Over the spec without the replica count, [`SWARM_FORMAT`] included.
    pub hash: String,
    pub spec: ServiceSpec,
    pub files: Vec<FileObject>,
}

/// Inputs besides the target that shape the objects.
pub struct Context<'a> {
    /// The ID of the Swarm's `host` network.
    pub host_network: &'a str,
    /// The configured image's ID (recorded on each task, so a rebuilt tag rolls the tasks).
    pub image_id: &'a str,
    pub state_dir: &'a str,
    pub extra_labels: &'a BTreeMap<String, String>,
    pub entrypoint: &'a Entrypoint,
    /// The watched files as stamped for the tasks (live tasks: their baseline); None: as
    /// rendered.
    pub watched: Option<&'a BTreeMap<String, String>>,
}

/// The labels that mark a Swarm object as this berth's (plus the test suite's).
pub fn ownership_labels(
    proxy: &str,
    state_dir: &str,
    extra: &BTreeMap<String, String>,
) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = extra.clone().into_iter().collect();
    for (k, v) in [
        (LABEL_MANAGED_BY, MANAGED_BY_VALUE),
        (LABEL_PROXY, proxy),
        (LABEL_SWARM, proxy),
        (LABEL_STATE_DIR, state_dir),
    ] {
        labels.insert(k.to_string(), v.to_string());
    }
    labels
}

/// The files of a proxy's tasks: the bootstrap, the watched files (without the agent channel
/// read once at start: a change is a new object and so a rolling update; with it, the baseline
/// the agent starts from), the channel's credentials, and TLS material (keys as secrets).
pub fn files(target: &Target, cx: &Context<'_>) -> Vec<FileObject> {
    let proxy = target.name();
    let mut out = Vec::new();
    let live = cx.entrypoint.channel();
    let mut add = |path: String, data: Vec<u8>, secret: bool| {
        let baseline = path.starts_with(BASELINE_DIR);
        let mut hashed = Vec::new();
        hashed.extend(proxy.as_bytes());
        hashed.push(0);
        hashed.extend(path.as_bytes());
        hashed.push(0);
        hashed.extend(&data);
        let name = format!("berth-{}-{}", short(proxy, 40), &sha256_hex(&hashed)[..16]);
        out.push(FileObject {
            name,
            target: path,
            data,
            secret,
            baseline,
        });
    };
    add(
        layout::CONTAINER_BOOTSTRAP.to_string(),
        target.rendered.bootstrap.clone().into_bytes(),
        false,
    );
    let watched_dir = if live.is_some() {
        BASELINE_DIR
    } else {
        layout::CONTAINER_XDS_DIR
    };
    // The certificate copies the watched files name ride with them: a live task's baseline
    // (copied into its TLS tmpfs by the agent), else mounted where Envoy reads them.
    let tls_dir = if live.is_some() {
        format!("{BASELINE_DIR}/tls")
    } else {
        layout::CONTAINER_TLS_DIR.to_string()
    };
    let rendered;
    let set = match cx.watched {
        Some(w) => w,
        None => {
            let mut all = target.rendered.xds.clone();
            all.extend(super::live::tls_copies(target));
            rendered = all;
            &rendered
        }
    };
    for (file, text) in set {
        match file.strip_prefix(TLS_PREFIX) {
            Some(copy) => {
                let key = copy
                    .rsplit('/')
                    .next()
                    .is_some_and(|f| f.starts_with("key"));
                add(format!("{tls_dir}/{copy}"), text.clone().into_bytes(), key);
            }
            None => add(
                format!("{watched_dir}/{file}"),
                text.clone().into_bytes(),
                false,
            ),
        }
    }
    if let Some(c) = live {
        add(
            format!("{CREDENTIALS_DIR}/ca.pem"),
            c.ca.clone().into_bytes(),
            false,
        );
        add(
            format!("{CREDENTIALS_DIR}/cert.pem"),
            c.cert.clone().into_bytes(),
            false,
        );
        add(
            format!("{CREDENTIALS_DIR}/key.pem"),
            c.key.clone().into_bytes(),
            true,
        );
    }
    if let Routing::Xds(_) = &target.proxy.routing {
        for f in replica::tls_files(&target.proxy) {
            // An unreadable file counts as empty here; validation names it.
            let data = std::fs::read(&f.source).unwrap_or_default();
            add(
                layout::container_tls_file(&f.owner, f.file),
                data,
                f.file == "key.pem",
            );
        }
    }
    out
}

fn short(s: &str, n: usize) -> &str {
    s.get(..n).unwrap_or(s)
}

/// The service for `target`. `ids` maps each file object's name to its ID on the Swarm
/// (objects are created before the service; the hash does not depend on IDs).
pub fn plan(target: &Target, cx: &Context<'_>, ids: &BTreeMap<String, String>) -> ServicePlan {
    let proxy = target.name().to_string();
    let desired = &target.desired;
    let spec = &desired.spec;
    let files = files(target, cx);

    let mut env: BTreeMap<String, String> = spec.env.clone();
    let (image, health_check, stop_grace_period) = match cx.entrypoint {
        Entrypoint::Plain => (spec.image.clone(), None, None),
        Entrypoint::Agent(a) => {
            env.extend(a.env.clone());
            // Each task's Envoy its own node id: Swarm expands templates in the environment
            // (not in arguments), and the agent puts it into Envoy's `--service-node`.
            env.insert(
                crate::core::agent::ENV_SERVICE_NODE.to_string(),
                "{{.Task.Name}}".to_string(),
            );
            if let Some(c) = &a.channel {
                use crate::core::agent::channel as ch;
                for (k, v) in [
                    (ch::ENV_MANAGER, c.manager.to_string()),
                    (ch::ENV_PROXY, proxy.clone()),
                    (ch::ENV_WATCHED, layout::CONTAINER_XDS_DIR.to_string()),
                    (ch::ENV_BASELINE, BASELINE_DIR.to_string()),
                    (ch::ENV_CREDENTIALS, CREDENTIALS_DIR.to_string()),
                    (ch::ENV_TLS, layout::CONTAINER_TLS_DIR.to_string()),
                ] {
                    env.insert(k.to_string(), v);
                }
            }
            let ns = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
            (
                a.image.clone(),
                Some(HealthConfig {
                    test: Some(a.health_test.clone()),
                    // See core::agent::health_bound: 6 s from the last passing check.
                    interval: Some(ns(crate::core::agent::HEALTH_INTERVAL)),
                    timeout: Some(ns(crate::core::agent::HEALTH_TIMEOUT)),
                    retries: Some(i64::from(crate::core::agent::HEALTH_RETRIES)),
                    start_period: Some(ns(desired.rollout.startup_deadline)),
                    start_interval: None,
                }),
                Some(ns(a.stop_grace_period)),
            )
        }
    };

    let mut container_labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
    container_labels.extend(cx.extra_labels.clone());
    container_labels.insert(LABEL_SWARM.into(), proxy.clone());
    container_labels.insert(LABEL_PROXY.into(), proxy.clone());
    container_labels.insert(LABEL_IMAGE_ID.into(), cx.image_id.to_string());
    container_labels.insert(LABEL_IMAGE.into(), spec.image.clone());

    let (configs, secrets): (Vec<_>, Vec<_>) = files.iter().partition(|f| !f.secret);
    let uid = spec.user.uid.to_string();
    let gid = spec.user.gid.to_string();
    let container = TaskSpecContainerSpec {
        image: Some(image),
        labels: Some(container_labels),
        // Every task of a service runs with the same arguments (Swarm templates do not reach
        // args): `--service-node` is the service's name here, and the agent replaces it with
        // the task's own name (from the environment, where templates do reach).
        args: Some(replica::with_service_node(
            &spec.args,
            &service_name(&proxy),
        )),
        env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        user: Some(format!("{uid}:{gid}")),
        read_only: Some(true),
        capability_drop: Some(vec!["ALL".into()]),
        capability_add: (!spec.cap_add.is_empty()).then(|| spec.cap_add.clone()),
        privileges: Some(TaskSpecContainerSpecPrivileges {
            no_new_privileges: Some(true),
            ..Default::default()
        }),
        mounts: Some(mounts(cx.entrypoint.channel().is_some())),
        configs: Some(
            configs
                .iter()
                .map(|f| TaskSpecContainerSpecConfigs {
                    file: Some(TaskSpecContainerSpecFile1 {
                        name: Some(f.target.clone()),
                        uid: Some(uid.clone()),
                        gid: Some(gid.clone()),
                        mode: Some(0o444),
                    }),
                    config_id: ids.get(&f.name).cloned(),
                    config_name: Some(f.name.clone()),
                    runtime: None,
                })
                .collect(),
        ),
        secrets: Some(
            secrets
                .iter()
                .map(|f| TaskSpecContainerSpecSecrets {
                    file: Some(TaskSpecContainerSpecFile {
                        name: Some(f.target.clone()),
                        uid: Some(uid.clone()),
                        gid: Some(gid.clone()),
                        mode: Some(0o400),
                    }),
                    secret_id: ids.get(&f.name).cloned(),
                    secret_name: Some(f.name.clone()),
                })
                .collect(),
        ),
        stop_signal: Some("SIGTERM".into()),
        stop_grace_period,
        health_check,
        ..Default::default()
    };
    let rollout = &desired.rollout;
    let monitor = i64::try_from(rollout.min_ready.as_nanos()).unwrap_or(i64::MAX);
    let task = TaskSpec {
        container_spec: Some(container),
        resources: Some(TaskSpecResources {
            limits: Some(Limit {
                nano_cpus: spec.nano_cpus,
                memory_bytes: spec.memory,
                pids: None,
            }),
            ..Default::default()
        }),
        restart_policy: Some(TaskSpecRestartPolicy {
            condition: Some(TaskSpecRestartPolicyConditionEnum::ANY),
            delay: Some(RESTART_DELAY.as_nanos() as i64),
            max_attempts: Some(0),
            window: Some(0),
        }),
        placement: Some(TaskSpecPlacement {
            constraints: (!target.proxy.placement.constraints.is_empty())
                .then(|| target.proxy.placement.constraints.clone()),
            ..Default::default()
        }),
        networks: Some(vec![NetworkAttachmentConfig {
            target: Some(cx.host_network.to_string()),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let mut spec_out = ServiceSpec {
        name: Some(service_name(&proxy)),
        labels: None,
        task_template: Some(task),
        mode: None,
        update_config: Some(ServiceSpecUpdateConfig {
            parallelism: Some(1),
            delay: Some(0),
            failure_action: Some(match rollout.on_failure {
                OnFailure::Rollback => ServiceSpecUpdateConfigFailureActionEnum::ROLLBACK,
                OnFailure::Pause => ServiceSpecUpdateConfigFailureActionEnum::PAUSE,
            }),
            monitor: Some(monitor),
            max_failure_ratio: Some(0.0),
            order: Some(ServiceSpecUpdateConfigOrderEnum::START_FIRST),
        }),
        // Never roll back a rollback: a failing rollback pauses.
        rollback_config: Some(ServiceSpecRollbackConfig {
            parallelism: Some(1),
            delay: Some(0),
            failure_action: Some(ServiceSpecRollbackConfigFailureActionEnum::PAUSE),
            monitor: Some(monitor),
            max_failure_ratio: Some(0.0),
            order: Some(ServiceSpecRollbackConfigOrderEnum::START_FIRST),
        }),
        networks: None,
        endpoint_spec: None,
    };
    let hash = hash_of(&spec_out, &files);
    let mut labels = ownership_labels(&proxy, cx.state_dir, cx.extra_labels);
    labels.extend(spec.labels.clone());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY_VALUE.into());
    labels.insert(LABEL_SPEC_HASH.into(), hash.clone());
    spec_out.labels = Some(labels);
    if let Some(c) = spec_out
        .task_template
        .as_mut()
        .and_then(|t| t.container_spec.as_mut())
    {
        c.labels
            .get_or_insert_with(HashMap::new)
            .insert(LABEL_SPEC_HASH.into(), hash.clone());
    }
    spec_out.mode = Some(mode(target));
    ServicePlan {
        proxy,
        name: service_name(target.name()),
        hash,
        spec: spec_out,
        files,
    }
}

/// The task's tmpfs mounts: the admin socket's directory; with the agent channel, the watched
/// directory the agent writes (the user's own, as the run directory: mode 1777).
fn mounts(live: bool) -> Vec<Mount> {
    let tmpfs = |target: &str, size: i64| Mount {
        target: Some(target.into()),
        typ: Some(MountType::TMPFS),
        tmpfs_options: Some(MountTmpfsOptions {
            size_bytes: Some(size),
            mode: Some(0o1777),
            options: None,
        }),
        ..Default::default()
    };
    let mut out = vec![tmpfs(layout::CONTAINER_RUN_DIR, RUN_TMPFS_BYTES)];
    if live {
        out.push(tmpfs(layout::CONTAINER_XDS_DIR, WATCHED_TMPFS_BYTES));
        out.push(tmpfs(layout::CONTAINER_TLS_DIR, TLS_TMPFS_BYTES));
    }
    out
}

/// Replicated with the proxy's replica count, or global.
pub fn mode(target: &Target) -> ServiceSpecMode {
    if target.proxy.placement.global {
        ServiceSpecMode {
            global: Some(HashMap::new()),
            ..Default::default()
        }
    } else {
        ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated {
                replicas: Some(i64::from(target.desired.replicas)),
            }),
            ..Default::default()
        }
    }
}

/// sha256 over the spec (labels and mode still unset, object IDs left out) and each file
/// object's name, which already hashes its content.
fn hash_of(spec: &ServiceSpec, files: &[FileObject]) -> String {
    #[derive(Serialize)]
    struct Hashed<'a> {
        format: u32,
        spec: serde_json::Value,
        files: Vec<&'a str>,
    }
    let mut value = serde_json::to_value(spec).expect("a ServiceSpec serializes");
    strip_ids(&mut value);
    strip_baseline(&mut value);
    // An image pinned by digest (the agent image pushed to `[swarm] registry`) counts by its
    // tag, which already names its content: `diff` can tell the hash without pushing.
    if let Some(image) = value
        .pointer_mut("/TaskTemplate/ContainerSpec/Image")
        .filter(|i| i.as_str().is_some_and(|i| i.contains('@')))
    {
        let tag = image
            .as_str()
            .and_then(|i| i.split('@').next())
            .unwrap_or("")
            .to_string();
        *image = serde_json::Value::String(tag);
    }
    let json = serde_json::to_vec(&Hashed {
        format: SWARM_FORMAT,
        spec: sorted(value),
        files: files
            .iter()
            .filter(|f| !f.baseline)
            .map(|f| f.name.as_str())
            .collect(),
    })
    .expect("serializes");
    sha256_hex(&json)
}

/// The baseline's config and secret references leave the hashed spec: a route change or a
/// certificate rotation is no new spec.
fn strip_baseline(v: &mut serde_json::Value) {
    for list in ["Configs", "Secrets"] {
        if let Some(serde_json::Value::Array(refs)) =
            v.pointer_mut(&format!("/TaskTemplate/ContainerSpec/{list}"))
        {
            refs.retain(|c| !is_baseline(c.pointer("/File/Name").and_then(|n| n.as_str())));
        }
    }
}

/// Whether a config reference of a task spec is one of a live task's baseline files.
pub fn is_baseline(target: Option<&str>) -> bool {
    target.is_some_and(|t| t.starts_with(BASELINE_DIR))
}

fn strip_ids(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("ConfigID");
            m.remove("SecretID");
            m.values_mut().for_each(strip_ids);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_ids),
        _ => {}
    }
}

/// Object keys sorted (serde_json's map keeps insertion order only with a feature; HashMaps in
/// the spec have none): the same spec always hashes the same.
fn sorted(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let b: BTreeMap<String, serde_json::Value> =
                m.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            serde_json::to_value(b).expect("serializes")
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(sorted).collect())
        }
        other => other,
    }
}
