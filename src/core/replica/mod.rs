//! What each replica container of a proxy must be: pure data derived from the IR and the
//! rendered files, and the spec hash that says when a container must be replaced.
//!
//! A [`ProxySpec`] is shared by every replica of a proxy; its hash covers everything that needs
//! a new container (image, args, env, resources, bootstrap content, mounts, ports) and not the
//! replica count. The few per-replica parts (container name, `--service-node`, admin socket
//! directory) come from [`ReplicaContainer::new`].

pub mod container;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::ir;
use crate::core::layout::{self, ProxyDirs};
pub use container::{
    ContainerInfo, Hardening, LiveSettings, Mount, Network, ObservedContainer, ReplicaContainer,
    RunState, User,
};

#[cfg(test)]
pub(crate) mod tests;

/// Marks every container berth manages; berth never touches a container without it.
pub const LABEL_MANAGED_BY: &str = "io.berth.managed-by";
pub const MANAGED_BY_VALUE: &str = "berth";
pub const LABEL_PROXY: &str = "io.berth.proxy";
pub const LABEL_SLOT: &str = "io.berth.slot";
pub const LABEL_SPEC_HASH: &str = "io.berth.spec-hash";
pub const LABEL_IMAGE_ID: &str = "io.berth.image-id";
/// The name berth gave the container; a different live name is drift.
pub const LABEL_NAME: &str = "io.berth.name";
/// The state directory of the berth that made the container: berths with different state
/// directories on one host leave each other's containers alone.
pub const LABEL_STATE_DIR: &str = "io.berth.state-dir";
/// Set on everything the test suite creates, so it can clean up by label.
pub const LABEL_TEST: &str = "io.berth.test";

/// Everything that requires a new container when it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxySpec {
    pub proxy: String,
    pub image: String,
    /// Envoy's arguments after the entrypoint, without the per-replica `--service-node`.
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// 1e9 = one CPU.
    pub nano_cpus: Option<i64>,
    /// Bytes.
    pub memory: Option<i64>,
    /// Mounts shared by all replicas (bootstrap generation, watched xDS directory, TLS files).
    pub mounts: Vec<Mount>,
    pub ports: Vec<u16>,
    /// The address a port is bound on, where it is not 0.0.0.0 (left out of the hash when
    /// empty, so specs from before listeners had addresses keep theirs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub addresses: BTreeMap<u16, std::net::IpAddr>,
    /// Capabilities added after dropping ALL: NET_BIND_SERVICE when a port is below 1024.
    pub cap_add: Vec<String>,
    /// sha256 of the rendered bootstrap.
    pub bootstrap_sha256: String,
    /// The user's metadata labels, copied onto each container.
    pub labels: BTreeMap<String, String>,
    /// The user the replicas run as; left out of the hash when it is [`REPLICA_USER`], so hashes
    /// made before this field existed still hold.
    #[serde(default = "default_user", skip_serializing_if = "is_default_user")]
    pub user: User,
    /// The image ID `image` named when it was last pulled, for a proxy whose pull policy is
    /// "always" ([`DesiredProxy::pin_image`]): a tag that moves to another image is then a new
    /// spec, rolled out like any other change. None (and out of the hash, so hashes made
    /// before this field existed still hold) when the reference alone is the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
}

fn default_user() -> User {
    REPLICA_USER
}

fn is_default_user(u: &User) -> bool {
    *u == REPLICA_USER
}

/// A proxy as it should be: its spec, that spec's hash, and how many replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesiredProxy {
    pub spec: ProxySpec,
    pub hash: String,
    pub replicas: u32,
    /// xds mode: Envoy Gateway pushes the listeners (on the ports of the IR's listeners, which
    /// are `spec.ports`); a replica serves only once its xDS server has sent them.
    #[serde(default)]
    pub xds: bool,
    /// How its replicas drain when they retire (not part of the hash: a change applies to the
    /// next retirement, it needs no new container). Recorded with the spec, so a proxy that
    /// left the config is still drained with its own settings.
    #[serde(default)]
    pub shutdown: ir::Shutdown,
    #[serde(default)]
    pub rollout: ir::RolloutPolicy,
}

impl DesiredProxy {
    /// Pins the spec to the image ID its tag names now (pull policy "always"): the hash
    /// follows the ID, so a moved tag replaces the replicas through the rolling path.
    pub fn pin_image(&mut self, image_id: &str) {
        if self.spec.image_id.as_deref() != Some(image_id) {
            self.spec.image_id = Some(image_id.to_string());
            self.hash = self.spec.hash();
        }
    }

