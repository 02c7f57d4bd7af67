//! Adaptive (AIMD) limit: reacts to 429/503 responses and attempt timeouts,
//! grows on successes, and settles near an upstream's real capacity.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use rebound_core::annotations::{Deadline, Reason, Sent, Verdict};
use rebound_core::limit::{AdaptiveLimitLayer, AdaptiveLimiter, Aimd};
use rebound_core::{Error, ErrorKind, TimeoutStage};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready, task};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

fn req() -> Request<()> {
    Request::get("http://upstream.test/x").body(()).unwrap()
}

fn status(code: u16) -> Response<()> {
    let mut res = Response::new(());
    *res.status_mut() = StatusCode::from_u16(code).unwrap();
    res
}

/// A service answering with whatever `answer` says.
fn answering(
    aimd: Aimd,
    answer: impl Fn() -> Result<Response<()>, Error> + Clone + Send + 'static,
) -> (
    Arc<AdaptiveLimiter>,
    impl Service<Request<()>, Response = Response<()>, Error = Error> + Clone,
) {
    let layer = AdaptiveLimitLayer::try_new(aimd).unwrap();
    let limiter = layer.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |_req: Request<()>| {
            let out = answer();
            async move { out }
        }));
    (limiter, svc)
}

#[test]
fn settings_are_checked() {
    for bad in [
        Aimd::default().backoff_ratio(0.4),
        Aimd::default().backoff_ratio(1.0),
        Aimd::default().backoff_ratio(f64::NAN),
        Aimd::default().min_limit(0),
        Aimd::default().min_limit(30),
        Aimd::default().initial_limit(300),
        Aimd::default().max_limit(usize::MAX),
    ] {
        let err = AdaptiveLimitLayer::try_new(bad).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config), "{bad:?} accepted");
    }
    let ok = AdaptiveLimiter::try_new(Aimd::default().backoff_ratio(0.5)).unwrap();
    assert_eq!(ok.current_limit(), 20);
    assert_eq!(AdaptiveLimitLayer::default().limiter().current_limit(), 20);
}

#[tokio::test(start_paused = true)]
async fn overload_statuses_and_attempt_timeouts_shrink_the_limit() {
    let aimd = Aimd::default().initial_limit(16).backoff_ratio(0.5);
    let (limiter, svc) = answering(aimd, || Ok(status(429)));
    svc.oneshot(req()).await.unwrap();
    assert_eq!(limiter.current_limit(), 8);

    let (limiter, svc) = answering(aimd, || Ok(status(503)));
    svc.oneshot(req()).await.unwrap();
    assert_eq!(limiter.current_limit(), 8);

    // A 429 is overload whatever the classifier made of it.
    let (limiter, svc) = answering(aimd, || {
        let mut res = status(429);
        res.extensions_mut().insert(Verdict::Fatal {
            reason: Reason::status(StatusCode::TOO_MANY_REQUESTS),
        });
        Ok(res)
    });
    svc.oneshot(req()).await.unwrap();
    assert_eq!(limiter.current_limit(), 8);

    let (limiter, svc) = answering(aimd, || Err(Error::timeout(TimeoutStage::Headers)));
    let err = svc.oneshot(req()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Headers));
    assert_eq!(limiter.current_limit(), 8);
}

