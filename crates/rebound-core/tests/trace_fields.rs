//! The trace layers record the OpenTelemetry HTTP-client fields and
//! rebound's own, at the documented levels: a first-try success emits
//! nothing above DEBUG, a retry is INFO (and only a retry that happens),
//! giving up is WARN, and
//! `http.request.resend_count` appears only on attempts after the first.

mod trace_support;

use std::time::Duration;

use http::header::{HeaderName, ACCEPT, RETRY_AFTER};
use http::Request;
use rebound_core::trace::TraceLayer;
use rebound_core::RetryStop;
use rebound_test::capture::{Capture, CapturedEvent, CapturedSpan};
use tower::{Service, ServiceExt};
use tracing::Level;

use trace_support::{secret_request, stack, FakeRetry, Scripted, Step};

async fn run(layer: &TraceLayer, steps: &[Step], max: u32, level: Level) -> (Capture, Scripted) {
    let capture = Capture::new();
    let inner = Scripted::new(steps);
    {
        let _guard = capture.set_default_at(level);
        let _ = stack(layer, inner.clone(), max)
            .oneshot(secret_request())
            .await;
    }
    (capture, inner)
}

fn request_span(capture: &Capture) -> CapturedSpan {
    let spans = capture.spans_named("http.client.request");
    assert_eq!(spans.len(), 1, "{}", capture.text());
    spans.into_iter().next().unwrap()
}

fn attempt_spans(capture: &Capture) -> Vec<CapturedSpan> {
    capture.spans_named("http.client.attempt")
}

