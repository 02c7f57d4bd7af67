//! The vocabulary: small typed values that layers leave in `http::Extensions`.
//!
//! rebound's layers never name each other's types. They talk only through
//! these annotations (DESIGN.md §1.3):
//!
//! * **On the request, going down:** [`Deadline`], [`AttemptNumber`],
//!   [`MaxAttempts`], [`IdempotencyKey`], [`Idempotent`],
//!   [`PreviousAttempt`].
//! * **On the outcome, going up** (the response's extensions, or the
//!   [`Error`](crate::Error)'s own [`extensions`](crate::Error::extensions)):
//!   [`Verdict`], [`RetryAfterHint`], [`ProposedDelay`]; and facts only a
//!   transport can see, such as [`CertificateRejected`].
//! * **On what the caller finally gets:** [`Attempts`] and, when the retry
//!   loop stopped short of success, [`RetryStop`].
//! * **State for observers** (read by the trace layers and metrics, written
//!   by the layers that own it): [`BudgetLeft`], [`LimiterState`],
//!   [`GateWait`], [`CircuitState`].
//! * **Carried by the task, not the request:** [`Closing`], the shutdown's
//!   "stop waiting" signal (like [`Deadline::scope`]).
//!
//! # Absence is the happy path
//!
//! `http::Extensions` allocates its map on the first insert and boxes every
//! value, so on the happy path the layers prefer *absence* to a stamped
//! default:
//!
//! * no [`Verdict`] means [`Verdict::Success`] (see [`Verdict::of`]);
//! * no [`AttemptNumber`] means the first attempt (see [`AttemptNumber::of`]);
//! * no [`Attempts`] on a response means one attempt was made.
//!
//! ```
//! use rebound_core::annotations::{AttemptNumber, Verdict, Sent, Reason};
//!
//! let mut res = http::Response::new(());
//! assert!(Verdict::of(res.extensions()).is_success());
//! assert_eq!(AttemptNumber::of(res.extensions()), 1);
//!
//! res.extensions_mut().insert(Verdict::Retryable {
//!     reason: Reason::status(http::StatusCode::SERVICE_UNAVAILABLE),
//!     sent: Sent::MaybeProcessed,
//! });
//! assert!(Verdict::of(res.extensions()).is_retryable());
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use http::{Extensions, HeaderValue, StatusCode};
use tokio::time::Instant;

// ===== request annotations =====

/// A future run under a [`Deadline`]: see [`Deadline::scope`].
pub type DeadlineScope<F> = tokio::task::futures::TaskLocalFuture<Instant, F>;

tokio::task_local! {
    /// The deadline in force for the task (see [`Deadline::scope`]).
    static CURRENT_DEADLINE: Instant;
}

