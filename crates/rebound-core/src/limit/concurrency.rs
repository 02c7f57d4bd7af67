//! A concurrency limit for logical requests that holds its permit until the
//! response body ends.
//!
//! [`ConcurrencyLimitLayer`] caps how many requests are in flight. Unlike
//! tower's `ConcurrencyLimit` (which lets go of its permit when the response
//! head arrives, so streamed bodies escape the limit), the permit here is
//! held **until the response body ends, fails or is dropped**: the response
//! body is wrapped in a [`LimitBody`] that carries it.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use rebound_core::annotations::Deadline;
//! use rebound_core::limit::{ConcurrencyLimitLayer, ConcurrencyLimiter};
//! use rebound_core::{ErrorKind, TimeoutStage};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let limiter = ConcurrencyLimiter::new(1).max_queue(10);
//! let svc = ServiceBuilder::new()
//!     .layer(ConcurrencyLimitLayer::with_limiter(limiter))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"body"))))
//!     }));
//!
//! // The first response holds the only permit while its body is unread...
//! let first = svc.clone().oneshot(http::Request::new(())).await?;
//!
//! // ...so a second request queues, until its deadline.
//! let mut req = http::Request::new(());
//! req.extensions_mut()
//!     .insert(Deadline(tokio::time::Instant::now() + Duration::from_secs(1)));
//! let err = svc.clone().oneshot(req).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
//!
//! drop(first); // dropping the body gives the permit back
//! svc.oneshot(http::Request::new(())).await?;
//! # Ok(())
//! # }
//! ```
//!
//! * `poll_ready` passes through; the permit is taken **inside the response
//!   future**, from a FIFO queue (`tokio::sync::Semaphore`), so the wait is
//!   bounded by the request's [`Deadline`] and dropping the future leaves the
//!   queue at once. With [`ConcurrencyLimitLayer::backpressure`] the permit
//!   is reserved in `poll_ready` instead, as tower's limit does (see the
//!   [`limit` module docs](super#backpressure)).
//! * A free permit is taken without allocating (`try_acquire_owned`); only a
//!   request that has to queue pays for a boxed wait.
//! * An optional maximum queue length ([`ConcurrencyLimiter::max_queue`])
//!   turns queueing into a fast failure past it.
//! * One [`ConcurrencyLimiter`] can be shared (`Arc`) by several layers or
//!   clients ([`ConcurrencyLimitLayer::shared`]), and observed
//!   ([`available`](ConcurrencyLimiter::available),
//!   [`in_flight`](ConcurrencyLimiter::in_flight),
//!   [`queued`](ConcurrencyLimiter::queued)).
//!
//! In the ready-made stack it sits above the retry layer, so one logical
//! request holds one permit across all its attempts and backoff sleeps. A
//! client-wide limit must not be held while a request waits for one host:
//! the ready-made stack puts a holding Retry-After gate
//! ([`RetryAfterGateLayer::closes_gates`](crate::gate::RetryAfterGateLayer::closes_gates))
//! above it, so new requests to a throttled host wait there without a
//! permit (see [`crate::gate`], "Where it sits"). A request that had to
//! queue for its permit (and so may meet a gate that closed meanwhile)
//! carries it down as a [`PermitLease`]: a layer below that waits for one
//! host gives it back while it waits, and takes it again before going on.
//! The permit comes back to this layer with the response (and its body
//! holds it as usual), or when the request is dropped. A request that got
//! its permit at once carries no lease: nothing on the happy path.
//!
//! # Errors
//!
//! * [`ErrorKind::Rejected`] when the queue is full (not retryable: the
//!   error carries a `Fatal` [`Verdict`]).
//! * [`ErrorKind::Timeout`]`(`[`TimeoutStage::Deadline`]`)` when the
//!   request's deadline passes while it waits for a permit.
//! * Errors of the inner service, turned into [`Error`] with
//!   [`Error::from_boxed`]; the permit is released at once.
//!
//! All errors made here name the request (method and redacted URL).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tower_layer::Layer;
use tower_service::Service;

use super::{wait_permit, Reservation, WaitPermit};
use crate::annotations::{Deadline, LimiterState, PermitLease, Reason, Verdict};
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};
use crate::wait::{take_ready, Wait, WaitThenCall};

