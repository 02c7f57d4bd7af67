//! `FallbackLayer` over `tower::service_fn`, on paused time: only listed
//! routes, only after a retryable failure, no credential across hosts.
#![cfg(all(feature = "fallback", feature = "retry"))]
#![allow(clippy::type_complexity)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use rebound_core::classify::{ClassifyLayer, HttpClassifier};
use rebound_core::fallback::{FallbackLayer, Route, Served};
use rebound_core::retry::{RetryBudget, RetryLayer, RetryPolicy};
use rebound_core::{Attempts, BoxError, Deadline, RetryStop};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

type B = Full<Bytes>;

#[derive(Debug, Clone)]
struct Seen {
    uri: String,
    auth: Option<String>,
    model: Option<String>,
    body: Bytes,
}

/// Answers `primary` on host `primary.example`, 200 elsewhere.
fn server(
    primary: u16,
) -> (
    Arc<Mutex<Vec<Seen>>>,
    impl Service<
            Request<B>,
            Response = Response<B>,
            Error = BoxError,
            Future = impl std::future::Future<Output = Result<Response<B>, BoxError>> + Send,
        > + Clone
        + Send
        + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = {
        let seen = seen.clone();
        tower::service_fn(move |req: Request<B>| {
            let seen = seen.clone();
            async move {
                let h = |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
                let (auth, model) = (h("authorization"), h("x-model"));
                let uri = req.uri().to_string();
                let body = http_body_util::BodyExt::collect(req.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                seen.lock().unwrap().push(Seen {
                    uri: uri.clone(),
                    auth,
                    model,
                    body,
                });
                let mut res = Response::new(Full::new(Bytes::new()));
                if uri.contains("primary.example") {
                    *res.status_mut() = StatusCode::from_u16(primary).unwrap();
                }
                Ok::<_, BoxError>(res)
            }
        })
    };
    (seen, svc)
}

fn req() -> Request<B> {
    Request::post("https://primary.example/v1/chat?x=1")
        .header("authorization", "Bearer primary-secret")
        .header("idempotency-key", "k1")
        .header("x-model", "big")
        .body(Full::new(Bytes::from_static(b"prompt")))
        .unwrap()
}

macro_rules! stack {
    ($layer:expr, $inner:expr) => {
        ServiceBuilder::new()
            .layer($layer)
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service($inner)
    };
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn primary_503_times_attempts_then_the_secondary_serves_marked() {
    let (seen, inner) = server(503);
    let mut svc = stack!(
        FallbackLayer::new([Route::base_url("https://secondary.example/eu")]),
        inner
    );
    let res = svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let served = res.extensions().get::<Served>().unwrap();
    assert_eq!(served.route, 1);
    assert_eq!(&*served.host, "secondary.example");
    assert_eq!(Attempts::of(res.extensions()), 1, "the route's own loop");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    assert!(seen[..3].iter().all(|s| s.uri.contains("primary.example")));
    assert_eq!(seen[3].uri, "https://secondary.example/eu/v1/chat?x=1");
    assert_eq!(seen[3].body, Bytes::from_static(b"prompt"));
    assert_eq!(seen[3].auth, None, "no Authorization across hosts");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn never_after_a_fatal_4xx() {
    for code in [400, 401, 403, 404, 422] {
        let (seen, inner) = server(code);
        let mut svc = stack!(
            FallbackLayer::new([Route::base_url("https://secondary.example")]),
            inner
        );
        let res = svc.ready().await.unwrap().call(req()).await.unwrap();
        assert_eq!(res.status().as_u16(), code);
        assert!(res.extensions().get::<Served>().is_none());
        assert_eq!(seen.lock().unwrap().len(), 1, "{code}: no fallback");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_rewrite_may_set_its_own_credential_and_model() {
    let (seen, inner) = server(503);
    let route = Route::base_url("https://secondary.example").rewrite(|parts| {
        parts.headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer secondary"),
        );
        parts
            .headers
            .insert("x-model", HeaderValue::from_static("small"));
    });
    let mut svc = stack!(FallbackLayer::new([route]), inner);
    let res = svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].auth.as_deref(), Some("Bearer primary-secret"));
    assert_eq!(seen[3].auth.as_deref(), Some("Bearer secondary"));
    assert_eq!(seen[3].model.as_deref(), Some("small"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn routes_in_order_and_nothing_outside_the_list() {
    let (seen, inner) = server(503);
    // The first route is down too (its host gets 503 by the same rule).
    let mut svc = stack!(
        FallbackLayer::new([
            Route::base_url("https://primary.example/b"),
            Route::base_url("https://third.example"),
        ]),
        inner
    );
    let res = svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(res.extensions().get::<Served>().unwrap().route, 2);
    let seen = seen.lock().unwrap();
    let hosts: Vec<_> = seen
        .iter()
        .map(|s| s.uri.split('/').nth(2).unwrap().to_owned())
        .collect();
    assert!(hosts
        .iter()
        .all(|h| h == "primary.example" || h == "third.example"));
    assert_eq!(seen.len(), 7);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_shared_budget_bounds_fallbacks() {
    let (seen, inner) = server(503);
    let budget = Arc::new(RetryBudget::new(0.1, Duration::from_secs(10), 0));
    let mut svc = stack!(
        FallbackLayer::new([Route::base_url("https://secondary.example")]).budget(budget),
        inner
    );
    let res = svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.extensions().get::<Served>().is_none());
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Attempts)
    );
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_fallback_once_the_deadline_has_passed() {
    let (seen, inner) = server(503);
    let slow = tower::service_fn(move |r: Request<B>| {
        let mut inner = inner.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            inner.ready().await?.call(r).await
        }
    });
    let mut svc = stack!(
        FallbackLayer::new([Route::base_url("https://secondary.example")]),
        slow
    );
    let mut r = req();
    r.extensions_mut()
        .insert(Deadline(Instant::now() + Duration::from_millis(250)));
    let _ = svc.ready().await.unwrap().call(r).await;
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .all(|s| s.uri.contains("primary.example")));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn never_for_a_write_the_loop_may_not_send_again() {
    // A POST without an idempotency key got a 503 (maybe processed): the
    // retry loop stops (`NotEligible`), and so must the fallback.
    let (seen, inner) = server(503);
    let mut svc = stack!(
        FallbackLayer::new([Route::base_url("https://secondary.example")]),
        inner
    );
    let mut r = req();
    r.headers_mut().remove("idempotency-key");
    let res = svc.ready().await.unwrap().call(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotEligible)
    );
    assert!(res.extensions().get::<Served>().is_none());
    assert_eq!(seen.lock().unwrap().len(), 1, "sent once, nowhere else");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_last_outcome_is_let_go_before_the_next_route() {
    // A concurrency limit of one below the fallback: the primary's 503
    // body holds the only permit until it is dropped, so a fallback that
    // kept it across the secondary's call would wait for ever.
    let inner = tower::service_fn(|req: Request<B>| async move {
        let primary = req.uri().host() == Some("primary.example");
        let mut res = Response::new(Full::new(Bytes::from_static(b"busy")));
        if primary {
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        Ok::<_, BoxError>(res)
    });
    let mut svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(
            "https://secondary.example",
        )]))
        .layer(rebound_core::limit::ConcurrencyLimitLayer::new(1))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(1)))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let call = svc.ready().await.unwrap().call(req());
    let res = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the secondary got the permit")
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Served>().unwrap().route, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn nothing_new_is_sent_once_a_shutdown_has_begun() {
    // One attempt, so the loop stops on its own (no wait to cut short),
    // with a retryable 503, after the shutdown began.
    let (seen, inner) = server(503);
    let mut svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(
            "https://secondary.example",
        )]))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(1)))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let closing = rebound_core::Closing::new();
    closing.close();
    let call = svc.ready().await.unwrap().call(req());
    let res = closing.scope(call).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.extensions().get::<Served>().is_none());
    assert_eq!(seen.lock().unwrap().len(), 1, "the primary only");
}

#[test]
fn an_empty_list_or_a_relative_route_is_rejected() {
    assert!(FallbackLayer::try_new([]).unwrap_err().is_config());
    for bad in [
        "/v1",
        "secondary.example",
        "https://u:p@secondary.example",
        "https://s.example/?k=v",
    ] {
        let e = FallbackLayer::try_new([Route::base_url(bad)]).unwrap_err();
        assert!(e.is_config(), "{bad}");
        assert!(!e.to_string().contains("u:p"), "{e}");
    }
}

#[test]
#[should_panic(expected = "FallbackLayer::new")]
fn new_panics_naming_itself() {
    let _ = FallbackLayer::new([]);
}
