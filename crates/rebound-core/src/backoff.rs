//! Propose how long to wait before the next attempt: exponential backoff with
//! jitter, and the server's Retry-After when it gave one.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use rebound_core::backoff::{Backoff, BackoffLayer, Jitter};
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::{DelaySource, ProposedDelay};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
//!     .jitter(Jitter::Full)
//!     .seed(7); // deterministic, for the example
//! let mut svc = ServiceBuilder::new()
//!     .layer(BackoffLayer::new(backoff))
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(tower::service_fn(|_req: Request<()>| async {
//!         let mut res = Response::new(());
//!         *res.status_mut() = StatusCode::BAD_GATEWAY;
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let res = svc.ready().await?.call(Request::new(())).await?;
//! let proposed = res.extensions().get::<ProposedDelay>().unwrap();
//! assert_eq!(proposed.source, DelaySource::Backoff);
//! assert!(proposed.delay <= Duration::from_millis(100)); // first retry: [0, base]
//! # Ok(())
//! # }
//! ```
//!
//! # The schedule
//!
//! For the retry after attempt `n` (read from the request's
//! [`AttemptNumber`], 1 when absent) the *capped exponential* is
//! `c(n) = min(cap, base × multiplier^(n-1))`, and the delay is drawn from:
//!
//! | [`Jitter`] | range |
//! |---|---|
//! | `Full` (default) | `[0, c(n)]` |
//! | `Equal` | `[c(n)/2, c(n)]` |
//! | `Decorrelated` | `[base, min(cap, 3 × previous delay)]` (previous = `base` on the first retry) |
//! | `Proportional(r)` | `[c(n) × (1-r), min(cap, c(n) × (1+r))]` |
//!
//! `Full` is the default because AWS's measurements ("Exponential Backoff And
//! Jitter", 2015) show it completes the work with the fewest calls: it spreads
//! retries over the whole window. `Decorrelated` takes the previous delay from
//! the request's [`PreviousAttempt`], which the retry layer carries.
//!
//! A [`RetryAfterHint`] on the outcome wins over the schedule: the proposal
//! is then the hint, with [`DelaySource::RetryAfter`].
//!
//! # Randomness
//!
//! The RNG is a [`SmallRng`] seeded from the OS, shared by all clones behind
//! a short mutex; [`Backoff::seed`] makes it deterministic and
//! [`Backoff::rng`] injects any other RNG.
//!
//! [`AttemptNumber`]: crate::annotations::AttemptNumber
//! [`PreviousAttempt`]: crate::annotations::PreviousAttempt
//! [`RetryAfterHint`]: crate::annotations::RetryAfterHint

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{
    AttemptNumber, DelaySource, PreviousAttempt, ProposedDelay, RetryAfterHint, Verdict,
};
use crate::error::{BoxError, Error};

/// The largest cap a [`Backoff`] accepts: one day.
pub const MAX_CAP: Duration = crate::config::MAX_DURATION;

/// The largest multiplier a [`Backoff`] accepts.
pub const MAX_MULTIPLIER: f64 = 100.0;

/// How the delay is spread around the capped exponential; see the
/// [module docs](self) for each range.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Jitter {
    /// Uniform in `[0, c(n)]` (the default).
    #[default]
    Full,
    /// Uniform in `[c(n)/2, c(n)]`.
    Equal,
    /// AWS's "decorrelated jitter": uniform in `[base, 3 × previous]`, capped.
    Decorrelated,
    /// Uniform in `c(n) × [1 - ratio, 1 + ratio]`, capped; `ratio` in
    /// `[0, 1]` (`0.2` is the common "±20 %").
    Proportional(f64),
}

type SharedRng = Arc<Mutex<Box<dyn RngCore + Send>>>;

/// An exponential backoff schedule with jitter.
///
/// # Clone
///
/// Clones share the RNG.
#[derive(Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    multiplier: f64,
    jitter: Jitter,
    rng: SharedRng,
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("base", &self.base)
            .field("cap", &self.cap)
            .field("multiplier", &self.multiplier)
            .field("jitter", &self.jitter)
            .finish()
    }
}

impl Default for Backoff {
    /// `exponential(100 ms, 10 s)`, multiplier 2, full jitter.
    fn default() -> Self {
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
    }
}

