//! HTTP-01 answers as live routes: the proxy itself serves
//! `/.well-known/acme-challenge/<token>` with the key authorization on its plain-HTTP
//! listener, ahead of the user's routes, in every virtual host (the CA asks with the domain as
//! Host). Delivered through the watched route file like any route change, and removed after.

use crate::core::ir::{self, ProxyInfra};

pub const PATH_PREFIX: &str = "/.well-known/acme-challenge/";

/// One HTTP-01 answer.
#[derive(Clone, PartialEq, Eq)]
pub struct Answer {
    pub token: String,
    pub key_authorization: String,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// `proxy` with the answers as the first routes of every virtual host of `listener`.
pub fn with_answers(proxy: &ProxyInfra, listener: &str, answers: &[Answer]) -> ProxyInfra {
    let mut out = proxy.clone();
    let ir::Routing::Standalone(s) = &mut out.routing else {
        return out;
    };
    for l in s.listeners.iter_mut().filter(|l| l.listener == listener) {
        let ir::Traffic::Http { virtual_hosts } = &mut l.traffic else {
            continue;
        };
        for vh in virtual_hosts {
            let routes = answers.iter().map(|a| ir::Route {
                matcher: ir::RouteMatch {
                    path: ir::PathMatch::Exact(format!("{PATH_PREFIX}{}", a.token)),
                    headers: Vec::new(),
                },
                action: ir::RouteAction::DirectResponse {
                    status: 200,
                    body: a.key_authorization.clone(),
                },
                timeout: None,
                retries: None,
            });
            vh.routes.splice(0..0, routes);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_come_first_in_every_virtual_host_of_the_challenge_listener_only() {
        let toml = r#"
[[proxy]]
name = "edge"
[[proxy.listener]]
name = "web"
port = 8080
[[proxy.listener.virtual_host]]
name = "a"
domains = ["a.example.com"]
[[proxy.listener.virtual_host.route]]
path_prefix = "/"
direct_response = { status = 200, body = "a" }
[[proxy.listener.virtual_host]]
name = "b"
domains = ["*"]
[[proxy.listener.virtual_host.route]]
path_prefix = "/"
direct_response = { status = 200, body = "b" }
[[proxy.listener]]
name = "other"
port = 8081
[[proxy.listener.route]]
path_prefix = "/"
direct_response = { status = 200, body = "o" }
"#;
        let config = crate::core::source::file::parse(std::path::Path::new("/x/berth.toml"), toml)
            .expect("valid");
        let proxy = &config.infra.proxies[0];
        let answer = Answer {
            token: "tok".into(),
            key_authorization: "tok.thumb".into(),
        };
        let out = with_answers(proxy, "web", std::slice::from_ref(&answer));
        let ir::Routing::Standalone(s) = &out.routing else {
            panic!()
        };
        for l in &s.listeners {
            let ir::Traffic::Http { virtual_hosts } = &l.traffic else {
                panic!()
            };
            for vh in virtual_hosts {
                let first = &vh.routes[0];
                let is_answer = first.matcher.path
                    == ir::PathMatch::Exact("/.well-known/acme-challenge/tok".into());
                assert_eq!(is_answer, l.listener == "web", "{}", vh.name);
                assert_eq!(vh.routes.len(), if is_answer { 2 } else { 1 });
            }
        }
        assert!(!format!("{answer:?}").contains("thumb"));
    }
}
