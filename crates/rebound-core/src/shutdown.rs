//! Graceful shutdown: refuse new requests, end the waits, give the attempts
//! in flight a grace period, then cut them, and say what happened.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use rebound_core::shutdown::{ShutdownHandle, ShutdownLayer};
//! use rebound_core::ErrorKind;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let handle = ShutdownHandle::new();
//! let svc = ServiceBuilder::new()
//!     .layer(ShutdownLayer::new(&handle))
//!     .service(service_fn(|req: http::Request<()>| async move {
//!         let slow = req.uri().path() == "/slow";
//!         let wait = if slow { 60 } else { 1 };
//!         tokio::time::sleep(Duration::from_secs(wait)).await;
//!         Ok::<_, Infallible>(http::Response::new(()))
//!     }));
//!
//! let req = |path: &str| http::Request::get(path).body(()).unwrap();
//! let fast = tokio::spawn(svc.clone().oneshot(req("/fast")));
//! let slow = tokio::spawn(svc.clone().oneshot(req("/slow")));
//! tokio::task::yield_now().await; // both are in flight
//!
//! let report = handle.shutdown(Duration::from_secs(5)).await;
//! assert_eq!((report.in_flight, report.completed, report.cancelled), (2, 1, 1));
//! assert!(fast.await.unwrap().is_ok()); // answered within the grace period
//! assert_eq!(slow.await.unwrap().unwrap_err().kind(), ErrorKind::Closed);
//!
//! // Closed for good: a new request is refused, never sent.
//! let err = svc.oneshot(req("/fast")).await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Closed);
//! // Asking again is harmless and tells the same story.
//! assert_eq!(handle.shutdown(Duration::ZERO).await, report);
//! # }
//! ```
//!
//! [`ShutdownHandle::shutdown`]`(grace)`:
//!
//! 1. **closes** the stack: from then on a request fails at once with
//!    [`ErrorKind::Closed`], marked [`Sent::NotSent`] and `Fatal` — it
//!    reaches nothing below;
//! 2. **ends the waits**: it closes the [`Closing`] signal that every request
//!    below carries in its task (like [`Deadline::scope`](crate::Deadline::scope)), so a request
//!    sleeping in the retry loop's backoff ends at once with its last real
//!    outcome ([`RetryStop::Closed`](crate::RetryStop::Closed); a response already drained comes back
//!    as a `Closed` error carrying its [`PreviousAttempt`](crate::PreviousAttempt)), and a layer
//!    that queues (a gate, a limit) can end its wait likewise; a caller
//!    waiting in this service's `poll_ready` (a limit with backpressure
//!    below) gets it ready at once, and its call is refused;
//! 3. gives the attempts **in flight** until `grace` has passed, then
//!    **cuts** the ones still running: their futures drop everything below
//!    at once (connections being made, attempts, bodies being sent) and
//!    return [`ErrorKind::Closed`] (marked `MaybeProcessed`: it may have
//!    reached the server);
//! 4. returns a [`ShutdownReport`]: how many requests were open, how many
//!    ended within the grace period, how many were cut.
//!
//! Calling it again, or from several clones of the handle at once, is
//! harmless: every call returns the first one's report (a later caller waits
//! for it). A zero grace cuts at once.
//!
//! Put the layer at the top of the stack, above everything that waits.
//!
//! # Bodies and connections
//!
//! The layer itself sees a request until its response **head** is
//! returned. A transport that streams bodies makes them count too: it
//! takes an [`OpenBody`] guard ([`ShutdownHandle::open_body`]) for each
//! response when its head arrives (only if there is a body to read: not
//! for a request still waiting for its head, which the layer counts) and
//! drops it when the body ends, so the grace period waits for
//! bodies still being read as for requests, and closes its connections on
//! [`ShutdownHandle::cut_token`], which is cancelled when the shutdown ends
//! (grace over, or nothing left open). rebound's ready-made client does
//! both: after `shutdown(grace)` returns, every pooled connection is
//! closed, and a body still being read then ends with
//! [`ErrorKind::Closed`] (counted in [`ShutdownReport::bodies_cut`]).
//!
//! # Cost
//!
//! While the stack is open, a request pays one atomic add (the open count,
//! which also says "closed"), one atomic subtract when it ends, reference
//! counts (the handle's state, the signals, the method and URI kept to name
//! a cut request — the URI's first clone allocates, which the retry and
//! trace layers pay anyway), and a task-local set per poll for the
//! [`Closing`] scope. It takes no lock until its future first returns
//! `Pending`: then it enters one of eight wait lists of the cut signal (a
//! short critical section, spread by the open count), and leaves it when it
//! ends. Waiting points look the signal up only when they wait.
//!
//! # Errors
//!
//! [`ErrorKind::Closed`], naming the request, for a request made after the
//! shutdown began or cut at its end. Errors of the inner service are turned
//! into [`Error`] with [`Error::from_boxed`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Uri};
use pin_project_lite::pin_project;
use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Closing, Reason, Sent, Verdict};
use crate::error::{BoxError, Error, ErrorKind};

