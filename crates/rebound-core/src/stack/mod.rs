//! The whole stack as one service: every layer's policy, called from one
//! short path.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use rebound_core::deadline::DeadlineLayer;
//! use rebound_core::stack::StackLayer;
//! use rebound_core::Attempts;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let calls = Arc::new(AtomicU32::new(0));
//! let inner = {
//!     let calls = calls.clone();
//!     tower::service_fn(move |_req: Request<Full<Bytes>>| {
//!         // A 503 first, then a 200.
//!         let n = calls.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             let mut res = Response::new(Full::new(Bytes::from_static(b"hi")));
//!             if n == 0 {
//!                 *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!             }
//!             Ok::<_, Infallible>(res)
//!         }
//!     })
//! };
//! let svc = ServiceBuilder::new()
//!     .layer(StackLayer::new().deadline(DeadlineLayer::new(Duration::from_secs(5))))
//!     .service(inner);
//!
//! let req = Request::get("https://api.example/v1").body(Full::new(Bytes::new())).unwrap();
//! let res = svc.oneshot(req).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(Attempts::of(res.extensions()), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # What it is
//!
//! [`StackLayer`] is configured with the **same layer values** a user
//! stacks in `ServiceBuilder` — a [`TraceLayer`], a [`DeadlineLayer`], a
//! [`RetryLayer`], a [`BackoffLayer`], ... — and behaves as those layers
//! stacked in the order of the crate docs (see the table below), with the
//! same annotations, errors, spans and events. What differs is how it is
//! made: instead of some twenty nested services and futures, each moving
//! the request and the response through its own level, it is **one
//! service and one future** that calls each layer's policy — the
//! classifier, the Retry-After parser, the backoff, the budget, the gate
//! and breaker tables, the limiters, the trace states — directly, in that
//! order. A policy is written once, in its module; the layer and this
//! stack both call it (DESIGN.md §13).
//!
//! So a request that succeeds at once costs what the policies cost and
//! not what the nesting costs: one future (a few hundred bytes) instead of
//! twenty-five, one timer for the response head (the earlier of the
//! attempt timeout and the deadline, reset rather than re-created between
//! attempts), one response-body wrapper ([`StackBody`]) instead of four,
//! with one timer for the body (the earliest of its idle, rate and
//! deadline limits), and nothing written into the request's or the
//! response's extensions.
//!
//! # The order
//!
//! Outer to inner, as if stacked:
//!
//! | step | the layer it stands for | set with |
//! |---|---|---|
//! | one span per logical request | [`TraceLayer`] | [`trace`](StackLayer::trace) |
//! | refuse once shut down, cut at the end of the grace | [`ShutdownLayer`](crate::shutdown::ShutdownLayer) | [`shutdown`](StackLayer::shutdown) (off by default) |
//! | a [`Cancel`](crate::Cancel) token ends the request | [`CancelLayer`](crate::cancel::CancelLayer) | always |
//! | the total deadline | [`DeadlineLayer`] | [`deadline`](StackLayer::deadline) |
//! | new requests to a closed host wait, holding no permit | [`RetryAfterGateLayer`] (holding) | [`retry_after_gate`](StackLayer::retry_after_gate) |
//! | logical requests in flight | [`ConcurrencyLimitLayer`] | [`concurrency_limit`](StackLayer::concurrency_limit) (off by default) |
//! | POST/PATCH get an `Idempotency-Key` | [`IdempotencyKeyLayer`] | [`idempotency_key`](StackLayer::idempotency_key) |
//! | after a retryable failure, the next alternate route | [`FallbackLayer`] | [`fallback`](StackLayer::fallback) (off by default) |
//! | declared-safe gRPC methods are eligible | [`MarkRetryableLayer`] | [`grpc_retryable`](StackLayer::grpc_retryable) (off by default) |
//! | per host: fail a request at once while its host is broken (counts requests' final outcomes) | [`CircuitBreakerLayer`] | [`circuit_breaker`](StackLayer::circuit_breaker) |
//! | the retry loop and its budget | [`RetryLayer`] | [`retry`](StackLayer::retry) |
//! | a maybe-processed write is looked up before it is sent again | [`ReconcileLayer`] | [`reconcile`](StackLayer::reconcile) (off by default) |
//! | one span per attempt | [`AttemptTraceLayer`](crate::trace::AttemptTraceLayer) | with `trace` |
//! | the time left as `grpc-timeout` | [`PropagateDeadlineLayer`] | [`propagate_deadline`](StackLayer::propagate_deadline) (off by default) |
//! | the proposed delay | [`BackoffLayer`] | [`backoff`](StackLayer::backoff) |
//! | close / hold a host's gate | [`RetryAfterGateLayer`] (closing) | [`retry_after_gate`](StackLayer::retry_after_gate) |
//! | each attempt paced by the quota its host announces (rate-limit headers) | [`RateLimitLayer`](crate::ratelimit::RateLimitLayer) | [`rate_limit`](StackLayer::rate_limit) (off by default) |
//! | each attempt counted with its host, shed locally while the host accepts too few (Google SRE) | [`ClientThrottleLayer`](crate::throttle::ClientThrottleLayer) | [`client_throttle`](StackLayer::client_throttle) (off by default) |
//! | attempts in flight, shrinking on overload | [`AdaptiveLimitLayer`] | [`adaptive_limit`](StackLayer::adaptive_limit) (off by default) |
//! | Retry-After / pushback into a hint | [`RetryAfterLayer`] | [`retry_after`](StackLayer::retry_after) |
//! | each attempt's [`Verdict`](crate::Verdict) | [`ClassifyLayer`](crate::classify::ClassifyLayer) | [`classifier`](StackLayer::classifier) |
//! | a committed gRPC call's status, from its trailers | [`GrpcTrailersLayer`](crate::grpc::GrpcTrailersLayer) | [`grpc_trailers`](StackLayer::grpc_trailers) (off by default) |
//! | time to the response head, per attempt | [`AttemptTimeoutLayer`] | [`attempt_timeout`](StackLayer::attempt_timeout) |
//!
//! "Off" is `None` in the setter, and an option that is off costs nothing:
//! it is a field that is `None`, not a pass-through layer.
//!
//! # Where it differs from the stacked layers
//!
//! * **Nothing is carried in task-locals.** The deadline is the stack's
//!   own value: the inner service is called with the request as the
//!   transport would get it. The inner service does not see the task's
//!   [`Deadline`](crate::Deadline) or [`Closing`](crate::annotations::Closing)
//!   (a transport has nothing to wait for).
//! * **A permit is never lent.** A request that waited for its
//!   concurrency permit while its host's gate closed gives the permit back
//!   and waits at the gate again (FIFO for the permit once the gate opens):
//!   the two layers coordinated that through a shared
//!   [`PermitLease`](crate::annotations::PermitLease); here one future owns
//!   both.
//! * **The response body** is one [`StackBody`]: the permit, the body
//!   timeouts ([`body_timeouts`](StackLayer::body_timeouts)) and the
//!   deadline on one timer, the shutdown guard, and the body's failure log
//!   in one wrapper. With a [`shutdown`](StackLayer::shutdown) handle, the
//!   stack counts each body with bytes left in the shutdown's grace period
//!   ([`ShutdownHandle::open_body`]), so the inner service must not count
//!   it too (rebound's client hands the stack its transport's bare
//!   bodies).
//!
//! # Errors
//!
//! As the stacked layers': [`Error`], every error named with its request.
//!
//! [`TraceLayer`]: crate::trace::TraceLayer
//! [`DeadlineLayer`]: crate::deadline::DeadlineLayer
//! [`RetryLayer`]: crate::retry::RetryLayer
//! [`BackoffLayer`]: crate::backoff::BackoffLayer
//! [`RetryAfterGateLayer`]: crate::gate::RetryAfterGateLayer
//! [`ConcurrencyLimitLayer`]: crate::limit::ConcurrencyLimitLayer
//! [`IdempotencyKeyLayer`]: crate::idempotency::IdempotencyKeyLayer
//! [`MarkRetryableLayer`]: crate::grpc::MarkRetryableLayer
//! [`PropagateDeadlineLayer`]: crate::grpc::PropagateDeadlineLayer
//! [`CircuitBreakerLayer`]: crate::breaker::CircuitBreakerLayer
//! [`AdaptiveLimitLayer`]: crate::limit::AdaptiveLimitLayer
//! [`RetryAfterLayer`]: crate::retry_after::RetryAfterLayer
//! [`AttemptTimeoutLayer`]: crate::attempt_timeout::AttemptTimeoutLayer

