//! [`GrpcClassifier`] (the head of a call) and [`GrpcTrailersLayer`] (its
//! end).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Span;

use super::code::{is_grpc, Code};
use crate::annotations::{Reason, Sent, Verdict};
use crate::classify::{Classifier, HttpClassifier};
use crate::error::Error;

// ===== GrpcClassifier =====

/// Classifies a gRPC call's outcome after gRFC A6; see the
/// [module docs](super) for the rules.
///
/// The set of retryable codes is a bit set: the classifier is `Copy`, and
/// classifying costs a header look-up and a mask.
///
/// ```
/// use http::Response;
/// use rebound_core::grpc::{Code, GrpcClassifier};
/// use rebound_core::classify::Classifier;
///
/// let c = GrpcClassifier::default().retryable_code(Code::RESOURCE_EXHAUSTED);
/// let trailers_only = |code: &'static str| {
///     Ok(Response::builder().header("grpc-status", code).body(()).unwrap())
/// };
/// assert!(c.classify(&trailers_only("14")).is_retryable()); // UNAVAILABLE
/// assert!(c.classify(&trailers_only("8")).is_retryable()); // RESOURCE_EXHAUSTED
/// assert!(c.classify(&trailers_only("3")).is_fatal()); // INVALID_ARGUMENT
/// assert!(c.classify(&trailers_only("0")).is_success());
/// // Headers without a status: the call is committed, never retried.
/// assert!(c.classify(&Ok(Response::new(()))).is_success());
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GrpcClassifier {
    /// Bit `n` set: code `n` is retryable.
    retryable: u32,
}

impl Default for GrpcClassifier {
    /// Only UNAVAILABLE is retryable.
    fn default() -> Self {
        GrpcClassifier {
            retryable: 1 << Code::UNAVAILABLE.as_u8(),
        }
    }
}

impl fmt::Debug for GrpcClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let codes: Vec<Code> = (0..=16)
            .map(Code::from_i32)
            .filter(|c| self.is_retryable_code(*c))
            .collect();
        f.debug_struct("GrpcClassifier")
            .field("retryable_codes", &codes)
            .finish()
    }
}

impl GrpcClassifier {
    /// The default classifier: only UNAVAILABLE is retryable.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replace the retryable codes (A6's `retryableStatusCodes`). OK is
    /// never retryable, whatever the list says. Default: UNAVAILABLE.
    pub fn retryable_codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.retryable = 0;
        for c in codes {
            self = self.retryable_code(c);
        }
        self
    }

    /// Also treat `code` as retryable (OK is ignored).
    pub fn retryable_code(mut self, code: Code) -> Self {
        if code != Code::OK {
            self.retryable |= 1 << code.as_u8();
        }
        self
    }

    /// Treat `code` as not retryable.
    pub fn non_retryable_code(mut self, code: Code) -> Self {
        self.retryable &= !(1 << code.as_u8());
        self
    }

    /// Whether `code` is classified as retryable.
    pub fn is_retryable_code(&self, code: Code) -> bool {
        self.retryable & (1 << code.as_u8()) != 0
    }

    /// The verdict on a final status `code`.
    pub fn classify_code(&self, code: Code) -> Verdict {
        if code == Code::OK {
            Verdict::Success
        } else if self.is_retryable_code(code) {
            Verdict::Retryable {
                reason: Reason::new_static(code.reason()),
                sent: Sent::MaybeProcessed,
            }
        } else {
            Verdict::Fatal {
                reason: Reason::new_static(code.reason()),
            }
        }
    }

    /// The verdict on a response head: its `grpc-status` (Trailers-Only);
    /// without one, an HTTP status other than 200 mapped as gRPC says
    /// ([`Code::from_http_status`]); otherwise `Success`, because the call
    /// is committed and its status comes in the trailers.
    pub fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        match Code::from_headers(headers) {
            Some(code) => self.classify_code(code),
            None if status != StatusCode::OK => self.classify_code(Code::from_http_status(status)),
            None => Verdict::Success,
        }
    }

    /// The verdict on an error: as [`HttpClassifier::classify_error`] (a
    /// refused connect is `Retryable { sent: NotSent }`, retried whatever
    /// the method).
    pub fn classify_error(&self, err: &Error) -> Verdict {
        HttpClassifier::default().classify_error(err)
    }
}

