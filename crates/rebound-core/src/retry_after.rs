//! Turn the server's `Retry-After` (or gRPC pushback) into a
//! [`RetryAfterHint`].
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::retry_after::RetryAfterLayer;
//! use rebound_core::RetryAfterHint;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryAfterLayer::new())
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(tower::service_fn(|_req: Request<()>| async {
//!         let res = Response::builder()
//!             .status(StatusCode::TOO_MANY_REQUESTS)
//!             .header("retry-after", "3")
//!             .body(())
//!             .unwrap();
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let res = svc.ready().await?.call(Request::new(())).await?;
//! assert_eq!(
//!     res.extensions().get::<RetryAfterHint>(),
//!     Some(&RetryAfterHint(Duration::from_secs(3)))
//! );
//! # Ok(())
//! # }
//! ```
//!
//! # Rules
//!
//! The layer looks at a response only when the layer below (classify) gave
//! it a non-success [`Verdict`], so the happy path costs one extension
//! look-up.
//!
//! * `Retry-After` is read on 429 and 503 responses (configurable with
//!   [`RetryAfterLayer::statuses`]), as delta-seconds (`120`) or as an
//!   HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, parsed by `httpdate`).
//! * A date in the past gives a zero delay. A negative, non-numeric or absurd
//!   value (one that does not fit in a `u64` of seconds, or a malformed
//!   date) gives **no hint**: never a panic.
//! * A value over the cap (default 60 s, [`RetryAfterLayer::max_delay`]) is
//!   [clamped](OverCap::Clamp) to the cap by default, or
//!   [discarded](OverCap::Discard). **Clamp is the default** because a server
//!   that asks for a long pause is overloaded: discarding its hint would
//!   make the client retry *sooner* (at its own short backoff) than with the
//!   clamped hint, which is the opposite of what the server asked. With a
//!   deadline the clamped delay usually does not fit, and the retry layer
//!   then returns the response at once. This is also what AWS SDKs and
//!   linkerd do. [`OverCap::FailFast`] gives up instead: the outcome becomes
//!   `Fatal` (`retry-after over cap`), its hint kept at the cap so that a
//!   Retry-After gate still closes.
//! * `grpc-retry-pushback-ms` (on any non-success response), after
//!   [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md#pushback):
//!   "an ASCII encoded signed 32-bit integer ... If the value for pushback
//!   is negative or unparseble, then it will be seen as the server asking
//!   the client not to retry at all." A non-negative number of milliseconds
//!   is a hint (capped the same way, and it wins over `Retry-After`); a
//!   negative value rewrites the verdict to
//!   `Fatal { reason: "server pushback: do not retry" }`; a malformed one
//!   (not an optional `-` and ASCII digits: `abc`, empty, `1.5`, `+5`,
//!   ` 5`, a number outside `i32`, or several values) to
//!   `Fatal { reason: "server pushback malformed: do not retry" }`, with a
//!   DEBUG event that does not carry the value. See [`parse_grpc_pushback`].
//!
//! The HTTP-date branch needs the wall clock. The pure functions
//! ([`parse_retry_after`], [`retry_after_hint`]) take `now` as an argument;
//! the layer reads [`SystemTime::now`] only when a date is present, unless a
//! clock is injected with [`RetryAfterLayer::clock`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Reason, RetryAfterHint, Verdict};
use crate::error::{BoxError, Error};

/// The gRPC pushback header (milliseconds; negative or malformed means "do not
/// retry").
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The default cap on a server-given delay: 60 s.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(60);

/// The largest cap [`RetryAfterLayer::max_delay`] accepts: one day.
pub const MAX_MAX_DELAY: Duration = crate::config::MAX_DURATION;

/// What to do with a server-given delay above the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OverCap {
    /// Use the cap instead (the default; see the [module docs](self) for why).
    #[default]
    Clamp,
    /// Ignore the hint: the backoff layer then proposes its own delay.
    Discard,
    /// Give up: a server that asks for longer than the cap is not retried
    /// (the outcome becomes `Fatal`, reason `retry-after over cap`), and the
    /// hint is kept at the cap so that a Retry-After gate still closes. With
    /// the ready-made client, a gate in `GateMode::Wait` then fails new
    /// requests to that host fast too (`GateMode::FailFast`).
    FailFast,
}

/// Parse one `Retry-After` value: delta-seconds or an HTTP-date, relative to
/// `now`. A date in the past gives [`Duration::ZERO`]; anything malformed,
/// negative or too large for a `u64` of seconds gives `None`. No cap.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use rebound_core::retry_after::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("3"), now), Some(Duration::from_secs(3)));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("-1"), now), None);
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("abc"), now), None);
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        // `u64::from_str` fails on overflow: absurd values are no hint.
        return text.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What a `grpc-retry-pushback-ms` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pushback {
    /// Wait this long before retrying (not capped).
    After(Duration),
    /// Do not retry (a negative value).
    DoNotRetry,
    /// Do not retry: the value is not a signed 32-bit decimal integer, or
    /// the header came more than once (gRFC A6: "negative or unparseble").
    Malformed,
}

