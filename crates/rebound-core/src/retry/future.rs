//! The response future of [`Retry`](super::Retry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http::request::Parts;
use http::{Method, Request, Response, Uri};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_service::Service;

use super::policy::RetryPolicy;
use crate::annotations::{
    AttemptNumber, Attempts, BudgetLeft, ClosingWait, DelaySource, Hedged, LimiterState,
    PreviousAttempt, ProposedDelay, Reason, RetryAfterHint, RetryStop, Sent, Verdict,
};
use crate::body::RetryBody;
use crate::error::{BoxError, Error};

/// At most this many bytes of a discarded response are read.
const DRAIN_MAX_BYTES: usize = 64 * 1024;
/// A discarded response is read for at most this long (and never past the
/// sleep).
pub(crate) const DRAIN_MAX_TIME: Duration = Duration::from_secs(1);
/// Frames read per poll before yielding, so a body that is always ready
/// cannot starve the executor.
const DRAIN_FRAMES_PER_POLL: usize = 32;
/// A retry held for its request body waits past its delay, within the
/// deadline, only while the body keeps moving: it gives up once the body
/// has not moved for this long.
const UPLOAD_IDLE_MAX: Duration = Duration::from_secs(1);

pin_project! {
    /// The response future of [`Retry`](super::Retry).
    ///
    /// Dropping it ends everything at once: the attempt in flight, the
    /// sleep, the drain of a discarded response.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, ResB>
    where
        S: Service<Request<B>>,
        B: RetryBody,
    {
        #[pin]
        state: State<S::Future, ResB>,
        replay: Replay<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, ResB> {
        // An attempt is in flight.
        Called {
            #[pin]
            fut: F,
        },
        // Waiting before the next attempt, draining the discarded response
        // (or holding it, while the request body may still end).
        Sleeping {
            #[pin]
            sleep: Sleep,
            drain: Option<Drain<ResB>>,
            until: Instant,
            held: Option<Box<Held<ResB>>>,
            // A shutdown's "stop waiting" signal, when the task carries one
            // (boxed, off the happy path: only a request that sleeps).
            closing: ClosingWait,
        },
        // Waiting for the inner service to be ready for the next attempt
        // (once the held retry, if any, has its body).
        Readying {
            held: Option<Box<Held<ResB>>>,
        },
        Done,
    }
}

/// Everything the loop keeps between attempts (not pinned).
pub(crate) struct Replay<S, B: RetryBody> {
    /// The inner service, when a retry is possible.
    pub(crate) service: Option<S>,
    /// The request head and what the body kept, to copy for each retry.
    pub(crate) template: Option<(Parts, B::Kept)>,
    /// The next attempt's request, made before the sleep.
    /// (Boxed: only a request that is retried has one.)
    pub(crate) next: Option<Box<Request<B>>>,
    /// Method and URI for naming errors, when there is no template.
    /// (Boxed: only a request that cannot be retried has no template.)
    pub(crate) name: Option<Box<(Method, Uri)>>,
    pub(crate) replayable: bool,
    pub(crate) idempotent: bool,
    pub(crate) deadline: Option<Instant>,
    pub(crate) policy: RetryPolicy,
    /// The number of the attempt in flight (1-based).
    pub(crate) attempt: u32,
    /// Whether the attempt in flight took a token from the budget (a retry
    /// the server invited with a Retry-After takes none).
    pub(crate) withdrew: bool,
    /// Whether the one transparent retry of a gRPC call that was never
    /// sent (gRFC A6) has been made.
    pub(crate) transparent: bool,
}

/// Reads a discarded response body, bounded in bytes, so its connection can
/// be reused.
pub(crate) struct Drain<B> {
    body: Pin<Box<B>>,
    read: usize,
}

impl<B: Body> Drain<B> {
    /// `true` when the drain is over (end, error, or byte cap).
    pub(crate) fn poll_done(&mut self, cx: &mut Context<'_>) -> bool {
        for _ in 0..DRAIN_FRAMES_PER_POLL {
            match self.body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.read += data.remaining();
                        if self.read >= DRAIN_MAX_BYTES {
                            return true;
                        }
                    }
                }
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => return true,
                Poll::Pending => return false,
            }
        }
        cx.waker().wake_by_ref();
        false
    }
}