fn events_with(capture: &Capture, message: &str) -> Vec<CapturedEvent> {
    capture
        .events()
        .into_iter()
        .filter(|e| e.message() == Some(message))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn first_try_success_records_otel_fields_and_nothing_above_debug() {
    let (capture, _) = run(&TraceLayer::new(), &[Step::Ok], 3, Level::TRACE).await;
    assert_eq!(
        capture.max_level(),
        Some(Level::DEBUG),
        "{}",
        capture.text()
    );

    let span = request_span(&capture);
    assert_eq!(span.level, Level::DEBUG);
    assert!(span.closed);
    for (field, value) in [
        ("otel.name", "POST"),
        ("otel.kind", "client"),
        ("http.request.method", "POST"),
        ("server.address", "api.example.com"),
        ("server.port", "8443"),
        ("url.scheme", "https"),
        ("url.path", "/v1/items"),
        ("request_id", "req-42"),
        ("http.response.status_code", "200"),
        ("rebound.attempts", "1"),
        ("rebound.stop", "success"),
    ] {
        assert_eq!(span.field(field), Some(value), "{field}: {span:?}");
    }
    for absent in [
        "error.type",
        "otel.status_code",
        "url.query_names",
        "http.request.headers",
        "http.response.headers",
    ] {
        assert_eq!(span.field(absent), None, "{absent}: {span:?}");
    }

    let attempts = attempt_spans(&capture);
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!(a.level, Level::DEBUG);
    assert_eq!(a.parent.as_deref(), Some("http.client.request"));
    assert_eq!(a.field("rebound.attempt"), Some("1"));
    assert_eq!(a.field("http.request.resend_count"), None);
    assert_eq!(a.field("http.response.status_code"), Some("200"));
    assert_eq!(a.field("rebound.verdict"), Some("success"));

    let finished = events_with(&capture, "request finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].level, Level::DEBUG);

    // At INFO, a first-try success emits nothing at all.
    let (quiet, _) = run(&TraceLayer::new(), &[Step::Ok], 3, Level::INFO).await;
    assert_eq!(quiet.text(), "");
}

#[tokio::test(start_paused = true)]
async fn retries_are_info_with_delay_and_source_and_resend_count_only_after_the_first() {
    let (capture, _) = run(
        &TraceLayer::new(),
        &[Step::Refused, Step::Unavailable, Step::Ok],
        4,
        Level::TRACE,
    )
    .await;
    let attempts = attempt_spans(&capture);
    assert_eq!(attempts.len(), 3, "{}", capture.text());
    let resend: Vec<_> = attempts
        .iter()
        .map(|a| a.field("http.request.resend_count"))
        .collect();
    assert_eq!(resend, [None, Some("1"), Some("2")]);
    let numbers: Vec<_> = attempts
        .iter()
        .map(|a| a.field("rebound.attempt"))
        .collect();
    assert_eq!(numbers, [Some("1"), Some("2"), Some("3")]);

    let first = &attempts[0];
    assert_eq!(first.field("error.type"), Some("connect"));
    assert_eq!(first.field("rebound.verdict"), Some("retryable"));
    assert_eq!(first.field("rebound.reason"), Some("connect refused"));
    assert_eq!(first.field("rebound.sent"), Some("not_sent"));
    assert_eq!(first.field("rebound.delay_ms"), Some("100"));
    assert_eq!(first.field("rebound.delay_source"), Some("backoff"));

    let second = &attempts[1];
    assert_eq!(second.field("http.response.status_code"), Some("503"));
    assert_eq!(second.field("error.type"), Some("503"));
    assert_eq!(second.field("rebound.reason"), Some("status 503"));
    assert_eq!(second.field("rebound.sent"), Some("maybe_processed"));
    assert_eq!(second.field("rebound.delay_ms"), Some("2000"));
    assert_eq!(second.field("rebound.delay_source"), Some("retry_after"));

    let third = &attempts[2];
    assert_eq!(third.field("rebound.verdict"), Some("success"));
    assert_eq!(third.field("error.type"), None);

    // One INFO `retrying` per retry, when the retried attempt starts, with
    // why the previous one failed and the wait just made.
    let retrying = events_with(&capture, "retrying");
    assert_eq!(retrying.len(), 2);
    assert!(retrying.iter().all(|e| e.level == Level::INFO));
    assert!(retrying
        .iter()
        .all(|e| e.span.as_deref() == Some("http.client.attempt")));
    let fields = |e: &CapturedEvent| {
        [
            "rebound.attempt",
            "http.request.resend_count",
            "rebound.reason",
            "rebound.sent",
            "rebound.delay_ms",
            "rebound.delay_source",
        ]
        .map(|f| e.field(f).map(str::to_owned))
    };
    let expect = |v: [&str; 6]| v.map(|f| Some(f.to_owned()));
    assert_eq!(
        fields(&retrying[0]),
        expect(["2", "1", "connect refused", "not_sent", "100", "backoff"])
    );
    assert_eq!(
        fields(&retrying[1]),
        expect([
            "3",
            "2",
            "status 503",
            "maybe_processed",
            "2000",
            "retry_after"
        ])
    );
    // Each attempt's own outcome is a DEBUG event; an error's message is
    // there.
    let finished = events_with(&capture, "attempt finished");
    assert_eq!(finished.len(), 3);
    assert!(finished.iter().all(|e| e.level == Level::DEBUG));
    assert!(finished[0]
        .field("error.message")
        .unwrap()
        .starts_with("connect error: connection refused for POST https://api.example.com:8443"));

    let done = events_with(&capture, "request succeeded after retries");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].level, Level::INFO);
    assert_eq!(done[0].field("rebound.attempts"), Some("3"));

    let span = request_span(&capture);
    assert_eq!(span.field("rebound.attempts"), Some("3"));
    assert_eq!(span.field("rebound.stop"), Some("success"));
    assert_eq!(span.field("http.response.status_code"), Some("200"));
    assert_eq!(span.field("rebound.elapsed_ms"), Some("2100"));
    // Nothing was WARN.
    assert_eq!(capture.max_level(), Some(Level::INFO));
}

