//! The planner's unit tests: one per case, plus a randomized simulation that applies plans to
//! observed sets and checks they converge in one step and never touch foreign containers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::*;
use crate::core::replica::tests::{desired, desired_of, proxy_infra, STATE};
use crate::core::replica::{
    LiveSettings, ReplicaContainer, LABEL_IMAGE_ID, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PROXY,
    LABEL_SLOT, LABEL_SPEC_HASH, MANAGED_BY_VALUE,
};

// ---- helpers -----------------------------------------------------------------------------

/// A container exactly as berth would have created it for `slot` of `d`, running.
fn replica(d: &DesiredProxy, slot: u32) -> ObservedContainer {
    replica_named(d, slot, &replica_name(d.name(), slot, &d.hash))
}

fn replica_named(d: &DesiredProxy, slot: u32, name: &str) -> ObservedContainer {
    let r = ReplicaContainer::new(
        d,
        slot,
        name,
        "sha256:img",
        Path::new(STATE),
        &Default::default(),
    );
    ObservedContainer {
        id: format!("id-{name}"),
        name: name.to_string(),
        labels: r.labels,
        state: RunState::Running,
        live: LiveSettings {
            nano_cpus: r.nano_cpus,
            memory: r.memory,
            restart_policy: RESTART_POLICY.to_string(),
        },
        info: Default::default(),
    }
}

/// The replicas of `d`, all slots, all running and current.
fn fleet(d: &DesiredProxy) -> Vec<ObservedContainer> {
    (0..d.replicas).map(|s| replica(d, s)).collect()
}

fn with_state(mut c: ObservedContainer, state: RunState) -> ObservedContainer {
    c.state = state;
    c
}

/// A container that is not berth's, whatever it looks like.
fn foreign(name: &str, labels: &[(&str, &str)]) -> ObservedContainer {
    ObservedContainer {
        id: format!("foreign-{name}"),
        name: name.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        state: RunState::Running,
        live: LiveSettings {
            nano_cpus: None,
            memory: None,
            restart_policy: "no".to_string(),
        },
        info: Default::default(),
    }
}

fn lines(p: &Plan) -> Vec<String> {
    p.actions.iter().map(ToString::to_string).collect()
}

fn with_image(name: &str, replicas: u32, image: &str) -> DesiredProxy {
    let mut p = proxy_infra(name, replicas, &[8080]);
    p.config.image = image.to_string();
    desired_of(&p)
}

fn cref(c: &ObservedContainer) -> ContainerRef {
    ContainerRef {
        id: c.id.clone(),
        name: c.name.clone(),
    }
}

// ---- the basic cases ---------------------------------------------------------------------

