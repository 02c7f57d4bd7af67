//! The circuit breaker: stop calling a host that is broken, for a while —
//! and never one that works.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Empty;
//! use rebound_core::breaker::CircuitBreakerLayer;
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::retry::{RetryLayer, RetryPolicy};
//! use rebound_core::{CircuitState, ErrorKind, Sent};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // The defaults, above the retry loop: the breaker counts requests.
//! let breaker = CircuitBreakerLayer::default();
//! let svc = ServiceBuilder::new()
//!     .layer(breaker.clone())
//!     .layer(RetryLayer::new(RetryPolicy::default()))
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(tower::service_fn(|_req: Request<Empty<Bytes>>| async {
//!         let mut res = Response::new(Empty::<Bytes>::new());
//!         *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let uri: http::Uri = "https://api.example/v1".parse().unwrap();
//! let get = || Request::get(uri.clone()).body(Empty::new()).unwrap();
//! for _ in 0..10 {
//!     let res = svc.clone().oneshot(get()).await.unwrap();
//!     assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
//! }
//! // Ten requests in a row failed after their retries: the circuit of
//! // api.example is open.
//! assert_eq!(breaker.state(&uri), CircuitState::Open);
//! let err = svc.clone().oneshot(get()).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::CircuitOpen);
//! assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
//! assert_eq!(
//!     err.to_string(),
//!     "circuit open: may close in 5s for GET https://api.example/v1"
//! );
//!
//! // After the break, one probe goes through.
//! tokio::time::advance(Duration::from_secs(5)).await;
//! assert_eq!(breaker.state(&uri), CircuitState::HalfOpen);
//! # }
//! ```
//!
//! # States
//!
//! Each circuit (one per host by default) is **closed**, **open** or
//! **half-open**:
//!
//! * **Closed**: calls go through and their outcomes are counted. The
//!   circuit opens on either of two triggers:
//!   * [`consecutive_failures`](CircuitBreakerConfig::consecutive_failures)
//!     failures in a row (a success ends the run; what is not counted, see
//!     below, neither ends nor extends it);
//!   * a failure that leaves a sliding window of
//!     [`sampling_duration`](CircuitBreakerConfig::sampling_duration) (ten
//!     buckets, each a tenth of it) with at least
//!     [`minimum_throughput`](CircuitBreakerConfig::minimum_throughput)
//!     calls and a failure ratio of at least
//!     [`failure_ratio`](CircuitBreakerConfig::failure_ratio).
//! * **Open**: every call fails at once with [`ErrorKind::CircuitOpen`],
//!   without reaching the service below, for the
//!   [`break_duration`](CircuitBreakerConfig::break_duration) (optionally
//!   [growing](CircuitBreakerConfig::break_growth) while probes keep
//!   failing). These refusals are never counted.
//! * **Half-open**: once the break is over, up to
//!   [`half_open_probes`](CircuitBreakerConfig::half_open_probes) calls go
//!   through as probes (the others still fail at once). When that many
//!   probes have succeeded the circuit closes **with a fresh start**: an
//!   empty window and no run of failures; one failed probe opens it again.
//!   A probe dropped before its outcome (its caller gave up), or whose
//!   outcome is not counted (a 429), frees its slot for the next call.
//!
//! # What counts
//!
//! The breaker reads the [`Verdict`] that a classify layer below it left on
//! each outcome (above a retry loop: the last real outcome the loop
//! returns, with its annotations):
//!
//! | outcome | counts as |
//! |---|---|
//! | `Retryable` (a 5xx, timeouts, resets, refused connects) | failure |
//! | a response, `Success` or `Fatal` (404, 400, ...: the host answered) | success |
//! | **throttling**: status 429 (whatever its verdict), a 5xx with a `Retry-After` header, an outcome carrying a [`RetryAfterHint`] (Retry-After, gRPC pushback), the Retry-After gate's own refusal ([`ErrorKind::Throttled`]) | not counted |
//! | an error without a verdict (no classifier below) | failure |
//! | an error with a `Fatal` verdict (cancelled, refused by a local limiter, another breaker's open circuit, a certificate rejected ...) | not counted |
//! | a call dropped before its outcome | not counted |
//!
//! Throttling is not breakage: a host that sheds load with 429s, or asks
//! for a pause with a 503 and a `Retry-After`, is working, and the
//! Retry-After gate, the backoff and the adaptive limit already slow down
//! for it. Counted as failures, a 429 storm opens the circuit, and the
//! open circuit then hides the host's recovery from the adaptive limit
//! (which only grows on successes): each holds the other down. Not counted,
//! a 429 storm never opens it, and once the storm ends the adaptive limit
//! grows back on the successes. A burst of 404s does not open it either.
//!
//! # Defaults, and why
//!
//! **10 consecutive failures**, or a failure ratio of **50 %** over at
//! least **100** calls in **30 s**; a break of **5 s**; one probe when
//! half-open; no growth of the break. Chosen so that errors a retry loop
//! absorbs cannot open the circuit, while a broken host still does, fast.
//! With the breaker above the retry loop (the ready-made client's place)
//! and 3 attempts per request, a host whose attempts fail independently at
//! a rate *p* fails requests at about *p*³: 0.1 → 0.1 %, 0.2 → 0.8 %,
//! 0.5 → 12.5 %.
//!
//! * Ten consecutive failed requests at *p* = 0.5 happen with probability
//!   0.125¹⁰ ≈ 1e-9 per request (at *p* = 0.2, 1e-21).
//! * A 50 % ratio over at least 100 requests, when 12.5 % fail, is about
//!   11 standard deviations away (mean 12.5, σ ≈ 3.3).
//! * A total outage (every answer a 503, every connect refused) opens the
//!   circuit after 10 requests, even when the 30 s window is full of the
//!   earlier successes; the ratio alone would wait for the window to turn
//!   over (about 15 s at a steady rate).
//!
//! These figures assume the retries are made. The client's default
//! [retry budget](crate::retry::RetryBudget) gives back the token of a
//! retry that succeeds, so it refuses none of them while the failed
//! retries stay under its ratio (20 % of requests: *p*² + *p*³ ≤ 0.2, *p*
//! up to about 0.38); past that, refused retries make requests fail at
//! nearer *p*, and such a host is broken enough to trip it.
//!
//! The peers, for comparison (their documented defaults):
//!
//! | | opens on | window | break |
//! |---|---|---|---|
//! | Polly v8 / .NET standard resilience handler | 10 % of ≥ 100 calls | 30 s | 5 s |
//! | Hystrix | 50 % of ≥ 20 requests | 10 s rolling | 5 s sleep window |
//! | resilience4j | 50 % of ≥ 100 calls | the last 100 calls (count-based) | 60 s |
//! | linkerd 2 (`consecutive` failure accrual) | 7 consecutive failures | — | backoff |
//! | Envoy outlier detection | 5 consecutive 5xx | — | 30 s × ejections |
//! | Finagle failure accrual | 5 consecutive failures | — | 5–300 s, jittered backoff |
//!
//! Polly's breaker sits below its retry and counts attempts: at 10 % a
//! host failing exactly one attempt in ten trips it, and the errors the
//! retries absorb become refusals. Hystrix and resilience4j count calls at
//! 50 %; linkerd, Envoy and Finagle open on a run of consecutive failures.
//! rebound takes both kinds of trigger, counted over logical requests.
//!
//! # Where it sits, and its error
//!
//! Above the classify layer, whose verdicts it reads, and in one of two
//! places, which decide what it counts:
//!
//! * **Above the retry loop** (the ready-made client's place, just below
//!   the fallback layer so that a fallback still happens after an open
//!   circuit): it admits **requests** and counts each request's final
//!   outcome, so an attempt the loop then recovers is not a failure. An
//!   open circuit fails the request before the loop, costing neither an
//!   attempt nor the retry budget; a probe is one request, with its
//!   retries. The defaults are meant for this place.
//!
//!   ```text
//!   Fallback ─► CircuitBreaker ─► Retry ─► Backoff ─► RetryAfterGate ─► AdaptiveLimit ─► RetryAfter ─► Classify ─► ...
//!   ```
//! * **Below the retry loop** (as Polly's standard pipeline puts it: retry
//!   → circuit breaker → attempt timeout): it admits and counts
//!   **attempts**, including those the loop recovers. Set its thresholds
//!   for attempts then: at the defaults a run of 10 failed attempts is
//!   three or four requests, and a host whose attempts fail half the time
//!   (which 3 attempts turn into 12.5 % failed requests) reaches the 50 %
//!   ratio. A retry that meets the open circuit stops there (below).
//!
//! Above the adaptive limit in both places, so a call failed at once takes
//! no attempt slot. A request held by a Retry-After gate below it holds its
//! probe slot while it waits, when it is a probe.
//!
//! While a circuit is open a call fails with its own kind,
//! [`ErrorKind::CircuitOpen`], carrying [`Sent::NotSent`], a
//! [`Verdict::Fatal`] (reason `circuit open`), a [`RetryAfterHint`] with the
//! time left in the break (none when the break is over and the probes are
//! in flight) and [`CircuitState::Open`]. Below a retry loop, the loop stops
//! on a fatal verdict before it looks at its attempts or its budget, so
//! the open circuit costs neither: a retryable verdict instead (it is not
//! sent, so any method could be retried) would make the loop spin through
//! its attempts against the open circuit, spending the shared budget that
//! other hosts need. The default classifier also calls this kind fatal, in
//! case a classify layer sits above a breaker. A retry that meets an open
//! circuit (it opened after the first attempt) returns this error carrying
//! the attempt before it as [`PreviousAttempt`]: the last real outcome (its
//! verdict, e.g. `status 503`) is not lost. `Display` names the host (the
//! redacted URL: no userinfo, no query) and when the circuit may
//! close: `circuit open: may close in 4.2s for GET https://api.example/v1`.
//!
//! A caller whose retry met the open circuit gets that error (with its
//! [`Attempts`](crate::Attempts)), not the earlier attempt's response.
//!
//! # Scope and memory
//!
//! By default a circuit is kept per **authority** (scheme, lower-cased
//! host, effective port; never userinfo, path or query); a
//! [`key_fn`](CircuitBreakerConfig::key_fn) picks another scope (a host
//! whatever its port, a path prefix, one circuit for everything).
//! Circuits live in a bounded table of
//! [`max_circuits`](CircuitBreakerConfig::max_circuits) slots (1024 by
//! default, allocated when the layer is built, about 150 bytes each): a
//! client that meets millions of hosts does not grow. A new host takes a
//! free slot among four, else the closed circuit idle the longest; an open
//! circuit is evicted only when all four are open. Keys are keyed hashes;
//! each slot keeps its host's redacted `scheme://host:port` for its log
//! lines.
//!
//! # Happy path
//!
//! A call to a closed circuit costs one hash of the authority (no
//! allocation), an atomic load or two to find its slot and read its state,
//! and, with the outcome, a status compare, one clock read, one
//! compare-and-swap on the current bucket and one atomic load of the run of
//! failures (written only when a run is there to end): no lock, no
//! allocation. Failures also sum the ten buckets. The table's only locks
//! guard each slot's log label, taken when a host first takes a slot and
//! when a circuit changes state.
//!
//! # Observing
//!
//! [`CircuitBreakerLayer::state`] (and [`CircuitBreaker::state`]) tell a
//! host's state. Every state change is an INFO event (`circuit breaker
//! opened`, `half-open`, `closed`) naming the circuit's host and why
//! (`consecutive failures`, `failure ratio reached`, `a probe failed`, ...);
//! with the `metrics` feature it is also counted
//! ([`CIRCUIT_TRANSITIONS`](crate::metrics::CIRCUIT_TRANSITIONS)) and so is
//! each call failed at once
//! ([`CIRCUIT_REJECTED`](crate::metrics::CIRCUIT_REJECTED)).
//!
//! # Limits
//!
//! The outcome is the one of the response head: a body that fails later is
//! not seen. Counts are per bucket up to about a million; past that they
//! saturate.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode, Uri};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{CircuitState, PreviousAttempt, Reason, RetryAfterHint, Sent, Verdict};
use crate::config::{expect_valid, validate_duration};
use crate::error::{BoxError, Error, ErrorKind};
use crate::redact::effective_port;

/// Buckets in the sliding window.
const BUCKETS: usize = 10;
/// Slots a key may take in the table (set-associative).
const WAYS: usize = 4;

// A bucket is one `AtomicU64`: epoch (24 bits, modulo) | failures (20) |
// successes (20), so recording an outcome is one compare-and-swap.
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << 24) - 1;

// A circuit's state is one `AtomicU64`: until (µs since the table's base,
// 62 bits) | state (2 bits), so a reader never sees "open" with a stale
// reopening time.
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
/// Open → half-open in progress (the winner resets the probe counters);
/// treated as open.
const SWITCHING: u64 = 3;

// Half-open bookkeeping, one `AtomicU64`: generation (32) | probes
// admitted (16) | probes succeeded (16). The generation changes on every
// open → half-open, so a probe from an earlier round cannot count.
const PROBE_BITS: u32 = 16;
const PROBE_MASK: u64 = (1 << PROBE_BITS) - 1;

/// A slot's key while it is free, and while it is being taken.
const EMPTY: u64 = 0;
const CLAIMING: u64 = 1;

/// The most probes [`CircuitBreakerConfig::half_open_probes`] accepts.
pub const MAX_HALF_OPEN_PROBES: u32 = PROBE_MASK as u32;
/// The largest [`CircuitBreakerConfig::minimum_throughput`] the window can
/// count.
pub const MAX_MINIMUM_THROUGHPUT: u32 = 1_000_000;

type KeyFn = Arc<dyn Fn(&Uri, &mut DefaultHasher) + Send + Sync>;

// ===== config =====

/// The settings of a [`CircuitBreakerLayer`]; see the [module docs](self).
///
/// Every setter documents its default (chosen so that errors a retry loop
/// absorbs cannot open the circuit: see the module docs' "Defaults, and
/// why"). Values are checked by [`CircuitBreakerLayer::new`] (which
/// panics) or [`CircuitBreakerLayer::try_new`] (which returns an error).
#[derive(Clone)]
pub struct CircuitBreakerConfig {
    /// 0: the consecutive trigger is off.
    consecutive_failures: u32,
    failure_ratio: f64,
    minimum_throughput: u32,
    sampling_duration: Duration,
    break_duration: Duration,
    break_growth: f64,
    /// `None`: the break duration.
    max_break_duration: Option<Duration>,
    half_open_probes: u32,
    max_circuits: usize,
    key_fn: Option<KeyFn>,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        CircuitBreakerConfig {
            consecutive_failures: 10,
            failure_ratio: 0.5,
            minimum_throughput: 100,
            sampling_duration: Duration::from_secs(30),
            break_duration: Duration::from_secs(5),
            break_growth: 1.0,
            max_break_duration: None,
            half_open_probes: 1,
            max_circuits: 1024,
            key_fn: None,
        }
    }
}

impl fmt::Debug for CircuitBreakerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerConfig")
            .field("consecutive_failures", &self.consecutive_failures)
            .field("failure_ratio", &self.failure_ratio)
            .field("minimum_throughput", &self.minimum_throughput)
            .field("sampling_duration", &self.sampling_duration)
            .field("break_duration", &self.break_duration)
            .field("break_growth", &self.break_growth)
            .field("max_break_duration", &self.max_break_duration)
            .field("half_open_probes", &self.half_open_probes)
            .field("max_circuits", &self.max_circuits)
            .field(
                "key",
                &if self.key_fn.is_some() {
                    "custom"
                } else {
                    "authority"
                },
            )
            .finish()
    }
}

