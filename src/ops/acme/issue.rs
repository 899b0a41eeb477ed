//! Obtaining a certificate: account, order, HTTP-01 answers delivered as live routes of the
//! proxy, finalization, and delivery of the new pair through the same converge as any change
//! (part A checks it and every replica confirms it). Used by `berth up` and serve's renewal.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use instant_acme::{Account, AccountCredentials, Identifier, NewAccount, NewOrder, RetryPolicy};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{backoff, renewal_time, unix, AcmeStatus, ListenerFiles};
use crate::core::ir::{self, Infra, ProxyInfra};
use crate::core::progress::{Event, Reporter};
use crate::core::render::Renderer;
use crate::infra::ConvergeRequest;
use crate::ops::Operations;

/// How long the CA gets to validate the answers and to issue.
const ORDER_TIMEOUT: Duration = Duration::from_secs(60);

/// Converges one proxy as it is, or with challenge answers: what issuance needs of the
/// operations layer.
pub struct Converger<'a> {
    pub ops: &'a Operations,
    pub renderer: &'a Renderer,
    pub state_dir: &'a Path,
    pub host_cpus: u32,
    pub confirm_timeout: Duration,
    pub reporter: &'a Reporter,
}

impl Converger<'_> {
    pub(super) async fn deliver(&self, proxy: &ProxyInfra) -> Result<()> {
        let infra = Infra {
            proxies: vec![proxy.clone()],
        };
        let targets = crate::core::target::targets(
            &infra,
            self.renderer,
            self.state_dir,
            self.host_cpus,
            super::Placeholders::Write,
        )?;
        let converged = self
            .ops
            .converge(ConvergeRequest {
                target: &targets[0],
                generation: None,
                hold_files: false,
                confirm_timeout: self.confirm_timeout,
                reporter: self.reporter,
                cancel: CancellationToken::new(),
            })
            .await?;
        if let Some(r) = converged.delivery.failed() {
            bail!("{r}");
        }
        Ok(())
    }
}

/// One attempt for one listener.
#[derive(Debug)]
pub struct Renewal {
    pub proxy: String,
    pub listener: String,
    /// Ok: the serial now served and how long issuance took (order to every replica serving).
    pub result: Result<(String, Duration), String>,
}

/// Obtains a certificate for every ACME listener of `proxies` that needs one: none yet (a
/// placeholder serves), other domains, or past two thirds of its lifetime. With
/// `respect_backoff`, a listener whose last attempts failed waits out its backoff first (serve);
/// without, it is tried now (`up`, asked by a person). Each outcome is recorded in the
/// listener's status; a failure leaves the served certificate as it was.
pub async fn renew_due(
    conv: &Converger<'_>,
    proxies: &[ProxyInfra],
    respect_backoff: bool,
) -> Vec<Renewal> {
    let mut out = Vec::new();
    for proxy in proxies {
        let ir::Routing::Standalone(s) = &proxy.routing else {
            continue;
        };
        for l in &s.listeners {
            let Some(acme) = &l.acme else { continue };
            let files = ListenerFiles::new(conv.state_dir, &proxy.name, &l.listener);
            let now = SystemTime::now();
            if !is_due(&files, acme, now, respect_backoff) {
                continue;
            }
            let result = obtain(conv, proxy, &l.listener, acme, &files).await;
            let mut st = AcmeStatus::read(&files.status());
            st.last_attempt = Some(unix(now));
            let result = match result {
                Ok((serial, not_before, not_after, took)) => {
                    st.placeholder = false;
                    st.issued_at = Some(unix(SystemTime::now()));
                    st.failures = 0;
                    st.last_error = None;
                    st.next_renewal = Some(renewal_time(not_before, not_after));
                    st.solver = Some(super::solve::solver_name(acme));
                    conv.reporter.event(Event::new(&proxy.name, "acme").message(format!(
                        "listener {}: certificate for {} issued by {} over {} (serial {serial}) and served by every replica in {took:.1?}",
                        l.listener,
                        acme.domains.join(", "),
                        super::solve::solver_name(acme),
                        acme.directory
                    )));
                    Ok((serial, took))
                }
                Err(e) => {
                    let msg = format!(
                        "proxy {}, listener {}: could not obtain a certificate for {} from {} over {}: {e:#}; the current certificate keeps serving",
                        proxy.name,
                        l.listener,
                        acme.domains.join(", "),
                        acme.directory,
                        super::solve::solver_name(acme)
                    );
                    st.failures += 1;
                    st.solver = Some(super::solve::solver_name(acme));
                    st.last_error = Some(msg.clone());
                    st.next_renewal = Some(unix(now) + backoff(st.failures).as_secs() as i64);
                    conv.reporter
                        .event(Event::new(&proxy.name, "acme").message(msg.clone()));
                    Err(msg)
                }
            };
            if let Err(e) = st.write(&files.status()) {
                tracing::warn!("{e:#}");
            }
            out.push(Renewal {
                proxy: proxy.name.clone(),
                listener: l.listener.clone(),
                result,
            });
        }
    }
    out
}

