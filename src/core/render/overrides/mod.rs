//! EG's bootstrap override (`config.bootstrap`): Merge ([`merge`]: a protobuf merge), Replace
//! or JSONPatch ([`patch`]: with `jsonPath` and parents created on `add`), applied to the
//! rendered bootstrap exactly as Envoy Gateway applies them; then [`invariants`] puts back
//! berth's admin socket and refuses what EG refuses (a changed `dynamic_resources` or
//! `xds_cluster` address).

pub mod invariants;
pub mod merge;
pub mod patch;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::core::ir::{BootstrapOverride, BootstrapOverrideKind};
use crate::core::render::descriptors;

pub use patch::json_patch;

/// Applies `ov` to the rendered bootstrap (YAML text) and returns the resulting YAML.
pub fn apply(rendered: &str, ov: &BootstrapOverride) -> Result<String> {
    let user: Value = serde_yaml::from_str(&ov.value).with_context(|| {
        format!(
            "bootstrap override ({:?}): the value is not valid YAML or JSON",
            ov.kind
        )
    })?;
    let result = match ov.kind {
        BootstrapOverrideKind::Replace => {
            if !user.is_object() {
                bail!("bootstrap override (Replace): the value must be a YAML mapping (a whole Envoy bootstrap), got {}", kind_of(&user));
            }
            user
        }
        BootstrapOverrideKind::Merge => {
            let Value::Object(overlay) = &user else {
                bail!("bootstrap override (Merge): the value must be a YAML mapping to merge into the bootstrap, got {}", kind_of(&user));
            };
            let mut base = parse_rendered(rendered)?;
            let Value::Object(into) = &mut base else {
                bail!("bootstrap override: the rendered bootstrap is not a YAML mapping");
            };
            let dropped = merge::merge_message(into, overlay, &descriptors::bootstrap(), "")
                .map_err(|e| anyhow::anyhow!("bootstrap override (Merge): {e}"))?;
            for field in dropped {
                tracing::warn!(
                    field,
                    "bootstrap override (Merge): Envoy's bootstrap has no such field; ignored, \
                     as Envoy Gateway ignores it"
                );
            }
            base
        }
        BootstrapOverrideKind::JSONPatch => {
            refuse_admin_address_patches(&user)?;
            let mut base = parse_rendered(rendered)?;
            json_patch(&mut base, &user).context("bootstrap override (JSONPatch)")?;
            base
        }
    };
    let mut result = result;
    let base = parse_rendered(rendered)?;
    let notes = invariants::keep(&base, &mut result, ov.kind)
        .with_context(|| format!("bootstrap override ({:?})", ov.kind))?;
    for note in notes {
        tracing::info!("bootstrap override ({:?}): {note}", ov.kind);
    }
    serde_yaml::to_string(&result).context("bootstrap override: serializing the result as YAML")
}

/// A patch of `admin.address` (EG's docs change the admin port this way) cannot apply: berth's
/// admin is a Unix socket. Say so, instead of "no key socket_address".
fn refuse_admin_address_patches(patch: &Value) -> Result<()> {
    for (i, op) in patch.as_array().into_iter().flatten().enumerate() {
        let path = op.get("path").and_then(Value::as_str).unwrap_or_default();
        if path == "/admin" || path.starts_with("/admin/address") {
            bail!(
                "bootstrap override (JSONPatch): operation {i} changes {path}: berth's admin \
                 listens on its Unix socket, not a TCP address (the replicas share one host, and \
                 berth gates, drains and reads each replica through the socket); leave \
                 admin.address out of the patch"
            );
        }
    }
    Ok(())
}

fn parse_rendered(rendered: &str) -> Result<Value> {
    serde_yaml::from_str(rendered).context("bootstrap override: the rendered bootstrap is not valid YAML (a template override is broken?)")
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RENDERED: &str = "admin:\n  address: {pipe: {path: \"/x\", mode: 384}}\nnode:\n  cluster: \"edge\"\nlayered_runtime:\n  layers:\n  - name: global_config\n    static_layer: {a: 1}\n";

    fn apply_kind(kind: BootstrapOverrideKind, value: &str) -> Result<Value> {
        let out = apply(
            RENDERED,
            &BootstrapOverride {
                kind,
                value: value.into(),
            },
        )?;
        Ok(serde_yaml::from_str(&out).unwrap())
    }

    #[test]
    fn apply_each_kind() {
        let v = apply_kind(
            BootstrapOverrideKind::Merge,
            "node: {id: n1}\nlayered_runtime: {layers: [{name: extra, static_layer: {b: 2}}]}\n",
        )
        .unwrap();
        assert_eq!(v["node"], json!({"cluster": "edge", "id": "n1"}));
        assert_eq!(v["admin"]["address"]["pipe"]["path"], "/x");
        // Lists append, as in protobuf and EG: the rendered layer stays first.
        let layers: Vec<_> = v["layered_runtime"]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap())
            .collect();
        assert_eq!(layers, ["global_config", "extra"]);

        // Replace: berth's admin socket is put back.
        let v = apply_kind(BootstrapOverrideKind::Replace, "{node: {cluster: other}}").unwrap();
        assert_eq!(
            v,
            json!({"node": {"cluster": "other"}, "admin": {"address": {"pipe": {"path": "/x", "mode": 384}}}})
        );

        // A JSONPatch of the admin address cannot apply: berth's admin is its socket.
        let err = apply_kind(
            BootstrapOverrideKind::JSONPatch,
            r#"[{"op": "remove", "path": "/admin"}]"#,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("Unix socket"), "{err:#}");
        let v = apply_kind(
            BootstrapOverrideKind::JSONPatch,
            r#"[{"op": "add", "path": "/admin/access_log_path", "value": "/dev/null"}]"#,
        )
        .unwrap();
        assert_eq!(v["admin"]["address"]["pipe"]["path"], "/x");

        let err = apply_kind(BootstrapOverrideKind::Merge, "- a list").unwrap_err();
        assert!(format!("{err:#}").contains("Merge"), "{err:#}");
        let err = apply_kind(BootstrapOverrideKind::Merge, "a: [unclosed").unwrap_err();
        assert!(format!("{err:#}").contains("not valid YAML"), "{err:#}");
    }
}
