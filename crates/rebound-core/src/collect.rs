//! Read the whole response body inside the attempt: [`CollectBodyLayer`].
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use rebound_core::collect::CollectBodyLayer;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let mut svc = ServiceBuilder::new()
//!     // .layer(ClassifyLayer::new(..)) goes here, above: a truncated body
//!     // is then an attempt's failure like any other, and is retried.
//!     .layer(CollectBodyLayer::new().max_bytes(1024 * 1024))
//!     .service(tower::service_fn(|_req: Request<()>| async {
//!         Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{\"id\":7}"))))
//!     }));
//!
//! let res = svc.ready().await?.call(Request::new(())).await?;
//! // The body is already in memory.
//! assert_eq!(res.body().bytes(), "{\"id\":7}");
//! # Ok(())
//! # }
//! ```
//!
//! # What it does
//!
//! By default a response is handed up as soon as its head arrives, and the
//! caller reads the body afterwards, outside the retry loop: a body cut
//! short then surfaces as an error the retry layer never sees.
//! [`CollectBodyLayer`] (opt-in; the JSON helpers use it) makes the body part
//! of the attempt. Its service waits for the head, then reads every frame
//! into memory and answers with a [`CollectedBody`]: the response future
//! only completes once the whole body is there. Put it **below** the
//! classify layer so that the classifier sees the body's failure.
//!
//! * **Size cap** (default 10 MiB): a response whose `Content-Length` (or
//!   the body's `size_hint`) is over the cap is refused at once, without
//!   reading it; otherwise reading stops as soon as the cap is passed.
//! * **Time**: the [`Deadline`] annotation on the request, if any, bounds
//!   the whole attempt, body included. Idle and minimum-rate timeouts on the
//!   body are the transport's: their errors come through unchanged.
//!
//! # Errors
//!
//! Every error names the request (method and redacted URL).
//!
//! * The body is over the cap: [`ErrorKind::BodyTooLarge`] (`body too
//!   large`), which the classifier treats as fatal. Nothing more is read.
//! * Reading the body fails (reset, truncated): [`ErrorKind::Body`] with the
//!   original error as its source, marked [`Sent::MaybeProcessed`]: the
//!   classifier makes it retryable for requests that may be sent again. A
//!   body error that already is a rebound [`Error`] (for example a
//!   `Timeout(BodyIdle)` from the transport) keeps its kind.
//! * The deadline passes: `Timeout(Deadline)`.
//! * Errors of the inner service pass through ([`Error::from_boxed`]).
//!
//! # Clone
//!
//! The service is as cheap to clone as the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Deadline, Sent};
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};

use self::future::{ResponseFuture, State};

// ===== layer =====

/// Reads the whole response body inside the attempt, up to a cap.
///
/// See the [module docs](self) for an example and the rules.
#[derive(Debug, Clone, Copy)]
pub struct CollectBodyLayer {
    max_bytes: usize,
}

impl CollectBodyLayer {
    /// The default cap: 10 MiB.
    pub const DEFAULT_MAX_BYTES: usize = 10 * 1024 * 1024;

    /// A layer with the default cap of 10 MiB.
    pub fn new() -> Self {
        CollectBodyLayer {
            max_bytes: Self::DEFAULT_MAX_BYTES,
        }
    }

    /// The largest body accepted, in bytes. Default is 10 MiB
    /// ([`DEFAULT_MAX_BYTES`](Self::DEFAULT_MAX_BYTES)). Any value works: `0`
    /// accepts only empty bodies.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl Default for CollectBodyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for CollectBodyLayer {
    type Service = CollectBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CollectBody {
            inner,
            max_bytes: self.max_bytes,
        }
    }
}

// ===== service =====

/// The service made by [`CollectBodyLayer`].
///
/// See the [module docs](self).
#[derive(Debug, Clone)]
pub struct CollectBody<S> {
    inner: S,
    max_bytes: usize,
}

impl<S> CollectBody<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, by value.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for CollectBody<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<CollectedBody>;
    type Error = Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let deadline = Deadline::of(req.extensions()).map(tokio::time::sleep_until);
        let method = req.method().clone();
        let uri = req.uri().clone();
        ResponseFuture {
            state: State::Head {
                future: self.inner.call(req),
            },
            deadline,
            max_bytes: self.max_bytes,
            method,
            uri,
        }
    }
}

pub mod future {
    //! The response future of [`CollectBody`].

    use super::*;

    // ===== future =====

    pin_project! {
        /// The response future of [`CollectBody`]: the head, then the whole
        /// body.
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F, B> {
            #[pin]
            pub(super) state: State<F, B>,
            #[pin]
            pub(super) deadline: Option<Sleep>,
            pub(super) max_bytes: usize,
            pub(super) method: Method,
            pub(super) uri: Uri,
        }
    }

