//! The Retry-After gate: when a server says the client is sending too much,
//! hold new requests to it until the pause is over.
//!
//! [`RetryAfterGateLayer`] remembers, per authority, a server's "come back
//! later" and holds or refuses new requests to that authority until then.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use rebound_core::annotations::RetryAfterHint;
//! use rebound_core::gate::RetryAfterGateLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let svc = ServiceBuilder::new()
//!     .layer(RetryAfterGateLayer::new())
//!     .service(service_fn(|req: http::Request<()>| async move {
//!         let mut res = http::Response::new(());
//!         if req.uri().path() == "/busy" {
//!             // What the Retry-After layer would leave on a 429.
//!             *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
//!             res.extensions_mut().insert(RetryAfterHint(Duration::from_secs(2)));
//!         }
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let start = Instant::now();
//! let busy = http::Request::get("http://api.example/busy").body(()).unwrap();
//! svc.clone().oneshot(busy).await?;
//!
//! // The next request to api.example waits for the pause to end...
//! let next = http::Request::get("http://api.example/other").body(()).unwrap();
//! svc.clone().oneshot(next).await?;
//! assert!(start.elapsed() >= Duration::from_secs(2));
//!
//! // ...but another host never waits.
//! let t = Instant::now();
//! let elsewhere = http::Request::get("http://other.example/").body(()).unwrap();
//! svc.oneshot(elsewhere).await?;
//! assert_eq!(t.elapsed(), Duration::ZERO);
//! # Ok(())
//! # }
//! ```
//!
//! # Scope: which responses close which gate, for how long
//!
//! * **Status.** A **429** response carrying a [`RetryAfterHint`] (written
//!   by the Retry-After layer below) closes the gate: a rate limit is about
//!   the client, so every request of the client to that host is held.
//!   A **503** does **not** close it by default: a 503 is about one
//!   endpoint's health, and its Retry-After paces only the request that
//!   received it (its own retry waits the hint, through the backoff and
//!   retry layers), so one failing endpoint does not hold the healthy
//!   endpoints of its host. [`RetryAfterGateLayer::close_on_503`] makes a
//!   503 close the host's gate too. A response without a hint, or with a
//!   zero hint, never closes it.
//! * **Host.** The gate is per **authority**: scheme, lower-cased host and
//!   effective port; userinfo, path and query play no part. Other
//!   authorities are never held.
//! * **Duration.** Until `now + hint`. The hint is already capped by the
//!   Retry-After layer (its `max_delay`, 60 s by default in the ready-made
//!   client), so no server can close a gate for longer than the cap. A
//!   later, longer pause extends a closed gate; a shorter one never
//!   shortens it.
//!
//! While a gate is closed, requests to that authority, by [`GateMode`]:
//!
//! * [`GateMode::Wait`] (the default): wait in the response future until it
//!   opens — bounded by their [`Deadline`]: a request whose deadline comes
//!   before the gate opens fails at once with [`ErrorKind::Throttled`];
//! * [`GateMode::FailFast`]: fail at once with [`ErrorKind::Throttled`];
//! * [`GateMode::Off`]: no gate at all: nothing is held, nothing is closed,
//!   and a request costs one branch (no hash, no clock read).
//!
//! The inner service sees none of the held requests during the pause. The
//! gates live in a bounded [`GateTable`], a [host table](crate::host) whose
//! entries a circuit breaker may share (one entry per host for its gate and
//! its circuit; the ready-made client shares one): a host gets an entry
//! when its gate closes, and the entry is released once the gate has opened
//! (when a request meets it, or in a sweep), unless its circuit still has
//! something to remember. A host may take one of four entries; when they
//! are all in use, a closing gate evicts the entry due for release soonest
//! (e.g. the gate that opens soonest), an open circuit last.
//!
//! # Where it sits
//!
//! Below the retry layer, so that retries respect the pause too, and above
//! the Retry-After layer, whose hint it reads on the way up; above the
//! adaptive limit, so a request waiting at the gate holds no attempt slot:
//!
//! ```text
//! Retry ─► Backoff ─► RetryAfterGate ─► AdaptiveLimit ─► RetryAfter ─► Classify ─► ...
//! ```
//!
//! A stack with a client-wide concurrency limit above the retry layer adds
//! a second gate over the same [`GateTable`] **above that limit**, built
//! with [`closes_gates(false)`](RetryAfterGateLayer::closes_gates): new
//! requests to a closed host then wait there, holding no permit that
//! requests to other hosts need (DESIGN.md §10, "Order that isolates
//! faults"); the lower gate closes the gate as each attempt's response
//! passes it and holds the retries. The ready-made client is built so.
//! A request that queued for its permit while the gate closed carries the
//! permit as a [`PermitLease`]: a gate that holds it gives the permit back
//! while it waits and takes it again (FIFO, bounded by the deadline; the
//! [`Deadline`] error says so if it cannot) before the request goes on.
//!
//! A retry that already sleeps the Retry-After (the backoff layer proposes
//! the hint as the delay) reaches the gate after it opened — the gate closed
//! when the response passed it, before the retry started to sleep — so it
//! does not wait twice. A retry whose delay is shorter than the hint (e.g. a
//! capped hint) waits at the gate for the rest of the pause. Requests that
//! were already past the gate when it closed are not recalled.
//!
//! # Happy path
//!
//! While no entry of the table is in use (no gate closed, and, in a table
//! shared with a breaker, no host failing), a request costs one atomic
//! load: no hash, no clock read, no lock. A gate that closes gates keeps
//! the request's scheme and authority in its response future (a reference
//! count, no allocation) and hashes them only if the response asks for a
//! pause. [`GateMode::Off`] costs one branch. While the table is in use, a
//! request hashes its authority once and reads its entry's gate (one
//! atomic load): no lock either way.
//!
//! # Errors
//!
//! [`ErrorKind::Throttled`] (fail-fast mode, or a deadline before the gate
//! opens), naming the request, carrying a `Fatal` [`Verdict`] and a
//! [`RetryAfterHint`] with the time left until the gate opens. Errors of the
//! inner service are turned into [`Error`] with [`Error::from_boxed`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Deadline, GateWait, PermitLease, Reason, RetryAfterHint, Verdict};
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};
use crate::host::HostOwned;
use crate::host::HostTable;
use crate::wait::{take_ready, Wait, WaitThenCall};

