//! The shutdown layer over the layers that hold a request before they call
//! their inner service (the shared wait of `wait.rs`), on paused time:
//! requests held at a closed Retry-After gate (the holding gate above a
//! concurrency limit, and a retry held at the closing gate below the retry
//! loop) and requests queued at a full adaptive limit end at once when the
//! shutdown begins, `Closed` and not sent (with their last real outcome
//! when they had one), reach nothing below, and count as completed; the
//! attempts in flight get the grace and are cut at its end; and no permit
//! of either limit is left behind by a request that was ended or cut.
//!
//! Every test first checks that the wait would have lasted without the
//! shutdown (its task is still waiting well into the pause), so an early
//! end can only come from the shutdown.
#![cfg(all(
    feature = "shutdown",
    feature = "limit",
    feature = "retry-after",
    feature = "retry"
))]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use rebound_core::gate::{GateTable, RetryAfterGateLayer};
use rebound_core::limit::{AdaptiveLimitLayer, Aimd, ConcurrencyLimitLayer};
use rebound_core::shutdown::{ShutdownHandle, ShutdownLayer, ShutdownReport};
use rebound_core::{
    ClassifyLayer, Error, ErrorKind, HttpClassifier, PreviousAttempt, RetryAfterHint, RetryBudget,
    RetryLayer, RetryPolicy, Sent, Verdict,
};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

type Body = Full<Bytes>;

const PAUSE: Duration = Duration::from_secs(60);

fn req(path: &str) -> Request<Body> {
    Request::get(format!("http://api.example{path}"))
        .body(Full::default())
        .unwrap()
}

/// The paths the upstream was called with, in order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn to(&self, path: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|p| *p == path).count()
    }
}

/// `/busy` answers 429 with a 60 s hint (what the Retry-After layer would
/// leave for `Retry-After: 60`), `/busy-after/N` the same after N seconds,
/// `/slow/N` 200 after N seconds, `/flaky` 503 (no hint) after 1 s;
/// anything else 200 at once.
fn upstream(
    calls: Calls,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = impl Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |req: Request<Body>| {
        let path = req.uri().path().to_owned();
        calls.0.lock().unwrap().push(path.clone());
        async move {
            let mut res = Response::new(Full::default());
            let too_many = |res: &mut Response<Body>| {
                *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                res.extensions_mut().insert(RetryAfterHint(PAUSE));
            };
            if path == "/busy" {
                too_many(&mut res);
            } else if let Some(n) = path.strip_prefix("/busy-after/") {
                sleep(Duration::from_secs(n.parse().unwrap())).await;
                too_many(&mut res);
            } else if let Some(n) = path.strip_prefix("/slow/") {
                sleep(Duration::from_secs(n.parse().unwrap())).await;
            } else if path == "/flaky" {
                sleep(Duration::from_secs(1)).await;
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok(res)
        }
    })
}

/// Send `req` on a task; the task keeps only the status, so a response body
/// that holds a permit is dropped as soon as the response arrives.
fn spawn<S, B>(svc: &S, req: Request<Body>) -> JoinHandle<Result<StatusCode, Error>>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Error> + Clone + Send + 'static,
    S::Future: Send,
{
    let svc = svc.clone();
    tokio::spawn(async move { svc.oneshot(req).await.map(|res| res.status()) })
}

fn counts(report: ShutdownReport) -> (usize, usize, usize) {
    (report.in_flight, report.completed, report.cancelled)
}

