//! One function per command: resolve, call the operations, print.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context, Result};

use super::settings::Resolved;
use super::{BadInput, Cli, Command, Output};
use crate::core::progress::Event;
use crate::edges::control::{self, ApplyRequest, Verb, Writer};
use crate::ops::HostPolicy;
use crate::state::lock::{Holder, Role};
use crate::status;

pub(super) fn render(cli: &Cli, proxy: Option<&str>) -> Result<()> {
    let resolved = Resolved::load(cli)?;
    let targets = resolved.selected(proxy)?;
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
                files.insert(
                    crate::core::layout::BOOTSTRAP_FILE.into(),
                    &t.rendered.bootstrap,
                );
                (t.name(), files)
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&files)?);
        return Ok(());
    }
    for t in targets {
        println!(
            "# proxy {} — {}",
            t.name(),
            crate::core::layout::BOOTSTRAP_FILE
        );
        println!("{}", t.rendered.bootstrap.trim_end());
        for (name, content) in &t.rendered.xds {
            println!("\n# proxy {} — {name}", t.name());
            println!("{}", content.trim_end());
        }
        println!();
    }
    Ok(())
}

pub(super) async fn validate(cli: &Cli, no_envoy: bool) -> Result<()> {
    let config = super::settings::load(cli)?;
    // Render against a scratch state directory: validation must not touch the real one.
    let scratch = tempfile::Builder::new()
        .prefix("berth-validate-")
        .tempdir()?;
    let resolved = Resolved::render(cli, Some(config), scratch.path().to_path_buf())?;
    let proxies = resolved.targets.len();
    if no_envoy {
        println!("{}: config is valid ({proxies} proxies)", cli.sources());
        return Ok(());
    }
    let ops = match resolved.validation_operations(cli).await {
        Ok(ops) => ops,
        Err(e) => {
            // An engine that does not answer is a reason to skip the Envoy check, said so;
            // anything else is an error.
            if !e
                .downcast_ref::<crate::engine::EngineError>()
                .is_some_and(|e| matches!(e, crate::engine::EngineError::Unreachable { .. }))
            {
                return Err(e);
            }
            println!(
                "{}: config is valid ({proxies} proxies); Envoy check skipped: {e:#}",
                cli.sources()
            );
            return Ok(());
        }
    };
    let reporter = cli.reporter();
    ops.validate(&resolved.targets, &reporter).await?;
    drop(reporter);
    println!(
        "{}: config is valid and Envoy accepts it ({proxies} proxies)",
        cli.sources()
    );
    Ok(())
}

pub(super) async fn diff(cli: &Cli) -> Result<()> {
    let resolved = Resolved::load(cli)?;
    let ops = resolved.operations(cli, false).await?;
    let plan = {
        // Pull progress goes to stderr; JSON output stays one document.
        let reporter = if cli.output == Output::Json {
            crate::core::progress::Reporter::quiet()
        } else {
            cli.reporter()
        };
        ops.diff(&resolved.targets, &reporter).await?
    };
    if cli.output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "summary": plan.summary(),
                "actions": plan.actions,
                "live": plan.live,
                "notes": plan.notes,
            }))?
        );
        return Ok(());
    }
    if plan.changes_nothing() {
        println!(
            "No changes. {} proxies are up to date.",
            resolved.targets.len()
        );
        return Ok(());
    }
    println!("berth will perform these actions:\n");
    for action in &plan.actions {
        println!("  {action}");
    }
    for update in &plan.live {
        println!("  {update}");
    }
    for note in &plan.notes {
        println!("  {note}");
    }
    println!("\n{}", plan.summary_line());
    Ok(())
}

/// Marks a step of a command at debug level (`BERTH_LOG=berth::phase=debug`): the log's
/// timestamps show where a command spends its time.
pub(super) fn phase(what: &str) {
    tracing::debug!(target: "berth::phase", "{what}");
}

/// Takes the state directory for `role` (see [`crate::state::lock`]); with `delegate`, a serve that
/// holds it is returned instead. Waiting is said once, on stderr, naming the holder.
async fn writer(cli: &Cli, resolved: &Resolved, role: Role, delegate: bool) -> Result<Writer> {
    let root = &resolved.state_dir;
    control::writer(root, role, delegate, |holder| {
        if !cli.quiet {
            eprintln!("{}", control::waiting_message(root, holder));
        }
    })
    .await
}

