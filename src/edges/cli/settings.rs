//! Settings resolved once, from flags, the environment and the config: the config and its
//! targets, the state directory, the renderer, the output mode, the infrastructure. Every
//! default lives here; commands only use what this resolved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::{BadInput, Cli, Output};
use crate::core::progress::{Mode, Reporter};
use crate::core::render::Renderer;
use crate::core::source::file::{self, Config};
use crate::core::target::{self, Target};
use crate::host::default_state_dir;
use crate::infra::{Caller, EngineKind};
use crate::ops::acme::Placeholders;
use crate::ops::Operations;
use crate::state::StateDir;

/// The default config file.
pub const DEFAULT_CONFIG: &str = "berth.toml";

impl Cli {
    /// The config file: `-f`, else `BERTH_CONFIG`, else `berth.toml`.
    pub fn config_path(&self) -> PathBuf {
        self.file
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG))
    }

    /// What the proxies come from, for messages: the config file and the `--ir` files.
    pub(super) fn sources(&self) -> String {
        let path = self.config_path();
        let mut parts = Vec::new();
        if self.ir.is_empty() || self.file.is_some() || path.exists() {
            parts.push(path.display().to_string());
        }
        parts.extend(self.ir.iter().map(|p| format!("--ir {}", p.display())));
        parts.join(" + ")
    }

    pub(super) fn mode(&self) -> Mode {
        match (self.quiet, self.output) {
            (true, _) => Mode::Quiet,
            (false, Output::Json) => Mode::Json,
            (false, Output::Table) => Mode::Human,
        }
    }

    pub(super) fn reporter(&self) -> Reporter {
        Reporter::new(self.mode())
    }

    pub(super) fn container_labels(&self) -> BTreeMap<String, String> {
        self.container_labels.iter().cloned().collect()
    }

    pub(super) fn renderer(&self) -> Result<Renderer> {
        match &self.templates {
            Some(dir) => Renderer::with_overrides(dir),
            None => Ok(Renderer::builtin()),
        }
    }

    /// The state directory, absolute: it is a bind-mount source and a container label.
    pub(super) fn state_dir(&self, config: Option<&Config>) -> PathBuf {
        let dir = self
            .state_dir
            .clone()
            .or_else(|| config.and_then(|c| c.state_dir.clone()))
            .unwrap_or_else(default_state_dir);
        std::path::absolute(&dir).unwrap_or(dir)
    }
}

/// What a command works on: the config (with `--ir` proxies) and its rendered targets.
pub(super) struct Resolved {
    pub config: Option<Config>,
    pub targets: Vec<Target>,
    pub state_dir: PathBuf,
    /// What rendered the targets, holding their renders for the render cache.
    renderer: Option<Renderer>,
}

impl Resolved {
    /// The config (required) rendered against its state directory (or `state_dir`). Renders
    /// the state directory's render cache holds are taken from it ([`crate::core::render::cache`]).
    pub fn load(cli: &Cli) -> Result<Resolved> {
        Self::load_caching(cli, false)
    }

    /// [`Resolved::load`] for `up`, which keeps what it rendered in the render cache once it
    /// has converged ([`Resolved::save_render_cache`]).
    pub fn load_for_up(cli: &Cli) -> Result<Resolved> {
        Self::load_caching(cli, true)
    }

    fn load_caching(cli: &Cli, write_cache: bool) -> Result<Resolved> {
        let config = load(cli)?;
        super::commands::phase("config loaded");
        let state_dir = cli.state_dir(Some(&config));
        // No command writes before it holds the state directory.
        Self::render_caching(
            cli,
            Some(config),
            state_dir,
            write_cache,
            Placeholders::InMemory,
        )
    }

    /// For `up` once it holds the state directory: renders again if an ACME listener's
    /// placeholder was only made in memory (a command writes nothing before it holds the
    /// directory: see [`Placeholders::InMemory`]), now writing it.
    pub fn with_placeholders_written(self, cli: &Cli) -> Result<Resolved> {
        if self.targets.iter().all(|t| t.acme_placeholders.is_empty()) {
            return Ok(self);
        }
        Self::render_caching(cli, self.config, self.state_dir, true, Placeholders::Write)
    }

    /// Like [`Resolved::load`] for commands that also work from the state directory alone
    /// (`status`, `down`): no config when no file was named, `berth.toml` is absent and no
    /// `--ir` is given; a named file must exist, and a config with errors is refused.
    pub fn load_optional(cli: &Cli) -> Result<Resolved> {
        let path = cli.config_path();
        if cli.file.is_none() && !path.exists() && cli.ir.is_empty() {
            tracing::debug!("no config at {}", path.display());
            let state_dir = cli.state_dir(None);
            return Self::render(cli, None, state_dir);
        }
        Self::load(cli)
    }

    /// Renders against `state_dir` (a scratch directory for `validate`).
    pub fn render(cli: &Cli, config: Option<Config>, state_dir: PathBuf) -> Result<Resolved> {
        Self::render_caching(cli, config, state_dir, false, Placeholders::InMemory)
    }

