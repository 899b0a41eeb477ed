#![allow(dead_code)]
//! HTTPS through the host port: a client that accepts any server certificate and reports the
//! serial it was served, and certificate/key pairs made with rcgen.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS client that accepts any certificate (the tests check serials, not trust).
pub fn connector() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

pub fn localhost() -> ServerName<'static> {
    server_name("localhost")
}

pub fn server_name(name: &str) -> ServerName<'static> {
    ServerName::try_from(name.to_string()).unwrap()
}

/// The serial (lowercase hex, no leading zeros) of the certificate one new connection to
/// 127.0.0.1:port is served.
pub async fn served_serial(port: u16) -> Result<String, String> {
    served_serial_for(port, "localhost").await
}

/// [`served_serial`] with `name` as SNI.
pub async fn served_serial_for(port: u16, name: &str) -> Result<String, String> {
    served_serial_at(([127, 0, 0, 1], port).into(), name).await
}

/// [`served_serial_for`] at `addr` (an address of a namespace the test made).
pub async fn served_serial_at(addr: std::net::SocketAddr, name: &str) -> Result<String, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let tls = tokio::time::timeout(
        Duration::from_secs(5),
        connector().connect(server_name(name), stream),
    )
    .await
    .map_err(|_| "handshake timed out".to_string())?
    .map_err(|e| format!("handshake: {e}"))?;
    let (_, conn) = tls.get_ref();
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no certificate")?;
    let (_, x509) = x509_parser::parse_x509_certificate(leaf).map_err(|e| e.to_string())?;
    Ok(berth::core::certificates::normalize_serial(&hex::encode(
        x509.raw_serial(),
    )))
}

/// The serial and issuer of the certificate one new connection to 127.0.0.1:port, with SNI
/// `name`, is served.
pub async fn served_by_name(port: u16, name: &str) -> Result<(String, String), String> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let sni = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
    let tls = tokio::time::timeout(Duration::from_secs(5), connector().connect(sni, stream))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    let (_, conn) = tls.get_ref();
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no certificate")?;
    let (_, x509) = x509_parser::parse_x509_certificate(leaf).map_err(|e| e.to_string())?;
    Ok((
        berth::core::certificates::normalize_serial(&hex::encode(x509.raw_serial())),
        x509.issuer().to_string(),
    ))
}

/// The serials `n` new connections are served (replicas are picked by the kernel).
pub async fn served_serials(port: u16, n: usize) -> Vec<String> {
    served_serials_for(port, "localhost", n).await
}

/// [`served_serials`] with `name` as SNI.
pub async fn served_serials_for(port: u16, name: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(served_serial_for(port, name).await.unwrap_or_else(|e| e));
    }
    out.sort();
    out.dedup();
    out
}

/// A self-signed certificate for localhost with `serial`, valid between the two years, and its
/// key (PEM).
pub fn pair(serial: u64, from_year: i32, to_year: i32) -> (String, String) {
    pair_for("localhost", serial, from_year, to_year)
}

/// [`pair`] for another DNS name.
pub fn pair_for(name: &str, serial: u64, from_year: i32, to_year: i32) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![name.into()]).unwrap();
    params.not_before = rcgen::date_time_ymd(from_year, 1, 1);
    params.not_after = rcgen::date_time_ymd(to_year, 1, 1);
    params.serial_number = Some(rcgen::SerialNumber::from(serial));
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Replaces a file the way certbot and editors do: a temporary file renamed over it.
pub fn replace(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp-new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