/// The instant by which the whole logical request must be finished.
///
/// Every layer that waits — for a permit, an attempt, a backoff sleep, a
/// response body — reads it with [`Deadline::of`], which answers the
/// **earlier** of two carriers:
///
/// * **a `Deadline` in the request's extensions**: what the deadline layer
///   stamps (and a caller may insert itself). It travels with the request,
///   through a `tower::buffer::Buffer` or a spawned task.
/// * **the task's current deadline**, set with [`Deadline::scope`] (for a
///   future) or [`Deadline::sync_scope`] (for a closure): how an inbound
///   deadline reaches the outbound calls a handler makes, whose requests
///   are new (scope the handler's future; `InboundDeadlineLayer` does).
///
/// # Limits of the task's deadline
///
/// It is a tokio task-local: it is seen by everything polled inside the
/// scoped future and by `call`s made inside a `sync_scope`, and **not** by a
/// task spawned from there (`tokio::spawn`), nor across a `Buffer` (whose
/// worker is another task). Carry it across with [`Deadline::current`] and a
/// new scope, or as an extension.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use rebound_core::Deadline;
/// use tokio::time::Instant;
///
/// let soon = Instant::now() + Duration::from_millis(300);
/// let ext = http::Extensions::new();
/// assert_eq!(Deadline::of(&ext), None);
/// Deadline(soon)
///     .scope(async {
///         assert_eq!(Deadline::of(&ext), Some(soon));
///         // A later deadline inside does not extend it.
///         Deadline(soon + Duration::from_secs(5))
///             .scope(async { assert_eq!(Deadline::current(), Some(soon)) })
///             .await;
///     })
///     .await;
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// The deadline in force for a request with extensions `ext`: the
    /// earlier of a `Deadline` in `ext` and the task's
    /// [current](Self::current) deadline, if either is set.
    pub fn of(ext: &Extensions) -> Option<Instant> {
        let current = Deadline::current();
        match ext.get::<Deadline>() {
            Some(d) => Some(current.map_or(d.0, |c| c.min(d.0))),
            None => current,
        }
    }

    /// The task's current deadline (set by [`scope`](Self::scope) or
    /// [`sync_scope`](Self::sync_scope)), if any.
    pub fn current() -> Option<Instant> {
        CURRENT_DEADLINE.try_with(|d| *d).ok()
    }

    /// Run `fut` with this deadline as the task's current one — or the
    /// current one, if it is earlier: a scope never extends a deadline.
    /// Every poll of `fut` sees it (see [`Deadline::of`]).
    pub fn scope<F: Future>(self, fut: F) -> DeadlineScope<F> {
        let at = Deadline::current().map_or(self.0, |c| c.min(self.0));
        CURRENT_DEADLINE.scope(at, fut)
    }

    /// Call `f` with this deadline (or the current one, if earlier) as the
    /// task's current one: for a service's `call`, which runs before the
    /// future it returns is polled.
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        let at = Deadline::current().map_or(self.0, |c| c.min(self.0));
        CURRENT_DEADLINE.sync_scope(at, f)
    }

    /// Time left before the deadline, saturating at zero.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub fn has_passed(&self) -> bool {
        Instant::now() >= self.0
    }
}

/// On the request, going down: which attempt this is, `1` for the first
/// try. (Going up, [`Attempts`] says how many were made.)
///
/// Stamped by the retry layer on every attempt after the first; absence means
/// the first attempt (see [`AttemptNumber::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptNumber(pub u32);

impl AttemptNumber {
    /// The attempt number carried in `ext`, `1` when absent.
    pub fn of(ext: &Extensions) -> u32 {
        ext.get::<AttemptNumber>().map_or(1, |a| a.0)
    }
}

/// The old name of [`AttemptNumber`], too close to [`Attempts`], which goes
/// the other way.
#[deprecated(
    since = "0.1.0",
    note = "renamed `AttemptNumber` (down), beside `Attempts` (up)"
)]
pub type Attempt = AttemptNumber;

/// The most attempts the retry loop may make for **this** request, the
/// first included, in place of its policy's
/// [`max_attempts`](crate::retry::RetryPolicy::max_attempts): lower
/// (`MaxAttempts(1)`: send once, never retry) or higher. Put on the
/// request by the caller (the ready-made client's request builder does it
/// for `.attempts(n)`); read once, when the request enters the retry loop
/// (the [`RetryLayer`](crate::retry::RetryLayer)'s, or the one-service
/// stack's).
///
/// Only the count changes: eligibility, the retry budget and the deadline
/// still bound every retry. A value outside the policy's valid range
/// `1..=100` is clamped into it (0 means 1). Absence: the policy's count.
///
/// ```
/// use rebound_core::annotations::MaxAttempts;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(MaxAttempts(1));
/// assert_eq!(MaxAttempts::of(req.extensions()), Some(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MaxAttempts(pub u32);

impl MaxAttempts {
    /// The count carried in `ext`, as given (not clamped), if any.
    pub fn of(ext: &Extensions) -> Option<u32> {
        ext.get::<MaxAttempts>().map(|m| m.0)
    }
}

