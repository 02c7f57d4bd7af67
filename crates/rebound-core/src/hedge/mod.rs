//! Hedging: when an attempt has no answer after a delay, send another copy;
//! the first acceptable answer wins and the others are cancelled.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use rebound_core::hedge::{HedgeLayer, HedgePolicy};
//! use rebound_core::{BoxError, Hedged};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let calls = Arc::new(AtomicU32::new(0));
//! let inner = {
//!     let calls = calls.clone();
//!     tower::service_fn(move |_req: Request<Full<Bytes>>| {
//!         // The first copy hangs for a minute, the second answers at once.
//!         let n = calls.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             if n == 0 {
//!                 tokio::time::sleep(Duration::from_secs(60)).await;
//!             }
//!             Ok::<_, BoxError>(Response::new(Full::new(Bytes::from(format!("copy {}", n + 1)))))
//!         }
//!     })
//! };
//! let mut svc = ServiceBuilder::new()
//!     .layer(HedgeLayer::new(HedgePolicy::fixed(Duration::from_millis(50))))
//!     .service(inner);
//!
//! let started = tokio::time::Instant::now();
//! let req = Request::get("http://api.example/v1").body(Full::new(Bytes::new())).unwrap();
//! let res = svc.ready().await?.call(req).await?;
//! assert_eq!(started.elapsed(), Duration::from_millis(50));
//! assert_eq!(
//!     res.extensions().get::<Hedged>(),
//!     Some(&Hedged { copies: 2, winner: Some(2) })
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # What it does
//!
//! [`Hedge`] sends a request on; if no answer (response head, or error) has
//! come back after the [delay](HedgePolicy), it sends another copy, and so
//! on up to [`max_attempts`](HedgePolicy::max_attempts) copies in all (2 by
//! default: one hedge). The first **acceptable** answer wins: a response or
//! error whose [`Verdict`](crate::Verdict) is not retryable (a success, a
//! 404, a fatal error; an error with no verdict is not acceptable). Every
//! other copy is dropped at once — under hyper that resets its HTTP/2
//! stream or closes its HTTP/1 connection — and no loser's body is read.
//! A retryable failure (a 503, a timeout, a reset) while another copy is in
//! flight waits for that copy; when every copy sent has failed, the group
//! sends its next copy at once if it may (gRFC A6: a failure cuts the
//! hedging delay short) unless the server asked for a pause
//! ([`RetryAfterHint`](crate::RetryAfterHint)), and otherwise returns the
//! last failure.
//!
//! The delay is either [fixed](HedgePolicy::fixed) or a
//! [percentile](HedgePolicy::percentile) of recent attempts' time to
//! answer, as tower's `Hedge`: a rotating pair of histograms, the written
//! one swapped for the read one every period; no hedge until the last
//! period held a minimum sample, or a fixed delay to start from
//! ([`or_fixed`](HedgePolicy::or_fixed)) until it does. Ours is lock-free (atomic buckets, the
//! percentile computed once per period). One estimator per layer, shared
//! by its clones: give upstreams with different latencies their own layer,
//! or a fixed delay.
//!
//! # Which requests, and how many copies
//!
//! Only requests that may be sent twice are hedged: an idempotent method
//! (GET, HEAD, OPTIONS, TRACE, PUT, DELETE by default:
//! [`eligible_methods`](HedgePolicy::eligible_methods)), an
//! [`Idempotent`] annotation (which gRPC's
//! `MarkRetryableLayer` puts on calls to the methods declared safe), a non-blank
//! `Idempotency-Key` header or [`IdempotencyKey`] annotation (one the
//! server can see: [`IdempotencyKey::is_seen`]) **that the caller chose** (so every copy carries the **same** key: it is part of
//! the head every copy is made from; a key the idempotency-key layer made,
//! marked [`KeyGenerated`](crate::KeyGenerated), makes a write retryable
//! but not hedgeable unless
//! [`hedge_generated_keys`](HedgePolicy::hedge_generated_keys)), or a path
//! declared hedgeable
//! ([`hedgeable_paths`](HedgePolicy::hedgeable_paths): gRPC methods, which
//! are all POSTs). A request body is copied as for a retry
//! ([`CloneableBody::try_replay`] up front, [`try_replay_whole`] for each
//! hedge): no whole copy, no hedge.
//!
//! Every hedge spends a token of the [`RetryBudget`] (share the retry
//! layer's with [`budget`](HedgePolicy::budget), as the ready-made client
//! does; a layer of its own otherwise, which then records each hedgeable
//! request in it). A hedge is never sent at or past the request's
//! [`Deadline`]. When the budget refuses, no more copies are sent and the
//! ones in flight are awaited.
//!
//! # Hedged or retried, not both
//!
//! gRFC A6 lets a method have a hedging policy or a retry policy, never
//! both, so the load a request can cause is bounded by one `max_attempts`,
//! not the product of two. rebound enforces it per request, in the
//! vocabulary:
//!
//! * the hedge layer hedges only a request's **first** attempt
//!   ([`AttemptNumber`] 1): an attempt the retry loop sends is
//!   passed through;
//! * once a hedge was sent, the outcome carries [`Hedged`](crate::Hedged), and the retry
//!   loop does not retry it ([`RetryStop::Hedged`](crate::RetryStop)).
//!
//! So a first attempt that fails before its hedge delay is retried as
//! usual (with backoff and Retry-After), while one that was hedged stands.
//!
//! # Tracing and metrics
//!
//! A hedged request (one that sent a hedge) logs one INFO event, target
//! `rebound::hedge`: `hedged request answered` with
//! `rebound.hedge.winner` (`1` the original, `2` the first hedge, ...) and
//! `rebound.hedge.copies`, or `hedged request: every copy failed`; each
//! hedge sent is a DEBUG event. Under the trace layer's request span they
//! are its children; each copy has its own attempt span. The outcome
//! carries [`Hedged`](crate::Hedged). With the `metrics` feature,
//! `rebound.client.hedges` and `rebound.client.hedges.won` count hedges
//! sent and hedges that won (see the `metrics` module).
//!
//! # Where it sits
//!
//! **Right below the retry loop, above everything per-attempt** (attempt
//! span, backoff, Retry-After, limits, classification, attempt timeout): a
//! hedge is an attempt-level copy, so each copy gets its own span, its own
//! permit of the adaptive limit (hedges are load), its own verdict (which
//! the hedge layer needs to tell an acceptable answer) and its own attempt
//! timeout; and it is below the retry loop so that the loop sees one
//! outcome per attempt, and the budget deposit of the loop is not repeated
//! per copy.
//!
//! # Cost
//!
//! A request that is not hedgeable (or a layer made with
//! [`HedgePolicy::off`]) costs a few branches. A hedgeable one that answers
//! before its delay: one timer, a copy of the request head (the hedge must
//! be made from something once the original has gone down), a clone of the
//! inner service and of two `Arc`s, and with a percentile delay two clock
//! reads and one atomic add; no lock (a layer's own budget records the
//! request with one more atomic add, locking only when a bucket of its
//! window turns over; the client's shared budget is recorded by the retry
//! loop, not here). Measured in the ready-made client: +2 allocations per
//! request, the head's header map (see BENCHMARKS.md). Hedges themselves
//! are boxed.
//!
//! [`IdempotencyKey`]: crate::IdempotencyKey
//! [`Deadline`]: crate::Deadline
//! [`try_replay_whole`]: CloneableBody::try_replay_whole

