//! Small loopback servers for the transport tests (until the shared
//! `FaultServer` lands): raw TCP scripts and a TLS server with a generated
//! certificate.

#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Every test is bounded by this.
pub const TEST_LIMIT: Duration = Duration::from_secs(30);

/// A background server task, aborted when dropped.
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A raw TCP server running `script` on every accepted connection.
pub async fn raw_server<F, Fut>(script: F) -> Server
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let script = Arc::new(script);
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((socket, _)) = listener.accept().await {
            conns.spawn((script)(socket));
        }
    });
    Server { addr, task }
}

/// Read one request head (and up to `Content-Length` body bytes); returns
/// the head as text. Bounded in size.
pub async fn read_request(socket: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while buf.len() < 64 * 1024 {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = socket.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return head;
        }
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).to_string()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Write `bytes`, ignoring errors (the client may have gone).
pub async fn write(socket: &mut TcpStream, bytes: &[u8]) {
    let _ = socket.write_all(bytes).await;
    let _ = socket.flush().await;
}

/// A port on 127.0.0.1 with no listener.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A test CA and a certificate for `127.0.0.1` / `localhost` it signed.
pub struct TestPki {
    pub roots: rustls::RootCertStore,
    pub server: Arc<rustls::ServerConfig>,
}

pub fn test_pki(alpn: &[&[u8]]) -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "rebound test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.der().to_vec())).unwrap();

    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![CertificateDer::from(leaf.der().to_vec())], key)
    .unwrap();
    server.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TestPki {
        roots,
        server: Arc::new(server),
    }
}

/// An HTTPS server (HTTP/1.1 and HTTP/2, by ALPN) answering every request
/// with its HTTP version as the body.
pub async fn tls_echo_version_server(config: Arc<rustls::ServerConfig>) -> Server {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    raw_server(move |socket| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(tls) = acceptor.accept(socket).await else {
                return;
            };
            let svc = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                        "{:?}",
                        req.version()
                    )))))
                },
            );
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        }
    })
    .await
}
