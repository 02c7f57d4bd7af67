//! The response future of [`Hedge`](super::Hedge).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tower_service::Service;

use super::latency::Latency;
use crate::annotations::{Hedged, RetryAfterHint, Sent, Verdict};
use crate::body::CloneableBody;
use crate::error::{BoxError, Error};
use crate::retry::RetryBudget;

/// The target of the hedge layer's events.
const TARGET: &str = "rebound::hedge";

pin_project! {
    /// The response future of [`Hedge`](super::Hedge).
    ///
    /// Dropping it drops every copy in flight at once (HTTP/2: the stream
    /// is reset; HTTP/1: the connection is closed) and the hedge timer.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, B, ResB>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        first: Slot<S::Future>,
        #[pin]
        timer: Timer,
        // The estimator to feed and when the original was sent (percentile
        // delays only).
        latency: Option<(Arc<Latency>, Instant)>,
        // Everything a hedge needs; `None` when this request is not hedged.
        hedging: Option<Hedging<S, B, ResB>>,
    }
}

pin_project! {
    #[project = SlotProj]
    enum Slot<F> {
        Live { #[pin] fut: F },
        Gone,
    }
}

pin_project! {
    #[project = TimerProj]
    enum Timer {
        Armed { #[pin] sleep: Sleep },
        Off,
    }
}

/// A hedge in flight.
struct InFlight<F> {
    n: u32,
    started: Instant,
    fut: Pin<Box<F>>,
}

/// The state of a request that may be hedged (not pinned).
pub(super) struct Hedging<S, B, ResB>
where
    S: Service<Request<B>>,
{
    pub(super) service: S,
    /// The head and a replayable body to copy for each hedge.
    pub(super) template: (Parts, B),
    pub(super) delay: Duration,
    pub(super) max: u32,
    pub(super) budget: Arc<RetryBudget>,
    pub(super) deadline: Option<Instant>,
    /// Copies sent, the original included.
    pub(super) sent: u32,
    copies: Vec<InFlight<S::Future>>,
    /// A hedge is due: waiting for the service to be ready.
    due: bool,
    /// No more hedges (budget, body, readiness error).
    stopped: bool,
    /// The last retryable failure, kept in case every copy fails.
    fallback: Option<Result<Response<ResB>, Error>>,
}

impl<S, B, ResB> Hedging<S, B, ResB>
where
    S: Service<Request<B>>,
{
    pub(super) fn new(
        service: S,
        template: (Parts, B),
        delay: Duration,
        max: u32,
        budget: Arc<RetryBudget>,
        deadline: Option<Instant>,
    ) -> Self {
        Hedging {
            service,
            template,
            delay,
            max,
            budget,
            deadline,
            sent: 1,
            copies: Vec::new(),
            due: false,
            stopped: false,
            fallback: None,
        }
    }
}

fn extensions_mut<R>(outcome: &mut Result<Response<R>, Error>) -> &mut http::Extensions {
    match outcome {
        Ok(res) => res.extensions_mut(),
        Err(err) => err.extensions_mut(),
    }
}

/// Whether an outcome may be the answer: a response whose verdict is not
/// retryable, or an error classified fatal that came from the server's
/// side. An error with no verdict (no classifier below) is not, nor one
/// marked [`Sent::NotSent`] (a copy refused before it left, e.g. by an
/// open circuit breaker): another copy may still answer.
fn acceptable<R>(outcome: &Result<Response<R>, Error>) -> bool {
    match outcome {
        Ok(res) => !Verdict::of(res.extensions()).is_retryable(),
        Err(err) => {
            err.extensions().get::<Sent>() != Some(&Sent::NotSent)
                && err
                    .extensions()
                    .get::<Verdict>()
                    .is_some_and(Verdict::is_fatal)
        }
    }
}

impl<S, B, ResB> Hedging<S, B, ResB>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    B: CloneableBody,
{
    fn may_send(&self) -> bool {
        !self.stopped && self.sent < self.max && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Send the next copy (the service is ready); `false` if it could not
    /// be sent (no whole body copy, no budget, past the deadline), and no
    /// more will be.
    fn send(&mut self) -> bool {
        if !self.may_send() {
            self.stopped = true;
            return false;
        }
        // The body copy before the budget: a hedge that cannot be sent must
        // not cost a token.
        let Some(body) = self.template.1.try_replay_whole() else {
            tracing::debug!(target: TARGET, "request body cannot be sent again: no hedge");
            self.stopped = true;
            return false;
        };
        if !self.budget.try_withdraw() {
            tracing::debug!(target: TARGET, { rebound.hedge.copies = self.sent }, "retry budget spent: no hedge");
            self.stopped = true;
            return false;
        }
        let n = self.sent + 1;
        self.sent = n;
        tracing::debug!(
            target: TARGET,
            { rebound.hedge.copy = n },
            "no answer yet: sending a hedge"
        );
        #[cfg(feature = "metrics")]
        crate::metrics::record_hedge_sent(&self.template.0.method);
        let req = Request::from_parts(self.template.0.clone(), body);
        let fut = Box::pin(self.service.call(req));
        self.copies.push(InFlight {
            n,
            started: Instant::now(),
            fut,
        });
        true
    }

    /// The outcome of copy `n`: the answer, if it is acceptable (marked
    /// when hedged); else kept as the fallback.
    fn settle(
        &mut self,
        n: u32,
        mut outcome: Result<Response<ResB>, Error>,
    ) -> Option<Result<Response<ResB>, Error>> {
        if !acceptable(&outcome) {
            self.fallback = Some(outcome);
            return None;
        }
        if self.sent > 1 {
            tracing::info!(
                target: TARGET,
                { rebound.hedge.winner = n, rebound.hedge.copies = self.sent },
                "hedged request answered"
            );
            #[cfg(feature = "metrics")]
            if n > 1 {
                crate::metrics::record_hedge_won(&self.template.0.method);
            }
            extensions_mut(&mut outcome).insert(Hedged {
                copies: self.sent,
                winner: Some(n),
            });
        }
        Some(outcome)
    }

    /// Every copy failed: the last failure, marked when hedged.
    fn finish(&mut self) -> Result<Response<ResB>, Error> {
        let mut outcome = self
            .fallback
            .take()
            .expect("a hedged request ends with an outcome");
        if self.sent > 1 {
            tracing::info!(
                target: TARGET,
                { rebound.hedge.copies = self.sent },
                "hedged request: every copy failed"
            );
            extensions_mut(&mut outcome).insert(Hedged {
                copies: self.sent,
                winner: None,
            });
        }
        outcome
    }
}

impl<S, B, ResB> ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>>,
{
    /// A request that is not hedged (its latency still recorded, if
    /// `latency` is given).
    pub(super) fn passthrough(fut: S::Future, latency: Option<(Arc<Latency>, Instant)>) -> Self {
        ResponseFuture {
            first: Slot::Live { fut },
            timer: Timer::Off,
            latency,
            hedging: None,
        }
    }

    /// A request hedged at `at` if it has no answer by then.
    pub(super) fn hedged(
        fut: S::Future,
        at: Instant,
        latency: Option<(Arc<Latency>, Instant)>,
        hedging: Hedging<S, B, ResB>,
    ) -> Self {
        ResponseFuture {
            first: Slot::Live { fut },
            timer: Timer::Armed {
                sleep: sleep_until(at),
            },
            latency,
            hedging: Some(hedging),
        }
    }
}

impl<S, B, ResB> fmt::Debug for ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("hedging", &self.hedging.is_some())
            .field("sent", &self.hedging.as_ref().map_or(1, |h| h.sent))
            .finish()
    }
}

impl<S, B, ResB> Future for ResponseFuture<S, B, ResB>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    B: CloneableBody,
{
    type Output = Result<Response<ResB>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            // The original.
            if let SlotProj::Live { fut } = this.first.as_mut().project() {
                if let Poll::Ready(out) = fut.poll(cx) {
                    this.first.set(Slot::Gone);
                    let out = out.map_err(|e| Error::from_boxed(e.into()));
                    if let Some((latency, started)) = this.latency.as_ref() {
                        let now = Instant::now();
                        latency.record(now, now.saturating_duration_since(*started));
                    }
                    let Some(h) = this.hedging.as_mut() else {
                        return Poll::Ready(out);
                    };
                    if let Some(won) = h.settle(1, out) {
                        // The losers go now, their bodies unread.
                        h.copies.clear();
                        this.timer.set(Timer::Off);
                        return Poll::Ready(won);
                    }
                }
            }
            let Some(h) = this.hedging.as_mut() else {
                return Poll::Pending;
            };

            // The hedges.
            let mut i = 0;
            while i < h.copies.len() {
                let Poll::Ready(out) = h.copies[i].fut.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                let copy = h.copies.swap_remove(i);
                let out = out.map_err(|e| Error::from_boxed(e.into()));
                if let Some((latency, _)) = this.latency.as_ref() {
                    let now = Instant::now();
                    latency.record(now, now.saturating_duration_since(copy.started));
                }
                if let Some(won) = h.settle(copy.n, out) {
                    this.first.set(Slot::Gone);
                    h.copies.clear();
                    this.timer.set(Timer::Off);
                    return Poll::Ready(won);
                }
            }

            // The hedge delay.
            if let TimerProj::Armed { sleep } = this.timer.as_mut().project() {
                if sleep.poll(cx).is_ready() {
                    this.timer.set(Timer::Off);
                    h.due = h.may_send();
                }
            }

            let in_flight = matches!(*this.first, Slot::Live { .. }) || !h.copies.is_empty();
            if !in_flight && !h.due {
                // Every copy sent so far failed. A hedged group sends its
                // next copy at once (gRFC A6: a retryable failure cuts the
                // hedging delay short), unless the server asked for a
                // pause; a group not yet hedged hands the failure to the
                // retry loop, with its backoff.
                let pushback = h
                    .fallback
                    .as_mut()
                    .is_some_and(|o| extensions_mut(o).get::<RetryAfterHint>().is_some());
                if h.sent > 1 && !pushback && h.may_send() {
                    h.due = true;
                } else {
                    this.timer.set(Timer::Off);
                    return Poll::Ready(h.finish());
                }
            }

            if !h.due {
                return Poll::Pending;
            }
            match h.service.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    let e: BoxError = e.into();
                    tracing::debug!(target: TARGET, error = %e, "service not ready: no hedge");
                    h.due = false;
                    h.stopped = true;
                }
                Poll::Ready(Ok(())) => {
                    h.due = false;
                    if h.send() && h.sent < h.max {
                        let at = Instant::now() + h.delay;
                        if h.deadline.is_none_or(|d| at < d) {
                            this.timer.set(Timer::Armed {
                                sleep: sleep_until(at),
                            });
                        }
                    }
                }
            }
            // Poll the new copy (or end, if nothing is left in flight).
        }
    }
}