use self::future::{ResponseFuture, State};

/// Set once the shutdown began: new requests are refused.
const CLOSED: usize = 1 << (usize::BITS - 1);
/// Set once the grace period ended: requests still open are cut.
const CUT: usize = 1 << (usize::BITS - 2);
/// The number of requests open.
const COUNT: usize = CUT - 1;
/// How many wait lists the requests in flight spread over.
const SHARDS: usize = 8;

/// What a shutdown found and did; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Requests open when the shutdown began (in flight, sleeping in
    /// backoff, or queued).
    pub in_flight: usize,
    /// Of those, the ones that ended before the grace period did — with a
    /// response, an error, their last outcome (a wait that the shutdown
    /// ended), or dropped by their caller.
    pub completed: usize,
    /// Of those, the ones still open when the grace period ended, cut with
    /// [`ErrorKind::Closed`].
    pub cancelled: usize,
    /// Response bodies still being read (or drained) when the shutdown
    /// ended, cut with it — counted only for bodies tracked with
    /// [`ShutdownHandle::open_body`] (the ready-made client tracks every
    /// body it returns, from its response head on). A request cut while
    /// still waiting for its head is counted in
    /// [`cancelled`](Self::cancelled), not here.
    pub bodies_cut: usize,
}

struct Shared {
    /// `CLOSED | CUT | open count`.
    state: AtomicUsize,
    /// "Stop waiting", carried by each request's task.
    closing: Closing,
    /// "Stop now", at the end of the grace period.
    cut: CancellationToken,
    /// Children of `cut` that requests wait on, spread by the open count
    /// at their call, so that concurrent requests rarely meet in one wait
    /// list.
    shards: Box<[CancellationToken]>,
    /// Woken when the last open request ends after the close.
    idle: Notify,
    /// Requests open at the close.
    open_at_close: AtomicUsize,
    /// Response bodies open ([`OpenBody`] guards alive).
    bodies: AtomicUsize,
    report: OnceCell<ShutdownReport>,
}

impl Shared {
    /// One request ended; `true` if it was counted as cut.
    fn end(&self) -> bool {
        let prev = self.state.fetch_sub(1, Ordering::SeqCst);
        // The waiter checks both counts: waking it with a body still open
        // only sends it back to sleep.
        if prev & CLOSED != 0 && prev & COUNT == 1 {
            self.idle.notify_waiters();
        }
        prev & CUT != 0
    }

    /// One tracked body ended.
    fn end_body(&self) {
        let prev = self.bodies.fetch_sub(1, Ordering::SeqCst);
        if prev == 1 {
            let state = self.state.load(Ordering::SeqCst);
            if state & CLOSED != 0 && state & COUNT == 0 {
                self.idle.notify_waiters();
            }
        }
    }

    /// Neither a request nor a tracked body is open.
    fn is_idle(&self) -> bool {
        self.state.load(Ordering::SeqCst) & COUNT == 0 && self.bodies.load(Ordering::SeqCst) == 0
    }
}

// === impl ShutdownHandle ===

/// The handle that shuts down every stack built with its
/// [`ShutdownLayer`]; see the [module docs](self).
///
/// # Clone
///
/// Cheap: clones share one state, and any of them can shut down.
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl Default for ShutdownHandle {
    fn default() -> Self {
        ShutdownHandle::new()
    }
}

impl fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.state.load(Ordering::Relaxed);
        f.debug_struct("ShutdownHandle")
            .field("closed", &(state & CLOSED != 0))
            .field("open", &(state & COUNT))
            .finish()
    }
}

