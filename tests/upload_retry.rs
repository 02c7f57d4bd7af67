//! An early answer to a streamed upload, over real sockets on 127.0.0.1
//! (issue 18, item 3): the server answers `503` after reading the first
//! 4 KiB of a POST whose body is a real stream still trickling in. Within
//! the replay cap the retry waits for the rest of the body (reading it into
//! the replay buffer itself) and sends it whole; over the cap the caller
//! gets the `503` and no second request is made. Either way the server
//! never sees a truncated or duplicated body.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::Request;
use rebound::{Attempts, Backoff, Body, Client, Jitter, RetryStop};
use rebound_test::fault::{Action, FaultServer};

/// Far above what each request needs, below the client's 30 s deadline.
const BOUND: Duration = Duration::from_secs(20);

/// `len` bytes whose content differs by position, so a duplicated or
/// missing chunk changes them.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// `data` as a real stream: 1 KiB chunks, `gap` apart (so the upload takes
/// at least `len / 1024 * gap`, however fast the machine).
fn trickled(data: &[u8], gap: Duration) -> Body {
    let chunks: Vec<Bytes> = data.chunks(1024).map(Bytes::copy_from_slice).collect();
    Body::from_stream(stream::unfold(
        chunks.into_iter(),
        move |mut rest| async move {
            let chunk = rest.next()?;
            tokio::time::sleep(gap).await;
            Some((Ok::<_, std::io::Error>(chunk), rest))
        },
    ))
}

/// The default client (idempotency keys on) with a fixed 20 ms backoff:
/// far shorter than the uploads below.
fn client() -> Client {
    Client::builder()
        .backoff(
            Backoff::exponential(Duration::from_millis(20), Duration::from_millis(20))
                .jitter(Jitter::Proportional(0.0)),
        )
        .build()
        .unwrap()
}

fn early_503_server() -> impl std::future::Future<Output = FaultServer> {
    FaultServer::builder()
        .route(
            "/upload",
            [Action::status(503).body("busy").after_body_bytes(4 * 1024)],
        )
        .default(Action::status(201).body("created"))
        .start()
}

#[tokio::test]
async fn an_early_503_to_a_trickling_upload_within_the_cap_is_retried_whole() {
    // 48 KiB (under the 64 KiB cap), 48 chunks 5 ms apart: at least 240 ms,
    // while the 503 comes after 4 KiB and the backoff is 20 ms.
    let server = early_503_server().await;
    let client = client();
    let data = pattern(48 * 1024);
    let req = Request::post(server.url("/upload"))
        .body(trickled(&data, Duration::from_millis(5)))
        .unwrap();

    let res = tokio::time::timeout(BOUND, client.send(req))
        .await
        .expect("bounded")
        .expect("a response");
    assert_eq!(
        res.status(),
        201,
        "{:?}",
        res.extensions().get::<RetryStop>()
    );
    assert_eq!(Attempts::of(res.extensions()), 2);

    server.wait_for_requests(2, BOUND).await.unwrap();
    let seen = server.requests_to("/upload");
    assert_eq!(seen.len(), 2);
    assert_eq!(server.requests_started(), 2, "no truncated attempt");
    let key = seen[0].header("idempotency-key").expect("a key");
    for r in &seen {
        assert_eq!(r.header("idempotency-key"), Some(key));
        assert_eq!(r.body.len(), data.len(), "attempt {}", r.index);
        assert!(r.body[..] == data[..], "attempt {} body differs", r.index);
    }
}

#[tokio::test]
async fn an_early_503_to_a_trickling_upload_over_the_cap_is_returned_once() {
    // 100 KiB (over the 64 KiB cap), 100 chunks 2 ms apart.
    let server = early_503_server().await;
    let client = client();
    let data = pattern(100 * 1024);
    let req = Request::post(server.url("/upload"))
        .body(trickled(&data, Duration::from_millis(2)))
        .unwrap();

    let res = tokio::time::timeout(BOUND, client.send(req))
        .await
        .expect("bounded")
        .expect("the real outcome, not an error");
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    assert_eq!(Attempts::of(res.extensions()), 1);

    // The attempt in flight still sends the whole body.
    server.wait_for_requests(1, BOUND).await.unwrap();
    // Give a retry, were one started, the time to reach the server.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.requests_started(), 1, "no second request");
    let seen = server.requests_to("/upload");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.len(), data.len());
    assert!(seen[0].body[..] == data[..]);
}