/// This request may be retried even though its method is not idempotent:
/// the server can recognise a repeat by this key.
///
/// Set by the idempotency-key layer together with the header it adds (or by
/// the caller). The value is the header value that every attempt carries.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(pub HeaderValue);

impl IdempotencyKey {
    /// Whether `value` is no key at all: empty, or only spaces and tabs.
    /// Servers trim a header value, so they would see an empty key and could
    /// not recognise a repeat by it; the idempotency-key and retry layers
    /// treat such a value as **no key** (the request is not made retryable
    /// by it).
    ///
    /// ```
    /// use http::HeaderValue;
    /// use rebound_core::IdempotencyKey;
    ///
    /// assert!(IdempotencyKey::is_blank(&HeaderValue::from_static("")));
    /// assert!(IdempotencyKey::is_blank(&HeaderValue::from_static(" \t ")));
    /// assert!(!IdempotencyKey::is_blank(&HeaderValue::from_static(" k1 ")));
    /// ```
    pub fn is_blank(value: &HeaderValue) -> bool {
        value.as_bytes().iter().all(|b| matches!(b, b' ' | b'\t'))
    }

    /// Whether a request with these `headers` and `extensions` carries a key
    /// **the server can see**: an `Idempotency-Key` header that is not blank,
    /// or an [`IdempotencyKey`] annotation that is not blank and whose value
    /// one of the request's headers carries (the idempotency-key layer's
    /// header may have another name, such as `X-Idempotency-Key`).
    ///
    /// An annotation alone, with no header carrying its value, is **no
    /// key**: the server could not tell a repeat from a new request, so a
    /// write must not be sent twice on its strength (put the idempotency-key
    /// layer above the retry layer: it copies the annotation into the
    /// header). The header wins over the annotation: it is what the server
    /// sees, so a blank header is no key whatever the annotation says.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use rebound_core::IdempotencyKey;
    ///
    /// let key = HeaderValue::from_static("k-1");
    /// let mut ext = http::Extensions::new();
    /// ext.insert(IdempotencyKey(key.clone()));
    /// // The annotation alone: the server would see no key.
    /// assert!(!IdempotencyKey::is_seen(&HeaderMap::new(), &ext));
    /// // The annotation and a header carrying it.
    /// let mut headers = HeaderMap::new();
    /// headers.insert("x-idempotency-key", key);
    /// assert!(IdempotencyKey::is_seen(&headers, &ext));
    /// ```
    pub fn is_seen(headers: &http::HeaderMap, extensions: &Extensions) -> bool {
        match headers.get(IDEMPOTENCY_KEY) {
            Some(v) => !Self::is_blank(v),
            None => extensions
                .get::<IdempotencyKey>()
                .is_some_and(|k| !Self::is_blank(&k.0) && headers.values().any(|v| v == k.0)),
        }
    }
}

/// The standard header name of an idempotency key.
const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is not a secret, but it is an identifier a log reader does
        // not need in full; keep `Debug` of a request free of it anyway.
        f.write_str("IdempotencyKey(..)")
    }
}

/// This request may be sent again after it may have been processed, whatever
/// its method: the caller (or a layer that knows the API, such as
/// [`grpc::MarkRetryable`](crate::grpc::MarkRetryable) for gRPC methods
/// declared safe) says the operation is idempotent.
///
/// The retry layer treats it like an eligible method. Absence changes
/// nothing: eligibility then comes from the method or an
/// [`IdempotencyKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Idempotent;

/// The request's [`IdempotencyKey`] was made by the idempotency-key layer,
/// not given by the caller. It makes the request **retryable** (the server
/// recognises a repeat), but by default not **hedgeable**: a hedge sends a
/// copy with no failure signal at all, which a caller who never thought
/// about keys did not ask for (see the hedge layer's
/// `HedgePolicy::hedge_generated_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KeyGenerated;

