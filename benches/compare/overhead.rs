//! In-process overhead: what a stack of layers adds to a service that
//! answers 200 at once, in ns per request and heap allocations per request.
//!
//! Columns run interleaved on one current-thread runtime; each round sends
//! `n` requests one after the other through each column (`ready`, `call`,
//! read the response body to its end), in a shuffled order. Time is this
//! thread's **CPU time** (all the work runs on it), so being preempted by
//! the machine's other jobs does not count; cache pollution still does.
//! "added ns" is the median over rounds of `column − bare` in the same
//! round.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use cpu_time::ThreadTime;
use http::{Request, Response, Uri};
use http_body::Body;
use http_body_util::{BodyExt as _, Empty, Full};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom as _;
use rand::SeedableRng as _;
use rebound::breaker::CircuitBreakerLayer;
use rebound::{
    deadline::DeadlineBody, limit::LimitBody, trace::TraceBody, AdaptiveLimitLayer, Aimd,
    AttemptTimeoutLayer, Backoff, BackoffLayer, CancelLayer, ClassifyLayer, CollectBodyLayer,
    ConcurrencyLimitLayer, DeadlineLayer, Error, HttpClassifier, IdempotencyKeyLayer,
    RetryAfterGateLayer, RetryAfterLayer, RetryLayer, RetryPolicy, TraceLayer,
};
use tokio::time::Instant;
use tower::layer::util::Identity;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};

use crate::peers::{tower_stack, Attempts};
use crate::report::{f, Checks, Samples, Table};
use crate::{allocations, Mode};

/// The request every column sends.
pub(crate) type Req = Request<Full<Bytes>>;

type Answer = Ready<Result<Response<Empty<Bytes>>, Infallible>>;

/// The bare service: a `tower::service_fn` answering 200 at once (a named
/// type, so any `tower::Layer<Bare>` can wrap it).
pub(crate) type Bare = tower::util::ServiceFn<fn(Req) -> Answer>;

fn ok200(_req: Req) -> Answer {
    ready(Ok(Response::new(Empty::new())))
}

pub(crate) fn bare() -> Bare {
    tower::service_fn(ok200 as fn(Req) -> Answer)
}

fn request() -> Req {
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = Uri::from_static("http://bench.invalid/ok");
    req
}

/// Reads a body to its end, without allocating.
pub(crate) async fn drain<B>(body: B) -> Result<(), BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    while let Some(frame) = body.frame().await {
        frame.map_err(Into::into)?;
    }
    Ok(())
}

type BatchFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + 'a>>;

/// One column: a service sent `n` requests in a row.
trait Column {
    fn name(&self) -> &str;
    /// The batch future is boxed once per batch, before counting starts.
    fn batch(&mut self, n: u64) -> BatchFuture<'_>;
}

struct SvcColumn<S> {
    name: String,
    svc: S,
}

impl<S, RB> Column for SvcColumn<S>
where
    S: Service<Req, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn batch(&mut self, n: u64) -> BatchFuture<'_> {
        Box::pin(async move {
            for _ in 0..n {
                let svc = self.svc.ready().await.map_err(Into::into)?;
                let res = svc
                    .call(std::hint::black_box(request()))
                    .await
                    .map_err(Into::into)?;
                if !res.status().is_success() {
                    return Err(format!("{}: status {}", self.name, res.status()).into());
                }
                drain(res.into_body()).await?;
            }
            Ok(())
        })
    }
}

/// A column made of any `tower::Layer` around the bare service: this is how
/// rebound's full stack and each of its layers alone are added.
fn with_layer<L, RB>(name: &str, layer: L) -> Box<dyn Column>
where
    L: Layer<Bare>,
    L::Service: Service<Req, Response = Response<RB>> + 'static,
    <L::Service as Service<Req>>::Error: Into<BoxError>,
    RB: Body + 'static,
    RB::Error: Into<BoxError>,
{
    Box::new(SvcColumn {
        name: name.to_owned(),
        svc: layer.layer(bare()),
    })
}

/// rebound's full default stack, every layer in the ready-made client's
/// order (`crates/rebound-hyper/src/client.rs`), with the bare service in
/// place of the transport. Like the client, its type is erased at the same
/// two points (below the retry loop and at the top; fully nested types make
/// rustc take minutes) the way the client erases it ([`Shared`]), so it
/// pays the same two boxed futures per request the client pays.
type FullStack = Shared<Response<TraceBody<DeadlineBody<LimitBody<Empty<Bytes>>>>>>;

/// The future of one call through a [`Shared`] stack.
type SharedFuture<R> = Pin<Box<dyn Future<Output = Result<R, Error>> + Send>>;