    fn render_caching(
        cli: &Cli,
        config: Option<Config>,
        state_dir: PathBuf,
        write_cache: bool,
        placeholders: Placeholders,
    ) -> Result<Resolved> {
        let (targets, renderer) = match &config {
            Some(c) => {
                let renderer = cli.renderer()?.caching_in(&state_dir, write_cache);
                let targets = target::targets(
                    &c.infra,
                    &renderer,
                    &state_dir,
                    target::host_cpus(),
                    placeholders,
                )?;
                (targets, Some(renderer))
            }
            None => (Vec::new(), None),
        };
        Ok(Resolved {
            config,
            targets,
            state_dir,
            renderer,
        })
    }

    /// Keeps the targets' renders in the render cache, for a command that may write it
    /// ([`Resolved::load_for_up`]) once it has converged them.
    pub fn save_render_cache(&self) {
        if let Some(renderer) = &self.renderer {
            renderer.save_cache();
        }
    }

    pub fn names(&self) -> BTreeSet<String> {
        self.targets.iter().map(|t| t.name().to_string()).collect()
    }

    pub fn tune_host(&self) -> bool {
        self.config.as_ref().is_none_or(|c| c.tune_host)
    }

    /// The targets named (all when `proxy` is None); an unknown name is an error listing the
    /// known ones.
    pub fn selected(&self, proxy: Option<&str>) -> Result<Vec<&Target>> {
        match proxy {
            None => Ok(self.targets.iter().collect()),
            Some(name) => {
                let found: Vec<&Target> =
                    self.targets.iter().filter(|t| t.name() == name).collect();
                if found.is_empty() {
                    let known: Vec<&str> = self.targets.iter().map(|t| t.name()).collect();
                    bail!(
                        "no proxy named {name:?} in the config; it has: {}",
                        known.join(", ")
                    );
                }
                Ok(found)
            }
        }
    }

    /// The operations over this host's engine, for this state directory. `create` makes the
    /// state directory when missing (commands that change things); otherwise it is only read.
    pub async fn operations(&self, cli: &Cli, create: bool) -> Result<Operations> {
        let kind = self.config.as_ref().map(|c| c.engine).unwrap_or_default();
        self.operations_on(kind, cli, create).await
    }

    /// The operations for `berth validate`: Envoy checks the rendered config in a throw-away
    /// container on the engine berth talks to, whatever realizes the proxies (a Swarm's own
    /// validation does the same on its manager), so no Swarm is needed to validate.
    pub async fn validation_operations(&self, cli: &Cli) -> Result<Operations> {
        self.operations_on(EngineKind::Docker, cli, true).await
    }

    async fn operations_on(&self, kind: EngineKind, cli: &Cli, create: bool) -> Result<Operations> {
        self.operations_over(kind, cli, create, None).await
    }

    /// [`Resolved::operations`] over an engine connection begun earlier (see
    /// [`crate::engine::DockerEngine::connect`]): `up` connects while it renders.
    pub async fn operations_connected(
        &self,
        cli: &Cli,
        engine: tokio::task::JoinHandle<crate::engine::EngineResult<crate::engine::DockerEngine>>,
        ahead: Option<crate::infra::docker_host::Ahead>,
    ) -> Result<Operations> {
        let kind = self.engine_kind();
        self.operations_over(kind, cli, true, Some((engine, ahead)))
            .await
    }

    /// The engine kind the config names.
    pub fn engine_kind(&self) -> EngineKind {
        self.config.as_ref().map(|c| c.engine).unwrap_or_default()
    }

    /// On a single Docker host: the readiness probes of the replicas the last look saw
    /// running, started now ([`crate::infra::docker_host::Ahead`]); they are
    /// handed to the operations [`Resolved::operations_connected`] makes, with the host
    /// reads the command started.
    pub fn ahead(&self) -> Option<crate::infra::docker_host::Ahead> {
        (self.engine_kind() == EngineKind::Docker).then(|| {
            crate::infra::docker_host::Ahead::start(
                &StateDir::at(&self.state_dir),
                &self.targets,
                std::sync::Arc::new(crate::envoy::admin::SocketConnector),
            )
        })
    }

    async fn operations_over(
        &self,
        kind: EngineKind,
        cli: &Cli,
        create: bool,
        engine: Option<(
            tokio::task::JoinHandle<crate::engine::EngineResult<crate::engine::DockerEngine>>,
            Option<crate::infra::docker_host::Ahead>,
        )>,
    ) -> Result<Operations> {
        let state = if create {
            StateDir::open(&self.state_dir)?
        } else {
            StateDir::at(&self.state_dir)
        };
        let labels = cli.container_labels();
        let swarm = self
            .config
            .as_ref()
            .map(|c| c.swarm.clone())
            .unwrap_or_default();
        let infra = match engine {
            Some((engine, ahead)) => {
                let engine = engine.await.context("connecting to the engine")??;
                crate::infra::connect_with(
                    engine,
                    kind,
                    &swarm,
                    state,
                    labels,
                    Caller::Command,
                    ahead,
                )
                .await?
            }
            None => crate::infra::connect(kind, &swarm, state, labels, Caller::Command).await?,
        };
        Ok(Operations::new(infra))
    }
}

