//! The total deadline of a logical request.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::Empty;
//! use rebound_core::deadline::DeadlineLayer;
//! use rebound_core::TimeoutStage;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! let svc = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(2)))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         // A server that takes far too long to answer.
//!         tokio::time::sleep(Duration::from_secs(60)).await;
//!         Ok::<_, Infallible>(http::Response::new(Empty::<Bytes>::new()))
//!     }));
//!
//! let err = svc.oneshot(http::Request::new(())).await.unwrap_err();
//! assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
//! # Ok(())
//! # }
//! ```
//!
//! [`DeadlineLayer`] gives every request a total budget. It stamps it on
//! the request as a [`Deadline`] annotation, so that every layer below it
//! that waits (a concurrency queue, each attempt, each backoff sleep) can
//! see how much time is left with [`Deadline::of`] — also across a
//! `tower::buffer::Buffer` or a task spawned with the request, which a
//! task-local would not cross — and it bounds three things itself:
//!
//! * a request whose deadline has **already passed** fails at once with
//!   [`TimeoutStage::Deadline`], without reaching the inner service;
//! * the **response future**: everything below (queueing, every attempt,
//!   every sleep between attempts) is cut when the deadline passes;
//! * the **response body**: the body is wrapped in a [`DeadlineBody`], so
//!   reading it past the deadline yields an error with stage `deadline`.
//!
//! If the request already has an **earlier** deadline (a [`Deadline`] in its
//! extensions, or the task's current one — for example an inbound request's,
//! propagated by the server), the earlier one wins; a later one is
//! overridden by this layer's. With the `grpc` feature, an HTTP/2
//! request's own `grpc-timeout` header (what tonic's `set_timeout` writes)
//! is such an earlier deadline too
//! ([`own_grpc_deadline`](crate::grpc::own_grpc_deadline)), so a tonic
//! call's retries end when its caller said.
//!
//! The stamp is an `http::Extensions` insert: the request's first one
//! allocates its map (a few small allocations), which a request that
//! already carries an extension does not pay again. The whole stack as one
//! service ([`crate::stack`], what the ready-made client runs) keeps its
//! deadline as its own value and stamps nothing.
//!
//! # Errors
//!
//! The service's error is [`Error`]: inner errors are converted with
//! [`Error::from_boxed`]; the deadline itself is
//! [`Error::timeout`]`(`[`TimeoutStage::Deadline`]`)`. Every error names the
//! request (method and redacted URL).
//!
//! # Why not tower-http's `TimeoutBody`?
//!
//! tower-http's body timeouts report a boxed `TimeoutError` that every caller
//! would have to downcast and re-map to a stage, and they allocate a timer of
//! their own. [`DeadlineBody`] instead takes over the very timer the response
//! future was already waiting on (one allocation per request) and yields
//! rebound's [`Error`] directly.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

/// The server side of a deadline — the caller's `grpc-timeout` or a
/// budget header of milliseconds made the deadline of every outbound call
/// made while handling the request — for plain HTTP (axum) as for gRPC;
/// the same layer as [`grpc::InboundDeadlineLayer`](crate::grpc::InboundDeadlineLayer).
#[cfg(feature = "grpc")]
pub use crate::grpc::{InboundDeadline, InboundDeadlineLayer};

use crate::annotations::Deadline;
use crate::config::validate_duration;
use crate::error::{BoxError, Error, TimeoutStage};
use crate::redact::RequestName;

use self::future::{Kind, ResponseFuture};

// ===== impl DeadlineLayer =====

/// Gives every request a total deadline; see the [module docs](self).
///
/// # Clone
///
/// The layer and its service are cheap to clone (a `Duration` and the inner
/// service).
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    total: Duration,
}

impl DeadlineLayer {
    /// A layer giving every request at most `total` from the moment it is
    /// called.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(total: Duration) -> Self {
        crate::config::expect_valid("DeadlineLayer::new", Self::try_new(total))
    }

    /// A layer giving every request at most `total` from the moment it is
    /// called.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) if `total` is zero or longer
    /// than one day.
    pub fn try_new(total: Duration) -> Result<Self, Error> {
        Ok(DeadlineLayer {
            total: validate_duration("total timeout", total)?,
        })
    }

    /// The total budget of each request.
    pub fn total(&self) -> Duration {
        self.total
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService {
            inner,
            total: self.total,
        }
    }
}

// ===== impl DeadlineService =====

/// The service made by [`DeadlineLayer`]; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
    total: Duration,
}

