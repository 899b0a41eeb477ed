//! Turns one proxy's IR into files: the Envoy bootstrap and, in standalone mode, the listener,
//! route and cluster resources Envoy watches (in xds mode, the file-based SDS secrets for the
//! xDS client certificate).
//!
//! Templates are tera files in `templates/`, compiled into the binary; a user's template
//! directory can replace any of them by name ([`Renderer::with_overrides`]). The IR is first
//! reshaped into a template context ([`view`]) where every decision is made in Rust; the
//! templates only print it.
//!
//! **Escaping.** Autoescape is on for every template, builtin or user-supplied, with an escape
//! function that turns each printed string into one double-quoted scalar ([`escape::quote`]).
//! So `{{ name }}` can never add a key or break the document, whatever `name` holds; numbers
//! and booleans print bare. Templates must therefore never wrap `{{ … }}` in quotes. Every
//! rendered file is parsed back as YAML before it is returned, so a broken override template
//! fails here, naming the template.

mod alpn;
pub mod cache;
pub mod descriptors;
pub mod escape;
pub mod inotify;
pub mod overrides;
pub mod validation;
pub mod view;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

use crate::core::ir;
use crate::core::layout;

use cache::RenderCache;
pub use validation::validation_bootstrap;
pub use view::{SDS_XDS_CERTIFICATE_FILE, SDS_XDS_TRUSTED_CA_FILE};

/// One proxy's rendered files.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rendered {
    /// The Envoy bootstrap ([`layout::CONTAINER_BOOTSTRAP`]), identical for every replica.
    pub bootstrap: String,
    /// Files for the watched directory ([`layout::CONTAINER_XDS_DIR`]), by file name:
    /// `lds.yaml`, `cds.yaml` and one `rds-<listener>.yaml` per HTTP listener in standalone
    /// mode; the SDS secrets
    /// ([`SDS_XDS_CERTIFICATE_FILE`], [`SDS_XDS_TRUSTED_CA_FILE`]) in xds mode.
    pub xds: BTreeMap<String, String>,
    /// The inotify instances one replica holds for these files
    /// ([`inotify::per_replica`]), counted from the documents as they were parsed
    /// back here, so the host's needs cost no second parse.
    pub inotify_per_replica: u32,
}

const BOOTSTRAP: &str = "bootstrap.yaml.tera";
const LDS: &str = "lds.yaml.tera";
const RDS: &str = "rds.yaml.tera";
const CDS: &str = "cds.yaml.tera";
const SDS_CERT: &str = "sds-xds-certificate.yaml.tera";
const SDS_CA: &str = "sds-xds-trusted-ca.yaml.tera";
const SDS_LISTENER: &str = "sds-listener.yaml.tera";
const SDS_BACKEND: &str = "sds-backend.yaml.tera";

/// The builtin templates, by name.
const BUILTIN: &[(&str, &str)] = &[
    (
        BOOTSTRAP,
        include_str!("../../../templates/bootstrap.yaml.tera"),
    ),
    (LDS, include_str!("../../../templates/lds.yaml.tera")),
    (RDS, include_str!("../../../templates/rds.yaml.tera")),
    (CDS, include_str!("../../../templates/cds.yaml.tera")),
    (
        SDS_CERT,
        include_str!("../../../templates/sds-xds-certificate.yaml.tera"),
    ),
    (
        SDS_CA,
        include_str!("../../../templates/sds-xds-trusted-ca.yaml.tera"),
    ),
    (
        SDS_LISTENER,
        include_str!("../../../templates/sds-listener.yaml.tera"),
    ),
    (
        SDS_BACKEND,
        include_str!("../../../templates/sds-backend.yaml.tera"),
    ),
];

/// The names of the templates berth renders; a user's template directory may hold files with
/// these names to replace them.
pub fn template_names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// The builtin source of a template, e.g. to copy it as the start of an override.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Renders proxies with the builtin templates or a user's overrides.
#[derive(Debug)]
pub struct Renderer {
    /// Each template: its name, its text and where it came from (for error messages).
    sources: Vec<(&'static str, String, String)>,
    /// One tera instance per template (none includes another), compiled at the first render
    /// that is not in the cache; a user's overrides are compiled at once, so a broken one is
    /// refused even when no proxy uses it.
    compiled: OnceLock<BTreeMap<&'static str, tera::Tera>>,
    /// What the output depends on besides a proxy: this berth and the templates' text.
    fingerprint: String,
    cache: Option<RenderCache>,
}

impl Renderer {
    /// The templates compiled into berth.
    pub fn builtin() -> Renderer {
        let sources = BUILTIN
            .iter()
            .map(|(n, t)| (*n, t.to_string(), "builtin".to_string()));
        Self::from_sources(sources.collect())
    }

