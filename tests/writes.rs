//! Safe retries for writes over real sockets (issue 4's acceptance):
//! idempotency keys, streamed request bodies that replay under a cap, and
//! JSON helpers that read the response body inside the attempt.

use rebound::ErrorKind;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::Request;
use rebound::rebound_hyper::json::{JsonError, JsonErrorCategory, UnexpectedStatus};
use rebound::{Attempts, Backoff, Body, Client, ClientBuilder, Jitter, RetryStop, Verdict};
use rebound_test::fault::{Action, FaultServer};
use serde::{Deserialize, Serialize};

/// A bound for whole requests: far above what any of them needs (they take
/// milliseconds), far below the client's own 30 s timeouts, so a client
/// that waited for a body it should not read fails here instead.
const BOUND: Duration = Duration::from_secs(20);

fn fast() -> ClientBuilder {
    Client::builder().backoff(Backoff::exponential(
        Duration::from_millis(1),
        Duration::from_millis(10),
    ))
}

fn is_uuid_v4(key: &str) -> bool {
    uuid::Uuid::parse_str(key).is_ok_and(|u| u.get_version() == Some(uuid::Version::Random))
}

/// `len` bytes in chunks of `chunk`, with content that differs by position
/// (so a duplicated or missing chunk changes the bytes).
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

fn streamed(data: &[u8], chunk: usize) -> Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = data
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    Body::from_stream(stream::iter(chunks))
}

fn post(url: String, body: impl Into<Body>) -> Request<Body> {
    Request::post(url).body(body.into()).unwrap()
}

fn busy_then_created() -> [Action; 3] {
    [
        Action::status(503).body("busy"),
        Action::status(503).body("busy"),
        Action::status(201).body("created"),
    ]
}

// ===== Idempotency-Key =====

#[tokio::test]
async fn post_is_retried_with_the_same_uuid_v4_key_on_every_attempt() {
    let server = FaultServer::builder()
        .route("/orders", busy_then_created())
        .start()
        .await;
    let client = fast().build().unwrap();

    let res = client
        .send(post(server.url("/orders"), "{\"item\":1}"))
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(Attempts::of(res.extensions()), 3);

    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 3);
    let key = seen[0].header("idempotency-key").expect("a key was added");
    assert!(is_uuid_v4(key), "not a UUIDv4: {key}");
    for r in &seen {
        assert_eq!(r.header("idempotency-key"), Some(key));
        assert_eq!(&r.body[..], b"{\"item\":1}");
    }
}

#[tokio::test]
async fn post_without_keys_is_sent_once() {
    let server = FaultServer::builder()
        .route("/orders", busy_then_created())
        .start()
        .await;
    let client = fast().idempotency_keys(None).build().unwrap();

    let res = client
        .send(post(server.url("/orders"), "{\"item\":1}"))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotEligible)
    );
    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("idempotency-key"), None);
}

#[tokio::test]
async fn a_callers_key_is_kept_as_is() {
    let server = FaultServer::builder()
        .route("/orders", busy_then_created())
        .start()
        .await;
    let client = fast().build().unwrap();

    let mut req = post(server.url("/orders"), "{}");
    req.headers_mut()
        .insert("idempotency-key", "order-42-attempt".parse().unwrap());
    let res = client.send(req).await.unwrap();
    assert_eq!(res.status(), 201);

    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 3);
    for r in &seen {
        assert_eq!(r.header("idempotency-key"), Some("order-42-attempt"));
        assert_eq!(r.headers.get_all("idempotency-key").iter().count(), 1);
    }
}

#[tokio::test]
async fn a_blank_callers_key_is_no_key_and_the_post_is_sent_once() {
    // Issue 10, item 3: servers trim the header and would see an empty key
    // on every attempt. A blank key is no key: one attempt, the caller's
    // header left as it was.
    for blank in ["", "   ", "\t", " \t "] {
        let server = FaultServer::builder()
            .route("/orders", busy_then_created())
            .start()
            .await;
        let client = fast().build().unwrap();
        let mut req = post(server.url("/orders"), "{}");
        req.headers_mut()
            .insert("idempotency-key", blank.parse().unwrap());
        let res = client.send(req).await.unwrap();
        assert_eq!(res.status(), 503, "{blank:?}");
        assert_eq!(
            res.extensions().get::<RetryStop>(),
            Some(&RetryStop::NotEligible),
            "{blank:?}"
        );
        let seen = server.requests_to("/orders");
        assert_eq!(
            seen.len(),
            1,
            "{blank:?}: the server saw {} requests",
            seen.len()
        );
        assert_eq!(
            seen[0]
                .headers
                .get("idempotency-key")
                .map(|v| v.as_bytes().trim_ascii()),
            Some(&b""[..]),
            "{blank:?}"
        );
        assert_eq!(seen[0].headers.get_all("idempotency-key").iter().count(), 1);
    }
}

