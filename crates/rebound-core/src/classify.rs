//! Classify each attempt's outcome into a [`Verdict`].
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::Verdict;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let mut svc = ServiceBuilder::new()
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(tower::service_fn(|_req: Request<()>| async {
//!         let mut res = Response::new("busy");
//!         *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let res = svc.ready().await?.call(Request::new(())).await?;
//! let verdict = Verdict::of(res.extensions());
//! assert!(verdict.is_retryable());
//! assert_eq!(verdict.reason().unwrap().as_str(), "status 503");
//! # Ok(())
//! # }
//! ```
//!
//! # What a verdict means
//!
//! [`ClassifyLayer`] asks a [`Classifier`] about every outcome of the service
//! below it and leaves the answer in the outcome's extensions (the response's,
//! or the [`Error`]'s own). **Absence is success**: nothing is inserted for a
//! [`Verdict::Success`], so the happy path pays no allocation.
//!
//! [`HttpClassifier`] is the default classifier:
//!
//! | outcome | verdict |
//! |---|---|
//! | 408, 429, 500, 502, 503, 504 (configurable) | `Retryable { sent: MaybeProcessed }` |
//! | any other 4xx or 5xx | `Fatal` |
//! | 1xx, 2xx, 3xx | `Success` |
//! | a 4xx or 5xx with `x-should-retry: false` / `true` (OpenAI's and Anthropic's APIs) | the server's word wins: `Fatal` / `Retryable { sent: MaybeProcessed }` (eligibility still applies: a write needs a key) |
//! | `Timeout(Connect)`, `Timeout(Tls)`, `Connect`, `Tls` errors | `Retryable { sent: NotSent }` |
//! | a `Tls` error marked [`CertificateRejected`] (wrong host, unknown CA, expired) | `Fatal`: not transient |
//! | other timeouts, `Body` errors | `Retryable { sent: MaybeProcessed }` |
//! | `Transport` errors whose `source()` chain holds an [`std::io::Error`] | connection refused: `NotSent`; reset, aborted, broken pipe, unexpected EOF, timed out: `MaybeProcessed` |
//! | `Rejected` by tower's `LoadShed` below the classifier | `Retryable { sent: NotSent }` |
//! | anything else (`Cancelled`, `Closed`, `Rejected`, `Throttled`, `CircuitOpen`, `Decode`, ...) | `Fatal` |
//!
//! Errors of other crates are recognised when they are converted
//! ([`Error::from_boxed`], see [`crate::foreign`]): over a bare hyper-util
//! client, a refused or timed-out connect is a `Connect` / `Timeout(Connect)`
//! error marked `NotSent`, and tower's `Elapsed` is a `Timeout(Headers)`.
//!
//! When the transport knows whether the request reached the server it says
//! so with a [`Sent`] value in the error's extensions; that answer overrides
//! the table above for every retryable error kind, and makes a `Transport`
//! error retryable with that answer (hyper's "connection closed before
//! message completed" carries no `io::Error`; the transport marks it
//! `MaybeProcessed`, so a GET is retried and a POST without a key is not).
//! A `Transport` error with neither an `io::Error` nor a `Sent` answer is
//! `Fatal`.
//!
//! Any `Fn(&Result<Response<B>, Error>) -> Verdict` is a classifier too:
//!
//! ```
//! use http::Response;
//! use rebound_core::classify::ClassifyLayer;
//! use rebound_core::{Error, Reason, Verdict};
//!
//! let layer = ClassifyLayer::new(|outcome: &Result<Response<()>, Error>| match outcome {
//!     Ok(res) if res.status().is_server_error() => Verdict::Fatal {
//!         reason: Reason::new_static("server error"),
//!     },
//!     Ok(_) => Verdict::Success,
//!     Err(_) => Verdict::Fatal { reason: Reason::new_static("error") },
//! });
//! # let _ = layer;
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{CertificateRejected, Reason, Sent, Verdict};
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};

/// Decides the [`Verdict`] of one attempt's outcome.
///
/// Implemented by [`HttpClassifier`] and by every
/// `Fn(&Result<Response<B>, Error>) -> Verdict`.
pub trait Classifier<B> {
    /// The verdict on `outcome`. Return [`Verdict::Success`] for a success:
    /// the layer then inserts nothing.
    fn classify(&self, outcome: &Result<Response<B>, Error>) -> Verdict;
}

impl<B, F> Classifier<B> for F
where
    F: Fn(&Result<Response<B>, Error>) -> Verdict,
{
    fn classify(&self, outcome: &Result<Response<B>, Error>) -> Verdict {
        self(outcome)
    }
}

// `Classifier` stays object safe, so it can be used as `dyn Classifier<B>`.
fn _obj_safe(_: &dyn Classifier<()>) {}

// ===== HttpClassifier =====

/// The default HTTP classifier; see the [module docs](self) for its table.
///
/// The set of retryable statuses is configurable; it is a small bit set, so
/// the classifier is `Copy` and classifying a status costs a shift and a mask.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HttpClassifier {
    /// Bit `n` set: status `n` (100..=999) is retryable.
    retryable: [u64; 16],
}

impl Default for HttpClassifier {
    /// 408, 429, 500, 502, 503 and 504 are retryable.
    fn default() -> Self {
        let mut c = HttpClassifier { retryable: [0; 16] };
        for s in [408u16, 429, 500, 502, 503, 504] {
            c.set(s, true);
        }
        c
    }
}

impl fmt::Debug for HttpClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let statuses: Vec<u16> = (100..1000).filter(|s| self.get(*s)).collect();
        f.debug_struct("HttpClassifier")
            .field("retryable_statuses", &statuses)
            .finish()
    }
}

