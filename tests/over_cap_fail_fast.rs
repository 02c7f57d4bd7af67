//! A client that gives up on a Retry-After longer than its cap
//! (`OverCap::FailFast`) does not retry that request, and fails new
//! requests to that host fast while the (capped) pause lasts, over real
//! sockets on 127.0.0.1. Other hosts are not held.

use std::time::Duration;

use rebound::{Attempts, Backoff, Client, ErrorKind, OverCap, RetryStop};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::Instant;

const BOUND: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_retry_after_over_the_cap_fails_fast_and_so_does_its_host() {
    let a = FaultServer::builder()
        .route(
            "/limited",
            [Action::status(429).header("retry-after", "3600")],
        )
        .default(Action::status(200))
        .start()
        .await;
    let b = FaultServer::builder()
        .default(Action::status(200))
        .start()
        .await;
    let client = Client::builder()
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .retry_after_cap(Duration::from_secs(2))
        .retry_after_over_cap(OverCap::FailFast)
        .build()
        .unwrap();

    // The 429 asking for an hour is the caller's answer at once: no retry.
    let start = Instant::now();
    let res = tokio::time::timeout(BOUND, client.get(a.url("/limited")))
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(Attempts::of(res.extensions()), 1);
    assert_eq!(res.extensions().get::<RetryStop>(), Some(&RetryStop::Fatal));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "not retried after a wait"
    );

    // Another path of that host fails fast during the capped pause, without
    // reaching the server ...
    let before = a.request_count();
    let err = tokio::time::timeout(BOUND, client.get(a.url("/other")))
        .await
        .expect("bounded")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Throttled, "{err}");
    assert_eq!(a.request_count(), before);

    // ... while another host answers.
    let res = tokio::time::timeout(BOUND, client.get(b.url("/ok")))
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(res.status(), 200);
}
