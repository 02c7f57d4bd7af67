//! Deadlines that travel: `grpc-timeout` (and an optional budget header)
//! out of the deadline on every attempt ([`PropagateDeadlineLayer`]), and
//! into the deadline of a server's handler ([`InboundDeadlineLayer`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::code::is_grpc;
use crate::annotations::{Deadline, DeadlineScope};

/// `grpc-timeout`: how long the caller will wait for the call.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The most digits gRPC allows in a `grpc-timeout` value.
const MAX_DIGITS: usize = 8;
const MAX_VALUE: u128 = 99_999_999;

/// `d` as a `grpc-timeout` value: the finest unit in which it fits in 8
/// digits, **rounded down**, so the value sent is never larger than `d`
/// (`299999999n` is sent as `299999u`).
///
/// ```
/// use std::time::Duration;
/// use rebound_core::grpc::{encode_grpc_timeout, parse_grpc_timeout};
///
/// assert_eq!(encode_grpc_timeout(Duration::from_millis(300)), "300000u");
/// assert_eq!(encode_grpc_timeout(Duration::from_nanos(1_234)), "1234n");
/// let v = encode_grpc_timeout(Duration::from_secs(3 * 86_400));
/// assert!(parse_grpc_timeout(&v).unwrap() <= Duration::from_secs(3 * 86_400));
/// ```
pub fn encode_grpc_timeout(d: Duration) -> HeaderValue {
    let nanos = d.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    let (value, unit) = units
        .iter()
        .find(|(per, _)| nanos / per <= MAX_VALUE)
        .map(|(per, unit)| (nanos / per, *unit))
        .unwrap_or((MAX_VALUE, 'H'));
    HeaderValue::try_from(format!("{value}{unit}")).expect("digits and a letter")
}

/// The deadline a gRPC call's own `grpc-timeout` header sets, counted from
/// `now`: what tonic's `Request::set_timeout` (or a generated client's
/// timeout) puts on the request. `None` for a request that is not HTTP/2
/// (gRPC runs only on HTTP/2, so a plain HTTP request pays one comparison)
/// or that carries no valid `grpc-timeout`. The stack and the
/// [`DeadlineLayer`](crate::DeadlineLayer) take the earlier of it and
/// their own total, so a call's retries end when its caller said.
pub fn own_grpc_deadline<B>(
    req: &http::Request<B>,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    if req.version() != http::Version::HTTP_2 {
        return None;
    }
    let left = parse_grpc_timeout(req.headers().get(GRPC_TIMEOUT)?)?;
    now.checked_add(left)
}

/// A `grpc-timeout` value as a duration: 1 to 8 ASCII digits and a unit
/// (`H`, `M`, `S`, `m`, `u`, `n`). Anything else (`abc`, a missing unit,
/// more than 8 digits, a sign, spaces) is `None`, never a panic.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use rebound_core::grpc::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("300m")), Some(Duration::from_millis(300)));
/// assert_eq!(parse_grpc_timeout(&HeaderValue::from_static("2S")), Some(Duration::from_secs(2)));
/// for bad in ["abc", "300", "m", "123456789m", "-1S", "1.5S", " 1S", "1s"] {
///     assert_eq!(parse_grpc_timeout(&HeaderValue::from_static(bad)), None, "{bad}");
/// }
/// ```
pub fn parse_grpc_timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A budget header value: whole milliseconds, at most 12 digits.
fn parse_millis(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 12 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = bytes.iter().fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    Some(Duration::from_millis(n))
}

// ===== PropagateDeadlineLayer =====

/// Tells the server how long it has: on every attempt, writes the time
/// left before the request's [`Deadline`] (see [`Deadline::of`]) into
/// `grpc-timeout` for gRPC calls and, when configured, into a budget header
/// of whole milliseconds for every request.
///
/// Put it **below** the retry layer, so each attempt carries the time left
/// at *its* start, never the value of the first one. A `grpc-timeout` that
/// the caller set (tonic's `Request::set_timeout`) is kept when it is
/// shorter than the time left, and lowered to it otherwise: the value sent
/// is never larger than the time left. Of a `grpc-timeout` the caller set
/// more than once, the smallest valid value counts and only one value is
/// sent. Without a deadline nothing is written.
///
/// Cost: a request that is neither gRPC nor configured for the budget header
/// pays one header look-up (`content-type`).
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct PropagateDeadlineLayer {
    grpc: bool,
    header: Option<HeaderName>,
}