// ===== streamed request bodies =====

#[tokio::test]
async fn a_1_mib_stream_is_sent_once_and_not_retried_with_a_reason() {
    let server = FaultServer::builder()
        .route("/upload", busy_then_created())
        .start()
        .await;
    let client = fast().build().unwrap();
    let data = pattern(1024 * 1024);

    let res = tokio::time::timeout(
        BOUND,
        client.send(post(server.url("/upload"), streamed(&data, 16 * 1024))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    let verdict = Verdict::of(res.extensions());
    assert_eq!(
        verdict.reason().map(|r| r.as_str()),
        Some("body not replayable")
    );

    let seen = server.requests_to("/upload");
    assert_eq!(seen.len(), 1, "sent once");
    assert!(is_uuid_v4(seen[0].header("idempotency-key").unwrap()));
    // The attempt in flight still sent the whole body.
    assert_eq!(seen[0].body.len(), data.len());
    assert!(seen[0].body[..] == data[..]);
}

#[tokio::test]
async fn a_10_kib_stream_is_retried_with_byte_identical_bodies() {
    let server = FaultServer::builder()
        .route("/upload", busy_then_created())
        .start()
        .await;
    let client = fast().build().unwrap();
    let data = pattern(10 * 1024);

    // Uneven chunks: the replay must keep every boundary and byte.
    let res = client
        .send(post(server.url("/upload"), streamed(&data, 1000)))
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(Attempts::of(res.extensions()), 3);

    let seen = server.requests_to("/upload");
    assert_eq!(seen.len(), 3);
    let key = seen[0].header("idempotency-key").unwrap();
    for r in &seen {
        assert_eq!(r.header("idempotency-key"), Some(key));
        assert_eq!(r.body.len(), data.len());
        assert!(r.body[..] == data[..], "attempt {} body differs", r.index);
    }
}

#[tokio::test]
async fn the_replay_cap_is_configurable() {
    let server = FaultServer::builder()
        .route("/upload", busy_then_created())
        .start()
        .await;
    // 10 KiB is under the 64 KiB default, over this cap.
    let client = fast().replay_cap(4 * 1024).build().unwrap();
    let data = pattern(10 * 1024);
    let res = client
        .send(post(server.url("/upload"), streamed(&data, 1000)))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    assert_eq!(server.requests_to("/upload").len(), 1);
}

#[tokio::test]
async fn an_early_503_to_a_stream_still_being_sent_is_returned_and_never_retried_truncated() {
    // Issue 10, item 4: a POST (with a key) streaming 100 KiB of unknown
    // length, over the 64 KiB replay cap, answered 503 after the server read
    // 4 KiB, on a keep-alive connection, while the body is still streaming.
    // A retry started then would play back the first bytes and go on the
    // wire truncated once the body passed the cap; the caller would get
    // "not replayable" instead of the 503.
    let server = FaultServer::builder()
        .route(
            "/upload",
            [Action::status(503).body("busy").after_body_bytes(4 * 1024)],
        )
        .default(Action::status(201).body("created"))
        .start()
        .await;
    let client = fast().build().unwrap();
    let data = pattern(100 * 1024);

    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let chunks = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let body = Body::from_stream(chunks);
    let responded = tokio::sync::Notify::new();
    let send = async {
        let res = client.send(post(server.url("/upload"), body)).await;
        responded.notify_one();
        res
    };
    let produce = async {
        let mut parts = data.chunks(1024).map(Bytes::copy_from_slice);
        for part in parts.by_ref().take(8) {
            tx.send(Ok(part)).await.unwrap();
        }
        // Hold the rest until the caller has its answer, or until a retry
        // opened a second connection (what the bug did), whichever first.
        tokio::select! {
            _ = responded.notified() => {}
            _ = server.wait_for_connections(2, BOUND) => {}
        }
        for part in parts {
            if tx.send(Ok(part)).await.is_err() {
                break; // the transport let go of the body
            }
        }
        drop(tx); // the end of the stream
    };
    let (res, ()) = tokio::time::timeout(BOUND, async { tokio::join!(send, produce) })
        .await
        .expect("bounded");
    let res = res.expect("the caller gets the real outcome, not an error");
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    assert_eq!(Attempts::of(res.extensions()), 1);

    // The first request is recorded once its body is read to the end.
    server.wait_for_requests(1, BOUND).await.unwrap();
    // Give a retry, were one started, the time to reach the server.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.requests_started(),
        1,
        "no second request was started"
    );
    assert_eq!(server.request_count(), 1);
    assert_eq!(server.connections(), 1);
    let seen = server.requests_to("/upload");
    assert!(is_uuid_v4(seen[0].header("idempotency-key").unwrap()));
    // The attempt in flight still sent the whole body.
    assert_eq!(seen[0].body.len(), data.len());
    assert!(seen[0].body[..] == data[..]);
}

#[tokio::test]
async fn an_early_503_to_a_stream_that_ends_during_the_backoff_is_retried_whole() {
    // The same early 503, to a 10 KiB stream (under the cap) that ends
    // shortly after: the retry waits out its backoff (1 s, no jitter),
    // finds the body whole, and sends it whole.
    let server = FaultServer::builder()
        .route(
            "/upload",
            [Action::status(503).body("busy").after_body_bytes(4 * 1024)],
        )
        .default(Action::status(201).body("created"))
        .start()
        .await;
    let client = Client::builder()
        .backoff(
            Backoff::exponential(Duration::from_secs(1), Duration::from_secs(1))
                .jitter(Jitter::Proportional(0.0)),
        )
        .build()
        .unwrap();
    let data = pattern(10 * 1024);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let chunks = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let send = client.send(post(server.url("/upload"), Body::from_stream(chunks)));
    let produce = async {
        let mut parts = data.chunks(1024).map(Bytes::copy_from_slice);
        for part in parts.by_ref().take(6) {
            tx.send(Ok(part)).await.unwrap();
        }
        // The rest once the server has the head (it answers at 4 KiB).
        // Bounded by the whole test's timeout.
        while server.requests_started() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        for part in parts {
            tx.send(Ok(part)).await.unwrap();
        }
        drop(tx);
    };
    let (res, ()) = tokio::time::timeout(BOUND, async { tokio::join!(send, produce) })
        .await
        .expect("bounded");
    let res = res.unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(Attempts::of(res.extensions()), 2);
    let seen = server.requests_to("/upload");
    assert_eq!(seen.len(), 2);
    assert_eq!(server.requests_started(), 2);
    for r in &seen {
        assert_eq!(r.body.len(), data.len(), "attempt {}", r.index);
        assert!(r.body[..] == data[..], "attempt {} body differs", r.index);
    }
}

// ===== JSON helpers =====

#[derive(Debug, Deserialize, PartialEq)]
struct Order {
    id: u64,
    item: String,
}

#[derive(Serialize)]
struct NewOrder<'a> {
    item: &'a str,
}