#[tokio::test(start_paused = true)]
async fn other_failures_leave_the_limit_alone() {
    let aimd = Aimd::default().initial_limit(16);
    let (limiter, mut svc) = answering(aimd, || {
        // A 500 the classifier called retryable, a connect error: not
        // overload, not success.
        let mut res = status(500);
        res.extensions_mut().insert(Verdict::Retryable {
            reason: Reason::status(StatusCode::INTERNAL_SERVER_ERROR),
            sent: Sent::MaybeProcessed,
        });
        Ok(res)
    });
    for _ in 0..50 {
        svc.ready().await.unwrap().call(req()).await.unwrap();
    }
    assert_eq!(limiter.current_limit(), 16);

    let (limiter, mut svc) = answering(aimd, || Err(Error::new(ErrorKind::Connect)));
    for _ in 0..50 {
        svc.ready().await.unwrap().call(req()).await.unwrap_err();
    }
    assert_eq!(limiter.current_limit(), 16);
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn successes_grow_one_per_window_while_the_limit_is_used() {
    let aimd = Aimd::default().min_limit(1).initial_limit(2).max_limit(3);
    // Absence of a Verdict is success.
    let (limiter, mut svc) = answering(aimd, || Ok(status(200)));
    svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(limiter.current_limit(), 2);
    svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(limiter.current_limit(), 3, "a window of 2 successes adds 1");

    // At limit 3, one request at a time uses less than half of it: no
    // growth from an idle client (and never past max anyway).
    let aimd = Aimd::default().min_limit(1).initial_limit(3).max_limit(10);
    let (limiter, mut svc) = answering(aimd, || Ok(status(200)));
    for _ in 0..30 {
        svc.ready().await.unwrap().call(req()).await.unwrap();
    }
    assert_eq!(limiter.current_limit(), 3);
}

/// A service whose calls wait until the test lets them finish, answering
/// with `code`.
// The tuple names what each test needs; a type alias cannot name `impl Service`.
#[allow(clippy::type_complexity)]
fn gated(
    aimd: Aimd,
    code: u16,
) -> (
    Arc<AdaptiveLimiter>,
    Arc<Semaphore>,
    Arc<AtomicUsize>,
    impl Service<Request<()>, Response = Response<()>, Error = Error, Future = impl Send> + Clone,
) {
    let release = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = AdaptiveLimitLayer::try_new(aimd).unwrap();
    let limiter = layer.limiter().clone();
    let svc = {
        let release = release.clone();
        let calls = calls.clone();
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |_req: Request<()>| {
                calls.fetch_add(1, Ordering::SeqCst);
                let release = release.clone();
                async move {
                    release.acquire().await.unwrap().forget();
                    Ok::<_, Infallible>(status(code))
                }
            }))
    };
    (limiter, release, calls, svc)
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_429s_from_one_generation_shrinks_once() {
    let aimd = Aimd::default().initial_limit(10);
    let (limiter, release, _calls, svc) = gated(aimd, 429);
    let mut all: Vec<_> = (0..10)
        .map(|_| task::spawn(svc.clone().oneshot(req())))
        .collect();
    for t in &mut all {
        assert_pending!(t.poll());
    }
    release.add_permits(10);
    for t in &mut all {
        assert_ready!(t.poll()).unwrap();
    }
    // Ten 429s for requests sent under the same limit: one decrease.
    assert_eq!(limiter.current_limit(), 9);
}

