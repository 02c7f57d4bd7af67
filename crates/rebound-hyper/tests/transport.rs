//! The hyper transport over real sockets on 127.0.0.1: every stage times
//! out with its own stage, TLS round trips over HTTP/1.1 and HTTP/2, and the
//! `Sent` answer of connect failures and resets.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use rebound_core::{AttemptTimeoutLayer, DeadlineLayer, ErrorKind, Sent, TimeoutStage};
use rebound_hyper::{Body, HyperTransport, MinBodyRate, TlsRoots};
use support::*;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn sent(err: &rebound_core::Error) -> Option<Sent> {
    err.extensions().get::<Sent>().copied()
}

/// Run `f` bounded by [`TEST_LIMIT`].
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test exceeded its time limit")
}

/// A server that reads the request and answers with `head`, then runs
/// `then` on the socket.
async fn answering(head: &'static str) -> Server {
    raw_server(move |mut s| async move {
        read_request(&mut s).await;
        write(&mut s, head.as_bytes()).await;
        // Keep the connection open (and silent) until the client goes.
        let mut buf = [0u8; 1];
        let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
    })
    .await
}

#[tokio::test]
async fn plain_round_trip() {
    bounded(async {
        let server = raw_server(|mut s| async move {
            let head = read_request(&mut s).await;
            assert!(head.starts_with("GET /hello?x=1 HTTP/1.1"), "{head}");
            write(&mut s, b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello").await;
        })
        .await;
        let transport = HyperTransport::builder().build().unwrap();
        let res = transport
            .oneshot(
                Request::get(format!("http://{}/hello?x=1", server.addr))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"hello"));
    })
    .await
}

#[tokio::test]
async fn connect_timeout_has_its_own_stage() {
    bounded(async {
        // Loopback always accepts, so the TCP stage is made slow by a
        // connector that waits before dialling.
        let delaying = tower::service_fn(|uri: http::Uri| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.call(uri).await
        });
        let transport = HyperTransport::builder()
            .connect_timeout(ms(200))
            .build_with_tcp(delaying)
            .unwrap();
        let start = Instant::now();
        let err = transport
            .oneshot(
                Request::post("http://127.0.0.1:9/orders")
                    .body(Body::from("{}"))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Connect), "{err:?}");
        assert_eq!(sent(&err), Some(Sent::NotSent));
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(
            err.to_string(),
            "timeout (connect) for POST http://127.0.0.1:9/orders"
        );
    })
    .await
}

#[tokio::test]
async fn tls_timeout_has_its_own_stage() {
    bounded(async {
        // Accepts TCP, never speaks TLS.
        let server = raw_server(|s| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(s);
        })
        .await;
        let transport = HyperTransport::builder()
            .tls_timeout(ms(300))
            .build()
            .unwrap();
        let start = Instant::now();
        let err = transport
            .oneshot(
                Request::get(format!("https://127.0.0.1:{}/", server.addr.port()))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Tls), "{err:?}");
        assert_eq!(sent(&err), Some(Sent::NotSent));
        assert!(start.elapsed() < Duration::from_secs(10));
    })
    .await
}

#[tokio::test]
async fn headers_timeout_under_the_attempt_timeout_layer() {
    bounded(async {
        // Reads the request, never answers.
        let server = raw_server(|mut s| async move {
            read_request(&mut s).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
        let transport = HyperTransport::builder().build().unwrap();
        let svc = AttemptTimeoutLayer::try_new(ms(300))
            .unwrap()
            .layer(transport);
        let err = svc
            .oneshot(
                Request::get(format!("http://{}/slow", server.addr))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Headers), "{err:?}");
        assert_eq!(sent(&err), Some(Sent::MaybeProcessed));
    })
    .await
}

#[tokio::test]
async fn body_idle_timeout_on_a_stalled_body() {
    bounded(async {
        let server = answering("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nfirst ten!").await;
        let transport = HyperTransport::builder()
            .body_idle_timeout(ms(300))
            .build()
            .unwrap();
        let res = transport
            .oneshot(
                Request::get(format!("http://{}/", server.addr))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let err = res.into_body().collect().await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyIdle), "{err:?}");
        assert_eq!(sent(&err), Some(Sent::MaybeProcessed));
        assert_eq!(
            err.to_string(),
            format!("timeout (body_idle) for GET http://{}/", server.addr)
        );
    })
    .await
}

