//! Unit tests of delivery's pure parts: the make-before-break stages, stamps, subscriptions
//! and the judging of a replica's stats.

use super::*;

const RDS_FILE: &str = "rds-web.yaml";

fn files() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            LDS_FILE.to_string(),
            "resources:\n- name: web\n  filter_chains:\n  - filters:\n    - typed_config:\n        stat_prefix: \"web\"\n        rds:\n          route_config_name: \"web\"\n".to_string(),
        ),
        (RDS_FILE.to_string(), "resources:\n- name: web\n".to_string()),
        (CDS_FILE.to_string(), "resources: []\n".to_string()),
    ])
}

/// A route moved from cluster `a` to a new cluster `b`: clusters first as both, then the
/// routes, then the clusters without `a` (never a route naming a missing cluster).
#[test]
fn a_renamed_backend_is_made_before_it_is_broken() {
    let gen = |g: u64, cds: &str, rds: &str| {
        stamp(
            &BTreeMap::from([
                (
                    LDS_FILE.to_string(),
                    "resources:\n- name: web\n".to_string(),
                ),
                (CDS_FILE.to_string(), cds.to_string()),
                (RDS_FILE.to_string(), rds.to_string()),
            ]),
            g,
        )
    };
    let from = gen(
        1,
        "resources:\n- name: a\n",
        "resources:\n- name: web\n  cluster: a\n",
    );
    let to = gen(
        2,
        "resources:\n- name: b\n",
        "resources:\n- name: web\n  cluster: b\n",
    );
    let stages = stages(&from, &to);
    let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
    assert_eq!(
        what,
        [
            "clusters (old and new)",
            "route configurations (old and new)",
            "clusters"
        ]
    );
    let union: serde_yaml::Value = serde_yaml::from_str(&stages[0].write[CDS_FILE]).unwrap();
    let names: Vec<&str> = union["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(union["version_info"], "2.1");
    assert_eq!(stamp_of(&stages[0].write[CDS_FILE]).as_deref(), Some("2.1"));
    assert_eq!(
        stages[1].write[RDS_FILE], to[RDS_FILE],
        "routes switch in one go"
    );
    assert_eq!(stages[2].write[CDS_FILE], to[CDS_FILE], "then `a` goes");
    // The listeners changed only their stamp: they ride along with the last stage.
    assert_eq!(stages[2].write[LDS_FILE], to[LDS_FILE]);
    assert!(!stages[..2].iter().any(|s| s.write.contains_key(LDS_FILE)));
    // Applying every stage ends exactly at `to`.
    let mut disk = from.clone();
    for s in &stages {
        disk.extend(s.write.clone());
        for r in &s.remove {
            disk.remove(r);
        }
    }
    assert_eq!(disk, to);
    // No change, no stage; only additions: one stage per file, final content at once.
    assert!(super::stages(&to, &to).is_empty());
}

/// A rotated certificate on a Swarm: the new copies before the secret that names them,
/// the old copies only after it switched.
#[test]
fn certificate_copies_come_before_their_secret_and_go_after_it() {
    let set = |v: &str| {
        BTreeMap::from([
            (
                "sds-web.yaml".to_string(),
                format!("resources:\n- name: web\n  cert: /etc/berth/tls/web/cert-{v}.pem\n"),
            ),
            (format!("tls/web/cert-{v}.pem"), format!("cert {v}")),
            (format!("tls/web/key-{v}.pem"), format!("key {v}")),
        ])
    };
    let (from, to) = (set("a"), set("b"));
    let stages = stages(&from, &to);
    let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
    assert_eq!(
        what,
        [
            "certificate files",
            "secrets and other files",
            "files no longer used"
        ]
    );
    assert_eq!(
        stages[0].write.keys().collect::<Vec<_>>(),
        ["tls/web/cert-b.pem", "tls/web/key-b.pem"]
    );
    assert_eq!(
        stages[2].remove,
        ["tls/web/cert-a.pem", "tls/web/key-a.pem"]
    );
}

/// Each route configuration has its own file: a new listener's file comes before the
/// listeners, a removed listener's file (and the older single `rds.yaml`) after them.
#[test]
fn route_files_come_before_their_listeners_and_go_after_them() {
    let from = BTreeMap::from([
        (LDS_FILE.to_string(), "resources: [web]\n".to_string()),
        (
            "rds.yaml".to_string(),
            "resources: [web, api]\n".to_string(),
        ),
    ]);
    let to = BTreeMap::from([
        (LDS_FILE.to_string(), "resources: [web, api]\n".to_string()),
        ("rds-web.yaml".to_string(), "resources: [web]\n".to_string()),
        ("rds-api.yaml".to_string(), "resources: [api]\n".to_string()),
    ]);
    let stages = stages(&from, &to);
    let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
    assert_eq!(
        what,
        [
            "route configurations (old and new)",
            "listeners",
            "route configurations"
        ]
    );
    assert_eq!(stages[0].write.len(), 2);
    assert_eq!(stages[2].remove, ["rds.yaml"]);
}

/// A route-only change of a new generation is one stage: every other file changes only
/// its stamp and goes with it.
#[test]
fn a_route_only_change_is_one_stage() {
    let with_route = |route: &str| {
        let mut f = files();
        f.insert(
            RDS_FILE.to_string(),
            format!("resources:\n- name: web\n  prefix: {route}\n"),
        );
        f.insert(
            "sds-web.yaml".to_string(),
            "resources: [cert]\n".to_string(),
        );
        f
    };
    let from = stamp(&with_route("/a"), 1);
    let to = stamp(&with_route("/b"), 2);
    let stages = stages(&from, &to);
    assert_eq!(stages.len(), 1, "{stages:#?}");
    assert_eq!(
        stages[0].write, to,
        "every file, the route and the new stamps"
    );
    // Only new stamps: one stage too.
    let restamped = stamp(&with_route("/a"), 3);
    let stages = super::stages(&from, &restamped);
    assert_eq!(stages.len(), 1);
    assert_eq!(stages[0].what, "versions");
    assert_eq!(stages[0].write, restamped);
}

#[test]
fn new_secrets_come_before_the_listeners_and_old_ones_go_last() {
    let from = BTreeMap::from([
        (
            LDS_FILE.to_string(),
            "version_info: \"1\"\nresources: []\n".to_string(),
        ),
        ("sds-old.yaml".to_string(), "old".to_string()),
    ]);
    let to = BTreeMap::from([
        (
            LDS_FILE.to_string(),
            "version_info: \"2\"\nresources: [x]\n".to_string(),
        ),
        ("sds-new.yaml".to_string(), "new".to_string()),
    ]);
    let stages = stages(&from, &to);
    let what: Vec<&str> = stages.iter().map(|s| s.what).collect();
    assert_eq!(
        what,
        [
            "secrets and other files",
            "listeners",
            "files no longer used"
        ]
    );
    assert_eq!(stages[2].remove, ["sds-old.yaml"]);
}

#[test]
fn stamps_replace_each_other_and_come_off() {
    let f = files();
    let one = stamp(&f, 1);
    assert!(one[RDS_FILE].starts_with("version_info: \"1\"\nresources:"));
    assert_eq!(generation_of(&one), Some(1));
    let two = stamp(&one, 2);
    assert_eq!(generation_of(&two), Some(2));
    assert_eq!(two[CDS_FILE], "version_info: \"2\"\nresources: []\n");
    assert_eq!(unstamp(&two), f);
    assert_eq!(generation_of(&f), None);
    let other = BTreeMap::from([("x.pem".to_string(), "---".to_string())]);
    assert_eq!(stamp(&other, 3), other);
}

#[test]
fn subscriptions_from_listeners() {
    assert_eq!(
        subscriptions(&files()),
        vec![
            "cluster_manager.cds".to_string(),
            "http.web.rds.web".to_string(),
            "listener_manager.lds".to_string()
        ]
    );
}

#[test]
fn subscriptions_from_backend_tls_secrets() {
    let cds = "resources:\n- name: api\n  transport_socket:\n    typed_config:\n      common_tls_context:\n        validation_context_sds_secret_config:\n          name: backend.api.ca\n          sds_config:\n            path_config_source:\n              path: /etc/berth/xds/sds-backend.api.ca.yaml\n";
    let mut files = BTreeMap::from([(CDS_FILE.to_string(), cds.to_string())]);
    assert_eq!(subscriptions(&files), ["cluster_manager.cds"]);
    files.insert("sds-backend.api.ca.yaml".into(), "resources: []".into());
    assert_eq!(
        subscriptions(&files),
        ["cluster_manager.cds", "sds.backend.api.ca"]
    );
}

#[test]
fn parses_stats_and_judges() {
    let json: serde_json::Value = serde_json::from_str(
        r#"{"stats":[{"name":"http.web.rds.web.version_text","value":"7"},
        {"name":"listener_manager.lds.version_text","value":"7"},
        {"name":"http.web.rds.web.update_attempt","value":5},
        {"name":"http.web.rds.web.update_failure","value":1},
        {"name":"http.web.rds.web.update_rejected","value":2},
        {"name":"listener_manager.lds.update_attempt","value":5}]}"#,
    )
    .unwrap();
    let now = parse_snapshot(&json);
    assert_eq!(now["http.web.rds.web"].refused, 3);
    let subs = vec![
        "http.web.rds.web".to_string(),
        "listener_manager.lds".to_string(),
    ];
    assert_eq!(confirmed_generation(&now, &subs), Some(7));
    let want = |v: &str| -> BTreeMap<String, Option<String>> {
        subs.iter()
            .map(|s| (s.clone(), Some(v.to_string())))
            .collect()
    };
    assert_eq!(judge(None, &now, &want("7"), 1), Some(Ok(())));
    let mut before = now.clone();
    before.get_mut("http.web.rds.web").unwrap().refused = 1;
    before.get_mut("http.web.rds.web").unwrap().attempts = 4;
    before.get_mut("listener_manager.lds").unwrap().attempts = 4;
    // Generation 8 was written once; the routes refused it.
    let verdict = judge(Some(&before), &now, &want("8"), 1);
    assert!(
        matches!(verdict, Some(Err(ref d)) if d.contains("http.web.rds.web")),
        "{verdict:?}"
    );
    // Two renames, only one processed: keep waiting.
    assert_eq!(judge(Some(&before), &now, &want("8"), 2), None);
}
