//! Hedging on paused time: when copies go, who wins, who is cancelled.

use crate::ErrorKind;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::{HedgeLayer, HedgePolicy};
use crate::annotations::{AttemptNumber, Attempts, Deadline, Hedged, RetryStop};
use crate::body::CloneableBody;
use crate::classify::{ClassifyLayer, HttpClassifier};
use crate::error::BoxError;
use crate::retry::{RetryBudget, RetryLayer, RetryPolicy};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the scripted upstream saw.
#[derive(Default)]
struct Log {
    calls: AtomicU32,
    /// Copies dropped before they answered.
    cancelled: AtomicU32,
    keys: Mutex<Vec<Option<HeaderValue>>>,
}

/// Counts a copy as cancelled if it is dropped before it answers.
struct Guard(Arc<Log>, bool);

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, SeqCst);
        }
    }
}

/// An upstream whose n-th call (0-based) waits `script[n].0` ms and answers
/// `script[n].1`; calls past the script answer 200 at once. Classified.
fn upstream<B>(
    script: Vec<(u64, u16)>,
) -> (
    impl Service<
            Request<B>,
            Response = Response<Full<Bytes>>,
            Error = crate::Error,
            Future = impl Send,
        > + Clone,
    Arc<Log>,
)
where
    B: Send + 'static,
{
    let log = Arc::new(Log::default());
    let svc = {
        let log = log.clone();
        let script = Arc::new(script);
        tower::service_fn(move |req: Request<B>| {
            let n = log.calls.fetch_add(1, SeqCst) as usize;
            log.keys
                .lock()
                .unwrap()
                .push(req.headers().get("idempotency-key").cloned());
            let (wait, status) = script.get(n).copied().unwrap_or((0, 200));
            let guard = Guard(log.clone(), false);
            async move {
                // The whole guard moves in (not only the field set below).
                let mut guard = guard;
                tokio::time::sleep(ms(wait)).await;
                guard.1 = true;
                let mut res = Response::new(Full::new(Bytes::from(format!("call {n}"))));
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok::<_, BoxError>(res)
            }
        })
    };
    let svc = ClassifyLayer::new(HttpClassifier::default()).layer(svc);
    (svc, log)
}

use tower_layer::Layer;

