//! The ready-made client (deadline + attempt timeout + transport so far)
//! and the timeout layers over the transport, on real sockets on
//! 127.0.0.1; and the client's build-time validation.

mod support;

use rebound_core::ErrorKind;
use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use rebound_core::{AttemptTimeoutLayer, DeadlineLayer, TimeoutStage};
use rebound_hyper::{Body, Client, HyperTransport, TlsRoots};
use support::*;
use tokio::time::Instant;
use tower::ServiceExt;

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test exceeded its time limit")
}

#[test]
fn attempt_timeout_longer_than_total_is_refused_at_build() {
    let err = Client::builder()
        .attempt_timeout(Duration::from_secs(20))
        .total_timeout(Duration::from_secs(10))
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config));
    assert!(
        err.to_string()
            .contains("attempt timeout (20s) is longer than the total timeout (10s)"),
        "{err}"
    );
}

#[test]
fn zero_or_absurd_timeouts_are_refused_at_build() {
    for builder in [
        Client::builder().connect_timeout(Duration::ZERO),
        Client::builder().tls_timeout(Duration::ZERO),
        Client::builder().total_timeout(Duration::ZERO),
        Client::builder().body_idle_timeout(Duration::ZERO),
        Client::builder().total_timeout(Duration::from_secs(10 * 24 * 3600)),
        Client::builder().tls_roots(TlsRoots::Custom(rustls::RootCertStore::empty())),
    ] {
        let err = builder.build().unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config), "{err}");
    }
    // Building needs a runtime for nothing: the defaults build anywhere.
    assert!(Client::builder().build().is_ok());
}

#[tokio::test]
async fn deadline_beats_a_longer_attempt_timeout() {
    bounded(async {
        // Reads the request, never answers.
        let server = raw_server(|mut s| async move {
            read_request(&mut s).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
        // Total 1 s over an attempt timeout of 10 s, assembled by hand (the
        // client builder refuses this combination).
        let svc = tower::ServiceBuilder::new()
            .layer(DeadlineLayer::try_new(Duration::from_secs(1)).unwrap())
            .layer(AttemptTimeoutLayer::try_new(Duration::from_secs(10)).unwrap())
            .service(HyperTransport::builder().build().unwrap());
        let start = Instant::now();
        let req = Request::get(format!("http://{}/never", server.addr))
            .body(Body::empty())
            .unwrap();
        let err = svc.oneshot(req).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(
                err.timeout_stage(),
                Some(TimeoutStage::Deadline | TimeoutStage::Headers)
            ),
            "{err:?}"
        );
        assert!(took >= Duration::from_millis(900), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    })
    .await
}

#[tokio::test]
async fn get_and_send_round_trip_on_clones() {
    bounded(async {
        let server = raw_server(|mut s| async move {
            // Keep-alive: answer requests on this connection until it closes.
            for _ in 0..10 {
                let head = read_request(&mut s).await;
                if head.is_empty() {
                    return;
                }
                write(&mut s, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            }
        })
        .await;
        let client = Client::builder().build().unwrap();
        let res = client
            .get(format!("http://{}/a", server.addr))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            &res.into_body().collect().await.unwrap().to_bytes()[..],
            b"ok"
        );

        let other = client.clone();
        let req = Request::post(format!("http://{}/b", server.addr))
            .body("payload")
            .unwrap();
        let res = other.send(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            &res.into_body().collect().await.unwrap().to_bytes()[..],
            b"ok"
        );
    })
    .await
}

#[tokio::test]
async fn an_invalid_url_is_an_invalid_request() {
    let client = Client::builder().build().unwrap();
    let err = client.get("not a url").await.unwrap_err();
    assert_eq!(err.kind(), rebound_core::ErrorKind::InvalidRequest);
    let err = client.get("/relative").await.unwrap_err();
    assert_eq!(err.kind(), rebound_core::ErrorKind::InvalidRequest);
}
