//! A lock-free rotating latency histogram: the percentile the hedge delay is
//! read from.
//!
//! tower's `Hedge` keeps two `hdrhistogram`s (one written, one read) behind
//! a `Mutex` and swaps them every period. This is the same design on
//! atomics: two log-linear histograms of 256 `AtomicU64` buckets (8 per
//! power of two, so a bucket is at most 12.5 % wide; microseconds up to
//! about 4.7 hours), an atomic index saying which one is written, and the
//! percentile of the finished one computed **once per period** by whoever
//! rotates and cached in an atomic. A call costs one load of the cached
//! delay; a completed attempt one `fetch_add`; both one load of the next
//! rotation time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

const BUCKETS: usize = 256;
/// The cached delay when there is none (too few samples).
const NONE: u64 = u64::MAX;

/// The bucket of a value (microseconds).
fn bucket(v: u64) -> usize {
    if v < 8 {
        return v as usize;
    }
    let e = 63 - u64::from(v.leading_zeros());
    let m = (v >> (e - 3)) & 7;
    let i = 8 + (e - 3) * 8 + m;
    (i as usize).min(BUCKETS - 1)
}

/// The exclusive upper bound of bucket `i` (microseconds).
fn upper(i: usize) -> u64 {
    if i < 8 {
        return i as u64 + 1;
    }
    let e = (i as u64 - 8) / 8 + 3;
    let m = (i as u64 - 8) % 8;
    (8 + m + 1) << (e - 3)
}

struct Histogram {
    buckets: [AtomicU64; BUCKETS],
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn clear(&self) {
        for b in &self.buckets {
            b.store(0, Relaxed);
        }
    }

    /// The upper bound of the bucket holding the `p` quantile, if there are
    /// at least `min` samples.
    fn quantile(&self, p: f64, min: u64) -> Option<u64> {
        let counts: [u64; BUCKETS] = std::array::from_fn(|i| self.buckets[i].load(Relaxed));
        let total: u64 = counts.iter().sum();
        if total == 0 || total < min {
            return None;
        }
        let target = ((total as f64 * p).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= target {
                return Some(upper(i));
            }
        }
        Some(upper(BUCKETS - 1))
    }
}

/// Recent latencies and the delay read from them; shared by every clone of
/// a hedge layer.
pub(crate) struct Latency {
    base: Instant,
    period_ns: u64,
    percentile: f64,
    min_samples: u64,
    /// When the written histogram is next rotated (ns since `base`).
    next_rotation: AtomicU64,
    /// Which histogram is written (0 or 1).
    write: AtomicUsize,
    histograms: [Histogram; 2],
    /// The delay read from the last finished period, µs (`NONE`: none).
    delay_us: AtomicU64,
}

impl std::fmt::Debug for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Latency")
            .field("percentile", &self.percentile)
            .field("min_samples", &self.min_samples)
            .field("period", &Duration::from_nanos(self.period_ns))
            .field("delay", &self.cached())
            .finish()
    }
}

impl Latency {
    pub(crate) fn new(percentile: f64, min_samples: u64, period: Duration) -> Self {
        let period_ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
        Latency {
            base: Instant::now(),
            period_ns,
            percentile,
            min_samples,
            next_rotation: AtomicU64::new(period_ns),
            write: AtomicUsize::new(0),
            histograms: [Histogram::new(), Histogram::new()],
            delay_us: AtomicU64::new(NONE),
        }
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn cached(&self) -> Option<Duration> {
        match self.delay_us.load(Relaxed) {
            NONE => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// The hedge delay at `now`: the percentile of the last full period's
    /// latencies, or `None` when it had fewer than the minimum samples.
    pub(crate) fn delay(&self, now: Instant) -> Option<Duration> {
        self.rotate(self.nanos(now));
        self.cached()
    }

    /// Record one attempt's time to its answer.
    pub(crate) fn record(&self, now: Instant, latency: Duration) {
        self.rotate(self.nanos(now));
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let w = self.write.load(Relaxed) & 1;
        self.histograms[w].buckets[bucket(us)].fetch_add(1, Relaxed);
    }

    fn rotate(&self, now_ns: u64) {
        let next = self.next_rotation.load(Relaxed);
        if now_ns < next {
            return;
        }
        let stale = now_ns >= next.saturating_add(self.period_ns);
        let new_next = if stale {
            now_ns.saturating_add(self.period_ns)
        } else {
            next.saturating_add(self.period_ns)
        };
        // One rotator per period; the others go on writing.
        if self
            .next_rotation
            .compare_exchange(next, new_next, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let w = self.write.load(Relaxed) & 1;
        let r = 1 - w;
        // Clear the one about to be written before anyone writes to it.
        self.histograms[r].clear();
        self.write.store(r, Relaxed);
        let delay = if stale {
            // Nothing was recorded for a whole period: what the finished
            // histogram holds is too old to say anything.
            self.histograms[w].clear();
            None
        } else {
            self.histograms[w].quantile(self.percentile, self.min_samples)
        };
        self.delay_us.store(delay.unwrap_or(NONE), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            17,
            100,
            1_000,
            1_000_000,
            u64::MAX,
        ] {
            let i = bucket(v);
            assert!(i >= last, "{v}");
            last = i;
            if i < BUCKETS - 1 {
                assert!(v < upper(i), "{v} < upper({i}) = {}", upper(i));
                assert!(i == 0 || v >= upper(i - 1), "{v}");
            }
        }
        // At most 12.5 % wide above 8 µs.
        for i in 9..BUCKETS {
            let (lo, hi) = (upper(i - 1), upper(i));
            assert!((hi - lo) * 8 <= lo, "bucket {i}: {lo}..{hi}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn percentile_of_the_last_full_period_with_a_minimum_sample() {
        let period = Duration::from_secs(1);
        let l = Latency::new(0.9, 10, period);
        let ms = Duration::from_millis;
        // Too few samples in the first period.
        for _ in 0..9 {
            l.record(Instant::now(), ms(1));
        }
        tokio::time::advance(period).await;
        assert_eq!(l.delay(Instant::now()), None);
        // 90 fast, 10 slow: p90 is in the fast bucket.
        for i in 0..100 {
            let d = if i % 10 == 0 { ms(500) } else { ms(1) };
            l.record(Instant::now(), d);
        }
        // Not yet: the period is not over.
        assert_eq!(l.delay(Instant::now()), None);
        tokio::time::advance(period).await;
        let d = l.delay(Instant::now()).unwrap();
        assert!(d >= ms(1) && d <= ms(1) + ms(1) / 8, "{d:?}");
        // A quiet period leaves no estimate.
        tokio::time::advance(period * 3).await;
        assert_eq!(l.delay(Instant::now()), None);
    }
}