/// What a request does when its authority's gate is closed.
///
/// See the [module docs](self) for the scope of a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GateMode {
    /// Wait until the gate opens, bounded by the request's deadline.
    #[default]
    Wait,
    /// Fail at once with [`ErrorKind::Throttled`].
    FailFast,
    /// No gate: requests are never held and responses never close a gate.
    /// The layer is a pass-through costing one branch per request.
    Off,
}

// === GateTable ===

/// The closed gates, per authority: the [`HostTable`], whose entries hold
/// each host's gate (and, when a circuit breaker shares the table, its
/// circuit); bounded. Share one between layers or clients with
/// [`RetryAfterGateLayer::shared`].
///
/// [`len`](HostTable::len) counts the hosts whose entry is in use (a
/// closed gate, or a circuit with something to remember).
pub type GateTable = HostTable;

// === impl RetryAfterGateLayer ===

/// Holds new requests to an authority that answered 429 with a Retry-After
/// (and, with [`close_on_503`](Self::close_on_503), 503), until the pause is
/// over.
///
/// Defaults: [`GateMode::Wait`], 429 only, closes gates, a table of
/// [`GateTable::DEFAULT_MAX_ENTRIES`]. See the [module docs](self) for an
/// example, the scope of a gate and where it sits.
///
/// # Clone
///
/// Clones share the same [`GateTable`].
#[derive(Clone, Debug)]
pub struct RetryAfterGateLayer {
    table: Arc<GateTable>,
    config: Config,
}

/// What a gate does, shared by the layer and its service.
#[derive(Clone, Copy, Debug)]
struct Config {
    mode: GateMode,
    close_on_503: bool,
    closes: bool,
}

impl RetryAfterGateLayer {
    /// A gate in [`GateMode::Wait`] with its own table of
    /// [`GateTable::DEFAULT_MAX_ENTRIES`] entries.
    pub fn new() -> Self {
        Self::shared(Arc::new(GateTable::default()))
    }

    /// A gate over a table shared with other layers or clients.
    pub fn shared(table: Arc<GateTable>) -> Self {
        RetryAfterGateLayer {
            table,
            config: Config {
                mode: GateMode::Wait,
                close_on_503: false,
                closes: true,
            },
        }
    }