pub mod future;
mod latency;

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use self::latency::Latency;
use crate::annotations::{AttemptNumber, Deadline, IdempotencyKey, Idempotent};
use crate::body::CloneableBody;
use crate::error::{BoxError, Error};
use crate::retry::RetryBudget;

/// The most copies [`HedgePolicy::max_attempts`] accepts (gRFC A6's cap).
pub const MAX_HEDGED_ATTEMPTS: u32 = 5;

use crate::retry::MethodSet;

/// When a hedge is sent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Delay {
    Off,
    Fixed(Duration),
    Percentile {
        percentile: f64,
        min_samples: u64,
        period: Duration,
        /// The delay while the last period held too few answers.
        unsampled: Option<Duration>,
    },
}

// ===== policy =====

/// What the [`HedgeLayer`] does: when to hedge, how many copies, which
/// requests, which budget.
///
/// See the [module docs](self) for an example.
#[derive(Clone)]
pub struct HedgePolicy {
    delay: Delay,
    max_attempts: u32,
    budget: Option<Arc<RetryBudget>>,
    methods: MethodSet,
    paths: Arc<[Box<str>]>,
    generated_keys: bool,
}

impl fmt::Debug for HedgePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgePolicy")
            .field("delay", &self.delay)
            .field("max_attempts", &self.max_attempts)
            .field("budget", &self.budget)
            .field("methods", &self.methods)
            .field("paths", &self.paths)
            .field("generated_keys", &self.generated_keys)
            .finish()
    }
}