impl HttpClassifier {
    /// The default classifier (same as [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A classifier for which no status is retryable (errors are still
    /// classified as in the table); add statuses with
    /// [`retryable_status`](Self::retryable_status).
    pub fn no_retryable_statuses() -> Self {
        HttpClassifier { retryable: [0; 16] }
    }

    /// Treat `status` as retryable (`Retryable { sent: MaybeProcessed }`).
    /// Default: 408, 429, 500, 502, 503, 504.
    pub fn retryable_status(mut self, status: StatusCode) -> Self {
        self.set(status.as_u16(), true);
        self
    }

    /// Treat `status` as not retryable: `Fatal` for a 4xx/5xx, `Success`
    /// otherwise.
    pub fn non_retryable_status(mut self, status: StatusCode) -> Self {
        self.set(status.as_u16(), false);
        self
    }

    /// Whether `status` is classified as retryable.
    pub fn is_retryable_status(&self, status: StatusCode) -> bool {
        self.get(status.as_u16())
    }

    fn set(&mut self, status: u16, on: bool) {
        let (word, bit) = ((status / 64) as usize, status % 64);
        if on {
            self.retryable[word] |= 1 << bit;
        } else {
            self.retryable[word] &= !(1 << bit);
        }
    }

    fn get(&self, status: u16) -> bool {
        let (word, bit) = ((status / 64) as usize, status % 64);
        self.retryable[word] & (1 << bit) != 0
    }

    /// The verdict on a response status.
    pub fn classify_status(&self, status: StatusCode) -> Verdict {
        if self.get(status.as_u16()) {
            Verdict::Retryable {
                reason: status_reason(status),
                sent: Sent::MaybeProcessed,
            }
        } else if status.is_client_error() || status.is_server_error() {
            Verdict::Fatal {
                reason: status_reason(status),
            }
        } else {
            Verdict::Success
        }
    }

    /// The verdict on an error; see the table in the [module docs](self).
    pub fn classify_error(&self, err: &Error) -> Verdict {
        classify_error(err)
    }
}

impl<B> Classifier<B> for HttpClassifier {
    fn classify(&self, outcome: &Result<Response<B>, Error>) -> Verdict {
        match outcome {
            Ok(res) => {
                // gRPC runs on HTTP/2 only: an HTTP/1 answer costs one
                // comparison here.
                if res.version() == http::Version::HTTP_2 && is_grpc(res.headers()) {
                    warn_http_classifier_on_grpc();
                }
                let verdict = self.classify_status(res.status());
                if verdict.is_success() {
                    return verdict;
                }
                // Off the happy path: the server's explicit word on retrying.
                match should_retry(res.headers()) {
                    Some(false) if verdict.is_retryable() => Verdict::Fatal {
                        reason: Reason::new_static("x-should-retry: false"),
                    },
                    Some(true) if !verdict.is_retryable() => Verdict::Retryable {
                        reason: Reason::new_static("x-should-retry: true"),
                        sent: Sent::MaybeProcessed,
                    },
                    _ => verdict,
                }
            }
            Err(err) => classify_error(err),
        }
    }
}