mod body;
pub mod future;

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

pub use self::body::StackBody;

use self::body::BodyConfig;

use crate::attempt_timeout::AttemptTimeoutLayer;
use crate::backoff::{Backoff, BackoffLayer};
use crate::body::RetryBody;
use crate::body_timeout::BodyTimeouts;
use crate::breaker::CircuitBreakerLayer;
use crate::classify::{Classifier, HttpClassifier};
use crate::collect::CollectedBody;
use crate::deadline::DeadlineLayer;
use crate::error::{BoxError, Error};
use crate::fallback::FallbackLayer;
use crate::gate::RetryAfterGateLayer;
use crate::grpc::{MarkRetryableLayer, PropagateDeadlineLayer};
use crate::idempotency::IdempotencyKeyLayer;
use crate::limit::{
    AdaptiveLimitLayer, AdaptiveLimiter, ConcurrencyLimitLayer, ConcurrencyLimiter, HostLimiters,
};
use crate::reconcile::{Check, CheckRequest, ReconcileHook, ReconcileLayer};
use crate::retry::{RetryLayer, RetryPolicy};
use crate::retry_after::RetryAfterLayer;
use crate::shutdown::ShutdownHandle;
use crate::trace::TraceLayer;

/// The default [`StackLayer::deadline`]: 30 s.
pub const DEFAULT_TOTAL: Duration = Duration::from_secs(30);
/// The default [`StackLayer::attempt_timeout`]: 10 s.
pub const DEFAULT_ATTEMPT: Duration = Duration::from_secs(10);