/// What happened on the previous attempt; carried by the retry layer into the
/// next attempt's request, for layers that want history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousAttempt {
    /// The previous attempt's number (`1` for the first try).
    pub attempt: u32,
    /// How the previous attempt was classified.
    pub verdict: Verdict,
    /// The server's Retry-After hint on the previous attempt, if any.
    pub retry_after: Option<Duration>,
    /// The delay the retry layer waited before this attempt, and why.
    pub delay: Option<ProposedDelay>,
}

// ===== a signal carried by the task =====

/// A future run under a [`Closing`] signal: see [`Closing::scope`].
pub type ClosingScope<F> = tokio::task::futures::TaskLocalFuture<Closing, F>;

tokio::task_local! {
    /// The closing signal in force for the task (see [`Closing::scope`]).
    static CURRENT_CLOSING: Closing;
}

/// The "stop waiting" signal of a shutdown, carried by the task like
/// [`Deadline::scope`]: the layer that owns the shutdown (rebound's
/// `shutdown` module, or a caller's own) runs each request's future in
/// [`scope`](Self::scope), and every layer that **waits** — the retry loop's
/// sleep, a gate, a limit's queue — asks [`Closing::current`] only when it
/// is about to wait, and ends its wait when [`closed`](Self::closed)
/// resolves: the retry loop with its last real outcome, a queue with
/// [`ErrorKind::Closed`](crate::ErrorKind::Closed). An attempt in flight is
/// not cut by it (that is the shutdown's grace period).
///
/// Nothing is stamped on the request and nothing is read on the happy path:
/// a request that never waits never looks.
///
/// ```
/// use rebound_core::annotations::Closing;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let closing = Closing::new();
/// let waiter = closing.clone().scope(async {
///     let signal = Closing::current().expect("in scope");
///     signal.closed().await; // a wait that ends at shutdown
///     "woken"
/// });
/// closing.close();
/// assert_eq!(waiter.await, "woken");
/// assert!(Closing::current().is_none());
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Closing {
    inner: std::sync::Arc<ClosingInner>,
}

#[derive(Default)]
struct ClosingInner {
    closed: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl fmt::Debug for Closing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Closing")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Closing {
    /// A signal not yet closed.
    pub fn new() -> Self {
        Closing::default()
    }

    /// The task's current signal (set by [`scope`](Self::scope)), if any.
    /// For waiting points only: it clones a reference count.
    pub fn current() -> Option<Closing> {
        CURRENT_CLOSING.try_with(|c| c.clone()).ok()
    }

    /// Run `fut` with this signal as the task's current one.
    pub fn scope<F: Future>(self, fut: F) -> ClosingScope<F> {
        CURRENT_CLOSING.scope(self, fut)
    }

    /// Close: wake every waiter now and every later one at once.
    /// Idempotent.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.inner.notify.notify_waiters();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once the signal is closed (at once if it already is).
    pub async fn closed(&self) {
        let notified = self.inner.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.is_closed() {
            return;
        }
        notified.await;
    }

    /// [`closed`](Self::closed) as an owned, boxed future, for a waiting
    /// point that keeps it in a state machine (it allocates: off the happy
    /// path only).
    pub fn closed_owned(self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
        Box::pin(async move { self.closed().await })
    }
}

/// A waiting point's view of the task's [`Closing`] signal: looked up on
/// the first poll of the wait (a wait begun in `call` runs before the scope
/// is entered), then polled with the wait. Allocates only for a request
/// that waits under a signal.
#[derive(Default)]
#[allow(dead_code)] // not every feature has a waiting point
pub(crate) struct ClosingWait {
    closed: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
}

#[allow(dead_code)]
impl ClosingWait {
    /// Whether the task's signal has closed (registers the waker if not).
    pub(crate) fn poll_closed(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        if self.closed.is_none() {
            self.closed = Closing::current().map(Closing::closed_owned);
        }
        self.closed
            .as_mut()
            .is_some_and(|c| c.as_mut().poll(cx).is_ready())
    }
}