/// `x-should-retry: true|false` (OpenAI's and Anthropic's APIs): the
/// server's explicit word on whether this failed request may be retried.
/// Anything else is no word.
fn should_retry(headers: &http::HeaderMap) -> Option<bool> {
    match headers.get("x-should-retry")?.as_bytes() {
        b"true" => Some(true),
        b"false" => Some(false),
        _ => None,
    }
}

/// Whether `headers` say this is a gRPC message (`content-type:
/// application/grpc`, with or without a `+proto`-style suffix): the one
/// test the gRPC layers, the classifier and a transport share.
///
/// ```
/// use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue};
///
/// let mut h = HeaderMap::new();
/// h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
/// assert!(rebound_core::classify::is_grpc(&h));
/// ```
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

static WARNED_HTTP_ON_GRPC: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Once per process: an [`HttpClassifier`] sees gRPC answers, whose errors
/// come as `200 OK` with a `grpc-status` it does not read.
#[cold]
fn warn_http_classifier_on_grpc() {
    use std::sync::atomic::Ordering;
    if !WARNED_HTTP_ON_GRPC.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "an HTTP classifier sees gRPC responses: a gRPC error comes as 200 OK with a \
             grpc-status it does not read, so nothing is retried; classify with \
             rebound::grpc::GrpcClassifier (shown once)"
        );
    }
}

/// `"status NNN"`, without allocating for the statuses seen most.
fn status_reason(status: StatusCode) -> Reason {
    let text = match status.as_u16() {
        400 => "status 400",
        401 => "status 401",
        403 => "status 403",
        404 => "status 404",
        408 => "status 408",
        409 => "status 409",
        422 => "status 422",
        429 => "status 429",
        500 => "status 500",
        501 => "status 501",
        502 => "status 502",
        503 => "status 503",
        504 => "status 504",
        _ => return Reason::status(status),
    };
    Reason::new_static(text)
}

fn retryable(reason: &'static str, sent: Sent) -> Verdict {
    Verdict::Retryable {
        reason: Reason::new_static(reason),
        sent,
    }
}

fn fatal(reason: &'static str) -> Verdict {
    Verdict::Fatal {
        reason: Reason::new_static(reason),
    }
}

/// What an `std::io::Error` in the source chain says, if anything.
fn classify_io(err: &Error) -> Option<(&'static str, Sent)> {
    use std::io::ErrorKind as Io;
    let io = err.find_source::<std::io::Error>()?;
    Some(match io.kind() {
        Io::ConnectionRefused => ("connect refused", Sent::NotSent),
        Io::ConnectionReset => ("connection reset", Sent::MaybeProcessed),
        Io::ConnectionAborted => ("connection aborted", Sent::MaybeProcessed),
        Io::BrokenPipe => ("broken pipe", Sent::MaybeProcessed),
        Io::UnexpectedEof => ("incomplete message", Sent::MaybeProcessed),
        Io::TimedOut => ("io timeout", Sent::MaybeProcessed),
        _ => return None,
    })
}