#[tokio::test(start_paused = true)]
async fn giving_up_is_warn_with_the_stop_reason() {
    let (capture, _) = run(&TraceLayer::new(), &[Step::Unavailable], 3, Level::TRACE).await;
    let warn = capture.events_at_least(Level::WARN);
    assert_eq!(warn.len(), 1, "{}", capture.text());
    let w = &warn[0];
    assert_eq!(w.message(), Some("request failed; giving up"));
    assert_eq!(w.field("rebound.stop"), Some("attempts"));
    assert_eq!(w.field("rebound.attempts"), Some("3"));
    assert_eq!(w.field("rebound.reason"), Some("status 503"));
    assert_eq!(w.field("error.type"), Some("503"));
    assert_eq!(w.span.as_deref(), Some("http.client.request"));
    let span = request_span(&capture);
    assert_eq!(span.field("otel.status_code"), Some("ERROR"));
    assert_eq!(span.field("error.type"), Some("503"));
    assert_eq!(span.field("rebound.stop"), Some("attempts"));
    // Three attempts, two retries: no INFO line for the third, which the
    // loop did not retry.
    assert_eq!(events_with(&capture, "retrying").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn errors_give_up_at_warn_with_error_type_and_budget() {
    let capture = Capture::new();
    let inner = Scripted::new(&[Step::Refused]);
    let layer = TraceLayer::new();
    let mut retry = FakeRetry::new(layer.attempt_layer().layer_on(inner), 2);
    retry.exhausted = RetryStop::Budget;
    retry.budget = Some(1);
    let svc = tower::Layer::layer(&layer, retry);
    let err = {
        let _guard = capture.set_default();
        svc.oneshot(secret_request()).await.unwrap_err()
    };
    assert!((err.retry_stop() == Some(RetryStop::Budget)));
    let w = &capture.events_at_least(Level::WARN)[0];
    assert_eq!(w.field("rebound.stop"), Some("budget"));
    assert_eq!(w.field("error.type"), Some("connect"));
    assert_eq!(w.field("rebound.budget_left"), Some("0"));
    assert!(w.field("error.message").unwrap().contains("connect error"));
    let attempts = attempt_spans(&capture);
    assert_eq!(attempts[0].field("rebound.budget_left"), Some("1"));
    assert_eq!(attempts[1].field("rebound.budget_left"), Some("0"));
    let span = request_span(&capture);
    assert_eq!(span.field("error.type"), Some("connect"));
    assert_eq!(span.field("http.response.status_code"), None);
}

/// `Layer::layer` with the arguments the other way round, for readability.
trait LayerOn: Sized {
    fn layer_on<S>(self, inner: S) -> <Self as tower::Layer<S>>::Service
    where
        Self: tower::Layer<S>,
    {
        tower::Layer::layer(&self, inner)
    }
}
impl<L> LayerOn for L {}

#[tokio::test(start_paused = true)]
async fn deadline_and_fatal_outcomes() {
    let (capture, _) = run(&TraceLayer::new(), &[Step::Deadline], 3, Level::TRACE).await;
    let w = &capture.events_at_least(Level::WARN)[0];
    assert_eq!(w.field("rebound.stop"), Some("deadline"));
    assert_eq!(w.field("error.type"), Some("timeout"));
    assert!(w
        .field("error.message")
        .unwrap()
        .starts_with("timeout (deadline)"));
    assert_eq!(
        attempt_spans(&capture)[0].field("rebound.verdict"),
        Some("unclassified")
    );

    // A fatal 404 on the first attempt: the caller gets the response; DEBUG.
    let (capture, _) = run(&TraceLayer::new(), &[Step::NotFound], 3, Level::TRACE).await;
    assert_eq!(
        capture.max_level(),
        Some(Level::DEBUG),
        "{}",
        capture.text()
    );
    let span = request_span(&capture);
    assert_eq!(span.field("rebound.stop"), Some("fatal"));
    assert_eq!(span.field("error.type"), Some("404"));

    // The same after retries: INFO, not WARN.
    let (capture, _) = run(
        &TraceLayer::new(),
        &[Step::Unavailable, Step::NotFound],
        3,
        Level::TRACE,
    )
    .await;
    assert_eq!(capture.max_level(), Some(Level::INFO), "{}", capture.text());
    assert_eq!(
        events_with(&capture, "request finished without success")[0].level,
        Level::INFO
    );
}

#[tokio::test(start_paused = true)]
async fn with_spans_off_the_events_name_their_request() {
    let (capture, _) = run(&TraceLayer::new(), &[Step::Unavailable], 2, Level::INFO).await;
    assert!(capture.spans().is_empty());
    let events = capture.events();
    assert_eq!(events.len(), 2, "{}", capture.text());
    for e in &events {
        assert_eq!(e.span, None);
        assert_eq!(e.field("http.request.method"), Some("POST"));
        assert_eq!(e.field("server.address"), Some("api.example.com"));
        assert_eq!(e.field("url.path"), Some("/v1/items"));
        assert_eq!(e.field("request_id"), Some("req-42"));
    }
    assert_eq!(events[0].message(), Some("retrying"));
    assert_eq!(events[1].level, Level::WARN);

    // With spans on, the events do not repeat what the span holds.
    let (capture, _) = run(&TraceLayer::new(), &[Step::Unavailable], 2, Level::TRACE).await;
    assert!(capture
        .events()
        .iter()
        .filter(|e| e.target == "rebound::trace")
        .all(|e| e.field("url.path").is_none()));
}

#[tokio::test(start_paused = true)]
async fn allow_list_query_names_request_id_header_and_attempt_header() {
    let layer = TraceLayer::builder()
        .record_headers([ACCEPT, RETRY_AFTER])
        .record_query_names(true)
        .request_id_header(HeaderName::from_static("x-correlation-id"))
        .send_attempt_header(HeaderName::from_static("x-attempt"))
        .build()
        .unwrap();
    let capture = Capture::new();
    let inner = Scripted::new(&[Step::Unavailable, Step::Ok]);
    {
        let _guard = capture.set_default();
        let mut req = secret_request();
        req.headers_mut()
            .insert("x-correlation-id", "corr-7".parse().unwrap());
        stack(&layer, inner.clone(), 3).oneshot(req).await.unwrap();
    }
    let span = request_span(&capture);
    assert_eq!(span.field("url.query_names"), Some("api_key,page"));
    assert_eq!(span.field("request_id"), Some("corr-7"));
    assert_eq!(
        span.field("http.request.headers"),
        Some("accept=application/json")
    );
    let attempts = attempt_spans(&capture);
    assert_eq!(
        attempts[0].field("http.response.headers"),
        Some("retry-after=2")
    );
    let sent: Vec<_> = inner
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get("x-attempt")
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(sent, ["1", "2"]);
    assert_eq!(inner.seen()[1].attempt, 2);

    // Off by default.
    let (_, inner) = run(&TraceLayer::new(), &[Step::Ok], 1, Level::TRACE).await;
    assert!(inner.seen()[0].headers.get("x-attempt").is_none());
}

#[tokio::test(start_paused = true)]
async fn observable_state_annotations_are_recorded() {
    let capture = Capture::new();
    let mut inner = Scripted::new(&[Step::Ok]);
    inner.annotate_state = true;
    {
        let _guard = capture.set_default();
        stack(&TraceLayer::new(), inner, 1)
            .oneshot(secret_request())
            .await
            .unwrap();
    }
    for span in [request_span(&capture), attempt_spans(&capture).remove(0)] {
        assert_eq!(
            span.field("rebound.limiter"),
            Some("adaptive limit=8 in_flight=3 queued=1")
        );
        assert_eq!(span.field("rebound.gate_wait_ms"), Some("1500"));
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_records_a_cancellation() {
    let capture = Capture::new();
    {
        let _guard = capture.set_default();
        let mut svc = stack(&TraceLayer::new(), Scripted::new(&[Step::Hang]), 3);
        let fut = svc.ready().await.unwrap().call(secret_request());
        let timed_out = tokio::time::timeout(Duration::from_secs(1), fut).await;
        assert!(timed_out.is_err());
    }
    let span = request_span(&capture);
    assert!(span.closed);
    assert_eq!(span.field("rebound.stop"), Some("cancelled"));
    let cancelled = events_with(&capture, "request cancelled by the caller");
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].level, Level::DEBUG);
    assert_eq!(cancelled[0].field("rebound.elapsed_ms"), Some("1000"));
    let attempt = &attempt_spans(&capture)[0];
    assert_eq!(attempt.field("rebound.verdict"), Some("cancelled"));
    assert_eq!(capture.max_level(), Some(Level::DEBUG));
}

#[tokio::test(start_paused = true)]
async fn works_over_a_plain_service_without_retry() {
    // The trace layers alone, around a service_fn: no annotation is
    // inserted on the happy path, the port comes from the scheme.
    let capture = Capture::new();
    let layer = TraceLayer::new();
    let svc = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .layer(layer.attempt_layer())
        .service_fn(|_req: Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        });
    let res = {
        let _guard = capture.set_default();
        svc.oneshot(
            Request::get("http://h.example/x")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap()
    };
    assert!(
        res.extensions().is_empty(),
        "no annotation on the happy path"
    );
    let span = request_span(&capture);
    assert_eq!(span.field("server.port"), Some("80"));
    assert_eq!(span.field("request_id"), None);
}

/// Over the real retry loop: an INFO line means a retry happens. A POST
/// without idempotency key to a 503 is not retried (`not_eligible`), so it
/// logs no INFO at all, only WARN giving up; a GET 503 then 200 logs exactly
/// one INFO `retrying`.
#[tokio::test(start_paused = true)]
async fn info_only_for_retries_the_real_loop_makes() {
    use bytes::Bytes;
    use http::Method;
    use http_body_util::Full;
    use rebound_core::{
        Backoff, BackoffLayer, ClassifyLayer, HttpClassifier, RetryLayer, RetryPolicy,
    };
    use rebound_test::mock::{MockService, Reply};

    async fn run_real(method: Method, mock: &MockService, level: Level) -> Capture {
        let trace = TraceLayer::new();
        let svc = tower::ServiceBuilder::new()
            .layer(trace.clone())
            .layer(RetryLayer::new(RetryPolicy::default()))
            .layer(trace.attempt_layer())
            .layer(BackoffLayer::new(
                Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10)).seed(1),
            ))
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(mock.clone());
        let req = Request::builder()
            .method(method)
            .uri("http://api.example.com/v1/items?api_key=secret")
            .header("x-request-id", "req-7")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        let capture = Capture::new();
        {
            let _guard = capture.set_default_at(level);
            let _ = svc.oneshot(req).await;
        }
        capture
    }

    for level in [Level::TRACE, Level::INFO] {
        // POST, no key, 503: one attempt, not eligible for a retry.
        let mock = MockService::new().otherwise(Reply::code(503));
        let capture = run_real(Method::POST, &mock, level).await;
        assert_eq!(mock.call_count(), 1);
        let above_debug = capture.events_at_least(Level::INFO);
        assert_eq!(above_debug.len(), 1, "{level}: {}", capture.text());
        let w = &above_debug[0];
        assert_eq!(w.level, Level::WARN);
        assert_eq!(w.message(), Some("request failed; giving up"));
        assert_eq!(w.field("rebound.stop"), Some("not_eligible"));
        assert!(events_with(&capture, "retrying").is_empty());

        // GET 503 then 200: exactly one INFO, the retry.
        let mock = MockService::new()
            .respond(Reply::code(503))
            .respond(Reply::code(200));
        let capture = run_real(Method::GET, &mock, level).await;
        assert_eq!(mock.call_count(), 2);
        let info: Vec<_> = capture
            .events()
            .into_iter()
            .filter(|e| e.level == Level::INFO && e.message() == Some("retrying"))
            .collect();
        assert_eq!(info.len(), 1, "{level}: {}", capture.text());
        let r = &info[0];
        assert_eq!(r.field("rebound.attempt"), Some("2"));
        assert_eq!(r.field("rebound.reason"), Some("status 503"));
        assert_eq!(r.field("rebound.sent"), Some("maybe_processed"));
        assert_eq!(r.field("rebound.delay_source"), Some("backoff"));
        assert!(r.field("rebound.delay_ms").is_some());
        assert!(r.field("rebound.budget_left").is_some());
        if level == Level::INFO {
            // Spans off: the event names its request itself.
            assert_eq!(r.field("http.request.method"), Some("GET"));
            assert_eq!(r.field("server.address"), Some("api.example.com"));
            assert_eq!(r.field("url.path"), Some("/v1/items"));
            assert_eq!(r.field("request_id"), Some("req-7"));
        }
        // Nothing WARN: it succeeded; one INFO closing line besides.
        assert_eq!(capture.max_level(), Some(Level::INFO));
        assert_eq!(
            events_with(&capture, "request succeeded after retries").len(),
            1
        );
    }
}