const ORDER: &str = "{\"id\":7,\"item\":\"tea\"}";

#[tokio::test]
async fn get_json_retries_a_truncated_body_then_succeeds() {
    let server = FaultServer::builder()
        .route(
            "/order",
            [
                Action::status(200).body(ORDER).truncate_after(5),
                Action::status(200).body(ORDER),
            ],
        )
        .start()
        .await;
    let client = fast().build().unwrap();

    let order: Order = client.get_json(server.url("/order")).await.unwrap();
    assert_eq!(
        order,
        Order {
            id: 7,
            item: "tea".into()
        }
    );
    let seen = server.requests_to("/order");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("accept"), Some("application/json"));
}

#[tokio::test]
async fn get_json_on_invalid_json_is_one_attempt_and_a_decode_error() {
    let server = FaultServer::builder()
        .route(
            "/order",
            [Action::status(200).body("<html>token=s3cret</html>")],
        )
        .start()
        .await;
    let client = fast().build().unwrap();

    let err = client
        .get_json::<Order>(server.url("/order?key=hush"))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode), "{err:?}");
    let json = err.find_source::<JsonError>().unwrap();
    assert_eq!(json.category(), JsonErrorCategory::Syntax);
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(!shown.contains("hush"), "{shown}");
    assert!(shown.contains("GET"), "{shown}");
    assert_eq!(server.requests_to("/order").len(), 1);
}

