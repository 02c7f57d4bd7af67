//! The one error type of the stack, and how to read an outcome.
//!
//! ```
//! use rebound_core::{Error, ErrorKind, TimeoutStage};
//!
//! let uri: http::Uri = "https://user:pw@api.example.com/v1/models?key=secret".parse().unwrap();
//! let err = Error::timeout(TimeoutStage::Headers).with_request(&http::Method::GET, &uri);
//! assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Headers));
//! assert_eq!(err.to_string(), "timeout (headers) for GET https://api.example.com/v1/models");
//!
//! // It is a `tower::BoxError`, and comes back out of one unchanged.
//! let boxed: tower::BoxError = err.into();
//! let back = Error::from_boxed(boxed);
//! assert!(matches!(back.kind(), ErrorKind::Timeout(_)));
//! ```
//!
//! [`Error`] is an opaque struct in hyper-util's shape: its
//! [kind](Error::kind), the [`source()`](std::error::Error::source) chain,
//! and an `http::Extensions` of its own so that outcome annotations
//! ([`Verdict`](crate::annotations::Verdict), [`Attempts`], ...) ride on
//! errors exactly as they ride on responses.
//!
//! # Reading an outcome
//!
//! Two questions, each with one answer, the same on `Err` and on
//! `Ok(response)`:
//!
//! * **What failed?** [`Error::kind`], an [`ErrorKind`] to match on
//!   (`ErrorKind::Timeout(stage)`, `Connect`, `CircuitOpen`, ...). It is
//!   the only reading of an error's kind; the `is_timeout()`-style
//!   predicates are deprecated aliases of it, and
//!   [`timeout_stage`](Error::timeout_stage) is the stage of a `Timeout`
//!   kind. A response is not a failure: its status is the server's answer.
//! * **Did the retry loop give up?** [`RetryStop`], on whatever the caller
//!   finally gets when the loop stopped short of a success: on an error,
//!   [`Error::retry_stop`]; on a response (the last real answer, a 503
//!   after its retries), [`RetryStop::of`]`(res.extensions())`. `None`
//!   means it succeeded (or no retry loop ran); `Some(RetryStop::Attempts)`
//!   that it ran out of attempts, `Some(RetryStop::Budget)` that the retry
//!   budget refused another, and so on. How many attempts were made:
//!   [`Error::attempts`] and [`Attempts::of`]`(res.extensions())`.
//!
//! ```
//! use rebound_core::{Attempts, Error, ErrorKind, RetryStop};
//!
//! // What a retry loop hands back after three 503s: the last response...
//! let mut res = http::Response::new(());
//! *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
//! res.extensions_mut().insert(Attempts(3));
//! res.extensions_mut().insert(RetryStop::Attempts);
//! // ...or, after three refused connections, the last error.
//! let mut err = Error::new(ErrorKind::Connect);
//! err.extensions_mut().insert(Attempts(3));
//! err.extensions_mut().insert(RetryStop::Attempts);
//!
//! let outcome: Result<http::Response<()>, Error> = Ok(res);
//! let (gave_up, attempts) = match &outcome {
//!     Ok(res) => (RetryStop::of(res.extensions()), Attempts::of(res.extensions())),
//!     Err(err) => (err.retry_stop(), err.attempts()),
//! };
//! assert_eq!((gave_up, attempts), (Some(RetryStop::Attempts), 3));
//! assert_eq!((err.kind(), err.retry_stop()), (ErrorKind::Connect, Some(RetryStop::Attempts)));
//! ```
//!
//! Whether an attempt may have reached the server is the outcome's
//! [`Verdict`](crate::annotations::Verdict)'s
//! [`sent`](crate::annotations::Verdict::sent), or a
//! [`Sent`](crate::Sent) in the error's extensions.
//!
//! # What an error shows
//!
//! `Display` names what failed, the method and the URL **without** query,
//! userinfo or any header value: `timeout (headers) for GET
//! https://api.example.com/v1/models`. Nothing the caller sent is ever
//! printed beyond that. An API with secrets in its paths sets a
//! [`PathRedaction`] on the trace layer (or the client): every error that
//! leaves through the trace layers then shows the path as the spans do
//! (`for GET https://api.example.com/v1/keys/{key}`), see
//! [`Error::redact_path`].
//!
//! Every rebound layer has `type Error = rebound::Error`. Inner errors are
//! turned into it with [`Error::from_boxed`], which never wraps an inner
//! `rebound::Error` twice.

use std::error::Error as StdError;
use std::fmt;

use http::{Extensions, Method, Uri};

