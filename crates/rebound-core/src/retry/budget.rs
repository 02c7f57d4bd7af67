//! The retry budget: retries as a fraction of requests over a sliding window,
//! with a floor for quiet clients that accrues over time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;

/// Buckets in the sliding window.
const BUCKETS: usize = 10;

/// Parts per million, so that ratios such as 0.1 or 0.6 are exact.
const PPM: u64 = 1_000_000;

/// A retry budget shared by every request of a client: the retries allowed in
/// the last `window` are
///
/// ```text
/// max(ratio × requests in the window, min_per_sec × window in seconds)
/// ```
///
/// The per-second floor is a **minimum, not an addition**: tower's
/// `TpsBudget` adds it on top of the ratio, so a burst of 1,000 failing
/// requests at 20 % gets 1.3× load instead of 1.2× (and its float
/// arithmetic over-allows at ratios that are not 1/n, tower issue 857). The
/// ratio is kept in parts per million, so 0.1, 0.2 and 0.6 are exact.
///
/// # The floor accrues over time
///
/// The floor exists so that a quiet client (too few requests for the ratio
/// to allow anything) can still retry now and then. It is **paced by a
/// token bucket**: a retry that only the floor allows (the ratio would
/// refuse it) takes a token; tokens come back at `min_per_sec`, and the
/// bucket holds at most [`floor_burst`](Self::floor_burst) of them —
/// **by default one second's worth (`min_per_sec`, at least 1)**. So no
/// single request (say, one with `max_attempts(100)` against a 503 storm)
/// can take the whole window's floor at once: after the burst it gets
/// `min_per_sec` retries per second, and the window bound above still
/// holds. Retries the ratio allows take no token: a busy client is bounded
/// by the ratio alone.
///
/// # A retry that succeeds gives its token back
///
/// As the AWS SDKs' retry quota does, a retry whose attempt succeeds is
/// [refunded](Self::refund) (the retry loop does it once per request that
/// succeeds on a retry): it no longer counts against the window. So the
/// budget bounds the retries that **fail**, not those that work. A steady
/// transient error rate that one retry absorbs (say every fifth first
/// attempt a 503, the retry a 200) costs the budget almost nothing, instead
/// of running it dry at 20 % and turning absorbed errors into caller
/// errors; with independent failures at a rate *p* and 3 attempts, the
/// failed retries are about *p*² + *p*³ per request, within the default
/// 20 % up to *p* ≈ 0.38. In a total outage no retry succeeds, nothing
/// comes back, and the bound above holds unchanged.
///
/// # A retry the server asked for takes no token
///
/// A retry whose delay comes from the server's own `Retry-After` (a 429
/// or 503 that says when to come back) neither
/// [withdraws](Self::try_withdraw) a token nor, when it succeeds, gets one
/// [refunded](Self::refund). The budget bounds the retries a client makes
/// **on its own**; a retry the server invited is paced by the server, and
/// while the host's Retry-After gate is closed no other request of the
/// client is sent to it either. Without this, a 429 storm that every
/// caller's retry would wait out (64 callers, each told `Retry-After: 1`)
/// ran a fresh client's budget dry after 16 retries and gave 42 callers a
/// 429 (`tests/defaults_never_worse.rs`).
///
/// **The trade-off:** an outage whose every answer is a 503 *with*
/// `Retry-After` is not capped by the budget: each request may use up to
/// its `max_attempts`, each retry spaced by the server's delay (bounded by
/// the deadline and the Retry-After cap, `RetryAfterLayer::max_delay` or
/// the client's `retry_after_cap`), and the gate holds the rest of the
/// host's traffic meanwhile. The load the server sees is the one it asked
/// for, not 1.2×. A server that sends `Retry-After: 0` on every 503 asks
/// for what it gets; to cap that anyway, lower `max_attempts`.
///
/// The window slides in ten buckets; requests and retries older than the
/// window are forgotten. Time is `tokio::time`, so paused-clock tests are
/// deterministic.
///
/// Recording a request ([`deposit`](Self::deposit), once per logical
/// request, on the happy path) is one clock read and one atomic add; the
/// budget's `std::sync::Mutex` is taken only when a bucket boundary has
/// passed (at most ten times per window) and to decide a retry, so the
/// bound on retries stays exact under concurrency. A request counted in
/// the very instant its bucket rotates may land in the older bucket, or be
/// lost on a gap longer than the window: either way the budget allows
/// fewer retries, never more.
///
/// ```
/// use std::time::Duration;
/// use rebound_core::retry::RetryBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let budget = RetryBudget::new(0.2, Duration::from_secs(10), 0);
/// for _ in 0..10 {
///     budget.deposit();
/// }
/// assert_eq!(budget.remaining(), 2);
/// assert!(budget.try_withdraw());
/// assert!(budget.try_withdraw());
/// assert!(!budget.try_withdraw());
/// // The retry succeeded: its token comes back.
/// budget.refund();
/// assert_eq!(budget.remaining(), 1);
///
/// // A quiet client: a floor of 5 retries per second, in a burst of 5.
/// let quiet = RetryBudget::new(0.2, Duration::from_secs(10), 5);
/// quiet.deposit();
/// assert_eq!(quiet.remaining(), 5);
/// while quiet.try_withdraw() {}
/// // The floor comes back over time, one token every 200 ms.
/// tokio::time::advance(Duration::from_millis(400)).await;
/// assert_eq!(quiet.remaining(), 2);
/// # }
/// ```
///
/// Share one budget among several layers (or clients) with an `Arc` and
/// [`RetryPolicy::budget`](super::RetryPolicy::budget).
pub struct RetryBudget {
    ratio_ppm: u64,
    floor: u64,
    ratio: f64,
    min_per_sec: u32,
    /// The most floor tokens the bucket holds.
    burst: u32,
    window: Duration,
    /// Bucket boundaries are counted from here.
    origin: Instant,
    bucket_ns: u64,
    /// The absolute number of the head bucket (buckets since `origin`),
    /// mirrored out of the lock for [`deposit`](Self::deposit).
    head: AtomicU64,
    /// Requests per bucket (slot = absolute number % `BUCKETS`): added to
    /// without the lock, zeroed under it when a bucket is reused.
    requests: [AtomicU64; BUCKETS],
    state: Mutex<Window>,
}