#[tokio::test]
async fn get_json_on_the_wrong_shape_is_a_decode_error_without_the_body() {
    let server = FaultServer::builder()
        .route(
            "/order",
            [Action::status(200).body("{\"id\":\"s3cret\",\"item\":\"tea\"}")],
        )
        .start()
        .await;
    let client = fast().build().unwrap();

    let err = client
        .get_json::<Order>(server.url("/order"))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode));
    assert_eq!(
        err.find_source::<JsonError>().unwrap().category(),
        JsonErrorCategory::Data
    );
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert_eq!(server.requests_to("/order").len(), 1);
}

#[tokio::test]
async fn get_json_on_an_empty_200_is_a_decode_error() {
    let server = FaultServer::builder()
        .route("/order", [Action::status(200)])
        .start()
        .await;
    let client = fast().build().unwrap();

    let err = client
        .get_json::<Order>(server.url("/order"))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode), "{err:?}");
    assert!(err.to_string().contains("response body is empty"), "{err}");
    assert_eq!(server.requests_to("/order").len(), 1);
}

#[tokio::test]
async fn get_json_refuses_a_20_mib_body_without_reading_it() {
    const MIB: u64 = 1024 * 1024;
    let server = FaultServer::builder()
        // Announced by content-length; only 64 KiB of it ever comes.
        .route(
            "/announced",
            [Action::status(200)
                .body_len(20 * MIB)
                .stall_after(64 * 1024)],
        )
        // Chunked (no length up front); 12 MiB come, the rest never does.
        .route(
            "/chunked",
            [Action::status(200)
                .body_len(20 * MIB)
                .chunked()
                .stall_after(12 * MIB)],
        )
        .start()
        .await;
    let client = fast().build().unwrap();

    // Reading all of either body would wait forever on the stall (until the
    // 30 s body-idle timeout, past `BOUND`); the cap ends them first.
    for path in ["/announced", "/chunked"] {
        let err = tokio::time::timeout(BOUND, client.get_json::<Order>(server.url(path)))
            .await
            .unwrap_or_else(|_| panic!("{path}: the client waited for the whole body"))
            .unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::BodyTooLarge),
            "{path}: {err:?}"
        );
        assert!(err.to_string().contains("body too large"), "{err}");
        assert_eq!(
            err.retry_stop(),
            Some(RetryStop::Fatal),
            "{path}: not retried"
        );
        assert_eq!(server.requests_to(path).len(), 1, "{path}");
    }
}

#[tokio::test]
async fn max_response_body_is_configurable() {
    let server = FaultServer::builder()
        .route("/order", [Action::status(200).body(ORDER)])
        .start()
        .await;
    let client = fast().max_response_body(8).build().unwrap();
    let err = client
        .get_json::<Order>(server.url("/order"))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::BodyTooLarge), "{err:?}");
}

#[tokio::test]
async fn post_json_sends_json_with_a_key_and_is_retried() {
    let server = FaultServer::builder()
        .route(
            "/orders",
            [
                Action::status(503).body("busy"),
                // A body reset mid-way is retried too: the key makes it safe.
                Action::status(201).body(ORDER).reset_after(3),
                Action::status(201).body(ORDER),
            ],
        )
        .start()
        .await;
    let client = fast().build().unwrap();

    let order: Order = client
        .post_json(server.url("/orders"), &NewOrder { item: "tea" })
        .await
        .unwrap();
    assert_eq!(order.id, 7);

    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 3);
    let key = seen[0].header("idempotency-key").unwrap();
    assert!(is_uuid_v4(key));
    for r in &seen {
        assert_eq!(r.method, http::Method::POST);
        assert_eq!(r.header("idempotency-key"), Some(key));
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("accept"), Some("application/json"));
        assert_eq!(&r.body[..], b"{\"item\":\"tea\"}");
    }
}

#[tokio::test]
async fn json_helpers_report_a_final_error_status_with_its_attempts() {
    let server = FaultServer::builder()
        .route(
            "/order",
            [Action::status(404).body("{\"error\":\"s3cret\"}")],
        )
        .default(Action::status(503).body("busy"))
        .start()
        .await;
    let client = fast().max_attempts(2).build().unwrap();

    let err = client
        .get_json::<Order>(server.url("/order"))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Status), "{err:?}");
    assert_eq!(err.find_source::<UnexpectedStatus>().unwrap().status(), 404);
    assert!(!format!("{err} {err:?}").contains("s3cret"));
    assert_eq!(server.requests_to("/order").len(), 1);

    let err = client
        .get_json::<Order>(server.url("/busy"))
        .await
        .unwrap_err();
    assert_eq!(err.find_source::<UnexpectedStatus>().unwrap().status(), 503);
    assert_eq!(err.attempts(), 2);
    assert!((err.retry_stop() == Some(RetryStop::Attempts)));
}

