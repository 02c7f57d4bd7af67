//! `FallbackLayer` over `tower::service_fn`, on paused time: only listed
//! routes, only after a retryable failure, no credential across hosts.
#![cfg(all(feature = "fallback", feature = "retry"))]
#![allow(clippy::type_complexity)]

use rebound_core::ErrorKind;
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
    assert_eq!(served.port, 443, "the scheme's port when the URL has none");
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
    assert!(matches!(
        FallbackLayer::try_new([]).unwrap_err().kind(),
        ErrorKind::Config
    ));
    for bad in [
        "/v1",
        "secondary.example",
        "https://u:p@secondary.example",
        "https://s.example/?k=v",
    ] {
        let e = FallbackLayer::try_new([Route::base_url(bad)]).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Config), "{bad}");
        assert!(!e.to_string().contains("u:p"), "{e}");
    }
}

#[test]
#[should_panic(expected = "FallbackLayer::new")]
fn new_panics_naming_itself() {
    let _ = FallbackLayer::new([]);
}

// ===== what a route never receives =====

/// The head of each request the service saw: its URI and headers. The host
/// `primary.example` answers 503, any other 200.
fn heads() -> (
    Arc<Mutex<Vec<(String, http::HeaderMap)>>>,
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
            let primary = req.uri().host() == Some("primary.example");
            seen.lock()
                .unwrap()
                .push((req.uri().to_string(), req.headers().clone()));
            let mut res = Response::new(Full::new(Bytes::new()));
            if primary {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            async move { Ok::<_, BoxError>(res) }
        })
    };
    (seen, svc)
}

/// One attempt on the primary, then `layer`'s routes; what each saw.
async fn through(layer: FallbackLayer, req: Request<B>) -> Vec<(String, http::HeaderMap)> {
    let (seen, inner) = heads();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(1)))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "a route served");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "the primary, then the route");
    seen
}

fn get(url: &str) -> http::request::Builder {
    Request::get(url).header("idempotency-key", "k1")
}

fn secondary() -> FallbackLayer {
    FallbackLayer::new([Route::base_url("https://secondary.example")])
}

/// Every header of the request, secret or not.
const HEADERS: [(&str, bool); 14] = [
    ("authorization", true),
    ("proxy-authorization", true),
    ("cookie", true),
    ("x-api-key", true),
    ("api-key", true),
    ("x-goog-api-key", true),
    ("x-amz-security-token", true),
    // Caught only by the name rule.
    ("x-session-token", true),
    ("x-client-secret", true),
    ("x-upstream-auth", true),
    // Harmless.
    ("accept", false),
    ("x-request-id", false),
    ("x-model", false),
    ("idempotency-key", false),
];

