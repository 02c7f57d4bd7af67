//! The ready-made client with its side-effect options, over real sockets:
//! `ClientBuilder::fallback` (alternate routes inside the client, under its
//! one deadline and retry budget) and `ClientBuilder::reconcile` (a status
//! check before a maybe-processed write is sent again), through `send` and
//! through the JSON helpers.
#![allow(clippy::type_complexity)]

use rebound::ErrorKind;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use rebound::fallback::{FallbackLayer, Route, Served};
use rebound::reconcile::{Check, OperationId, ReconcileLayer, Reconciled};
use rebound::retry::RetryBudget;
use rebound::{Attempts, Backoff, Body, BoxError, Client, ClientBody, ClientBuilder, TimeoutStage};
use rebound_test::fault::{refused_addr, Action, FaultServer};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Every test ends well within this, or fails.
const BOUND: Duration = Duration::from_secs(20);

fn fast() -> ClientBuilder {
    Client::builder().backoff(Backoff::exponential(
        Duration::from_millis(1),
        Duration::from_millis(10),
    ))
}

async fn bounded<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(BOUND, fut)
        .await
        .expect("ends within the bound")
}

async fn body_of(res: Response<ClientBody>) -> bytes::Bytes {
    http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes()
}

#[derive(Serialize)]
struct NewOrder<'a> {
    item: &'a str,
}

#[derive(Deserialize, Debug, PartialEq)]
struct Order {
    id: u64,
}

// ===== fallback =====

fn chat(url: String) -> Request<Body> {
    // No Idempotency-Key of the caller's: the client's layer adds one.
    Request::post(url)
        .header("authorization", "Bearer primary-secret")
        .header("content-type", "application/json")
        .body(Body::from("{\"model\":\"big\"}"))
        .unwrap()
}

fn to(server: &FaultServer) -> FallbackLayer {
    FallbackLayer::new([Route::base_url(&server.url(""))])
}

#[tokio::test]
async fn fallback_after_503_on_every_attempt_the_secondary_serves_without_authorization() {
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
        .fallback(to(&secondary))
        .build()
        .unwrap();

    let res = bounded(client.send(chat(primary.url("/v1/chat"))))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let served = res.extensions().get::<Served>().unwrap().clone();
    assert_eq!(served.route, 1);
    assert_eq!(&*served.host, "127.0.0.1");
    // The port tells two routes on one host apart (issue 20).
    assert_eq!(served.port, secondary.addr().port());
    assert_eq!(&body_of(res).await[..], b"ok");

    let first = primary.requests_to("/v1/chat");
    assert_eq!(first.len(), 3, "the primary's whole retry loop first");
    assert_eq!(
        first[0].header("authorization"),
        Some("Bearer primary-secret")
    );
    let got = secondary.requests_to("/v1/chat");
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header("authorization"),
        None,
        "no credential across hosts"
    );
    // The same body, and the same key the primary's attempts carried.
    assert_eq!(&got[0].body[..], b"{\"model\":\"big\"}");
    let key = first[0]
        .header("idempotency-key")
        .expect("the client's key");
    assert!(first
        .iter()
        .all(|r| r.header("idempotency-key") == Some(key)));
    assert_eq!(got[0].header("idempotency-key"), Some(key));
}

#[tokio::test]
async fn fallback_never_after_a_401() {
    let primary = FaultServer::builder()
        .route("/v1/chat", [Action::status(401)])
        .start()
        .await;
    let secondary = FaultServer::builder().start().await;
    let client = fast().fallback(to(&secondary)).build().unwrap();

    let res = bounded(client.send(chat(primary.url("/v1/chat"))))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(res.extensions().get::<Served>().is_none());
    assert_eq!(primary.request_count(), 1);
    assert_eq!(
        secondary.request_count(),
        0,
        "nothing reached the secondary"
    );
}

