//! The response future of [`Stack`](super::Stack): the whole stack's
//! request path as one state machine.
//!
//! Each step below calls the policy of the layer it stands for (see the
//! table in the [module docs](super)), in the layers' order: the same
//! decisions, the same annotations on the outcome, the same errors.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{sleep_until, Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;
use tower_service::Service;

use super::body::{timeout_error, Payload, StackBody};
use super::Config;
use crate::annotations::{
    closed_while_waiting, Closing, Deadline, GateWait, LimiterState, PreviousAttempt, Reason, Sent,
    Verdict,
};
use crate::backoff::propose;
use crate::body::RetryBody;
use crate::body_timeout::{BodyClock, TimedError};
use crate::breaker::future::Track;
use crate::cancel::{cancelled_error, Cancel};
use crate::classify::Classifier;
use crate::collect::future::{announced_len, body_error, has_no_content, too_large, Collecting};
use crate::error::{BoxError, Error, TimeoutStage};
use crate::fallback::{Routes, Served};
use crate::gate::{close_after, throttled_named, wait_open, GateMode};
use crate::host::HostRef;
use crate::limit::{AttemptSlot, HeldSlot};
use crate::ratelimit::{exhausted, settle, Admit, Cost, Ticket};
use crate::reconcile::{OperationId, ReconcileHook};
use crate::redact::RequestName;
use crate::retry::future::{Decision, Drain, Held, Replay, Slept, DRAIN_MAX_TIME};
use crate::shutdown::{closed, Entered};
use crate::throttle::Admit as Shed;
use crate::trace::{begin, begin_attempt, AttemptState, RequestState};

type Wait<T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send>>;
type ClosedFuture = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;
type Checking = crate::reconcile::Asked;

pin_project! {
    /// The response future of [`Stack`](super::Stack).
    ///
    /// Dropping it ends everything at once, as dropping the stacked
    /// layers' futures does: the attempt in flight, any wait or sleep;
    /// permits and slots go back, the request span records the
    /// cancellation.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, ResB, C>
    where
        S: Service<Request<B>>,
        B: RetryBody,
    {
        #[pin]
        state: State<S::Future, B, ResB>,
        // The one timer of the head phase: the attempt's time to its head
        // (or the deadline, when earlier), the backoff sleep, the deadline
        // while waiting. Reset, never re-created.
        #[pin]
        timer: Sleep,
        // The shutdown's cut at the end of its grace period.
        #[pin]
        cut: Option<WaitForCancellationFutureOwned>,
        r: Req<S, B, C>,
    }

    impl<S, B, ResB, C> PinnedDrop for ResponseFuture<S, B, ResB, C>
    where
        S: Service<Request<B>>,
        B: RetryBody,
    {
        fn drop(this: Pin<&mut Self>) {
            let r = this.project().r;
            // The request first, then its attempt: the order in which the
            // stacked layers' futures would be dropped.
            if let Some(trace) = r.trace.take() {
                trace.cancelled();
            }
            if let Some(attempt) = r.attempt.take() {
                attempt.cancelled();
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, ResB> {
        // A request-level wait, before the first attempt: the holding gate
        // or the concurrency queue.
        Admitting {
            wait: Wait<Admitted>,
            what: Waited,
            req: Option<Box<Request<B>>>,
        },
        // An attempt-level wait: the closing gate, the adaptive queue.
        Holding {
            wait: Wait<Option<AttemptSlot>>,
            from: Step,
            req: Option<Box<Request<B>>>,
        },
        // An attempt in flight.
        Calling {
            #[pin]
            fut: F,
        },
        // A write's status check, before the loop decides.
        Reconciling {
            check: Checking,
            out: Option<Box<Result<Response<Payload<ResB>>, Error>>>,
        },
        // Waiting for the inner service to be ready for the next attempt.
        Readying,
        // A response head in: its body read inside the attempt, for a
        // request that asked for it.
        Collecting {
            collect: Pin<Box<Collect<ResB>>>,
        },
        // Waiting before the next attempt (see the retry loop).
        Sleeping {
            drain: Option<Drain<Payload<ResB>>>,
            until: Instant,
            held: Option<Box<Held<Payload<ResB>>>>,
        },
        // The outcome, already complete.
        // An outcome complete before any attempt (boxed: off the happy
        // path; every later outcome is returned at once, not stored).
        Ready {
            out: Option<Box<Result<Response<StackBody<ResB>>, Error>>>,
        },
        Done,
    }
}

/// What a step of the path comes to: the next state (and the timer's
/// instant), or the request's outcome, returned at once rather than kept
/// in the future (which would make every future as large as a response).
#[allow(clippy::large_enum_variant)] // a transient return value
enum Flow<St, O> {
    Go(St, Instant),
    Done(O),
}

type Next<F, B, ResB> = Flow<State<F, B, ResB>, Result<Response<StackBody<ResB>>, Error>>;

/// Take a [`Flow`] in `poll`: set the next state and reset the timer, or
/// return the outcome.
macro_rules! go {
    ($this:ident, $next:expr) => {
        match $next {
            Flow::Go(state, until) => {
                $this.state.set(state);
                $this.timer.as_mut().reset(until);
            }
            Flow::Done(out) => {
                $this.state.set(State::Done);
                return Poll::Ready(out);
            }
        }
    };
}

pin_project! {
    /// A body being read inside the attempt (boxed in the state: only the
    /// JSON helpers' requests read one).
    struct Collect<ResB> {
        #[pin]
        body: ResB,
        parts: Option<http::response::Parts>,
        buf: Collecting,
        // The body timeouts and the deadline, on the head's timer.
        clock: BodyClock,
    }
}

/// Which request-level wait a request is in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Waited {
    Gate,
    Permit,
}

/// What a request-level wait yielded.
enum Admitted {
    /// The holding gate opened.
    GateOpen,
    /// The concurrency permit.
    Permit(OwnedSemaphorePermit),
}

/// Where an attempt's admission goes on after a wait.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    Gate,
    /// The pacer: admit (again, after a quota's reset).
    Pace,
    /// The pacer let the attempt go (its slot has come).
    Paced,
    Adaptive,
    Call,
}

/// Which layer an attempt's outcome comes from: the classifier and the
/// Retry-After parser judge only what the transport (or the attempt
/// timeout) returned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum From {
    Transport,
    /// The body read inside the attempt (classified, as the transport's
    /// outcome is).
    Collect,
    Admission,
}

