//! tonic without adapters: rebound's errors as `tonic::Status`.
//!
//! tonic turns a service error it does not recognise into UNKNOWN. Put
//! [`IntoStatusLayer`] at the top of a rebound stack over a
//! `tonic::transport::Channel` and the generated client gets the right code:
//!
//! | rebound error | `tonic::Code` |
//! |---|---|
//! | a `tonic::Status` in its source chain (from the channel) | that status's code |
//! | `Timeout(Deadline)`, and the per-attempt `Timeout(Headers)` / body timeouts | `DeadlineExceeded` |
//! | `Cancelled` | `Cancelled` |
//! | `Closed` | `Unavailable` |
//! | `Connect`, `Tls`, `Timeout(Connect)` / `Timeout(Tls)`, `Transport`, `Body`, or marked [`Sent::NotSent`](crate::Sent) | `Unavailable` |
//! | `Rejected` (a limit), `Throttled` (a Retry-After gate), `QuotaExhausted` (the pacer), `ClientThrottled` (client-side throttling), `BodyTooLarge` | `ResourceExhausted` |
//! | `InvalidRequest` (e.g. a URL with no origin: tonic's `Grpc::new(client)` over `rebound::Client`; use `Grpc::with_origin`) | `Internal`: it would fail the same way again |
//! | anything else | `Internal` |
//!
//! The rebound [`Error`] stays reachable: it is the status's `source()`
//! ([`error_of`]), with its [`Attempts`] and
//! [`RetryStop`]. Those two are also put in the status's
//! metadata as `rebound-attempts` and `rebound-retry-stop` — and in the
//! response headers of a call that ended with a gRPC status after retries,
//! where tonic's client reads them into the `Status` it makes (or the
//! `tonic::Response`'s metadata for an OK). A first-try success gets no
//! header.
//!
//! `impl From<Error> for tonic::Status` does the same mapping for `?`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Attempts, RetryStop, Sent};
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};

/// The metadata key with the attempt count, when more than one was made.
pub const ATTEMPTS_KEY: HeaderName = HeaderName::from_static("rebound-attempts");
/// The metadata key with why the retry loop stopped
/// ([`RetryStop::as_str`]), when it stopped short of success.
pub const RETRY_STOP_KEY: HeaderName = HeaderName::from_static("rebound-retry-stop");

/// The gRPC code for a rebound error (see the [module docs](self)).
pub fn code_of(err: &Error) -> tonic::Code {
    use tonic::Code as C;
    if let Some(status) = err.find_source::<tonic::Status>() {
        return status.code();
    }
    match err.kind() {
        ErrorKind::Timeout(TimeoutStage::Connect | TimeoutStage::Tls) => C::Unavailable,
        ErrorKind::Timeout(_) => C::DeadlineExceeded,
        ErrorKind::Cancelled => C::Cancelled,
        ErrorKind::Closed => C::Unavailable,
        ErrorKind::Connect | ErrorKind::Tls | ErrorKind::Transport | ErrorKind::Body => {
            C::Unavailable
        }
        ErrorKind::Rejected
        | ErrorKind::Throttled
        | ErrorKind::QuotaExhausted
        | ErrorKind::ClientThrottled
        | ErrorKind::BodyTooLarge => C::ResourceExhausted,
        // A request that cannot be sent as written (a URL with no origin,
        // a header that is not valid) fails the same way every time: not
        // UNAVAILABLE, which callers retry.
        ErrorKind::InvalidRequest => C::Internal,
        _ if err.extensions().get::<Sent>() == Some(&Sent::NotSent) => C::Unavailable,
        _ => C::Internal,
    }
}

/// tonic's code as rebound's, e.g. to mark a code retryable in a
/// [`GrpcClassifier`](crate::grpc::GrpcClassifier) from what a generated
/// client names.
///
/// ```
/// use rebound_core::grpc::Code;
///
/// assert_eq!(Code::from(tonic::Code::Unavailable), Code::UNAVAILABLE);
/// assert_eq!(tonic::Code::from(Code::NOT_FOUND), tonic::Code::NotFound);
/// ```
impl From<tonic::Code> for crate::grpc::Code {
    fn from(code: tonic::Code) -> Self {
        crate::grpc::Code::from_i32(code as i32)
    }
}

/// rebound's code as tonic's.
impl From<crate::grpc::Code> for tonic::Code {
    fn from(code: crate::grpc::Code) -> Self {
        tonic::Code::from_i32(i32::from(code.as_u8()))
    }
}

/// The rebound error behind a status made by this module, if any.
///
/// ```
/// use rebound_core::grpc::tonic::error_of;
/// use rebound_core::{Error, ErrorKind, TimeoutStage};
///
/// let status = tonic::Status::from(Error::timeout(TimeoutStage::Deadline));
/// assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
/// assert_eq!(error_of(&status).unwrap().kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
/// ```
pub fn error_of(status: &tonic::Status) -> Option<&Error> {
    std::error::Error::source(status)?.downcast_ref::<Error>()
}

fn annotate(headers: &mut HeaderMap, attempts: Option<Attempts>, stop: Option<RetryStop>) {
    if let Some(a) = attempts {
        headers.insert(ATTEMPTS_KEY, HeaderValue::from(a.0));
    }
    if let Some(s) = stop {
        headers.insert(RETRY_STOP_KEY, HeaderValue::from_static(s.as_str()));
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        let code = code_of(&err);
        let mut status = tonic::Status::new(code, err.to_string());
        // The count only when more than one attempt was made, as on a
        // response: a first-attempt failure carries none.
        let attempts = err
            .extensions()
            .get::<Attempts>()
            .copied()
            .filter(|a| a.0 > 1);
        annotate(status.metadata_mut().as_mut(), attempts, err.retry_stop());
        status.set_source(Arc::new(err));
        status
    }
}

