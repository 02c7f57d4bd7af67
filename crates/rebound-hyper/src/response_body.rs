//! Response-body timeouts: idle and minimum rate.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::BodyExt;
//! use rebound_core::TimeoutStage;
//! use rebound_hyper::{BodyTimeouts, ResponseBody};
//!
//! // A body that sends one chunk and then stalls.
//! let stalled = http_body_util::StreamBody::new(futures_util::stream::unfold(0, |n| async move {
//!     if n > 0 {
//!         std::future::pending::<()>().await;
//!     }
//!     Some((Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from("head"))), n + 1))
//! }));
//! let timeouts = BodyTimeouts::new().idle(Duration::from_secs(5));
//! let mut body = Box::pin(ResponseBody::new(stalled, timeouts));
//! assert!(body.frame().await.unwrap().is_ok());
//! let err = body.frame().await.unwrap().unwrap_err();
//! assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyIdle));
//! # Ok(())
//! # }
//! ```
//!
//! [`ResponseBody`] wraps the body of a response (hyper's `Incoming` in the
//! transport) with two optional timeouts, both measured **only while the
//! caller is waiting for the body** (a caller that is busy elsewhere between
//! two reads never trips them):
//!
//! * **idle** ([`BodyTimeouts::idle`]): no frame arrived for `d` while the
//!   caller was waiting → [`TimeoutStage::BodyIdle`].
//! * **minimum rate** ([`MinBodyRate`]): modelled on the AWS SDKs'
//!   stalled-stream protection. After a grace period, the waiting time is cut
//!   into windows; in each window the body must deliver at least
//!   `bytes_per_sec × window` bytes — or all the bytes it still has to
//!   deliver, whichever is fewer — else → [`TimeoutStage::BodyRate`].
//!
//!   Unlike AWS's first versions it has no false positives on **small** or
//!   **finished** bodies: a body whose remaining length (from
//!   `Content-Length`) is smaller than a window's quota only has to deliver
//!   what it still owes, a body with nothing left to deliver (only its end,
//!   or its trailers, are missing) is never judged, and time the caller
//!   spends not polling the body is not counted at all. One limit remains: a
//!   body of unknown length (chunked) cannot be known to be finished before
//!   its end arrives, so a chunked body slow to *end* is judged like one slow
//!   to deliver.
//!
//! Errors have kind `Timeout(stage)` for the two timeouts and
//! [`ErrorKind::Body`](rebound_core::ErrorKind::Body) for a failed read
//! (reset, truncated body, ...); all carry
//! [`Sent::MaybeProcessed`](rebound_core::Sent) and name the request when
//! the transport made the body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use rebound_core::shutdown::OpenBody;
use rebound_core::{BoxError, Error, Sent, TimeoutStage};
use tokio::time::{Instant, Sleep};

use crate::error::{from_body, RequestName};

pub(crate) use rebound_core::config::validate_duration as validate;
use rebound_core::config::MAX_DURATION;

// ===== impl MinBodyRate =====

/// A minimum response-body rate; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinBodyRate {
    bytes_per_sec: u64,
    window: Duration,
    grace: Duration,
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
        rebound_core::config::expect_valid("MinBodyRate::new", Self::try_new(bytes_per_sec, window))
    }

    /// At least `bytes_per_sec` bytes per second, judged over windows of
    /// `window` of waiting time. The grace period defaults to `window`.
    ///
    /// # Errors
    ///
    /// A [configuration error](Error::is_config) if `bytes_per_sec` is zero,
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
            window,
            grace: window,
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
        rebound_core::config::expect_valid("BodyTimeouts::grace", self.try_grace(grace))
    }

    /// Waiting time at the start of the body that is not judged (time to
    /// the first bytes can be long). Zero is allowed. Default: the window.
    ///
    /// # Errors
    ///
    /// A [configuration error](Error::is_config) if `grace` is over a day.
    pub fn try_grace(mut self, grace: Duration) -> Result<Self, Error> {
        if grace > MAX_DURATION {
            return Err(Error::config(format!(
                "minimum body rate grace of {grace:?} is longer than the maximum of {MAX_DURATION:?}"
            )));
        }
        self.grace = grace;
        Ok(self)
    }

    /// The minimum rate in bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The grace period.
    pub fn grace_period(&self) -> Duration {
        self.grace
    }

    fn quota(&self, waited: Duration) -> u64 {
        let q = u128::from(self.bytes_per_sec) * waited.as_nanos() / 1_000_000_000;
        u64::try_from(q).unwrap_or(u64::MAX).max(1)
    }
}