fn with_every_header(mut b: http::request::Builder) -> Request<B> {
    for (name, _) in HEADERS {
        b = b.header(name, format!("primary-{name}"));
    }
    // Repeated: every value goes.
    b = b.header("x-api-key", "primary-second-key");
    b.body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_secret_header_reaches_a_route_by_default() {
    let seen = through(
        secondary(),
        with_every_header(get("https://primary.example/v1")),
    )
    .await;
    let (primary, route) = (&seen[0].1, &seen[1].1);
    let deny = rebound_core::redact::HeaderDenyList::default();
    for (name, secret) in HEADERS {
        assert!(primary.contains_key(name), "the primary gets {name}");
        assert_eq!(route.contains_key(name), !secret, "{name} at the route");
        // One list: what the trace never shows is what no route gets.
        let h = http::HeaderName::from_static(name);
        assert_eq!(deny.contains(&h), secret, "{name} on the deny-list");
    }
    assert_eq!(primary.get_all("x-api-key").iter().count(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn secret_query_parameters_never_reach_a_route() {
    for (url, at_route) in [
        // No query; nothing to take.
        ("https://primary.example/v1", "https://secondary.example/v1"),
        ("https://primary.example/", "https://secondary.example/"),
        // Only secret parameters: no `?` left.
        (
            "https://primary.example/v1?api_key=s3cret",
            "https://secondary.example/v1",
        ),
        (
            "https://primary.example/v1?key=a&access_token=b&X-Amz-Signature=c&sig=d",
            "https://secondary.example/v1",
        ),
        (
            "https://primary.example?token=t",
            "https://secondary.example/",
        ),
        // The rest in its order and its encoding.
        (
            "https://primary.example/v1?api_key=s3cret&page=2",
            "https://secondary.example/v1?page=2",
        ),
        (
            "https://primary.example/v1?q=a%20b+c&apiKey=s&sort=-date&page=2",
            "https://secondary.example/v1?q=a%20b+c&sort=-date&page=2",
        ),
        // Encoded names, matched decoded.
        (
            "https://primary.example/v1?api%5Fkey=s&%74oken=t&page=2",
            "https://secondary.example/v1?page=2",
        ),
        // Repeated parameters: every one goes.
        (
            "https://primary.example/v1?token=a&page=2&token=b&tag=x&tag=y",
            "https://secondary.example/v1?page=2&tag=x&tag=y",
        ),
        // Empty values and bare names.
        (
            "https://primary.example/v1?password=&page=&token&flag",
            "https://secondary.example/v1?page=&flag",
        ),
        // A secret behind `;`, which some servers read as a separator:
        // its whole `&` pair goes.
        (
            "https://primary.example/v1?page=2;access_token=s3cret&q=1",
            "https://secondary.example/v1?q=1",
        ),
        // A secret-looking value under a harmless name stays (a value is
        // not a name).
        (
            "https://primary.example/v1?q=api_key%3Dx",
            "https://secondary.example/v1?q=api_key%3Dx",
        ),
        // An empty query stays empty.
        (
            "https://primary.example/v1?",
            "https://secondary.example/v1?",
        ),
    ] {
        let req = get(url).body(Full::new(Bytes::new())).unwrap();
        let seen = through(secondary(), req).await;
        let whole = url.parse::<http::Uri>().unwrap().to_string();
        assert_eq!(seen[0].0, whole, "the primary gets the whole query");
        assert_eq!(seen[1].0, at_route, "{url}");
    }
    // Behind a route's path prefix too.
    let req = get("https://primary.example/v1?session_id=s&page=2")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let layer = FallbackLayer::new([Route::base_url("https://secondary.example/eu")]);
    let seen = through(layer, req).await;
    assert_eq!(seen[1].0, "https://secondary.example/eu/v1?page=2");
    let req = get("https://primary.example/v1?key=k")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let layer = FallbackLayer::new([Route::base_url("https://secondary.example/eu")]);
    let seen = through(layer, req).await;
    assert_eq!(seen[1].0, "https://secondary.example/eu/v1");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rewrite_sets_its_own_credentials_after_the_strip() {
    let route = Route::base_url("https://secondary.example").rewrite(|parts| {
        parts
            .headers
            .insert("x-api-key", HeaderValue::from_static("secondary-key"));
        parts.headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer secondary"),
        );
        let pq = parts.uri.path_and_query().unwrap().as_str();
        let sep = if pq.contains('?') { '&' } else { '?' };
        parts.uri = format!("https://secondary.example{pq}{sep}key=secondary-qk")
            .parse()
            .unwrap();
    });
    let req = with_every_header(get("https://primary.example/v1?key=primary-qk&page=2"));
    let seen = through(FallbackLayer::new([route]), req).await;
    let route = &seen[1].1;
    assert_eq!(
        seen[1].0,
        "https://secondary.example/v1?page=2&key=secondary-qk"
    );
    let values: Vec<_> = route.get_all("x-api-key").iter().collect();
    assert_eq!(
        values,
        ["secondary-key"],
        "the rewrite's, never the primary's"
    );
    assert_eq!(route["authorization"], "Bearer secondary");
    assert!(!route.contains_key("cookie"));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_opt_outs_are_explicit() {
    use rebound_core::redact::HeaderDenyList;
    // Kept: named headers and parameters go to every route.
    let layer = secondary()
        .keep_headers([http::header::AUTHORIZATION])
        .keep_query_params(["author"]);
    let req = with_every_header(get("https://primary.example/v1?author=ann&token=t&page=2"));
    let seen = through(layer, req).await;
    let route = &seen[1].1;
    assert_eq!(seen[1].0, "https://secondary.example/v1?author=ann&page=2");
    assert_eq!(route["authorization"], "primary-authorization");
    assert!(!route.contains_key("x-api-key") && !route.contains_key("cookie"));

    // Added: more names are stripped, the secret ones still are; an
    // explicit strip beats a keep.
    let layer = secondary()
        .strip_headers([http::HeaderName::from_static("x-model")])
        .strip_query_params(["tenant"])
        .keep_headers([http::HeaderName::from_static("x-model")]);
    let req = with_every_header(get("https://primary.example/v1?tenant=acme&key=k&page=2"));
    let seen = through(layer, req).await;
    let route = &seen[1].1;
    assert_eq!(seen[1].0, "https://secondary.example/v1?page=2");
    assert!(!route.contains_key("x-model"));
    assert!(!route.contains_key("authorization") && !route.contains_key("x-session-token"));
    assert!(route.contains_key("accept"));

    // Replaced: a list without the name rule forwards what only the rule
    // caught; the credential headers stay on every list.
    let layer = secondary().secret_headers(HeaderDenyList::minimal());
    let seen = through(layer, with_every_header(get("https://primary.example/v1"))).await;
    let route = &seen[1].1;
    assert!(route.contains_key("x-session-token") && route.contains_key("x-api-key"));
    for name in rebound_core::redact::ALWAYS_SENSITIVE {
        assert!(!route.contains_key(&name), "{name}");
    }
}

/// A request's own attempt count (`MaxAttempts`) holds on every route,
/// not only the primary's (issue 20).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_requests_own_attempt_count_holds_on_the_alternate_route_too() {
    let (seen, inner) = server(503);
    let mut svc = stack!(
        FallbackLayer::new([Route::base_url("https://primary.example/again")]),
        inner
    );
    let mut r = req();
    r.extensions_mut().insert(rebound_core::MaxAttempts(2));
    let res = svc.ready().await.unwrap().call(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let seen = seen.lock().unwrap();
    // 2 on the primary, 2 on the route (the policy's 3 would make 6).
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen[2..].iter().all(|s| s.uri.contains("/again/")));
}
