//! Pace requests by what the server says is left of its quota, before it
//! answers 429.
//!
//! [`RateLimitLayer`] reads every response's rate-limit headers (IETF
//! `RateLimit` / `RateLimit-Policy`, the legacy `RateLimit-*` and
//! `X-RateLimit-*`, OpenAI's, Anthropic's, Azure's; see [`parse`]) and
//! holds new requests to a host whose quota runs low: spread over the time
//! left in the window, released with jitter at the reset, failed at once
//! when the quota cannot come back within the request's deadline.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use rebound_core::ratelimit::RateLimitLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new())
//!     .service(service_fn(|_req: Request<()>| async {
//!         // The server's last request of this window: none left for 2 s.
//!         let res = Response::builder()
//!             .header("x-ratelimit-limit-requests", "60")
//!             .header("x-ratelimit-remaining-requests", "0")
//!             .header("x-ratelimit-reset-requests", "2s")
//!             .body(())
//!             .unwrap();
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let get = || Request::get("https://api.example/v1/models").body(()).unwrap();
//! svc.clone().oneshot(get()).await?;
//!
//! // The next request waits for the reset (and up to 100 ms of jitter)
//! // instead of drawing a 429.
//! let start = Instant::now();
//! svc.oneshot(get()).await?;
//! assert!(start.elapsed() >= Duration::from_secs(2));
//! assert!(start.elapsed() <= Duration::from_millis(2_100));
//! # Ok(())
//! # }
//! ```
//!
//! # Rules
//!
//! Per host (its **authority**, keyed as the [host table](crate::host) keys
//! it: scheme, lower-cased host, effective port) and per partition (the
//! IETF `pk`: a host's requests are paced by the partition its last
//! response named; four partitions kept per host), the [`Pacer`] keeps,
//! for each [`Dimension`] the server spoke of (requests; tokens; input and
//! output tokens), what it said last: limit, remaining, reset. What is
//! **left** is the server's remaining count less what requests still in
//! flight reserved (they may not have reached it yet), and goes down by
//! each request admitted.
//!
//! * **Plenty.** While `left ≥ cost + zone`, where `zone` is the last
//!   [`spread_fraction`](PacerConfig::spread_fraction) of the limit (10 %
//!   by default; `0` when the server does not say its limit), a request
//!   goes at once.
//! * **Spreading.** Below that, the remaining requests are spread evenly
//!   over the time left: a request admitted at `t` with `left` remaining
//!   and the reset at `R` sets the next slot to
//!   `t + (R − t) / ⌊left / cost⌋`; the next request waits for that slot.
//!   A request whose slot comes after its deadline goes at once (the quota
//!   is there): spreading never fails a request.
//! * **Exhausted.** With `left < cost`, the request waits for the reset
//!   plus a jitter drawn uniformly from
//!   `[0, `[`release_jitter`](PacerConfig::release_jitter)`]` (100 ms by
//!   default), so that the requests held for a reset do not all arrive at
//!   once, and is admitted again then (by then the window has rolled: what
//!   is left is the limit less what is in flight). A reset that, with its
//!   jitter, comes after the request's [`Deadline`] — or, without one,
//!   after [`max_wait`](PacerConfig::max_wait) (60 s) — fails the request
//!   at once with [`ErrorKind::QuotaExhausted`]: a daily quota, a reset
//!   hours away, is not waited for.
//! * **Retry-After wins.** A pause the server asked for (`Retry-After` on a
//!   429 or 503, `retry-after-ms`, `x-ms-retry-after-ms`) holds the host's
//!   requests until it ends, whatever the rate-limit headers say.
//! * **Cached responses are ignored.** A response with an `Age` header, or
//!   a 304, says what the origin said when it answered, not now: its
//!   fields are not read (see [`parse::is_cached`]).
//! * **A new window** is recognised by a reset later than the one kept
//!   (by more than the readings' precision) or the kept one having passed.
//!   Within a window the server's count only goes down, so a reading above
//!   the lowest one seen is a response that arrived out of order, and is
//!   ignored; any other sets what is left (which corrects the estimates
//!   of the requests it answered).
//! * **Requests in flight before a host is tracked** count against it too:
//!   when a host's first low reading arrives, every request in flight is
//!   taken as possibly bound for it (to any host: the happy path does not
//!   hash hosts), an estimate that each of their answers settles.
//! * **The reset is taken as the server says it.** A server that rounds
//!   its reset down sees the first requests of the next window early, by
//!   up to the rounding; the jitter softens that.
//!
//! # Cost
//!
//! A request may carry its estimated [`Cost`] (for an AI call, the prompt's
//! tokens plus `max_tokens`, [`Cost::ai`]), as a request extension. It is
//! reserved from the token dimensions (tokens; input and output tokens
//! where the server counts them apart) before the request goes, and
//! corrected when the response says what is left (the server counted the
//! real usage). For a server that does not say, [`Pacer::correct`] takes
//! the usage the caller read from the body.
//!
//! # Signals for the concurrency limit
//!
//! A 429, or a remaining count of zero, leaves a [`QuotaSignal`] on the
//! response, for an adaptive limit to lower its limit.
//!
//! # Happy path
//!
//! While no host is tracked — no server has said its quota is within the
//! spread zone plus what is in flight — a request reads one atomic and
//! adds its cost to the in-flight counts (one atomic add, one subtract);
//! no hash, no lock, no clock. Its response's headers are walked once
//! (names that cannot be rate-limit headers are told apart by their first
//! bytes, without a look-up); a response that carries rate-limit headers
//! saying "plenty" has its numbers parsed and compared, and nothing
//! stored. The response future keeps the request's scheme and authority
//! (a reference count) to key its host only if the response says the
//! quota runs low. A host is forgotten again once every quota it said is
//! plenty.
//!
//! Measured (callgrind, release build, over `service_fn`, per request,
//! against the same service without the layer): a response without
//! rate-limit headers costs about 1,000 instructions more, of which the
//! engine's part (the ticket, the in-flight count, the header walk, the
//! record) is about 270 and the rest is being a separate layer (its
//! future, the moves of the response through it, the kept authority); a
//! response with OpenAI's six headers saying "plenty" costs about 4,000
//! more, most of it parsing the six values. The one-service stack pays
//! the engine's part only; parsing the numbers lazily (only the remaining
//! counts while no host is tracked) is the next step toward 300.
//!
//! # Tracing
//!
//! On the current span (the trace layers declare them): `rebound.ratelimit.wait_ms`
//! when a request was held, `rebound.ratelimit.remaining` (the smallest
//! remaining count of the response) and `rebound.ratelimit.reset_ms` (its
//! reset). Numbers only; no header value.
//!
//! # Where it sits
//!
//! Below the retry layer (each attempt is paced, and each response read),
//! above the classifier; it reads the headers of every response whatever
//! its status or verdict:
//!
//! ```text
//! Retry ─► Backoff ─► RateLimit ─► RetryAfterGate ─► AdaptiveLimit ─► RetryAfter ─► Classify ─► ...
//! ```
//!
//! # Peers
//!
//! No Rust crate paces by these headers as tower middleware: `governor`
//! and tower's `RateLimit` enforce a rate the client chooses, not the one
//! the server announces; the crate that follows provider headers has no
//! tower layer.
//!
//! # Errors
//!
//! [`ErrorKind::QuotaExhausted`], naming the request, **not sent**
//! ([`Sent::NotSent`]), `Fatal` (not retried), with a [`RetryAfterHint`]
//! to the reset and a [`QuotaReset`] saying which quota and when. Errors of
//! the inner service are turned into [`Error`] with [`Error::from_boxed`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use http::{Request, Response, StatusCode};
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Deadline, Reason, RetryAfterHint, Sent, Verdict};
use crate::error::{BoxError, Error, ErrorKind};
use crate::wait::{take_ready, Wait, WaitThenCall};

