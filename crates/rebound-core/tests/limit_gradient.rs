//! The gradient (latency-driven) adaptive limit, on paused time against a
//! model of a queueing upstream: a fixed number of workers, a FIFO queue,
//! no refusals.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rebound_core::limit::{AdaptiveLimitLayer, AdaptiveLimiter, Aimd, Gradient};
use rebound_core::{Error, ErrorKind};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

const T: Duration = Duration::from_millis(10);

fn req() -> Request<()> {
    Request::get("http://upstream.test/x").body(()).unwrap()
}

/// An upstream with `workers` workers, each taking `service` (an atomic,
/// in µs, to slow it down) per request; the rest wait in FIFO order.
#[derive(Clone)]
struct Queueing {
    workers: Arc<Semaphore>,
    service_us: Arc<AtomicU64>,
}

impl Queueing {
    fn new(workers: usize) -> Self {
        Queueing {
            workers: Arc::new(Semaphore::new(workers)),
            service_us: Arc::new(AtomicU64::new(T.as_micros() as u64)),
        }
    }

    fn slow(&self, factor: u64) {
        self.service_us
            .store(T.as_micros() as u64 * factor, Ordering::SeqCst);
    }

    fn layer(
        &self,
        limit: AdaptiveLimitLayer,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = Error, Future: Send>
           + Clone
           + Send
           + 'static {
        let this = self.clone();
        ServiceBuilder::new()
            .layer(limit)
            .service(service_fn(move |_req: Request<()>| {
                let this = this.clone();
                async move {
                    let _worker = this.workers.acquire().await.unwrap();
                    let us = this.service_us.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(us)).await;
                    Ok::<_, Error>(Response::new(()))
                }
            }))
    }
}

/// `callers` closed-loop callers for `run`; returns the latencies (ms) and
/// how many finished.
async fn drive<S>(svc: S, callers: usize, run: Duration) -> Vec<f64>
where
    S: Service<Request<()>, Response = Response<()>, Error = Error> + Clone + Send + 'static,
    S::Future: Send,
{
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            // Bounded: at most this many requests per caller.
            for _ in 0..100_000 {
                if Instant::now() >= end {
                    break;
                }
                let t0 = Instant::now();
                svc.clone().oneshot(req()).await.unwrap();
                lat.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn gradient() -> Gradient {
    Gradient::default().seed(7)
}

#[test]
fn bad_settings_are_refused_with_the_setting_named() {
    for (bad, names) in [
        (gradient().min_limit(0), "min_limit"),
        (gradient().initial_limit(500), "initial_limit"),
        (gradient().max_limit(usize::MAX), "max_limit"),
        (gradient().rtt_tolerance(0.9), "rtt_tolerance"),
        (gradient().rtt_tolerance(f64::NAN), "rtt_tolerance"),
        (gradient().smoothing(0.0), "smoothing"),
        (gradient().smoothing(1.5), "smoothing"),
        (
            gradient().update_interval(Duration::ZERO),
            "update_interval",
        ),
        (
            gradient().probe_interval(Duration::from_millis(50)),
            "probe_interval",
        ),
        (gradient().probe_jitter(1.0), "probe_jitter"),
        (gradient().probe_limit(0), "probe_limit"),
        (gradient().probe_samples(0), "probe_samples"),
        (gradient().backoff_ratio(1.0), "backoff_ratio"),
    ] {
        let err = AdaptiveLimitLayer::try_new(bad).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config), "{bad:?} accepted");
        assert!(
            err.to_string().contains(names),
            "{err} does not name {names}"
        );
    }
    // Both algorithms go through the same constructor.
    AdaptiveLimitLayer::try_new(Aimd::default()).unwrap();
    AdaptiveLimitLayer::try_new(gradient()).unwrap();
}

#[tokio::test(start_paused = true)]
async fn converges_on_a_queueing_upstream_without_its_queue() {
    // 10 workers, 40 callers (4× capacity): without a limit every request
    // would wait 4 service times.
    let up = Queueing::new(10);
    let layer = AdaptiveLimitLayer::try_new(gradient().initial_limit(40)).unwrap();
    let limiter = layer.limiter().clone();
    let svc = up.layer(layer);
    // Warm-up, then the measured run.
    drive(svc.clone(), 40, Duration::from_secs(5)).await;
    let lat = drive(svc, 40, Duration::from_secs(10)).await;
    let throughput = lat.len() as f64 / 10.0;
    let capacity = 10.0 / T.as_secs_f64();
    let limit = limiter.current_limit();
    assert!(
        (10..=20).contains(&limit),
        "limit {limit}: at most the workers plus the headroom"
    );
    assert!(
        throughput >= 0.9 * capacity,
        "throughput {throughput}/s of {capacity}/s"
    );
    // The callers' latency includes the wait for a slot; the upstream's
    // own round-trip stays near its service time.
    let min = limiter.min_rtt().unwrap();
    let sample = limiter.sample_rtt().unwrap();
    assert!(min >= T && min < T * 2, "min rtt {min:?}");
    assert!(sample <= T * 2, "sample rtt {sample:?}");
    assert!(p99(lat) > 0.0);
}

