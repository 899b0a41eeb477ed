use std::fs;

use super::*;

fn fleet(proxies: u32, replicas: u32, port: u16) -> Needs {
    Needs {
        proxies: (0..proxies)
            .map(|i| ProxyNeeds {
                name: format!("p{i}"),
                replicas,
                ports: vec![port + i as u16],
                inotify_per_replica: 3,
            })
            .collect(),
    }
}

/// A fresh host's defaults.
fn fresh() -> Observed {
    Observed {
        values: BTreeMap::from([
            (Key::TcpMigrateReq, 0),
            (Key::UnprivilegedPortStart, 1024),
            (Key::InotifyInstances, 128),
            (Key::InotifyWatches, 8192),
        ]),
        ..Observed::default()
    }
}

struct Host {
    dir: tempfile::TempDir,
    settings: Settings,
}

/// A fake /proc/sys and /etc/sysctl.d in a temp directory.
fn host(tune: bool, root: bool, values: &Observed) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("proc/sys");
    for (k, v) in &values.values {
        let p = sys.join(k.name().replace('.', "/"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, format!("{v}\n")).unwrap();
    }
    let etc = dir.path().join("etc/sysctl.d");
    fs::create_dir_all(&etc).unwrap();
    let dropin = etc.join("60-berth.conf");
    let settings = Settings {
        tune,
        root,
        sysctls: Sysctls::at(&sys),
        boot: boot::BootConfig {
            dirs: vec![etc],
            conf: dir.path().join("etc/sysctl.conf"),
            extra: None,
        },
        dropin,
        replica_uid: 101,
        fleet_pids: BTreeSet::new(),
        user_processes: None,
    };
    Host { dir, settings }
}

#[test]
fn a_fleet_of_a_hundred_and_two_on_a_low_port_as_root_sets_and_persists_everything() {
    let needs = fleet(34, 3, 81);
    assert_eq!(needs.inotify_instances(), 34 * 4 * 3);
    let h = host(true, true, &fresh());
    let plan = plan(&needs, &fresh(), &h.settings).unwrap();
    assert_eq!(
        plan.changes,
        vec![
            Change {
                key: Key::TcpMigrateReq,
                from: 0,
                to: 1
            },
            Change {
                key: Key::UnprivilegedPortStart,
                from: 1024,
                to: 81
            },
            Change {
                key: Key::InotifyInstances,
                from: 128,
                to: 1024
            },
        ]
    );
    assert_eq!(
        plan.dropin,
        Some(BTreeMap::from([
            (Key::TcpMigrateReq, 1),
            (Key::UnprivilegedPortStart, 81),
            (Key::InotifyInstances, 1024),
        ]))
    );
    assert!(plan.concerns.is_empty(), "{:?}", plan.concerns);
}

#[test]
fn without_tune_host_what_the_fleet_cannot_run_without_is_refused_with_numbers() {
    let h = host(false, true, &fresh());
    let refusal = plan(&fleet(34, 3, 81), &fresh(), &h.settings).unwrap_err();
    let text = refusal.to_string();
    assert_eq!(refusal.problems.len(), 2, "{text}");
    assert!(text.contains("proxy p0 listens on port 81"), "{text}");
    assert!(
        text.contains("sysctl -w net.ipv4.ip_unprivileged_port_start=81"),
        "{text}"
    );
    assert!(
        text.contains("the fleet needs 408 inotify instances (102 replicas of 34 proxies"),
        "{text}"
    );
    assert!(
        text.contains("fs.inotify.max_user_instances is 128"),
        "{text}"
    );
    assert!(
        text.contains("sysctl -w fs.inotify.max_user_instances=1024"),
        "{text}"
    );
    assert!(
        text.contains("tune_host = false") && text.ends_with("nothing was changed"),
        "{text}"
    );
}

#[test]
fn other_users_of_the_limit_count() {
    let mut o = fresh();
    o.other_inotify = inotify::Usage {
        instances: 110,
        watches: 110,
        unreadable: 0,
    };
    let h = host(false, true, &o);
    // 3 replicas: 12 instances; with the 110 others, 122 fit under 128.
    assert!(plan(&fleet(1, 3, 8080), &o, &h.settings).is_ok());
    // 6 replicas: 21 + 110 do not.
    let text = plan(&fleet(1, 6, 8080), &o, &h.settings)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("needs 21 inotify instances") && text.contains("hold 110"),
        "{text}"
    );
}

#[test]
fn without_tune_host_a_small_fleet_runs_with_one_warning_and_a_reason() {
    let h = host(false, true, &fresh());
    let plan = plan(&fleet(1, 2, 8080), &fresh(), &h.settings).unwrap();
    assert!(plan.changes.is_empty() && plan.dropin.is_none());
    let prepared = apply(plan, &h.settings).unwrap();
    let (reason, message) = prepared.degraded().unwrap();
    assert_eq!(reason, "TcpMigrateReqOff");
    assert!(message.contains("tune_host = false"), "{message}");
    assert!(
        message.contains("sysctl -w net.ipv4.tcp_migrate_req=1"),
        "{message}"
    );
    assert!(
        message.contains("60-berth.conf"),
        "and how to keep it: {message}"
    );
}

