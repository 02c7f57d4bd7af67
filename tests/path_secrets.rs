//! Secrets in paths and headers (issue 10, item 6), over real sockets
//! through the ready-made `Client`, under a subscriber that captures every
//! span, field and event: with a path redaction set, a secret in the path
//! appears in no log line, span field or error `Display`/`Debug`; the
//! cloud-token headers and any header whose name says it holds a secret are
//! never recorded and are marked sensitive.
//!
//! Its own test binary: the tests here assert on tracing output.

use rebound::ErrorKind;
use std::borrow::Cow;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::BodyExt;
use rebound::redact::PathRedaction;
use rebound::trace::TraceLayer;
use rebound::{Backoff, Client, ClientBuilder};
use rebound_test::capture::Capture;
use rebound_test::fault::{Action, FaultServer};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tracing::Level;

/// The secret in the path.
const KEY: &str = "sk-live-Zq9xP4th";
/// The secret in the headers.
const TOKEN: &str = "tok-Hd7eR5cr3t";

fn fast() -> ClientBuilder {
    Client::builder()
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .attempt_timeout(Duration::from_millis(300))
        .body_idle_timeout(Duration::from_millis(300))
        .total_timeout(Duration::from_secs(5))
}

/// A server where `/v1/keys/KEY` answers 503 twice then 200, `/v1/keys/KEY/slow`
/// never answers, and `/v1/keys/KEY/stall` sends a head and stalls its body.
async fn server() -> FaultServer {
    FaultServer::builder()
        .route(
            &format!("/v1/keys/{KEY}"),
            [Action::status(503), Action::status(503)],
        )
        .route(
            &format!("/v1/keys/{KEY}/slow"),
            std::iter::repeat_n(Action::never_respond(), 3),
        )
        .route(&format!("/v1/keys/{KEY}/stall"), [Action::stall_body()])
        .start()
        .await
}

/// Every path of the scenario: a retried request (`retrying` at INFO), a
/// request that times out on every attempt (WARN `giving up` with the
/// error), a body that stalls after its head (WARN `response body failed`),
/// and the JSON helper's decode error made outside the stack. Returns every
/// error's `Display` and `Debug`.
async fn scenario(client: &Client, server: &FaultServer) -> Vec<String> {
    let mut texts = Vec::new();
    let res = client
        .get(server.url(&format!("/v1/keys/{KEY}?x=1")))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let err = client
        .get(server.url(&format!("/v1/keys/{KEY}/slow")))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Timeout(_)), "{err}");
    texts.push(err.to_string());
    texts.push(format!("{err:?}"));

    let res = client
        .get(server.url(&format!("/v1/keys/{KEY}/stall")))
        .await
        .unwrap();
    let err = res.into_body().collect().await.unwrap_err();
    texts.push(err.to_string());
    texts.push(format!("{err:?}"));

    // 200 with an empty body: a decode error, named outside the stack.
    let err = client
        .get_json::<serde_json::Value>(server.url(&format!("/v1/keys/{KEY}/json")))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode), "{err}");
    texts.push(err.to_string());
    texts.push(format!("{err:?}"));
    texts
}

fn assert_no_key(capture: &Capture, texts: &[String], expect_in_errors: &str) {
    let logs = capture.text();
    let leaks: Vec<&str> = logs.lines().filter(|l| l.contains(KEY)).take(5).collect();
    assert!(leaks.is_empty(), "the key is in the logs: {leaks:#?}");
    for t in texts {
        assert!(!t.contains(KEY), "an error shows the key: {t}");
        assert!(t.contains(expect_in_errors), "{t}");
    }
    // The scenario did log what would have carried the path.
    assert!(capture.count("retrying") > 0, "{logs}");
    assert!(capture.count("request failed; giving up") > 0, "{logs}");
    assert!(capture.count("response body failed") > 0, "{logs}");
}

#[tokio::test]
async fn a_path_template_keeps_the_key_out_of_spans_events_and_errors() {
    let server = server().await;
    let client = fast()
        .path_redaction(PathRedaction::templates([
            "/v1/keys/{key}",
            "/v1/keys/{key}/{op}",
        ]))
        .build()
        .unwrap();
    let capture = Capture::new();
    let texts = {
        let _guard = capture.set_default();
        scenario(&client, &server).await
    };
    assert_no_key(&capture, &texts, "/v1/keys/{key}");
    // The spans name the template.
    let span = capture.span("http.client.request").unwrap();
    assert_eq!(span.field("url.path"), Some("/v1/keys/{key}"));
    // The server still got the real path.
    assert!(server.requests()[0].path().contains(KEY));
}