impl Default for PropagateDeadlineLayer {
    fn default() -> Self {
        PropagateDeadlineLayer {
            grpc: true,
            header: None,
        }
    }
}

impl PropagateDeadlineLayer {
    /// `grpc-timeout` on gRPC calls; no budget header.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also write the time left, in whole milliseconds (rounded down), into
    /// `name` on every request, gRPC or not. Default: no such header.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = Some(name);
        self
    }

    /// Whether to write `grpc-timeout` on gRPC calls. Default: `true`.
    pub fn grpc_timeout(mut self, on: bool) -> Self {
        self.grpc = on;
        self
    }

    #[cfg(feature = "stack")]
    /// Write the time left before `deadline` into `req`, as the layer's
    /// service does.
    pub(crate) fn write<B>(&self, req: &mut Request<B>, deadline: Instant) {
        let grpc = self.grpc && is_grpc(req.headers());
        if grpc || self.header.is_some() {
            let left = deadline.saturating_duration_since(Instant::now());
            write_left(req.headers_mut(), left, grpc, self.header.as_ref());
        }
    }
}

impl<S> Layer<S> for PropagateDeadlineLayer {
    type Service = PropagateDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateDeadline {
            inner,
            grpc: self.grpc,
            header: self.header.clone(),
        }
    }
}

/// The service made by [`PropagateDeadlineLayer`].
#[derive(Clone, Debug)]
pub struct PropagateDeadline<S> {
    inner: S,
    grpc: bool,
    header: Option<HeaderName>,
}

impl<S> PropagateDeadline<S> {
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

impl<S, B> Service<Request<B>> for PropagateDeadline<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let grpc = self.grpc && is_grpc(req.headers());
        if grpc || self.header.is_some() {
            if let Some(deadline) = Deadline::of(req.extensions()) {
                let left = deadline.saturating_duration_since(Instant::now());
                write_left(req.headers_mut(), left, grpc, self.header.as_ref());
            }
        }
        self.inner.call(req)
    }
}

/// The smallest valid `grpc-timeout` in `headers`, with its value, and how
/// many values the header has.
fn least_grpc_timeout(headers: &HeaderMap) -> (Option<(Duration, &HeaderValue)>, usize) {
    let mut least: Option<(Duration, &HeaderValue)> = None;
    let mut count = 0;
    for value in headers.get_all(GRPC_TIMEOUT) {
        count += 1;
        if let Some(d) = parse_grpc_timeout(value) {
            if least.is_none_or(|(l, _)| d < l) {
                least = Some((d, value));
            }
        }
    }
    (least, count)
}

fn write_left(headers: &mut HeaderMap, left: Duration, grpc: bool, header: Option<&HeaderName>) {
    if grpc {
        // The caller's own value counts when it is shorter; of several, the
        // smallest valid one, and only one value goes out (a server that
        // reads the first of several would take whichever came first).
        match least_grpc_timeout(headers) {
            (Some((set, _)), 1) if set <= left => {} // sent as it is
            (Some((set, value)), _) if set <= left => {
                let value = value.clone();
                headers.insert(GRPC_TIMEOUT, value);
            }
            _ => {
                headers.insert(GRPC_TIMEOUT, encode_grpc_timeout(left));
            }
        }
    }
    if let Some(name) = header {
        let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        headers.insert(name.clone(), HeaderValue::from(ms));
    }
}

// ===== InboundDeadlineLayer =====

