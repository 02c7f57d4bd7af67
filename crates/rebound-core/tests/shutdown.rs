//! The shutdown layer on paused time: refusal before anything is sent, the
//! retry loop's backoff sleep ended at once with its last outcome, the
//! grace period and the cut, a zero grace, repeated and concurrent calls,
//! and the report's counts.
#![cfg(all(feature = "shutdown", feature = "retry", feature = "backoff"))]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use rebound_core::shutdown::{ShutdownHandle, ShutdownLayer};
use rebound_core::{
    Backoff, BackoffLayer, ClassifyLayer, ErrorKind, HttpClassifier, Jitter, PreviousAttempt,
    RetryBudget, RetryLayer, RetryPolicy, RetryStop, Sent,
};
use tokio::time::{sleep, Instant};
use tower::{service_fn, ServiceBuilder, ServiceExt};

type Body = Full<Bytes>;

fn req(path: &str) -> Request<Body> {
    Request::get(format!("http://api.example{path}"))
        .body(Full::default())
        .unwrap()
}

/// `/slow/N` answers 200 after N seconds; `/busy` answers 503 at once.
/// Counts the calls it gets.
fn upstream(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |req: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let path = req.uri().path().to_owned();
            if let Some(n) = path.strip_prefix("/slow/") {
                sleep(Duration::from_secs(n.parse().unwrap())).await;
                return Ok(Response::new(Full::default()));
            }
            let mut res = Response::new(Full::default());
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok(res)
        }
    })
}

