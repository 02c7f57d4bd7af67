//! Side effects over real sockets (issue 14, parts 1 and 2): reconciling a
//! write whose answer was lost, and falling back only where policy allows.
#![allow(clippy::type_complexity)]

use rebound::ErrorKind;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, StatusCode};
use rebound::fallback::{FallbackLayer, Route, Served};
use rebound::reconcile::{Check, OperationId, ReconcileLayer, Reconciled};
use rebound::retry::{RetryLayer, RetryPolicy};
use rebound::{Backoff, Body, BoxError, Client, ClientBuilder};
use rebound_test::fault::{refused_addr, Action, FaultServer};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

const BOUND: Duration = Duration::from_secs(20);

fn fast() -> ClientBuilder {
    Client::builder().backoff(Backoff::exponential(
        Duration::from_millis(1),
        Duration::from_millis(10),
    ))
}

/// The status check: `GET {base}/operations/{id}` through `client`.
fn status_check(
    client: Client,
    base: String,
    calls: Arc<AtomicU32>,
) -> impl Service<
    OperationId,
    Response = Check<http::Response<rebound::rebound_hyper::ClientBody>>,
    Error = BoxError,
    Future = impl std::future::Future<
        Output = Result<Check<http::Response<rebound::rebound_hyper::ClientBody>>, BoxError>,
    > + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |id: OperationId| {
        calls.fetch_add(1, Ordering::SeqCst);
        let (client, url) = (client.clone(), format!("{base}/operations/{id}"));
        async move {
            let res = client.get(url).await?;
            Ok::<_, BoxError>(match res.status() {
                StatusCode::OK => Check::Finished(res),
                StatusCode::NOT_FOUND => Check::NotFound,
                _ => Check::Unknown,
            })
        }
    })
}

fn post(url: String, key: &str) -> Request<Body> {
    Request::post(url)
        .header("idempotency-key", key)
        .body(Body::from("{\"item\":1}"))
        .unwrap()
}

/// `RetryLayer → ReconcileLayer → Client` (the client's own loop off).
macro_rules! reconciling {
    ($check:expr) => {{
        let inner = fast().max_attempts(1).build().unwrap();
        ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
            .layer($check)
            .service(inner)
    }};
}

#[tokio::test]
async fn processed_then_reset_is_reconciled_and_created_once() {
    let server = FaultServer::builder()
        .route("/orders", [Action::reset()])
        .route(
            "/operations/op-1",
            [Action::status(200).body("{\"order\":1}")],
        )
        .start()
        .await;
    let calls = Arc::new(AtomicU32::new(0));
    let checker = fast().build().unwrap();
    let mut svc = reconciling!(ReconcileLayer::new(status_check(
        checker,
        server.url(""),
        calls.clone()
    )));
    let res = tokio::time::timeout(
        BOUND,
        ServiceExt::<Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(post(server.url("/orders"), "op-1")),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<Reconciled>().unwrap().id.as_str(),
        "op-1"
    );
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"{\"order\":1}");
    assert_eq!(
        server.requests_to("/orders").len(),
        1,
        "created exactly one"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_post_that_never_arrived_is_retried_without_a_check() {
    let refused = refused_addr().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let checker = fast().build().unwrap();
    let mut svc = reconciling!(ReconcileLayer::new(status_check(
        checker,
        format!("http://{refused}"),
        calls.clone()
    )));
    let err = tokio::time::timeout(
        BOUND,
        ServiceExt::<Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(post(format!("http://{refused}/orders"), "op-2")),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Connect), "{err}");
    assert_eq!(err.attempts(), 3, "retried");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no check");
}

#[tokio::test]
async fn a_check_that_hangs_is_ambiguous_within_its_timeout() {
    let server = FaultServer::builder()
        .route("/orders", [Action::reset()])
        .route("/operations/op-3", [Action::never_respond()])
        .start()
        .await;
    let calls = Arc::new(AtomicU32::new(0));
    let checker = fast().build().unwrap();
    let mut svc =
        reconciling!(
            ReconcileLayer::new(status_check(checker, server.url(""), calls.clone()))
                .check_timeout(Duration::from_millis(300))
        );
    let start = Instant::now();
    let err = tokio::time::timeout(
        BOUND,
        ServiceExt::<Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(post(server.url("/orders"), "op-3")),
    )
    .await
    .unwrap()
    .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err.kind(), ErrorKind::Ambiguous), "{err}");
    assert!(err.to_string().contains("op-3"), "{err}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(server.requests_to("/orders").len(), 1, "no second write");
}

// ===== fallback =====

fn chat(url: String) -> Request<Body> {
    Request::post(url)
        .header("authorization", "Bearer primary-secret")
        .header("idempotency-key", "k-1")
        .body(Body::from("{\"model\":\"big\"}"))
        .unwrap()
}

#[tokio::test]
async fn primary_503_times_attempts_then_secondary_200_marked_without_authorization() {
    let primary = FaultServer::builder()
        .default(Action::status(503).body("busy"))
        .start()
        .await;
    let secondary = FaultServer::builder()
        .route("/v1/chat", [Action::status(200).body("ok")])
        .start()
        .await;
    let client = fast()
        .max_attempts(3)
        .circuit_breaker(None)
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(&secondary.url(""))]))
        .service(client);
    let res = tokio::time::timeout(
        BOUND,
        ServiceExt::<Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(chat(primary.url("/v1/chat"))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Served>().unwrap().route, 1);
    assert_eq!(primary.requests_to("/v1/chat").len(), 3);
    let got = secondary.requests_to("/v1/chat");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("authorization"), None);
    assert!(primary.requests_to("/v1/chat")[0]
        .header("authorization")
        .is_some());
}

#[tokio::test]
async fn primary_401_does_not_fall_back() {
    let primary = FaultServer::builder()
        .route("/v1/chat", [Action::status(401)])
        .start()
        .await;
    let secondary = FaultServer::builder().start().await;
    let client = fast().build().unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(&secondary.url(""))]))
        .service(client);
    let res = tokio::time::timeout(
        BOUND,
        ServiceExt::<Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(chat(primary.url("/v1/chat"))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(res.extensions().get::<Served>().is_none());
    assert_eq!(secondary.request_count(), 0);
}

#[tokio::test]
async fn the_secondary_gets_an_authorization_only_from_the_rewrite() {
    let primary = FaultServer::builder()
        .default(Action::status(503))
        .start()
        .await;
    let secondary = FaultServer::builder()
        .route("/v1/chat", [Action::status(200)])
        .start()
        .await;
    let route = Route::base_url(&secondary.url("")).rewrite(|parts| {
        parts.headers.insert(
            "authorization",
            http::HeaderValue::from_static("Bearer secondary-own"),
        );
    });
    let client = fast()
        .max_attempts(2)
        .circuit_breaker(None)
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([route]))
        .service(client);
    let res = tokio::time::timeout(
        BOUND,
        ServiceExt::<Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(chat(primary.url("/v1/chat"))),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let got = secondary.requests_to("/v1/chat");
    assert_eq!(got[0].header("authorization"), Some("Bearer secondary-own"));
}