#[tokio::test]
async fn fallback_spends_the_client_retry_budget() {
    let primary = FaultServer::builder()
        .default(Action::status(503))
        .start()
        .await;
    let secondary = FaultServer::builder().start().await;
    // Two retries per request: the primary's loop takes both, none is left
    // for a fallback (the layer has no budget of its own).
    let budget = Arc::new(RetryBudget::new(2.0, Duration::from_secs(10), 0));
    let client = fast()
        .max_attempts(3)
        .circuit_breaker(None)
        .retry_budget(budget.clone())
        .fallback(to(&secondary))
        .build()
        .unwrap();

    let res = bounded(client.send(chat(primary.url("/v1/chat"))))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.extensions().get::<Served>().is_none());
    assert_eq!(primary.request_count(), 3);
    assert_eq!(secondary.request_count(), 0, "the budget refused it");
    assert_eq!(budget.remaining(), 0);
}

#[tokio::test]
async fn fallback_a_primary_hanging_past_the_total_leaves_no_time_for_the_secondary() {
    let primary = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    let secondary = FaultServer::builder().start().await;
    let total = Duration::from_millis(600);
    let client = fast()
        .total_timeout(total)
        .fallback(to(&secondary))
        .build()
        .unwrap();

    let start = Instant::now();
    let err = bounded(client.send(chat(primary.url("/v1/chat"))))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline), "{err}");
    assert!(
        took >= total && took < total + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(primary.request_count(), 1);
    assert_eq!(secondary.request_count(), 0, "no time was left");
}

#[tokio::test]
async fn fallback_a_route_is_asked_while_time_remains_and_cut_at_the_deadline() {
    let primary = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    let secondary = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    // The primary's two attempts take ~800 ms of the 1 s; the secondary
    // gets what is left, and is cut at the client's deadline.
    let total = Duration::from_secs(1);
    let client = fast()
        .total_timeout(total)
        .attempt_timeout(Duration::from_millis(400))
        .max_attempts(2)
        .circuit_breaker(None)
        .fallback(to(&secondary))
        .build()
        .unwrap();

    let start = Instant::now();
    let err = bounded(client.send(chat(primary.url("/v1/chat"))))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline), "{err}");
    assert_eq!(err.extensions().get::<Served>().map(|s| s.route), Some(1));
    assert!(
        took >= total && took < total + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(primary.request_count(), 2);
    assert_eq!(
        secondary.request_count(),
        1,
        "asked once, while time was left"
    );
}

#[tokio::test]
async fn fallback_post_json_sends_the_same_body_and_key_to_the_secondary() {
    let primary = FaultServer::builder()
        .default(Action::status(503))
        .start()
        .await;
    let secondary = FaultServer::builder()
        .route("/orders", [Action::status(201).body("{\"id\":8}")])
        .start()
        .await;
    let client = fast()
        .max_attempts(2)
        .circuit_breaker(None)
        .fallback(to(&secondary))
        .build()
        .unwrap();

    let order: Order = bounded(client.post_json(primary.url("/orders"), &NewOrder { item: "tea" }))
        .await
        .unwrap();
    assert_eq!(order, Order { id: 8 });
    let first = primary.requests_to("/orders");
    let got = secondary.requests_to("/orders");
    assert_eq!((first.len(), got.len()), (2, 1));
    assert_eq!(&got[0].body[..], b"{\"item\":\"tea\"}");
    assert_eq!(got[0].body, first[0].body);
    assert_eq!(got[0].header("content-type"), Some("application/json"));
    let key = first[0]
        .header("idempotency-key")
        .expect("the client's key");
    assert_eq!(got[0].header("idempotency-key"), Some(key));
}

// ===== reconcile =====

/// The status check: `GET {base}/operations/{id}` through `client`,
/// recording each id it is asked about.
fn status_check(
    client: Client,
    base: String,
    asked: Arc<Mutex<Vec<String>>>,
) -> ReconcileLayer<
    impl tower::Service<
            OperationId,
            Response = Check<Response<ClientBody>>,
            Error = BoxError,
            Future = impl Future<Output = Result<Check<Response<ClientBody>>, BoxError>> + Send,
        > + Clone
        + Send
        + Sync
        + 'static,