fn get() -> Request<Full<Bytes>> {
    Request::get("http://api.example/v1")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn body(res: Response<Full<Bytes>>) -> String {
    use http_body_util::BodyExt;
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_attempt_is_hedged_and_cancelled() {
    let (inner, log) = upstream(vec![(60_000, 200), (5, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(55));
    assert_eq!(
        res.extensions().get::<Hedged>(),
        Some(&Hedged {
            copies: 2,
            winner: Some(2)
        })
    );
    assert_eq!(body(res).await, "call 1");
    assert_eq!(log.calls.load(SeqCst), 2);
    // The original was dropped as soon as the hedge answered.
    assert_eq!(log.cancelled.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_delay_sends_nothing_more() {
    let (inner, log) = upstream(vec![(49, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert!(res.extensions().get::<Hedged>().is_none());
    tokio::time::sleep(ms(500)).await;
    assert_eq!(log.calls.load(SeqCst), 1);
    assert_eq!(log.cancelled.load(SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_original_may_still_win() {
    let (inner, log) = upstream(vec![(80, 200), (500, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(80));
    assert_eq!(res.extensions().get::<Hedged>().unwrap().winner, Some(1));
    assert_eq!(log.calls.load(SeqCst), 2);
    assert_eq!(log.cancelled.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_failure_waits_for_the_other_copy() {
    // The hedge fails fast with a 503; the original answers later.
    let (inner, log) = upstream(vec![(200, 200), (10, 503)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Hedged>().unwrap().winner, Some(1));
    assert_eq!(log.cancelled.load(SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_answer_wins_and_a_failed_group_is_not_retried() {
    // A 404 is an answer (not retryable): it wins.
    let (inner, _) = upstream(vec![(300, 200), (10, 404)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);

    // Both copies fail: the last failure, marked, and the retry loop above
    // does not retry it (hedged or retried, not both).
    let (inner, log) = upstream(vec![(100, 503), (10, 503), (0, 200)]);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
        .layer(HedgeLayer::new(HedgePolicy::fixed(ms(50))))
        .service(inner);
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<Hedged>(),
        Some(&Hedged {
            copies: 2,
            winner: None
        })
    );
    assert_eq!(
        res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Hedged)
    );
    assert_eq!(Attempts::of(res.extensions()), 1);
    assert_eq!(log.calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failure_before_the_delay_is_left_to_the_retry_loop() {
    // Not hedged: the retry loop retries it as usual, and does not hedge
    // its retry.
    let (inner, log) = upstream(vec![(10, 503), (100, 200)]);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
        .layer(HedgeLayer::new(HedgePolicy::fixed(ms(50))))
        .service(inner);
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(Attempts::of(res.extensions()), 2);
    assert!(res.extensions().get::<Hedged>().is_none());
    assert_eq!(log.calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_hedged_group_sends_its_next_copy_when_all_failed() {
    // Three copies: the original hangs, the first hedge fails, the
    // second goes at once rather than at 100 ms.
    let (inner, log) = upstream(vec![(60_000, 200), (5, 503), (5, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50)).max_attempts(3)).layer(inner);
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    // The original is still in flight when the first hedge fails, so the
    // second waits for its delay: 50 + 50, then 5.
    assert_eq!(start.elapsed(), ms(105));
    assert_eq!(res.extensions().get::<Hedged>().unwrap().copies, 3);
    assert_eq!(res.extensions().get::<Hedged>().unwrap().winner, Some(3));
    assert_eq!(log.calls.load(SeqCst), 3);

    // The original fails after the hedge was sent and the hedge fails too:
    // the third copy goes at once.
    let (inner, log) = upstream(vec![(60, 503), (20, 503), (5, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50)).max_attempts(3)).layer(inner);
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(75));
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(log.calls.load(SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn only_requests_that_may_be_sent_twice_are_hedged() {
    let post = |key: Option<&'static str>| {
        let mut b = Request::post("http://api.example/v1/orders");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(Full::new(Bytes::from_static(b"{}"))).unwrap()
    };
    // A POST without a key: never.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    svc.ready().await.unwrap().call(post(None)).await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
    // A blank key is no key.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    svc.ready()
        .await
        .unwrap()
        .call(post(Some("  ")))
        .await
        .unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
    // With a key: hedged, and both copies carry the same key.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    svc.ready()
        .await
        .unwrap()
        .call(post(Some("k-1")))
        .await
        .unwrap();
    assert_eq!(log.calls.load(SeqCst), 2);
    let keys = log.keys.lock().unwrap().clone();
    assert_eq!(keys, vec![Some(HeaderValue::from_static("k-1")); 2]);
    // A gRPC method declared hedgeable (a POST).
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let policy = HedgePolicy::fixed(ms(50)).hedgeable_paths(["/pkg.Search/"]);
    let mut svc = HedgeLayer::new(policy).layer(inner);
    let grpc = |path: &str| {
        Request::post(format!("http://api.example{path}"))
            .header("content-type", "application/grpc")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    svc.ready()
        .await
        .unwrap()
        .call(grpc("/pkg.Search/Find"))
        .await
        .unwrap();
    assert_eq!(log.calls.load(SeqCst), 2);
    svc.ready()
        .await
        .unwrap()
        .call(grpc("/pkg.Orders/Create"))
        .await
        .unwrap();
    assert_eq!(log.calls.load(SeqCst), 3);
    // A POST the caller (or gRPC's MarkRetryable) declared idempotent.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let mut req = post(None);
    req.extensions_mut().insert(crate::annotations::Idempotent);
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 2);
    // A retry's attempt is not hedged.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let mut req = get();
    req.extensions_mut().insert(AttemptNumber(2));
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
    // Methods can be narrowed.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let policy = HedgePolicy::fixed(ms(50)).eligible_methods([Method::HEAD]);
    let mut svc = HedgeLayer::new(policy).layer(inner);
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn hedges_spend_the_budget_and_stop_when_it_is_empty() {
    // A shared budget allowing two retries (floor 0, ratio 0.2 of 10
    // requests the retry layer would record).
    let budget = Arc::new(RetryBudget::new(0.2, Duration::from_secs(10), 0));
    for _ in 0..10 {
        budget.deposit();
    }
    let (inner, log) = upstream((0..10).map(|_| (1_000, 200)).collect());
    let layer = HedgeLayer::new(HedgePolicy::fixed(ms(50)).budget(budget.clone()));
    let mut svc = layer.layer(inner);
    for _ in 0..5 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    // 5 originals + 2 hedges; the budget is spent.
    assert_eq!(log.calls.load(SeqCst), 7);
    assert_eq!(budget.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn never_past_the_deadline() {
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let mut req = get();
    req.extensions_mut()
        .insert(Deadline(Instant::now() + ms(40)));
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
    // The task's deadline (the deadline layer's) counts as well.
    let (inner, log) = upstream(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let fut = Deadline(Instant::now() + ms(40)).sync_scope(|| svc.call(get()));
    fut.await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
}

/// A body that cannot be sent again.
struct Once(Full<Bytes>);

impl http_body::Body for Once {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }
}

impl CloneableBody for Once {
    fn try_replay(&self) -> Option<Self> {
        None
    }
}

#[tokio::test(start_paused = true)]
async fn no_body_copy_no_hedge() {
    let (inner, log) = upstream::<Once>(vec![(1_000, 200)]);
    let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
    let req = Request::put("http://api.example/v1")
        .body(Once(Full::new(Bytes::from_static(b"x"))))
        .unwrap();
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(log.calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_percentile_delay_needs_a_minimum_sample() {
    // 2 ms answers; from the 600th call on, 1 in 5 takes a second.
    let script = (0..2_000)
        .map(|i| {
            if i >= 600 && i % 5 == 0 {
                (1_000, 200)
            } else {
                (2, 200)
            }
        })
        .collect();
    let (inner, log) = upstream(script);
    let policy = HedgePolicy::percentile(0.9)
        .min_samples(50)
        .period(Duration::from_secs(1));
    let layer = HedgeLayer::new(policy);
    let mut svc = layer.layer(inner);
    assert_eq!(layer.current_delay(), None);
    // The first period: no estimate, no hedges (sequential calls).
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_secs(1) && n < 600 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
        n += 1;
    }
    assert!(n > 50 && n < 600, "{n}");
    assert_eq!(log.calls.load(SeqCst), n);
    // Now there is one: about 2 ms (the bucket's upper bound).
    let delay = layer.current_delay().expect("an estimate");
    assert!(delay >= ms(2) && delay <= ms(3), "{delay:?}");
    // A slow call is now hedged after that delay.
    let before = log.calls.load(SeqCst);
    let mut hedged = 0;
    for _ in 0..300 {
        let start = Instant::now();
        let res = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert!(start.elapsed() < ms(10), "{:?}", start.elapsed());
        hedged += u32::from(res.extensions().get::<Hedged>().is_some());
    }
    assert!(hedged >= 10, "{hedged}");
    assert_eq!(log.calls.load(SeqCst), before + 300 + hedged);
}

#[tokio::test(start_paused = true)]
async fn a_percentile_delay_starts_from_its_fixed_delay_until_sampled() {
    // 1 in 4 calls takes a second; 10 calls a second: too few for 50
    // samples a period, so without `or_fixed` nothing is ever hedged.
    let script = (0..200)
        .map(|i| if i % 4 == 0 { (1_000, 200) } else { (2, 200) })
        .collect::<Vec<_>>();
    for (or_fixed, want_hedges) in [(None, false), (Some(ms(20)), true)] {
        let (inner, log) = upstream(script.clone());
        let mut policy = HedgePolicy::percentile(0.9)
            .min_samples(50)
            .period(Duration::from_secs(1));
        if let Some(d) = or_fixed {
            policy = policy.or_fixed(d);
        }
        let layer = HedgeLayer::new(policy);
        let mut svc = layer.layer(inner);
        assert_eq!(layer.current_delay(), or_fixed);
        let mut hedged = 0;
        for _ in 0..40 {
            let res = svc.ready().await.unwrap().call(get()).await.unwrap();
            hedged += u32::from(res.extensions().get::<Hedged>().is_some());
            tokio::time::sleep(ms(100)).await;
        }
        // Still no estimate: light traffic.
        assert_eq!(layer.current_delay(), or_fixed);
        if want_hedges {
            // Each slow call hedged after 20 ms (a hedge takes the next
            // script entry, so the count is not exactly one in four).
            assert!(hedged >= 8, "{hedged}");
            assert_eq!(log.calls.load(SeqCst), 40 + hedged);
        } else {
            assert_eq!(hedged, 0);
            assert_eq!(log.calls.load(SeqCst), 40);
        }
    }
}

#[test]
fn settings_that_cannot_work_are_refused_by_name() {
    for (policy, name) in [
        (HedgePolicy::fixed(Duration::ZERO), "delay"),
        (HedgePolicy::fixed(Duration::from_secs(2 * 86_400)), "delay"),
        (HedgePolicy::percentile(1.0), "percentile"),
        (HedgePolicy::percentile(0.0), "percentile"),
        (HedgePolicy::percentile(f64::NAN), "percentile"),
        (HedgePolicy::percentile(0.9).min_samples(0), "min_samples"),
        (
            HedgePolicy::percentile(0.9).or_fixed(Duration::ZERO),
            "or_fixed",
        ),
        (
            HedgePolicy::percentile(0.9).period(Duration::ZERO),
            "period",
        ),
        (HedgePolicy::fixed(ms(1)).max_attempts(0), "max_attempts"),
        (HedgePolicy::fixed(ms(1)).max_attempts(6), "max_attempts"),
    ] {
        let err = HedgeLayer::try_new(policy.clone()).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config));
        assert!(err.to_string().contains(name), "{err}");
        let panic = std::panic::catch_unwind(|| HedgeLayer::new(policy)).unwrap_err();
        let msg = panic.downcast_ref::<String>().unwrap();
        assert!(msg.starts_with("HedgeLayer::new: "), "{msg}");
        assert!(msg.contains(name), "{msg}");
    }
    assert!(HedgeLayer::try_new(HedgePolicy::off()).is_ok());
    assert!(HedgePolicy::fixed(ms(1)).max_attempts(1).is_off());
}

#[cfg(feature = "metrics")]
#[test]
fn metrics_count_hedges_sent_and_won() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            // Hedged, the hedge wins; hedged, the original wins; not hedged.
            let (inner, _) = upstream(vec![
                (1_000, 200),
                (5, 200),
                (60, 200),
                (500, 200),
                (1, 200),
            ]);
            let mut svc = HedgeLayer::new(HedgePolicy::fixed(ms(50))).layer(inner);
            for _ in 0..3 {
                svc.ready().await.unwrap().call(get()).await.unwrap();
            }
        })
    });
    // One snapshot: reading a counter resets it.
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str| {
        snapshot
            .iter()
            .find(|(key, ..)| key.key().name() == name)
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name}: {other:?}"),
            })
    };
    assert_eq!(counter(crate::metrics::HEDGES_SENT), Some(2));
    assert_eq!(counter(crate::metrics::HEDGES_WON), Some(1));
}
