//! The client's request builder over real sockets (`FaultServer` on
//! 127.0.0.1): what the server receives, the per-request timeout and
//! attempts, the caller's idempotency key, and bad input refused before
//! anything is sent (issue 20).

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};
use http::Method;
use rebound::idempotency::IdempotencyKeyLayer;
use rebound::{
    Attempts, Backoff, Client, ClientBuilder, ErrorKind, HedgePolicy, RetryStop, SendFuture,
    TimeoutStage,
};
use rebound_test::fault::{Action, FaultServer};
use serde::Deserialize;

/// Every test ends within this, whatever the machine.
const BOUND: Duration = Duration::from_secs(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Retries without a noticeable wait.
fn builder() -> ClientBuilder {
    Client::builder().backoff(Backoff::exponential(ms(1), ms(5)))
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("the test ended within its bound")
}

#[tokio::test]
async fn method_headers_query_and_body_arrive() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::status(200))
            .start()
            .await;
        let client = builder().build().unwrap();
        let mut map = HeaderMap::new();
        map.insert("x-replaced", HeaderValue::from_static("new"));
        map.insert("x-map", HeaderValue::from_static("m"));
        let res = client
            .put(server.url("/v1/items/7?keep=1"))
            .header("x-one", "1")
            .header("x-replaced", "old")
            .headers(map)
            .query(&[("q", "a b&c"), ("lang", "fr")])
            .body("payload")
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let seen = &server.requests()[0];
        assert_eq!(seen.method, Method::PUT);
        assert_eq!(seen.path(), "/v1/items/7");
        assert_eq!(seen.query(), Some("keep=1&q=a%20b%26c&lang=fr"));
        assert_eq!(seen.header("x-one"), Some("1"));
        assert_eq!(seen.header("x-map"), Some("m"));
        let replaced: Vec<_> = seen.headers.get_all("x-replaced").iter().collect();
        assert_eq!(replaced, ["new"]);
        assert_eq!(&seen.body[..], b"payload");

        // JSON: the body and its content type.
        client
            .patch(server.url("/v1/items/7"))
            .json(&serde_json::json!({"name": "tea"}))
            .await
            .unwrap();
        let seen = &server.requests()[1];
        assert_eq!(seen.method, Method::PATCH);
        assert_eq!(seen.header("content-type"), Some("application/json"));
        assert_eq!(&seen.body[..], br#"{"name":"tea"}"#);

        // Every verb, and any method through `request`.
        client.post(server.url("/v")).await.unwrap();
        client.delete(server.url("/v")).await.unwrap();
        client.head(server.url("/v")).await.unwrap();
        client.get(server.url("/v")).await.unwrap();
        client
            .request(Method::OPTIONS, server.url("/v"))
            .await
            .unwrap();
        let methods: Vec<_> = server
            .requests_to("/v")
            .into_iter()
            .map(|r| r.method)
            .collect();
        assert_eq!(
            methods,
            [
                Method::POST,
                Method::DELETE,
                Method::HEAD,
                Method::GET,
                Method::OPTIONS
            ]
        );
    })
    .await
}

#[tokio::test]
async fn send_is_a_nameable_future_that_can_be_spawned() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::status(200).body(r#"{"id":7}"#))
            .start()
            .await;
        let client = builder().build().unwrap();
        let fut: SendFuture = client.get(server.url("/a")).send();
        let same: SendFuture = client.get(server.url("/b")).into_future();
        drop(client);
        let res = tokio::spawn(fut).await.unwrap().unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(same.await.unwrap().status(), 200);

        #[derive(Deserialize, Debug, PartialEq)]
        struct Item {
            id: u64,
        }
        let client = builder().build().unwrap();
        let item: Item = client
            .get(server.url("/c"))
            .header("x-trace", "t")
            .send_json()
            .await
            .unwrap();
        assert_eq!(item, Item { id: 7 });
        let seen = &server.requests_to("/c")[0];
        assert_eq!(seen.header("accept"), Some("application/json"));
        assert_eq!(seen.header("x-trace"), Some("t"));
    })
    .await
}

#[tokio::test]
async fn a_per_request_timeout_shortens_the_total_never_lengthens_it() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::status(200).delay(Duration::from_secs(3)))
            .start()
            .await;
        // The client's total (30 s) would wait for the slow answer.
        let client = builder().build().unwrap();
        let err = client
            .get(server.url("/slow"))
            .timeout(ms(200))
            .await
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Timeout(TimeoutStage::Deadline),
            "{err}"
        );

        // A longer one does not extend a short client total.
        let client = builder().total_timeout(ms(200)).build().unwrap();
        let err = client
            .get(server.url("/slow"))
            .timeout(Duration::from_secs(60))
            .await
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Timeout(TimeoutStage::Deadline),
            "{err}"
        );
    })
    .await
}