/// What the stack calls, set from the layers' own values.
pub(crate) struct Config<C> {
    pub(crate) trace: TraceLayer,
    pub(crate) shutdown: Option<ShutdownHandle>,
    /// The inner service ends its calls in flight itself at the cut.
    pub(crate) inner_cuts: bool,
    pub(crate) total: Duration,
    pub(crate) gate: Option<RetryAfterGateLayer>,
    pub(crate) concurrency: Option<Arc<ConcurrencyLimiter>>,
    pub(crate) idempotency: Option<IdempotencyKeyLayer>,
    pub(crate) fallback: Option<FallbackLayer>,
    pub(crate) mark: Option<MarkRetryableLayer>,
    pub(crate) retry: RetryPolicy,
    pub(crate) reconcile: Option<ReconcileHook>,
    pub(crate) propagate: Option<PropagateDeadlineLayer>,
    pub(crate) rate_limit: Option<crate::ratelimit::RateLimitLayer>,
    pub(crate) backoff: Backoff,
    pub(crate) breaker: Option<CircuitBreakerLayer>,
    pub(crate) adaptive: Option<Arc<AdaptiveLimiter>>,
    pub(crate) adaptive_hosts: Option<Arc<HostLimiters>>,
    pub(crate) throttle: Option<Arc<crate::throttle::Throttle>>,
    pub(crate) retry_after: RetryAfterLayer,
    pub(crate) classifier: C,
    pub(crate) attempt: Duration,
    pub(crate) body: BodyConfig,
}

impl<C: Clone> Clone for Config<C> {
    fn clone(&self) -> Self {
        Config {
            trace: self.trace.clone(),
            shutdown: self.shutdown.clone(),
            inner_cuts: self.inner_cuts,
            total: self.total,
            gate: self.gate.clone(),
            concurrency: self.concurrency.clone(),
            idempotency: self.idempotency.clone(),
            fallback: self.fallback.clone(),
            mark: self.mark.clone(),
            retry: self.retry.clone(),
            reconcile: self.reconcile.clone(),
            propagate: self.propagate.clone(),
            rate_limit: self.rate_limit.clone(),
            backoff: self.backoff.clone(),
            breaker: self.breaker.clone(),
            adaptive: self.adaptive.clone(),
            adaptive_hosts: self.adaptive_hosts.clone(),
            throttle: self.throttle.clone(),
            retry_after: self.retry_after.clone(),
            classifier: self.classifier.clone(),
            attempt: self.attempt,
            body: self.body,
        }
    }
}

