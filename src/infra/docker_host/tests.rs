//! The executor against the in-memory engine, on tokio's paused clock: what it does, in which
//! order, and what it leaves behind when a gate fails (rollback, pause, never rolling back a
//! rollback), when it is cancelled between steps, when validation refuses, and when a replica
//! stops serving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::DockerHost;
use crate::core::progress::Reporter;
use crate::core::render::Renderer;
use crate::core::target::{self, Target};
use crate::engine::fake::{Behavior, FakeEngine};
use crate::engine::{ContainerEngine, RunState, User};
use crate::envoy::admin::AdminConnector;
use crate::infra::{ConvergeError, ConvergeRequest, Converged, Gate, Infrastructure};
use crate::state::StateDir;

const OLD: &str = "fake/envoy:1";
const NEW: &str = "fake/envoy:2";
const PORT: u16 = 18080;

struct World {
    engine: Arc<FakeEngine>,
    host: DockerHost,
    _dir: tempfile::TempDir,
}

fn world() -> World {
    let engine = FakeEngine::new();
    engine.add_image(OLD, Behavior::healthy(&[PORT]));
    engine.add_image(NEW, Behavior::healthy(&[PORT]));
    let dir = tempfile::Builder::new()
        .prefix("bt")
        .tempdir_in("/tmp")
        .unwrap();
    let state = StateDir::open(dir.path()).unwrap();
    let host = DockerHost::new(
        engine.clone(),
        Arc::new(engine.clone()),
        state,
        Default::default(),
    );
    World {
        engine,
        host,
        _dir: dir,
    }
}

/// A proxy of `replicas` replicas of `image`, run as this process's user (so the run
/// directories need no root).
fn target(w: &World, image: &str, replicas: u32, on_failure: &str) -> Target {
    target_on(w, image, replicas, on_failure, PORT)
}

/// [`target`] on another port than [`PORT`].
fn target_on(w: &World, image: &str, replicas: u32, on_failure: &str, port: u16) -> Target {
    let text = format!(
        r#"
[[proxy]]
name = "edge"
image = "{image}"
replicas = {replicas}
[proxy.rollout]
min_ready = "1s"
startup_deadline = "30s"
on_failure = "{on_failure}"
[proxy.shutdown]
drain_timeout = "5s"
[[proxy.listener]]
name = "web"
port = {port}
[[proxy.listener.route]]
path_prefix = "/"
direct_response = {{ status = 200 }}
"#
    );
    let config = crate::core::source::file::parse(std::path::Path::new("t.toml"), &text).unwrap();
    let mut t = target::targets(
        &config.infra,
        &Renderer::builtin(),
        w.host.state.root(),
        2,
        crate::ops::acme::Placeholders::Write,
    )
    .unwrap()
    .remove(0);
    // SAFETY: geteuid/getegid have no preconditions.
    t.desired.spec.user = unsafe {
        User {
            uid: libc::geteuid(),
            gid: libc::getegid(),
        }
    };
    t.desired.hash = t.desired.spec.hash();
    t
}

async fn converge_with(
    w: &World,
    t: &Target,
    reporter: &Reporter,
    cancel: CancellationToken,
) -> Result<Converged, ConvergeError> {
    w.host
        .converge(ConvergeRequest {
            target: t,
            generation: None,
            hold_files: false,
            confirm_timeout: Duration::from_secs(5),
            reporter,
            cancel,
        })
        .await
}

async fn converge(w: &World, t: &Target) -> Result<Converged, ConvergeError> {
    converge_with(w, t, &Reporter::quiet(), CancellationToken::new()).await
}

/// The running containers' images, by slot.
fn images(w: &World) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = w
        .engine
        .containers()
        .into_iter()
        .filter(|c| c.state == RunState::Running)
        .map(|c| (c.labels["io.berth.slot"].clone(), c.image))
        .collect();
    v.sort();
    v
}