impl Pushback {
    /// Whether the server asked not to retry ([`DoNotRetry`](Self::DoNotRetry)
    /// or [`Malformed`](Self::Malformed)).
    pub fn is_do_not_retry(self) -> bool {
        !matches!(self, Pushback::After(_))
    }
}

/// Parse `grpc-retry-pushback-ms` from `headers`; `None` when absent.
///
/// gRFC A6 (§ Pushback): the value is "an ASCII encoded signed 32-bit
/// integer ... that represents how many milliseconds to wait before sending
/// a retry. If the value for pushback is negative or unparseble, then it
/// will be seen as the server asking the client not to retry at all." So:
///
/// * an optional `-` and 1 or more ASCII digits, within `i32`: a negative
///   value is [`Pushback::DoNotRetry`], any other is [`Pushback::After`]
///   (leading zeros are accepted, as gRPC's own clients accept them);
/// * anything else is [`Pushback::Malformed`], which also means "do not
///   retry": empty, `abc`, `1.5`, `+5`, ` 5` (no trimming), a number that
///   does not fit in an `i32`, bytes that are not ASCII, or the header more
///   than once (two header lines or `5, 6`).
///
/// Never panics.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use rebound_core::retry_after::{parse_grpc_pushback, Pushback};
///
/// let mut h = HeaderMap::new();
/// assert_eq!(parse_grpc_pushback(&h), None);
/// h.insert("grpc-retry-pushback-ms", "250".parse().unwrap());
/// assert_eq!(parse_grpc_pushback(&h), Some(Pushback::After(Duration::from_millis(250))));
/// h.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
/// assert_eq!(parse_grpc_pushback(&h), Some(Pushback::DoNotRetry));
/// h.insert("grpc-retry-pushback-ms", "1.5".parse().unwrap());
/// assert_eq!(parse_grpc_pushback(&h), Some(Pushback::Malformed));
/// ```
pub fn parse_grpc_pushback(headers: &HeaderMap) -> Option<Pushback> {
    let mut values = headers.get_all(GRPC_RETRY_PUSHBACK_MS).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return Some(Pushback::Malformed);
    }
    Some(parse_pushback_value(value.as_bytes()))
}

/// One pushback value (see [`parse_grpc_pushback`]).
fn parse_pushback_value(bytes: &[u8]) -> Pushback {
    let digits = match bytes.split_first() {
        Some((b'-', rest)) => rest,
        _ => bytes,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Pushback::Malformed;
    }
    // Digits only, so `from_utf8` cannot fail and `i32::from_str` fails
    // only on overflow.
    let Some(ms) = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.parse::<i32>().ok())
    else {
        return Pushback::Malformed;
    };
    match u64::try_from(ms) {
        Ok(ms) => Pushback::After(Duration::from_millis(ms)),
        Err(_) => Pushback::DoNotRetry, // negative
    }
}

