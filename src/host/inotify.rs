//! inotify, the kernel facility Envoy watches its files with: how many instances one replica
//! holds (counted from its rendered files) and how many a user holds now (from /proc).
//!
//! Every replica runs as the same user ([`crate::core::replica::REPLICA_UID`]) and the kernel limits
//! instances per user (`fs.inotify.max_user_instances`, 128 by default), so the limit is shared
//! by the whole fleet. Envoy creates one instance per file-based subscription
//! (`path_config_source`: LDS, CDS, one per distinct RDS route config, one per distinct SDS
//! secret) and one per `watched_directory` of a data source. Measured: a replica of a proxy with
//! one HTTP listener holds 3 (LDS, CDS, RDS), with two listeners 4.

use std::collections::BTreeSet;
use std::fs;

use serde_yaml::Value;

/// The inotify instances (and watches: one each) one replica of a proxy holds, counted from
/// its bootstrap and watched files as parsed (the renderer parses each file it renders).
pub fn per_replica(docs: &[Value]) -> u32 {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for doc in docs {
        collect(doc, None, &mut seen);
    }
    seen.len() as u32
}

/// Walks `v` (whose parent mapping is `parent`), recording one entry per watcher Envoy would
/// create. Envoy shares a subscription between identical uses (same route config or secret
/// name and config source), so each is keyed by the mapping that names it.
fn collect(v: &Value, parent: Option<&Value>, seen: &mut BTreeSet<String>) {
    match v {
        Value::Mapping(m) => {
            for (k, child) in m {
                let key = k.as_str().unwrap_or_default();
                let watches = match key {
                    "path_config_source" => true,
                    // A data source's directory; inside a path_config_source it is that
                    // subscription's one watcher, already counted.
                    "watched_directory" => !m.contains_key("path"),
                    _ => false,
                };
                if watches {
                    let yaml = |x: Option<&Value>| {
                        x.map(|x| serde_yaml::to_string(x).unwrap_or_default())
                            .unwrap_or_default()
                    };
                    seen.insert(format!("{key}:{}|{}", yaml(parent), yaml(Some(v))));
                }
                collect(child, Some(v), seen);
            }
        }
        Value::Sequence(items) => items.iter().for_each(|i| collect(i, parent, seen)),
        _ => {}
    }
}

/// inotify use by one user's processes, from /proc.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub instances: u64,
    pub watches: u64,
    /// Processes whose file descriptors could not be read (not root): their use is unknown.
    pub unreadable: u64,
}

/// inotify instances and watches held by processes running as `uid` (effective), except the
/// processes in `exclude` (the fleet's own replicas, which the fleet's need already counts).
pub fn usage(uid: u32, exclude: &BTreeSet<u32>) -> Usage {
    usage_of(&processes_of(uid), exclude)
}

/// The processes running as `uid` (effective): one read of `/proc/<pid>/status` each, the
/// costly half of [`usage`], which needs nothing else and can run while other work waits.
pub fn processes_of(uid: u32) -> Vec<u32> {
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| effective_uid(*pid) == Some(uid))
        .collect()
}

/// inotify instances and watches held by `pids` (see [`processes_of`]), except `exclude`.
pub fn usage_of(pids: &[u32], exclude: &BTreeSet<u32>) -> Usage {
    let mut total = Usage::default();
    for &pid in pids {
        if exclude.contains(&pid) {
            continue;
        }
        match process_usage(pid) {
            Some(u) => {
                total.instances += u.instances;
                total.watches += u.watches;
            }
            None => total.unreadable += 1,
        }
    }
    total
}

fn effective_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// One process's inotify instances and watches; None when its fds cannot be read.
pub fn process_usage(pid: u32) -> Option<Usage> {
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut u = Usage::default();
    for fd in fds.filter_map(|e| e.ok()) {
        let Ok(target) = fs::read_link(fd.path()) else {
            continue;
        };
        if target.as_os_str() != "anon_inode:inotify" {
            continue;
        }
        u.instances += 1;
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        u.watches += info
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count() as u64;
    }
    Some(u)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// [`super::per_replica`] of the files as text.
    fn per_replica(bootstrap: &str, xds: &BTreeMap<String, String>) -> u32 {
        let docs: Vec<Value> = std::iter::once(bootstrap)
            .chain(xds.values().map(String::as_str))
            .flat_map(serde_yaml::Deserializer::from_str)
            .filter_map(|d| serde::Deserialize::deserialize(d).ok())
            .collect();
        super::per_replica(&docs)
    }

    const BOOTSTRAP: &str = r#"
dynamic_resources:
  cds_config:
    resource_api_version: V3
    path_config_source:
      path: /etc/berth/xds/cds.yaml
      watched_directory:
        path: /etc/berth/xds
  lds_config:
    resource_api_version: V3
    path_config_source:
      path: /etc/berth/xds/lds.yaml
      watched_directory:
        path: /etc/berth/xds
"#;

    fn lds(listeners: &[&str]) -> String {
        let mut s = String::from("resources:\n");
        for route in listeners {
            s.push_str(&format!(
                r#"- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: {route}
  filter_chains:
  - filters:
    - typed_config:
        rds:
          route_config_name: {route}
          config_source:
            path_config_source:
              path: /etc/berth/xds/rds-{route}.yaml
              watched_directory:
                path: /etc/berth/xds
"#
            ));
        }
        s
    }

    #[test]
    fn counts_one_per_subscription_as_measured() {
        let one = BTreeMap::from([("lds.yaml".to_string(), lds(&["web"]))]);
        assert_eq!(per_replica(BOOTSTRAP, &one), 3);
        let two = BTreeMap::from([("lds.yaml".to_string(), lds(&["web", "api"]))]);
        assert_eq!(per_replica(BOOTSTRAP, &two), 4);
        // Two listeners sharing one route config share its subscription.
        let shared = BTreeMap::from([("lds.yaml".to_string(), lds(&["web", "web"]))]);
        assert_eq!(per_replica(BOOTSTRAP, &shared), 3);
        assert_eq!(per_replica("admin: {}", &BTreeMap::new()), 0);
    }

    #[test]
    fn counts_data_source_directories() {
        let secret = r#"
resources:
- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret
  name: xds_certificate
  tls_certificate:
    certificate_chain: { filename: /etc/berth/tls/xds/cert.pem }
    private_key: { filename: /etc/berth/tls/xds/key.pem }
    watched_directory:
      path: /etc/berth/tls/xds
"#;
        let files = BTreeMap::from([("sds.yaml".to_string(), secret.to_string())]);
        assert_eq!(per_replica("", &files), 1);
    }

    #[test]
    fn sees_this_process_instances() {
        // SAFETY: plain syscalls on fds this test owns.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        let dir = tempfile::tempdir().unwrap();
        let path = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
        assert!(unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_MOVED_TO) } >= 0);
        let me = process_usage(std::process::id()).unwrap();
        assert!(me.instances >= 1 && me.watches >= 1, "{me:?}");
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let all = usage(uid, &BTreeSet::new());
        assert!(all.instances >= me.instances, "{all:?}");
        unsafe { libc::close(fd) };
    }
}