#[tokio::test]
async fn body_rate_timeout_on_a_trickling_body() {
    bounded(async {
        // 10 bytes every 50 ms (about 200 B/s) of a 100 kB body.
        let server = raw_server(|mut s| async move {
            read_request(&mut s).await;
            write(&mut s, b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n").await;
            for _ in 0..2000 {
                tokio::time::sleep(ms(50)).await;
                if tokio::io::AsyncWriteExt::write_all(&mut s, b"0123456789")
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
        .await;
        let rate = MinBodyRate::try_new(10_000, ms(500))
            .unwrap()
            .try_grace(ms(200))
            .unwrap();
        let transport = HyperTransport::builder()
            .body_idle_timeout(Duration::from_secs(20))
            .min_body_rate(rate)
            .build()
            .unwrap();
        let res = transport
            .oneshot(
                Request::get(format!("http://{}/", server.addr))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let start = Instant::now();
        let err = res.into_body().collect().await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyRate), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(10));
    })
    .await
}

#[tokio::test]
async fn a_fast_body_passes_the_rate_check() {
    bounded(async {
        let server = raw_server(|mut s| async move {
            read_request(&mut s).await;
            write(&mut s, b"HTTP/1.1 200 OK\r\ncontent-length: 200000\r\n\r\n").await;
            write(&mut s, &vec![b'x'; 200_000]).await;
        })
        .await;
        let transport = HyperTransport::builder()
            .min_body_rate(MinBodyRate::try_new(1000, ms(500)).unwrap())
            .build()
            .unwrap();
        let res = transport
            .oneshot(
                Request::get(format!("http://{}/", server.addr))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 200_000);
    })
    .await
}

#[tokio::test]
async fn deadline_cuts_a_body_still_being_read() {
    bounded(async {
        // One byte every 100 ms, forever: neither idle nor a rate check
        // would fire, the total deadline must.
        let server = raw_server(|mut s| async move {
            read_request(&mut s).await;
            write(
                &mut s,
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            )
            .await;
            for _ in 0..600 {
                tokio::time::sleep(ms(100)).await;
                if tokio::io::AsyncWriteExt::write_all(&mut s, b"1\r\nx\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
        .await;
        let transport = HyperTransport::builder().build().unwrap();
        let svc = DeadlineLayer::try_new(Duration::from_secs(1))
            .unwrap()
            .layer(transport);
        let start = Instant::now();
        let res = svc
            .oneshot(
                Request::get(format!("http://{}/stream", server.addr))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let err = res.into_body().collect().await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline), "{err:?}");
        let took = start.elapsed();
        assert!(
            took >= ms(900) && took < Duration::from_secs(10),
            "{took:?}"
        );
    })
    .await
}

#[tokio::test]
async fn tls_round_trip_over_http1_and_http2() {
    bounded(async {
        let pki = test_pki(&[b"h2", b"http/1.1"]);
        let server = tls_echo_version_server(pki.server.clone()).await;
        let url = format!("https://127.0.0.1:{}/v", server.addr.port());
        for (http2, expect) in [(true, Version::HTTP_2), (false, Version::HTTP_11)] {
            let transport = HyperTransport::builder()
                .tls_roots(TlsRoots::Custom(pki.roots.clone()))
                .http2(http2)
                .build()
                .unwrap();
            let res = transport
                .oneshot(Request::get(&url).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(res.version(), expect);
            let body = res.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, Bytes::from(format!("{expect:?}")));
        }
    })
    .await
}

#[tokio::test]
async fn untrusted_certificate_is_a_tls_error_not_sent() {
    bounded(async {
        let pki = test_pki(&[b"http/1.1"]);
        let server = tls_echo_version_server(pki.server.clone()).await;
        // The default webpki roots do not trust the test CA.
        let transport = HyperTransport::builder().build().unwrap();
        let err = transport
            .oneshot(
                Request::get(format!("https://127.0.0.1:{}/", server.addr.port()))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Tls), "{err:?}");
        assert_eq!(sent(&err), Some(Sent::NotSent));
        assert!(
            err.to_string()
                .starts_with("tls error: invalid server certificate"),
            "{err}"
        );
    })
    .await
}

#[tokio::test]
async fn refused_connection_is_connect_not_sent() {
    bounded(async {
        let port = closed_port();
        let transport = HyperTransport::builder().build().unwrap();
        let err = transport
            .oneshot(
                Request::post(format!("http://127.0.0.1:{port}/orders"))
                    .body(Body::from("{\"n\":1}"))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Connect), "{err:?}");
        assert_eq!(sent(&err), Some(Sent::NotSent));
        assert_eq!(
            err.to_string(),
            format!("connect error: connection refused for POST http://127.0.0.1:{port}/orders")
        );
    })
    .await
}

#[tokio::test]
async fn reset_after_reading_the_request_is_maybe_processed() {
    bounded(async {
        let server = raw_server(|mut s| async move {
            read_request(&mut s).await;
            // SO_LINGER 0 makes the close a reset; it does not block the
            // thread on drop when the linger time is zero.
            #[allow(deprecated)]
            let _ = s.set_linger(Some(Duration::ZERO));
            drop(s); // RST
        })
        .await;
        let transport = HyperTransport::builder().build().unwrap();
        let err = transport
            .oneshot(
                Request::post(format!("http://{}/orders", server.addr))
                    .body(Body::from("{\"n\":1}"))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transport, "{err:?}");
        assert_eq!(sent(&err), Some(Sent::MaybeProcessed));
    })
    .await
}

#[tokio::test]
async fn userinfo_never_reaches_the_wire_as_userinfo() {
    bounded(async {
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let tx = std::sync::Mutex::new(Some(tx));
        let server = raw_server(move |mut s| {
            let tx = tx.lock().unwrap().take();
            async move {
                let head = read_request(&mut s).await;
                if let Some(tx) = tx {
                    let _ = tx.send(head);
                }
                write(&mut s, b"HTTP/1.1 204 No Content\r\n\r\n").await;
            }
        })
        .await;
        let transport = HyperTransport::builder().build().unwrap();
        let url = format!("http://al%40ice:s3cret@{}/x", server.addr);
        let res = transport
            .oneshot(Request::get(url).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        let head = rx.await.unwrap();
        assert!(!head.contains("s3cret"), "{head}");
        // base64("al@ice:s3cret")
        assert!(
            head.contains("authorization: Basic YWxAaWNlOnMzY3JldA=="),
            "{head}"
        );
        assert!(head.contains(&format!("host: {}", server.addr)), "{head}");
    })
    .await
}

#[tokio::test]
async fn http2_refused_stream_is_not_sent() {
    bounded(async {
        let pki = test_pki(&[b"h2"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
        // An HTTP/2 server that refuses every stream (REFUSED_STREAM: the
        // request was not processed).
        let server = raw_server(move |socket| {
            let acceptor = acceptor.clone();
            async move {
                let Ok(tls) = acceptor.accept(socket).await else {
                    return;
                };
                let Ok(mut conn) = h2::server::handshake(tls).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            }
        })
        .await;
        let transport = HyperTransport::builder()
            .tls_roots(TlsRoots::Custom(pki.roots.clone()))
            .build()
            .unwrap();
        let err = transport
            .oneshot(
                Request::post(format!("https://127.0.0.1:{}/orders", server.addr.port()))
                    .body(Body::from("{}"))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(sent(&err), Some(Sent::NotSent), "{err:?}");
        assert!(err.to_string().contains("HTTP/2 stream refused"), "{err}");
    })
    .await
}