/// Apply the cap to a server-given delay.
pub fn cap_delay(delay: Duration, max: Duration, over_cap: OverCap) -> Option<Duration> {
    if delay <= max {
        Some(delay)
    } else {
        match over_cap {
            OverCap::Clamp | OverCap::FailFast => Some(max),
            OverCap::Discard => None,
        }
    }
}

/// The capped `Retry-After` hint of a response with `status` and `headers`,
/// if `status` is one of `statuses` (pass `None` to read the header whatever
/// the status).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{HeaderMap, StatusCode};
/// use rebound_core::retry_after::{retry_after_hint, OverCap};
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "120".parse().unwrap());
/// let statuses = [StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE];
/// let max = Duration::from_secs(60);
/// let hint = retry_after_hint(Some(StatusCode::TOO_MANY_REQUESTS), &headers, now, &statuses, max, OverCap::Clamp);
/// assert_eq!(hint, Some(max));
/// let hint = retry_after_hint(Some(StatusCode::TOO_MANY_REQUESTS), &headers, now, &statuses, max, OverCap::Discard);
/// assert_eq!(hint, None);
/// ```
pub fn retry_after_hint(
    status: Option<StatusCode>,
    headers: &HeaderMap,
    now: SystemTime,
    statuses: &[StatusCode],
    max: Duration,
    over_cap: OverCap,
) -> Option<Duration> {
    if let Some(status) = status {
        if !statuses.contains(&status) {
            return None;
        }
    }
    let delay = parse_retry_after(headers.get(http::header::RETRY_AFTER)?, now)?;
    cap_delay(delay, max, over_cap)
}

// ===== layer =====

type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    statuses: Arc<[StatusCode]>,
    max: Duration,
    over_cap: OverCap,
    clock: Option<Clock>,
}

impl Config {
    fn now(&self) -> SystemTime {
        match &self.clock {
            Some(clock) => clock(),
            // The HTTP-date form of Retry-After is an absolute wall-clock
            // time: only the wall clock can turn it into a delay. Called only
            // when a non-success response carries the header.
            #[allow(clippy::disallowed_methods)]
            None => SystemTime::now(),
        }
    }

    pub(crate) fn annotate(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        ext: &mut http::Extensions,
    ) {
        let Some(verdict) = ext.get::<Verdict>() else {
            return; // success: nothing to do
        };
        if verdict.is_success() {
            return;
        }
        if let Some(pushback) = parse_grpc_pushback(headers) {
            match pushback {
                Pushback::DoNotRetry => {
                    ext.insert(Verdict::Fatal {
                        reason: Reason::new_static("server pushback: do not retry"),
                    });
                }
                Pushback::Malformed => {
                    // The value is the server's, not ours to log: it may be
                    // long, and it is not on the redaction allow-list.
                    tracing::debug!(
                        target: "rebound::retry_after",
                        header = GRPC_RETRY_PUSHBACK_MS.as_str(),
                        "malformed gRPC pushback: not retried (gRFC A6)"
                    );
                    ext.insert(Verdict::Fatal {
                        reason: Reason::new_static("server pushback malformed: do not retry"),
                    });
                }
                Pushback::After(d) => self.record(d, ext),
            }
            return;
        }
        if !self.statuses.contains(&status) || !headers.contains_key(http::header::RETRY_AFTER) {
            return;
        }
        // Only read the wall clock for the date form.
        let value = &headers[http::header::RETRY_AFTER];
        let is_delta = value
            .as_bytes()
            .iter()
            .all(|b| b.is_ascii_digit() || *b == b' ');
        let now = if is_delta {
            SystemTime::UNIX_EPOCH
        } else {
            self.now()
        };
        // Uncapped here: `record` applies the cap and the over-cap policy.
        if let Some(d) = retry_after_hint(None, headers, now, &[], Duration::MAX, OverCap::Clamp) {
            self.record(d, ext);
        }
    }