fn position(history: &[String], prefix: &str) -> usize {
    history
        .iter()
        .position(|h| h.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {history:#?}"))
}

#[tokio::test(start_paused = true)]
async fn a_fresh_proxy_s_ready_replicas_are_its_validation() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    let c = converge(&w, &t).await.unwrap();
    assert_eq!(c.actions.create, 3);
    assert!(c.readiness.all_ready(), "{}", c.readiness);
    assert_eq!(images(&w).len(), 3);
    let h = w.engine.history();
    assert!(
        !h.iter().any(|x| x.starts_with("validate")),
        "nothing to protect, and replicas that serve prove the config: {h:#?}"
    );
    // A second converge changes nothing and validates nothing.
    let before = w.engine.history().len();
    let again = converge(&w, &t).await.unwrap();
    assert_eq!(again.actions, Default::default());
    let after = w.engine.history();
    assert!(
        after[before..].iter().all(|h| h == "observe"),
        "a no-op converge only looks: {:?}",
        &after[before..]
    );
}

#[tokio::test(start_paused = true)]
async fn a_no_op_converge_probes_each_replica_once() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    converge(&w, &t).await.unwrap();
    let before = w.engine.ready_asks();
    let again = converge(&w, &t).await.unwrap();
    assert_eq!(again.actions, Default::default());
    assert_eq!((again.readiness.ready, again.readiness.wanted), (3, 3));
    assert!(again.readiness.not_ready.is_empty(), "{}", again.readiness);
    // The facts' probes are the readiness: no second round of /ready.
    assert_eq!(w.engine.ready_asks() - before, 3);
}

#[tokio::test(start_paused = true)]
async fn a_no_op_converge_reports_a_replica_that_stopped_serving() {
    let w = world();
    let t = target(&w, OLD, 2, "rollback");
    converge(&w, &t).await.unwrap();
    // One replica fails its health check (DRAINING): nothing for the planner to replace, and
    // the readiness taken from the facts still says so.
    let victim = w.engine.containers().remove(0);
    let run = victim.labels.get("io.berth.name").unwrap_or(&victim.name);
    w.engine
        .connect(
            &w.host.state.proxy("edge").admin_socket(run),
            Duration::from_secs(1),
        )
        .healthcheck_fail()
        .await
        .unwrap();
    let again = converge(&w, &t).await.unwrap();
    assert_eq!(again.readiness.ready, 1, "{}", again.readiness);
    assert_eq!(again.readiness.not_ready.len(), 1, "{}", again.readiness);
    assert_eq!(again.readiness.not_ready[0].0, victim.name);
}