mod pacer;
pub mod parse;

pub use self::pacer::{Admit, Pacer, PacerConfig, Ticket};
pub use self::parse::{Dimension, Precision, Quota, Reading};

// ===== vocabulary =====

/// A request's estimated cost in tokens, as a request extension: reserved
/// from the host's token quotas before the request goes. A request always
/// costs one request.
///
/// ```
/// use rebound_core::ratelimit::Cost;
///
/// // A prompt of 1,200 tokens with max_tokens = 800.
/// let cost = Cost::ai(1_200, 800);
/// assert_eq!(cost.tokens, 2_000);
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(cost);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cost {
    /// Tokens in all (the `Tokens` dimension).
    pub tokens: u64,
    /// Input tokens (where the server counts them apart).
    pub input_tokens: u64,
    /// Output tokens (where the server counts them apart).
    pub output_tokens: u64,
}

impl Cost {
    /// `tokens` in all, not split into input and output.
    pub fn tokens(tokens: u64) -> Self {
        Cost {
            tokens,
            ..Cost::default()
        }
    }

    /// An AI call: `input` tokens of prompt and at most `max_output`
    /// tokens of answer (`tokens` is their sum).
    pub fn ai(input: u64, max_output: u64) -> Self {
        Cost {
            tokens: input.saturating_add(max_output),
            input_tokens: input,
            output_tokens: max_output,
        }
    }