    /// What requests do while their gate is closed, or [`GateMode::Off`]
    /// for no gate. Default is [`GateMode::Wait`].
    pub fn mode(mut self, mode: GateMode) -> Self {
        self.config.mode = mode;
        self
    }

    /// Whether a 503 with a Retry-After closes its host's gate, as a 429
    /// does. Default is `false`: a 503's Retry-After paces only the request
    /// that received it (its own retry), so one failing endpoint does not
    /// hold the healthy endpoints of the same host.
    pub fn close_on_503(mut self, enabled: bool) -> Self {
        self.config.close_on_503 = enabled;
        self
    }

    /// Whether this gate closes gates when a response asks for a pause
    /// (`true`, the default), or only holds requests at gates closed by
    /// others over the same table (`false`: a gate placed above a
    /// client-wide limit, paired with a closing gate below the retry
    /// layer; see the [module docs](self#where-it-sits)). No gate hashes
    /// the authority while the table is idle.
    pub fn closes_gates(mut self, enabled: bool) -> Self {
        self.config.closes = enabled;
        self
    }

    /// Shorthand for `.mode(GateMode::FailFast)`.
    pub fn fail_fast(self) -> Self {
        self.mode(GateMode::FailFast)
    }

    /// The table of closed gates, to observe or to share.
    pub fn table(&self) -> &Arc<GateTable> {
        &self.table
    }
}

impl Default for RetryAfterGateLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for RetryAfterGateLayer {
    type Service = RetryAfterGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryAfterGate {
            inner,
            table: self.table.clone(),
            config: self.config,
        }
    }
}

// === impl RetryAfterGate ===

/// The service of [`RetryAfterGateLayer`].
///
/// See the [module docs](self).
///
/// # Clone
///
/// Clones share the same [`GateTable`].
#[derive(Clone, Debug)]
pub struct RetryAfterGate<S> {
    inner: S,
    table: Arc<GateTable>,
    config: Config,
}

impl<S> RetryAfterGate<S> {
    /// The table of closed gates.
    pub fn table(&self) -> &Arc<GateTable> {
        &self.table
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

fn throttled<B>(
    req: &Request<B>,
    until: Instant,
    now: Instant,
    detail: Option<&'static str>,
) -> Error {
    let mut err = Error::new(ErrorKind::Throttled);
    if let Some(detail) = detail {
        err = err.with_detail(detail);
    }
    let mut err = err.with_request(req.method(), req.uri());
    err.extensions_mut()
        .insert(RetryAfterHint(until.saturating_duration_since(now)));
    err.extensions_mut().insert(Verdict::Fatal {
        reason: Reason::new_static("throttled by the Retry-After gate"),
    });
    err
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for RetryAfterGate<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = ResponseFuture<S, Request<ReqB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let config = self.config;
        if config.mode == GateMode::Off {
            return ResponseFuture {
                inner: WaitThenCall::called(self.inner.call(req), ()),
                key: None,
                host: None,
                close_429: false,
                close_503: false,
                table: None,
                held_since: None,
            };
        }
        // The key is needed to look a gate up while the table is in use.
        // Happy path: an idle table, no hash, no clock read.
        let key = (!self.table.is_empty()).then(|| self.table.key(req.uri()));
        let closed = key.and_then(|key| {
            let now = Instant::now();
            self.table.check(key, now).map(|until| (until, now, key))
        });
        // A gate that closes keeps the host (a reference count, not a
        // hash) to key it only if a response asks for a pause.
        let host = (config.closes && key.is_none()).then(|| HostOwned::of(req.uri()));
        let held_since = closed.map(|(_, now, _)| now);
        let inner = match closed {
            None => WaitThenCall::called(self.inner.call(req), ()),
            Some((until, now, key)) => match config.mode {
                GateMode::FailFast | GateMode::Off => {
                    WaitThenCall::failed(throttled(&req, until, now, None))
                }
                GateMode::Wait => match Deadline::of(req.extensions()) {
                    Some(deadline) if deadline < until => WaitThenCall::failed(throttled(
                        &req,
                        until,
                        now,
                        Some("the deadline comes before the pause ends"),
                    )),
                    _ => {
                        // A client-wide permit lent by a limit above (the
                        // request queued for it while this gate closed) goes
                        // back while the request waits for this host.
                        let lease = req.extensions().get::<PermitLease>().cloned();
                        if let Some(lease) = &lease {
                            lease.release();
                        }
                        let wait = Held::Sleeping {
                            sleep: Box::pin(tokio::time::sleep_until(until)),
                            lease,
                            table: self.table.clone(),
                            key,
                        };
                        WaitThenCall::waiting(wait, take_ready(&mut self.inner), req)
                    }
                },
            },
        };
        ResponseFuture {
            inner,
            // The key goes up only when some use of it remains: to re-check
            // a gate after a wait, or to close one.
            key,
            host,
            close_429: config.closes,
            close_503: config.closes && config.close_on_503,
            table: (config.closes || held_since.is_some()).then(|| self.table.clone()),
            held_since,
        }
    }
}

// === impl ResponseFuture ===

/// The wait of a request held at a closed gate: sleep until the gate opens
/// (again, if the pause was extended meanwhile), then take back a
/// client-wide permit it gave back while it waited.
enum Held {
    Sleeping {
        sleep: Pin<Box<Sleep>>,
        // A client-wide permit given back while waiting.
        lease: Option<PermitLease>,
        table: Arc<GateTable>,
        key: u64,
    },
    Reacquiring {
        wait: Pin<Box<dyn Future<Output = bool> + Send>>,
    },
}

impl Wait for Held {
    type Held = ();