impl<B> Classifier<B> for GrpcClassifier {
    fn classify(&self, outcome: &Result<Response<B>, Error>) -> Verdict {
        match outcome {
            Ok(res) => self.classify_head(res.status(), res.headers()),
            Err(err) => self.classify_error(err),
        }
    }
}

// ===== GrpcTrailersLayer =====

/// Watches the end of committed gRPC calls: when the response head had no
/// `grpc-status`, the body is wrapped in a [`GrpcTrailersBody`] that reads
/// the status in the trailers and records it on the trace (and, with the
/// `metrics` feature, as `rebound_grpc_status_total{code}`).
///
/// A committed call is never retried (gRFC A6); this is how its final status
/// still reaches the trace. A failed status is a WARN event
/// `grpc call failed after its headers` with `grpc.code` (the name) and
/// `grpc.status` (the number), an OK one a DEBUG event; both in the span
/// that was current when the head arrived (the request span under
/// [`TraceLayer`](crate::trace::TraceLayer)). `grpc-message` is never
/// logged: it is the server's text.
///
/// Responses that are not gRPC, and Trailers-Only responses (already
/// classified from their head), are passed through: their body is not
/// watched.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcTrailersLayer {
    _p: (),
}

impl GrpcTrailersLayer {
    /// The layer.
    pub fn new() -> Self {
        GrpcTrailersLayer { _p: () }
    }
}

impl<S> Layer<S> for GrpcTrailersLayer {
    type Service = GrpcTrailers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrailers { inner }
    }
}

/// The service made by [`GrpcTrailersLayer`].
#[derive(Clone, Debug)]
pub struct GrpcTrailers<S> {
    inner: S,
}

impl<S> GrpcTrailers<S> {
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

impl<S, ReqB, ResB> Service<Request<ReqB>> for GrpcTrailers<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Response = Response<GrpcTrailersBody<ResB>>;
    type Error = S::Error;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        future::ResponseFuture {
            inner: self.inner.call(req),
        }
    }
}

pub mod future {
    //! The response future of [`GrpcTrailers`](super::GrpcTrailers).

    use super::*;

    pin_project! {
        /// The response future of [`GrpcTrailers`](super::GrpcTrailers).
        #[must_use = "futures do nothing unless polled"]
        #[derive(Debug)]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) inner: F,
        }
    }

    impl<F, B, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
    {
        type Output = Result<Response<GrpcTrailersBody<B>>, E>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let res = ready!(self.project().inner.poll(cx))?;
            let watch = is_grpc(res.headers())
                && res.status() == StatusCode::OK
                && Code::from_headers(res.headers()).is_none();
            let span = if watch { Some(Span::current()) } else { None };
            Poll::Ready(Ok(res.map(|inner| GrpcTrailersBody { inner, span })))
        }
    }
}

pin_project! {
    /// The response body of [`GrpcTrailers`]: the inner body, unchanged,
    /// whose trailers' `grpc-status` is recorded (see [`GrpcTrailersLayer`]).
    pub struct GrpcTrailersBody<B> {
        #[pin]
        inner: B,
        // `Some` while the status is still to be seen.
        span: Option<Span>,
    }
}

impl<B> GrpcTrailersBody<B> {
    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Unwrap the inner body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for GrpcTrailersBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcTrailersBody")
            .field("inner", &self.inner)
            .field("watching", &self.span.is_some())
            .finish()
    }
}

/// Record a committed call's final `code` in `span` (and as a metric).
pub(crate) fn record(span: Span, code: Code) {
    let (name, n) = (code.name(), code.as_u8());
    span.in_scope(|| {
        if code == Code::OK {
            tracing::debug!(target: "rebound::grpc", { grpc.code = name, grpc.status = n }, "grpc call ended");
        } else {
            tracing::warn!(target: "rebound::grpc", { grpc.code = name, grpc.status = n }, "grpc call failed after its headers");
        }
    });
    #[cfg(feature = "metrics")]
    metrics::counter!("rebound_grpc_status_total", "code" => name).increment(1);
}

