//! A request's own attempt count ([`MaxAttempts`]) against the retry
//! layer's policy, over the scripted `MockService`, on paused time. The
//! one-service stack's loop reads it through the same engine; the client's
//! tests (`tests/request_builder.rs`) check it over real sockets.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use rebound_core::{
    Attempts, Backoff, BackoffLayer, ClassifyLayer, HttpClassifier, MaxAttempts, RetryLayer,
    RetryPolicy, RetryStop,
};
use rebound_test::mock::{MockService, Reply};
use tower::{ServiceBuilder, ServiceExt};

async fn attempts_made(
    policy_attempts: u32,
    asked: Option<u32>,
) -> (u32, usize, Option<RetryStop>) {
    let mock = MockService::new().otherwise(Reply::code(503));
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::default().max_attempts(policy_attempts),
        ))
        .layer(BackoffLayer::new(Backoff::exponential(
            Duration::from_millis(10),
            Duration::from_millis(10),
        )))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(mock.clone());
    let mut req = Request::get("http://test.example/v1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    if let Some(n) = asked {
        req.extensions_mut().insert(MaxAttempts(n));
    }
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    (
        Attempts::of(res.extensions()),
        mock.call_count(),
        res.extensions().get::<RetryStop>().copied(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_request_lowers_the_policy_count() {
    assert_eq!(
        attempts_made(3, None).await,
        (3, 3, Some(RetryStop::Attempts))
    );
    assert_eq!(
        attempts_made(3, Some(1)).await,
        (1, 1, Some(RetryStop::Attempts))
    );
    assert_eq!(
        attempts_made(3, Some(2)).await,
        (2, 2, Some(RetryStop::Attempts))
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_raises_the_policy_count() {
    assert_eq!(
        attempts_made(1, Some(4)).await,
        (4, 4, Some(RetryStop::Attempts))
    );
}

#[tokio::test(start_paused = true)]
async fn out_of_range_counts_are_clamped() {
    assert_eq!(
        attempts_made(3, Some(0)).await,
        (1, 1, Some(RetryStop::Attempts))
    );
}
