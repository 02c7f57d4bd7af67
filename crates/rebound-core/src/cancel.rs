//! Cancellation by token: a caller attaches a
//! [`CancellationToken`] to the request, and when it fires the response
//! future ends at once with [`ErrorKind::Cancelled`].
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use rebound_core::cancel::{Cancel, CancelLayer};
//! use rebound_core::ErrorKind;
//! use tokio_util::sync::CancellationToken;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(CancelLayer::new())
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         tokio::time::sleep(Duration::from_secs(60)).await; // a slow upstream
//!         Ok::<_, Infallible>(http::Response::new(()))
//!     }));
//!
//! let token = CancellationToken::new();
//! let mut req = http::Request::get("https://api.example/slow").body(()).unwrap();
//! req.extensions_mut().insert(Cancel(token.clone()));
//!
//! let canceller = async {
//!     tokio::time::sleep(Duration::from_secs(1)).await;
//!     token.cancel();
//! };
//! let (res, ()) = tokio::join!(svc.oneshot(req), canceller);
//! assert_eq!(res.unwrap_err().kind(), ErrorKind::Cancelled);
//! # }
//! ```
//!
//! Dropping a response future already cancels everything it started (every
//! rebound layer is drop-safe and spawns nothing). A token is for when the
//! caller cannot drop the future itself — it was handed to another task, or
//! one token should stop a whole group of requests. Attach it as the
//! [`Cancel`] request annotation; [`CancelLayer`] watches it:
//!
//! * a request whose token has already fired is not sent at all;
//! * when the token fires while the request is in flight, the inner future
//!   (attempts, backoff sleeps, queue places, connections being made) is
//!   dropped at once and the caller gets [`ErrorKind::Cancelled`];
//! * the token bounds the response **head**: once the response is returned,
//!   stop reading its body by dropping the body.
//!
//! Cancellation is never retried: the error carries a `Fatal` [`Verdict`]
//! (and the classifier maps `Cancelled` to `Fatal` too). Put the layer at the
//! top of the stack, so everything below is dropped when it fires. Requests
//! without a token pay one extension look-up.
//!
//! # Errors
//!
//! [`ErrorKind::Cancelled`], naming the request, when the token fires before
//! the response head. Errors of the inner service are turned into [`Error`]
//! with [`Error::from_boxed`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Method, Request, Uri};
use pin_project_lite::pin_project;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Reason, Verdict};
use crate::error::{BoxError, Error, ErrorKind};

use self::future::{ResponseFuture, State};

/// Request annotation: cancel this request when the token fires.
///
/// Read by [`CancelLayer`]; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Cancel(pub CancellationToken);

impl Cancel {
    /// The token carried in `ext`, if any.
    pub fn of(ext: &http::Extensions) -> Option<&CancellationToken> {
        ext.get::<Cancel>().map(|c| &c.0)
    }
}

pub(crate) fn cancelled_error(method: &Method, uri: &Uri) -> Error {
    let mut err = Error::new(ErrorKind::Cancelled).with_request(method, uri);
    err.extensions_mut().insert(Verdict::Fatal {
        reason: Reason::new_static("cancelled by the caller"),
    });
    err
}

// === impl CancelLayer ===

/// Ends the response future with [`ErrorKind::Cancelled`] when the request's
/// [`Cancel`] token fires.
///
/// See the [module docs](self) for an example.
#[derive(Clone, Debug, Default)]
pub struct CancelLayer {
    _priv: (),
}

impl CancelLayer {
    /// A new layer.
    pub fn new() -> Self {
        CancelLayer { _priv: () }
    }
}

impl<S> Layer<S> for CancelLayer {
    type Service = CancelService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CancelService { inner }
    }
}

// === impl CancelService ===

/// The service of [`CancelLayer`].
///
/// See the [module docs](self).
#[derive(Clone, Debug)]
pub struct CancelService<S> {
    inner: S,
}

impl<S> CancelService<S> {
    /// Wrap `inner`.
    pub fn new(inner: S) -> Self {
        CancelService { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, B> Service<Request<B>> for CancelService<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let state = match Cancel::of(req.extensions()) {
            None => State::Plain {
                fut: self.inner.call(req),
            },
            Some(token) if token.is_cancelled() => State::Cancelled {
                error: Some(cancelled_error(req.method(), req.uri())),
            },
            Some(token) => {
                let cancelled = token.clone().cancelled_owned();
                let method = req.method().clone();
                let uri = req.uri().clone();
                State::Watched {
                    fut: self.inner.call(req),
                    cancelled,
                    request: Some((method, uri)),
                }
            }
        };
        ResponseFuture { state }
    }
}

pub mod future {
    //! The response future of [`CancelService`].

    use super::*;

    // === impl ResponseFuture ===

    pin_project! {
        /// The response future of [`CancelService`].
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) state: State<F>,
        }
    }

    pin_project! {
        #[project = StateProj]
        pub(super) enum State<F> {
            Plain {
                #[pin]
                fut: F,
            },
            Watched {
                #[pin]
                fut: F,
                #[pin]
                cancelled: WaitForCancellationFutureOwned,
                request: Option<(Method, Uri)>,
            },
            Cancelled {
                error: Option<Error>,
            },
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match &self.state {
                State::Plain { .. } => "plain",
                State::Watched { .. } => "watched",
                State::Cancelled { .. } => "cancelled",
            };
            f.debug_struct("ResponseFuture")
                .field("state", &state)
                .finish()
        }
    }

    impl<F, T, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<T, Error>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.as_mut().project().state.project() {
                StateProj::Plain { fut } => fut.poll(cx).map_err(|e| Error::from_boxed(e.into())),
                StateProj::Watched {
                    fut,
                    cancelled,
                    request,
                } => {
                    // The token first: once it fired, the caller gets
                    // `Cancelled` even if the inner future is also ready.
                    if cancelled.poll(cx).is_ready() {
                        let (method, uri) = request.take().expect("polled after completion");
                        let error = cancelled_error(&method, &uri);
                        // Drop everything below now, not when the caller drops us.
                        self.as_mut()
                            .project()
                            .state
                            .set(State::Cancelled { error: None });
                        return Poll::Ready(Err(error));
                    }
                    let out = ready!(fut.poll(cx));
                    Poll::Ready(out.map_err(|e| Error::from_boxed(e.into())))
                }
                StateProj::Cancelled { error } => {
                    Poll::Ready(Err(error.take().expect("polled after completion")))
                }
            }
        }
    }
}
