//! Concurrency limit: FIFO queue, permit held until the response body ends or
//! is dropped, queue bound, deadline while queued, drop-safety.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, Full};
use rebound_core::annotations::{Deadline, LimiterState, Verdict};
use rebound_core::limit::{ConcurrencyLimitLayer, ConcurrencyLimiter};
use rebound_core::{Error, ErrorKind, TimeoutStage};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready, task};
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};

fn req(path: &str) -> Request<()> {
    Request::get(format!("http://user:pw@upstream.test{path}?token=secret"))
        .body(())
        .unwrap()
}

type Calls = Arc<Mutex<Vec<String>>>;

/// Records the path of every call; answers at once with a small body that is
/// not read yet.
fn recording(
    calls: Calls,
) -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |req: Request<()>| {
        calls.lock().unwrap().push(req.uri().path().to_owned());
        async { Ok(Response::new(Full::new(Bytes::from_static(b"body")))) }
    })
}

// The tuple names what each test needs; a type alias cannot name `impl Service`.
#[allow(clippy::type_complexity)]
fn limited(
    limiter: ConcurrencyLimiter,
) -> (
    Calls,
    Arc<ConcurrencyLimiter>,
    impl Service<
            Request<()>,
            Response = Response<rebound_core::limit::LimitBody<Full<Bytes>>>,
            Error = Error,
            Future = impl Send,
        > + Clone,
) {
    let calls = Calls::default();
    let layer = ConcurrencyLimitLayer::with_limiter(limiter);
    let limiter = layer.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(recording(calls.clone()));
    (calls, limiter, svc)
}

#[test]
fn zero_limit_is_a_config_error() {
    let err = ConcurrencyLimitLayer::try_new(0).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config), "{err}");
    assert!(matches!(
        ConcurrencyLimiter::try_new(usize::MAX).unwrap_err().kind(),
        ErrorKind::Config
    ));
}