/// A server-side layer (axum `Router::layer`, tonic `Server::layer`): reads
/// the caller's `grpc-timeout` (and, when configured, a budget header of
/// whole milliseconds) and makes it the [`Deadline`] of everything the
/// handler does — every outbound call made through rebound while handling
/// the request ends by then (`DeadlineLayer` and `rebound::Client` use the
/// earlier of their own deadline and this one).
///
/// The deadline is carried as the task's current deadline
/// ([`Deadline::scope`]), so the handler's future and the `call`s it makes
/// see it with no change to their code. **Limits**: a task spawned from the
/// handler (`tokio::spawn`) does not inherit it, nor does a
/// `tower::buffer::Buffer` worker; carry it with [`Deadline::current`] and a
/// new [`Deadline::scope`], or as a `Deadline` in the outbound request's
/// extensions.
///
/// A malformed or absurd value (`abc`, a missing unit, more than 8 digits,
/// a duration past the end of time) is ignored with a DEBUG event that
/// names the header but not its value: the server's own deadline, if any,
/// applies. It never panics and never makes a zero deadline out of bad
/// input (a well-formed `0m` is a deadline that has passed, as gRPC says).
/// A header sent more than once (`grpc-timeout: 100H` and
/// `grpc-timeout: 50m`) asks for its smallest valid value, whatever the
/// order; its malformed values are ignored as above. When both headers are
/// valid the earlier deadline wins; an optional [`max`](Self::max) caps
/// what a caller may ask for.
///
/// On a client stack (above the deadline layer) the same layer turns
/// tonic's `Request::set_timeout` into rebound's deadline.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct InboundDeadlineLayer {
    grpc: bool,
    header: Option<HeaderName>,
    max: Option<Duration>,
}

impl Default for InboundDeadlineLayer {
    fn default() -> Self {
        InboundDeadlineLayer {
            grpc: true,
            header: None,
            max: None,
        }
    }
}

impl InboundDeadlineLayer {
    /// Read `grpc-timeout`; no budget header, no cap.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also read `name` as whole milliseconds left. Default: none.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = Some(name);
        self
    }

    /// Whether to read `grpc-timeout`. Default: `true`.
    pub fn grpc_timeout(mut self, on: bool) -> Self {
        self.grpc = on;
        self
    }

    /// Never give a request more than `max`, whatever it asks. Default:
    /// no cap.
    pub fn max(mut self, max: Duration) -> Self {
        self.max = Some(max);
        self
    }

    /// The deadline `headers` ask for, now; `None` when they ask for none
    /// or only for malformed values.
    pub fn deadline_of(&self, headers: &HeaderMap) -> Option<Instant> {
        // Every value of the header counts (a header sent twice, `100H`
        // then `50m`, asks for the smaller): the smallest valid one wins,
        // malformed ones are ignored.
        let read = |name: &HeaderName, parse: fn(&HeaderValue) -> Option<Duration>| {
            let mut least: Option<Duration> = None;
            for value in headers.get_all(name) {
                match parse(value) {
                    Some(d) => least = Some(least.map_or(d, |l| l.min(d))),
                    None => tracing::debug!(
                        target: "rebound::grpc",
                        header = name.as_str(),
                        "inbound deadline: malformed value ignored"
                    ),
                }
            }
            least
        };
        let grpc = if self.grpc {
            read(&GRPC_TIMEOUT, parse_grpc_timeout)
        } else {
            None
        };
        let budget = self.header.as_ref().and_then(|h| read(h, parse_millis));
        let left = match (grpc, budget) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let left = self.max.map_or(left, |m| left.min(m));
        let at = Instant::now().checked_add(left);
        if at.is_none() {
            tracing::debug!(
                target: "rebound::grpc",
                "inbound deadline: absurd value ignored"
            );
        }
        at
    }
}

impl<S> Layer<S> for InboundDeadlineLayer {
    type Service = InboundDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InboundDeadline {
            inner,
            config: self.clone(),
        }
    }
}

/// The service made by [`InboundDeadlineLayer`].
#[derive(Clone)]
pub struct InboundDeadline<S> {
    inner: S,
    config: InboundDeadlineLayer,
}

impl<S: fmt::Debug> fmt::Debug for InboundDeadline<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundDeadline")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S> InboundDeadline<S> {
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

impl<S, B> Service<Request<B>> for InboundDeadline<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = future::ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.config.deadline_of(req.headers()) {
            Some(at) => {
                let scope = Deadline(at);
                let fut = scope.sync_scope(|| self.inner.call(req));
                future::ResponseFuture::scoped(scope.scope(fut))
            }
            None => future::ResponseFuture::plain(self.inner.call(req)),
        }
    }
}

