//! What a bootstrap override must leave alone, checked after Merge, Replace or JSONPatch.
//!
//! Envoy Gateway refuses an EnvoyProxy whose bootstrap, once applied, changes
//! `dynamic_resources` (except `initial_fetch_timeout`) or the `load_assignment` of
//! `xds_cluster`, or has no `xds_cluster` (`internal/xds/bootstrap/validate.go`). berth applies
//! the same rules against its own rendered bootstrap, and adds what it needs to manage the
//! replicas:
//!
//! - **The admin socket is re-added.** berth gates, drains and reads every replica through its
//!   admin Unix socket, and N replicas on one host cannot share a TCP admin port. So
//!   `admin.address` is always berth's socket; the rest of `admin` (access logs…) is the
//!   user's. A bootstrap copied from EG (admin on 127.0.0.1:19000) thus runs unchanged.
//! - **Replace, xDS mode:** EG only accepts its own default `load_assignment` for
//!   `xds_cluster` (its in-cluster address), which names nothing on a Docker host; berth puts in
//!   the xDS server and the mTLS files it was configured with (`load_assignment` and
//!   `transport_socket`). Merge and JSONPatch start from berth's bootstrap, so there a changed
//!   `load_assignment` is refused, as EG refuses it.

use anyhow::{anyhow, bail, Result};
use prost_reflect::DynamicMessage;
use serde_json::{Map, Value};

use crate::core::ir::BootstrapOverrideKind;
use crate::core::render::descriptors;

pub const XDS_CLUSTER: &str = "xds_cluster";

/// Makes `result` keep what berth needs from `base` (berth's rendered bootstrap) and refuses
/// what Envoy Gateway refuses. Returns notes on what was put back.
pub fn keep(base: &Value, result: &mut Value, kind: BootstrapOverrideKind) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    let root = result
        .as_object_mut()
        .ok_or_else(|| anyhow!("the bootstrap must be a YAML mapping"))?;

    if let Some(address) = base.pointer("/admin/address") {
        let admin = root
            .entry("admin")
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(admin) = admin else {
            bail!("admin must be a mapping");
        };
        if admin.get("address") != Some(address) {
            if let Some(theirs) = admin.get("address") {
                notes.push(format!(
                    "admin.address {} replaced by berth's admin socket (berth gates and drains \
                     each replica through it)",
                    serde_json::to_string(theirs).unwrap_or_default()
                ));
            }
            admin.insert("address".into(), address.clone());
        }
    }

    let theirs = field(root, "dynamic_resources", "dynamicResources");
    let ours = base.get("dynamic_resources");
    if let Some(ours) = ours {
        let same = match theirs {
            Some(theirs) => same_dynamic_resources(theirs, ours),
            None => false,
        };
        if !same {
            bail!(
                "dynamic_resources cannot be modified (as in Envoy Gateway; only \
                 initial_fetch_timeout of lds_config and cds_config may change): they are \
                 how berth's replicas get their listeners and clusters; keep them as berth \
                 renders them (`berth validate` shows the rendered bootstrap's)"
            );
        }
    }

    let Some(our_cluster) = cluster(base, XDS_CLUSTER) else {
        return Ok(notes);
    };
    let their_cluster = clusters_mut(root)
        .and_then(|cs| {
            cs.iter_mut()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(XDS_CLUSTER))
        })
        .ok_or_else(|| {
            anyhow!(
                "static_resources.clusters has no {XDS_CLUSTER} (as Envoy Gateway, berth \
                 refuses it): replicas reach Envoy Gateway's xDS server through it"
            )
        })?;
    let Value::Object(their_cluster) = their_cluster else {
        bail!("{XDS_CLUSTER} must be a mapping");
    };
    let load_assignment = our_cluster.get("load_assignment");
    if kind == BootstrapOverrideKind::Replace {
        for key in ["load_assignment", "transport_socket"] {
            if let Some(v) = our_cluster.get(key) {
                their_cluster.remove("loadAssignment");
                their_cluster.remove("transportSocket");
                their_cluster.insert(key.into(), v.clone());
            }
        }
        notes.push(format!(
            "{XDS_CLUSTER}: load_assignment and transport_socket are berth's (the configured xDS \
             server and mTLS files)"
        ));
    } else {
        let theirs = field(their_cluster, "load_assignment", "loadAssignment");
        let same = match (theirs, load_assignment) {
            (Some(a), Some(b)) => {
                same_message(a, b, "envoy.config.endpoint.v3.ClusterLoadAssignment")
            }
            (None, None) => true,
            _ => false,
        };
        if !same {
            bail!(
                "{XDS_CLUSTER}'s load_assignment cannot be modified (as in Envoy Gateway): it \
                 is where the replicas reach the xDS server; set the address in berth's \
                 [envoy_gateway] xds_address / xds_port instead"
            );
        }
    }
    Ok(notes)
}

fn field<'a>(m: &'a Map<String, Value>, name: &str, json_name: &str) -> Option<&'a Value> {
    m.get(name).or_else(|| m.get(json_name))
}