use crate::annotations::{Attempts, RetryStop};
use crate::redact::{PathRedaction, RedactedUri};

/// A boxed error: what `tower` layers exchange.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The stage of a request at which a timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeoutStage {
    /// Establishing the TCP connection (across all resolved addresses).
    Connect,
    /// The TLS handshake, measured from TCP-established.
    Tls,
    /// Waiting for the response head (the per-attempt timeout).
    Headers,
    /// No response body frame arrived for the idle timeout.
    BodyIdle,
    /// The response body arrived slower than the minimum rate.
    BodyRate,
    /// The total deadline of the logical request passed.
    Deadline,
}

impl TimeoutStage {
    /// `"connect"`, `"tls"`, `"headers"`, `"body_idle"`, `"body_rate"` or
    /// `"deadline"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            TimeoutStage::Connect => "connect",
            TimeoutStage::Tls => "tls",
            TimeoutStage::Headers => "headers",
            TimeoutStage::BodyIdle => "body_idle",
            TimeoutStage::BodyRate => "body_rate",
            TimeoutStage::Deadline => "deadline",
        }
    }
}

impl fmt::Display for TimeoutStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of failure an [`Error`] is. Match on it to branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A timeout fired at the given stage.
    Timeout(TimeoutStage),
    /// The connection could not be established (refused, DNS, unreachable).
    Connect,
    /// The TLS handshake failed (not a timeout).
    Tls,
    /// Reading or writing a body failed (reset, truncated, ...).
    Body,
    /// The response body was larger than the configured cap.
    BodyTooLarge,
    /// The response body could not be decoded (empty, invalid, wrong shape).
    Decode,
    /// A helper that expects a success (e.g. the JSON helpers) got another
    /// status; the status is in the error's source.
    Status,
    /// The caller cancelled the request.
    Cancelled,
    /// The client (or stack) is shut down: a new request is failed at once,
    /// **not sent**; one cut at the end of the shutdown's grace period may
    /// have been (see `rebound_core::shutdown`).
    Closed,
    /// A concurrency limiter refused the request (its queue was full).
    Rejected,
    /// A Retry-After gate refused the request: the server asked for a pause.
    Throttled,
    /// The server's announced quota for the request's host (requests or
    /// tokens) is out and does not come back before the request's
    /// deadline: the request was failed at once, **not sent**, and is not
    /// retried. The error carries when the quota resets (see
    /// `rebound_core::ratelimit`).
    QuotaExhausted,
    /// Client-side adaptive throttling shed the attempt: its host has
    /// accepted too few of the requests asked of it lately (Google SRE's
    /// rule). The attempt was failed at once, **not sent**, and is not
    /// retried (see `rebound_core::throttle`).
    ClientThrottled,
    /// A circuit breaker is open for the request's host (or scope): the
    /// request was failed at once, **not sent**. The error names the host
    /// and when the circuit may close (see `rebound_core::breaker`).
    CircuitOpen,
    /// A write may have been processed (its answer was lost) and the status
    /// check could not say how it ended; the error carries the operation id
    /// (see `rebound_core::reconcile`). Not retried.
    Ambiguous,
    /// The request cannot be sent (again): its body cannot be replayed.
    NotReplayable,
    /// The request itself is invalid (bad URI, bad header value, ...).
    InvalidRequest,
    /// A layer or client was configured with values that cannot work;
    /// returned when it is built, never per request.
    Config,
    /// Any other failure of the transport or of an inner service.
    Transport,
}

