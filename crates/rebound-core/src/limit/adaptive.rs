//! An adaptive limit on attempts in flight that shrinks when the upstream
//! says it is overloaded (AIMD) or when its latency climbs (gradient).
//!
//! [`AdaptiveLimitLayer`] caps **attempts** in flight with a limit moved by
//! one of two [`Algorithm`]s: [`Aimd`] shrinks when the upstream says it is
//! overloaded (429, 503, attempt timeout) and grows back while attempts
//! succeed, probing faster once past the point where the upstream last
//! refused; [`Gradient`] follows the round-trip time against its measured
//! minimum, for an upstream that queues instead of refusing (see
//! [the gradient algorithm](#the-gradient-algorithm)).
//!
//! ```
//! use std::convert::Infallible;
//! use rebound_core::limit::{AdaptiveLimitLayer, Aimd};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let layer = AdaptiveLimitLayer::try_new(
//!     Aimd::default().min_limit(1).initial_limit(10).max_limit(100).backoff_ratio(0.5),
//! )?;
//! let limiter = layer.limiter().clone();
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         let mut res = http::Response::new(());
//!         *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! svc.oneshot(http::Request::new(())).await?;
//! assert_eq!(limiter.current_limit(), 5); // 10 × 0.5
//! # Ok(())
//! # }
//! ```
//!
//! [`AdaptiveLimitLayer`] sits **below the retry layer and above the
//! classifier**, so it sees every attempt and each attempt's [`Verdict`]. It
//! keeps a limit between a minimum and a maximum and changes it the AIMD
//! way, with two refinements that make it react in time:
//!
//! * **The first overload of a generation** multiplies the limit by a
//!   factor ([`Aimd::backoff_ratio`], default 0.9), rounding down, and
//!   starts a new generation. An overload on an attempt that started
//!   before that decrease is normally not counted again (TCP's
//!   once-per-window rule), so a burst of 429s from attempts already in
//!   flight shrinks the limit once, not once per response...
//! * **...unless attempts are waiting for a slot and what is still in
//!   flight is below what one more decrease would leave** (`in flight <
//!   limit × ratio`, this attempt not counted). Then the upstream has
//!   refused much of what was sent under the old limit, and the slot this
//!   attempt frees would go to a waiter it would refuse too: the limit drops
//!   **to what is still in flight** (the attempts the upstream is actually
//!   serving, in the spirit of the "limit = in-flight × backoff" rule of
//!   Netflix's concurrency-limits), and the slot is not handed on. Starting
//!   at 8 against an upstream that takes 2, a burst of 40 requests now
//!   draws 11 429s (37 before; 134 with a fixed limit of 8); 10,000
//!   requests from the client's default limit of 256 against an upstream
//!   that takes 20 leave at most a few callers with a 429 (0–0.1 %).
//! * **Success** grows the limit by one per window of `limit` successes,
//!   and only while the limit is actually used (at least half of it in
//!   flight), so a quiet period does not inflate it. Growing back **onto
//!   the point where the upstream last refused** (the limit before the last
//!   multiplicative decrease, or one more than what was in flight after a
//!   drop to in-flight) takes four windows
//!   (CUBIC's plateau near its last maximum: at a small limit one step is a
//!   large share of the load, and re-probing at once would draw a 429 every
//!   couple of successes). **Above** that point the limit probes for new
//!   capacity: each clean window adds twice what the previous one added (at
//!   most half the limit at once), so once the upstream is healthy the
//!   limit climbs back to its maximum in a few hundred successes (from 20 to
//!   256 in about 1,000 requests), not tens of thousands. Any decrease
//!   resets the step to one.
//! * Anything else (a 404, a connect error, a 500 the classifier called
//!   fatal) leaves it alone.
//!
//! Every change is bounded work: a decrease takes free permits out of the
//! semaphore (at most the change), growth adds at most half the limit.
//!
//! What counts as **overload**: a response with status **429** or **503**
//! (read from the status itself, whatever the classifier or the Retry-After
//! layer made of it: even a 503 that may not be retried says the server is
//! overloaded), and an error of kind
//! [`Timeout`](ErrorKind::Timeout)`(`[`Headers`](TimeoutStage::Headers)`)` —
//! the attempt timeout, the latency signal of an upstream that queues.
//! What counts as **success**: a response whose [`Verdict`] is `Success`
//! (absence of a verdict is success). A 429 that arrives as a response is an
//! overload, not a success (tower-resilience counts only `Err`).
//!
//! The slot is taken in the response future (FIFO, bounded by the
//! [`Deadline`], left at once when the future is dropped), or with
//! [`AdaptiveLimitLayer::backpressure`] reserved in `poll_ready` (see the
//! [`limit` module docs](super#backpressure)), and released when
//! the **response head** arrives: this layer sits below the retry layer,
//! whose drain of a discarded body would hold it for nothing; the
//! concurrency limit above holds the logical request until its body ends.
//! The whole-stack service (and so the ready-made client) knows which
//! response goes to the caller, and **holds that attempt's slot until its
//! body ends or is dropped** (a retried attempt's slot goes back at once):
//! an upstream still streaming a body is still busy with it. The outcome
//! (and the gradient's round-trip time) is recorded when the head arrives
//! all the same: time to the head is the upstream's queue and service,
//! where time to the body's end would also measure how fast the caller
//! reads.
//!
//! Observe it with [`AdaptiveLimiter::current_limit`]; every change is also
//! a `DEBUG` event with the field `current_limit` (and a
//! `rebound_adaptive_limit` gauge with the `metrics` feature).
//!
//! # Happy path
//!
//! Taking a free slot is one `try_acquire` and one atomic load. Giving it
//! back after a success at the maximum limit (the ready-made client's
//! default state while its upstream is healthy) takes no lock; every other
//! outcome takes the limiter's mutex for a few integer updates.
//!
//! # Defaults
//!
//! AIMD: min 1, initial 20, max 200, backoff ratio 0.9 (the ready-made client
//! uses initial = max = 256: unlimited in practice until the upstream says
//! it is overloaded; the rules above bring it down in one burst). Netflix's
//! concurrency-limits uses 20–200 with an initial 20 for its AIMD limit; we
//! keep its initial and maximum (20 is a sane first guess for one upstream,
//! 200 is more than one HTTP client usually needs towards one host), but
//! lower the minimum to **1**: Netflix limits a *server's* inbound load
//! across many clients, where 20 is a floor worth keeping; a client facing
//! one overloaded upstream must be able to back off to a single request in
//! flight, or it keeps hammering a server that answers 429 to everything.
//!
//! # The gradient algorithm
//!
//! Most servers do not answer 429 when they are overloaded: they queue.
//! Their latency climbs, every caller's deadline burns in the queue, and
//! AIMD, which waits for a refusal, keeps the limit high. A [`Gradient`]
//! limit (`AdaptiveLimitLayer::try_new(Gradient::default())`, or
//! `ClientBuilder::adaptive_limit(Gradient::default())` in the ready-made
//! client) reads the queue from the round-trip time of each successful
//! attempt (slot taken to response head):
//!
//! * every **update interval** (100 ms), the round-trip times of the
//!   attempts that ended since are averaged into the **sample RTT**;
//! * the **minimum RTT** is the no-load round-trip time. It is measured at
//!   the first window and then every **probe interval** (30 s ± 15 %
//!   jitter): the limit drops to the **probe limit** (3) and the mean
//!   round-trip time of the next **probe samples** (50) attempts that
//!   started at that limit is the new minimum; the limit then goes back to
//!   where it was. Between measurements, a window faster than the minimum
//!   lowers it (live traffic); only a measurement raises it, so an upstream
//!   that became slower for good is not mistaken for a queue for longer
//!   than one interval;
//! * each window then moves the limit `L` (a real number, floored for the
//!   semaphore) to
//!
//!   ```text
//!   gradient = clamp(tolerance × min_rtt / sample_rtt, 0.5, 1)
//!   new      = L × gradient + √L            (headroom: √L)
//!   L        = clamp((1 − smoothing) × L + smoothing × new, min, max)
//!   ```
//!
//!   with `tolerance` 1.25 and `smoothing` 0.2. The gradient is 1 while the
//!   upstream answers within the tolerance of its no-load time, and the
//!   limit grows by `smoothing × √L` per window; a queue makes it smaller
//!   than 1, down to halving. Against an upstream of `C` workers the limit
//!   settles where `L ≈ tolerance × C + √L`: every worker busy, a queue of
//!   about `0.25 C + √L`, the round-trip within about 1.3–1.6× the no-load
//!   time;
//! * the limit does not grow while fewer than half of it are in flight
//!   (a quiet client does not inflate it), and the √L headroom and the 0.5
//!   floor on the gradient keep noise from walking it down to zero (at
//!   `L = 4` even a gradient of 0.5 gives `2 + 2`);
//! * **loss** still counts: a 429 or 503, an attempt timeout and a
//!   connect failure multiply the limit by the backoff ratio (0.9), once
//!   per generation as for AIMD (during a probe, the limit it goes back to
//!   is cut instead).
//!
//! **Sources.** The formula is Envoy's adaptive concurrency filter
//! (`gradient = (minRTT + buffer) / sampleRTT`, headroom `√limit`, a
//! minimum re-measured at `min_concurrency` 3 over `request_count` 50
//! requests every `interval` with `jitter` 15 %, a 25 % `buffer`: our
//! tolerance 1.25) and the smoothing is Netflix concurrency-limits'
//! `Gradient2Limit` (`smoothing` 0.2, the gradient clamped to `[0.5, 1]`,
//! growth only while the limit is used; its `rttTolerance` is 1.5, its
//! long-term RTT an exponential average over 600 samples where we measure
//! the minimum as Envoy does, so a slow drift of the latency is not taken
//! for the baseline). Netflix's limits 20–200 are kept, with the minimum
//! lowered to 1 as for AIMD (below).
//!
//! **Cost.** The gradient reads the clock when a slot is taken (the
//! whole-stack service reuses the read that arms the attempt's timer) and
//! when the response head arrives (no clock read is made there otherwise on
//! the happy path). A success inside an update window only adds to the
//! window's atomics (its time, its count, the peak in flight): no lock.
//! The success that closes a window (one per 100 ms) and every sample while
//! the minimum is measured take the limiter's mutex. See BENCHMARKS.md.
//!
//! # Errors
//!
//! * [`ErrorKind::Timeout`]`(`[`TimeoutStage::Deadline`]`)` when the
//!   request's deadline passes while it waits for a slot (with a `Fatal`
//!   [`Verdict`]: there is no time left for another attempt).
//! * Errors of the inner service, turned into [`Error`] with
//!   [`Error::from_boxed`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

