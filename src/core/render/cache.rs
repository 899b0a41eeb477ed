//! The render cache: what each proxy rendered to, kept in the state directory
//! ([`CACHE_FILE`]) under a key of everything the output depends on, so that a command whose
//! config did not change renders nothing (compiling the templates and rendering them is most
//! of the CPU a no-op `up` spends).
//!
//! Rendering is a pure function of this berth (its code: the binary's identity), the
//! templates' text, the proxy's IR and the versions of its certificate copies; the key hashes
//! all of them, so an entry is either exactly what rendering would give, or not used. The
//! cache is only an economy: unreadable or torn, it is ignored and written again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Rendered;
use crate::core::ir::ProxyInfra;

/// The cache's file in the state directory.
pub const CACHE_FILE: &str = "rendered.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: String,
    rendered: Rendered,
}

/// The entries of one state directory's cache, by proxy name.
#[derive(Debug)]
pub struct RenderCache {
    path: PathBuf,
    /// Whether this command may write the cache (`up`, serve); read-only commands only read it.
    write: bool,
    /// What the file held, read at the first lookup.
    stored: Mutex<Option<BTreeMap<String, Entry>>>,
    /// What this process rendered or found, by proxy: what [`RenderCache::save`] keeps.
    used: Mutex<BTreeMap<String, Entry>>,
}

impl RenderCache {
    pub fn open(state_dir: &Path, write: bool) -> RenderCache {
        RenderCache {
            path: state_dir.join(CACHE_FILE),
            write,
            stored: Mutex::new(None),
            used: Mutex::new(BTreeMap::new()),
        }
    }

    /// What `proxy` rendered to under `key`, if this cache holds it.
    pub fn get(&self, proxy: &str, key: &str) -> Option<Rendered> {
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let entries = stored.get_or_insert_with(|| read(&self.path));
        let entry = entries.get(proxy).filter(|e| e.key == key)?.clone();
        let rendered = entry.rendered.clone();
        self.used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(proxy.to_string(), entry);
        Some(rendered)
    }

    pub fn put(&self, proxy: &str, key: String, rendered: &Rendered) {
        self.used.lock().unwrap_or_else(|e| e.into_inner()).insert(
            proxy.to_string(),
            Entry {
                key,
                rendered: rendered.clone(),
            },
        );
    }

    /// Writes the entries this process used (so proxies no longer rendered drop out), when it
    /// may write, the state directory exists and they differ from the file's.
    pub fn save(&self) {
        if !self.write || !self.path.parent().is_some_and(Path::is_dir) {
            return;
        }
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut stored = self.stored.lock().unwrap_or_else(|e| e.into_inner());
        let before = stored.get_or_insert_with(|| read(&self.path));
        let same = before.len() == used.len()
            && before
                .iter()
                .zip(&used)
                .all(|((a, x), (b, y))| a == b && x.key == y.key);
        if same {
            return;
        }
        let Ok(text) = serde_json::to_vec(&used) else {
            return;
        };
        // Not synced: a torn file does not parse, and is written again.
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        *before = used;
    }
}

