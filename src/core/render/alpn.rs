//! TLS-ALPN-01 challenge chains beside ordinary ones. Envoy picks a filter chain by server name
//! first and only then by ALPN, without going back: once a name has a challenge chain, a client
//! naming it without `acme-tls/1` would match no chain at all. So each challenged name also gets
//! an ordinary chain serving the certificate that name is served otherwise (a virtual host's
//! whose wildcard covers it, else the listener's), and ordinary clients see no gap.

use super::view::{ChainView, TlsView};

/// Adds the ordinary chain for each challenged name that no other chain names exactly.
pub fn ordinary_chains(chains: &mut Vec<ChainView>, default: Option<&TlsView>) {
    let challenged: Vec<String> = chains
        .iter()
        .filter(|c| c.acme_tls_alpn)
        .flat_map(|c| c.server_names.clone())
        .collect();
    for name in challenged {
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
        ordinary_chains(&mut chains, Some(&tls("web")));
        let added: Vec<(String, String)> = chains[5..]
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
        assert!(chains[5..].iter().all(|c| !c.acme_tls_alpn));
    }
}
