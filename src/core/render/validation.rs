//! A self-contained bootstrap for `envoy --mode validate`.
//!
//! Validate mode checks the bootstrap but not the resources Envoy would later load from the
//! watched directory. [`validation_bootstrap`] therefore inlines them: the listeners of
//! `lds.yaml` and clusters of `cds.yaml` become `static_resources`, each listener's RDS
//! reference is replaced by its route configuration from its `rds-<listener>.yaml`, and the file-based
//! `lds_config`/`cds_config` are dropped. Validating the result checks every resource with
//! the real Envoy. Validate mode only checks that SDS secret files exist and never reads them
//! (nor static secrets), so each file-based SDS reference (`tls_certificate_sds_secret_configs`,
//! `validation_context_sds_secret_config`) is replaced by the secret it names, inline: then
//! Envoy parses the secret and loads the certificate files it names (listeners' certificates,
//! backends' CAs and client certificates alike). Mount the TLS files.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

use super::Rendered;
use crate::core::layout;

/// The rendered bootstrap with the standalone resource files inlined as static resources.
pub fn validation_bootstrap(rendered: &Rendered) -> Result<String> {
    let mut boot: Value =
        serde_yaml::from_str(&rendered.bootstrap).context("parsing the rendered bootstrap")?;
    if !boot.is_object() {
        bail!("the rendered bootstrap is not a YAML mapping");
    }
    let mut routes = vec![];
    for (file, text) in &rendered.xds {
        if layout::is_rds_file(file) {
            routes.extend(resources(file, text)?);
        }
    }
    let mut listeners = match rendered.xds.get(layout::LDS_FILE) {
        Some(text) => resources(layout::LDS_FILE, text)?,
        None => vec![],
    };
    for l in &mut listeners {
        inline_rds(l, &routes)?;
    }
    let clusters = match rendered.xds.get(layout::CDS_FILE) {
        Some(text) => resources(layout::CDS_FILE, text)?,
        None => vec![],
    };
    let mut secrets = vec![];
    for (file, text) in &rendered.xds {
        if is_secret_file(text) {
            secrets.extend(resources(file, text)?);
        }
    }
    inline_sds(&mut boot, &secrets)?;
    for l in &mut listeners {
        inline_sds(l, &secrets)?;
    }
    let mut clusters = clusters;
    for c in &mut clusters {
        inline_sds(c, &secrets)?;
    }
    let Some(root) = boot.as_object_mut() else {
        bail!("the rendered bootstrap is not a YAML mapping");
    };
    if rendered.xds.contains_key(layout::LDS_FILE) {
        drop_file_config(root, "lds_config");
    }
    if rendered.xds.contains_key(layout::CDS_FILE) {
        drop_file_config(root, "cds_config");
    }
    let statics = root
        .entry("static_resources")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| anyhow!("static_resources in the bootstrap is not a mapping"))?;
    for (key, items) in [("listeners", listeners), ("clusters", clusters)] {
        if items.is_empty() {
            continue;
        }
        let list = statics
            .entry(key)
            .or_insert_with(|| Value::Array(vec![]))
            .as_array_mut()
            .ok_or_else(|| anyhow!("static_resources.{key} in the bootstrap is not a list"))?;
        list.extend(items);
    }
    serde_yaml::to_string(&boot).context("serializing the validation bootstrap")
}

/// Whether a watched-directory file holds SDS secrets.
fn is_secret_file(text: &str) -> bool {
    let Ok(doc) = serde_yaml::from_str::<Value>(text) else {
        return false;
    };
    doc.get("resources")
        .and_then(Value::as_array)
        .is_some_and(|list| {
            !list.is_empty()
                && list.iter().all(|r| {
                    r.get("@type")
                        .and_then(Value::as_str)
                        .is_some_and(|t| t.ends_with(".tls.v3.Secret"))
                })
        })
}

