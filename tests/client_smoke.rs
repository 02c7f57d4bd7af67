//! Building the ready-made client: defaults that fit any valid total
//! timeout. (The 503,503,200 round trip over real sockets lives in
//! `tests/transport.rs`.)

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
    assert!(err.is_config());
    assert!(err.to_string().contains("backoff cap"), "{err}");
}