    /// Per [`Dimension`], in index order (one request first).
    pub fn per_dimension(&self) -> [u64; 4] {
        [1, self.tokens, self.input_tokens, self.output_tokens]
    }
}

/// A response's signal that the client is at its quota: a 429, or a
/// remaining count of zero. Left on the response by [`RateLimitLayer`] for
/// a concurrency limit to lower its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSignal {
    /// The response was a 429.
    pub too_many_requests: bool,
    /// A quota the response said is at zero.
    pub exhausted: Option<Dimension>,
    /// When that quota (or, on a 429, the pause) ends, if said.
    pub reset: Option<Duration>,
}

impl QuotaSignal {
    /// The signal of a response with `status` and `reading`, if any.
    pub fn of(status: StatusCode, reading: &Reading) -> Option<QuotaSignal> {
        let too_many = status == StatusCode::TOO_MANY_REQUESTS;
        if !too_many && reading.is_empty() {
            return None;
        }
        let zero = reading
            .quotas()
            .find(|(_, q)| q.remaining == Some(0))
            .map(|(d, q)| (d, q.reset));
        if !too_many && zero.is_none() {
            return None;
        }
        Some(QuotaSignal {
            too_many_requests: too_many,
            exhausted: zero.map(|z| z.0),
            reset: reading.retry_after.or(zero.and_then(|z| z.1)),
        })
    }
}

/// Whether a response says a quota is at zero (a `remaining` of 0 in any
/// header family; a cached response's fields are not read): the check a
/// concurrency limit makes on a response that no [`RateLimitLayer`] has
/// read yet, so that a quota at zero lowers it whichever layer is outside.
/// A response without rate-limit headers costs one pass over its names.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use rebound_core::ratelimit::says_exhausted;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
/// assert!(says_exhausted(StatusCode::OK, &headers));
/// headers.insert("x-ratelimit-remaining", HeaderValue::from_static("12"));
/// assert!(!says_exhausted(StatusCode::OK, &headers));
/// assert!(!says_exhausted(StatusCode::OK, &HeaderMap::new()));
/// ```
pub fn says_exhausted(status: StatusCode, headers: &http::HeaderMap) -> bool {
    if !parse::has_fields(headers) || parse::is_cached(status, headers) {
        return false;
    }
    // No reset is compared with the clock here: only `remaining` counts.
    let reading = parse::read_with(headers, status, || SystemTime::UNIX_EPOCH);
    let at_zero = reading.quotas().any(|(_, q)| q.remaining == Some(0));
    at_zero
}

/// On a [`ErrorKind::QuotaExhausted`] error: which quota is out and when
/// it comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaReset {
    /// The quota that is out.
    pub dimension: Dimension,
    /// When the server said it resets.
    pub at: Instant,
}

pub(crate) fn exhausted<B>(
    req: &Request<B>,
    reset: Instant,
    dimension: Dimension,
    now: Instant,
) -> Error {
    let mut err = Error::new(ErrorKind::QuotaExhausted)
        .with_detail(match dimension {
            Dimension::Requests => "no requests left before the deadline",
            Dimension::Tokens => "no tokens left before the deadline",
            Dimension::InputTokens => "no input tokens left before the deadline",
            Dimension::OutputTokens => "no output tokens left before the deadline",
        })
        .with_request(req.method(), req.uri());
    let ext = err.extensions_mut();
    ext.insert(RetryAfterHint(reset.saturating_duration_since(now)));
    ext.insert(QuotaReset {
        dimension,
        at: reset,
    });
    ext.insert(Sent::NotSent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("quota exhausted"),
    });
    err
}

// ===== impl RateLimitLayer =====

/// Paces requests by the quota their host's responses announce, and reads
/// every response's rate-limit headers.
///
/// Defaults: see [`PacerConfig::new`]. See the [module docs](self) for an
/// example, the rules and where it sits.
///
/// # Clone
///
/// Clones share the same [`Pacer`].
#[derive(Clone)]
pub struct RateLimitLayer {
    pub(crate) pacer: Arc<Pacer>,
    pub(crate) clock: Option<Clock>,
}

pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("pacer", &self.pacer)
            .finish()
    }
}

impl Default for RateLimitLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimitLayer {
    /// A layer with its own [`Pacer`] of the default settings.
    pub fn new() -> Self {
        Self::shared(Arc::new(Pacer::default()))
    }

    /// A layer with its own [`Pacer`] of `config`.
    ///
    /// # Panics
    ///
    /// On a setting [`try_new`](Self::try_new) refuses, naming it.
    #[track_caller]
    pub fn with_config(config: PacerConfig) -> Self {
        crate::config::expect_valid("RateLimitLayer::with_config", Self::try_new(config))
    }

    /// A layer with its own [`Pacer`] of `config`.
    ///
    /// # Errors
    ///
    /// As [`Pacer::try_new`].
    pub fn try_new(config: PacerConfig) -> Result<Self, Error> {
        Ok(Self::shared(Arc::new(Pacer::try_new(config)?)))
    }

    /// A layer over a pacer shared with other layers or clients.
    pub fn shared(pacer: Arc<Pacer>) -> Self {
        RateLimitLayer { pacer, clock: None }
    }

    /// Read the wall clock with `clock` (for epoch and RFC 3339 resets,
    /// HTTP-date pauses) instead of [`SystemTime::now`], which is read only
    /// when a header needs it.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The pacer, to observe or to share.
    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            pacer: self.pacer.clone(),
            clock: self.clock.clone(),
        }
    }
}

// ===== impl RateLimit =====

/// The service of [`RateLimitLayer`].
///
/// See the [module docs](self).
///
/// # Clone
///
/// Clones share the same [`Pacer`].
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    pacer: Arc<Pacer>,
    clock: Option<Clock>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("pacer", &self.pacer)
            .finish()
    }
}

impl<S> RateLimit<S> {
    /// The pacer.
    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S, Request<ReqB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let mut ticket = self.pacer.ticket(req.extensions().get::<Cost>());
        let (admit, now) = if self.pacer.hosts() == 0 {
            // Happy path: no host tracked; no clock, no deadline, no hash.
            self.pacer.count(&mut ticket);
            (Admit::Go, None)
        } else {
            let now = Instant::now();
            let deadline = Deadline::of(req.extensions());
            let admit = self.pacer.admit(now, req.uri(), &mut ticket, deadline);
            (admit, Some(now))
        };
        let host = crate::host::HostOwned::of(req.uri());
        let (inner, held_since) = match admit {
            Admit::Go => (
                WaitThenCall::called(self.inner.call(req), Some(ticket)),
                None,
            ),
            Admit::Wait(until) | Admit::Later(until) => {
                let wait = Paced {
                    sleep: Box::pin(tokio::time::sleep_until(until)),
                    ticket: Some(ticket),
                    readmit: matches!(admit, Admit::Later(_)),
                };
                (
                    WaitThenCall::waiting(wait, take_ready(&mut self.inner), req),
                    now,
                )
            }
            Admit::Exhausted { reset, dimension } => {
                let now = now.unwrap_or_else(Instant::now);
                let error = exhausted(&req, reset, dimension, now);
                (WaitThenCall::failed(error), None)
            }
        };
        future::ResponseFuture {
            inner,
            host,
            clock: self.clock.clone(),
            held_since,
        }
    }
}

/// The wait of a paced request: until its slot (reserved), or until a
/// reset (then admitted again).
struct Paced {
    sleep: Pin<Box<Sleep>>,
    ticket: Option<Ticket>,
    readmit: bool,
}

impl Wait for Paced {
    type Held = Option<Ticket>;

    fn poll_wait<B>(
        &mut self,
        cx: &mut Context<'_>,
        req: &mut Request<B>,
    ) -> Poll<Result<Option<Ticket>, Error>> {
        loop {
            ready!(self.sleep.as_mut().poll(cx));
            if !self.readmit {
                return Poll::Ready(Ok(self.ticket.take()));
            }
            let now = Instant::now();
            let Some(ticket) = self.ticket.as_mut() else {
                return Poll::Ready(Ok(None));
            };
            let pacer = ticket.pacer().clone();
            match pacer.admit(now, req.uri(), ticket, Deadline::of(req.extensions())) {
                Admit::Go => return Poll::Ready(Ok(self.ticket.take())),
                Admit::Wait(until) => {
                    self.readmit = false;
                    self.sleep.as_mut().reset(until);
                }
                Admit::Later(until) => self.sleep.as_mut().reset(until),
                Admit::Exhausted { reset, dimension } => {
                    return Poll::Ready(Err(exhausted(req, reset, dimension, now)));
                }
            }
        }
    }