/// Everything the request keeps besides its state and timer (not pinned).
struct Req<S, B: RetryBody, C> {
    cfg: Arc<Config<C>>,
    svc: S,
    replay: Option<Replay<(), B>>,
    trace: Option<RequestState>,
    attempt: Option<AttemptState>,
    entered: Option<Entered>,
    cancel: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    deadline: Instant,
    // The concurrency permit, and the limiter's state if it had to wait.
    permit: Option<OwnedSemaphorePermit>,
    queued_state: Option<LimiterState>,
    // The authority's key for the gate and the breaker, once computed
    // (off the happy path).
    key: Option<u64>,
    // When the holding gate started holding this request.
    held_since: Option<Instant>,
    // When the closing gate started holding the attempt in flight.
    attempt_held_since: Option<Instant>,
    slot: Option<AttemptSlot>,
    // The adaptive slot of the attempt whose streamed response is on its
    // way up: its outcome is recorded, and the response body holds it
    // until it ends (dropped if the attempt is retried).
    held_slot: Option<HeldSlot>,
    // The throttle counted this attempt (with its host's `key`): the
    // accept is counted when it is judged.
    throttled: bool,
    track: Option<Track>,
    // The timer's meaning while an attempt is in flight.
    stage: TimeoutStage,
    // The delay waited before the attempt in flight (for the backoff).
    previous_delay: Option<Duration>,
    // The idempotency layer checks this request's responses for key
    // conflicts.
    conflicts: bool,
    // A shutdown's "stop waiting", while the request waits.
    closing: Option<ClosedFuture>,
    // Read the response body inside the attempt, up to this many bytes.
    collect: Option<usize>,
    // The fallback's routes still to try, and which route this loop is.
    routes: Option<Box<Routes<B>>>,
    served: Option<Served>,
    // The operation id a status check would be asked about.
    operation: Option<OperationId>,
    // The attempt's place with the pacer, settled by its response.
    ticket: Option<Ticket>,
    // When the pacer started holding the attempt in flight.
    paced_since: Option<Instant>,
}

impl<S, B: RetryBody, C> Req<S, B, C> {
    fn name(&self) -> Option<RequestName> {
        self.replay
            .as_ref()
            .and_then(Replay::name)
            .map(|(m, u)| RequestName::new(m.clone(), u.clone()))
    }

    /// Whether the shutdown's signal has closed, while the request waits.
    fn poll_closed(&mut self, cx: &mut Context<'_>) -> bool {
        poll_closed_for(&mut self.closing, &self.cfg.shutdown, cx)
    }

    fn gate_key(&mut self, uri: &http::Uri) -> Option<u64> {
        let gate = self.cfg.gate.as_ref()?;
        Some(*self.key.get_or_insert_with(|| gate.table().key(uri)))
    }
}

/// What starting an attempt came to. (A transient return value: its
/// large variant, the request that waits, is moved into the state at once.)
#[allow(clippy::large_enum_variant)]
enum Started<F, B> {
    /// The attempt's future, and the clock reading it was admitted on.
    Called(F, Instant),
    Waiting(Wait<Option<AttemptSlot>>, Step, Request<B>),
    Failed(Error),
}