pub use super::gradient::Gradient;
use super::gradient::{GradientState, Move, Window};
use super::{wait_permit, Reservation, WaitPermit};
use crate::annotations::{Deadline, LimiterState, Reason, Verdict};
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};
use crate::wait::{take_ready, Wait, WaitThenCall};

/// How many windows of successes it takes to grow back onto the limit at
/// which the upstream was last overloaded.
const PLATEAU_WINDOWS: usize = 4;

// === impl Algorithm ===

/// The algorithm that moves an [`AdaptiveLimiter`]'s limit: [`Aimd`] (on
/// loss: 429, 503, timeouts) or [`Gradient`] (on latency, and on loss).
/// Both convert into it, so [`AdaptiveLimitLayer::try_new`] takes either.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Algorithm {
    /// Additive increase, multiplicative decrease on overload.
    Aimd(Aimd),
    /// The round-trip time against its minimum (Gradient2 / Envoy).
    Gradient(Gradient),
}

impl From<Aimd> for Algorithm {
    fn from(aimd: Aimd) -> Self {
        Algorithm::Aimd(aimd)
    }
}

impl From<Gradient> for Algorithm {
    fn from(gradient: Gradient) -> Self {
        Algorithm::Gradient(gradient)
    }
}

impl From<Aimd> for Option<Algorithm> {
    fn from(aimd: Aimd) -> Self {
        Some(Algorithm::Aimd(aimd))
    }
}

