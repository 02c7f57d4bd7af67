//! `CircuitBreakerLayer` on the paused clock: what opens a circuit and what
//! does not (throttling never counts; the consecutive trigger and its
//! reset; the ratio at the defaults; open-circuit and other fatal
//! refusals not counted), the sliding window (fresh when the circuit
//! closes), the break, half-open probes (a dropped one frees its slot),
//! per-host isolation, the bounded table, the error it fails with and the
//! retry loop's answer to it, above and below the loop; concurrent calls
//! when half-open (exactly the probes go through) and parallel calls on two
//! threads over a small table (every call counted once).
#![cfg(feature = "breaker")]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{Empty, Full};
use rebound_core::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound_core::classify::{ClassifyLayer, HttpClassifier};
use rebound_core::{
    CircuitState, Error, ErrorKind, Reason, RetryAfterHint, RetryStop, Sent, Verdict,
};
use tokio::sync::oneshot;
use tower::util::BoxCloneService;
use tower::{service_fn, ServiceBuilder, ServiceExt};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A host whose next call waits until the sender is dropped.
type Hold = (String, oneshot::Receiver<()>);

/// A fake upstream: the status each host answers (200 unless set), and the
/// calls each host received.
#[derive(Clone, Default)]
struct Upstream {
    status: Arc<Mutex<HashMap<String, u16>>>,
    /// A `Retry-After` header each host's answers carry, when set.
    retry_after: Arc<Mutex<HashMap<String, &'static str>>>,
    calls: Arc<Mutex<HashMap<String, u64>>>,
    /// When set, calls to this host wait for the sender to be dropped.
    hold: Arc<Mutex<Option<Hold>>>,
}

impl Upstream {
    fn set(&self, host: &str, status: u16) {
        self.status.lock().unwrap().insert(host.to_owned(), status);
    }

    fn set_retry_after(&self, host: &str, value: &'static str) {
        self.retry_after
            .lock()
            .unwrap()
            .insert(host.to_owned(), value);
    }

    fn calls(&self, host: &str) -> u64 {
        self.calls.lock().unwrap().get(host).copied().unwrap_or(0)
    }

    fn service(&self) -> BoxCloneService<Request<Empty<Bytes>>, Response<Full<Bytes>>, Error> {
        let up = self.clone();
        ServiceBuilder::new()
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(service_fn(move |req: Request<Empty<Bytes>>| {
                let up = up.clone();
                async move {
                    let host = req.uri().host().unwrap_or("").to_owned();
                    *up.calls.lock().unwrap().entry(host.clone()).or_default() += 1;
                    let wait = {
                        let mut hold = up.hold.lock().unwrap();
                        match hold.take() {
                            Some((h, rx)) if h == host => Some(rx),
                            other => {
                                *hold = other;
                                None
                            }
                        }
                    };
                    if let Some(rx) = wait {
                        let _ = rx.await;
                    }
                    let status = up.status.lock().unwrap().get(&host).copied().unwrap_or(200);
                    let mut res = Response::new(Full::new(Bytes::new()));
                    *res.status_mut() = StatusCode::from_u16(status).unwrap();
                    if let Some(v) = up.retry_after.lock().unwrap().get(&host) {
                        res.headers_mut()
                            .insert("retry-after", http::HeaderValue::from_static(v));
                    }
                    Ok::<_, Infallible>(res)
                }
            }))
            .boxed_clone()
    }
}

type Svc = BoxCloneService<Request<Empty<Bytes>>, Response<Full<Bytes>>, Error>;

fn stack(layer: &CircuitBreakerLayer, up: &Upstream) -> Svc {
    ServiceBuilder::new()
        .layer(layer.clone())
        .service(up.service())
        .boxed_clone()
}

fn uri(host: &str) -> Uri {
    format!("https://{host}/v1/items").parse().unwrap()
}

fn call(
    svc: &Svc,
    host: &str,
) -> impl std::future::Future<Output = Result<Response<Full<Bytes>>, Error>> + Send + Unpin {
    svc.clone()
        .oneshot(Request::get(uri(host)).body(Empty::new()).unwrap())
}