#[tokio::test(start_paused = true)]
async fn shrinking_below_in_flight_holds_new_attempts_back() {
    let aimd = Aimd::default().initial_limit(4).backoff_ratio(0.5);
    let (limiter, release, calls, svc) = gated(aimd, 429);
    let mut first: Vec<_> = (0..4)
        .map(|_| task::spawn(svc.clone().oneshot(req())))
        .collect();
    for t in &mut first {
        assert_pending!(t.poll());
    }
    let mut later: Vec<_> = (0..3)
        .map(|_| task::spawn(svc.clone().oneshot(req())))
        .collect();
    for t in &mut later {
        assert_pending!(t.poll());
    }
    assert_eq!((limiter.in_flight(), limiter.queued()), (4, 3));

    // One 429: the limit halves to 2 while 3 are still in flight.
    release.add_permits(1);
    assert_ready!(first[0].poll()).unwrap();
    assert_eq!(limiter.current_limit(), 2);
    for t in &mut later {
        assert_pending!(t.poll());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4, "sent above the new limit");

    // Two more come back (same generation: no further decrease); only when
    // in-flight drops below 2 does the oldest waiter go.
    release.add_permits(2);
    assert_ready!(first[1].poll()).unwrap();
    assert_ready!(first[2].poll()).unwrap();
    assert_eq!(limiter.current_limit(), 2);
    // One attempt left in flight, and the freed slot already handed to the
    // oldest waiter (FIFO), not to whoever asks first.
    assert_eq!(limiter.in_flight(), 2);
    assert_eq!(limiter.available(), 0);
    assert!(later[0].is_woken());
    assert_pending!(later[0].poll());
    assert_pending!(later[1].poll());
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!((limiter.in_flight(), limiter.queued()), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn waiting_is_bounded_by_the_deadline_and_left_on_drop() {
    let aimd = Aimd::default().initial_limit(1);
    let (limiter, release, calls, svc) = gated(aimd, 200);
    let mut held = task::spawn(svc.clone().oneshot(req()));
    assert_pending!(held.poll());

    let start = Instant::now();
    let mut r = req();
    r.extensions_mut()
        .insert(Deadline(start + Duration::from_millis(250)));
    let err = svc.clone().oneshot(r).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
    assert!(err.extensions().get::<Verdict>().unwrap().is_fatal());
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert_eq!(limiter.queued(), 0);

    let mut dropped = task::spawn(svc.clone().oneshot(req()));
    assert_pending!(dropped.poll());
    assert_eq!(limiter.queued(), 1);
    drop(dropped);
    assert_eq!(limiter.queued(), 0);

    // Dropping an attempt in flight gives its slot back at once.
    drop(held);
    assert_eq!(limiter.in_flight(), 0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let mut next = task::spawn(svc.oneshot(req()));
    assert_pending!(next.poll());
    release.add_permits(1);
    assert_ready!(next.poll()).unwrap();
}

/// The scenario in miniature: an upstream that answers 429 whenever
/// more than 10 requests are in flight; 2,000 requests offered at
/// concurrency 100; the limit must settle near 10 and the 429 share fall
/// below 10 % in the second half.
#[tokio::test(start_paused = true)]
async fn settles_near_the_upstreams_capacity() {
    const CAPACITY: usize = 10;
    const REQUESTS: usize = 2_000;
    const OFFERED: usize = 100;

    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let layer = AdaptiveLimitLayer::try_new(Aimd::default().min_limit(1)).unwrap();
    let limiter = layer.limiter().clone();
    let at_server = Arc::new(AtomicUsize::new(0));
    let svc = {
        let at_server = at_server.clone();
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |_req: Request<()>| {
                let n = at_server.fetch_add(1, Ordering::SeqCst) + 1;
                let at_server = at_server.clone();
                async move {
                    let res = if n > CAPACITY {
                        status(429) // rejected at once
                    } else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        status(200)
                    };
                    at_server.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(res)
                }
            }))
    };

    // (status, limit after the outcome), in completion order.
    let log = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..OFFERED)
        .map(|_| {
            let (svc, log, next, limiter) =
                (svc.clone(), log.clone(), next.clone(), limiter.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < REQUESTS {
                    let res = svc.clone().oneshot(req()).await.unwrap();
                    log.lock()
                        .unwrap()
                        .push((res.status(), limiter.current_limit()));
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }

    let log = log.lock().unwrap();
    assert_eq!(log.len(), REQUESTS);
    let trajectory: Vec<usize> = log.iter().step_by(100).map(|(_, l)| *l).collect();
    println!("limit every 100 completions: {trajectory:?}");
    let share = |part: &[(StatusCode, usize)]| {
        part.iter()
            .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
            .count() as f64
            / part.len() as f64
    };
    let (first, second) = log.split_at(REQUESTS / 2);
    let limits: Vec<usize> = second.iter().map(|(_, l)| *l).collect();
    let (lo, hi) = (*limits.iter().min().unwrap(), *limits.iter().max().unwrap());
    let mean = limits.iter().sum::<usize>() as f64 / limits.len() as f64;
    println!(
        "429 share: first half {:.1} %, second half {:.1} %; second-half limit {lo}..={hi}, mean {mean:.1}",
        share(first) * 100.0,
        share(second) * 100.0
    );
    assert!(share(second) < 0.10, "429 share too high");
    assert!(
        (7..=13).contains(&lo) && (7..=13).contains(&hi),
        "did not settle near 10"
    );
    assert_eq!(limiter.in_flight(), 0);
    assert_eq!(limiter.queued(), 0);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline
    );
}

/// An upstream that answers 429 at once when more than `capacity` attempts
/// are in flight at it, and 200 after 20 ms otherwise; counts its 429s.
fn capacity_upstream(
    aimd: Aimd,
    capacity: usize,
) -> (
    Arc<AdaptiveLimiter>,
    Arc<AtomicUsize>,
    impl Service<Request<()>, Response = Response<()>, Error = Error, Future = impl Send> + Clone,
) {
    let layer = AdaptiveLimitLayer::try_new(aimd).unwrap();
    let limiter = layer.limiter().clone();
    let at_server = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(AtomicUsize::new(0));
    let svc = {
        let rejected = rejected.clone();
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |_req: Request<()>| {
                let n = at_server.fetch_add(1, Ordering::SeqCst) + 1;
                let (at_server, rejected) = (at_server.clone(), rejected.clone());
                async move {
                    let res = if n > capacity {
                        rejected.fetch_add(1, Ordering::SeqCst);
                        status(429)
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        status(200)
                    };
                    at_server.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(res)
                }
            }))
    };
    (limiter, rejected, svc)
}