/// The whole stack as one layer; see the [module docs](self).
///
/// Built from the layers' own values: each setter takes what a user would
/// stack (already checked by that layer's `new` / `try_new`), so this
/// layer has no configuration error of its own. The defaults are those of
/// each layer's `new`, with a 30 s total and a 10 s attempt timeout.
///
/// # Clone
///
/// Cheap (one `Arc`); clones and every service they make share the
/// layers' state (budget, tables, limiters).
pub struct StackLayer<C = HttpClassifier> {
    cfg: Arc<Config<C>>,
}

impl<C> Clone for StackLayer<C> {
    fn clone(&self) -> Self {
        StackLayer {
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<C> fmt::Debug for StackLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.cfg;
        f.debug_struct("StackLayer")
            .field("total", &c.total)
            .field("attempt", &c.attempt)
            .field("retry", &c.retry)
            .field("gate", &c.gate.is_some())
            .field("concurrency", &c.concurrency)
            .field("breaker", &c.breaker.is_some())
            .field("adaptive", &c.adaptive)
            .field("adaptive_hosts", &c.adaptive_hosts)
            .field("body", &c.body)
            .finish_non_exhaustive()
    }
}

impl Default for StackLayer<HttpClassifier> {
    fn default() -> Self {
        StackLayer::new()
    }
}

impl StackLayer<HttpClassifier> {
    /// The defaults: a [`TraceLayer::new`], a 30 s deadline, the holding
    /// and closing Retry-After gate ([`RetryAfterGateLayer::new`]),
    /// idempotency keys, [`RetryPolicy::default`], exponential backoff from
    /// 100 ms to 10 s with full jitter, the default circuit breaker (over
    /// the gate's [host table](crate::host), one entry per host for both),
    /// [`RetryAfterLayer::new`], the [`HttpClassifier`], a 10 s attempt
    /// timeout; no shutdown handle, no concurrency or adaptive limit, no
    /// gRPC marking or deadline propagation.
    pub fn new() -> Self {
        // One host table for the gate and the breaker.
        let hosts = Arc::new(crate::host::HostTable::default());
        let breaker = CircuitBreakerLayer::shared(Default::default(), Arc::clone(&hosts));
        StackLayer {
            cfg: Arc::new(Config {
                trace: TraceLayer::new(),
                shutdown: None,
                inner_cuts: false,
                total: DEFAULT_TOTAL,
                gate: Some(RetryAfterGateLayer::shared(hosts)),
                concurrency: None,
                idempotency: Some(IdempotencyKeyLayer::new()),
                fallback: None,
                mark: None,
                retry: RetryPolicy::default(),
                reconcile: None,
                propagate: None,
                rate_limit: None,
                backoff: Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10)),
                breaker: Some(breaker),
                adaptive: None,
                adaptive_hosts: None,
                throttle: None,
                retry_after: RetryAfterLayer::new(),
                classifier: HttpClassifier::default(),
                attempt: DEFAULT_ATTEMPT,
                body: BodyConfig::default(),
            }),
        }
    }
}

impl<C: Clone> StackLayer<C> {
    fn with(mut self, f: impl FnOnce(&mut Config<C>)) -> Self {
        f(Arc::make_mut(&mut self.cfg));
        self
    }

    /// The request and attempt spans ([`TraceLayer`] and its
    /// [`attempt_layer`](TraceLayer::attempt_layer)).
    pub fn trace(self, trace: TraceLayer) -> Self {
        self.with(|c| c.trace = trace)
    }

    /// Shut down with `handle` (refuse, end waits, cut after the grace),
    /// as a [`ShutdownLayer`](crate::shutdown::ShutdownLayer) would; and
    /// count each response body with bytes left until it ends or is
    /// dropped ([`StackBody`]), as a transport built with the handle would
    /// (so the inner service should not).
    pub fn shutdown(self, handle: Option<ShutdownHandle>) -> Self {
        self.with(|c| c.shutdown = handle)
    }

