//! RFC 2136 dynamic updates signed with TSIG (RFC 8945), sent over TCP to the zone's primary
//! server. The answer must be NOERROR and carry a valid TSIG signature of the same key.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use hickory_proto::op::{Message, OpCode, Query, ResponseCode, UpdateMessage};
use hickory_proto::rr::rdata::tsig::{TsigAlgorithm, TsigError};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType, TSigner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::TxtRecord;

/// How long one update exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The clock difference the server accepts (RFC 8945 recommends 300 s).
const FUDGE: u16 = 300;

/// The update's parameters (from `ir::DnsProvider::Rfc2136`; the secret read from its file).
pub struct Server<'a> {
    pub addr: SocketAddr,
    pub zone: &'a str,
    pub key_name: &'a str,
    pub algorithm: &'a str,
    pub secret: Vec<u8>,
}

/// Adds (`add`) or deletes the TXT records in one signed update.
pub async fn update(server: &Server<'_>, records: &[TxtRecord], ttl: u32, add: bool) -> Result<()> {
    let zone = Name::from_ascii(format!("{}.", server.zone.trim_end_matches('.')))
        .with_context(|| format!("zone {:?} is not a DNS name", server.zone))?;
    let mut message = Message::query();
    message.metadata.op_code = OpCode::Update;
    message.metadata.recursion_desired = false;
    let mut q = Query::new();
    q.set_name(zone.clone())
        .set_query_class(DNSClass::IN)
        .set_query_type(RecordType::SOA);
    message.add_zone(q);
    for r in records {
        let name = Name::from_ascii(format!("{}.", r.fqdn))
            .with_context(|| format!("{:?} is not a DNS name", r.fqdn))?;
        if !zone.zone_of(&name) {
            bail!("{} is not in zone {}", r.fqdn, server.zone);
        }
        let mut record = Record::from_rdata(name, ttl, RData::TXT(TXT::new(vec![r.value.clone()])));
        if !add {
            // RFC 2136 2.5.4: delete this RR from its RRset.
            record.dns_class = DNSClass::NONE;
            record.ttl = 0;
        }
        message.add_update(record);
    }
    let signer = TSigner::new(
        server.secret.clone(),
        algorithm(server.algorithm)?,
        Name::from_ascii(format!("{}.", server.key_name.trim_end_matches('.')))
            .with_context(|| format!("key_name {:?} is not a DNS name", server.key_name))?,
        FUDGE,
    )
    .map_err(|e| anyhow!("TSIG key: {e}"))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut verifier = message
        .finalize(&signer, now)
        .map_err(|e| anyhow!("signing the update: {e}"))?
        .ok_or_else(|| anyhow!("signing the update gave no verifier"))?;
    let bytes = message
        .to_vec()
        .map_err(|e| anyhow!("encoding the update: {e}"))?;
    let answer = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(server.addr, &bytes))
        .await
        .map_err(|_| anyhow!("no answer from {} within {EXCHANGE_TIMEOUT:?}", server.addr))?
        .with_context(|| format!("sending the update to {}", server.addr))?;
    let parsed = Message::from_vec(&answer)
        .map_err(|e| anyhow!("the answer of {} is not a DNS message: {e}", server.addr))?;
    if parsed.metadata.id != message.metadata.id {
        bail!("the answer of {} is for another message", server.addr);
    }
    let rcode = parsed.metadata.response_code;
    if rcode != ResponseCode::NoError {
        let tsig = parsed
            .signature()
            .and_then(|s| s.data.error)
            .map(|e| match e {
                TsigError::BadKey => format!(
                    "; TSIG error BADKEY: the server does not know key {:?} with {}",
                    server.key_name, server.algorithm
                ),
                TsigError::BadSig => {
                    "; TSIG error BADSIG: the secret does not match the server's".to_string()
                }
                TsigError::BadTime => {
                    "; TSIG error BADTIME: this host's clock differs from the server's".to_string()
                }
                other => format!("; TSIG error {other:?}"),
            })
            .unwrap_or_default();
        let hint = match rcode {
            ResponseCode::Refused => " (the server does not allow this key to update this name)",
            ResponseCode::NotAuth => {
                " (the server is not authoritative for the zone, or refused the key)"
            }
            ResponseCode::NotZone => " (the name is not in the zone)",
            _ => "",
        };
        bail!(
            "{} refused the update of zone {}: {rcode}{hint}{tsig}",
            server.addr,
            server.zone
        );
    }
    verifier.verify(&answer).map_err(|e| {
        anyhow!(
            "the answer of {} is not signed by key {:?}: {e}",
            server.addr,
            server.key_name
        )
    })?;
    Ok(())
}

fn algorithm(name: &str) -> Result<TsigAlgorithm> {
    Ok(match name {
        "hmac-sha256" => TsigAlgorithm::HmacSha256,
        "hmac-sha384" => TsigAlgorithm::HmacSha384,
        "hmac-sha512" => TsigAlgorithm::HmacSha512,
        other => {
            bail!("TSIG algorithm {other:?} is not one of hmac-sha256, hmac-sha384, hmac-sha512")
        }
    })
}

/// One DNS message over TCP (RFC 1035 4.2.2: two length octets first).
pub(super) async fn exchange(addr: SocketAddr, request: &[u8]) -> Result<Vec<u8>> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut framed = (request.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(request);
    s.write_all(&framed).await?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await?;
    let mut answer = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut answer).await?;
    Ok(answer)
}