impl From<Gradient> for Option<Algorithm> {
    fn from(gradient: Gradient) -> Self {
        Some(Algorithm::Gradient(gradient))
    }
}

impl Algorithm {
    /// The lowest limit.
    pub fn min_limit(&self) -> usize {
        match self {
            Algorithm::Aimd(a) => a.min,
            Algorithm::Gradient(g) => g.min,
        }
    }

    /// The limit to start with.
    pub fn initial_limit(&self) -> usize {
        match self {
            Algorithm::Aimd(a) => a.initial,
            Algorithm::Gradient(g) => g.initial,
        }
    }

    /// The highest limit.
    pub fn max_limit(&self) -> usize {
        match self {
            Algorithm::Aimd(a) => a.max,
            Algorithm::Gradient(g) => g.max,
        }
    }

    /// The algorithm's short name (`"aimd"`, `"gradient"`).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Aimd(_) => "aimd",
            Algorithm::Gradient(_) => "gradient",
        }
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        match self {
            Algorithm::Aimd(a) => a.validate(),
            Algorithm::Gradient(g) => g.validate(),
        }
    }
}

// === impl Aimd ===

/// The AIMD settings of an [`AdaptiveLimiter`]; checked when the limiter is
/// built.
///
/// See the [module docs](self) for the defaults and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aimd {
    min: usize,
    initial: usize,
    max: usize,
    backoff_ratio: f64,
}

impl Default for Aimd {
    fn default() -> Self {
        Aimd {
            min: 1,
            initial: 20,
            max: 200,
            backoff_ratio: 0.9,
        }
    }
}

impl Aimd {
    /// The limit never goes below this. Default is 1.
    pub fn min_limit(mut self, min: usize) -> Self {
        self.min = min;
        self
    }

    /// The limit to start with. Default is 20.
    pub fn initial_limit(mut self, initial: usize) -> Self {
        self.initial = initial;
        self
    }

    /// The limit never goes above this. Default is 200.
    pub fn max_limit(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// On overload the limit is multiplied by this ratio (rounding down),
    /// which must be in `[0.5, 1)`. Default is 0.9.
    pub fn backoff_ratio(mut self, ratio: f64) -> Self {
        self.backoff_ratio = ratio;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if self.min == 0 {
            return Err(Error::config(
                "adaptive limit: min_limit must be at least 1",
            ));
        }
        if self.min > self.initial || self.initial > self.max {
            return Err(Error::config(format!(
                "adaptive limit: need min_limit <= initial_limit <= max_limit, got {} <= {} <= {}",
                self.min, self.initial, self.max
            )));
        }
        if self.max > Semaphore::MAX_PERMITS {
            return Err(Error::config(format!(
                "adaptive limit: max_limit {} is larger than the maximum of {}",
                self.max,
                Semaphore::MAX_PERMITS
            )));
        }
        if !(0.5..1.0).contains(&self.backoff_ratio) {
            return Err(Error::config(format!(
                "adaptive limit: backoff_ratio must be in [0.5, 1), got {}",
                self.backoff_ratio
            )));
        }
        Ok(())
    }
}

// === impl AdaptiveLimiter ===

/// The shared state of an adaptive limit: a FIFO semaphore whose capacity
/// follows the AIMD limit.
///
/// Shrinking takes free permits out of the semaphore at once; permits that
/// are in use are recorded as a debt and forgotten when they come back, so
/// in-flight attempts are never cut and the queue stays FIFO.
pub struct AdaptiveLimiter {
    semaphore: Arc<Semaphore>,
    state: Mutex<LimitState>,
    algorithm: Algorithm,
    /// The AIMD settings' maximum (the lock-free happy path), or
    /// `usize::MAX` for the gradient (which samples every success).
    fast_max: usize,
    /// The gradient's slot stamps count from here.
    base: Instant,
    /// The gradient's update window, filled without the lock (unused for
    /// AIMD).
    window: Window,
    /// The gradient's update interval in ns (0 for AIMD).
    update_ns: u64,
    /// Mirror of `state.limit`, readable without the lock.
    current: AtomicUsize,
    /// Mirror of `state.epoch`, read when a slot is taken.
    epoch: AtomicU64,
    /// Permits in use that must be forgotten, not returned, when released.
    /// Added to and paid under the lock; a release takes one off without
    /// it (a slot held by a response body gives its permit back on its
    /// own, after its outcome was recorded).
    debt: AtomicUsize,
    queued: AtomicUsize,
    /// The `HostLimiters` use counter at this
    /// limiter's last use (for its eviction order; 0 elsewhere).
    #[cfg_attr(
        not(any(feature = "breaker", feature = "retry-after")),
        allow(dead_code)
    )]
    pub(super) last_use: AtomicU64,
}

#[derive(Debug)]
struct LimitState {
    limit: usize,
    /// Successes in the current growth window.
    successes: usize,
    /// How much the next full growth window adds: 1 after an overload and
    /// below `probe_above`, then doubling with every clean window.
    step: usize,
    /// The limit before the last multiplicative decrease: up to it growth
    /// is one per window (the upstream was overloaded there); above it the
    /// limit probes for new capacity with doubling steps.
    probe_above: usize,
    /// Bumped on every decrease.
    epoch: u64,
    /// The gradient's state (`None` for AIMD).
    gradient: Option<Box<GradientState>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Overload,
    /// The connection could not be made: a loss for the gradient, neutral
    /// for AIMD.
    Unreachable,
    Neutral,
}

