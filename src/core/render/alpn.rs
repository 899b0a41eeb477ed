//! TLS-ALPN-01 challenge chains beside ordinary ones. Envoy picks a filter chain by server name
//! first and only then by ALPN, without going back: once a name has a challenge chain, a client
//! naming it without `acme-tls/1` would match no chain at all. So each name a TLS-ALPN-01
//! listener proves has an ordinary chain serving the certificate that name is served otherwise
//! (a virtual host's whose wildcard covers it, else the listener's), and ordinary clients see no
//! gap. That chain is there whether or not a challenge is up, so putting a challenge up or down
//! only adds or removes the `acme-tls/1` chains: the ordinary connections' chains never change,
//! and Envoy drains none of them.

use super::view::{ChainView, TlsView};

/// Adds the ordinary chain for each challenged name, and each of `proved` (the names of the
/// listener's TLS-ALPN-01 certificate), that no other chain names exactly; the challenge chains
/// go last.
pub fn ordinary_chains(chains: &mut Vec<ChainView>, default: Option<&TlsView>, proved: &[String]) {
    let mut names: Vec<String> = proved.iter().map(|n| n.to_ascii_lowercase()).collect();
    names.extend(
        chains
            .iter()
            .filter(|c| c.acme_tls_alpn)
            .flat_map(|c| c.server_names.clone()),
    );
    for name in names {
        let ordinary = |c: &&ChainView| !c.acme_tls_alpn;
        if chains
            .iter()
            .filter(ordinary)
            .any(|c| c.server_names.contains(&name))
        {
            continue;
        }
        let covering = chains.iter().filter(ordinary).find(|c| {
            c.server_names.iter().any(|n| {
                n.strip_prefix("*.").is_some_and(|base| {
                    name.strip_suffix(base).is_some_and(|head| {
                        head.ends_with('.') && !head[..head.len() - 1].contains('.')
                    })
                })
            })
        });
        let tls = covering.and_then(|c| c.tls.clone()).or(default.cloned());
        chains.push(ChainView {
            server_names: vec![name],
            tls,
            acme_tls_alpn: false,
        });
    }
    // Stable: the ordinary chains keep their order whether challenge chains are there or not.
    chains.sort_by_key(|c| c.acme_tls_alpn);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(secret: &str) -> TlsView {
        TlsView {
            secret: secret.into(),
            sds: String::new(),
            cert: String::new(),
            key: String::new(),
        }
    }

    fn chain(names: &[&str], secret: &str, alpn: bool) -> ChainView {
        ChainView {
            server_names: names.iter().map(|n| n.to_string()).collect(),
            tls: Some(tls(secret)),
            acme_tls_alpn: alpn,
        }
    }

    #[test]
    fn a_challenged_name_keeps_an_ordinary_chain_with_the_certificate_it_had() {
        let mut chains = vec![
            chain(&["*.example.com"], "web_wild", false),
            chain(&["api.example.com"], "web_api", false),
            chain(&["www.example.com"], "web__acme-tls-alpn-0", true),
            chain(&["api.example.com"], "web__acme-tls-alpn-1", true),
            chain(&["example.org"], "web__acme-tls-alpn-2", true),
        ];
        ordinary_chains(&mut chains, Some(&tls("web")), &[]);
        let added: Vec<(String, String)> = chains[2..4]
            .iter()
            .map(|c| {
                (
                    c.server_names[0].clone(),
                    c.tls.as_ref().unwrap().secret.clone(),
                )
            })
            .collect();
        assert_eq!(
            added,
            [
                ("www.example.com".to_string(), "web_wild".to_string()),
                ("example.org".to_string(), "web".to_string())
            ]
        );
        assert!(chains[..4].iter().all(|c| !c.acme_tls_alpn));
        assert!(chains[4..].iter().all(|c| c.acme_tls_alpn));
    }

    #[test]
    fn the_proved_names_have_their_ordinary_chains_with_or_without_a_challenge() {
        let mut idle = Vec::new();
        ordinary_chains(&mut idle, Some(&tls("web")), &["Edge.example.com".into()]);
        let mut up = vec![chain(&["edge.example.com"], "web__acme-tls-alpn-0", true)];
        ordinary_chains(&mut up, Some(&tls("web")), &["Edge.example.com".into()]);
        let show = |c: &ChainView| {
            (
                c.server_names.clone(),
                c.tls.as_ref().unwrap().secret.clone(),
                c.acme_tls_alpn,
            )
        };
        assert_eq!(
            idle.iter().map(show).collect::<Vec<_>>(),
            [(
                vec!["edge.example.com".to_string()],
                "web".to_string(),
                false
            )]
        );
        assert_eq!(up.len(), 2);
        assert_eq!(show(&up[0]), show(&idle[0]));
        assert!(up[1].acme_tls_alpn);
    }
}
