//! The whole stack in the default order over a scripted service, on paused
//! time: every layer's contract with its neighbours, checked end to end.
//!
//! Trace → (Deadline stand-in) → ConcurrencyLimit → IdempotencyKey → Retry →
//! AttemptTrace → Backoff → RetryAfterGate → AdaptiveLimit → RetryAfter →
//! Classify → CollectBody → MockService.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use rebound_core::annotations::{AttemptNumber, Deadline, IdempotencyKey, PreviousAttempt};
use rebound_core::backoff::{Backoff, BackoffLayer, Jitter};
use rebound_core::classify::{ClassifyLayer, HttpClassifier};
use rebound_core::collect::{CollectBodyLayer, CollectedBody};
use rebound_core::gate::RetryAfterGateLayer;
use rebound_core::idempotency::IdempotencyKeyLayer;
use rebound_core::limit::{AdaptiveLimitLayer, Aimd, ConcurrencyLimitLayer, LimitBody};
use rebound_core::replay::RecordingBody;
use rebound_core::retry::{RetryLayer, RetryPolicy};
use rebound_core::retry_after::RetryAfterLayer;
use rebound_core::trace::{TraceBody, TraceLayer};
use rebound_core::{Attempts, BoxError, DelaySource, Error, GateWait, LimiterState, RetryStop};
use rebound_test::capture::Capture;
use rebound_test::mock::{MockService, Reply};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

fn assert_send<T: Send>(_: &T) {}
fn assert_send_sync_clone<T: Send + Sync + Clone>(_: &T) {}

/// What the probe right under the retry layer saw on each attempt.
#[derive(Debug, Clone)]
struct Seen {
    attempt: u32,
    at: Instant,
    previous: Option<PreviousAttempt>,
    key: Option<IdempotencyKey>,
    deadline: Option<Instant>,
}

#[derive(Clone)]
struct Probe(Arc<Mutex<Vec<Seen>>>);

impl Probe {
    fn new() -> Self {
        Probe(Arc::new(Mutex::new(Vec::new())))
    }
    fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
    fn record<B>(&self, req: &Request<B>) {
        let ext = req.extensions();
        self.0.lock().unwrap().push(Seen {
            attempt: AttemptNumber::of(ext),
            at: Instant::now(),
            previous: ext.get::<PreviousAttempt>().cloned(),
            key: ext.get::<IdempotencyKey>().cloned(),
            deadline: Deadline::of(ext),
        });
    }
}

struct Parts {
    trace: TraceLayer,
    limit: ConcurrencyLimitLayer,
    adaptive: AdaptiveLimitLayer,
    gate: RetryAfterGateLayer,
    retry: RetryLayer,
    probe: Probe,
}

impl Parts {
    fn new() -> Self {
        Parts {
            trace: TraceLayer::new(),
            limit: ConcurrencyLimitLayer::try_new(4).unwrap(),
            adaptive: AdaptiveLimitLayer::try_new(Aimd::default()).unwrap(),
            gate: RetryAfterGateLayer::new(),
            retry: RetryLayer::try_new(RetryPolicy::default().max_attempts(3)).unwrap(),
            probe: Probe::new(),
        }
    }
}

/// Backoff without jitter (ratio 0): 100 ms, then 200 ms, exactly.
fn backoff() -> Backoff {
    Backoff::try_exponential(Duration::from_millis(100), Duration::from_secs(10))
        .unwrap()
        .jitter(Jitter::Proportional(0.0))
}

/// Every request in these tests has this body: a streamed body made
/// replayable (an empty one for the GETs), so the whole stack is
/// instantiated once.
type ReqBody = RecordingBody<Chunks>;

fn stack(
    p: &Parts,
    mock: &MockService,
) -> impl Service<
    Request<ReqBody>,
    Response = Response<TraceBody<LimitBody<CollectedBody>>>,
    Error = Error,
    Future: Send,
> + Clone
       + Send
       + Sync {
    let probe = p.probe.clone();
    ServiceBuilder::new()
        .layer(p.trace.clone())
        // Stand-in for the deadline layer: stamps a Deadline 30 s away.
        .map_request(|mut req: Request<ReqBody>| {
            req.extensions_mut()
                .insert(Deadline(Instant::now() + Duration::from_secs(30)));
            req
        })
        .layer(p.limit.clone())
        .layer(IdempotencyKeyLayer::new())
        .layer(p.retry.clone())
        .map_request(move |req: Request<ReqBody>| {
            probe.record(&req);
            req
        })
        .layer(p.trace.attempt_layer())
        .layer(BackoffLayer::try_new(backoff()).unwrap())
        .layer(p.gate.clone())
        .layer(p.adaptive.clone())
        .layer(RetryAfterLayer::new())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .layer(CollectBodyLayer::new())
        .service(mock.clone())
}