impl CircuitBreakerConfig {
    /// The defaults (same as [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Open the circuit after this many failed calls in a row (a success
    /// ends the run; calls that are not counted, such as throttling,
    /// neither end nor extend it); `0` turns this trigger off, leaving the
    /// ratio alone. Default: 10.
    pub fn consecutive_failures(mut self, failures: u32) -> Self {
        self.consecutive_failures = failures;
        self
    }

    /// The share of failed calls in the window at which the circuit opens,
    /// in `(0, 1]`. Default: `0.5` (50 %).
    pub fn failure_ratio(mut self, ratio: f64) -> Self {
        self.failure_ratio = ratio;
        self
    }

    /// The fewest calls in the window for the circuit to open, at least 1
    /// and at most [`MAX_MINIMUM_THROUGHPUT`]. Default: 100.
    pub fn minimum_throughput(mut self, calls: u32) -> Self {
        self.minimum_throughput = calls;
        self
    }

    /// The length of the sliding window, from 1 ms to a day. Default: 30 s.
    pub fn sampling_duration(mut self, d: Duration) -> Self {
        self.sampling_duration = d;
        self
    }

    /// How long the circuit stays open before probes are let through; not
    /// zero, at most a day. Default: 5 s.
    pub fn break_duration(mut self, d: Duration) -> Self {
        self.break_duration = d;
        self
    }