fn stack(
    handle: &ShutdownHandle,
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = rebound_core::Error,
    Future = impl Send,
> + Clone {
    let policy = RetryPolicy::default()
        .max_attempts(5)
        .budget(Arc::new(RetryBudget::new(
            1.0,
            Duration::from_secs(10),
            100,
        )));
    ServiceBuilder::new()
        .layer(ShutdownLayer::new(handle))
        .layer(RetryLayer::new(policy))
        .layer(BackoffLayer::new(
            Backoff::exponential(Duration::from_secs(30), Duration::from_secs(30))
                .jitter(Jitter::Proportional(0.0)),
        ))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(upstream(calls))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_after_shutdown_is_refused_and_never_sent() {
    let handle = ShutdownHandle::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = stack(&handle, calls.clone());

    let report = handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        (report.in_flight, report.completed, report.cancelled),
        (0, 0, 0)
    );
    assert!(handle.is_closed());

    let err = svc.oneshot(req("/slow/1")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert!(rebound_core::Verdict::of(err.extensions()).is_fatal());
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing below was called");
    assert_eq!(handle.open(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_backoff_sleep_ends_at_once_with_the_last_outcome() {
    let handle = ShutdownHandle::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = stack(&handle, calls.clone());

    let busy = tokio::spawn(svc.oneshot(req("/busy")));
    sleep(Duration::from_secs(1)).await; // the 503, then a 30 s sleep
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(handle.open(), 1);

    let start = Instant::now();
    let report = handle.shutdown(Duration::from_secs(10)).await;
    assert_eq!(start.elapsed(), Duration::ZERO, "no grace needed");
    assert_eq!(
        (report.in_flight, report.completed, report.cancelled),
        (1, 1, 0)
    );

    let err = busy.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(err.retry_stop(), Some(RetryStop::Closed));
    let prev = err.extensions().get::<PreviousAttempt>().unwrap();
    assert_eq!(prev.attempt, 1);
    assert!(prev.verdict.is_retryable());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no further attempt");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn in_flight_requests_get_the_grace_period_then_are_cut() {
    let handle = ShutdownHandle::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = stack(&handle, calls.clone());

    let quick = tokio::spawn(svc.clone().oneshot(req("/slow/2")));
    let slow = tokio::spawn(svc.clone().oneshot(req("/slow/60")));
    tokio::task::yield_now().await;
    assert_eq!(handle.open(), 2);

    let start = Instant::now();
    let report = handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(
        (report.in_flight, report.completed, report.cancelled),
        (2, 1, 1)
    );

    assert!(quick.await.unwrap().is_ok());
    let err = slow.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5),
        "cut at the end of grace"
    );
    assert_eq!(handle.open(), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_wait_ends_early_when_everything_is_done() {
    let handle = ShutdownHandle::new();
    let svc = stack(&handle, Arc::new(AtomicUsize::new(0)));
    let quick = tokio::spawn(svc.oneshot(req("/slow/2")));
    tokio::task::yield_now().await;

    let start = Instant::now();
    let report = handle.shutdown(Duration::from_secs(60)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(
        (report.in_flight, report.completed, report.cancelled),
        (1, 1, 0)
    );
    assert!(quick.await.unwrap().is_ok());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn zero_grace_cuts_at_once_and_every_call_agrees() {
    let handle = ShutdownHandle::new();
    let svc = stack(&handle, Arc::new(AtomicUsize::new(0)));
    let slow: Vec<_> = (0..3)
        .map(|_| tokio::spawn(svc.clone().oneshot(req("/slow/60"))))
        .collect();
    tokio::task::yield_now().await;

    let start = Instant::now();
    let other = handle.clone();
    let (a, b) = tokio::join!(
        handle.shutdown(Duration::ZERO),
        other.shutdown(Duration::from_secs(30)),
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(a, b, "concurrent calls agree");
    assert_eq!((a.in_flight, a.completed, a.cancelled), (3, 0, 3));
    for t in slow {
        assert!(matches!(
            t.await.unwrap().unwrap_err().kind(),
            ErrorKind::Closed
        ));
    }
    assert_eq!(
        handle.shutdown(Duration::from_secs(1)).await,
        a,
        "and later ones"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_request_counts_as_completed() {
    let handle = ShutdownHandle::new();
    let svc = stack(&handle, Arc::new(AtomicUsize::new(0)));
    let dropped = tokio::spawn(svc.oneshot(req("/slow/60")));
    tokio::task::yield_now().await;
    assert_eq!(handle.open(), 1);

    let shutdown = tokio::spawn(handle.shutdown(Duration::from_secs(10)));
    sleep(Duration::from_secs(1)).await;
    dropped.abort();
    let report = shutdown.await.unwrap();
    assert_eq!(
        (report.in_flight, report.completed, report.cancelled),
        (1, 1, 0)
    );
    assert_eq!(handle.open(), 0);
}

#[cfg(feature = "limit")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_queued_at_a_limit_ends_at_once() {
    use rebound_core::ConcurrencyLimitLayer;

    let handle = ShutdownHandle::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(ShutdownLayer::new(&handle))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(upstream(calls.clone()));

    let holder = tokio::spawn(svc.clone().oneshot(req("/slow/60")));
    tokio::task::yield_now().await;
    let queued = tokio::spawn(svc.clone().oneshot(req("/slow/1")));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the second one queues");

    let shutdown = tokio::spawn(handle.shutdown(Duration::from_secs(10)));
    let start = Instant::now();
    let err = queued.await.unwrap().unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the queue place ends at once"
    );
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert!(matches!(
        holder.await.unwrap().unwrap_err().kind(),
        ErrorKind::Closed
    ));
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    let report = shutdown.await.unwrap();
    assert_eq!(
        (report.in_flight, report.completed, report.cancelled),
        (2, 1, 1)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never sent");
}

/// A tracked body keeps the grace period open like a request: the shutdown
/// resolves when the body's guard drops, or cuts it at the end of the
/// grace (counted in the report); the cut token fires when it resolves.
#[tokio::test(start_paused = true)]
async fn open_bodies_hold_the_grace_period_and_the_cut_token_fires_at_its_end() {
    // Dropped within the grace period: the shutdown ends with it.
    let handle = ShutdownHandle::new();
    let token = handle.cut_token();
    let body = handle.open_body();
    let start = Instant::now();
    let shutdown = tokio::spawn(handle.shutdown(Duration::from_secs(10)));
    sleep(Duration::from_secs(2)).await;
    assert!(!shutdown.is_finished(), "waits for the body");
    assert!(!token.is_cancelled() && !body.is_cut());
    drop(body);
    let report = shutdown.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(report.bodies_cut, 0);
    assert!(token.is_cancelled() && handle.is_cut());

    // Still open at the end of the grace period: cut and counted.
    let handle = ShutdownHandle::new();
    let token = handle.cut_token();
    let body = handle.open_body();
    let start = Instant::now();
    let report = handle.shutdown(Duration::from_secs(3)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!((report.in_flight, report.bodies_cut), (0, 1));
    assert!(body.is_cut() && token.is_cancelled());

    // Nothing open: resolves at once, and a child token of the cut token
    // cancelled by the caller cancels nothing else.
    let handle = ShutdownHandle::new();
    handle.cut_token().cancel();
    assert!(!handle.is_cut());
    let start = Instant::now();
    let report = handle.shutdown(Duration::from_secs(3)).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(report, ShutdownHandle::new().shutdown(Duration::ZERO).await);
}
