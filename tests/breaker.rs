//! Issue 13's circuit-breaker acceptance through the ready-made client over
//! real sockets (`FaultServer` on 127.0.0.1): a host answering 503 to
//! everything opens its circuit after 10 failed calls in a row (the
//! default trigger), later calls fail fast without reaching it, after the
//! break one probe goes through, and once the host is healthy the circuit
//! closes; 404s, 400s and a 429 storm never open it (issue 18: throttling
//! is not breakage); another host is unaffected throughout.
//!
//! Counts are exact (the server's recorder); time is real but every bound
//! is generous: the break is 2 s and what happens inside it is a handful of
//! calls that fail without I/O.

use std::time::Duration;

use rebound::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound::{CircuitState, Client, ErrorKind, Sent};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::{sleep, timeout, Instant};

const BREAK: Duration = Duration::from_secs(2);
/// The default consecutive trigger.
const MINIMUM: u64 = 10;

/// One attempt per call, so that every call is one count at the server and
/// in the breaker's window; the breaker has its defaults but for a shorter
/// break: it opens after `MINIMUM` failed calls in a row.
fn breaker() -> CircuitBreakerLayer {
    CircuitBreakerLayer::new(CircuitBreakerConfig::default().break_duration(BREAK))
}

fn client(breaker: &CircuitBreakerLayer) -> Client {
    Client::builder()
        .max_attempts(1)
        .circuit_breaker(breaker.clone())
        .build()
        .unwrap()
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    timeout(Duration::from_secs(60), f)
        .await
        .expect("test exceeded its time limit")
}

#[tokio::test]
async fn a_host_answering_503_opens_then_probes_then_closes_when_healthy() {
    bounded(async {
        let down = FaultServer::builder()
            .default(Action::status(503))
            .start()
            .await;
        let healthy = FaultServer::builder()
            .default(Action::status(200).body("ok"))
            .start()
            .await;
        let breaker = breaker();
        let client = client(&breaker);
        let url = down.url("/v1/items?token=s3cret");
        let uri: http::Uri = url.parse().unwrap();

        // 100 calls: the first MINIMUM reach the server and open the
        // circuit; the rest fail at once, not sent.
        let mut opened_at = None;
        let mut fast = 0;
        for n in 0..100u64 {
            match client.get(url.as_str()).await {
                Ok(res) => {
                    assert_eq!(res.status(), 503);
                    assert!(n < MINIMUM, "call {n} reached the server");
                }
                Err(err) => {
                    assert_eq!(err.kind(), ErrorKind::CircuitOpen, "{err}");
                    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
                    let shown = err.to_string();
                    assert!(shown.starts_with("circuit open: may close in "), "{shown}");
                    assert!(shown.contains(&format!("127.0.0.1:{}", down.addr().port())));
                    assert!(!shown.contains("s3cret"), "{shown}");
                    opened_at.get_or_insert_with(Instant::now);
                    fast += 1;
                }
            }
        }
        // The healthy host is unaffected while the other's circuit is open.
        for _ in 0..20 {
            let res = client.get(healthy.url("/").as_str()).await.unwrap();
            assert_eq!(res.status(), 200);
        }
        let opened_at = opened_at.expect("the circuit opened");
        // The premise of the counts below: still within the break.
        assert!(opened_at.elapsed() < BREAK, "the calls took a whole break");
        assert_eq!(fast, 100 - MINIMUM);
        assert_eq!(down.request_count(), MINIMUM, "failed fast: never sent");
        assert_eq!(healthy.request_count(), 20);
        assert_eq!(breaker.state(&uri), CircuitState::Open);

        // After the break one probe goes through; still failing, it opens
        // the circuit again.
        sleep(BREAK + Duration::from_millis(200)).await;
        assert_eq!(breaker.state(&uri), CircuitState::HalfOpen);
        assert_eq!(client.get(url.as_str()).await.unwrap().status(), 503);
        assert_eq!(down.request_count(), MINIMUM + 1, "one probe");
        assert_eq!(breaker.state(&uri), CircuitState::Open);
        assert!(matches!(
            client.get(url.as_str()).await.unwrap_err().kind(),
            ErrorKind::CircuitOpen
        ));
        assert_eq!(down.request_count(), MINIMUM + 1);

        // Healthy again: the next probe closes it and calls succeed.
        down.set_default(Action::status(200).body("back"));
        sleep(BREAK + Duration::from_millis(200)).await;
        for _ in 0..20 {
            assert_eq!(client.get(url.as_str()).await.unwrap().status(), 200);
        }
        assert_eq!(breaker.state(&uri), CircuitState::Closed);
        assert_eq!(down.request_count(), MINIMUM + 1 + 20);
    })
    .await;
}

#[tokio::test]
async fn fours_hundreds_and_a_429_storm_never_open_it() {
    bounded(async {
        let missing = FaultServer::builder()
            .default(Action::status(404))
            .start()
            .await;
        let bad = FaultServer::builder()
            .default(Action::status(400))
            .start()
            .await;
        let busy = FaultServer::builder()
            .default(Action::status(429))
            .start()
            .await;
        let breaker = breaker();
        let client = client(&breaker);

        for _ in 0..150 {
            let res = client.get(missing.url("/nope").as_str()).await.unwrap();
            assert_eq!(res.status(), 404);
            let res = client.get(bad.url("/bad").as_str()).await.unwrap();
            assert_eq!(res.status(), 400);
        }
        assert_eq!(missing.request_count(), 150);
        assert_eq!(bad.request_count(), 150);
        let uri = |s: &FaultServer| s.url("/").parse::<http::Uri>().unwrap();
        assert_eq!(breaker.state(&uri(&missing)), CircuitState::Closed);
        assert_eq!(breaker.state(&uri(&bad)), CircuitState::Closed);

        // Throttling is not breakage: every call is sent and answered 429.
        for _ in 0..150 {
            let res = client.get(busy.url("/").as_str()).await.unwrap();
            assert_eq!(res.status(), 429);
        }
        assert_eq!(busy.request_count(), 150);
        assert_eq!(breaker.state(&uri(&busy)), CircuitState::Closed);
    })
    .await;
}

#[tokio::test]
async fn off_means_every_call_is_sent() {
    bounded(async {
        let down = FaultServer::builder()
            .default(Action::status(503))
            .start()
            .await;
        let client = Client::builder()
            .max_attempts(1)
            .circuit_breaker(None)
            .build()
            .unwrap();
        for _ in 0..150 {
            let res = client.get(down.url("/").as_str()).await.unwrap();
            assert_eq!(res.status(), 503);
        }
        assert_eq!(down.request_count(), 150);
    })
    .await;
}
