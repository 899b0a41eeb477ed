//! The command line: parse arguments, call the library, print. Exit codes: 0 success,
//! 1 runtime failure, 2 bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::layout::DEFAULT_STATE_DIR;
use crate::plan;
use crate::progress::{Mode, Reporter};
use crate::render::Renderer;
use crate::replica::ObservedContainer;
use crate::rollout::Rollout;
use crate::source::file::{self, Config, ConfigErrors};
use crate::state::StateDir;
use crate::target::{self, Target};
use crate::{preflight, status};

mod docs;
mod down_guard;
mod logs;

const ABOUT: &str = "Runs Envoy proxy fleets as Docker containers: N replicas behind one host \
port, rolled one at a time, health-gated, without dropping a request.";

const AFTER_HELP: &str = "Examples:
  berth -f examples/quickstart.toml up       start or converge the fleet, wait until ready
  berth status                                one row per replica
  berth diff --output json                    what `up` would do, as JSON
  berth render quickstart                     print the rendered Envoy files
  berth logs -f edge                          follow the replicas of proxy edge
  berth down                                  drain and remove the config's proxies
  berth completions bash > /etc/bash_completion.d/berth

The config file option -f comes before the command, as with docker compose (after `logs`, -f
means --follow).

Exit codes: 0 success, 1 runtime failure, 2 bad input (config or arguments).";

#[derive(Debug, Parser)]
#[command(name = "berth", version, about = ABOUT, after_help = AFTER_HELP)]
pub struct Cli {
    /// The config file [default: berth.toml]; before the command. `status`, `logs` and `down`
    /// also work without one (from the state directory) unless -f names a file.
    #[arg(short = 'f', long = "file", env = "BERTH_CONFIG")]
    pub file: Option<PathBuf>,

    /// Where rendered files and replica sockets live [default: the config's state_dir, else /var/lib/berth].
    #[arg(long, global = true, env = "BERTH_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// A directory of templates overriding the built-in ones (same file names).
    #[arg(long, global = true, env = "BERTH_TEMPLATES")]
    pub templates: Option<PathBuf>,

    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,

    /// Print only errors.
    #[arg(short = 'q', long, global = true)]
    pub quiet: bool,

    /// An Envoy Gateway infra IR file (JSON or YAML; `egctl x translate --to ir` output, an
    /// `ir.Infra` or a bare ProxyInfra) whose proxies join the config's (repeatable). The config
    /// file is then optional.
    #[arg(long = "ir", global = true, value_name = "FILE")]
    pub ir: Vec<PathBuf>,

    /// Envoy Gateway's xDS server address for IR proxies [default: [envoy_gateway] xds_address].
    #[arg(long, global = true, value_name = "HOST")]
    pub xds_address: Option<String>,

    /// Envoy Gateway's xDS server port [default: [envoy_gateway] xds_port, else 18000].
    #[arg(long, global = true, value_name = "PORT")]
    pub xds_port: Option<u16>,

    /// CA certificate (PEM) the replicas verify the xDS server with [default: [envoy_gateway] ca_file].
    #[arg(long, global = true, value_name = "FILE")]
    pub xds_ca: Option<PathBuf>,

    /// Client certificate (PEM) the replicas present to the xDS server [default: [envoy_gateway] cert_file].
    #[arg(long, global = true, value_name = "FILE")]
    pub xds_cert: Option<PathBuf>,

    /// Client key (PEM) [default: [envoy_gateway] key_file].
    #[arg(long, global = true, value_name = "FILE")]
    pub xds_key: Option<PathBuf>,

