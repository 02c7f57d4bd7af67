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
//! use rebound_hyper::{BodyTimeouts, TransportBody};
//!
//! // A body that sends one chunk and then stalls.
//! let stalled = http_body_util::StreamBody::new(futures_util::stream::unfold(0, |n| async move {
//!     if n > 0 {
//!         std::future::pending::<()>().await;
//!     }
//!     Some((Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from("head"))), n + 1))
//! }));
//! let timeouts = BodyTimeouts::new().idle(Duration::from_secs(5));
//! let mut body = Box::pin(TransportBody::new(stalled, timeouts));
//! assert!(body.frame().await.unwrap().is_ok());
//! let err = body.frame().await.unwrap().unwrap_err();
//! assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyIdle));
//! # Ok(())
//! # }
//! ```
//!
//! [`TransportBody`] wraps the body of a response (hyper's `Incoming` in the
//! transport) with two optional timeouts, both measured **only while the
//! caller is waiting for the body** (a caller that is busy elsewhere between
//! two reads never trips them):
//!
//! * **idle** ([`BodyTimeouts::idle`]): no frame arrived for `d` while the
//!   caller was waiting → [`TimeoutStage::BodyIdle`].
//! * **minimum rate** ([`MinBodyRate`]): after a grace period, in each
//!   window of waiting time the body must deliver at least
//!   `bytes_per_sec × window` bytes — or all the bytes it still has to
//!   deliver, whichever is fewer — else → [`TimeoutStage::BodyRate`].
//!
//! The policy is rebound-core's body-timeout engine
//! ([`rebound_core::body_timeout`], which says it in full: small and
//! finished bodies are never judged, time the caller spends not polling is
//! not counted); this wrapper adds what the transport knows: its errors'
//! kinds, the request's name and the shutdown's guard. The ready-made
//! [`Client`](crate::Client) does not use it: its stack's one body wrapper
//! runs the same engine over hyper's body.
//!
//! Errors have kind `Timeout(stage)` for the two timeouts and
//! [`ErrorKind::Body`](rebound_core::ErrorKind::Body) for a failed read
//! (reset, truncated body, ...); all carry
//! [`Sent::MaybeProcessed`](rebound_core::Sent) and name the request when
//! the transport made the body.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use rebound_core::body_timeout::{BodyTimer, TimedError};
use rebound_core::shutdown::OpenBody;
use rebound_core::{BoxError, Error, Sent, TimeoutStage};

use crate::error::{from_body, RequestName};

pub use rebound_core::body_timeout::{BodyTimeouts, MinBodyRate};
pub(crate) use rebound_core::config::validate_duration as validate;

// ===== impl ResponseBody =====

pin_project! {
    /// A response body with idle and minimum-rate timeouts; see the
    /// [module docs](self).
    ///
    /// With no timeouts configured it is a plain pass-through (no timer is
    /// ever created, no clock read).
    pub struct TransportBody<B = hyper::body::Incoming> {
        #[pin]
        inner: B,
        timer: BodyTimer,
        request: Option<RequestName>,
        // Counted by a shutdown until the body ends.
        open: Option<OpenBody>,
    }
}

/// The old name of [`TransportBody`].
#[deprecated(
    since = "0.1.0",
    note = "renamed `TransportBody`: the transport's response body (the ready-made client's is `ClientBody`)"
)]
pub type ResponseBody<B = hyper::body::Incoming> = TransportBody<B>;

impl<B> TransportBody<B> {
    /// Wrap `body` with `timeouts`.
    pub fn new(body: B, timeouts: BodyTimeouts) -> Self {
        TransportBody {
            inner: body,
            timer: BodyTimer::new(timeouts),
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

impl<B> fmt::Debug for TransportBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.timer.timeouts();
        f.debug_struct("TransportBody")
            .field("idle", &t.idle_timeout())
            .field("min_rate", &t.min_body_rate())
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

impl<B> Body for TransportBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let out = match this.timer.poll_frame(this.inner.as_mut(), cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => None,
            Poll::Ready(Some(Ok(frame))) => Some(Ok(frame)),
            Poll::Ready(Some(Err(TimedError::Timeout(stage)))) => {
                Some(Err(body_timeout(stage, this.request)))
            }
            Poll::Ready(Some(Err(TimedError::Body(e)))) => {
                Some(Err(read_error(e.into(), this.request)))
            }
        };
        // The shutdown's guard goes when the body ends (its last frame, its
        // end, or an error); a read that failed because the shutdown cut
        // the connection says so.
        let ended = this.open.is_some()
            && match &out {
                Some(Ok(_)) => this.inner.is_end_stream(),
                _ => true,
            };
        if !ended {
            return Poll::Ready(out);
        }
        let cut = this.open.take().is_some_and(|open| open.is_cut());
        Poll::Ready(match out {
            Some(Err(err)) if cut && err.kind() == rebound_core::ErrorKind::Body => {
                Some(Err(cut_error(err, this.request)))
            }
            out => out,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.timer.failed().is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::{Buf, Bytes};
    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::time::Instant;

    use super::*;
    use rebound_core::ErrorKind;

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

    async fn read_all<B>(body: TransportBody<B>) -> Result<usize, Error>
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
        assert!(matches!(
            MinBodyRate::try_new(0, ms(1000)).unwrap_err().kind(),
            ErrorKind::Config
        ));
        assert!(matches!(
            MinBodyRate::try_new(1, ms(10)).unwrap_err().kind(),
            ErrorKind::Config
        ));
        assert!(matches!(
            BodyTimeouts::new()
                .try_idle(Duration::ZERO)
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
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
            read_all(TransportBody::new(scripted(chunks, false, false), t))
                .await
                .unwrap(),
            30
        );

        let start = Instant::now();
        let chunks = vec![(10, ms(0)), (10, ms(900))];
        let err = read_all(TransportBody::new(scripted(chunks, false, true), t))
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
        let mut body = Box::pin(TransportBody::new(scripted(chunks, false, false), t));
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
        let err = read_all(TransportBody::new(
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
        let n = read_all(TransportBody::new(
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
        let mut body = Box::pin(TransportBody::new(
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
        let mut body = Box::pin(TransportBody::new(
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
        let mut body = Box::pin(TransportBody::new(
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
            let err = read_all(TransportBody::new(StreamBody::new(s), t))
                .await
                .unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::Body));
            assert_eq!(err.to_string(), "body error: connection reset");
        }
    }
}
