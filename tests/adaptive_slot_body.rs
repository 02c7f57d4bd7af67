//! The ready-made client holds the adaptive limit's slot of an attempt
//! until its response body ends or is dropped, not only until the head:
//! a server that sends a head and then trickles the body keeps its slot
//! while the body is unread, so a second request at a limit of 1 waits;
//! reading the body to its end or dropping it unread gives the slot back.
//!
//! Real sockets on 127.0.0.1 and the real clock: "waits" is checked as
//! "has not reached the server after 300 ms" (true whatever the machine's
//! speed when the slot is held), "proceeds" with a generous bound.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use rebound::limit::{AdaptiveLimiter, Aimd, Algorithm, Gradient};
use rebound::Client;
use rebound_test::fault::{Action, FaultServer};
use tokio::time::timeout;

/// Long enough for a request to reach the server when nothing holds it.
const HELD: Duration = Duration::from_millis(300);
/// A bound for what should happen at once (a slow machine included).
const PROMPT: Duration = Duration::from_secs(10);

fn limit_of_one() -> [(&'static str, Algorithm); 2] {
    [
        (
            "aimd",
            Aimd::default()
                .min_limit(1)
                .initial_limit(1)
                .max_limit(1)
                .into(),
        ),
        (
            "gradient",
            Gradient::default()
                .min_limit(1)
                .initial_limit(1)
                .max_limit(1)
                .into(),
        ),
    ]
}

async fn server() -> FaultServer {
    FaultServer::builder()
        // A head, then 2,000 bytes at 100 bytes/s: 20 s of body.
        .route(
            "/trickle",
            [Action::status(200).body_len(2_000).trickle(100)],
        )
        .route(
            "/trickle-again",
            [Action::status(200).body_len(2_000).trickle(100)],
        )
        .route("/short", [Action::status(200).body_len(10)])
        .start()
        .await
}

fn client(limiter: &Arc<AdaptiveLimiter>) -> Client {
    Client::builder()
        .total_timeout(Duration::from_secs(60))
        .attempt_timeout(Duration::from_secs(30))
        .body_idle_timeout(Duration::from_secs(30))
        .adaptive_limiter(limiter.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_slot_is_held_until_the_body_is_dropped() {
    for (name, algorithm) in limit_of_one() {
        let server = server().await;
        let limiter = Arc::new(AdaptiveLimiter::try_new(algorithm).unwrap());
        let client = client(&limiter);

        let first = timeout(PROMPT, client.get(server.url("/trickle")).send())
            .await
            .expect("the head comes at once")
            .unwrap();
        assert_eq!(first.status(), 200);
        assert_eq!(limiter.available(), 0, "{name}: the body holds the slot");

        // A second request waits for the slot while the body is unread.
        let mut second = Box::pin(client.get(server.url("/short")).send());
        assert!(
            timeout(HELD, &mut second).await.is_err(),
            "{name}: the second request waited"
        );
        assert!(
            server.requests_to("/short").is_empty(),
            "{name}: not sent while the slot is held"
        );
        assert_eq!(limiter.queued(), 1, "{name}");

        // Cancellation: the body dropped unread gives the slot back, and
        // the second request proceeds.
        drop(first);
        let res = timeout(PROMPT, &mut second)
            .await
            .expect("proceeds once the body is dropped")
            .unwrap();
        assert_eq!(res.status(), 200);
        res.into_body().collect().await.unwrap();
        assert_eq!(limiter.available(), 1, "{name}: every slot is back");
        assert_eq!(limiter.current_limit(), 1, "{name}");
    }
}

#[tokio::test]
async fn the_slot_goes_back_when_the_body_ends() {
    for (name, algorithm) in limit_of_one() {
        let server = server().await;
        let limiter = Arc::new(AdaptiveLimiter::try_new(algorithm).unwrap());
        let client = client(&limiter);

        let res = timeout(PROMPT, client.get(server.url("/short")).send())
            .await
            .expect("the head comes at once")
            .unwrap();
        let body = timeout(PROMPT, res.into_body().collect())
            .await
            .expect("a short body")
            .unwrap()
            .to_bytes();
        assert_eq!(body.len(), 10);
        assert_eq!(limiter.available(), 1, "{name}: back at the body's end");

        // A body read part of the way still holds it; the rest of it
        // dropped gives it back.
        let res = timeout(PROMPT, client.get(server.url("/trickle-again")).send())
            .await
            .expect("the head comes at once")
            .unwrap();
        let mut body = res.into_body();
        let frame = timeout(PROMPT, body.frame())
            .await
            .expect("the first bytes come with the head")
            .expect("a frame")
            .unwrap();
        assert!(frame.is_data());
        assert_eq!(limiter.available(), 0, "{name}: held mid-body");
        drop(body);
        assert_eq!(limiter.available(), 1, "{name}: back when dropped");
    }
}