/// The config and the proxies of `--ir` files. With `--ir`, the config file is optional (none
/// named and `berth.toml` absent: an empty config).
pub(super) fn load(cli: &Cli) -> Result<Config> {
    let path = cli.config_path();
    let config = if !cli.ir.is_empty() && cli.file.is_none() && !path.exists() {
        Config::empty(&path)
    } else {
        file::load(&path)?
    };
    let config = with_ir(cli, config)?;
    for note in &config.notes {
        if !cli.quiet {
            eprintln!("note: {note}");
        }
    }
    Ok(config)
}

/// The xDS defaults for IR proxies: `[envoy_gateway]` overridden by the `--xds-*` flags.
fn xds_defaults(cli: &Cli, config: &Config) -> Result<crate::core::source::eg::XdsDefaults> {
    let from_config = config.envoy_gateway.as_ref().map(|g| g.xds.clone());
    let missing = |flag: &str, key: &str| {
        BadInput(format!(
            "--ir needs Envoy Gateway's xDS settings: give {flag} or set {key} in [envoy_gateway] of the config"
        ))
    };
    let address = match (&cli.xds_address, &from_config) {
        (Some(a), _) => {
            file::check_host(a).map_err(|m| BadInput(format!("--xds-address: {m}")))?;
            a.clone()
        }
        (None, Some(x)) => x.address.clone(),
        (None, None) => return Err(missing("--xds-address", "xds_address").into()),
    };
    let port = match (cli.xds_port, &from_config) {
        (Some(0), _) => return Err(BadInput("--xds-port: must be 1–65535".into()).into()),
        (Some(p), _) => p,
        (None, Some(x)) => x.port,
        (None, None) => crate::core::source::eg::DEFAULT_XDS_PORT,
    };
    let pem = |flag: &str,
               key: &str,
               given: &Option<PathBuf>,
               configured: Option<PathBuf>,
               kind: &str| {
        let path = match (given, configured) {
            (Some(p), _) => std::path::absolute(p).unwrap_or_else(|_| p.clone()),
            (None, Some(p)) => return Ok(p),
            (None, None) => return Err(missing(flag, key)),
        };
        file::check_pem(&path, kind).map_err(|m| BadInput(format!("{flag}: {m}")))?;
        Ok(path)
    };
    let configured = |f: fn(&crate::core::source::eg::XdsDefaults) -> &PathBuf| {
        from_config.as_ref().map(|x| f(x).clone())
    };
    Ok(crate::core::source::eg::XdsDefaults {
        address,
        port,
        ca_file: pem(
            "--xds-ca",
            "ca_file",
            &cli.xds_ca,
            configured(|x| &x.ca_file),
            "CERTIFICATE",
        )?,
        cert_file: pem(
            "--xds-cert",
            "cert_file",
            &cli.xds_cert,
            configured(|x| &x.cert_file),
            "CERTIFICATE",
        )?,
        key_file: pem(
            "--xds-key",
            "key_file",
            &cli.xds_key,
            configured(|x| &x.key_file),
            "PRIVATE KEY",
        )?,
    })
}

/// Adds the proxies of the `--ir` files to the config's: names and host ports must not clash.
fn with_ir(cli: &Cli, mut config: Config) -> Result<Config> {
    if cli.ir.is_empty() {
        return Ok(config);
    }
    let xds = xds_defaults(cli, &config)?;
    let mut ports: BTreeMap<u16, String> = BTreeMap::new();
    for p in &config.infra.proxies {
        for port in p.host_ports() {
            ports.insert(port, format!("proxy {}", p.name));
        }
    }
    for path in &cli.ir {
        let shown = path.display();
        let text = file::read_ir_file(path)
            .map_err(|m| BadInput(format!("--ir {shown}: cannot read: {m}")))?;
        let proxies = crate::core::source::eg::parse_ir(&text, &xds)
            .map_err(|e| BadInput(format!("--ir {shown}: {e}")))?;
        for p in proxies {
            if p.is_empty() {
                config.notes.push(format!(
                    "{shown}: Envoy Gateway proxy {:?} has no listeners; skipped (as Envoy Gateway does)",
                    p.eg_name
                ));
                continue;
            }
            let name = &p.proxy.name;
            if config.infra.proxy(name).is_some() {
                return Err(BadInput(format!(
                    "--ir {shown}: Envoy Gateway proxy {:?} becomes berth proxy {name:?}, which the config (or an earlier --ir) already has; proxy names must be unique",
                    p.eg_name
                ))
                .into());
            }
            let mut own = p.proxy.host_ports();
            own.sort_unstable();
            own.dedup();
            for port in own {
                if let Some(by) = ports.get(&port) {
                    return Err(BadInput(format!(
                        "--ir {shown}: Envoy Gateway proxy {:?} listens on port {port}, already used by {by}; each listener on the host needs its own port",
                        p.eg_name
                    ))
                    .into());
                }
                ports.insert(port, format!("proxy {name}"));
            }
            config.infra.proxies.push(p.proxy);
        }
    }
    Ok(config)
}