/// Small numbers so a test reads: ratio 50 %, 10 calls, 10 s window, 5 s
/// break (and the default consecutive trigger, 10 in a row).
fn config() -> CircuitBreakerConfig {
    CircuitBreakerConfig::default()
        .failure_ratio(0.5)
        .minimum_throughput(10)
        .sampling_duration(secs(10))
        .break_duration(secs(5))
}

#[tokio::test(start_paused = true)]
async fn opens_after_the_minimum_and_fails_fast_without_calling() {
    let up = Upstream::default();
    up.set("down.example", 503);
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);

    for n in 1..=9 {
        let res = call(&svc, "down.example").await.unwrap();
        assert_eq!(res.status(), 503, "call {n} reaches the server");
        assert_eq!(breaker.state(&uri("down.example")), CircuitState::Closed);
    }
    call(&svc, "down.example").await.unwrap();
    assert_eq!(breaker.state(&uri("down.example")), CircuitState::Open);
    assert_eq!(up.calls("down.example"), 10);

    for _ in 0..100 {
        let err = call(&svc, "down.example").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    }
    assert_eq!(up.calls("down.example"), 10, "fail fast: not sent");
}

#[tokio::test(start_paused = true)]
async fn open_error_is_not_sent_fatal_and_names_the_host_without_secrets() {
    let up = Upstream::default();
    up.set("down.example", 503);
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    for _ in 0..10 {
        call(&svc, "down.example").await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(1500)).await;
    let secret: Uri = "https://user:pw@down.example/v1/items?token=s3cret"
        .parse()
        .unwrap();
    let err = svc
        .clone()
        .oneshot(Request::post(secret).body(Empty::new()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "circuit open: may close in 3.5s for POST https://down.example/v1/items"
    );
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("s3cret") && !shown.contains("pw"),
        "{shown}"
    );
    let ext = err.extensions();
    assert_eq!(ext.get::<Sent>(), Some(&Sent::NotSent));
    assert_eq!(
        ext.get::<Verdict>(),
        Some(&Verdict::Fatal {
            reason: Reason::new_static("circuit open")
        })
    );
    assert_eq!(
        ext.get::<RetryAfterHint>(),
        Some(&RetryAfterHint(Duration::from_millis(3500)))
    );
    assert_eq!(ext.get::<CircuitState>(), Some(&CircuitState::Open));
    // A classifier above a breaker calls it fatal too.
    assert!(HttpClassifier::default().classify_error(&err).is_fatal());
}

#[tokio::test(start_paused = true)]
async fn fatal_4xx_never_open_it() {
    let up = Upstream::default();
    up.set("notfound.example", 404);
    up.set("bad.example", 400);
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    for _ in 0..100 {
        assert_eq!(call(&svc, "notfound.example").await.unwrap().status(), 404);
        assert_eq!(call(&svc, "bad.example").await.unwrap().status(), 400);
    }
    assert_eq!(
        breaker.state(&uri("notfound.example")),
        CircuitState::Closed
    );
    assert_eq!(breaker.state(&uri("bad.example")), CircuitState::Closed);
    assert_eq!(up.calls("notfound.example"), 100);
}

