//! The one readiness probe (DESIGN decision 11): a replica is ready only when its Envoy is LIVE
//! **and** every listener port its proxy declares is bound. LIVE alone means "initialised",
//! not "serving": a listener Envoy could not bind (a port below
//! `ip_unprivileged_port_start` after a reboot, a port taken) is only a rejected LDS update in
//! its log, and in xDS mode an Envoy whose xDS server never answered turns LIVE after its
//! initial fetch timeout with no listener at all.
//!
//! The rollout gate, serve's Ready condition, `/status`, `berth status` and the metrics all
//! call [`probe`]; none has a readiness notion of its own.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

pub use crate::core::expect::Expect;
use crate::envoy::admin::{AdminApi, ReadyState};

/// How long one probe's admin calls may take on a status path (the gate polls with its own).
pub const STATUS_TIMEOUT: Duration = Duration::from_millis(1000);

/// Whether `l` is the listener `expect`ed on `port`: that port, and the expected address
/// where Envoy reports one.
fn is_bound(expect: &Expect, port: u16, l: &crate::envoy::admin::BoundListener) -> bool {
    let want = expect
        .addresses
        .get(&port)
        .copied()
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    l.port == port && l.address.is_none_or(|a| a == want)
}

/// The verdict of one probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "ready", rename_all = "kebab-case")]
pub enum Readiness {
    /// LIVE and every declared port bound.
    Ready,
    /// Anything else, with the reason.
    NotReady { reason: NotReady },
}

/// Why a replica is not ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum NotReady {
    /// The admin socket does not answer (not started yet, gone, or hung).
    AdminUnreachable { detail: String },
    /// Envoy is still initialising (PRE_INITIALIZING, INITIALIZING).
    Starting { state: String },
    /// Envoy is draining (failing health checks on purpose).
    Draining,
    /// LIVE, but some declared listener ports are not bound.
    ListenersNotBound { missing: Vec<u16> },
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }

    /// The state Envoy's `/ready` answered during the probe ("LIVE", "DRAINING", …), or None
    /// when its admin socket did not answer: a status row shows it without asking again.
    pub fn envoy_state(&self) -> Option<String> {
        match self {
            Readiness::Ready
            | Readiness::NotReady {
                reason: NotReady::ListenersNotBound { .. },
            } => Some(ReadyState::Live.to_string()),
            Readiness::NotReady { reason } => match reason {
                NotReady::Starting { state } => Some(state.clone()),
                NotReady::Draining => Some(ReadyState::Draining.to_string()),
                _ => None,
            },
        }
    }

    /// Short, for tables: "ready", "starting", "not-serving", "draining", "-".
    pub fn short(&self) -> &'static str {
        match self {
            Readiness::Ready => "ready",
            Readiness::NotReady { reason } => match reason {
                NotReady::AdminUnreachable { .. } => "-",
                NotReady::Starting { .. } => "starting",
                NotReady::Draining => "draining",
                NotReady::ListenersNotBound { .. } => "not-serving",
            },
        }
    }
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::AdminUnreachable { detail } => {
                write!(f, "its admin socket does not answer ({detail})")
            }
            NotReady::Starting { state } => write!(f, "Envoy is {state}"),
            NotReady::Draining => f.write_str("Envoy is draining"),
            NotReady::ListenersNotBound { missing } => {
                let ports: Vec<String> = missing.iter().map(u16::to_string).collect();
                write!(
                    f,
                    "Envoy is LIVE but not listening on port(s) {} (it could not bind them, or its \
                     xDS server sent no listener for them); its log says why",
                    ports.join(", ")
                )
            }
        }
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Readiness::Ready => f.write_str("ready"),
            Readiness::NotReady { reason } => write!(f, "not ready: {reason}"),
        }
    }
}