    /// What a ready replica of this proxy shows: every listener port bound.
    pub fn expect(&self) -> crate::core::expect::Expect {
        crate::core::expect::Expect {
            ports: self.spec.ports.clone(),
            addresses: self.spec.addresses.clone(),
        }
    }
}

impl ObservedContainer {
    /// Seconds since the container started, while it runs.
    pub fn uptime_seconds(&self) -> Option<u64> {
        if self.state != RunState::Running {
            return None;
        }
        let started =
            humantime::parse_rfc3339_weak(self.info.started_at.as_deref()?.trim_end_matches('Z'))
                .ok()?;
        std::time::SystemTime::now()
            .duration_since(started)
            .ok()
            .map(|d| d.as_secs())
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    pub fn is_managed(&self) -> bool {
        self.label(LABEL_MANAGED_BY) == Some(MANAGED_BY_VALUE)
    }

    pub fn proxy(&self) -> Option<&str> {
        self.label(LABEL_PROXY)
    }

    pub fn slot(&self) -> Option<u32> {
        self.label(LABEL_SLOT).and_then(|s| s.parse().ok())
    }

    /// Whether the container belongs to the berth with this state directory (containers made
    /// before the label existed count as everyone's).
    pub fn belongs_to(&self, state_dir: &Path) -> bool {
        self.label(LABEL_STATE_DIR)
            .is_none_or(|d| Path::new(d) == state_dir)
    }

    pub fn spec_hash(&self) -> Option<&str> {
        self.label(LABEL_SPEC_HASH)
    }

    /// The name berth gave the container (its [`LABEL_NAME`] label).
    pub fn recorded_name(&self) -> Option<&str> {
        self.label(LABEL_NAME)
    }

    /// The image ID berth recorded when it created the container.
    pub fn image_id(&self) -> Option<&str> {
        self.label(LABEL_IMAGE_ID)
    }
}

/// The restart policy every replica has (DESIGN decision 8).
pub const RESTART_POLICY: &str = container::RESTART_UNLESS_STOPPED;

/// The user every replica runs as by default: `101:101`, the `envoy` user of Envoy's official
/// image and of `scripts/envoy-image.sh`, whatever `USER` the image declares. SO_REUSEPORT only
/// lets sockets share a port when they belong to the same effective UID, so an old and a new
/// replica from different images must run as the same UID for a start-first replacement to
/// bind; and berth hands each replica's admin-socket directory to this UID before it starts.
pub const REPLICA_USER: User = User { uid: 101, gid: 101 };
pub const REPLICA_UID: u32 = REPLICA_USER.uid;

/// The user replicas run as: [`REPLICA_USER`] when berth runs as root (it hands each replica
/// its run directory); otherwise berth's own uid:gid, as compose runs for a docker-group member:
/// berth cannot hand files to another user, and the admin socket Envoy creates must be
/// reachable by berth and by nobody else.
pub fn replica_user() -> User {
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        REPLICA_USER
    } else {
        User { uid, gid }
    }
}
pub const REPLICA_GID: u32 = REPLICA_USER.gid;

/// Version of how berth builds a container beyond the fields of [`ProxySpec`]: hardening
/// (user, read-only root, `cap_drop`, `no-new-privileges`), host networking, restart policy.
/// It is part of every spec hash, so bumping it when any of those change replaces every
/// replica (safely, through the rolling path) instead of leaving old-style containers behind.
pub const SPEC_FORMAT: u32 = 1;

/// The value of `--drain-strategy`.
pub const DRAIN_STRATEGY: &str = "immediate";

/// Added to `cap_add` when a listener port is below 1024.
pub const CAP_NET_BIND_SERVICE: &str = "NET_BIND_SERVICE";