/// Throttling is not breakage: a 429 (whatever its verdict), a 5xx with a
/// `Retry-After` header, an outcome carrying a `RetryAfterHint` (response
/// or error) and the gate's own `Throttled` refusal are never counted —
/// neither as failures nor as successes (a run of failures goes on across
/// them).
#[tokio::test(start_paused = true)]
async fn throttling_never_counts() {
    let up = Upstream::default();
    up.set("busy.example", 429);
    up.set("paused.example", 503);
    up.set_retry_after("paused.example", "1");
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    for _ in 0..200 {
        assert_eq!(call(&svc, "busy.example").await.unwrap().status(), 429);
        assert_eq!(call(&svc, "paused.example").await.unwrap().status(), 503);
    }
    assert_eq!(breaker.state(&uri("busy.example")), CircuitState::Closed);
    assert_eq!(breaker.state(&uri("paused.example")), CircuitState::Closed);
    assert_eq!(up.calls("busy.example"), 200, "every call was sent");
    assert_eq!(up.calls("paused.example"), 200);

    // A hint the layers below left (a Retry-After parsed, gRPC pushback),
    // on a retryable response or error, and the gate's refusal.
    #[derive(Clone, Copy)]
    enum Answer {
        HintedResponse,
        HintedError,
        Throttled,
        Failure,
    }
    let answer = Arc::new(Mutex::new(Answer::HintedResponse));
    let inner = {
        let answer = answer.clone();
        service_fn(move |_req: Request<Empty<Bytes>>| {
            let answer = *answer.lock().unwrap();
            async move {
                let retryable = Verdict::Retryable {
                    reason: Reason::new_static("status 502"),
                    sent: Sent::MaybeProcessed,
                };
                match answer {
                    Answer::HintedResponse | Answer::Failure => {
                        let mut res = Response::new(Full::new(Bytes::new()));
                        *res.status_mut() = StatusCode::BAD_GATEWAY;
                        res.extensions_mut().insert(retryable);
                        if matches!(answer, Answer::HintedResponse) {
                            res.extensions_mut()
                                .insert(RetryAfterHint(Duration::from_secs(2)));
                        }
                        Ok(res)
                    }
                    Answer::HintedError => {
                        let mut err = Error::new(ErrorKind::Transport);
                        err.extensions_mut().insert(retryable);
                        err.extensions_mut()
                            .insert(RetryAfterHint(Duration::from_secs(2)));
                        Err(err)
                    }
                    // No verdict at all: counted a failure if the kind did
                    // not say "throttled".
                    Answer::Throttled => Err(Error::new(ErrorKind::Throttled)),
                }
            }
        })
    };
    let breaker = CircuitBreakerLayer::new(config());
    let svc: Svc = ServiceBuilder::new()
        .layer(breaker.clone())
        .service(inner)
        .boxed_clone();
    let at = uri("hinted.example");
    // Nine failures: one short of the run that opens it.
    *answer.lock().unwrap() = Answer::Failure;
    for _ in 0..9 {
        let _ = call(&svc, "hinted.example").await;
    }
    for a in [
        Answer::HintedResponse,
        Answer::HintedError,
        Answer::Throttled,
    ] {
        *answer.lock().unwrap() = a;
        for _ in 0..100 {
            let _ = call(&svc, "hinted.example").await;
        }
        assert_eq!(breaker.state(&at), CircuitState::Closed);
    }
    // The run went on across them: one more failure opens it.
    *answer.lock().unwrap() = Answer::Failure;
    let _ = call(&svc, "hinted.example").await;
    assert_eq!(breaker.state(&at), CircuitState::Open);
}

/// A half-open probe answered with a 429 is not counted: its slot goes to
/// the next call, whose success closes the circuit.
#[tokio::test(start_paused = true)]
async fn a_throttled_probe_frees_its_slot() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    open(&svc, &up, "x.example").await;
    tokio::time::advance(secs(5)).await;
    up.set("x.example", 429);
    assert_eq!(call(&svc, "x.example").await.unwrap().status(), 429);
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::HalfOpen);
    up.set("x.example", 200);
    assert_eq!(call(&svc, "x.example").await.unwrap().status(), 200);
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::Closed);
}

/// The consecutive trigger: `consecutive_failures` failures in a row open
/// the circuit whatever the window holds; one success ends the run; `0`
/// turns the trigger off.
#[tokio::test(start_paused = true)]
async fn consecutive_failures_open_it_and_a_success_ends_the_run() {
    let up = Upstream::default();
    // The defaults: 10 in a row (the ratio needs 100 calls).
    let breaker = CircuitBreakerLayer::default();
    let svc = stack(&breaker, &up);
    let at = uri("x.example");
    // A window full of successes: the ratio is far from 50 %.
    for _ in 0..1000 {
        call(&svc, "x.example").await.unwrap();
    }
    for _ in 0..5 {
        up.set("x.example", 503);
        for _ in 0..9 {
            call(&svc, "x.example").await.unwrap();
        }
        up.set("x.example", 200);
        call(&svc, "x.example").await.unwrap();
    }
    assert_eq!(breaker.state(&at), CircuitState::Closed, "runs of 9");
    up.set("x.example", 503);
    for n in 1..=10 {
        assert_eq!(breaker.state(&at), CircuitState::Closed, "failure {n}");
        call(&svc, "x.example").await.unwrap();
    }
    assert_eq!(breaker.state(&at), CircuitState::Open, "10 in a row");
    assert_eq!(up.calls("x.example"), 1000 + 50 + 10);

    // Off: only the ratio, which 50 failures below the minimum cannot reach.
    let breaker = CircuitBreakerLayer::new(CircuitBreakerConfig::default().consecutive_failures(0));
    let svc = stack(&breaker, &up);
    for _ in 0..50 {
        call(&svc, "x.example").await.unwrap();
    }
    assert_eq!(breaker.state(&at), CircuitState::Closed);
}