impl HedgePolicy {
    fn with(delay: Delay) -> Self {
        HedgePolicy {
            delay,
            max_attempts: 2,
            budget: None,
            methods: MethodSet::idempotent(),
            paths: Arc::from(Vec::new()),
            generated_keys: false,
        }
    }

    /// Hedge after a fixed `delay` without an answer (must be above zero).
    pub fn fixed(delay: Duration) -> Self {
        HedgePolicy::with(Delay::Fixed(delay))
    }

    /// Hedge after the `percentile` (a fraction in `(0, 1)`, e.g. `0.95`)
    /// of recent attempts' time to answer, as tower's `Hedge`. The estimate
    /// comes from the last full [period](Self::period) (default 5 s) and
    /// only when it held at least [`min_samples`](Self::min_samples)
    /// answers (default 100); until then — at start, below about
    /// `min_samples / period` requests per second (20/s by default), after
    /// an idle pause — no hedge, unless a fixed delay to start from is
    /// given with [`or_fixed`](Self::or_fixed):
    ///
    /// ```
    /// use std::time::Duration;
    /// use rebound_core::hedge::HedgePolicy;
    ///
    /// // The p95 once 100 answers came in the last 5 s; 200 ms until then.
    /// let policy = HedgePolicy::percentile(0.95).or_fixed(Duration::from_millis(200));
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn percentile(percentile: f64) -> Self {
        HedgePolicy::with(Delay::Percentile {
            percentile,
            min_samples: 100,
            period: Duration::from_secs(5),
            unsampled: None,
        })
    }

    /// For a [percentile](Self::percentile) delay: hedge after `delay`
    /// (above zero) whenever the last period held too few answers for an
    /// estimate — until the first full period, under light traffic, after
    /// an idle pause — instead of not hedging. Default: none (no hedge
    /// until there is an estimate). Ignored for a fixed delay.
    pub fn or_fixed(mut self, delay: Duration) -> Self {
        if let Delay::Percentile { unsampled, .. } = &mut self.delay {
            *unsampled = Some(delay);
        }
        self
    }

    /// Never hedge: the layer passes every request through (a few branches
    /// per request). The ready-made client's default.
    pub fn off() -> Self {
        HedgePolicy::with(Delay::Off)
    }

    /// For a [percentile](Self::percentile) delay: the fewest answers the
    /// last period must hold for an estimate (at least 1). Default: 100.
    pub fn min_samples(mut self, n: u64) -> Self {
        if let Delay::Percentile { min_samples, .. } = &mut self.delay {
            *min_samples = n;
        }
        self
    }

    /// For a [percentile](Self::percentile) delay: how long each histogram
    /// is written before it becomes the one read (above zero). Default: 5 s.
    pub fn period(mut self, d: Duration) -> Self {
        if let Delay::Percentile { period, .. } = &mut self.delay {
            *period = d;
        }
        self
    }

    /// Copies in all, the original included: `2` sends at most one hedge.
    /// Valid: `1..=5` (1 never hedges; 5 is gRFC A6's cap). Default: 2.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Spend hedges from `budget`, shared with the retry layer (which
    /// records the requests in it; this layer then does not). Default: a
    /// [`RetryBudget::default`] of the layer's own, in which it records
    /// every hedgeable request.
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Whether a write whose idempotency key the client made (not the
    /// caller: [`KeyGenerated`](crate::KeyGenerated)) may be hedged.
    /// Default: `false`: the key makes it safe to **retry** after a
    /// failure, but a hedge sends a copy with no failure at all, so only a
    /// caller who chose the key (or an idempotent method, or a declared
    /// path) gets hedged writes.
    pub fn hedge_generated_keys(mut self, yes: bool) -> Self {
        self.generated_keys = yes;
        self
    }

    /// The methods that may be hedged (replaces the set; only standard
    /// methods can be listed). Default: GET, HEAD, OPTIONS, TRACE, PUT,
    /// DELETE. A request with a non-blank idempotency key, or on a
    /// [hedgeable path](Self::hedgeable_paths), is hedgeable whatever its
    /// method.
    pub fn eligible_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = MethodSet::of(methods);
        self
    }