    /// Extra label KEY=VALUE put on every container berth creates (the test suite uses it).
    #[arg(long = "container-label", global = true, hide = true, value_parser = parse_label)]
    pub container_labels: Vec<(String, String)>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Converge every proxy in the config and wait until every replica is ready.
    ///
    /// Writes the rendered files into the state directory, pulls images, validates new
    /// configs with `envoy --mode validate`, then creates, starts or replaces replicas one at a
    /// time, each gated on /ready, and drains and removes what is no longer wanted.
    Up {
        /// Start even when the fleet's memory limits exceed the host's memory.
        #[arg(long)]
        force: bool,
    },
    /// Drain and remove the replicas of every proxy (or of PROXY) and their state files.
    ///
    /// Only containers carrying berth's managed-by label are touched. Without a config file
    /// (no -f and no ./berth.toml) and without PROXY, down would remove every proxy of the
    /// state directory: it then says what it would remove and refuses unless --all is given
    /// (on a terminal it asks instead).
    Down {
        /// Only this proxy.
        proxy: Option<String>,
        /// Remove every proxy of the state directory even without a config file.
        #[arg(long, conflicts_with = "proxy")]
        all: bool,
    },
    /// Show the replicas' logs, interleaved and prefixed by replica.
    ///
    /// With --follow, replicas that start later (a rollout's replacements, a restart) join
    /// the stream; stop with Ctrl-C.
    Logs {
        /// Only this proxy, or one replica slot of it (edge/2).
        #[arg(value_name = "PROXY[/SLOT]")]
        target: Option<String>,
        /// Keep printing new lines, following replicas as they are replaced.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only lines since then: a duration back from now (10m, 1h30m), a time
        /// (2025-06-01T12:00:00Z) or Unix seconds.
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// Only the last N lines of each replica ("all" for every line).
        #[arg(short = 'n', long, value_name = "N", default_value = "all")]
        tail: String,
        /// Show the engine's timestamp of each line.
        #[arg(short = 't', long)]
        timestamps: bool,
        /// Print lines without the replica prefix.
        #[arg(long)]
        no_log_prefix: bool,
    },
    /// Print a shell completion script: berth completions bash|zsh|fish|elvish|powershell.
    ///
    /// bash: berth completions bash > /etc/bash_completion.d/berth;
    /// zsh: berth completions zsh > "${fpath[1]}/_berth";
    /// fish: berth completions fish > ~/.config/fish/completions/berth.fish
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print berth's manual page (roff: berth man | man -l -), or one command's.
    Man {
        /// The command whose page to print (berth man up).
        command: Option<String>,
        /// Write berth.1 and every berth-COMMAND.1 into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },

    /// Show one row per replica: state, readiness, image, spec, uptime, connections.
    Status,
    /// Show what `up` would do, without doing it.
    Diff,
    /// Print the rendered Envoy files (bootstrap and watched resources).
    Render {
        /// Only this proxy.
        proxy: Option<String>,
    },
    /// Check the config; when Docker answers, also run `envoy --mode validate` on the
    /// rendered files.
    Validate {
        /// Skip the Envoy check even when Docker answers.
        #[arg(long)]
        no_envoy: bool,
    },
    /// Run as a manager: keep every proxy converged until SIGTERM.
    ///
    /// Watches the config file (a broken edit is reported and ignored), repairs replicas that
    /// die or are removed (Docker events), resyncs periodically, applies route and cluster
    /// changes live with every replica confirming them, and serves /healthz, /status and
    /// /metrics. On SIGTERM or SIGINT the current rollout step finishes and serve exits 0; the
    /// proxies keep running.
    Serve {
        /// Address of the status server (/healthz, /status, /metrics), or "off".
        #[arg(long, default_value = crate::serve::DEFAULT_LISTEN, env = "BERTH_LISTEN")]
        listen: String,
        /// Reconcile every proxy this often even without events ("0" turns it off).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        resync: std::time::Duration,
        /// How long every replica gets to confirm a live route/cluster update.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        confirm_timeout: std::time::Duration,
        /// Do not watch the config file.
        #[arg(long)]
        no_watch: bool,
        /// Do not watch Docker's container events (rely on the resync).
        #[arg(long)]
        no_docker_events: bool,
        /// Serve Envoy Gateway's remote infrastructure provider on this address
        /// ("unix:///path" or "tcp://IP:PORT") [default: [envoy_gateway] remote; "off" disables].
        #[arg(long, value_name = "ADDR")]
        remote: Option<String>,
    },
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    Ok((k.to_string(), v.to_string()))
}

/// Runs berth with the process arguments and returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_tracing(cli.quiet);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => 0,
        Err(e) => {
            if let Some(bad) = e.downcast_ref::<BadInput>() {
                eprintln!("error: {bad}; nothing was changed");
                2
            } else if let Some(errors) = e.downcast_ref::<ConfigErrors>() {
                eprintln!("{errors}");
                eprintln!(
                    "error: {} problem(s) in the config; nothing was changed",
                    errors.0.len()
                );
                2
            } else {
                eprintln!("error: {e:#}");
                1
            }
        }
    }
}

