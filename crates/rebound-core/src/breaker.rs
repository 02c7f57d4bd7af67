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
//! * **Closed**: calls go through and their outcomes are counted (from a
//!   host's first failure on: see [the host table](#the-host-table)). The
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
//! Circuits live in the entries of a bounded [host table](crate::host):
//! the breaker's own, of
//! [`max_circuits`](CircuitBreakerConfig::max_circuits) entries (1024 by
//! default, allocated when the layer is built, about 180 bytes each), or
//! one it [shares](CircuitBreakerLayer::shared) with a Retry-After gate, so
//! that a host's gate and circuit are one entry (the ready-made client
//! does this). A client that meets millions of hosts does not grow. A host
//! that needs an entry takes a free one among four, else one not in use,
//! else the closed circuit due for release soonest; an open circuit is
//! evicted only when all four are open. Keys are keyed hashes; each entry
//! keeps its host's redacted `scheme://host:port` for its log lines.
//!
//! # The host table
//!
//! A host gets an entry on its **first counted failure**, not before: a
//! host that never fails costs the table nothing. An entry is in use while
//! a failure is in the window, the circuit is not closed, or (in a shared
//! table) the host's gate is closed; once none is left it is released, and
//! the table returns to empty after a blip. While the table has no entry
//! in use it is **idle**, and a call neither hashes its host nor records
//! its outcome anywhere (see "Happy path"). Compared with a breaker that
//! records every call, this changes three things:
//!
//! * **The ratio window starts at the first failure** when the table was
//!   idle: the successes just before it were not recorded. From then on
//!   (and for every host, while any entry of the table is in use) every
//!   call is counted, so the ratio is exact over what follows, and the
//!   [`minimum_throughput`](CircuitBreakerConfig::minimum_throughput)
//!   (100 calls by default) still guards it: a burst of failures after a
//!   quiet success streak needs that many calls in the window before the
//!   ratio can open the circuit. (So the ratio can only be higher than
//!   over every call, never lower.)
//! * **The consecutive trigger is exact**: a success is only unrecorded
//!   while the table is idle, when no failure is in the host's window, so
//!   no run is there to end.
//! * **A run is forgotten once its failures have left the window**
//!   ([`sampling_duration`](CircuitBreakerConfig::sampling_duration)
//!   without a failure), with the entry: failures further apart than that,
//!   with nothing in between, are not "in a row".
//!
//! # Happy path
//!
//! While no host of the table is failing, broken or throttled, a call
//! costs one atomic load of the table's count of entries in use, and, with
//! the outcome, a look at its status and verdict and that load again: no
//! hash, no lookup,
//! no clock read, no write, no lock. The whole-stack service
//! ([`stack`](crate::stack)) keeps the request's URI, so its breaker keys
//! a host only when the outcome needs it; the standalone layer's response
//! future keeps the URI's scheme and authority for that (a reference
//! count, no allocation), and computes a [`key_fn`](CircuitBreakerConfig::key_fn)
//! key at the call. While the table is in use, a call hashes its host once
//! (shared with a gate over the same table in the whole-stack service),
//! reads its entry's state, and records its outcome with one clock read
//! and one compare-and-swap on the current bucket; failures also sum the
//! ten buckets. The table's only locks guard each entry's log label, taken
//! when a host first takes an entry and when a circuit changes state.
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

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode, Uri};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{CircuitState, PreviousAttempt, Reason, RetryAfterHint, Sent, Verdict};
use crate::config::{expect_valid, validate_duration};
use crate::error::{BoxError, Error, ErrorKind};
use crate::host::{
    state_of, until_of, Circuit, HostOwned, HostRef, HostTable, BUCKETS, CLOSED, HALF_OPEN, OPEN,
    SWITCHING,
};

// A bucket is one `AtomicU64`: epoch (24 bits, modulo) | failures (20) |
// successes (20), so recording an outcome is one compare-and-swap.
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << 24) - 1;

// Half-open bookkeeping, one `AtomicU64`: generation (32) | probes
// admitted (16) | probes succeeded (16). The generation changes on every
// open → half-open, so a probe from an earlier round cannot count.
const PROBE_BITS: u32 = 16;
const PROBE_MASK: u64 = (1 << PROBE_BITS) - 1;

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

    /// Entries in the breaker's own [host table](crate::host), from 1 to
    /// 2²⁴ (a breaker [over a shared table](CircuitBreakerLayer::shared)
    /// uses that table's size instead). Default: 1024.
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