#[tokio::test(start_paused = true)]
async fn the_minimum_is_measured_again_at_a_reduced_limit() {
    let up = Queueing::new(100);
    let layer = AdaptiveLimitLayer::try_new(
        gradient()
            .initial_limit(20)
            .probe_interval(Duration::from_secs(2))
            .probe_jitter(0.1),
    )
    .unwrap();
    let limiter = layer.limiter().clone();
    let svc = up.layer(layer);
    drive(svc.clone(), 20, Duration::from_secs(1)).await;
    let first = limiter.min_rtt().unwrap();
    assert!(first >= T && first < T + T / 2, "{first:?}");
    // The upstream gets 3× slower for everyone (not a queue): the live
    // minimum cannot see it go up, the measurement does.
    up.slow(3);
    let seen_probe = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (limiter, seen) = (limiter.clone(), seen_probe.clone());
        tokio::spawn(async move {
            for _ in 0..1_000 {
                if limiter.probing() && limiter.current_limit() <= 3 {
                    seen.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    drive(svc, 20, Duration::from_secs(4)).await;
    watcher.abort();
    assert!(seen_probe.load(Ordering::SeqCst), "no probe at limit 3");
    let again = limiter.min_rtt().unwrap();
    assert!(again >= T * 3 && again < T * 4, "{again:?}");
    // Back to its level after the probe.
    assert!(limiter.current_limit() >= 15, "{}", limiter.current_limit());
}

#[tokio::test(start_paused = true)]
async fn noise_does_not_drift_the_limit_to_zero() {
    // No queue (plenty of workers); each round-trip drawn from 0.5–1.5 T,
    // one in ten 5 T.
    let rng = Arc::new(std::sync::Mutex::new(SmallRng::seed_from_u64(3)));
    let layer = AdaptiveLimitLayer::try_new(gradient().initial_limit(20)).unwrap();
    let limiter = layer.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |_req: Request<()>| {
            let d = {
                let mut rng = rng.lock().unwrap();
                let base = T.as_secs_f64() * rng.random_range(0.5..1.5);
                if rng.random_bool(0.1) {
                    T.as_secs_f64() * 5.0
                } else {
                    base
                }
            };
            async move {
                tokio::time::sleep(Duration::from_secs_f64(d)).await;
                Ok::<_, Error>(Response::new(()))
            }
        }));
    let lowest = Arc::new(AtomicUsize::new(usize::MAX));
    let watcher = {
        let (limiter, lowest) = (limiter.clone(), lowest.clone());
        tokio::spawn(async move {
            for _ in 0..10_000 {
                lowest.fetch_min(limiter.current_limit(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    drive(svc, 20, Duration::from_secs(60)).await;
    watcher.abort();
    // Only the probes (every ~30 s) go low, and only to their limit.
    let lowest = lowest.load(Ordering::SeqCst);
    assert!(lowest >= 3, "lowest {lowest}");
    let end = limiter.current_limit();
    assert!(end >= 15, "the limit drifted to {end}");
}

#[tokio::test(start_paused = true)]
async fn recovers_after_a_slow_phase() {
    let up = Queueing::new(10);
    let layer = AdaptiveLimitLayer::try_new(gradient().initial_limit(20)).unwrap();
    let limiter = layer.limiter().clone();
    let svc = up.layer(layer);
    drive(svc.clone(), 40, Duration::from_secs(5)).await;
    let before = limiter.current_limit();
    up.slow(10);
    drive(svc.clone(), 40, Duration::from_secs(5)).await;
    let slow = limiter.current_limit();
    assert!(slow < before, "{slow} vs {before}");
    up.slow(1);
    // Within 5 s of traffic, back within 10 %.
    let back = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (limiter, back) = (limiter.clone(), back.clone());
        let since = Instant::now();
        tokio::spawn(async move {
            for _ in 0..1_000 {
                if limiter.current_limit() * 10 >= before * 9 {
                    back.store(since.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    drive(svc, 40, Duration::from_secs(5)).await;
    watcher.abort();
    let ms = back.load(Ordering::SeqCst);
    assert!(
        ms > 0 && ms <= 5_000,
        "not back to {before} in 5 s (now {})",
        limiter.current_limit()
    );
}

#[tokio::test(start_paused = true)]
async fn loss_signals_still_shrink_it() {
    for answer in ["503", "429", "connect"] {
        let layer = AdaptiveLimitLayer::try_new(gradient().initial_limit(20)).unwrap();
        let limiter: Arc<AdaptiveLimiter> = layer.limiter().clone();
        let mut svc = ServiceBuilder::new().layer(layer).service(service_fn(
            move |_req: Request<()>| async move {
                let mut res = Response::new(());
                match answer {
                    "503" => *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE,
                    "429" => *res.status_mut() = StatusCode::TOO_MANY_REQUESTS,
                    _ => return Err(Error::new(ErrorKind::Connect)),
                }
                Ok(res)
            },
        ));
        let _ = svc.ready().await.unwrap().call(req()).await;
        assert_eq!(limiter.current_limit(), 18, "{answer}: 20 × 0.9");
    }
}