/// The client's type erasure (`SharedStack` in
/// `crates/rebound-hyper/src/client.rs`): clones share the stack behind an
/// `Arc`, each call drives its own clone of the concrete stack with
/// `Oneshot` in one boxed future, and `poll_ready` is always ready (every
/// layer of this stack is).
#[derive(Clone)]
struct Shared<R> {
    call: Arc<dyn Fn(Req) -> SharedFuture<R> + Send + Sync>,
}

impl<R: Send + 'static> Shared<R> {
    fn new<S>(stack: S) -> Self
    where
        S: Service<Req, Response = R, Error = Error> + Clone + Send + Sync + 'static,
        S::Future: Send + 'static,
    {
        Shared {
            call: Arc::new(move |req| {
                let mut svc = stack.clone();
                // Every layer of the stack is always ready, so readiness is
                // asked here without a waker (and without `Oneshot`'s moves);
                // were it ever pending, the future would wait for it.
                match svc.poll_ready(&mut Context::from_waker(Waker::noop())) {
                    Poll::Ready(Ok(())) => Box::pin(svc.call(req)),
                    Poll::Ready(Err(e)) => Box::pin(std::future::ready(Err(e))),
                    Poll::Pending => Box::pin(svc.oneshot(req)),
                }
            }),
        }
    }
}

impl<R> Service<Req> for Shared<R> {
    type Response = R;
    type Error = Error;
    type Future = SharedFuture<R>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        (self.call)(req)
    }
}

fn full_stack(inner: Bare) -> FullStack {
    let trace = TraceLayer::new();
    let attempts: Shared<Response<Empty<Bytes>>> = Shared::new(
        ServiceBuilder::new()
            .layer(trace.attempt_layer())
            .layer(BackoffLayer::new(Backoff::exponential(
                Duration::from_millis(100),
                Duration::from_secs(10),
            )))
            .layer(RetryAfterGateLayer::new())
            .layer(CircuitBreakerLayer::default())
            .layer(adaptive())
            .layer(RetryAfterLayer::new())
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .layer(attempt_timeout())
            .service(inner),
    );
    Shared::new(
        ServiceBuilder::new()
            .layer(trace)
            .layer(CancelLayer::new())
            .layer(deadline())
            .layer(concurrency())
            .layer(IdempotencyKeyLayer::new())
            .layer(retry())
            .service(attempts),
    )
}

// The client's defaults, layer by layer.
fn deadline() -> DeadlineLayer {
    DeadlineLayer::try_new(Duration::from_secs(30)).expect("valid total timeout")
}
fn attempt_timeout() -> AttemptTimeoutLayer {
    AttemptTimeoutLayer::try_new(Duration::from_secs(10)).expect("valid attempt timeout")
}
fn concurrency() -> ConcurrencyLimitLayer {
    ConcurrencyLimitLayer::try_new(tokio::sync::Semaphore::MAX_PERMITS).expect("valid limit")
}
fn adaptive() -> AdaptiveLimitLayer {
    AdaptiveLimitLayer::try_new(
        Aimd::default()
            .min_limit(1)
            .initial_limit(256)
            .max_limit(256),
    )
    .expect("valid AIMD")
}
fn retry() -> RetryLayer {
    RetryLayer::try_new(RetryPolicy::default().max_attempts(3)).expect("valid policy")
}

fn columns() -> Vec<Box<dyn Column>> {
    vec![
        with_layer("bare service_fn (baseline)", Identity::new()),
        // A/A control: the baseline again; shows the noise floor of the run.
        with_layer("bare service_fn again (A/A control)", Identity::new()),
        with_layer(
            "tower: ConcurrencyLimit + Retry(3) + Timeout",
            tower::layer::layer_fn(|s| tower_stack(s, Attempts::new(3))),
        ),
        with_layer(
            "rebound: full default stack (client's order, 2 boxes)",
            tower::layer::layer_fn(full_stack),
        ),
        // Each layer alone, outer to inner in the client's order.
        with_layer("rebound: Trace alone", TraceLayer::new()),
        with_layer("rebound: Cancel alone", CancelLayer::new()),
        with_layer("rebound: Deadline alone", deadline()),
        with_layer("rebound: ConcurrencyLimit alone", concurrency()),
        with_layer("rebound: IdempotencyKey alone", IdempotencyKeyLayer::new()),
        with_layer("rebound: Retry alone", retry()),
        with_layer(
            "rebound: AttemptTrace alone",
            TraceLayer::new().attempt_layer(),
        ),
        with_layer(
            "rebound: Backoff alone",
            BackoffLayer::new(Backoff::exponential(
                Duration::from_millis(100),
                Duration::from_secs(10),
            )),
        ),
        with_layer("rebound: RetryAfterGate alone", RetryAfterGateLayer::new()),
        with_layer(
            "rebound: CircuitBreaker alone",
            CircuitBreakerLayer::default(),
        ),
        with_layer("rebound: AdaptiveLimit alone", adaptive()),
        with_layer("rebound: RetryAfter alone", RetryAfterLayer::new()),
        with_layer(
            "rebound: Classify alone",
            ClassifyLayer::new(HttpClassifier::default()),
        ),
        with_layer("rebound: AttemptTimeout alone", attempt_timeout()),
        with_layer(
            "rebound: CollectBody alone (not in the client)",
            CollectBodyLayer::new(),
        ),
        // One boxed future per call: what each of the stack's two type
        // erasures costs on its own.
        with_layer(
            "tower: BoxCloneSyncService alone (one erasure)",
            tower::layer::layer_fn(
                BoxCloneSyncService::<Req, Response<Empty<Bytes>>, Infallible>::new,
            ),
        ),
    ]
}