/// Turns the errors of the stack below into `tonic::Status` (see the
/// [module docs](self)), and writes the attempt count and stop reason of a
/// retried call into its response headers. Put it at the top of a rebound
/// stack that a tonic client calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct IntoStatusLayer {
    _p: (),
}

impl IntoStatusLayer {
    /// The layer.
    pub fn new() -> Self {
        IntoStatusLayer { _p: () }
    }
}

impl<S> Layer<S> for IntoStatusLayer {
    type Service = IntoStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IntoStatus { inner }
    }
}

/// The service made by [`IntoStatusLayer`].
#[derive(Clone, Debug)]
pub struct IntoStatus<S> {
    inner: S,
}

impl<S> IntoStatus<S> {
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

fn to_status(e: impl Into<BoxError>) -> tonic::Status {
    let boxed = e.into();
    match boxed.downcast::<tonic::Status>() {
        Ok(status) => *status,
        Err(other) => tonic::Status::from(Error::from_boxed(other)),
    }
}

impl<S, B, ResB> Service<Request<B>> for IntoStatus<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = tonic::Status;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(to_status)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        future::ResponseFuture {
            inner: self.inner.call(req),
        }
    }
}

pub mod future {
    //! The response future of [`IntoStatus`].

    use super::*;

    pin_project! {
        /// The response future of [`IntoStatus`](super::IntoStatus).
        #[must_use = "futures do nothing unless polled"]
        #[derive(Debug)]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) inner: F,
        }
    }

    impl<F, ResB, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<ResB>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<ResB>, tonic::Status>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut res = ready!(self.project().inner.poll(cx)).map_err(to_status)?;
            // Off the happy path only: both are absent on a first-try success.
            let attempts = res.extensions().get::<Attempts>().copied();
            let stop = res.extensions().get::<RetryStop>().copied();
            if attempts.is_some() || stop.is_some() {
                annotate(res.headers_mut(), attempts, stop);
            }
            Poll::Ready(Ok(res))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code as C;

    #[test]
    fn codes_convert_both_ways() {
        for n in 0..=16 {
            let tonic = tonic::Code::from_i32(n);
            let ours = crate::grpc::Code::from(tonic);
            assert_eq!(i32::from(ours.as_u8()), n);
            assert_eq!(tonic::Code::from(ours), tonic);
        }
    }

    #[test]
    fn mapping() {
        let cases = [
            (Error::timeout(TimeoutStage::Deadline), C::DeadlineExceeded),
            (Error::timeout(TimeoutStage::Headers), C::DeadlineExceeded),
            (Error::timeout(TimeoutStage::Connect), C::Unavailable),
            (Error::new(ErrorKind::Cancelled), C::Cancelled),
            (Error::new(ErrorKind::Connect), C::Unavailable),
            (Error::new(ErrorKind::Transport), C::Unavailable),
            (Error::new(ErrorKind::Throttled), C::ResourceExhausted),
            (Error::new(ErrorKind::Rejected), C::ResourceExhausted),
            (Error::new(ErrorKind::Decode), C::Internal),
            (
                {
                    let mut e = Error::new(ErrorKind::InvalidRequest);
                    e.extensions_mut().insert(Sent::NotSent);
                    e
                },
                C::Internal,
            ),
            (
                Error::new(ErrorKind::Transport).with_source(tonic::Status::not_found("x")),
                C::NotFound,
            ),
        ];
        for (err, code) in cases {
            let kind = err.kind();
            assert_eq!(tonic::Status::from(err).code(), code, "{kind:?}");
        }
        // Any other kind never sent (an open circuit, a shutdown) may go
        // through on another try.
        let mut e = Error::new(ErrorKind::CircuitOpen);
        e.extensions_mut().insert(Sent::NotSent);
        assert_eq!(code_of(&e), C::Unavailable);
    }

    #[test]
    fn a_first_attempt_failure_carries_no_count() {
        let status = tonic::Status::from(Error::new(ErrorKind::Connect));
        assert!(status.metadata().get("rebound-attempts").is_none());
        let mut e = Error::new(ErrorKind::Connect);
        e.extensions_mut().insert(Attempts(1));
        let status = tonic::Status::from(e);
        assert!(status.metadata().get("rebound-attempts").is_none());
    }

    #[test]
    fn attempts_and_stop_reachable() {
        let mut e = Error::timeout(TimeoutStage::Deadline);
        e.extensions_mut().insert(Attempts(3));
        e.extensions_mut().insert(RetryStop::Deadline);
        let status = tonic::Status::from(e);
        assert_eq!(status.metadata().get("rebound-attempts").unwrap(), "3");
        assert_eq!(
            status.metadata().get("rebound-retry-stop").unwrap(),
            "deadline"
        );
        let inner = error_of(&status).unwrap();
        assert_eq!(inner.attempts(), 3);
        assert_eq!(inner.retry_stop(), Some(RetryStop::Deadline));
        // A status passes through unchanged.
        let s = to_status(tonic::Status::aborted("a"));
        assert_eq!(s.code(), C::Aborted);
    }
}