// ===== impl BodyTimeouts =====

/// The timeouts applied to a response body: none by default.
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
        rebound_core::config::expect_valid("BodyTimeouts::idle", self.try_idle(d))
    }

    /// Fail when no frame arrives for `d` while the caller waits.
    ///
    /// # Errors
    ///
    /// A [configuration error](Error::is_config) if `d` is zero or over a
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
}

// ===== rate accounting =====

#[derive(Debug)]
struct Rate {
    cfg: MinBodyRate,
    in_grace: bool,
    /// Waiting time in the current period (grace or window).
    waited: Duration,
    /// Bytes delivered in the current window.
    bytes: u64,
    /// Upper bound of what the body still had to deliver when the window
    /// started (`None`: unknown).
    remaining_at_start: Option<u64>,
    /// With no grace period, the first window starts at the first poll.
    first_window_unstarted: bool,
}

impl Rate {
    fn new(cfg: MinBodyRate) -> Self {
        Rate {
            cfg,
            in_grace: !cfg.grace.is_zero(),
            waited: Duration::ZERO,
            bytes: 0,
            remaining_at_start: None,
            first_window_unstarted: cfg.grace.is_zero(),
        }
    }

    fn period(&self) -> Duration {
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
            let quota = self.cfg.quota(self.waited);
            let quota = match self.remaining_at_start {
                Some(left) => quota.min(left),
                None => quota,
            };
            if self.bytes < quota {
                return Err(());
            }
        }
        self.in_grace = false;
        self.waited = Duration::ZERO;
        self.bytes = 0;
        self.remaining_at_start = remaining;
        Ok(())
    }

    fn time_left(&self) -> Duration {
        self.period().saturating_sub(self.waited)
    }
}

// ===== impl ResponseBody =====

pin_project! {
    /// A response body with idle and minimum-rate timeouts; see the
    /// [module docs](self).
    ///
    /// With no timeouts configured it is a plain pass-through (no timer is
    /// ever created).
    pub struct ResponseBody<B = hyper::body::Incoming> {
        #[pin]
        inner: B,
        idle: Option<Duration>,
        // When the caller started waiting with no frame (idle timer).
        idle_since: Option<Instant>,
        rate: Option<Rate>,
        // When the last poll returned `Pending` (rate accounting).
        pending_since: Option<Instant>,
        sleep: Option<Pin<Box<Sleep>>>,
        failed: Option<TimeoutStage>,
        request: Option<RequestName>,
        // Counted by a shutdown until the body ends.
        open: Option<OpenBody>,
    }
}

impl<B> ResponseBody<B> {
    /// Wrap `body` with `timeouts`.
    pub fn new(body: B, timeouts: BodyTimeouts) -> Self {
        ResponseBody {
            inner: body,
            idle: timeouts.idle,
            idle_since: None,
            rate: timeouts.min_rate.map(Rate::new),
            pending_since: None,
            sleep: None,
            failed: None,
            request: None,
            open: None,
        }
    }

    pub(crate) fn named(mut self, request: RequestName) -> Self {
        self.request = Some(request);
        self
    }

    pub(crate) fn tracked(mut self, open: Option<OpenBody>) -> Self {
        self.open = open;
        self
    }