    /// The builtin templates, with every file in `dir` named like a builtin template
    /// (see [`template_names`]) replacing it. Other `.tera` files are an error (a typo would
    /// otherwise be silently ignored); files with other extensions are ignored.
    pub fn with_overrides(dir: &Path) -> Result<Renderer> {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("reading the template directory {}", dir.display()))?;
        let mut sources: Vec<(&'static str, String, String)> = BUILTIN
            .iter()
            .map(|(n, t)| (*n, t.to_string(), "builtin".to_string()))
            .collect();
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let file_name = entry.file_name();
            let name = file_name.to_string_lossy();
            if !name.ends_with(".tera") {
                continue;
            }
            let Some(slot) = sources.iter_mut().find(|(n, _, _)| *n == name) else {
                bail!(
                    "{}: no builtin template is called {name:?}; the templates are {}",
                    entry.path().display(),
                    template_names().join(", ")
                );
            };
            let path = entry.path();
            slot.1 = std::fs::read_to_string(&path)
                .with_context(|| format!("reading the template {}", path.display()))?;
            slot.2 = path.display().to_string();
        }
        let renderer = Self::from_sources(sources);
        let _ = renderer.compiled.set(compile_all(&renderer.sources)?);
        Ok(renderer)
    }

    fn from_sources(sources: Vec<(&'static str, String, String)>) -> Renderer {
        let fingerprint = cache::fingerprint(&sources);
        Renderer {
            sources,
            compiled: OnceLock::new(),
            fingerprint,
            cache: None,
        }
    }

    /// This renderer, answering from the render cache in the state directory `state_dir`
    /// ([`cache`]) and, when `write`, keeping what it renders there ([`Renderer::save_cache`]).
    pub fn caching_in(mut self, state_dir: &Path, write: bool) -> Renderer {
        self.cache = Some(RenderCache::open(state_dir, write));
        self
    }

    /// Writes what this renderer rendered to its cache, when it may write one.
    pub fn save_cache(&self) {
        if let Some(cache) = &self.cache {
            cache.save();
        }
    }

    fn compiled(&self) -> &BTreeMap<&'static str, tera::Tera> {
        self.compiled.get_or_init(|| {
            compile_all(&self.sources).expect("the builtin templates compile (tested)")
        })
    }

    /// Renders one proxy's bootstrap and resource files; listener certificates are read as
    /// `cert.pem`/`key.pem` (see [`Renderer::render_with_certificates`]).
    pub fn render(&self, proxy: &ir::ProxyInfra) -> Result<Rendered> {
        self.render_with_certificates(proxy, &BTreeMap::new())
    }

    /// Renders one proxy; `versions` names each TLS listener's checked certificate copy (and,
    /// under [`view::backend_tls_owner`], each TLS backend's).
    pub fn render_with_certificates(
        &self,
        proxy: &ir::ProxyInfra,
        versions: &BTreeMap<String, String>,
    ) -> Result<Rendered> {
        let Some(cache) = &self.cache else {
            return self.render_now(proxy, versions);
        };
        let key = cache::key(&self.fingerprint, proxy, versions);
        if let Some(rendered) = cache.get(&proxy.name, &key) {
            return Ok(rendered);
        }
        let rendered = self.render_now(proxy, versions)?;
        cache.put(&proxy.name, key, &rendered);
        Ok(rendered)
    }