impl AdaptiveLimiter {
    /// A limiter with the given settings.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(algorithm: impl Into<Algorithm>) -> Self {
        crate::config::expect_valid("AdaptiveLimiter::new", Self::try_new(algorithm))
    }

    /// A limiter with the given settings.
    ///
    /// # Errors
    ///
    /// A [`Config`](ErrorKind::Config) error unless
    /// `1 <= min <= initial <= max` and the backoff ratio is in `[0.5, 1)`;
    /// for a [`Gradient`], also unless its tolerance is at least 1, its
    /// smoothing in `(0, 1]`, its intervals non-zero (the probe's longer
    /// than the update's), its jitter in `[0, 1)` and its probe's limit and
    /// samples at least 1. The message names the setting.
    pub fn try_new(algorithm: impl Into<Algorithm>) -> Result<Self, Error> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        let initial = algorithm.initial_limit();
        let (fast_max, gradient, update_ns) = match &algorithm {
            Algorithm::Aimd(a) => (a.max, None, 0),
            Algorithm::Gradient(g) => (
                usize::MAX,
                Some(Box::new(GradientState::new(g))),
                g.update_ns(),
            ),
        };
        Ok(AdaptiveLimiter {
            semaphore: Arc::new(Semaphore::new(initial)),
            state: Mutex::new(LimitState {
                limit: initial,
                successes: 0,
                step: 1,
                probe_above: 0,
                epoch: 0,
                gradient,
            }),
            algorithm,
            fast_max,
            base: Instant::now(),
            window: Window::default(),
            update_ns,
            current: AtomicUsize::new(initial),
            epoch: AtomicU64::new(0),
            debt: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            last_use: AtomicU64::new(0),
        })
    }

    /// The algorithm and its settings.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The AIMD settings, if the limit is AIMD.
    pub fn aimd(&self) -> Option<&Aimd> {
        match &self.algorithm {
            Algorithm::Aimd(a) => Some(a),
            Algorithm::Gradient(_) => None,
        }
    }

    /// The gradient's minimum round-trip time as measured so far (`None`
    /// for AIMD, or before the first measurement).
    pub fn min_rtt(&self) -> Option<Duration> {
        let st = self.lock();
        let g = st.gradient.as_ref()?;
        (g.min_rtt > 0).then(|| Duration::from_nanos(g.min_rtt))
    }

    /// The gradient's last sampled round-trip time (the mean of an update
    /// window; `None` for AIMD, or before the first window).
    pub fn sample_rtt(&self) -> Option<Duration> {
        let st = self.lock();
        let g = st.gradient.as_ref()?;
        (g.sample_rtt > 0).then(|| Duration::from_nanos(g.sample_rtt))
    }

    /// Whether the gradient is measuring its minimum round-trip time again,
    /// at a reduced limit, right now.
    pub fn probing(&self) -> bool {
        self.lock().gradient.as_ref().is_some_and(|g| g.probing())
    }

    /// The current limit.
    pub fn current_limit(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// Attempts in flight right now (between taking a slot and the response
    /// head, or its body's end in the whole-stack service), counting a slot just handed to the oldest waiter. Can exceed
    /// [`current_limit`](Self::current_limit) for a while after a decrease:
    /// attempts in flight are never cut, the excess is not handed out again.
    pub fn in_flight(&self) -> usize {
        let st = self.lock();
        (st.limit + self.debt.load(Ordering::Acquire))
            .saturating_sub(self.semaphore.available_permits())
    }

    /// Slots free right now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits()
    }

    /// Attempts waiting for a slot right now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// The state as a [`LimiterState`] annotation.
    fn state(&self) -> LimiterState {
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        LimiterState {
            limiter: "adaptive",
            limit: clamp(self.current_limit()),
            in_flight: clamp(self.in_flight()),
            queued: clamp(self.queued()),
        }
    }

    /// `state` (taken while this attempt held its slot, so it counts in
    /// `in_flight`) with the limit as it is now, after the outcome.
    fn after(&self, state: LimiterState) -> LimiterState {
        LimiterState {
            limit: u32::try_from(self.current_limit()).unwrap_or(u32::MAX),
            ..state
        }
    }

    /// Now, as ns since the limiter's base plus one (8 bytes in a slot,
    /// where an `Option<Instant>` takes 16).
    #[inline]
    fn stamp(&self, now: Instant) -> u64 {
        // In u64 arithmetic (no u128 `as_nanos`): 584 years of ns.
        let d = now.saturating_duration_since(self.base);
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
            .min(u64::MAX - 1)
            + 1
    }

    /// Attempts in flight, without the lock (from the limit's mirror: may
    /// lag a change in progress by its size).
    #[inline]
    fn in_flight_now(&self) -> usize {
        (self.current.load(Ordering::Acquire) + self.debt.load(Ordering::Acquire))
            .saturating_sub(self.semaphore.available_permits())
    }

    fn lock(&self) -> MutexGuard<'_, LimitState> {
        // The state stays consistent even if a holder panicked: every update
        // is a few integer assignments.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pay up to `n` of the debt; how much was paid.
    fn pay_debt(&self, n: usize) -> usize {
        let mut paid = 0;
        // Never fails: the closure always returns `Some`.
        let _ = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                paid = n.min(d);
                Some(d - paid)
            });
        paid
    }

    /// Give a slot's permit back, or forget it against the debt. No lock:
    /// one atomic load while there is no debt.
    fn release(&self, permit: OwnedSemaphorePermit) {
        let owed = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1));
        if owed.is_ok() {
            permit.forget();
        } else {
            drop(permit);
        }
    }

    /// Record the outcome of an attempt that took its slot in `epoch` (at
    /// `started`, a [`stamp`](Self::stamp), for the gradient), then give
    /// the slot back.
    fn finish(&self, permit: OwnedSemaphorePermit, epoch: u64, started: u64, outcome: Outcome) {
        self.record(epoch, started, outcome);
        self.release(permit);
    }

    /// Record the outcome of an attempt that took its slot in `epoch` (at
    /// `started`, a [`stamp`](Self::stamp), for the gradient), its slot
    /// still held (counted in flight).
    fn record(&self, epoch: u64, started: u64, outcome: Outcome) {
        // Happy path, without the lock: a success at the maximum changes
        // nothing (the release that follows reads the debt without it).
        if outcome == Outcome::Success && self.current.load(Ordering::Acquire) >= self.fast_max {
            return;
        }
        // The gradient's happy path, without the lock either: a success
        // inside an update window only adds to the window.
        let mut end = None;
        if outcome == Outcome::Success && self.update_ns > 0 {
            if started == 0 {
                return;
            }
            let now = self.stamp(Instant::now());
            let rtt = now.saturating_sub(started);
            if self
                .window
                .add(now, rtt, self.update_ns, || self.in_flight_now())
            {
                return;
            }
            end = Some(now);
        }
        let mut st = self.lock();
        let before = st.limit;
        // Attempts in flight, this one included.
        let in_flight = (st.limit + self.debt.load(Ordering::Acquire))
            .saturating_sub(self.semaphore.available_permits());
        let aimd = match &self.algorithm {
            Algorithm::Aimd(aimd) => aimd,
            Algorithm::Gradient(g) => {
                self.gradient_outcome(&mut st, g, (epoch, started, end), in_flight, outcome);
                self.report(st, before);
                return;
            }
        };
        match outcome {
            Outcome::Overload if epoch == st.epoch => {
                // The first overload of a generation: multiplicative decrease.
                let target = ((st.limit as f64 * aimd.backoff_ratio) as usize).max(aimd.min);
                st.probe_above = st.limit;
                self.shrink(&mut st, target);
            }
            Outcome::Overload
                if self.queued.load(Ordering::Acquire) > 0
                    && (in_flight.saturating_sub(1) as f64)
                        < st.limit as f64 * aimd.backoff_ratio =>
            {
                // A later overload of an older generation, while attempts are
                // waiting, and what is still in flight is below what one more
                // decrease would leave: the upstream refused much of what was
                // sent under the old limit, and the slot would go to a
                // waiter it would refuse too. The limit drops to what is
                // still in flight (the attempts the upstream is serving), so
                // the slot is not handed on.
                let target = in_flight.saturating_sub(1).max(aimd.min);
                if target < st.limit {
                    self.shrink(&mut st, target);
                    // The upstream refused what went past `target`: growth
                    // waits at `target + 1`, then probes past it.
                    st.probe_above = target + 1;
                }
            }
            Outcome::Success if st.limit < aimd.max && in_flight * 2 >= st.limit => {
                st.successes += 1;
                // Growing back onto the limit where the upstream was last
                // overloaded takes a longer window (CUBIC's plateau near
                // its last maximum): at small limits one step is a large
                // share of the load, so re-probing at once would draw a
                // 429 every couple of successes.
                let onto_plateau =
                    st.limit < st.probe_above && st.limit + st.step >= st.probe_above;
                let window = if onto_plateau {
                    st.limit.saturating_mul(PLATEAU_WINDOWS)
                } else {
                    st.limit
                };
                if st.successes >= window {
                    st.successes = 0;
                    let grow = st.step.min(aimd.max - st.limit);
                    st.limit += grow;
                    // Above the last overload point, the next clean window
                    // adds twice as much, but never more than half the
                    // limit at once.
                    if st.limit > st.probe_above {
                        st.step = (st.step * 2).min((st.limit / 2).max(1));
                    }
                    let paid = self.pay_debt(grow);
                    self.semaphore.add_permits(grow - paid);
                }
            }
            _ => {}
        }
        self.report(st, before);
    }

    /// The gradient's part of [`finish`](Self::finish).
    fn gradient_outcome(
        &self,
        st: &mut LimitState,
        g: &Gradient,
        (epoch, started, end): (u64, u64, Option<u64>),
        in_flight: usize,
        outcome: Outcome,
    ) {
        let current = st.epoch;
        let limit = st.limit;
        let state = st
            .gradient
            .as_mut()
            .expect("a gradient limiter has its state");
        let target = match outcome {
            Outcome::Success => {
                if started == 0 {
                    return;
                }
                let now = end.unwrap_or_else(|| self.stamp(Instant::now()));
                let rtt = now.saturating_sub(started);
                let window = &self.window;
                match state.sample(g, window, (now, rtt), (epoch, current), in_flight, limit) {
                    Move::Stay => return,
                    Move::To(target) => target,
                }
            }
            Outcome::Overload | Outcome::Unreachable if epoch == current => {
                state.overload(g, limit)
            }
            _ => return,
        };
        self.set_limit(st, target);
    }

    /// Move the limit to `target`: down as [`shrink`](Self::shrink), up by
    /// paying the debt first, then adding permits.
    fn set_limit(&self, st: &mut LimitState, target: usize) {
        if target < st.limit {
            self.shrink(st, target);
        } else if target > st.limit {
            let grow = target - st.limit;
            st.limit = target;
            let paid = self.pay_debt(grow);
            self.semaphore.add_permits(grow - paid);
        }
    }

    /// Report a change of the limit from `before`.
    fn report(&self, st: MutexGuard<'_, LimitState>, before: usize) {
        let after = st.limit;
        let ms = |ns: u64| (ns > 0).then(|| ns as f64 / 1e6);
        let (min_rtt, sample_rtt) = st
            .gradient
            .as_ref()
            .map_or((None, None), |g| (ms(g.min_rtt), ms(g.sample_rtt)));
        drop(st);
        if after != before {
            self.current.store(after, Ordering::Release);
            tracing::debug!(
                current_limit = after,
                previous_limit = before,
                algorithm = self.algorithm.name(),
                min_rtt_ms = min_rtt,
                sample_rtt_ms = sample_rtt,
                cause = if after < before {
                    "overload"
                } else {
                    "success"
                },
                "adaptive limit changed"
            );
            #[cfg(feature = "metrics")]
            {
                metrics::gauge!("rebound_adaptive_limit").set(after as f64);
                crate::metrics::record_adaptive(after, min_rtt, sample_rtt);
            }
        }
    }

    /// Lower the limit to `target` (below the current limit): free permits
    /// are taken out at once, permits in use become debt. Starts a new
    /// generation and resets growth.
    fn shrink(&self, st: &mut LimitState, target: usize) {
        let mut excess = st.limit - target;
        st.limit = target;
        st.successes = 0;
        st.step = 1;
        st.epoch += 1;
        self.epoch.store(st.epoch, Ordering::Release);
        while excess > 0 {
            match self.semaphore.try_acquire() {
                Ok(free) => {
                    free.forget();
                    excess -= 1;
                }
                Err(_) => break,
            }
        }
        self.debt.fetch_add(excess, Ordering::AcqRel);
    }
}

