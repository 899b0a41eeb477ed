//! Layer host: the machine's kernel settings and [`preflight`]. May use: core, state (atomic writes).
//!
//! Host preparation (DESIGN decision 12): the kernel settings a fleet of replicas needs, set
//! before any replica starts, kept across reboots, and refused with numbers when the host
//! cannot hold the fleet.
//!
//! - `net.ipv4.tcp_migrate_req = 1`: connections still queued on a retiring replica's listener
//!   move to a sibling instead of being reset (a rollout with it at 0 loses requests).
//! - `net.ipv4.ip_unprivileged_port_start` ≤ the lowest listener port: replicas run as a
//!   non-root user, so a port below it cannot be bound.
//! - `fs.inotify.max_user_instances` / `max_user_watches`: every replica watches its files with
//!   inotify, and all replicas share one user's limit ([`inotify`]).
//!
//! [`prepare`] observes the host, plans ([`plan`], pure), and applies: with `tune_host = true`
//! as root it sets what is short and writes the drop-in [`sysctl::DEFAULT_DROPIN`] so the
//! settings survive a reboot; otherwise what the fleet cannot run without is refused
//! ([`Refusal`], with the numbers and the command) and the rest comes back as [`Concern`]s,
//! which the caller shows once and turns into a Degraded condition.

pub mod boot;
pub mod inotify;
pub mod preflight;
pub mod process;
pub mod sysctl;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use sysctl::{Key, Sysctls};

/// Kernel defaults: what a setting returns to at boot unless a drop-in sets it.
const DEFAULT_PORT_START: u64 = 1024;
const DEFAULT_INOTIFY_INSTANCES: u64 = 128;
/// The smallest default of `max_user_watches` (newer kernels scale it with memory).
const MIN_DEFAULT_INOTIFY_WATCHES: u64 = 8192;
/// berth raises inotify limits in steps, so that a growing fleet does not rewrite them often.
const INOTIFY_INSTANCES_STEP: u64 = 1024;
const INOTIFY_WATCHES_STEP: u64 = 8192;

/// What one proxy of the fleet needs of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNeeds {
    pub name: String,
    pub replicas: u32,
    pub ports: Vec<u16>,
    /// [`inotify::per_replica`] of the proxy's rendered files.
    pub inotify_per_replica: u32,
}

/// What the whole fleet (every proxy berth will run from this state directory) needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub proxies: Vec<ProxyNeeds>,
}

impl Needs {
    /// The lowest listener port and its proxy.
    pub fn lowest_port(&self) -> Option<(u16, &str)> {
        self.proxies
            .iter()
            .flat_map(|p| p.ports.iter().map(move |port| (*port, p.name.as_str())))
            .min()
    }

    pub fn replicas(&self) -> u64 {
        self.proxies.iter().map(|p| u64::from(p.replicas)).sum()
    }

    /// inotify instances at the fleet's peak: every replica, plus for every proxy the extra
    /// replica a start-first rollout runs beside the old ones (serve rolls proxies at once).
    pub fn inotify_instances(&self) -> u64 {
        self.proxies
            .iter()
            .filter(|p| p.replicas > 0)
            .map(|p| u64::from(p.replicas + 1) * u64::from(p.inotify_per_replica))
            .sum()
    }

    /// Each instance watches one directory.
    pub fn inotify_watches(&self) -> u64 {
        self.inotify_instances()
    }

    fn describe_inotify(&self) -> String {
        let proxies = self.proxies.iter().filter(|p| p.replicas > 0).count();
        let per: BTreeSet<u32> = self.proxies.iter().map(|p| p.inotify_per_replica).collect();
        let per = per.iter().map(u32::to_string).collect::<Vec<_>>().join("-");
        format!(
            "{} replicas of {proxies} proxies plus one start-first rollout replica per proxy, \
             {per} each",
            self.replicas()
        )
    }
}

/// Where and how to prepare the host.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `tune_host` of the config: berth may change host settings.
    pub tune: bool,
    /// berth runs as root (only root can change them).
    pub root: bool,
    pub sysctls: Sysctls,
    /// berth's drop-in.
    pub dropin: PathBuf,
    /// The files the boot applies ([`boot`]), to tell whether a setting survives a reboot.
    pub boot: boot::BootConfig,
    /// The user replicas run as (inotify limits are per user).
    pub replica_uid: u32,
    /// This fleet's running replicas: their inotify use is part of the fleet's need, not
    /// someone else's.
    pub fleet_pids: BTreeSet<u32>,
    /// The processes running as `replica_uid`, when already listed
    /// ([`inotify::processes_of`]); None: listed when observed.
    pub user_processes: Option<Vec<u32>>,
}