async fn body_bytes<B>(res: Response<B>) -> Bytes
where
    B: Body,
    B::Error: std::fmt::Debug,
{
    res.into_body().collect().await.unwrap().to_bytes()
}

fn get(uri: &str) -> Request<ReqBody> {
    Request::get(uri)
        .body(RecordingBody::new(Chunks(VecDeque::new())))
        .unwrap()
}

fn in_memory(bytes: &'static [u8]) -> ReqBody {
    RecordingBody::new(Chunks(VecDeque::from([Bytes::from_static(bytes)])))
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

fn assert_no_permits_held(p: &Parts) {
    let limiter = p.limit.limiter();
    assert_eq!(limiter.in_flight(), 0, "concurrency permits returned");
    assert_eq!(limiter.available(), limiter.max());
    assert_eq!(limiter.queued(), 0);
    let adaptive = p.adaptive.limiter();
    assert_eq!(adaptive.in_flight(), 0, "adaptive slots returned");
    assert_eq!(adaptive.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn get_503_503_200_backoff_delays_are_honoured() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    let tasks = alive_tasks();
    let parts = Parts::new();
    let mock = MockService::new()
        .respond_times(2, Reply::code(503).body("busy"))
        .respond(Reply::code(200).body("ok"));
    let mut svc = stack(&parts, &mock);
    assert_send_sync_clone(&svc);

    let fut = svc
        .ready()
        .await
        .unwrap()
        .call(get("http://api.example/v1/items"));
    assert_send(&fut);
    let res = fut.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(Attempts::of(res.extensions()), 3);
    assert_eq!(res.extensions().get::<Attempts>(), Some(&Attempts(3)));
    assert!(res.extensions().get::<RetryStop>().is_none());
    // The permit is held by the body until it is read.
    assert_eq!(parts.limit.limiter().in_flight(), 1);
    assert_eq!(body_bytes(res).await, "ok");

    assert_eq!(mock.call_count(), 3);
    let seen = parts.probe.seen();
    assert_eq!(
        seen.iter().map(|s| s.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    // The delays proposed by the backoff layer, carried forward and waited.
    let expected = [Duration::from_millis(100), Duration::from_millis(200)];
    for (i, want) in expected.iter().enumerate() {
        let prev = seen[i + 1].previous.as_ref().expect("PreviousAttempt");
        assert_eq!(prev.attempt, i as u32 + 1);
        assert!(prev.verdict.is_retryable());
        let delay = prev.delay.expect("a proposed delay");
        assert_eq!(delay.source, DelaySource::Backoff);
        assert_eq!(delay.delay, *want);
        assert_eq!(seen[i + 1].at - seen[i].at, *want, "delay honoured");
    }
    let calls = mock.calls();
    assert_eq!(calls[1].at - calls[0].at, expected[0]);
    assert_eq!(calls[2].at - calls[1].at, expected[1]);
    // The deadline stand-in's stamp reaches every attempt.
    assert!(seen.iter().all(|s| s.deadline.is_some()));

    assert_no_permits_held(&parts);
    assert_eq!(alive_tasks(), tasks, "no task left behind");

    // Trace: one request span, one attempt span per attempt.
    let req_spans = capture.spans_named("http.client.request");
    assert_eq!(req_spans.len(), 1);
    assert_eq!(req_spans[0].field("rebound.attempts"), Some("3"));
    assert_eq!(req_spans[0].field("http.response.status_code"), Some("200"));
    let attempts = capture.spans_named("http.client.attempt");
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[0].field("http.response.status_code"), Some("503"));
    assert_eq!(attempts[0].field("rebound.delay_source"), Some("backoff"));
    assert_eq!(attempts[2].field("http.request.resend_count"), Some("2"));
}

#[tokio::test(start_paused = true)]
async fn get_503_x3_returns_the_last_503_with_its_body() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let parts = Parts::new();
    let mock = MockService::new().otherwise(Reply::code(503).body("still busy"));
    let mut svc = stack(&parts, &mock);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(get("http://api.example/v1/items"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(Attempts::of(res.extensions()), 3);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Attempts)
    );
    // Three overloads shrank the adaptive limit 20 → 18 → 16 → 14; the
    // final outcome shows it (the request span's `rebound.limiter`).
    let state = res.extensions().get::<LimiterState>().copied();
    assert_eq!(state.map(|s| (s.limiter, s.limit)), Some(("adaptive", 14)));
    assert_eq!(parts.adaptive.limiter().current_limit(), 14);
    assert_eq!(body_bytes(res).await, "still busy");
    assert_eq!(mock.call_count(), 3);
    assert_no_permits_held(&parts);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_and_the_gate_holds_a_new_request() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let tasks = alive_tasks();
    let parts = Parts::new();
    let mock = MockService::new()
        .respond(Reply::code(429).header("retry-after", "2"))
        .otherwise(Reply::code(200).body("ok"));
    let svc = stack(&parts, &mock);
    let start = Instant::now();

    let first = {
        let svc = svc.clone();
        async move { svc.oneshot(get("http://api.example/a")).await }
    };
    let second = {
        let svc = svc.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            // The gate is closed now: this new request must wait.
            svc.oneshot(get("http://api.example/b")).await
        }
    };
    let other_host = {
        let svc = svc.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            svc.oneshot(get("http://elsewhere.example/c")).await
        }
    };
    let (a, b, c) = tokio::join!(first, second, other_host);
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(Attempts::of(a.extensions()), 2);
    assert_eq!(b.status(), StatusCode::OK);
    assert_eq!(Attempts::of(b.extensions()), 1);
    // The gate says how long it held the request (for traces and metrics).
    assert_eq!(
        b.extensions().get::<GateWait>(),
        Some(&GateWait(Duration::from_millis(1500)))
    );
    assert!(a.extensions().get::<GateWait>().is_none());
    assert_eq!(c.status(), StatusCode::OK);
    drop((a, b, c));

    let calls = mock.calls();
    assert_eq!(calls.len(), 4);
    let at = |path: &str| -> Vec<Duration> {
        calls
            .iter()
            .filter(|c| c.uri.path() == path)
            .map(|c| c.at - start)
            .collect()
    };
    // The retry starts exactly 2 s after the 429.
    assert_eq!(at("/a"), [Duration::ZERO, Duration::from_secs(2)]);
    // The new request to the same authority was held until the pause ended.
    assert_eq!(at("/b"), [Duration::from_secs(2)]);
    // Another authority is not affected.
    assert_eq!(at("/c"), [Duration::from_millis(500)]);
    let seen = parts.probe.seen();
    let retry = seen.iter().find(|s| s.attempt == 2).unwrap();
    let delay = retry.previous.as_ref().unwrap().delay.unwrap();
    assert_eq!(delay.source, DelaySource::RetryAfter);
    assert_eq!(delay.delay, Duration::from_secs(2));

    assert_no_permits_held(&parts);
    assert_eq!(alive_tasks(), tasks, "no task left behind");
}

