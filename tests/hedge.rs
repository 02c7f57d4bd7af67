//! Hedging over real sockets (issue 13's acceptance): a hung first attempt
//! is overtaken by its hedge and its connection closed; a POST without the
//! caller's own key is never hedged; hedges stop when the retry budget is empty.

use rebound::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use http_body_util::BodyExt;
use rebound::hedge::HedgePolicy;
use rebound::{Body, Client, ClientBuilder, Hedged, RetryBudget, RetryStop};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::Instant;

/// A bound for whole requests and waits: far above what any of them needs
/// (milliseconds), far below the client's timeouts.
const BOUND: Duration = Duration::from_secs(20);

/// The hedge delay. Only the hung or delayed routes below are slower than
/// it by design; a test whose answer must not be hedged says so with a
/// route that answers at once or with a hedge that cannot happen.
const DELAY: Duration = Duration::from_millis(100);

fn client(b: ClientBuilder) -> Client {
    b.attempt_timeout(Duration::from_secs(30))
        .total_timeout(Duration::from_secs(60))
        .build()
        .expect("a valid client")
}

fn hedging() -> ClientBuilder {
    Client::builder().hedge(HedgePolicy::fixed(DELAY))
}

/// Waits (bounded) until the server has no request in flight: a request
/// that got no answer leaves only when its connection is closed.
async fn until_idle(server: &FaultServer) -> bool {
    let start = Instant::now();
    while start.elapsed() < BOUND {
        if server.in_flight() == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn a_hung_get_is_answered_by_its_hedge_and_its_connection_closed() {
    let server = FaultServer::builder()
        .route("/item", [Action::never_respond()])
        .default(Action::status(200).body("from the hedge"))
        .start()
        .await;
    let client = client(hedging());
    let start = Instant::now();
    let res = tokio::time::timeout(BOUND, client.get(server.url("/item")))
        .await
        .expect("bounded")
        .expect("the hedge answers");
    let elapsed = start.elapsed();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.extensions().get::<Hedged>(),
        Some(&Hedged {
            copies: 2,
            winner: Some(2)
        })
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"from the hedge");
    // Not before the delay; long before the attempt timeout.
    assert!(elapsed >= DELAY && elapsed < BOUND, "{elapsed:?}");
    assert_eq!(server.requests_to("/item").len(), 2);
    assert_eq!(
        server.connections(),
        2,
        "the hedge needs its own HTTP/1 connection"
    );
    // The hung attempt was cancelled: its connection closed, so the server
    // no longer holds its request.
    assert!(
        until_idle(&server).await,
        "the hung attempt's connection stayed open"
    );
}

#[tokio::test]
async fn a_post_is_hedged_only_with_the_callers_own_key() {
    let slow = || Action::status(200).delay(Duration::from_millis(400));
    let server = FaultServer::builder()
        .route("/orders", [slow(), slow(), slow(), slow(), slow(), slow()])
        .start()
        .await;
    let post = |key: Option<&str>| {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri(server.url("/orders"));
        if let Some(key) = key {
            b = b.header("idempotency-key", key);
        }
        b.body(Body::from(r#"{"amount":42}"#)).unwrap()
    };
    let send = |client: Client, req| async move {
        tokio::time::timeout(BOUND, client.send(req))
            .await
            .expect("bounded")
            .unwrap()
    };
    // No key (the key layer off): sent once, slow as it is.
    let res = send(client(hedging().idempotency_keys(None)), post(None)).await;
    assert_eq!(res.status(), 200);
    assert!(res.extensions().get::<Hedged>().is_none());
    assert_eq!(server.requests_to("/orders").len(), 1);

    // The key the client makes (the default): retryable, but not hedged
    // (issue 20: a hedge copies a write with no failure signal at all).
    let res = send(client(hedging()), post(None)).await;
    assert!(res.extensions().get::<Hedged>().is_none());
    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1].header("idempotency-key").is_some(),
        "a key was made"
    );

    // The caller's own key: hedged, and both copies carry that key and body.
    let res = send(client(hedging()), post(Some("order-42"))).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.extensions().get::<Hedged>().map(|h| h.copies), Some(2));
    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[2].header("idempotency-key"), Some("order-42"));
    assert_eq!(seen[3].header("idempotency-key"), Some("order-42"));
    assert_eq!(seen[2].body, seen[3].body);

    // Asked for: a made key is hedged too.
    let opted = Client::builder().hedge(HedgePolicy::fixed(DELAY).hedge_generated_keys(true));
    let res = send(client(opted), post(None)).await;
    assert_eq!(res.extensions().get::<Hedged>().map(|h| h.copies), Some(2));
    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 6);
    assert_eq!(
        seen[4].header("idempotency-key"),
        seen[5].header("idempotency-key")
    );
}