/// What one poll of the wait before the next attempt came to (see
/// [`Replay::poll_sleep`]).
pub(crate) enum Slept<ResB> {
    /// Still waiting.
    Pending,
    /// The loop is over: its outcome.
    Return(Result<Response<ResB>, Error>),
    /// The wait is over: the next attempt, once the retry held for its
    /// body (if any) is [resumed](Replay::resume) and the service ready.
    Ready(Option<Box<Held<ResB>>>),
}

pub(crate) enum Decision<ResB> {
    Return(Result<Response<ResB>, Error>),
    Retry {
        until: Instant,
        drain: Option<Drain<ResB>>,
        held: Option<Box<Held<ResB>>>,
    },
}

/// What the next attempt's request is made from.
pub(crate) struct Plan {
    /// The attempt that just failed.
    n: u32,
    verdict: Verdict,
    hint: Option<Duration>,
    proposed: ProposedDelay,
    limiter: Option<LimiterState>,
}

/// A retry decided but for its body, which was still being sent: the
/// outcome to return if the body cannot be sent whole after the wait.
pub(crate) struct Held<ResB> {
    pub(crate) outcome: Result<Response<ResB>, Error>,
    plan: Plan,
    /// When the body last moved (a chunk read into the replay buffer).
    moved: Instant,
    /// Whether there is nothing more to read into the buffer: the body
    /// ended, passed its cap or failed.
    buffered: bool,
}

fn budget_left(budget: &super::RetryBudget) -> u32 {
    u32::try_from(budget.remaining()).unwrap_or(u32::MAX)
}

fn extensions_mut<ResB>(outcome: &mut Result<Response<ResB>, Error>) -> &mut http::Extensions {
    match outcome {
        Ok(res) => res.extensions_mut(),
        Err(err) => err.extensions_mut(),
    }
}

