//! [`StackBody`]: the one response-body wrapper of the whole stack.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::annotations::Sent;
use crate::body_timeout::{BodyTimeouts, BodyTimer, TimedError};
use crate::collect::CollectedBody;
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};
use crate::limit::HeldSlot;
use crate::redact::RequestName;
use crate::shutdown::OpenBody;
use crate::trace::{BodyWatch, Config as TraceConfig};

pin_project! {
    /// What an attempt's response carries on the stack's path: the
    /// transport's body as it streams in, or (a request that asked for its
    /// body to be read inside the attempt) that body already read: its
    /// bytes (taken by the first read) and its trailers, boxed (they are
    /// rare, and a `HeaderMap` would make every response body larger).
    #[project = PayloadProj]
    pub(crate) enum Payload<B> {
        Stream {
            #[pin]
            body: B,
        },
        Collected {
            data: Bytes,
            trailers: Option<Box<HeaderMap>>,
        },
    }
}

impl<B> Payload<B> {
    pub(crate) fn stream(body: B) -> Self {
        Payload::Stream { body }
    }

    pub(crate) fn collected(body: CollectedBody) -> Self {
        let (data, trailers) = body.into_parts();
        Payload::Collected {
            data,
            trailers: trailers.map(Box::new),
        }
    }
}

/// The next frame of a body read inside the attempt: its bytes, then its
/// trailers (what [`CollectedBody`] yields).
fn poll_collected(
    data: &mut Bytes,
    trailers: &mut Option<Box<HeaderMap>>,
) -> Option<Result<Frame<Bytes>, Infallible>> {
    if !data.is_empty() {
        return Some(Ok(Frame::data(std::mem::take(data))));
    }
    trailers.take().map(|t| Ok(Frame::trailers(*t)))
}

/// [`CollectedBody`]'s end and size, for the parts a payload keeps.
fn collected_at_end(data: &Bytes, trailers: &Option<Box<HeaderMap>>) -> bool {
    data.is_empty() && trailers.is_none()
}

impl<B> Body for Payload<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match self.project() {
            PayloadProj::Stream { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|frame| match frame {
                    // `Bytes` into `Bytes` moves; another `Buf` is copied.
                    Ok(frame) => Ok(frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))),
                    Err(e) => Err(Error::from_boxed(e.into())),
                })
            }),
            PayloadProj::Collected { data, trailers } => Poll::Ready(
                poll_collected(data, trailers).map(|frame| frame.map_err(|never| match never {})),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Payload::Stream { body } => body.is_end_stream(),
            Payload::Collected { data, trailers } => collected_at_end(data, trailers),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Payload::Stream { body } => body.size_hint(),
            Payload::Collected { data, .. } => SizeHint::with_exact(data.len() as u64),
        }
    }
}

/// How a [`StackBody`] reads: the body timeouts, and how the inner body's
/// errors become [`Error`]s (set on the [`StackLayer`](super::StackLayer)).
#[derive(Clone, Copy)]
pub(crate) struct BodyConfig {
    pub(crate) timeouts: BodyTimeouts,
    pub(crate) errors: fn(BoxError) -> Error,
    /// Record a committed gRPC call's status from its trailers
    /// ([`StackLayer::grpc_trailers`](super::StackLayer::grpc_trailers)).
    pub(crate) grpc_trailers: bool,
}

impl Default for BodyConfig {
    fn default() -> Self {
        BodyConfig {
            timeouts: BodyTimeouts::new(),
            errors: Error::from_boxed,
            grpc_trailers: false,
        }
    }
}

impl fmt::Debug for BodyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyConfig")
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// A body timeout's error: [`Sent::MaybeProcessed`] for idle and rate (the
/// head arrived), as the transport's body says; the deadline's as the
/// deadline layer's body makes it.
pub(crate) fn timeout_error(stage: TimeoutStage) -> Error {
    let mut err = Error::timeout(stage);
    if stage != TimeoutStage::Deadline {
        err.extensions_mut().insert(Sent::MaybeProcessed);
    }
    err
}

/// A read that failed after a shutdown ended (its connections are closed):
/// [`ErrorKind::Closed`], the failure as its source.
fn cut_error(err: Error) -> Error {
    let mut cut = Error::new(ErrorKind::Closed)
        .with_detail("response body cut at the end of the shutdown's grace period")
        .with_source(err);
    cut.extensions_mut().insert(Sent::MaybeProcessed);
    cut
}

