//! A request the server provably did not process is `NotSent`, and retried
//! even as a keyless POST; one it may have processed is not (issue 18,
//! item 3). Over real sockets on 127.0.0.1, with the fault server's
//! `ConnectionAction::go_away`: the server reads the request's `HEADERS`,
//! stops reading, and 100 ms later sends a `PING` and a `GOAWAY`, then
//! resets the connection.
//!
//! With a 16 MiB body the client is still writing, blocked on a full
//! socket, when the `GOAWAY` comes and when the reset fails its write: it
//! must still read the `GOAWAY` (last stream id 0: the request was not
//! processed) and not take the reset for a request that may have been
//! processed. With a last stream id that covers the request, or an
//! HTTP/1.1 reset after the server read the request, nothing proves the
//! request was not processed: `MaybeProcessed`, not retried.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Version};
use rebound::{Attempts, Backoff, Body, Client, ErrorKind, RetryStop, Sent, TlsRoots};
use rebound_test::fault::{Action, ConnectionAction, FaultServer};

const BOUND: Duration = Duration::from_secs(30);
const BIG: usize = 16 << 20;

async fn server(first: ConnectionAction) -> FaultServer {
    FaultServer::builder()
        .tls()
        .connections([first])
        .default(Action::status(200).body("done"))
        .start()
        .await
}

/// Keyless POSTs (idempotency keys off): only `NotSent` makes them
/// retryable.
fn client(server: &FaultServer) -> Client {
    let mut builder = Client::builder()
        .idempotency_keys(None)
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .total_timeout(BOUND);
    if let Some(roots) = server.root_store() {
        builder = builder.tls_roots(TlsRoots::Custom(roots));
    }
    builder.build().unwrap()
}

fn post(server: &FaultServer, body: impl Into<Body>) -> Request<Body> {
    Request::post(server.url("/orders"))
        .body(body.into())
        .unwrap()
}

#[tokio::test]
async fn a_goaway_below_the_stream_is_not_sent_while_the_client_is_still_writing() {
    let server = server(ConnectionAction::go_away(0)).await;
    let client = client(&server);
    let body = Bytes::from(vec![7u8; BIG]);

    let res = tokio::time::timeout(BOUND, client.send(post(&server, body)))
        .await
        .expect("bounded")
        .expect("retried on a new connection");
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), Version::HTTP_2);
    assert_eq!(Attempts::of(res.extensions()), 2);
    assert_eq!(server.connections(), 2);
    // Processed once: by the second connection.
    let seen = server.requests_to("/orders");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body.len(), BIG);
}

#[tokio::test]
async fn a_goaway_read_in_time_is_not_sent_too() {
    // A small body: the client is not writing when the GOAWAY comes, and
    // reads it before the reset.
    let server = server(ConnectionAction::go_away(0)).await;
    let client = client(&server);
    let res = tokio::time::timeout(BOUND, client.send(post(&server, "{}")))
        .await
        .expect("bounded")
        .expect("retried on a new connection");
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 2);
    assert_eq!(server.requests_to("/orders").len(), 1);
}

#[tokio::test]
async fn a_goaway_that_covers_the_stream_then_a_reset_may_have_processed_it() {
    // Control: last stream id 1 is this request's stream, which the server
    // may have processed; the reset that follows proves nothing more.
    let server = server(ConnectionAction::go_away(1)).await;
    let client = client(&server);
    let body = Bytes::from(vec![7u8; BIG]);

    let err = tokio::time::timeout(BOUND, client.send(post(&server, body)))
        .await
        .expect("bounded")
        .expect_err("not retried");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
    assert_eq!(err.retry_stop(), Some(RetryStop::NotEligible), "{err}");
    assert_eq!(Attempts::of(err.extensions()), 1);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn an_http1_reset_after_the_server_read_the_request_may_have_processed_it() {
    // Control, HTTP/1.1: the server read the whole request, then reset the
    // connection without a byte of response. Nothing proves it did not act
    // on it.
    let server = FaultServer::builder()
        .route("/orders", [Action::reset()])
        .start()
        .await;
    let client = client(&server);
    let err = tokio::time::timeout(BOUND, client.send(post(&server, "{}")))
        .await
        .expect("bounded")
        .expect_err("not retried");
    assert_eq!(err.kind(), ErrorKind::Transport, "{err}");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
    assert_eq!(err.retry_stop(), Some(RetryStop::NotEligible), "{err}");
    assert_eq!(server.requests_to("/orders").len(), 1);
}

/// rebound's layers over a bare hyper-util client (DESIGN §1, principle
/// 9): the `GOAWAY` below the stream reaches the classifier as a foreign
/// `hyper::Error` with an `h2::Error` inside, and is `NotSent` there too.
#[tokio::test]
async fn over_a_bare_hyper_util_client_a_goaway_below_the_stream_is_not_sent() {
    use http_body_util::Full;
    use hyper_util::client::legacy::Client as HyperClient;
    use hyper_util::rt::TokioExecutor;
    use rebound::rebound_hyper::connect::{tls_config, Connector};
    use rebound::{BackoffLayer, ClassifyLayer, HttpClassifier, RetryLayer, RetryPolicy};
    use tower::{ServiceBuilder, ServiceExt};

    let server = server(ConnectionAction::go_away(0)).await;
    let tls = tls_config(&TlsRoots::Custom(server.root_store().unwrap()), true).unwrap();
    let bare: HyperClient<_, Full<Bytes>> =
        HyperClient::builder(TokioExecutor::new()).build(Connector::http(tls));
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
        .layer(BackoffLayer::new(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(5),
        )))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(bare);
    let req = Request::post(server.url("/orders"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = tokio::time::timeout(BOUND, svc.oneshot(req))
        .await
        .expect("bounded")
        .expect("retried on a new connection");
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 2);
    assert_eq!(server.requests_to("/orders").len(), 1);
}