#[tokio::test(start_paused = true)]
async fn queue_is_fifo() {
    let (calls, limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap());
    let first = svc.clone().oneshot(req("/0")).await.unwrap();
    assert_eq!(limiter.in_flight(), 1);

    let mut waiting: Vec<_> = (1..=5)
        .map(|i| task::spawn(svc.clone().oneshot(req(&format!("/{i}")))))
        .collect();
    for w in &mut waiting {
        assert_pending!(w.poll());
    }
    assert_eq!(limiter.queued(), 5);

    drop(first);
    // Each round exactly one waiter gets the permit: the oldest one. Poll in
    // reverse order so a LIFO or random hand-over would show.
    let mut order = Vec::new();
    for _round in 0..5 {
        let mut got = None;
        for (i, w) in waiting.iter_mut().enumerate().rev() {
            if w.is_woken() || got.is_none() {
                if let Poll::Ready(res) = w.poll() {
                    assert!(got.is_none(), "two waiters got the one permit");
                    got = Some((i, res.unwrap()));
                }
            }
        }
        let (i, res) = got.expect("a waiter got the permit");
        order.push(i + 1);
        drop(res); // dropping the unread body frees the permit
    }
    assert_eq!(order, vec![1, 2, 3, 4, 5]);
    assert_eq!(*calls.lock().unwrap(), ["/0", "/1", "/2", "/3", "/4", "/5"]);
    assert_eq!(limiter.in_flight(), 0);
    assert_eq!(limiter.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn permit_held_until_body_is_read_to_the_end() {
    let (calls, limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap());
    let first = svc.clone().oneshot(req("/first")).await.unwrap();
    assert!(first.body().holds_permit());
    assert!(first.extensions().get::<LimiterState>().is_none());

    let mut second = task::spawn(svc.clone().oneshot(req("/second")));
    assert_pending!(second.poll());
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_pending!(second.poll());
    assert_eq!(calls.lock().unwrap().len(), 1, "second request sent early");
    assert_eq!((limiter.in_flight(), limiter.queued()), (1, 1));

    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "body");
    assert!(second.is_woken());
    let second = assert_ready!(second.poll()).unwrap();
    assert_eq!(calls.lock().unwrap().len(), 2);
    // A request that had to queue shows the limiter's state (for the
    // request span's `rebound.limiter`); the first, which did not, shows
    // nothing (no insert on the happy path).
    let state = second.extensions().get::<LimiterState>().copied();
    assert_eq!(
        state.map(|s| (s.limiter, s.limit, s.in_flight, s.queued)),
        Some(("concurrency", 1, 1, 0))
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_body_releases_the_permit_at_once() {
    let (_calls, limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap());
    let first = svc.clone().oneshot(req("/first")).await.unwrap();
    let mut second = task::spawn(svc.clone().oneshot(req("/second")));
    assert_pending!(second.poll());
    drop(first);
    assert!(second.is_woken());
    let res = assert_ready!(second.poll()).unwrap();
    assert_eq!(limiter.in_flight(), 1);
    drop(res);
    assert_eq!(limiter.in_flight(), 0);
}

/// A body fed by a channel: ends when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test(start_paused = true)]
async fn streamed_body_holds_the_permit_until_it_ends() {
    let (tx, rx) = mpsc::channel(4);
    let rx = Arc::new(Mutex::new(Some(rx)));
    let svc = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::try_new(1).unwrap())
        .service(service_fn(move |_req: Request<()>| {
            let body = match rx.lock().unwrap().take() {
                Some(rx) => ChannelBody(rx).boxed(),
                None => Empty::new().boxed(),
            };
            async move { Ok::<_, Infallible>(Response::new(body)) }
        }));
    let limiter = svc.limiter().clone();

    let mut first = svc.clone().oneshot(req("/stream")).await.unwrap();
    tx.send(Bytes::from_static(b"chunk 1")).await.unwrap();
    let frame = first.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "chunk 1");

    let mut second = task::spawn(svc.clone().oneshot(req("/second")));
    assert_pending!(second.poll());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_pending!(second.poll());
    assert_eq!(limiter.in_flight(), 1);

    tx.send(Bytes::from_static(b"chunk 2")).await.unwrap();
    drop(tx);
    let rest = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(rest, "chunk 2");
    assert!(second.is_woken());
    let res = assert_ready!(second.poll()).unwrap();
    // An empty body holds nothing: released with the head.
    assert!(!res.body().holds_permit());
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn error_outcome_releases_at_once() {
    let svc = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::try_new(1).unwrap())
        .service(service_fn(|_req: Request<()>| async {
            Err::<Response<Full<Bytes>>, BoxError>("upstream broke".into())
        }));
    let limiter = svc.limiter().clone();
    let err = svc.clone().oneshot(req("/x")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert_eq!(limiter.in_flight(), 0);
    // And the next request gets the permit without waiting.
    let err = svc.oneshot(req("/y")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport);
}

#[tokio::test(start_paused = true)]
async fn full_queue_rejects_at_once() {
    let (calls, limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap().max_queue(1));
    let _first = svc.clone().oneshot(req("/1")).await.unwrap();
    let mut second = task::spawn(svc.clone().oneshot(req("/2")));
    assert_pending!(second.poll());
    assert_eq!(limiter.queued(), 1);

    let mut third = task::spawn(svc.clone().oneshot(req("/3")));
    let err = assert_ready!(third.poll()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Rejected);
    assert!(
        err.extensions().get::<Verdict>().unwrap().is_fatal(),
        "a rejection must not be retried"
    );
    let shown = err.to_string();
    assert!(shown.contains("GET http://upstream.test/3"), "{shown}");
    assert!(
        !shown.contains("secret") && !shown.contains("pw"),
        "{shown}"
    );
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(limiter.queued(), 1);
}

#[tokio::test(start_paused = true)]
async fn zero_queue_never_waits() {
    let (_calls, _limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap().max_queue(0));
    let _first = svc.clone().oneshot(req("/1")).await.unwrap();
    let err = svc.clone().oneshot(req("/2")).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Rejected));
}