#[tokio::test(start_paused = true)]
async fn post_without_key_gets_one_and_keeps_it_on_every_attempt() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let parts = Parts::new();
    let mock = MockService::new()
        .respond_times(2, Reply::code(503))
        .respond(Reply::code(201));
    let mut svc = stack(&parts, &mock);
    let req = Request::post("http://api.example/orders")
        .body(in_memory(b"{\"n\":1}"))
        .unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(Attempts::of(res.extensions()), 3);
    let calls = mock.calls();
    assert_eq!(calls.len(), 3);
    let keys: Vec<_> = calls
        .iter()
        .map(|c| c.headers.get("idempotency-key").cloned().expect("a key"))
        .collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "same key: {keys:?}");
    let key = uuid::Uuid::parse_str(keys[0].to_str().unwrap()).unwrap();
    assert_eq!(key.get_version_num(), 4);
    assert!(calls
        .iter()
        .all(|c| c.body.as_deref() == Some(&b"{\"n\":1}"[..])));
    assert!(parts.probe.seen().iter().all(|s| s.key.is_some()));
    drop(res);
    assert_no_permits_held(&parts);
}

// ===== a streamed request body =====

/// A body that yields its chunks one at a time and does not announce its
/// length, as a streamed upload does.
struct Chunks(VecDeque<Bytes>);