/// The ratio at its defaults: 50 % of at least 100 calls in 30 s. A host
/// failing one call in ten — or one in three — never trips it; one failing
/// every other call does, at the 100th.
#[tokio::test(start_paused = true)]
async fn the_ratio_opens_it_at_50_percent_of_100_calls() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::default();
    let svc = stack(&breaker, &up);
    for (host, every) in [("tenth.example", 10), ("third.example", 3)] {
        for n in 0..3000u64 {
            up.set(host, if n % every == 0 { 503 } else { 200 });
            call(&svc, host).await.unwrap();
            if n % 100 == 0 {
                tokio::time::advance(Duration::from_millis(100)).await;
            }
        }
        assert_eq!(breaker.state(&uri(host)), CircuitState::Closed, "{host}");
    }
    for n in 1..=100u64 {
        assert_eq!(
            breaker.state(&uri("half.example")),
            CircuitState::Closed,
            "call {n}"
        );
        up.set("half.example", if n % 2 == 0 { 503 } else { 200 });
        call(&svc, "half.example").await.unwrap();
    }
    assert_eq!(breaker.state(&uri("half.example")), CircuitState::Open);
}

/// When the probes close the circuit it starts afresh: the failures that
/// opened it are gone from the window, and the run of failures is over.
#[tokio::test(start_paused = true)]
async fn the_window_and_the_run_start_fresh_when_the_circuit_closes() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    let at = uri("x.example");
    open(&svc, &up, "x.example").await;
    tokio::time::advance(secs(5)).await;
    up.set("x.example", 200);
    call(&svc, "x.example").await.unwrap();
    assert_eq!(breaker.state(&at), CircuitState::Closed);
    // Nine failures: with the ten that opened it still in the window (or
    // the run still counting) this would open it again at once.
    up.set("x.example", 503);
    for n in 1..=9 {
        call(&svc, "x.example").await.unwrap();
        assert_eq!(breaker.state(&at), CircuitState::Closed, "failure {n}");
    }
    call(&svc, "x.example").await.unwrap();
    assert_eq!(breaker.state(&at), CircuitState::Open);
}

/// A call the circuit refused is not counted, here or by a breaker above
/// (the open error is fatal): an outer breaker over an open inner one stays
/// closed, and the inner one closes on its first probe.
#[tokio::test(start_paused = true)]
async fn open_circuit_refusals_are_never_counted() {
    let up = Upstream::default();
    let inner = CircuitBreakerLayer::new(config());
    let outer = CircuitBreakerLayer::new(config().consecutive_failures(1).minimum_throughput(1));
    let svc: Svc = ServiceBuilder::new()
        .layer(outer.clone())
        .layer(inner.clone())
        .service(up.service())
        .boxed_clone();
    let at = uri("x.example");
    // The outer one opens on any failure that counts: keep it out of the
    // inner one's opening by stacking the inner one alone first.
    open(&stack(&inner, &up), &up, "x.example").await;
    assert_eq!(inner.state(&at), CircuitState::Open);
    for _ in 0..200 {
        assert!(matches!(
            call(&svc, "x.example").await.unwrap_err().kind(),
            ErrorKind::CircuitOpen
        ));
    }
    assert_eq!(outer.state(&at), CircuitState::Closed);
    assert_eq!(up.calls("x.example"), 10, "nothing was sent");
    tokio::time::advance(secs(5)).await;
    up.set("x.example", 200);
    call(&svc, "x.example").await.unwrap();
    assert_eq!(inner.state(&at), CircuitState::Closed);
    assert_eq!(outer.state(&at), CircuitState::Closed);
}