impl ShutdownHandle {
    /// A handle for a stack that is open.
    pub fn new() -> Self {
        ShutdownHandle {
            shared: Arc::new({
                let cut = CancellationToken::new();
                let shards = (0..SHARDS).map(|_| cut.child_token()).collect();
                Shared {
                    state: AtomicUsize::new(0),
                    closing: Closing::new(),
                    cut,
                    shards,
                    idle: Notify::new(),
                    open_at_close: AtomicUsize::new(0),
                    bodies: AtomicUsize::new(0),
                    report: OnceCell::new(),
                }
            }),
        }
    }

    /// A layer whose services this handle shuts down.
    pub fn layer(&self) -> ShutdownLayer {
        ShutdownLayer::new(self)
    }

    /// Whether the shutdown began (new requests are refused).
    pub fn is_closed(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Requests open right now.
    pub fn open(&self) -> usize {
        self.shared.state.load(Ordering::Acquire) & COUNT
    }

    /// Whether the shutdown ended: its grace period is over (or every
    /// request and tracked body ended before), and whatever was still open
    /// was cut.
    pub fn is_cut(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) & CUT != 0
    }

    /// A token cancelled when the shutdown ends (see
    /// [`is_cut`](Self::is_cut)): what a stack holds beyond its requests —
    /// pooled connections, background work — can close on it. It is a
    /// child of the handle's own signal: cancelling it cancels nothing
    /// else.
    pub fn cut_token(&self) -> CancellationToken {
        self.shared.cut.child_token()
    }

    /// Counts a response body as in flight until the returned guard is
    /// dropped: a shutdown's grace period then waits for it as for a
    /// request, and the shutdown's end cuts it (the guard's owner must end
    /// the body then, e.g. by closing its connection — see
    /// [`cut_token`](Self::cut_token); the report counts it in
    /// [`ShutdownReport::bodies_cut`]).
    ///
    /// A transport calls this when the head of a response whose body it
    /// streams arrives (not when it sends the request: a request waiting
    /// for its head is already counted, as a request), and drops the guard
    /// when the body ends or is dropped. Cost:
    /// a reference count and two atomic adds on the handle's state.
    pub fn open_body(&self) -> OpenBody {
        self.shared.bodies.fetch_add(1, Ordering::SeqCst);
        OpenBody {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Shut down: refuse new requests, end the waits at once, give requests
    /// in flight until `grace` has passed, cut the rest, and report. See the
    /// [module docs](self).
    ///
    /// Refusing starts when this is called, not when it is first polled.
    /// Every call (from any clone) returns the same report.
    pub fn shutdown(
        &self,
        grace: Duration,
    ) -> impl Future<Output = ShutdownReport> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        let prev = shared.state.fetch_or(CLOSED, Ordering::AcqRel);
        if prev & CLOSED == 0 {
            shared.open_at_close.store(prev & COUNT, Ordering::Release);
            shared.closing.close();
            tracing::debug!(open = prev & COUNT, ?grace, "shutdown: closed");
        }
        async move {
            *shared
                .report
                .get_or_init(|| async {
                    let idle = async {
                        loop {
                            let notified = shared.idle.notified();
                            tokio::pin!(notified);
                            notified.as_mut().enable();
                            if shared.is_idle() {
                                return;
                            }
                            notified.await;
                        }
                    };
                    let _ = tokio::time::timeout(grace, idle).await;
                    let prev = shared.state.fetch_or(CUT, Ordering::SeqCst);
                    let bodies_cut = shared.bodies.load(Ordering::SeqCst);
                    shared.cut.cancel();
                    let in_flight = shared.open_at_close.load(Ordering::Acquire);
                    let cancelled = (prev & COUNT).min(in_flight);
                    let report = ShutdownReport {
                        in_flight,
                        completed: in_flight - cancelled,
                        cancelled,
                        bodies_cut,
                    };
                    tracing::debug!(?report, "shutdown: done");
                    report
                })
                .await
        }
    }
}

/// A response body counted by its [`ShutdownHandle`] until this guard is
/// dropped; see [`ShutdownHandle::open_body`].
pub struct OpenBody {
    shared: Arc<Shared>,
}

impl OpenBody {
    /// Whether the shutdown ended and cut this body.
    pub fn is_cut(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) & CUT != 0
    }
}