    /// Grow the break while probes keep failing: the `n`-th consecutive
    /// opening breaks for `break_duration × factor^(n-1)`, at most `max`;
    /// the break is back to `break_duration` once the circuit closes.
    /// `factor` at least 1, `max` at least the break duration. Default: no
    /// growth (`1.0`).
    pub fn break_growth(mut self, factor: f64, max: Duration) -> Self {
        self.break_growth = factor;
        self.max_break_duration = Some(max);
        self
    }

    /// Probes let through when half-open, and successes needed to close, in
    /// `1..=65535`. Default: 1.
    pub fn half_open_probes(mut self, probes: u32) -> Self {
        self.half_open_probes = probes;
        self
    }

    /// Slots in the table of circuits (rounded up to a power of two), at
    /// least 1. Default: 1024.
    pub fn max_circuits(mut self, slots: usize) -> Self {
        self.max_circuits = slots;
        self
    }

    /// Key circuits by `f(uri)` instead of by authority: requests whose
    /// keys are equal share a circuit. `|_| ()` makes one circuit for
    /// everything; `|uri| uri.host().map(str::to_owned)` one per host
    /// whatever the port (prefer a key that does not allocate). Default:
    /// scheme, lower-cased host and effective port.
    pub fn key_fn<K, F>(mut self, f: F) -> Self
    where
        K: Hash,
        F: Fn(&Uri) -> K + Send + Sync + 'static,
    {
        self.key_fn = Some(Arc::new(move |uri, h| f(uri).hash(h)));
        self
    }