impl<S, B, ResB, C> ResponseFuture<S, B, ResB, C>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    B: RetryBody,
    ResB: Body,
    ResB::Error: Into<BoxError>,
    C: Classifier<ResB>,
{
    /// The request path down to the first attempt's call, as the stacked
    /// layers' `call`s run it.
    pub(super) fn start(
        cfg: Arc<Config<C>>,
        svc: S,
        mut req: Request<B>,
        collect: Option<usize>,
    ) -> Self {
        // Trace: the request span, deny-listed headers marked sensitive.
        let trace = begin(cfg.trace.config(), &mut req);
        let span = trace.span.clone();
        let _entered = span.enter();
        let now = Instant::now();
        let ours = now + cfg.total;
        let mut r = Req {
            cfg,
            svc,
            replay: None,
            trace: Some(trace),
            attempt: None,
            entered: None,
            cancel: None,
            deadline: ours,
            permit: None,
            queued_state: None,
            key: None,
            held_since: None,
            attempt_held_since: None,
            slot: None,
            held_slot: None,
            throttled: false,
            track: None,
            stage: TimeoutStage::Headers,
            previous_delay: None,
            conflicts: false,
            closing: None,
            collect,
            routes: None,
            served: None,
            operation: None,
            ticket: None,
            paced_since: None,
        };
        let mut cut = None;
        let early = Self::admit(&mut r, &mut cut, now, ours, req);
        let (state, until) = match early {
            Admission::Ready(req) => match Self::first(&mut r, req, Some(now)) {
                Flow::Go(state, until) => (state, until),
                Flow::Done(out) => (
                    State::Ready {
                        out: Some(Box::new(out)),
                    },
                    r.deadline,
                ),
            },
            Admission::Waiting(wait, what, req) => (
                State::Admitting {
                    wait,
                    what,
                    req: Some(Box::new(req)),
                },
                r.deadline,
            ),
            Admission::Finished(out) => (State::Ready { out: Some(out) }, r.deadline),
        };
        ResponseFuture {
            state,
            timer: sleep_until(until),
            cut,
            r,
        }
    }

    /// The request-level steps before the retry loop: shutdown, cancel,
    /// deadline, the holding gate, the concurrency permit. `Err`: the
    /// request's final outcome, already complete.
    fn admit(
        r: &mut Req<S, B, C>,
        cut: &mut Option<WaitForCancellationFutureOwned>,
        now: Instant,
        ours: Instant,
        req: Request<B>,
    ) -> Admission<B, ResB> {
        // Shutdown: refused once closed (nothing else runs).
        if let Some(handle) = &r.cfg.shutdown {
            match handle.enter() {
                Some(entered) => {
                    if !r.cfg.inner_cuts {
                        *cut = Some(entered.cut());
                    }
                    r.entered = Some(entered);
                }
                None => {
                    let err = closed(&RequestName::of(&req), Sent::NotSent, "request refused");
                    return Admission::Finished(Box::new(r.complete(Err(err), Up::Trace)));
                }
            }
        }
        // Cancel: a token already cancelled ends it here.
        if let Some(token) = Cancel::of(req.extensions()) {
            if token.is_cancelled() {
                let err = cancelled_error(req.method(), req.uri());
                return Admission::Finished(Box::new(r.complete(Err(err), Up::Close)));
            }
            r.cancel = Some(Box::pin(token.clone().cancelled_owned()));
        }
        // Deadline: the earlier of ours, one the request carries, and a
        // gRPC call's own `grpc-timeout` (tonic's `set_timeout`).
        let mut deadline = match Deadline::of(req.extensions()) {
            Some(earlier) if earlier <= ours => earlier,
            _ => ours,
        };
        if let Some(theirs) = crate::grpc::own_grpc_deadline(&req, now) {
            deadline = deadline.min(theirs);
        }
        r.deadline = deadline;
        if deadline <= now {
            let err = RequestName::of(&req).name(Error::timeout(TimeoutStage::Deadline));
            return Admission::Finished(Box::new(r.complete(Err(err), Up::Close)));
        }
        Self::admit_gate(r, req)
    }

    /// The holding gate, then the permit. A request that waited for its
    /// permit comes back here: the gate may have closed while it queued.
    fn admit_gate(r: &mut Req<S, B, C>, req: Request<B>) -> Admission<B, ResB> {
        if let Some(gate) = &r.cfg.gate {
            let table = gate.table();
            if gate.gate_mode() != GateMode::Off && !table.is_empty() {
                let key = r.gate_key(req.uri()).expect("a gate");
                let now = Instant::now();
                if let Some(until) = r.cfg.gate.as_ref().expect("a gate").table().check(key, now) {
                    let gate = r.cfg.gate.as_ref().expect("a gate");
                    let name = RequestName::of(&req);
                    let failed = match gate.gate_mode() {
                        GateMode::Wait if r.deadline < until => Some(throttled_named(
                            &name,
                            until,
                            now,
                            Some("the deadline comes before the pause ends"),
                        )),
                        GateMode::Wait => None,
                        _ => Some(throttled_named(&name, until, now, None)),
                    };
                    if let Some(err) = failed {
                        let err = out_of_quota(r.cfg.rate_limit.as_ref(), &req, r.deadline, now)
                            .unwrap_or(err);
                        return Admission::Finished(Box::new(r.complete(Err(err), Up::Hold)));
                    }
                    r.held_since.get_or_insert(now);
                    let wait =
                        wait_open(Arc::clone(gate.table()), key, until, Some(r.deadline), name);
                    let wait: Wait<Admitted> = Box::pin(async move {
                        wait.await?;
                        Ok(Admitted::GateOpen)
                    });
                    // A permit this request waited for goes back while it
                    // waits for its host (it takes its turn again after).
                    r.permit = None;
                    r.queued_state = None;
                    return Admission::Waiting(wait, Waited::Gate, req);
                }
            }
        }
        Self::admit_permit(r, req)
    }

    fn admit_permit(r: &mut Req<S, B, C>, req: Request<B>) -> Admission<B, ResB> {
        if r.permit.is_none() {
            if let Some(limiter) = &r.cfg.concurrency {
                match limiter.try_permit() {
                    Some(permit) => r.permit = Some(permit),
                    None => {
                        let wait = limiter.wait_permit(Some(r.deadline), RequestName::of(&req));
                        let wait: Wait<Admitted> =
                            Box::pin(async move { Ok(Admitted::Permit(wait.await?)) });
                        return Admission::Waiting(wait, Waited::Permit, req);
                    }
                }
            }
        }
        Admission::Ready(req)
    }

    /// Below the permit: the idempotency key, gRPC marking, the retry
    /// loop's set-up, then the first attempt. Returns the state and the
    /// timer's instant. `fresh`: the request's clock reading, when nothing
    /// has waited since it was taken (the first attempt starts on it).
    fn first(
        r: &mut Req<S, B, C>,
        mut req: Request<B>,
        fresh: Option<Instant>,
    ) -> Next<S::Future, B, ResB> {
        if let Some(keys) = &r.cfg.idempotency {
            r.conflicts = keys.stamp(&mut req);
        }
        // The fallback keeps what its routes are made of (only when
        // configured: a head copy and a replay of the body).
        if let Some(fallback) = &r.cfg.fallback {
            let (saved, routes) = Routes::save(fallback, req, Some(r.deadline));
            req = saved;
            r.routes = routes.map(Box::new);
        }
        Self::run_loop(r, req, fresh)
    }

    /// One retry loop for `req` (the primary's, or an alternate route's):
    /// gRPC marking, the breaker's admission, the loop's set-up, the first
    /// attempt.
    fn run_loop(
        r: &mut Req<S, B, C>,
        mut req: Request<B>,
        fresh: Option<Instant>,
    ) -> Next<S::Future, B, ResB> {
        if let Some(mark) = &r.cfg.mark {
            mark.mark(&mut req);
        }
        // The circuit breaker, right above the retry loop: it admits the
        // request and counts its final outcome.
        if let Some(breaker) = &r.cfg.breaker {
            match breaker.admit(&req, &mut r.key) {
                Ok(track) => r.track = Some(track),
                Err(err) => return Self::loop_done(r, Err(err)),
            }
        }
        if let Some(hook) = &r.cfg.reconcile {
            let (parts, body) = req.into_parts();
            r.operation = hook.operation_id(&parts);
            req = Request::from_parts(parts, body);
        }
        let (req, replay) = Replay::prepare(&r.cfg.retry, req, Some(r.deadline));
        r.replay = Some(replay);
        Self::attempt(r, req, fresh)
    }

    /// Start an attempt: its span, then its admission and call.
    fn attempt(
        r: &mut Req<S, B, C>,
        mut req: Request<B>,
        fresh: Option<Instant>,
    ) -> Next<S::Future, B, ResB> {
        let attempt = begin_attempt(r.cfg.trace.config(), &mut req);
        r.previous_delay = req
            .extensions()
            .get::<PreviousAttempt>()
            .and_then(|p| p.delay.map(|d| d.delay));
        if let Some(propagate) = &r.cfg.propagate {
            propagate.write(&mut req, r.deadline);
        }
        r.attempt_held_since = None;
        r.paced_since = None;
        let span = attempt.span.clone();
        r.attempt = Some(attempt);
        let _entered = span.enter();
        let started = Self::admit_attempt(r, req, Step::Gate, fresh);
        Self::started(r, started)
    }

    fn started(r: &mut Req<S, B, C>, started: Started<S::Future, B>) -> Next<S::Future, B, ResB> {
        match started {
            Started::Called(fut, now) => {
                let until = Self::arm(r, now);
                Flow::Go(State::Calling { fut }, until)
            }
            Started::Waiting(wait, from, req) => Flow::Go(
                State::Holding {
                    wait,
                    from,
                    req: Some(Box::new(req)),
                },
                r.deadline,
            ),
            Started::Failed(err) => Self::judged(r, Err(err), From::Admission),
        }
    }

    /// The head timer of the attempt about to be called: the earlier of
    /// its timeout and the deadline, from `now`: the reading its admission
    /// checked the deadline with (one clock read for the deadline, the
    /// attempt timeout and the gradient's round-trip time).
    fn arm(r: &mut Req<S, B, C>, now: Instant) -> Instant {
        if let Some(slot) = &mut r.slot {
            slot.called_at(now);
        }
        let ours = now + r.cfg.attempt;
        // A tie is the deadline's: an attempt timeout clamped to the total
        // ends with it (on the request's own reading they are equal).
        if r.deadline <= ours {
            r.stage = TimeoutStage::Deadline;
            r.deadline
        } else {
            r.stage = TimeoutStage::Headers;
            ours
        }
    }

    /// The attempt's admission from step `from` on: the closing gate, the
    /// adaptive limit; then the call. `fresh`: a clock reading nothing has
    /// waited since (else the clock is read here, once).
    fn admit_attempt(
        r: &mut Req<S, B, C>,
        req: Request<B>,
        from: Step,
        fresh: Option<Instant>,
    ) -> Started<S::Future, B> {
        if from == Step::Gate {
            if let Some(gate) = &r.cfg.gate {
                if gate.gate_mode() != GateMode::Off && !gate.table().is_empty() {
                    let key = r.gate_key(req.uri()).expect("a gate");
                    let gate = r.cfg.gate.as_ref().expect("a gate");
                    let now = Instant::now();
                    if let Some(until) = gate.table().check(key, now) {
                        let name = RequestName::of(&req);
                        r.attempt_held_since.get_or_insert(now);
                        let fails = gate.gate_mode() != GateMode::Wait || r.deadline < until;
                        if let Some(err) = fails
                            .then(|| out_of_quota(r.cfg.rate_limit.as_ref(), &req, r.deadline, now))
                            .flatten()
                        {
                            return Started::Failed(err);
                        }
                        match gate.gate_mode() {
                            GateMode::Wait if r.deadline >= until => {
                                let wait = wait_open(
                                    Arc::clone(gate.table()),
                                    key,
                                    until,
                                    Some(r.deadline),
                                    name,
                                );
                                let wait: Wait<Option<AttemptSlot>> = Box::pin(async move {
                                    wait.await?;
                                    Ok(None)
                                });
                                return Started::Waiting(wait, Step::Adaptive, req);
                            }
                            GateMode::Wait => {
                                return Started::Failed(throttled_named(
                                    &name,
                                    until,
                                    now,
                                    Some("the deadline comes before the pause ends"),
                                ));
                            }
                            _ => return Started::Failed(throttled_named(&name, until, now, None)),
                        }
                    }
                }
            }
        }
        if matches!(from, Step::Gate | Step::Pace) {
            if let Some(rate_limit) = &r.cfg.rate_limit {
                let pacer = &rate_limit.pacer;
                // Made in place and kept there (a ticket is not small).
                let ticket = r
                    .ticket
                    .get_or_insert_with(|| pacer.ticket(req.extensions().get::<Cost>()));
                let admit = if pacer.hosts() == 0 {
                    // No host tracked: no clock, no hash, no lock.
                    pacer.count(ticket);
                    Admit::Go
                } else {
                    pacer.admit(Instant::now(), req.uri(), ticket, Some(r.deadline))
                };
                match admit {
                    Admit::Go => {}
                    Admit::Wait(until) | Admit::Later(until) => {
                        r.paced_since.get_or_insert_with(Instant::now);
                        let next = if matches!(admit, Admit::Wait(_)) {
                            Step::Paced
                        } else {
                            Step::Pace
                        };
                        let wait: Wait<Option<AttemptSlot>> = Box::pin(async move {
                            sleep_until(until).await;
                            Ok(None)
                        });
                        return Started::Waiting(wait, next, req);
                    }
                    Admit::Exhausted { reset, dimension } => {
                        r.ticket = None;
                        let err = exhausted(&req, reset, dimension, Instant::now());
                        return Started::Failed(err);
                    }
                }
            }
        }
        // Client-side throttling: count the attempt with its host, or shed
        // it here (not sent, not retried).
        if from != Step::Call && !r.throttled {
            if let Some(throttle) = &r.cfg.throttle {
                let key = *r.key.get_or_insert_with(|| HostRef::of(req.uri()).key());
                match throttle.admit(key, Instant::now()) {
                    Shed::Go(_) => r.throttled = true,
                    Shed::Shed(p) => {
                        return Started::Failed(crate::throttle::shed_error(
                            req.method(),
                            req.uri(),
                            p,
                        ))
                    }
                }
            }
        }
        if from != Step::Call && r.slot.is_none() {
            // Per host: the limiter of the request's host, by the key the
            // gate and the breaker use (computed once per request, or
            // found with the limiter in the thread's cache).
            let host = r
                .cfg
                .adaptive_hosts
                .as_ref()
                .map(|hosts| hosts.lookup(req.uri(), &mut r.key));
            if let Some(limiter) = host.as_ref().or(r.cfg.adaptive.as_ref()) {
                match limiter.try_slot() {
                    Some(slot) => r.slot = Some(slot),
                    None => {
                        let wait = limiter.wait_slot(Some(r.deadline), RequestName::of(&req));
                        let wait: Wait<Option<AttemptSlot>> =
                            Box::pin(async move { Ok(Some(wait.await?)) });
                        return Started::Waiting(wait, Step::Call, req);
                    }
                }
            }
        }
        // The attempt timeout: a deadline already passed fails the attempt
        // without calling the transport. The same reading starts the
        // attempt's timer (see `arm`).
        let now = fresh.unwrap_or_else(Instant::now);
        if r.deadline <= now {
            let name = RequestName::of(&req);
            return Started::Failed(crate::attempt_timeout::future::timed_out(
                TimeoutStage::Deadline,
                name,
            ));
        }
        Started::Called(r.svc.call(req), now)
    }

    /// An attempt's outcome judged on its way up through the attempt's
    /// layers (classify, Retry-After, adaptive limit, gate, backoff,
    /// attempt trace), then the retry loop's decision. A response head
    /// whose body the request asked to read inside the attempt goes on to
    /// that read first.
    fn judged(
        r: &mut Req<S, B, C>,
        mut out: Result<Response<ResB>, Error>,
        from: From,
    ) -> Next<S::Future, B, ResB> {
        if from == From::Transport {
            let verdict = r.cfg.classifier.classify(&out);
            if !verdict.is_success() {
                ext_of(&mut out).insert(verdict);
                // Retry-After: a hint on a response that was not a success.
                out = out.map(|res| {
                    let (mut parts, body) = res.into_parts();
                    r.cfg.retry_after.config().annotate(
                        parts.status,
                        &parts.headers,
                        &mut parts.extensions,
                    );
                    Response::from_parts(parts, body)
                });
            } else if let (Some(max), Ok(_)) = (r.collect, &out) {
                let Ok(res) = out else {
                    unreachable!("matched Ok")
                };
                let (parts, body) = res.into_parts();
                let method = r.replay.as_ref().and_then(Replay::name).map(|(m, _)| m);
                let announced = if method.is_some_and(|m| has_no_content(m, parts.status)) {
                    // Its Content-Length describes a body that is not sent.
                    body.size_hint().lower()
                } else {
                    announced_len(&parts.headers, &body.size_hint())
                };
                if announced > max as u64 {
                    // Refused at once: dropping the body reads nothing more.
                    let err = r.named(too_large("content-length is over the cap"));
                    return Self::judged_on(r, Err(err), From::Collect);
                }
                let buf = Collecting::new(announced.min(max as u64) as usize);
                let clock = BodyClock::new(r.cfg.body.timeouts, Some(r.deadline));
                let collect = Box::pin(Collect {
                    body,
                    parts: Some(parts),
                    buf,
                    clock,
                });
                return Flow::Go(State::Collecting { collect }, r.deadline);
            }
            // Already judged by the classifier.
            return Self::judged_on(r, out.map(|res| res.map(Payload::stream)), From::Admission);
        }
        Self::judged_on(r, out.map(|res| res.map(Payload::stream)), from)
    }

    /// [`judged`](Self::judged), from the adaptive limit up. An error from
    /// the body read inside the attempt is classified first.
    fn judged_on(
        r: &mut Req<S, B, C>,
        mut out: Result<Response<Payload<ResB>>, Error>,
        from: From,
    ) -> Next<S::Future, B, ResB> {
        if from == From::Collect {
            if let Err(err) = out {
                let raw: Result<Response<ResB>, Error> = Err(err);
                let verdict = r.cfg.classifier.classify(&raw);
                let Err(mut err) = raw else {
                    unreachable!("an error")
                };
                if !verdict.is_success() {
                    err.extensions_mut().insert(verdict);
                }
                out = Err(err);
            }
        }
        // The pacer first: a quota at zero is an overload signal for the
        // adaptive limit below.
        if let Some(ticket) = &mut r.ticket {
            // An error: the ticket's drop gives its reservation back.
            if let Ok(res) = &mut out {
                let rate_limit = r.cfg.rate_limit.as_ref().expect("a ticket of the pacer");
                let uri = r.replay.as_ref().and_then(Replay::name).map(|(_, u)| u);
                let signal = settle(
                    rate_limit.clock.as_deref(),
                    res.status(),
                    res.headers(),
                    ticket,
                    || uri.map_or(0, |u| HostRef::of(u).key()),
                );
                if let Some(signal) = signal {
                    res.extensions_mut().insert(signal);
                }
            }
            // Settled, or (an error) given back by its drop.
            r.ticket = None;
        }
        if std::mem::take(&mut r.throttled) {
            if let (true, Some(key)) = (crate::throttle::is_accept(&out), r.key) {
                let throttle = r.cfg.throttle.as_ref().expect("counted by the throttle");
                throttle.accepted(key, Instant::now());
            }
        }
        if let Some(slot) = r.slot.take() {
            let held = slot.settle(&mut out);
            // Held until the body ends, for a streamed body with bytes left
            // (the upstream is still sending); else given back now.
            let streams = matches!(&out, Ok(res)
                if matches!(res.body(), Payload::Stream { .. }) && !res.body().is_end_stream());
            if streams {
                r.held_slot = Some(held);
            }
        }
        if let Some(since) = r.attempt_held_since.take() {
            ext_of(&mut out).insert(GateWait(since.elapsed()));
        }
        if let Some(since) = r.paced_since.take() {
            let waited = since.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
            tracing::Span::current().record("rebound.ratelimit.wait_ms", waited);
        }
        if let Ok(res) = &out {
            let closes = r
                .cfg
                .gate
                .as_ref()
                .is_some_and(|g| g.closes_on(res.status()))
                && res
                    .extensions()
                    .get::<crate::annotations::RetryAfterHint>()
                    .is_some();
            if closes {
                let uri = r
                    .replay
                    .as_ref()
                    .and_then(Replay::name)
                    .map(|(_, u)| u.clone());
                if let Some(uri) = uri {
                    if let Some(key) = r.gate_key(&uri) {
                        let table = r.cfg.gate.as_ref().expect("a gate").table();
                        close_after(table, key, res.status(), res.extensions());
                    }
                }
            }
        }
        let replay = r.replay.as_mut().expect("an attempt has a loop");
        propose(
            &r.cfg.backoff,
            replay.attempt,
            r.previous_delay,
            ext_of(&mut out),
        );
        if let Some(attempt) = r.attempt.take() {
            attempt.finish(&mut out);
        }
        // Reconcile: a write whose attempt may have been processed is
        // looked up before the loop decides (only when configured).
        if let (Some(hook), Some(id)) = (&r.cfg.reconcile, &r.operation) {
            if ReconcileHook::wants(&out) {
                let name = r.request_name().expect("an attempt has a name");
                let check = hook.ask(id.clone(), name, r.deadline);
                return Flow::Go(
                    State::Reconciling {
                        check,
                        out: Some(Box::new(out)),
                    },
                    r.deadline,
                );
            }
        }
        Self::decided(r, out)
    }

    /// The retry loop's decision on an attempt's judged outcome.
    fn decided(
        r: &mut Req<S, B, C>,
        out: Result<Response<Payload<ResB>>, Error>,
    ) -> Next<S::Future, B, ResB> {
        let replay = r.replay.as_mut().expect("an attempt has a loop");
        match replay.decide(out) {
            Decision::Return(out) => Self::loop_done(r, out),
            Decision::Retry { until, drain, held } => {
                // The discarded response's slot goes back now, not after
                // its drain.
                r.held_slot = None;
                // Wake first at the end of the drain window, if it ends
                // before the sleep does.
                let first = match &drain {
                    Some(_) => until.min(Instant::now() + DRAIN_MAX_TIME),
                    None => until,
                };
                Flow::Go(State::Sleeping { drain, until, held }, first)
            }
        }
    }

    /// A retry loop's last outcome: the breaker counts it; then the next
    /// alternate route's loop, if the fallback tries one, else the outcome
    /// on its way up.
    fn loop_done(
        r: &mut Req<S, B, C>,
        mut out: Result<Response<Payload<ResB>>, Error>,
    ) -> Next<S::Future, B, ResB> {
        if let Some(track) = r.track.take() {
            let uri = r.replay.as_ref().and_then(Replay::name).map(|(_, u)| u);
            track.settle(&out, uri, &mut r.key);
        }
        if let Some(served) = r.served.take() {
            ext_of(&mut out).insert(served);
        }
        if let Some(routes) = r.routes.as_mut() {
            let closing = r.cfg.shutdown.as_ref().is_some_and(|h| h.is_closed())
                || Closing::current().is_some_and(|c| c.is_closed());
            match routes.next(&out, closing) {
                Some(Ok((req, served))) => {
                    // This route's outcome replaces the last one: let go
                    // of it now (its connection).
                    drop(out);
                    r.held_slot = None;
                    r.served = Some(served);
                    r.operation = None;
                    // Another route, another host: its own key.
                    r.key = None;
                    return Self::run_loop(r, req, None);
                }
                Some(Err(err)) => out = Err(err),
                None => {}
            }
        }
        let out = r.complete(out, Up::Retry);
        Flow::Done(out)
    }
}