#[tokio::test]
async fn with_spans_off_the_events_name_the_templated_path() {
    let server = server().await;
    let client = fast()
        .path_redaction(PathRedaction::templates([
            "/v1/keys/{key}",
            "/v1/keys/{key}/{op}",
        ]))
        .build()
        .unwrap();
    let capture = Capture::new();
    let texts = {
        let _guard = capture.set_default_at(Level::INFO);
        scenario(&client, &server).await
    };
    assert_no_key(&capture, &texts, "/v1/keys/{key}");
    let retrying = capture
        .events()
        .into_iter()
        .find(|e| e.message() == Some("retrying"))
        .unwrap();
    assert_eq!(retrying.field("url.path"), Some("/v1/keys/{key}"));
}

#[tokio::test]
async fn a_hidden_path_or_a_closure_set_on_the_trace_builder() {
    // Hidden, through `TraceLayer::builder()` and `ClientBuilder::trace`.
    let server = server().await;
    let trace = TraceLayer::builder()
        .path_redaction(PathRedaction::hidden())
        .build()
        .unwrap();
    let client = fast().trace(trace).build().unwrap();
    let capture = Capture::new();
    let texts = {
        let _guard = capture.set_default();
        scenario(&client, &server).await
    };
    assert_no_key(&capture, &texts, "/{redacted}");
    let span = capture.span("http.client.request").unwrap();
    assert_eq!(span.field("url.path"), None, "hidden: no url.path at all");

    // A closure.
    let server = self::server().await;
    let client = fast()
        .path_redaction(PathRedaction::with(|path: &str| {
            if path.starts_with("/v1/keys/") {
                Cow::Borrowed("/v1/keys/*")
            } else {
                Cow::Borrowed(path)
            }
        }))
        .build()
        .unwrap();
    let capture = Capture::new();
    let texts = {
        let _guard = capture.set_default();
        scenario(&client, &server).await
    };
    assert_no_key(&capture, &texts, "/v1/keys/*");
}

#[tokio::test]
async fn without_a_redaction_the_path_is_shown_as_before() {
    // The control: the same scenario does show the key by default, so the
    // tests above can fail.
    let server = server().await;
    let client = fast().build().unwrap();
    let capture = Capture::new();
    let texts = {
        let _guard = capture.set_default();
        scenario(&client, &server).await
    };
    assert!(capture.count(KEY) > 0);
    assert!(texts.iter().all(|t| t.contains(KEY)), "{texts:#?}");
}

// ===== headers =====

#[tokio::test]
async fn cloud_token_and_secret_named_headers_are_redacted_and_sensitive() {
    let names = [
        "x-amz-security-token",
        "x-goog-api-key",
        "x-upstream-session",
        "x-client-secret",
        "x-custom-auth",
    ];
    // Over real sockets: sent to the server, never in the logs.
    let mut action = Action::status(200);
    for name in names {
        action = action.header(name, TOKEN);
    }
    let server = FaultServer::builder()
        .route("/v1/things", [action])
        .start()
        .await;
    let client = fast().build().unwrap();
    let capture = Capture::new();
    let res = {
        let _guard = capture.set_default();
        let mut req = Request::get(server.url("/v1/things"))
            .body(rebound::Body::empty())
            .unwrap();
        for name in names {
            req.headers_mut()
                .insert(name, HeaderValue::from_static(TOKEN));
        }
        let res = client.send(req).await.unwrap();
        tracing::debug!(response = ?res, "the caller logs the response");
        res
    };
    assert_eq!(res.status(), 200);
    assert_eq!(capture.count(TOKEN), 0, "{}", capture.text());
    let seen = server.requests();
    for name in names {
        assert_eq!(seen[0].header(name), Some(TOKEN), "{name} was sent");
    }
    for name in names {
        assert!(res.headers()[name].is_sensitive(), "response {name}");
    }

    // In the stack: the request below the trace layer and the response
    // above it have them marked sensitive (Debug prints `Sensitive`, HTTP/2
    // never indexes them in HPACK).
    let svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .service(service_fn(move |req: Request<()>| async move {
            for name in names {
                assert!(req.headers()[name].is_sensitive(), "request {name}");
            }
            assert!(!format!("{req:?}").contains(TOKEN));
            let mut res = Response::new(http_body_util::Empty::<bytes::Bytes>::new());
            for name in names {
                res.headers_mut()
                    .insert(name, HeaderValue::from_static(TOKEN));
            }
            res.headers_mut()
                .insert("x-plain", HeaderValue::from_static("visible"));
            Ok::<_, std::convert::Infallible>(res)
        }));
    let mut req = Request::new(());
    for name in names {
        req.headers_mut()
            .insert(name, HeaderValue::from_static(TOKEN));
    }
    let res = svc.oneshot(req).await.unwrap();
    for name in names {
        assert!(res.headers()[name].is_sensitive(), "response {name}");
    }
    assert!(!res.headers()["x-plain"].is_sensitive());
    let shown = format!("{:?}", res.headers());
    assert!(
        !shown.contains(TOKEN) && shown.contains("visible"),
        "{shown}"
    );

    // Denied headers cannot be allow-listed for recording.
    for name in names {
        let err = TraceLayer::builder()
            .record_headers([HeaderName::from_static(name)])
            .build()
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config), "{name}");
    }
}