    /// Check the values.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] naming the first value that cannot work.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::config(format!("CircuitBreakerConfig: {m}")));
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return bad(format!(
                "failure_ratio must be in (0, 1], got {}",
                self.failure_ratio
            ));
        }
        if !(1..=MAX_MINIMUM_THROUGHPUT).contains(&self.minimum_throughput) {
            return bad(format!(
                "minimum_throughput must be in 1..={MAX_MINIMUM_THROUGHPUT}, got {}",
                self.minimum_throughput
            ));
        }
        // The one duration rule (not zero, at most a day), plus a window
        // long enough for its ten buckets.
        validate_duration(
            "CircuitBreakerConfig: sampling_duration",
            self.sampling_duration,
        )?;
        if self.sampling_duration < Duration::from_millis(1) {
            return bad(format!(
                "sampling_duration must be at least 1ms, got {:?}",
                self.sampling_duration
            ));
        }
        validate_duration("CircuitBreakerConfig: break_duration", self.break_duration)?;
        if let Some(max) = self.max_break_duration {
            validate_duration("CircuitBreakerConfig: break_growth max", max)?;
        }
        if !(self.break_growth >= 1.0 && self.break_growth.is_finite()) {
            return bad(format!(
                "break_growth factor must be at least 1, got {}",
                self.break_growth
            ));
        }
        if let Some(max) = self.max_break_duration.filter(|m| *m < self.break_duration) {
            return bad(format!(
                "break_growth max ({max:?}) is shorter than break_duration ({:?})",
                self.break_duration
            ));
        }
        if !(1..=MAX_HALF_OPEN_PROBES).contains(&self.half_open_probes) {
            return bad(format!(
                "half_open_probes must be in 1..={MAX_HALF_OPEN_PROBES}, got {}",
                self.half_open_probes
            ));
        }
        if self.max_circuits == 0 || self.max_circuits > 1 << 24 {
            return bad(format!(
                "max_circuits must be in 1..={}, got {}",
                1 << 24,
                self.max_circuits
            ));
        }
        Ok(())
    }
}

// ===== the table of circuits =====

/// One circuit.
struct Slot {
    key: AtomicU64,
    state: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
    half: AtomicU64,
    /// Failures in a row while closed (the consecutive trigger).
    run: AtomicU32,
    /// Consecutive openings since the circuit last closed.
    breaks: AtomicU32,
    /// `scheme://host:port` of the request that took the slot, for logs.
    label: Mutex<String>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            key: AtomicU64::new(EMPTY),
            state: AtomicU64::new(CLOSED),
            buckets: Default::default(),
            half: AtomicU64::new(0),
            run: AtomicU32::new(0),
            breaks: AtomicU32::new(0),
            label: Mutex::new(String::new()),
        }
    }

    fn label(&self) -> String {
        self.label.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn unpack_bucket(w: u64) -> (u64, u64, u64) {
    (
        w >> (2 * COUNT_BITS),
        (w >> COUNT_BITS) & COUNT_MAX,
        w & COUNT_MAX,
    )
}

fn pack_bucket(epoch: u64, failures: u64, successes: u64) -> u64 {
    ((epoch & EPOCH_MASK) << (2 * COUNT_BITS)) | (failures << COUNT_BITS) | successes
}

fn state_of(word: u64) -> u64 {
    word & 3
}

fn until_of(word: u64) -> u64 {
    word >> 2
}

/// What the call was let through as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admit {
    /// A closed circuit: count the outcome.
    Counted,
    /// A half-open probe of generation `gen`.
    Probe(u32),
    /// No slot could be had (lost every race for one): not counted.
    Untracked,
}

/// What an outcome counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    Success,
    Failure,
    Ignore,
}

/// What `outcome` counts as (see the module docs' "What counts"): a
/// function of the outcome alone.
fn count_of<B>(outcome: &Result<Response<B>, Error>) -> Count {
    match outcome {
        Ok(res) => {
            // Throttling is neither a success nor a failure, whatever the
            // classifier made of it.
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                return Count::Ignore;
            }
            match res.extensions().get::<Verdict>() {
                Some(Verdict::Retryable { .. }) if asks_for_a_pause(res) => Count::Ignore,
                Some(Verdict::Retryable { .. }) => Count::Failure,
                _ => Count::Success,
            }
        }
        Err(err) => {
            // The Retry-After gate's own refusal.
            if err.kind() == ErrorKind::Throttled {
                return Count::Ignore;
            }
            match err.extensions().get::<Verdict>() {
                Some(Verdict::Retryable { .. })
                    if err.extensions().get::<RetryAfterHint>().is_some() =>
                {
                    Count::Ignore
                }
                Some(Verdict::Retryable { .. }) | None => Count::Failure,
                Some(_) => Count::Ignore,
            }
        }
    }
}

/// A failed response that asks for a pause: a hint parsed below (a
/// Retry-After, gRPC pushback), or a 5xx with a `Retry-After` header (even
/// one no layer below parsed).
fn asks_for_a_pause<B>(res: &Response<B>) -> bool {
    res.extensions().get::<RetryAfterHint>().is_some()
        || (res.status().is_server_error() && res.headers().contains_key(RETRY_AFTER))
}