#[tokio::test]
async fn send_json_keeps_the_callers_headers() {
    let server = FaultServer::builder()
        .default(Action::status(200).body(ORDER))
        .start()
        .await;
    let client = fast().build().unwrap();
    let req = Request::put(server.url("/order"))
        .header("accept", "application/vnd.api+json")
        .header("content-type", "application/merge-patch+json")
        .body("{\"item\":\"tea\"}")
        .unwrap();
    let order: Order = client.send_json(req).await.unwrap();
    assert_eq!(order.id, 7);
    let seen = server.requests();
    assert_eq!(seen[0].header("accept"), Some("application/vnd.api+json"));
    assert_eq!(
        seen[0].header("content-type"),
        Some("application/merge-patch+json")
    );
}

// ===== draining discarded responses =====

/// Two 503s with 32 KiB bodies, then `ok`. 32 KiB is "small" for the retry
/// layer's drain (up to 64 KiB) but more than hyper reads ahead on its own:
/// with a few bytes only, hyper has the whole body before the response is
/// even handed up, and the connection is reused with or without a drain.
fn small_503s_then(ok: &'static str) -> [Action; 3] {
    [
        Action::status(503).body_len(32 * 1024),
        Action::status(503).body_len(32 * 1024),
        Action::status(200).body(ok),
    ]
}

/// The drain runs during the backoff sleep: no jitter, so each sleep
/// (25 ms, 50 ms) is far longer than reading 32 KiB on loopback.
fn steady_backoff() -> Client {
    Client::builder()
        .backoff(
            Backoff::exponential(Duration::from_millis(25), Duration::from_millis(100))
                .jitter(Jitter::Proportional(0.0)),
        )
        .build()
        .unwrap()
}

#[tokio::test]
async fn discarded_small_503_bodies_are_drained_so_one_connection_serves_all() {
    let server = FaultServer::builder()
        .route("/flaky", small_503s_then("ok"))
        .start()
        .await;
    let client = steady_backoff();

    let res = client
        .send(Request::get(server.url("/flaky")).body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 3);
    let seen = server.requests_to("/flaky");
    assert_eq!(seen.len(), 3);
    assert_eq!(
        server.connections(),
        1,
        "the connection went back to the pool"
    );
    assert_eq!(seen[2].index_on_connection, 2);
}

#[tokio::test]
async fn json_helpers_reuse_the_connection_across_attempts_too() {
    let server = FaultServer::builder()
        .route("/flaky", small_503s_then(ORDER))
        .start()
        .await;
    let client = steady_backoff();

    let order: Order = client.get_json(server.url("/flaky")).await.unwrap();
    assert_eq!(order.id, 7);
    assert_eq!(server.requests_to("/flaky").len(), 3);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn both_stacks_share_the_retry_after_gate() {
    let server = FaultServer::builder()
        .route("/a", [Action::status(429).header("retry-after", "30")])
        .default(Action::status(200).body(ORDER))
        .start()
        .await;
    let client = fast()
        .max_attempts(1)
        .retry_after_gate(rebound::GateMode::FailFast)
        .build()
        .unwrap();

    // The plain stack sees the pause; the JSON stack honours it.
    let res = client
        .send(Request::get(server.url("/a")).body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let err = client
        .get_json::<Order>(server.url("/b"))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Throttled), "{err:?}");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn post_json_with_a_body_that_cannot_be_json_sends_nothing() {
    let server = FaultServer::builder().start().await;
    let client = fast().build().unwrap();
    // JSON object keys must be strings.
    let body = std::collections::BTreeMap::from([((1u8, 2u8), "v")]);
    let err = client
        .post_json::<_, Order>(server.url("/orders"), &body)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), rebound::ErrorKind::InvalidRequest, "{err:?}");
    assert!(
        err.to_string().contains("cannot be encoded as JSON"),
        "{err}"
    );
    assert_eq!(server.request_count(), 0);
}