/// The error of a request whose wait (a gate, a limit's queue) a shutdown
/// ended: [`ErrorKind::Closed`](crate::ErrorKind::Closed), not sent, fatal,
/// carrying the previous attempt's [`PreviousAttempt`] when there was one
/// (its outcome is the last real one).
#[allow(dead_code)] // not every feature has a waiting point
pub(crate) fn closed_while_waiting<B>(
    req: &http::Request<B>,
    detail: &'static str,
) -> crate::Error {
    let mut err = crate::Error::new(crate::ErrorKind::Closed)
        .with_detail(detail)
        .with_request(req.method(), req.uri());
    let previous = req.extensions().get::<PreviousAttempt>().cloned();
    let ext = err.extensions_mut();
    ext.insert(Sent::NotSent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("closed"),
    });
    if let Some(p) = previous {
        ext.insert(p);
    }
    err
}

// ===== outcome annotations =====

/// Whether a failed request may have reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sent {
    /// The request certainly did not reach the server (connect refused, DNS
    /// failure, TLS failure, hyper's "canceled before it was written",
    /// HTTP/2 `REFUSED_STREAM`): safe to retry for **any** method.
    NotSent,
    /// The request may have been processed (a timeout, a reset after
    /// writing, a response status): retry only an idempotent request.
    MaybeProcessed,
}

impl Sent {
    /// `"not_sent"` or `"maybe_processed"`, for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Sent::NotSent => "not_sent",
            Sent::MaybeProcessed => "maybe_processed",
        }
    }
}

impl fmt::Display for Sent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The server's TLS certificate failed verification: unknown issuer,
/// expired or not yet valid, not valid for the host name, bad signature,
/// revoked, ... The text is a short, secret-free reason such as
/// `"unknown issuer"`.
///
/// Put by a transport in the extensions of its
/// [`Tls`](crate::ErrorKind::Tls) error, to tell a certificate that will be
/// the same on every attempt from a handshake that may succeed next time.
/// The default classifier makes such an error `Fatal`: no retry.
///
/// ```
/// use rebound_core::annotations::CertificateRejected;
/// use rebound_core::classify::HttpClassifier;
/// use rebound_core::{Error, ErrorKind};
///
/// let mut err = Error::new(ErrorKind::Tls);
/// assert!(HttpClassifier::default().classify_error(&err).is_retryable());
/// err.extensions_mut().insert(CertificateRejected("unknown issuer"));
/// assert!(HttpClassifier::default().classify_error(&err).is_fatal());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertificateRejected(pub &'static str);

/// Why an outcome was classified as it was: a short, secret-free text such as
/// `"status 503"`, `"connect refused"` or `"body not replayable"`.
///
/// Reasons are meant for logs and metric labels: never build one from a
/// header value, a body or a URL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reason(Cow<'static, str>);

impl Reason {
    /// A reason from a static text (no allocation).
    pub const fn new_static(text: &'static str) -> Self {
        Reason(Cow::Borrowed(text))
    }

    /// A reason from an owned text.
    pub fn new(text: impl Into<Cow<'static, str>>) -> Self {
        Reason(text.into())
    }

    /// `"status NNN"` for a response status.
    pub fn status(status: StatusCode) -> Self {
        Reason(Cow::Owned(format!("status {}", status.as_u16())))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How one attempt's outcome was classified.
///
/// Written by the classify layer (and refined by layers above it: the
/// Retry-After layer turns a "do not retry" pushback into `Fatal`, the retry
/// layer marks a non-replayable body). **Absence means `Success`**: see
/// [`Verdict::of`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The attempt succeeded (2xx/3xx by default).
    Success,
    /// A transient failure: retrying may help.
    Retryable {
        /// Why.
        reason: Reason,
        /// Whether the request may have reached the server.
        sent: Sent,
    },
    /// A failure that retrying will not fix.
    Fatal {
        /// Why.
        reason: Reason,
    },
}

impl Verdict {
    /// The verdict carried in `ext`; `Success` when there is none.
    pub fn of(ext: &Extensions) -> Cow<'_, Verdict> {
        match ext.get::<Verdict>() {
            Some(v) => Cow::Borrowed(v),
            None => Cow::Owned(Verdict::Success),
        }
    }