impl<S, B> Replay<S, B>
where
    B: RetryBody,
{
    /// Everything the loop keeps for `req`, under `policy`, and the first
    /// attempt's request: counts the request in the budget, decides its
    /// eligibility, and keeps the head and a replay of the body when a
    /// retry is possible. The service (for [`Retry`](super::Retry)'s own
    /// loop) is set by the caller when [`may_retry`](Self::may_retry).
    pub(crate) fn prepare(
        policy: &RetryPolicy,
        req: Request<B>,
        deadline: Option<Instant>,
    ) -> (Request<B>, Self) {
        policy.budget.deposit();
        let (parts, body) = req.into_parts();
        let idempotent = super::is_idempotent(policy, &parts);
        // The request's own count (`MaxAttempts`), if it carries one: the
        // loop below counts against the copy of the policy it keeps.
        let max_attempts = policy.max_attempts_for(&parts.extensions);
        let (body, template, replayable) = if max_attempts <= 1 {
            (body, None, true)
        } else {
            match body.keep() {
                (body, Some(kept)) => (body, Some((parts.clone(), kept)), true),
                (body, None) => (body, None, false),
            }
        };
        let name = if template.is_none() {
            Some(Box::new((parts.method.clone(), parts.uri.clone())))
        } else {
            None
        };
        let replay = Replay {
            service: None,
            template,
            next: None,
            name,
            replayable,
            idempotent,
            deadline,
            policy: {
                let mut policy = policy.clone();
                policy.max_attempts = max_attempts;
                policy
            },
            attempt: 1,
            withdrew: false,
            transparent: false,
        };
        (Request::from_parts(parts, body), replay)
    }

    /// Whether a retry can be made at all (a head and body copy are kept).
    pub(crate) fn may_retry(&self) -> bool {
        self.template.is_some()
    }

    #[cfg(feature = "stack")]
    /// The method and URI errors are named with, moved out (for the response
    /// body of a stack that returns now): no clone.
    pub(crate) fn take_name(&mut self) -> Option<(Method, Uri)> {
        match self.template.take() {
            Some((parts, _)) => Some((parts.method, parts.uri)),
            None => self.name.take().map(|n| *n),
        }
    }

    pub(crate) fn name(&self) -> Option<(&Method, &Uri)> {
        match (&self.template, &self.name) {
            (Some((parts, _)), _) => Some((&parts.method, &parts.uri)),
            (None, Some(name)) => Some((&name.0, &name.1)),
            (None, None) => None,
        }
    }

    /// The outcome of a request whose sleep a shutdown ended: its last
    /// attempt's response was drained, so a `Closed` error (fatal) that
    /// carries that attempt's verdict as [`PreviousAttempt`].
    pub(crate) fn closed_error(&mut self) -> Error {
        let mut err = Error::new(crate::error::ErrorKind::Closed)
            .with_detail("shut down while waiting to retry");
        let previous = self
            .next
            .as_ref()
            .and_then(|r| r.extensions().get::<PreviousAttempt>().cloned());
        let ext = err.extensions_mut();
        ext.insert(Verdict::Fatal {
            reason: Reason::new_static("closed"),
        });
        if let Some(p) = previous {
            ext.insert(p);
        }
        err
    }

    /// Annotate and hand back the last real outcome.
    pub(crate) fn finish<ResB>(
        &self,
        mut outcome: Result<Response<ResB>, Error>,
        stop: Option<RetryStop>,
    ) -> Result<Response<ResB>, Error> {
        let attempts = self.attempt;
        if let Some(stop) = stop {
            tracing::debug!(attempts, stop = stop.as_str(), "retry: stopped");
        }
        if attempts > 1 || stop.is_some() {
            let ext = extensions_mut(&mut outcome);
            if attempts > 1 {
                ext.insert(Attempts(attempts));
            }
            if let Some(stop) = stop {
                ext.insert(stop);
            }
            // Off the happy path only: what the budget would still allow,
            // for the trace layers and metrics.
            ext.insert(BudgetLeft(budget_left(&self.policy.budget)));
        }
        match self.name() {
            Some((method, uri)) => outcome.map_err(|e| e.with_request(method, uri)),
            None => outcome,
        }
    }

    /// Retry, or stop with the outcome.
    pub(crate) fn decide<ResB: Body>(
        &mut self,
        mut outcome: Result<Response<ResB>, Error>,
    ) -> Decision<ResB> {
        let n = self.attempt;
        if let None | Some(Verdict::Success) = extensions_mut(&mut outcome).get::<Verdict>() {
            if n > 1 && self.withdrew {
                // A retry that worked gives its token back (see
                // `RetryBudget::refund`).
                self.policy.budget.refund();
            }
            return Decision::Return(self.finish(outcome, None));
        }
        // A failed gRPC call whose method has its own retryable codes
        // (gRFC A6's per-method policy) is judged by them.
        #[cfg(feature = "grpc")]
        self.judge_by_call_codes(&mut outcome);
        let ext = extensions_mut(&mut outcome);
        let sent = match ext.get::<Verdict>() {
            None | Some(Verdict::Success) => unreachable!("returned above"),
            Some(Verdict::Fatal { .. }) => {
                // A wait below (a gate, a limit's queue) that a shutdown
                // ended: stopped by the shutdown, as a backoff sleep is,
                // and that attempt was never made.
                let closed = matches!(&outcome, Err(e) if e.kind() == crate::error::ErrorKind::Closed
                    && e.extensions().get::<Sent>() == Some(&Sent::NotSent));
                if closed && n > 1 {
                    self.attempt -= 1;
                }
                // A retry shed by client-side throttling was never sent:
                // its budget token goes back.
                let shed = matches!(&outcome, Err(e) if e.kind() == crate::error::ErrorKind::ClientThrottled);
                if shed && n > 1 && self.withdrew {
                    self.policy.budget.refund();
                }
                let stop = if closed {
                    RetryStop::Closed
                } else {
                    RetryStop::Fatal
                };
                return Decision::Return(self.finish(outcome, Some(stop)));
            }
            Some(Verdict::Retryable { sent, .. }) => *sent,
        };
        // A hedged group already sent its copies: hedged or retried, not
        // both (gRFC A6).
        if ext.get::<Hedged>().is_some() {
            return Decision::Return(self.finish(outcome, Some(RetryStop::Hedged)));
        }
        if !self.replayable {
            ext.insert(Verdict::Fatal {
                reason: Reason::new_static("body not replayable"),
            });
            return Decision::Return(self.finish(outcome, Some(RetryStop::NotReplayable)));
        }
        if !(self.idempotent || sent == Sent::NotSent) {
            if matches!(&outcome, Ok(res) if crate::classify::is_grpc(res.headers())) {
                warn_grpc_not_eligible();
            }
            return Decision::Return(self.finish(outcome, Some(RetryStop::NotEligible)));
        }
        if n >= self.policy.max_attempts {
            // gRFC A6's transparent retry: a gRPC call that never left the
            // client (connect refused, REFUSED_STREAM, GOAWAY above its
            // stream) is sent once more outside the attempt count; the
            // budget, the deadline and the backoff still apply.
            let transparent = sent == Sent::NotSent
                && !self.transparent
                && self
                    .template
                    .as_ref()
                    .is_some_and(|(parts, _)| crate::classify::is_grpc(&parts.headers));
            if !transparent {
                return Decision::Return(self.finish(outcome, Some(RetryStop::Attempts)));
            }
            self.transparent = true;
            tracing::debug!(
                attempt = n,
                "retry: a gRPC call that was never sent gets one transparent retry"
            );
        }
        let hint = ext.get::<RetryAfterHint>().map(|h| h.0);
        let proposed = match (ext.get::<ProposedDelay>(), hint) {
            (Some(p), _) => *p,
            (None, Some(h)) => ProposedDelay {
                delay: h,
                source: DelaySource::RetryAfter,
            },
            (None, None) => ProposedDelay {
                delay: Duration::ZERO,
                source: DelaySource::Backoff,
            },
        };
        let now = Instant::now();
        let until = now.checked_add(proposed.delay);
        let fits = match (until, self.deadline) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(until), Some(deadline)) => until < deadline,
        };
        if !fits {
            return Decision::Return(self.finish(outcome, Some(RetryStop::Deadline)));
        }
        let plan = Plan {
            n,
            verdict: Verdict::of(ext).into_owned(),
            hint,
            proposed,
            limiter: ext.get::<LimiterState>().copied(),
        };
        // The body copy before the budget: a retry that cannot be sent (the
        // body passed its replay cap) must not cost a retry token.
        let Some(body) = self.replay_body() else {
            if self.may_become_whole() {
                // A streamed body still being sent by this attempt: decide
                // after the wait, when it may have ended (or passed its
                // cap). The outcome is kept, undrained, to be returned if
                // the retry cannot be made then.
                tracing::debug!(
                    attempt = n,
                    "retry: request body still streaming; deciding after the wait"
                );
                return Decision::Retry {
                    until: until.unwrap_or(now),
                    drain: None,
                    held: Some(Box::new(Held {
                        outcome,
                        plan,
                        moved: now,
                        buffered: false,
                    })),
                };
            }
            ext.insert(Verdict::Fatal {
                reason: Reason::new_static("body not replayable"),
            });
            return Decision::Return(self.finish(outcome, Some(RetryStop::NotReplayable)));
        };
        if let Err(stop) = self.plan(plan, body) {
            return Decision::Return(self.finish(outcome, Some(stop)));
        }
        let drain = match outcome {
            Ok(res) => Some(Drain {
                body: Box::pin(res.into_body()),
                read: 0,
            }),
            Err(_) => None,
        };
        Decision::Retry {
            until: until.unwrap_or(now),
            drain,
            held: None,
        }
    }

    /// With [`CallCodes`](crate::grpc::CallCodes) on the request: the
    /// verdict on a failed gRPC head by the call's own codes.
    #[cfg(feature = "grpc")]
    fn judge_by_call_codes<ResB>(&self, outcome: &mut Result<Response<ResB>, Error>) {
        let (Ok(res), Some((parts, _))) = (outcome, &self.template) else {
            return;
        };
        let Some(crate::grpc::CallCodes(codes)) = parts.extensions.get() else {
            return;
        };
        let verdict = codes.classify_head(res.status(), res.headers());
        // Only a verdict a gRPC classifier gave on the same code (its
        // reason names the code) is replaced: one another layer gave (a
        // negative pushback's "do not retry") stands.
        let same_code = match (Verdict::of(res.extensions()).reason(), verdict.reason()) {
            (Some(was), Some(now)) => was.as_str() == now.as_str(),
            _ => false,
        };
        if same_code {
            res.extensions_mut().insert(verdict);
        }
    }

    /// Withdraw a retry token and make the next attempt's request with
    /// `body`; the reason to stop if that cannot be done.
    fn plan(&mut self, plan: Plan, body: B) -> Result<(), RetryStop> {
        // A retry the server asked for with a Retry-After (a 429, a 503 with
        // a pause) is paced by the server's own word, and the gate holds
        // the host meanwhile: it takes no token. The budget bounds the
        // retries a client makes on its own, so that a 429 storm the
        // retries can wait out turns into no caller error.
        self.withdrew = plan.hint.is_none();
        if self.withdrew && !self.policy.budget.try_withdraw() {
            return Err(RetryStop::Budget);
        }
        let Plan {
            n,
            verdict,
            hint,
            proposed,
            limiter,
        } = plan;
        tracing::debug!(
            attempt = n,
            reason = verdict.reason().map(Reason::as_str).unwrap_or(""),
            delay_ms = proposed.delay.as_millis() as u64,
            source = proposed.source.as_str(),
            "retry: will retry"
        );
        // `None` is unreachable: a body copy was made, so there is a
        // template.
        let next = self
            .next_request(n, verdict, hint, proposed, limiter, body)
            .ok_or(RetryStop::NotReplayable)?;
        self.next = Some(Box::new(next));
        self.attempt = n + 1;
        Ok(())
    }

    /// After the wait, the retry that was waiting for its body: planned if
    /// the body can now be sent whole, else the held outcome, returned.
    pub(crate) fn resume<ResB>(
        &mut self,
        held: Held<ResB>,
    ) -> Option<Result<Response<ResB>, Error>> {
        let Held {
            mut outcome, plan, ..
        } = held;
        let Some(body) = self.replay_body() else {
            extensions_mut(&mut outcome).insert(Verdict::Fatal {
                reason: Reason::new_static("body not replayable"),
            });
            return Some(self.give_up(outcome, RetryStop::NotReplayable));
        };
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            // The body became whole too late for another attempt.
            return Some(self.give_up(outcome, RetryStop::Deadline));
        }
        match self.plan(plan, body) {
            Ok(()) => None,
            Err(stop) => Some(self.give_up(outcome, stop)),
        }
    }

    /// Return a held outcome: annotated as [`finish`](Self::finish) does,
    /// and the kept body let go of, so that the copy still sending it
    /// takes over the real body (and its wake-ups) from the buffering.
    fn give_up<ResB>(
        &mut self,
        outcome: Result<Response<ResB>, Error>,
        stop: RetryStop,
    ) -> Result<Response<ResB>, Error> {
        let out = self.finish(outcome, Some(stop));
        if let Some((parts, _kept)) = self.template.take() {
            self.name = Some(Box::new((parts.method, parts.uri)));
        }
        out
    }

    /// While a retry is held for its body: read the body into its replay
    /// buffer (the attempt that got the answer may no longer be sending
    /// it, so no one else may), noting when it moved and when it is over.
    fn buffer<ResB>(&mut self, held: &mut Held<ResB>, cx: &mut Context<'_>) {
        if held.buffered {
            return;
        }
        let Some((_, kept)) = self.template.as_mut() else {
            held.buffered = true;
            return;
        };
        let mut moved = false;
        for _ in 0..DRAIN_FRAMES_PER_POLL {
            match B::poll_buffer(kept, cx) {
                Poll::Ready(Some(_)) => moved = true,
                Poll::Ready(None) => {
                    held.buffered = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if moved {
            held.moved = Instant::now();
        }
        if !held.buffered && moved {
            // Read a whole batch, or stopped at `Pending` after moving:
            // come back (a batch may have ended without `Pending`).
            cx.waker().wake_by_ref();
        }
    }

    /// One poll of the wait before the next attempt: the shutdown's
    /// signal (`closed`), the drain of the discarded response, the body a
    /// held retry waits for, the `sleep` until `until` (and past it while
    /// a held body keeps moving). Shared by [`Retry`](super::Retry)'s
    /// future and the whole-stack service.
    pub(crate) fn poll_sleep<ResB: Body>(
        &mut self,
        cx: &mut Context<'_>,
        closed: bool,
        mut sleep: Pin<&mut Sleep>,
        drain: &mut Option<Drain<ResB>>,
        until: Instant,
        held: &mut Option<Box<Held<ResB>>>,
    ) -> Slept<ResB> {
        if closed {
            // Shut down: no further attempt. The outcome held whole is
            // returned as it is; a drained one as a `Closed` error carrying
            // its verdict.
            let out = match held.take() {
                Some(h) => self.give_up(h.outcome, RetryStop::Closed),
                None => {
                    // The next attempt was planned, not made.
                    self.attempt -= 1;
                    let err = Err(self.closed_error());
                    self.finish(err, Some(RetryStop::Closed))
                }
            };
            return Slept::Return(out);
        }
        if let Some(d) = drain {
            if d.poll_done(cx) {
                *drain = None;
            }
        }
        if let Some(h) = held {
            // Held for its body: read it into the buffer while waiting
            // (see "Waiting for the rest of the body" in `crate::replay`).
            self.buffer(h, cx);
            if h.buffered {
                if !self.may_become_whole() {
                    // Passed its cap, or failed: no retry can be sent
                    // whole; the held outcome now.
                    return match held.take().and_then(|h| self.resume(*h)) {
                        Some(out) => Slept::Return(out),
                        None => Slept::Ready(None),
                    };
                }
                if Instant::now() >= until {
                    return Slept::Ready(held.take());
                }
            }
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Slept::Pending;
            }
            // The drain never outlives its window.
            *drain = None;
            let now = Instant::now();
            if now < until {
                sleep.as_mut().reset(until);
                continue;
            }
            if let Some(h) = held.as_ref().filter(|h| !h.buffered) {
                // Past the delay with the body still coming: wait on while
                // it moves, within the deadline.
                let limit = self.hold_until(h);
                if now < limit {
                    sleep.as_mut().reset(limit);
                    continue;
                }
            }
            return Slept::Ready(held.take());
        }
    }

    /// How long a held retry may still wait for its body, past its delay:
    /// until the body has been still for [`UPLOAD_IDLE_MAX`], and never
    /// past the deadline.
    fn hold_until<ResB>(&self, held: &Held<ResB>) -> Instant {
        let idle = held.moved + UPLOAD_IDLE_MAX;
        match self.deadline {
            Some(deadline) => idle.min(deadline),
            None => idle,
        }
    }

    /// Whether the body, not whole now, may become so: it is still within
    /// its cap (a copy can be made), only not known to finish within it.
    fn may_become_whole(&self) -> bool {
        self.template
            .as_ref()
            .is_some_and(|(_, kept)| B::may_replay(kept))
    }

    /// A fresh copy of the body for the next attempt, if it can be sent
    /// again **whole**: a copy that might be cut short (a stream another
    /// attempt still reads, past which the cap may yet pass) is not made, so
    /// no truncated attempt is ever started.
    fn replay_body(&self) -> Option<B> {
        B::replay(&self.template.as_ref()?.1)
    }

    /// The request for attempt `n + 1`: `body` (a fresh copy), the template
    /// head, `AttemptNumber`, `BudgetLeft`, `PreviousAttempt` and the last
    /// attempt's `LimiterState` (so that the trace layer's `retrying` event
    /// can show the limiter the retry was decided under).
    fn next_request(
        &self,
        n: u32,
        verdict: Verdict,
        retry_after: Option<Duration>,
        delay: ProposedDelay,
        limiter: Option<LimiterState>,
        body: B,
    ) -> Option<Request<B>> {
        let (parts, _) = self.template.as_ref()?;
        let mut req = Request::from_parts(parts.clone(), body);
        let ext = req.extensions_mut();
        ext.insert(AttemptNumber(n + 1));
        ext.insert(BudgetLeft(budget_left(&self.policy.budget)));
        ext.insert(PreviousAttempt {
            attempt: n,
            verdict,
            retry_after,
            delay: Some(delay),
        });
        if let Some(limiter) = limiter {
            ext.insert(limiter);
        }
        Some(req)
    }
}

impl<S, B, ResB> ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>>,
    B: RetryBody,
{
    pub(crate) fn new(fut: S::Future, replay: Replay<S, B>) -> Self {
        ResponseFuture {
            state: State::Called { fut },
            replay,
        }
    }
}

impl<S, B, ResB> fmt::Debug for ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>>,
    B: RetryBody,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Sleeping { .. } => "sleeping",
            State::Readying { .. } => "readying",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempt", &self.replay.attempt)
            .finish()
    }
}