/// Above a retry loop the breaker counts each request's final outcome: a
/// host whose every other attempt fails, which 3 attempts always absorb,
/// never opens it; below the loop (counting attempts) the same host does.
#[tokio::test(start_paused = true)]
async fn above_a_retry_loop_absorbed_errors_are_not_counted() {
    use rebound_core::retry::{RetryBudget, RetryLayer, RetryPolicy};
    use std::sync::atomic::{AtomicU64, Ordering};
    let upstream = || {
        let n = Arc::new(AtomicU64::new(0));
        ServiceBuilder::new()
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(service_fn(move |_req: Request<Empty<Bytes>>| {
                let fail = n.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
                async move {
                    let mut res = Response::new(Full::new(Bytes::new()));
                    if fail {
                        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    }
                    Ok::<_, Infallible>(res)
                }
            }))
    };
    let retry = || {
        RetryLayer::new(RetryPolicy::default().budget(Arc::new(RetryBudget::new(1.0, secs(10), 0))))
    };
    let above = CircuitBreakerLayer::default();
    let svc: Svc = ServiceBuilder::new()
        .layer(above.clone())
        .layer(retry())
        .service(upstream())
        .boxed_clone();
    for _ in 0..1000 {
        assert_eq!(call(&svc, "x.example").await.unwrap().status(), 200);
    }
    assert_eq!(above.state(&uri("x.example")), CircuitState::Closed);

    let below = CircuitBreakerLayer::default();
    let svc: Svc = ServiceBuilder::new()
        .layer(retry())
        .layer(below.clone())
        .service(upstream())
        .boxed_clone();
    let mut open = 0;
    for _ in 0..1000 {
        if call(&svc, "x.example").await.is_err() {
            open += 1;
        }
    }
    assert_eq!(below.state(&uri("x.example")), CircuitState::Open);
    assert!(open > 0);
}

#[tokio::test(start_paused = true)]
async fn a_ratio_below_the_threshold_or_too_few_calls_do_not_open_it() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    // 20 % failures over 100 calls: under 50 % in every window.
    for n in 0..100 {
        up.set("flaky.example", if n % 5 == 0 { 503 } else { 200 });
        call(&svc, "flaky.example").await.unwrap();
    }
    assert_eq!(breaker.state(&uri("flaky.example")), CircuitState::Closed);

    // Every call fails, but only 9 in any 10 s window (and the run of
    // failures, which would open it at 10, is off here).
    let breaker = CircuitBreakerLayer::new(config().consecutive_failures(0));
    let svc = stack(&breaker, &up);
    up.set("rare.example", 503);
    for _ in 0..50 {
        call(&svc, "rare.example").await.unwrap();
        tokio::time::advance(Duration::from_millis(1200)).await;
    }
    assert_eq!(breaker.state(&uri("rare.example")), CircuitState::Closed);
    assert_eq!(up.calls("rare.example"), 50);
}

#[tokio::test(start_paused = true)]
async fn old_outcomes_slide_out_of_the_window() {
    let up = Upstream::default();
    // The ratio alone (10 failures in a row would open it either way).
    let breaker = CircuitBreakerLayer::new(config().consecutive_failures(0));
    let svc = stack(&breaker, &up);
    // 1000 successes, then 11 s later 10 failures: the successes have left
    // the window, so the ratio is 100 %.
    for _ in 0..1000 {
        call(&svc, "a.example").await.unwrap();
    }
    tokio::time::advance(secs(11)).await;
    up.set("a.example", 503);
    for _ in 0..10 {
        call(&svc, "a.example").await.unwrap();
    }
    assert_eq!(breaker.state(&uri("a.example")), CircuitState::Open);

    // The same with the successes inside the window: 10 / 1010 < 50 %.
    up.set("b.example", 200);
    for _ in 0..1000 {
        call(&svc, "b.example").await.unwrap();
    }
    tokio::time::advance(secs(5)).await;
    up.set("b.example", 503);
    for _ in 0..10 {
        call(&svc, "b.example").await.unwrap();
    }
    assert_eq!(breaker.state(&uri("b.example")), CircuitState::Closed);
}