/// Probes one replica: `/ready` and, when ports are expected, `/listeners`, both at once (the
/// listeners answer counts only when Envoy is LIVE).
pub async fn probe(admin: &dyn AdminApi, expect: &Expect) -> Readiness {
    let not = |reason| Readiness::NotReady { reason };
    let (ready, listeners) = if expect.ports.is_empty() {
        (admin.ready().await, None)
    } else {
        let (ready, listeners) = futures_util::future::join(admin.ready(), admin.listeners()).await;
        (ready, Some(listeners))
    };
    match ready {
        Err(e) => not(NotReady::AdminUnreachable {
            detail: format!("{e:#}"),
        }),
        Ok(ReadyState::Live) => {
            let Some(listeners) = listeners else {
                return Readiness::Ready;
            };
            match listeners {
                Err(e) => not(NotReady::AdminUnreachable {
                    detail: format!("{e:#}"),
                }),
                Ok(bound) => {
                    let missing: Vec<u16> = expect
                        .ports
                        .iter()
                        .copied()
                        .filter(|p| !bound.iter().any(|l| is_bound(expect, *p, l)))
                        .collect();
                    if missing.is_empty() {
                        Readiness::Ready
                    } else {
                        not(NotReady::ListenersNotBound { missing })
                    }
                }
            }
        }
        Ok(ReadyState::Draining) => not(NotReady::Draining),
        Ok(other) => not(NotReady::Starting {
            state: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::admin::BoundListener;
    use anyhow::{anyhow, Result};

    struct Scripted {
        ready: Option<ReadyState>,
        ports: Vec<u16>,
    }

    #[async_trait::async_trait]
    impl AdminApi for Scripted {
        fn location(&self) -> String {
            "scripted".into()
        }
        async fn ready(&self) -> Result<ReadyState> {
            self.ready.clone().ok_or_else(|| anyhow!("no such socket"))
        }
        async fn listeners(&self) -> Result<Vec<BoundListener>> {
            Ok(self
                .ports
                .iter()
                .map(|p| BoundListener {
                    name: format!("l{p}"),
                    port: *p,
                    address: Some("0.0.0.0".parse().unwrap()),
                })
                .collect())
        }
        async fn downstream_connections(&self) -> Result<u64> {
            Ok(0)
        }
        async fn healthcheck_fail(&self) -> Result<()> {
            Ok(())
        }
        async fn drain_listeners(&self, _: bool) -> Result<()> {
            Ok(())
        }
        async fn get(&self, _: &str) -> Result<(u16, String)> {
            Ok((404, String::new()))
        }
    }

    fn expect(ports: &[u16]) -> Expect {
        Expect {
            ports: ports.to_vec(),
            addresses: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_port_bound_on_another_address_is_not_the_listener() {
        let a = Scripted {
            ready: Some(ReadyState::Live),
            ports: vec![80],
        };
        let mut e = expect(&[80]);
        e.addresses.insert(80, "127.0.0.1".parse().unwrap());
        assert!(
            !probe(&a, &e).await.is_ready(),
            "bound on 0.0.0.0, expected on 127.0.0.1"
        );
        e.addresses.insert(80, "0.0.0.0".parse().unwrap());
        assert!(probe(&a, &e).await.is_ready());
    }

    #[tokio::test]
    async fn live_with_every_port_bound_is_ready() {
        let a = Scripted {
            ready: Some(ReadyState::Live),
            ports: vec![80, 443],
        };
        assert_eq!(probe(&a, &expect(&[80, 443])).await, Readiness::Ready);
        assert_eq!(probe(&a, &expect(&[])).await, Readiness::Ready);
        assert_eq!(Readiness::Ready.envoy_state().as_deref(), Some("LIVE"));
    }

    #[tokio::test]
    async fn live_with_a_port_missing_is_not() {
        let a = Scripted {
            ready: Some(ReadyState::Live),
            ports: vec![443],
        };
        let r = probe(&a, &expect(&[80, 443])).await;
        assert_eq!(
            r,
            Readiness::NotReady {
                reason: NotReady::ListenersNotBound { missing: vec![80] }
            }
        );
        assert!(r.to_string().contains("port(s) 80"), "{r}");
        // xDS mode with nothing pushed: LIVE after the initial fetch timeout, no listener.
        let empty = Scripted {
            ready: Some(ReadyState::Live),
            ports: vec![],
        };
        assert!(!probe(&empty, &expect(&[10080])).await.is_ready());
    }

    #[tokio::test]
    async fn other_states_are_not_ready() {
        for (state, short) in [
            (Some(ReadyState::PreInitializing), "starting"),
            (Some(ReadyState::Initializing), "starting"),
            (Some(ReadyState::Draining), "draining"),
            (None, "-"),
        ] {
            let a = Scripted {
                ready: state.clone(),
                ports: vec![80],
            };
            let r = probe(&a, &expect(&[80])).await;
            assert!(!r.is_ready());
            assert_eq!(r.short(), short);
            assert_eq!(r.envoy_state(), state.map(|s| s.to_string()));
        }
    }
}