    /// Leave the hint for a server-given `delay`, capped by the policy.
    fn record(&self, delay: Duration, ext: &mut http::Extensions) {
        if delay > self.max && self.over_cap == OverCap::FailFast {
            ext.insert(Verdict::Fatal {
                reason: Reason::new_static("retry-after over cap"),
            });
        }
        if let Some(d) = cap_delay(delay, self.max, self.over_cap) {
            ext.insert(RetryAfterHint(d));
        }
    }
}

/// Reads `Retry-After` and gRPC pushback on non-success responses and
/// leaves a [`RetryAfterHint`] in their extensions.
///
/// Needs a [`Verdict`] from a classify layer below it. See the
/// [module docs](self) for the rules and an example.
///
/// # Clone
///
/// Cloning the layer (or its service) shares its configuration (an `Arc`).
#[derive(Clone)]
pub struct RetryAfterLayer {
    config: Config,
}

impl fmt::Debug for RetryAfterLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryAfterLayer")
            .field("statuses", &self.config.statuses)
            .field("max", &self.config.max)
            .field("over_cap", &self.config.over_cap)
            .field("clock", &self.config.clock.as_ref().map(|_| "injected"))
            .finish()
    }
}

impl Default for RetryAfterLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryAfterLayer {
    #[cfg(feature = "stack")]
    /// What the layer's service does with an outcome (for the whole-stack
    /// service, which calls it without nesting the layer).
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// Read `Retry-After` on 429 and 503, cap at 60 s, clamp over-cap values.
    pub fn new() -> Self {
        RetryAfterLayer {
            config: Config {
                statuses: Arc::from(
                    &[
                        StatusCode::TOO_MANY_REQUESTS,
                        StatusCode::SERVICE_UNAVAILABLE,
                    ][..],
                ),
                max: DEFAULT_MAX_DELAY,
                over_cap: OverCap::Clamp,
                clock: None,
            },
        }
    }

    /// The statuses on which `Retry-After` is read. Default: 429 and 503.
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.config.statuses = statuses.into_iter().collect();
        self
    }

    /// The cap on a server-given delay. Default: 60 s.
    ///
    /// # Panics
    ///
    /// On a value [`try_max_delay`](Self::try_max_delay) refuses, with a message that
    /// names it; use `try_max_delay` for values that come from configuration.
    #[track_caller]
    pub fn max_delay(self, max: Duration) -> Self {
        crate::config::expect_valid("RetryAfterLayer::max_delay", self.try_max_delay(max))
    }

    /// The cap on a server-given delay. Default: 60 s.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `max` is zero or above one day.
    pub fn try_max_delay(mut self, max: Duration) -> Result<Self, Error> {
        if max.is_zero() {
            return Err(Error::config("RetryAfterLayer: max_delay must be > 0"));
        }
        if max > MAX_MAX_DELAY {
            return Err(Error::config(
                "RetryAfterLayer: max_delay must be at most one day",
            ));
        }
        self.config.max = max;
        Ok(self)
    }

    /// What to do with a value above the cap. Default: [`OverCap::Clamp`].
    pub fn over_cap(mut self, over_cap: OverCap) -> Self {
        self.config.over_cap = over_cap;
        self
    }

    /// Use `clock` instead of [`SystemTime::now`] for HTTP-dates (tests,
    /// simulated time). Default: the system clock.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.config.clock = Some(Arc::new(clock));
        self
    }
}

impl<S> Layer<S> for RetryAfterLayer {
    type Service = RetryAfter<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryAfter {
            inner,
            config: self.config.clone(),
        }
    }
}

// ===== service =====

