//! A replica that stops answering while it keeps its socket (issue 25, DESIGN decision 14),
//! against the real Docker engine and real Envoy: berth never takes the fleet's own frozen
//! replica for a stranger holding the port, and replaces it.

mod common;

use berth::core::replica::RunState;
use common::fleet::*;

/// `docker pause` of one of 2 replicas: the paused Envoy still holds its socket on the port,
/// and the engine reports no pid for it. `berth up` must see it as the fleet's own (never
/// "already in use by envoy (pid N)"), and replace it: a frozen replica never blocks
/// reconciling the rest of its proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_is_the_fleets_own_and_up_replaces_it() {
    let _serial = SERIAL.lock().await;
    let s = Settings::new(NEW, 2);
    let (fleet, ids) = Fleet::up_on("paused", &s).await;
    let (_, paused) = ids[0].clone();
    docker(&["pause", &paused]);
    let out = fleet.up().await;
    let err = stderr(&out);
    assert!(
        !err.contains("already in use"),
        "the fleet's own paused replica was taken for a stranger:\n{err}"
    );
    assert!(out.status.success(), "berth up failed:\n{err}");
    let now = fleet.replicas().await;
    assert!(
        now.iter().all(|c| c.id != paused),
        "the paused replica is still there: {now:#?}"
    );
    assert_eq!(
        now.iter().filter(|c| c.state == RunState::Running).count(),
        2,
        "{now:#?}"
    );
}
