//! The gradient (latency-driven) algorithm of the adaptive limit: its
//! settings and its state. The formula and the defaults are in the
//! [`adaptive` module docs](super::adaptive#the-gradient-algorithm).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;

use crate::error::Error;

/// The gradient settings of an [`AdaptiveLimiter`](super::AdaptiveLimiter):
/// a limit that follows the round-trip time (Netflix concurrency-limits'
/// `Gradient2Limit`, Envoy's adaptive concurrency filter); checked when the
/// limiter is built.
///
/// See the [module docs](super::adaptive#the-gradient-algorithm) for the
/// formula, the defaults and their sources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gradient {
    pub(crate) min: usize,
    pub(crate) initial: usize,
    pub(crate) max: usize,
    pub(crate) tolerance: f64,
    pub(crate) smoothing: f64,
    pub(crate) update_interval: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) probe_jitter: f64,
    pub(crate) probe_limit: usize,
    pub(crate) probe_samples: usize,
    pub(crate) backoff_ratio: f64,
    pub(crate) seed: Option<u64>,
}

impl Default for Gradient {
    fn default() -> Self {
        Gradient {
            min: 1,
            initial: 20,
            max: 200,
            tolerance: 1.25,
            smoothing: 0.2,
            update_interval: Duration::from_millis(100),
            probe_interval: Duration::from_secs(30),
            probe_jitter: 0.15,
            probe_limit: 3,
            probe_samples: 50,
            backoff_ratio: 0.9,
            seed: None,
        }
    }
}

impl Gradient {
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

    /// How much slower than the minimum round-trip time a sample may be
    /// before the limit shrinks (the gradient is `tolerance × min / sample`,
    /// capped at 1); at least 1. Default is 1.25 (Envoy's 25 % buffer;
    /// Netflix's `rttTolerance` is 1.5).
    pub fn rtt_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The weight of a new estimate against the current limit, in
    /// `(0, 1]`. Default is 0.2 (Netflix's `smoothing`).
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing;
        self
    }

    /// How often the limit is recomputed from the round-trip times of the
    /// attempts that ended since (at least one). Default is 100 ms (Envoy's
    /// `concurrency_update_interval` in its documentation's example).
    pub fn update_interval(mut self, interval: Duration) -> Self {
        self.update_interval = interval;
        self
    }

    /// How often the minimum round-trip time is measured again at a
    /// reduced limit, before jitter. Default is 30 s.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// The share of the probe interval drawn at random each time, in
    /// `[0, 1)`, so that clients started together do not probe together.
    /// Default is 0.15 (Envoy's `jitter`: 15 %).
    pub fn probe_jitter(mut self, jitter: f64) -> Self {
        self.probe_jitter = jitter;
        self
    }

    /// The limit while the minimum round-trip time is measured (capped by
    /// the limit and raised to `min_limit`). Default is 3 (Envoy's
    /// `min_concurrency`).
    pub fn probe_limit(mut self, limit: usize) -> Self {
        self.probe_limit = limit;
        self
    }

    /// How many round-trip times a measurement of the minimum takes (at
    /// least 1). Default is 50 (Envoy's `request_count`).
    pub fn probe_samples(mut self, samples: usize) -> Self {
        self.probe_samples = samples;
        self
    }

    /// On a loss signal (429, 503, an attempt timeout, a connect failure)
    /// the limit is multiplied by this ratio, which must be in `[0.5, 1)`.
    /// Default is 0.9 (as [`Aimd`](super::Aimd)).
    pub fn backoff_ratio(mut self, ratio: f64) -> Self {
        self.backoff_ratio = ratio;
        self
    }

    /// Seed the jitter's RNG, for reproducible probes. Default: seeded
    /// from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    pub(crate) fn update_ns(&self) -> u64 {
        u64::try_from(self.update_interval.as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::config(format!("gradient limit: {what}")));
        if self.min == 0 {
            return bad("min_limit must be at least 1".into());
        }
        if self.min > self.initial || self.initial > self.max {
            return bad(format!(
                "need min_limit <= initial_limit <= max_limit, got {} <= {} <= {}",
                self.min, self.initial, self.max
            ));
        }
        if self.max > Semaphore::MAX_PERMITS {
            return bad(format!(
                "max_limit {} is larger than the maximum of {}",
                self.max,
                Semaphore::MAX_PERMITS
            ));
        }
        if !(self.tolerance >= 1.0 && self.tolerance.is_finite()) {
            return bad(format!(
                "rtt_tolerance must be at least 1, got {}",
                self.tolerance
            ));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return bad(format!(
                "smoothing must be in (0, 1], got {}",
                self.smoothing
            ));
        }
        if self.update_interval.is_zero() {
            return bad("update_interval must be more than zero".into());
        }
        if self.probe_interval <= self.update_interval {
            return bad(format!(
                "probe_interval ({:?}) must be longer than update_interval ({:?})",
                self.probe_interval, self.update_interval
            ));
        }
        if !(0.0..1.0).contains(&self.probe_jitter) {
            return bad(format!(
                "probe_jitter must be in [0, 1), got {}",
                self.probe_jitter
            ));
        }
        if self.probe_limit == 0 || self.probe_samples == 0 {
            return bad("probe_limit and probe_samples must be at least 1".into());
        }
        if !(0.5..1.0).contains(&self.backoff_ratio) {
            return bad(format!(
                "backoff_ratio must be in [0.5, 1), got {}",
                self.backoff_ratio
            ));
        }
        Ok(())
    }
}