struct Table {
    slots: Box<[Slot]>,
    mask: usize,
    hasher: RandomState,
    key_fn: Option<KeyFn>,
    base: Instant,
    /// Bucket length in µs.
    bucket_us: u64,
    /// 0: off.
    consecutive: u32,
    failure_ratio: f64,
    minimum_throughput: u64,
    break_us: u64,
    break_growth: f64,
    max_break_us: u64,
    probes: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Table {
    fn new(cfg: &CircuitBreakerConfig) -> Self {
        let n = cfg.max_circuits.next_power_of_two();
        Table {
            slots: (0..n).map(|_| Slot::new()).collect(),
            mask: n - 1,
            hasher: RandomState::new(),
            key_fn: cfg.key_fn.clone(),
            base: Instant::now(),
            bucket_us: (micros(cfg.sampling_duration) / BUCKETS as u64).max(1),
            consecutive: cfg.consecutive_failures,
            failure_ratio: cfg.failure_ratio,
            minimum_throughput: u64::from(cfg.minimum_throughput),
            break_us: micros(cfg.break_duration),
            break_growth: cfg.break_growth,
            max_break_us: micros(cfg.max_break_duration.unwrap_or(cfg.break_duration)),
            probes: u64::from(cfg.half_open_probes),
        }
    }

    fn now_us(&self) -> u64 {
        micros(Instant::now().saturating_duration_since(self.base))
    }

    /// The circuit's key; never [`EMPTY`] or [`CLAIMING`].
    fn key(&self, uri: &Uri) -> u64 {
        let mut h = self.hasher.build_hasher();
        match &self.key_fn {
            Some(f) => f(uri, &mut h),
            None => crate::redact::hash_authority(uri, &mut h),
        }
        h.finish().max(CLAIMING + 1)
    }

    fn ways(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = (key >> 7) as usize;
        (0..WAYS.min(self.slots.len())).map(move |i| (start.wrapping_add(i)) & self.mask)
    }

    fn find(&self, key: u64) -> Option<usize> {
        self.ways(key)
            .find(|&i| self.slots[i].key.load(Ordering::Acquire) == key)
    }

    /// The slot of `key`, taking one if it has none.
    fn slot_for(&self, key: u64, uri: &Uri) -> Option<usize> {
        if let Some(i) = self.find(key) {
            return Some(i);
        }
        self.claim(key, uri)
    }

    fn claim(&self, key: u64, uri: &Uri) -> Option<usize> {
        for i in self.ways(key) {
            if self.slots[i]
                .key
                .compare_exchange(EMPTY, CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.init(i, key, uri);
                return Some(i);
            }
        }
        // Evict: the closed circuit idle the longest, else the open one
        // whose break ends soonest.
        let now = self.now_us();
        let epoch = (now / self.bucket_us) & EPOCH_MASK;
        let mut victim: Option<(usize, u64, (bool, u64))> = None;
        for i in self.ways(key) {
            let slot = &self.slots[i];
            let k = slot.key.load(Ordering::Acquire);
            if k == CLAIMING {
                continue;
            }
            let word = slot.state.load(Ordering::Acquire);
            let rank = if state_of(word) == CLOSED {
                let idle = slot
                    .buckets
                    .iter()
                    .map(|b| {
                        epoch.wrapping_sub(unpack_bucket(b.load(Ordering::Relaxed)).0) & EPOCH_MASK
                    })
                    .min()
                    .unwrap_or(0);
                (true, idle)
            } else {
                (false, u64::MAX - until_of(word))
            };
            if victim.is_none_or(|(_, _, r)| rank > r) {
                victim = Some((i, k, rank));
            }
        }
        let (i, k, _) = victim?;
        self.slots[i]
            .key
            .compare_exchange(k, CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        self.init(i, key, uri);
        Some(i)
    }

    fn init(&self, i: usize, key: u64, uri: &Uri) {
        let slot = &self.slots[i];
        for b in &slot.buckets {
            b.store(0, Ordering::Relaxed);
        }
        slot.state.store(CLOSED, Ordering::Relaxed);
        // A new generation: probes of the slot's previous circuit no longer
        // count.
        let gen = (slot.half.load(Ordering::Relaxed) >> 32).wrapping_add(1);
        slot.half.store(gen << 32, Ordering::Relaxed);
        slot.run.store(0, Ordering::Relaxed);
        slot.breaks.store(0, Ordering::Relaxed);
        {
            let mut label = slot.label.lock().unwrap_or_else(|p| p.into_inner());
            label.clear();
            use std::fmt::Write as _;
            let _ = match (uri.scheme_str(), uri.host()) {
                (Some(s), Some(h)) => write!(label, "{s}://{h}"),
                (None, Some(h)) => write!(label, "{h}"),
                _ => write!(label, "(no authority)"),
            };
            if let (Some(_), Some(port)) = (uri.host(), effective_port(uri)) {
                let _ = write!(label, ":{port}");
            }
        }
        slot.key.store(key, Ordering::Release);
    }

    /// Let a call through, or say until when the circuit is open.
    fn admit(&self, i: usize) -> Result<Admit, u64> {
        let slot = &self.slots[i];
        let word = slot.state.load(Ordering::Acquire);
        match state_of(word) {
            CLOSED => Ok(Admit::Counted),
            OPEN => {
                let now = self.now_us();
                if now < until_of(word) {
                    return Err(until_of(word));
                }
                // The break is over: the first to switch opens the probes.
                let switching = (until_of(word) << 2) | SWITCHING;
                if slot
                    .state
                    .compare_exchange(word, switching, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let gen = (slot.half.load(Ordering::Relaxed) >> 32).wrapping_add(1);
                    slot.half.store(gen << 32, Ordering::Release);
                    slot.state
                        .store((until_of(word) << 2) | HALF_OPEN, Ordering::Release);
                    self.transition(slot, CircuitState::HalfOpen, "the break is over");
                }
                self.probe(i)
            }
            HALF_OPEN => self.probe(i),
            _ => Err(until_of(word)),
        }
    }

    /// Take a probe slot if one is free.
    fn probe(&self, i: usize) -> Result<Admit, u64> {
        let slot = &self.slots[i];
        let word = slot.state.load(Ordering::Acquire);
        if state_of(word) != HALF_OPEN {
            return Err(until_of(word));
        }
        let probes = self.probes;
        let taken = slot
            .half
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                let admitted = (h >> PROBE_BITS) & PROBE_MASK;
                (admitted < probes).then_some(h + (1 << PROBE_BITS))
            });
        match taken {
            Ok(h) => {
                let gen = (h >> 32) as u32;
                // The round may have ended while we took the slot.
                if state_of(slot.state.load(Ordering::Acquire)) != HALF_OPEN {
                    self.release(i, gen);
                    return Err(until_of(word));
                }
                Ok(Admit::Probe(gen))
            }
            // Every probe slot is taken: fail at once like an open circuit.
            Err(_) => Err(until_of(word)),
        }
    }

