//! The per-attempt timeout: time allowed until the response head arrives.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use rebound_core::attempt_timeout::AttemptTimeoutLayer;
//! use rebound_core::{Sent, TimeoutStage};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! let svc = ServiceBuilder::new()
//!     .layer(AttemptTimeoutLayer::new(Duration::from_secs(1)))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         // A server that never answers.
//!         std::future::pending::<()>().await;
//!         Ok::<_, Infallible>(http::Response::new(()))
//!     }));
//!
//! let err = svc.oneshot(http::Request::new(())).await.unwrap_err();
//! assert_eq!(err.timeout_stage(), Some(TimeoutStage::Headers));
//! assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
//! # Ok(())
//! # }
//! ```
//!
//! [`AttemptTimeoutLayer`] sits just above the transport, under the retry
//! layer, so it bounds **one attempt**: from the call until the response head
//! arrives. The body is not covered (the transport's body idle / minimum-rate
//! timeouts and the total deadline are).
//!
//! The effective timeout of an attempt is the smaller of the configured one
//! and the time left before the request's [`Deadline`] annotation:
//!
//! * when the configured timeout fires, the error is
//!   [`Error::timeout`]`(`[`TimeoutStage::Headers`]`)`;
//! * when the deadline is what cut the attempt, the stage is
//!   [`TimeoutStage::Deadline`], so the caller learns the real cause;
//! * an attempt whose deadline has already passed fails at once, without
//!   reaching the inner service.
//!
//! Either way the error carries [`Sent::MaybeProcessed`] in its extensions:
//! the request may have been written before the timer fired, so it is
//! retried only when that is safe.
//!
//! The check "attempt timeout longer than the total deadline" belongs to
//! whoever assembles both layers: see [`AttemptTimeoutLayer::check_within`].
//!
//! # Errors
//!
//! The service's error is [`Error`]; inner errors are converted with
//! [`Error::from_boxed`] and named with the request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Deadline, Sent};
use crate::config::validate_duration;
use crate::error::{BoxError, Error, TimeoutStage};
use crate::redact::RequestName;

use self::future::{Kind, ResponseFuture};

// ===== impl AttemptTimeoutLayer =====

/// Bounds each attempt until its response head; see the
/// [module docs](self).
///
/// # Clone
///
/// The layer and its service are cheap to clone (a `Duration` and the inner
/// service).
#[derive(Debug, Clone, Copy)]
pub struct AttemptTimeoutLayer {
    timeout: Duration,
}

impl AttemptTimeoutLayer {
    /// A layer allowing each attempt `timeout` until its response head.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(timeout: Duration) -> Self {
        crate::config::expect_valid("AttemptTimeoutLayer::new", Self::try_new(timeout))
    }

    /// A layer allowing each attempt `timeout` until its response head.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) if `timeout` is zero or
    /// longer than one day.
    pub fn try_new(timeout: Duration) -> Result<Self, Error> {
        Ok(AttemptTimeoutLayer {
            timeout: validate_duration("attempt timeout", timeout)?,
        })
    }

    /// The configured per-attempt timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Checks that this attempt timeout fits in a total deadline of `total`.
    ///
    /// An attempt timeout longer than the total deadline can never fire: the
    /// deadline always cuts the attempt first, which is a configuration
    /// mistake worth reporting when the stack is built.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) naming both values when
    /// `self.timeout() > total`.
    pub fn check_within(&self, total: Duration) -> Result<(), Error> {
        if self.timeout > total {
            return Err(Error::config(format!(
                "attempt timeout ({:?}) is longer than the total timeout ({total:?}): \
                 the total deadline would always cut an attempt first",
                self.timeout
            )));
        }
        Ok(())
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AttemptTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

// ===== impl AttemptTimeout =====

/// The service made by [`AttemptTimeoutLayer`]; see the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct AttemptTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S> AttemptTimeout<S> {
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AttemptTimeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let now = Instant::now();
        let ours = now + self.timeout;
        let (until, stage) = match Deadline::of(req.extensions()) {
            Some(deadline) if deadline < ours => (deadline, TimeoutStage::Deadline),
            _ => (ours, TimeoutStage::Headers),
        };
        let request = Some(RequestName::of(&req));
        let kind = if until <= now {
            Kind::Expired
        } else {
            Kind::Running {
                future: self.inner.call(req),
                sleep: tokio::time::sleep_until(until),
            }
        };
        ResponseFuture {
            kind,
            stage,
            request,
        }
    }
}

pub mod future {
    //! The response future of [`AttemptTimeout`].

    use super::*;

    // ===== impl ResponseFuture =====