impl fmt::Debug for AdaptiveLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimiter")
            .field("algorithm", &self.algorithm)
            .field("current_limit", &self.current_limit())
            .field("available", &self.available())
            .field("queued", &self.queued())
            .finish()
    }
}

/// A slot held by one attempt; released (as a neutral outcome) if dropped.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    epoch: u64,
    /// When the attempt took the slot (the gradient's round-trip time; no
    /// clock is read for AIMD).
    /// (ns since the limiter's base, plus one; 0: not taken).
    started: u64,
    limiter: Arc<AdaptiveLimiter>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, limiter: &Arc<AdaptiveLimiter>) -> Self {
        let mut slot = Self::unstamped(permit, limiter);
        if limiter.fast_max == usize::MAX {
            slot.started = limiter.stamp(Instant::now());
        }
        slot
    }

    /// A slot whose start the caller stamps (the whole-stack service, with
    /// the clock read it makes anyway to arm the attempt's timer).
    fn unstamped(permit: OwnedSemaphorePermit, limiter: &Arc<AdaptiveLimiter>) -> Self {
        Slot {
            permit: Some(permit),
            epoch: limiter.epoch.load(Ordering::Acquire),
            started: 0,
            limiter: limiter.clone(),
        }
    }

    fn finish(mut self, outcome: Outcome) {
        if let Some(permit) = self.permit.take() {
            self.limiter
                .finish(permit, self.epoch, self.started, outcome);
        }
    }

    /// Record the outcome now, and keep the permit until the returned
    /// holder is dropped.
    #[cfg(feature = "stack")]
    fn record(mut self, outcome: Outcome) -> HeldSlot {
        let permit = self.permit.take();
        self.limiter.record(self.epoch, self.started, outcome);
        HeldSlot {
            permit,
            limiter: self.limiter.clone(),
        }
    }
}