#[test]
fn fresh_install_creates_every_slot_in_order() {
    let d = desired("edge", 3, &[8080]);
    let p = plan(std::slice::from_ref(&d), &[]);
    assert_eq!(
        p.actions,
        (0..3)
            .map(|slot| Action::Create {
                proxy: "edge".into(),
                slot,
                name: replica_name("edge", slot, &d.hash),
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.summary(),
        PlanSummary {
            create: 3,
            ..PlanSummary::default()
        }
    );
    assert!(p.notes.is_empty());
}

#[test]
fn converged_fleet_is_a_no_op() {
    let a = desired("a", 3, &[8080]);
    let b = desired("b", 1, &[9090]);
    let mut obs = fleet(&a);
    obs.extend(fleet(&b));
    obs.push(foreign("nginx", &[]));
    let p = plan(&[a, b], &obs);
    assert!(p.is_empty(), "{p}");
    assert!(p.notes.is_empty());
    assert_eq!(p.to_string(), "No changes.\n");
}

#[test]
fn nothing_desired_nothing_observed() {
    assert_eq!(plan(&[], &[]), Plan::default());
}

#[test]
fn scale_up_creates_only_the_new_slots() {
    let mut p5 = proxy_infra("edge", 5, &[8080]);
    p5.config.concurrency = Some(1);
    let mut p3 = p5.clone();
    p3.config.replicas = 3;
    let (d3, d5) = (desired_of(&p3), desired_of(&p5));
    assert_eq!(d3.hash, d5.hash);
    let p = plan(std::slice::from_ref(&d5), &fleet(&d3));
    assert_eq!(
        lines(&p),
        [
            format!("+ create edge/3 as {}", replica_name("edge", 3, &d5.hash)),
            format!("+ create edge/4 as {}", replica_name("edge", 4, &d5.hash)),
        ]
    );
}

#[test]
fn scale_up_on_a_two_cpu_host_keeps_existing_replicas() {
    // Default concurrency: 2 CPUs / 3 = 1 and 2 / 5 = 1, so the hash holds (see spec docs).
    let d3 = desired("edge", 3, &[8080]);
    let d5 = desired("edge", 5, &[8080]);
    assert_eq!(d3.hash, d5.hash);
    let p = plan(&[d5], &fleet(&d3));
    assert_eq!(p.summary().create, 2);
    assert_eq!(p.actions.len(), 2);
}

#[test]
fn scale_down_removes_the_highest_slots_first() {
    let d5 = desired("edge", 5, &[8080]);
    let d2 = desired("edge", 2, &[8080]);
    let obs = fleet(&d5);
    let p = plan(&[d2], &obs);
    assert_eq!(
        p.actions,
        [4, 3, 2]
            .iter()
            .map(|&s| Action::Remove {
                proxy: "edge".into(),
                slot: Some(s),
                container: cref(&obs[s as usize]),
                reason: RemoveReason::ScaleDown,
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(
        p.to_string().lines().next().unwrap(),
        format!("- remove edge/4 ({}): scale down", obs[4].name)
    );
}

#[test]
fn scale_to_zero_removes_everything() {
    let d = desired("edge", 2, &[8080]);
    let p = plan(&[desired("edge", 0, &[8080])], &fleet(&d));
    assert_eq!(p.summary().remove, 2);
    assert_eq!(
        p.actions.iter().map(Action::slot).collect::<Vec<_>>(),
        [Some(1), Some(0)]
    );
}

#[test]
fn image_change_replaces_every_replica_in_slot_order() {
    let old = with_image("edge", 3, "envoyproxy/envoy:v1.39.3");
    let new = with_image("edge", 3, "envoyproxy/envoy:v1.40.0");
    let obs = fleet(&old);
    let p = plan(std::slice::from_ref(&new), &obs);
    assert_eq!(
        p.actions,
        (0..3)
            .map(|slot| Action::Replace {
                proxy: "edge".into(),
                slot,
                old: cref(&obs[slot as usize]),
                new_name: replica_name("edge", slot, &new.hash),
                reason: ReplaceReason::SpecChanged {
                    from: old.hash.clone(),
                    to: new.hash.clone(),
                },
            })
            .collect::<Vec<_>>()
    );
    // Start-first: the new name differs from the old one.
    for a in &p.actions {
        assert_ne!(a.new_name(), a.container().map(|c| c.name.as_str()));
    }
    assert_eq!(
        lines(&p)[1],
        format!(
            "~ replace edge/1 ({}): spec {} → {}",
            obs[1].name,
            &old.hash[..12],
            &new.hash[..12]
        )
    );
}

#[test]
fn bootstrap_change_replaces_every_replica() {
    let p = proxy_infra("edge", 2, &[8080]);
    let old = desired_proxy_with(&p, "a: 1\n");
    let new = desired_proxy_with(&p, "a: 2\n");
    assert_ne!(old.hash, new.hash);
    let plan = plan(std::slice::from_ref(&new), &fleet(&old));
    assert_eq!(plan.summary().replace, 2);
    assert!(plan.actions.iter().all(|a| matches!(
        a,
        Action::Replace { reason: ReplaceReason::SpecChanged { to, .. }, .. } if *to == new.hash
    )));
}

fn desired_proxy_with(p: &crate::core::ir::ProxyInfra, bootstrap: &str) -> DesiredProxy {
    crate::core::replica::desired_proxy(p, bootstrap, Path::new(STATE), 2)
}

#[test]
fn spec_changes_replace_and_scale_down_together() {
    // 5 → 2 replicas and a new image: replace the two kept slots, remove the rest last.
    let old = with_image("edge", 5, "img:1");
    let new = with_image("edge", 2, "img:2");
    let p = plan(&[new], &fleet(&old));
    let kinds: Vec<(String, Option<u32>)> = p
        .actions
        .iter()
        .map(|a| (a.to_string()[..1].to_string(), a.slot()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("~".into(), Some(0)),
            ("~".into(), Some(1)),
            ("-".into(), Some(4)),
            ("-".into(), Some(3)),
            ("-".into(), Some(2)),
        ]
    );
}

// ---- drift -------------------------------------------------------------------------------

#[test]
fn missing_replica_is_recreated() {
    let d = desired("edge", 3, &[8080]);
    let mut obs = fleet(&d);
    obs.remove(1);
    let p = plan(std::slice::from_ref(&d), &obs);
    assert_eq!(
        p.actions,
        [Action::Create {
            proxy: "edge".into(),
            slot: 1,
            name: replica_name("edge", 1, &d.hash),
        }]
    );
}

#[test]
fn stopped_replica_is_started() {
    let d = desired("edge", 3, &[8080]);
    for state in [RunState::Exited, RunState::Created] {
        let mut obs = fleet(&d);
        obs[2] = with_state(obs[2].clone(), state);
        let p = plan(std::slice::from_ref(&d), &obs);
        assert_eq!(
            p.actions,
            [Action::Start {
                proxy: "edge".into(),
                slot: 2,
                container: cref(&obs[2]),
            }],
            "{state}"
        );
        assert_eq!(lines(&p), [format!("> start edge/2 ({})", obs[2].name)]);
    }
}

#[test]
fn dead_replica_is_replaced_not_started() {
    let d = desired("edge", 2, &[8080]);
    let mut obs = fleet(&d);
    obs[0] = with_state(obs[0].clone(), RunState::Dead);
    let p = plan(std::slice::from_ref(&d), &obs);
    let base = replica_name("edge", 0, &d.hash);
    assert_eq!(
        p.actions,
        [Action::Replace {
            proxy: "edge".into(),
            slot: 0,
            old: cref(&obs[0]),
            // Same spec, same slot: the base name is the dead one's, so a suffix is added.
            new_name: format!("{base}-1"),
            reason: ReplaceReason::Dead,
        }]
    );
    assert_eq!(lines(&p), [format!("~ replace edge/0 ({base}): dead")]);
}

#[test]
fn memory_changed_by_hand_is_replaced() {
    let mut p = proxy_infra("edge", 2, &[8080]);
    p.config.resources.memory = Some(536_870_912);
    let d = desired_of(&p);
    let mut obs = fleet(&d);
    obs[1].live.memory = Some(268_435_456);
    let plan = plan(std::slice::from_ref(&d), &obs);
    assert_eq!(
        plan.actions,
        [Action::Replace {
            proxy: "edge".into(),
            slot: 1,
            old: cref(&obs[1]),
            new_name: format!("{}-1", obs[1].name),
            reason: ReplaceReason::Drifted {
                what: "memory 536870912 → 268435456 (live)".into()
            },
        }]
    );
    assert_eq!(
        lines(&plan),
        [format!(
            "~ replace edge/1 ({}): drifted: memory 536870912 → 268435456 (live)",
            obs[1].name
        )]
    );
}

#[test]
fn memory_limit_added_or_removed_by_hand_is_drift() {
    let d = desired("edge", 1, &[8080]);
    let mut obs = fleet(&d);
    obs[0].live.memory = Some(1 << 30);
    assert_eq!(
        plan(std::slice::from_ref(&d), &obs).actions[0],
        Action::Replace {
            proxy: "edge".into(),
            slot: 0,
            old: cref(&obs[0]),
            new_name: format!("{}-1", obs[0].name),
            reason: ReplaceReason::Drifted {
                what: "memory none → 1073741824 (live)".into()
            },
        }
    );
    // Docker reports "no limit" as 0: not drift.
    obs[0].live.memory = Some(0);
    obs[0].live.nano_cpus = Some(0);
    assert!(plan(std::slice::from_ref(&d), &obs).is_empty());
}

#[test]
fn cpus_changed_by_hand_is_replaced() {
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.resources.cpus = Some(1.5);
    let d = desired_of(&p);
    let mut obs = fleet(&d);
    obs[0].live.nano_cpus = Some(500_000_000);
    let plan = plan(&[d], &obs);
    assert!(
        matches!(
            &plan.actions[..],
            [Action::Replace { reason: ReplaceReason::Drifted { what }, .. }]
                if what == "cpus 1.5 → 0.5 (live)"
        ),
        "{plan}"
    );
}

#[test]
fn restart_policy_changed_is_replaced() {
    let d = desired("edge", 1, &[8080]);
    let mut obs = fleet(&d);
    obs[0].live.restart_policy = "always".into();
    let plan = plan(&[d], &obs);
    assert!(
        matches!(
            &plan.actions[..],
            [Action::Replace { reason: ReplaceReason::Drifted { what }, .. }]
                if what == "restart policy unless-stopped → always (live)"
        ),
        "{plan}"
    );
}

#[test]
fn renamed_container_is_replaced_under_a_new_name() {
    let d = desired("edge", 1, &[8080]);
    let mut obs = fleet(&d);
    let original = obs[0].name.clone();
    obs[0].name = "my-envoy".into();
    let plan = plan(std::slice::from_ref(&d), &obs);
    assert_eq!(
        plan.actions,
        [Action::Replace {
            proxy: "edge".into(),
            slot: 0,
            old: ContainerRef {
                id: obs[0].id.clone(),
                name: "my-envoy".into()
            },
            // Its recorded name still keys its admin socket directory until it is removed:
            // the replacement must not share it.
            new_name: format!("{original}-1"),
            reason: ReplaceReason::Drifted {
                what: format!("name {original} → my-envoy (live)")
            },
        }]
    );
}

#[test]
fn new_names_avoid_recorded_names_of_renamed_containers() {
    // Slot 0 renamed by hand and the spec changed: the new slot-0 name must not be the old
    // container's recorded name either, nor any live one.
    let old = desired("edge", 2, &[8080]);
    let mut obs = fleet(&old);
    obs[1].name = "renamed".into();
    let new = with_image("edge", 2, "envoyproxy/envoy:v9.9.9");
    let recorded: BTreeSet<String> = obs
        .iter()
        .flat_map(|c| [c.name.clone(), c.recorded_name().unwrap().to_string()])
        .collect();
    let p = plan(std::slice::from_ref(&new), &obs);
    assert_eq!(p.actions.len(), 2);
    for a in &p.actions {
        assert!(!recorded.contains(a.new_name().unwrap()), "{a}");
    }
    // Same spec, renamed: the replacement gets a suffix instead of the recorded name.
    let p = plan(std::slice::from_ref(&old), &obs);
    assert_eq!(
        p.actions[0].new_name(),
        Some(format!("{}-1", replica_name("edge", 1, &old.hash)).as_str())
    );
}

#[test]
fn missing_name_label_is_drift() {
    let d = desired("edge", 1, &[8080]);
    let mut obs = fleet(&d);
    obs[0].labels.remove(LABEL_NAME);
    let plan = plan(&[d], &obs);
    assert!(
        matches!(
            &plan.actions[..],
            [Action::Replace { reason: ReplaceReason::Drifted { what }, .. }]
                if what.starts_with("name label missing")
        ),
        "{plan}"
    );
}

#[test]
fn several_drifts_are_listed_together() {
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.resources.memory = Some(100);
    let d = desired_of(&p);
    let mut obs = fleet(&d);
    obs[0].live.memory = Some(200);
    obs[0].live.restart_policy = String::new();
    let plan = plan(&[d], &obs);
    assert!(
        matches!(
            &plan.actions[..],
            [Action::Replace { reason: ReplaceReason::Drifted { what }, .. }]
                if what == "memory 100 → 200 (live), restart policy unless-stopped → none (live)"
        ),
        "{plan}"
    );
}

#[test]
fn stopped_and_drifted_is_replaced_not_started() {
    let mut p = proxy_infra("edge", 1, &[8080]);
    p.config.resources.memory = Some(100);
    let d = desired_of(&p);
    let mut obs = fleet(&d);
    obs[0].state = RunState::Exited;
    obs[0].live.memory = Some(200);
    let plan = plan(&[d], &obs);
    assert_eq!(plan.summary().replace, 1);
    assert_eq!(plan.summary().start, 0);
}

#[test]
fn stopped_outdated_replica_is_replaced() {
    let old = with_image("edge", 2, "img:1");
    let new = with_image("edge", 2, "img:2");
    let mut obs = fleet(&old);
    obs[0].state = RunState::Exited;
    obs[1].state = RunState::Dead;
    let p = plan(std::slice::from_ref(&new), &obs);
    for (i, a) in p.actions.iter().enumerate() {
        assert_eq!(
            a,
            &Action::Replace {
                proxy: "edge".into(),
                slot: i as u32,
                old: cref(&obs[i]),
                new_name: replica_name("edge", i as u32, &new.hash),
                reason: ReplaceReason::StoppedOutdated {
                    from: old.hash.clone(),
                    to: new.hash.clone()
                },
            }
        );
    }
    assert_eq!(p.actions.len(), 2);
    assert!(lines(&p)[0].ends_with(&format!(
        "stopped, spec {} → {}",
        short_hash(&old.hash),
        short_hash(&new.hash)
    )));
}

#[test]
fn paused_replica_is_replaced_as_drift() {
    let d = desired("edge", 1, &[8080]);
    let obs = vec![with_state(replica(&d, 0), RunState::Paused)];
    let plan = plan(&[d], &obs);
    assert!(
        matches!(
            &plan.actions[..],
            [Action::Replace { reason: ReplaceReason::Drifted { what }, .. }] if what == "paused"
        ),
        "{plan}"
    );
}

#[test]
fn paused_or_restarting_outdated_replica_is_a_spec_change() {
    let old = with_image("edge", 2, "img:1");
    let new = with_image("edge", 2, "img:2");
    let mut obs = fleet(&old);
    obs[0].state = RunState::Paused;
    obs[1].state = RunState::Restarting;
    let p = plan(&[new], &obs);
    assert_eq!(p.actions.len(), 2);
    assert!(p.actions.iter().all(|a| matches!(
        a,
        Action::Replace {
            reason: ReplaceReason::SpecChanged { .. },
            ..
        }
    )));
}

#[test]
fn restarting_current_replica_is_left_alone_with_a_note() {
    let d = desired("edge", 2, &[8080]);
    let mut obs = fleet(&d);
    obs[1].state = RunState::Restarting;
    let p = plan(&[d], &obs);
    assert!(p.is_empty(), "{p}");
    assert_eq!(p.notes.len(), 1);
    assert_eq!(p.notes[0].slot, Some(1));
    assert_eq!(p.notes[0].container, Some(cref(&obs[1])));
    assert!(p.to_string().contains("restarting"));
    assert!(p.to_string().ends_with("No changes.\n"));
}

#[test]
fn removing_containers_are_ignored_with_a_note() {
    let d = desired("edge", 2, &[8080]);
    let mut obs = fleet(&d);
    obs[0].state = RunState::Removing;
    let p = plan(std::slice::from_ref(&d), &obs);
    // The slot is empty as far as the plan goes; the new container avoids the old name.
    assert_eq!(
        p.actions,
        [Action::Create {
            proxy: "edge".into(),
            slot: 0,
            name: format!("{}-1", obs[0].name),
        }]
    );
    assert_eq!(p.notes.len(), 1);
    // A removing stray is not removed again either.
    let p = plan(&[], &obs);
    assert_eq!(p.actions.len(), 1);
    assert_eq!(p.actions[0].container(), Some(&cref(&obs[1])));
}

// ---- strays, foreign, unidentifiable, duplicates ------------------------------------------

#[test]
fn strays_of_a_removed_proxy_are_removed_last() {
    let keep = desired("keep", 1, &[8080]);
    let old = desired("old", 2, &[9090]);
    let mut obs = fleet(&old);
    obs.extend(fleet(&keep));
    let new = desired("zzz-new", 1, &[9090]);
    let p = plan(&[keep, new.clone()], &obs);
    assert_eq!(
        lines(&p),
        [
            format!(
                "+ create zzz-new/0 as {}",
                replica_name("zzz-new", 0, &new.hash)
            ),
            format!("- remove old/1 ({}): proxy removed", obs[1].name),
            format!("- remove old/0 ({}): proxy removed", obs[0].name),
        ]
    );
    assert!(p.actions[1..].iter().all(|a| matches!(
        a,
        Action::Remove {
            reason: RemoveReason::ProxyRemoved,
            ..
        }
    )));
}

#[test]
fn stray_with_unreadable_slot_is_still_a_removed_proxys() {
    let old = desired("old", 1, &[9090]);
    let mut c = replica(&old, 0);
    c.labels.insert(LABEL_SLOT.into(), "x".into());
    let p = plan(&[], std::slice::from_ref(&c));
    assert_eq!(
        p.actions,
        [Action::Remove {
            proxy: "old".into(),
            slot: None,
            container: cref(&c),
            reason: RemoveReason::ProxyRemoved,
        }]
    );
    assert_eq!(
        lines(&p),
        [format!("- remove old ({}): proxy removed", c.name)]
    );
}

#[test]
fn foreign_containers_never_appear() {
    let d = desired("edge", 2, &[8080]);
    let hash = d.hash.clone();
    let slot0 = replica_name("edge", 0, &hash);
    let lookalikes = vec![
        // No labels at all, berth's name for slot 0 of the desired spec.
        foreign(&slot0, &[]),
        // berth's proxy/slot/hash labels but no managed-by.
        foreign(
            "berth-edge-1-deadbeef",
            &[
                (LABEL_PROXY, "edge"),
                (LABEL_SLOT, "1"),
                (LABEL_SPEC_HASH, &hash),
            ],
        ),
        // managed-by with the wrong value.
        foreign(
            "berth-edge-5-aaaaaaaa",
            &[
                (LABEL_MANAGED_BY, "berth-old"),
                (LABEL_PROXY, "edge"),
                (LABEL_SLOT, "5"),
            ],
        ),
        foreign(
            "berth-old-0-aaaaaaaa",
            &[
                (LABEL_MANAGED_BY, "Berth"),
                (LABEL_PROXY, "old"),
                (LABEL_SLOT, "0"),
            ],
        ),
        foreign("x", &[(LABEL_MANAGED_BY, "")]),
    ];
    let foreign_ids: BTreeSet<String> = lookalikes.iter().map(|c| c.id.clone()).collect();
    let foreign_names: BTreeSet<String> = lookalikes.iter().map(|c| c.name.clone()).collect();

    for desired_set in [vec![], vec![d.clone()], vec![desired("edge", 0, &[8080])]] {
        for with_own in [false, true] {
            let mut obs = lookalikes.clone();
            if with_own && !desired_set.is_empty() {
                obs.push(replica(&d, 1));
            }
            let p = plan(&desired_set, &obs);
            for a in &p.actions {
                if let Some(c) = a.container() {
                    assert!(!foreign_ids.contains(&c.id), "{a}");
                }
                // Never given a name Docker would refuse.
                if let Some(n) = a.new_name() {
                    assert!(!foreign_names.contains(n), "{a}");
                }
            }
            assert!(p.notes.iter().all(|n| n
                .container
                .as_ref()
                .is_none_or(|c| !foreign_ids.contains(&c.id))));
        }
    }

    // With the desired proxy: slot 0 is created under a suffixed name, slot 1 as usual.
    let p = plan(std::slice::from_ref(&d), &lookalikes);
    assert_eq!(
        p.actions,
        [
            Action::Create {
                proxy: "edge".into(),
                slot: 0,
                name: format!("{slot0}-1"),
            },
            Action::Create {
                proxy: "edge".into(),
                slot: 1,
                name: replica_name("edge", 1, &hash),
            },
        ]
    );
    assert!(plan(&[], &lookalikes).is_empty());
}

#[test]
fn unidentifiable_managed_containers_are_removed() {
    let d = desired("edge", 1, &[8080]);
    let mut no_proxy = replica(&d, 0);
    no_proxy.name = "a-no-proxy".into();
    no_proxy.id = "id-a".into();
    no_proxy.labels.remove(LABEL_PROXY);
    let mut empty_proxy = no_proxy.clone();
    empty_proxy.name = "b-empty-proxy".into();
    empty_proxy.id = "id-b".into();
    empty_proxy.labels.insert(LABEL_PROXY.into(), String::new());
    let mut bad_slot = replica(&d, 0);
    bad_slot.name = "c-bad-slot".into();
    bad_slot.id = "id-c".into();
    bad_slot.labels.insert(LABEL_SLOT.into(), "one".into());
    let mut no_slot = bad_slot.clone();
    no_slot.name = "d-no-slot".into();
    no_slot.id = "id-d".into();
    no_slot.labels.remove(LABEL_SLOT);
    let good = replica(&d, 0);

    let obs = vec![
        no_proxy.clone(),
        good,
        bad_slot.clone(),
        empty_proxy.clone(),
        no_slot.clone(),
    ];
    let p = plan(std::slice::from_ref(&d), &obs);
    let rm = |proxy: &str, c: &ObservedContainer| Action::Remove {
        proxy: proxy.into(),
        slot: None,
        container: cref(c),
        reason: RemoveReason::Unidentifiable,
    };
    assert_eq!(
        p.actions,
        [
            // With the desired proxy's group, first.
            rm("edge", &bad_slot),
            rm("edge", &no_slot),
            // Without a proxy: at the very end.
            rm("", &no_proxy),
            rm("", &empty_proxy),
        ]
    );
    assert_eq!(
        lines(&p)[2],
        "- remove ? (a-no-proxy): unidentifiable (proxy or slot label unreadable)"
    );
}

#[test]
fn duplicates_in_a_slot_keep_the_current_running_one() {
    // berth stopped mid-replacement: slot 1 has the old and the new container, both running.
    let old = with_image("edge", 2, "img:1");
    let new = with_image("edge", 2, "img:2");
    let old0 = replica(&old, 0);
    let old1 = replica(&old, 1);
    let new1 = replica(&new, 1);
    let obs = vec![new1.clone(), old0.clone(), old1.clone()];
    let p = plan(std::slice::from_ref(&new), &obs);
    assert_eq!(
        p.actions,
        [
            Action::Remove {
                proxy: "edge".into(),
                slot: Some(1),
                container: cref(&old1),
                reason: RemoveReason::Duplicate,
            },
            Action::Replace {
                proxy: "edge".into(),
                slot: 0,
                old: cref(&old0),
                new_name: replica_name("edge", 0, &new.hash),
                reason: ReplaceReason::SpecChanged {
                    from: old.hash.clone(),
                    to: new.hash.clone()
                },
            },
        ]
    );
    assert!(lines(&p)[0].ends_with("duplicate in slot"));
}

#[test]
fn duplicates_prefer_running_over_stopped_current() {
    let old = with_image("edge", 1, "img:1");
    let new = with_image("edge", 1, "img:2");
    let running_old = replica(&old, 0);
    let stopped_new = with_state(replica(&new, 0), RunState::Exited);
    let p = plan(
        std::slice::from_ref(&new),
        &[stopped_new.clone(), running_old.clone()],
    );
    // Keep serving with the running one and replace it; drop the stopped one.
    assert_eq!(p.actions.len(), 2);
    assert_eq!(p.actions[0].container(), Some(&cref(&stopped_new)));
    assert!(matches!(
        p.actions[0],
        Action::Remove {
            reason: RemoveReason::Duplicate,
            ..
        }
    ));
    assert_eq!(p.actions[1].container(), Some(&cref(&running_old)));
    assert!(matches!(p.actions[1], Action::Replace { .. }));
}

#[test]
fn duplicates_prefer_current_over_outdated_when_both_stopped() {
    let old = with_image("edge", 1, "img:1");
    let new = with_image("edge", 1, "img:2");
    let a = with_state(replica(&old, 0), RunState::Exited);
    let b = with_state(replica(&new, 0), RunState::Exited);
    let p = plan(std::slice::from_ref(&new), &[a.clone(), b.clone()]);
    assert_eq!(
        p.actions,
        [
            Action::Remove {
                proxy: "edge".into(),
                slot: Some(0),
                container: cref(&a),
                reason: RemoveReason::Duplicate
            },
            Action::Start {
                proxy: "edge".into(),
                slot: 0,
                container: cref(&b)
            },
        ]
    );
}

#[test]
fn duplicates_prefer_undrifted_then_name_and_do_not_depend_on_list_order() {
    let d = desired("edge", 1, &[8080]);
    let a = replica_named(&d, 0, "berth-edge-0-a");
    let b = replica_named(&d, 0, "berth-edge-0-b");
    let mut drifted = replica_named(&d, 0, "berth-edge-0-0");
    drifted.live.restart_policy = "no".into();
    let p1 = plan(
        std::slice::from_ref(&d),
        &[drifted.clone(), b.clone(), a.clone()],
    );
    let p2 = plan(
        std::slice::from_ref(&d),
        &[a.clone(), drifted.clone(), b.clone()],
    );
    assert_eq!(p1, p2);
    // Keeps "a" (healthy, first by name); removes the drifted one and "b".
    let removed: Vec<&str> = p1
        .actions
        .iter()
        .map(|a| a.container().unwrap().name.as_str())
        .collect();
    assert_eq!(removed, ["berth-edge-0-0", "berth-edge-0-b"]);
    assert!(p1.actions.iter().all(|a| matches!(
        a,
        Action::Remove {
            reason: RemoveReason::Duplicate,
            ..
        }
    )));
}

#[test]
fn duplicates_above_the_replica_count_are_all_scaled_down() {
    let d = desired("edge", 1, &[8080]);
    let a = replica_named(&d, 3, "berth-edge-3-a");
    let b = replica_named(&d, 3, "berth-edge-3-b");
    let c = replica(&d, 2);
    let p = plan(
        std::slice::from_ref(&d),
        &[replica(&d, 0), b.clone(), c.clone(), a.clone()],
    );
    assert_eq!(
        p.actions
            .iter()
            .map(|x| x.container().unwrap().name.clone())
            .collect::<Vec<_>>(),
        [a.name, b.name, c.name]
    );
    assert!(p.actions.iter().all(|a| matches!(
        a,
        Action::Remove {
            reason: RemoveReason::ScaleDown,
            ..
        }
    )));
}

// ---- several proxies and the ordering -------------------------------------------------------

#[test]
fn two_proxies_changing_at_once_are_ordered_by_proxy_then_kind() {
    // "web": new image, one slot missing, one stopped, scale 4 → 3.
    let web_old = with_image("web", 4, "img:1");
    let web_new = with_image("web", 3, "img:2");
    // "api": scale 1 → 2, one duplicate, same spec.
    let api = with_image("api", 2, "img:1");
    let mut obs = vec![
        replica(&web_old, 0),
        with_state(replica(&web_new, 1), RunState::Exited),
        // slot 2 missing
        replica(&web_old, 3),
        replica(&api, 0),
        replica_named(&api, 0, "berth-api-0-zz"),
    ];
    obs.push(replica(&desired("gone", 1, &[7070]), 0));
    obs.push(foreign("berth-web-2-x", &[(LABEL_PROXY, "web")]));
    // Listed in an unhelpful order; proxies given out of order too.
    obs.reverse();
    let p = plan(&[web_new.clone(), api.clone()], &obs);
    let got: Vec<String> = lines(&p)
        .iter()
        .map(|l| {
            l.split(" (")
                .next()
                .unwrap()
                .split(" as ")
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        got,
        [
            "- remove api/0", // duplicate
            "+ create api/1", // scale up
            "> start web/1",  // capacity first
            "+ create web/2",
            "~ replace web/0", // then the rolling replacements
            "- remove web/3",  // then shrink
            "- remove gone/0", // removed proxies last
        ]
    );
    assert_eq!(
        p.summary(),
        PlanSummary {
            create: 2,
            start: 1,
            replace: 1,
            remove: 3
        }
    );
    assert_eq!(p.for_proxy("web").count(), 4);
    assert_eq!(p.for_proxy("api").count(), 2);
    assert_eq!(p.for_proxy("gone").count(), 1);
    assert_eq!(p.for_proxy("nope").count(), 0);
    assert!(p.for_proxy("web").all(|a| a.proxy() == "web"));
    assert!(p
        .to_string()
        .ends_with("Plan: 2 to create, 1 to start, 1 to replace, 3 to remove.\n"));
}

#[test]
fn plan_is_deterministic_whatever_the_input_order() {
    let a = with_image("a", 3, "img:2");
    let b = with_image("b", 2, "img:1");
    let old_a = with_image("a", 5, "img:1");
    let mut obs = fleet(&old_a);
    obs.extend(fleet(&b));
    obs[1].state = RunState::Exited;
    obs.push(replica(&desired("c", 2, &[1]), 1));
    obs.push(foreign("f", &[]));
    let reference = plan(&[a.clone(), b.clone()], &obs);
    let mut rng = Rng(7);
    for _ in 0..50 {
        let mut o = obs.clone();
        rng.shuffle(&mut o);
        let mut d = vec![a.clone(), b.clone()];
        rng.shuffle(&mut d);
        assert_eq!(plan(&d, &o), reference);
    }
}

#[test]
fn a_proxy_listed_twice_counts_once() {
    let a = desired("a", 1, &[8080]);
    let a2 = desired("a", 3, &[8080]);
    let p = plan(&[a, a2], &[]);
    assert_eq!(p.actions.len(), 1);
    assert_eq!(p.notes.len(), 1);
}

// ---- serde and display -------------------------------------------------------------------

#[test]
fn actions_serialize_for_diff_json() {
    let a = Action::Replace {
        proxy: "edge".into(),
        slot: 1,
        old: ContainerRef {
            id: "abc".into(),
            name: "berth-edge-1-aaaa".into(),
        },
        new_name: "berth-edge-1-bbbb".into(),
        reason: ReplaceReason::SpecChanged {
            from: "a1".into(),
            to: "b2".into(),
        },
    };
    let v = serde_json::to_value(&a).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "action": "replace",
            "proxy": "edge",
            "slot": 1,
            "old": {"id": "abc", "name": "berth-edge-1-aaaa"},
            "new_name": "berth-edge-1-bbbb",
            "reason": {"kind": "spec_changed", "from": "a1", "to": "b2"}
        })
    );
    assert_eq!(serde_json::from_value::<Action>(v).unwrap(), a);
    let r = Action::Remove {
        proxy: "old".into(),
        slot: None,
        container: ContainerRef {
            id: "i".into(),
            name: "n".into(),
        },
        reason: RemoveReason::ProxyRemoved,
    };
    assert_eq!(
        serde_json::to_value(&r).unwrap()["reason"],
        serde_json::json!("proxy_removed")
    );
    assert_eq!(
        serde_json::to_value(ReplaceReason::Dead).unwrap(),
        serde_json::json!({"kind": "dead"})
    );
    let s = PlanSummary {
        create: 1,
        start: 2,
        replace: 3,
        remove: 4,
    };
    assert_eq!(
        serde_json::to_value(s).unwrap(),
        serde_json::json!({"create": 1, "start": 2, "replace": 3, "remove": 4})
    );
    // An empty plan has no "notes" key; one with notes round-trips.
    assert_eq!(
        serde_json::to_value(Plan::default()).unwrap(),
        serde_json::json!({"actions": []})
    );
    let p: Plan = serde_json::from_str(r#"{"actions": []}"#).unwrap();
    assert_eq!(p, Plan::default());
}

#[test]
fn display_is_terraform_like() {
    let c = ContainerRef {
        id: "i".into(),
        name: "berth-edge-1-aaaa".into(),
    };
    let cases = [
        (
            Action::Create {
                proxy: "edge".into(),
                slot: 0,
                name: "berth-edge-0-1a2b3c4d".into(),
            },
            "+ create edge/0 as berth-edge-0-1a2b3c4d",
        ),
        (
            Action::Start {
                proxy: "edge".into(),
                slot: 2,
                container: c.clone(),
            },
            "> start edge/2 (berth-edge-1-aaaa)",
        ),
        (
            Action::Replace {
                proxy: "edge".into(),
                slot: 1,
                old: c.clone(),
                new_name: "n".into(),
                reason: ReplaceReason::SpecChanged {
                    from: "a1b2c3d4e5f6a7b8".into(),
                    to: "d4e5f6".into(),
                },
            },
            "~ replace edge/1 (berth-edge-1-aaaa): spec a1b2c3d4e5f6 → d4e5f6",
        ),
        (
            Action::Replace {
                proxy: "edge".into(),
                slot: 1,
                old: c.clone(),
                new_name: "n".into(),
                reason: ReplaceReason::SpecChanged {
                    from: String::new(),
                    to: "d4e5f6".into(),
                },
            },
            "~ replace edge/1 (berth-edge-1-aaaa): spec (none) → d4e5f6",
        ),
        (
            Action::Remove {
                proxy: "old".into(),
                slot: Some(0),
                container: c.clone(),
                reason: RemoveReason::ProxyRemoved,
            },
            "- remove old/0 (berth-edge-1-aaaa): proxy removed",
        ),
    ];
    for (a, want) in cases {
        assert_eq!(a.to_string(), want);
    }
}

#[test]
fn outdated_container_without_a_hash_label_is_a_spec_change() {
    let d = desired("edge", 1, &[8080]);
    let mut c = replica(&d, 0);
    c.labels.remove(LABEL_SPEC_HASH);
    let p = plan(std::slice::from_ref(&d), &[c.clone()]);
    assert_eq!(
        p.actions,
        [Action::Replace {
            proxy: "edge".into(),
            slot: 0,
            old: cref(&c),
            new_name: format!("{}-1", c.name),
            reason: ReplaceReason::SpecChanged {
                from: String::new(),
                to: d.hash.clone()
            },
        }]
    );
}

// ---- randomized simulation ---------------------------------------------------------------

/// xorshift64*: a tiny deterministic generator, so the test needs no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }
}

const STATES: [RunState; 7] = [
    RunState::Running,
    RunState::Running,
    RunState::Exited,
    RunState::Created,
    RunState::Dead,
    RunState::Paused,
    RunState::Restarting,
];

/// A random host: desired proxies among a, b, c (two possible specs each), and a jumble of
/// berth containers (current, outdated, drifted, stopped, duplicated, strays, unlabelled) and
/// foreign look-alikes, some holding the very names berth would pick.
fn scenario(rng: &mut Rng) -> (Vec<DesiredProxy>, Vec<ObservedContainer>) {
    let specs = |name: &str, replicas: u32| {
        let mut p = proxy_infra(name, replicas, &[8080]);
        p.config.concurrency = Some(1);
        p.config.resources.memory = Some(1 << 28);
        let v1 = desired_of(&p);
        p.config.image = "img:new".into();
        (v1, desired_of(&p))
    };
    let mut desired = Vec::new();
    let mut all_specs = Vec::new();
    for name in ["a", "b", "c", "gone"] {
        let (v1, v2) = specs(name, rng.below(5) as u32);
        let current = if rng.chance(50) {
            v1.clone()
        } else {
            v2.clone()
        };
        if name != "gone" && rng.chance(80) {
            desired.push(current);
        }
        all_specs.push(v1);
        all_specs.push(v2);
    }

    let mut observed: Vec<ObservedContainer> = Vec::new();
    let mut n = 0;
    for _ in 0..rng.below(12) {
        n += 1;
        let spec = rng.pick(&all_specs).clone();
        let slot = rng.below(6) as u32;
        let mut c = replica_named(&spec, slot, &format!("c{n}"));
        c.state = *rng.pick(&STATES);
        if rng.chance(15) {
            c.live.memory = Some(1 << 27);
        }
        if rng.chance(10) {
            c.live.restart_policy = "always".into();
        }
        if rng.chance(10) {
            c.name = format!("renamed{n}");
        }
        if rng.chance(5) {
            c.labels.insert(LABEL_SLOT.into(), "?".into());
        }
        if rng.chance(5) {
            c.labels.remove(LABEL_PROXY);
        }
        if rng.chance(5) {
            c.labels.remove(LABEL_SPEC_HASH);
        }
        if rng.chance(5) {
            c.state = RunState::Removing;
        }
        if rng.chance(15) {
            // Make it foreign: drop or spoil the managed-by label.
            if rng.chance(50) {
                c.labels.remove(LABEL_MANAGED_BY);
            } else {
                c.labels.insert(LABEL_MANAGED_BY.into(), "berth2".into());
            }
            c.id = format!("foreign-{n}");
        }
        observed.push(c);
    }
    // Foreign containers holding names berth would choose.
    for d in &desired {
        if rng.chance(30) {
            n += 1;
            let slot = rng.below(d.replicas.max(1) as usize) as u32;
            observed.push(foreign(&replica_name(d.name(), slot, &d.hash), &[]));
            let last = observed.last_mut().unwrap();
            last.id = format!("foreign-{n}");
        }
    }
    (desired, observed)
}

/// Does to `observed` what executing `plan` would do, checking each step is one Docker could
/// perform. Containers being removed finish disappearing.
fn apply(
    desired: &[DesiredProxy],
    observed: &[ObservedContainer],
    plan: &Plan,
) -> Vec<ObservedContainer> {
    let mut world: Vec<ObservedContainer> = observed.to_vec();
    let spec_of = |proxy: &str| desired.iter().find(|d| d.name() == proxy).unwrap();
    let create = |world: &mut Vec<ObservedContainer>, proxy: &str, slot: u32, name: &str| {
        assert!(
            world.iter().all(|c| c.name != name),
            "name {name} already taken"
        );
        world.push(replica_named(spec_of(proxy), slot, name));
    };
    let existing = |world: &Vec<ObservedContainer>, r: &ContainerRef| -> usize {
        let i = world
            .iter()
            .position(|c| c.id == r.id)
            .unwrap_or_else(|| panic!("{} does not exist", r.id));
        assert_eq!(world[i].name, r.name);
        assert!(world[i].is_managed(), "acted on foreign {}", r.name);
        i
    };
    for a in &plan.actions {
        match a {
            Action::Create { proxy, slot, name } => create(&mut world, proxy, *slot, name),
            Action::Start { container, .. } => {
                let i = existing(&world, container);
                assert!(world[i].state.is_startable());
                world[i].state = RunState::Running;
            }
            Action::Replace {
                proxy,
                slot,
                old,
                new_name,
                ..
            } => {
                existing(&world, old);
                create(&mut world, proxy, *slot, new_name);
                let i = existing(&world, old);
                world.remove(i);
            }
            Action::Remove { container, .. } => {
                let i = existing(&world, container);
                world.remove(i);
            }
        }
    }
    world.retain(|c| !(c.is_managed() && c.state == RunState::Removing));
    world
}

#[test]
fn random_hosts_converge_in_one_step_and_foreign_containers_are_never_touched() {
    let mut rng = Rng(0x5eed_b0a7);
    let mut counted = [0usize; 4];
    for round in 0..3000 {
        let (desired, observed) = scenario(&mut rng);
        let p = plan(&desired, &observed);
        let ctx = || format!("round {round}\n{p}\nobserved: {observed:#?}");

        // Foreign containers never appear, and new names never clash with anything.
        let foreign: Vec<&ObservedContainer> =
            observed.iter().filter(|c| !c.is_managed()).collect();
        for a in &p.actions {
            if let Some(c) = a.container() {
                assert!(foreign.iter().all(|f| f.id != c.id), "{}", ctx());
            }
        }
        let s = p.summary();
        counted[0] += s.create;
        counted[1] += s.start;
        counted[2] += s.replace;
        counted[3] += s.remove;

        // Deterministic under reordering.
        let mut shuffled = observed.clone();
        rng.shuffle(&mut shuffled);
        assert_eq!(plan(&desired, &shuffled), p, "{}", ctx());

        // Ordered: per proxy, kinds never go backwards; removed proxies after desired ones.
        let group = |a: &Action| match a {
            Action::Remove {
                reason: RemoveReason::Duplicate | RemoveReason::Unidentifiable,
                proxy,
                ..
            } if desired.iter().any(|d| d.name() == proxy) => 0,
            Action::Start { .. } => 1,
            Action::Create { .. } => 2,
            Action::Replace { .. } => 3,
            Action::Remove {
                reason: RemoveReason::ScaleDown,
                ..
            } => 4,
            Action::Remove { .. } => 5,
        };
        let key = |a: &Action| {
            let g = group(a);
            let proxy = if g == 5 { "\u{10ffff}" } else { a.proxy() };
            (proxy.to_string(), g)
        };
        for w in p.actions.windows(2) {
            assert!(
                key(&w[0]) <= key(&w[1]),
                "{} before {}\n{}",
                w[0],
                w[1],
                ctx()
            );
        }

        // Applying the plan converges: exactly one current container per slot, nothing else
        // of berth's, the foreign ones as they were, and a second plan is empty.
        let world = apply(&desired, &observed, &p);
        for d in &desired {
            let mut slots: Vec<u32> = world
                .iter()
                .filter(|c| c.is_managed() && c.proxy() == Some(d.name()))
                .map(|c| {
                    assert_eq!(c.spec_hash(), Some(d.hash.as_str()), "{}", ctx());
                    assert!(
                        matches!(c.state, RunState::Running | RunState::Restarting),
                        "{}",
                        ctx()
                    );
                    c.slot().expect("readable slot")
                })
                .collect();
            slots.sort_unstable();
            assert_eq!(slots, (0..d.replicas).collect::<Vec<_>>(), "{}", ctx());
        }
        let managed = world.iter().filter(|c| c.is_managed()).count();
        let wanted: u32 = desired.iter().map(|d| d.replicas).sum();
        assert_eq!(managed, wanted as usize, "{}", ctx());
        let foreign_after: Vec<&ObservedContainer> =
            world.iter().filter(|c| !c.is_managed()).collect();
        assert_eq!(foreign_after, foreign, "{}", ctx());
        let again = plan(&desired, &world);
        assert!(again.is_empty(), "not converged:\n{again}\n{}", ctx());
    }
    // The generator really exercised every kind of action.
    assert!(counted.iter().all(|&n| n > 100), "{counted:?}");
}

#[test]
fn labels_of_simulated_containers_match_what_berth_creates() {
    // Guards the helper the tests rely on.
    let d = desired("edge", 1, &[8080]);
    let c = replica(&d, 0);
    assert!(c.is_managed());
    assert_eq!(c.label(LABEL_MANAGED_BY), Some(MANAGED_BY_VALUE));
    assert_eq!(c.proxy(), Some("edge"));
    assert_eq!(c.slot(), Some(0));
    assert_eq!(c.spec_hash(), Some(d.hash.as_str()));
    assert_eq!(c.recorded_name(), Some(c.name.as_str()));
    assert_eq!(c.label(LABEL_IMAGE_ID), Some("sha256:img"));
    let _: BTreeMap<String, String> = c.labels.clone();
}

#[test]
fn whole_plan_display() {
    let old = with_image("web", 3, "img:1");
    let new = with_image("web", 2, "img:2");
    let mut obs = fleet(&old);
    obs[0].state = RunState::Exited;
    obs.push(replica(&desired("gone", 1, &[7070]), 0));
    let p = plan(std::slice::from_ref(&new), &obs);
    let want = format!(
        "~ replace web/0 ({}): stopped, spec {from} → {to}\n\
         ~ replace web/1 ({}): spec {from} → {to}\n\
         - remove web/2 ({}): scale down\n\
         - remove gone/0 ({}): proxy removed\n\
         Plan: 0 to create, 0 to start, 2 to replace, 2 to remove.\n",
        obs[0].name,
        obs[1].name,
        obs[2].name,
        obs[3].name,
        from = short_hash(&old.hash),
        to = short_hash(&new.hash),
    );
    assert_eq!(p.to_string(), want);
}

#[test]
fn strays_go_highest_slot_first_and_unreadable_slots_last() {
    let old = desired("old", 3, &[9090]);
    let mut obs = fleet(&old);
    let mut bad = replica_named(&old, 0, "berth-old-x");
    bad.labels.insert(LABEL_SLOT.into(), "x".into());
    obs.insert(0, bad);
    let p = plan(&[], &obs);
    assert_eq!(
        p.actions.iter().map(Action::slot).collect::<Vec<_>>(),
        [Some(2), Some(1), Some(0), None]
    );
}