/// One token of the floor's bucket, in micro-tokens.
const TOKEN: u64 = 1_000_000;

#[derive(Clone, Copy, Default)]
struct Totals {
    requests: u64,
    retries: u64,
}

struct Window {
    /// Retries per bucket, by slot.
    retries: [u64; BUCKETS],
    /// The absolute number of the head bucket.
    head: u64,
    /// The floor's token bucket, in micro-tokens, as of `refilled`.
    tokens: u64,
    refilled: Instant,
}

impl Window {
    /// Make `now_bucket` the head, zeroing the buckets it reuses (retries
    /// here, requests in `requests`). Buckets never move backwards.
    fn rotate(&mut self, now_bucket: u64, requests: &[AtomicU64; BUCKETS], head: &AtomicU64) {
        if now_bucket <= self.head {
            return;
        }
        let steps = now_bucket - self.head;
        let reused = if steps >= BUCKETS as u64 {
            0..BUCKETS as u64
        } else {
            self.head + 1..now_bucket + 1
        };
        for b in reused {
            let slot = (b % BUCKETS as u64) as usize;
            self.retries[slot] = 0;
            requests[slot].store(0, Ordering::Relaxed);
        }
        self.head = now_bucket;
        head.store(now_bucket, Ordering::Release);
    }

    /// Add the floor tokens earned since the last refill (`per_sec` tokens
    /// a second), up to `burst`.
    fn refill(&mut self, now: Instant, per_sec: u32, burst: u32) {
        let cap = u64::from(burst) * TOKEN;
        if self.tokens >= cap {
            self.tokens = cap;
            self.refilled = now;
            return;
        }
        let elapsed = now.saturating_duration_since(self.refilled);
        // micro-tokens = elapsed_ns × per_sec / 1000; in u128, no overflow.
        let earned = elapsed.as_nanos() * u128::from(per_sec) / 1_000;
        let earned = u64::try_from(earned).unwrap_or(u64::MAX);
        if earned == 0 {
            // Keep the fraction: do not move `refilled`.
            return;
        }
        self.tokens = self.tokens.saturating_add(earned).min(cap);
        self.refilled = now;
    }