/// Drops the columns `--filter` leaves out; the baseline (first) stays.
fn keep(cols: &mut Vec<Box<dyn Column>>, mode: Mode) {
    let mut i = 0;
    cols.retain(|c| {
        i += 1;
        i == 1 || mode.keeps(c.name())
    });
}

/// Runs the section and prints its table.
pub(crate) fn run(mode: Mode) -> Result<Checks, BoxError> {
    let rounds: usize = mode.pick(3, 61);
    let n: u64 = mode.pick(2_000, 20_000);
    let budget = mode.pick(Duration::from_secs(5), Duration::from_secs(120));
    let batch_limit = Duration::from_secs(60);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut cols = columns();
    keep(&mut cols, mode);
    let (ns, allocs) = rt.block_on(async {
        let mut ns = vec![Samples::default(); cols.len()];
        let mut allocs = vec![Samples::default(); cols.len()];
        for col in &mut cols {
            tokio::time::timeout(batch_limit, col.batch(n.min(10_000))).await??;
        }
        let mut rng = SmallRng::seed_from_u64(7);
        let mut order: Vec<usize> = (0..cols.len()).collect();
        let start = Instant::now();
        for round in 0..rounds {
            // A shuffled order each round (fixed seed): no column always
            // runs first or after the same neighbour.
            order.shuffle(&mut rng);
            for &i in &order {
                let batch = cols[i].batch(n);
                let a0 = allocations();
                let t0 = ThreadTime::now();
                tokio::time::timeout(batch_limit, batch).await??;
                let dt = t0.elapsed();
                let a1 = allocations();
                ns[i].0.push(dt.as_nanos() as f64 / n as f64);
                allocs[i].0.push((a1 - a0) as f64 / n as f64);
            }
            if round >= 2 && start.elapsed() > budget {
                break;
            }
        }
        Ok::<_, BoxError>((ns, allocs))
    })?;

    let mut table = Table::new(
        format!(
            "In-process overhead ({} rounds × {n} requests per column, current-thread runtime, thread CPU time)",
            ns[0].0.len()
        ),
        &["column", "CPU ns/req", "× bare", "added ns/req", "allocs/req"],
    );
    for (i, col) in cols.iter().enumerate() {
        table.row(vec![
            col.name().to_owned(),
            f(ns[i].median(), 1),
            f(ns[i].ratio_to(&ns[0]), 2),
            f(ns[i].minus(&ns[0]), 1),
            f(allocs[i].median(), 2),
        ]);
    }
    table.print();

    let mut checks = Checks::default();
    checks.check(
        "the bare service allocates nothing per request",
        allocs[0].median() < 0.01,
    );
    // Exact counts, not timings: every rebound layer alone allocates
    // nothing on the happy path, except the deadline's stamp: it hands its
    // `Deadline` down as an extension of the request (so that it crosses a
    // `Buffer` or a spawned task, which a task-local did not), and the
    // request's first extension allocates `http::Extensions`' map: 3
    // allocations, exactly (the map's box, its table, the value's box). The
    // client's one-service stack keeps its deadline as a value and stamps
    // nothing.
    const DEADLINE_STAMP: f64 = 3.0;
    let alone: Vec<&str> = cols
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            let name = c.name();
            let allowed = if name == "rebound: Deadline alone" {
                DEADLINE_STAMP
            } else {
                0.0
            };
            name.starts_with("rebound: ")
                && name.contains(" alone")
                && (allocs[*i].median() - allowed).abs() >= 0.01
        })
        .map(|(_, c)| c.name())
        .collect();
    checks.check(
        format!(
            "each rebound layer alone allocates nothing per request, the deadline's stamp \
             its 3 (offenders: {alone:?})"
        ),
        alone.is_empty(),
    );
    checks.print();
    Ok(checks)
}
