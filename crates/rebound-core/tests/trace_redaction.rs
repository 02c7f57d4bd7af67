//! No secret reaches a span field, an event, `Debug` of a request or
//! response, or an error's `Display`/`Debug`, whatever the outcome and
//! whatever the log level.

mod trace_support;

use http::header::{
    HeaderName, ACCEPT, AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, RETRY_AFTER, SET_COOKIE,
};
use http::{Request, Response};
use rebound_core::trace::{TraceBody, TraceLayer};
use rebound_core::Error;
use rebound_test::capture::Capture;
use tower::ServiceExt;
use tracing::Level;

use trace_support::{secret_request, stack, Scripted, Step, SECRET};

/// Everything an error shows: `Display`, `Debug`, and the whole source
/// chain.
fn error_text(err: &Error) -> String {
    let mut text = format!("{err} {err:?}");
    let mut cur = std::error::Error::source(err);
    while let Some(e) = cur {
        text.push_str(&format!(" {e} {e:?}"));
        cur = e.source();
    }
    text
}

fn layers() -> Vec<(&'static str, TraceLayer)> {
    vec![
        ("default", TraceLayer::new()),
        (
            "verbose",
            TraceLayer::builder()
                .record_query_names(true)
                .record_headers([ACCEPT, RETRY_AFTER, HeaderName::from_static("x-request-id")])
                .send_attempt_header(HeaderName::from_static("x-attempt"))
                .build()
                .unwrap(),
        ),
    ]
}

const SCENARIOS: &[(&str, &[Step])] = &[
    ("success", &[Step::Ok]),
    ("refused storm", &[Step::Refused]),
    ("503 storm", &[Step::Unavailable]),
    ("503 then success", &[Step::Unavailable, Step::Ok]),
    (
        "refused, 503, success",
        &[Step::Refused, Step::Unavailable, Step::Ok],
    ),
    ("fatal 404", &[Step::NotFound]),
    ("deadline", &[Step::Deadline]),
];

#[tokio::test(start_paused = true)]
async fn the_secret_appears_zero_times() {
    let mut runs = 0;
    for (config, layer) in layers() {
        for level in [Level::TRACE, Level::INFO] {
            for (scenario, steps) in SCENARIOS {
                let what = format!("{scenario} / {config} / {level}");
                let capture = Capture::new();
                let mut inner = Scripted::new(steps);
                inner.annotate_state = true;
                let svc = stack(&layer, inner.clone(), 3);
                let result = {
                    let _guard = capture.set_default_at(level);
                    svc.oneshot(secret_request()).await
                };
                let text = capture.text();

                // The capture did see the requests: the test can fail.
                if level == Level::TRACE {
                    assert!(capture.span("http.client.request").is_some(), "{what}");
                    assert!(text.contains("api.example.com"), "{what}: {text}");
                    assert!(text.contains("inner service got a request"), "{what}");
                }
                assert_eq!(capture.count(SECRET), 0, "{what}: {text}");
                assert_eq!(capture.count("alice"), 0, "{what}: userinfo leaked: {text}");

                // Below the trace layer, `Debug` of the headers hides every
                // deny-listed value.
                let seen = inner.seen();
                assert!(!seen.is_empty(), "{what}");
                for s in &seen {
                    assert!(
                        !s.headers_debug.contains(SECRET),
                        "{what}: {}",
                        s.headers_debug
                    );
                    for name in [
                        AUTHORIZATION,
                        PROXY_AUTHORIZATION,
                        COOKIE,
                        HeaderName::from_static("x-api-key"),
                        HeaderName::from_static("api-key"),
                    ] {
                        assert!(
                            s.headers.get(&name).unwrap().is_sensitive(),
                            "{what}: {name}"
                        );
                    }
                }

                match &result {
                    Ok(res) => {
                        let shown = format!("{:?}", res.headers());
                        assert!(!shown.contains(SECRET), "{what}: {shown}");
                        if let Some(cookie) = res.headers().get(SET_COOKIE) {
                            assert!(cookie.is_sensitive(), "{what}");
                        }
                    }
                    Err(err) => {
                        let shown = error_text(err);
                        assert!(!shown.contains(SECRET), "{what}: {shown}");
                        assert!(!shown.contains("alice"), "{what}: {shown}");
                        // It still names the request, redacted.
                        assert!(
                            shown.contains("https://api.example.com:8443/v1/items"),
                            "{what}: {shown}"
                        );
                    }
                }
                runs += 1;
            }
        }
    }
    assert_eq!(runs, 2 * 2 * SCENARIOS.len());
}