/// An attempt's slot whose outcome is recorded, its permit still held (by
/// the response body, in the whole-stack service): given back when
/// dropped.
#[cfg(feature = "stack")]
pub(crate) struct HeldSlot {
    permit: Option<OwnedSemaphorePermit>,
    limiter: Arc<AdaptiveLimiter>,
}

#[cfg(feature = "stack")]
impl Drop for HeldSlot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.limiter.release(permit);
        }
    }
}

#[cfg(feature = "stack")]
impl fmt::Debug for HeldSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldSlot").finish_non_exhaustive()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.limiter
                .finish(permit, self.epoch, self.started, Outcome::Neutral);
        }
    }
}

/// A place in the queue; leaving it gives it back.
struct QueueSlot(Arc<AdaptiveLimiter>);

impl QueueSlot {
    fn enter(limiter: &Arc<AdaptiveLimiter>) -> Self {
        limiter.queued.fetch_add(1, Ordering::AcqRel);
        QueueSlot(limiter.clone())
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

// === impl AdaptiveLimitLayer ===

/// Limits attempts in flight with a limit that shrinks on overload (AIMD).
///
/// See the [module docs](self) for an example, and
/// [`backpressure`](Self::backpressure) for a limit that `poll_ready`
/// reports.
///
/// # Clone
///
/// Clones share the same [`AdaptiveLimiter`].
#[derive(Clone, Debug)]
pub struct AdaptiveLimitLayer {
    limiter: Arc<AdaptiveLimiter>,
    backpressure: bool,
}

impl AdaptiveLimitLayer {
    /// A layer with a new limiter of the given settings.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(algorithm: impl Into<Algorithm>) -> Self {
        crate::config::expect_valid("AdaptiveLimitLayer::new", Self::try_new(algorithm))
    }

    /// A layer with a new limiter of the given settings: an [`Aimd`] or a
    /// [`Gradient`].
    ///
    /// # Errors
    ///
    /// See [`AdaptiveLimiter::try_new`].
    pub fn try_new(algorithm: impl Into<Algorithm>) -> Result<Self, Error> {
        Ok(Self::shared(Arc::new(AdaptiveLimiter::try_new(algorithm)?)))
    }

    /// A layer over a limiter shared with other layers or clients that talk
    /// to the same upstream.
    pub fn shared(limiter: Arc<AdaptiveLimiter>) -> Self {
        AdaptiveLimitLayer {
            limiter,
            backpressure: false,
        }
    }

    /// Whether the service reports "no slot free" from `poll_ready`
    /// (`true`), reserving the slot there as tower's `ConcurrencyLimit`
    /// does, so that tower's `LoadShed` above it sheds. Default is `false`:
    /// `poll_ready` passes through and attempts wait for their slot in the
    /// response future, bounded by their deadline. See the
    /// [`limit` module docs](super#backpressure).
    pub fn backpressure(mut self, enabled: bool) -> Self {
        self.backpressure = enabled;
        self
    }

    /// The limiter, to observe or to share.
    pub fn limiter(&self) -> &Arc<AdaptiveLimiter> {
        &self.limiter
    }
}

impl Default for AdaptiveLimitLayer {
    /// A layer with the default [`Aimd`] settings.
    fn default() -> Self {
        Self::new(Aimd::default())
    }
}

impl<S> Layer<S> for AdaptiveLimitLayer {
    type Service = AdaptiveLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveLimit::new(inner, self.limiter.clone()).backpressure(self.backpressure)
    }
}