    fn totals(&self, requests: &[AtomicU64; BUCKETS]) -> Totals {
        Totals {
            requests: requests.iter().map(|r| r.load(Ordering::Relaxed)).sum(),
            retries: self.retries.iter().sum(),
        }
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.ratio)
            .field("window", &self.window)
            .field("min_per_sec", &self.min_per_sec)
            .field("floor_burst", &self.burst)
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl Default for RetryBudget {
    /// 20 % of requests over 10 s, with a floor of 10 retries per second
    /// (in bursts of at most 10).
    fn default() -> Self {
        RetryBudget::build(0.2, Duration::from_secs(10), 10)
    }
}

impl RetryBudget {
    /// A budget allowing `ratio` retries per request over `window`, and at
    /// least `min_per_sec` retries per second of the window, paced by a
    /// token bucket of `max(min_per_sec, 1)` tokens (see
    /// [`floor_burst`](Self::floor_burst)).
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(ratio: f64, window: Duration, min_per_sec: u32) -> Self {
        crate::config::expect_valid(
            "RetryBudget::new",
            Self::try_new(ratio, window, min_per_sec),
        )
    }

    /// A budget allowing `ratio` retries per request over `window`, and at
    /// least `min_per_sec` retries per second of the window, paced by a
    /// token bucket of `max(min_per_sec, 1)` tokens (see
    /// [`floor_burst`](Self::floor_burst)).
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `ratio` is not in `[0, 10]`, or `window`
    /// is not in `[100 ms, 1 h]`.
    pub fn try_new(ratio: f64, window: Duration, min_per_sec: u32) -> Result<Self, Error> {
        if !(0.0..=10.0).contains(&ratio) {
            return Err(Error::config("RetryBudget: ratio must be in [0, 10]"));
        }
        if window < Duration::from_millis(100) || window > Duration::from_secs(3600) {
            return Err(Error::config(
                "RetryBudget: window must be in [100 ms, 1 h]",
            ));
        }
        Ok(RetryBudget::build(ratio, window, min_per_sec))
    }

    /// The most retries the floor allows at once (the token bucket's size).
    /// Default: `min_per_sec` (one second's worth), at least 1.
    ///
    /// # Panics
    ///
    /// On a value [`try_with_floor_burst`](Self::try_with_floor_burst) refuses, with a message that
    /// names it; use `try_with_floor_burst` for values that come from configuration.
    #[track_caller]
    pub fn with_floor_burst(self, burst: u32) -> Self {
        crate::config::expect_valid(
            "RetryBudget::with_floor_burst",
            self.try_with_floor_burst(burst),
        )
    }

    /// The most retries the floor allows at once (the token bucket's size).
    /// Default: `min_per_sec` (one second's worth), at least 1.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `burst` is zero while the floor is not
    /// (the floor would never allow a retry).
    pub fn try_with_floor_burst(mut self, burst: u32) -> Result<Self, Error> {
        if burst == 0 && self.min_per_sec > 0 {
            return Err(Error::config(
                "RetryBudget: floor_burst must be at least 1 when min_per_sec is not 0",
            ));
        }
        self.burst = burst;
        let w = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        w.tokens = u64::from(burst) * TOKEN;
        Ok(self)
    }