impl<S> DeadlineService<S> {
    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<DeadlineBody<ResBody>>;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let now = Instant::now();
        let ours = now + self.total;
        #[allow(unused_mut)]
        let mut deadline = match Deadline::of(req.extensions()) {
            Some(earlier) if earlier <= ours => earlier,
            _ => ours,
        };
        // A gRPC call's own `grpc-timeout` (tonic's `set_timeout`).
        #[cfg(feature = "grpc")]
        if let Some(theirs) = crate::grpc::own_grpc_deadline(&req, now) {
            deadline = deadline.min(theirs);
        }
        let request = RequestName::of(&req);
        if deadline <= now {
            return ResponseFuture {
                kind: Kind::Expired,
                request: Some(request),
            };
        }
        // The deadline travels with the request (one extension), so the
        // layers below see it across a `Buffer` or a spawned task too.
        let mut req = req;
        req.extensions_mut().insert(Deadline(deadline));
        let future = self.inner.call(req);
        ResponseFuture {
            kind: Kind::Running {
                future,
                sleep: None,
                deadline,
            },
            request: Some(request),
        }
    }
}

pub mod future {
    //! The response future of [`DeadlineService`].

    use super::*;

    // ===== impl ResponseFuture =====

    pin_project! {
        #[project = KindProj]
        pub(super) enum Kind<F> {
            Running {
                #[pin]
                future: F,
                // Armed (boxed, so that it can move into the response body)
                // only once the inner future is pending: an answer that is
                // there at once costs no allocation and no timer.
                sleep: Option<Pin<Box<Sleep>>>,
                deadline: Instant,
            },
            Expired,
        }
    }

    pin_project! {
        /// The response future of [`DeadlineService`].
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) kind: Kind<F>,
            pub(super) request: Option<RequestName>,
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("deadline::ResponseFuture")
                .field("request", &self.request)
                .finish_non_exhaustive()
        }
    }

    impl<F, B, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<DeadlineBody<B>>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            match this.kind.project() {
                KindProj::Expired => {
                    let request = this.request.take().expect("polled after completion");
                    Poll::Ready(Err(request.name(Error::timeout(TimeoutStage::Deadline))))
                }
                KindProj::Running {
                    future,
                    sleep,
                    deadline,
                } => {
                    // The inner outcome first: a result that is there is a real
                    // outcome, even if the deadline passed at the same moment.
                    if let Poll::Ready(result) = future.poll(cx) {
                        let request = this.request.take().expect("polled after completion");
                        return Poll::Ready(match result {
                            Ok(res) => Ok(res.map(|body| DeadlineBody {
                                inner: body,
                                sleep: sleep.take(),
                                deadline: *deadline,
                                request: Some(request),
                            })),
                            Err(e) => Err(request.name(Error::from_boxed(e.into()))),
                        });
                    }
                    let timer =
                        sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(*deadline)));
                    ready!(timer.as_mut().poll(cx));
                    let request = this.request.take().expect("polled after completion");
                    Poll::Ready(Err(request.name(Error::timeout(TimeoutStage::Deadline))))
                }
            }
        }
    }
}

// ===== impl DeadlineBody =====

pin_project! {
    /// A response body that fails with stage
    /// [`deadline`](TimeoutStage::Deadline) once the deadline has passed.
    ///
    /// Made by [`DeadlineLayer`]; a body that has already reached its end is
    /// not cut. Its errors are rebound [`Error`]s naming the request.
    pub struct DeadlineBody<B> {
        #[pin]
        inner: B,
        // Armed when the inner body is first pending (or handed over by the
        // response future); until then the clock is read instead.
        sleep: Option<Pin<Box<Sleep>>>,
        deadline: Instant,
        request: Option<RequestName>,
    }
}

impl<B> DeadlineBody<B> {
    /// Wrap `body` so that reading it fails once `deadline` has passed.
    pub fn new(body: B, deadline: Instant) -> Self {
        DeadlineBody {
            inner: body,
            sleep: None,
            deadline,
            request: None,
        }
    }