// === impl AdaptiveLimit ===

/// The service of [`AdaptiveLimitLayer`].
///
/// See the [module docs](self).
///
/// # Clone
///
/// Clones share the same [`AdaptiveLimiter`]. A clone starts without the
/// slot a [backpressure](AdaptiveLimitLayer::backpressure) `poll_ready`
/// may have reserved: it reserves its own.
#[derive(Clone, Debug)]
pub struct AdaptiveLimit<S> {
    inner: S,
    limiter: Arc<AdaptiveLimiter>,
    /// With backpressure: the permit `poll_ready` reserves for `call`.
    reservation: Reservation,
}

impl<S> AdaptiveLimit<S> {
    /// Wrap `inner` with the limit of `limiter`.
    pub fn new(inner: S, limiter: Arc<AdaptiveLimiter>) -> Self {
        AdaptiveLimit {
            inner,
            limiter,
            reservation: Reservation::off(),
        }
    }

    /// See [`AdaptiveLimitLayer::backpressure`].
    pub fn backpressure(mut self, enabled: bool) -> Self {
        self.reservation = Reservation::new(&self.limiter.semaphore, enabled);
        self
    }

    /// The limiter, to observe or to share.
    pub fn limiter(&self) -> &Arc<AdaptiveLimiter> {
        &self.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for AdaptiveLimit<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = ResponseFuture<S, Request<ReqB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // With backpressure: reserve a slot first (FIFO; the waker is
        // registered in the semaphore's queue). A decrease takes only free
        // permits, so a reserved slot is one the limit still allows.
        ready!(self.reservation.poll_reserve(cx));
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let reserved = self.reservation.take();
        start(&mut self.inner, self.limiter.clone(), reserved, req)
    }
}

/// An attempt under `limiter`: a slot reserved by a backpressure
/// `poll_ready` (`reserved`), else a free one (happy path); an attempt that
/// finds neither waits in the future, in the limiter's FIFO queue. Shared by
/// [`AdaptiveLimit`] and the per-host layer.
pub(crate) fn start<S, ReqB, ResB>(
    inner: &mut S,
    limiter: Arc<AdaptiveLimiter>,
    reserved: Option<(tokio::sync::OwnedSemaphorePermit, bool)>,
    req: Request<ReqB>,
) -> ResponseFuture<S, Request<ReqB>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    let inner = if let Some((permit, waited)) = reserved {
        let slot = Slot::new(permit, &limiter);
        WaitThenCall::called(inner.call(req), (slot, waited))
    } else if let Ok(permit) = limiter.semaphore.clone().try_acquire_owned() {
        let slot = Slot::new(permit, &limiter);
        WaitThenCall::called(inner.call(req), (slot, false))
    } else {
        let wait = Queued {
            wait: wait_permit(limiter.semaphore.clone(), Deadline::of(req.extensions())),
            queue: Some(QueueSlot::enter(&limiter)),
        };
        WaitThenCall::waiting(wait, take_ready(inner), req)
    };
    ResponseFuture { inner, limiter }
}

/// The wait of an attempt that found no free slot: its place in the FIFO
/// queue, until the slot or the deadline. Yields the slot and "queued".
struct Queued {
    wait: WaitPermit,
    queue: Option<QueueSlot>,
}

impl Wait for Queued {
    type Held = (Slot, bool);

    fn name(&self) -> &'static str {
        "queued"
    }

    fn closed_detail(&self) -> &'static str {
        "shut down while queued for an adaptive-limit slot"
    }

    fn poll_wait<B>(
        &mut self,
        cx: &mut Context<'_>,
        req: &mut Request<B>,
    ) -> Poll<Result<(Slot, bool), Error>> {
        let permit = ready!(self.wait.as_mut().poll(cx));
        let queue = self.queue.take().expect("polled after completion");
        let Some(permit) = permit else {
            let mut err = Error::timeout(TimeoutStage::Deadline)
                .with_detail("while waiting for an adaptive-limit slot")
                .with_request(req.method(), req.uri());
            err.extensions_mut().insert(Verdict::Fatal {
                reason: Reason::new_static("deadline passed while queued"),
            });
            return Poll::Ready(Err(err));
        };
        let slot = Slot::new(permit, &queue.0);
        Poll::Ready(Ok((slot, true)))
    }
}

fn outcome_of_response<B>(res: &Response<B>) -> Outcome {
    match res.status() {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Outcome::Overload,
        // The pacer read a quota at zero on this answer (a 200 whose
        // `remaining` says the next would be refused): lower the limit
        // before the 429s come, as the server's word asks.
        #[cfg(feature = "ratelimit")]
        _ if res
            .extensions()
            .get::<crate::ratelimit::QuotaSignal>()
            .is_some_and(|s| s.exhausted.is_some()) =>
        {
            Outcome::Overload
        }
        _ if Verdict::of(res.extensions()).is_success() => Outcome::Success,
        _ => Outcome::Neutral,
    }
}