    fn build(ratio: f64, window: Duration, min_per_sec: u32) -> Self {
        let ratio_ppm = (ratio * PPM as f64).round() as u64;
        let floor = (u128::from(min_per_sec) * window.as_millis() / 1000) as u64;
        let burst = min_per_sec.max(1);
        let now = Instant::now();
        // `window` is at least 100 ms (checked by `new`; 10 s by default).
        let bucket_ns = u64::try_from((window / BUCKETS as u32).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        RetryBudget {
            ratio_ppm,
            floor,
            ratio,
            min_per_sec,
            burst,
            window,
            origin: now,
            bucket_ns,
            head: AtomicU64::new(0),
            requests: Default::default(),
            state: Mutex::new(Window {
                retries: [0; BUCKETS],
                head: 0,
                tokens: u64::from(burst) * TOKEN,
                refilled: now,
            }),
        }
    }

    /// The ratio of retries to requests.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The sliding window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The floor, in retries per second.
    pub fn min_per_sec(&self) -> u32 {
        self.min_per_sec
    }

    /// The floor's burst: the most retries the floor allows at once.
    pub fn floor_burst(&self) -> u32 {
        self.burst
    }

    /// The absolute number of the bucket `now` falls in.
    fn bucket_of(&self, now: Instant) -> u64 {
        let ns = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(ns / u128::from(self.bucket_ns)).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        // Only additions happen under the lock; a poisoned one is consistent.
        let mut w = self.state.lock().unwrap_or_else(|p| p.into_inner());
        w.rotate(self.bucket_of(Instant::now()), &self.requests, &self.head);
        w
    }

    fn by_ratio(&self, requests: u64) -> u64 {
        (u128::from(requests) * u128::from(self.ratio_ppm) / u128::from(PPM)) as u64
    }

    /// Record one logical request (the retry layer does this once per
    /// request, before its first attempt).
    pub fn deposit(&self) {
        let now = self.bucket_of(Instant::now());
        let mut head = self.head.load(Ordering::Acquire);
        if now > head {
            // A bucket boundary passed: rotate under the lock (at most once
            // per bucket for all callers).
            head = self.lock().head;
        }
        self.requests[(head % BUCKETS as u64) as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Take one retry from the budget; `false` (and nothing recorded) when
    /// the budget is spent.
    pub fn try_withdraw(&self) -> bool {
        let mut w = self.lock();
        let t = w.totals(&self.requests);
        let allowed = if t.retries < self.by_ratio(t.requests) {
            // The ratio allows it: no floor token.
            true
        } else if t.retries < self.floor {
            // Only the floor allows it: paced by the bucket.
            w.refill(Instant::now(), self.min_per_sec, self.burst);
            if w.tokens >= TOKEN {
                w.tokens -= TOKEN;
                true
            } else {
                false
            }
        } else {
            false
        };
        if allowed {
            let slot = (w.head % BUCKETS as u64) as usize;
            w.retries[slot] += 1;
        }
        allowed
    }

    /// Give back one retry taken with [`try_withdraw`](Self::try_withdraw)
    /// whose attempt succeeded (see [the type's docs](Self)): the newest
    /// retry still in the window stops counting. Nothing happens when the
    /// window holds none (the retry has already left it). Takes the lock:
    /// it runs only for a request that was retried.
    pub fn refund(&self) {
        let mut w = self.lock();
        let head = (w.head % BUCKETS as u64) as usize;
        // Newest bucket first: the retry was taken a backoff and an
        // attempt ago, most likely in the head bucket or the one before.
        for back in 0..BUCKETS {
            let slot = (head + BUCKETS - back) % BUCKETS;
            if w.retries[slot] > 0 {
                w.retries[slot] -= 1;
                return;
            }
        }
    }

    /// How many retries the budget would allow right now (for tracing).
    pub fn remaining(&self) -> u64 {
        let mut w = self.lock();
        let t = w.totals(&self.requests);
        let ratio = self.by_ratio(t.requests);
        let by_ratio = ratio.saturating_sub(t.retries);
        // What the floor allows beyond the ratio, no more than the tokens.
        let floor_room = self.floor.saturating_sub(t.retries.max(ratio));
        let by_floor = if floor_room == 0 {
            0
        } else {
            w.refill(Instant::now(), self.min_per_sec, self.burst);
            floor_room.min(w.tokens / TOKEN)
        };
        by_ratio + by_floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn drain(budget: &RetryBudget) -> u64 {
        let mut n = 0;
        // Bounded: a budget can never allow more than this here.
        while n < 1_000_000 && budget.try_withdraw() {
            n += 1;
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn ratio_bound_is_exact() {
        for (ratio, expected) in [(0.1, 100), (0.2, 200), (0.6, 600)] {
            let budget = RetryBudget::try_new(ratio, Duration::from_secs(10), 0).unwrap();
            for _ in 0..1000 {
                budget.deposit();
            }
            assert_eq!(budget.remaining(), expected, "ratio {ratio}");
            assert_eq!(drain(&budget), expected, "ratio {ratio}");
            assert_eq!(budget.remaining(), 0);
        }
        // Interleaved: never more than ratio × requests so far.
        for ratio in [0.1, 0.2, 0.6] {
            let budget = RetryBudget::try_new(ratio, Duration::from_secs(10), 0).unwrap();
            let mut retries = 0u64;
            for requests in 1..=1000u64 {
                budget.deposit();
                while budget.try_withdraw() {
                    retries += 1;
                }
                let bound = (requests as f64 * ratio + 1e-9).floor() as u64;
                assert!(retries <= bound, "ratio {ratio}: {retries} > {bound}");
                assert!(retries + 1 > bound, "ratio {ratio}: {retries} < {bound}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn floor_is_a_minimum_not_an_addition() {
        let budget = RetryBudget::try_new(0.2, Duration::from_secs(10), 10).unwrap();
        // Quiet client: the floor applies, paced: a burst of one second's
        // worth (10), not the whole window's 100 at once.
        budget.deposit();
        assert_eq!(budget.remaining(), 10);
        // Busy client: the ratio applies alone, the floor is not added.
        for _ in 1..1000 {
            budget.deposit();
        }
        assert_eq!(budget.remaining(), 200);
        assert_eq!(drain(&budget), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_accrues_over_time() {
        let budget = RetryBudget::try_new(0.2, Duration::from_secs(10), 10).unwrap();
        assert_eq!(budget.floor_burst(), 10);
        budget.deposit();
        // The burst at once, then nothing until tokens come back.
        assert_eq!(drain(&budget), 10);
        assert_eq!(budget.remaining(), 0);
        tokio::time::advance(Duration::from_millis(99)).await;
        assert_eq!(drain(&budget), 0);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(drain(&budget), 1, "one token per 100 ms at 10/s");
        // A long pause refills at most the burst.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(budget.remaining(), 10);
        // Over the window, never more than the floor (100): 11 taken so
        // far; draining every 100 ms for the rest of the window.
        let mut total = 11 + drain(&budget);
        for _ in 0..55 {
            tokio::time::advance(Duration::from_millis(100)).await;
            total += drain(&budget);
        }
        // 8.6 s of the first window: 11 + 10 + 55 = 76, all within it.
        assert_eq!(total, 76);
        assert!(total <= 100);
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_burst_is_configurable_and_checked() {
        let budget = RetryBudget::try_new(0.0, Duration::from_secs(10), 10)
            .unwrap()
            .try_with_floor_burst(3)
            .unwrap();
        budget.deposit();
        assert_eq!(budget.floor_burst(), 3);
        assert_eq!(drain(&budget), 3);
        let err = RetryBudget::try_new(0.0, Duration::from_secs(10), 10)
            .unwrap()
            .try_with_floor_burst(0)
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config));
        assert!(err.to_string().contains("floor_burst"), "{err}");
        // No floor: a zero burst is fine (and means nothing).
        assert!(RetryBudget::try_new(0.2, Duration::from_secs(10), 0)
            .unwrap()
            .try_with_floor_burst(0)
            .is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn window_slides() {
        let budget = RetryBudget::try_new(0.5, Duration::from_secs(10), 0).unwrap();
        for _ in 0..100 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 50);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(budget.remaining(), 0);
        for _ in 0..100 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 50);
        // The first half leaves the window: its requests and retries go.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(budget.remaining(), 0);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(budget.remaining(), 0);
        budget.deposit();
        budget.deposit();
        assert_eq!(budget.remaining(), 1);
    }

    /// Deposits without the lock, from many threads at once: the ratio
    /// bound still holds exactly (retries are decided under the lock).
    #[test]
    fn concurrent_deposits_and_withdrawals_keep_the_bound() {
        let budget = RetryBudget::try_new(0.2, Duration::from_secs(3600), 0).unwrap();
        let retries = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        budget.deposit();
                        if budget.try_withdraw() {
                            retries.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        // 40,000 requests in one window: 20 % of them, no more, and none
        // lost (what the interleaving refused is still there to take).
        let taken = retries.load(Ordering::Relaxed);
        assert!(taken <= 8_000, "{taken}");
        assert_eq!(taken + drain(&budget), 8_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_restores_a_retry() {
        let budget = RetryBudget::try_new(0.2, Duration::from_secs(10), 0).unwrap();
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 2);
        assert_eq!(budget.remaining(), 0);
        budget.refund();
        assert_eq!(budget.remaining(), 1);
        budget.refund();
        assert_eq!(budget.remaining(), 2);
        // Nothing left to give back: no credit beyond the ratio.
        budget.refund();
        assert_eq!(budget.remaining(), 2);
        // A retry taken in an older bucket is refunded too.
        assert_eq!(drain(&budget), 2);
        tokio::time::advance(Duration::from_secs(3)).await;
        budget.refund();
        assert_eq!(budget.remaining(), 1);
        // One that has left the window is not: nothing to give back.
        tokio::time::advance(Duration::from_secs(10)).await;
        budget.refund();
        assert_eq!(budget.remaining(), 0);
    }

    /// A steady transient rate that one retry absorbs: 30 % of first
    /// attempts fail, every retry succeeds. Without refunds the default
    /// budget (20 %, its floor spent early) refuses about a third of those
    /// retries.
    #[tokio::test(start_paused = true)]
    async fn absorbed_errors_cost_the_budget_nothing() {
        let budget = RetryBudget::default();
        let mut refused = 0;
        for n in 0..1000u64 {
            budget.deposit();
            if n % 10 < 3 {
                if budget.try_withdraw() {
                    budget.refund();
                } else {
                    refused += 1;
                }
            }
            if n % 100 == 99 {
                tokio::time::advance(Duration::from_millis(500)).await;
            }
        }
        assert_eq!(refused, 0);
    }

    /// The retry loop gives back the token of a retry that succeeded: a
    /// host whose every first attempt fails and every retry works (a 100 %
    /// transient rate, absorbed) is served whole, where the ratio alone
    /// would have refused most of those retries.
    #[tokio::test(start_paused = true)]
    async fn the_retry_loop_refunds_a_retry_that_succeeds() {
        use std::sync::atomic::AtomicU32;
        use std::sync::Arc;

        use bytes::Bytes;
        use http::{Request, Response, StatusCode};
        use http_body_util::Empty;
        use tower::{service_fn, ServiceBuilder, ServiceExt};

        use crate::classify::{ClassifyLayer, HttpClassifier};
        use crate::retry::{RetryLayer, RetryPolicy};

        let budget = Arc::new(RetryBudget::try_new(0.2, Duration::from_secs(10), 0).unwrap());
        // Some history, so the ratio allows a first retry.
        for _ in 0..10 {
            budget.deposit();
        }
        let calls = Arc::new(AtomicU32::new(0));
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::new(
                RetryPolicy::default().budget(Arc::clone(&budget)),
            ))
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(service_fn(move |_req: Request<Empty<Bytes>>| {
                let first = calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2);
                async move {
                    let mut res = Response::new(Empty::<Bytes>::new());
                    if first {
                        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    }
                    Ok::<_, std::convert::Infallible>(res)
                }
            }));
        for n in 0..50 {
            let req = Request::get("http://api.example/")
                .body(Empty::new())
                .unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "request {n}");
            assert_eq!(crate::Attempts::of(res.extensions()), 2);
        }
        // 60 requests, every retry given back: the whole ratio is left.
        assert_eq!(budget.remaining(), 12);
    }

    /// Refunds leave the outage bound as it is: the retries that fail never
    /// exceed ratio × requests, at ratios that are not 1/n too.
    #[tokio::test(start_paused = true)]
    async fn failed_retries_stay_within_the_ratio_with_refunds() {
        for ratio in [0.1, 0.2, 0.6] {
            let budget = RetryBudget::try_new(ratio, Duration::from_secs(10), 0).unwrap();
            let mut failed = 0u64;
            for requests in 1..=1000u64 {
                budget.deposit();
                // Every first attempt fails; one request in three succeeds
                // on its first retry, the others fail every retry (up to 2).
                for retry in 0..2 {
                    if !budget.try_withdraw() {
                        break;
                    }
                    if requests % 3 == 0 && retry == 0 {
                        budget.refund();
                        break;
                    }
                    failed += 1;
                }
                let bound = (requests as f64 * ratio + 1e-9).floor() as u64;
                assert!(failed <= bound, "ratio {ratio}: {failed} > {bound}");
            }
            // ... and a total outage (no refund at all) still gets exactly
            // the ratio.
            let outage = RetryBudget::try_new(ratio, Duration::from_secs(10), 0).unwrap();
            for _ in 0..1000 {
                outage.deposit();
            }
            let expected = (1000.0 * ratio + 1e-9).floor() as u64;
            assert_eq!(drain(&outage), expected, "ratio {ratio}");
        }
    }

    #[test]
    fn bad_config_is_an_error() {
        assert!(matches!(
            RetryBudget::try_new(-0.1, Duration::from_secs(10), 1)
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        assert!(RetryBudget::try_new(f64::NAN, Duration::from_secs(10), 1).is_err());
        assert!(RetryBudget::try_new(0.2, Duration::ZERO, 1).is_err());
        assert!(RetryBudget::try_new(0.2, Duration::from_secs(7200), 1).is_err());
    }
}