fn ext_of<T>(out: &mut Result<Response<T>, Error>) -> &mut http::Extensions {
    match out {
        Ok(res) => res.extensions_mut(),
        Err(err) => err.extensions_mut(),
    }
}

/// Where an outcome enters the request-level layers on its way up: each
/// level also runs every level after it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Up {
    /// From the retry loop: the idempotency key's conflict check, the
    /// concurrency permit.
    Retry,
    /// From the concurrency limit's wait: the holding gate's wait time.
    Permit,
    /// From the holding gate (and the deadline layer, which adds nothing).
    Hold,
    /// From the cancel or deadline layer: the shutdown's count.
    Close,
    /// From the shutdown: only the trace.
    Trace,
}

impl<S, B: RetryBody, C> Req<S, B, C> {
    /// The outcome on its way up through the request-level layers, from
    /// `from` on, to what the caller gets.
    fn complete<ResB>(
        &mut self,
        mut out: Result<Response<Payload<ResB>>, Error>,
        from: Up,
    ) -> Result<Response<StackBody<ResB>>, Error>
    where
        ResB: Body,
        ResB::Error: Into<BoxError>,
    {
        let mut permit = None;
        if from <= Up::Retry {
            if let Some(track) = self.track.take() {
                let uri = self.replay.as_ref().and_then(Replay::name).map(|(_, u)| u);
                track.settle(&out, uri, &mut self.key);
            }
            if self.conflicts {
                if let Ok(res) = &mut out {
                    if let Some(reason) = crate::idempotency::future::conflict_reason(res.status())
                    {
                        res.extensions_mut().insert(Verdict::Fatal {
                            reason: Reason::new_static(reason),
                        });
                    }
                }
            }
            if let Some(state) = self.queued_state.take() {
                ext_of(&mut out).insert(state);
            }
            permit = self.permit.take();
        }
        if from <= Up::Permit {
            if let Some(since) = self.held_since.take() {
                ext_of(&mut out).insert(GateWait(since.elapsed()));
            }
        }
        // The shutdown's body guard, for a streamed body with bytes left:
        // taken before the request stops counting, so that a shutdown never
        // finds the request gone and its body not yet counted.
        let open = match (&out, &self.cfg.shutdown) {
            (Ok(res), Some(handle))
                if matches!(res.body(), Payload::Stream { .. }) && !res.body().is_end_stream() =>
            {
                Some(handle.open_body())
            }
            _ => None,
        };
        if from <= Up::Close {
            if let Some(entered) = self.entered.take() {
                if entered.end() {
                    // Counted as cut by the shutdown's report: say so.
                    let name = self.request_name();
                    out = Err(cut_error(name.as_ref()));
                }
            }
        }
        let watch = self.trace.take().map(|trace| trace.finish(&mut out));
        match out {
            Ok(res) => {
                let name = self
                    .replay
                    .as_mut()
                    .and_then(Replay::take_name)
                    .map(|(m, u)| RequestName::new(m, u));
                let deadline = self.deadline;
                let cfg = &self.cfg.body;
                // A committed gRPC call: its status comes in the trailers.
                let grpc = cfg.grpc_trailers
                    && crate::classify::is_grpc(res.headers())
                    && !res.headers().contains_key(crate::grpc::GRPC_STATUS);
                Ok(res.map(|body| {
                    StackBody::new(body, deadline, permit, open, watch, name, cfg)
                        .holding_slot(self.held_slot.take())
                        .watching_grpc(grpc)
                }))
            }
            Err(err) => Err(err),
        }
    }