impl Drop for OpenBody {
    fn drop(&mut self) {
        self.shared.end_body();
    }
}

impl fmt::Debug for OpenBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenBody")
            .field("cut", &self.is_cut())
            .finish()
    }
}

fn closed_error(method: &Method, uri: &Uri, sent: Sent, reason: &'static str) -> Error {
    let mut err = Error::new(ErrorKind::Closed)
        .with_detail(reason)
        .with_request(method, uri);
    let ext = err.extensions_mut();
    ext.insert(sent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("closed"),
    });
    err
}

// === impl ShutdownLayer ===

/// Closes its services when its [`ShutdownHandle`] shuts down.
///
/// See the [module docs](self) for an example.
#[derive(Clone, Debug)]
pub struct ShutdownLayer {
    handle: ShutdownHandle,
}

impl ShutdownLayer {
    /// A layer shut down by `handle`.
    pub fn new(handle: &ShutdownHandle) -> Self {
        ShutdownLayer {
            handle: handle.clone(),
        }
    }

    /// The handle that shuts this layer's services down.
    pub fn handle(&self) -> &ShutdownHandle {
        &self.handle
    }
}

impl<S> Layer<S> for ShutdownLayer {
    type Service = Shutdown<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Shutdown {
            inner,
            handle: self.handle.clone(),
            ready_wait: None,
        }
    }
}

// === impl Shutdown ===

/// The service of [`ShutdownLayer`].
///
/// See the [module docs](self).
pub struct Shutdown<S> {
    inner: S,
    handle: ShutdownHandle,
    /// While the inner service is not ready (a limit with backpressure):
    /// the wait that makes this service ready at shutdown.
    ready_wait: Option<Pin<Box<dyn Future<Output = ()> + Send + Sync>>>,
}