#[tokio::test]
async fn hedges_stop_when_the_budget_is_empty() {
    let slow = || Action::status(200).delay(Duration::from_millis(300));
    let server = FaultServer::builder()
        .route("/slow", std::iter::repeat_n(slow(), 20))
        .start()
        .await;
    // 20 % of requests, no floor: five requests earn exactly one hedge,
    // and only once the fifth is recorded.
    let budget = Arc::new(RetryBudget::new(0.2, Duration::from_secs(60), 0));
    let client = client(hedging().retry_budget(budget.clone()));
    let mut hedged = Vec::new();
    for _ in 0..5 {
        let res = tokio::time::timeout(BOUND, client.get(server.url("/slow")))
            .await
            .expect("bounded")
            .unwrap();
        assert_eq!(res.status(), 200);
        hedged.push(res.extensions().get::<Hedged>().is_some());
    }
    assert_eq!(hedged, [false, false, false, false, true]);
    assert_eq!(server.requests_to("/slow").len(), 6);
    assert_eq!(budget.remaining(), 0);
}

#[tokio::test]
async fn a_hedged_failure_is_not_retried() {
    // Both copies fail with a 503 after the delay: the caller gets the
    // last 503, not a third attempt (hedged or retried, not both).
    let late_503 = || Action::status(503).delay(Duration::from_millis(200));
    let server = FaultServer::builder()
        .route("/busy", [late_503(), late_503(), late_503()])
        .start()
        .await;
    let client = client(hedging());
    let res = tokio::time::timeout(BOUND, client.get(server.url("/busy")))
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Hedged)
    );
    assert_eq!(server.requests_to("/busy").len(), 2);
}

#[tokio::test]
async fn off_by_default() {
    let server = FaultServer::builder()
        .route(
            "/item",
            [Action::status(200).delay(Duration::from_millis(300))],
        )
        .start()
        .await;
    let client = client(Client::builder());
    let res = tokio::time::timeout(BOUND, client.get(server.url("/item")))
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(server.requests_to("/item").len(), 1);
}

#[tokio::test]
async fn over_http2_the_hung_stream_is_reset_on_the_same_connection() {
    let server = FaultServer::builder()
        .tls()
        .route("/item", [Action::never_respond()])
        .default(Action::status(200).body("from the hedge"))
        .start()
        .await;
    let roots = server.root_store().expect("a TLS server has a root store");
    let client = client(hedging().tls_roots(rebound::TlsRoots::Custom(roots)));
    let res = tokio::time::timeout(BOUND, client.get(server.url("/item")))
        .await
        .expect("bounded")
        .expect("the hedge answers");
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.extensions().get::<Hedged>().and_then(|h| h.winner),
        Some(2)
    );
    assert_eq!(server.requests_to("/item").len(), 2);
    // Both copies on one HTTP/2 connection: the hung one's stream was reset
    // (the server dropped its request), the connection stays.
    assert_eq!(server.connections(), 1);
    assert!(until_idle(&server).await, "the hung stream was not reset");
}

#[test]
fn a_hedge_policy_that_cannot_work_is_a_build_error_not_a_panic() {
    let err = Client::builder()
        .hedge(HedgePolicy::fixed(Duration::ZERO))
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config));
    assert!(err.to_string().contains("hedge delay"), "{err}");
}