/// Lower-case hex sha256.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The first 12 characters of a hash, for display (the whole string when shorter).
pub fn short_hash(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// The name berth gives a new replica container: `berth-<proxy>-<slot>-<first 8 of hash>`,
/// e.g. `berth-edge-0-1a2b3c4d`. It differs between specs, so a start-first replacement's new
/// container never clashes with the old one of the same slot. The planner adds a `-<n>` suffix
/// when the name is already taken (a same-spec replacement of a drifted container); see
/// [`crate::core::plan`].
pub fn replica_name(proxy: &str, slot: u32, spec_hash: &str) -> String {
    let prefix = spec_hash.get(..8).unwrap_or(spec_hash);
    format!("berth-{proxy}-{slot}-{prefix}")
}

/// Envoy's `--concurrency` for one replica: the configured value as given (Envoy runs one
/// worker for 0, as under Envoy Gateway, which passes 0 through), or else
/// max(1, host CPUs / replicas) so that the replicas together use the host's CPUs once.
pub fn concurrency(config: &ir::EnvoyProxy, host_cpus: u32) -> u32 {
    match config.concurrency {
        Some(n) => n,
        None => (host_cpus / config.replicas.max(1)).max(1),
    }
}

/// `--drain-time-s`: whole seconds, rounded up so a sub-second timeout is not turned into 0.
fn drain_time_secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// One TLS file a proxy's replicas read: copied from `source` into the state directory's
/// `tls/<dir>/<file>` and mounted at `layout::container_tls_file(owner, file)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFile {
    /// A listener name, or "xds" for the xDS client certificate.
    pub owner: String,
    /// The directory under the state's `tls/`: the owner for a listener's files, whose
    /// renewals reach running replicas in place; `xds-<sha>` of the contents for the xDS
    /// client certificate, so a new one is a new spec that must get config from the xDS
    /// server before it replaces a replica (a certificate the server does not trust would
    /// otherwise reach every running replica, which then cannot reconnect).
    pub dir: String,
    /// "cert.pem", "key.pem" or "ca.pem".
    pub file: &'static str,
    pub source: PathBuf,
}

/// Every TLS file the proxy's replicas need.
pub fn tls_files(proxy: &ir::ProxyInfra) -> Vec<TlsFile> {
    let file = |owner: &str, file, source: &PathBuf| TlsFile {
        owner: owner.to_string(),
        dir: owner.to_string(),
        file,
        source: source.clone(),
    };
    match &proxy.routing {
        ir::Routing::Standalone(standalone) => standalone
            .listeners
            .iter()
            .flat_map(|l| l.certificates())
            .flat_map(|c| {
                [
                    file(&c.dir, "cert.pem", &c.files.cert_file),
                    file(&c.dir, "key.pem", &c.files.key_file),
                ]
            })
            .collect(),
        ir::Routing::Xds(x) => {
            let mut files = vec![
                file("xds", "ca.pem", &x.ca_file),
                file("xds", "cert.pem", &x.cert_file),
                file("xds", "key.pem", &x.key_file),
            ];
            let dir = xds_tls_dir(&files);
            for f in &mut files {
                f.dir.clone_from(&dir);
            }
            files
        }
    }
}

/// `xds-<first 12 hex of sha256>` over the files' contents (a file that cannot be read counts
/// by its path: copying it fails later, naming it).
fn xds_tls_dir(files: &[TlsFile]) -> String {
    let mut all = Vec::new();
    for f in files {
        all.extend(f.file.as_bytes());
        all.push(0);
        match std::fs::read(&f.source) {
            Ok(content) => all.extend(content),
            Err(_) => all.extend(f.source.as_os_str().as_encoded_bytes()),
        }
        all.push(0);
    }
    format!("xds-{}", &sha256_hex(&all)[..12])
}