impl<S: Clone> Clone for Shutdown<S> {
    fn clone(&self) -> Self {
        Shutdown {
            inner: self.inner.clone(),
            handle: self.handle.clone(),
            ready_wait: None,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Shutdown<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shutdown")
            .field("inner", &self.inner)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<S> Shutdown<S> {
    /// Wrap `inner`, shut down by `handle`.
    pub fn new(inner: S, handle: &ShutdownHandle) -> Self {
        Shutdown {
            inner,
            handle: handle.clone(),
            ready_wait: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for Shutdown<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Closed: ready at once, and `call` refuses (the inner service is
        // not called, so it need not be ready).
        if self.handle.is_closed() {
            self.ready_wait = None;
            return Poll::Ready(Ok(()));
        }
        match self.inner.poll_ready(cx) {
            Poll::Ready(ready) => {
                self.ready_wait = None;
                Poll::Ready(ready.map_err(|e| Error::from_boxed(e.into())))
            }
            Poll::Pending => {
                // Backpressure below (a limit that reserves in
                // `poll_ready`): a shutdown ends this wait too. Allocates
                // only for a service that is not ready.
                let closing = &self.handle.shared.closing;
                let wait = self
                    .ready_wait
                    .get_or_insert_with(|| closing.clone().closed_owned());
                if wait.as_mut().poll(cx).is_ready() {
                    self.ready_wait = None;
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            }
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = &self.handle.shared;
        let prev = shared.state.fetch_add(1, Ordering::AcqRel);
        if prev & CLOSED != 0 {
            shared.end();
            let error = closed_error(req.method(), req.uri(), Sent::NotSent, "request refused");
            return ResponseFuture {
                state: State::Refused { error: Some(error) },
                shared: None,
            };
        }
        let method = req.method().clone();
        let uri = req.uri().clone();
        ResponseFuture {
            state: State::Open {
                fut: shared.closing.clone().scope(self.inner.call(req)),
                cut: shared.shards[prev % SHARDS].clone().cancelled_owned(),
                request: Some((method, uri)),
            },
            shared: Some(Arc::clone(shared)),
        }
    }
}

pub mod future {
    //! The response future of [`Shutdown`].

    use super::*;
    use crate::annotations::ClosingScope;

    // === impl ResponseFuture ===

    pin_project! {
        /// The response future of [`Shutdown`].
        ///
        /// Dropping it ends the request (it counts as completed).
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) state: State<F>,
            // Present while the request is counted open.
            pub(super) shared: Option<Arc<Shared>>,
        }

        impl<F> PinnedDrop for ResponseFuture<F> {
            fn drop(this: Pin<&mut Self>) {
                if let Some(shared) = this.project().shared.take() {
                    shared.end();
                }
            }
        }
    }

    pin_project! {
        #[project = StateProj]
        pub(super) enum State<F> {
            Open {
                #[pin]
                fut: ClosingScope<F>,
                #[pin]
                cut: WaitForCancellationFutureOwned,
                request: Option<(Method, Uri)>,
            },
            Refused {
                error: Option<Error>,
            },
            Done,
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match &self.state {
                State::Open { .. } => "open",
                State::Refused { .. } => "refused",
                State::Done => "done",
            };
            f.debug_struct("ResponseFuture")
                .field("state", &state)
                .finish()
        }
    }

    impl<F, T, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<T, Error>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.as_mut().project();
            match this.state.project() {
                StateProj::Open { fut, cut, request } => {
                    // The cut first: once the grace period ended, the
                    // caller gets `Closed` even if the inner future is ready.
                    let out = if cut.poll(cx).is_ready() {
                        None
                    } else {
                        match fut.poll(cx) {
                            Poll::Ready(out) => Some(out),
                            Poll::Pending => return Poll::Pending,
                        }
                    };
                    let (method, uri) = request.take().expect("polled after completion");
                    let shared = this.shared.take().expect("open while counted");
                    // Counted as cut by the report: say so, whatever the
                    // inner future had.
                    let cut = shared.end();
                    // Drop everything below now, not when the caller drops us.
                    self.as_mut().project().state.set(State::Done);
                    match out {
                        Some(out) if !cut => {
                            Poll::Ready(out.map_err(|e| Error::from_boxed(e.into())))
                        }
                        _ => Poll::Ready(Err(closed_error(
                            &method,
                            &uri,
                            Sent::MaybeProcessed,
                            "cut at the end of the grace period",
                        ))),
                    }
                }
                StateProj::Refused { error } => {
                    Poll::Ready(Err(error.take().expect("polled after completion")))
                }
                StateProj::Done => panic!("shutdown ResponseFuture polled after completion"),
            }
        }
    }
}

// === the shutdown's engine, for the whole-stack service ===

#[cfg(feature = "stack")]
/// A request counted open by its [`ShutdownHandle`] (as [`Shutdown`]'s
/// future counts it): ends, as completed, when dropped.
pub(crate) struct Entered {
    shared: Option<Arc<Shared>>,
    shard: usize,
}

#[cfg(feature = "stack")]
impl ShutdownHandle {
    /// Count a new request open; `None` (nothing counted) once the shutdown
    /// began: the request is refused.
    pub(crate) fn enter(&self) -> Option<Entered> {
        let shared = &self.shared;
        let prev = shared.state.fetch_add(1, Ordering::AcqRel);
        if prev & CLOSED != 0 {
            shared.end();
            return None;
        }
        Some(Entered {
            shared: Some(Arc::clone(shared)),
            shard: prev % SHARDS,
        })
    }

    /// The "stop waiting" signal, for the waits of a request.
    pub(crate) fn closing(&self) -> &Closing {
        &self.shared.closing
    }
}

#[cfg(feature = "stack")]
impl Entered {
    /// Resolves when the grace period ends and this request is to be cut.
    pub(crate) fn cut(&self) -> WaitForCancellationFutureOwned {
        let shared = self.shared.as_ref().expect("entered");
        shared.shards[self.shard].clone().cancelled_owned()
    }

    /// The request ended; `true` if the shutdown counts it as cut.
    pub(crate) fn end(mut self) -> bool {
        self.shared.take().is_some_and(|shared| shared.end())
    }
}

#[cfg(feature = "stack")]
impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.end();
        }
    }
}

#[cfg(feature = "stack")]
/// The error of a request the shutdown refused (`NotSent`) or cut.
pub(crate) fn closed(name: &crate::redact::RequestName, sent: Sent, reason: &'static str) -> Error {
    let mut err = name.name(Error::new(ErrorKind::Closed).with_detail(reason));
    let ext = err.extensions_mut();
    ext.insert(sent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("closed"),
    });
    err
}
