//! The retry core end to end (classify, Retry-After, backoff, retry with
//! budget) against the scripted `MockService`, on paused time.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::join_all;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use rand::{Rng, SeedableRng};
use rebound_core::backoff::BackoffService;
use rebound_core::body::CloneableBody;
use rebound_core::classify::Classify;
use rebound_core::retry_after::RetryAfter;
use rebound_core::{
    retry::Retry, AttemptNumber, Attempts, Backoff, BackoffLayer, BoxError, ClassifyLayer,
    Deadline, DelaySource, Error, ErrorKind, HttpClassifier, PreviousAttempt, RetryAfterLayer,
    RetryBudget, RetryLayer, RetryPolicy, RetryStop, Verdict,
};
use rebound_test::mock::{MockService, Reply};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

type Stack<S> = Retry<BackoffService<RetryAfter<Classify<S, HttpClassifier>>>>;

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn stack_with<S>(inner: S, policy: RetryPolicy) -> Stack<S> {
    ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .layer(BackoffLayer::new(
            Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10)).seed(1),
        ))
        .layer(RetryAfterLayer::new().clock(now))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner)
}

fn stack(mock: &MockService) -> Stack<MockService> {
    stack_with(mock.clone(), RetryPolicy::default())
}

fn req(method: Method) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri("http://test.example/v1/things?token=secret")
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap()
}

fn get() -> Request<Full<Bytes>> {
    req(Method::GET)
}

fn gap(mock: &MockService, i: usize) -> Duration {
    let calls = mock.calls();
    calls[i + 1].at - calls[i].at
}

async fn body_of(res: Response<Full<Bytes>>) -> Bytes {
    res.into_body().collect().await.unwrap().to_bytes()
}

// ===== statuses =====

#[tokio::test(start_paused = true)]
async fn five_hundred_then_ok_is_two_attempts() {
    let mock = MockService::new()
        .respond(Reply::code(500))
        .respond(Reply::code(200).body("ok"));
    let res = stack(&mock).oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Attempts>(), Some(&Attempts(2)));
    assert!(res.extensions().get::<RetryStop>().is_none());
    assert_eq!(body_of(res).await, "ok");
    assert_eq!(mock.call_count(), 2);
    // The retry carried the same body.
    assert_eq!(mock.calls()[1].body.as_deref(), Some(&b"payload"[..]));
}

#[tokio::test(start_paused = true)]
async fn first_success_is_not_annotated() {
    let mock = MockService::new().respond(Reply::code(200));
    let res = stack(&mock).oneshot(get()).await.unwrap();
    assert!(res.extensions().get::<Attempts>().is_none());
    assert!(res.extensions().get::<Verdict>().is_none());
    assert_eq!(Attempts::of(res.extensions()), 1);
}

#[tokio::test(start_paused = true)]
async fn client_errors_are_one_attempt() {
    for code in [400, 401, 403, 404, 422] {
        let mock = MockService::new()
            .respond(Reply::code(code))
            .otherwise(Reply::code(200));
        let res = stack(&mock).oneshot(get()).await.unwrap();
        assert_eq!(res.status().as_u16(), code);
        assert_eq!(Attempts::of(res.extensions()), 1);
        assert_eq!(res.extensions().get::<RetryStop>(), Some(&RetryStop::Fatal));
        assert_eq!(mock.call_count(), 1, "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn three_503_give_the_last_503_with_its_body() {
    let mock = MockService::new()
        .respond(Reply::code(503).body("first"))
        .respond(Reply::code(503).body("second"))
        .respond(Reply::code(503).body("third"))
        .otherwise(Reply::code(200));
    let res = stack(&mock).oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.extensions().get::<Attempts>(), Some(&Attempts(3)));
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Attempts)
    );
    assert_eq!(body_of(res).await, "third");
    assert_eq!(mock.call_count(), 3);
}