/// A response body that fails after a 200 head (a stall, a truncation) is
/// logged at WARN `response body failed`, with the error's type and stage;
/// a body read to its end logs nothing above DEBUG.
#[tokio::test(start_paused = true)]
async fn a_body_failure_after_the_head_is_warn() {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::BodyExt;
    use rebound_core::{Error, TimeoutStage};

    struct Script(VecDeque<Result<Frame<Bytes>, Error>>);
    impl http_body::Body for Script {
        type Data = Bytes;
        type Error = Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    async fn read(fail: bool, level: Level) -> (Capture, bool) {
        let svc = TraceLayer::new().layer_on(tower::service_fn(move |_req: Request<String>| {
            let mut frames = VecDeque::new();
            frames.push_back(Ok(Frame::data(Bytes::from_static(b"partial"))));
            if fail {
                frames.push_back(Err(Error::timeout(TimeoutStage::BodyIdle)));
            }
            async move { Ok::<_, Infallible>(http::Response::new(Script(frames))) }
        }));
        let capture = Capture::new();
        let ok = {
            let _guard = capture.set_default_at(level);
            let res = svc.oneshot(secret_request()).await.unwrap();
            assert!(res.status().is_success());
            res.into_body().collect().await.is_ok()
        };
        (capture, ok)
    }

    // Read to its end: nothing above DEBUG.
    let (capture, ok) = read(false, Level::TRACE).await;
    assert!(ok);
    assert_eq!(
        capture.max_level(),
        Some(Level::DEBUG),
        "{}",
        capture.text()
    );

    for level in [Level::TRACE, Level::INFO] {
        let (capture, ok) = read(true, level).await;
        assert!(!ok);
        let warn = capture.events_at_least(Level::WARN);
        assert_eq!(warn.len(), 1, "{level}: {}", capture.text());
        let w = &warn[0];
        assert_eq!(w.message(), Some("response body failed"));
        assert_eq!(w.field("error.type"), Some("timeout"));
        assert_eq!(w.field("error.stage"), Some("body_idle"));
        assert!(w.field("error.message").unwrap().starts_with("timeout"));
        if level == Level::INFO {
            // Spans off: it names its request itself, without secrets.
            assert_eq!(w.span, None);
            assert_eq!(w.field("url.path"), Some("/v1/items"));
            assert_eq!(w.field("request_id"), Some("req-42"));
            assert_eq!(w.field("http.request.method"), Some("POST"));
        } else {
            assert_eq!(w.span.as_deref(), Some("http.client.request"));
        }
        assert_eq!(capture.count(trace_support::SECRET), 0);
    }
}
