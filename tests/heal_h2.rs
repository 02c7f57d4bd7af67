//! Issue 10, item 1: a silent HTTP/2 connection must not poison its host.
//!
//! The server is a TLS `FaultServer` speaking h2 whose every connection
//! answers its first request and then goes silent (no response, no PING
//! acknowledgement, no `GOAWAY`, no reset), as a dead peer behind a live
//! socket does. Two mechanisms heal the client, each tested alone:
//!
//! * an attempt that times out waiting for its head retires its HTTP/2
//!   connection, so the retry (and every later request) gets a fresh one;
//! * HTTP/2 keep-alive PINGs close a connection that stops answering, even
//!   when no attempt timeout fires first.
//!
//! Real sockets on 127.0.0.1; every bound is generous (a loaded machine),
//! none is a timing assertion.

use std::time::Duration;

use http::{Request, Version};
use rebound::{
    Attempts, Backoff, Body, Client, ClientBuilder, HyperTransport, TimeoutStage, TlsRoots,
};
use rebound_test::fault::{ConnectionAction, FaultServer};
use tokio::time::{Instant, MissedTickBehavior};
use tower::ServiceExt;

/// Upper bound of any one test: far above what each needs.
const TEST_LIMIT: Duration = Duration::from_secs(60);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test exceeded its time limit")
}

/// A TLS h2 server whose every connection answers one request, then goes
/// silent.
async fn one_answer_per_connection() -> FaultServer {
    FaultServer::builder()
        .tls()
        .default_connection(ConnectionAction::serve_then_silent(1))
        .start()
        .await
}

/// A client trusting `server`'s CA, with a short backoff, keep-alive as
/// given by the caller.
fn client_for(server: &FaultServer) -> ClientBuilder {
    Client::builder()
        .tls_roots(TlsRoots::Custom(server.root_store().expect("a TLS server")))
        .backoff(Backoff::exponential(ms(5), ms(20)))
        .total_timeout(Duration::from_secs(10))
}

#[tokio::test]
async fn a_headers_timeout_retires_the_http2_connection() {
    bounded(async {
        let server = one_answer_per_connection().await;
        // Keep-alive off: only the retiring of the timed-out connection can
        // heal this client.
        let client = client_for(&server)
            .attempt_timeout(ms(400))
            .http2_keep_alive_interval(None)
            .build()
            .unwrap();

        let res = client.get(server.url("/one")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.version(), Version::HTTP_2);
        assert_eq!(Attempts::of(res.extensions()), 1);
        assert_eq!(server.connections(), 1);

        // The pooled connection is silent now: the first attempt times out
        // waiting for its head, the second goes out on a new connection.
        let res = client.get(server.url("/two")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(Attempts::of(res.extensions()), 2);
        assert_eq!(server.connections(), 2, "the retry used a new connection");
        let seen = server.requests_to("/two");
        assert_eq!(seen.len(), 2);
        assert_ne!(seen[0].connection, seen[1].connection);

        // A request every 0.5 s for 10 s: each finds its connection silent
        // and heals on its retry; none waits for the dead one for ever.
        let mut tick = tokio::time::interval(ms(500));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failed = Vec::new();
        for i in 0..20 {
            tick.tick().await;
            match client.get(server.url("/loop")).await {
                Ok(res) if res.status() == 200 => {}
                Ok(res) => failed.push(format!("request {i}: status {}", res.status())),
                Err(e) => failed.push(format!("request {i}: {e}")),
            }
        }
        assert!(
            failed.len() <= 1 && !failed.iter().any(|f| !f.starts_with("request 0:")),
            "all but at most the first must succeed: {failed:?}"
        );
        // Every request after the first two opened a fresh connection.
        assert!(
            server.connections() >= 2 + 19,
            "connections: {}",
            server.connections()
        );
    })
    .await
}

#[tokio::test]
async fn keep_alive_pings_close_a_silent_connection() {
    bounded(async {
        let server = one_answer_per_connection().await;
        // An attempt timeout far beyond the keep-alive's reaction (PING
        // after 200 ms without a frame, closed 200 ms later), so only the
        // PING can end the wait on the silent connection.
        let attempt = Duration::from_secs(8);
        let client = client_for(&server)
            .attempt_timeout(attempt)
            .http2_keep_alive_interval(ms(200))
            .http2_keep_alive_timeout(ms(200))
            .build()
            .unwrap();

        let res = client.get(server.url("/one")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.version(), Version::HTTP_2);

        // The first attempt fails when the PING goes unanswered, not when
        // the attempt timeout fires; the retry gets a new connection.
        let start = Instant::now();
        let res = client.get(server.url("/two")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(Attempts::of(res.extensions()), 2);
        assert!(
            start.elapsed() < attempt,
            "the keep-alive closed the connection before the attempt timeout: {:?}",
            start.elapsed()
        );
        assert_eq!(server.connections(), 2);

        // With one attempt, the caller sees why: not a headers timeout.
        let client = client_for(&server)
            .attempt_timeout(attempt)
            .max_attempts(1)
            .http2_keep_alive_interval(ms(200))
            .http2_keep_alive_timeout(ms(200))
            .build()
            .unwrap();
        client.get(server.url("/three")).await.unwrap();
        let err = client.get(server.url("/four")).await.unwrap_err();
        assert_ne!(err.timeout_stage(), Some(TimeoutStage::Headers), "{err}");
        assert!(err.to_string().contains("timed out"), "{err}");
    })
    .await
}

#[tokio::test]
async fn http1_over_tls_is_not_captured_and_still_recovers() {
    bounded(async {
        // The same fault over HTTP/1.1: the abandoned connection is never
        // reused (hyper closes an HTTP/1 connection whose request was
        // abandoned), so it heals without retiring anything.
        let server = one_answer_per_connection().await;
        let client = client_for(&server)
            .attempt_timeout(ms(400))
            .http2(false)
            .build()
            .unwrap();
        let res = client.get(server.url("/one")).await.unwrap();
        assert_eq!(res.version(), Version::HTTP_11);
        let res = client.get(server.url("/two")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(Attempts::of(res.extensions()), 2);
        assert_eq!(server.connections(), 2);
    })
    .await
}

#[tokio::test]
async fn an_early_cancel_keeps_the_connection_a_long_wait_retires_it() {
    bounded(async {
        let server = one_answer_per_connection().await;
        // The transport alone, as under a foreign timeout layer: an abandon
        // after 300 ms of waiting for the head retires the connection.
        let transport = HyperTransport::builder()
            .tls_roots(TlsRoots::Custom(server.root_store().unwrap()))
            .http2_retire_abandoned_after(ms(300))
            .build()
            .unwrap();
        let get = |path: &str| Request::get(server.url(path)).body(Body::empty()).unwrap();
        let res = transport.clone().oneshot(get("/one")).await.unwrap();
        assert_eq!(res.version(), Version::HTTP_2);

        // Cancelled after 50 ms: the connection stays pooled.
        let early = tokio::time::timeout(ms(50), transport.clone().oneshot(get("/early"))).await;
        assert!(early.is_err(), "the silent connection never answers");
        // Abandoned after 400 ms: it went out on the same, silent
        // connection (a fresh one would have answered at once), which is
        // now retired.
        let late = tokio::time::timeout(ms(400), transport.clone().oneshot(get("/late"))).await;
        assert!(late.is_err(), "the early cancel kept the silent connection");
        assert_eq!(server.connections(), 1);

        let res = transport.clone().oneshot(get("/after")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(server.connections(), 2, "the long wait retired it");
    })
    .await
}