    fn request_name(&self) -> Option<RequestName> {
        self.name()
    }

    /// `err`, named with the request.
    fn named(&self, err: Error) -> Error {
        match self.replay.as_ref().and_then(Replay::name) {
            Some((m, u)) => err.with_request(m, u),
            None => err,
        }
    }
}

fn cut_error(name: Option<&RequestName>) -> Error {
    let reason = "cut at the end of the grace period";
    match name {
        Some(name) => closed(name, Sent::MaybeProcessed, reason),
        None => {
            let mut err = Error::new(crate::error::ErrorKind::Closed).with_detail(reason);
            err.extensions_mut().insert(Sent::MaybeProcessed);
            err.extensions_mut().insert(Verdict::Fatal {
                reason: Reason::new_static("closed"),
            });
            err
        }
    }
}

/// What a request-level admission came to.
enum Admission<B, ResB> {
    /// Admitted: on to the retry loop.
    Ready(Request<B>),
    /// It waits (the holding gate, the concurrency queue).
    Waiting(Wait<Admitted>, Waited, Request<B>),
    /// Refused before any attempt: its outcome, complete (boxed: off the
    /// happy path).
    Finished(Box<Result<Response<StackBody<ResB>>, Error>>),
}

impl<S, B, ResB, C> fmt::Debug for ResponseFuture<S, B, ResB, C>
where
    S: Service<Request<B>>,
    B: RetryBody,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Holding { .. } => "holding",
            State::Calling { .. } => "calling",
            State::Collecting { .. } => "collecting",
            State::Reconciling { .. } => "reconciling",
            State::Readying => "readying",
            State::Sleeping { .. } => "sleeping",
            State::Ready { .. } => "ready",
            State::Done => "done",
        };
        let attempt = self.r.replay.as_ref().map_or(0, |r| r.attempt);
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempt", &attempt)
            .finish()
    }
}