    /// Whether this is `Success`.
    pub fn is_success(&self) -> bool {
        matches!(self, Verdict::Success)
    }

    /// Whether this is `Retryable`.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Verdict::Retryable { .. })
    }

    /// Whether this is `Fatal`.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Verdict::Fatal { .. })
    }

    /// The reason, if this is not `Success`.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Verdict::Success => None,
            Verdict::Retryable { reason, .. } | Verdict::Fatal { reason } => Some(reason),
        }
    }

    /// The `sent` answer, if this is `Retryable`.
    pub fn sent(&self) -> Option<Sent> {
        match self {
            Verdict::Retryable { sent, .. } => Some(*sent),
            _ => None,
        }
    }

    /// `"success"`, `"retryable"` or `"fatal"`, for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Retryable { .. } => "retryable",
            Verdict::Fatal { .. } => "fatal",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Success => f.write_str("success"),
            Verdict::Retryable { reason, sent } => write!(f, "retryable ({reason}, {sent})"),
            Verdict::Fatal { reason } => write!(f, "fatal ({reason})"),
        }
    }
}

/// The server asked the client to wait this long before trying again
/// (`Retry-After` as delta-seconds or HTTP-date, gRPC pushback, or a
/// rate-limit reset header). Already capped by the layer that parsed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RetryAfterHint(pub Duration);

/// Where a [`ProposedDelay`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DelaySource {
    /// The server's Retry-After (or pushback) hint.
    RetryAfter,
    /// The client's own backoff schedule.
    Backoff,
}

impl DelaySource {
    /// `"retry_after"` or `"backoff"`, for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            DelaySource::RetryAfter => "retry_after",
            DelaySource::Backoff => "backoff",
        }
    }
}

impl fmt::Display for DelaySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long to wait before the next attempt, and why; written by the backoff
/// layer on each retryable outcome, read by the retry layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProposedDelay {
    /// The delay.
    pub delay: Duration,
    /// Where it came from.
    pub source: DelaySource,
}

// ===== what the caller gets =====

/// How many attempts the retry layer made for this logical request; on the
/// response or error the caller finally gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempts(pub u32);

impl Attempts {
    /// The attempt count carried in `ext`, `1` when absent.
    pub fn of(ext: &Extensions) -> u32 {
        ext.get::<Attempts>().map_or(1, |a| a.0)
    }
}

/// Why the retry loop stopped without a success; on the outcome the caller
/// gets when its last verdict was not `Success`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryStop {
    /// The last outcome was fatal.
    Fatal,
    /// The request may not be sent again: not idempotent, no idempotency
    /// key, and it may have been processed.
    NotEligible,
    /// The request body cannot be replayed (streamed past the buffer cap).
    NotReplayable,
    /// The maximum number of attempts was reached.
    Attempts,
    /// The retry budget refused another attempt.
    Budget,
    /// The next attempt could not finish before the deadline.
    Deadline,
    /// The outcome is a hedged group's ([`Hedged`]): a request is hedged
    /// or retried, not both (gRFC A6).
    Hedged,
    /// A shutdown ended the wait before the next attempt (see
    /// [`Closing`]).
    Closed,
}

impl RetryStop {
    /// Why the retry loop stopped, carried in `ext` (a response's or an
    /// error's extensions); `None` when it succeeded or no retry loop ran.
    /// On an error, [`Error::retry_stop`](crate::Error::retry_stop) says
    /// the same.
    ///
    /// ```
    /// use rebound_core::RetryStop;
    ///
    /// let mut res = http::Response::new(());
    /// assert_eq!(RetryStop::of(res.extensions()), None);
    /// res.extensions_mut().insert(RetryStop::Attempts);
    /// assert_eq!(RetryStop::of(res.extensions()), Some(RetryStop::Attempts));
    /// ```
    pub fn of(ext: &Extensions) -> Option<RetryStop> {
        ext.get::<RetryStop>().copied()
    }

