//! The rate-limit layer over `tower::service_fn` servers that enforce a
//! quota per window and say so in their headers, on paused time.
#![cfg(feature = "ratelimit")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rebound_core::ratelimit::{
    Cost, Dimension, PacerConfig, QuotaReset, QuotaSignal, RateLimitLayer,
};
use rebound_core::{Deadline, ErrorKind, RetryAfterHint, Sent, Verdict};
use tokio::time::Instant;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

const URL: &str = "https://api.example/v1/chat";

/// A server's quota: `limit` units per `window`, windows aligned on
/// `start`; a request is charged at arrival and answered after `latency`.
struct Quota {
    limit: u64,
    window: Duration,
    start: Instant,
    latency: Duration,
    state: Mutex<Windows>,
    calls: AtomicU64,
}

#[derive(Default)]
struct Windows {
    used: Vec<u64>,
    ok: u64,
    refused: u64,
}

impl Quota {
    fn new(limit: u64, window: Duration) -> Arc<Self> {
        Arc::new(Quota {
            limit,
            window,
            start: Instant::now(),
            latency: Duration::from_millis(20),
            state: Mutex::new(Windows::default()),
            calls: AtomicU64::new(0),
        })
    }

    /// Charge `cost` now: `Ok(remaining)` or `Err(())` (over quota), and
    /// the time to the window's end.
    fn charge(&self, cost: u64) -> (Result<u64, ()>, Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let elapsed = self.start.elapsed();
        let w = (elapsed.as_nanos() / self.window.as_nanos()) as usize;
        let end = self.window * (w as u32 + 1);
        let mut s = self.state.lock().unwrap();
        if s.used.len() <= w {
            s.used.resize(w + 1, 0);
        }
        let left = end - elapsed;
        if s.used[w] + cost > self.limit {
            s.refused += 1;
            return (Err(()), left);
        }
        s.used[w] += cost;
        s.ok += 1;
        (Ok(self.limit - s.used[w]), left)
    }

    fn used(&self, windows: usize) -> u64 {
        self.state.lock().unwrap().used.iter().take(windows).sum()
    }

    fn counts(&self) -> (u64, u64) {
        let s = self.state.lock().unwrap();
        (s.ok, s.refused)
    }
}

fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// A server that counts requests and answers OpenAI's request headers.
fn request_server(
    quota: Arc<Quota>,
) -> impl tower::Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
       + Clone
       + Send {
    service_fn(move |_req: Request<()>| {
        let quota = quota.clone();
        async move {
            let (charged, reset) = quota.charge(1);
            tokio::time::sleep(quota.latency).await;
            let b = Response::builder()
                .header("x-ratelimit-limit-requests", quota.limit.to_string())
                .header("x-ratelimit-reset-requests", go_duration(reset));
            let res = match charged {
                Ok(left) => b.header("x-ratelimit-remaining-requests", left.to_string()),
                Err(()) => b
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("x-ratelimit-remaining-requests", "0"),
            };
            Ok::<_, Infallible>(res.body(()).unwrap())
        }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn paced_callers_use_the_request_quota_without_429s() {
    const CALLERS: usize = 64;
    const WINDOWS: u32 = 10;
    let quota = Quota::new(100, Duration::from_secs(1));
    let end = quota.start + quota.window * WINDOWS;
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::with_config(
            PacerConfig::new().jitter_seed(1),
        ))
        .service(request_server(quota.clone()));
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let svc = svc.clone();
        callers.push(tokio::spawn(async move {
            // Bounded: at most 1,000 requests per caller.
            for _ in 0..1_000 {
                if Instant::now() >= end {
                    break;
                }
                let req = Request::get(URL).body(()).unwrap();
                svc.clone().oneshot(req).await.unwrap();
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let (ok, refused) = quota.counts();
    let used = quota.used(WINDOWS as usize);
    let total = ok + refused;
    let capacity = quota.limit * u64::from(WINDOWS);
    println!("paced: {total} requests, {refused} 429s, {used} of {capacity} used");
    assert!(refused * 1000 <= total, "{refused} 429s of {total}");
    assert!(used * 100 >= capacity * 95, "{used} of {capacity} used");
}

/// A server with a token quota that charges each request its real cost
/// (in its `x-cost` test header) and answers OpenAI's token headers.
fn token_server(
    quota: Arc<Quota>,
) -> impl tower::Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
       + Clone
       + Send {
    service_fn(move |req: Request<()>| {
        let quota = quota.clone();
        async move {
            let cost: u64 = req.headers()["x-cost"].to_str().unwrap().parse().unwrap();
            let (charged, reset) = quota.charge(cost);
            tokio::time::sleep(quota.latency).await;
            let b = Response::builder()
                .header("x-ratelimit-limit-tokens", quota.limit.to_string())
                .header("x-ratelimit-reset-tokens", go_duration(reset))
                .header("x-ratelimit-limit-requests", "100000")
                .header("x-ratelimit-remaining-requests", "99999");
            let res = match charged {
                Ok(left) => b.header("x-ratelimit-remaining-tokens", left.to_string()),
                Err(()) => b.status(StatusCode::TOO_MANY_REQUESTS),
            };
            Ok::<_, Infallible>(res.body(()).unwrap())
        }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn paced_callers_use_the_token_quota_with_estimates_30_percent_off() {
    const CALLERS: usize = 64;
    const WINDOWS: u32 = 10;
    let quota = Quota::new(20_000, Duration::from_secs(1));
    let end = quota.start + quota.window * WINDOWS;
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::with_config(
            PacerConfig::new().jitter_seed(2),
        ))
        .service(token_server(quota.clone()));
    let mut callers = Vec::new();
    for seed in 0..CALLERS {
        let svc = svc.clone();
        callers.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed as u64);
            for _ in 0..1_000 {
                if Instant::now() >= end {
                    break;
                }
                let real: u64 = rng.random_range(100..=300);
                let off: f64 = rng.random_range(-0.3..=0.3);
                let estimate = (real as f64 * (1.0 + off)).round() as u64;
                let mut req = Request::get(URL)
                    .header("x-cost", real.to_string())
                    .body(())
                    .unwrap();
                req.extensions_mut().insert(Cost::tokens(estimate));
                svc.clone().oneshot(req).await.unwrap();
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let (ok, refused) = quota.counts();
    let used = quota.used(WINDOWS as usize);
    let total = ok + refused;
    let capacity = quota.limit * u64::from(WINDOWS);
    println!("tokens: {total} requests, {refused} 429s, {used} of {capacity} tokens used");
    assert!(refused * 100 <= total, "{refused} 429s of {total}");
    assert!(used * 100 >= capacity * 90, "{used} of {capacity} used");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_daily_quota_fails_the_next_request_at_once_not_sent() {
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new())
        .service(service_fn(move |_req: Request<()>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async {
                let res = Response::builder()
                    .header("ratelimit-policy", "\"daily\";q=1000;w=86400")
                    .header("ratelimit", "\"daily\";r=0;t=86400")
                    .body(())
                    .unwrap();
                Ok::<_, Infallible>(res)
            }
        }));
    let res = svc
        .clone()
        .oneshot(Request::get(URL).body(()).unwrap())
        .await
        .unwrap();
    let signal = res.extensions().get::<QuotaSignal>().copied().unwrap();
    assert_eq!(signal.exhausted, Some(Dimension::Requests));

    let start = Instant::now();
    let mut req = Request::get(URL).body(()).unwrap();
    req.extensions_mut()
        .insert(Deadline(start + Duration::from_secs(30)));
    let err = svc.oneshot(req).await.unwrap_err();
    assert!(start.elapsed() <= Duration::from_millis(1));
    assert_eq!(err.kind(), ErrorKind::QuotaExhausted);
    assert!(err.is_quota_exhausted());
    assert_eq!(calls.load(Ordering::Relaxed), 1, "not sent");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert!(matches!(
        err.extensions().get::<Verdict>(),
        Some(Verdict::Fatal { .. })
    ));
    let reset = err.extensions().get::<QuotaReset>().unwrap();
    assert_eq!(reset.at, start + Duration::from_secs(86_400));
    assert_eq!(
        err.extensions().get::<RetryAfterHint>(),
        Some(&RetryAfterHint(Duration::from_secs(86_400)))
    );
    assert_eq!(
        err.to_string(),
        "quota exhausted: no requests left before the deadline for GET https://api.example/v1/chat"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_429_leaves_a_signal_and_cached_answers_are_not_read() {
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new())
        .service(service_fn(|req: Request<()>| async move {
            let b = Response::builder().header("x-ratelimit-remaining", "0");
            let res = if req.uri().path() == "/cached" {
                b.header("x-ratelimit-reset", "30").header("age", "12")
            } else {
                b.status(StatusCode::TOO_MANY_REQUESTS)
            };
            Ok::<_, Infallible>(res.body(()).unwrap())
        }));
    let cached = svc
        .clone()
        .oneshot(Request::get("https://a.example/cached").body(()).unwrap())
        .await
        .unwrap();
    assert!(cached.extensions().get::<QuotaSignal>().is_none());
    let res = svc
        .oneshot(Request::get("https://a.example/busy").body(()).unwrap())
        .await
        .unwrap();
    let signal = res.extensions().get::<QuotaSignal>().unwrap();
    assert!(signal.too_many_requests);
    assert_eq!(signal.exhausted, Some(Dimension::Requests));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_cached_answer_holds_nobody() {
    let layer = RateLimitLayer::new();
    let pacer = layer.pacer().clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            let res = Response::builder()
                .header("x-ratelimit-remaining", "0")
                .header("x-ratelimit-reset", "30")
                .header("age", "5")
                .body(())
                .unwrap();
            Ok::<_, Infallible>(res)
        }));
    let start = Instant::now();
    for _ in 0..3 {
        svc.clone()
            .oneshot(Request::get(URL).body(()).unwrap())
            .await
            .unwrap();
    }
    assert_eq!(pacer.hosts(), 0);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn composes_with_tower_timeout() {
    let layer = RateLimitLayer::new();
    let pacer = layer.pacer().clone();
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(layer)
        .timeout(Duration::from_secs(5))
        .service(service_fn(move |_req: Request<()>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async {
                let res = Response::builder()
                    .header("x-ratelimit-limit-requests", "60")
                    .header("x-ratelimit-remaining-requests", "0")
                    .header("x-ratelimit-reset-requests", "10s")
                    .body(())
                    .unwrap();
                Ok::<_, Infallible>(res)
            }
        }));
    svc.clone()
        .oneshot(Request::get(URL).body(()).unwrap())
        .await
        .unwrap();
    // The next waits for the reset (10 s): tower's timeout outside cuts it
    // at 1 s, and the dropped wait gives its place back.
    let start = Instant::now();
    let err: BoxError = svc
        .oneshot(Request::get(URL).body(()).unwrap())
        .await
        .unwrap_err();
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err}");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(pacer.hosts(), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_wait_and_the_quota_are_on_the_request_span_as_numbers() {
    use rebound_core::trace::TraceLayer;
    use rebound_test::capture::Capture;

    let svc = ServiceBuilder::new()
        .layer(TraceLayer::new())
        .layer(RateLimitLayer::with_config(
            PacerConfig::new().release_jitter(Duration::ZERO),
        ))
        .service(service_fn(|_req: Request<()>| async {
            let res = Response::builder()
                .header("x-ratelimit-limit-requests", "60")
                .header("x-ratelimit-remaining-requests", "0")
                .header("x-ratelimit-reset-requests", "1.5s")
                .body(())
                .unwrap();
            Ok::<_, Infallible>(res)
        }));
    let capture = Capture::new();
    {
        let _guard = capture.set_default();
        for _ in 0..2 {
            svc.clone()
                .oneshot(Request::get(URL).body(()).unwrap())
                .await
                .unwrap();
        }
    }
    let spans = capture.spans_named("http.client.request");
    assert_eq!(spans.len(), 2, "{}", capture.text());
    assert_eq!(spans[0].field("rebound.ratelimit.wait_ms"), None);
    for span in &spans {
        assert_eq!(span.field("rebound.ratelimit.remaining"), Some("0"));
        assert_eq!(span.field("rebound.ratelimit.reset_ms"), Some("1500"));
    }
    assert_eq!(spans[1].field("rebound.ratelimit.wait_ms"), Some("1500"));
}

/// A 200 whose `remaining` is 0 lowers the adaptive limit before any 429,
/// whichever of the two layers is outside (issue 21: "on 429, lower your
/// own concurrency"); one with quota left does not.
#[cfg(feature = "limit")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_quota_at_zero_lowers_the_adaptive_limit_in_either_order() {
    use rebound_core::limit::{AdaptiveLimitLayer, Aimd};

    fn answering(remaining: &'static str) -> Response<()> {
        Response::builder()
            .header("x-ratelimit-limit", "100")
            .header("x-ratelimit-remaining", remaining)
            .header("x-ratelimit-reset", "30")
            .body(())
            .unwrap()
    }
    for remaining in ["0", "40"] {
        for adaptive_outside in [true, false] {
            let adaptive =
                AdaptiveLimitLayer::new(Aimd::default().initial_limit(16).backoff_ratio(0.5));
            let limiter = adaptive.limiter().clone();
            let server = service_fn(move |_req: Request<()>| async move {
                Ok::<_, Infallible>(answering(remaining))
            });
            let res = if adaptive_outside {
                ServiceBuilder::new()
                    .layer(adaptive)
                    .layer(RateLimitLayer::new())
                    .service(server)
                    .oneshot(Request::get(URL).body(()).unwrap())
                    .await
                    .map(|r| r.status())
                    .map_err(|e| e.to_string())
            } else {
                ServiceBuilder::new()
                    .layer(RateLimitLayer::new())
                    .layer(adaptive)
                    .service(server)
                    .oneshot(Request::get(URL).body(()).unwrap())
                    .await
                    .map(|r| r.status())
                    .map_err(|e| e.to_string())
            };
            assert_eq!(res, Ok(StatusCode::OK));
            let want = if remaining == "0" { 8 } else { 16 };
            assert_eq!(
                limiter.current_limit(),
                want,
                "remaining {remaining}, adaptive limit outside: {adaptive_outside}"
            );
        }
    }
}