impl Backoff {
    /// Exponential backoff from `base`, doubling, capped at `cap`, with full
    /// jitter.
    ///
    /// This constructor cannot fail; the values are checked when the layer is
    /// built: [`BackoffLayer::try_new`] rejects invalid ones and
    /// [`BackoffLayer::new`] brings them into range (see
    /// [`normalized`](Self::normalized)). Use
    /// [`try_exponential`](Self::try_exponential) to check at once.
    pub fn exponential(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            multiplier: 2.0,
            jitter: Jitter::Full,
            rng: Arc::new(Mutex::new(Box::new(SmallRng::from_os_rng()))),
        }
    }

    /// Like [`exponential`](Self::exponential), checked.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `base` is zero, `base > cap`, or `cap` is
    /// above one day.
    pub fn try_exponential(base: Duration, cap: Duration) -> Result<Self, Error> {
        let b = Self::exponential(base, cap);
        b.validate()?;
        Ok(b)
    }

    /// The growth factor between attempts. Default: 2. Valid: `[1, 100]`.
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The jitter mode. Default: [`Jitter::Full`].
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Shorthand for `.jitter(Jitter::Full)`.
    pub fn full_jitter(self) -> Self {
        self.jitter(Jitter::Full)
    }

    /// Seed the RNG, for reproducible delays. Default: seeded from the OS.
    pub fn seed(self, seed: u64) -> Self {
        self.rng(SmallRng::seed_from_u64(seed))
    }

    /// Draw from `rng` instead. Default: a [`SmallRng`] seeded from the OS.
    pub fn rng(mut self, rng: impl RngCore + Send + 'static) -> Self {
        self.rng = Arc::new(Mutex::new(Box::new(rng)));
        self
    }

    /// The first delay's upper bound.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap on any delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The jitter mode.
    pub fn jitter_mode(&self) -> Jitter {
        self.jitter
    }

    /// Check the values.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] saying which value is wrong.
    pub fn validate(&self) -> Result<(), Error> {
        if self.base.is_zero() {
            return Err(Error::config("Backoff: base must be > 0"));
        }
        if self.base > self.cap {
            return Err(Error::config("Backoff: base must not exceed cap"));
        }
        if self.cap > MAX_CAP {
            return Err(Error::config("Backoff: cap must be at most one day"));
        }
        if !(1.0..=MAX_MULTIPLIER).contains(&self.multiplier) {
            return Err(Error::config("Backoff: multiplier must be in [1, 100]"));
        }
        if let Jitter::Proportional(r) = self.jitter {
            if !(0.0..=1.0).contains(&r) {
                return Err(Error::config(
                    "Backoff: proportional jitter ratio must be in [0, 1]",
                ));
            }
        }
        Ok(())
    }

    /// The same schedule with every value brought into range: a zero base
    /// becomes 1 ms, a cap above one day becomes one day, a cap below the
    /// base becomes the base, a multiplier out of `[1, 100]` (or NaN) becomes
    /// 2, a proportional ratio is clamped to `[0, 1]` (NaN becomes 0.2).
    pub fn normalized(mut self) -> Self {
        if self.base.is_zero() {
            self.base = Duration::from_millis(1);
        }
        self.base = self.base.min(MAX_CAP);
        self.cap = self.cap.clamp(self.base, MAX_CAP);
        if !(1.0..=MAX_MULTIPLIER).contains(&self.multiplier) {
            self.multiplier = 2.0;
        }
        if let Jitter::Proportional(r) = self.jitter {
            let r = if r.is_nan() { 0.2 } else { r.clamp(0.0, 1.0) };
            self.jitter = Jitter::Proportional(r);
        }
        self
    }

    /// The capped exponential `c(n) = min(cap, base × multiplier^(n-1))` for
    /// the retry after attempt `attempt` (1-based; 0 is read as 1).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(1024) as i32;
        let secs = self.base.as_secs_f64() * self.multiplier.powi(exp);
        if !secs.is_finite() || secs >= self.cap.as_secs_f64() {
            self.cap
        } else if secs <= 0.0 {
            // Only reachable with an unvalidated negative multiplier.
            Duration::ZERO
        } else {
            Duration::from_secs_f64(secs).min(self.cap)
        }
    }

    /// The range `[low, high]` the delay after attempt `attempt` is drawn
    /// from; `previous` is the delay waited before that attempt
    /// (decorrelated jitter only).
    pub fn bounds(&self, attempt: u32, previous: Option<Duration>) -> (Duration, Duration) {
        match self.jitter {
            Jitter::Full => (Duration::ZERO, self.ceiling(attempt)),
            Jitter::Equal => {
                let c = self.ceiling(attempt);
                (c / 2, c)
            }
            Jitter::Decorrelated => {
                let prev = previous.unwrap_or(self.base).max(self.base);
                let high = prev.saturating_mul(3).min(self.cap);
                (self.base.min(high), high)
            }
            Jitter::Proportional(r) => {
                let c = self.ceiling(attempt).as_secs_f64();
                let r = if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) };
                let cap = self.cap.as_secs_f64();
                let low = (c * (1.0 - r)).min(cap);
                let high = (c * (1.0 + r)).min(cap);
                // A cap near `Duration::MAX` rounds up to 2^64 s as an f64,
                // which `from_secs_f64` would panic on: saturate at the cap.
                let secs =
                    |s: f64| Duration::try_from_secs_f64(s).map_or(self.cap, |d| d.min(self.cap));
                (secs(low), secs(high))
            }
        }
    }

    /// Draw the delay after attempt `attempt` with `rng`.
    pub fn delay_with<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        previous: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let (low, high) = self.bounds(attempt, previous);
        let (low, high) = (nanos(low), nanos(high));
        if high <= low {
            return Duration::from_nanos(low);
        }
        Duration::from_nanos(rng.random_range(low..=high))
    }

    /// Draw the delay after attempt `attempt` with the backoff's own RNG.
    pub fn delay(&self, attempt: u32, previous: Option<Duration>) -> Duration {
        // A poisoned lock only means another thread panicked mid-draw; the
        // RNG state is still usable.
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        self.delay_with(attempt, previous, &mut **rng)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ===== layer =====

/// Annotates every retryable outcome with a [`ProposedDelay`]: the
/// [`RetryAfterHint`] when there is one, else a draw from its [`Backoff`].
///
/// Needs a [`Verdict`] from a classify layer below it (and a Retry-After
/// layer below it for hints). See the [module docs](self) for an example.
///
/// # Clone
///
/// Clones share the schedule and its RNG.
#[derive(Clone, Debug)]
pub struct BackoffLayer {
    backoff: Backoff,
}

impl BackoffLayer {
    /// A layer proposing delays from `backoff`.
    ///
    /// # Panics
    ///
    /// If `backoff` is invalid (see [`Backoff::validate`]), with a message
    /// that names the value; use [`try_new`](Self::try_new) for values that
    /// come from configuration, or [`Backoff::normalized`] to bring them
    /// into range.
    #[track_caller]
    pub fn new(backoff: Backoff) -> Self {
        crate::config::expect_valid("BackoffLayer::new", Self::try_new(backoff))
    }

    /// A layer proposing delays from `backoff`, checked.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `backoff` is invalid (see
    /// [`Backoff::validate`]).
    pub fn try_new(backoff: Backoff) -> Result<Self, Error> {
        backoff.validate()?;
        Ok(BackoffLayer { backoff })
    }

    /// The schedule.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }
}

impl<S> Layer<S> for BackoffLayer {
    type Service = BackoffService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BackoffService {
            inner,
            backoff: self.backoff.clone(),
        }
    }
}