fn classify_error(err: &Error) -> Verdict {
    let explicit = err.extensions().get::<Sent>().copied();
    let (reason, sent) = match err.kind() {
        ErrorKind::Timeout(stage) => match stage {
            TimeoutStage::Connect => ("timeout (connect)", Sent::NotSent),
            TimeoutStage::Tls => ("timeout (tls)", Sent::NotSent),
            TimeoutStage::Headers => ("timeout (headers)", Sent::MaybeProcessed),
            TimeoutStage::BodyIdle => ("timeout (body_idle)", Sent::MaybeProcessed),
            TimeoutStage::BodyRate => ("timeout (body_rate)", Sent::MaybeProcessed),
            TimeoutStage::Deadline => ("timeout (deadline)", Sent::MaybeProcessed),
        },
        ErrorKind::Connect => match classify_io(err) {
            Some(("connect refused", _)) => ("connect refused", Sent::NotSent),
            _ => ("connect error", Sent::NotSent),
        },
        // A certificate that failed verification is the same on the next
        // attempt: not transient.
        ErrorKind::Tls if err.extensions().get::<CertificateRejected>().is_some() => {
            return fatal("tls certificate rejected")
        }
        ErrorKind::Tls => ("tls handshake failed", Sent::NotSent),
        ErrorKind::Body => match classify_io(err) {
            Some((reason, Sent::MaybeProcessed)) => (reason, Sent::MaybeProcessed),
            _ => ("body error", Sent::MaybeProcessed),
        },
        ErrorKind::Transport => match (classify_io(err), explicit) {
            (Some((reason, sent)), _) => (reason, sent),
            (None, Some(Sent::NotSent)) => ("not sent", Sent::NotSent),
            // The transport judged it (e.g. hyper's "connection closed
            // before message completed", which carries no io::Error): a
            // transient failure after the request may have been written.
            (None, Some(Sent::MaybeProcessed)) => ("transport error", Sent::MaybeProcessed),
            (None, None) => return fatal("transport error"),
        },
        ErrorKind::Cancelled => return fatal("cancelled"),
        ErrorKind::Closed => return fatal("closed"),
        // tower's `LoadShed` below the classifier refused the attempt before
        // it left: retry it after a backoff. rebound's own limits reject
        // above the retry loop (or when their queue is full), which is final.
        ErrorKind::Rejected
            if err
                .find_source::<tower::load_shed::error::Overloaded>()
                .is_some() =>
        {
            ("overloaded", Sent::NotSent)
        }
        ErrorKind::Rejected => return fatal("rejected"),
        ErrorKind::Throttled => return fatal("throttled"),
        // Failed before sending: the quota is out past the deadline.
        ErrorKind::QuotaExhausted => return fatal("quota exhausted"),
        // Shed locally by client-side throttling, never sent: the host
        // accepts too little for a retry to help.
        ErrorKind::ClientThrottled => return fatal("client throttled"),
        // Failed at once by a circuit breaker, never sent: retrying now
        // would only meet the open circuit again (and spend the budget).
        ErrorKind::CircuitOpen => return fatal("circuit open"),
        // A write that may have happened and could not be reconciled:
        // sending it again could do it twice.
        ErrorKind::Ambiguous => return fatal("ambiguous write"),
        ErrorKind::Decode => return fatal("decode error"),
        ErrorKind::Status => return fatal("unexpected status"),
        ErrorKind::BodyTooLarge => return fatal("body too large"),
        ErrorKind::NotReplayable => return fatal("body not replayable"),
        ErrorKind::Config => return fatal("invalid configuration"),
        ErrorKind::InvalidRequest => return fatal("invalid request"),
    };
    retryable(reason, explicit.unwrap_or(sent))
}

// ===== layer =====

/// Classifies every outcome of the inner service with `C` and leaves a
/// [`Verdict`] in its extensions (none for a success).
///
/// See the [module docs](self) for an example.
///
/// # Clone
///
/// Cloning the layer clones the classifier.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassifyLayer<C> {
    classifier: C,
}

impl<C> ClassifyLayer<C> {
    /// A layer that classifies with `classifier`.
    pub fn new(classifier: C) -> Self {
        ClassifyLayer { classifier }
    }
}

impl<S, C: Clone> Layer<S> for ClassifyLayer<C> {
    type Service = Classify<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Classify {
            inner,
            classifier: self.classifier.clone(),
        }
    }
}

// ===== service =====

/// The service made by [`ClassifyLayer`].
///
/// # Errors
///
/// Inner errors are turned into [`Error`] (an inner `rebound::Error` is kept
/// as is) and carry the verdict in their extensions.
#[derive(Clone)]
pub struct Classify<S, C> {
    inner: S,
    classifier: C,
}

impl<S: fmt::Debug, C> fmt::Debug for Classify<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classify")
            .field("inner", &self.inner)
            .field("classifier", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C> Classify<S, C> {
    /// Wrap `inner`, classifying with `classifier`.
    pub fn new(inner: S, classifier: C) -> Self {
        Classify { inner, classifier }
    }

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

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for Classify<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    C: Classifier<ResB> + Clone,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        future::ResponseFuture::new(self.inner.call(req), self.classifier.clone())
    }
}

pub mod future {
    //! The response future of [`Classify`].

    use super::*;

    pin_project! {
        /// The response future of [`Classify`](super::Classify).
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F, C> {
            #[pin]
            inner: F,
            classifier: C,
        }
    }

    impl<F, C> ResponseFuture<F, C> {
        pub(super) fn new(inner: F, classifier: C) -> Self {
            ResponseFuture { inner, classifier }
        }
    }