    fn render_now(
        &self,
        proxy: &ir::ProxyInfra,
        versions: &BTreeMap<String, String>,
    ) -> Result<Rendered> {
        let view =
            view::build(proxy, versions).with_context(|| format!("proxy {:?}", proxy.name))?;
        let mut ctx =
            tera::Context::from_serialize(&view).context("building the template context")?;
        let (mut bootstrap, mut parsed) = self.render_one(BOOTSTRAP, &ctx)?;
        if let Some(ov) = &proxy.config.bootstrap {
            bootstrap = overrides::apply(&bootstrap, ov)
                .with_context(|| format!("proxy {:?}", proxy.name))?;
            parsed = serde_yaml::from_str(&bootstrap)
                .context("parsing the bootstrap with its override")?;
        }
        let mut docs = vec![parsed];
        let mut xds = BTreeMap::new();
        let mut add = |file: String, (text, doc): (String, serde_yaml::Value)| {
            xds.insert(file, text);
            docs.push(doc);
        };
        let files: &[(&str, &str)] = match proxy.routing {
            ir::Routing::Standalone(_) => &[(layout::LDS_FILE, LDS), (layout::CDS_FILE, CDS)],
            ir::Routing::Xds(_) => &[
                (SDS_XDS_CERTIFICATE_FILE, SDS_CERT),
                (SDS_XDS_TRUSTED_CA_FILE, SDS_CA),
            ],
        };
        for (file, template) in files {
            add(file.to_string(), self.render_one(template, &ctx)?);
        }
        // One file per route configuration (see `layout::rds_file`).
        for rc in &view.route_configs {
            ctx.insert("route_configs", std::slice::from_ref(rc));
            add(layout::rds_file(&rc.name), self.render_one(RDS, &ctx)?);
        }
        for secret in &view.secrets {
            ctx.insert("secret", &secret.tls);
            add(secret.file.clone(), self.render_one(SDS_LISTENER, &ctx)?);
        }
        for secret in &view.backend_secrets {
            ctx.insert("secret", secret);
            add(secret.file.clone(), self.render_one(SDS_BACKEND, &ctx)?);
        }
        Ok(Rendered {
            bootstrap,
            xds,
            inotify_per_replica: inotify::per_replica(&docs),
        })
    }

    /// One template's text, and the YAML mapping it parses back to.
    fn render_one(&self, name: &str, ctx: &tera::Context) -> Result<(String, serde_yaml::Value)> {
        let from = self
            .sources
            .iter()
            .find(|(n, _, _)| *n == name)
            .map_or("?", |(_, _, from)| from.as_str());
        let tera = self
            .compiled()
            .get(name)
            .with_context(|| format!("no template {name}"))?;
        let text = tera.render(name, ctx).map_err(|e| {
            anyhow::anyhow!("rendering template {name} ({from}): {}", tera_error(&e))
        })?;
        // A leading comment block leaves blank lines behind.
        let text = text.trim_start_matches(['\n', '\r']).to_string();
        match serde_yaml::from_str::<serde_yaml::Value>(&text) {
            Ok(doc @ serde_yaml::Value::Mapping(_)) => Ok((text, doc)),
            Ok(_) => bail!("template {name} ({from}) did not render a YAML mapping"),
            Err(e) => bail!("template {name} ({from}) rendered invalid YAML: {e}"),
        }
    }
}

/// Compiles every template, on one thread per core: tera's parser is most of the cost of a
/// render.
fn compile_all(
    sources: &[(&'static str, String, String)],
) -> Result<BTreeMap<&'static str, tera::Tera>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let compiled: Vec<Result<(&'static str, tera::Tera)>> = std::thread::scope(|scope| {
        let shares: Vec<_> = (0..threads.min(sources.len()))
            .map(|i| {
                scope.spawn(move || {
                    sources
                        .iter()
                        .skip(i)
                        .step_by(threads)
                        .map(|(name, text, from)| Ok((*name, compile(name, text, from)?)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        shares
            .into_iter()
            .flat_map(|share| {
                share
                    .join()
                    .unwrap_or_else(|_| vec![Err(anyhow::anyhow!("a template compiler panicked"))])
            })
            .collect()
    });
    compiled.into_iter().collect()
}

/// One template in its own tera instance, escaping every printed string.
fn compile(name: &'static str, text: &str, from: &str) -> Result<tera::Tera> {
    let mut tera = tera::Tera::default();
    // Every template, whatever its name: escape every printed string.
    tera.autoescape_on(vec![""]);
    tera.set_escape_fn(escape::quote);
    tera.add_raw_template(name, text)
        .map_err(|e| anyhow::anyhow!("template {from} ({name}): {}", tera_error(&e)))?;
    Ok(tera)
}

/// A tera error with its causes, on one line.
fn tera_error(e: &tera::Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests;
