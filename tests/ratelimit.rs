//! The rate-limit layer over a bare hyper-util client and real sockets
//! (`FaultServer` on 127.0.0.1) answering fixed rate-limit headers, one
//! test per reset form: OpenAI's Go duration, `X-RateLimit-Reset` delta
//! seconds, and an IETF daily quota that fails the next request at once.
//!
//! Counts are exact (the server's recorder). Time is real: waits are of
//! one second, checked only from below (never "faster than"), and every
//! call is bounded far above what it needs.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use rebound::ratelimit::{PacerConfig, QuotaReset, QuotaSignal, RateLimitLayer};
use rebound::{ErrorKind, Sent};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::{timeout, Instant};
use tower::{Service, ServiceBuilder, ServiceExt};

const BOUND: Duration = Duration::from_secs(20);

fn paced() -> impl Service<
    Request<Empty<Bytes>>,
    Response = http::Response<hyper::body::Incoming>,
    Error = rebound::Error,
> + Clone {
    let bare: HyperClient<HttpConnector, Empty<Bytes>> =
        HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new());
    ServiceBuilder::new()
        .layer(RateLimitLayer::with_config(
            PacerConfig::new().release_jitter(Duration::from_millis(10)),
        ))
        .service(bare)
}

fn get(server: &FaultServer) -> Request<Empty<Bytes>> {
    Request::get(server.url("/v1/chat"))
        .body(Empty::new())
        .unwrap()
}

/// The first answer says the quota is out for a second; the second request
/// waits for the reset instead of drawing a 429.
async fn waits_for_the_reset(first: Action) {
    let server = FaultServer::builder()
        .route("/v1/chat", [first])
        .default(Action::status(200))
        .start()
        .await;
    let svc = paced();
    let res = timeout(BOUND, svc.clone().oneshot(get(&server)))
        .await
        .unwrap()
        .unwrap();
    assert!(res.extensions().get::<QuotaSignal>().is_some());
    let start = Instant::now();
    let res = timeout(BOUND, svc.oneshot(get(&server)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn openai_reset_is_waited_for() {
    waits_for_the_reset(
        Action::status(200)
            .header("x-ratelimit-limit-requests", "60")
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-reset-requests", "1s"),
    )
    .await;
}

#[tokio::test]
async fn x_ratelimit_reset_is_waited_for() {
    waits_for_the_reset(
        Action::status(200)
            .header("x-ratelimit-limit", "60")
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-reset", "1"),
    )
    .await;
}

#[tokio::test]
async fn a_daily_quota_fails_the_next_request_not_sent() {
    let server = FaultServer::builder()
        .default(
            Action::status(200)
                .header("ratelimit-policy", "\"daily\";q=1000;w=86400")
                .header("ratelimit", "\"daily\";r=0;t=86400"),
        )
        .start()
        .await;
    let svc = paced();
    timeout(BOUND, svc.clone().oneshot(get(&server)))
        .await
        .unwrap()
        .unwrap();
    let err = timeout(BOUND, svc.oneshot(get(&server)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuotaExhausted, "{err}");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    let reset = err.extensions().get::<QuotaReset>().unwrap();
    assert!(reset.at > Instant::now() + Duration::from_secs(86_000));
    assert_eq!(server.requests().len(), 1, "not sent");
}
