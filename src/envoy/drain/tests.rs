use std::sync::Mutex;

use anyhow::Result;

use super::*;
use crate::envoy::admin::{BoundListener, ReadyState};

fn shutdown(drain: u64, min: u64, delay: u64) -> Shutdown {
    Shutdown {
        drain_timeout: Duration::from_secs(drain),
        min_drain_duration: Duration::from_secs(min),
        health_check_failure_delay: Duration::from_secs(delay),
    }
}

fn at(start: Instant, ms: u64) -> Instant {
    start + Duration::from_millis(ms)
}

#[test]
fn keep_alive_clients_leave_then_listeners_close_then_done() {
    let t0 = Instant::now();
    let mut s = Schedule::new(t0, &shutdown(60, 1, 0));
    s.health_check_failed();
    // Connections still open, minimum drain not reached: wait.
    assert_eq!(s.step(at(t0, 100), 30), Step::Wait);
    // Idle before the minimum drain time: still wait (a reconnect may land here).
    assert_eq!(s.step(at(t0, 500), 0), Step::Wait);
    // Idle after it: close the listen sockets, then done at the next idle poll.
    assert_eq!(s.step(at(t0, 1000), 0), Step::CloseListeners);
    assert_eq!(s.step(at(t0, 1050), 0), Step::Done);
}

#[test]
fn busy_listeners_close_after_the_grace_and_stragglers_get_the_window() {
    let t0 = Instant::now();
    let mut s = Schedule::new(t0, &shutdown(10, 1, 0));
    s.health_check_failed();
    // Connection-per-request clients keep the count above 0.
    assert_eq!(s.step(at(t0, 2999), 4), Step::Wait);
    assert_eq!(s.step(at(t0, 3000), 4), Step::CloseListeners);
    assert_eq!(s.step(at(t0, 5000), 2), Step::Wait);
    assert_eq!(s.step(at(t0, 6000), 0), Step::Done);
}

#[test]
fn the_drain_timeout_ends_it_with_connections_left() {
    let t0 = Instant::now();
    let mut s = Schedule::new(t0, &shutdown(2, 5, 0));
    s.health_check_failed();
    // The minimum drain time beyond the timeout: the timeout wins for closing, too.
    assert_eq!(s.step(at(t0, 1999), 7), Step::Wait);
    assert_eq!(s.step(at(t0, 2000), 7), Step::CloseListeners);
    assert_eq!(s.step(at(t0, 2001), 7), Step::Done);
}

#[test]
fn a_health_check_failure_delay_keeps_the_listeners_until_it_failed() {
    let t0 = Instant::now();
    let mut s = Schedule::new(t0, &shutdown(60, 0, 3));
    assert_eq!(s.step(at(t0, 10), 0), Step::Wait);
    assert_eq!(s.step(at(t0, 2999), 0), Step::Wait);
    assert_eq!(s.step(at(t0, 3000), 0), Step::FailHealthCheck);
    assert_eq!(s.step(at(t0, 3000), 0), Step::CloseListeners);
    assert_eq!(s.step(at(t0, 3050), 0), Step::Done);
}

#[test]
fn a_delay_past_the_timeout_still_fails_the_health_check() {
    let t0 = Instant::now();
    let mut s = Schedule::new(t0, &shutdown(1, 0, 30));
    assert_eq!(s.step(at(t0, 1000), 3), Step::FailHealthCheck);
    assert_eq!(s.step(at(t0, 1000), 3), Step::CloseListeners);
    assert_eq!(s.step(at(t0, 1000), 3), Step::Done);
}

/// An Envoy whose connections fall by one per poll, recording the admin calls.
struct Draining {
    open: Mutex<u64>,
    calls: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl AdminApi for Draining {
    fn location(&self) -> String {
        "scripted".into()
    }
    async fn ready(&self) -> Result<ReadyState> {
        Ok(ReadyState::Live)
    }
    async fn listeners(&self) -> Result<Vec<BoundListener>> {
        Ok(vec![])
    }
    async fn downstream_connections(&self) -> Result<u64> {
        let mut open = self.open.lock().unwrap();
        let now = *open;
        *open = open.saturating_sub(1);
        Ok(now)
    }
    async fn healthcheck_fail(&self) -> Result<()> {
        self.calls.lock().unwrap().push("healthcheck/fail".into());
        Ok(())
    }
    async fn drain_listeners(&self, graceful_skip_exit: bool) -> Result<()> {
        self.calls.lock().unwrap().push(if graceful_skip_exit {
            "drain_listeners?graceful&skip_exit".into()
        } else {
            "drain_listeners".into()
        });
        Ok(())
    }
    async fn get(&self, _: &str) -> Result<(u16, String)> {
        Ok((404, String::new()))
    }
}

#[tokio::test(start_paused = true)]
async fn drain_calls_envoy_in_order_and_reports_what_was_left() {
    let envoy = Draining {
        open: Mutex::new(5),
        calls: Mutex::new(vec![]),
    };
    let mut seen = vec![];
    let drained = drain(&envoy, &shutdown(60, 0, 0), |open| seen.push(open))
        .await
        .unwrap();
    assert_eq!(drained.left, 0);
    assert_eq!(seen, vec![5, 4, 3, 2, 1]);
    assert_eq!(
        *envoy.calls.lock().unwrap(),
        vec![
            "healthcheck/fail",
            "drain_listeners?graceful&skip_exit",
            "drain_listeners"
        ]
    );
    assert_eq!(drained.elapsed, POLL * 5);
}