impl<S, B, ResB, C> Future for ResponseFuture<S, B, ResB, C>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    B: RetryBody,
    ResB: Body,
    ResB::Error: Into<BoxError>,
    C: Classifier<ResB>,
{
    type Output = Result<Response<StackBody<ResB>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let r = &mut *this.r;
        // Everything below runs in the request span, as under the trace
        // layer.
        let span = r.trace.as_ref().map(|t| t.span.clone());
        let _entered = span.as_ref().map(tracing::Span::enter);

        // The shutdown's cut first: once the grace period ended, the
        // caller gets `Closed` even if the attempt is also ready.
        if let Some(cut) = this.cut.as_mut().as_pin_mut() {
            if cut.poll(cx).is_ready() {
                this.cut.set(None);
                this.state.set(State::Done);
                if let Some(attempt) = r.attempt.take() {
                    attempt.cancelled();
                }
                let name = r.request_name();
                if let Some(entered) = r.entered.take() {
                    entered.end();
                }
                let mut out: Result<Response<Payload<ResB>>, Error> = Err(cut_error(name.as_ref()));
                if let Some(trace) = r.trace.take() {
                    trace.finish(&mut out);
                }
                return Poll::Ready(out.map(|_| unreachable!("an error")));
            }
        }
        // Then the caller's token.
        if let Some(cancel) = r.cancel.as_mut() {
            if cancel.as_mut().poll(cx).is_ready() {
                r.cancel = None;
                if matches!(*this.state, State::Ready { .. } | State::Done) {
                    // Already complete: the outcome stands.
                } else {
                    this.state.set(State::Done);
                    if let Some(attempt) = r.attempt.take() {
                        attempt.cancelled();
                    }
                    r.slot = None;
                    r.track = None;
                    let err = match r.replay.as_ref().and_then(Replay::name) {
                        Some((m, u)) => cancelled_error(m, u),
                        None => {
                            let mut err = Error::new(crate::error::ErrorKind::Cancelled);
                            err.extensions_mut().insert(Verdict::Fatal {
                                reason: Reason::new_static("cancelled by the caller"),
                            });
                            err
                        }
                    };
                    r.permit = None;
                    return Poll::Ready(r.complete(Err(err), Up::Close));
                }
            }
        }

        loop {
            match this.state.as_mut().project() {
                StateProj::Ready { out } => {
                    let out = out.take().expect("polled after completion");
                    this.state.set(State::Done);
                    return Poll::Ready(*out);
                }
                StateProj::Admitting { wait, what, req } => {
                    let what = *what;
                    if r.poll_closed(cx) {
                        let req = req.as_ref().expect("waiting with its request");
                        let detail = match what {
                            Waited::Gate => "shut down while held at the gate",
                            Waited::Permit => "shut down while queued for a concurrency permit",
                        };
                        let err = closed_while_waiting(req, detail);
                        let up = match what {
                            Waited::Gate => Up::Hold,
                            Waited::Permit => Up::Permit,
                        };
                        let out = r.complete(Err(err), up);
                        this.state.set(State::Done);
                        return Poll::Ready(out);
                    }
                    let admitted = match wait.as_mut().poll(cx) {
                        Poll::Ready(admitted) => admitted,
                        Poll::Pending => {
                            if this.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            // The deadline layer's own timer.
                            let req = req.as_ref().expect("waiting with its request");
                            let err =
                                RequestName::of(req).name(Error::timeout(TimeoutStage::Deadline));
                            let out = r.complete(Err(err), Up::Close);
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                    };
                    let req = req.take().expect("waiting with its request");
                    let admission = match admitted {
                        Err(err) => {
                            let up = match what {
                                Waited::Gate => Up::Hold,
                                Waited::Permit => Up::Permit,
                            };
                            let out = r.complete(Err(err), up);
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                        Ok(Admitted::GateOpen) => Self::admit_permit(r, *req),
                        Ok(Admitted::Permit(permit)) => {
                            r.permit = Some(permit);
                            r.queued_state = r.cfg.concurrency.as_ref().map(|l| l.observed());
                            Self::admit_gate(r, *req)
                        }
                    };
                    let (state, until) = match admission {
                        Admission::Ready(req) => match Self::first(r, req, None) {
                            Flow::Go(state, until) => (state, until),
                            Flow::Done(out) => {
                                this.state.set(State::Done);
                                return Poll::Ready(out);
                            }
                        },
                        Admission::Waiting(wait, what, req) => (
                            State::Admitting {
                                wait,
                                what,
                                req: Some(Box::new(req)),
                            },
                            r.deadline,
                        ),
                        Admission::Finished(out) => (State::Ready { out: Some(out) }, r.deadline),
                    };
                    this.state.set(state);
                    this.timer.as_mut().reset(until);
                }
                StateProj::Holding { wait, from, req } => {
                    let from = *from;
                    if r.poll_closed(cx) {
                        let req = req.as_ref().expect("waiting with its request");
                        let detail = match from {
                            Step::Call => "shut down while queued for an adaptive-limit slot",
                            Step::Pace | Step::Paced => "shut down while paced for a quota",
                            _ => "shut down while held at the gate",
                        };
                        let err = closed_while_waiting(req, detail);
                        go!(this, Self::judged(r, Err(err), From::Admission));
                        continue;
                    }
                    let waited = match wait.as_mut().poll(cx) {
                        Poll::Ready(waited) => waited,
                        Poll::Pending => {
                            if this.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            let req = req.as_ref().expect("waiting with its request");
                            let err =
                                RequestName::of(req).name(Error::timeout(TimeoutStage::Deadline));
                            this.state.set(State::Done);
                            let attempt = r.attempt.take();
                            r.slot = None;
                            r.track = None;
                            let out = r.complete(Err(err), Up::Close);
                            if let Some(attempt) = attempt {
                                attempt.cancelled();
                            }
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                    };
                    let req = req.take().expect("waiting with its request");
                    let started = match waited {
                        Err(err) => Started::Failed(err),
                        Ok(slot) => {
                            if slot.is_some() {
                                r.slot = slot;
                            }
                            let span = r.attempt.as_ref().map(|a| a.span.clone());
                            let _entered = span.as_ref().map(tracing::Span::enter);
                            Self::admit_attempt(r, *req, from, None)
                        }
                    };
                    go!(this, Self::started(r, started));
                }
                StateProj::Calling { fut } => {
                    let span = r.attempt.as_ref().map(|a| a.span.clone());
                    let entered = span.as_ref().map(tracing::Span::enter);
                    let out = match fut.poll(cx) {
                        Poll::Ready(out) => out.map_err(|e| {
                            let err = Error::from_boxed(e.into());
                            match r.replay.as_ref().and_then(Replay::name) {
                                Some((m, u)) => err.with_request(m, u),
                                None => err,
                            }
                        }),
                        Poll::Pending => {
                            if this.timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            let name = r.request_name().expect("an attempt has a name");
                            Err(crate::attempt_timeout::future::timed_out(r.stage, name))
                        }
                    };
                    drop(entered);
                    go!(this, Self::judged(r, out, From::Transport));
                }
                StateProj::Collecting { collect } => {
                    let c = collect.as_mut().project();
                    let (mut body, parts, buf, clock) = (c.body, c.parts, c.buf, c.clock);
                    let max = r.collect.unwrap_or(usize::MAX);
                    // Bounded by the cap: every data frame adds to the
                    // buffer's length or is empty.
                    let done = loop {
                        let timer = this.timer.as_mut();
                        let frame = match clock.poll_frame(timer, body.as_mut(), cx) {
                            Poll::Ready(frame) => frame,
                            Poll::Pending => return Poll::Pending,
                        };
                        match frame {
                            None => {
                                let parts = parts.take().expect("polled after completion");
                                let body = std::mem::take(buf).finish();
                                break Ok(Response::from_parts(parts, Payload::collected(body)));
                            }
                            Some(Err(TimedError::Timeout(stage))) => {
                                break Err(timeout_error(stage))
                            }
                            Some(Err(TimedError::Body(err))) => {
                                break Err(body_error((r.cfg.body.errors)(err.into()).into()))
                            }
                            Some(Ok(frame)) => {
                                if let Err(err) = buf.push(frame, max) {
                                    break Err(err);
                                }
                            }
                        }
                    };
                    let done = done.map_err(|err| r.named(err));
                    go!(this, Self::judged_on(r, done, From::Collect));
                }
                StateProj::Sleeping { drain, until, held } => {
                    let closed = poll_closed_for(&mut r.closing, &r.cfg.shutdown, cx);
                    let replay = r.replay.as_mut().expect("sleeping in a loop");
                    let held = match replay.poll_sleep(
                        cx,
                        closed,
                        this.timer.as_mut(),
                        drain,
                        *until,
                        held,
                    ) {
                        Slept::Pending => return Poll::Pending,
                        Slept::Return(out) => {
                            go!(this, Self::loop_done(r, out));
                            continue;
                        }
                        Slept::Ready(held) => held,
                    };
                    if let Some(h) = held {
                        if let Some(out) = replay.resume(*h) {
                            go!(this, Self::loop_done(r, out));
                            continue;
                        }
                    }
                    this.state.set(State::Readying);
                }
                StateProj::Reconciling { check, out } => {
                    let checked = match check.as_mut().poll(cx) {
                        Poll::Ready(checked) => checked,
                        Poll::Pending => return Poll::Pending,
                    };
                    let out = *out.take().expect("polled after completion");
                    let hook = r.cfg.reconcile.as_ref().expect("reconciling with a check");
                    let id = r.operation.clone().expect("reconciling an operation");
                    let name = r.request_name().expect("an attempt has a name");
                    let out =
                        hook.settle(checked, id, out, &name, |res| res.map(Payload::collected));
                    go!(this, Self::decided(r, out));
                }
                StateProj::Readying => {
                    match r.svc.poll_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => {
                            let replay = r.replay.as_mut().expect("readying in a loop");
                            // The attempts made so far; the last outcome is
                            // gone.
                            replay.attempt -= 1;
                            let out = replay.finish(Err(Error::from_boxed(e.into())), None);
                            go!(this, Self::loop_done(r, out));
                        }
                        Poll::Ready(Ok(())) => {
                            let req = r
                                .replay
                                .as_mut()
                                .and_then(|replay| replay.next.take())
                                .expect("a retry is only planned with its request");
                            go!(this, Self::attempt(r, *req, None));
                        }
                    }
                }
                StateProj::Done => panic!("stack ResponseFuture polled after completion"),
            }
        }
    }
}

/// [`Req::poll_closed`] on the parts a sleeping request lends (its loop is
/// borrowed at the same time).
fn poll_closed_for(
    closing: &mut Option<ClosedFuture>,
    shutdown: &Option<crate::shutdown::ShutdownHandle>,
    cx: &mut Context<'_>,
) -> bool {
    if closing.is_none() {
        let signal = match shutdown {
            Some(handle) => Some(handle.closing().clone()),
            None => Closing::current(),
        };
        *closing = signal.map(Closing::closed_owned);
    }
    closing
        .as_mut()
        .is_some_and(|c| c.as_mut().poll(cx).is_ready())
}

/// A request the Retry-After gate fails fast fails by the pacer's word
/// first, if the pacer holds its host past the deadline too (a daily
/// quota, a `quota-exceeded` 429 whose reset is hours away), as the layers
/// stack (the pacer outside the gate): the error is
/// [`QuotaExhausted`](crate::ErrorKind::QuotaExhausted), naming the quota
/// and its reset. Off the happy path: only for a request already failing.
fn out_of_quota<B>(
    rate_limit: Option<&crate::ratelimit::RateLimitLayer>,
    req: &Request<B>,
    deadline: Instant,
    now: Instant,
) -> Option<Error> {
    let (reset, dimension) = rate_limit?.pacer.out_past(now, req.uri(), Some(deadline))?;
    Some(exhausted(req, reset, dimension, now))
}