// ===== the circuits, in the host table =====

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

/// What the call was let through as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admit {
    /// A closed circuit (or none yet): count the outcome.
    Counted,
    /// A half-open probe of generation `gen`.
    Probe(u32),
    /// Its outcome is counted already (or never will be).
    Done,
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
            // The Retry-After gate's own refusal, the pacer's.
            if matches!(err.kind(), ErrorKind::Throttled | ErrorKind::QuotaExhausted) {
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

/// How a call was let through: the entry it met (if the table was in
/// use and its host had one), its key (if computed), and the admission,
/// or until when its circuit is open.
struct Admission {
    slot: Option<usize>,
    key: Option<u64>,
    admit: Result<Admit, u64>,
}

/// A breaker: its settings, and the host table that keeps its circuits.
struct Breaker {
    table: Arc<HostTable>,
    key_fn: Option<KeyFn>,
    /// Bucket length in ns.
    bucket_ns: u64,
    /// 0: off.
    consecutive: u32,
    failure_ratio: f64,
    minimum_throughput: u64,
    break_ns: u64,
    break_growth: f64,
    max_break_ns: u64,
    probes: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Breaker {
    fn new(cfg: &CircuitBreakerConfig, table: Arc<HostTable>) -> Self {
        Breaker {
            table,
            key_fn: cfg.key_fn.clone(),
            bucket_ns: (nanos(cfg.sampling_duration) / BUCKETS as u64).max(1),
            consecutive: cfg.consecutive_failures,
            failure_ratio: cfg.failure_ratio,
            minimum_throughput: u64::from(cfg.minimum_throughput),
            break_ns: nanos(cfg.break_duration),
            break_growth: cfg.break_growth,
            max_break_ns: nanos(cfg.max_break_duration.unwrap_or(cfg.break_duration)),
            probes: u64::from(cfg.half_open_probes),
        }
    }

    /// The circuit's key; never the table's `EMPTY` or `CLAIMING`.
    fn key(&self, uri: &Uri) -> u64 {
        self.key_in(uri, &mut None)
    }

    /// The circuit's key; the authority's key comes from (or goes into)
    /// `cell`, so a request hashes its authority once for the gate and the
    /// breaker.
    fn key_in(&self, uri: &Uri, cell: &mut Option<u64>) -> u64 {
        match &self.key_fn {
            Some(f) => {
                let mut h = crate::host::hasher();
                f(uri, &mut h);
                crate::host::finish(h)
            }
            None => crate::host::authority_key(uri, cell),
        }
    }

    fn circuit(&self, i: usize) -> &Circuit {
        &self.table.entry(i).circuit
    }

    /// Let a call through circuit `i`, or say until when it is open.
    fn admit(&self, i: usize) -> Result<Admit, u64> {
        let c = self.circuit(i);
        let word = c.state.load(Ordering::Acquire);
        match state_of(word) {
            CLOSED => Ok(Admit::Counted),
            OPEN => {
                let now = self.table.now();
                if now < until_of(word) {
                    return Err(until_of(word));
                }
                // The break is over: the first to switch opens the probes.
                let switching = (until_of(word) << 2) | SWITCHING;
                if c.state
                    .compare_exchange(word, switching, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let gen = (c.half.load(Ordering::Relaxed) >> 32).wrapping_add(1);
                    c.half.store(gen << 32, Ordering::Release);
                    c.state
                        .store((until_of(word) << 2) | HALF_OPEN, Ordering::Release);
                    self.transition(i, CircuitState::HalfOpen, "the break is over");
                }
                self.probe(i)
            }
            HALF_OPEN => self.probe(i),
            _ => Err(until_of(word)),
        }
    }

    /// Take a probe slot if one is free.
    fn probe(&self, i: usize) -> Result<Admit, u64> {
        let c = self.circuit(i);
        let word = c.state.load(Ordering::Acquire);
        if state_of(word) != HALF_OPEN {
            return Err(until_of(word));
        }
        let probes = self.probes;
        let taken = c
            .half
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                let admitted = (h >> PROBE_BITS) & PROBE_MASK;
                (admitted < probes).then_some(h + (1 << PROBE_BITS))
            });
        match taken {
            Ok(h) => {
                let gen = (h >> 32) as u32;
                // The round may have ended while we took the slot.
                if state_of(c.state.load(Ordering::Acquire)) != HALF_OPEN {
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
        let _ = self
            .circuit(i)
            .half
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                let admitted = (h >> PROBE_BITS) & PROBE_MASK;
                ((h >> 32) as u32 == gen && admitted > 0).then(|| h - (1 << PROBE_BITS))
            });
    }

    fn break_for(&self, breaks: u32) -> u64 {
        if self.break_growth == 1.0 || breaks == 0 {
            return self.break_ns;
        }
        let grown = self.break_ns as f64 * self.break_growth.powi(breaks.min(1000) as i32);
        if grown >= self.max_break_ns as f64 {
            self.max_break_ns
        } else {
            grown as u64
        }
    }

    /// Open circuit `i`, whose state word was `expected`.
    fn open(&self, i: usize, expected: u64, now: u64, why: &'static str) {
        let c = self.circuit(i);
        let breaks = c.breaks.load(Ordering::Acquire);
        let until = now
            .saturating_add(self.break_for(breaks))
            .min(u64::MAX >> 2);
        if c.state
            .compare_exchange(
                expected,
                (until << 2) | OPEN,
                Ordering::SeqCst,
                Ordering::Acquire,
            )
            .is_ok()
        {
            c.breaks.fetch_add(1, Ordering::AcqRel);
            tracing::info!(
                circuit = %self.table.entry(i).label(),
                state = "open",
                reason = why,
                break_ms = (until - now) / 1_000_000,
                "circuit breaker opened"
            );
            #[cfg(feature = "metrics")]
            {
                crate::metrics::record_circuit_transition(CircuitState::Open);
                if state_of(expected) == CLOSED {
                    crate::metrics::record_circuit_opened();
                }
            }
        }
    }

    fn transition(&self, i: usize, to: CircuitState, why: &'static str) {
        tracing::info!(
            circuit = %self.table.entry(i).label(),
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
        {
            crate::metrics::record_circuit_transition(to);
            // Closed only ever from half-open (the probes succeeded).
            if to == CircuitState::Closed {
                crate::metrics::record_circuit_closed();
            }
        }
    }

    /// The outcome `count` of a call let through as `admit` by entry
    /// `slot` (found when the call was admitted) for `key` (if computed
    /// then). A call admitted by no entry gets one on a failure — its key
    /// from `later_key`, its name from `host` — and records a success only
    /// while the table is in use (see the module docs).
    fn finish(
        &self,
        slot: Option<usize>,
        key: Option<u64>,
        admit: Admit,
        count: Count,
        host: Option<HostRef<'_>>,
        later_key: impl FnOnce() -> Option<u64>,
    ) {
        let table = &*self.table;
        // The entry the call was admitted by, if it is still that host's.
        let known = match (slot, key) {
            (Some(i), Some(k)) if table.entry(i).key.load(Ordering::Acquire) == k => Some(i),
            _ => None,
        };
        match admit {
            Admit::Done => {}
            Admit::Counted => {
                let failure = match count {
                    Count::Ignore => return,
                    Count::Success => false,
                    Count::Failure => true,
                };
                let i = match known {
                    Some(i) => i,
                    // Happy path: an idle table, a success: nothing to do.
                    None if !failure && table.is_empty() => return,
                    None => {
                        let Some(key) = key.or_else(later_key) else {
                            return;
                        };
                        // A success never evicts an entry in use.
                        match table.find(key).or_else(|| table.claim(key, host, failure)) {
                            Some(i) => i,
                            None => return,
                        }
                    }
                };
                self.count(i, failure, host);
            }
            Admit::Probe(gen) => {
                let Some(i) = known else { return };
                let c = self.circuit(i);
                match count {
                    Count::Ignore => self.release(i, gen),
                    Count::Failure => {
                        let word = c.state.load(Ordering::Acquire);
                        let current = (c.half.load(Ordering::Acquire) >> 32) as u32;
                        if state_of(word) == HALF_OPEN && current == gen {
                            self.open(i, word, table.now(), "a probe failed");
                        }
                    }
                    Count::Success => {
                        let probes = self.probes;
                        let after = c
                            .half
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                                ((h >> 32) as u32 == gen).then(|| h + 1)
                            });
                        let Ok(before) = after else { return };
                        if (before & PROBE_MASK) + 1 < probes {
                            return;
                        }
                        let word = c.state.load(Ordering::Acquire);
                        if state_of(word) == HALF_OPEN
                            && c.state
                                .compare_exchange(word, CLOSED, Ordering::SeqCst, Ordering::Acquire)
                                .is_ok()
                        {
                            // A fresh start: an empty window, no run of
                            // failures; nothing left to keep the entry.
                            for b in &c.buckets {
                                b.store(0, Ordering::Relaxed);
                            }
                            c.run.store(0, Ordering::Relaxed);
                            c.breaks.store(0, Ordering::Release);
                            c.fail_until.store(0, Ordering::SeqCst);
                            self.transition(i, CircuitState::Closed, "the probes succeeded");
                            table.release_if_idle(i, table.now());
                        }
                    }
                }
            }
        }
    }

    /// Count a closed circuit's call: the window, the run, the triggers;
    /// the entry is in use while a failure is in the window.
    fn count(&self, i: usize, failure: bool, host: Option<HostRef<'_>>) {
        let table = &*self.table;
        let c = self.circuit(i);
        let word = c.state.load(Ordering::Acquire);
        if state_of(word) != CLOSED {
            return;
        }
        let now = table.now();
        self.record(c, now, failure);
        if failure {
            table.name(i, host);
            // When this failure leaves the window.
            let leaves = (now / self.bucket_ns + BUCKETS as u64).saturating_mul(self.bucket_ns);
            c.fail_until.fetch_max(leaves, Ordering::SeqCst);
            table.mark_live(i);
            let (failures, calls) = self.window(c, now);
            if self.consecutive != 0 {
                // A run ends with a success, and is forgotten once its
                // failures have left the window (with the entry).
                let run = if failures <= 1 {
                    c.run.store(1, Ordering::Relaxed);
                    1
                } else {
                    c.run.fetch_add(1, Ordering::AcqRel).saturating_add(1)
                };
                if run >= self.consecutive {
                    self.open(i, word, now, "consecutive failures");
                    table.maybe_sweep(now);
                    return;
                }
            }
            if calls >= self.minimum_throughput
                && failures as f64 >= self.failure_ratio * calls as f64
            {
                self.open(i, word, now, "failure ratio reached");
            }
        } else {
            if c.run.load(Ordering::Relaxed) != 0 {
                // A success ends the run; written only when there is one.
                c.run.store(0, Ordering::Relaxed);
            }
            table.release_if_idle(i, now);
        }
        table.maybe_sweep(now);
    }

    fn record(&self, c: &Circuit, now: u64, failure: bool) {
        let tick = now / self.bucket_ns;
        let epoch = tick & EPOCH_MASK;
        let bucket = &c.buckets[(tick % BUCKETS as u64) as usize];
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
    fn window(&self, c: &Circuit, now: u64) -> (u64, u64) {
        let epoch = (now / self.bucket_ns) & EPOCH_MASK;
        c.buckets.iter().fold((0, 0), |(fs, calls), b| {
            let (e, f, s) = unpack_bucket(b.load(Ordering::Acquire));
            if epoch.wrapping_sub(e) & EPOCH_MASK < BUCKETS as u64 {
                (fs + f, calls + f + s)
            } else {
                (fs, calls)
            }
        })
    }

    fn state(&self, uri: &Uri) -> CircuitState {
        let Some(i) = self.table.find(self.key(uri)) else {
            return CircuitState::Closed;
        };
        let word = self.circuit(i).state.load(Ordering::Acquire);
        match state_of(word) {
            CLOSED => CircuitState::Closed,
            OPEN if self.table.now() >= until_of(word) => CircuitState::HalfOpen,
            HALF_OPEN => CircuitState::HalfOpen,
            _ => CircuitState::Open,
        }
    }

    /// How a call to `uri` is let through, when the table is in use (an
    /// idle table has no open circuit: every call goes through, counted,
    /// with no entry and no key yet).
    fn admission(&self, uri: &Uri, cell: &mut Option<u64>) -> Admission {
        if self.table.is_empty() {
            return Admission {
                slot: None,
                key: None,
                admit: Ok(Admit::Counted),
            };
        }
        let key = self.key_in(uri, cell);
        let slot = self.table.find(key);
        Admission {
            slot,
            key: Some(key),
            admit: slot.map_or(Ok(Admit::Counted), |i| self.admit(i)),
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
    breaker: Arc<Breaker>,
}

impl CircuitBreakerLayer {
    /// A breaker with `config`, keeping its circuits in a host table of its
    /// own ([`max_circuits`](CircuitBreakerConfig::max_circuits) entries).
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
        let table = Arc::new(HostTable::try_new(config.max_circuits)?);
        Self::try_shared(config, table)
    }

    /// A breaker with `config` keeping its circuits in `table`, whose
    /// entries a [Retry-After gate](crate::gate::RetryAfterGateLayer::shared)
    /// over the same table shares: one entry, and one hash of the
    /// authority, per host for both (see [`host`](crate::host)). The
    /// table's size applies, not
    /// [`max_circuits`](CircuitBreakerConfig::max_circuits).
    ///
    /// # Panics
    ///
    /// Where [`try_shared`](Self::try_shared) returns an error.
    #[track_caller]
    pub fn shared(config: CircuitBreakerConfig, table: Arc<HostTable>) -> Self {
        expect_valid(
            "CircuitBreakerLayer::shared",
            Self::try_shared(config, table),
        )
    }

    /// A breaker with `config` keeping its circuits in `table`, checked.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] naming the first value that cannot work,
    /// or saying that `table` already keeps another breaker's circuits (a
    /// table keeps one breaker's; clones of a layer are the same breaker).
    pub fn try_shared(config: CircuitBreakerConfig, table: Arc<HostTable>) -> Result<Self, Error> {
        config.validate()?;
        if !table.attach_breaker() {
            return Err(Error::config(
                "CircuitBreakerLayer: the host table already keeps another breaker's circuits",
            ));
        }
        Ok(CircuitBreakerLayer {
            breaker: Arc::new(Breaker::new(&config, table)),
        })
    }

    /// The state of the circuit `uri` belongs to (`Closed` for one never
    /// seen). An open circuit whose break is over is reported `HalfOpen`:
    /// the next call will probe.
    pub fn state(&self, uri: &Uri) -> CircuitState {
        self.breaker.state(uri)
    }

    /// The host table that keeps this breaker's circuits, to observe or to
    /// share with a [Retry-After gate](crate::gate::RetryAfterGateLayer::shared).
    pub fn table(&self) -> &Arc<HostTable> {
        &self.breaker.table
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
            .field("slots", &self.breaker.table.max_entries())
            .field("in_use", &self.breaker.table.len())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for CircuitBreakerLayer {
    type Service = CircuitBreaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker {
            inner,
            breaker: self.breaker.clone(),
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
    breaker: Arc<Breaker>,
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
        self.breaker.state(uri)
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

/// The open circuit's error for the request `(method, uri)`, which carried
/// `ext`.
fn open_error(
    method: &http::Method,
    uri: &Uri,
    ext: &http::Extensions,
    breaker: &Breaker,
    until: u64,
) -> Error {
    let left = Duration::from_nanos(until.saturating_sub(breaker.table.now()));
    // Rounded up to the millisecond, so "5s" reads as 5s.
    let left =
        Duration::from_millis(u64::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(0));
    let detail = if left.is_zero() {
        "probes in flight".to_owned()
    } else {
        format!("may close in {left:?}")
    };
    let mut err = Error::new(ErrorKind::CircuitOpen)
        .with_owned_detail(detail)
        .with_request(method, uri);
    let out = err.extensions_mut();
    out.insert(Sent::NotSent);
    out.insert(Verdict::Fatal {
        reason: Reason::new_static("circuit open"),
    });
    if !left.is_zero() {
        out.insert(RetryAfterHint(left));
    }
    out.insert(CircuitState::Open);
    // A retry that meets the open circuit: the last real outcome (DESIGN
    // §4) is the previous attempt's, so the error says what it was.
    if let Some(previous) = ext.get::<PreviousAttempt>() {
        out.insert(previous.clone());
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
        let b = &*self.breaker;
        let mut cell = None;
        let mut at = b.admission(req.uri(), &mut cell);
        if b.key_fn.is_some() && at.key.is_none() {
            // A custom key needs the whole URI, which the response future
            // does not keep: computed now.
            at.key = Some(b.key(req.uri()));
        }
        match at.admit {
            Ok(admit) => {
                // The host (a reference count on the URI's authority), to
                // key and name an entry if the outcome needs one.
                let host = HostOwned::of(req.uri());
                future::ResponseFuture::called(
                    self.inner.call(req),
                    future::Track {
                        breaker: self.breaker.clone(),
                        slot: at.slot,
                        key: at.key,
                        admit,
                    },
                    host,
                )
            }
            Err(until) => future::ResponseFuture::rejected(open_error(
                req.method(),
                req.uri(),
                req.extensions(),
                b,
                until,
            )),
        }
    }
}

pub mod future {
    //! The response future of [`CircuitBreaker`].

    use super::*;

    /// What the future reports back to its circuit. A probe dropped before
    /// its outcome frees its slot.
    pub(crate) struct Track {
        pub(super) breaker: Arc<Breaker>,
        pub(super) slot: Option<usize>,
        pub(super) key: Option<u64>,
        pub(super) admit: Admit,
    }

    impl Track {
        pub(super) fn finish(
            mut self,
            count: Count,
            host: Option<HostRef<'_>>,
            later_key: impl FnOnce() -> Option<u64>,
        ) {
            let admit = std::mem::replace(&mut self.admit, Admit::Done);
            self.breaker
                .finish(self.slot, self.key, admit, count, host, later_key);
        }
    }

    impl Drop for Track {
        fn drop(&mut self) {
            if let (Admit::Probe(gen), Some(i), Some(key)) = (self.admit, self.slot, self.key) {
                if self.breaker.table.entry(i).key.load(Ordering::Acquire) == key {
                    self.breaker.release(i, gen);
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
            track: Option<(Track, HostOwned)>,
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
        pub(super) fn called(fut: F, track: Track, host: HostOwned) -> Self {
            ResponseFuture {
                kind: Kind::Called { fut },
                track: Some((track, host)),
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
                    if let Some((track, host)) = this.track.take() {
                        let host = host.as_ref();
                        track.finish(count_of(&outcome), Some(host), || Some(host.key()));
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
    /// sent): what [`CircuitBreaker::call`] decides. While the table is
    /// idle this reads one atomic: no hash, no entry. `key` is the
    /// request's authority key, computed at most once for the gate and the
    /// breaker.
    pub(crate) fn admit<B>(
        &self,
        req: &Request<B>,
        key: &mut Option<u64>,
    ) -> Result<future::Track, Error> {
        let b = &*self.breaker;
        let at = b.admission(req.uri(), key);
        match at.admit {
            Ok(admit) => Ok(future::Track {
                breaker: self.breaker.clone(),
                slot: at.slot,
                key: at.key,
                admit,
            }),
            Err(until) => Err(open_error(
                req.method(),
                req.uri(),
                req.extensions(),
                b,
                until,
            )),
        }
    }
}

#[cfg(feature = "stack")]
impl future::Track {
    /// Count `out` for the circuit of the request to `uri` (see the module
    /// docs for what counts); `key` as for
    /// [`admit`](CircuitBreakerLayer::admit).
    pub(crate) fn settle<B>(
        self,
        out: &Result<Response<B>, Error>,
        uri: Option<&Uri>,
        key: &mut Option<u64>,
    ) {
        let mut track = self;
        let admit = std::mem::replace(&mut track.admit, Admit::Done);
        let b = &*track.breaker;
        b.finish(
            track.slot,
            track.key,
            admit,
            count_of(out),
            uri.map(HostRef::of),
            || uri.map(|u| b.key_in(u, key)),
        );
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
            assert!(matches!(err.kind(), ErrorKind::Config), "{err}");
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
        let t = Breaker::new(&cfg, Arc::new(HostTable::default()));
        let s: Vec<u64> = (0..5).map(|n| t.break_for(n) / 1_000_000_000).collect();
        assert_eq!(s, [1, 2, 4, 5, 5]);
    }

    #[test]
    fn keys_by_authority() {
        let t = Breaker::new(
            &CircuitBreakerConfig::default(),
            Arc::new(HostTable::default()),
        );
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