/// [`outcome_of_response`] for the layer, which may stand inside a
/// `RateLimitLayer` (so no [`QuotaSignal`](crate::ratelimit::QuotaSignal)
/// is on the response yet): a quota at zero in the headers is an overload
/// too. The whole-stack service reads the headers once, in its pacer, and
/// keeps to [`outcome_of_response`].
fn outcome_of_unread_response<B>(res: &Response<B>) -> Outcome {
    let outcome = outcome_of_response(res);
    #[cfg(feature = "ratelimit")]
    if outcome != Outcome::Overload && crate::ratelimit::says_exhausted(res.status(), res.headers())
    {
        return Outcome::Overload;
    }
    outcome
}

fn outcome_of_error(err: &Error) -> Outcome {
    match err.kind() {
        ErrorKind::Timeout(TimeoutStage::Headers) => Outcome::Overload,
        ErrorKind::Connect => Outcome::Unreachable,
        _ => Outcome::Neutral,
    }
}

// === impl ResponseFuture ===

pin_project! {
    /// The response future of [`AdaptiveLimit`]: waits for a slot (if none
    /// was free), calls the inner service, and feeds the outcome back into
    /// the limit.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, R>
    where
        S: Service<R>,
    {
        #[pin]
        inner: WaitThenCall<Queued, S, R>,
        limiter: Arc<AdaptiveLimiter>,
    }
}

impl<S, R> fmt::Debug for ResponseFuture<S, R>
where
    S: Service<R>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("state", &self.inner.state_name())
            .finish()
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, Request<ReqB>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResB>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (result, (slot, queued)) = match ready!(this.inner.poll(cx)) {
            Ok(called) => called,
            Err(waited) => return Poll::Ready(Err(waited)),
        };
        // Off the happy path only (queued, or an overload that moved the
        // limit): the outcome shows the limiter state.
        let show = |outcome: Outcome| queued || outcome == Outcome::Overload;
        Poll::Ready(match result {
            Ok(mut res) => {
                let outcome = outcome_of_unread_response(&res);
                let before = show(outcome).then(|| this.limiter.state());
                slot.finish(outcome);
                if let Some(state) = before {
                    res.extensions_mut().insert(this.limiter.after(state));
                }
                Ok(res)
            }
            Err(mut err) => {
                let outcome = outcome_of_error(&err);
                let before = show(outcome).then(|| this.limiter.state());
                slot.finish(outcome);
                if let Some(state) = before {
                    err.extensions_mut().insert(this.limiter.after(state));
                }
                Err(err)
            }
        })
    }
}

// === the limit's engine, for the whole-stack service ===

#[cfg(feature = "stack")]
/// An attempt's slot in the adaptive limit, as the whole-stack service
/// holds it: released as a neutral outcome if dropped.
pub(crate) struct AttemptSlot {
    slot: Slot,
    queued: bool,
}

#[cfg(feature = "stack")]
impl AdaptiveLimiter {
    /// A free slot now (the happy path), if any.
    pub(crate) fn try_slot(self: &Arc<Self>) -> Option<AttemptSlot> {
        let permit = self.semaphore.clone().try_acquire_owned().ok()?;
        Some(AttemptSlot {
            slot: Slot::unstamped(permit, self),
            queued: false,
        })
    }

    /// The slow path: queue for a slot until `deadline`, with
    /// [`AdaptiveLimit`]'s error when it passes first. Boxed: only an
    /// attempt that found no free slot waits.
    pub(crate) fn wait_slot(
        self: &Arc<Self>,
        deadline: Option<tokio::time::Instant>,
        name: crate::redact::RequestName,
    ) -> Pin<Box<dyn Future<Output = Result<AttemptSlot, Error>> + Send>> {
        let queue = QueueSlot::enter(self);
        let wait = wait_permit(self.semaphore.clone(), deadline);
        Box::pin(async move {
            let permit = wait.await;
            let limiter = queue.0.clone();
            drop(queue);
            match permit {
                Some(permit) => Ok(AttemptSlot {
                    slot: Slot::unstamped(permit, &limiter),
                    queued: true,
                }),
                None => {
                    let mut err = name.name(
                        Error::timeout(TimeoutStage::Deadline)
                            .with_detail("while waiting for an adaptive-limit slot"),
                    );
                    err.extensions_mut().insert(Verdict::Fatal {
                        reason: Reason::new_static("deadline passed while queued"),
                    });
                    Err(err)
                }
            }
        })
    }
}

#[cfg(feature = "stack")]
impl AttemptSlot {
    /// The attempt is called now (the gradient's round-trip time starts;
    /// nothing for AIMD).
    pub(crate) fn called_at(&mut self, now: Instant) {
        if self.slot.limiter.fast_max == usize::MAX {
            self.slot.started = self.slot.limiter.stamp(now);
        }
    }

    /// Feed the attempt's outcome into the limit, keeping the slot (the
    /// caller gives it back by dropping what this returns: the whole-stack
    /// service hands it to the response body); the outcome shows the
    /// limiter's state off the happy path (the attempt queued, or
    /// overloaded the upstream), as [`AdaptiveLimit`]'s does.
    pub(crate) fn settle<B>(self, out: &mut Result<Response<B>, Error>) -> HeldSlot {
        let AttemptSlot { slot, queued } = self;
        let limiter = slot.limiter.clone();
        let outcome = match out {
            Ok(res) => outcome_of_response(res),
            Err(err) => outcome_of_error(err),
        };
        let before = (queued || outcome == Outcome::Overload).then(|| limiter.state());
        let held = slot.record(outcome);
        if let Some(state) = before {
            let state = limiter.after(state);
            match out {
                Ok(res) => res.extensions_mut().insert(state),
                Err(err) => err.extensions_mut().insert(state),
            };
        }
        held
    }
}