/// The resources of a DiscoveryResponse-shaped file, without their `@type`.
fn resources(file: &str, text: &str) -> Result<Vec<Value>> {
    let doc: Value = serde_yaml::from_str(text).with_context(|| format!("parsing {file}"))?;
    let list = match doc.get("resources") {
        Some(Value::Array(list)) => list.clone(),
        Some(Value::Null) | None => vec![],
        Some(_) => bail!("{file}: resources is not a list"),
    };
    list.into_iter()
        .map(|mut r| {
            r.as_object_mut()
                .ok_or_else(|| anyhow!("{file}: a resource is not a mapping"))?
                .remove("@type");
            Ok(r)
        })
        .collect()
}

/// Replaces every `rds: {route_config_name: X, …}` under `v` with `route_config: <X>`.
fn inline_rds(v: &mut Value, routes: &[Value]) -> Result<()> {
    match v {
        Value::Object(m) => {
            if let Some(rds) = m.get("rds") {
                let name = rds
                    .get("route_config_name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| anyhow!("an rds block has no route_config_name"))?
                    .to_string();
                let rc = routes
                    .iter()
                    .find(|r| r.get("name").and_then(Value::as_str) == Some(&name))
                    .ok_or_else(|| {
                        anyhow!(
                            "route configuration {name:?} is not in {}",
                            layout::rds_file(&name)
                        )
                    })?;
                m.remove("rds");
                m.insert("route_config".into(), rc.clone());
            }
            for child in m.values_mut() {
                inline_rds(child, routes)?;
            }
        }
        Value::Array(a) => {
            for child in a {
                inline_rds(child, routes)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Replaces file-based SDS references under `v` by the secrets they name, inline (without the
/// SDS-only `watched_directory`).
fn inline_sds(v: &mut Value, secrets: &[Value]) -> Result<()> {
    let find = |cfg: &Value, part: &str| -> Result<Option<Value>> {
        let Some(name) = cfg.get("name").and_then(Value::as_str) else {
            return Ok(None);
        };
        if cfg.get("sds_config").is_none() {
            return Ok(None);
        }
        let Some(secret) = secrets
            .iter()
            .find(|s| s.get("name").and_then(Value::as_str) == Some(name))
        else {
            return Ok(None);
        };
        let mut inner = secret
            .get(part)
            .cloned()
            .ok_or_else(|| anyhow!("secret {name:?} has no {part}"))?;
        if let Some(m) = inner.as_object_mut() {
            m.remove("watched_directory");
        }
        Ok(Some(inner))
    };
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(cfgs)) = m.get("tls_certificate_sds_secret_configs") {
                let found: Vec<Option<Value>> = cfgs
                    .iter()
                    .map(|c| find(c, "tls_certificate"))
                    .collect::<Result<_>>()?;
                if found.iter().all(Option::is_some) {
                    m.remove("tls_certificate_sds_secret_configs");
                    m.insert(
                        "tls_certificates".into(),
                        Value::Array(found.into_iter().flatten().collect()),
                    );
                }
            }
            if let Some(cfg) = m.get("validation_context_sds_secret_config") {
                if let Some(inner) = find(cfg, "validation_context")? {
                    m.remove("validation_context_sds_secret_config");
                    m.insert("validation_context".into(), inner);
                }
            }
            for child in m.values_mut() {
                inline_sds(child, secrets)?;
            }
        }
        Value::Array(a) => {
            for child in a {
                inline_sds(child, secrets)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn drop_file_config(root: &mut Map<String, Value>, key: &str) {
    let Some(Value::Object(dynamic)) = root.get_mut("dynamic_resources") else {
        return;
    };
    if dynamic
        .get(key)
        .is_some_and(|c| c.get("path_config_source").is_some() || c.get("path").is_some())
    {
        dynamic.remove(key);
    }
    if dynamic.is_empty() {
        root.remove("dynamic_resources");
    }
}