impl Settings {
    /// This host: /proc/sys, /etc/sysctl.d (or [`sysctl::DROPIN_ENV`]).
    pub fn for_host(tune: bool, fleet_pids: BTreeSet<u32>) -> Settings {
        let dropin = sysctl::dropin_path();
        Settings {
            tune,
            root: is_root(),
            sysctls: Sysctls::default(),
            boot: boot::BootConfig::standard().with_dropin(&dropin),
            dropin,
            replica_uid: crate::core::replica::replica_user().uid,
            fleet_pids,
            user_processes: None,
        }
    }

    /// With the replica user's processes already listed.
    pub fn with_user_processes(mut self, pids: Vec<u32>) -> Settings {
        self.user_processes = Some(pids);
        self
    }
}

/// What the host is like now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Current values; a missing key: this kernel has no such setting.
    pub values: BTreeMap<Key, u64>,
    /// Values the boot applies (from the sysctl config files).
    pub at_boot: BTreeMap<Key, boot::Setting>,
    /// berth's drop-in as it is.
    pub dropin: BTreeMap<Key, u64>,
    /// inotify use by the replica user's processes outside this fleet.
    pub other_inotify: inotify::Usage,
}

/// Reads everything [`plan`] needs.
pub fn observe(settings: &Settings) -> Observed {
    with_inotify(observe_settings(settings), settings)
}

/// What [`observe`] reads but the inotify use, which needs the fleet's pids: the settings'
/// current values, their values at boot, berth's drop-in. Read while the fleet is observed,
/// then completed by [`prepare_observed`].
pub fn observe_settings(settings: &Settings) -> Observed {
    Observed {
        values: Key::ALL
            .into_iter()
            .filter_map(|k| Some((k, settings.sysctls.get(k)?)))
            .collect(),
        at_boot: settings.boot.read(),
        dropin: sysctl::read_dropin(&settings.dropin),
        other_inotify: Default::default(),
    }
}

fn with_inotify(mut observed: Observed, settings: &Settings) -> Observed {
    observed.other_inotify = match &settings.user_processes {
        Some(pids) => inotify::usage_of(pids, &settings.fleet_pids),
        None => inotify::usage(settings.replica_uid, &settings.fleet_pids),
    };
    observed
}

/// Why berth did not do something itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    TuneHostOff,
    NotRoot,
    /// The write failed (e.g. a read-only /proc/sys in a container).
    Failed(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::TuneHostOff => f.write_str("the config sets tune_host = false"),
            Why::NotRoot => f.write_str("berth is not running as root"),
            Why::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Something the fleet can run with, but worse: shown once as a warning and reported as a
/// Degraded condition (`reason`, `message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Concern {
    /// `tcp_migrate_req` is 0: a rollout may reset queued connections.
    MigrateReqOff { why: Why },
    /// Settings the fleet relies on return to their defaults at the next boot.
    NotPersistent {
        settings: BTreeMap<Key, u64>,
        why: PersistWhy,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PersistWhy {
    /// berth did not write its drop-in.
    NotWritten(Why),
    /// A sysctl file read after berth's sets another value at boot.
    Overridden { file: PathBuf, key: Key, value: u64 },
}

impl Concern {
    /// A CamelCase reason for a Degraded condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Concern::MigrateReqOff { .. } => "TcpMigrateReqOff",
            Concern::NotPersistent { .. } => "HostSettingsNotPersistent",
        }
    }

    pub fn message(&self, dropin: &std::path::Path) -> String {
        match self {
            Concern::MigrateReqOff { why } => format!(
                "net.ipv4.tcp_migrate_req is 0 ({why}): a connection arriving while a replica \
                 closes its listener may be reset during rollouts. Run: {}",
                Key::TcpMigrateReq.command(1)
            ),
            Concern::NotPersistent { settings, why } => {
                let list = settings
                    .iter()
                    .map(|(k, v)| format!("{} = {v}", k.name()))
                    .collect::<Vec<_>>();
                match why {
                    PersistWhy::NotWritten(why) => format!(
                        "after a reboot the host loses settings the replicas need ({}), and \
                         Docker restarts the replicas before berth runs ({why}). Run as root: \
                         printf '{}' > {} && sysctl --system",
                        list.join(", "),
                        list.iter().map(|l| format!("{l}\\n")).collect::<String>(),
                        dropin.display()
                    ),
                    PersistWhy::Overridden { file, key, value } => format!(
                        "{} sets {} = {value} at boot, after berth's {}; the replicas need {}. \
                         Remove that line",
                        file.display(),
                        key.name(),
                        dropin.display(),
                        settings.get(key).map(u64::to_string).unwrap_or_default()
                    ),
                }
            }
        }
    }
}

/// The fleet needs more than the host gives and berth may not (or could not) change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub problems: Vec<String>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; nothing was changed", self.problems.join("\n"))
    }
}

impl std::error::Error for Refusal {}