impl ErrorKind {
    /// A short label for logs and metrics (`error.type`):
    /// `"timeout"`, `"connect"`, `"tls"`, ...
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorKind::Timeout(_) => "timeout",
            ErrorKind::Connect => "connect",
            ErrorKind::Tls => "tls",
            ErrorKind::Body => "body",
            ErrorKind::BodyTooLarge => "body_too_large",
            ErrorKind::Decode => "decode",
            ErrorKind::Status => "status",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Closed => "closed",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Throttled => "throttled",
            ErrorKind::QuotaExhausted => "quota_exhausted",
            ErrorKind::ClientThrottled => "client_throttled",
            ErrorKind::CircuitOpen => "circuit_open",
            ErrorKind::Ambiguous => "ambiguous",
            ErrorKind::NotReplayable => "not_replayable",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Config => "config",
            ErrorKind::Transport => "transport",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Timeout(stage) => write!(f, "timeout ({stage})"),
            ErrorKind::Connect => f.write_str("connect error"),
            ErrorKind::Tls => f.write_str("tls error"),
            ErrorKind::Body => f.write_str("body error"),
            ErrorKind::BodyTooLarge => f.write_str("body too large"),
            ErrorKind::Decode => f.write_str("decode error"),
            ErrorKind::Status => f.write_str("unexpected status"),
            ErrorKind::Cancelled => f.write_str("cancelled"),
            ErrorKind::Closed => f.write_str("closed: the client is shut down"),
            ErrorKind::Rejected => f.write_str("rejected by the concurrency limiter"),
            ErrorKind::Throttled => f.write_str("throttled: the server asked for a pause"),
            ErrorKind::QuotaExhausted => f.write_str("quota exhausted"),
            ErrorKind::ClientThrottled => {
                f.write_str("throttled by the client: the host accepts too few requests")
            }
            ErrorKind::CircuitOpen => f.write_str("circuit open"),
            ErrorKind::Ambiguous => f.write_str("ambiguous write"),
            ErrorKind::NotReplayable => f.write_str("request body not replayable"),
            ErrorKind::InvalidRequest => f.write_str("invalid request"),
            ErrorKind::Config => f.write_str("invalid configuration"),
            ErrorKind::Transport => f.write_str("transport error"),
        }
    }
}

/// The error of every rebound layer and of the ready-made client.
///
/// See the [module docs](self).
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    /// A short, secret-free detail (e.g. which configuration value is wrong).
    detail: Option<&'static str>,
    /// An owned detail, for configuration errors that name values.
    detail_owned: Option<String>,
    method: Option<Method>,
    url: Option<RedactedUri>,
    source: Option<BoxError>,
    extensions: Extensions,
}