fn init_tracing(quiet: bool) {
    let default = if quiet { "error" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs one command.
pub async fn run(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::Render { proxy } => render(&cli, proxy.as_deref()),
        Command::Validate { no_envoy } => validate(&cli, *no_envoy).await,
        Command::Diff => diff(&cli).await,
        Command::Up { force } => up(&cli, *force).await,
        Command::Down { proxy, all } => down(&cli, proxy.as_deref(), *all).await,
        Command::Logs { .. } => logs::command(&cli).await,
        Command::Completions { shell } => {
            docs::completions(*shell, &mut std::io::stdout());
            Ok(())
        }
        Command::Man { command, dir } => {
            docs::man(command.as_deref(), dir.as_deref(), &mut std::io::stdout())
        }
        Command::Status => show_status(&cli).await,
        Command::Serve { .. } => serve(&cli).await,
    }
}

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
    fn sources(&self) -> String {
        let path = self.config_path();
        let mut parts = Vec::new();
        if self.ir.is_empty() || self.file.is_some() || path.exists() {
            parts.push(path.display().to_string());
        }
        parts.extend(self.ir.iter().map(|p| format!("--ir {}", p.display())));
        parts.join(" + ")
    }
}

/// Bad input that is not in the config file (an `--ir` file, an `--xds-*` flag): exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// The config and the proxies of `--ir` files. With `--ir`, the config file is optional (none
/// named and `berth.toml` absent: an empty config).
fn load(cli: &Cli) -> Result<Config> {
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

/// The config for commands that also work from the state directory alone (`status`, `down`):
/// none when no file was named, `berth.toml` is absent and no `--ir` is given; a named file
/// must exist, and a config with errors is refused (exit 2) rather than ignored.
fn load_optional(cli: &Cli) -> Result<Option<Config>> {
    let path = cli.config_path();
    if cli.file.is_none() && !path.exists() && cli.ir.is_empty() {
        tracing::debug!("no config at {}", path.display());
        return Ok(None);
    }
    load(cli).map(Some)
}

/// The xDS defaults for IR proxies: `[envoy_gateway]` overridden by the `--xds-*` flags.
fn xds_defaults(cli: &Cli, config: &Config) -> Result<crate::source::eg::XdsDefaults> {
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
        (None, None) => crate::source::eg::DEFAULT_XDS_PORT,
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
    let configured = |f: fn(&crate::source::eg::XdsDefaults) -> &PathBuf| {
        from_config.as_ref().map(|x| f(x).clone())
    };
    Ok(crate::source::eg::XdsDefaults {
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
        let proxies = crate::source::eg::parse_ir(&text, &xds)
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

fn renderer(cli: &Cli) -> Result<Renderer> {
    match &cli.templates {
        Some(dir) => Renderer::with_overrides(dir),
        None => Ok(Renderer::builtin()),
    }
}

/// The state directory, absolute: it is a bind-mount source and a container label.
fn state_dir(cli: &Cli, config: Option<&Config>) -> PathBuf {
    let dir = cli
        .state_dir
        .clone()
        .or_else(|| config.and_then(|c| c.state_dir.clone()))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    std::path::absolute(&dir).unwrap_or(dir)
}

fn reporter(cli: &Cli) -> Reporter {
    Reporter::new(match (cli.quiet, cli.output) {
        (true, _) => Mode::Quiet,
        (false, Output::Json) => Mode::Json,
        (false, Output::Table) => Mode::Human,
    })
}

fn selected<'a>(targets: &'a [Target], proxy: Option<&str>) -> Result<Vec<&'a Target>> {
    match proxy {
        None => Ok(targets.iter().collect()),
        Some(name) => {
            let found: Vec<&Target> = targets.iter().filter(|t| t.name() == name).collect();
            if found.is_empty() {
                let known: Vec<&str> = targets.iter().map(|t| t.name()).collect();
                bail!(
                    "no proxy named {name:?} in the config; it has: {}",
                    known.join(", ")
                );
            }
            Ok(found)
        }
    }
}

fn render(cli: &Cli, proxy: Option<&str>) -> Result<()> {
    let config = load(cli)?;
    let targets = target::targets(
        &config.infra,
        &renderer(cli)?,
        &state_dir(cli, Some(&config)),
        target::host_cpus(),
    )?;
    let targets = selected(&targets, proxy)?;
    if cli.output == Output::Json {
        let files: BTreeMap<&str, BTreeMap<String, &str>> = targets
            .iter()
            .map(|t| {
                let mut files: BTreeMap<String, &str> = t
                    .rendered
                    .xds
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str()))
                    .collect();
                files.insert(crate::layout::BOOTSTRAP_FILE.into(), &t.rendered.bootstrap);
                (t.name(), files)
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&files)?);
        return Ok(());
    }
    for t in targets {
        println!("# proxy {} — {}", t.name(), crate::layout::BOOTSTRAP_FILE);
        println!("{}", t.rendered.bootstrap.trim_end());
        for (name, content) in &t.rendered.xds {
            println!("\n# proxy {} — {name}", t.name());
            println!("{}", content.trim_end());
        }
        println!();
    }
    Ok(())
}

