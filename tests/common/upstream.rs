//! Backends the tests start on 127.0.0.1 for berth to reach: a gRPC echo service (HTTP/2
//! cleartext, tonic) and an HTTPS server (rustls) with a certificate from a test CA, optionally
//! requiring a client certificate.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod echo {
    include!(concat!(env!("OUT_DIR"), "/berthtest.echo.rs"));
}

use echo::echo_server::{Echo, EchoServer};
use echo::{CountRequest, Text};

struct EchoService;

type TextStream = Pin<Box<dyn futures_util::Stream<Item = Result<Text, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn say(&self, req: tonic::Request<Text>) -> Result<tonic::Response<Text>, tonic::Status> {
        let via_envoy = req.metadata().contains_key("x-request-id");
        let text = format!("{} (via envoy: {via_envoy})", req.into_inner().text);
        Ok(tonic::Response::new(Text { text }))
    }

    type CountStream = TextStream;

    async fn count(
        &self,
        req: tonic::Request<CountRequest>,
    ) -> Result<tonic::Response<TextStream>, tonic::Status> {
        let CountRequest { count, interval_ms } = req.into_inner();
        let stream = futures_util::stream::unfold(0u32, move |i| async move {
            if i >= count {
                return None;
            }
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(u64::from(interval_ms))).await;
            }
            Some((
                Ok(Text {
                    text: i.to_string(),
                }),
                i + 1,
            ))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// Starts the echo service on 127.0.0.1 (HTTP/2 only, as gRPC servers are); returns its port.
pub async fn grpc_echo() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let incoming = tokio_stream_of(listener);
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(EchoServer::new(EchoService))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (port, task)
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |l| async move {
        let accepted = l.accept().await.map(|(s, _)| s);
        Some((accepted, l))
    })
}

/// A gRPC client of the echo service through 127.0.0.1:port (HTTP/2 prior knowledge).
pub async fn echo_client(port: u16) -> echo::echo_client::EchoClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
    echo::echo_client::EchoClient::new(channel)
}

/// A test PKI in a directory: CAs and certificates they sign, as PEM files.
pub struct Pki {
    pub dir: PathBuf,
}

pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    /// A CA named `cn`, written to `<cn>.pem`.
    pub fn ca(&self, cn: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, cn.to_string());
        let issuer = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(self.dir.join(format!("{cn}.pem")), issuer.pem()).unwrap();
        Ca { issuer }
    }

    /// A leaf for `names` with `serial`, signed by `ca`, written to `<file>.pem` and
    /// `<file>-key.pem`; returns the two paths.
    pub fn leaf(&self, ca: &Ca, file: &str, names: &[&str], serial: u64) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.serial_number = Some(rcgen::SerialNumber::from(serial));
        p.distinguished_name
            .push(rcgen::DnType::CommonName, names[0].to_string());
        let cert = p.signed_by(&key, &ca.issuer).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}-key.pem")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

/// An HTTPS/1.1 server on 127.0.0.1 presenting `cert`/`key`; with `client_ca`, it requires a
/// client certificate signed by that CA. One request per connection (so each request is a new
/// handshake, verified with the trust Envoy has then), answered 200 with
/// `"<name> client=<serial or none>\n"`.
pub async fn https_backend(
    name: &'static str,
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> (u16, tokio::task::JoinHandle<()>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let config = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    }
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let client = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|leaf| {
                        let (_, x) = x509_parser::parse_x509_certificate(leaf).unwrap();
                        berth::core::certificates::normalize_serial(&hex::encode(x.raw_serial()))
                    })
                    .unwrap_or_else(|| "none".into());
                let body = format!("{name} client={client}\n");
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, task)
}
