//! Response-body timeouts — idle, minimum rate, and a deadline — as one
//! engine with one timer.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use std::future::poll_fn;
//! use std::pin::pin;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use rebound_core::body_timeout::{BodyTimeouts, BodyTimer, TimedError};
//! use rebound_core::TimeoutStage;
//!
//! // A body that sends one chunk and then stalls.
//! let stalled = http_body_util::StreamBody::new(futures_util::stream::unfold(0, |n| async move {
//!     if n > 0 {
//!         std::future::pending::<()>().await;
//!     }
//!     Some((Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from("head"))), n + 1))
//! }));
//! let mut body = pin!(stalled);
//! let mut timer = BodyTimer::new(BodyTimeouts::new().idle(Duration::from_secs(5)));
//! let first = poll_fn(|cx| timer.poll_frame(body.as_mut(), cx)).await;
//! assert!(first.unwrap().is_ok());
//! let second = poll_fn(|cx| timer.poll_frame(body.as_mut(), cx)).await;
//! assert!(matches!(
//!     second,
//!     Some(Err(TimedError::Timeout(TimeoutStage::BodyIdle)))
//! ));
//! # }
//! ```
//!
//! [`BodyTimer`] is the policy of the response-body timeouts, written once:
//! plain state and one `poll`-time function, no tower. rebound-hyper's
//! `TransportBody` (the transport's body, standalone) and the stack's
//! [`StackBody`](crate::stack::StackBody) are thin wrappers over it. It
//! applies up to three limits:
//!
//! * **idle** ([`BodyTimeouts::idle`]): no frame arrived for `d` while the
//!   caller was waiting → [`TimeoutStage::BodyIdle`].
//! * **minimum rate** ([`MinBodyRate`]): modelled on the AWS SDKs'
//!   stalled-stream protection. After a grace period, the waiting time is
//!   cut into windows; in each window the body must deliver at least
//!   `bytes_per_sec × window` bytes — or all the bytes it still has to
//!   deliver, whichever is fewer — else → [`TimeoutStage::BodyRate`].
//! * **a deadline** ([`BodyTimer::deadline`], the request's total
//!   deadline): reading past it → [`TimeoutStage::Deadline`]. It is checked
//!   before every read, so a body whose frames are always ready is cut
//!   too; a body already at its end is not cut. When it falls due together
//!   with the idle or rate limit, the deadline wins.
//!
//! Idle and rate are measured **only while the caller is waiting for the
//! body** (a caller that is busy elsewhere between two reads never trips
//! them). Unlike AWS's first versions the rate has no false positives on
//! **small** or **finished** bodies: a body whose remaining length (from
//! `Content-Length`) is smaller than a window's quota only has to deliver
//! what it still owes, a body with nothing left to deliver (only its end,
//! or its trailers, are missing) is never judged, and time the caller
//! spends not polling the body is not counted at all. One limit remains: a
//! body of unknown length (chunked) cannot be known to be finished before
//! its end arrives, so a chunked body slow to *end* is judged like one slow
//! to deliver.
//!
//! # One timer
//!
//! A timer is created only once the inner body is pending (a body whose
//! frames are always ready never arms one), boxed then, and armed at the
//! earliest of the three limits; after that it is **reset**, never
//! re-created. With no limit at all the timer is a pass-through that
//! reads no clock. With limits, it reads the clock once per poll.
//!
//! An idle or rate failure is final: every later poll returns it again.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

use crate::config::{validate_duration as validate, MAX_DURATION};
use crate::error::{Error, TimeoutStage};

// ===== impl MinBodyRate =====

/// A minimum response-body rate; see the [module docs](self).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MinBodyRate {
    bytes_per_sec: u64,
    // In nanoseconds (at most a day): every body with a minimum rate
    // carries a copy, and a body's size is paid on every move.
    window: u64,
    grace: u64,
}

impl fmt::Debug for MinBodyRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MinBodyRate")
            .field("bytes_per_sec", &self.bytes_per_sec)
            .field("window", &self.window())
            .field("grace", &self.grace_period())
            .finish()
    }
}