    /// The deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
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

impl<B> fmt::Debug for DeadlineBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineBody")
            .field("deadline", &self.deadline)
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl<B> Body for DeadlineBody<B>
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
        let this = self.project();
        let request: &Option<RequestName> = this.request;
        let name = |err: Error| match request {
            Some(r) => r.name(err),
            None => err,
        };
        // A body already at its end is not cut; otherwise the deadline is
        // checked first, so that a body whose frames are always ready is cut
        // too.
        let expired = match this.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
            None => Instant::now() >= *this.deadline,
        };
        if expired && !this.inner.is_end_stream() {
            return Poll::Ready(Some(Err(name(Error::timeout(TimeoutStage::Deadline)))));
        }
        let frame = match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                // Waiting on the inner body: arm the timer so that the
                // deadline wakes this task.
                let deadline = *this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(name(Error::timeout(TimeoutStage::Deadline)))));
                }
                return Poll::Pending;
            }
        };
        match frame {
            Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
            Some(Err(e)) => Poll::Ready(Some(Err(name(Error::from_boxed(e.into()))))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};
    use tower::{service_fn, ServiceExt};

    use super::*;
    use crate::error::ErrorKind;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn config_is_validated() {
        assert!(matches!(
            DeadlineLayer::try_new(Duration::ZERO).unwrap_err().kind(),
            ErrorKind::Config
        ));
        let err = DeadlineLayer::try_new(secs(2 * 24 * 3600)).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config));
        assert!(err.to_string().contains("total timeout"), "{err}");
        assert_eq!(DeadlineLayer::try_new(secs(3)).unwrap().total(), secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn stamps_deadline_and_bounds_the_response_future() {
        let start = Instant::now();
        let svc = DeadlineLayer::try_new(secs(2)).unwrap().layer(service_fn(
            move |req: Request<()>| async move {
                assert_eq!(Deadline::of(req.extensions()), Some(start + secs(2)));
                tokio::time::sleep(secs(60)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            },
        ));
        let req = Request::get("http://u:p@h.example/x?q=secret")
            .body(())
            .unwrap();
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
        assert_eq!(Instant::now() - start, secs(2));
        assert_eq!(
            err.to_string(),
            "timeout (deadline) for GET http://h.example/x"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn earlier_deadline_wins_later_is_replaced() {
        let start = Instant::now();
        let svc = DeadlineLayer::try_new(secs(10)).unwrap().layer(service_fn(
            |req: Request<()>| async move {
                let d = Deadline::of(req.extensions()).unwrap();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "{}",
                    (d - Instant::now()).as_secs()
                )))))
            },
        ));
        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline(start + secs(3)));
        let res = svc.clone().oneshot(req).await.unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"3");

        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline(start + secs(100)));
        let res = svc.oneshot(req).await.unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"10");
    }

    #[tokio::test(start_paused = true)]
    async fn passed_deadline_fails_without_calling_inner() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = calls.clone();
        let svc =
            DeadlineLayer::try_new(secs(10))
                .unwrap()
                .layer(service_fn(move |_req: Request<()>| {
                    c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
                }));
        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline(Instant::now()));
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn body_read_past_the_deadline_fails() {
        let svc =
            DeadlineLayer::try_new(secs(5))
                .unwrap()
                .layer(service_fn(|_req: Request<()>| async {
                    // One chunk now, the next one after 10 s.
                    let chunks = futures_util::stream::unfold(0u32, |n| async move {
                        match n {
                            0 => Some((Ok::<_, Infallible>(Frame::data(Bytes::from("a"))), 1)),
                            1 => {
                                tokio::time::sleep(secs(10)).await;
                                Some((Ok(Frame::data(Bytes::from("b"))), 2))
                            }
                            _ => None,
                        }
                    });
                    Ok::<_, Infallible>(Response::new(StreamBody::new(chunks)))
                }));
        let start = Instant::now();
        let res = svc
            .oneshot(Request::post("http://h.example/up").body(()).unwrap())
            .await
            .unwrap();
        let mut body = Box::pin(res.into_body());
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "a");
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
        assert_eq!(Instant::now() - start, secs(5));
        assert_eq!(
            err.to_string(),
            "timeout (deadline) for POST http://h.example/up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn finished_body_is_not_cut() {
        let svc =
            DeadlineLayer::try_new(secs(1))
                .unwrap()
                .layer(service_fn(|_req: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }));
        let res = svc.oneshot(Request::new(())).await.unwrap();
        tokio::time::sleep(secs(5)).await;
        assert!(res.into_body().collect().await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn inner_errors_are_converted_and_named() {
        let svc =
            DeadlineLayer::try_new(secs(1))
                .unwrap()
                .layer(service_fn(|_req: Request<()>| async {
                    Err::<Response<Full<Bytes>>, _>(std::io::Error::other("boom"))
                }));
        let err = svc
            .oneshot(Request::get("http://h.example/").body(()).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Transport);
        assert!(err.find_source::<std::io::Error>().is_some());
        assert_eq!(err.to_string(), "transport error for GET http://h.example/");
    }
}