> {
    ReconcileLayer::new(tower::service_fn(move |id: OperationId| {
        asked.lock().unwrap().push(id.as_str().to_owned());
        let (client, url) = (client.clone(), format!("{base}/operations/{id}"));
        async move {
            let res = client.get(url).await?;
            Ok::<_, BoxError>(match res.status() {
                StatusCode::OK => Check::Finished(res),
                StatusCode::NOT_FOUND => Check::NotFound,
                _ => Check::Unknown,
            })
        }
    }))
}

fn order(url: String) -> Request<Body> {
    Request::post(url)
        .header("content-type", "application/json")
        .body(Body::from("{\"item\":1}"))
        .unwrap()
}

/// A shop whose every POST /orders is processed and then reset before the
/// answer (the client would send it three times without a check).
async fn shop_that_resets() -> FaultServer {
    FaultServer::builder()
        .route(
            "/orders",
            [Action::reset(), Action::reset(), Action::reset()],
        )
        .start()
        .await
}

#[tokio::test]
async fn reconcile_processed_then_reset_asks_the_check_once_and_sends_once() {
    let shop = shop_that_resets().await;
    let status = FaultServer::builder()
        .default(Action::status(200).body("{\"order\":1}"))
        .start()
        .await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let check = status_check(fast().build().unwrap(), status.url(""), asked.clone());
    let client = fast().max_attempts(3).reconcile(check).build().unwrap();

    let res = bounded(client.send(order(shop.url("/orders"))))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let posts = shop.requests_to("/orders");
    assert_eq!(posts.len(), 1, "created exactly once");
    let key = posts[0].header("idempotency-key").unwrap().to_owned();
    assert_eq!(
        res.extensions().get::<Reconciled>().unwrap().id.as_str(),
        key,
        "reconciled by the request's own key"
    );
    assert_eq!(Attempts::of(res.extensions()), 1, "no second write");
    assert_eq!(&body_of(res).await[..], b"{\"order\":1}");
    assert_eq!(*asked.lock().unwrap(), vec![key.clone()], "asked once");
    assert_eq!(status.requests_to(&format!("/operations/{key}")).len(), 1);
}

#[tokio::test]
async fn reconcile_not_found_lets_the_retry_go_ahead_with_the_same_key() {
    let shop = FaultServer::builder()
        .route(
            "/orders",
            [Action::reset(), Action::status(201).body("made")],
        )
        .start()
        .await;
    let status = FaultServer::builder()
        .default(Action::status(404))
        .start()
        .await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let check = status_check(fast().build().unwrap(), status.url(""), asked.clone());
    let client = fast().reconcile(check).build().unwrap();

    let res = bounded(client.send(order(shop.url("/orders"))))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(res.extensions().get::<Reconciled>().is_none());
    assert_eq!(Attempts::of(res.extensions()), 2);
    let posts = shop.requests_to("/orders");
    assert_eq!(posts.len(), 2);
    assert_eq!(
        posts[0].header("idempotency-key"),
        posts[1].header("idempotency-key")
    );
    assert_eq!(asked.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn reconcile_a_refused_connection_is_retried_without_a_check() {
    let refused = refused_addr().unwrap();
    let status = FaultServer::builder().start().await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let check = status_check(fast().build().unwrap(), status.url(""), asked.clone());
    let client = fast().max_attempts(3).reconcile(check).build().unwrap();

    let err = bounded(client.send(order(format!("http://{refused}/orders"))))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Connect), "{err}");
    assert_eq!(err.attempts(), 3, "retried");
    assert!(asked.lock().unwrap().is_empty(), "no check");
    assert_eq!(status.request_count(), 0);
}

