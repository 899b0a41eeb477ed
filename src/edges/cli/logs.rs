//! `berth logs [PROXY[/SLOT]] [-f] [--since] [--tail]`: the replicas' logs, interleaved and
//! prefixed per replica like `docker compose logs`. With `-f` it follows replicas as they come:
//! a replica started during a rollout (or restarted by the engine) joins the stream.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use bollard::query_parameters::LogsOptionsBuilder;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::core::replica::{ObservedContainer, RunState, LABEL_MANAGED_BY, MANAGED_BY_VALUE};
use crate::edges::cli::log_lines::{self as logs, Line, LineSplitter, Printer, Selector};
use crate::engine::{ContainerEngine, DockerEngine as Engine, LabelFilter};

/// What `berth logs` was asked for.
#[derive(Debug, Clone)]
pub struct Request {
    pub selector: Selector,
    pub follow: bool,
    /// Unix seconds.
    pub since: Option<i64>,
    /// "all" or a line count, per replica.
    pub tail: String,
    pub timestamps: bool,
    pub prefix: bool,
}

/// How to read one replica's log.
#[derive(Debug, Clone)]
struct Read {
    follow: bool,
    since: Option<i64>,
    tail: String,
    /// Lines at or before this time were printed already (a restarted replica).
    after: Option<SystemTime>,
}

/// Prints the logs. `observe` lists the containers this berth owns (the caller's scope); it is
/// called again while following, whenever a berth container starts.
pub async fn run<F, Fut>(engine: &Engine, request: Request, observe: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<ObservedContainer>>>,
{
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut printer = Printer::new(request.prefix, request.timestamps, color);
    // Subscribe before listing, so a replica that starts in between is not missed.
    let events = request.follow.then(|| starts(engine));
    let selected = select(observe().await?, &request.selector);
    if selected.is_empty() && !request.follow {
        anyhow::bail!("{}", nothing_selected(&request.selector));
    }
    for c in &selected {
        printer.add_replica(&c.name);
    }
    let first = Read {
        follow: request.follow,
        since: request.since,
        tail: request.tail.clone(),
        after: None,
    };
    if !request.follow {
        let mut all = Vec::new();
        for c in &selected {
            let (tx, mut rx) = mpsc::unbounded_channel();
            read_log(engine, c, first.clone(), tx).await?;
            let mut lines = Vec::new();
            while let Some(Event::Line(l)) = rx.recv().await {
                lines.push(l);
            }
            all.push(lines);
        }
        let mut out = std::io::stdout().lock();
        for line in logs::merge(all) {
            writeln!(out, "{}", printer.format(&line))?;
        }
        return Ok(());
    }
    follow(engine, request, observe, events, selected, printer, first).await
}

/// What a reading task reports.
enum Event {
    Line(Line),
    /// The replica's stream ended (it stopped, or went away).
    Ended {
        id: String,
        last: Option<SystemTime>,
    },
}

/// One replica's attachment while following.
struct Attached {
    live: bool,
    last: Option<SystemTime>,
}

async fn follow<F, Fut>(
    engine: &Engine,
    request: Request,
    observe: F,
    events: Option<Starts>,
    selected: Vec<ObservedContainer>,
    mut printer: Printer,
    first: Read,
) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<ObservedContainer>>>,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut attached: BTreeMap<String, Attached> = BTreeMap::new();
    let mut events = events.expect("following subscribes to events");
    if selected.is_empty() {
        eprintln!(
            "{}; waiting for replicas to start",
            nothing_selected(&request.selector)
        );
    }
    for c in &selected {
        attach(engine, c, first.clone(), &tx, &mut attached);
    }
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            event = rx.recv() => match event {
                Some(Event::Line(l)) => {
                    writeln!(out, "{}", printer.format(&l))?;
                }
                Some(Event::Ended { id, last }) => {
                    if let Some(a) = attached.get_mut(&id) {
                        a.live = false;
                        a.last = last.or(a.last);
                    }
                }
                None => return Ok(()),
            },
            started = events.next() => {
                match started {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        eprintln!("berth logs: the engine's event stream failed ({e:#}); resubscribing");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        events = starts(engine);
                    }
                    None => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        events = starts(engine);
                    }
                }
                for c in select(observe().await?, &request.selector) {
                    if c.state != RunState::Running {
                        continue;
                    }
                    let read = match attached.get(&c.id) {
                        Some(a) if a.live => continue,
                        // Restarted: what it logged before was printed already.
                        Some(a) => Read { follow: true, since: None, tail: "all".into(), after: a.last },
                        // New (a rollout's replacement): all of it.
                        None => Read { follow: true, since: None, tail: "all".into(), after: None },
                    };
                    printer.add_replica(&c.name);
                    attach(engine, &c, read, &tx, &mut attached);
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn attach(
    engine: &Engine,
    c: &ObservedContainer,
    read: Read,
    tx: &mpsc::UnboundedSender<Event>,
    attached: &mut BTreeMap<String, Attached>,
) {
    let last = attached.get(&c.id).and_then(|a| a.last);
    attached.insert(c.id.clone(), Attached { live: true, last });
    let (engine, c, tx) = (engine.clone(), c.clone(), tx.clone());
    tokio::spawn(async move {
        if let Err(e) = read_log(&engine, &c, read, tx).await {
            eprintln!("berth logs: {}: {e:#}", c.name);
        }
    });
}

/// Reads one replica's log into `tx` (until the end, or while it runs when following), then
/// sends [`Event::Ended`].
async fn read_log(
    engine: &Engine,
    c: &ObservedContainer,
    read: Read,
    tx: mpsc::UnboundedSender<Event>,
) -> Result<()> {
    let mut opts = LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .timestamps(true)
        .follow(read.follow)
        .tail(&read.tail);
    if let Some(since) = read.since {
        opts = opts.since(i32::try_from(since).unwrap_or(i32::MAX));
    }
    let mut stream = engine.client().logs(&c.id, Some(opts.build()));
    let mut splitter = LineSplitter::default();
    let mut last = read.after;
    let send = |raw: String, last: &mut Option<SystemTime>| {
        let (stamp, at, text) = logs::split_stamp(&raw);
        if let (Some(at), Some(after)) = (at, read.after) {
            if at <= after {
                return;
            }
        }
        if at.is_some() {
            *last = at;
        }
        let _ = tx.send(Event::Line(Line {
            replica: c.name.clone(),
            at,
            stamp,
            text: text.to_string(),
        }));
    };
    let result = async {
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // Removed while we read: its log ends here.
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => break,
                Err(e) => return Err(anyhow::anyhow!(e)),
            };
            for raw in splitter.push(chunk.as_ref()) {
                send(raw, &mut last);
            }
        }
        Ok(())
    }
    .await
    .with_context(|| format!("reading the log of {}", c.name));
    if let Some(raw) = splitter.finish() {
        send(raw, &mut last);
    }
    let _ = tx.send(Event::Ended {
        id: c.id.clone(),
        last,
    });
    result
}