async fn open(svc: &Svc, up: &Upstream, host: &str) {
    up.set(host, 503);
    for _ in 0..10 {
        let _ = call(svc, host).await;
    }
}

#[tokio::test(start_paused = true)]
async fn after_the_break_one_probe_goes_through_and_its_success_closes_it() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    open(&svc, &up, "x.example").await;
    assert_eq!(up.calls("x.example"), 10);

    tokio::time::advance(Duration::from_millis(4999)).await;
    assert!(matches!(
        call(&svc, "x.example").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));
    assert_eq!(up.calls("x.example"), 10);
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::HalfOpen);

    // The host is healthy again. The probe is held at the server: while it
    // is in flight, other calls still fail fast.
    up.set("x.example", 200);
    let (tx, rx) = oneshot::channel();
    *up.hold.lock().unwrap() = Some(("x.example".to_owned(), rx));
    let probe = tokio::spawn(call(&svc, "x.example"));
    tokio::task::yield_now().await;
    assert_eq!(up.calls("x.example"), 11, "one probe went through");
    for _ in 0..5 {
        let err = call(&svc, "x.example").await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::CircuitOpen));
        assert_eq!(
            err.to_string(),
            "circuit open: probes in flight for GET https://x.example/v1/items"
        );
        assert_eq!(err.extensions().get::<RetryAfterHint>(), None);
    }
    assert_eq!(up.calls("x.example"), 11);
    drop(tx);
    assert_eq!(probe.await.unwrap().unwrap().status(), 200);
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::Closed);
    for _ in 0..20 {
        assert_eq!(call(&svc, "x.example").await.unwrap().status(), 200);
    }
    assert_eq!(up.calls("x.example"), 31);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_opens_it_again_for_a_growing_break() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(
        config().break_growth(2.0, secs(12)), // 5 s, 10 s, 12 s, 12 s
    );
    let svc = stack(&breaker, &up);
    open(&svc, &up, "x.example").await;
    for (n, wait) in [5, 10, 12, 12].into_iter().enumerate() {
        tokio::time::advance(secs(wait) - Duration::from_millis(1)).await;
        assert!(
            matches!(
                call(&svc, "x.example").await.unwrap_err().kind(),
                ErrorKind::CircuitOpen
            ),
            "break {n} is {wait} s"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        let before = up.calls("x.example");
        assert_eq!(call(&svc, "x.example").await.unwrap().status(), 503);
        assert_eq!(up.calls("x.example"), before + 1, "one probe");
        assert_eq!(breaker.state(&uri("x.example")), CircuitState::Open);
    }
    // Healthy again: the next probe closes it, and the break is back to 5 s
    // the next time it opens.
    tokio::time::advance(secs(12)).await;
    up.set("x.example", 200);
    call(&svc, "x.example").await.unwrap();
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::Closed);
    open(&svc, &up, "x.example").await;
    tokio::time::advance(secs(5)).await;
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_slot() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    open(&svc, &up, "x.example").await;
    tokio::time::advance(secs(5)).await;
    up.set("x.example", 200);

    let (_tx, rx) = oneshot::channel();
    *up.hold.lock().unwrap() = Some(("x.example".to_owned(), rx));
    let mut probe = call(&svc, "x.example");
    assert!(futures_poll_once(&mut probe).await.is_none());
    assert_eq!(up.calls("x.example"), 11);
    assert!(matches!(
        call(&svc, "x.example").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));
    // Its caller gives up: the slot is free for the next call, which
    // probes and closes the circuit.
    drop(probe);
    assert_eq!(call(&svc, "x.example").await.unwrap().status(), 200);
    assert_eq!(up.calls("x.example"), 12);
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::Closed);
}