    /// The inner service ends every call in flight by itself when the
    /// shutdown's grace period ends (rebound's transport built with the
    /// same handle closes its connections then: see
    /// `rebound_hyper::TransportBuilder::shutdown`): the stack then does not
    /// watch for the cut on every request (a registration in the handle's
    /// wait list); a call that ends after the cut still ends as `Closed`.
    /// Default: `false`, the stack cuts its calls itself.
    pub fn inner_ends_calls_at_cut(self, yes: bool) -> Self {
        self.with(|c| c.inner_cuts = yes)
    }

    /// The total deadline of a logical request.
    pub fn deadline(self, deadline: DeadlineLayer) -> Self {
        self.with(|c| c.total = deadline.total())
    }

    /// The Retry-After gate, holding new requests above the concurrency
    /// limit and closing / holding attempts below the retry loop, over the
    /// layer's one table (its [`closes_gates`](RetryAfterGateLayer::closes_gates)
    /// setting decides whether attempts close gates). `None`: no gate.
    pub fn retry_after_gate(self, gate: Option<RetryAfterGateLayer>) -> Self {
        self.with(|c| c.gate = gate)
    }

    /// A client-wide limit of logical requests in flight (the permit is
    /// held until the response body ends). `None` (the default): no limit,
    /// and no semaphore is touched.
    pub fn concurrency_limit(self, limit: Option<ConcurrencyLimitLayer>) -> Self {
        self.with(|c| c.concurrency = limit.map(|l| Arc::clone(l.limiter())))
    }

    /// Idempotency keys for POST/PATCH (the layer's methods and header).
    /// `None`: no key is added.
    pub fn idempotency_key(self, keys: Option<IdempotencyKeyLayer>) -> Self {
        self.with(|c| c.idempotency = keys)
    }

    /// Alternate routes tried, in order, after the retry loop ends in a
    /// retryable failure (each with its own retry loop, within the one
    /// deadline, with the same permit and key; see
    /// [`FallbackLayer`]). `None` (the default): none.
    pub fn fallback(self, fallback: Option<FallbackLayer>) -> Self {
        self.with(|c| c.fallback = fallback)
    }

    /// Before the retry loop sends again a write whose attempt may have
    /// been processed, ask the status check by its operation id (see
    /// [`ReconcileLayer`]). The check's responses are in memory: a
    /// reconciled response's body is one the check already read. `None`
    /// (the default): no check.
    pub fn reconcile<K, Q>(self, reconcile: Option<ReconcileLayer<K, Q>>) -> Self
    where
        Q: CheckRequest,
        K: Service<Q, Response = Check<Response<CollectedBody>>> + Clone + Send + Sync + 'static,
        K::Error: Into<BoxError>,
        K::Future: Send + 'static,
    {
        let hook = reconcile.map(ReconcileLayer::hook);
        self.with(|c| c.reconcile = hook)
    }

    /// gRPC methods declared safe to retry. `None` (the default): none
    /// marked.
    pub fn grpc_retryable(self, mark: Option<MarkRetryableLayer>) -> Self {
        self.with(|c| c.mark = mark)
    }

    /// The retry loop's policy (attempts, eligible methods, budget).
    pub fn retry(self, retry: RetryLayer) -> Self {
        self.with(|c| c.retry = retry.policy().clone())
    }

    /// Record a committed gRPC call's final status from its trailers, on
    /// the request span and as a metric, as
    /// [`GrpcTrailersLayer`](crate::grpc::GrpcTrailersLayer) does: a WARN
    /// `grpc call failed after its headers` with `grpc.code` and
    /// `grpc.status` for a failed one. Costs a header look-up per response
    /// when on. Default: off (`rebound::Client` turns it on with a gRPC
    /// classifier or gRPC methods).
    pub fn grpc_trailers(self, on: bool) -> Self {
        self.with(|c| c.body.grpc_trailers = on)
    }