#[tokio::test]
async fn reconcile_a_check_that_hangs_is_ambiguous_within_its_timeout() {
    let shop = shop_that_resets().await;
    let status = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let check = status_check(fast().build().unwrap(), status.url(""), asked.clone())
        .check_timeout(Duration::from_millis(300));
    let client = fast().reconcile(check).build().unwrap();

    let start = Instant::now();
    let err = bounded(client.send(order(shop.url("/orders"))))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err.kind(), ErrorKind::Ambiguous), "{err}");
    let posts = shop.requests_to("/orders");
    assert_eq!(posts.len(), 1, "no second write");
    let key = posts[0].header("idempotency-key").unwrap();
    assert_eq!(
        err.extensions().get::<OperationId>().map(|id| id.as_str()),
        Some(key)
    );
    assert!(err.to_string().contains(key), "{err}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(asked.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn reconcile_post_json_decodes_the_checked_result() {
    let shop = shop_that_resets().await;
    let status = FaultServer::builder()
        .default(Action::status(200).body("{\"id\":8}"))
        .start()
        .await;
    let asked = Arc::new(Mutex::new(Vec::new()));
    let check = status_check(fast().build().unwrap(), status.url(""), asked.clone());
    let client = fast().reconcile(check).build().unwrap();

    let order: Order = bounded(client.post_json(shop.url("/orders"), &NewOrder { item: "tea" }))
        .await
        .unwrap();
    assert_eq!(order, Order { id: 8 });
    let posts = shop.requests_to("/orders");
    assert_eq!(posts.len(), 1, "created exactly once");
    assert_eq!(
        *asked.lock().unwrap(),
        vec![posts[0].header("idempotency-key").unwrap().to_owned()]
    );
}

/// A check answered from the caller's own records (a map standing in for a
/// database), not by another HTTP call: it sees the write's method and its
/// redacted URL (no query string, no userinfo) and answers with a body of
/// its own type, which the caller gets from `send` and the JSON helpers.
#[tokio::test]
async fn reconcile_a_check_from_memory_sees_the_write_and_answers_any_body() {
    use http_body_util::Full;
    use rebound::reconcile::Inquiry;

    let shop = shop_that_resets().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let check = {
        let seen = seen.clone();
        ReconcileLayer::with_request(tower::service_fn(move |q: Inquiry| {
            seen.lock().unwrap().push((
                q.method().clone(),
                q.url().to_string(),
                q.id().to_string(),
            ));
            async move {
                Ok::<_, BoxError>(Check::Finished(Response::new(Full::new(
                    bytes::Bytes::from_static(b"{\"id\":9}"),
                ))))
            }
        }))
    };
    let client = fast().max_attempts(3).reconcile(check).build().unwrap();

    // Through `send`: the check's body, in memory.
    let mut url = shop.url("/orders?token=s3cret");
    url = url.replacen("http://", "http://user:pw@", 1);
    let res = bounded(client.send(order(url.clone()))).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.extensions().get::<Reconciled>().is_some());
    assert_eq!(&body_of(res).await[..], b"{\"id\":9}");

    // Through a JSON helper: decoded as its `T`.
    let made: Order = bounded(client.post_json(url, &NewOrder { item: "tea" }))
        .await
        .unwrap();
    assert_eq!(made, Order { id: 9 });

    let posts = shop.requests_to("/orders");
    assert_eq!(posts.len(), 2, "each write sent once");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "asked once per write: {seen:?}");
    for ((method, shown, id), post) in seen.iter().zip(&posts) {
        assert_eq!(method, http::Method::POST);
        assert_eq!(shown, &format!("http://{}/orders", shop.addr()));
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw"),
            "{shown}"
        );
        assert_eq!(Some(id.as_str()), post.header("idempotency-key"));
    }
}

/// A hedged response streams from the transport: a check whose body is not
/// a rebound client's is refused when the client is built, not when a write
/// is ambiguous.
#[test]
fn reconcile_a_hedged_client_refuses_a_check_with_a_foreign_body() {
    use http_body_util::Full;
    use rebound::hedge::HedgePolicy;

    let check = ReconcileLayer::new(tower::service_fn(|_id: OperationId| async {
        Ok::<_, BoxError>(Check::Finished(Response::new(Full::new(
            bytes::Bytes::new(),
        ))))
    }));
    let err = Client::builder()
        .hedge(HedgePolicy::fixed(Duration::from_millis(50)))
        .reconcile(check.clone())
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("reconcile check"), "{err}");
    // Without the hedge it builds.
    Client::builder().reconcile(check).build().unwrap();
}
