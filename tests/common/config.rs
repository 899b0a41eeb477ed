//! berth.toml for tests, built instead of typed out: a [`Proxy`] with its listeners, routes and
//! backends, each a TOML table underneath (so any field berth knows can be [`set`](Proxy::set)
//! by its dotted path, e.g. `"rollout.min_ready"`), serialized by the toml crate.
//!
//! ```ignore
//! let toml = Proxy::test(PROXY, NEW, 2)
//!     .listener(Listener::https("https", port, tls_files("cert.pem", "key.pem"))
//!         .route(Route::direct("/", 200, "hello over TLS\n")))
//!     .to_toml();
//! ```
#![allow(dead_code)]

use toml::{Table, Value};

/// An inline table value, e.g. `table([("cert_file", "c.pem".into()), ...])`.
pub fn table<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// `tls = { cert_file = …, key_file = … }`.
pub fn tls_files(cert: &str, key: &str) -> Value {
    table([("cert_file", cert.into()), ("key_file", key.into())])
}

/// Sets `path` (dot-separated, sub-tables made as needed) in `t`.
fn set_path(t: &mut Table, path: &str, value: Value) {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    match rest {
        None => {
            t.insert(head.to_string(), value);
        }
        Some(rest) => {
            let sub = t
                .entry(head.to_string())
                .or_insert_with(|| Value::Table(Table::new()));
            let Value::Table(sub) = sub else {
                panic!("{head} is not a table in {t:?}")
            };
            set_path(sub, rest, value);
        }
    }
}

fn push(t: &mut Table, key: &str, item: Table) {
    match t
        .entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()))
    {
        Value::Array(items) => items.push(Value::Table(item)),
        other => panic!("{key} is not an array: {other:?}"),
    }
}

macro_rules! tables {
    ($($name:ident),*) => {$(
        #[derive(Clone, Debug)]
        pub struct $name(pub Table);

        impl $name {
            /// Sets a field by its dotted path (`"tls.sni"`, `"rollout.min_ready"`).
            pub fn set(mut self, path: &str, value: impl Into<Value>) -> Self {
                set_path(&mut self.0, path, value.into());
                self
            }
        }
    )*};
}

tables!(Proxy, Listener, VirtualHost, Route, Backend);

impl Proxy {
    /// `[[proxy]]` with a name, an image and a replica count; nothing else.
    pub fn new(name: &str, image: &str, replicas: u32) -> Proxy {
        Proxy(Table::new())
            .set("name", name)
            .set("image", image)
            .set("replicas", i64::from(replicas))
    }

    /// [`Proxy::new`] as most integration tests run it: one Envoy worker, a 20 s startup
    /// deadline, `min_ready = "1s"`.
    pub fn test(name: &str, image: &str, replicas: u32) -> Proxy {
        Proxy::new(name, image, replicas)
            .set("concurrency", 1)
            .set("rollout.startup_deadline", "20s")
            .set("rollout.min_ready", "1s")
    }

    pub fn listener(mut self, l: Listener) -> Proxy {
        push(&mut self.0, "listener", l.0);
        self
    }

    pub fn backend(mut self, b: Backend) -> Proxy {
        push(&mut self.0, "backend", b.0);
        self
    }

    /// The config file with this proxy alone.
    pub fn to_toml(&self) -> String {
        config(&Table::new(), std::slice::from_ref(self))
    }
}

/// A config file: top-level settings (`tune_host`, `[swarm]`, …) and the proxies.
pub fn config(top: &Table, proxies: &[Proxy]) -> String {
    let mut doc = top.clone();
    for p in proxies {
        push(&mut doc, "proxy", p.0.clone());
    }
    toml::to_string(&doc).expect("a test config serializes")
}

impl Listener {
    /// A listener with no protocol set (berth's default, http).
    pub fn new(name: &str, port: u16) -> Listener {
        Listener(Table::new())
            .set("name", name)
            .set("port", i64::from(port))
    }

    pub fn http(name: &str, port: u16) -> Listener {
        Listener::new(name, port).set("protocol", "http")
    }

    pub fn https(name: &str, port: u16, tls: Value) -> Listener {
        Listener::new(name, port)
            .set("protocol", "https")
            .set("tls", tls)
    }

    pub fn route(mut self, r: Route) -> Listener {
        push(&mut self.0, "route", r.0);
        self
    }

    pub fn virtual_host(mut self, v: VirtualHost) -> Listener {
        push(&mut self.0, "virtual_host", v.0);
        self
    }
}

impl VirtualHost {
    pub fn new(name: &str, domains: &[&str]) -> VirtualHost {
        VirtualHost(Table::new()).set("name", name).set(
            "domains",
            Value::Array(domains.iter().map(|d| Value::from(*d)).collect()),
        )
    }

    pub fn route(mut self, r: Route) -> VirtualHost {
        push(&mut self.0, "route", r.0);
        self
    }
}

impl Route {
    /// `path_prefix = prefix`, `direct_response = { status, body }`.
    pub fn direct(prefix: &str, status: u16, body: &str) -> Route {
        Route(Table::new()).set("path_prefix", prefix).set(
            "direct_response",
            table([("status", i64::from(status).into()), ("body", body.into())]),
        )
    }

    /// `path_prefix = prefix`, `direct_response = { status }` (no body).
    pub fn status(prefix: &str, status: u16) -> Route {
        Route(Table::new()).set("path_prefix", prefix).set(
            "direct_response",
            table([("status", i64::from(status).into())]),
        )
    }

    /// `path_prefix = prefix`, `backend = backend`.
    pub fn backend(prefix: &str, backend: &str) -> Route {
        Route(Table::new())
            .set("path_prefix", prefix)
            .set("backend", backend)
    }
}

impl Backend {
    pub fn new(name: &str, endpoints: &[String]) -> Backend {
        Backend(Table::new()).set("name", name).set(
            "endpoints",
            Value::Array(endpoints.iter().map(|e| Value::from(e.as_str())).collect()),
        )
    }

    /// One endpoint on 127.0.0.1.
    pub fn local(name: &str, port: u16) -> Backend {
        Backend::new(name, &[format!("127.0.0.1:{port}")])
    }
}

/// Whether two config texts mean the same TOML (for moving a typed-out fixture to the builder).
pub fn same_toml(a: &str, b: &str) -> bool {
    a.parse::<Table>().expect("TOML") == b.parse::<Table>().expect("TOML")
}
