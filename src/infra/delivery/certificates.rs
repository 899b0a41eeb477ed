//! Certificate serials: waiting until every replica's admin `/certs` lists the listener
//! certificates it must serve.

use super::*;

/// Waits until every replica's admin `/certs` lists each of `serials` (the listener
/// certificates it must serve), until `timeout` after the last stage.
pub async fn certificates_served(
    replicas: &[Replica],
    serials: &[String],
    started: Instant,
    timeout: Duration,
) -> BTreeMap<String, Ack> {
    let deadline = Instant::now() + timeout;
    let one = |r: &Replica| {
        let r = r.clone();
        async move {
            loop {
                let last = match r.admin.get("/certs").await {
                    Ok((200, body)) => match serde_json::from_str(&body) {
                        Ok(json) => {
                            let served = crate::core::certificates::served_serials(&json);
                            let missing: Vec<&String> =
                                serials.iter().filter(|s| !served.contains(s)).collect();
                            if missing.is_empty() {
                                let millis = started.elapsed().as_millis() as u64;
                                return (r.name, Ack::Confirmed { millis });
                            }
                            format!("serves serials {served:?}, not yet {missing:?}")
                        }
                        Err(e) => format!("/certs is not JSON: {e}"),
                    },
                    Ok((status, body)) => format!("GET /certs answered {status}: {}", body.trim()),
                    Err(e) => format!("{e:#}"),
                };
                if Instant::now() >= deadline {
                    let detail = format!(
                        "nothing after {}: {last}",
                        humantime::format_duration(timeout)
                    );
                    return (r.name, Ack::NoAnswer { detail });
                }
                tokio::time::sleep(POLL).await;
            }
        }
    };
    futures_util::future::join_all(replicas.iter().map(one))
        .await
        .into_iter()
        .collect()
}