#[tokio::test(start_paused = true)]
async fn attempts_are_stamped_and_history_carried() {
    type Seen = Arc<Mutex<Vec<(u32, Option<PreviousAttempt>)>>>;
    let seen: Seen = Arc::default();
    let inner = {
        let seen = seen.clone();
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            seen.lock().unwrap().push((
                AttemptNumber::of(req.extensions()),
                req.extensions().get::<PreviousAttempt>().cloned(),
            ));
            let n = seen.lock().unwrap().len();
            async move {
                let mut res = Response::new(Full::new(Bytes::new()));
                *res.status_mut() = if n < 3 {
                    StatusCode::BAD_GATEWAY
                } else {
                    StatusCode::OK
                };
                Ok::<_, BoxError>(res)
            }
        })
    };
    let res = stack_with(inner, RetryPolicy::default().max_attempts(4))
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(Attempts::of(res.extensions()), 3);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(seen[0].1.is_none());
    let prev = seen[2].1.as_ref().unwrap();
    assert_eq!(prev.attempt, 2);
    assert_eq!(prev.verdict.reason().unwrap().as_str(), "status 502");
    assert_eq!(prev.delay.unwrap().source, DelaySource::Backoff);
    assert!(prev.delay.unwrap().delay <= Duration::from_millis(200));
}

