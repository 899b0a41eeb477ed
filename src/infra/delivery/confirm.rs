//! The confirm loop: one stage written, then every replica asked until it took the files,
//! refused them, or the deadline passed.

use super::*;

/// Why a stage did not go through.
pub enum StageError {
    Io(anyhow::Error),
    Unconfirmed(BTreeMap<String, Ack>),
}

/// Writes one stage and waits for every replica to confirm it (a Swarm task's agent does the
/// same for its own Envoy).
pub async fn apply(
    dir: &Path,
    stage: &Stage,
    replicas: &[Replica],
    timeout: Duration,
) -> std::result::Result<BTreeMap<String, Ack>, StageError> {
    let baselines =
        futures_util::future::join_all(replicas.iter().map(|r| snapshot(r.admin.as_ref()))).await;
    let started = Instant::now();
    let renames = write_stage(dir, stage).map_err(StageError::Io)?;
    let on_disk = read_dir_files(dir).map_err(StageError::Io)?;
    let expected = expected_versions(&on_disk);
    let acks = confirm(replicas, &baselines, &expected, renames, started, timeout).await;
    if acks.values().all(|a| matches!(a, Ack::Confirmed { .. })) {
        Ok(acks)
    } else {
        Err(StageError::Unconfirmed(acks))
    }
}

/// A verdict on one replica given its state before and now, or None to keep waiting.
/// `expected` gives, per subscription, the version it must report (None: it must only have
/// reloaded `renames` more times without a new refusal).
pub fn judge(
    before: Option<&Snapshot>,
    now: &Snapshot,
    expected: &BTreeMap<String, Option<String>>,
    renames: u64,
) -> Option<Result<(), String>> {
    let empty = SubState::default();
    let mut all_done = true;
    let mut all_match = true;
    let mut refusals = Vec::new();
    for (sub, want) in expected {
        let Some(cur) = now.get(sub) else {
            // Not created yet (a new listener's routes): keep waiting.
            all_done = false;
            all_match = false;
            continue;
        };
        let base = before.and_then(|b| b.get(sub)).unwrap_or(&empty);
        let new_sub = before.is_some_and(|b| !b.contains_key(sub));
        let done = if new_sub {
            cur.attempts >= 1
        } else {
            cur.attempts >= base.attempts + renames
        };
        let matches = match want {
            Some(v) => cur.version == *v,
            None => done && cur.refused == base.refused,
        };
        if cur.refused > base.refused && !matches {
            refusals.push(format!(
                "{sub}: update_rejected/update_failure +{}, still at version {:?}",
                cur.refused - base.refused,
                cur.version
            ));
        }
        all_done &= done;
        all_match &= matches;
    }
    if all_match {
        return Some(Ok(()));
    }
    if all_done && !refusals.is_empty() {
        return Some(Err(refusals.join("; ")));
    }
    None
}

pub(super) async fn confirm(
    replicas: &[Replica],
    baselines: &[Result<Snapshot>],
    expected: &BTreeMap<String, Option<String>>,
    renames: u64,
    started: Instant,
    timeout: Duration,
) -> BTreeMap<String, Ack> {
    let deadline = started + timeout;
    let one = |r: &Replica, base: Option<&Snapshot>| {
        let r = r.clone();
        let base = base.cloned();
        async move {
            let mut last: String;
            loop {
                match snapshot(r.admin.as_ref()).await {
                    Ok(now) => match judge(base.as_ref(), &now, expected, renames) {
                        Some(Ok(())) => {
                            return (
                                r.name,
                                Ack::Confirmed {
                                    millis: started.elapsed().as_millis() as u64,
                                },
                            )
                        }
                        Some(Err(detail)) => return (r.name, Ack::Rejected { detail }),
                        None => {
                            last = format!(
                                "versions {:?}, waiting for {:?}",
                                expected
                                    .keys()
                                    .map(|s| now
                                        .get(s)
                                        .map(|st| st.version.as_str())
                                        .unwrap_or("-"))
                                    .collect::<Vec<_>>(),
                                expected.values().collect::<Vec<_>>()
                            )
                        }
                    },
                    Err(e) => last = format!("{e:#}"),
                }
                if Instant::now() >= deadline {
                    return (
                        r.name,
                        Ack::NoAnswer {
                            detail: format!(
                                "nothing after {}: {last}",
                                humantime::format_duration(timeout)
                            ),
                        },
                    );
                }
                tokio::time::sleep(POLL).await;
            }
        }
    };
    let acks = futures_util::future::join_all(
        replicas
            .iter()
            .zip(baselines)
            .map(|(r, b)| one(r, b.as_ref().ok())),
    )
    .await;
    acks.into_iter().collect()
}