fn cluster<'a>(doc: &'a Value, name: &str) -> Option<&'a Map<String, Value>> {
    doc.pointer("/static_resources/clusters")?
        .as_array()?
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))?
        .as_object()
}

fn clusters_mut(root: &mut Map<String, Value>) -> Option<&mut Vec<Value>> {
    let statics = match root.contains_key("static_resources") {
        true => root.get_mut("static_resources"),
        false => root.get_mut("staticResources"),
    }?;
    statics
        .as_object_mut()?
        .get_mut("clusters")
        .and_then(Value::as_array_mut)
}

/// `dynamic_resources` compared as messages, ignoring `initial_fetch_timeout` of the config
/// sources, as EG's validator does.
fn same_dynamic_resources(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            for (k, source) in m.iter_mut() {
                if k.ends_with("_config") || k.ends_with("Config") {
                    if let Some(s) = source.as_object_mut() {
                        s.remove("initial_fetch_timeout");
                        s.remove("initialFetchTimeout");
                    }
                }
            }
        }
        v
    };
    same_message(
        &strip(a),
        &strip(b),
        "envoy.config.bootstrap.v3.Bootstrap.DynamicResources",
    )
}

/// Whether two JSON forms are the same protobuf message (field spellings, duration formats and
/// number forms do not matter). A form that is not a valid message differs from everything.
fn same_message(a: &Value, b: &Value, full_name: &str) -> bool {
    let desc = descriptors::message(full_name);
    let parse = |v: &Value| DynamicMessage::deserialize(desc.clone(), v.clone()).ok();
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "admin": {"address": {"pipe": {"path": "/run/berth/admin.sock", "mode": 384}}},
            "dynamic_resources": {
                "ads_config": {"api_type": "DELTA_GRPC", "transport_api_version": "V3",
                    "grpc_services": [{"envoy_grpc": {"cluster_name": "xds_cluster"}}]},
                "lds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
                "cds_config": {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}},
            "static_resources": {"clusters": [{"name": "xds_cluster", "type": "STATIC",
                "load_assignment": {"cluster_name": "xds_cluster", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 18000}}}}]}]},
                "transport_socket": {"name": "berth-tls"}}]}
        })
    }

    #[test]
    fn the_admin_socket_is_re_added() {
        let mut r = base();
        r["admin"] = json!({"access_log_path": "/dev/null",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 19000}}});
        let notes = keep(&base(), &mut r, BootstrapOverrideKind::Merge).unwrap();
        assert_eq!(r["admin"]["address"], base()["admin"]["address"]);
        assert_eq!(r["admin"]["access_log_path"], "/dev/null");
        assert!(notes[0].contains("admin.address"), "{notes:?}");
        let mut r = base();
        r.as_object_mut().unwrap().remove("admin");
        keep(&base(), &mut r, BootstrapOverrideKind::Replace).unwrap();
        assert_eq!(r["admin"]["address"], base()["admin"]["address"]);
    }

    #[test]
    fn dynamic_resources_may_change_only_initial_fetch_timeout() {
        let mut r = base();
        r["dynamic_resources"]["lds_config"]["initial_fetch_timeout"] = json!("15s");
        // Spelling does not matter: camelCase and a differently written duration.
        r["dynamic_resources"]["cds_config"] = json!({"ads": {}, "resourceApiVersion": "V3"});
        keep(&base(), &mut r, BootstrapOverrideKind::Merge).unwrap();
        r["dynamic_resources"]["ads_config"]["api_type"] = json!("GRPC");
        let e = keep(&base(), &mut r, BootstrapOverrideKind::Merge).unwrap_err();
        assert!(
            e.to_string()
                .contains("dynamic_resources cannot be modified"),
            "{e}"
        );
        let mut r = base();
        r.as_object_mut().unwrap().remove("dynamic_resources");
        assert!(keep(&base(), &mut r, BootstrapOverrideKind::Replace).is_err());
    }

    #[test]
    fn xds_cluster_must_stay_and_keep_its_address() {
        let mut r = base();
        r["static_resources"]["clusters"] = json!([{"name": "other"}]);
        let e = keep(&base(), &mut r, BootstrapOverrideKind::JSONPatch).unwrap_err();
        assert!(e.to_string().contains("no xds_cluster"), "{e}");

        let mut r = base();
        r["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]
            [0]["endpoint"]["address"]["socket_address"]["port_value"] = json!(18001);
        let e = keep(&base(), &mut r, BootstrapOverrideKind::Merge).unwrap_err();
        assert!(
            e.to_string().contains("load_assignment cannot be modified"),
            "{e}"
        );

        // Replace: EG's own in-cluster address is what a copied bootstrap has; berth's wins.
        let notes = keep(&base(), &mut r, BootstrapOverrideKind::Replace).unwrap();
        assert_eq!(
            r["static_resources"]["clusters"][0]["load_assignment"],
            base()["static_resources"]["clusters"][0]["load_assignment"]
        );
        assert_eq!(
            r["static_resources"]["clusters"][0]["transport_socket"]["name"],
            "berth-tls"
        );
        assert!(notes.iter().any(|n| n.contains("xds_cluster")), "{notes:?}");
    }
}