/// `n` simultaneous requests, each retried (after 50 ms) until it succeeds,
/// at most 100 times; returns the upstream's 429 count.
async fn burst_until_success(aimd: Aimd, capacity: usize, n: usize) -> (usize, usize) {
    let (limiter, rejected, svc) = capacity_upstream(aimd, capacity);
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                for _ in 0..100 {
                    let res = svc.clone().oneshot(req()).await.unwrap();
                    if res.status() == StatusCode::OK {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                false
            })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap(), "a request never succeeded");
    }
    (rejected.load(Ordering::SeqCst), limiter.current_limit())
}

/// Issue 10's burst on paused time: 40 simultaneous requests, start 8,
/// capacity 2. The control is a fixed limit of 8 under the same retries.
#[tokio::test(start_paused = true)]
async fn a_burst_draws_far_fewer_429s_than_a_fixed_limit() {
    let (control, _) = burst_until_success(
        Aimd::default().min_limit(8).initial_limit(8).max_limit(8),
        2,
        40,
    )
    .await;
    let (adaptive, limit) = burst_until_success(
        Aimd::default().min_limit(1).initial_limit(8).max_limit(200),
        2,
        40,
    )
    .await;
    println!(
        "40 simultaneous, capacity 2: 429s adaptive {adaptive}, fixed 8 {control} ({:.2}x), limit {limit}",
        adaptive as f64 / control as f64
    );
    assert!(
        adaptive as f64 <= 0.4 * control as f64,
        "adaptive {adaptive} vs fixed {control}"
    );
    assert!(
        limit <= 4,
        "the limit stayed far above the capacity: {limit}"
    );
}

#[tokio::test(start_paused = true)]
async fn stale_429s_with_waiters_bring_the_limit_down_to_what_is_in_flight() {
    let aimd = Aimd::default().initial_limit(8);
    let (limiter, release, calls, svc) = gated(aimd, 429);
    let mut first: Vec<_> = (0..8)
        .map(|_| task::spawn(svc.clone().oneshot(req())))
        .collect();
    for t in &mut first {
        assert_pending!(t.poll());
    }
    let mut waiting: Vec<_> = (0..4)
        .map(|_| task::spawn(svc.clone().oneshot(req())))
        .collect();
    for t in &mut waiting {
        assert_pending!(t.poll());
    }
    assert_eq!((limiter.in_flight(), limiter.queued()), (8, 4));

    // Six of the eight come back 429 (the upstream serves the other two):
    // the first one × 0.9, then the limit follows what is still in flight,
    // and no waiter is let through to be refused as well.
    release.add_permits(6);
    for t in &mut first[..6] {
        assert_ready!(t.poll()).unwrap();
    }
    assert_eq!(limiter.current_limit(), 2);
    assert_eq!(limiter.in_flight(), 2);
    for t in &mut waiting {
        assert_pending!(t.poll());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 8, "a waiter was sent");
}