    fn name(&self) -> &'static str {
        "paced"
    }

    fn closed_detail(&self) -> &'static str {
        "shut down while paced for a quota"
    }
}

/// What a response says of its host's quota, read into the pacer: its
/// rate-limit headers parsed (none of a cached response's), the span's
/// `rebound.ratelimit.*` fields recorded, `ticket` settled. The one reading
/// for the layer and the whole stack as one service ([`crate::stack`]).
pub(crate) fn settle(
    clock: Option<&(dyn Fn() -> SystemTime + Send + Sync)>,
    status: http::StatusCode,
    headers: &http::HeaderMap,
    ticket: &mut Ticket,
    key: impl FnOnce() -> u64,
) -> Option<QuotaSignal> {
    if !parse::has_fields(headers) {
        // Nothing said (the happy path): no reading to make, nothing on
        // the span. Nothing reserved either, and not a 429 (no signal):
        // the ticket only leaves the in-flight counts. Otherwise the pacer
        // settles it with an empty reading, as `read` would have made.
        if status != StatusCode::TOO_MANY_REQUESTS && ticket.settle_unread() {
            return None;
        }
        return Pacer::settle_ticket(ticket, Instant::now, key, status, &Reading::EMPTY);
    }
    let mut reading = parse::read_with(headers, status, || match clock {
        Some(clock) => clock(),
        #[allow(clippy::disallowed_methods)] // the wall clock, for dates
        None => SystemTime::now(),
    });
    if !reading.is_empty() && parse::is_cached(status, headers) {
        reading = Reading::default();
    }
    if let Some((_, q)) = reading.tightest() {
        let span = tracing::Span::current();
        if let Some(r) = q.remaining {
            span.record("rebound.ratelimit.remaining", r);
        }
        if let Some(reset) = q.reset {
            span.record("rebound.ratelimit.reset_ms", future::millis(reset));
        }
    }
    Pacer::settle_ticket(ticket, Instant::now, key, status, &reading)
}

/// The response future of [`RateLimit`].
pub mod future {
    use super::*;
    use pin_project_lite::pin_project;

    pin_project! {
        /// The response future of [`RateLimit`]: waits for the request's
        /// turn, calls the inner service, and reads the response's
        /// rate-limit headers.
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<S, R>
        where
            S: Service<R>,
        {
            #[pin]
            pub(super) inner: WaitThenCall<Paced, S, R>,
            // The request's host, keyed only if its response says the
            // quota runs low.
            pub(super) host: crate::host::HostOwned,
            pub(super) clock: Option<Clock>,
            pub(super) held_since: Option<Instant>,
        }
    }

    impl<S, R> fmt::Debug for ResponseFuture<S, R>
    where
        S: Service<R>,
    {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture")
                .field("state", &self.inner.state_name())
                .finish()
        }
    }

    impl<S, ReqB, ResB> Future for ResponseFuture<S, Request<ReqB>>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
        S::Error: Into<BoxError>,
    {
        type Output = Result<Response<ResB>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let (out, ticket) = match ready!(this.inner.poll(cx)) {
                Ok(called) => called,
                Err(waited) => return Poll::Ready(Err(waited)),
            };
            if let Some(since) = *this.held_since {
                tracing::Span::current()
                    .record("rebound.ratelimit.wait_ms", millis(since.elapsed()));
            }
            // An error: the ticket's drop gives its reservation back.
            let mut res = out?;
            let Some(mut ticket) = ticket else {
                return Poll::Ready(Ok(res));
            };
            let host = this.host.as_ref();
            let signal = settle(
                this.clock.as_deref(),
                res.status(),
                res.headers(),
                &mut ticket,
                || host.key(),
            );
            if let Some(signal) = signal {
                res.extensions_mut().insert(signal);
            }
            Poll::Ready(Ok(res))
        }
    }

    pub(crate) fn millis(d: Duration) -> u64 {
        d.as_millis().min(u128::from(u64::MAX)) as u64
    }
}
