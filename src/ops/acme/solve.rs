//! Answering an order's challenges with the listener's solver: HTTP-01 routes, TLS-ALPN-01
//! certificates on the listener itself, or DNS-01 TXT records. Whatever was put up comes down
//! again before [`answer`] returns, also when the CA refused.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use instant_acme::{AuthorizationStatus, ChallengeType, Order, OrderStatus, RetryPolicy};

use super::challenge::{with_answers, Answer};
use super::dns::{self, TxtRecord};
use super::issue::Converger;
use crate::core::ir::{self, ProxyInfra};

/// How long the CA gets to validate the answers.
const VALIDATION_TIMEOUT: Duration = Duration::from_secs(60);

/// The solver as status and errors name it: "http-01", "tls-alpn-01", "dns-01 rfc2136".
pub fn solver_name(acme: &ir::Acme) -> String {
    match &acme.challenge {
        ir::AcmeChallenge::Dns01(d) => format!("dns-01 {}", d.provider.name()),
        other => other.name().to_string(),
    }
}

fn challenge_type(acme: &ir::Acme) -> ChallengeType {
    match acme.challenge {
        ir::AcmeChallenge::Http01 => ChallengeType::Http01,
        ir::AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        ir::AcmeChallenge::Dns01(_) => ChallengeType::Dns01,
    }
}

/// One pending authorization's challenge, in each form a solver needs.
struct Pending {
    /// As ordered: `*.example.com` for a wildcard.
    identifier: String,
    token: String,
    key_authorization: String,
    /// SHA-256 of the key authorization (TLS-ALPN-01's acmeIdentifier).
    digest: Vec<u8>,
    /// base64url of the digest (DNS-01's TXT value).
    dns_value: String,
}

/// Puts up the answers for every pending authorization, tells the CA they are ready, waits for
/// the order to be ready, and takes the answers down. `listener` is the ACME listener.
pub async fn answer(
    conv: &Converger<'_>,
    proxy: &ProxyInfra,
    listener: &str,
    acme: &ir::Acme,
    order: &mut Order,
) -> Result<()> {
    let kind = challenge_type(acme);
    let mut pending = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        match authz.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => bail!("authorization for {} is {other:?}", authz.identifier()),
        }
        let identifier = authz.identifier().to_string();
        let challenge = authz.challenge(kind.clone()).ok_or_else(|| {
            anyhow!(
                "the CA offers no {} challenge for {identifier}, the one this listener answers",
                acme.challenge.name()
            )
        })?;
        let ka = challenge.key_authorization();
        pending.push(Pending {
            identifier,
            token: challenge.token.clone(),
            key_authorization: ka.as_str().to_string(),
            digest: ka.digest().as_ref().to_vec(),
            dns_value: ka.dns_value(),
        });
    }
    if pending.is_empty() {
        return Ok(());
    }
    let records: Vec<TxtRecord> = pending
        .iter()
        .map(|p| TxtRecord::new(&p.identifier, p.dns_value.clone()))
        .collect();
    let validated = async {
        present(conv, proxy, listener, acme, &pending, &records).await?;
        ready(order, kind.clone()).await
    }
    .await;
    // Down again whatever happened (HTTP-01 and TLS-ALPN-01 answers go with the delivery of
    // the new pair, see issue::obtain).
    if let ir::AcmeChallenge::Dns01(d) = &acme.challenge {
        if let Err(e) = dns::cleanup(d, &records).await {
            match &validated {
                Ok(()) => tracing::warn!("{e:#}"),
                Err(_) => tracing::warn!("{e:#} (after the failure)"),
            }
        }
    }
    validated
}

async fn present(
    conv: &Converger<'_>,
    proxy: &ProxyInfra,
    listener: &str,
    acme: &ir::Acme,
    pending: &[Pending],
    records: &[TxtRecord],
) -> Result<()> {
    match &acme.challenge {
        ir::AcmeChallenge::Http01 => {
            let answers: Vec<Answer> = pending
                .iter()
                .map(|p| Answer {
                    token: p.token.clone(),
                    key_authorization: p.key_authorization.clone(),
                })
                .collect();
            conv.deliver(&with_answers(proxy, &acme.challenge_listener, &answers))
                .await
                .context("delivering the http-01 answers to the proxy")
        }
        ir::AcmeChallenge::TlsAlpn01 => {
            let answers: Vec<(String, Vec<u8>)> = pending
                .iter()
                .map(|p| (p.identifier.clone(), p.digest.clone()))
                .collect();
            let with = super::alpn::with_answers(conv.state_dir, proxy, listener, &answers)
                .context("making the tls-alpn-01 certificates")?;
            conv.deliver(&with)
                .await
                .context("delivering the tls-alpn-01 certificates to the proxy")
        }
        ir::AcmeChallenge::Dns01(d) => dns::present(d, records).await,
    }
}

/// Tells the CA every pending challenge is ready and waits for the order to be ready.
async fn ready(order: &mut Order, kind: ChallengeType) -> Result<()> {
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz?;
        if authz.status != AuthorizationStatus::Pending {
            continue;
        }
        if let Some(mut c) = authz.challenge(kind.clone()) {
            c.set_ready().await?;
        }
    }
    let policy = RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .backoff(1.5)
        .timeout(VALIDATION_TIMEOUT);
    let status = order.poll_ready(&policy).await?;
    if status != OrderStatus::Ready {
        bail!("the order is {status:?}: {}", challenge_errors(order).await);
    }
    Ok(())
}

/// Why the CA refused the answers, from each authorization's challenges.
async fn challenge_errors(order: &mut Order) -> String {
    let mut out = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authz)) = authorizations.next().await {
        let Ok(state) = authz.refresh().await else {
            continue;
        };
        for c in &state.challenges {
            if let Some(e) = &c.error {
                out.push(format!("{}: {e}", state.identifier()));
            }
        }
    }
    if out.is_empty() {
        "the CA gave no reason".into()
    } else {
        out.join("; ")
    }
}