    /// A probe of generation `gen` ended without an outcome that counts.
    fn release(&self, i: usize, gen: u32) {
        let _ = self.slots[i]
            .half
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                let admitted = (h >> PROBE_BITS) & PROBE_MASK;
                ((h >> 32) as u32 == gen && admitted > 0).then(|| h - (1 << PROBE_BITS))
            });
    }

    fn break_for(&self, breaks: u32) -> u64 {
        if self.break_growth == 1.0 || breaks == 0 {
            return self.break_us;
        }
        let grown = self.break_us as f64 * self.break_growth.powi(breaks.min(1000) as i32);
        if grown >= self.max_break_us as f64 {
            self.max_break_us
        } else {
            grown as u64
        }
    }

    /// Open the circuit whose state word was `expected`.
    fn open(&self, slot: &Slot, expected: u64, now: u64, why: &'static str) {
        let breaks = slot.breaks.load(Ordering::Acquire);
        let until = now
            .saturating_add(self.break_for(breaks))
            .min(u64::MAX >> 2);
        if slot
            .state
            .compare_exchange(
                expected,
                (until << 2) | OPEN,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            slot.breaks.fetch_add(1, Ordering::AcqRel);
            tracing::info!(
                circuit = %slot.label(),
                state = "open",
                reason = why,
                break_ms = (until - now) / 1000,
                "circuit breaker opened"
            );
            #[cfg(feature = "metrics")]
            crate::metrics::record_circuit_transition(CircuitState::Open);
        }
    }

    fn transition(&self, slot: &Slot, to: CircuitState, why: &'static str) {
        tracing::info!(
            circuit = %slot.label(),
            state = to.as_str(),
            reason = why,
            "circuit breaker {}",
            match to {
                CircuitState::Closed => "closed",
                CircuitState::Open => "opened",
                CircuitState::HalfOpen => "half-open",
            }
        );
        #[cfg(feature = "metrics")]
        crate::metrics::record_circuit_transition(to);
    }

    /// The outcome of a call let through as `admit` by slot `i` for `key`.
    fn finish(&self, i: usize, key: u64, admit: Admit, count: Count) {
        let slot = &self.slots[i];
        if slot.key.load(Ordering::Acquire) != key {
            // The slot went to another host meanwhile.
            return;
        }
        match admit {
            Admit::Untracked => {}
            Admit::Counted => {
                if count == Count::Ignore {
                    return;
                }
                let word = slot.state.load(Ordering::Acquire);
                if state_of(word) != CLOSED {
                    return;
                }
                let now = self.now_us();
                let failure = count == Count::Failure;
                self.record(slot, now, failure);
                if failure {
                    if self.consecutive != 0 {
                        let run = slot.run.fetch_add(1, Ordering::AcqRel).saturating_add(1);
                        if run >= self.consecutive {
                            self.open(slot, word, now, "consecutive failures");
                            return;
                        }
                    }
                    let (failures, calls) = self.window(slot, now);
                    if calls >= self.minimum_throughput
                        && failures as f64 >= self.failure_ratio * calls as f64
                    {
                        self.open(slot, word, now, "failure ratio reached");
                    }
                } else if slot.run.load(Ordering::Relaxed) != 0 {
                    // A success ends the run; written only when there is
                    // one, so the happy path stores nothing here.
                    slot.run.store(0, Ordering::Relaxed);
                }
            }
            Admit::Probe(gen) => match count {
                Count::Ignore => self.release(i, gen),
                Count::Failure => {
                    let word = slot.state.load(Ordering::Acquire);
                    let current = (slot.half.load(Ordering::Acquire) >> 32) as u32;
                    if state_of(word) == HALF_OPEN && current == gen {
                        self.open(slot, word, self.now_us(), "a probe failed");
                    }
                }
                Count::Success => {
                    let probes = self.probes;
                    let after = slot
                        .half
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                            ((h >> 32) as u32 == gen).then(|| h + 1)
                        });
                    let Ok(before) = after else { return };
                    if (before & PROBE_MASK) + 1 < probes {
                        return;
                    }
                    let word = slot.state.load(Ordering::Acquire);
                    if state_of(word) == HALF_OPEN
                        && slot
                            .state
                            .compare_exchange(word, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    {
                        // A fresh start: an empty window, no run of failures.
                        for b in &slot.buckets {
                            b.store(0, Ordering::Relaxed);
                        }
                        slot.run.store(0, Ordering::Relaxed);
                        slot.breaks.store(0, Ordering::Release);
                        self.transition(slot, CircuitState::Closed, "the probes succeeded");
                    }
                }
            },
        }
    }

    fn record(&self, slot: &Slot, now: u64, failure: bool) {
        let tick = now / self.bucket_us;
        let epoch = tick & EPOCH_MASK;
        let bucket = &slot.buckets[(tick % BUCKETS as u64) as usize];
        let _ = bucket.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
            let (e, f, s) = unpack_bucket(w);
            let (f, s) = if e == epoch { (f, s) } else { (0, 0) };
            Some(if failure {
                pack_bucket(epoch, (f + 1).min(COUNT_MAX), s)
            } else {
                pack_bucket(epoch, f, (s + 1).min(COUNT_MAX))
            })
        });
    }

    /// (failures, calls) in the window ending now.
    fn window(&self, slot: &Slot, now: u64) -> (u64, u64) {
        let epoch = (now / self.bucket_us) & EPOCH_MASK;
        slot.buckets.iter().fold((0, 0), |(fs, calls), b| {
            let (e, f, s) = unpack_bucket(b.load(Ordering::Acquire));
            if epoch.wrapping_sub(e) & EPOCH_MASK < BUCKETS as u64 {
                (fs + f, calls + f + s)
            } else {
                (fs, calls)
            }
        })
    }

    fn state(&self, uri: &Uri) -> CircuitState {
        let Some(i) = self.find(self.key(uri)) else {
            return CircuitState::Closed;
        };
        let word = self.slots[i].state.load(Ordering::Acquire);
        match state_of(word) {
            CLOSED => CircuitState::Closed,
            OPEN if self.now_us() >= until_of(word) => CircuitState::HalfOpen,
            HALF_OPEN => CircuitState::HalfOpen,
            _ => CircuitState::Open,
        }
    }
}

