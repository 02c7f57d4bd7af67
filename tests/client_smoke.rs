//! Building the ready-made client: defaults that fit any valid total
//! timeout. (The 503,503,200 round trip over real sockets lives in
//! `tests/transport.rs`.)

use rebound::ErrorKind;
use std::time::Duration;

use rebound::Client;

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
    assert!(matches!(err.kind(), ErrorKind::Config));
    assert!(err.to_string().contains("backoff cap"), "{err}");
}

#[test]
fn defaults_shrink_to_fit_a_total_the_user_set() {
    // Issue 10, item 4: the default 10 s attempt timeout no longer refuses
    // a 5 s total; it shrinks to it.
    Client::builder()
        .total_timeout(Duration::from_secs(5))
        .build()
        .expect("a 5 s total alone is valid");
    // Only values the user set contradict each other, with the same words.
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

#[tokio::test]
async fn a_short_total_alone_bounds_every_attempt_over_real_sockets() {
    use rebound_test::fault::{Action, FaultServer};
    // A server that never answers, and a 400 ms total set alone: the
    // attempts (default 10 s) must fit in it. Over real sockets, so the
    // bound is generous: far below the 10 s default a regression would fall
    // back to.
    let server = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    let client = Client::builder()
        .total_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    let err = client.get(server.url("/slow")).await.unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err.kind(), ErrorKind::Timeout(_)), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}