    /// Write the time left into each attempt (`grpc-timeout`, a budget
    /// header). `None` (the default): nothing written.
    pub fn propagate_deadline(self, propagate: Option<PropagateDeadlineLayer>) -> Self {
        self.with(|c| c.propagate = propagate)
    }

    /// Pace each attempt by the quota its host's responses announce, and
    /// read every response's rate-limit headers (see
    /// [`RateLimitLayer`](crate::ratelimit::RateLimitLayer)): the wait is
    /// bounded by the deadline, a quota that does not come back within it
    /// fails the attempt at once (`QuotaExhausted`, not sent). Default:
    /// off (the ready-made client turns it on).
    pub fn rate_limit(self, rate_limit: Option<crate::ratelimit::RateLimitLayer>) -> Self {
        self.with(|c| c.rate_limit = rate_limit)
    }

    /// The delay proposed for each retryable attempt.
    pub fn backoff(self, backoff: BackoffLayer) -> Self {
        self.with(|c| c.backoff = backoff.backoff().clone())
    }

    /// The circuit breaker. `None`: none.
    pub fn circuit_breaker(self, breaker: Option<CircuitBreakerLayer>) -> Self {
        self.with(|c| c.breaker = breaker)
    }

    /// The adaptive limit of attempts in flight, one for every host (its
    /// limiter shared with the layer). `None` (the default): none. `Some`
    /// replaces an [`adaptive_limit_per_host`](Self::adaptive_limit_per_host).
    pub fn adaptive_limit(self, limit: Option<AdaptiveLimitLayer>) -> Self {
        self.with(|c| {
            c.adaptive = limit.map(|l| Arc::clone(l.limiter()));
            if c.adaptive.is_some() {
                c.adaptive_hosts = None;
            }
        })
    }

    /// The adaptive limit of attempts in flight, **one limiter per host**
    /// (see [`HostLimiters`]): a slow or overloaded host shrinks its own
    /// limit only. The host's key is the one the gate and the breaker use,
    /// computed once per request. `None` (the default): none. `Some`
    /// replaces an [`adaptive_limit`](Self::adaptive_limit).
    pub fn adaptive_limit_per_host(self, hosts: Option<Arc<HostLimiters>>) -> Self {
        self.with(|c| {
            if hosts.is_some() {
                c.adaptive = None;
            }
            c.adaptive_hosts = hosts;
        })
    }

    /// Client-side adaptive throttling per host (see
    /// [`ClientThrottleLayer`](crate::throttle::ClientThrottleLayer)): each
    /// attempt is counted with its host and shed locally with the SRE
    /// probability, failing at once with
    /// [`ClientThrottled`](crate::ErrorKind::ClientThrottled), not sent and
    /// not retried. `None` (the default): off, nothing counted.
    pub fn client_throttle(self, throttle: Option<crate::throttle::ClientThrottleLayer>) -> Self {
        self.with(|c| c.throttle = throttle.map(|t| Arc::clone(t.throttle())))
    }

    /// The Retry-After / pushback parser (its statuses, cap and clock).
    pub fn retry_after(self, retry_after: RetryAfterLayer) -> Self {
        self.with(|c| c.retry_after = retry_after)
    }

    /// The time to the response head of each attempt.
    pub fn attempt_timeout(self, timeout: AttemptTimeoutLayer) -> Self {
        self.with(|c| c.attempt = timeout.timeout())
    }

    /// The idle and minimum-rate timeouts of the response body, applied by
    /// [`StackBody`] while the caller reads it (and to a body read inside
    /// the attempt, [`Stack::collect`]), with the deadline, on one timer.
    /// Default: none (only the deadline).
    pub fn body_timeouts(self, timeouts: BodyTimeouts) -> Self {
        self.with(|c| c.body.timeouts = timeouts)
    }

    /// How an error of the inner service's response body becomes an
    /// [`Error`] (a transport that knows its bodies' errors says so: kind,
    /// detail, [`Sent`](crate::Sent)). Default: [`Error::from_boxed`].
    pub fn body_errors(self, errors: fn(BoxError) -> Error) -> Self {
        self.with(|c| c.body.errors = errors)
    }