impl Chunks {
    fn new(total: usize, chunk: usize) -> (Self, Bytes) {
        let all: Bytes = (0..total)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<_>>()
            .into();
        let chunks = (0..total)
            .step_by(chunk)
            .map(|i| all.slice(i..(i + chunk).min(total)))
            .collect();
        (Chunks(chunks), all)
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[tokio::test(start_paused = true)]
async fn streamed_post_under_the_cap_is_replayed_byte_identical() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let parts = Parts::new();
    let mock = MockService::new()
        .respond(Reply::code(503))
        .respond(Reply::code(200));
    let mut svc = stack(&parts, &mock);
    let (body, all) = Chunks::new(10 * 1024, 1000);
    let req = Request::post("http://api.example/upload")
        .body(RecordingBody::new(body))
        .unwrap();
    let fut = svc.ready().await.unwrap().call(req);
    assert_send(&fut);
    let res = fut.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(Attempts::of(res.extensions()), 2);
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    for c in &calls {
        assert_eq!(c.body.as_ref(), Some(&all), "byte-identical");
    }
    assert_eq!(
        calls[0].headers.get("idempotency-key"),
        calls[1].headers.get("idempotency-key")
    );
    drop(res);
    assert_no_permits_held(&parts);
}

#[tokio::test(start_paused = true)]
async fn streamed_post_over_the_cap_is_sent_once() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let parts = Parts::new();
    let mock = MockService::new()
        .respond(Reply::code(503).body("busy"))
        .otherwise(Reply::code(200));
    let mut svc = stack(&parts, &mock);
    let budget = parts.retry.policy().get_budget().clone();
    let (body, all) = Chunks::new(RecordingBody::<Chunks>::DEFAULT_MAX_BYTES + 1, 4096);
    let req = Request::post("http://api.example/upload")
        .body(RecordingBody::new(body))
        .unwrap();
    let before = budget.remaining();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    assert_eq!(
        rebound_core::Verdict::of(res.extensions())
            .reason()
            .map(|r| r.as_str().to_owned()),
        Some("body not replayable".to_owned())
    );
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].body.as_ref(),
        Some(&all),
        "the first attempt completes"
    );
    // A retry that was not made costs no budget (one request deposited,
    // which can only raise what remains).
    assert!(budget.remaining() >= before, "budget charged for no retry");
    assert_eq!(body_bytes(res).await, "busy");
    assert_no_permits_held(&parts);
}

#[tokio::test(start_paused = true)]
async fn dropping_during_the_backoff_sleep_releases_everything() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let tasks = alive_tasks();
    let parts = Parts::new();
    let mock = MockService::new()
        .respond(Reply::code(503).header("retry-after", "5"))
        .otherwise(Reply::code(200));
    let mut svc = stack(&parts, &mock);
    let fut = svc.ready().await.unwrap().call(get("http://api.example/x"));
    // The first attempt is answered at once; then the loop sleeps 5 s.
    let out = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(out.is_err(), "still sleeping");
    assert_eq!(mock.call_count(), 1);
    assert_no_permits_held(&parts);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(mock.call_count(), 1, "no attempt after the drop");
    assert_eq!(alive_tasks(), tasks);
}

#[tokio::test(start_paused = true)]
async fn errors_compose_through_the_stack() {
    // Every test here runs under a capture: tracing caches whether a
    // callsite is enabled process-wide, and a callsite first hit on a
    // thread with no subscriber could be cached as disabled for the test
    // that asserts on spans. Captures are serialized (see `Capture`).
    let _capture = Capture::new().set_default();
    let parts = Parts::new();
    let mock = MockService::new().otherwise_fail(|| {
        Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) as BoxError
    });
    let mut svc = stack(&parts, &mock);
    let req = Request::builder()
        .method(Method::POST)
        .uri("http://user:pw@api.example/x?token=abc")
        .body(in_memory(b""))
        .unwrap();
    let err: Error = svc.ready().await.unwrap().call(req).await.unwrap_err();
    // A connect refusal is NotSent: retried for a POST too, until attempts
    // run out.
    assert_eq!(Attempts::of(err.extensions()), 3);
    assert_eq!(mock.call_count(), 3);
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("pw"), "{shown}");
    assert!(!shown.contains("token"), "{shown}");
    assert_no_permits_held(&parts);
}