/// A measurement of the minimum in progress.
#[derive(Debug)]
struct Probe {
    /// The limit to go back to.
    saved: usize,
    /// Samples of attempts that started in this generation or later count.
    epoch: u64,
    sum_ns: u128,
    count: usize,
}

/// The current update window's samples, accumulated without the
/// limiter's lock: a success inside a window is two atomic adds (and a
/// load of the peak); only the success that closes the window (and every
/// success while the minimum is measured) takes the lock.
///
/// Under concurrency a sample added while another thread closes the window
/// may have its time counted in one window and its count in the next: the
/// mean of either moves by at most one sample's share, and a window never
/// has a count of zero (the closing sample counts in it).
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// When the window started (ns since the limiter's base, plus one);
    /// 0: no window yet (the first success starts it, under the lock).
    start: AtomicU64,
    sum_ns: AtomicU64,
    count: AtomicU64,
    /// Most attempts in flight seen in the window.
    peak: AtomicUsize,
    /// The minimum is being measured: every sample takes the lock.
    probing: AtomicBool,
}

impl Window {
    /// Add a success that ended at `now` after `rtt` (ns), with
    /// `in_flight()` attempts in flight, if the window is open and not due
    /// (`update_ns` long); `false`: take the lock and
    /// [`close`](GradientState::close) it.
    #[inline]
    pub(crate) fn add(
        &self,
        now: u64,
        rtt: u64,
        update_ns: u64,
        in_flight: impl FnOnce() -> usize,
    ) -> bool {
        let start = self.start.load(Ordering::Acquire);
        if start == 0
            || now.saturating_sub(start) >= update_ns
            || self.probing.load(Ordering::Acquire)
        {
            return false;
        }
        self.sum_ns.fetch_add(rtt.max(1), Ordering::AcqRel);
        self.count.fetch_add(1, Ordering::AcqRel);
        let n = in_flight();
        if n > self.peak.load(Ordering::Acquire) {
            self.peak.fetch_max(n, Ordering::AcqRel);
        }
        true
    }

    /// Empty the window and start the next one at `now`: its samples'
    /// total time, count and peak.
    fn take(&self, now: u64) -> (u64, u64, usize) {
        self.start.store(now, Ordering::Release);
        (
            self.sum_ns.swap(0, Ordering::AcqRel),
            self.count.swap(0, Ordering::AcqRel),
            self.peak.swap(0, Ordering::AcqRel),
        )
    }
}

/// The gradient's state, under the limiter's lock.
#[derive(Debug)]
pub(crate) struct GradientState {
    /// The limit as a real number (smoothing moves it by less than one).
    pub(crate) estimate: f64,
    /// The minimum round-trip time (ns); 0: none yet.
    pub(crate) min_rtt: u64,
    /// The last window's round-trip time (ns); 0: none yet.
    pub(crate) sample_rtt: u64,
    next_probe: Option<u64>,
    probe: Option<Probe>,
    rng: SmallRng,
}

/// What the gradient asks of the limiter after a sample.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Move {
    Stay,
    To(usize),
}

impl GradientState {
    pub(crate) fn new(g: &Gradient) -> Self {
        GradientState {
            estimate: g.initial as f64,
            min_rtt: 0,
            sample_rtt: 0,
            next_probe: None,
            probe: None,
            rng: match g.seed {
                Some(seed) => SmallRng::seed_from_u64(seed),
                None => SmallRng::from_os_rng(),
            },
        }
    }

    pub(crate) fn probing(&self) -> bool {
        self.probe.is_some()
    }