pin_project! {
    /// The response body of a [`Stack`](super::Stack): the inner body,
    /// frame for frame (its data as [`Bytes`]), or the body already read
    /// for a request that asked for it
    /// ([`Stack::collect`](super::Stack::collect)). It is the stack's one
    /// body wrapper, doing what the stacked layers' and the transport's
    /// bodies did one wrapper each:
    ///
    /// * the **concurrency permit** is held until the body ends (its end of
    ///   stream or an error) or is dropped, as
    ///   [`LimitBody`](crate::limit::LimitBody) holds it;
    /// * the **body timeouts** ([`StackLayer::body_timeouts`](super::StackLayer::body_timeouts):
    ///   idle, minimum rate) and the **deadline** apply while the caller
    ///   reads, with [`TimeoutStage::BodyIdle`], [`TimeoutStage::BodyRate`]
    ///   and [`TimeoutStage::Deadline`] as the transport's body and
    ///   [`DeadlineBody`](crate::deadline::DeadlineBody) fail (the deadline
    ///   wins a tie; a body already at its end is not cut), all driven by
    ///   **one timer** ([`BodyTimer`]), created only once the inner body is
    ///   pending and then reset, never re-created;
    /// * the **shutdown guard** ([`ShutdownHandle::open_body`](crate::shutdown::ShutdownHandle::open_body),
    ///   taken when the response is handed out, only for a body with bytes
    ///   left) counts the body in a shutdown's grace period until it ends;
    ///   a read that fails once the shutdown has cut it fails with
    ///   [`ErrorKind::Closed`];
    /// * a **failure** after the head is logged at WARN (`response body
    ///   failed`) in the request span, and its error's path shown as the
    ///   trace configuration says, as [`TraceBody`](crate::trace::TraceBody)
    ///   does.
    ///
    /// A body already at its end holds neither the permit nor the guard.
    ///
    /// # Errors
    ///
    /// The inner body's errors (turned into [`Error`]s as the
    /// [`StackLayer::body_errors`](super::StackLayer::body_errors) says) and
    /// the timeouts above, naming the request.
    pub struct StackBody<B> {
        #[pin]
        inner: Payload<B>,
        timer: BodyTimer,
        permit: Option<OwnedSemaphorePermit>,
        // The adaptive limit's slot of the attempt that answered.
        slot: Option<HeldSlot>,
        // Counted by a shutdown until the body ends.
        open: Option<OpenBody>,
        // `None` once a failure has been logged.
        watch: Option<BodyWatch>,
        // How the errors' paths are shown, kept after the watch is gone.
        cfg: Option<Arc<TraceConfig>>,
        request: Option<RequestName>,
        errors: fn(BoxError) -> Error,
        // A committed gRPC call whose status (in the trailers) is still to
        // be recorded.
        grpc: bool,
    }
}

impl<B> StackBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(
        inner: Payload<B>,
        deadline: Instant,
        permit: Option<OwnedSemaphorePermit>,
        open: Option<OpenBody>,
        watch: Option<BodyWatch>,
        request: Option<RequestName>,
        body: &BodyConfig,
    ) -> Self {
        // A body that is already over (HEAD, 204, empty) holds nothing.
        let over = inner.is_end_stream();
        let (permit, open) = if over { (None, None) } else { (permit, open) };
        // A body read inside the attempt is in memory: only the deadline
        // applies to reading it.
        let timeouts = match &inner {
            Payload::Stream { .. } => body.timeouts,
            Payload::Collected { .. } => BodyTimeouts::new(),
        };
        StackBody {
            inner,
            timer: BodyTimer::new(timeouts).deadline(deadline),
            permit,
            slot: None,
            open,
            watch,
            cfg: None,
            request,
            errors: body.errors,
            grpc: false,
        }
    }

    /// Hold the adaptive limit's slot of the attempt that answered until
    /// the body ends (none for a body already over).
    pub(crate) fn holding_slot(mut self, slot: Option<HeldSlot>) -> Self {
        if !self.inner.is_end_stream() {
            self.slot = slot;
        }
        self
    }

    /// Record the status in this body's trailers (a committed gRPC call's),
    /// as [`GrpcTrailersLayer`](crate::grpc::GrpcTrailersLayer) does.
    pub(crate) fn watching_grpc(mut self, yes: bool) -> Self {
        self.grpc = yes;
        self
    }
}

impl<B> StackBody<B> {
    /// Whether this body still holds a concurrency permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// Whether this body still holds the adaptive limit's slot of the
    /// attempt that answered (until it ends or is dropped).
    pub fn holds_slot(&self) -> bool {
        self.slot.is_some()
    }

    /// Whether this body still counts in a shutdown (its guard).
    pub fn holds_shutdown(&self) -> bool {
        self.open.is_some()
    }

    /// The deadline reading this body is bound by.
    pub fn deadline(&self) -> Instant {
        self.timer
            .get_deadline()
            .expect("a stack body has a deadline")
    }

