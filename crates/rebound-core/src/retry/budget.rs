//! The retry budget: retries as a fraction of requests over a sliding window,
//! with a floor for quiet clients.

use std::fmt;
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
/// The window slides in ten buckets; requests and retries older than the
/// window are forgotten. Time is `tokio::time`, so paused-clock tests are
/// deterministic. The state is behind a `std::sync::Mutex` held for a few
/// additions only.
///
/// ```
/// use std::time::Duration;
/// use rebound_core::retry::RetryBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let budget = RetryBudget::new(0.2, Duration::from_secs(10), 0).unwrap();
/// for _ in 0..10 {
///     budget.deposit();
/// }
/// assert_eq!(budget.remaining(), 2);
/// assert!(budget.try_withdraw());
/// assert!(budget.try_withdraw());
/// assert!(!budget.try_withdraw());
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
    window: Duration,
    bucket_len: Duration,
    state: Mutex<Window>,
}

#[derive(Clone, Copy, Default)]
struct Bucket {
    requests: u64,
    retries: u64,
}

struct Window {
    buckets: [Bucket; BUCKETS],
    head: usize,
    head_start: Instant,
}

impl Window {
    fn rotate(&mut self, now: Instant, bucket_len: Duration) {
        let elapsed = now.saturating_duration_since(self.head_start);
        if elapsed < bucket_len {
            return;
        }
        let steps = (elapsed.as_nanos() / bucket_len.as_nanos().max(1)) as u64;
        if steps >= BUCKETS as u64 {
            self.buckets = [Bucket::default(); BUCKETS];
        } else {
            for _ in 0..steps {
                self.head = (self.head + 1) % BUCKETS;
                self.buckets[self.head] = Bucket::default();
            }
        }
        // Keep bucket boundaries aligned (saturating on absurd gaps).
        let steps32 = u32::try_from(steps).unwrap_or(u32::MAX);
        self.head_start = self
            .head_start
            .checked_add(bucket_len.saturating_mul(steps32))
            .unwrap_or(now);
        if self.head_start > now {
            self.head_start = now;
        }
    }

    fn totals(&self) -> Bucket {
        self.buckets
            .iter()
            .fold(Bucket::default(), |acc, b| Bucket {
                requests: acc.requests + b.requests,
                retries: acc.retries + b.retries,
            })
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.ratio)
            .field("window", &self.window)
            .field("min_per_sec", &self.min_per_sec)
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl Default for RetryBudget {
    /// 20 % of requests over 10 s, with a floor of 10 retries per second.
    fn default() -> Self {
        RetryBudget::build(0.2, Duration::from_secs(10), 10)
    }
}

impl RetryBudget {
    /// A budget allowing `ratio` retries per request over `window`, and at
    /// least `min_per_sec` retries per second of the window.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `ratio` is not in `[0, 10]`, or `window`
    /// is not in `[100 ms, 1 h]`.
    pub fn new(ratio: f64, window: Duration, min_per_sec: u32) -> Result<Self, Error> {
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

    fn build(ratio: f64, window: Duration, min_per_sec: u32) -> Self {
        let ratio_ppm = (ratio * PPM as f64).round() as u64;
        let floor = (u128::from(min_per_sec) * window.as_millis() / 1000) as u64;
        RetryBudget {
            ratio_ppm,
            floor,
            ratio,
            min_per_sec,
            window,
            bucket_len: window / BUCKETS as u32,
            state: Mutex::new(Window {
                buckets: [Bucket::default(); BUCKETS],
                head: 0,
                head_start: Instant::now(),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        // Only additions happen under the lock; a poisoned one is consistent.
        let mut w = self.state.lock().unwrap_or_else(|p| p.into_inner());
        w.rotate(Instant::now(), self.bucket_len);
        w
    }

    fn allowed(&self, requests: u64) -> u64 {
        let by_ratio = (u128::from(requests) * u128::from(self.ratio_ppm) / u128::from(PPM)) as u64;
        by_ratio.max(self.floor)
    }

    /// Record one logical request (the retry layer does this once per
    /// request, before its first attempt).
    pub fn deposit(&self) {
        let mut w = self.lock();
        let head = w.head;
        w.buckets[head].requests += 1;
    }

    /// Take one retry from the budget; `false` (and nothing recorded) when
    /// the budget is spent.
    pub fn try_withdraw(&self) -> bool {
        let mut w = self.lock();
        let t = w.totals();
        if t.retries < self.allowed(t.requests) {
            let head = w.head;
            w.buckets[head].retries += 1;
            true
        } else {
            false
        }
    }

    /// How many retries the budget would allow right now (for tracing).
    pub fn remaining(&self) -> u64 {
        let w = self.lock();
        let t = w.totals();
        self.allowed(t.requests).saturating_sub(t.retries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let budget = RetryBudget::new(ratio, Duration::from_secs(10), 0).unwrap();
            for _ in 0..1000 {
                budget.deposit();
            }
            assert_eq!(budget.remaining(), expected, "ratio {ratio}");
            assert_eq!(drain(&budget), expected, "ratio {ratio}");
            assert_eq!(budget.remaining(), 0);
        }
        // Interleaved: never more than ratio × requests so far.
        for ratio in [0.1, 0.2, 0.6] {
            let budget = RetryBudget::new(ratio, Duration::from_secs(10), 0).unwrap();
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
        let budget = RetryBudget::new(0.2, Duration::from_secs(10), 10).unwrap();
        // Quiet client: the floor (10/s × 10 s) applies.
        budget.deposit();
        assert_eq!(budget.remaining(), 100);
        // Busy client: the ratio applies alone, the floor is not added.
        for _ in 1..1000 {
            budget.deposit();
        }
        assert_eq!(budget.remaining(), 200);
        assert_eq!(drain(&budget), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn window_slides() {
        let budget = RetryBudget::new(0.5, Duration::from_secs(10), 0).unwrap();
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

    #[test]
    fn bad_config_is_an_error() {
        assert!(RetryBudget::new(-0.1, Duration::from_secs(10), 1)
            .unwrap_err()
            .is_config());
        assert!(RetryBudget::new(f64::NAN, Duration::from_secs(10), 1).is_err());
        assert!(RetryBudget::new(0.2, Duration::ZERO, 1).is_err());
        assert!(RetryBudget::new(0.2, Duration::from_secs(7200), 1).is_err());
    }
}