// ===== Retry-After =====

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_is_honoured_exactly() {
    let mock = MockService::new()
        .respond(Reply::code(429).header("retry-after", "3"))
        .respond(Reply::code(200));
    let start = Instant::now();
    let res = stack(&mock).oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(gap(&mock, 0), Duration::from_secs(3));
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_is_relative_to_injected_now() {
    let date = httpdate::fmt_http_date(now() + Duration::from_secs(5));
    let mock = MockService::new()
        .respond(Reply::code(503).header("retry-after", &date))
        .respond(Reply::code(200));
    stack(&mock).oneshot(get()).await.unwrap();
    assert_eq!(gap(&mock, 0), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn malformed_retry_after_falls_back_to_backoff() {
    for bad in ["-1", "abc", "99999999999999999999"] {
        let mock = MockService::new()
            .respond(Reply::code(429).header("retry-after", bad))
            .respond(Reply::code(200));
        let res = stack(&mock).oneshot(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{bad}");
        // The computed backoff for the first retry: full jitter in [0, 100 ms].
        assert!(gap(&mock, 0) <= Duration::from_millis(100), "{bad}");
    }
    // A date in the past is a zero delay.
    let mock = MockService::new()
        .respond(Reply::code(429).header("retry-after", "Mon, 01 Jan 1990 00:00:00 GMT"))
        .respond(Reply::code(200));
    stack(&mock).oneshot(get()).await.unwrap();
    assert_eq!(gap(&mock, 0), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn deadline_shorter_than_retry_after_returns_at_once() {
    let mock = MockService::new()
        .respond(
            Reply::code(429)
                .header("retry-after", "10")
                .body("slow down"),
        )
        .otherwise(Reply::code(200));
    let start = Instant::now();
    let mut r = get();
    r.extensions_mut()
        .insert(Deadline(Instant::now() + Duration::from_secs(2)));
    let res = stack(&mock).oneshot(r).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "no sleep");
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Deadline)
    );
    assert_eq!(body_of(res).await, "slow down");
    assert_eq!(mock.call_count(), 1);
}

// ===== eligibility =====

#[tokio::test(start_paused = true)]
async fn post_503_is_not_retried() {
    let mock = MockService::new()
        .respond(Reply::code(503))
        .otherwise(Reply::code(200));
    let res = stack(&mock).oneshot(req(Method::POST)).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotEligible)
    );
    assert_eq!(mock.call_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn post_with_idempotency_key_is_retried_with_the_same_key() {
    let mock = MockService::new()
        .respond(Reply::code(503))
        .respond(Reply::code(201));
    let mut r = req(Method::POST);
    r.headers_mut()
        .insert("idempotency-key", "4f1c-key".parse().unwrap());
    let res = stack(&mock).oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let calls = mock.calls();
    assert_eq!(calls.len(), 2);
    for c in &calls {
        assert_eq!(c.method, Method::POST);
        assert_eq!(c.headers["idempotency-key"], "4f1c-key");
    }
}

#[tokio::test(start_paused = true)]
async fn post_with_an_empty_idempotency_key_is_not_retried() {
    // The idempotency-key layer treats an empty value as "no key"; so must
    // the retry layer, or a POST the server cannot deduplicate is re-sent.
    let mock = MockService::new()
        .respond(Reply::code(503))
        .otherwise(Reply::code(200));
    let mut r = req(Method::POST);
    r.headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static(""));
    let res = stack(&mock).oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotEligible)
    );
    assert_eq!(mock.call_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn post_with_idempotency_key_annotation_is_retried() {
    // The annotation and a header carrying its value (the idempotency-key
    // layer's, here under another name): the server can see the key.
    let mock = MockService::new()
        .respond(Reply::code(502))
        .respond(Reply::code(200));
    let mut r = req(Method::POST);
    r.extensions_mut()
        .insert(rebound_core::IdempotencyKey("k".parse().unwrap()));
    r.headers_mut()
        .insert("x-idempotency-key", http::HeaderValue::from_static("k"));
    stack(&mock).oneshot(r).await.unwrap();
    assert_eq!(mock.call_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn post_with_an_idempotency_key_annotation_the_server_cannot_see_is_sent_once() {
    // The annotation alone, no header carrying it (no idempotency-key layer
    // above): a repeat would reach the server without a key, so the POST is
    // sent once.
    let mock = MockService::new()
        .respond(Reply::code(502))
        .otherwise(Reply::code(200));
    let mut r = req(Method::POST);
    r.extensions_mut()
        .insert(rebound_core::IdempotencyKey("k".parse().unwrap()));
    r.headers_mut()
        .insert("x-other", http::HeaderValue::from_static("not-k"));
    let res = stack(&mock).oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotEligible)
    );
    assert_eq!(mock.call_count(), 1);
}

fn connect_refused() -> BoxError {
    Box::new(
        Error::new(ErrorKind::Connect)
            .with_source(io::Error::from(io::ErrorKind::ConnectionRefused)),
    )
}

#[tokio::test(start_paused = true)]
async fn post_refused_at_connect_is_retried() {
    let mock = MockService::new()
        .fail(connect_refused())
        .respond(Reply::code(200));
    let res = stack(&mock).oneshot(req(Method::POST)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(Attempts::of(res.extensions()), 2);
    assert_eq!(mock.call_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn post_reset_mid_flight_is_not_retried() {
    let mock = MockService::new()
        .fail(io::Error::from(io::ErrorKind::ConnectionReset))
        .otherwise(Reply::code(200));
    let err = stack(&mock).oneshot(req(Method::POST)).await.unwrap_err();
    assert_eq!(err.retry_stop(), Some(RetryStop::NotEligible));
    assert_eq!(mock.call_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn last_error_is_returned_named_and_counted() {
    let mock = MockService::new().otherwise_fail(connect_refused);
    let err = stack(&mock).oneshot(get()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Connect));
    assert!((err.retry_stop() == Some(RetryStop::Attempts)));
    assert_eq!(err.attempts(), 3);
    let shown = err.to_string();
    assert!(
        shown.contains("GET http://test.example/v1/things"),
        "{shown}"
    );
    assert!(!shown.contains("secret"), "{shown}");
    assert_eq!(
        Verdict::of(err.extensions()).reason().unwrap().as_str(),
        "connect refused"
    );
}

// ===== bodies =====

/// A request body that cannot be replayed.
struct OnceBody(Option<Bytes>);

impl Body for OnceBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }
}

impl CloneableBody for OnceBody {
    fn try_replay(&self) -> Option<Self> {
        None
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_cannot_be_replayed_is_sent_once() {
    let mock = MockService::new()
        .respond(Reply::code(503))
        .otherwise(Reply::code(200));
    let r = Request::get("http://test.example/")
        .body(OnceBody(Some(Bytes::from_static(b"stream"))))
        .unwrap();
    let res = stack(&mock).oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    let v = Verdict::of(res.extensions());
    assert!(v.is_fatal());
    assert_eq!(v.reason().unwrap().as_str(), "body not replayable");
    assert_eq!(mock.call_count(), 1);
    assert_eq!(mock.calls()[0].body.as_deref(), Some(&b"stream"[..]));
}

/// A request body that gives one copy (for the first attempt), then no more:
/// like a streamed body that passed its replay cap during the first attempt.
struct OneCopy(Option<Bytes>, bool);

impl Body for OneCopy {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }
}

impl CloneableBody for OneCopy {
    fn try_replay(&self) -> Option<Self> {
        // The original may be copied once; copies cannot be.
        self.1.then(|| OneCopy(self.0.clone(), false))
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_refused_for_the_body_costs_no_budget() {
    let mock = MockService::new()
        .respond(Reply::code(503))
        .otherwise(Reply::code(200));
    // No ratio, a floor of 1/s over 10 s: 10 retries in the window, paced
    // by a bucket of 1 (the floor accrues over time): one retry now.
    let budget = Arc::new(RetryBudget::try_new(0.0, Duration::from_secs(10), 1).unwrap());
    let policy = RetryPolicy::default().budget(budget.clone());
    let r = Request::get("http://test.example/")
        .body(OneCopy(Some(Bytes::from_static(b"stream")), true))
        .unwrap();
    assert_eq!(budget.remaining(), 1);
    let res = stack_with(mock.clone(), policy).oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::NotReplayable)
    );
    assert_eq!(mock.call_count(), 1);
    assert_eq!(budget.remaining(), 1, "no retry was sent, none is charged");
}

/// A response body that records how much of it was read, when, and when it
/// was dropped; it yields `chunks` chunks of `chunk` bytes, then hangs or
/// ends.
struct Tracked {
    chunks: usize,
    chunk: usize,
    hang: bool,
    read: Arc<AtomicUsize>,
    dropped_at: Arc<Mutex<Option<Instant>>>,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if self.chunks == 0 {
            return if self.hang {
                Poll::Pending
            } else {
                Poll::Ready(None)
            };
        }
        self.chunks -= 1;
        self.read.fetch_add(self.chunk, Ordering::SeqCst);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0u8; self.chunk])))))
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        *self.dropped_at.lock().unwrap() = Some(Instant::now());
    }
}

