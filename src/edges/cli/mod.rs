//! The command line: parse arguments ([`Cli`]), resolve settings once (`settings`), call the
//! operations (`commands`), print. Exit codes: 0 success, 1 runtime failure, 2 bad input.

pub mod agent;
mod commands;
mod docs;
mod down_guard;
pub mod log_lines;
mod logs;
mod rollout;
mod settings;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

pub use settings::DEFAULT_CONFIG;

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
  berth version --output json                 version, git commit, Envoy Gateway release
  berth agent health                          (inside an agent image) the replica's HEALTHCHECK

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

    /// Where rendered files and replica sockets live [default: the config's state_dir, else
    /// /var/lib/berth as root, $XDG_STATE_HOME/berth (~/.local/state/berth) otherwise].
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
    /// time, each gated on /ready, and drains and removes what is no longer wanted. Then
    /// obtains each ACME listener certificate that is missing or past two thirds of its
    /// lifetime, answering the CA's challenge through the proxy.
    ///
    /// One writer per state directory: when `berth serve` manages it, serve runs the request
    /// (one pass of every proxy) and up prints its events and ends with its verdict and exit
    /// code; when another up or down runs, up waits for it, naming its pid.
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
    /// (on a terminal it asks instead). While another berth changes the state directory
    /// (`berth serve` for its whole life), down waits for it, naming its pid.
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

    /// Print berth's version, the git commit it was built from and the Envoy Gateway
    /// release whose behaviour it follows (with that release's default Envoy image).
    Version,

    /// Show one row per replica: state, readiness, image, spec, uptime, connections; then the
    /// listener certificates the replicas serve: SNI names, names, serial, expiry, days left.
    Status,
    /// What is rolling, and steering it: status, pause, resume, promote (end a canary's hold),
    /// undo (back to the previous spec, held until the config changes). Works on a rollout run
    /// by a foreground `berth up` or by serve alike, through the state directory.
    Rollout {
        #[command(subcommand)]
        verb: rollout::Verb,
    },
    /// Show what `up` would do, without doing it.
    ///
    /// Images whose proxy has `pull = "always"` are pulled first, as `up` would (a pull
    /// changes no replica): a tag that now names another image shows as replacements and a
    /// note, old image ID -> new.
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
    /// changes live with every replica confirming them, renews ACME listener certificates when
    /// due, and serves /healthz, /status and /metrics. On SIGTERM or SIGINT the current rollout step finishes and serve exits 0; the
    /// proxies keep running.
    ///
    /// serve holds the state directory's lock (berth.lock) for its life and answers `berth up`
    /// on a local socket (serve.sock); it refuses to start while another serve holds it, and
    /// waits for a running up or down.
    Serve {
        /// Address of the status server (/healthz, /status, /metrics), or "off"
        /// [default: [serve] listen, else 127.0.0.1:9477].
        #[arg(long, env = "BERTH_LISTEN", value_parser = parse_listen)]
        listen: Option<ListenFlag>,
        /// Reconcile every proxy this often even without events ("0" turns it off); images
        /// with `pull = "always"` are pulled this often too [default: [serve] resync, else 30s].
        #[arg(long, value_parser = humantime::parse_duration)]
        resync: Option<std::time::Duration>,
        /// How long every replica gets to confirm a live route/cluster update
        /// [default: [serve] confirm_timeout, else 5s].
        #[arg(long, value_parser = humantime::parse_duration)]
        confirm_timeout: Option<std::time::Duration>,
        /// Do not watch the config file and the files it names.
        #[arg(long)]
        no_watch: bool,
        /// Do not watch the engine's container events (rely on the resync).
        #[arg(long, alias = "no-docker-events")]
        no_engine_events: bool,
        /// Do not watch the replicas' liveness (a replica that stops answering while it holds
        /// its port is then never killed; e.g. while debugging an Envoy under a debugger).
        #[arg(long)]
        no_liveness: bool,
        /// Serve Envoy Gateway's remote infrastructure provider on this address
        /// ("unix:///path" or "tcp://IP:PORT") [default: [envoy_gateway] remote; "off" disables].
        #[arg(long, value_name = "ADDR")]
        remote: Option<String>,
    },
    /// The proxy agent: a replica's entrypoint where berth does not drain replicas itself
    /// (Docker Swarm). Runs inside the container, from the derived image berth builds (the Envoy
    /// image plus a static berth at /usr/local/bin/berth-agent).
    ///
    /// `berth agent run -- ENVOY…` starts Envoy as its child, drains it on SIGTERM, and kills
    /// it when it hangs (stopped, or silent for 2 s while it uses no CPU);
    /// `berth agent health` is the image's HEALTHCHECK. Both read their settings from
    /// BERTH_AGENT_* variables (the service sets them), flags overriding.
    Agent {
        #[command(subcommand)]
        command: agent::AgentCommand,
    },
}

/// `--listen`: an address, or "off".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenFlag(pub Option<std::net::SocketAddr>);

fn parse_listen(s: &str) -> Result<ListenFlag, String> {
    crate::core::source::file::parse_listen(s).map(ListenFlag)
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
    commands::phase("arguments parsed");
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let code = if let Command::Agent { command } = &cli.command {
        // The agent's exit codes are its own (Envoy's status, the health verdict).
        runtime.block_on(agent::command(command))
    } else {
        match runtime.block_on(run(cli)) {
            Ok(()) => 0,
            Err(e) => {
                let (code, text) = crate::edges::exit::report(&e);
                eprintln!("{text}");
                code
            }
        }
    };
    // The command is done: probes it no longer needs and idle blocking threads are not waited
    // for (the process exits next).
    runtime.shutdown_background();
    code
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
        Command::Render { proxy } => commands::render(&cli, proxy.as_deref()),
        Command::Validate { no_envoy } => commands::validate(&cli, *no_envoy).await,
        Command::Diff => commands::diff(&cli).await,
        Command::Up { force } => commands::up(&cli, *force).await,
        Command::Down { proxy, all } => commands::down(&cli, proxy.as_deref(), *all).await,
        Command::Logs { .. } => logs::command(&cli).await,
        Command::Completions { shell } => {
            docs::completions(*shell, &mut std::io::stdout());
            Ok(())
        }
        Command::Man { command, dir } => {
            docs::man(command.as_deref(), dir.as_deref(), &mut std::io::stdout())
        }
        Command::Version => docs::version(cli.output, &mut std::io::stdout()),
        Command::Status => commands::status(&cli).await,
        Command::Rollout { verb } => rollout::command(&cli, verb).await,
        Command::Serve { .. } => commands::serve(&cli).await,
        Command::Agent { command } => match agent::command(command).await {
            0 => Ok(()),
            code => Err(crate::edges::exit::Relayed {
                code,
                text: format!("error: berth agent exited {code}"),
            }
            .into()),
        },
    }
}

pub use crate::edges::exit::BadInput;
