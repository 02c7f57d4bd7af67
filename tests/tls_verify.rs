//! Issue 10, item 4: a TLS certificate that fails verification is not
//! transient. One attempt, a TLS error whose `Display` names the reason,
//! and the server sees exactly one handshake — while a handshake that
//! fails for another reason is still retried.

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use rebound::annotations::CertificateRejected;
use rebound::{Backoff, Client, ClientBuilder, ErrorKind, RetryStop, TlsRoots};
use rebound_test::fault::FaultServer;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test exceeded its time limit")
}

/// Three attempts (the default) with a short backoff, so a retry would
/// show as more handshakes.
fn client() -> ClientBuilder {
    Client::builder()
        .max_attempts(3)
        .backoff(Backoff::exponential(ms(5), ms(20)))
}

#[tokio::test]
async fn an_unknown_ca_is_one_attempt_and_says_so() {
    bounded(async {
        let server = FaultServer::builder().tls().start().await;
        // Webpki roots do not know the server's generated CA.
        let client = client().build().unwrap();
        let err = client.get(server.url("/x?token=s3cret")).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Tls), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::Tls);
        assert_eq!(err.attempts(), 1, "{err}");
        assert_eq!(err.retry_stop(), Some(RetryStop::Fatal));
        assert_eq!(
            err.extensions().get::<CertificateRejected>(),
            Some(&CertificateRejected("unknown issuer"))
        );
        let shown = err.to_string();
        assert!(
            shown.contains("invalid server certificate: unknown issuer"),
            "{shown}"
        );
        assert!(!format!("{shown} {err:?}").contains("s3cret"), "{err:?}");
        assert_eq!(server.connections(), 1, "exactly one handshake");
        assert_eq!(server.request_count(), 0);
    })
    .await
}

#[tokio::test]
async fn a_name_not_in_the_certificate_is_one_attempt_and_says_so() {
    bounded(async {
        let server = FaultServer::builder().tls().start().await;
        // Every name resolves to the server, whose certificate is for
        // `localhost` and `127.0.0.1` only.
        let addr: SocketAddr = server.addr();
        let resolve = tower::service_fn(move |_name: Name| async move {
            Ok::<_, std::io::Error>(std::iter::once(addr))
        });
        let mut tcp = HttpConnector::new_with_resolver(resolve);
        tcp.enforce_http(false);
        let client = client()
            .tls_roots(TlsRoots::Custom(server.root_store().unwrap()))
            .build_with_tcp(tcp)
            .unwrap();
        let url = format!("https://not-in-the-cert.test:{}/", addr.port());
        let err = client.get(url).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Tls), "{err:?}");
        assert_eq!(err.attempts(), 1, "{err}");
        assert_eq!(
            err.extensions().get::<CertificateRejected>(),
            Some(&CertificateRejected("not valid for the host name"))
        );
        assert!(
            err.to_string()
                .contains("invalid server certificate: not valid for the host name"),
            "{err}"
        );
        assert_eq!(server.connections(), 1, "exactly one handshake");

        // The control: the same client, by a name the certificate has.
        let res = client
            .get(format!("https://localhost:{}/", addr.port()))
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    })
    .await
}

#[tokio::test]
async fn other_handshake_failures_are_still_retried() {
    bounded(async {
        // A plain-HTTP server answering a TLS ClientHello: the handshake
        // fails on a corrupt message, not on a certificate.
        let server = FaultServer::builder().start().await;
        let client = client().build().unwrap();
        let url = format!("https://127.0.0.1:{}/", server.addr().port());
        let err = client.get(url).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Tls), "{err:?}");
        assert!(err.extensions().get::<CertificateRejected>().is_none());
        assert_eq!(err.attempts(), 3, "{err}");
        assert_eq!(server.connections(), 3);
    })
    .await
}