pub(super) async fn up(cli: &Cli, force: bool) -> Result<()> {
    // The engine's version answer (the API version to speak) is awaited while the config
    // renders: it is the first of a no-op's few engine requests.
    let engine = tokio::spawn(crate::engine::DockerEngine::connect());
    // The host's preparation reads /proc (every process's status) and the sysctls: started
    // now, used if the command gets there within a second.
    let host_reads = crate::infra::docker_host::HostReads::start();
    let resolved = Resolved::load_for_up(cli)?;
    phase("config rendered");
    // Held until up returns: nothing else changes the state directory meanwhile.
    let _lock = match writer(cli, &resolved, Role::Up, true).await? {
        Writer::Locked(lock) => lock,
        Writer::Serve { holder, client } => {
            return up_through_serve(cli, &resolved, force, &holder, &client).await
        }
    };
    phase("state directory locked");
    let resolved = resolved.with_placeholders_written(cli)?;
    // The replicas the last look saw running are probed while the engine answers; their
    // answers count only for containers the engine says are unchanged since.
    let ahead = resolved.ahead().map(|a| a.with_host_reads(host_reads));
    let ops = resolved.operations_connected(cli, engine, ahead).await?;
    phase("engine connected");
    let reporter = cli.reporter();
    let policy = HostPolicy {
        tune: resolved.tune_host(),
        force_memory: force,
    };
    let report = ops
        .up(
            &resolved.targets,
            policy,
            crate::infra::delivery::DEFAULT_CONFIRM_TIMEOUT,
            &reporter,
        )
        .await?;
    phase("converged");
    resolved.save_render_cache();
    // ACME listeners: a missing, mismatched or two-thirds-old certificate is obtained now,
    // through the proxy just converged (it answers the challenge), and delivered like any
    // certificate change. A failure leaves the served certificate as it was.
    let acme: Vec<crate::core::ir::ProxyInfra> = resolved
        .targets
        .iter()
        .filter(|t| !crate::ops::acme::listeners(&t.proxy).is_empty())
        .map(|t| t.proxy.clone())
        .collect();
    let acme_failed: Vec<String> = if acme.is_empty() {
        Vec::new()
    } else {
        let renderer = cli.renderer()?;
        crate::ops::acme::renew_due(
            &crate::ops::acme::Converger {
                ops: &ops,
                renderer: &renderer,
                state_dir: &resolved.state_dir,
                host_cpus: crate::core::target::host_cpus(),
                confirm_timeout: crate::infra::delivery::DEFAULT_CONFIRM_TIMEOUT,
                reporter: &reporter,
            },
            &acme,
            false,
        )
        .await
        .into_iter()
        .filter_map(|r| r.result.err())
        .collect()
    };
    for (_, warning) in &report.host.degraded {
        if !cli.quiet {
            eprintln!("warning: {warning}");
        }
    }
    let failed: Vec<String> = report
        .converged
        .iter()
        .filter_map(|(_, c)| c.delivery.failed().map(|r| r.to_string()))
        .chain(acme_failed)
        .collect();
    if cli.output == Output::Json {
        // Counted before anything else is asked of the engine: the cost of this reconcile.
        reporter.event(
            Event::new("berth", "summary")
                .message(format!("{} docker api requests", ops.infra.api_calls())),
        );
    }
    drop(reporter);
    if !failed.is_empty() {
        bail!("{}", failed.join("\n"));
    }
    // xDS mode's first install may end before Envoy Gateway has pushed any listener: said,
    // not failed (see the gate).
    let xds: BTreeSet<&str> = resolved
        .targets
        .iter()
        .filter(|t| t.desired.xds)
        .map(|t| t.name())
        .collect();
    let (waiting, not_ready): (Vec<_>, Vec<_>) = report
        .converged
        .iter()
        .filter(|(_, c)| !c.readiness.all_ready())
        .map(|(name, c)| (name, format!("proxy {name}: {}", c.readiness)))
        .partition(|(name, _)| xds.contains(name.as_str()));
    for (_, line) in &waiting {
        eprintln!("note: {line} (xDS mode: waiting for Envoy Gateway's listeners)");
    }
    let not_ready: Vec<String> = not_ready.into_iter().map(|(_, l)| l).collect();
    if cli.output == Output::Table && !cli.quiet {
        let rows = ops.status(&resolved.names()).await?;
        println!("{}", status::table(&rows));
    }
    if !not_ready.is_empty() {
        bail!("not every replica is ready:\n{}", not_ready.join("\n"));
    }
    Ok(())
}