    fn poll_wait<B>(
        &mut self,
        cx: &mut Context<'_>,
        req: &mut Request<B>,
    ) -> Poll<Result<(), Error>> {
        loop {
            match self {
                Held::Sleeping {
                    sleep,
                    lease,
                    table,
                    key,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let now = Instant::now();
                    // The pause may have been extended while we slept.
                    if let Some(until) = table.check(*key, now) {
                        if Deadline::of(req.extensions()).is_some_and(|d| d < until) {
                            return Poll::Ready(Err(throttled(
                                req,
                                until,
                                now,
                                Some("the deadline comes before the pause ends"),
                            )));
                        }
                        sleep.as_mut().reset(until);
                        continue;
                    }
                    let Some(lease) = lease.take() else {
                        return Poll::Ready(Ok(()));
                    };
                    // Take the lent permit again (FIFO, bounded by the
                    // deadline) before the request goes on.
                    let wait = lease.reacquire(Deadline::of(req.extensions()));
                    *self = Held::Reacquiring { wait };
                }
                Held::Reacquiring { wait } => {
                    if ready!(wait.as_mut().poll(cx)) {
                        return Poll::Ready(Ok(()));
                    }
                    let mut error = Error::timeout(TimeoutStage::Deadline)
                        .with_detail("while waiting for a concurrency permit after a gate")
                        .with_request(req.method(), req.uri());
                    error.extensions_mut().insert(Verdict::Fatal {
                        reason: Reason::new_static("deadline passed while queued"),
                    });
                    return Poll::Ready(Err(error));
                }
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Held::Sleeping { .. } => "waiting",
            Held::Reacquiring { .. } => "reacquiring",
        }
    }

    fn closed_detail(&self) -> &'static str {
        "shut down while held at the gate"
    }
}

pin_project! {
    /// The response future of [`RetryAfterGate`]: waits for a closed gate
    /// to open, calls the inner service, and closes the gate when the
    /// response asks for a pause.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, R>
    where
        S: Service<R>,
    {
        #[pin]
        inner: WaitThenCall<Held, S, R>,
        // The authority's key, when the table was in use at the call.
        key: Option<u64>,
        // Otherwise, for a gate that closes gates, the host to key.
        host: Option<HostOwned>,
        // Which statuses close the gate on the way up.
        close_429: bool,
        close_503: bool,
        // Present when the gate closes gates, or held this request.
        table: Option<Arc<GateTable>>,
        // When a closed gate started holding this request (off the happy
        // path only): the outcome then carries a `GateWait`.
        held_since: Option<Instant>,
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
        let (mut out, ()) = match ready!(this.inner.poll(cx)) {
            Ok(called) => called,
            Err(waited) => return Poll::Ready(Err(waited)),
        };
        if let Some(since) = *this.held_since {
            // For the trace layers and metrics: how long the gate held
            // this request.
            let wait = GateWait(since.elapsed());
            match &mut out {
                Ok(res) => res.extensions_mut().insert(wait),
                Err(err) => err.extensions_mut().insert(wait),
            };
        }
        let res = out?;
        let closes = match res.status() {
            StatusCode::TOO_MANY_REQUESTS => *this.close_429,
            StatusCode::SERVICE_UNAVAILABLE => *this.close_503,
            _ => false,
        };
        let target = match this.table.as_ref() {
            Some(table) if closes => Some(table),
            _ => None,
        };
        if let Some(table) = target {
            if let Some(RetryAfterHint(pause)) = res.extensions().get() {
                // A hint too large for the clock is "no hint".
                let until = Instant::now().checked_add(*pause);
                let key = this
                    .key
                    .or_else(|| this.host.as_ref().map(|h| h.as_ref().key()));
                if let (false, Some(until), Some(key)) = (pause.is_zero(), until, key) {
                    table.close_key(key, until);
                    tracing::debug!(
                        status = res.status().as_u16(),
                        pause_ms = pause.as_millis() as u64,
                        "retry-after gate closed"
                    );
                }
            }
        }
        Poll::Ready(Ok(res))
    }
}

// ===== the gate's engine, for the whole-stack service =====

#[cfg(feature = "stack")]
impl RetryAfterGateLayer {
    /// What a request does at a closed gate.
    pub(crate) fn gate_mode(&self) -> GateMode {
        self.config.mode
    }