/// The desired state of one proxy's replicas.
///
/// `bootstrap` is the rendered bootstrap text: its sha256 is [`ProxySpec::bootstrap_sha256`]
/// and names the generation directory mounted at [`layout::CONTAINER_BOOTSTRAP_DIR`], so a new
/// bootstrap is a new spec (replicas are replaced) while the old replicas keep their files. The
/// watched xDS files are *not* part of the spec: Envoy reloads them live, without a restart.
///
/// **Concurrency and the hash.** The hash covers Envoy's arguments, and `--concurrency`
/// defaults to max(1, host CPUs / replicas). The replica count itself is not hashed, but when
/// concurrency is not set, a scale that changes the *computed* worker count changes every
/// replica's args and therefore its hash, and the replicas are rolled to the new worker count
/// (the price of replicas that together use the host's CPUs once, not N times). When the
/// computed value stays the same (e.g. 3 → 5 replicas on a 2-CPU host: 1 worker either way), or
/// when `concurrency` is set explicitly, scaling leaves the hash alone and only adds or removes
/// slots. The host's CPU count is an input for the same reason: moving the state to a bigger
/// host rolls the replicas to more workers.
pub fn desired_proxy(
    proxy: &ir::ProxyInfra,
    bootstrap: &str,
    state_dir: &Path,
    host_cpus: u32,
) -> DesiredProxy {
    let cfg = &proxy.config;
    let bootstrap_sha256 = sha256_hex(bootstrap.as_bytes());
    let dirs = ProxyDirs::new(state_dir, &proxy.name);

    let mut args: Vec<String> = vec![
        "-c".into(),
        layout::CONTAINER_BOOTSTRAP.into(),
        "--disable-hot-restart".into(),
        "--service-cluster".into(),
        proxy.service_cluster().to_string(),
        "--log-level".into(),
        cfg.logging.default_level().as_str().into(),
    ];
    let components: Vec<String> = cfg
        .logging
        .component_levels()
        .map(|(c, l)| format!("{c}:{}", l.as_str()))
        .collect();
    if !components.is_empty() {
        args.push("--component-log-level".into());
        args.push(components.join(","));
    }
    args.extend([
        "--drain-strategy".into(),
        DRAIN_STRATEGY.into(),
        "--drain-time-s".into(),
        drain_time_secs(cfg.shutdown.drain_timeout).to_string(),
        "--concurrency".into(),
        concurrency(cfg, host_cpus).to_string(),
    ]);
    args.extend(cfg.extra_args.iter().cloned());

    let ro = |source: PathBuf, target: String| Mount {
        source,
        target,
        read_only: true,
    };
    let mut mounts = vec![ro(
        dirs.generation(&bootstrap_sha256),
        layout::CONTAINER_BOOTSTRAP_DIR.into(),
    )];
    // The watched directory holds the listener/route/cluster files (standalone) or the SDS
    // files for the xDS client certificate (xds mode).
    mounts.push(ro(dirs.xds(), layout::CONTAINER_XDS_DIR.into()));
    // TLS material is copied into the state directory (owned by the replica user) and mounted
    // as directories, so a renewed certificate replaced by rename reaches running replicas.
    let owners: BTreeSet<(String, String)> = tls_files(proxy)
        .into_iter()
        .map(|f| (f.dir, f.owner))
        .collect();
    for (dir, owner) in owners {
        mounts.push(ro(
            dirs.tls(&dir),
            format!("{}/{owner}", layout::CONTAINER_TLS_DIR),
        ));
    }
    // Backends' TLS files likewise, one directory per backend (new versions arrive by rename).
    if let ir::Routing::Standalone(s) = &proxy.routing {
        for b in s.backends.iter().filter(|b| b.tls.is_some()) {
            let owner = crate::core::render::view::backend_tls_owner(&b.name);
            mounts.push(ro(
                dirs.tls(&owner),
                format!("{}/{owner}", layout::CONTAINER_TLS_DIR),
            ));
        }
    }
    mounts.sort();
    mounts.dedup();

    let mut ports = proxy.host_ports();
    ports.sort_unstable();
    ports.dedup();
    let cap_add = if ports.iter().any(|&p| p < 1024) {
        vec![CAP_NET_BIND_SERVICE.to_string()]
    } else {
        Vec::new()
    };

    let spec = ProxySpec {
        proxy: proxy.name.clone(),
        image: cfg.image.clone(),
        args,
        env: cfg.env.clone(),
        nano_cpus: cfg.resources.cpus.map(|c| (c * 1e9).round() as i64),
        memory: cfg
            .resources
            .memory
            .map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
        mounts,
        ports,
        addresses: proxy
            .host_binds()
            .into_iter()
            .filter(|(a, _)| *a != std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
            .map(|(a, p)| (p, a))
            .collect(),
        cap_add,
        bootstrap_sha256,
        labels: proxy.metadata.labels.clone(),
        user: replica_user(),
        image_id: None,
    };
    let hash = spec.hash();
    DesiredProxy {
        spec,
        hash,
        replicas: cfg.replicas,
        xds: matches!(proxy.routing, ir::Routing::Xds(_)),
        shutdown: cfg.shutdown.clone(),
        rollout: proxy.rollout.clone(),
    }
}

/// The node name `envoy --mode validate` runs as (a replica runs as its container name).
pub const VALIDATION_NODE: &str = "berth-validate";

/// Envoy's arguments for `envoy --mode validate` of this spec: exactly a replica's (see
/// [`ReplicaContainer::new`]), with [`VALIDATION_NODE`] as the node, so that an extra argument
/// Envoy refuses fails validation instead of the replica's start.
pub fn validation_args(spec: &ProxySpec) -> Vec<String> {
    with_service_node(&spec.args, VALIDATION_NODE)
}

/// `args` with `--service-node <node>` right after `--service-cluster <cluster>`, so the
/// user's extra arguments stay last.
pub fn with_service_node(args: &[String], node: &str) -> Vec<String> {
    let mut args = args.to_vec();
    let at = args
        .iter()
        .position(|a| a == "--service-cluster")
        .map(|i| (i + 2).min(args.len()))
        .unwrap_or(0);
    args.splice(at..at, ["--service-node".to_string(), node.to_string()]);
    args
}

impl ProxySpec {
    /// sha256 (lower-case hex) over a canonical serialization: serde_json of
    /// `{"format": SPEC_FORMAT, "spec": <this spec with mounts, ports and cap_add sorted>}`.
    /// Maps are BTreeMaps, so the bytes do not depend on insertion order; `args` keep their
    /// order because it is meaningful. Renaming or adding a field changes every hash (and so
    /// rolls every replica on upgrade): a golden test guards against doing so by accident.
    pub fn hash(&self) -> String {
        #[derive(Serialize)]
        struct Hashed<'a> {
            format: u32,
            spec: &'a ProxySpec,
        }
        let mut spec = self.clone();
        spec.mounts.sort();
        spec.mounts.dedup();
        spec.ports.sort_unstable();
        spec.ports.dedup();
        spec.cap_add.sort();
        spec.cap_add.dedup();
        let json = serde_json::to_vec(&Hashed {
            format: SPEC_FORMAT,
            spec: &spec,
        })
        .expect("a ProxySpec always serializes");
        sha256_hex(&json)
    }
}