    /// The whole stack set up for gRPC, in the order that works — the
    /// bundle to put around a `tonic::transport::Channel`: the
    /// [`GrpcClassifier`](crate::grpc::GrpcClassifier) (gRFC A6),
    /// `methods` retryable with their own [policies](crate::grpc::MethodPolicy)
    /// ([`grpc_retryable`](Self::grpc_retryable)), the time left as
    /// `grpc-timeout` on every attempt
    /// ([`propagate_deadline`](Self::propagate_deadline)), a committed
    /// call's status read from its trailers
    /// ([`grpc_trailers`](Self::grpc_trailers)), and no `Idempotency-Key`
    /// header (gRPC calls are POSTs; their eligibility is the method's).
    /// A call that was never sent is retried whatever the method, and once
    /// more outside the attempt count (A6's transparent retry).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rebound_core::deadline::DeadlineLayer;
    /// use rebound_core::grpc::{Code, MethodPolicy, RetryableMethods};
    /// use rebound_core::stack::StackLayer;
    ///
    /// let layer = StackLayer::new()
    ///     .deadline(DeadlineLayer::new(Duration::from_secs(5)))
    ///     .grpc(RetryableMethods::none().service_policy(
    ///         "kv.Store",
    ///         MethodPolicy::new().max_attempts(4).retryable_codes([Code::UNAVAILABLE]),
    ///     ));
    /// assert!(layer.layers().contains(&"MarkRetryableLayer"));
    /// // let channel = tonic::transport::Channel::from_static("http://[::1]:50051").connect_lazy();
    /// // let svc = tower::ServiceBuilder::new()
    /// //     .layer(rebound_core::grpc::tonic::IntoStatusLayer::new())
    /// //     .layer(layer)
    /// //     .service(channel);
    /// ```
    pub fn grpc(
        self,
        methods: crate::grpc::RetryableMethods,
    ) -> StackLayer<crate::grpc::GrpcClassifier> {
        self.idempotency_key(None)
            .grpc_retryable(Some(MarkRetryableLayer::new(methods)))
            .propagate_deadline(Some(PropagateDeadlineLayer::new()))
            .grpc_trailers(true)
            .classifier(crate::grpc::GrpcClassifier::default())
    }

    /// The classifier of each attempt's outcome.
    pub fn classifier<C2: Clone>(self, classifier: C2) -> StackLayer<C2> {
        let c = Arc::unwrap_or_clone(self.cfg);
        StackLayer {
            cfg: Arc::new(Config {
                trace: c.trace,
                shutdown: c.shutdown,
                inner_cuts: c.inner_cuts,
                total: c.total,
                gate: c.gate,
                concurrency: c.concurrency,
                idempotency: c.idempotency,
                fallback: c.fallback,
                mark: c.mark,
                retry: c.retry,
                reconcile: c.reconcile,
                propagate: c.propagate,
                rate_limit: c.rate_limit,
                backoff: c.backoff,
                breaker: c.breaker,
                adaptive: c.adaptive,
                adaptive_hosts: c.adaptive_hosts,
                throttle: c.throttle,
                retry_after: c.retry_after,
                classifier,
                attempt: c.attempt,
                body: c.body,
            }),
        }
    }
}