// === impl ConcurrencyLimiter ===

/// The shared state of a concurrency limit: a FIFO semaphore of `max`
/// permits and a count of waiters.
///
/// Share one limiter between several layers or clients with
/// [`ConcurrencyLimitLayer::shared`]; observe it with
/// [`available`](Self::available), [`in_flight`](Self::in_flight) and
/// [`queued`](Self::queued).
pub struct ConcurrencyLimiter {
    semaphore: Arc<Semaphore>,
    max: usize,
    max_queue: Option<usize>,
    queued: AtomicUsize,
}

impl ConcurrencyLimiter {
    /// A limiter with `max` permits and an unbounded queue.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(max: usize) -> Self {
        crate::config::expect_valid("ConcurrencyLimiter::new", Self::try_new(max))
    }

    /// A limiter with `max` permits and an unbounded queue.
    ///
    /// # Errors
    ///
    /// A [`Config`](ErrorKind::Config) error if `max` is zero (every request
    /// would wait forever) or larger than the semaphore can hold.
    pub fn try_new(max: usize) -> Result<Self, Error> {
        if max == 0 {
            return Err(Error::config(
                "concurrency limit must be at least 1 (0 would block every request)",
            ));
        }
        if max > Semaphore::MAX_PERMITS {
            return Err(Error::config(format!(
                "concurrency limit {max} is larger than the maximum of {}",
                Semaphore::MAX_PERMITS
            )));
        }
        Ok(ConcurrencyLimiter {
            semaphore: Arc::new(Semaphore::new(max)),
            max,
            max_queue: None,
            queued: AtomicUsize::new(0),
        })
    }

    /// Fail fast with [`ErrorKind::Rejected`] instead of queueing when
    /// `max_queue` requests are already waiting for a permit. `0` means
    /// "never queue".
    ///
    /// Default is no bound (the wait is bounded only by each request's
    /// [`Deadline`]).
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.max_queue = Some(max_queue);
        self
    }

    /// The maximum number of permits.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Permits free right now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits()
    }

    /// Permits held right now: requests in flight, counting those whose
    /// response body is still being read, and a permit just handed to the
    /// oldest waiter that has not run yet.
    pub fn in_flight(&self) -> usize {
        self.max.saturating_sub(self.available())
    }

    /// Requests waiting for a permit right now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// The state as a [`LimiterState`] annotation.
    fn state(&self) -> LimiterState {
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        LimiterState {
            limiter: "concurrency",
            limit: clamp(self.max),
            in_flight: clamp(self.in_flight()),
            queued: clamp(self.queued()),
        }
    }

    /// Take a place in the queue, unless it is full.
    fn enter_queue(self: &Arc<Self>) -> Option<QueueSlot> {
        let entered = match self.max_queue {
            None => {
                self.queued.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(max) => self
                .queued
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok(),
        };
        entered.then(|| QueueSlot(self.clone()))
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("max", &self.max)
            .field("max_queue", &self.max_queue)
            .field("available", &self.available())
            .field("queued", &self.queued())
            .finish()
    }
}

/// A place in the queue; leaving it (permit granted, deadline, drop) gives it
/// back.
struct QueueSlot(Arc<ConcurrencyLimiter>);

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

// === impl ConcurrencyLimitLayer ===

/// Caps logical requests in flight; holds each permit until the response
/// body ends or is dropped.
///
/// See the [module docs](self) for an example, and
/// [`backpressure`](Self::backpressure) for a limit that `poll_ready`
/// reports.
///
/// # Clone
///
/// Clones share the same [`ConcurrencyLimiter`].
#[derive(Clone, Debug)]
pub struct ConcurrencyLimitLayer {
    limiter: Arc<ConcurrencyLimiter>,
    backpressure: bool,
}

