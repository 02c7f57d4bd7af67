//! The ready-made client's fallback over real sockets: a route never
//! receives the primary's credentials — no secret header (the redaction
//! deny-list, name rule included), no secret query parameter — unless its
//! own rewrite sets one. Two `FaultServer`s: the primary answers 503 to
//! every attempt, the secondary records what reached it.

use std::future::Future;
use std::time::Duration;

use http::{HeaderValue, Request, StatusCode};
use rebound::fallback::{FallbackLayer, Route, Served};
use rebound::{Backoff, Body, Client};
use rebound_test::fault::{Action, FaultServer, RecordedRequest};

/// Every test ends well within this, or fails.
const BOUND: Duration = Duration::from_secs(20);

/// Headers no route may receive, and headers every route does.
const HARMLESS: [(&str, &str); 2] = [("x-request-id", "req-1"), ("accept", "application/json")];

async fn bounded<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(BOUND, fut)
        .await
        .expect("ends within the bound")
}

struct Seen {
    primary: Vec<RecordedRequest>,
    secondary: RecordedRequest,
}

/// Sends `req` (a path and query on the primary, with `headers`) through a
/// default client whose fallback is `route` (on the secondary); returns
/// what each server received.
async fn fall_back(
    path_and_query: &str,
    headers: &[(&str, &str)],
    route: impl FnOnce(&FaultServer) -> Route,
) -> Seen {
    let primary = FaultServer::builder()
        .default(Action::status(503).body("busy"))
        .start()
        .await;
    let secondary = FaultServer::builder()
        .default(Action::status(200).body("ok"))
        .start()
        .await;
    let client = Client::builder()
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .max_attempts(2)
        .circuit_breaker(None)
        .fallback(FallbackLayer::new([route(&secondary)]))
        .build()
        .unwrap();
    let mut req = Request::get(primary.url(path_and_query));
    for (name, value) in HARMLESS.iter().chain(headers) {
        req = req.header(*name, *value);
    }
    let res = bounded(client.send(req.body(Body::empty()).unwrap()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Served>().unwrap().route, 1);
    let primary = primary.requests();
    assert_eq!(primary.len(), 2, "the primary's whole retry loop first");
    let mut secondary = secondary.requests();
    assert_eq!(secondary.len(), 1);
    Seen {
        primary,
        secondary: secondary.remove(0),
    }
}

fn plain(secondary: &FaultServer) -> Route {
    Route::base_url(&secondary.url(""))
}

/// `name: value` reaches the primary on every attempt and never the
/// secondary; the harmless headers reach both.
async fn never_crosses(name: &str, value: &str) {
    let seen = fall_back("/v1/chat", &[(name, value)], plain).await;
    for got in &seen.primary {
        assert_eq!(got.header(name), Some(value), "the primary gets {name}");
    }
    assert_eq!(seen.secondary.header(name), None, "{name} crossed");
    assert!(
        !format!("{:?}", seen.secondary.headers).contains(value),
        "{name}'s value crossed"
    );
    for (name, value) in HARMLESS {
        assert_eq!(seen.secondary.header(name), Some(value), "{name}");
    }
}

#[tokio::test]
async fn cookie_never_reaches_the_secondary() {
    never_crosses("cookie", "session=primary-cookie").await;
}

#[tokio::test]
async fn x_api_key_never_reaches_the_secondary() {
    never_crosses("x-api-key", "primary-api-key").await;
}

#[tokio::test]
async fn proxy_authorization_never_reaches_the_secondary() {
    never_crosses("proxy-authorization", "Basic cHJpbWFyeTpwcm94eQ==").await;
}

#[tokio::test]
async fn authorization_never_reaches_the_secondary() {
    never_crosses("authorization", "Bearer primary-token").await;
}

#[tokio::test]
async fn a_header_the_name_rule_catches_never_reaches_the_secondary() {
    // On no list by name: caught because its name says `token`.
    never_crosses("x-session-token", "primary-session-token").await;
}

#[tokio::test]
async fn a_secret_query_parameter_never_reaches_the_secondary() {
    let seen = fall_back("/v1/items?api_key=primary-qk&page=2", &[], plain).await;
    for got in &seen.primary {
        assert_eq!(got.target, "/v1/items?api_key=primary-qk&page=2");
    }
    assert_eq!(seen.secondary.target, "/v1/items?page=2");
}

#[tokio::test]
async fn a_rewrite_gives_the_secondary_its_own_key_never_the_primarys() {
    let seen = fall_back(
        "/v1/items?key=primary-qk&page=2",
        &[("x-api-key", "primary-api-key")],
        |secondary| {
            let base = secondary.url("");
            Route::base_url(&base).rewrite(move |parts| {
                parts
                    .headers
                    .insert("x-api-key", HeaderValue::from_static("secondary-api-key"));
                let pq = parts.uri.path_and_query().unwrap().as_str();
                parts.uri = format!("{base}{pq}&key=secondary-qk").parse().unwrap();
            })
        },
    )
    .await;
    for got in &seen.primary {
        assert_eq!(got.header("x-api-key"), Some("primary-api-key"));
        assert_eq!(got.query(), Some("key=primary-qk&page=2"));
    }
    let got = &seen.secondary;
    let keys: Vec<_> = got.headers.get_all("x-api-key").iter().collect();
    assert_eq!(keys, ["secondary-api-key"]);
    assert_eq!(got.query(), Some("page=2&key=secondary-qk"));
}