/// `d` in nanoseconds, saturating (the durations here are at most a day).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl MinBodyRate {
    /// At least `bytes_per_sec` bytes per second, judged over windows of
    /// `window` of waiting time. The grace period defaults to `window`.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(bytes_per_sec: u64, window: Duration) -> Self {
        crate::config::expect_valid("MinBodyRate::new", Self::try_new(bytes_per_sec, window))
    }

    /// At least `bytes_per_sec` bytes per second, judged over windows of
    /// `window` of waiting time. The grace period defaults to `window`.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) if `bytes_per_sec` is zero,
    /// or `window` is under 100 ms or over a day.
    pub fn try_new(bytes_per_sec: u64, window: Duration) -> Result<Self, Error> {
        if bytes_per_sec == 0 {
            return Err(Error::config(
                "minimum body rate must be at least 1 byte per second",
            ));
        }
        let window = validate("minimum body rate window", window)?;
        if window < Duration::from_millis(100) {
            return Err(Error::config(format!(
                "minimum body rate window of {window:?} is shorter than 100ms"
            )));
        }
        Ok(MinBodyRate {
            bytes_per_sec,
            window: nanos(window),
            grace: nanos(window),
        })
    }

    /// Waiting time at the start of the body that is not judged (time to
    /// the first bytes can be long). Zero is allowed. Default: the window.
    ///
    /// # Panics
    ///
    /// On a value [`try_grace`](Self::try_grace) refuses, with a message that
    /// names it; use `try_grace` for values that come from configuration.
    #[track_caller]
    pub fn grace(self, grace: Duration) -> Self {
        crate::config::expect_valid("BodyTimeouts::grace", self.try_grace(grace))
    }

    /// Waiting time at the start of the body that is not judged (time to
    /// the first bytes can be long). Zero is allowed. Default: the window.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) if `grace` is over a day.
    pub fn try_grace(mut self, grace: Duration) -> Result<Self, Error> {
        if grace > MAX_DURATION {
            return Err(Error::config(format!(
                "minimum body rate grace of {grace:?} is longer than the maximum of {MAX_DURATION:?}"
            )));
        }
        self.grace = nanos(grace);
        Ok(self)
    }

    /// The minimum rate in bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The grace period.
    pub fn grace_period(&self) -> Duration {
        Duration::from_nanos(self.grace)
    }

    /// The bytes owed for `waited` nanoseconds of waiting (at least one).
    fn quota(&self, waited: u64) -> u64 {
        let q = u128::from(self.bytes_per_sec) * u128::from(waited) / 1_000_000_000;
        u64::try_from(q).unwrap_or(u64::MAX).max(1)
    }
}

// ===== impl BodyTimeouts =====

/// The idle and minimum-rate timeouts applied to a response body: none by
/// default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyTimeouts {
    idle: Option<Duration>,
    min_rate: Option<MinBodyRate>,
}

impl BodyTimeouts {
    /// No body timeouts.
    pub const fn new() -> Self {
        BodyTimeouts {
            idle: None,
            min_rate: None,
        }
    }

    /// Fail when no frame arrives for `d` while the caller waits.
    ///
    /// # Panics
    ///
    /// On a value [`try_idle`](Self::try_idle) refuses, with a message that
    /// names it; use `try_idle` for values that come from configuration.
    #[track_caller]
    pub fn idle(self, d: Duration) -> Self {
        crate::config::expect_valid("BodyTimeouts::idle", self.try_idle(d))
    }

    /// Fail when no frame arrives for `d` while the caller waits.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) if `d` is zero or over a
    /// day.
    pub fn try_idle(mut self, d: Duration) -> Result<Self, Error> {
        self.idle = Some(validate("body idle timeout", d)?);
        Ok(self)
    }

    /// Fail when the body is slower than `rate`.
    pub fn min_rate(mut self, rate: MinBodyRate) -> Self {
        self.min_rate = Some(rate);
        self
    }

    /// The idle timeout, if any.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle
    }

    /// The minimum rate, if any.
    pub fn min_body_rate(&self) -> Option<MinBodyRate> {
        self.min_rate
    }

    /// Whether neither timeout is set.
    pub fn is_off(&self) -> bool {
        self.idle.is_none() && self.min_rate.is_none()
    }
}

// ===== rate accounting =====

/// `remaining_at_start` when the length is unknown: as a bound on the
/// quota (`quota.min(left)`) it is no bound at all.
const UNKNOWN: u64 = u64::MAX;

