//! The ready-made client over real sockets: the whole stack end to end.

use std::time::Duration;

use http_body_util::BodyExt;
use rebound::{Attempts, Client};
use rebound_test::fault::{Action, FaultServer};

#[tokio::test]
async fn retries_503_503_then_200_over_real_sockets() {
    let server = FaultServer::builder()
        .route(
            "/flaky",
            [
                Action::status(503).body("busy"),
                Action::status(503).body("busy"),
                Action::status(200).body("ok"),
            ],
        )
        .start()
        .await;
    let client = Client::builder()
        .backoff(rebound::Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .build()
        .unwrap();
    let res = client.get(server.url("/flaky")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 3);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    assert_eq!(server.requests_to("/flaky").len(), 3);
}

#[test]
fn a_short_total_timeout_alone_builds() {
    // The default backoff's 10 s cap shrinks to fit a shorter total.
    Client::builder()
        .total_timeout(Duration::from_secs(2))
        .attempt_timeout(Duration::from_secs(1))
        .build()
        .expect("a short total with the default backoff is valid");
    // A caller's own backoff that cannot fit is refused, saying why.
    let err = Client::builder()
        .total_timeout(Duration::from_secs(2))
        .attempt_timeout(Duration::from_secs(1))
        .backoff(rebound::Backoff::exponential(
            Duration::from_millis(100),
            Duration::from_secs(10),
        ))
        .build()
        .unwrap_err();
    assert!(err.is_config());
    assert!(err.to_string().contains("backoff cap"), "{err}");
}
