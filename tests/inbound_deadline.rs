//! Issue 12: an axum server's inbound deadline (`grpc-timeout`) becomes the
//! deadline of the outbound calls its handler makes through rebound, and
//! the downstream is told how long it has.

use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use rebound::grpc::InboundDeadlineLayer;
use rebound::{Body, Client};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::Instant;

const BUDGET: HeaderName = HeaderName::from_static("x-budget-ms");

async fn handler(State((client, downstream)): State<(Client, String)>) -> (StatusCode, String) {
    let start = Instant::now();
    match client.get(&downstream).await {
        Ok(res) => (res.status(), "unexpected answer".into()),
        Err(e) => (
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "{} {}",
                e.timeout_stage().map_or("none", |s| s.as_str()),
                start.elapsed().as_millis()
            ),
        ),
    }
}

async fn gateway(downstream: String) -> String {
    // The client's own total (10 s) is far longer than the caller's 300 ms.
    let client = Client::builder()
        .total_timeout(Duration::from_secs(10))
        .deadline_header(BUDGET)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(handler))
        .with_state((client, downstream))
        .layer(InboundDeadlineLayer::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

async fn ask(url: &str, grpc_timeout: &str) -> (StatusCode, String, Duration) {
    ask_with(url, &[grpc_timeout]).await
}

/// Ask with one `grpc-timeout` header line per value, in this order.
async fn ask_with(url: &str, grpc_timeouts: &[&str]) -> (StatusCode, String, Duration) {
    let caller = Client::builder().max_attempts(1).build().unwrap();
    let mut req = Request::get(url);
    for t in grpc_timeouts {
        req = req.header("grpc-timeout", *t);
    }
    let req = req.body(Body::empty()).unwrap();
    let start = Instant::now();
    let res = caller.send(req).await.unwrap();
    let status = res.status();
    let text = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        String::from_utf8_lossy(&text).into_owned(),
        start.elapsed(),
    )
}

#[tokio::test]
async fn an_inbound_grpc_timeout_bounds_the_outbound_call() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let downstream = FaultServer::builder()
            .default(Action::never_respond())
            .start()
            .await;
        let url = gateway(downstream.url("/hang")).await;

        // 1 s: the gateway's connect to the downstream fits in it on a
        // loaded machine, so the downstream is called (and told the time
        // left).
        let (status, text, took) = ask(&url, "1000m").await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{text}");
        let (stage, ms) = text.split_once(' ').unwrap();
        assert_eq!(stage, "deadline");
        let ms: u64 = ms.parse().unwrap();
        // Not sooner than asked (the handler starts right after the layer
        // reads the header); the upper bounds only tell the caller's 1 s
        // from the client's own 10 s, and leave a loaded machine room.
        assert!((900..5_000).contains(&ms), "outbound call took {ms} ms");
        assert!(took < Duration::from_secs(8), "{took:?}");

        let seen = downstream.requests_to("/hang");
        assert_eq!(seen.len(), 1, "no retry fits in the time left");
        for r in seen {
            let budget: u64 = r.header("x-budget-ms").unwrap().parse().unwrap();
            assert!(budget <= 1000, "{budget}");
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_malformed_inbound_grpc_timeout_is_ignored() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let downstream = FaultServer::builder()
            .default(Action::never_respond())
            .start()
            .await;
        let url = gateway(downstream.url("/hang")).await;
        // Ignored: the handler's call runs on the client's own deadline
        // (10 s). It is not a zero deadline (the downstream is called) and
        // it does not cut the call short: the call is still waiting once
        // the downstream has it, and the downstream is told of the 10 s.
        // Measured from when the downstream got the call, not from when it
        // was made: how long connecting takes is not under test.
        let caller = Client::builder().max_attempts(1).build().unwrap();
        let req = Request::get(&url)
            .header("grpc-timeout", "123456789m")
            .body(Body::empty())
            .unwrap();
        let call = tokio::spawn(async move { caller.send(req).await.map(|r| r.status()) });
        let waited = Instant::now();
        while downstream.requests_to("/hang").is_empty() {
            assert!(
                waited.elapsed() < Duration::from_secs(8),
                "the downstream was never called"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !call.is_finished(),
            "the malformed value must not cut the call short: {:?}",
            call.await
        );
        call.abort();
        let seen = downstream.requests_to("/hang");
        assert_eq!(seen.len(), 1);
        let budget: u64 = seen[0].header("x-budget-ms").unwrap().parse().unwrap();
        assert!(budget > 5_000, "{budget}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn of_two_inbound_grpc_timeouts_the_smaller_wins() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let downstream = FaultServer::builder()
            .default(Action::never_respond())
            .start()
            .await;
        let url = gateway(downstream.url("/hang")).await;
        for order in [["100H", "500m"], ["500m", "100H"]] {
            // Were the 100 hours to win, the handler's call would run on
            // the client's own 10 s: 3 s of patience tells the two apart on
            // any machine.
            let (status, text, _) =
                tokio::time::timeout(Duration::from_secs(3), ask_with(&url, &order))
                    .await
                    .unwrap_or_else(|_| panic!("{order:?}: the 500 ms deadline did not apply"));
            assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{order:?}: {text}");
            let (stage, ms) = text.split_once(' ').unwrap();
            assert_eq!(stage, "deadline", "{order:?}");
            let ms: u64 = ms.parse().unwrap();
            assert!(ms <= 3_000, "{order:?}: the outbound call took {ms} ms");
        }
        // What the downstream was told is never more than the smaller value.
        for r in downstream.requests_to("/hang") {
            let budget: u64 = r.header("x-budget-ms").unwrap().parse().unwrap();
            assert!(budget <= 500, "{budget}");
        }
    })
    .await
    .unwrap();
}