#[derive(Debug)]
struct Rate {
    cfg: MinBodyRate,
    in_grace: bool,
    /// With no grace period, the first window starts at the first poll.
    first_window_unstarted: bool,
    /// Waiting time in the current period (grace or window), in
    /// nanoseconds.
    waited: u64,
    /// Bytes delivered in the current window.
    bytes: u64,
    /// Upper bound of what the body still had to deliver when the window
    /// started ([`UNKNOWN`]: unknown).
    remaining_at_start: u64,
}

impl Rate {
    fn new(cfg: MinBodyRate) -> Self {
        Rate {
            cfg,
            in_grace: cfg.grace != 0,
            first_window_unstarted: cfg.grace == 0,
            waited: 0,
            bytes: 0,
            remaining_at_start: UNKNOWN,
        }
    }

    /// The current period (grace or window), in nanoseconds.
    fn period(&self) -> u64 {
        if self.in_grace {
            self.cfg.grace
        } else {
            self.cfg.window
        }
    }

    /// Close the current period if it is full; `Err` if the window missed
    /// its quota. `remaining` is what the body still has to deliver now.
    fn evaluate(&mut self, remaining: Option<u64>) -> Result<(), ()> {
        if self.waited < self.period() {
            return Ok(());
        }
        if !self.in_grace {
            let quota = self.cfg.quota(self.waited).min(self.remaining_at_start);
            if self.bytes < quota {
                return Err(());
            }
        }
        self.in_grace = false;
        self.waited = 0;
        self.bytes = 0;
        self.remaining_at_start = remaining.unwrap_or(UNKNOWN);
        Ok(())
    }

    fn time_left(&self) -> Duration {
        Duration::from_nanos(self.period().saturating_sub(self.waited))
    }
}

// ===== the engine's state =====

/// What the engine keeps per body, without its timer (the stack's
/// in-attempt read drives it with the attempt's own timer).
pub(crate) struct BodyClock {
    idle: Option<Duration>,
    // When the caller started waiting with no frame (idle timer).
    idle_since: Option<Instant>,
    // When the last poll returned `Pending` (rate accounting).
    pending_since: Option<Instant>,
    deadline: Option<Instant>,
    rate: Option<Rate>,
    failed: Option<TimeoutStage>,
}

impl BodyClock {
    pub(crate) fn new(timeouts: BodyTimeouts, deadline: Option<Instant>) -> Self {
        BodyClock {
            idle: timeouts.idle,
            idle_since: None,
            pending_since: None,
            deadline,
            rate: timeouts.min_rate.map(Rate::new),
            failed: None,
        }
    }

    fn timed(&self) -> bool {
        self.idle.is_some() || self.rate.is_some()
    }

    pub(crate) fn timeouts(&self) -> BodyTimeouts {
        BodyTimeouts {
            idle: self.idle,
            min_rate: self.rate.as_ref().map(|r| r.cfg),
        }
    }

    pub(crate) fn failed(&self) -> Option<TimeoutStage> {
        self.failed
    }