// ===== service =====

/// The service made by [`BackoffLayer`].
///
/// # Errors
///
/// Inner errors are turned into [`Error`]; a retryable one gets its
/// [`ProposedDelay`] in its extensions.
#[derive(Clone, Debug)]
pub struct BackoffService<S> {
    inner: S,
    backoff: Backoff,
}

impl<S> BackoffService<S> {
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

impl<S, ReqB, ResB> Service<Request<ReqB>> for BackoffService<S>
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
        let attempt = AttemptNumber::of(req.extensions());
        let previous = req
            .extensions()
            .get::<PreviousAttempt>()
            .and_then(|p| p.delay.map(|d| d.delay));
        future::ResponseFuture {
            inner: self.inner.call(req),
            backoff: self.backoff.clone(),
            attempt,
            previous,
        }
    }
}

pub(crate) fn propose(
    backoff: &Backoff,
    attempt: u32,
    previous: Option<Duration>,
    ext: &mut http::Extensions,
) {
    match ext.get::<Verdict>() {
        Some(v) if v.is_retryable() => {}
        _ => return,
    }
    let proposed = match ext.get::<RetryAfterHint>() {
        Some(hint) => ProposedDelay {
            delay: hint.0,
            source: DelaySource::RetryAfter,
        },
        None => ProposedDelay {
            delay: backoff.delay(attempt, previous),
            source: DelaySource::Backoff,
        },
    };
    ext.insert(proposed);
}