impl ConcurrencyLimitLayer {
    /// A limit of `max` requests in flight, with an unbounded queue.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(max: usize) -> Self {
        crate::config::expect_valid("ConcurrencyLimitLayer::new", Self::try_new(max))
    }

    /// A limit of `max` requests in flight, with an unbounded queue.
    ///
    /// # Errors
    ///
    /// See [`ConcurrencyLimiter::new`].
    pub fn try_new(max: usize) -> Result<Self, Error> {
        Ok(Self::with_limiter(ConcurrencyLimiter::try_new(max)?))
    }

    /// A layer over `limiter` (e.g. one with a [`max_queue`](ConcurrencyLimiter::max_queue)).
    pub fn with_limiter(limiter: ConcurrencyLimiter) -> Self {
        Self::shared(Arc::new(limiter))
    }

    /// A layer over a limiter shared with other layers or clients: all of
    /// them together stay under its limit.
    pub fn shared(limiter: Arc<ConcurrencyLimiter>) -> Self {
        ConcurrencyLimitLayer {
            limiter,
            backpressure: false,
        }
    }

    /// Whether the service reports "no capacity" from `poll_ready`
    /// (`true`), as tower's `ConcurrencyLimit` does, so that tower's
    /// `LoadShed` above it sheds and a `Buffer` above it stops taking
    /// requests; see the [`limit` module docs](super#backpressure). Default is
    /// `false`: `poll_ready` passes through and requests wait for their
    /// permit in the response future, bounded by their deadline.
    pub fn backpressure(mut self, enabled: bool) -> Self {
        self.backpressure = enabled;
        self
    }

    /// The limiter, to observe or to share.
    pub fn limiter(&self) -> &Arc<ConcurrencyLimiter> {
        &self.limiter
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::new(inner, self.limiter.clone()).backpressure(self.backpressure)
    }
}

// === impl ConcurrencyLimit ===

/// The service of [`ConcurrencyLimitLayer`].
///
/// See the [module docs](self).
///
/// # Clone
///
/// Clones share the same [`ConcurrencyLimiter`]. A clone starts without
/// the permit a [backpressure](ConcurrencyLimitLayer::backpressure)
/// `poll_ready` may have reserved: it reserves its own.
#[derive(Clone, Debug)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    limiter: Arc<ConcurrencyLimiter>,
    /// With backpressure: the permit `poll_ready` reserves for `call`.
    reservation: Reservation,
}

impl<S> ConcurrencyLimit<S> {
    /// Wrap `inner` with the limit of `limiter`.
    pub fn new(inner: S, limiter: Arc<ConcurrencyLimiter>) -> Self {
        ConcurrencyLimit {
            inner,
            limiter,
            reservation: Reservation::off(),
        }
    }

    /// See [`ConcurrencyLimitLayer::backpressure`].
    pub fn backpressure(mut self, enabled: bool) -> Self {
        self.reservation = Reservation::new(&self.limiter.semaphore, enabled);
        self
    }