/// When the listener's next attempt is due (Unix seconds): [`planned`], and after failures
/// not before the backoff has passed.
pub fn due_at(files: &ListenerFiles, acme: &ir::Acme, now: SystemTime) -> i64 {
    let st = AcmeStatus::read(&files.status());
    let planned = planned(files, acme, now);
    match (st.failures, st.last_attempt) {
        (0, _) | (_, None) => planned,
        (n, Some(last)) => planned.max(last + backoff(n).as_secs() as i64),
    }
}

/// Now for a placeholder or a pair that does not fit; else two thirds into the served
/// certificate's lifetime.
fn planned(files: &ListenerFiles, acme: &ir::Acme, now: SystemTime) -> i64 {
    let st = AcmeStatus::read(&files.status());
    if st.placeholder || !super::usable(files, acme, now) {
        return unix(now);
    }
    crate::core::certificates::check("", &files.cert(), &files.key(), now)
        .map_or(unix(now), |c| renewal_time(c.not_before, c.not_after))
}

fn is_due(files: &ListenerFiles, acme: &ir::Acme, now: SystemTime, respect_backoff: bool) -> bool {
    let at = if respect_backoff {
        due_at(files, acme, now)
    } else {
        planned(files, acme, now)
    };
    at <= unix(now)
}

/// One issuance: returns the new serial, its validity and how long it took.
async fn obtain(
    conv: &Converger<'_>,
    proxy: &ProxyInfra,
    listener: &str,
    acme: &ir::Acme,
    files: &ListenerFiles,
) -> Result<(String, i64, i64, Duration)> {
    let start = Instant::now();
    let outcome = order(conv, proxy, listener, acme, files).await;
    // The answers go in any case; on success the new pair comes in with the same converge.
    let delivered = conv.deliver(proxy).await;
    let (serial, not_before, not_after) = outcome?;
    delivered.context("delivering the new certificate")?;
    Ok((serial, not_before, not_after, start.elapsed()))
}

async fn order(
    conv: &Converger<'_>,
    proxy: &ProxyInfra,
    listener: &str,
    acme: &ir::Acme,
    files: &ListenerFiles,
) -> Result<(String, i64, i64)> {
    let identifiers: Vec<Identifier> = acme
        .domains
        .iter()
        .map(|d| Identifier::Dns(d.clone()))
        .collect();
    let mut account = account(conv.state_dir, acme, false).await?;
    let mut order = match account.new_order(&NewOrder::new(&identifiers)).await {
        Err(instant_acme::Error::Api(p))
            if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:accountDoesNotExist") =>
        {
            // The CA forgot the account (a test CA restarted): register again.
            account = self::account(conv.state_dir, acme, true).await?;
            account.new_order(&NewOrder::new(&identifiers)).await?
        }
        other => other?,
    };
    super::solve::answer(conv, proxy, listener, acme, &mut order).await?;
    let policy = RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .backoff(1.5)
        .timeout(ORDER_TIMEOUT);
    let key_pem = order.finalize().await?;
    let cert_pem = order.poll_certificate(&policy).await?;
    install(files, cert_pem.as_bytes(), key_pem.as_bytes())
}

/// Checks the issued pair as part A would, then puts it where the listener reads it.
fn install(files: &ListenerFiles, cert_pem: &[u8], key_pem: &[u8]) -> Result<(String, i64, i64)> {
    let next = ListenerFiles {
        dir: files.dir.join("next"),
    };
    crate::state::create_dir(&next.dir, 0o700)?;
    super::write_pair(&next, cert_pem, key_pem)?;
    let c = crate::core::certificates::check("", &next.cert(), &next.key(), SystemTime::now())
        .context("the CA's certificate")?;
    super::write_pair(files, cert_pem, key_pem)?;
    let _ = std::fs::remove_dir_all(&next.dir);
    Ok((c.serial, c.not_before, c.not_after))
}

/// The account for `acme`'s directory and email, from the state directory or newly registered
/// (`fresh`: always newly registered).
async fn account(state_dir: &Path, acme: &ir::Acme, fresh: bool) -> Result<Account> {
    let path = account_file(state_dir, acme);
    let builder = || -> Result<instant_acme::AccountBuilder> {
        Ok(match &acme.ca_file {
            Some(ca) => Account::builder_with_root(ca)
                .with_context(|| format!("reading ca_file {}", ca.display()))?,
            None => Account::builder()?,
        })
    };
    if !fresh {
        if let Ok(bytes) = std::fs::read(&path) {
            let creds: AccountCredentials = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not an ACME account file", path.display()))?;
            return Ok(builder()?.from_credentials(creds).await?);
        }
    }
    let contact = acme.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, creds) = builder()?
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            acme.directory.clone(),
            None,
        )
        .await
        .context("registering an ACME account")?;
    crate::state::create_dir(path.parent().expect("accounts dir"), 0o700)?;
    crate::state::write_atomic(&path, &serde_json::to_vec(&creds)?, 0o600)?;
    Ok(account)
}

fn account_file(state_dir: &Path, acme: &ir::Acme) -> PathBuf {
    let mut h = Sha256::new();
    h.update(acme.directory.as_bytes());
    h.update([0]);
    h.update(acme.email.as_deref().unwrap_or("").as_bytes());
    super::accounts_dir(state_dir).join(format!("{}.json", &hex::encode(h.finalize())[..16]))
}