async fn validate(cli: &Cli, no_envoy: bool) -> Result<()> {
    let config = load(cli)?;
    // Render against a scratch state directory: validation must not touch the real one.
    let scratch = tempfile::Builder::new()
        .prefix("berth-validate-")
        .tempdir()?;
    let targets = target::targets(
        &config.infra,
        &renderer(cli)?,
        scratch.path(),
        target::host_cpus(),
    )?;
    let proxies = targets.len();
    if no_envoy {
        println!("{}: config is valid ({proxies} proxies)", cli.sources());
        return Ok(());
    }
    let engine = match Engine::connect().await {
        Ok(engine) => engine,
        Err(e) => {
            println!(
                "{}: config is valid ({proxies} proxies); Envoy check skipped: {e:#}",
                cli.sources()
            );
            return Ok(());
        }
    };
    let state = StateDir::open(scratch.path())?;
    let reporter = reporter(cli);
    let rollout = Rollout {
        engine: &engine,
        state: &state,
        reporter: &reporter,
        extra_labels: container_labels(cli),
        cancel: CancellationToken::new(),
    };
    for target in &targets {
        engine
            .ensure_image(&target.desired.spec.image, reporter.shows_progress())
            .await?;
        rollout.validate_target(target).await?;
    }
    drop(reporter);
    println!(
        "{}: config is valid and Envoy accepts it ({proxies} proxies)",
        cli.sources()
    );
    Ok(())
}

fn container_labels(cli: &Cli) -> BTreeMap<String, String> {
    cli.container_labels.iter().cloned().collect()
}

/// The containers this berth (this state directory) is responsible for: those of proxies in
/// the config or with state on disk. Other berth containers on the host are left alone, and
/// not even inspected.
async fn owned(
    engine: &Engine,
    config_proxies: &BTreeSet<String>,
    state: &StateDir,
) -> Result<Vec<ObservedContainer>> {
    let mut known = config_proxies.clone();
    known.extend(state.proxies()?);
    engine.observe_proxies(&known, state.root()).await
}

async fn diff(cli: &Cli) -> Result<()> {
    let config = load(cli)?;
    let state_path = state_dir(cli, Some(&config));
    let targets = target::targets(
        &config.infra,
        &renderer(cli)?,
        &state_path,
        target::host_cpus(),
    )?;
    let engine = Engine::connect().await?;
    let state = StateDir::at(&state_path);
    let names: BTreeSet<String> = targets.iter().map(|t| t.name().to_string()).collect();
    let observed = owned(&engine, &names, &state).await?;
    let desired: Vec<_> = targets.iter().map(|t| t.desired.clone()).collect();
    let plan = plan::plan(&desired, &observed);
    if cli.output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "summary": plan.summary(),
                "actions": plan.actions,
            }))?
        );
        return Ok(());
    }
    if plan.is_empty() {
        println!("No changes. {} proxies are up to date.", targets.len());
        return Ok(());
    }
    println!("berth will perform these actions:\n");
    for action in &plan.actions {
        println!("  {action}");
    }
    let s = plan.summary();
    println!(
        "\nPlan: {} to create, {} to start, {} to replace, {} to remove.",
        s.create, s.start, s.replace, s.remove
    );
    Ok(())
}