#[test]
fn not_root_the_settings_that_would_not_survive_a_reboot_are_a_concern() {
    let mut o = fresh();
    o.values.insert(Key::TcpMigrateReq, 1);
    o.values.insert(Key::UnprivilegedPortStart, 443);
    let h = host(true, false, &o);
    let plan = plan(&fleet(1, 2, 443), &o, &h.settings).unwrap();
    assert!(plan.changes.is_empty());
    assert_eq!(
        plan.concerns,
        vec![Concern::NotPersistent {
            settings: BTreeMap::from([(Key::TcpMigrateReq, 1), (Key::UnprivilegedPortStart, 443)]),
            why: PersistWhy::NotWritten(Why::NotRoot),
        }]
    );
    let message = plan.concerns[0].message(&h.settings.dropin);
    assert!(message.contains("not running as root"), "{message}");
    assert!(
        message.contains("net.ipv4.ip_unprivileged_port_start = 443"),
        "{message}"
    );
    // Once the boot sets them (by any file), there is nothing to say.
    fs::write(
        h.settings.boot.dirs[0].join("90-admin.conf"),
        "net.ipv4.tcp_migrate_req = 1\nnet.ipv4.ip_unprivileged_port_start = 80\n",
    )
    .unwrap();
    let o = Observed {
        at_boot: h.settings.boot.read(),
        ..o
    };
    assert!(super::plan(&fleet(1, 2, 443), &o, &h.settings)
        .unwrap()
        .concerns
        .is_empty());
}

#[test]
fn prepare_sets_writes_the_dropin_once_and_never_tightens() {
    let h = host(true, true, &fresh());
    let first = prepare(&fleet(2, 3, 80), &h.settings).unwrap();
    assert_eq!(first.changes.len(), 2, "{:?}", first.changes);
    assert_eq!(
        first.dropin_written.as_deref(),
        Some(h.settings.dropin.as_path())
    );
    assert_eq!(h.settings.sysctls.get(Key::UnprivilegedPortStart), Some(80));
    assert_eq!(h.settings.sysctls.get(Key::TcpMigrateReq), Some(1));
    assert!(first.degraded().is_none());
    assert_eq!(first.change_lines()[0], "net.ipv4.tcp_migrate_req 0 → 1");
    let again = prepare(&fleet(2, 3, 80), &h.settings).unwrap();
    assert!(
        again.changes.is_empty() && again.dropin_written.is_none(),
        "{again:?}"
    );
    // A fleet that moved to port 443 leaves port 80 open: berth only loosens.
    let moved = prepare(&fleet(1, 3, 443), &h.settings).unwrap();
    assert!(
        moved.changes.is_empty() && moved.dropin_written.is_none(),
        "{moved:?}"
    );
    assert_eq!(
        sysctl::read_dropin(&h.settings.dropin).get(&Key::UnprivilegedPortStart),
        Some(&80)
    );
    // The boot (simulated): the kernel back to its defaults, the drop-in applied.
    for (k, v) in sysctl::read_dropin(&h.settings.dropin) {
        h.settings.sysctls.set(k, v).unwrap();
    }
    assert!(prepare(&fleet(2, 3, 80), &h.settings)
        .unwrap()
        .changes
        .is_empty());
    drop(h.dir);
}

#[test]
fn a_file_the_boot_reads_later_can_undo_the_dropin() {
    let h = host(true, true, &fresh());
    fs::write(
        h.settings.boot.dirs[0].join("99-sysctl.conf"),
        "net.ipv4.tcp_migrate_req=0\n",
    )
    .unwrap();
    let prepared = prepare(&fleet(1, 1, 8080), &h.settings).unwrap();
    let (reason, message) = prepared.degraded().unwrap();
    assert_eq!(reason, "HostSettingsNotPersistent");
    assert!(
        message.contains("99-sysctl.conf sets net.ipv4.tcp_migrate_req = 0"),
        "{message}"
    );
}

#[test]
fn a_kernel_without_tcp_migrate_req_is_left_alone() {
    let mut o = fresh();
    o.values.remove(&Key::TcpMigrateReq);
    let h = host(true, true, &o);
    let plan = plan(&fleet(1, 1, 8080), &o, &h.settings).unwrap();
    assert!(
        plan.changes.is_empty() && plan.concerns.is_empty(),
        "{plan:?}"
    );
}

#[test]
fn a_failed_write_of_a_needed_setting_is_a_refusal() {
    let h = host(true, true, &fresh());
    // /proc/sys read-only, as in some containers: here, a directory where the file was.
    let port_start = h
        .dir
        .path()
        .join("proc/sys/net/ipv4/ip_unprivileged_port_start");
    fs::remove_file(&port_start).unwrap();
    fs::create_dir(&port_start).unwrap();
    let plan = Plan {
        changes: vec![
            Change {
                key: Key::TcpMigrateReq,
                from: 0,
                to: 1,
            },
            Change {
                key: Key::UnprivilegedPortStart,
                from: 1024,
                to: 80,
            },
        ],
        ..Plan::default()
    };
    let refusal = apply(plan, &h.settings).unwrap_err().to_string();
    assert!(
        refusal.contains("cannot set net.ipv4.ip_unprivileged_port_start = 80"),
        "{refusal}"
    );
    assert!(
        refusal.contains("already changed: net.ipv4.tcp_migrate_req 0 → 1"),
        "{refusal}"
    );
}