#[tokio::test(start_paused = true)]
async fn debug_of_the_request_below_the_trace_layer_hides_deny_listed_headers() {
    // Under a capture like the other test here: tracing caches callsite
    // interest process-wide, and a callsite first hit on a thread with no
    // subscriber could be cached as disabled for the test that asserts on
    // captured output. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let inner = Scripted::new(&[Step::Ok]);
    let layer = TraceLayer::builder()
        .deny_header(HeaderName::from_static("x-session"))
        .build()
        .unwrap();
    let svc = stack(&layer, inner.clone(), 1);
    let req = Request::get("https://api.example.com/v1/items")
        .header(AUTHORIZATION, format!("Bearer {SECRET}"))
        .header(PROXY_AUTHORIZATION, format!("Basic {SECRET}"))
        .header(COOKIE, format!("a={SECRET}"))
        .header("x-api-key", SECRET)
        .header("api-key", SECRET)
        .header("x-auth-token", SECRET)
        .header("x-session", SECRET)
        .header(ACCEPT, "application/json")
        .body(String::new())
        .unwrap();
    // Before the step, `Debug` shows the secret: the assertion below can fail.
    assert!(format!("{req:?}").contains(SECRET));
    let res: Response<TraceBody<String>> = svc.oneshot(req).await.unwrap();
    let seen = inner.seen();
    assert_eq!(seen.len(), 1);
    let shown = &seen[0].request_debug;
    assert_eq!(shown.matches(SECRET).count(), 0, "{shown}");
    assert_eq!(shown.matches("Sensitive").count(), 7, "{shown}");
    assert!(shown.contains("application/json"), "{shown}");
    assert!(res.status().is_success());
}

// ===== path redaction (issue 10, item 6) =====

#[tokio::test(start_paused = true)]
async fn a_path_redaction_reaches_spans_events_and_errors_named_deep_in_the_stack() {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::Full;
    use rebound_core::redact::PathRedaction;
    use rebound_core::{
        AttemptTimeoutLayer, ClassifyLayer, HttpClassifier, RetryLayer, RetryPolicy,
    };
    use rebound_test::mock::MockService;

    const KEY: &str = "sk-PATHSECRET";
    for (redaction, shown) in [
        (
            PathRedaction::templates(["/v1/keys/{key}"]),
            "/v1/keys/{key}",
        ),
        (PathRedaction::hidden(), "/{redacted}"),
    ] {
        let trace = TraceLayer::builder()
            .path_redaction(redaction)
            .build()
            .unwrap();
        // Never answers: every attempt times out, the error is named by the
        // attempt timeout with the raw path, well below the trace layers.
        let mock = MockService::new().hang().hang().hang().hang();
        let svc = tower::ServiceBuilder::new()
            .layer(trace.clone())
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(2)))
            .layer(trace.attempt_layer())
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .layer(AttemptTimeoutLayer::try_new(Duration::from_secs(1)).unwrap())
            .service(mock.clone());
        let req = Request::get(format!("https://api.example.com/v1/keys/{KEY}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        for level in [Level::TRACE, Level::INFO] {
            let capture = Capture::new();
            let err = {
                let _guard = capture.set_default_at(level);
                let req = Request::get(req.uri().clone())
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                svc.clone().oneshot(req).await.unwrap_err()
            };
            let text = error_text(&err);
            assert!(!text.contains(KEY), "{text}");
            assert!(
                err.to_string()
                    .contains(&format!("https://api.example.com{shown}")),
                "{err}"
            );
            assert_eq!(capture.count(KEY), 0, "{}", capture.text());
            assert!(capture.count("request failed; giving up") > 0);
        }
        assert!(mock.call_count() >= 2);
    }
}