async fn up(cli: &Cli, force: bool) -> Result<()> {
    let config = load(cli)?;
    let state_path = state_dir(cli, Some(&config));
    let targets = target::targets(
        &config.infra,
        &renderer(cli)?,
        &state_path,
        target::host_cpus(),
    )?;
    preflight::check_memory(&config.infra, force)?;
    let engine = Engine::connect().await?;
    let state = StateDir::open(&state_path)?;
    let names: BTreeSet<String> = targets.iter().map(|t| t.name().to_string()).collect();
    let observed = owned(&engine, &names, &state).await?;
    let replica_pids: BTreeSet<u32> = observed.iter().filter_map(|c| c.info.pid).collect();
    preflight::check_ports(&config.infra, &replica_pids)?;
    if let crate::host::MigrateReq::Off(warning) =
        crate::host::ensure_tcp_migrate_req(config.tune_host)
    {
        tracing::warn!("{warning}");
    }
    let lowest_port = config
        .infra
        .proxies
        .iter()
        .flat_map(|p| p.host_ports())
        .min();
    let port_start = crate::host::ensure_unprivileged_port_start(lowest_port, config.tune_host)?;
    let reporter = reporter(cli);
    if let crate::host::PortStart::Lowered { from, to } = port_start {
        reporter.event(crate::progress::Event::new("berth", "host").message(format!(
            "net.ipv4.ip_unprivileged_port_start lowered from {from} to {to} so non-root replicas can bind port {to}"
        )));
    }
    let rollout = Rollout {
        engine: &engine,
        state: &state,
        reporter: &reporter,
        extra_labels: container_labels(cli),
        cancel: CancellationToken::new(),
    };
    rollout.converge(&targets, &observed).await?;
    if cli.output == Output::Json {
        // Counted before anything else is asked of the engine: the cost of this reconcile.
        reporter.event(
            crate::progress::Event::new("berth", "summary")
                .message(format!("{} docker api requests", engine.api_calls())),
        );
    }
    drop(reporter);
    if cli.output == Output::Table && !cli.quiet {
        let rows = status::collect(&state, &owned(&engine, &names, &state).await?).await;
        println!("{}", status::table(&rows));
    }
    Ok(())
}

/// What `down` and `status` look at: the config (optional for them), the state directory
/// and the containers this berth owns.
struct Scope {
    config: Option<Config>,
    state_path: PathBuf,
    state: StateDir,
    engine: Engine,
    names: BTreeSet<String>,
    observed: Vec<ObservedContainer>,
}

async fn scope(cli: &Cli) -> Result<Scope> {
    let config = load_optional(cli)?;
    let state_path = state_dir(cli, config.as_ref());
    let state = StateDir::at(&state_path);
    let engine = Engine::connect().await?;
    let names: BTreeSet<String> = config
        .iter()
        .flat_map(|c| c.infra.proxies.iter().map(|p| p.name.clone()))
        .collect();
    let observed = owned(&engine, &names, &state).await?;
    Ok(Scope {
        config,
        state_path,
        state,
        engine,
        names,
        observed,
    })
}