/// `up` handed to the serve that holds the state directory: serve runs one pass of every
/// proxy and streams its events; they are printed as `up` prints its own, and serve's verdict
/// is up's (same text, same exit code).
async fn up_through_serve(
    cli: &Cli,
    resolved: &Resolved,
    force: bool,
    holder: &Holder,
    client: &control::Client,
) -> Result<()> {
    let root = resolved.state_dir.display();
    if !cli.ir.is_empty() {
        return Err(BadInput(format!(
            "{holder} manages the state directory {root} from its config and does not take              --ir: list the IR files in [envoy_gateway] ir_files of that config, or stop serve"
        ))
        .into());
    }
    if !cli.quiet {
        eprintln!("{holder} manages the state directory {root}: it runs this up");
    }
    let config = cli.config_path();
    let request = ApplyRequest {
        verb: Verb::Up,
        config: std::path::absolute(&config).unwrap_or(config),
        force,
        labels: cli.container_labels(),
    };
    let reporter = cli.reporter();
    let outcome = client.apply(&request, |e| reporter.event(e)).await?;
    for line in &outcome.notes {
        if !(cli.quiet && line.starts_with("warning:")) {
            eprintln!("{line}");
        }
    }
    if let (Output::Json, Some(n)) = (cli.output, outcome.api_requests) {
        reporter.event(Event::new("berth", "summary").message(format!("{n} docker api requests")));
    }
    drop(reporter);
    if outcome.exit_code != 0 {
        return Err(crate::edges::exit::Relayed {
            code: outcome.exit_code,
            text: outcome.error.unwrap_or_default(),
        }
        .into());
    }
    if cli.output == Output::Table && !cli.quiet {
        let ops = resolved.operations(cli, false).await?;
        let rows = ops.status(&resolved.names()).await?;
        println!("{}", status::table(&rows));
    }
    Ok(())
}