    /// Paths that may be hedged whatever the method, as gRFC A6 declares
    /// hedgeable gRPC methods: `"/pkg.Service/Method"` for one method,
    /// `"/pkg.Service/"` (ending in `/`) for every method of a service.
    /// Default: none.
    pub fn hedgeable_paths<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.paths = paths
            .into_iter()
            .map(|p| p.into().into_boxed_str())
            .collect();
        self
    }

    /// The copies in all.
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether this policy ever hedges.
    pub fn is_off(&self) -> bool {
        self.delay == Delay::Off || self.max_attempts <= 1
    }

    /// Whether `method` may be hedged.
    pub fn is_eligible_method(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Whether the budget is shared (see [`budget`](Self::budget)).
    pub fn has_budget(&self) -> bool {
        self.budget.is_some()
    }

    /// Check the values.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] naming the value: a fixed delay or a
    /// period that is zero or longer than a day, a percentile outside
    /// `(0, 1)`, zero `min_samples`, or `max_attempts` outside `1..=5`.
    pub fn validate(&self) -> Result<(), Error> {
        match self.delay {
            Delay::Off => {}
            Delay::Fixed(d) => {
                crate::config::validate_duration("hedge delay", d)?;
            }
            Delay::Percentile {
                percentile,
                min_samples,
                period,
                unsampled,
            } => {
                if let Some(d) = unsampled {
                    crate::config::validate_duration("hedge or_fixed delay", d)?;
                }
                if !(percentile > 0.0 && percentile < 1.0) {
                    return Err(Error::config(
                        "hedge percentile must be in (0, 1), e.g. 0.95",
                    ));
                }
                if min_samples == 0 {
                    return Err(Error::config("hedge min_samples must be at least 1"));
                }
                crate::config::validate_duration("hedge period", period)?;
            }
        }
        if !(1..=MAX_HEDGED_ATTEMPTS).contains(&self.max_attempts) {
            return Err(Error::config("hedge max_attempts must be in 1..=5"));
        }
        Ok(())
    }
}

// ===== layer =====

/// Hedges slow attempts with [`HedgePolicy`]; its service is [`Hedge`].
///
/// See the [module docs](self) for an example.
///
/// # Clone
///
/// Clones of the layer, and every service it makes, share the latency
/// estimator and the budget.
#[derive(Clone, Debug)]
pub struct HedgeLayer {
    shared: Arc<Shared>,
}

/// What every clone shares.
#[derive(Debug)]
struct Shared {
    policy: HedgePolicy,
    budget: Arc<RetryBudget>,
    /// Record requests in the budget (it is the layer's own).
    deposit: bool,
    latency: Option<Arc<Latency>>,
}

impl HedgeLayer {
    /// A layer with `policy`.
    ///
    /// # Panics
    ///
    /// If the policy cannot work, with a message naming the value (see
    /// [`HedgePolicy::validate`]); use [`try_new`](Self::try_new) for
    /// values from configuration.
    #[track_caller]
    pub fn new(policy: HedgePolicy) -> Self {
        crate::config::expect_valid("HedgeLayer::new", Self::try_new(policy))
    }

    /// A layer with `policy`, checked.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if the policy cannot work (see
    /// [`HedgePolicy::validate`]).
    pub fn try_new(policy: HedgePolicy) -> Result<Self, Error> {
        policy.validate()?;
        let latency = match policy.delay {
            Delay::Percentile {
                percentile,
                min_samples,
                period,
                ..
            } if !policy.is_off() => Some(Arc::new(Latency::new(percentile, min_samples, period))),
            _ => None,
        };
        let (budget, deposit) = match &policy.budget {
            Some(b) => (Arc::clone(b), false),
            None => (Arc::new(RetryBudget::default()), true),
        };
        Ok(HedgeLayer {
            shared: Arc::new(Shared {
                policy,
                budget,
                deposit,
                latency,
            }),
        })
    }

    /// The policy.
    pub fn policy(&self) -> &HedgePolicy {
        &self.shared.policy
    }

    /// The current delay a hedge would wait: the fixed one, the percentile
    /// estimate (`None` until there is one), or `None` when off.
    pub fn current_delay(&self) -> Option<Duration> {
        self.shared.delay(Instant::now())
    }
}