#[tokio::test(start_paused = true)]
async fn an_image_change_replaces_one_replica_at_a_time_start_first() {
    let w = world();
    converge(&w, &target(&w, OLD, 2, "rollback")).await.unwrap();
    let olds: Vec<String> = w.engine.containers().into_iter().map(|c| c.name).collect();
    let start = w.engine.history().len();
    let c = converge(&w, &target(&w, NEW, 2, "rollback")).await.unwrap();
    assert_eq!(c.actions.replace, 2);
    assert_eq!(
        images(&w),
        vec![("0".into(), NEW.into()), ("1".into(), NEW.into())]
    );
    let h = &w.engine.history()[start..];
    let creates: Vec<usize> = h
        .iter()
        .enumerate()
        .filter(|(_, x)| x.starts_with("create"))
        .map(|(i, _)| i)
        .collect();
    let removes: Vec<usize> = olds
        .iter()
        .map(|o| position(h, &format!("remove {o}")))
        .collect();
    let drains: Vec<usize> = olds
        .iter()
        .map(|o| position(h, &format!("drain {o}")))
        .collect();
    assert_eq!(creates.len(), 2);
    // Start first: each new replica exists before its predecessor drains; one at a time:
    // the second new replica is created only after the first old one is gone.
    assert!(creates[0] < drains[0] && drains[0] < removes[0], "{h:#?}");
    assert!(removes[0] < creates[1], "{h:#?}");
    assert!(creates[1] < drains[1] && drains[1] < removes[1], "{h:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_failed_gate_rolls_the_replaced_slots_back() {
    let w = world();
    converge(&w, &target(&w, OLD, 2, "rollback")).await.unwrap();
    let t = target(&w, NEW, 2, "rollback");
    // Slot 1's new replica will not start.
    w.engine.fail_once(
        &format!("start berth-edge-1-{}", &t.desired.hash[..8]),
        "boom",
    );
    let err = converge(&w, &t).await.unwrap_err();
    let ConvergeError::Gate(f) = &err else {
        panic!("{err}")
    };
    assert_eq!(f.gate, Gate::Start);
    assert!(f.aftermath.contains("rolled back"), "{}", f.aftermath);
    assert_eq!(
        images(&w),
        vec![("0".into(), OLD.into()), ("1".into(), OLD.into())],
        "every slot serves the old spec again"
    );
}

#[tokio::test(start_paused = true)]
async fn pause_leaves_the_replaced_slots_on_the_new_spec() {
    let w = world();
    converge(&w, &target(&w, OLD, 2, "pause")).await.unwrap();
    let t = target(&w, NEW, 2, "pause");
    w.engine.fail_once(
        &format!("start berth-edge-1-{}", &t.desired.hash[..8]),
        "boom",
    );
    let err = converge(&w, &t).await.unwrap_err();
    let ConvergeError::Gate(f) = &err else {
        panic!("{err}")
    };
    assert!(f.aftermath.contains("paused"), "{}", f.aftermath);
    assert_eq!(
        images(&w),
        vec![("0".into(), NEW.into()), ("1".into(), OLD.into())]
    );
}

#[tokio::test(start_paused = true)]
async fn a_rollback_is_never_rolled_back() {
    let w = world();
    let old = target(&w, OLD, 2, "rollback");
    converge(&w, &old).await.unwrap();
    let t = target(&w, NEW, 2, "rollback");
    w.engine.fail_once(
        &format!("start berth-edge-1-{}", &t.desired.hash[..8]),
        "boom",
    );
    // The rollback of slot 0 to the old spec fails too.
    w.engine.fail_once(
        &format!("start berth-edge-0-{}", &old.desired.hash[..8]),
        "again",
    );
    let err = converge(&w, &t).await.unwrap_err();
    let ConvergeError::Gate(f) = &err else {
        panic!("{err}")
    };
    assert!(
        f.aftermath.contains("rollback failed too") && f.aftermath.contains("left as is"),
        "{}",
        f.aftermath
    );
    let attempts = w
        .engine
        .history()
        .iter()
        .filter(|h| h.starts_with(&format!("create berth-edge-0-{}", &old.desired.hash[..8])))
        .count();
    // Slot 0 was created once on the old spec at the start, and tried once as a rollback.
    assert_eq!(attempts, 2, "{:#?}", w.engine.history());
    assert_eq!(
        images(&w),
        vec![("0".into(), NEW.into()), ("1".into(), OLD.into())]
    );
}

#[tokio::test(start_paused = true)]
async fn cancellation_stops_between_two_steps() {
    let w = world();
    converge(&w, &target(&w, OLD, 3, "rollback")).await.unwrap();
    let cancel = CancellationToken::new();
    let fired = Arc::new(AtomicBool::new(false));
    let reporter = {
        let (cancel, fired) = (cancel.clone(), fired.clone());
        Reporter::quiet().on_event(move |e| {
            // Cancel as soon as the first old replica is gone.
            if e.event == "removed" && !fired.swap(true, Ordering::SeqCst) {
                cancel.cancel();
            }
        })
    };
    let err = converge_with(&w, &target(&w, NEW, 3, "rollback"), &reporter, cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, ConvergeError::Cancelled { .. }), "{err}");
    // The wave under way was finished (max_surge 50% of 3: slots 0 and 1), the last slot
    // untouched, none short.
    assert_eq!(
        images(&w),
        vec![
            ("0".into(), NEW.into()),
            ("1".into(), NEW.into()),
            ("2".into(), OLD.into())
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_rejected_config_changes_nothing() {
    let w = world();
    converge(&w, &target(&w, OLD, 2, "rollback")).await.unwrap();
    let before = images(&w);
    let start = w.engine.history().len();
    let refused = "[critical][main] error initializing configuration: no_such_field";
    let mut bad = Behavior::healthy(&[PORT]);
    // As a real Envoy does: validation refuses it, and a replica exits at start.
    bad.rejects = Some(refused.into());
    bad.exits_after = Some((Duration::from_millis(100), 1, refused.into()));
    w.engine.add_image(NEW, bad);
    let err = converge(&w, &target(&w, NEW, 2, "rollback"))
        .await
        .unwrap_err();
    let ConvergeError::Rejected { why, .. } = &err else {
        panic!("{err}")
    };
    assert!(why.contains("no_such_field"), "{why}");
    assert_eq!(images(&w), before);
    let h = &w.engine.history()[start..];
    assert!(
        !h.iter()
            .any(|x| x.starts_with("create") || x.starts_with("drain")),
        "{h:#?}"
    );
}

/// A fresh proxy whose replicas fail: Envoy's verdict on the config is the answer, and no
/// replica is left.
#[tokio::test(start_paused = true)]
async fn a_fresh_proxy_with_a_rejected_config_leaves_nothing() {
    let w = world();
    let refused = "[critical][main] error initializing configuration: no_such_field";
    let mut bad = Behavior::healthy(&[PORT]);
    // As a real Envoy does: validation refuses it, and a replica exits at start.
    bad.rejects = Some(refused.into());
    bad.exits_after = Some((Duration::from_millis(100), 1, refused.into()));
    w.engine.add_image(NEW, bad);
    let err = converge(&w, &target(&w, NEW, 2, "rollback"))
        .await
        .unwrap_err();
    let ConvergeError::Rejected { why, .. } = &err else {
        panic!("{err}")
    };
    assert!(why.contains("no_such_field"), "{why}");
    assert!(
        w.engine.containers().is_empty(),
        "{:#?}",
        w.engine.containers()
    );
    let h = w.engine.history();
    assert!(position(&h, "create") < position(&h, "validate"), "{h:#?}");
}

#[tokio::test(start_paused = true)]
async fn an_engine_refusal_is_the_engines_not_envoys() {
    let w = world();
    converge(&w, &target(&w, OLD, 1, "rollback")).await.unwrap();
    w.engine
        .fail_once("validate", "default ulimits exceed the hard limit");
    let err = converge(&w, &target(&w, NEW, 1, "rollback"))
        .await
        .unwrap_err();
    assert!(matches!(err, ConvergeError::Engine(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("the fake engine refused") && msg.contains("ulimits"),
        "{msg}"
    );
    assert!(!msg.contains("envoy --mode validate rejected"), "{msg}");
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_stops_serving_is_replaced_once_the_host_allows() {
    let w = world();
    let t = target(&w, OLD, 1, "rollback");
    converge(&w, &t).await.unwrap();
    // A reboot: the port cannot be bound any more, Envoy is LIVE without its listener.
    let mut unbound = Behavior::healthy(&[]);
    unbound.live_after = Duration::from_secs(1);
    w.engine.add_image(OLD, unbound);
    let err = converge(&w, &t).await.unwrap_err();
    let ConvergeError::Gate(f) = &err else {
        panic!("{err}")
    };
    assert_eq!(f.gate, Gate::Listeners, "{f}");
    assert!(f.reason.contains(&PORT.to_string()), "{f}");
    // The host is fixed: the next pass replaces the replica with one that serves.
    w.engine.add_image(OLD, Behavior::healthy(&[PORT]));
    let c = converge(&w, &t).await.unwrap();
    assert!(c.readiness.all_ready(), "{}", c.readiness);
}

#[tokio::test(start_paused = true)]
async fn remove_drains_every_replica_before_any_goes() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    converge(&w, &t).await.unwrap();
    let start = w.engine.history().len();
    let n = w.host.remove("edge", &Reporter::quiet()).await.unwrap();
    assert_eq!(n, 3);
    let h = &w.engine.history()[start..];
    let last_drain = h.iter().rposition(|x| x.starts_with("drain")).unwrap();
    let first_remove = h.iter().position(|x| x.starts_with("remove")).unwrap();
    assert!(
        last_drain < first_remove,
        "every replica was draining before any was removed: {h:#?}"
    );
    assert!(images(&w).is_empty());
    assert!(!w.host.state.proxy("edge").root().exists());
}

/// Pull policy "always" over the fake registry: the operations layer on a second host of the
/// same engine and state directory.
fn operations(w: &World) -> crate::ops::Operations {
    let host = DockerHost::new(
        w.engine.clone(),
        Arc::new(w.engine.clone()),
        w.host.state.clone(),
        Default::default(),
    );
    crate::ops::Operations::new(Arc::new(host))
}

const EDGE: &str = "registry.test:5000/envoy:edge";

/// `target` with `pull = "always"`, pinned by a pull as `up` pins it.
async fn pulled(w: &World, replicas: u32) -> Result<Target, ConvergeError> {
    let mut t = target(w, EDGE, replicas, "rollback");
    t.proxy.config.pull = crate::core::ir::PullPolicy::Always;
    let mut ts = vec![t];
    operations(w)
        .pin_images(&mut ts, crate::ops::TagCheck::Registry, &Reporter::quiet())
        .await?;
    Ok(ts.remove(0))
}

fn image_ids(w: &World) -> Vec<String> {
    let mut v: Vec<String> = w
        .engine
        .containers()
        .into_iter()
        .filter(|c| c.state == RunState::Running)
        .map(|c| c.labels["io.berth.image-id"].clone())
        .collect();
    v.sort();
    v
}

#[tokio::test(start_paused = true)]
async fn a_moved_tag_is_a_new_spec_shown_by_diff_and_rolled_back_to_the_old_image_by_id() {
    let w = world();
    w.engine.add_image(EDGE, Behavior::healthy(&[PORT]));
    let first = pulled(&w, 2).await.unwrap();
    let old_id = first.desired.spec.image_id.clone().unwrap();
    converge(&w, &first).await.unwrap();
    // Pulling again while the tag stays is no change at all.
    assert_eq!(
        pulled(&w, 2).await.unwrap().desired.hash,
        first.desired.hash
    );

    let new_id = w.engine.push(EDGE, Behavior::healthy(&[PORT]));
    let moved = pulled(&w, 2).await.unwrap();
    assert_ne!(
        moved.desired.hash, first.desired.hash,
        "the hash follows the image ID"
    );
    let plan = w.host.diff(std::slice::from_ref(&moved)).await.unwrap();
    assert_eq!(plan.summary().replace, 2, "{plan}");
    let shown = plan.to_string();
    assert!(
        shown.contains(&format!(
            "image {EDGE}: {} -> {}",
            crate::core::plan::short_image_id(&old_id),
            crate::core::plan::short_image_id(&new_id)
        )),
        "{shown}"
    );

    // Slot 1's new replica fails: slot 0 goes back to the image it ran, by ID, although the
    // tag names the new one now.
    w.engine.fail_once(
        &format!("start berth-edge-1-{}", &moved.desired.hash[..8]),
        "boom",
    );
    converge(&w, &moved).await.unwrap_err();
    assert_eq!(
        images(&w),
        vec![("0".into(), old_id.clone()), ("1".into(), EDGE.into())]
    );
    assert_eq!(image_ids(&w), vec![old_id.clone(), old_id.clone()]);

    converge(&w, &moved).await.unwrap();
    assert_eq!(
        images(&w),
        vec![("0".into(), EDGE.into()), ("1".into(), EDGE.into())]
    );
    assert_eq!(image_ids(&w), vec![new_id.clone(), new_id]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_pull_is_the_answer_before_anything_changes() {
    let w = world();
    w.engine.add_image(EDGE, Behavior::healthy(&[PORT]));
    converge(&w, &pulled(&w, 1).await.unwrap()).await.unwrap();
    let before = w.engine.containers();
    w.engine.push(EDGE, Behavior::healthy(&[PORT]));
    w.engine
        .fail_pulls(Some(crate::engine::PullFailure::Unauthorized));
    let err = pulled(&w, 1).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(EDGE) && text.contains("registry.test:5000"),
        "{text}"
    );
    assert!(
        text.contains("unauthorized") && text.contains("docker login"),
        "{text}"
    );
    assert!(!err.is_transient(), "credentials wait for a change");
    assert_eq!(w.engine.containers(), before);
}

/// A command's host over `w`'s engine and state directory (it keeps its look in the state
/// directory), with the probes it starts before the engine answers when `ahead`.
fn command(w: &World, t: &Target, ahead: bool) -> DockerHost {
    let host = DockerHost::new(
        w.engine.clone(),
        Arc::new(w.engine.clone()),
        w.host.state.clone(),
        Default::default(),
    )
    .reusing_observations(Duration::from_secs(10));
    if !ahead {
        return host;
    }
    host.with_ahead(super::Ahead::start(
        &w.host.state,
        std::slice::from_ref(t),
        Arc::new(w.engine.clone()),
    ))
}

async fn converge_on(host: &DockerHost, t: &Target) -> Result<Converged, ConvergeError> {
    host.converge(ConvergeRequest {
        target: t,
        generation: None,
        hold_files: false,
        confirm_timeout: Duration::from_secs(5),
        reporter: &Reporter::quiet(),
        cancel: CancellationToken::new(),
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_no_op_command_uses_the_probes_it_started_before_the_engine_answered() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    converge_on(&command(&w, &t, false), &t).await.unwrap();
    let before = w.engine.ready_asks();
    let host = command(&w, &t, true);
    // The probes run before anything is observed.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(w.engine.ready_asks() - before, 3);
    let again = converge_on(&host, &t).await.unwrap();
    assert_eq!(again.actions, Default::default());
    assert_eq!((again.readiness.ready, again.readiness.wanted), (3, 3));
    // The engine vouched for every replica: their early answers are the facts.
    assert_eq!(w.engine.ready_asks() - before, 3);
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_stopped_serving_between_two_commands_is_caught_by_the_early_probe() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    converge_on(&command(&w, &t, false), &t).await.unwrap();
    let victim = w.engine.containers().remove(0);
    let run = victim.labels.get("io.berth.name").unwrap_or(&victim.name);
    w.engine
        .connect(
            &w.host.state.proxy("edge").admin_socket(run),
            Duration::from_secs(1),
        )
        .healthcheck_fail()
        .await
        .unwrap();
    let host = command(&w, &t, true);
    let again = converge_on(&host, &t).await.unwrap();
    assert_eq!(again.readiness.ready, 2, "{}", again.readiness);
    assert_eq!(again.readiness.not_ready.len(), 1, "{}", again.readiness);
    assert_eq!(again.readiness.not_ready[0].0, victim.name);
}

#[tokio::test(start_paused = true)]
async fn a_container_changed_after_its_early_probe_is_probed_again() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    converge_on(&command(&w, &t, false), &t).await.unwrap();
    let victim = w.engine.containers().remove(0);
    w.engine
        .stop(&victim.id, Duration::from_secs(1))
        .await
        .unwrap();
    // Probed while it is stopped: not ready.
    let host = command(&w, &t, true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let before = w.engine.ready_asks();
    // Started again (an engine event), and LIVE before the command observes.
    w.engine.start(&victim.id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = converge_on(&host, &t).await.unwrap();
    assert_eq!(again.actions, Default::default());
    assert_eq!(
        (again.readiness.ready, again.readiness.wanted),
        (3, 3),
        "{}",
        again.readiness
    );
    // Only the changed container was asked again.
    assert_eq!(w.engine.ready_asks() - before, 1);
}

#[tokio::test(start_paused = true)]
async fn early_answers_do_not_outlive_a_change_berth_makes() {
    let w = world();
    let t = target(&w, OLD, 2, "rollback");
    converge_on(&command(&w, &t, false), &t).await.unwrap();
    // The image changes: every replica is replaced, and the readiness berth reports is the
    // new replicas', asked after they started.
    let t2 = target(&w, NEW, 2, "rollback");
    let host = command(&w, &t2, true);
    let c = converge_on(&host, &t2).await.unwrap();
    assert_eq!(c.actions.replace + c.actions.create, 2, "{:?}", c.actions);
    assert!(c.readiness.all_ready(), "{}", c.readiness);
    assert!(host.ahead.as_ref().unwrap().is_empty());
}

/// Preflight attributes a socket on the proxy's port by the container its process runs in:
/// a paused replica (for which the engine reports no pid) is the fleet's own, never "another
/// process holding the port", and never stops its proxy from being reconciled.
#[tokio::test(start_paused = true)]
async fn a_port_held_by_the_fleets_own_paused_replica_is_not_a_strangers() {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let w = world();
    w.engine.add_image(OLD, Behavior::healthy(&[port]));
    let t = target_on(&w, OLD, 2, "rollback", port);
    converge(&w, &t).await.unwrap();
    let paused = w.engine.containers()[0].id.clone();
    w.engine.pause(&paused);
    let policy = crate::core::policy::HostPolicy {
        tune: false,
        force_memory: false,
    };
    // This process's socket stands for the paused replica's Envoy: a stranger's until the
    // engine says which container the process is in.
    let refused = w.host.prepare(std::slice::from_ref(&t), policy).await;
    let Err(ConvergeError::Host { problem }) = refused else {
        panic!("a stranger on the port was not refused: {refused:?}");
    };
    assert!(problem.contains("already in use"), "{problem}");
    w.engine.place_process(std::process::id(), &paused);
    w.host
        .prepare(std::slice::from_ref(&t), policy)
        .await
        .expect("the fleet's own paused replica holds the port");
    // And the rest of the proxy converges: the paused replica is replaced.
    let done = converge(&w, &t).await.unwrap();
    assert!(done.readiness.all_ready(), "{done:?}");
    assert!(
        w.engine.containers().iter().all(|c| c.id != paused),
        "{:?}",
        w.engine.history()
    );
    drop(listener);
}

/// The liveness look: each running or paused replica's `/ready` asked (none for a paused one),
/// the engine's pause seen; a kill takes the replica down at once.
#[tokio::test(start_paused = true)]
async fn a_look_sees_a_paused_replica_and_a_kill_takes_it_down() {
    let w = world();
    let t = target(&w, OLD, 2, "rollback");
    converge(&w, &t).await.unwrap();
    let paused = w.engine.containers()[0].id.clone();
    w.engine.pause(&paused);
    let proxies = std::collections::BTreeSet::from(["edge".to_string()]);
    let looks = w.host.look(&proxies).await.unwrap();
    assert_eq!(looks.len(), 2, "{looks:?}");
    for l in &looks {
        assert_eq!(l.proxy, "edge");
        assert_eq!(l.probe.paused, l.container == paused, "{l:?}");
        assert_eq!(l.probe.answered, l.container != paused, "{l:?}");
    }
    assert!(w.host.look(&Default::default()).await.unwrap().is_empty());
    w.host.kill(&paused).await.unwrap();
    let seen = w.engine.containers();
    let killed = seen.iter().find(|c| c.id == paused).unwrap();
    assert_eq!(killed.state, RunState::Exited);
    assert!(
        w.engine.history().iter().any(|h| h.starts_with("sigkill ")),
        "{:?}",
        w.engine.history()
    );
    // Killed, it is not looked at any more; the next converge starts it again.
    assert_eq!(w.host.look(&proxies).await.unwrap().len(), 1);
    converge(&w, &t).await.unwrap();
    assert_eq!(w.host.look(&proxies).await.unwrap().len(), 2);
}

/// serve's liveness watch over the fake engine, one pass a second: (slot, verdict kind)
/// of every replica after each pass, and the kills in the engine's history.
async fn watch_passes(w: &World, passes: usize) -> Vec<Vec<(String, String)>> {
    use crate::core::liveness::Verdict;
    let mut watch = crate::ops::liveness::Watch::new();
    let proxies = std::collections::BTreeSet::from(["edge".to_string()]);
    let mut out = Vec::new();
    for _ in 0..passes {
        let judged = watch.pass(&w.host, &proxies).await.unwrap();
        let mut row: Vec<(String, String)> = judged
            .iter()
            .map(|j| {
                let kind = match j.verdict {
                    Verdict::Live => "live".to_string(),
                    Verdict::Starting => "starting".to_string(),
                    Verdict::Quiet { .. } => "quiet".to_string(),
                    Verdict::Dead(why) => format!("dead: {why}"),
                };
                (j.look.container.clone(), kind)
            })
            .collect();
        row.sort();
        out.push(row);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    out
}

fn verdicts_of<'a>(passes: &'a [Vec<(String, String)>], id: &str) -> Vec<&'a str> {
    passes
        .iter()
        .map(|row| {
            row.iter()
                .find(|(c, _)| c == id)
                .map_or("-", |(_, k)| k.as_str())
        })
        .collect()
}

/// A paused replica is killed at the first look 2 s after its last answer, and only it.
#[tokio::test(start_paused = true)]
async fn the_watch_kills_a_paused_replica_after_two_seconds_and_nothing_else() {
    let w = world();
    let t = target(&w, OLD, 3, "rollback");
    converge(&w, &t).await.unwrap();
    let ids: Vec<String> = w.engine.containers().iter().map(|c| c.id.clone()).collect();
    let mut watch = crate::ops::liveness::Watch::new();
    let proxies = std::collections::BTreeSet::from(["edge".to_string()]);
    // It answered once, then the engine froze it.
    watch.pass(&w.host, &proxies).await.unwrap();
    w.engine.pause(&ids[0]);
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let judged = watch.pass(&w.host, &proxies).await.unwrap();
        kinds.push(
            judged
                .iter()
                .find(|j| j.look.container == ids[0])
                .map(|j| (j.verdict, j.killed.clone())),
        );
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    use crate::core::liveness::{DeadReason, Verdict};
    assert!(
        matches!(kinds[0], Some((Verdict::Quiet { .. }, None))),
        "{kinds:?}"
    );
    assert_eq!(
        kinds[1],
        Some((Verdict::Dead(DeadReason::Paused), Some(Ok(()))))
    );
    // Killed, it is not running any more, so not looked at.
    assert_eq!(kinds[2], None);
    let kills: Vec<String> = w
        .engine
        .history()
        .into_iter()
        .filter(|h| h.starts_with("sigkill "))
        .collect();
    assert_eq!(kills.len(), 1, "{kills:?}");
    let states: Vec<RunState> = w.engine.containers().iter().map(|c| c.state).collect();
    assert_eq!(
        states.iter().filter(|s| **s == RunState::Running).count(),
        2,
        "{states:?}"
    );
}

/// A replica whose Envoy stops answering while the engine shows it running, with no CPU
/// reading (the fake has no process): killed only after 10 s of silence.
#[tokio::test(start_paused = true)]
async fn without_a_cpu_reading_the_watch_waits_ten_seconds() {
    let w = world();
    let t = target(&w, OLD, 2, "rollback");
    converge(&w, &t).await.unwrap();
    let hung = w.engine.containers()[1].id.clone();
    let mut watch = crate::ops::liveness::Watch::new();
    let proxies = std::collections::BTreeSet::from(["edge".to_string()]);
    watch.pass(&w.host, &proxies).await.unwrap();
    w.engine.hang(&hung);
    let passes = {
        let mut p = Vec::new();
        for _ in 0..11 {
            tokio::time::advance(Duration::from_secs(1)).await;
            let judged = watch.pass(&w.host, &proxies).await.unwrap();
            p.push(
                judged
                    .iter()
                    .find(|j| j.look.container == hung)
                    .map(|j| j.verdict),
            );
        }
        p
    };
    use crate::core::liveness::Verdict;
    assert!(
        passes[..9]
            .iter()
            .all(|v| matches!(v, Some(Verdict::Quiet { busy: false, .. }))),
        "{passes:?}"
    );
    assert!(matches!(passes[9], Some(Verdict::Dead(_))), "{passes:?}");
}

/// A replica that has not answered since it was first seen is starting: never killed (the
/// rollout gate judges it), however long it takes.
#[tokio::test(start_paused = true)]
async fn the_watch_never_kills_a_replica_that_is_starting() {
    let w = world();
    let t = target(&w, OLD, 1, "rollback");
    converge(&w, &t).await.unwrap();
    let id = w.engine.containers()[0].id.clone();
    w.engine.hang(&id);
    let passes = watch_passes(&w, 15).await;
    let v = verdicts_of(&passes, &id);
    assert!(v.iter().all(|k| *k == "starting"), "{v:?}");
    assert!(!w.engine.history().iter().any(|h| h.starts_with("sigkill")));
}
