//! rebound's layers over services that are not rebound's transport (issue
//! 11, "any service below"): a bare hyper-util client and tower's own
//! `Timeout` and `LoadShed`, over real sockets on 127.0.0.1. Their errors
//! are classified as well as rebound's own: a connection that never opened
//! is "not sent" (so even a POST is retried), tower's `Elapsed` is a
//! retryable headers timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use rebound::{
    Attempts, Backoff, BackoffLayer, ClassifyLayer, ErrorKind, HttpClassifier, Jitter, RetryBudget,
    RetryLayer, RetryPolicy, RetryStop, Sent, TimeoutStage, Verdict,
};
use rebound_test::fault::{refused_addr, Action, FaultServer};
use tokio::net::{TcpSocket, TcpStream};
use tower::{ServiceBuilder, ServiceExt};

/// A bound for whole calls: far above what each needs.
const BOUND: Duration = Duration::from_secs(20);

type BareClient = HyperClient<HttpConnector, Full<Bytes>>;

fn bare(connect_timeout: Option<Duration>) -> BareClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(connect_timeout);
    HyperClient::builder(TokioExecutor::new()).build(http)
}

/// Retry (3 attempts, a budget that never refuses), a 1–5 ms backoff and the
/// default classifier over `inner`, counting the calls that reach `inner`.
fn stack<S>(
    inner: S,
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = http::Response<hyper::body::Incoming>,
    Error = rebound::Error,
> + Clone
where
    S: tower::Service<Request<Full<Bytes>>, Response = http::Response<hyper::body::Incoming>>
        + Clone
        + Send
        + 'static,
    S::Error: Into<rebound::BoxError>,
    S::Future: Send + 'static,
{
    let budget = Arc::new(RetryBudget::try_new(10.0, Duration::from_secs(1), 1000).unwrap());
    ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::default().max_attempts(3).budget(budget),
        ))
        .layer(BackoffLayer::new(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(5))
                .jitter(Jitter::Full),
        ))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .map_request(move |req| {
            calls.fetch_add(1, Ordering::SeqCst);
            req
        })
        .service(inner)
}

fn post(url: String) -> Request<Full<Bytes>> {
    Request::post(url)
        .body(Full::new(Bytes::from_static(b"{\"order\":1}")))
        .unwrap()
}

#[tokio::test]
async fn a_post_to_a_refused_port_is_retried_as_not_sent() {
    let addr = refused_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = stack(bare(None), calls.clone());
    let err = tokio::time::timeout(BOUND, svc.oneshot(post(format!("http://{addr}/orders"))))
        .await
        .expect("bounded")
        .unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "every attempt reached the client"
    );
    assert_eq!(Attempts::of(err.extensions()), 3);
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert_eq!(
        err.extensions().get::<RetryStop>(),
        Some(&RetryStop::Attempts)
    );
}

/// A listener on 127.0.0.1 whose accept queue is full: a new connect gets no
/// SYN-ACK and hangs (Linux drops SYNs to a full accept queue). The
/// precondition is checked: a probe connect must hang.
async fn hanging_listener() -> (tokio::net::TcpListener, Vec<TcpStream>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind((std::net::Ipv4Addr::LOCALHOST, 0).into())
        .unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fill = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(conn)) => fill.push(conn),
            Ok(Err(e)) => panic!("filling the accept queue failed: {e}"),
            Err(_) => return (listener, fill),
        }
    }
    panic!("could not fill a loopback accept queue: connects never hang on this OS");
}

#[tokio::test]
async fn a_post_whose_connect_times_out_is_retried_as_not_sent() {
    let (listener, _fill) = hanging_listener().await;
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = stack(bare(Some(Duration::from_millis(100))), calls.clone());
    let err = tokio::time::timeout(BOUND, svc.oneshot(post(format!("http://{addr}/orders"))))
        .await
        .expect("bounded")
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(Attempts::of(err.extensions()), 3);
    assert_eq!(
        err.timeout_stage(),
        Some(TimeoutStage::Connect),
        "hyper-util's connect timeout is a connect-stage timeout: {err}"
    );
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
}

#[tokio::test]
async fn towers_timeout_under_classify_is_a_retryable_headers_timeout() {
    let server = FaultServer::builder()
        .route("/slow", [Action::never_respond(), Action::status(200)])
        .start()
        .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let timed = ServiceBuilder::new()
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(
            200,
        )))
        .service(bare(None));
    let svc = stack(timed, calls.clone());
    let req = Request::get(server.url("/slow"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = tokio::time::timeout(BOUND, svc.oneshot(req))
        .await
        .expect("bounded")
        .expect("the second attempt answers");
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 2);
    assert_eq!(server.requests_to("/slow").len(), 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn towers_timeout_does_not_make_a_keyless_post_retryable() {
    let server = FaultServer::builder()
        .route("/slow", [Action::never_respond(), Action::status(200)])
        .start()
        .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let timed = ServiceBuilder::new()
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(
            200,
        )))
        .service(bare(None));
    let svc = stack(timed, calls.clone());
    let err = tokio::time::timeout(BOUND, svc.oneshot(post(server.url("/slow"))))
        .await
        .expect("bounded")
        .unwrap_err();
    // The request may have been processed: without a key, one attempt.
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(err.timeout_stage(), Some(TimeoutStage::Headers));
    assert!(matches!(
        err.extensions().get::<Verdict>(),
        Some(Verdict::Retryable {
            sent: Sent::MaybeProcessed,
            ..
        })
    ));
}