impl<B: Body> Body for GrpcTrailersBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if this.span.is_some() {
            match &frame {
                Some(Ok(f)) => {
                    if let Some(trailers) = f.trailers_ref() {
                        // No status in the trailers: gRPC calls it UNKNOWN.
                        let code = Code::from_headers(trailers).unwrap_or(Code::UNKNOWN);
                        record(this.span.take().expect("checked"), code);
                    }
                }
                // A stream that ends without trailers has no status.
                None => record(this.span.take().expect("checked"), Code::UNKNOWN),
                // A body error is the transport's to report.
                Some(Err(_)) => *this.span = None,
            }
        }
        Poll::Ready(frame)
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
    use super::*;
    use http::HeaderValue;

    fn head(status: u16, grpc: Option<&'static str>) -> Verdict {
        let mut b = Response::builder().status(status);
        if let Some(g) = grpc {
            b = b.header("grpc-status", g);
        }
        GrpcClassifier::default().classify(&Ok(b.body(()).unwrap()))
    }

    #[test]
    fn trailers_only_and_committed() {
        assert!(head(200, Some("14")).is_retryable());
        assert_eq!(
            head(200, Some("14")).reason().unwrap().as_str(),
            "grpc UNAVAILABLE"
        );
        assert_eq!(head(200, Some("14")).sent(), Some(Sent::MaybeProcessed));
        assert!(head(200, Some("3")).is_fatal());
        assert!(head(200, Some("0")).is_success());
        // Malformed or unknown: UNKNOWN, not retried.
        assert!(head(200, Some("nope")).is_fatal());
        assert_eq!(
            head(200, Some("42")).reason().unwrap().as_str(),
            "grpc UNKNOWN"
        );
        // Committed: no status in the head.
        assert!(head(200, None).is_success());
        // A proxy's 503 without grpc-status: UNAVAILABLE.
        assert!(head(503, None).is_retryable());
        assert!(head(404, None).is_fatal());
    }

    #[test]
    fn codes_are_configurable() {
        let c = GrpcClassifier::default()
            .retryable_codes([Code::RESOURCE_EXHAUSTED, Code::OK])
            .retryable_code(Code::ABORTED);
        assert!(!c.is_retryable_code(Code::UNAVAILABLE));
        assert!(!c.is_retryable_code(Code::OK));
        assert!(c.classify_code(Code::RESOURCE_EXHAUSTED).is_retryable());
        assert!(c.classify_code(Code::ABORTED).is_retryable());
        let c = c.non_retryable_code(Code::ABORTED);
        assert!(c.classify_code(Code::ABORTED).is_fatal());
        assert!(format!("{c:?}").contains("RESOURCE_EXHAUSTED"));
    }

    #[test]
    fn errors_as_http() {
        let c = GrpcClassifier::default();
        let e = Error::new(crate::ErrorKind::Connect);
        assert_eq!(c.classify_error(&e).sent(), Some(Sent::NotSent));
        assert!(c
            .classify_error(&Error::new(crate::ErrorKind::Cancelled))
            .is_fatal());
    }

    #[cfg(feature = "metrics")]
    #[tokio::test]
    async fn trailers_status_is_counted() {
        use http_body_util::BodyExt;
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        {
            let _guard = metrics::set_default_local_recorder(&recorder);
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("14"));
            let frames = vec![Ok::<_, std::convert::Infallible>(
                Frame::<bytes::Bytes>::trailers(trailers),
            )];
            let body = GrpcTrailersBody {
                inner: http_body_util::StreamBody::new(futures_util::stream::iter(frames)),
                span: Some(Span::none()),
            };
            body.collect().await.unwrap();
        }
        let counted: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "rebound_grpc_status_total")
            .map(|(k, _, _, v)| {
                let labels: Vec<String> = k
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (labels, v)
            })
            .collect();
        assert_eq!(
            counted,
            vec![(vec!["code=UNAVAILABLE".to_owned()], DebugValue::Counter(1))]
        );
    }

    #[tokio::test]
    async fn trailers_body_passes_frames() {
        use http_body_util::BodyExt;
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("13"));
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from_static(b"x"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = GrpcTrailersBody {
            inner: http_body_util::StreamBody::new(futures_util::stream::iter(frames)),
            span: Some(Span::none()),
        };
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "13");
    }
}