impl DesiredProxy {
    pub fn name(&self) -> &str {
        &self.spec.proxy
    }
}

impl ReplicaContainer {
    /// The container for `slot` of `desired`, named `name` (from the plan's action). Adds to
    /// the shared spec: `--service-node <name>` (right after `--service-cluster`, so the user's
    /// extra args stay last), this replica's admin socket directory at
    /// [`layout::CONTAINER_RUN_DIR`] (read-write), and berth's labels, which win over the
    /// user's labels of the same key. `image_id` is what the image reference names now; it is
    /// recorded as a label for `status` and `diff`. A spec pinned to another image ID
    /// ([`DesiredProxy::pin_image`]; a rollback after its tag moved) is created from that ID,
    /// so it runs the image it was proven with. `extra_labels` (the test suite's) go on too.
    pub fn new(
        desired: &DesiredProxy,
        slot: u32,
        name: &str,
        image_id: &str,
        state_dir: &Path,
        extra_labels: &BTreeMap<String, String>,
    ) -> ReplicaContainer {
        let spec = &desired.spec;
        let (image, image_id) = match spec.image_id.as_deref() {
            Some(pinned) if pinned != image_id => (pinned.to_string(), pinned),
            _ => (spec.image.clone(), image_id),
        };

        let args = with_service_node(&spec.args, name);

        let mut mounts = spec.mounts.clone();
        mounts.push(Mount {
            source: ProxyDirs::new(state_dir, &spec.proxy).run(name),
            target: layout::CONTAINER_RUN_DIR.into(),
            read_only: false,
        });
        mounts.sort();

        let mut labels = spec.labels.clone();
        labels.extend(extra_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        for (k, v) in [
            (LABEL_MANAGED_BY, MANAGED_BY_VALUE),
            (LABEL_PROXY, spec.proxy.as_str()),
            (LABEL_SLOT, &slot.to_string()),
            (LABEL_SPEC_HASH, desired.hash.as_str()),
            (LABEL_IMAGE_ID, image_id),
            (LABEL_NAME, name),
            (LABEL_STATE_DIR, &state_dir.display().to_string()),
        ] {
            labels.insert(k.to_string(), v.to_string());
        }

        ReplicaContainer {
            name: name.to_string(),
            slot,
            image,
            args,
            env: spec.env.clone(),
            nano_cpus: spec.nano_cpus,
            memory: spec.memory,
            mounts,
            labels,
            hardening: hardening(spec),
            network: Network::Host,
            restart_policy: RESTART_POLICY.to_string(),
        }
    }
}

/// DESIGN decision 9: non-root, read-only root filesystem, every capability dropped (plus
/// `NET_BIND_SERVICE` for ports below 1024), no new privileges.
pub fn hardening(spec: &ProxySpec) -> Hardening {
    Hardening {
        user: spec.user,
        read_only_rootfs: true,
        cap_drop_all: true,
        cap_add: spec.cap_add.clone(),
        no_new_privileges: true,
    }
}