impl<S> Layer<S> for HedgeLayer {
    type Service = Hedge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Shared {
    fn delay(&self, now: Instant) -> Option<Duration> {
        if self.policy.is_off() {
            return None;
        }
        match self.policy.delay {
            Delay::Off => None,
            Delay::Fixed(d) => Some(d),
            Delay::Percentile { unsampled, .. } => self
                .latency
                .as_ref()
                .and_then(|l| l.delay(now))
                .or(unsampled),
        }
    }

    /// Whether this request may be sent twice.
    fn hedgeable<B>(&self, req: &Request<B>) -> bool {
        let policy = &self.policy;
        // A caller (or a layer that knows the API, such as gRPC's
        // `MarkRetryable` for methods declared safe) says it is idempotent.
        if policy.is_eligible_method(req.method()) || req.extensions().get::<Idempotent>().is_some()
        {
            return true;
        }
        // A blank key is no key, as for the retry layer: what the server
        // sees is the header, so a blank header is no key whatever the
        // annotation says.
        let keyed = IdempotencyKey::is_seen(req.headers(), req.extensions());
        // A key the client made is the caller's only if asked.
        let keyed = keyed
            && (policy.generated_keys
                || req
                    .extensions()
                    .get::<crate::annotations::KeyGenerated>()
                    .is_none());
        keyed || self.hedgeable_path(req)
    }

    fn hedgeable_path<B>(&self, req: &Request<B>) -> bool {
        if self.policy.paths.is_empty() {
            return false;
        }
        let path = req.uri().path();
        self.policy.paths.iter().any(|p| {
            if p.ends_with('/') {
                path.starts_with(&**p) && path.len() > p.len()
            } else {
                path == &**p
            }
        })
    }
}

// ===== service =====

/// The service made by [`HedgeLayer`].
///
/// See the [module docs](self) for an example.
///
/// # Errors
///
/// The winning copy's error (or, when every copy failed, the last one),
/// turned into [`Error`] (an inner `rebound::Error` is kept as is). An
/// error of the inner service's `poll_ready` before a hedge stops hedging
/// and is not returned.
///
/// # Clone
///
/// Clones share the estimator and the budget.
#[derive(Clone)]
pub struct Hedge<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for Hedge<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("inner", &self.inner)
            .field("policy", &self.shared.policy)
            .finish()
    }
}

impl<S> Hedge<S> {
    /// Wrap `inner` (see [`HedgeLayer::new`], which panics as it does).
    pub fn new(inner: S, policy: HedgePolicy) -> Self {
        HedgeLayer::new(policy).layer(inner)
    }

    /// The policy.
    pub fn policy(&self) -> &HedgePolicy {
        &self.shared.policy
    }

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

impl<S, B, ResB> Service<Request<B>> for Hedge<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    B: CloneableBody,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S, B, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = &*self.shared;
        // Off, not hedgeable, or an attempt of the retry loop (hedged or
        // retried, not both): straight through.
        if shared.policy.is_off()
            || AttemptNumber::of(req.extensions()) > 1
            || !shared.hedgeable(&req)
        {
            return future::ResponseFuture::passthrough(self.inner.call(req), None);
        }
        let now = Instant::now();
        let latency = shared.latency.as_ref().map(|l| (Arc::clone(l), now));
        if shared.deposit {
            shared.budget.deposit();
        }
        let deadline = Deadline::of(req.extensions());
        let at = shared
            .delay(now)
            .and_then(|d| now.checked_add(d))
            .filter(|at| deadline.is_none_or(|dl| *at < dl));
        let Some(at) = at else {
            return future::ResponseFuture::passthrough(self.inner.call(req), latency);
        };
        let (parts, body) = req.into_parts();
        let Some(copy) = body.try_replay() else {
            // No body copy, no hedge.
            let req = Request::from_parts(parts, body);
            return future::ResponseFuture::passthrough(self.inner.call(req), latency);
        };
        let template = (parts.clone(), copy);
        // The ready service takes the original; hedges go through a clone,
        // made ready before each.
        let service = self.inner.clone();
        let fut = self.inner.call(Request::from_parts(parts, body));
        let hedging = future::Hedging::new(
            service,
            template,
            at - now,
            shared.policy.max_attempts,
            Arc::clone(&shared.budget),
            deadline,
        );
        future::ResponseFuture::hedged(fut, at, latency, hedging)
    }
}

#[cfg(test)]
mod tests;