// ===== layer =====

/// Fails calls to a host that keeps failing at once, for a while.
///
/// See the [module docs](self) for an example, the states and where it
/// sits.
///
/// # Clone
///
/// Clones of the layer, and every service it makes, share the table of
/// circuits: a host that opened its circuit through one clone is open for
/// all.
#[derive(Clone)]
pub struct CircuitBreakerLayer {
    table: Arc<Table>,
}

impl CircuitBreakerLayer {
    /// A breaker with `config`.
    ///
    /// # Panics
    ///
    /// If a value cannot work (see [`CircuitBreakerConfig::validate`]), with
    /// a message naming it. Use [`try_new`](Self::try_new) for values from
    /// configuration.
    #[track_caller]
    pub fn new(config: CircuitBreakerConfig) -> Self {
        expect_valid("CircuitBreakerLayer::new", Self::try_new(config))
    }

    /// A breaker with `config`, checked.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] naming the first value that cannot work.
    pub fn try_new(config: CircuitBreakerConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(CircuitBreakerLayer {
            table: Arc::new(Table::new(&config)),
        })
    }

    /// The state of the circuit `uri` belongs to (`Closed` for one never
    /// seen). An open circuit whose break is over is reported `HalfOpen`:
    /// the next call will probe.
    pub fn state(&self, uri: &Uri) -> CircuitState {
        self.table.state(uri)
    }
}

impl Default for CircuitBreakerLayer {
    /// A breaker with the defaults of [`CircuitBreakerConfig`].
    fn default() -> Self {
        Self::new(CircuitBreakerConfig::default())
    }
}

impl fmt::Debug for CircuitBreakerLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("slots", &self.table.slots.len())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for CircuitBreakerLayer {
    type Service = CircuitBreaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker {
            inner,
            table: self.table.clone(),
        }
    }
}

// ===== service =====

/// The service of [`CircuitBreakerLayer`].
///
/// See the [module docs](self).
///
/// # Errors
///
/// [`ErrorKind::CircuitOpen`] while the request's circuit is open (not
/// sent; see the module docs); errors of the inner service turned into
/// [`Error`] with [`Error::from_boxed`].
///
/// # Clone
///
/// Clones share the table of circuits.
#[derive(Clone)]
pub struct CircuitBreaker<S> {
    inner: S,
    table: Arc<Table>,
}

impl<S: fmt::Debug> fmt::Debug for CircuitBreaker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> CircuitBreaker<S> {
    /// The state of the circuit `uri` belongs to; see
    /// [`CircuitBreakerLayer::state`].
    pub fn state(&self, uri: &Uri) -> CircuitState {
        self.table.state(uri)
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

fn open_error<B>(req: &Request<B>, table: &Table, until: u64) -> Error {
    let left = Duration::from_micros(until.saturating_sub(table.now_us()));
    // Rounded up to the millisecond, so "5s" reads as 5s.
    let left = Duration::from_millis(u64::try_from(left.as_micros().div_ceil(1000)).unwrap_or(0));
    let detail = if left.is_zero() {
        "probes in flight".to_owned()
    } else {
        format!("may close in {left:?}")
    };
    let mut err = Error::new(ErrorKind::CircuitOpen)
        .with_owned_detail(detail)
        .with_request(req.method(), req.uri());
    let ext = err.extensions_mut();
    ext.insert(Sent::NotSent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("circuit open"),
    });
    if !left.is_zero() {
        ext.insert(RetryAfterHint(left));
    }
    ext.insert(CircuitState::Open);
    // A retry that meets the open circuit: the last real outcome (DESIGN
    // §4) is the previous attempt's, so the error says what it was.
    if let Some(previous) = req.extensions().get::<PreviousAttempt>() {
        ext.insert(previous.clone());
    }
    #[cfg(feature = "metrics")]
    crate::metrics::record_circuit_rejected();
    err
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for CircuitBreaker<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let table = &self.table;
        let key = table.key(req.uri());
        let (slot, admit) = match table.slot_for(key, req.uri()) {
            None => (0, Ok(Admit::Untracked)),
            Some(i) => (i, table.admit(i)),
        };
        match admit {
            Ok(admit) => future::ResponseFuture::called(
                self.inner.call(req),
                future::Track {
                    table: self.table.clone(),
                    slot,
                    key,
                    admit,
                },
            ),
            Err(until) => future::ResponseFuture::rejected(open_error(&req, table, until)),
        }
    }
}

pub mod future {
    //! The response future of [`CircuitBreaker`].

    use super::*;

    /// What the future reports back to its circuit. A probe dropped before
    /// its outcome frees its slot.
    pub(crate) struct Track {
        pub(super) table: Arc<Table>,
        pub(super) slot: usize,
        pub(super) key: u64,
        pub(super) admit: Admit,
    }