type Probe = (
    Arc<AtomicUsize>,
    Arc<Mutex<Option<Instant>>>,
    Arc<Mutex<Vec<Instant>>>,
);

type DrainResponse = Response<http_body_util::Either<Tracked, Full<Bytes>>>;

/// A 503 with Retry-After: 3 and a tracked body, then a 200.
fn draining_service(
    chunks: usize,
    chunk: usize,
    hang: bool,
) -> (
    impl tower::Service<
            Request<Full<Bytes>>,
            Response = DrainResponse,
            Error = BoxError,
            Future = impl Send,
        > + Clone,
    Probe,
) {
    let read = Arc::new(AtomicUsize::new(0));
    let dropped_at = Arc::new(Mutex::new(None));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let probe = (read.clone(), dropped_at.clone(), calls.clone());
    let svc = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let mut c = calls.lock().unwrap();
        c.push(Instant::now());
        let first = c.len() == 1;
        let (read, dropped_at) = (read.clone(), dropped_at.clone());
        async move {
            let res = if first {
                Response::builder()
                    .status(503)
                    .header("retry-after", "3")
                    .body(http_body_util::Either::Left(Tracked {
                        chunks,
                        chunk,
                        hang,
                        read,
                        dropped_at,
                    }))
                    .unwrap()
            } else {
                Response::new(http_body_util::Either::Right(Full::new(Bytes::new())))
            };
            Ok::<_, BoxError>(res)
        }
    });
    (svc, probe)
}