    pin_project! {
        #[project = StateProj]
        pub(super) enum State<F, B> {
            Head {
                #[pin]
                future: F,
            },
            Body {
                #[pin]
                body: B,
                parts: Option<http::response::Parts>,
                buf: Collecting,
            },
        }
    }

    impl<F, B> fmt::Debug for ResponseFuture<F, B> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match &self.state {
                State::Head { .. } => "head",
                State::Body { .. } => "body",
            };
            f.debug_struct("ResponseFuture")
                .field("state", &state)
                .field("max_bytes", &self.max_bytes)
                .field("deadline", &self.deadline.as_ref().map(|s| s.deadline()))
                .finish()
        }
    }

    impl<F, B, E> Future for ResponseFuture<F, B>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        type Output = Result<Response<CollectedBody>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut this = self.project();
            let result = ready!(poll_collect(
                this.state.as_mut(),
                *this.max_bytes,
                this.method,
                this.deadline.as_mut(),
                cx
            ));
            Poll::Ready(result.map_err(|e| e.with_request(this.method, this.uri)))
        }
    }

    pub(super) fn poll_collect<F, B, E>(
        mut state: Pin<&mut State<F, B>>,
        max_bytes: usize,
        method: &Method,
        mut deadline: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<CollectedBody>, Error>>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
        B: Body,
        B::Error: Into<BoxError>,
    {
        loop {
            match state.as_mut().project() {
                StateProj::Head { future } => {
                    let res = match future.poll(cx) {
                        Poll::Ready(res) => res.map_err(|e| Error::from_boxed(e.into()))?,
                        Poll::Pending => return poll_deadline(deadline.as_mut(), cx),
                    };
                    let (parts, body) = res.into_parts();
                    let announced = if has_no_content(method, parts.status) {
                        // Its Content-Length describes a body that is not sent.
                        body.size_hint().lower()
                    } else {
                        announced_len(&parts.headers, &body.size_hint())
                    };
                    if announced > max_bytes as u64 {
                        // Refuse at once: dropping the body reads nothing more.
                        return Poll::Ready(Err(too_large("content-length is over the cap")));
                    }
                    state.set(State::Body {
                        body,
                        parts: Some(parts),
                        buf: Collecting::new(announced.min(max_bytes as u64) as usize),
                    });
                }
                StateProj::Body {
                    mut body,
                    parts,
                    buf,
                } => {
                    // Bounded by the cap: every data frame adds to `buf.len` or
                    // is empty; only a body that yields empty frames forever
                    // keeps this loop going, as it would keep any reader.
                    loop {
                        let frame = match body.as_mut().poll_frame(cx) {
                            Poll::Pending => return poll_deadline(deadline.as_mut(), cx),
                            Poll::Ready(frame) => frame,
                        };
                        match frame {
                            None => {
                                let parts = parts.take().expect("polled after completion");
                                let body = std::mem::take(buf).finish();
                                return Poll::Ready(Ok(Response::from_parts(parts, body)));
                            }
                            Some(Err(err)) => return Poll::Ready(Err(body_error(err.into()))),
                            Some(Ok(frame)) => {
                                if let Err(err) = buf.push(frame, max_bytes) {
                                    return Poll::Ready(Err(err));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    pub(super) fn poll_deadline<T>(
        deadline: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<T, Error>> {
        match deadline.as_pin_mut().map(|sleep| sleep.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(Error::timeout(TimeoutStage::Deadline))),
            _ => Poll::Pending,
        }
    }

    /// Whether the response to `method` with `status` has no content whatever
    /// its headers say (RFC 9110 §6.4.1): HEAD, 1xx, 204, 304.
    pub(crate) fn has_no_content(method: &Method, status: StatusCode) -> bool {
        method == Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
    }

    /// The length the response announces: its `Content-Length`, or else its
    /// body's `size_hint` lower bound. A malformed header announces nothing.
    pub(crate) fn announced_len(headers: &HeaderMap, hint: &SizeHint) -> u64 {
        let header = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        header.max(hint.lower())
    }

    pub(crate) fn too_large(detail: &'static str) -> Error {
        Error::new(ErrorKind::BodyTooLarge).with_detail(detail)
    }

    pub(crate) fn body_error(err: BoxError) -> Error {
        let mut err = match err.downcast::<Error>() {
            Ok(err) => *err,
            Err(other) => Error::new(ErrorKind::Body)
                .with_detail("reading the response body failed")
                .with_source(other),
        };
        // The response head arrived: the request reached the server.
        if err.extensions().get::<Sent>().is_none() {
            err.extensions_mut().insert(Sent::MaybeProcessed);
        }
        err
    }

    /// The body read so far. One chunk is kept as is (no copy); more are
    /// gathered into one buffer.
    #[derive(Default)]
    pub(crate) struct Collecting {
        first: Option<Bytes>,
        more: Option<BytesMut>,
        len: usize,
        /// The announced length (capped), to size the buffer once.
        hint: usize,
        trailers: Option<HeaderMap>,
    }

    impl Collecting {
        pub(crate) fn new(hint: usize) -> Self {
            Collecting {
                hint,
                ..Collecting::default()
            }
        }

        pub(crate) fn push<D: Buf>(
            &mut self,
            frame: Frame<D>,
            max_bytes: usize,
        ) -> Result<(), Error> {
            let mut data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        self.trailers = Some(trailers);
                    }
                    return Ok(());
                }
            };
            let n = data.remaining();
            if n == 0 {
                return Ok(());
            }
            self.len = self.len.saturating_add(n);
            if self.len > max_bytes {
                return Err(too_large("the body passed the cap"));
            }
            match (&self.first, &mut self.more) {
                (None, _) => self.first = Some(data.copy_to_bytes(n)),
                (Some(first), None) => {
                    let mut more = BytesMut::with_capacity(self.hint.max(self.len));
                    more.extend_from_slice(first);
                    more.put(&mut data);
                    self.more = Some(more);
                }
                (Some(_), Some(more)) => more.put(&mut data),
            }
            Ok(())
        }

        pub(crate) fn finish(self) -> CollectedBody {
            let data = match (self.more, self.first) {
                (Some(more), _) => more.freeze(),
                (None, Some(first)) => first,
                (None, None) => Bytes::new(),
            };
            CollectedBody {
                data,
                trailers: self.trailers,
            }
        }
    }
}

// ===== the collected body =====

/// A response body read whole into memory by [`CollectBodyLayer`]: its bytes
/// (one contiguous [`Bytes`]) and its trailers.
///
/// Read it directly with [`bytes`](Self::bytes) or
/// [`into_bytes`](Self::into_bytes), or as any [`Body`] (one data frame, then
/// the trailers, if any). `Debug` shows only its length.
#[derive(Clone, Default)]
pub struct CollectedBody {
    data: Bytes,
    trailers: Option<HeaderMap>,
}

impl CollectedBody {
    /// A body with `data` and no trailers.
    pub fn new(data: Bytes) -> Self {
        CollectedBody {
            data,
            trailers: None,
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.data
    }

    /// The bytes, by value (no copy).
    pub fn into_bytes(self) -> Bytes {
        self.data
    }

    /// The trailers, if the body had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// The bytes and the trailers, by value.
    #[cfg(feature = "stack")]
    pub(crate) fn into_parts(self) -> (Bytes, Option<HeaderMap>) {
        (self.data, self.trailers)
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

impl Body for CollectedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if !this.data.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut this.data)))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

impl fmt::Debug for CollectedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the bytes: a response body may hold secrets.
        f.debug_struct("CollectedBody")
            .field("len", &self.data.len())
            .field("trailers", &self.trailers.is_some())
            .finish()
    }
}

impl From<Bytes> for CollectedBody {
    fn from(data: Bytes) -> Self {
        CollectedBody::new(data)
    }
}

#[cfg(test)]
mod tests {
    use super::future::*;
    use super::*;

    #[test]
    fn announced_length() {
        let mut h = HeaderMap::new();
        assert_eq!(announced_len(&h, &SizeHint::default()), 0);
        assert_eq!(announced_len(&h, &SizeHint::with_exact(7)), 7);
        h.insert(CONTENT_LENGTH, "123".parse().unwrap());
        assert_eq!(announced_len(&h, &SizeHint::default()), 123);
        h.insert(CONTENT_LENGTH, "12x".parse().unwrap());
        assert_eq!(
            announced_len(&h, &SizeHint::default()),
            0,
            "malformed: no hint"
        );
        h.insert(CONTENT_LENGTH, "99999999999999999999999".parse().unwrap());
        assert_eq!(
            announced_len(&h, &SizeHint::default()),
            0,
            "overflow: no hint"
        );
    }

    #[test]
    fn one_chunk_is_not_copied() {
        let chunk = Bytes::from(vec![1u8; 100]);
        let mut c = Collecting::new(100);
        c.push(Frame::data(chunk.clone()), 1000).unwrap();
        let body = c.finish();
        assert_eq!(body.bytes().as_ptr(), chunk.as_ptr());
    }

    #[test]
    fn chunks_are_gathered_and_capped() {
        let mut c = Collecting::new(0);
        c.push(Frame::data(Bytes::from_static(b"ab")), 5).unwrap();
        c.push(Frame::data(Bytes::from_static(b"")), 5).unwrap();
        c.push(Frame::data(Bytes::from_static(b"cde")), 5).unwrap();
        let err = c
            .push(Frame::data(Bytes::from_static(b"f")), 5)
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::BodyTooLarge));
        assert_eq!(c.finish().bytes(), "abcde");
    }
}