    /// A short label: `"fatal"`, `"not_eligible"`, `"not_replayable"`,
    /// `"attempts"`, `"budget"`, `"deadline"`, `"hedged"` or `"closed"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RetryStop::Fatal => "fatal",
            RetryStop::NotEligible => "not_eligible",
            RetryStop::NotReplayable => "not_replayable",
            RetryStop::Attempts => "attempts",
            RetryStop::Budget => "budget",
            RetryStop::Deadline => "deadline",
            RetryStop::Hedged => "hedged",
            RetryStop::Closed => "closed",
        }
    }
}

impl fmt::Display for RetryStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// This outcome comes from a hedged group: more than one copy of the
/// attempt was sent (by the hedge layer), and `winner` says which one
/// answered (`1` is the original, `2` the first hedge, ...; `None` when
/// every copy failed and this is the last failure).
///
/// On the outcome only when a hedge was actually sent, so a request that
/// answers before its hedge delay carries nothing. The retry loop reads it:
/// a hedged outcome is **not retried** ([`RetryStop::Hedged`]), so a
/// request is hedged or retried, never both (gRFC A6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hedged {
    /// Copies sent, the original included.
    pub copies: u32,
    /// The copy whose answer this is, if one was acceptable.
    pub winner: Option<u32>,
}

// ===== state other layers may show =====
/// How many more retries the retry budget would allow at the moment an
/// attempt was sent (or the loop stopped).
///
/// A retry layer may stamp it on each attempt's request (the attempt span
/// shows it as `rebound.budget_left`) and on the final outcome (the request
/// span and the "giving up" event show it). Absent means "not known"; the
/// trace layers never insert it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BudgetLeft(pub u32);

/// The state of a limiter as a request or attempt passed it: a limiter may
/// put it on the outcome (or on the request on its way down). Shown as
/// `rebound.limiter` (`concurrency limit=8 in_flight=3 queued=0`) and, with
/// the `metrics` feature, recorded as the limiter gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimiterState {
    /// Which limiter: a fixed, low-cardinality name such as `"concurrency"`
    /// or `"adaptive"` (used as a metric label).
    pub limiter: &'static str,
    /// The current limit.
    pub limit: u32,
    /// Requests (or attempts) in flight, this one included.
    pub in_flight: u32,
    /// Requests waiting in the limiter's queue.
    pub queued: u32,
}

impl fmt::Display for LimiterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} limit={} in_flight={} queued={}",
            self.limiter, self.limit, self.in_flight, self.queued
        )
    }
}

/// How long a gate (e.g. the Retry-After gate) held this request before
/// letting it through; put on the outcome by the gate. Shown as
/// `rebound.gate_wait_ms` and, with the `metrics` feature, counted as a gate
/// wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GateWait(pub Duration);

// ===== lent by one layer to another =====

/// A client-wide permit this request holds, which a layer that waits for
/// **one host** may give back while it waits, and take again after
/// (DESIGN.md §10, "Order that isolates faults": per-host waits must not
/// hold what other hosts need).
///
/// Put on the request by a concurrency limit, **only when the request had
/// to queue for its permit** (a request that got one at once meets no
/// per-host wait it has not already passed, so the happy path carries
/// none); read by the Retry-After gate. Clones share the one permit.
///
/// ```
/// use std::sync::Arc;
/// use rebound_core::annotations::PermitLease;
/// use tokio::sync::Semaphore;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let semaphore = Arc::new(Semaphore::new(1));
/// let permit = semaphore.clone().try_acquire_owned().unwrap();
/// let lease = PermitLease::new(semaphore.clone(), permit);
/// lease.release(); // while waiting for one host
/// assert_eq!(semaphore.available_permits(), 1);
/// assert!(lease.reacquire(None).await); // back in the FIFO queue
/// assert_eq!(semaphore.available_permits(), 0);
/// assert!(lease.take().is_some()); // the owner takes it back
/// # }
/// ```
#[derive(Clone)]
pub struct PermitLease(std::sync::Arc<LeaseInner>);