    fn schedule_probe(&mut self, g: &Gradient, now: u64) {
        let jitter = if g.probe_jitter > 0.0 {
            self.rng.random_range(-g.probe_jitter..g.probe_jitter)
        } else {
            0.0
        };
        let secs = g.probe_interval.as_secs_f64() * (1.0 + jitter);
        self.next_probe = Some(now.saturating_add((secs.max(0.0) * 1e9) as u64));
    }

    /// A successful attempt that ended at `now` after `rtt` (ns), of
    /// generation `epoch` (the limit's being `current`), with `in_flight`
    /// attempts in flight (it included) and the limit at `limit`, that
    /// [`Window::add`] did not take: the window's first sample, the one
    /// that closes it, or a sample of a measurement of the minimum. Times
    /// are ns since the limiter's base (plain integers: no `Instant`
    /// arithmetic on the happy path).
    pub(crate) fn sample(
        &mut self,
        g: &Gradient,
        w: &Window,
        (now, rtt): (u64, u64),
        (epoch, current): (u64, u64),
        in_flight: usize,
        limit: usize,
    ) -> Move {
        let ns = rtt.max(1);
        if let Some(probe) = &mut self.probe {
            if epoch >= probe.epoch {
                probe.sum_ns += u128::from(ns);
                probe.count += 1;
            }
            if probe.count < g.probe_samples {
                return Move::Stay;
            }
            // The measurement is done: its mean is the new minimum, and
            // the limit goes back to where it was.
            let probe = self.probe.take().expect("probing");
            self.min_rtt = (probe.sum_ns / probe.count as u128).max(1) as u64;
            self.schedule_probe(g, now);
            w.take(now);
            w.probing.store(false, Ordering::Release);
            self.estimate = probe.saved as f64;
            return Move::To(probe.saved);
        }
        let start = w.start.load(Ordering::Acquire);
        if start == 0 || now.saturating_sub(start) < g.update_ns() {
            // The first sample (it starts the window), or one that another
            // thread's close overtook: added as the happy path adds.
            if start == 0 {
                w.start.store(now, Ordering::Release);
            }
            w.sum_ns.fetch_add(ns, Ordering::AcqRel);
            w.count.fetch_add(1, Ordering::AcqRel);
            w.peak.fetch_max(in_flight, Ordering::AcqRel);
            return Move::Stay;
        }
        let (sum, count, peak) = w.take(now);
        let sample = ((u128::from(sum) + u128::from(ns)) / u128::from(count + 1)).max(1) as u64;
        let peak = peak.max(in_flight);
        self.sample_rtt = sample;
        // The minimum from live traffic: a window faster than it lowers it.
        if self.min_rtt == 0 || sample < self.min_rtt {
            self.min_rtt = sample;
        }
        // The first window starts the first measurement (traffic that
        // starts against a queue would take its round-trip for the
        // minimum), then one every probe interval.
        if self.next_probe.is_none_or(|at| now >= at) {
            // Measure the minimum again at a reduced limit.
            let to = g.probe_limit.min(limit).max(g.min);
            self.probe = Some(Probe {
                saved: limit,
                epoch: current + u64::from(to < limit),
                sum_ns: 0,
                count: 0,
            });
            w.probing.store(true, Ordering::Release);
            self.next_probe = None;
            return Move::To(to);
        }
        Move::To(self.update(g, sample, peak))
    }

    /// The new limit after a window of round-trip time `sample` (ns).
    fn update(&mut self, g: &Gradient, sample: u64, peak: usize) -> usize {
        let limit = self.estimate;
        let gradient = (g.tolerance * self.min_rtt as f64 / sample as f64).clamp(0.5, 1.0);
        let mut new = limit * gradient + limit.sqrt();
        // Growth only while the limit is used (at least half of it in
        // flight): a quiet period does not inflate it.
        if (peak as f64) < limit / 2.0 {
            new = new.min(limit);
        }
        let smoothed = limit * (1.0 - g.smoothing) + new * g.smoothing;
        self.estimate = smoothed.clamp(g.min as f64, g.max as f64);
        self.estimate as usize
    }

    /// A loss signal from an attempt of the current generation: the limit
    /// times the backoff ratio. During a probe the limit stays at the
    /// probe's, and the limit it goes back to is cut instead.
    pub(crate) fn overload(&mut self, g: &Gradient, limit: usize) -> usize {
        let cut = |n: usize| ((n as f64 * g.backoff_ratio) as usize).max(g.min);
        if let Some(probe) = &mut self.probe {
            probe.saved = cut(probe.saved);
            return limit;
        }
        let to = cut(limit);
        self.estimate = to as f64;
        to
    }
}