impl<S, B, ResB> Future for ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    B: RetryBody,
    ResB: Body,
{
    type Output = Result<Response<ResB>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { fut } => {
                    let outcome = ready!(fut.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
                    match this.replay.decide(outcome) {
                        Decision::Return(out) => {
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                        Decision::Retry { until, drain, held } => {
                            // Wake first at the end of the drain window, if
                            // it ends before the sleep does.
                            let first = match &drain {
                                Some(_) => until.min(Instant::now() + DRAIN_MAX_TIME),
                                None => until,
                            };
                            this.state.set(State::Sleeping {
                                sleep: sleep_until(first),
                                drain,
                                until,
                                held,
                                closing: ClosingWait::default(),
                            });
                        }
                    }
                }
                StateProj::Sleeping {
                    sleep,
                    drain,
                    until,
                    held,
                    closing,
                } => {
                    let closed = closing.poll_closed(cx);
                    match this
                        .replay
                        .poll_sleep(cx, closed, sleep, drain, *until, held)
                    {
                        Slept::Pending => return Poll::Pending,
                        Slept::Return(out) => {
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                        Slept::Ready(held) => this.state.set(State::Readying { held }),
                    }
                }
                StateProj::Readying { held } => {
                    if let Some(h) = held.take() {
                        if let Some(out) = this.replay.resume(*h) {
                            this.state.set(State::Done);
                            return Poll::Ready(out);
                        }
                    }
                    let svc = this
                        .replay
                        .service
                        .as_mut()
                        .expect("a retry is only planned with a service");
                    if let Err(e) = ready!(svc.poll_ready(cx)) {
                        this.state.set(State::Done);
                        // The attempts made so far; the last outcome is gone.
                        this.replay.attempt -= 1;
                        let err = this.replay.finish(Err(Error::from_boxed(e.into())), None);
                        return Poll::Ready(err);
                    }
                    let req = this
                        .replay
                        .next
                        .take()
                        .expect("a retry is only planned with its request");
                    let fut = svc.call(*req);
                    this.state.set(State::Called { fut });
                }
                StateProj::Done => panic!("retry ResponseFuture polled after completion"),
            }
        }
    }
}

static WARNED_GRPC_NOT_ELIGIBLE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Once per process: a gRPC call failed retryably and was not retried
/// because no method is marked safe to retry (a gRPC call is a POST).
#[cold]
fn warn_grpc_not_eligible() {
    use std::sync::atomic::Ordering;
    if !WARNED_GRPC_NOT_ELIGIBLE.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "a gRPC call failed with a retryable status and was not retried: its method is \
             not marked retryable (gRPC calls are POSTs); declare the methods with \
             rebound::grpc::RetryableMethods (MarkRetryableLayer, or the client's \
             grpc_retryable_methods) (shown once)"
        );
    }
}