/// What the docs promise a request whose wait a shutdown ended: `Closed`,
/// not sent, fatal, and `detail` names the wait.
#[track_caller]
fn assert_closed_while_waiting(err: &Error, detail: &str) {
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert_eq!(
        err.extensions().get::<Sent>(),
        Some(&Sent::NotSent),
        "{err}"
    );
    assert!(Verdict::of(err.extensions()).is_fatal(), "{err}");
    assert!(err.to_string().contains(detail), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn requests_held_at_a_closed_gate_above_the_limit_end_at_once_not_sent() {
    // The ready-made client's order: a holding gate above the concurrency
    // limit, the closing gate below it, over one table.
    let handle = ShutdownHandle::new();
    let calls = Calls::default();
    let table = Arc::new(GateTable::default());
    let limit = ConcurrencyLimitLayer::new(4);
    let permits = limit.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(RetryAfterGateLayer::shared(table.clone()).closes_gates(false))
        .layer(limit)
        .layer(RetryAfterGateLayer::shared(table.clone()))
        .service(upstream(calls.clone()));

    let start = Instant::now();
    assert_eq!(spawn(&svc, req("/busy")).await.unwrap().unwrap(), 429);
    let uri = "http://api.example/".parse().unwrap();
    assert_eq!(table.closed_until(&uri), Some(start + PAUSE), "gate closed");

    let held: Vec<_> = (0..3)
        .map(|i| spawn(&svc, req(&format!("/next/{i}"))))
        .collect();
    // Control: without a shutdown they wait out the pause.
    sleep(Duration::from_secs(30)).await;
    assert!(held.iter().all(|t| !t.is_finished()), "still held at 30 s");
    assert_eq!(calls.len(), 1, "none of them was sent");
    assert_eq!(handle.open(), 3);
    assert_eq!(permits.available(), 4, "held above the limit: no permit");

    let at = Instant::now();
    let report = handle.shutdown(Duration::from_secs(10)).await;
    assert_eq!(at.elapsed(), Duration::ZERO, "nothing in flight: no grace");
    assert_eq!(counts(report), (3, 3, 0), "ended waits count as completed");
    for t in held {
        let err = t.await.unwrap().unwrap_err();
        assert_closed_while_waiting(&err, "held at the gate");
        assert!(err.extensions().get::<PreviousAttempt>().is_none());
    }
    assert_eq!(at.elapsed(), Duration::ZERO, "ended at once");
    assert!(
        Instant::now() < start + PAUSE,
        "well before the pause ended"
    );
    assert_eq!(calls.len(), 1, "nothing more reached the inner service");
    assert_eq!((permits.available(), permits.in_flight()), (4, 0));
    assert_eq!(handle.open(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_held_at_the_closing_gate_ends_with_its_last_real_outcome() {
    // Retry ─► RetryAfterGate ─► Classify: a 503 (no hint) is retried at
    // once, and the retry meets the gate that another request's 429 closed
    // meanwhile, so it waits there for the rest of the pause.
    let handle = ShutdownHandle::new();
    let calls = Calls::default();
    let table = Arc::new(GateTable::default());
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .budget(Arc::new(RetryBudget::new(
            1.0,
            Duration::from_secs(10),
            100,
        )));
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(RetryLayer::new(policy))
        .layer(RetryAfterGateLayer::shared(table.clone()))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(upstream(calls.clone()));
    // Another stack of the client, closing the same host's gate.
    let other = ServiceBuilder::new()
        .layer(RetryAfterGateLayer::shared(table.clone()))
        .service(upstream(calls.clone()));

    let start = Instant::now();
    let flaky = spawn(&svc, req("/flaky"));
    tokio::task::yield_now().await; // past the gate, waiting for its 503
    assert_eq!(other.oneshot(req("/busy")).await.unwrap().status(), 429);

    // Control: at 1 s the 503 comes and the retry is held at the gate.
    sleep(Duration::from_secs(30)).await;
    assert!(!flaky.is_finished(), "the retry still waits at 30 s");
    assert_eq!((calls.to("/flaky"), calls.len()), (1, 2), "retry not sent");

    let at = Instant::now();
    let report = handle.shutdown(Duration::from_secs(10)).await;
    assert_eq!(at.elapsed(), Duration::ZERO);
    assert_eq!(counts(report), (1, 1, 0));
    let err = flaky.await.unwrap().unwrap_err();
    assert_closed_while_waiting(&err, "held at the gate");
    // The last real outcome: the 503 of the first attempt.
    let prev = err.extensions().get::<PreviousAttempt>().expect("carried");
    assert_eq!(prev.attempt, 1);
    // Stopped by the shutdown, as a backoff sleep is; the held attempt 2
    // was never made.
    assert_eq!(err.retry_stop(), Some(rebound_core::RetryStop::Closed));
    assert_eq!(err.attempts(), 1);
    assert!(prev.verdict.is_retryable(), "{:?}", prev.verdict);
    assert!(Instant::now() < start + PAUSE);
    assert_eq!(calls.to("/flaky"), 1, "no further attempt");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn attempts_queued_at_a_full_adaptive_limit_end_at_once_in_flight_ones_get_the_grace() {
    let handle = ShutdownHandle::new();
    let calls = Calls::default();
    let limit = AdaptiveLimitLayer::new(Aimd::default().min_limit(1).initial_limit(2).max_limit(2));
    let limiter = limit.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(limit)
        .service(upstream(calls.clone()));

    let quick = spawn(&svc, req("/slow/5")); // ends within the grace
    let slow = spawn(&svc, req("/slow/60")); // cut at the grace's end
    tokio::task::yield_now().await;
    assert_eq!((limiter.in_flight(), limiter.available()), (2, 0), "full");
    let queued: Vec<_> = (0..3).map(|_| spawn(&svc, req("/slow/1"))).collect();

    // Control: they queue (the first slot frees only at 5 s).
    sleep(Duration::from_secs(1)).await;
    assert!(queued.iter().all(|t| !t.is_finished()));
    assert_eq!((limiter.queued(), calls.len()), (3, 2));
    assert_eq!(handle.open(), 5);

    let at = Instant::now();
    let shutdown = tokio::spawn(handle.shutdown(Duration::from_secs(10)));
    for t in queued {
        let err = t.await.unwrap().unwrap_err();
        assert_closed_while_waiting(&err, "adaptive-limit slot");
    }
    assert_eq!(at.elapsed(), Duration::ZERO, "the queue ends at once");
    assert_eq!(limiter.queued(), 0);

    assert_eq!(quick.await.unwrap().unwrap(), StatusCode::OK);
    assert_eq!(
        at.elapsed(),
        Duration::from_secs(4),
        "answered in the grace"
    );
    let err = slow.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(
        err.extensions().get::<Sent>(),
        Some(&Sent::MaybeProcessed),
        "cut in flight: it may have been sent"
    );
    assert_eq!(
        at.elapsed(),
        Duration::from_secs(10),
        "cut at the grace's end"
    );

    let report = shutdown.await.unwrap();
    assert_eq!(counts(report), (5, 4, 1));
    assert_eq!(calls.len(), 2, "the queued ones were never sent");
    // Nothing leaked, and a cut attempt is no overload: the limit stands.
    assert_eq!((limiter.available(), limiter.in_flight()), (2, 0));
    assert_eq!(limiter.current_limit(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_permit_of_either_limit_is_left_behind_after_a_shutdown() {
    // Both limits in the client's order: one request holds a permit and
    // the only attempt slot (cut), one holds a permit and queues for the
    // slot, one queues for a permit (both ended at once).
    let handle = ShutdownHandle::new();
    let calls = Calls::default();
    let concurrency = ConcurrencyLimitLayer::new(2);
    let permits = concurrency.limiter().clone();
    let adaptive =
        AdaptiveLimitLayer::new(Aimd::default().min_limit(1).initial_limit(1).max_limit(1));
    let slots = adaptive.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(concurrency)
        .layer(adaptive)
        .service(upstream(calls.clone()));

    let in_flight = spawn(&svc, req("/slow/60"));
    tokio::task::yield_now().await;
    let for_slot = spawn(&svc, req("/slow/1"));
    tokio::task::yield_now().await;
    let for_permit = spawn(&svc, req("/slow/1"));

    sleep(Duration::from_secs(1)).await;
    assert!(!for_slot.is_finished() && !for_permit.is_finished());
    assert_eq!((permits.available(), permits.queued()), (0, 1));
    assert_eq!((slots.available(), slots.queued()), (0, 1));
    assert_eq!(calls.len(), 1);

    let at = Instant::now();
    let shutdown = tokio::spawn(handle.shutdown(Duration::from_secs(5)));
    let err = for_slot.await.unwrap().unwrap_err();
    assert_closed_while_waiting(&err, "adaptive-limit slot");
    let err = for_permit.await.unwrap().unwrap_err();
    assert_closed_while_waiting(&err, "concurrency permit");
    assert_eq!(at.elapsed(), Duration::ZERO);
    assert!(matches!(
        in_flight.await.unwrap().unwrap_err().kind(),
        ErrorKind::Closed
    ));
    assert_eq!(at.elapsed(), Duration::from_secs(5));
    assert_eq!(counts(shutdown.await.unwrap()), (3, 2, 1));

    assert_eq!(
        (permits.available(), permits.in_flight(), permits.queued()),
        (2, 0, 0),
        "every concurrency permit is back"
    );
    assert_eq!(
        (slots.available(), slots.in_flight(), slots.queued()),
        (1, 0, 0),
        "every adaptive slot is back"
    );
    assert_eq!(calls.len(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_permit_lent_to_a_request_held_at_the_gate_is_back_after_a_shutdown() {
    // A request that queued for its permit while the gate closed takes it
    // as a `PermitLease`, and the closing gate gives it back while the
    // request waits there: the shutdown must not leave it taken.
    let handle = ShutdownHandle::new();
    let calls = Calls::default();
    let table = Arc::new(GateTable::default());
    let limit = ConcurrencyLimitLayer::new(1);
    let permits = limit.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(RetryAfterGateLayer::shared(table.clone()).closes_gates(false))
        .layer(limit)
        .layer(RetryAfterGateLayer::shared(table.clone()))
        .service(upstream(calls.clone()));

    let first = spawn(&svc, req("/busy-after/2")); // the permit, then a 429
    tokio::task::yield_now().await;
    let lent = spawn(&svc, req("/next")); // queues for the permit
    tokio::task::yield_now().await;
    assert_eq!(permits.queued(), 1);

    sleep(Duration::from_secs(3)).await;
    assert_eq!(first.await.unwrap().unwrap(), 429);
    // `lent` got the permit, met the closed gate below and gave it back.
    assert!(!lent.is_finished());
    assert_eq!((permits.available(), permits.queued()), (1, 0));
    let held = spawn(&svc, req("/other")); // held above the limit
    sleep(Duration::from_secs(27)).await;
    assert!(!lent.is_finished() && !held.is_finished(), "held at 30 s");
    assert_eq!(calls.len(), 1);

    let at = Instant::now();
    let report = handle.shutdown(Duration::from_secs(10)).await;
    assert_eq!(at.elapsed(), Duration::ZERO);
    assert_eq!(counts(report), (2, 2, 0));
    for t in [lent, held] {
        let err = t.await.unwrap().unwrap_err();
        assert_closed_while_waiting(&err, "held at the gate");
    }
    assert_eq!(calls.len(), 1, "nothing more was sent");
    assert_eq!(
        (permits.available(), permits.in_flight(), permits.queued()),
        (1, 0, 0),
        "the lent permit is back"
    );
    // And it is really free: a stack over the same limiter takes it at once.
    let after = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::shared(permits.clone()))
        .service(upstream(calls.clone()));
    let res = after
        .oneshot(
            Request::builder()
                .method(Method::GET)
                .uri("http://b.example/")
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        (res.status(), Instant::now() - at),
        (StatusCode::OK, Duration::ZERO)
    );
}

/// Backpressure below (a concurrency limit that reserves its permit in
/// `poll_ready`): a caller waiting for readiness is made ready at once by
/// the shutdown and refused, never sent; the request in flight gets the
/// grace period.
#[tokio::test(start_paused = true)]
async fn a_caller_waiting_in_poll_ready_behind_backpressure_is_refused_at_once() {
    let handle = ShutdownHandle::new();
    let calls = Calls::default();
    let seen = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(ConcurrencyLimitLayer::new(1).backpressure(true))
        .service(service_fn(move |req: Request<Body>| {
            seen.0.lock().unwrap().push(req.uri().path().to_owned());
            async move {
                sleep(Duration::from_secs(5)).await;
                Ok::<_, Infallible>(Response::new(Body::default()))
            }
        }));
    let first = tokio::spawn(svc.clone().oneshot(req("/first")));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(calls.len(), 1, "the first holds the only permit");
    // `oneshot` waits in `poll_ready` for the permit.
    let second = tokio::spawn(svc.clone().oneshot(req("/second")));
    sleep(Duration::from_secs(1)).await;
    assert!(
        !second.is_finished(),
        "waits for readiness without a shutdown"
    );
    assert_eq!(handle.open(), 1, "not called yet: not counted");

    let start = Instant::now();
    let shutdown = tokio::spawn(handle.shutdown(Duration::from_secs(30)));
    let err = second.await.unwrap().unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "at once");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert_eq!(calls.to("/second"), 0, "never sent");
    assert!(first.await.unwrap().is_ok(), "answered within the grace");
    let report = shutdown.await.unwrap();
    assert_eq!(counts(report), (1, 1, 0));
}