pub(super) async fn down(cli: &Cli, proxy: Option<&str>, all: bool) -> Result<()> {
    use std::io::IsTerminal;
    let resolved = Resolved::load_optional(cli)?;
    // serve would start the config's proxies again: down waits for it to stop instead.
    let _lock = match writer(cli, &resolved, Role::Down, false).await? {
        Writer::Locked(lock) => lock,
        Writer::Serve { .. } => unreachable!("down never hands its request over"),
    };
    // Without a config the engine kind is unknown: the Docker host, and the Swarm when its
    // engine manages one.
    let mut all_ops = vec![resolved.operations(cli, false).await?];
    if resolved.config.is_none() {
        if let Some(swarm) = crate::infra::swarm_if_manager(
            crate::state::StateDir::at(&resolved.state_dir),
            cli.container_labels(),
        )
        .await?
        {
            all_ops.push(crate::ops::Operations::new(swarm));
        }
    }
    let mut proxies: BTreeSet<String> = resolved.names();
    let mut owners: Vec<BTreeSet<String>> = Vec::new();
    for ops in &all_ops {
        let owned = ops.owned().await?;
        proxies.extend(owned.iter().cloned());
        owners.push(owned);
    }
    if let Some(p) = proxy {
        if !proxies.contains(p) {
            bail!(
                "no proxy named {p:?} is known here (config {}, state {})",
                cli.config_path().display(),
                resolved.state_dir.display()
            );
        }
        proxies = BTreeSet::from([p.to_string()]);
    }
    let mut rows = Vec::new();
    for ops in &all_ops {
        rows.extend(ops.status(&proxies).await?);
    }
    let removal: super::down_guard::Removal = proxies
        .iter()
        .map(|p| (p.clone(), rows.iter().filter(|r| &r.proxy == p).count()))
        .collect();
    let ask = super::down_guard::Ask {
        has_config: resolved.config.is_some(),
        proxy_named: proxy.is_some(),
        all,
        interactive: std::io::stdin().is_terminal() && std::io::stderr().is_terminal(),
        state_dir: &resolved.state_dir,
    };
    match super::down_guard::decide(ask, &removal) {
        super::down_guard::Decision::Proceed => {}
        super::down_guard::Decision::Refuse(why) => return Err(BadInput(why).into()),
        super::down_guard::Decision::Ask(question) => {
            if !super::down_guard::confirm(
                &question,
                &mut std::io::stdin().lock(),
                &mut std::io::stderr(),
            ) {
                return Err(BadInput("not confirmed".into()).into());
            }
        }
    }
    let reporter = cli.reporter();
    let mut removed = 0;
    for name in &proxies {
        for (i, ops) in all_ops.iter().enumerate() {
            // The config's own infrastructure always; another only for what it owns.
            if i > 0 && !owners[i].contains(name) {
                continue;
            }
            removed += ops
                .remove(name, &reporter)
                .await
                .with_context(|| format!("removing proxy {name}"))?;
        }
    }
    for ops in &all_ops {
        ops.prune_images(&reporter).await?;
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

pub(super) async fn status(cli: &Cli) -> Result<()> {
    let resolved = Resolved::load_optional(cli)?;
    let ops = resolved.operations(cli, false).await?;
    let mut proxies = resolved.names();
    proxies.extend(ops.owned().await?);
    let rows = ops.status(&proxies).await?;
    // What `berth serve` recorded (generations, conditions, last rollout), when it runs here.
    let mut record = status::record::read(&crate::state::StateDir::at(&resolved.state_dir));
    for (name, p) in record.iter_mut().flat_map(|r| r.proxies.iter_mut()) {
        let wanted = resolved
            .targets
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.desired.replicas);
        status::live_ready(&mut p.conditions, &rows, name, wanted);
    }
    let certificates = status::certificates::delivered(
        &crate::state::StateDir::at(&resolved.state_dir),
        &proxies,
        std::time::SystemTime::now(),
    );
    if cli.output == Output::Json {
        let proxies = record.map(|r| r.proxies).unwrap_or_default();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "replicas": rows,
                "proxies": proxies,
                "certificates": certificates,
            }))?
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!(
            "no replicas (config {}, state {})",
            cli.config_path().display(),
            resolved.state_dir.display()
        );
    } else {
        println!("{}", status::table(&rows));
    }
    if let Some(record) = record.filter(|r| !r.proxies.is_empty()) {
        println!("\n{}", status::proxies_table(&record));
    }
    if !certificates.is_empty() {
        println!("\n{}", status::certificates::table(&certificates));
    }
    Ok(())
}

pub(super) async fn serve(cli: &Cli) -> Result<()> {
    let Command::Serve {
        listen,
        resync,
        confirm_timeout,
        no_watch,
        no_engine_events,
        no_liveness,
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
    crate::edges::serve::run(crate::edges::serve::Options {
        config: cli.config_path(),
        state_dir: cli.state_dir.clone(),
        templates: cli.templates.clone(),
        extra_labels: cli.container_labels(),
        mode: cli.mode(),
        flags: crate::edges::serve::ServeFlags {
            listen: listen.map(|l| l.0),
            resync: resync.map(|r| (!r.is_zero()).then_some(r)),
            confirm_timeout: *confirm_timeout,
            watch: no_watch.then_some(false),
            engine_events: no_engine_events.then_some(false),
            liveness: no_liveness.then_some(false),
        },
        remote: match remote.as_deref() {
            None => crate::edges::serve::RemoteFlag::FromConfig,
            Some("off") => crate::edges::serve::RemoteFlag::Off,
            Some(addr) => crate::edges::serve::RemoteFlag::At(
                crate::edges::eg_provider::Listen::parse(addr, &std::env::current_dir()?)
                    .map_err(|m| BadInput(format!("--remote: {m}")))?,
            ),
        },
    })
    .await
}
