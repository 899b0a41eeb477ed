//! The listener certificates a proxy's replicas are told to serve, read back from the state
//! directory: each SDS secret in the watched directory names a checked copy of a certificate
//! (`tls/<secret>/cert-<version>.pem`), and `lds.yaml` says which SNI names choose it. What is
//! shown is what was delivered, not what the config file says now.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::state::StateDir;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CertificateStatus {
    pub proxy: String,
    pub listener: String,
    /// The SDS secret (the listener's name, or `<listener>_<virtual host>`).
    pub secret: String,
    /// The SNI names choosing it; empty for the listener's default certificate.
    pub server_names: Vec<String>,
    /// The names the certificate is for (subjectAltName, else common name).
    pub names: Vec<String>,
    pub serial: String,
    /// RFC 3339.
    pub not_after: String,
    pub not_after_unix: i64,
    /// Whole days until it expires (negative once it has).
    pub days_left: i64,
}

/// The delivered certificates of `proxies`, in the order of their secrets. A secret whose copy
/// cannot be read is left out (the replicas could not serve it either).
pub fn delivered<'a>(
    state: &StateDir,
    proxies: impl IntoIterator<Item = &'a String>,
    now: SystemTime,
) -> Vec<CertificateStatus> {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut out = Vec::new();
    for proxy in proxies {
        let Ok(files) = state.read_xds(proxy) else {
            continue;
        };
        let sni = files
            .get(crate::core::layout::LDS_FILE)
            .map(|lds| server_names(lds))
            .unwrap_or_default();
        for text in files
            .iter()
            .filter(|(name, _)| name.starts_with("sds-"))
            .map(|(_, text)| text)
        {
            let Some((secret, chain)) = secret_and_chain(text) else {
                continue;
            };
            let Some(file) = chain.rsplit('/').next() else {
                continue;
            };
            let path = state.proxy(proxy).tls(&secret).join(file);
            let Ok(pem) = std::fs::read(&path) else {
                continue;
            };
            let Ok(c) = crate::core::certificates::describe(&pem) else {
                continue;
            };
            let listener = secret.split('_').next().unwrap_or(&secret).to_string();
            out.push(CertificateStatus {
                proxy: proxy.clone(),
                listener,
                server_names: sni.get(&secret).cloned().unwrap_or_default(),
                secret,
                names: c.names,
                serial: c.serial,
                not_after: humantime::format_rfc3339_seconds(
                    UNIX_EPOCH + std::time::Duration::from_secs(c.not_after.max(0) as u64),
                )
                .to_string(),
                not_after_unix: c.not_after,
                days_left: (c.not_after - now).div_euclid(86_400),
            });
        }
    }
    out
}

/// `resources[0].name` and its `tls_certificate.certificate_chain.filename` of an SDS file.
fn secret_and_chain(sds: &str) -> Option<(String, String)> {
    let doc: serde_yaml::Value = serde_yaml::from_str(sds).ok()?;
    let secret = doc.get("resources")?.get(0)?;
    let name = secret.get("name")?.as_str()?;
    let chain = secret
        .get("tls_certificate")?
        .get("certificate_chain")?
        .get("filename")?
        .as_str()?;
    Some((name.to_string(), chain.to_string()))
}

/// For each secret a filter chain of `lds.yaml` reads, the SNI names that choose that chain.
fn server_names(lds: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(lds) else {
        return out;
    };
    let listeners = doc.get("resources").and_then(|r| r.as_sequence());
    for chain in listeners
        .into_iter()
        .flatten()
        .filter_map(|l| l.get("filter_chains")?.as_sequence())
        .flatten()
    {
        let names: Vec<String> = chain
            .get("filter_chain_match")
            .and_then(|m| m.get("server_names"))
            .and_then(|n| n.as_sequence())
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        let secrets = chain
            .get("transport_socket")
            .and_then(|t| t.get("typed_config"))
            .and_then(|t| t.get("common_tls_context"))
            .and_then(|c| c.get("tls_certificate_sds_secret_configs"))
            .and_then(|s| s.as_sequence());
        for s in secrets.into_iter().flatten() {
            if let Some(name) = s.get("name").and_then(|n| n.as_str()) {
                out.insert(name.to_string(), names.clone());
            }
        }
    }
    out
}

/// A table: one row per certificate.
pub fn table(rows: &[CertificateStatus]) -> String {
    let header = [
        "PROXY",
        "LISTENER",
        "SNI",
        "NAMES",
        "SERIAL",
        "EXPIRES",
        "DAYS LEFT",
    ];
    let cells = rows
        .iter()
        .map(|c| {
            vec![
                c.proxy.clone(),
                c.listener.clone(),
                if c.server_names.is_empty() {
                    "(default)".to_string()
                } else {
                    c.server_names.join(",")
                },
                c.names.join(","),
                c.serial.clone(),
                c.not_after.clone(),
                c.days_left.to_string(),
            ]
        })
        .collect();
    super::columns(&header, cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_secret_its_copy_and_the_names_choosing_it() {
        let sds = "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: \"web_app\"\n  tls_certificate:\n    certificate_chain:\n      filename: \"/etc/berth/tls/web_app/cert-abc.pem\"\n    private_key:\n      filename: \"/etc/berth/tls/web_app/key-abc.pem\"\n";
        assert_eq!(
            secret_and_chain(sds),
            Some((
                "web_app".to_string(),
                "/etc/berth/tls/web_app/cert-abc.pem".to_string()
            ))
        );
        let lds = "resources:\n- name: web\n  filter_chains:\n  - filter_chain_match:\n      server_names: [\"app.example.com\"]\n    transport_socket:\n      typed_config:\n        common_tls_context:\n          tls_certificate_sds_secret_configs:\n          - name: web_app\n  - transport_socket:\n      typed_config:\n        common_tls_context:\n          tls_certificate_sds_secret_configs:\n          - name: web\n";
        let sni = server_names(lds);
        assert_eq!(sni["web_app"], ["app.example.com"]);
        assert!(sni["web"].is_empty());
    }
}