#[tokio::test(start_paused = true)]
async fn discarded_response_is_drained_during_the_sleep() {
    let (svc, (read, dropped_at, calls)) = draining_service(4, 1024, false);
    let start = Instant::now();
    let res = stack_with(svc, RetryPolicy::default())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(read.load(Ordering::SeqCst), 4096, "read to the end");
    // Read at once, dropped long before the retry.
    assert_eq!(dropped_at.lock().unwrap().unwrap(), start);
    let calls = calls.lock().unwrap();
    assert_eq!(calls[1] - calls[0], Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn drain_is_bounded_in_bytes() {
    let (svc, (read, _dropped, calls)) = draining_service(1_000, 16 * 1024, false);
    stack_with(svc, RetryPolicy::default())
        .oneshot(get())
        .await
        .unwrap();
    let read = read.load(Ordering::SeqCst);
    assert!(read <= 64 * 1024 + 16 * 1024, "read {read} bytes");
    assert!(read >= 64 * 1024, "read {read} bytes");
    let calls = calls.lock().unwrap();
    assert_eq!(calls[1] - calls[0], Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn drain_never_delays_the_retry_and_stops_after_one_second() {
    let (svc, (read, dropped_at, calls)) = draining_service(1, 10, true);
    let start = Instant::now();
    stack_with(svc, RetryPolicy::default())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(read.load(Ordering::SeqCst), 10);
    assert_eq!(
        dropped_at.lock().unwrap().unwrap() - start,
        Duration::from_secs(1),
        "a stalled body is let go after 1 s"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls[1] - calls[0], Duration::from_secs(3), "retry on time");
}

// ===== cancellation =====

#[tokio::test(start_paused = true)]
async fn dropping_during_the_sleep_stops_everything() {
    let mock = MockService::new()
        .respond(Reply::code(503).header("retry-after", "5"))
        .otherwise(Reply::code(200));
    let fut = stack(&mock).oneshot(get());
    // Give up after 1 s, in the middle of the 5 s sleep.
    assert!(tokio::time::timeout(Duration::from_secs(1), fut)
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(mock.call_count(), 1, "no further call after the drop");
}

#[tokio::test(start_paused = true)]
async fn dropping_during_an_attempt_stops_everything() {
    let mock = MockService::new()
        .respond(Reply::code(503))
        .hang()
        .otherwise(Reply::code(200));
    let fut = stack(&mock).oneshot(get());
    assert!(tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(mock.call_count(), 2);
}

// ===== budget =====

async fn burst(policy: RetryPolicy, requests: usize) -> (usize, usize) {
    let mock = MockService::new().otherwise(Reply::code(503));
    let svc = stack_with(mock.clone(), policy);
    let results = join_all((0..requests).map(|_| svc.clone().oneshot(get()))).await;
    let budget_stops = results
        .iter()
        .filter(|r| r.as_ref().unwrap().extensions().get::<RetryStop>() == Some(&RetryStop::Budget))
        .count();
    (mock.call_count(), budget_stops)
}

#[tokio::test(start_paused = true)]
async fn budget_bounds_a_total_outage_at_defaults() {
    let (attempts, stopped) = burst(RetryPolicy::default(), 1_000).await;
    let ratio = attempts as f64 / 1_000.0;
    println!("always failing, defaults: {attempts} attempts for 1000 requests = {ratio:.3} (budget stopped {stopped})");
    assert!(ratio <= 1.2, "{ratio}");
    assert!(ratio >= 1.19, "the budget should be used: {ratio}");
}

#[tokio::test(start_paused = true)]
async fn budget_bound_holds_at_ratios_that_are_not_one_over_n() {
    for ratio in [0.1, 0.2, 0.6] {
        let budget = Arc::new(RetryBudget::try_new(ratio, Duration::from_secs(10), 0).unwrap());
        let policy = RetryPolicy::default()
            .max_attempts(3)
            .budget(budget.clone());
        let (attempts, _) = burst(policy, 1_000).await;
        let retries = attempts - 1_000;
        println!("ratio {ratio}: {retries} retries for 1000 requests");
        assert!(
            retries as f64 <= ratio * 1_000.0 + 1e-6,
            "ratio {ratio}: {retries}"
        );
        assert!(
            retries as f64 >= ratio * 1_000.0 - 1.0,
            "ratio {ratio}: {retries}"
        );
        assert_eq!(budget.remaining(), 0);
    }
}

/// One request with `max_attempts(100)` against a 503 storm, with a 1 ms
/// backoff: the floor is a token bucket (a burst of 10 at the default 10/s),
/// so it does not get the window's whole floor (100) at once.
#[tokio::test(start_paused = true)]
async fn one_request_cannot_take_the_whole_floor_at_once() {
    let mock = MockService::new().otherwise(Reply::code(503));
    let budget = Arc::new(RetryBudget::default());
    let storm = |mock: &MockService, budget: &Arc<RetryBudget>| {
        ServiceBuilder::new()
            .layer(RetryLayer::new(
                RetryPolicy::default()
                    .max_attempts(100)
                    .budget(budget.clone()),
            ))
            .layer(BackoffLayer::new(Backoff::exponential(
                Duration::from_millis(1),
                Duration::from_millis(1),
            )))
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(mock.clone())
    };
    let start = Instant::now();
    let res = storm(&mock, &budget).oneshot(get()).await.unwrap();
    let took = start.elapsed();
    let at = |limit: Duration| {
        mock.calls()
            .iter()
            .filter(|c| c.at - start <= limit)
            .count()
    };
    let in_200ms = at(Duration::from_millis(200));
    println!(
        "max_attempts(100), 503 storm, default budget: {} attempts in 200 ms, {} in all, \
         stopped by {:?} after {took:?}",
        in_200ms,
        mock.call_count(),
        res.extensions().get::<RetryStop>()
    );
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The first attempt, the burst of 10, then one more per 100 ms.
    assert!(in_200ms <= 1 + 10 + 2, "{in_200ms} attempts in 200 ms");
    assert!(in_200ms >= 11, "the burst is usable: {in_200ms}");
    // The budget refuses (it never waits): the request stops after the
    // burst, leaving the rest of the window's floor to other requests.
    assert_eq!(mock.call_count(), 11);
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Budget)
    );
    // A second later the floor has accrued again: another storm-struck
    // request gets its own burst.
    tokio::time::advance(Duration::from_secs(1)).await;
    let res = storm(&mock, &budget).oneshot(get()).await.unwrap();
    assert_eq!(Attempts::of(res.extensions()), 11);
    assert_eq!(mock.call_count(), 22);
}

#[tokio::test(start_paused = true)]
async fn budget_shared_across_layers() {
    let budget = Arc::new(RetryBudget::try_new(0.1, Duration::from_secs(10), 0).unwrap());
    let a = MockService::new().otherwise(Reply::code(503));
    let b = MockService::new().otherwise(Reply::code(503));
    let sa = stack_with(a.clone(), RetryPolicy::default().budget(budget.clone()));
    let sb = stack_with(b.clone(), RetryPolicy::default().budget(budget.clone()));
    let mut futs = Vec::new();
    for _ in 0..50 {
        futs.push(sa.clone().oneshot(get()));
        futs.push(sb.clone().oneshot(get()));
    }
    join_all(futs).await;
    assert_eq!(a.call_count() + b.call_count() - 100, 10);
}

#[tokio::test(start_paused = true)]
async fn budget_allows_rare_failures() {
    let rng = Arc::new(Mutex::new(rand::rngs::SmallRng::seed_from_u64(2024)));
    let inner = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let fail = rng.lock().unwrap().random_bool(0.01);
        async move {
            let mut res = Response::new(Full::new(Bytes::new()));
            if fail {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, BoxError>(res)
        }
    });
    let svc = stack_with(inner, RetryPolicy::default());
    let (mut allowed, mut refused) = (0u32, 0u32);
    for _ in 0..10_000 {
        let res = svc.clone().oneshot(get()).await.unwrap();
        let attempts = Attempts::of(res.extensions());
        let stop = res.extensions().get::<RetryStop>().copied();
        allowed += attempts - 1;
        if stop == Some(RetryStop::Budget) {
            refused += 1;
        }
    }
    let share = f64::from(allowed) / f64::from(allowed + refused);
    println!(
        "1 % failures: {allowed} retries allowed, {refused} refused ({:.2} %)",
        share * 100.0
    );
    assert!(allowed > 50, "failures happened: {allowed}");
    assert!(share >= 0.99, "{share}");
}

// ===== readiness, step by step =====

#[tokio::test(start_paused = true)]
async fn retry_waits_for_the_inner_service_to_be_ready() {
    let (mock, mut handle) =
        tower_test::mock::pair::<Request<Full<Bytes>>, Response<Full<Bytes>>>();
    let svc = stack_with(mock, RetryPolicy::default());
    handle.allow(1);
    let mut fut = tokio_test::task::spawn(svc.oneshot(get()));
    tokio_test::assert_pending!(fut.poll());

    let (first, respond) = handle.next_request().await.unwrap();
    assert_eq!(AttemptNumber::of(first.extensions()), 1);
    let mut res = Response::new(Full::new(Bytes::new()));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res.headers_mut()
        .insert("retry-after", "1".parse().unwrap());
    respond.send_response(res);

    // The sleep ends, but the inner service is not ready: no second call.
    tokio_test::assert_pending!(fut.poll());
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio_test::assert_pending!(fut.poll());
    assert!(handle.poll_request().is_pending());

    // Ready again: the retry goes out, stamped as attempt 2.
    handle.allow(1);
    tokio_test::assert_pending!(fut.poll());
    let (second, respond) = handle.next_request().await.unwrap();
    assert_eq!(AttemptNumber::of(second.extensions()), 2);
    respond.send_response(Response::new(Full::new(Bytes::from_static(b"ok"))));
    let res = tokio_test::assert_ready_ok!(fut.poll());
    assert_eq!(Attempts::of(res.extensions()), 2);
}

#[tokio::test(start_paused = true)]
async fn a_passed_deadline_stops_the_loop() {
    let mock = MockService::new()
        .fail(Error::timeout(rebound_core::TimeoutStage::Headers))
        .otherwise(Reply::code(200));
    let mut r = get();
    r.extensions_mut().insert(Deadline(Instant::now()));
    let err = stack(&mock).oneshot(r).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Timeout(_)));
    assert_eq!(err.retry_stop(), Some(RetryStop::Deadline));
    assert_eq!(mock.call_count(), 1);
}

#[test]
fn the_retry_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let mock = MockService::new();
    let fut = stack(&mock).oneshot(get());
    assert_send(&fut);
}