    /// A reference to the inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("idle", &self.idle)
            .field("min_rate", &self.rate.as_ref().map(|r| r.cfg))
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

fn read_error(e: BoxError, request: &Option<RequestName>) -> Error {
    let err = from_body(e);
    match request {
        Some(r) => r.name(err),
        None => err,
    }
}

/// A read that failed after a shutdown ended (its connections are closed):
/// [`ErrorKind::Closed`](rebound_core::ErrorKind::Closed), the failure as
/// its source.
fn cut_error(err: Error, request: &Option<RequestName>) -> Error {
    let mut cut = Error::new(rebound_core::ErrorKind::Closed)
        .with_detail("response body cut at the end of the shutdown's grace period")
        .with_source(err);
    cut.extensions_mut().insert(Sent::MaybeProcessed);
    match request {
        Some(r) => r.name(cut),
        None => cut,
    }
}

fn body_timeout(stage: TimeoutStage, request: &Option<RequestName>) -> Error {
    let mut err = Error::timeout(stage);
    if let Some(r) = request {
        err = r.name(err);
    }
    err.extensions_mut().insert(Sent::MaybeProcessed);
    err
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let out = self.as_mut().poll_timed(cx);
        // The shutdown's guard goes when the body ends (its last frame, its
        // end, or an error); a read that failed because the shutdown cut
        // the connection says so.
        let this = self.project();
        let ended = this.open.is_some()
            && match &out {
                Poll::Pending => false,
                Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
                Poll::Ready(_) => true,
            };
        if !ended {
            return out;
        }
        let cut = this.open.take().is_some_and(|open| open.is_cut());
        match out {
            Poll::Ready(Some(Err(err))) if cut && err.kind() == rebound_core::ErrorKind::Body => {
                Poll::Ready(Some(Err(cut_error(err, this.request))))
            }
            out => out,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// The next frame, with the timeouts applied.
    fn poll_timed(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Error>>> {
        let mut this = self.project();
        if let Some(stage) = *this.failed {
            return Poll::Ready(Some(Err(body_timeout(stage, this.request))));
        }
        if this.idle.is_none() && this.rate.is_none() {
            return match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(e))) => {
                    Poll::Ready(Some(Err(read_error(e.into(), this.request))))
                }
                Poll::Ready(None) => Poll::Ready(None),
            };
        }

        let now = Instant::now();
        // Time the caller spent waiting since our last `Pending` counts
        // towards the rate window; time between a frame and the next poll
        // (the caller busy elsewhere) does not.
        if let (Some(since), Some(rate)) = (this.pending_since.take(), this.rate.as_mut()) {
            rate.waited += now.saturating_duration_since(since);
        }

        if let Some(rate) = this.rate.as_mut() {
            if rate.first_window_unstarted {
                rate.first_window_unstarted = false;
                rate.remaining_at_start = this.inner.size_hint().upper();
            }
        }

        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.idle_since = None;
                if let (Some(data), Some(rate)) = (frame.data_ref(), this.rate.as_mut()) {
                    if !rate.in_grace {
                        rate.bytes = rate.bytes.saturating_add(data.remaining() as u64);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(read_error(e.into(), this.request)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let remaining = this.inner.size_hint().upper();
                let mut wake_at: Option<Instant> = None;
                if let Some(rate) = this.rate.as_mut() {
                    // A body with nothing left to deliver (only its end is
                    // missing) is never judged, and its waiting is not
                    // counted.
                    if remaining == Some(0) {
                        rate.waited = Duration::ZERO;
                    } else {
                        if rate.evaluate(remaining).is_err() {
                            *this.failed = Some(TimeoutStage::BodyRate);
                            return Poll::Ready(Some(Err(body_timeout(
                                TimeoutStage::BodyRate,
                                this.request,
                            ))));
                        }
                        *this.pending_since = Some(now);
                        wake_at = Some(now + rate.time_left());
                    }
                }
                if let Some(idle) = *this.idle {
                    let since = *this.idle_since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= idle {
                        *this.failed = Some(TimeoutStage::BodyIdle);
                        return Poll::Ready(Some(Err(body_timeout(
                            TimeoutStage::BodyIdle,
                            this.request,
                        ))));
                    }
                    let at = since + idle;
                    wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                }
                if let Some(at) = wake_at {
                    let sleep = match this.sleep {
                        Some(sleep) => {
                            if sleep.deadline() != at {
                                sleep.as_mut().reset(at);
                            }
                            sleep
                        }
                        None => this.sleep.insert(Box::pin(tokio::time::sleep_until(at))),
                    };
                    if sleep.as_mut().poll(cx).is_ready() {
                        // Already due: come back at once to judge it.
                        cx.waker().wake_by_ref();
                    }
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    type Chunks =
        Pin<Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send>>;

    /// A body that yields `chunks` (size, delay before it) then ends, with an
    /// exact length when `exact` is set.
    struct Scripted {
        inner: StreamBody<Chunks>,
        left: Option<u64>,
    }

    impl Body for Scripted {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            let res = Pin::new(&mut self.inner).poll_frame(cx);
            if let Poll::Ready(Some(Ok(f))) = &res {
                if let (Some(left), Some(d)) = (self.left.as_mut(), f.data_ref()) {
                    *left -= d.len() as u64;
                }
            }
            res
        }
        fn size_hint(&self) -> SizeHint {
            match self.left {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            }
        }
    }

    fn scripted(chunks: Vec<(usize, Duration)>, exact: bool, then_stall: bool) -> Scripted {
        let total: u64 = chunks.iter().map(|c| c.0 as u64).sum();
        let s = stream::iter(chunks)
            .then(|(n, d)| async move {
                tokio::time::sleep(d).await;
                Ok(Frame::data(Bytes::from(vec![b'x'; n])))
            })
            .chain(stream::once(async move {
                if then_stall {
                    std::future::pending::<()>().await;
                }
                Err(std::io::Error::other("end"))
            }))
            .take_while(|r| std::future::ready(r.is_ok()));
        Scripted {
            inner: StreamBody::new(Box::pin(s) as Chunks),
            left: exact.then_some(total),
        }
    }

    use futures_util::StreamExt;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    async fn read_all<B>(body: ResponseBody<B>) -> Result<usize, Error>
    where
        B: Body + Send + 'static,
        B::Error: Into<BoxError>,
        B::Data: Buf,
    {
        let mut body = Box::pin(body);
        let mut n = 0;
        while let Some(f) = body.frame().await {
            if let Some(d) = f?.data_ref() {
                n += d.remaining();
            }
        }
        Ok(n)
    }

    fn rate(bps: u64, window_ms: u64, grace_ms: u64) -> BodyTimeouts {
        BodyTimeouts::new().min_rate(
            MinBodyRate::try_new(bps, ms(window_ms))
                .unwrap()
                .try_grace(ms(grace_ms))
                .unwrap(),
        )
    }

    #[test]
    fn config_is_validated() {
        assert!(MinBodyRate::try_new(0, ms(1000)).unwrap_err().is_config());
        assert!(MinBodyRate::try_new(1, ms(10)).unwrap_err().is_config());
        assert!(BodyTimeouts::new()
            .try_idle(Duration::ZERO)
            .unwrap_err()
            .is_config());
        assert_eq!(
            MinBodyRate::try_new(1, ms(1000)).unwrap().grace_period(),
            ms(1000)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_fires_only_after_d_without_a_frame() {
        let chunks = vec![(10, ms(0)), (10, ms(900)), (10, ms(900))];
        let t = BodyTimeouts::new().try_idle(ms(1000)).unwrap();
        assert_eq!(
            read_all(ResponseBody::new(scripted(chunks, false, false), t))
                .await
                .unwrap(),
            30
        );

        let start = Instant::now();
        let chunks = vec![(10, ms(0)), (10, ms(900))];
        let err = read_all(ResponseBody::new(scripted(chunks, false, true), t))
            .await
            .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyIdle));
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
        assert_eq!(Instant::now() - start, ms(1900));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_does_not_count_time_the_caller_is_busy() {
        let chunks = vec![(10, ms(0)), (10, ms(0))];
        let t = BodyTimeouts::new().try_idle(ms(100)).unwrap();
        let mut body = Box::pin(ResponseBody::new(scripted(chunks, false, false), t));
        body.frame().await.unwrap().unwrap();
        tokio::time::sleep(ms(5000)).await; // caller busy
        body.frame().await.unwrap().unwrap();
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn trickle_fails_the_rate_after_grace_and_one_window() {
        // 10 bytes every 100 ms = 100 B/s, minimum 1000 B/s.
        let chunks = vec![(10, ms(100)); 100];
        let start = Instant::now();
        let err = read_all(ResponseBody::new(
            scripted(chunks, false, false),
            rate(1000, 1000, 500),
        ))
        .await
        .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyRate));
        let took = Instant::now() - start;
        assert!(took >= ms(1500) && took <= ms(1700), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn fast_enough_bodies_pass() {
        // 200 bytes every 100 ms = 2000 B/s over 5 s, minimum 1000 B/s.
        let chunks = vec![(200, ms(100)); 50];
        let n = read_all(ResponseBody::new(
            scripted(chunks, false, false),
            rate(1000, 1000, 0),
        ))
        .await
        .unwrap();
        assert_eq!(n, 10_000);
    }

    #[tokio::test(start_paused = true)]
    async fn small_or_finished_bodies_are_not_judged() {
        // A 30-byte body (Content-Length known) whose bytes all arrive, then
        // whose end does not come (e.g. HTTP/2 trailers pending): far under
        // 1000 B/s overall, yet nothing is left to deliver, so no rate error
        // (the idle timeout is the tool for a missing end).
        let chunks = vec![(10, ms(0)), (10, ms(400)), (10, ms(400))];
        let mut body = Box::pin(ResponseBody::new(
            scripted(chunks, true, true),
            rate(1000, 1000, 0),
        ));
        for _ in 0..3 {
            body.frame().await.unwrap().unwrap();
        }
        let r = tokio::time::timeout(ms(5000), body.frame()).await;
        assert!(r.is_err(), "no error while nothing is left to deliver");

        // The same body still missing its last bytes after a full window is
        // judged: it must deliver what it still owes within the window.
        let chunks = vec![(10, ms(0)), (10, ms(400))];
        let mut body = Box::pin(ResponseBody::new(
            Scripted {
                left: Some(30),
                ..scripted(chunks, false, true)
            },
            rate(1000, 1000, 0),
        ));
        let start = Instant::now();
        let err = loop {
            match body.frame().await.unwrap() {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyRate));
        assert_eq!(Instant::now() - start, ms(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_does_not_count_time_the_caller_is_not_polling() {
        // All data is ready; the caller reads 1 byte-chunk every 2 s (slow
        // consumer). The body is never the bottleneck: no error.
        let chunks = vec![(1, ms(0)); 5];
        let mut body = Box::pin(ResponseBody::new(
            scripted(chunks, false, false),
            rate(1000, 1000, 0),
        ));
        for _ in 0..5 {
            body.frame().await.unwrap().unwrap();
            tokio::time::sleep(ms(2000)).await;
        }
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn inner_errors_are_body_errors() {
        for t in [BodyTimeouts::new(), rate(1, 1000, 0)] {
            let s = stream::iter([
                Ok(Frame::data(Bytes::from("a"))),
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            ]);
            let err = read_all(ResponseBody::new(StreamBody::new(s), t))
                .await
                .unwrap_err();
            assert!(err.is_body());
            assert_eq!(err.to_string(), "body error: connection reset");
        }
    }
}