/// A setting berth changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub key: Key,
    pub from: u64,
    pub to: u64,
}

/// What [`apply`] will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// The drop-in's new content, when berth writes it.
    pub dropin: Option<BTreeMap<Key, u64>>,
    pub concerns: Vec<Concern>,
}

/// What a requirement of the fleet is.
struct Want {
    key: Key,
    /// The value the fleet needs (at least, or at most for a port start).
    need: u64,
    /// The value berth sets when it may (a step above the need for inotify).
    target: u64,
    /// Whether the fleet cannot run without it (refuse) or only runs worse (concern).
    hard: bool,
    /// Whether it must also hold after a reboot (it differs from the kernel default).
    persist: bool,
    /// What the number is, for a refusal.
    detail: String,
}

fn wants(needs: &Needs, o: &Observed) -> Vec<Want> {
    let mut wants = vec![Want {
        key: Key::TcpMigrateReq,
        need: 1,
        target: 1,
        hard: false,
        persist: true,
        detail: String::new(),
    }];
    if let Some((port, proxy)) = needs.lowest_port() {
        let port = u64::from(port);
        wants.push(Want {
            key: Key::UnprivilegedPortStart,
            need: port,
            target: port,
            hard: true,
            persist: port < DEFAULT_PORT_START,
            detail: format!(
                "proxy {proxy} listens on port {port} and replicas run as a non-root user"
            ),
        });
    }
    let instances = needs.inotify_instances();
    if instances > 0 {
        let other = o.other_inotify;
        let unknown = if other.unreadable > 0 {
            format!(
                " ({} processes of that user could not be inspected; run as root to count them)",
                other.unreadable
            )
        } else {
            String::new()
        };
        let need = instances + other.instances;
        wants.push(Want {
            key: Key::InotifyInstances,
            need,
            target: need.div_ceil(INOTIFY_INSTANCES_STEP) * INOTIFY_INSTANCES_STEP,
            hard: true,
            persist: need > DEFAULT_INOTIFY_INSTANCES,
            detail: format!(
                "the fleet needs {instances} inotify instances ({}) and other processes of \
                 the replicas' user hold {}{unknown}",
                needs.describe_inotify(),
                other.instances
            ),
        });
        let need = needs.inotify_watches() + other.watches;
        wants.push(Want {
            key: Key::InotifyWatches,
            need,
            target: need.div_ceil(INOTIFY_WATCHES_STEP) * INOTIFY_WATCHES_STEP,
            hard: true,
            persist: need > MIN_DEFAULT_INOTIFY_WATCHES,
            detail: format!(
                "the fleet needs {} inotify watches and other processes of the replicas' user \
                 hold {}{unknown}",
                needs.inotify_watches(),
                other.watches
            ),
        });
    }
    wants
}

fn satisfied(key: Key, value: u64, need: u64) -> bool {
    if key.lower_is_looser() {
        value <= need
    } else {
        value >= need
    }
}

/// Decides what to change, what to refuse and what to warn about. Pure.
pub fn plan(needs: &Needs, o: &Observed, settings: &Settings) -> Result<Plan, Refusal> {
    let why_not = if !settings.tune {
        Some(Why::TuneHostOff)
    } else if !settings.root {
        Some(Why::NotRoot)
    } else {
        None
    };
    let mut plan = Plan::default();
    let mut problems = Vec::new();
    let mut relied_on = BTreeMap::new();
    for want in wants(needs, o) {
        // A kernel without the setting: nothing to set (tcp_migrate_req before Linux 5.14).
        let Some(&current) = o.values.get(&want.key) else {
            continue;
        };
        let mut effective = current;
        if !satisfied(want.key, current, want.need) {
            match &why_not {
                None => {
                    let to = want.key.looser(current, want.target);
                    plan.changes.push(Change {
                        key: want.key,
                        from: current,
                        to,
                    });
                    effective = to;
                }
                Some(why) if want.hard => problems.push(format!(
                    "{}, but {} is {current} ({why}). Run: {} (and keep it in {}), or set \
                     tune_host = true and run berth as root",
                    want.detail,
                    want.key.name(),
                    want.key.command(want.target),
                    settings.dropin.display()
                )),
                Some(why) => plan
                    .concerns
                    .push(Concern::MigrateReqOff { why: why.clone() }),
            }
        }
        if want.persist {
            relied_on.insert(want.key, want.key.looser(effective, want.need));
        }
    }
    if !problems.is_empty() {
        return Err(Refusal { problems });
    }
    match &why_not {
        None => {
            let mut content = o.dropin.clone();
            for (key, value) in &relied_on {
                let merged = content
                    .get(key)
                    .map_or(*value, |old| key.looser(*old, *value));
                content.insert(*key, merged);
            }
            if content != o.dropin || !settings.dropin.exists() {
                plan.dropin = Some(content.clone());
            }
            // Another file the boot reads after berth's may still undo it.
            if let Some((key, setting)) = relied_on.iter().find_map(|(k, v)| {
                let s = o.at_boot.get(k)?;
                (s.file != settings.dropin && !satisfied(*k, s.value, *v)).then_some((*k, s))
            }) {
                plan.concerns.push(Concern::NotPersistent {
                    settings: relied_on.clone(),
                    why: PersistWhy::Overridden {
                        file: setting.file.clone(),
                        key,
                        value: setting.value,
                    },
                });
            }
        }
        Some(why) => {
            let lost: BTreeMap<Key, u64> = relied_on
                .into_iter()
                .filter(|(k, v)| !o.at_boot.get(k).is_some_and(|s| satisfied(*k, s.value, *v)))
                .collect();
            if !lost.is_empty() {
                plan.concerns.push(Concern::NotPersistent {
                    settings: lost,
                    why: PersistWhy::NotWritten(why.clone()),
                });
            }
        }
    }
    Ok(plan)
}