    /// The limiter, to observe or to share.
    pub fn limiter(&self) -> &Arc<ConcurrencyLimiter> {
        &self.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for ConcurrencyLimit<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    ResB: Body,
{
    type Response = Response<LimitBody<ResB>>;
    type Error = Error;
    type Future = ResponseFuture<S, Request<ReqB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Default: no reservation here; waiting happens in the response
        // future, where the deadline bounds it and dropping cancels it.
        // With backpressure: reserve a permit first (FIFO; the waker is
        // registered in the semaphore's queue), as tower's limit does.
        ready!(self.reservation.poll_reserve(cx));
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        if let Some((permit, waited)) = self.reservation.take() {
            // Backpressure: the permit reserved by `poll_ready`.
            let held = if waited {
                let lease = lend(&self.limiter, permit, &mut req);
                let fut = self.inner.call(req);
                let held = Held {
                    permit: None,
                    lease: Some(lease),
                    observed: Some(self.limiter.state()),
                };
                WaitThenCall::called(fut, held)
            } else {
                WaitThenCall::called(self.inner.call(req), Held::at_once(permit))
            };
            return ResponseFuture { inner: held };
        }
        // Without a reserved permit (the default, or a `call` that came
        // without `poll_ready`): take a free one, or wait in the future.
        let inner = match self.limiter.semaphore.clone().try_acquire_owned() {
            // Happy path: a free permit (the semaphore hands released permits
            // to waiters first, so this never jumps the queue).
            Ok(permit) => WaitThenCall::called(self.inner.call(req), Held::at_once(permit)),
            Err(TryAcquireError::NoPermits) => match self.limiter.enter_queue() {
                Some(slot) => {
                    let wait = Queued {
                        wait: wait_permit(
                            self.limiter.semaphore.clone(),
                            Deadline::of(req.extensions()),
                        ),
                        slot: Some(slot),
                        limiter: None,
                    };
                    // The inner service was made ready for this request:
                    // take it along, leave a clone for the next poll_ready.
                    WaitThenCall::waiting(wait, take_ready(&mut self.inner), req)
                }
                None => WaitThenCall::failed(rejected(&req, "queue full")),
            },
            // rebound never closes the semaphore.
            Err(TryAcquireError::Closed) => WaitThenCall::failed(rejected(&req, "limiter closed")),
        };
        ResponseFuture { inner }
    }
}

fn rejected<B>(req: &Request<B>, detail: &'static str) -> Error {
    let mut err = Error::new(ErrorKind::Rejected)
        .with_detail(detail)
        .with_request(req.method(), req.uri());
    err.extensions_mut().insert(Verdict::Fatal {
        reason: Reason::new_static("rejected by the concurrency limiter"),
    });
    err
}

fn deadline_while_queued<B>(req: &Request<B>) -> Error {
    let mut err = Error::timeout(TimeoutStage::Deadline)
        .with_detail("while waiting for a concurrency permit")
        .with_request(req.method(), req.uri());
    err.extensions_mut().insert(Verdict::Fatal {
        reason: Reason::new_static("deadline passed while queued"),
    });
    err
}

/// Off the happy path only (this request had to wait for its permit): the
/// permit is lent to the layers below, so that one that waits for one host
/// (the Retry-After gate, which may have closed meanwhile) can give it back
/// while it waits.
fn lend<B>(
    limiter: &ConcurrencyLimiter,
    permit: OwnedSemaphorePermit,
    req: &mut Request<B>,
) -> OwnedLease {
    let lease = OwnedLease(PermitLease::new(limiter.semaphore.clone(), permit));
    req.extensions_mut().insert(lease.0.clone());
    lease
}

/// The owner's handle on a lent permit: dropping it (the request was
/// cancelled) takes the permit back out of the lease, so a clone left in
/// some request's extensions below never keeps it.
struct OwnedLease(PermitLease);

impl Drop for OwnedLease {
    fn drop(&mut self) {
        drop(self.0.take());
    }
}

/// What a called request holds until its outcome: its permit, or the lease
/// it lent it through, and the limiter's state when it had to wait.
struct Held {
    permit: Option<OwnedSemaphorePermit>,
    // The permit lent to the layers below (waiting requests only).
    lease: Option<OwnedLease>,
    observed: Option<LimiterState>,
}

impl Held {
    /// The happy path: a permit taken at once; no lease, no annotation.
    fn at_once(permit: OwnedSemaphorePermit) -> Self {
        Held {
            permit: Some(permit),
            lease: None,
            observed: None,
        }
    }
}

/// The wait of a request that found no free permit: its place in the FIFO
/// queue, until the permit or the deadline.
struct Queued {
    wait: WaitPermit,
    slot: Option<QueueSlot>,
    // The limiter, once out of the queue, to show its state.
    limiter: Option<Arc<ConcurrencyLimiter>>,
}

impl Wait for Queued {
    type Held = Held;

    fn name(&self) -> &'static str {
        "queued"
    }

    fn closed_detail(&self) -> &'static str {
        "shut down while queued for a concurrency permit"
    }

    fn poll_wait<B>(
        &mut self,
        cx: &mut Context<'_>,
        req: &mut Request<B>,
    ) -> Poll<Result<Held, Error>> {
        let permit = ready!(self.wait.as_mut().poll(cx));
        // Out of the queue either way.
        let limiter = self.slot.take().map(|s| s.0.clone());
        let Some(permit) = permit else {
            return Poll::Ready(Err(deadline_while_queued(req)));
        };
        let lease = limiter.as_ref().map(|l| lend(l, permit, req));
        self.limiter = limiter;
        Poll::Ready(Ok(Held {
            permit: None,
            lease,
            observed: None,
        }))
    }

    fn called(&mut self, held: &mut Held) {
        // The outcome shows the limiter's state.
        held.observed = self.limiter.as_ref().map(|l| l.state());
    }
}