/// Completes `n` successes through `svc` (a [`gated`] service answering
/// 200) while keeping every slot of the limit in use and one attempt
/// waiting, so that growth is never held back by an idle limit.
async fn successes_at_full_use<S>(
    n: usize,
    limiter: &AdaptiveLimiter,
    release: &Semaphore,
    svc: &S,
    pending: &mut Vec<tokio::task::JoinHandle<()>>,
) where
    S: Service<Request<()>, Response = Response<()>, Error = Error> + Clone + Send + 'static,
    S::Future: Send,
{
    for _ in 0..n {
        while pending.len() < limiter.current_limit() + 1 {
            let svc = svc.clone();
            pending.push(tokio::spawn(async move {
                svc.oneshot(req()).await.unwrap();
            }));
        }
        // Let every new attempt take its slot or queue.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        let before = pending.len();
        release.add_permits(1);
        // Bounded: one attempt finishes within a few polls.
        for _ in 0..100 {
            pending.retain(|t| !t.is_finished());
            if pending.len() < before {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            pending.len(),
            before - 1,
            "the released attempt did not finish"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn growth_waits_at_the_last_overload_point_and_probes_past_it() {
    let aimd = Aimd::default().initial_limit(10).max_limit(100);
    let (limiter, release, _calls, svc) = gated(aimd, 200);
    // One overload at 10: the limit goes to 9, and 10 is where the upstream
    // was last overloaded.
    let (over_limiter, over) = {
        let layer = AdaptiveLimitLayer::shared(limiter.clone());
        let svc =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_req: Request<()>| async {
                    Ok::<_, Infallible>(status(429))
                }));
        (limiter.clone(), svc)
    };
    over.oneshot(req()).await.unwrap();
    assert_eq!(over_limiter.current_limit(), 9);

    let mut pending = Vec::new();
    // Growing back onto 10 takes four windows of 9, not one.
    successes_at_full_use(9, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 9);
    successes_at_full_use(27, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 10);
    // Past it the limit probes: +1, then +2, +4, +8 per window.
    successes_at_full_use(10, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 11);
    successes_at_full_use(11, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 13);
    successes_at_full_use(13, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 17);
    successes_at_full_use(17, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 25);
    // Never more than half the limit at once: +12 (not +16).
    successes_at_full_use(25, &limiter, &release, &svc, &mut pending).await;
    assert_eq!(limiter.current_limit(), 37);
    for t in pending {
        t.abort();
    }
}

// ===== per host, as a standalone layer =====

/// One host's attempts fill its own limit; another host's attempts still
/// find free slots. With one limiter for both, the second host would
/// queue behind the first.
#[tokio::test(start_paused = true)]
async fn per_host_layer_one_slow_host_does_not_take_the_others_slots() {
    use rebound_core::limit::{HostLimiters, PerHostAdaptiveLimitLayer};

    let hosts = Arc::new(HostLimiters::new(
        Aimd::default().min_limit(1).initial_limit(2).max_limit(2),
        16,
    ));
    let layer = PerHostAdaptiveLimitLayer::new(hosts.clone());
    assert!(Arc::ptr_eq(layer.hosts(), &hosts));
    // The slow host never answers within the test; the fast one at once.
    let svc = ServiceBuilder::new()
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(60)))
        .layer(layer)
        .service(service_fn(|req: Request<()>| async move {
            if req.uri().host() == Some("slow.test") {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok::<_, Infallible>(status(200))
        }));
    let get = |url: &str| Request::get(url).body(()).unwrap();

    // Fill the slow host's two slots; a third attempt there queues.
    let mut slow: Vec<_> = (0..3)
        .map(|_| task::spawn(svc.clone().oneshot(get("http://slow.test/x"))))
        .collect();
    for t in &mut slow {
        assert_pending!(t.poll());
    }
    let slow_limiter = hosts.get(&"http://slow.test/".parse().unwrap()).unwrap();
    assert_eq!((slow_limiter.in_flight(), slow_limiter.queued()), (2, 1));

    // The fast host: its own limiter, its slots free.
    for _ in 0..5 {
        let res = svc
            .clone()
            .oneshot(get("http://fast.test/y"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let fast_limiter = hosts.get(&"http://fast.test/".parse().unwrap()).unwrap();
    assert!(!Arc::ptr_eq(&slow_limiter, &fast_limiter));
    assert_eq!(fast_limiter.in_flight(), 0);
    assert_eq!(hosts.len(), 2);

    // Dropping the slow attempts gives their slots back and leaves the queue.
    drop(slow);
    assert_eq!((slow_limiter.in_flight(), slow_limiter.queued()), (0, 0));
}

/// A 429 from one host shrinks that host's limit only.
#[tokio::test(start_paused = true)]
async fn per_host_layer_an_overload_lowers_only_its_hosts_limit() {
    use rebound_core::limit::PerHostAdaptiveLimitLayer;

    let layer = PerHostAdaptiveLimitLayer::try_new(
        Aimd::default()
            .initial_limit(10)
            .max_limit(10)
            .backoff_ratio(0.5),
        16,
    )
    .unwrap();
    let hosts = layer.hosts().clone();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<()>| async move {
                Ok::<_, Infallible>(status(if req.uri().host() == Some("busy.test") {
                    429
                } else {
                    200
                }))
            }));
    let get = |url: &str| Request::get(url).body(()).unwrap();
    svc.clone().oneshot(get("http://busy.test/")).await.unwrap();
    svc.clone().oneshot(get("http://calm.test/")).await.unwrap();
    let limit = |url: &str| hosts.get(&url.parse().unwrap()).unwrap().current_limit();
    assert_eq!(limit("http://busy.test/"), 5);
    assert_eq!(limit("http://calm.test/"), 10);
}

/// Bad configuration is an error, not a panic.
#[test]
fn per_host_layer_refuses_zero_hosts() {
    use rebound_core::limit::PerHostAdaptiveLimitLayer;
    let err = PerHostAdaptiveLimitLayer::try_new(Aimd::default(), 0).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config), "{err}");
    assert!(err.to_string().contains("max_hosts"), "{err}");
}