    /// The next frame of `body` under the limits, `timer` the one timer.
    pub(crate) fn poll_frame<B, T>(
        &mut self,
        mut timer: T,
        mut body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> TimedFrame<B>
    where
        B: Body,
        T: Timer,
    {
        // The deadline first, so that a body whose frames are always ready
        // is cut too; a body at its end is not. An armed timer that has
        // not fired says "not yet" without a clock read.
        let mut now = None;
        if let Some(deadline) = self.deadline {
            let due = match timer.fired(cx) {
                Some(false) => false,
                _ => *now.insert(Instant::now()) >= deadline,
            };
            let at_end = self.failed.is_none() && body.is_end_stream();
            if due && !at_end {
                return Poll::Ready(Some(Err(TimedError::Timeout(TimeoutStage::Deadline))));
            }
        }
        if let Some(stage) = self.failed {
            return Poll::Ready(Some(Err(TimedError::Timeout(stage))));
        }
        if !self.timed() {
            return match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(TimedError::Body(e)))),
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => match self.deadline {
                    // Waiting on the inner body: the deadline wakes this
                    // task.
                    Some(deadline) if timer.arm(deadline, cx) => {
                        Poll::Ready(Some(Err(TimedError::Timeout(TimeoutStage::Deadline))))
                    }
                    _ => Poll::Pending,
                },
            };
        }

        let now = now.unwrap_or_else(Instant::now);
        // Time the caller spent waiting since our last `Pending` counts
        // towards the rate window; time between a frame and the next poll
        // (the caller busy elsewhere) does not.
        if let (Some(since), Some(rate)) = (self.pending_since.take(), self.rate.as_mut()) {
            rate.waited = rate
                .waited
                .saturating_add(nanos(now.saturating_duration_since(since)));
        }
        if let Some(rate) = self.rate.as_mut() {
            if rate.first_window_unstarted {
                rate.first_window_unstarted = false;
                rate.remaining_at_start = body.size_hint().upper().unwrap_or(UNKNOWN);
            }
        }

        match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.idle_since = None;
                if let (Some(data), Some(rate)) = (frame.data_ref(), self.rate.as_mut()) {
                    if !rate.in_grace {
                        rate.bytes = rate.bytes.saturating_add(data.remaining() as u64);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(TimedError::Body(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let remaining = body.size_hint().upper();
                let mut wake_at: Option<Instant> = None;
                if let Some(rate) = self.rate.as_mut() {
                    // A body with nothing left to deliver (only its end is
                    // missing) is never judged, and its waiting is not
                    // counted.
                    if remaining == Some(0) {
                        rate.waited = 0;
                    } else {
                        if rate.evaluate(remaining).is_err() {
                            self.failed = Some(TimeoutStage::BodyRate);
                            return Poll::Ready(Some(Err(TimedError::Timeout(
                                TimeoutStage::BodyRate,
                            ))));
                        }
                        self.pending_since = Some(now);
                        wake_at = Some(now + rate.time_left());
                    }
                }
                if let Some(idle) = self.idle {
                    let since = *self.idle_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= idle {
                        self.failed = Some(TimeoutStage::BodyIdle);
                        return Poll::Ready(Some(Err(TimedError::Timeout(TimeoutStage::BodyIdle))));
                    }
                    let at = since + idle;
                    wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                }
                // One timer, at the earliest limit; the deadline wins a tie.
                let earliest = match (self.deadline, wake_at) {
                    (Some(deadline), Some(at)) if at < deadline => Some((at, false)),
                    (Some(deadline), _) => Some((deadline, true)),
                    (None, Some(at)) => Some((at, false)),
                    (None, None) => None,
                };
                if let Some((at, deadline)) = earliest {
                    if timer.arm(at, cx) {
                        if deadline {
                            return Poll::Ready(Some(Err(TimedError::Timeout(
                                TimeoutStage::Deadline,
                            ))));
                        }
                        // Already due: come back at once to judge it.
                        cx.waker().wake_by_ref();
                    }
                }
                Poll::Pending
            }
        }
    }
}