// === impl ResponseFuture ===

pin_project! {
    /// The response future of [`ConcurrencyLimit`]: waits for a permit (if
    /// none was free), then calls the inner service.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, R>
    where
        S: Service<R>,
    {
        #[pin]
        inner: WaitThenCall<Queued, S, R>,
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
    ResB: Body,
{
    type Output = Result<Response<LimitBody<ResB>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (out, mut held) = match ready!(self.project().inner.poll(cx)) {
            Ok(called) => called,
            Err(waited) => return Poll::Ready(Err(waited)),
        };
        // A lent permit comes back to the request: the body holds it from
        // here (later clones of the lease hold nothing).
        let permit = match held.permit.take() {
            Some(permit) => Some(permit),
            None => held.lease.take().and_then(|l| l.0.take()),
        };
        Poll::Ready(match out {
            Ok(mut res) => {
                if let Some(state) = held.observed.take() {
                    res.extensions_mut().insert(state);
                }
                Ok(res.map(|body| LimitBody::new(body, permit)))
            }
            Err(mut err) => {
                // An error outcome gives the permit back at once.
                drop(permit);
                if let Some(state) = held.observed.take() {
                    err.extensions_mut().insert(state);
                }
                Err(err)
            }
        })
    }
}

// === impl LimitBody ===

pin_project! {
    /// A response body that holds a concurrency permit until it ends (end of
    /// stream or an error) or is dropped.
    ///
    /// Frames, errors, size hints and trailers pass through unchanged.
    pub struct LimitBody<B> {
        #[pin]
        inner: B,
        permit: Option<OwnedSemaphorePermit>,
    }
}

impl<B: Body> LimitBody<B> {
    fn new(inner: B, permit: Option<OwnedSemaphorePermit>) -> Self {
        // A body that is already over (HEAD, 204, empty) holds nothing.
        let permit = if inner.is_end_stream() { None } else { permit };
        LimitBody { inner, permit }
    }
}

impl<B> LimitBody<B> {
    /// Whether this body still holds its permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The wrapped body, giving the permit back.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> fmt::Debug for LimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitBody")
            .field("holds_permit", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for LimitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let over = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if over {
            drop(this.permit.take());
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

// === the limit's engine, for the whole-stack service ===

#[cfg(feature = "stack")]
impl ConcurrencyLimiter {
    /// A free permit now (the happy path), if any.
    pub(crate) fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.semaphore.clone().try_acquire_owned().ok()
    }

    /// The slow path: a place in the FIFO queue, then the permit, by
    /// `deadline` at the latest; the errors [`ConcurrencyLimit`] gives
    /// (queue full, deadline while queued), naming `name`. Boxed: only a
    /// request that found no free permit waits.
    pub(crate) fn wait_permit(
        self: &Arc<Self>,
        deadline: Option<tokio::time::Instant>,
        name: crate::redact::RequestName,
    ) -> Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, Error>> + Send>> {
        let Some(slot) = self.enter_queue() else {
            let mut err = name.name(Error::new(ErrorKind::Rejected).with_detail("queue full"));
            err.extensions_mut().insert(Verdict::Fatal {
                reason: Reason::new_static("rejected by the concurrency limiter"),
            });
            return Box::pin(std::future::ready(Err(err)));
        };
        let wait = super::wait_permit(self.semaphore.clone(), deadline);
        Box::pin(async move {
            let permit = wait.await;
            drop(slot);
            permit.ok_or_else(|| {
                let mut err = name.name(
                    Error::timeout(TimeoutStage::Deadline)
                        .with_detail("while waiting for a concurrency permit"),
                );
                err.extensions_mut().insert(Verdict::Fatal {
                    reason: Reason::new_static("deadline passed while queued"),
                });
                err
            })
        })
    }

    /// This limiter's state, for the outcome of a request that waited.
    pub(crate) fn observed(&self) -> LimiterState {
        self.state()
    }
}