async fn down(cli: &Cli, proxy: Option<&str>, all: bool) -> Result<()> {
    let Scope {
        config,
        state_path,
        state,
        engine,
        names,
        observed,
    } = scope(cli).await?;
    let mut proxies: BTreeSet<String> = names.clone();
    proxies.extend(state.proxies()?);
    proxies.extend(
        observed
            .iter()
            .filter_map(|c| c.proxy().map(str::to_string)),
    );
    if let Some(p) = proxy {
        if !proxies.contains(p) {
            bail!(
                "no proxy named {p:?} is known here (config {}, state {})",
                cli.config_path().display(),
                state_path.display()
            );
        }
        proxies = BTreeSet::from([p.to_string()]);
    }
    let removal: down_guard::Removal = proxies
        .iter()
        .map(|p| {
            let n = observed
                .iter()
                .filter(|c| c.proxy() == Some(p.as_str()))
                .count();
            (p.clone(), n)
        })
        .collect();
    let ask = down_guard::Ask {
        has_config: config.is_some(),
        proxy_named: proxy.is_some(),
        all,
        interactive: std::io::stdin().is_terminal() && std::io::stderr().is_terminal(),
        state_dir: &state_path,
    };
    match down_guard::decide(ask, &removal) {
        down_guard::Decision::Proceed => {}
        down_guard::Decision::Refuse(why) => return Err(BadInput(why).into()),
        down_guard::Decision::Ask(question) => {
            if !down_guard::confirm(
                &question,
                &mut std::io::stdin().lock(),
                &mut std::io::stderr(),
            ) {
                return Err(BadInput("not confirmed".into()).into());
            }
        }
    }
    let reporter = reporter(cli);
    let rollout = Rollout {
        engine: &engine,
        state: &state,
        reporter: &reporter,
        extra_labels: container_labels(cli),
        cancel: CancellationToken::new(),
    };
    let mut removed = 0;
    for name in &proxies {
        let ir = config.as_ref().and_then(|c| c.infra.proxy(name));
        let shutdown = ir.map(|p| p.config.shutdown.clone()).unwrap_or_default();
        let policy = ir.map(|p| p.rollout.clone()).unwrap_or_default();
        // The whole proxy goes away: drain its replicas at once, not one after the other.
        let retirements = observed
            .iter()
            .filter(|c| c.proxy() == Some(name.as_str()))
            .map(|c| {
                let (rollout, observed, shutdown, policy) =
                    (&rollout, &observed, &shutdown, &policy);
                async move {
                    let container = plan::ContainerRef {
                        id: c.id.clone(),
                        name: c.name.clone(),
                    };
                    rollout
                        .retire(name, &container, observed, shutdown, policy)
                        .await
                        .with_context(|| format!("removing {}", c.name))
                }
            });
        let results = futures_util::future::join_all(retirements).await;
        removed += results.iter().filter(|r| r.is_ok()).count();
        if let Some(err) = results.into_iter().find_map(Result::err) {
            return Err(err);
        }
        if state_path.exists() {
            state.remove_proxy(name)?;
        }
    }
    drop(reporter);
    if !cli.quiet && cli.output == Output::Table {
        println!(
            "removed {removed} replica(s) of {} proxy(ies)",
            proxies.len()
        );
    }
    Ok(())
}

async fn show_status(cli: &Cli) -> Result<()> {
    let Scope {
        state_path,
        state,
        observed,
        ..
    } = scope(cli).await?;
    let rows = status::collect(&state, &observed).await;
    // What `berth serve` recorded (generations, conditions, last rollout), when it runs here.
    let record = crate::status::record::read(&state);
    if cli.output == Output::Json {
        let proxies = record.map(|r| r.proxies).unwrap_or_default();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "replicas": rows,
                "proxies": proxies,
            }))?
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!(
            "no replicas (config {}, state {})",
            cli.config_path().display(),
            state_path.display()
        );
    } else {
        println!("{}", status::table(&rows));
    }
    if let Some(record) = record.filter(|r| !r.proxies.is_empty()) {
        println!("\n{}", status::proxies_table(&record));
    }
    Ok(())
}

async fn serve(cli: &Cli) -> Result<()> {
    let Command::Serve {
        listen,
        resync,
        confirm_timeout,
        no_watch,
        no_docker_events,
        remote,
    } = &cli.command
    else {
        unreachable!("serve is only called for the serve command")
    };
    if !cli.ir.is_empty() {
        return Err(BadInput(
            "serve does not take --ir: list IR files in [envoy_gateway] ir_files of the config (re-read with it), or enable [envoy_gateway] remote".into(),
        )
        .into());
    }
    let listen = match listen.as_str() {
        "off" | "none" | "" => None,
        addr => Some(
            addr.parse()
                .with_context(|| format!("--listen {addr:?}: expected HOST:PORT or \"off\""))?,
        ),
    };
    crate::serve::run(crate::serve::Options {
        config: cli.config_path(),
        state_dir: cli.state_dir.clone(),
        templates: cli.templates.clone(),
        extra_labels: container_labels(cli),
        mode: match (cli.quiet, cli.output) {
            (true, _) => Mode::Quiet,
            (false, Output::Json) => Mode::Json,
            (false, Output::Table) => Mode::Human,
        },
        listen,
        resync: (!resync.is_zero()).then_some(*resync),
        watch: !no_watch,
        docker_events: !no_docker_events,
        confirm_timeout: *confirm_timeout,
        remote: match remote.as_deref() {
            None => crate::serve::RemoteFlag::FromConfig,
            Some("off") => crate::serve::RemoteFlag::Off,
            Some(addr) => crate::serve::RemoteFlag::At(
                crate::eg_provider::Listen::parse(addr, &std::env::current_dir()?)
                    .map_err(|m| BadInput(format!("--remote: {m}")))?,
            ),
        },
    })
    .await
}