/// Ids of berth containers as they start (any berth's: the caller re-lists its own).
type Starts = std::pin::Pin<Box<dyn Stream<Item = Result<String>> + Send>>;

fn starts(engine: &Engine) -> Starts {
    Box::pin(
        engine
            .events(&LabelFilter::default().with(LABEL_MANAGED_BY, Some(MANAGED_BY_VALUE)))
            .filter(|e| {
                let start = e.as_ref().map_or(true, |e| e.action == "start");
                async move { start }
            })
            .map(|e| e.map(|e| e.id).map_err(anyhow::Error::from)),
    )
}

fn select(observed: Vec<ObservedContainer>, selector: &Selector) -> Vec<ObservedContainer> {
    let mut found: Vec<ObservedContainer> = observed
        .into_iter()
        .filter(|c| selector.matches(c))
        .collect();
    found.sort_by(|a, b| (a.proxy(), a.slot(), &a.name).cmp(&(b.proxy(), b.slot(), &b.name)));
    found
}

fn nothing_selected(selector: &Selector) -> String {
    match (&selector.proxy, selector.slot) {
        (None, _) => "no replicas here".to_string(),
        (Some(p), None) => format!("no replicas of proxy {p:?}"),
        (Some(p), Some(s)) => format!("no replica {s} of proxy {p:?}"),
    }
}

/// The containers of this berth (this state directory, these labels) of the proxies in the
/// config, in the state directory, or named.
async fn owned(
    engine: &Engine,
    names: &BTreeSet<String>,
    state: &crate::state::StateDir,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<ObservedContainer>> {
    let mut known = names.clone();
    known.extend(state.proxies()?);
    let mut filter = LabelFilter::default()
        .with(LABEL_MANAGED_BY, Some(MANAGED_BY_VALUE))
        .with(
            crate::core::replica::LABEL_STATE_DIR,
            Some(&state.root().display().to_string()),
        );
    for (k, v) in labels {
        filter = filter.with(k, Some(v));
    }
    let mut found = engine.observe(&filter).await?;
    found.retain(|c| c.proxy().is_some_and(|p| known.contains(p)));
    Ok(found)
}

/// The proxies a selector names, for the caller's scope.
pub fn proxies_named(selector: &Selector) -> BTreeSet<String> {
    selector.proxy.iter().cloned().collect()
}

/// `berth logs`, from the command line: the scope is that of `status` (the config when there
/// is one, the state directory, this berth's containers) plus the proxy named.
pub(super) async fn command(cli: &super::Cli) -> Result<()> {
    let super::Command::Logs {
        target,
        follow,
        since,
        tail,
        timestamps,
        no_log_prefix,
    } = &cli.command
    else {
        unreachable!("only called for the logs command")
    };
    let bad = |m: String| anyhow::Error::from(super::BadInput(m));
    let selector = Selector::parse(target.as_deref()).map_err(bad)?;
    let since = since
        .as_deref()
        .map(|s| logs::parse_since(s, SystemTime::now()))
        .transpose()
        .map_err(bad)?;
    let tail = logs::parse_tail(tail).map_err(bad)?;
    let resolved = super::settings::Resolved::load_optional(cli)?;
    let state = crate::state::StateDir::at(&resolved.state_dir);
    let mut names: BTreeSet<String> = resolved.names();
    names.extend(proxies_named(&selector));
    let engine = Engine::connect().await?;
    let request = Request {
        selector,
        follow: *follow,
        since,
        tail,
        timestamps: *timestamps,
        prefix: !no_log_prefix,
    };
    let labels = cli.container_labels();
    let observe = || owned(&engine, &names, &state, &labels);
    match run(&engine, request, observe).await {
        // `berth logs | head`: the reader is gone, which is not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}