pub mod future {
    //! The response future of [`InboundDeadline`](super::InboundDeadline).

    use super::*;

    pin_project! {
        /// The response future of
        /// [`InboundDeadline`](super::InboundDeadline): the handler's
        /// future, run under the inbound deadline when there is one.
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            kind: Kind<F>,
        }
    }

    pin_project! {
        #[project = KindProj]
        enum Kind<F> {
            Scoped { #[pin] fut: DeadlineScope<F> },
            Plain { #[pin] fut: F },
        }
    }

    impl<F> ResponseFuture<F> {
        pub(super) fn scoped(fut: DeadlineScope<F>) -> Self {
            ResponseFuture {
                kind: Kind::Scoped { fut },
            }
        }

        pub(super) fn plain(fut: F) -> Self {
            ResponseFuture {
                kind: Kind::Plain { fut },
            }
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let scoped = matches!(self.kind, Kind::Scoped { .. });
            f.debug_struct("ResponseFuture")
                .field("scoped", &scoped)
                .finish()
        }
    }

    impl<F: Future> Future for ResponseFuture<F> {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().kind.project() {
                KindProj::Scoped { fut } => fut.poll(cx),
                KindProj::Plain { fut } => fut.poll(cx),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn hv(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    #[test]
    fn encode_never_rounds_up() {
        for nanos in [
            0u64,
            1,
            99_999_999,
            100_000_000,
            299_999_999,
            1_000_000_000_000,
            u64::MAX,
        ] {
            let d = Duration::from_nanos(nanos);
            let v = encode_grpc_timeout(d);
            let back = parse_grpc_timeout(&v).unwrap();
            assert!(back <= d, "{nanos} -> {v:?}");
            assert!(v.len() <= MAX_DIGITS + 1, "{v:?}");
        }
        assert_eq!(
            encode_grpc_timeout(Duration::from_nanos(299_999_999)),
            "299999u"
        );
        assert_eq!(encode_grpc_timeout(Duration::MAX), "99999999H");
    }

    #[test]
    fn parse_units_and_garbage() {
        assert_eq!(
            parse_grpc_timeout(&hv("1H")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            parse_grpc_timeout(&hv("2M")),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_grpc_timeout(&hv("7u")),
            Some(Duration::from_micros(7))
        );
        assert_eq!(
            parse_grpc_timeout(&hv("99999999H")),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        for bad in ["", "H", "12345678 m", "123456789n", "+5S", "5x", "五S"] {
            let v = HeaderValue::from_bytes(bad.as_bytes()).unwrap();
            assert_eq!(parse_grpc_timeout(&v), None, "{bad:?}");
        }
        assert_eq!(parse_millis(&hv("250")), Some(Duration::from_millis(250)));
        assert_eq!(parse_millis(&hv("-1")), None);
        assert_eq!(parse_millis(&hv("1234567890123")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn propagate_writes_time_left() {
        let svc = PropagateDeadlineLayer::new()
            .header(HeaderName::from_static("x-budget-ms"))
            .layer(tower::service_fn(|req: Request<()>| async move {
                Ok::<_, std::convert::Infallible>(req.headers().clone())
            }));
        let grpc = |timeout: Option<&'static str>| {
            let mut b = Request::post("/a.A/M").header("content-type", "application/grpc");
            if let Some(t) = timeout {
                b = b.header("grpc-timeout", t);
            }
            b.body(()).unwrap()
        };
        // No deadline: nothing written.
        let h = svc.clone().oneshot(grpc(None)).await.unwrap();
        assert!(h.get("grpc-timeout").is_none() && h.get("x-budget-ms").is_none());

        let at = Instant::now() + Duration::from_millis(300);
        let h = Deadline(at)
            .scope(svc.clone().oneshot(grpc(None)))
            .await
            .unwrap();
        assert_eq!(h["grpc-timeout"], "300000u");
        assert_eq!(h["x-budget-ms"], "300");
        // The caller's shorter timeout is kept; a longer one is lowered.
        let h = Deadline(at)
            .scope(svc.clone().oneshot(grpc(Some("100m"))))
            .await
            .unwrap();
        assert_eq!(h["grpc-timeout"], "100m");
        let h = Deadline(at)
            .scope(svc.clone().oneshot(grpc(Some("5S"))))
            .await
            .unwrap();
        assert_eq!(h["grpc-timeout"], "300000u");
        // Set twice: the smallest valid value, sent once, in either order.
        for pair in [
            ["5S", "100m"],
            ["100m", "5S"],
            ["abc", "100m"],
            ["5S", "10S"],
        ] {
            let mut req = grpc(Some(pair[0]));
            req.headers_mut()
                .append(GRPC_TIMEOUT, HeaderValue::from_static(pair[1]));
            let h = Deadline(at).scope(svc.clone().oneshot(req)).await.unwrap();
            let sent: Vec<_> = h.get_all(GRPC_TIMEOUT).iter().collect();
            let want = if pair.contains(&"100m") {
                "100m"
            } else {
                "300000u"
            };
            assert_eq!(sent, [want], "{pair:?}");
        }
        // Later, less is left.
        tokio::time::advance(Duration::from_millis(200)).await;
        let h = Deadline(at)
            .scope(svc.clone().oneshot(grpc(None)))
            .await
            .unwrap();
        assert_eq!(h["grpc-timeout"], "100000u");
        // Plain HTTP: only the budget header.
        let plain = Request::get("/x").body(()).unwrap();
        let h = Deadline(at)
            .scope(svc.clone().oneshot(plain))
            .await
            .unwrap();
        assert!(h.get("grpc-timeout").is_none());
        assert_eq!(h["x-budget-ms"], "100");
    }

    #[tokio::test(start_paused = true)]
    async fn inbound_scopes_the_handler() {
        let svc = InboundDeadlineLayer::new()
            .header(HeaderName::from_static("x-budget-ms"))
            .layer(tower::service_fn(|_req: Request<()>| async move {
                Ok::<_, std::convert::Infallible>(Deadline::current())
            }));
        let call = |headers: &[(&'static str, &'static str)]| {
            let mut b = Request::post("/");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            svc.clone().oneshot(b.body(()).unwrap())
        };
        let now = Instant::now();
        assert_eq!(
            call(&[("grpc-timeout", "300m")]).await.unwrap(),
            Some(now + Duration::from_millis(300))
        );
        assert_eq!(
            call(&[("grpc-timeout", "300m"), ("x-budget-ms", "100")])
                .await
                .unwrap(),
            Some(now + Duration::from_millis(100))
        );
        // Malformed or absurd: ignored, never zero.
        for bad in ["abc", "300", "123456789m", ""] {
            assert_eq!(
                call(&[("grpc-timeout", bad)]).await.unwrap(),
                None,
                "{bad:?}"
            );
        }
        assert_eq!(call(&[("x-budget-ms", "soon")]).await.unwrap(), None);
        // A header sent twice: the smaller value, in either order; a
        // malformed one beside a valid one is ignored.
        for pair in [
            ["100H", "50m"],
            ["50m", "100H"],
            ["abc", "50m"],
            ["50m", "abc"],
        ] {
            let headers = [("grpc-timeout", pair[0]), ("grpc-timeout", pair[1])];
            assert_eq!(
                call(&headers).await.unwrap(),
                Some(now + Duration::from_millis(50)),
                "{pair:?}"
            );
        }
        assert_eq!(
            call(&[("x-budget-ms", "900"), ("x-budget-ms", "70")])
                .await
                .unwrap(),
            Some(now + Duration::from_millis(70))
        );
        assert_eq!(call(&[]).await.unwrap(), None);
        // The cap.
        let capped = InboundDeadlineLayer::new().max(Duration::from_secs(1));
        let mut h = HeaderMap::new();
        h.insert(GRPC_TIMEOUT, hv("99999999H"));
        assert_eq!(capped.deadline_of(&h), Some(now + Duration::from_secs(1)));
        // An enclosing, earlier deadline wins (a scope never extends).
        let earlier = now + Duration::from_millis(50);
        let got = Deadline(earlier)
            .scope(call(&[("grpc-timeout", "1S")]))
            .await
            .unwrap();
        assert_eq!(got, Some(earlier));
    }
}