impl<C> StackLayer<C> {
    /// The layers this stack stands for, outer to inner, as configured:
    /// the names of the table in the [module docs](self), an option that
    /// is off left out. (The ready-made client's README table is checked
    /// against this.)
    pub fn layers(&self) -> Vec<&'static str> {
        let c = &self.cfg;
        let gate = c
            .gate
            .as_ref()
            .is_some_and(|g| g.gate_mode() != crate::gate::GateMode::Off);
        let mut v = vec!["TraceLayer"];
        if c.shutdown.is_some() {
            v.push("ShutdownLayer");
        }
        v.extend(["CancelLayer", "DeadlineLayer"]);
        if gate {
            v.push("RetryAfterGateLayer (holding)");
        }
        let on = |v: &mut Vec<&'static str>, yes: bool, name: &'static str| {
            if yes {
                v.push(name);
            }
        };
        on(&mut v, c.concurrency.is_some(), "ConcurrencyLimitLayer");
        on(&mut v, c.idempotency.is_some(), "IdempotencyKeyLayer");
        on(&mut v, c.fallback.is_some(), "FallbackLayer");
        on(&mut v, c.mark.is_some(), "MarkRetryableLayer");
        on(&mut v, c.breaker.is_some(), "CircuitBreakerLayer");
        v.push("RetryLayer");
        on(&mut v, c.reconcile.is_some(), "ReconcileLayer");
        v.push("AttemptTraceLayer");
        on(&mut v, c.propagate.is_some(), "PropagateDeadlineLayer");
        v.push("BackoffLayer");
        on(&mut v, gate, "RetryAfterGateLayer");
        on(&mut v, c.rate_limit.is_some(), "RateLimitLayer");
        on(&mut v, c.throttle.is_some(), "ClientThrottleLayer");
        on(
            &mut v,
            c.adaptive.is_some() || c.adaptive_hosts.is_some(),
            "AdaptiveLimitLayer",
        );
        v.extend(["RetryAfterLayer", "ClassifyLayer"]);
        on(&mut v, c.body.grpc_trailers, "GrpcTrailersLayer");
        v.push("AttemptTimeoutLayer");
        v
    }
}

impl<S, C> Layer<S> for StackLayer<C> {
    type Service = Stack<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Stack {
            inner,
            cfg: Arc::clone(&self.cfg),
        }
    }
}

/// The service of [`StackLayer`]; see the [module docs](self).
///
/// # Clone
///
/// Clones share the configuration and the layers' state; each clone calls
/// its own clone of the inner service.
pub struct Stack<S, C = HttpClassifier> {
    inner: S,
    cfg: Arc<Config<C>>,
}

impl<S: Clone, C> Clone for Stack<S, C> {
    fn clone(&self) -> Self {
        Stack {
            inner: self.inner.clone(),
            cfg: Arc::clone(&self.cfg),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for Stack<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, C> Stack<S, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming `self`.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, C> Stack<S, C> {
    /// [`call`](Service::call), with the response body **read inside the
    /// attempt**, up to `max_bytes`: a body cut short (a reset, a
    /// truncation, an idle or rate timeout — the inner body's own or the
    /// [`body_timeouts`](StackLayer::body_timeouts)) is then
    /// the attempt's failure, classified and retried like any other, as
    /// [`CollectBodyLayer`](crate::collect::CollectBodyLayer) below the
    /// classify layer makes it. The head timer covers the time to the head
    /// as for any attempt; the same timer then bounds the body read by the
    /// body timeouts and the deadline. Only a
    /// response the classifier judged a success is read; its body is then
    /// in memory ([`StackBody`] yields it at once). A `Content-Length` (or
    /// size hint) over `max_bytes` fails the attempt at once with
    /// [`ErrorKind::BodyTooLarge`](crate::ErrorKind::BodyTooLarge), as does
    /// a body that passes it.
    pub fn collect<B, ResB>(
        &mut self,
        req: Request<B>,
        max_bytes: usize,
    ) -> future::ResponseFuture<S, B, ResB, C>
    where
        S: Service<Request<B>, Response = Response<ResB>> + Clone,
        S::Error: Into<BoxError>,
        B: RetryBody,
        ResB: http_body::Body,
        ResB::Error: Into<BoxError>,
        C: Classifier<ResB>,
    {
        let clone = self.inner.clone();
        let svc = mem::replace(&mut self.inner, clone);
        future::ResponseFuture::start(Arc::clone(&self.cfg), svc, req, Some(max_bytes))
    }
}

impl<S, B, ResB, C> Service<Request<B>> for Stack<S, C>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    B: RetryBody,
    ResB: http_body::Body,
    ResB::Error: Into<BoxError>,
    C: Classifier<ResB>,
{
    type Response = Response<StackBody<ResB>>;
    type Error = Error;
    type Future = future::ResponseFuture<S, B, ResB, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The ready service goes with this request; `self` keeps a clone
        // that must be made ready again.
        let clone = self.inner.clone();
        let svc = mem::replace(&mut self.inner, clone);
        future::ResponseFuture::start(Arc::clone(&self.cfg), svc, req, None)
    }
}