/// What [`prepare`] did and what is still wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub changes: Vec<Change>,
    /// The drop-in, when berth (re)wrote it.
    pub dropin_written: Option<PathBuf>,
    pub concerns: Vec<Concern>,
    dropin: PathBuf,
}

impl Prepared {
    /// One line per change, for progress events.
    pub fn change_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .changes
            .iter()
            .map(|c| format!("{} {} → {}", c.key.name(), c.from, c.to))
            .collect();
        if let Some(path) = &self.dropin_written {
            lines.push(format!("wrote {} (kept across reboots)", path.display()));
        }
        lines
    }

    /// The one warning to show, if anything is wrong.
    pub fn warning(&self) -> Option<String> {
        self.degraded().map(|(_, message)| message)
    }

    /// A Degraded condition's reason and message, if anything is wrong.
    pub fn degraded(&self) -> Option<(&'static str, String)> {
        let first = self.concerns.first()?;
        let message = self
            .concerns
            .iter()
            .map(|c| c.message(&self.dropin))
            .collect::<Vec<_>>()
            .join("; also: ");
        Some((first.reason(), message))
    }
}

/// Brings the host to what the fleet needs: observe, [`plan`], set, persist. Call it before
/// starting or replacing any replica (every entry point), and at serve's start.
pub fn prepare(needs: &Needs, settings: &Settings) -> Result<Prepared, Refusal> {
    prepare_observed(needs, settings, observe_settings(settings))
}

/// [`prepare`] with the settings already read ([`observe_settings`], with the same
/// `settings` but for the fleet's pids and the replica user's processes).
pub fn prepare_observed(
    needs: &Needs,
    settings: &Settings,
    read: Observed,
) -> Result<Prepared, Refusal> {
    let observed = with_inotify(read, settings);
    let plan = plan(needs, &observed, settings)?;
    apply(plan, settings)
}

/// Carries out a plan. A change that fails is a refusal (the fleet cannot run without it),
/// except tcp_migrate_req's, which becomes a concern.
pub fn apply(plan: Plan, settings: &Settings) -> Result<Prepared, Refusal> {
    let mut done = Prepared {
        changes: Vec::new(),
        dropin_written: None,
        concerns: plan.concerns,
        dropin: settings.dropin.clone(),
    };
    for change in plan.changes {
        match settings.sysctls.set(change.key, change.to) {
            Ok(()) => done.changes.push(change),
            Err(e) if change.key == Key::TcpMigrateReq => {
                done.concerns.push(Concern::MigrateReqOff {
                    why: Why::Failed(format!("{e:#}")),
                })
            }
            Err(e) => {
                let mut problems = vec![format!("{e:#}")];
                if !done.changes.is_empty() {
                    problems.push(format!(
                        "already changed: {}",
                        done.change_lines().join(", ")
                    ));
                }
                return Err(Refusal { problems });
            }
        }
    }
    if let Some(content) = plan.dropin {
        match sysctl::write_dropin(&settings.dropin, &content) {
            Ok(true) => done.dropin_written = Some(settings.dropin.clone()),
            Ok(false) => {}
            Err(e) => done.concerns.push(Concern::NotPersistent {
                settings: content,
                why: PersistWhy::NotWritten(Why::Failed(format!("{e:#}"))),
            }),
        }
    }
    Ok(done)
}

/// The state directory when neither `--state-dir` nor the config names one: [`crate::core::layout::DEFAULT_STATE_DIR`]
/// for root, else the user's state directory, `$XDG_STATE_HOME/berth` (`~/.local/state/berth`
/// without it), as for other per-user tools; a user cannot write /var/lib.
pub fn default_state_dir() -> std::path::PathBuf {
    crate::core::layout::default_state_dir_for(
        is_root(),
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("HOME"),
    )
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests;