    impl Track {
        pub(super) fn finish(mut self, count: Count) {
            let admit = std::mem::replace(&mut self.admit, Admit::Untracked);
            self.table.finish(self.slot, self.key, admit, count);
        }
    }

    impl Drop for Track {
        fn drop(&mut self) {
            if let Admit::Probe(gen) = self.admit {
                if self.table.slots[self.slot].key.load(Ordering::Acquire) == self.key {
                    self.table.release(self.slot, gen);
                }
            }
        }
    }

    pin_project! {
        /// The response future of [`CircuitBreaker`](super::CircuitBreaker):
        /// the inner call, whose outcome it counts, or the open circuit's
        /// error.
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            kind: Kind<F>,
            track: Option<Track>,
        }
    }

    pin_project! {
        #[project = KindProj]
        enum Kind<F> {
            Called {
                #[pin]
                fut: F,
            },
            Rejected {
                error: Option<Error>,
            },
        }
    }

    impl<F> ResponseFuture<F> {
        pub(super) fn called(fut: F, track: Track) -> Self {
            ResponseFuture {
                kind: Kind::Called { fut },
                track: Some(track),
            }
        }

        pub(super) fn rejected(error: Error) -> Self {
            ResponseFuture {
                kind: Kind::Rejected { error: Some(error) },
                track: None,
            }
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let kind = match &self.kind {
                Kind::Called { .. } => "called",
                Kind::Rejected { .. } => "rejected",
            };
            f.debug_struct("ResponseFuture")
                .field("kind", &kind)
                .finish()
        }
    }

    impl<F, B, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<B>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            match this.kind.project() {
                KindProj::Called { fut } => {
                    let outcome = ready!(fut.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
                    if let Some(track) = this.track.take() {
                        track.finish(count_of(&outcome));
                    }
                    Poll::Ready(outcome)
                }
                KindProj::Rejected { error } => {
                    Poll::Ready(Err(error.take().expect("polled after completion")))
                }
            }
        }
    }
}

// ===== the breaker's engine, for the whole-stack service =====

#[cfg(feature = "stack")]
impl CircuitBreakerLayer {
    /// Let `req` through its circuit, or the open circuit's error (not
    /// sent): what [`CircuitBreaker::call`] decides.
    pub(crate) fn admit<B>(&self, req: &Request<B>) -> Result<future::Track, Error> {
        let table = &self.table;
        let key = table.key(req.uri());
        let (slot, admit) = match table.slot_for(key, req.uri()) {
            None => (0, Ok(Admit::Untracked)),
            Some(i) => (i, table.admit(i)),
        };
        match admit {
            Ok(admit) => Ok(future::Track {
                table: self.table.clone(),
                slot,
                key,
                admit,
            }),
            Err(until) => Err(open_error(req, table, until)),
        }
    }
}

#[cfg(feature = "stack")]
impl future::Track {
    /// Count `out` for the circuit (see the module docs for what counts).
    pub(crate) fn settle<B>(self, out: &Result<Response<B>, Error>) {
        self.finish(count_of(out));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_packing() {
        let w = pack_bucket((1 << 24) + 5, 7, COUNT_MAX);
        assert_eq!(unpack_bucket(w), (5, 7, COUNT_MAX));
    }

    #[test]
    fn config_rejects_what_cannot_work() {
        let c = CircuitBreakerConfig::default;
        for (cfg, name) in [
            (c().failure_ratio(0.0), "failure_ratio"),
            (c().failure_ratio(1.5), "failure_ratio"),
            (c().failure_ratio(f64::NAN), "failure_ratio"),
            (c().minimum_throughput(0), "minimum_throughput"),
            (c().sampling_duration(Duration::ZERO), "sampling_duration"),
            (c().break_duration(Duration::ZERO), "break_duration"),
            (
                c().break_duration(Duration::from_secs(2 * 86_400)),
                "break_duration",
            ),
            (
                c().sampling_duration(Duration::from_micros(10)),
                "sampling_duration",
            ),
            (c().half_open_probes(0), "half_open_probes"),
            (c().max_circuits(0), "max_circuits"),
            (
                c().break_growth(0.5, Duration::from_secs(60)),
                "break_growth",
            ),
            (
                c().break_growth(2.0, Duration::from_secs(1)),
                "break_growth",
            ),
        ] {
            let err = CircuitBreakerLayer::try_new(cfg.clone()).unwrap_err();
            assert!(err.is_config(), "{err}");
            assert!(err.to_string().contains(name), "{err}");
            let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                CircuitBreakerLayer::new(cfg)
            }))
            .unwrap_err();
            let msg = panic.downcast_ref::<String>().unwrap();
            assert!(msg.contains(name), "{msg}");
        }
        assert!(CircuitBreakerLayer::try_new(c().failure_ratio(1.0)).is_ok());
        assert!(CircuitBreakerLayer::try_new(c()).is_ok());
    }

    #[test]
    fn break_grows_to_its_cap() {
        let cfg = CircuitBreakerConfig::default()
            .break_duration(Duration::from_secs(1))
            .break_growth(2.0, Duration::from_secs(5));
        let t = Table::new(&cfg);
        let s: Vec<u64> = (0..5).map(|n| t.break_for(n) / 1_000_000).collect();
        assert_eq!(s, [1, 2, 4, 5, 5]);
    }

    #[test]
    fn keys_by_authority() {
        let t = Table::new(&CircuitBreakerConfig::default());
        let k = |s: &str| t.key(&s.parse().unwrap());
        assert_eq!(
            k("https://API.example/a?x=1"),
            k("https://api.example:443/b")
        );
        assert_eq!(k("https://u:p@api.example/"), k("https://api.example/"));
        assert_ne!(k("https://api.example/"), k("http://api.example/"));
        assert_ne!(k("https://api.example/"), k("https://api.example:8443/"));
        assert_ne!(k("https://a.example/"), k("https://b.example/"));
    }
}