struct LeaseInner {
    semaphore: std::sync::Arc<tokio::sync::Semaphore>,
    permit: std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

impl PermitLease {
    /// A lease of `permit`, taken from `semaphore`.
    pub fn new(
        semaphore: std::sync::Arc<tokio::sync::Semaphore>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Self {
        PermitLease(std::sync::Arc::new(LeaseInner {
            semaphore,
            permit: std::sync::Mutex::new(Some(permit)),
        }))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<tokio::sync::OwnedSemaphorePermit>> {
        // An `Option` swap cannot leave it inconsistent.
        self.0.permit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Give the permit back to its semaphore (nothing if it is not held).
    pub fn release(&self) {
        let permit = self.slot().take();
        drop(permit);
    }

    /// Whether the permit is held right now.
    pub fn is_held(&self) -> bool {
        self.slot().is_some()
    }

    /// Wait for the permit again, in the semaphore's FIFO queue, until
    /// `deadline` at the latest; `true` once it is held (at once if it
    /// still was). Dropping the future leaves the queue.
    pub fn reacquire(
        &self,
        deadline: Option<Instant>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
        let lease = self.clone();
        Box::pin(async move {
            if lease.is_held() {
                return true;
            }
            let acquire = lease.0.semaphore.clone().acquire_owned();
            let permit = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, acquire)
                    .await
                    .ok()
                    .and_then(Result::ok),
                None => acquire.await.ok(),
            };
            match permit {
                Some(permit) => {
                    *lease.slot() = Some(permit);
                    true
                }
                None => false,
            }
        })
    }

    /// Take the permit out of the lease (the owner does, when the request
    /// is over or its response body takes the permit along).
    pub fn take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slot().take()
    }
}

impl fmt::Debug for PermitLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitLease")
            .field("held", &self.is_held())
            .finish()
    }
}

/// The state of a circuit breaker's circuit (for one host, or one scope).
///
/// Put on the error of a request the breaker failed at once, and reported
/// by the breaker's `state(&uri)`; the breaker's INFO events and, with the
/// `metrics` feature, its transition counter name these states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CircuitState {
    /// Calls go through; outcomes are counted.
    Closed,
    /// Calls fail at once, not sent, until the break is over.
    Open,
    /// The break is over: a bounded number of probes go through; their
    /// success closes the circuit, a failure opens it again.
    HalfOpen,
}

impl CircuitState {
    /// `"closed"`, `"open"` or `"half_open"`, for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absence_means_success_and_first_attempt() {
        let ext = Extensions::new();
        assert!(Verdict::of(&ext).is_success());
        assert_eq!(AttemptNumber::of(&ext), 1);
        assert_eq!(Attempts::of(&ext), 1);
        assert_eq!(Deadline::of(&ext), None);
    }

    #[test]
    fn reason_and_display() {
        let v = Verdict::Retryable {
            reason: Reason::status(StatusCode::TOO_MANY_REQUESTS),
            sent: Sent::MaybeProcessed,
        };
        assert_eq!(v.to_string(), "retryable (status 429, maybe_processed)");
        assert_eq!(v.reason().unwrap().as_str(), "status 429");
        assert_eq!(v.sent(), Some(Sent::MaybeProcessed));
        let f = Verdict::Fatal {
            reason: Reason::new_static("body not replayable"),
        };
        assert!(f.is_fatal());
        assert_eq!(f.sent(), None);
    }

    #[test]
    fn idempotency_key_debug_hides_value() {
        let k = IdempotencyKey(HeaderValue::from_static("abc-123"));
        assert!(!format!("{k:?}").contains("abc"));
    }
}