    impl<F: fmt::Debug, C> fmt::Debug for ResponseFuture<F, C> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture")
                .field("inner", &self.inner)
                .finish()
        }
    }

    impl<F, C, B, E> Future for ResponseFuture<F, C>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
        C: Classifier<B>,
    {
        type Output = Result<Response<B>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let mut outcome = ready!(this.inner.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
            let verdict = this.classifier.classify(&outcome);
            if !verdict.is_success() {
                match &mut outcome {
                    Ok(res) => res.extensions_mut().insert(verdict),
                    Err(err) => err.extensions_mut().insert(verdict),
                };
            }
            Poll::Ready(outcome)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_servers_word_on_retrying_wins_over_the_status() {
        let c = HttpClassifier::default();
        let res = |status: u16, word: Option<&str>| {
            let mut b = Response::builder().status(status);
            if let Some(w) = word {
                b = b.header("x-should-retry", w);
            }
            let out: Result<Response<()>, Error> = Ok(b.body(()).unwrap());
            Classifier::classify(&c, &out)
        };
        assert!(res(503, None).is_retryable());
        assert!(!res(503, Some("false")).is_retryable());
        assert!(!res(503, Some("false")).is_success());
        assert!(!res(409, None).is_retryable());
        assert!(res(409, Some("true")).is_retryable());
        assert!(res(200, Some("true")).is_success(), "a success stays one");
        assert!(
            res(503, Some("maybe")).is_retryable(),
            "no word: the status"
        );
    }

    use super::*;
    use std::io;

    fn status(c: &HttpClassifier, s: u16) -> Verdict {
        c.classify_status(StatusCode::from_u16(s).unwrap())
    }

    #[test]
    fn status_table() {
        let c = HttpClassifier::default();
        for s in [408, 429, 500, 502, 503, 504] {
            let v = status(&c, s);
            assert_eq!(v.sent(), Some(Sent::MaybeProcessed), "{s}");
            assert_eq!(v.reason().unwrap().as_str(), format!("status {s}"));
        }
        for s in [400, 401, 403, 404, 409, 422, 451, 501, 505, 599] {
            assert!(status(&c, s).is_fatal(), "{s}");
            assert_eq!(
                status(&c, s).reason().unwrap().as_str(),
                format!("status {s}")
            );
        }
        for s in [100, 200, 201, 204, 301, 304, 399] {
            assert!(status(&c, s).is_success(), "{s}");
        }
    }

    #[test]
    fn statuses_are_configurable() {
        let c = HttpClassifier::default()
            .retryable_status(StatusCode::CONFLICT)
            .non_retryable_status(StatusCode::SERVICE_UNAVAILABLE);
        assert!(status(&c, 409).is_retryable());
        assert!(status(&c, 503).is_fatal());
        let none = HttpClassifier::no_retryable_statuses();
        assert!(status(&none, 503).is_fatal());
        assert!(format!("{c:?}").contains("409"));
    }

    fn err_verdict(e: Error) -> Verdict {
        HttpClassifier::default().classify_error(&e)
    }

    fn io_err(kind: io::ErrorKind) -> Error {
        Error::from_boxed(Box::new(io::Error::new(kind, "x")))
    }

    #[test]
    fn error_table() {
        use ErrorKind as K;
        let not_sent = [
            (Error::timeout(TimeoutStage::Connect), "timeout (connect)"),
            (Error::timeout(TimeoutStage::Tls), "timeout (tls)"),
            (Error::new(K::Connect), "connect error"),
            (
                Error::new(K::Connect)
                    .with_source(io::Error::from(io::ErrorKind::ConnectionRefused)),
                "connect refused",
            ),
            (Error::new(K::Tls), "tls handshake failed"),
            (io_err(io::ErrorKind::ConnectionRefused), "connect refused"),
        ];
        for (e, reason) in not_sent {
            let v = err_verdict(e);
            assert_eq!(v.sent(), Some(Sent::NotSent), "{reason}");
            assert_eq!(v.reason().unwrap().as_str(), reason);
        }
        let maybe = [
            (Error::timeout(TimeoutStage::Headers), "timeout (headers)"),
            (
                Error::timeout(TimeoutStage::BodyIdle),
                "timeout (body_idle)",
            ),
            (
                Error::timeout(TimeoutStage::BodyRate),
                "timeout (body_rate)",
            ),
            (Error::new(K::Body), "body error"),
            (io_err(io::ErrorKind::ConnectionReset), "connection reset"),
            (
                io_err(io::ErrorKind::ConnectionAborted),
                "connection aborted",
            ),
            (io_err(io::ErrorKind::BrokenPipe), "broken pipe"),
            (io_err(io::ErrorKind::UnexpectedEof), "incomplete message"),
            (io_err(io::ErrorKind::TimedOut), "io timeout"),
        ];
        for (e, reason) in maybe {
            let v = err_verdict(e);
            assert_eq!(v.sent(), Some(Sent::MaybeProcessed), "{reason}");
            assert_eq!(v.reason().unwrap().as_str(), reason);
        }
        let fatal = [
            K::Cancelled,
            K::Closed,
            K::Rejected,
            K::Throttled,
            K::Decode,
            K::BodyTooLarge,
            K::NotReplayable,
            K::Config,
            K::InvalidRequest,
            K::Transport,
        ];
        for k in fatal {
            assert!(err_verdict(Error::new(k)).is_fatal(), "{k:?}");
        }
        assert!(err_verdict(io_err(io::ErrorKind::PermissionDenied)).is_fatal());
        let other: BoxError = "some library error".into();
        assert!(err_verdict(Error::from_boxed(other)).is_fatal());
    }

    #[test]
    fn io_error_deep_in_the_chain() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("wrapper")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Error::from_boxed(Box::new(Wrapper(io::Error::from(
            io::ErrorKind::ConnectionReset,
        ))));
        assert_eq!(err_verdict(e).sent(), Some(Sent::MaybeProcessed));
    }

    #[test]
    fn explicit_sent_overrides() {
        let mut e = Error::timeout(TimeoutStage::Headers);
        e.extensions_mut().insert(Sent::NotSent);
        assert_eq!(err_verdict(e).sent(), Some(Sent::NotSent));

        let mut e = Error::new(ErrorKind::Connect);
        e.extensions_mut().insert(Sent::MaybeProcessed);
        assert_eq!(err_verdict(e).sent(), Some(Sent::MaybeProcessed));

        let mut e = Error::new(ErrorKind::Transport);
        e.extensions_mut().insert(Sent::NotSent);
        let v = err_verdict(e);
        assert_eq!(v.sent(), Some(Sent::NotSent));
        assert_eq!(v.reason().unwrap().as_str(), "not sent");

        // A transport error the transport judged "maybe processed" (hyper's
        // incomplete message, no io::Error inside) is retryable as such;
        // without any judgement it stays fatal.
        let mut e = Error::new(ErrorKind::Transport);
        e.extensions_mut().insert(Sent::MaybeProcessed);
        assert_eq!(err_verdict(e).sent(), Some(Sent::MaybeProcessed));
        assert!(err_verdict(Error::new(ErrorKind::Transport)).is_fatal());

        // Sent does not make a fatal kind retryable.
        let mut e = Error::new(ErrorKind::Cancelled);
        e.extensions_mut().insert(Sent::NotSent);
        assert!(err_verdict(e).is_fatal());
    }

    #[tokio::test(start_paused = true)]
    async fn layer_inserts_only_non_success() {
        use tower::{ServiceBuilder, ServiceExt};
        let svc = ServiceBuilder::new()
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(tower::service_fn(|req: Request<u16>| async move {
                if *req.body() == 0 {
                    return Err::<Response<()>, BoxError>(Box::new(Error::new(ErrorKind::Connect)));
                }
                let mut res = Response::new(());
                *res.status_mut() = StatusCode::from_u16(*req.body()).unwrap();
                Ok(res)
            }));
        let ok = svc.clone().oneshot(Request::new(200)).await.unwrap();
        assert!(ok.extensions().get::<Verdict>().is_none());
        let bad = svc.clone().oneshot(Request::new(404)).await.unwrap();
        assert!(bad.extensions().get::<Verdict>().unwrap().is_fatal());
        let err = svc.clone().oneshot(Request::new(0)).await.unwrap_err();
        assert_eq!(Verdict::of(err.extensions()).sent(), Some(Sent::NotSent));
    }

    #[test]
    fn closure_is_a_classifier() {
        fn takes<C: Classifier<()>>(c: C) -> Verdict {
            c.classify(&Ok(Response::new(())))
        }
        let v = takes(|_: &Result<Response<()>, Error>| Verdict::Fatal {
            reason: Reason::new_static("no"),
        });
        assert!(v.is_fatal());
    }
}
