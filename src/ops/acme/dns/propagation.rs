//! Is the TXT record visible yet? Asked of the resolvers the settings name, or else the zone's
//! authoritative servers (found through the system resolver), before the CA is asked to look.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};

/// How long one query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// The TXT strings at `fqdn` according to `server` (empty when it has none).
pub async fn txt(server: SocketAddr, fqdn: &str) -> Result<Vec<String>> {
    let answer = query(server, fqdn, RecordType::TXT).await?;
    Ok(answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(t) => Some(
                t.txt_data
                    .iter()
                    .map(|s| String::from_utf8_lossy(s))
                    .collect::<String>(),
            ),
            _ => None,
        })
        .collect())
}

/// The zone's authoritative servers for `fqdn` (port 53): the NS records of the closest
/// enclosing name that has them, each resolved, all through the system resolver.
pub async fn authoritative(fqdn: &str) -> Result<Vec<SocketAddr>> {
    let system = system_resolvers()?;
    let labels: Vec<&str> = fqdn.trim_end_matches('.').split('.').collect();
    for i in 0..labels.len().saturating_sub(1) {
        let name = labels[i..].join(".");
        let mut ns = Vec::new();
        for &r in &system {
            if let Ok(m) = query(r, &name, RecordType::NS).await {
                ns.extend(m.answers.iter().filter_map(|a| match &a.data {
                    RData::NS(n) => Some(n.0.to_ascii()),
                    _ => None,
                }));
                break;
            }
        }
        if ns.is_empty() {
            continue;
        }
        let mut out = Vec::new();
        for n in &ns {
            for &r in &system {
                if let Ok(m) = query(r, n, RecordType::A).await {
                    out.extend(m.answers.iter().filter_map(|a| match &a.data {
                        RData::A(ip) => Some(SocketAddr::new(IpAddr::V4(ip.0), 53)),
                        _ => None,
                    }));
                    break;
                }
            }
        }
        if out.is_empty() {
            bail!(
                "the name servers of {name} ({}) have no address",
                ns.join(", ")
            );
        }
        return Ok(out);
    }
    bail!("found no NS records for {fqdn} or a parent through the system resolver; name the servers to ask with resolvers = [\"address:port\"]")
}

/// The name servers of /etc/resolv.conf.
fn system_resolvers() -> Result<Vec<SocketAddr>> {
    let text = std::fs::read_to_string("/etc/resolv.conf").context("reading /etc/resolv.conf")?;
    let out: Vec<SocketAddr> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect();
    if out.is_empty() {
        bail!("/etc/resolv.conf names no nameserver");
    }
    Ok(out)
}

/// One query over UDP, again over TCP when the answer is truncated.
async fn query(server: SocketAddr, name: &str, kind: RecordType) -> Result<Message> {
    let name = Name::from_ascii(format!("{}.", name.trim_end_matches('.')))
        .map_err(|e| anyhow!("{name:?} is not a DNS name: {e}"))?;
    let mut m = Message::query();
    m.add_query(Query::query(name, kind));
    m.metadata.recursion_desired = true;
    let bytes = m.to_vec().map_err(|e| anyhow!("encoding a query: {e}"))?;
    let sock = tokio::net::UdpSocket::bind(if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .await?;
    sock.connect(server).await?;
    sock.send(&bytes).await?;
    let mut buf = vec![0u8; 4096];
    let answer = loop {
        let n = tokio::time::timeout(QUERY_TIMEOUT, sock.recv(&mut buf))
            .await
            .map_err(|_| anyhow!("{server} did not answer within {QUERY_TIMEOUT:?}"))??;
        let a = Message::from_vec(&buf[..n]).map_err(|e| anyhow!("{server}: {e}"))?;
        if a.metadata.id == m.metadata.id {
            break a;
        }
    };
    if answer.metadata.truncation {
        let bytes = tokio::time::timeout(QUERY_TIMEOUT, super::rfc2136::exchange(server, &bytes))
            .await
            .map_err(|_| anyhow!("{server} did not answer within {QUERY_TIMEOUT:?}"))??;
        return Message::from_vec(&bytes).map_err(|e| anyhow!("{server}: {e}"));
    }
    Ok(answer)
}