async fn attempts_seen(
    client: &Client,
    server: &FaultServer,
    path: &str,
    n: Option<u32>,
) -> (u32, usize) {
    let mut req = client.get(server.url(path));
    if let Some(n) = n {
        req = req.attempts(n);
    }
    let res = req.await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Attempts)
    );
    (
        Attempts::of(res.extensions()),
        server.requests_to(path).len(),
    )
}

#[tokio::test]
async fn the_attempts_override_lowers_and_raises_the_client_count() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::status(503))
            .start()
            .await;
        // The one-service stack, and the layered one (a client with a hedge).
        for client in [
            builder().max_attempts(3).build().unwrap(),
            builder()
                .max_attempts(3)
                .hedge(HedgePolicy::fixed(Duration::from_secs(10)))
                .build()
                .unwrap(),
        ] {
            let tag = if client.layers().contains(&"HedgeLayer") {
                "layered"
            } else {
                "stack"
            };
            let p = |s: &str| format!("/{tag}/{s}");
            assert_eq!(
                attempts_seen(&client, &server, &p("default"), None).await,
                (3, 3)
            );
            assert_eq!(
                attempts_seen(&client, &server, &p("once"), Some(1)).await,
                (1, 1)
            );
            assert_eq!(
                attempts_seen(&client, &server, &p("more"), Some(5)).await,
                (5, 5)
            );
        }
    })
    .await
}

#[tokio::test]
async fn the_callers_key_is_sent_on_every_attempt_of_a_retried_post() {
    bounded(async {
        let server = FaultServer::builder()
            .route("/orders", [Action::status(503), Action::status(201)])
            .route("/off", [Action::status(503), Action::status(201)])
            .route("/named", [Action::status(503), Action::status(201)])
            .start()
            .await;
        let client = builder().build().unwrap();
        let res = client
            .post(server.url("/orders"))
            .json(&serde_json::json!({"item": "tea"}))
            .idempotency_key("order-7f3a")
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let seen = server.requests_to("/orders");
        assert_eq!(seen.len(), 2);
        for r in &seen {
            assert_eq!(r.header("idempotency-key"), Some("order-7f3a"));
            assert_eq!(r.headers.get_all("idempotency-key").iter().count(), 1);
        }

        // With the client's own keys off, the caller's key still goes out
        // and makes the POST retryable.
        let client = builder().idempotency_keys(None).build().unwrap();
        let res = client
            .post(server.url("/off"))
            .idempotency_key("k-2")
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let seen = server.requests_to("/off");
        assert_eq!(seen.len(), 2);
        assert!(seen
            .iter()
            .all(|r| r.header("idempotency-key") == Some("k-2")));

        // In the header the client's layer is configured with.
        let client = builder()
            .idempotency_keys(
                IdempotencyKeyLayer::new().header_name(http::HeaderName::from_static("x-idem")),
            )
            .build()
            .unwrap();
        client
            .post(server.url("/named"))
            .idempotency_key("k-3")
            .await
            .unwrap();
        let seen = server.requests_to("/named");
        assert_eq!(seen.len(), 2);
        assert!(seen.iter().all(|r| r.header("x-idem") == Some("k-3")));
        assert!(seen.iter().all(|r| r.header("idempotency-key").is_none()));
    })
    .await
}

#[tokio::test]
async fn bad_input_is_an_invalid_request_and_nothing_is_sent() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::status(200))
            .start()
            .await;
        let client = builder().build().unwrap();
        let url = server.url("/v1/keys/abc?token=s3cret");
        let mut non_string_keys = BTreeMap::new();
        non_string_keys.insert(vec![1u8], 1u8);
        let cases = [
            (
                "header name",
                client.get(&*url).header("bad name", "s3cret").send(),
            ),
            (
                "header value",
                client.get(&*url).header("x-auth", "s3cret\n").send(),
            ),
            ("blank key", client.post(&*url).idempotency_key("  ").send()),
            (
                "invalid key",
                client.post(&*url).idempotency_key("s3cret\r").send(),
            ),
            ("zero attempts", client.get(&*url).attempts(0).send()),
            ("too many attempts", client.get(&*url).attempts(101).send()),
            (
                "zero timeout",
                client.get(&*url).timeout(Duration::ZERO).send(),
            ),
            ("json", client.post(&*url).json(&non_string_keys).send()),
            // The first bad value wins, later good ones change nothing.
            (
                "first error",
                client
                    .get(&*url)
                    .attempts(0)
                    .header("x-ok", "1")
                    .body("b")
                    .send(),
            ),
            ("url", client.get("http://exa mple.com/").send()),
        ];
        for (what, fut) in cases {
            let err = fut.await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{what}: {err}");
            assert_eq!(
                err.extensions().get::<rebound::Sent>(),
                Some(&rebound::Sent::NotSent),
                "{what}"
            );
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("s3cret"), "{what}: {shown}");
            if what != "url" {
                assert!(shown.contains("/v1/keys/abc"), "{what}: {shown}");
            }
        }
        assert_eq!(server.request_count(), 0);

        // The builder's Debug shows no header value and no query.
        let b = client.get(&*url).header("authorization", "Bearer s3cret");
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    })
    .await
}