/// Where the engine's one timer lives: a lazily boxed `Sleep` (a body of
/// its own) or a pinned one it borrows (the stack's in-attempt read).
pub(crate) trait Timer {
    /// Whether the timer has fired; `None` if it was never armed. Polls
    /// it (registering the task) when armed.
    fn fired(&mut self, cx: &mut Context<'_>) -> Option<bool>;
    /// Arm the timer at `at` (reset if it was armed at another instant)
    /// and poll it; `true` if it is already due.
    fn arm(&mut self, at: Instant, cx: &mut Context<'_>) -> bool;
}

impl Timer for &mut Option<Pin<Box<Sleep>>> {
    fn fired(&mut self, cx: &mut Context<'_>) -> Option<bool> {
        self.as_mut()
            .map(|sleep| sleep.as_mut().poll(cx).is_ready())
    }

    fn arm(&mut self, at: Instant, cx: &mut Context<'_>) -> bool {
        let sleep = match &mut **self {
            Some(sleep) => {
                if sleep.deadline() != at {
                    sleep.as_mut().reset(at);
                }
                sleep
            }
            None => self.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        sleep.as_mut().poll(cx).is_ready()
    }
}

impl Timer for Pin<&mut Sleep> {
    fn fired(&mut self, cx: &mut Context<'_>) -> Option<bool> {
        Some(self.as_mut().poll(cx).is_ready())
    }

    fn arm(&mut self, at: Instant, cx: &mut Context<'_>) -> bool {
        if self.deadline() != at {
            self.as_mut().reset(at);
        }
        self.as_mut().poll(cx).is_ready()
    }
}

// ===== impl BodyTimer =====

/// What [`BodyTimer::poll_frame`] returns for a body `B`: its next frame,
/// its end, or why it failed.
pub type TimedFrame<B> =
    Poll<Option<Result<Frame<<B as Body>::Data>, TimedError<<B as Body>::Error>>>>;

/// Why [`BodyTimer::poll_frame`] failed.
#[derive(Debug)]
pub enum TimedError<E> {
    /// The inner body failed.
    Body(E),
    /// A limit passed: [`TimeoutStage::BodyIdle`],
    /// [`TimeoutStage::BodyRate`] or [`TimeoutStage::Deadline`].
    Timeout(TimeoutStage),
}

/// The body-timeout engine: the state of one response body's limits and
/// its one lazily boxed timer; see the [module docs](self).
///
/// A wrapper body keeps one, next to its inner body, and reads every frame
/// through [`poll_frame`](Self::poll_frame).
pub struct BodyTimer {
    clock: BodyClock,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl BodyTimer {
    /// A timer for `timeouts`, with no deadline.
    pub fn new(timeouts: BodyTimeouts) -> Self {
        BodyTimer {
            clock: BodyClock::new(timeouts, None),
            sleep: None,
        }
    }

    /// Also fail a read once `deadline` has passed
    /// ([`TimeoutStage::Deadline`]).
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.clock.deadline = Some(deadline);
        self
    }

    /// The deadline, if any.
    pub fn get_deadline(&self) -> Option<Instant> {
        self.clock.deadline
    }

    /// The idle and rate timeouts.
    pub fn timeouts(&self) -> BodyTimeouts {
        self.clock.timeouts()
    }

    /// The idle or rate timeout that failed the body, if one did (a
    /// failure is final: every later poll returns it again).
    pub fn failed(&self) -> Option<TimeoutStage> {
        self.clock.failed()
    }

    /// Whether the timer was ever armed (the inner body was pending with a
    /// limit set).
    pub fn is_armed(&self) -> bool {
        self.sleep.is_some()
    }

    /// Whether reading a body that is never pending (already in memory;
    /// `at_end`: nothing left to read) fails at the deadline now: a clock
    /// read, no timer.
    #[cfg(feature = "stack")]
    pub(crate) fn poll_deadline(&self, at_end: bool) -> Option<TimeoutStage> {
        let deadline = self.clock.deadline?;
        (!at_end && Instant::now() >= deadline).then_some(TimeoutStage::Deadline)
    }

    /// The next frame of `body`, with the limits applied.
    pub fn poll_frame<B: Body>(
        &mut self,
        body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> TimedFrame<B> {
        self.clock.poll_frame(&mut self.sleep, body, cx)
    }
}

impl fmt::Debug for BodyTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.timeouts();
        f.debug_struct("BodyTimer")
            .field("idle", &t.idle)
            .field("min_rate", &t.min_rate)
            .field("deadline", &self.clock.deadline)
            .field("failed", &self.clock.failed)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use bytes::Bytes;
    use http_body_util::StreamBody;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    type Frames =
        StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>;

    /// A body that sends `n` bytes at once, then stalls for good.
    fn stalls_after(n: usize) -> Frames {
        use futures_util::StreamExt;
        let first = futures_util::stream::iter([Ok(Frame::data(Bytes::from(vec![b'x'; n])))]);
        StreamBody::new(first.chain(futures_util::stream::pending()).boxed())
    }

    /// Frames of `n` bytes every `every`, for ever.
    fn trickle(n: usize, every: Duration) -> Frames {
        use futures_util::StreamExt;
        StreamBody::new(
            futures_util::stream::unfold((), move |()| async move {
                tokio::time::sleep(every).await;
                Some((Ok(Frame::data(Bytes::from(vec![b'x'; n]))), ()))
            })
            .boxed(),
        )
    }

    /// Read `body` through `timer` until it fails; the stage and when.
    async fn fails(mut timer: BodyTimer, body: Frames) -> (TimeoutStage, Duration) {
        let start = Instant::now();
        let mut body = std::pin::pin!(body);
        loop {
            match poll_fn(|cx| timer.poll_frame(body.as_mut(), cx)).await {
                Some(Ok(_)) => continue,
                Some(Err(TimedError::Timeout(stage))) => return (stage, start.elapsed()),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_limit_fails_the_body() {
        let idle = BodyTimeouts::new().idle(ms(300));
        // Idle before the deadline.
        let timer = BodyTimer::new(idle).deadline(Instant::now() + ms(1000));
        assert_eq!(
            fails(timer, stalls_after(10)).await,
            (TimeoutStage::BodyIdle, ms(300))
        );
        // The deadline before idle.
        let timer = BodyTimer::new(idle).deadline(Instant::now() + ms(200));
        assert_eq!(
            fails(timer, stalls_after(10)).await,
            (TimeoutStage::Deadline, ms(200))
        );
        // Both at once: the deadline wins, as when the deadline's body
        // wrapped the idle one.
        let timer = BodyTimer::new(idle).deadline(Instant::now() + ms(300));
        assert_eq!(
            fails(timer, stalls_after(10)).await,
            (TimeoutStage::Deadline, ms(300))
        );
        // A rate checkpoint before the deadline.
        let rate = BodyTimeouts::new().min_rate(MinBodyRate::new(1000, ms(500)).grace(ms(200)));
        let timer = BodyTimer::new(rate).deadline(Instant::now() + ms(5000));
        let (stage, took) = fails(timer, trickle(10, ms(100))).await;
        assert_eq!(stage, TimeoutStage::BodyRate);
        assert!(took >= ms(700) && took <= ms(800), "{took:?}");
        // A deadline before the rate checkpoint, frames keep coming.
        let timer = BodyTimer::new(rate).deadline(Instant::now() + ms(450));
        let (stage, took) = fails(timer, trickle(10, ms(100))).await;
        assert_eq!(stage, TimeoutStage::Deadline);
        assert!(took >= ms(450) && took <= ms(500), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn one_timer_armed_only_once_the_body_waits() {
        // Every frame ready: no timer, even with every limit set.
        let all = BodyTimeouts::new()
            .idle(ms(300))
            .min_rate(MinBodyRate::new(1000, ms(500)));
        let mut timer = BodyTimer::new(all).deadline(Instant::now() + ms(1000));
        let mut body = std::pin::pin!(http_body_util::Full::new(Bytes::from("ready")));
        let frame = poll_fn(|cx| timer.poll_frame(body.as_mut(), cx)).await;
        assert!(frame.unwrap().is_ok());
        assert!(poll_fn(|cx| timer.poll_frame(body.as_mut(), cx))
            .await
            .is_none());
        assert!(!timer.is_armed());

        // A body that waits arms it; the idle failure then stays.
        let mut timer = BodyTimer::new(all).deadline(Instant::now() + ms(1000));
        let mut body = std::pin::pin!(stalls_after(10));
        assert!(poll_fn(|cx| timer.poll_frame(body.as_mut(), cx))
            .await
            .unwrap()
            .is_ok());
        let err = poll_fn(|cx| timer.poll_frame(body.as_mut(), cx)).await;
        assert!(timer.is_armed());
        assert!(matches!(
            err,
            Some(Err(TimedError::Timeout(TimeoutStage::BodyIdle)))
        ));
        assert_eq!(timer.failed(), Some(TimeoutStage::BodyIdle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_at_its_end_is_not_cut_by_the_deadline() {
        let mut timer = BodyTimer::new(BodyTimeouts::new()).deadline(Instant::now());
        let mut body = std::pin::pin!(http_body_util::Empty::<Bytes>::new());
        assert!(poll_fn(|cx| timer.poll_frame(body.as_mut(), cx))
            .await
            .is_none());
        // One with bytes left is.
        let mut body = std::pin::pin!(http_body_util::Full::new(Bytes::from("late")));
        assert!(matches!(
            poll_fn(|cx| timer.poll_frame(body.as_mut(), cx)).await,
            Some(Err(TimedError::Timeout(TimeoutStage::Deadline)))
        ));
    }
}