/// The service made by [`RetryAfterLayer`].
///
/// # Errors
///
/// Inner errors are turned into [`Error`] unchanged (errors carry no
/// headers, so no hint).
#[derive(Clone)]
pub struct RetryAfter<S> {
    inner: S,
    config: Config,
}

impl<S: fmt::Debug> fmt::Debug for RetryAfter<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryAfter")
            .field("inner", &self.inner)
            .field("max", &self.config.max)
            .finish()
    }
}

impl<S> RetryAfter<S> {
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

impl<S, ReqB, ResB> Service<Request<ReqB>> for RetryAfter<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        future::ResponseFuture {
            inner: self.inner.call(req),
            config: self.config.clone(),
        }
    }
}

pub mod future {
    //! The response future of [`RetryAfter`].

    use super::*;

    pin_project! {
        /// The response future of [`RetryAfter`](super::RetryAfter).
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) inner: F,
            pub(super) config: Config,
        }
    }

    impl<F: fmt::Debug> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture")
                .field("inner", &self.inner)
                .finish()
        }
    }

    impl<F, B, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<B>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let res = ready!(this.inner.poll(cx)).map_err(|e| Error::from_boxed(e.into()))?;
            if res.extensions().get::<Verdict>().is_none() {
                return Poll::Ready(Ok(res)); // success: not even a header look-up
            }
            // Headers are read while extensions are written: split the parts
            // (moves only, no allocation).
            let (mut parts, body) = res.into_parts();
            this.config
                .annotate(parts.status, &parts.headers, &mut parts.extensions);
            let res = Response::from_parts(parts, body);
            Poll::Ready(Ok(res))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::Sent;
    use crate::ErrorKind;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_retry_after(&hv("0"), now()), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&hv("3"), now()),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after(&hv(" 120 "), now()),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn malformed_is_no_hint() {
        for bad in [
            "-1",
            "abc",
            "99999999999999999999",
            "",
            "1.5",
            "3s",
            "+3",
            "Wed, 99 Foo",
        ] {
            assert_eq!(parse_retry_after(&hv(bad), now()), None, "{bad:?}");
        }
        let non_utf8 = HeaderValue::from_bytes(b"\xff3").unwrap();
        assert_eq!(parse_retry_after(&non_utf8, now()), None);
    }

    #[test]
    fn http_date() {
        let ahead = httpdate::fmt_http_date(now() + Duration::from_secs(5));
        assert_eq!(
            parse_retry_after(&hv(&ahead), now()),
            Some(Duration::from_secs(5))
        );
        let past = "Mon, 01 Jan 1990 00:00:00 GMT";
        assert_eq!(parse_retry_after(&hv(past), now()), Some(Duration::ZERO));
    }

    #[test]
    fn cap_and_statuses() {
        let statuses = [
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
        ];
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, hv("600"));
        let max = Duration::from_secs(60);
        let s429 = Some(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            retry_after_hint(s429, &h, now(), &statuses, max, OverCap::Clamp),
            Some(max)
        );
        assert_eq!(
            retry_after_hint(s429, &h, now(), &statuses, max, OverCap::Discard),
            None
        );
        let s500 = Some(StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            retry_after_hint(s500, &h, now(), &statuses, max, OverCap::Clamp),
            None
        );
        assert_eq!(
            retry_after_hint(None, &h, now(), &[], max, OverCap::Clamp),
            Some(max)
        );
        h.insert(http::header::RETRY_AFTER, hv("60"));
        assert_eq!(
            retry_after_hint(s429, &h, now(), &statuses, max, OverCap::Discard),
            Some(max)
        );
    }

    #[test]
    fn grpc_pushback() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_grpc_pushback(&h), None);
        let ms = |n| Some(Pushback::After(Duration::from_millis(n)));
        let table: &[(&[u8], Option<Pushback>)] = &[
            (b"250", ms(250)),
            (b"0", ms(0)),
            (b"-0", ms(0)),
            (b"007", ms(7)),
            (b"2147483647", ms(2_147_483_647)),
            (b"-1", Some(Pushback::DoNotRetry)),
            (b"-2147483648", Some(Pushback::DoNotRetry)),
            // gRFC A6: "negative or unparseble" means do not retry.
            (b"", Some(Pushback::Malformed)),
            (b"abc", Some(Pushback::Malformed)),
            (b"soon", Some(Pushback::Malformed)),
            (b"1.5", Some(Pushback::Malformed)),
            (b"+5", Some(Pushback::Malformed)),
            (b" 5", Some(Pushback::Malformed)),
            (b"5 ", Some(Pushback::Malformed)),
            (b"-", Some(Pushback::Malformed)),
            (b"--1", Some(Pushback::Malformed)),
            (b"5,6", Some(Pushback::Malformed)),
            (b"5, 6", Some(Pushback::Malformed)),
            (b"1e3", Some(Pushback::Malformed)),
            (b"2147483648", Some(Pushback::Malformed)),
            (b"-2147483649", Some(Pushback::Malformed)),
            (b"99999999999999999999", Some(Pushback::Malformed)),
            (b"\xff5", Some(Pushback::Malformed)),
        ];
        for (value, want) in table {
            h.insert(
                GRPC_RETRY_PUSHBACK_MS,
                HeaderValue::from_bytes(value).unwrap(),
            );
            assert_eq!(parse_grpc_pushback(&h), *want, "{:?}", value.escape_ascii());
            let want_stop = want.is_some_and(Pushback::is_do_not_retry);
            assert_eq!(
                parse_grpc_pushback(&h).unwrap().is_do_not_retry(),
                want_stop
            );
        }
        // A very long value: no panic, no retry.
        let long = "9".repeat(64 * 1024);
        h.insert(GRPC_RETRY_PUSHBACK_MS, hv(&long));
        assert_eq!(parse_grpc_pushback(&h), Some(Pushback::Malformed));
        // Several values, even valid ones: which one did the server mean?
        h.insert(GRPC_RETRY_PUSHBACK_MS, hv("5"));
        h.append(GRPC_RETRY_PUSHBACK_MS, hv("6"));
        assert_eq!(parse_grpc_pushback(&h), Some(Pushback::Malformed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_malformed_pushback_is_logged_without_its_value() {
        let capture = rebound_test::capture::Capture::new();
        let _guard = capture.set_default();
        let value = format!("x{}", "7".repeat(4096));
        let r = run(
            RetryAfterLayer::new(),
            503,
            &[("grpc-retry-pushback-ms", value.clone())],
            Some(retryable()),
        )
        .await;
        assert!(Verdict::of(r.extensions()).is_fatal());
        let events = capture.events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].level, tracing::Level::DEBUG);
        assert_eq!(
            events[0].message(),
            Some("malformed gRPC pushback: not retried (gRFC A6)")
        );
        assert_eq!(events[0].field("header"), Some("grpc-retry-pushback-ms"));
        assert_eq!(capture.count("777"), 0, "the value is never logged");
    }

    #[test]
    fn bad_config_is_an_error() {
        assert!(matches!(
            RetryAfterLayer::new()
                .try_max_delay(Duration::ZERO)
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        assert!(matches!(
            RetryAfterLayer::new()
                .try_max_delay(Duration::from_secs(2 * 86_400))
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        assert!(RetryAfterLayer::new()
            .try_max_delay(Duration::from_secs(5))
            .is_ok());
    }

    fn retryable() -> Verdict {
        Verdict::Retryable {
            reason: Reason::new_static("status 429"),
            sent: Sent::MaybeProcessed,
        }
    }

    async fn run(
        layer: RetryAfterLayer,
        status: u16,
        headers: &[(&'static str, String)],
        verdict: Option<Verdict>,
    ) -> Response<()> {
        use tower::ServiceExt;
        let headers: Vec<(&'static str, String)> = headers.to_vec();
        let svc = layer.layer(tower::service_fn(move |_req: Request<()>| {
            let headers = headers.clone();
            let verdict = verdict.clone();
            async move {
                let mut res = Response::new(());
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
                for (k, v) in headers {
                    res.headers_mut()
                        .insert(k, HeaderValue::from_str(&v).unwrap());
                }
                if let Some(v) = verdict {
                    res.extensions_mut().insert(v);
                }
                Ok::<_, BoxError>(res)
            }
        }));
        svc.oneshot(Request::new(())).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn layer_annotates() {
        let layer = RetryAfterLayer::new().clock(now);
        let hint = |r: &Response<()>| r.extensions().get::<RetryAfterHint>().map(|h| h.0);

        let r = run(
            layer.clone(),
            429,
            &[("retry-after", "3".into())],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), Some(Duration::from_secs(3)));

        let date = httpdate::fmt_http_date(now() + Duration::from_secs(5));
        let r = run(
            layer.clone(),
            503,
            &[("retry-after", date)],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), Some(Duration::from_secs(5)));

        // No verdict (success): nothing read.
        let r = run(layer.clone(), 429, &[("retry-after", "3".into())], None).await;
        assert_eq!(hint(&r), None);

        // Status not configured.
        let r = run(
            layer.clone(),
            500,
            &[("retry-after", "3".into())],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), None);

        // Over the cap: clamped by default, discarded on request.
        let r = run(
            layer.clone(),
            429,
            &[("retry-after", "3600".into())],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), Some(DEFAULT_MAX_DELAY));
        let discard = layer.clone().over_cap(OverCap::Discard);
        let r = run(
            discard,
            429,
            &[("retry-after", "3600".into())],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), None);
        // ... or given up: fatal, the hint kept at the cap for a gate.
        let fail = layer.clone().over_cap(OverCap::FailFast);
        let r = run(
            fail.clone(),
            429,
            &[("retry-after", "3600".into())],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), Some(DEFAULT_MAX_DELAY));
        let verdict = Verdict::of(r.extensions()).into_owned();
        assert!(verdict.is_fatal(), "{verdict:?}");
        assert_eq!(verdict.reason().unwrap().as_str(), "retry-after over cap");
        // Under the cap, FailFast changes nothing.
        let r = run(fail, 429, &[("retry-after", "3".into())], Some(retryable())).await;
        assert_eq!(hint(&r), Some(Duration::from_secs(3)));
        assert!(Verdict::of(r.extensions()).is_retryable());

        // Pushback: hint, or do-not-retry.
        let r = run(
            layer.clone(),
            500,
            &[("grpc-retry-pushback-ms", "1500".into())],
            Some(retryable()),
        )
        .await;
        assert_eq!(hint(&r), Some(Duration::from_millis(1500)));
        let r = run(
            layer.clone(),
            503,
            &[("grpc-retry-pushback-ms", "-1".into())],
            Some(retryable()),
        )
        .await;
        let v = Verdict::of(r.extensions());
        assert!(v.is_fatal());
        assert_eq!(
            v.reason().unwrap().as_str(),
            "server pushback: do not retry"
        );
        assert_eq!(hint(&r), None);
        // Malformed pushback (gRFC A6): do not retry either, and it is not
        // read as "no pushback" (which would let Retry-After retry it).
        for bad in ["abc", "", "1.5", "99999999999999999999"] {
            let r = run(
                layer.clone(),
                503,
                &[
                    ("grpc-retry-pushback-ms", bad.into()),
                    ("retry-after", "1".into()),
                ],
                Some(retryable()),
            )
            .await;
            let v = Verdict::of(r.extensions());
            assert!(v.is_fatal(), "{bad:?}: {v:?}");
            assert_eq!(
                v.reason().unwrap().as_str(),
                "server pushback malformed: do not retry"
            );
            assert_eq!(hint(&r), None, "{bad:?}");
        }
    }
}
