//! The one wait-then-call response future of the layers that may hold a
//! request before they call their inner service: the Retry-After gate, the
//! adaptive limit and the concurrency limit.
//!
//! Each of them used to hand-write the same three states (waiting for
//! something, then calling the inner service, or failed before calling).
//! [`WaitThenCall`] is those states once, generic over what is awaited
//! (a [`Wait`]) and what the wait yields ([`Wait::Held`], e.g. a permit,
//! kept beside the inner future until its outcome). What each layer does
//! with the outcome (release a slot, close a gate, annotate) stays in its
//! own response future, which wraps this one.
//!
//! The happy path (nothing to wait for) starts in [`WaitThenCall::called`]:
//! the inner future and what it holds, no allocation, no extra poll.

use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Request;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::annotations::{closed_while_waiting, ClosingWait};
use crate::error::{BoxError, Error};

/// Something a request waits for before it is called.
///
/// Waits are `Unpin` (the slow paths box what they poll), so the future
/// that drives them need not pin-project them.
pub(crate) trait Wait: Unpin {
    /// What the wait yields and the call keeps until its outcome (a permit,
    /// a slot, or `()`).
    type Held;

    /// Poll the wait. `req` is the request that waits: a wait may read it
    /// (its deadline), name it in its error, or annotate it before it is
    /// sent. An `Err` fails the request without calling the inner service.
    fn poll_wait<B>(
        &mut self,
        cx: &mut Context<'_>,
        req: &mut Request<B>,
    ) -> Poll<Result<Self::Held, Error>>;

    /// Runs right after the inner service was called with the request, with
    /// what the wait yielded (e.g. to record the limiter's state once the
    /// request is on its way). Default: nothing.
    fn called(&mut self, _held: &mut Self::Held) {}

    /// What the request is doing while it waits, for `Debug`.
    fn name(&self) -> &'static str {
        "waiting"
    }

    /// The detail of the `Closed` error when a shutdown ends the wait
    /// (see [`Closing`](crate::annotations::Closing)).
    fn closed_detail(&self) -> &'static str {
        "shut down while waiting"
    }
}

pin_project! {
    /// Waits for `W` (if the request had to), then calls the inner service
    /// and resolves to its outcome together with what the wait yielded.
    #[project = WaitThenCallProj]
    pub(crate) enum WaitThenCall<W, S, R>
    where
        S: Service<R>,
        W: Wait,
    {
        Waiting {
            wait: W,
            svc: Option<S>,
            req: Option<R>,
            // A shutdown ends the wait (looked up on the first poll: the
            // task's signal is in scope only once the future is polled).
            closing: ClosingWait,
        },
        Called {
            #[pin]
            fut: S::Future,
            held: Option<W::Held>,
        },
        Failed {
            error: Option<Error>,
        },
    }
}

impl<W, S, R> WaitThenCall<W, S, R>
where
    S: Service<R>,
    W: Wait,
{
    /// The happy path: already called, keeping `held`.
    #[inline(always)]
    pub(crate) fn called(fut: S::Future, held: W::Held) -> Self {
        WaitThenCall::Called {
            fut,
            held: Some(held),
        }
    }

    /// The request waits for `wait`, then `svc` (made ready for it) is
    /// called with it.
    pub(crate) fn waiting(wait: W, svc: S, req: R) -> Self {
        WaitThenCall::Waiting {
            wait,
            svc: Some(svc),
            req: Some(req),
            closing: ClosingWait::default(),
        }
    }

    /// Fails at once with `error`; the inner service is not called.
    pub(crate) fn failed(error: Error) -> Self {
        WaitThenCall::Failed { error: Some(error) }
    }

    /// The name of the state, for `Debug`.
    pub(crate) fn state_name(&self) -> &'static str {
        match self {
            WaitThenCall::Waiting { wait, .. } => wait.name(),
            WaitThenCall::Called { .. } => "called",
            WaitThenCall::Failed { .. } => "failed",
        }
    }
}

impl<W, S, B> Future for WaitThenCall<W, S, Request<B>>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    W: Wait,
{
    /// `Err`: the wait failed and the inner service was never called.
    /// `Ok`: the inner service's outcome (its error turned into [`Error`])
    /// and what the wait yielded.
    type Output = Result<(Result<S::Response, Error>, W::Held), Error>;

    // Always inlined into the layer's own `poll`: on the happy path this is
    // one match and the inner future's poll, as the hand-written futures
    // were (also in unoptimised builds, which the benchmark's quick mode
    // measures).
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                WaitThenCallProj::Waiting {
                    wait,
                    svc,
                    req,
                    closing,
                } => {
                    let r = req.as_mut().expect("polled after completion");
                    if closing.poll_closed(cx) {
                        let error = closed_while_waiting(r, wait.closed_detail());
                        self.set(WaitThenCall::Failed { error: None });
                        return Poll::Ready(Err(error));
                    }
                    let waited = ready!(wait.poll_wait(cx, r));
                    let mut held = match waited {
                        Ok(held) => held,
                        Err(error) => {
                            // Drop the request and the service now.
                            self.set(WaitThenCall::Failed { error: None });
                            return Poll::Ready(Err(error));
                        }
                    };
                    let req = req.take().expect("polled after completion");
                    let mut svc = svc.take().expect("polled after completion");
                    let fut = svc.call(req);
                    wait.called(&mut held);
                    self.set(WaitThenCall::Called {
                        fut,
                        held: Some(held),
                    });
                }
                WaitThenCallProj::Called { fut, held } => {
                    let out = match ready!(fut.poll(cx)) {
                        Ok(res) => Ok(res),
                        Err(e) => Err(Error::from_boxed(e.into())),
                    };
                    let Some(held) = held.take() else {
                        panic!("polled after completion")
                    };
                    return Poll::Ready(Ok((out, held)));
                }
                WaitThenCallProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().expect("polled after completion")));
                }
            }
        }
    }
}

/// Move a service that was made ready for one request out of `slot`,
/// leaving a clone for the next `poll_ready` (the idiom of tower's
/// `Service` docs, "Be careful when cloning inner services"). Only requests
/// that wait pay for the clone.
pub(crate) fn take_ready<S: Clone>(slot: &mut S) -> S {
    let clone = slot.clone();
    mem::replace(slot, clone)
}