impl Error {
    /// A new error of the given kind.
    pub fn new(kind: ErrorKind) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                detail: None,
                detail_owned: None,
                method: None,
                url: None,
                source: None,
                extensions: Extensions::new(),
            }),
        }
    }

    /// A timeout at `stage`.
    pub fn timeout(stage: TimeoutStage) -> Self {
        Error::new(ErrorKind::Timeout(stage))
    }

    /// A configuration error, with a message that says what is wrong. The
    /// message must not contain secrets; it is shown as is.
    pub fn config(message: impl Into<String>) -> Self {
        let mut e = Error::new(ErrorKind::Config);
        e.inner.detail_owned = Some(message.into());
        e
    }

    /// The same error with `source` as its cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// The same error with a short, secret-free detail shown after the kind
    /// (e.g. `"connection reset"`).
    pub fn with_detail(mut self, detail: &'static str) -> Self {
        self.inner.detail = Some(detail);
        self
    }

    /// The same error with an owned, secret-free detail shown after the kind
    /// (off the happy path only: it allocates).
    #[allow(dead_code)] // used by the `breaker` feature
    pub(crate) fn with_owned_detail(mut self, detail: String) -> Self {
        self.inner.detail_owned = Some(detail);
        self
    }

    /// The same error, naming the request it belongs to. Only the method and
    /// the [redacted](crate::redact) URL are kept. A request already named is
    /// not renamed.
    pub fn with_request(mut self, method: &Method, uri: &Uri) -> Self {
        if self.inner.method.is_none() {
            self.inner.method = Some(method.clone());
            self.inner.url = Some(RedactedUri::new(uri));
        }
        self
    }

    /// Show the path of the URL this error names as `redaction` says
    /// (see [`PathRedaction`]); applied once, so a path redacted already is
    /// kept. The trace layers do this to every error that passes through
    /// them, with their configured redaction, so an error that reaches the
    /// caller through them shows the path as the spans do. A no-op for an
    /// error that names no request and for [`PathRedaction::full`].
    pub fn redact_path(&mut self, redaction: &PathRedaction) {
        if let Some(url) = &mut self.inner.url {
            url.redact_path(redaction);
        }
    }

    /// Turn any boxed error into a rebound `Error`. An inner error that
    /// already is a rebound `Error` is returned as is, never wrapped twice.
    /// Another crate's error that rebound recognises (tower's `Elapsed` and
    /// `Overloaded`, hyper-util's connect errors, hyper's canceled requests,
    /// a refused connection: see [`crate::foreign`]) gets its kind, a short
    /// detail and a [`Sent`](crate::Sent) answer in the extensions; anything
    /// else becomes a [`ErrorKind::Transport`] error. Either way the original
    /// error is the source.
    pub fn from_boxed(err: BoxError) -> Self {
        match err.downcast::<Error>() {
            Ok(e) => *e,
            Err(other) => match crate::foreign::recognise(&*other) {
                Some((kind, sent, detail)) => {
                    let mut e = Error::new(kind).with_detail(detail).with_source(other);
                    e.extensions_mut().insert(sent);
                    e
                }
                None => Error::new(ErrorKind::Transport).with_source(other),
            },
        }
    }

    /// The kind of failure: **the** reading of an error (see the [module
    /// docs](self)).
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// Whether a timeout fired (at any stage).
    #[deprecated(note = "read the kind: `matches!(err.kind(), ErrorKind::Timeout(_))`")]
    pub fn is_timeout(&self) -> bool {
        matches!(self.inner.kind, ErrorKind::Timeout(_))
    }

    /// The stage of the timeout, if the [kind](Self::kind) is
    /// `ErrorKind::Timeout(stage)`.
    pub fn timeout_stage(&self) -> Option<TimeoutStage> {
        match self.inner.kind {
            ErrorKind::Timeout(stage) => Some(stage),
            _ => None,
        }
    }

    /// Whether the connection could not be established (not a timeout).
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Connect`")]
    pub fn is_connect(&self) -> bool {
        self.inner.kind == ErrorKind::Connect
    }

    /// Whether the TLS handshake failed (not a timeout).
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Tls`")]
    pub fn is_tls(&self) -> bool {
        self.inner.kind == ErrorKind::Tls
    }

    /// Whether reading or writing a body failed.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Body`")]
    pub fn is_body(&self) -> bool {
        self.inner.kind == ErrorKind::Body
    }

    /// Whether a body was over its cap.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::BodyTooLarge`")]
    pub fn is_body_too_large(&self) -> bool {
        self.inner.kind == ErrorKind::BodyTooLarge
    }

    /// Whether a body could not be decoded.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Decode`")]
    pub fn is_decode(&self) -> bool {
        self.inner.kind == ErrorKind::Decode
    }

    /// Whether a helper expecting a success got another status.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Status`")]
    pub fn is_status(&self) -> bool {
        self.inner.kind == ErrorKind::Status
    }

    /// Whether the caller cancelled the request.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Cancelled`")]
    pub fn is_cancelled(&self) -> bool {
        self.inner.kind == ErrorKind::Cancelled
    }

    /// Whether the client (or stack) was shut down under the request.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Closed`")]
    pub fn is_closed(&self) -> bool {
        self.inner.kind == ErrorKind::Closed
    }

    /// Whether a concurrency limiter refused the request.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Rejected`")]
    pub fn is_rejected(&self) -> bool {
        self.inner.kind == ErrorKind::Rejected
    }

    /// Whether a Retry-After gate refused the request.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Throttled`")]
    pub fn is_throttled(&self) -> bool {
        self.inner.kind == ErrorKind::Throttled
    }

    /// Whether the host's announced quota is out until after the request's
    /// deadline (the request was not sent).
    pub fn is_quota_exhausted(&self) -> bool {
        self.inner.kind == ErrorKind::QuotaExhausted
    }

    /// Whether a circuit breaker failed the request at once (not sent).
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::CircuitOpen`")]
    pub fn is_circuit_open(&self) -> bool {
        self.inner.kind == ErrorKind::CircuitOpen
    }

    /// Whether a write may have been processed and its state could not be
    /// reconciled (see `rebound_core::reconcile`).
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Ambiguous`")]
    pub fn is_ambiguous(&self) -> bool {
        self.inner.kind == ErrorKind::Ambiguous
    }

    /// Whether this is a configuration error from building a layer or client.
    #[deprecated(note = "read the kind: `err.kind() == ErrorKind::Config`")]
    pub fn is_config(&self) -> bool {
        self.inner.kind == ErrorKind::Config
    }

    /// Whether the retry loop stopped because its budget refused another
    /// attempt. The error itself is then the last real outcome (e.g. a
    /// connect error); this asks the [`RetryStop`] annotation it carries.
    #[deprecated(
        note = "read why the loop stopped: `err.retry_stop() == Some(RetryStop::Budget)` (also on a response: `RetryStop::of(res.extensions())`)"
    )]
    pub fn is_budget_exhausted(&self) -> bool {
        self.retry_stop() == Some(RetryStop::Budget)
    }

    /// Whether the retry loop stopped because it ran out of attempts.
    #[deprecated(
        note = "read why the loop stopped: `err.retry_stop() == Some(RetryStop::Attempts)` (also on a response: `RetryStop::of(res.extensions())`)"
    )]
    pub fn is_attempts_exhausted(&self) -> bool {
        self.retry_stop() == Some(RetryStop::Attempts)
    }

    /// Why the retry loop stopped, if a retry loop handled this request and
    /// did not succeed: the same answer as [`RetryStop::of`] on a response
    /// (see the [module docs](self)).
    pub fn retry_stop(&self) -> Option<RetryStop> {
        self.inner.extensions.get::<RetryStop>().copied()
    }

    /// How many attempts were made (`1` when no retry layer counted).
    pub fn attempts(&self) -> u32 {
        Attempts::of(&self.inner.extensions)
    }

    /// The request's method, if the error names its request.
    pub fn method(&self) -> Option<&Method> {
        self.inner.method.as_ref()
    }

    /// The request's redacted URL, if the error names its request.
    pub fn url(&self) -> Option<&RedactedUri> {
        self.inner.url.as_ref()
    }

    /// The outcome annotations this error carries.
    pub fn extensions(&self) -> &Extensions {
        &self.inner.extensions
    }

    /// Mutable access to the outcome annotations.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.inner.extensions
    }

    /// Find the first error of type `E` in the `source()` chain (this error
    /// excluded).
    pub fn find_source<E: StdError + 'static>(&self) -> Option<&E> {
        let mut cur: Option<&(dyn StdError + 'static)> = self.source_ref();
        while let Some(e) = cur {
            if let Some(found) = e.downcast_ref::<E>() {
                return Some(found);
            }
            cur = e.source();
        }
        None
    }

    fn source_ref(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner.kind, f)?;
        if let Some(detail) = self.inner.detail {
            write!(f, ": {detail}")?;
        }
        if let Some(detail) = &self.inner.detail_owned {
            write!(f, ": {detail}")?;
        }
        if let (Some(method), Some(url)) = (&self.inner.method, &self.inner.url) {
            write!(f, " for {method} {url}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("rebound::Error");
        d.field("kind", &self.inner.kind);
        if let Some(detail) = self.inner.detail {
            d.field("detail", &detail);
        }
        if let Some(detail) = &self.inner.detail_owned {
            d.field("detail", detail);
        }
        if let Some(method) = &self.inner.method {
            d.field("method", method);
        }
        if let Some(url) = &self.inner.url {
            d.field("url", &format_args!("{url}"));
        }
        if let Some(stop) = self.retry_stop() {
            d.field("retry_stop", &stop);
        }
        if self.inner.extensions.get::<Attempts>().is_some() {
            d.field("attempts", &self.attempts());
        }
        if let Some(source) = &self.inner.source {
            // The sources we wrap (io, hyper, rustls, tower) do not print
            // request data; their Display is what an operator needs.
            d.field("source", &format_args!("{source}"));
        }
        d.finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_redacted() {
        let uri: Uri = "http://user:secret@example.com:8080/a/b?token=secret#frag"
            .parse()
            .unwrap();
        let e = Error::new(ErrorKind::Connect)
            .with_detail("connection refused")
            .with_request(&Method::POST, &uri);
        let shown = e.to_string();
        assert_eq!(
            shown,
            "connect error: connection refused for POST http://example.com:8080/a/b"
        );
        assert!(!format!("{e:?}").contains("secret"));
    }

    #[test]
    fn never_wrapped_twice() {
        let e = Error::timeout(TimeoutStage::Tls);
        let boxed: BoxError = Box::new(e);
        let back = Error::from_boxed(boxed);
        assert_eq!(back.kind(), ErrorKind::Timeout(TimeoutStage::Tls));
        assert!(back.source().is_none());

        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let wrapped = Error::from_boxed(Box::new(io));
        assert_eq!(wrapped.kind(), ErrorKind::Transport);
        assert!(wrapped.find_source::<std::io::Error>().is_some());
    }

    #[test]
    fn annotations_ride_on_errors() {
        let mut e = Error::new(ErrorKind::Connect);
        e.extensions_mut().insert(Attempts(3));
        e.extensions_mut().insert(RetryStop::Budget);
        assert_eq!(e.attempts(), 3);
        assert_eq!(e.retry_stop(), Some(RetryStop::Budget));
        assert_eq!(e.retry_stop(), RetryStop::of(e.extensions()));
    }

    #[test]
    fn first_request_name_wins() {
        let a: Uri = "http://a.example/x".parse().unwrap();
        let b: Uri = "http://b.example/y".parse().unwrap();
        let e = Error::new(ErrorKind::Body)
            .with_request(&Method::GET, &a)
            .with_request(&Method::PUT, &b);
        assert_eq!(e.to_string(), "body error for GET http://a.example/x");
    }
}