    pin_project! {
        #[project = KindProj]
        pub(super) enum Kind<F> {
            Running {
                #[pin]
                future: F,
                #[pin]
                sleep: Sleep,
            },
            Expired,
        }
    }

    pin_project! {
        /// The response future of [`AttemptTimeout`].
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) kind: Kind<F>,
            pub(super) stage: TimeoutStage,
            pub(super) request: Option<RequestName>,
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("attempt_timeout::ResponseFuture")
                .field("stage", &self.stage)
                .field("request", &self.request)
                .finish_non_exhaustive()
        }
    }

    pub(crate) fn timed_out(stage: TimeoutStage, request: RequestName) -> Error {
        let mut err = request.name(Error::timeout(stage));
        err.extensions_mut().insert(Sent::MaybeProcessed);
        err
    }

    impl<F, B, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<B>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            match this.kind.project() {
                KindProj::Expired => {
                    let request = this.request.take().expect("polled after completion");
                    Poll::Ready(Err(timed_out(*this.stage, request)))
                }
                KindProj::Running { future, sleep } => {
                    if let Poll::Ready(result) = future.poll(cx) {
                        return Poll::Ready(result.map_err(|e| {
                            let request = this.request.take().expect("polled after completion");
                            request.name(Error::from_boxed(e.into()))
                        }));
                    }
                    ready!(sleep.poll(cx));
                    let request = this.request.take().expect("polled after completion");
                    Poll::Ready(Err(timed_out(*this.stage, request)))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use tower::{service_fn, ServiceExt};

    use super::*;
    use crate::deadline::DeadlineLayer;
    use crate::ErrorKind;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn never() -> impl Service<Request<()>, Response = Response<()>, Error = Infallible> + Clone {
        service_fn(|_req: Request<()>| async {
            std::future::pending::<()>().await;
            Ok(Response::new(()))
        })
    }

    #[test]
    fn config_is_validated() {
        assert!(matches!(
            AttemptTimeoutLayer::try_new(Duration::ZERO)
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        assert!(matches!(
            AttemptTimeoutLayer::try_new(secs(90_000))
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        let layer = AttemptTimeoutLayer::try_new(secs(20)).unwrap();
        let err = layer.check_within(secs(10)).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config));
        assert!(
            err.to_string()
                .contains("attempt timeout (20s) is longer than the total timeout (10s)"),
            "{err}"
        );
        assert!(layer.check_within(secs(20)).is_ok());
        assert!(layer.check_within(secs(30)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_attempt_timeout_with_stage_headers() {
        let start = Instant::now();
        let svc = AttemptTimeoutLayer::try_new(secs(3))
            .unwrap()
            .layer(never());
        let req = Request::get("https://h.example/a?k=v").body(()).unwrap();
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Headers));
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
        assert_eq!(Instant::now() - start, secs(3));
        assert_eq!(
            err.to_string(),
            "timeout (headers) for GET https://h.example/a"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn capped_by_the_deadline_annotation() {
        let start = Instant::now();
        let svc = AttemptTimeoutLayer::try_new(secs(10))
            .unwrap()
            .layer(never());
        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline(start + secs(1)));
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
        assert_eq!(Instant::now() - start, secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn later_deadline_does_not_extend_the_attempt() {
        let start = Instant::now();
        let svc = AttemptTimeoutLayer::try_new(secs(2))
            .unwrap()
            .layer(never());
        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline(start + secs(60)));
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Headers));
        assert_eq!(Instant::now() - start, secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn passed_deadline_fails_at_once_without_calling_inner() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let svc = AttemptTimeoutLayer::try_new(secs(2))
            .unwrap()
            .layer(service_fn(move |_req: Request<()>| {
                c.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(())) }
            }));
        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline(Instant::now()));
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_response_passes_and_the_body_is_not_bounded() {
        let svc = AttemptTimeoutLayer::try_new(secs(1))
            .unwrap()
            .layer(service_fn(|_req: Request<()>| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, Infallible>(Response::new("body"))
            }));
        let res = svc.oneshot(Request::new(())).await.unwrap();
        tokio::time::sleep(secs(5)).await;
        assert_eq!(*res.body(), "body");
    }

    #[tokio::test(start_paused = true)]
    async fn under_a_deadline_layer_the_deadline_stage_wins() {
        // Deadline 1 s over an attempt timeout of 10 s and a server that
        // never answers: the error comes after 1 s, not 10 s.
        let start = Instant::now();
        let svc = tower::ServiceBuilder::new()
            .layer(DeadlineLayer::try_new(secs(1)).unwrap())
            .layer(AttemptTimeoutLayer::try_new(secs(10)).unwrap())
            .service(never());
        let err = svc.oneshot(Request::new(())).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline));
        assert_eq!(Instant::now() - start, secs(1));
    }
}