pub mod future {
    //! The response future of [`BackoffService`].

    use super::*;

    pin_project! {
        /// The response future of [`BackoffService`](super::BackoffService).
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) inner: F,
            pub(super) backoff: Backoff,
            pub(super) attempt: u32,
            pub(super) previous: Option<Duration>,
        }
    }

    impl<F: fmt::Debug> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture")
                .field("inner", &self.inner)
                .field("attempt", &self.attempt)
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
            let mut outcome = ready!(this.inner.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
            let ext = match &mut outcome {
                Ok(res) => res.extensions_mut(),
                Err(err) => err.extensions_mut(),
            };
            propose(this.backoff, *this.attempt, *this.previous, ext);
            Poll::Ready(outcome)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{Reason, Sent};
    use crate::ErrorKind;

    const DRAWS: usize = 10_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn schedule(jitter: Jitter) -> Backoff {
        Backoff::try_exponential(ms(100), ms(5_000))
            .unwrap()
            .jitter(jitter)
            .seed(42)
    }

    #[test]
    fn ceiling_grows_and_caps() {
        let b = schedule(Jitter::Full);
        assert_eq!(b.ceiling(0), ms(100));
        assert_eq!(b.ceiling(1), ms(100));
        assert_eq!(b.ceiling(2), ms(200));
        assert_eq!(b.ceiling(3), ms(400));
        assert_eq!(b.ceiling(6), ms(3_200));
        assert_eq!(b.ceiling(7), ms(5_000));
        assert_eq!(b.ceiling(u32::MAX), ms(5_000));
        let b = schedule(Jitter::Full).multiplier(3.0);
        assert_eq!(b.ceiling(3), ms(900));
    }

    #[test]
    fn every_mode_stays_in_bounds() {
        let modes = [
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::Proportional(0.2),
            Jitter::Proportional(1.0),
        ];
        for mode in modes {
            let b = schedule(mode);
            let mut previous = None;
            for i in 0..DRAWS {
                let attempt = (i % 10) as u32 + 1;
                let (low, high) = b.bounds(attempt, previous);
                let d = b.delay(attempt, previous);
                assert!(
                    low <= d && d <= high,
                    "{mode:?} {attempt}: {d:?} not in [{low:?}, {high:?}]"
                );
                assert!(d <= b.cap(), "{mode:?}: {d:?} over the cap");
                // Documented ranges.
                let c = b.ceiling(attempt);
                match mode {
                    Jitter::Full => assert!(d <= c),
                    Jitter::Equal => assert!(c / 2 <= d && d <= c),
                    Jitter::Decorrelated => {
                        let prev = previous.unwrap_or(b.base());
                        assert!(b.base() <= d && d <= (prev * 3).min(b.cap()));
                    }
                    Jitter::Proportional(r) => {
                        let (lo, hi) = (c.mul_f64(1.0 - r), c.mul_f64(1.0 + r).min(b.cap()));
                        assert!(lo.saturating_sub(ms(1)) <= d && d <= hi + ms(1));
                    }
                }
                previous = Some(d);
            }
        }
    }

    #[test]
    fn full_jitter_mean_is_half_the_ceiling() {
        for attempt in [1, 3, 8] {
            let b = schedule(Jitter::Full);
            let c = b.ceiling(attempt).as_secs_f64();
            let sum: f64 = (0..DRAWS)
                .map(|_| b.delay(attempt, None).as_secs_f64())
                .sum();
            let mean = sum / DRAWS as f64;
            let expected = c / 2.0;
            assert!(
                (mean - expected).abs() <= expected * 0.05,
                "attempt {attempt}: mean {mean} vs {expected}"
            );
        }
    }

    #[test]
    fn seeded_is_reproducible() {
        let a: Vec<_> = {
            let b = schedule(Jitter::Full);
            (1..20).map(|n| b.delay(n, None)).collect()
        };
        let b: Vec<_> = {
            let b = schedule(Jitter::Full);
            (1..20).map(|n| b.delay(n, None)).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    #[should_panic(expected = "BackoffLayer::new: invalid configuration")]
    fn the_layer_panics_on_what_try_new_refuses() {
        let _ = BackoffLayer::new(Backoff::exponential(ms(10), ms(100)).multiplier(0.5));
    }

    #[test]
    fn invalid_config_is_an_error_not_a_panic() {
        assert!(matches!(
            Backoff::try_exponential(Duration::ZERO, ms(10))
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        assert!(matches!(
            Backoff::try_exponential(ms(20), ms(10)).unwrap_err().kind(),
            ErrorKind::Config
        ));
        assert!(matches!(
            Backoff::try_exponential(ms(20), Duration::from_secs(90_000))
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        let b = Backoff::exponential(ms(10), ms(100));
        assert!(BackoffLayer::try_new(b.clone().multiplier(0.5)).is_err());
        assert!(BackoffLayer::try_new(b.clone().multiplier(f64::NAN)).is_err());
        assert!(BackoffLayer::try_new(b.clone().jitter(Jitter::Proportional(1.5))).is_err());
        assert!(BackoffLayer::try_new(b.clone()).is_ok());

        // `normalized` brings values into range instead (the layer's `new`
        // panics on them: see below).
        let n = BackoffLayer::new(
            Backoff::exponential(Duration::ZERO, Duration::ZERO)
                .multiplier(f64::NAN)
                .normalized(),
        );
        assert!(n.backoff().validate().is_ok());
        assert_eq!(n.backoff().base(), ms(1));
        assert_eq!(n.backoff().cap(), ms(1));
        let _ = n.backoff().delay(5, None);

        // Drawing from an unvalidated schedule never panics either.
        for m in [-1.0, f64::NAN, f64::INFINITY, 0.0, 1e300] {
            for j in [
                Jitter::Full,
                Jitter::Equal,
                Jitter::Decorrelated,
                Jitter::Proportional(f64::NAN),
                Jitter::Proportional(-3.0),
            ] {
                let b = Backoff::exponential(ms(10), ms(100))
                    .multiplier(m)
                    .jitter(j);
                for attempt in [0, 1, 2, 3, 1000, u32::MAX] {
                    assert!(b.delay(attempt, Some(Duration::MAX)) <= ms(100));
                }
            }
        }
        let weird = Backoff::exponential(ms(100), ms(10));
        let _ = weird.delay(3, None);
        // Nor does a cap near `Duration::MAX` (2^64 s as an f64).
        for j in [
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::Proportional(0.2),
        ] {
            let huge = Backoff::exponential(ms(10), Duration::MAX).jitter(j);
            for attempt in [1, 2, 70, 1000, u32::MAX] {
                let _ = huge.delay(attempt, Some(Duration::MAX));
            }
        }
    }

    fn verdict() -> Verdict {
        Verdict::Retryable {
            reason: Reason::new_static("status 503"),
            sent: Sent::MaybeProcessed,
        }
    }

    #[test]
    fn retry_after_wins_and_success_is_untouched() {
        let b = schedule(Jitter::Full);
        let mut ext = http::Extensions::new();
        propose(&b, 1, None, &mut ext);
        assert!(ext.get::<ProposedDelay>().is_none());

        ext.insert(Verdict::Fatal {
            reason: Reason::new_static("status 404"),
        });
        propose(&b, 1, None, &mut ext);
        assert!(ext.get::<ProposedDelay>().is_none());

        ext.insert(verdict());
        propose(&b, 2, None, &mut ext);
        let p = ext.get::<ProposedDelay>().unwrap();
        assert_eq!(p.source, DelaySource::Backoff);
        assert!(p.delay <= ms(200));

        ext.insert(RetryAfterHint(Duration::from_secs(3)));
        propose(&b, 2, None, &mut ext);
        assert_eq!(
            ext.get::<ProposedDelay>(),
            Some(&ProposedDelay {
                delay: Duration::from_secs(3),
                source: DelaySource::RetryAfter
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn layer_reads_attempt_and_previous_delay() {
        use tower::ServiceExt;
        let layer = BackoffLayer::new(schedule(Jitter::Decorrelated));
        let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
            let mut res = Response::new(());
            res.extensions_mut().insert(verdict());
            Ok::<_, BoxError>(res)
        }));
        let mut req = Request::new(());
        req.extensions_mut().insert(AttemptNumber(3));
        req.extensions_mut().insert(PreviousAttempt {
            attempt: 2,
            verdict: verdict(),
            retry_after: None,
            delay: Some(ProposedDelay {
                delay: ms(1_000),
                source: DelaySource::Backoff,
            }),
        });
        for _ in 0..100 {
            let res = svc.clone().oneshot(req.clone()).await.unwrap();
            let d = res.extensions().get::<ProposedDelay>().unwrap().delay;
            assert!(ms(100) <= d && d <= ms(3_000), "{d:?}");
        }
    }
}