/// Poll `fut` once; `Some` if it finished.
async fn futures_poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *fut).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn several_probes_must_all_succeed() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config().half_open_probes(3));
    let svc = stack(&breaker, &up);
    open(&svc, &up, "x.example").await;
    tokio::time::advance(secs(5)).await;
    up.set("x.example", 200);
    call(&svc, "x.example").await.unwrap();
    call(&svc, "x.example").await.unwrap();
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::HalfOpen);
    call(&svc, "x.example").await.unwrap();
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn hosts_are_isolated_and_clones_share_state() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let svc = stack(&breaker, &up);
    let other_clone = stack(&breaker.clone(), &up);
    open(&svc, &up, "down.example").await;
    assert!(matches!(
        call(&other_clone, "down.example").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));
    for _ in 0..100 {
        assert_eq!(call(&svc, "up.example").await.unwrap().status(), 200);
    }
    assert_eq!(up.calls("up.example"), 100);
    // Another port is another circuit; case and userinfo are not.
    let other_port: Uri = "https://down.example:8443/".parse().unwrap();
    assert_eq!(breaker.state(&other_port), CircuitState::Closed);
    let same: Uri = "https://me@DOWN.example:443/x".parse().unwrap();
    assert_eq!(breaker.state(&same), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_key_fn_picks_the_scope() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config().key_fn(|_| ()));
    let svc = stack(&breaker, &up);
    open(&svc, &up, "a.example").await;
    assert!(matches!(
        call(&svc, "b.example").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));
}

#[tokio::test(start_paused = true)]
async fn the_table_is_bounded_and_keeps_open_circuits() {
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config().max_circuits(4));
    let svc = stack(&breaker, &up);
    open(&svc, &up, "down.example").await;
    for n in 0..10_000 {
        call(&svc, &format!("h{n}.example")).await.unwrap();
    }
    assert!(format!("{breaker:?}").contains("slots: 4"));
    // Closed circuits were evicted for new hosts, not the open one.
    assert_eq!(breaker.state(&uri("down.example")), CircuitState::Open);
    assert!(matches!(
        call(&svc, "down.example").await.unwrap_err().kind(),
        ErrorKind::CircuitOpen
    ));
}

#[tokio::test(start_paused = true)]
async fn the_retry_loop_spends_no_attempt_or_budget_on_an_open_circuit() {
    use rebound_core::retry::{RetryBudget, RetryLayer, RetryPolicy};
    let up = Upstream::default();
    let breaker = CircuitBreakerLayer::new(config());
    let budget = Arc::new(RetryBudget::default());
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::default()
                .max_attempts(3)
                .budget(budget.clone()),
        ))
        .layer(breaker.clone())
        .service(up.service())
        .boxed_clone();
    open(&svc, &up, "down.example").await;
    let calls = up.calls("down.example");
    let left = budget.remaining();
    for _ in 0..50 {
        let err = call(&svc, "down.example").await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::CircuitOpen));
        assert_eq!(err.retry_stop(), Some(RetryStop::Fatal));
        assert_eq!(err.attempts(), 1);
    }
    assert_eq!(up.calls("down.example"), calls);
    assert!(budget.remaining() >= left, "no retry was spent");
}