#[tokio::test(start_paused = true)]
async fn deadline_bounds_the_wait() {
    let (calls, limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap());
    let _first = svc.clone().oneshot(req("/1")).await.unwrap();

    let start = Instant::now();
    let mut second = req("/2");
    second
        .extensions_mut()
        .insert(Deadline(start + Duration::from_millis(500)));
    let err = svc.clone().oneshot(second).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert!(
        err.to_string().contains("GET http://upstream.test/2"),
        "{err}"
    );
    assert_eq!(limiter.queued(), 0);
    assert_eq!(calls.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_queued_request_frees_its_place_at_once() {
    let (calls, limiter, svc) = limited(ConcurrencyLimiter::try_new(1).unwrap().max_queue(1));
    let first = svc.clone().oneshot(req("/1")).await.unwrap();

    let mut dropped = task::spawn(svc.clone().oneshot(req("/dropped")));
    assert_pending!(dropped.poll());
    assert_eq!(limiter.queued(), 1);
    drop(dropped);
    assert_eq!(limiter.queued(), 0);

    // The freed place is usable (the queue bound is 1) ...
    let mut next = task::spawn(svc.clone().oneshot(req("/next")));
    assert_pending!(next.poll());
    // ... and the permit goes straight to the live waiter, not the dropped one.
    drop(first);
    assert!(next.is_woken());
    assert_ready!(next.poll()).unwrap();
    assert_eq!(*calls.lock().unwrap(), ["/1", "/next"]);
}

#[tokio::test(start_paused = true)]
async fn one_limit_shared_by_two_stacks() {
    let limiter = Arc::new(ConcurrencyLimiter::try_new(1).unwrap());
    let calls = Calls::default();
    let a = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::shared(limiter.clone()))
        .service(recording(calls.clone()));
    let b = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::shared(limiter.clone()))
        .service(recording(calls.clone()));
    let held = a.oneshot(req("/a")).await.unwrap();
    let mut via_b = task::spawn(b.oneshot(req("/b")));
    assert_pending!(via_b.poll());
    drop(held);
    assert_ready!(via_b.poll()).unwrap();
}

/// Counts requests the "server" is busy with: from the call until the caller
/// is done with the response body (or anything in between is dropped).
#[derive(Default)]
struct Active {
    now: usize,
    peak: usize,
}

struct ActiveGuard(Arc<Mutex<Active>>);

impl ActiveGuard {
    fn enter(active: &Arc<Mutex<Active>>) -> Self {
        let mut a = active.lock().unwrap();
        a.now += 1;
        a.peak = a.peak.max(a.now);
        ActiveGuard(active.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap().now -= 1;
    }
}

/// A body that keeps an [`ActiveGuard`] until it is dropped.
struct GuardBody(Full<Bytes>, #[allow(dead_code)] ActiveGuard);

impl Body for GuardBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn many_requests_never_exceed_the_limit_and_leave_nothing_behind() {
    const LIMIT: usize = 8;
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let active = Arc::new(Mutex::new(Active::default()));
    let svc = {
        let active = active.clone();
        ServiceBuilder::new()
            .layer(ConcurrencyLimitLayer::try_new(LIMIT).unwrap())
            .service(service_fn(move |_req: Request<()>| {
                let guard = ActiveGuard::enter(&active);
                async move {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let body = GuardBody(Full::new(Bytes::from_static(b"x")), guard);
                    Ok::<_, Infallible>(Response::new(body))
                }
            }))
    };
    let limiter = svc.limiter().clone();

    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = req("/many");
            if i % 10 == 0 {
                // Some give up while queued.
                r.extensions_mut()
                    .insert(Deadline(Instant::now() + Duration::from_millis(5)));
            }
            match svc.oneshot(r).await {
                Ok(res) => {
                    // Read slowly: the permit stays taken meanwhile.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    res.into_body().collect().await.unwrap();
                    true
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
                    false
                }
            }
        }));
    }
    // Let them all start (and most queue), then abort some at every stage:
    // queued, in the call, reading the body.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(limiter.queued() > 100);
    for (n, t) in tasks.iter().enumerate() {
        if n % 23 == 7 {
            t.abort();
        }
    }
    let mut done = 0;
    for t in tasks {
        if let Ok(true) = t.await {
            done += 1;
        }
    }
    assert!(done > 150, "only {done} completed");
    let Active { now, peak } = *active.lock().unwrap();
    assert_eq!(now, 0);
    assert!(peak <= LIMIT, "peak {peak} over the limit {LIMIT}");
    assert_eq!(
        peak, LIMIT,
        "the limit was never reached: the test proves nothing"
    );
    assert_eq!(limiter.in_flight(), 0);
    assert_eq!(limiter.queued(), 0);
    tokio::task::yield_now().await;
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline
    );
}