    /// Whether an attempt's response with `status` closes its host's gate
    /// (when it carries a hint).
    pub(crate) fn closes_on(&self, status: StatusCode) -> bool {
        let c = &self.config;
        match status {
            StatusCode::TOO_MANY_REQUESTS => c.closes && c.mode != GateMode::Off,
            StatusCode::SERVICE_UNAVAILABLE => {
                c.closes && c.close_on_503 && c.mode != GateMode::Off
            }
            _ => false,
        }
    }
}

#[cfg(feature = "stack")]
/// [`ErrorKind::Throttled`] for the request `name`: its gate is closed until
/// `until`.
pub(crate) fn throttled_named(
    name: &crate::redact::RequestName,
    until: Instant,
    now: Instant,
    detail: Option<&'static str>,
) -> Error {
    let mut err = Error::new(ErrorKind::Throttled);
    if let Some(detail) = detail {
        err = err.with_detail(detail);
    }
    let mut err = name.name(err);
    err.extensions_mut()
        .insert(RetryAfterHint(until.saturating_duration_since(now)));
    err.extensions_mut().insert(Verdict::Fatal {
        reason: Reason::new_static("throttled by the Retry-After gate"),
    });
    err
}

#[cfg(feature = "stack")]
/// The wait of a request at the closed gate of `key` (until `until`, or
/// later if the pause is extended meanwhile), bounded by `deadline`: a
/// deadline that comes before the gate opens fails it with
/// [`ErrorKind::Throttled`], as [`RetryAfterGate`] does. Boxed: off the
/// happy path.
pub(crate) fn wait_open(
    table: Arc<GateTable>,
    key: u64,
    until: Instant,
    deadline: Option<Instant>,
    name: crate::redact::RequestName,
) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send>> {
    Box::pin(async move {
        let mut until = until;
        loop {
            if deadline.is_some_and(|d| d < until) {
                return Err(throttled_named(
                    &name,
                    until,
                    Instant::now(),
                    Some("the deadline comes before the pause ends"),
                ));
            }
            tokio::time::sleep_until(until).await;
            match table.check(key, Instant::now()) {
                Some(later) => until = later,
                None => return Ok(()),
            }
        }
    })
}

#[cfg(feature = "stack")]
/// Close the gate of `key` when an attempt's response asks for a pause
/// (its [`RetryAfterHint`], not zero); what [`RetryAfterGate`]'s response
/// future does on the way up.
pub(crate) fn close_after(table: &GateTable, key: u64, status: StatusCode, ext: &http::Extensions) {
    if let Some(RetryAfterHint(pause)) = ext.get() {
        // A hint too large for the clock is "no hint".
        let until = Instant::now().checked_add(*pause);
        if let (false, Some(until)) = (pause.is_zero(), until) {
            table.close_key(key, until);
            tracing::debug!(
                status = status.as_u16(),
                pause_ms = pause.as_millis() as u64,
                "retry-after gate closed"
            );
        }
    }
}