    /// The idle and rate timeouts reading this body is bound by (none for
    /// a body read inside the attempt).
    pub fn body_timeouts(&self) -> BodyTimeouts {
        self.timer.timeouts()
    }

    /// The inner body, unless it was read inside the attempt.
    pub fn get_ref(&self) -> Option<&B> {
        match &self.inner {
            Payload::Stream { body } => Some(body),
            Payload::Collected { .. } => None,
        }
    }

    /// Unwrap the inner body (the permits and the shutdown guard go back,
    /// and neither the timeouts, the deadline nor the failure log apply
    /// any more); `None` for a body read inside the attempt.
    pub fn into_inner(self) -> Option<B> {
        self.into_stream().map(|(body, _)| body)
    }

    /// Unwrap the inner body with its shutdown guard, for a wrapper that
    /// goes on counting it (the permit and the adaptive slot go back; the timeouts, the
    /// deadline and the failure log no longer apply); `None` for a body
    /// read inside the attempt.
    pub fn into_stream(self) -> Option<(B, Option<OpenBody>)> {
        match self.inner {
            Payload::Stream { body } => Some((body, self.open)),
            Payload::Collected { .. } => None,
        }
    }
}

impl<B> fmt::Debug for StackBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBody")
            .field("timer", &self.timer)
            .field("holds_permit", &self.permit.is_some())
            .field("holds_slot", &self.slot.is_some())
            .field("holds_shutdown", &self.open.is_some())
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl<B> Body for StackBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let (frame, at_end) = match this.inner.project() {
            PayloadProj::Stream { mut body } => {
                let frame = match ready!(this.timer.poll_frame(body.as_mut(), cx)) {
                    None => None,
                    // `Bytes` into `Bytes` moves; another `Buf` is copied.
                    Some(Ok(frame)) => {
                        Some(Ok(frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
                    }
                    Some(Err(TimedError::Timeout(stage))) => Some(Err(timeout_error(stage))),
                    Some(Err(TimedError::Body(e))) => {
                        let err = (this.errors)(e.into());
                        // A read that failed because the shutdown cut its
                        // connection says so.
                        let cut = this.open.as_ref().is_some_and(OpenBody::is_cut);
                        Some(Err(if cut && err.kind() == ErrorKind::Body {
                            cut_error(err)
                        } else {
                            err
                        }))
                    }
                };
                (frame, body.is_end_stream())
            }
            PayloadProj::Collected { data, trailers } => {
                // In memory: only the deadline applies.
                let frame = match this.timer.poll_deadline(collected_at_end(data, trailers)) {
                    Some(stage) => Some(Err(timeout_error(stage))),
                    None => {
                        poll_collected(data, trailers).map(|f| f.map_err(|never| match never {}))
                    }
                };
                (frame, collected_at_end(data, trailers))
            }
        };
        if *this.grpc {
            let code = match &frame {
                Some(Ok(f)) => f.trailers_ref().map(|t| {
                    // No status in the trailers: gRPC calls it UNKNOWN.
                    crate::grpc::Code::from_headers(t).unwrap_or(crate::grpc::Code::UNKNOWN)
                }),
                // A stream that ends without trailers has no status.
                None => Some(crate::grpc::Code::UNKNOWN),
                // A body error is the transport's to report (below).
                Some(Err(_)) => {
                    *this.grpc = false;
                    None
                }
            };
            if let Some(code) = code {
                *this.grpc = false;
                let span = match this.watch {
                    Some(watch) => watch.span.clone(),
                    None => tracing::Span::current(),
                };
                crate::grpc::record_trailers_status(span, code);
            }
        }
        let over = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => at_end,
        };
        if over {
            drop(this.permit.take());
            drop(this.slot.take());
            drop(this.open.take());
        }
        Poll::Ready(match frame {
            Some(Err(err)) => {
                let mut err = match this.request {
                    Some(r) => r.name(err),
                    None => err,
                };
                if let Some(watch) = this.watch.take() {
                    watch.cfg.redact_error(&mut err);
                    *this.cfg = Some(watch.failed(&err));
                } else if let Some(cfg) = this.cfg {
                    cfg.redact_error(&mut err);
                }
                Some(Err(err))
            }
            other => other,
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
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use futures_util::stream::{self, BoxStream, StreamExt};
    use http::{Request, Response};
    use http_body_util::{BodyExt, Full, StreamBody};
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::annotations::Attempts;
    use crate::deadline::DeadlineLayer;
    use crate::shutdown::ShutdownHandle;
    use crate::stack::StackLayer;

    type Chunks = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn get() -> Request<Full<Bytes>> {
        Request::get("http://api.example/v1")
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    /// `n` bytes at once, then (with `stall`) a wait for ever, else the end.
    fn chunks(n: usize, stall: bool) -> Chunks {
        let first = stream::iter([Ok(Frame::data(Bytes::from(vec![b'x'; n])))]);
        if stall {
            StreamBody::new(first.chain(stream::pending()).boxed())
        } else {
            StreamBody::new(first.boxed())
        }
    }

    /// A service whose responses have the bodies `make` gives for each call
    /// (counted from 0).
    fn service(
        make: fn(u32) -> Chunks,
    ) -> impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<Chunks>,
        Error = Infallible,
        Future = impl Send,
    > + Clone {
        let calls = std::sync::Arc::new(AtomicU32::new(0));
        tower::service_fn(move |_req: Request<Full<Bytes>>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok::<_, Infallible>(Response::new(make(n))))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_being_read_holds_the_shutdown_and_one_at_its_end_holds_nothing() {
        // Bytes left: counted until read to its end.
        let handle = ShutdownHandle::new();
        let stack = StackLayer::new().shutdown(Some(handle.clone()));
        let svc = stack.layer(service(|_| chunks(10, false)));
        let res = svc.oneshot(get()).await.unwrap();
        assert!(res.body().holds_shutdown());
        let start = Instant::now();
        let report = handle.shutdown(ms(500)).await;
        assert_eq!(start.elapsed(), ms(500), "waited for the unread body");
        assert_eq!(report.bodies_cut, 1);
        drop(res);

        // Read to its end: the guard goes with the last frame.
        let handle = ShutdownHandle::new();
        let stack = StackLayer::new().shutdown(Some(handle.clone()));
        let svc = stack.layer(service(|_| chunks(10, false)));
        let mut body = svc.oneshot(get()).await.unwrap().into_body();
        while body.frame().await.is_some() {}
        assert!(!body.holds_shutdown());
        let start = Instant::now();
        let report = handle.shutdown(ms(500)).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(report.bodies_cut, 0);

        // Already at its end (an empty body): no guard, no permit.
        let handle = ShutdownHandle::new();
        let stack = StackLayer::new()
            .shutdown(Some(handle.clone()))
            .concurrency_limit(Some(crate::limit::ConcurrencyLimitLayer::new(4)));
        let svc = stack.layer(tower::service_fn(|_req: Request<Full<Bytes>>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))))
        }));
        let kept = svc.oneshot(get()).await.unwrap();
        assert!(!kept.body().holds_shutdown());
        assert!(!kept.body().holds_permit());
        let start = Instant::now();
        let report = handle.shutdown(ms(500)).await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "an empty body is not in flight"
        );
        assert_eq!(report.bodies_cut, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_body_timeouts_and_the_deadline_share_one_timer() {
        let idle = BodyTimeouts::new().idle(ms(300));
        // A body whose frames are all ready arms no timer.
        let svc = StackLayer::new()
            .body_timeouts(idle)
            .layer(service(|_| chunks(10, false)));
        let mut body = svc.oneshot(get()).await.unwrap().into_body();
        while body.frame().await.is_some() {}
        assert!(!body.timer.is_armed());

        // A stall fails as idle, the transport's way: named, maybe
        // processed.
        let svc = StackLayer::new()
            .body_timeouts(idle)
            .layer(service(|_| chunks(10, true)));
        let mut body = svc.oneshot(get()).await.unwrap().into_body();
        body.frame().await.unwrap().unwrap();
        let start = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyIdle));
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
        assert!(
            err.to_string().contains("GET http://api.example/v1"),
            "{err}"
        );
        assert_eq!(start.elapsed(), ms(300));
        assert!(!body.is_end_stream());

        // The deadline first when it comes first.
        let svc = StackLayer::new()
            .body_timeouts(BodyTimeouts::new().idle(Duration::from_secs(60)))
            .deadline(DeadlineLayer::new(ms(200)))
            .layer(service(|_| chunks(10, true)));
        let mut body = svc.oneshot(get()).await.unwrap().into_body();
        body.frame().await.unwrap().unwrap();
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_read_inside_the_attempt_is_bound_by_the_body_timeouts() {
        // The first response stalls after its first bytes: the attempt
        // fails as idle (not at the deadline), and the retry reads the
        // second whole.
        let mut stack = StackLayer::new()
            .body_timeouts(BodyTimeouts::new().idle(ms(300)))
            .layer(service(|n| chunks(10, n == 0)));
        let start = Instant::now();
        let res = stack.collect(get(), 1024).await.unwrap();
        assert_eq!(Attempts::of(res.extensions()), 2);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 10);
    }
}