fn read(path: &Path) -> BTreeMap<String, Entry> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// What a renderer's output depends on besides the proxy: this berth's code (the running
/// binary, by version and file identity: a rebuilt or upgraded berth misses every entry) and
/// the templates' text.
pub fn fingerprint(sources: &[(&'static str, String, String)]) -> String {
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION"));
    h.update([0]);
    h.update(binary_identity());
    for (name, text, _) in sources {
        h.update(name);
        h.update([0]);
        h.update(text);
        h.update([0]);
    }
    hex::encode(h.finalize())
}

/// The running binary's device, inode, size and modification time; empty (so no entry
/// written by another binary can match) when they cannot be read.
fn binary_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    let meta = std::env::current_exe().and_then(std::fs::metadata);
    match meta {
        Ok(m) => format!(
            "{}:{}:{}:{}.{}",
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(_) => format!("unknown:{}", std::process::id()),
    }
}

/// The key of one proxy's render: the renderer's fingerprint, the proxy's IR and the
/// versions of its certificate copies.
pub fn key(fingerprint: &str, proxy: &ProxyInfra, versions: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    h.update(fingerprint);
    h.update([0]);
    // Serializing a derived Serialize of plain data does not fail; if it ever did, the key
    // would hash an empty IR, so it is folded in as a marker no real IR produces.
    h.update(serde_json::to_vec(proxy).unwrap_or_else(|_| b"\0unserializable".to_vec()));
    h.update([0]);
    h.update(serde_json::to_vec(versions).unwrap_or_default());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::render::Renderer;

    fn proxy(name: &str, port: u16) -> ProxyInfra {
        let toml = format!(
            "[[proxy]]\nname = \"{name}\"\nimage = \"envoyproxy/envoy:v1.33.0\"\n\
             [[proxy.listener]]\nname = \"web\"\nport = {port}\nprotocol = \"http\"\n\
             [[proxy.listener.route]]\npath_prefix = \"/\"\n\
             direct_response = {{ status = 200, body = \"hi\" }}\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.toml");
        std::fs::write(&path, toml).unwrap();
        crate::core::source::file::load(&path)
            .unwrap()
            .infra
            .proxies
            .remove(0)
    }

    #[test]
    fn a_cached_render_is_what_rendering_gives_and_any_input_change_misses() {
        let state = tempfile::tempdir().unwrap();
        let versions = BTreeMap::new();
        let a = proxy("a", 8080);
        let plain = Renderer::builtin()
            .render_with_certificates(&a, &versions)
            .unwrap();

        let first = Renderer::builtin().caching_in(state.path(), true);
        assert_eq!(
            first.render_with_certificates(&a, &versions).unwrap(),
            plain
        );
        assert!(first.compiled.get().is_some(), "a miss renders");
        first.save_cache();
        assert!(state.path().join(CACHE_FILE).is_file());

        let second = Renderer::builtin().caching_in(state.path(), false);
        assert_eq!(
            second.render_with_certificates(&a, &versions).unwrap(),
            plain
        );
        assert!(second.compiled.get().is_none(), "a hit compiles nothing");

        // A changed IR, other certificate versions or other templates: rendered again.
        let moved = proxy("a", 8081);
        let third = Renderer::builtin().caching_in(state.path(), false);
        let rendered = third.render_with_certificates(&moved, &versions).unwrap();
        assert_eq!(rendered, Renderer::builtin().render(&moved).unwrap());
        assert_ne!(rendered, plain);
        let renewed = BTreeMap::from([("web".to_string(), "v2".to_string())]);
        assert_ne!(
            key(&third.fingerprint, &a, &versions),
            key(&third.fingerprint, &a, &renewed)
        );
        let mut sources = Renderer::builtin().sources;
        sources[0].1.push_str("\n# edited\n");
        assert_ne!(fingerprint(&sources), Renderer::builtin().fingerprint);
    }

    #[test]
    fn read_only_commands_do_not_write_and_a_torn_file_is_ignored() {
        let state = tempfile::tempdir().unwrap();
        let a = proxy("a", 8080);
        let reader = Renderer::builtin().caching_in(state.path(), false);
        reader.render(&a).unwrap();
        reader.save_cache();
        assert!(!state.path().join(CACHE_FILE).exists());

        std::fs::write(state.path().join(CACHE_FILE), b"{\"a\": {\"key\": ").unwrap();
        let writer = Renderer::builtin().caching_in(state.path(), true);
        assert_eq!(
            writer.render(&a).unwrap(),
            Renderer::builtin().render(&a).unwrap()
        );
        writer.save_cache();
        let reread = Renderer::builtin().caching_in(state.path(), false);
        reread.render(&a).unwrap();
        assert!(
            reread.compiled.get().is_none(),
            "the rewritten file is used"
        );
    }

    #[test]
    fn proxies_no_longer_rendered_drop_out() {
        let state = tempfile::tempdir().unwrap();
        let both = Renderer::builtin().caching_in(state.path(), true);
        both.render(&proxy("a", 8080)).unwrap();
        both.render(&proxy("b", 8081)).unwrap();
        both.save_cache();
        let one = Renderer::builtin().caching_in(state.path(), true);
        one.render(&proxy("a", 8080)).unwrap();
        one.save_cache();
        assert_eq!(read(&state.path().join(CACHE_FILE)).len(), 1);
    }
}