/// A retry that meets a circuit opened after its first attempt returns
/// `CircuitOpen` carrying that first attempt's outcome (DESIGN §4: the
/// last real outcome is not lost).
#[tokio::test(start_paused = true)]
async fn a_retry_meeting_an_open_circuit_keeps_the_previous_outcome() {
    use rebound_core::retry::{RetryBudget, RetryLayer, RetryPolicy};
    use rebound_core::PreviousAttempt;
    let up = Upstream::default();
    // Opens on the first failure.
    let breaker = CircuitBreakerLayer::new(config().minimum_throughput(1));
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(
            RetryPolicy::default()
                .max_attempts(3)
                .budget(Arc::new(RetryBudget::new(1.0, secs(10), 10))),
        ))
        .layer(breaker.clone())
        .service(up.service())
        .boxed_clone();
    up.set("down.example", 503);
    let err = call(&svc, "down.example").await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::CircuitOpen), "{err}");
    assert_eq!(err.attempts(), 2, "the retry met the open circuit");
    assert_eq!(up.calls("down.example"), 1);
    let previous = err
        .extensions()
        .get::<PreviousAttempt>()
        .expect("the first attempt's outcome");
    assert_eq!(previous.attempt, 1);
    assert!(previous.verdict.is_retryable(), "{:?}", previous.verdict);
    assert_eq!(
        previous.verdict.reason().map(Reason::as_str),
        Some("status 503")
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_when_half_open_let_exactly_the_probes_through() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let reached = Arc::new(AtomicU64::new(0));
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let upstream = {
        let (reached, failing, release) = (reached.clone(), failing.clone(), release.clone());
        ServiceBuilder::new()
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(service_fn(move |_req: Request<Empty<Bytes>>| {
                let (reached, failing, release) =
                    (reached.clone(), failing.clone(), release.clone());
                async move {
                    reached.fetch_add(1, Ordering::SeqCst);
                    let fail = failing.load(Ordering::SeqCst);
                    if !fail {
                        release.acquire().await.unwrap().forget();
                    }
                    let mut res = Response::new(Full::new(Bytes::new()));
                    *res.status_mut() = if fail {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::OK
                    };
                    Ok::<_, Infallible>(res)
                }
            }))
    };
    let breaker = CircuitBreakerLayer::new(config().half_open_probes(3));
    let svc: Svc = ServiceBuilder::new()
        .layer(breaker.clone())
        .service(upstream)
        .boxed_clone();
    for _ in 0..10 {
        call(&svc, "x.example").await.unwrap();
    }
    tokio::time::advance(secs(5)).await;
    failing.store(false, std::sync::atomic::Ordering::SeqCst);

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        tasks.spawn(call(&svc, "x.example"));
    }
    // Let every task reach the breaker.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(reached.load(Ordering::SeqCst), 13, "exactly 3 probes");
    release.add_permits(3);
    let (mut ok, mut open) = (0, 0);
    while let Some(out) = tasks.join_next().await {
        match out.unwrap() {
            Ok(res) => {
                assert_eq!(res.status(), 200);
                ok += 1;
            }
            Err(err) => {
                assert!(matches!(err.kind(), ErrorKind::CircuitOpen));
                open += 1;
            }
        }
    }
    assert_eq!((ok, open), (3, 47));
    assert_eq!(breaker.state(&uri("x.example")), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_over_a_small_table_count_every_call_once() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let reached = Arc::new(AtomicU64::new(0));
    let upstream = {
        let reached = reached.clone();
        ServiceBuilder::new()
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(service_fn(move |req: Request<Empty<Bytes>>| {
                reached.fetch_add(1, Ordering::Relaxed);
                // Half the hosts fail everything.
                let fail = req.uri().host().is_some_and(|h| h.len() % 2 == 0);
                async move {
                    let mut res = Response::new(Full::new(Bytes::new()));
                    *res.status_mut() = if fail {
                        StatusCode::BAD_GATEWAY
                    } else {
                        StatusCode::OK
                    };
                    Ok::<_, Infallible>(res)
                }
            }))
    };
    let breaker = CircuitBreakerLayer::new(config().max_circuits(8).break_duration(secs(600)));
    let svc: Svc = ServiceBuilder::new()
        .layer(breaker.clone())
        .service(upstream)
        .boxed_clone();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8 {
        let svc = svc.clone();
        tasks.spawn(async move {
            let mut fast = 0u64;
            for n in 0..2_000u64 {
                let host = format!("{}.example", "h".repeat(1 + ((n + t) % 24) as usize));
                match call(&svc, &host).await {
                    Ok(_) => {}
                    Err(err) => {
                        assert!(matches!(err.kind(), ErrorKind::CircuitOpen), "{err}");
                        fast += 1;
                    }
                }
            }
            fast
        });
    }
    let mut fast = 0;
    while let Some(n) = tasks.join_next().await {
        fast += n.unwrap();
    }
    assert_eq!(reached.load(Ordering::Relaxed) + fast, 8 * 2_000);
    // Whether a failing host kept its slot long enough to open depends on
    // the interleaving (24 hosts churn through 8 slots); alone, one does.
    for _ in 0..10 {
        let _ = call(&svc, "hh.example").await;
    }
    assert_eq!(breaker.state(&uri("hh.example")), CircuitState::Open);
}
