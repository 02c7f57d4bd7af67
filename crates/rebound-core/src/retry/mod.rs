//! The retry loop: the only place that repeats a request and sleeps between
//! attempts.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use rebound_core::backoff::{Backoff, BackoffLayer};
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::retry::{RetryLayer, RetryPolicy};
//! use rebound_core::retry_after::RetryAfterLayer;
//! use rebound_core::{Attempts, BoxError};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let calls = Arc::new(AtomicU32::new(0));
//! let inner = {
//!     let calls = calls.clone();
//!     tower::service_fn(move |_req: Request<Full<Bytes>>| {
//!         // The first call fails with a 503, the second succeeds.
//!         let n = calls.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             let status = if n == 0 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
//!             let mut res = Response::new(Full::new(Bytes::from_static(b"hi")));
//!             *res.status_mut() = status;
//!             Ok::<_, BoxError>(res)
//!         }
//!     })
//! };
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
//!     .layer(BackoffLayer::new(Backoff::exponential(
//!         Duration::from_millis(100),
//!         Duration::from_secs(10),
//!     )))
//!     .layer(RetryAfterLayer::new())
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(inner);
//!
//! let req = Request::get("http://api.example/v1").body(Full::new(Bytes::new())).unwrap();
//! let res = svc.ready().await?.call(req).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(Attempts::of(res.extensions()), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # What it does
//!
//! For every outcome of the stack below it (which must hold a classify layer,
//! and usually a backoff and a Retry-After layer) [`Retry`] retries only when
//!
//! 1. the [`Verdict`](crate::Verdict) is retryable;
//! 2. the request is eligible: its method is in the
//!    [policy](RetryPolicy::eligible_methods) (GET, HEAD, OPTIONS, TRACE,
//!    PUT, DELETE by default), or it carries an
//!    key the server can see ([`IdempotencyKey::is_seen`]): an
//!    `Idempotency-Key` header that is not blank
//!    ([`IdempotencyKey::is_blank`]: empty or only whitespace is no key), or
//!    an [`IdempotencyKey`] annotation whose value a header carries (an
//!    annotation alone is no key: put the idempotency-key layer above this
//!    one, it copies the annotation into the header),
//!    or the verdict says
//!    [`Sent::NotSent`](crate::Sent);
//! 3. attempts remain ([`RetryPolicy::max_attempts`], 3 by default; a
//!    request that carries a [`MaxAttempts`](crate::MaxAttempts) counts
//!    against its own number instead, clamped into `1..=100`: see
//!    [`RetryPolicy::max_attempts_for`]);
//! 4. the next attempt can start before the request's [`Deadline`], if
//!    any, once the [`ProposedDelay`](crate::ProposedDelay) has passed
//!    (without a backoff layer below: the Retry-After hint, else no delay);
//! 5. the [`RetryBudget`] allows it (checked last, so a retry refused for
//!    another reason costs no budget). A retry that then succeeds gives its
//!    token back ([`RetryBudget::refund`]), so errors the retries absorb
//!    cost the budget nothing.
//!
//! Otherwise the caller gets **the last real outcome, untouched** (the 503
//! response with its body, or the last error), with [`Attempts`](crate::Attempts)
//! when more than one attempt was made and a [`RetryStop`](crate::RetryStop)
//! saying why the loop stopped when it did not succeed. Errors are named
//! with the request's method and redacted URL.
//!
//! Every attempt after the first carries [`AttemptNumber(n)`](crate::AttemptNumber) and a
//! [`PreviousAttempt`](crate::PreviousAttempt) (verdict, Retry-After hint,
//! the delay waited), [`BudgetLeft`](crate::BudgetLeft) and the failed
//! attempt's [`LimiterState`](crate::LimiterState) if it had one; the trace
//! layer's INFO `retrying` event is made from them. The body of each attempt is a fresh
//! copy ([`CloneableBody::try_replay`](crate::body::CloneableBody::try_replay) for the first,
//! [`CloneableBody::try_replay_whole`](crate::body::CloneableBody::try_replay_whole)
//! for every retry; see [`crate::body::RetryBody`]); a body that cannot
//! be replayed is sent once and not retried
//! ([`RetryStop::NotReplayable`](crate::RetryStop::NotReplayable), verdict
//! rewritten to `Fatal { reason: "body not replayable" }`). A retry never
//! starts with a body copy that is not known to be sent whole: when the
//! response came back while a streamed body of unknown length was still
//! being sent (and could still pass its replay cap), the loop keeps that
//! response (not draining it) and reads the rest of the body into the
//! replay buffer itself
//! ([`CloneableBody::poll_buffer`](crate::body::CloneableBody::poll_buffer))
//! while it waits: the body ends within its cap, and the retry goes ahead
//! once the delay is over; or it passes the cap, or is still coming after
//! the delay and has not moved for a second (or the deadline comes), and
//! the caller gets the kept response, the last real outcome, with
//! `RetryStop::NotReplayable`. See [`crate::replay`].
//!
//! A discarded retryable response is **drained** during the backoff sleep
//! (at most 64 KiB, never past the sleep nor 1 s) so that its connection
//! can go back to the pool; the retry is never delayed for it.
//!
//! Dropping the response future during an attempt or a sleep ends
//! everything at once: no task is spawned.
//!
//! # Why not `tower::retry::Policy`
//!
//! tower's `Retry` carries much of this: its `Policy` sees `&mut Req` and
//! `&mut Result`, enough to stamp attempts, carry hints, mark the final
//! outcome and return it untouched. What it cannot do cleanly:
//!
//! * **drain the discarded response during the sleep**: tower drops the
//!   result as soon as `Policy::retry` returns its sleep future, so the
//!   policy would have to move the body out through `&mut Result` and leave
//!   a placeholder response (or a fake error) in its place;
//! * **keep the loop's state explicit**: tower clones the whole `Retry`
//!   (policy and service) into each response future and calls
//!   `clone_request` before the first attempt, so the attempt number, the
//!   previous verdict and the budget decision would live in a per-request
//!   clone of the policy;
//! * **return our error**: its future yields `S::Error`, so naming the final
//!   error with the request would need one more wrapper around it.
//!
//! Our future is the same three-state machine as tower's (`Called`,
//! `Sleeping`, `Readying`), written with `pin-project-lite`, with the drain
//! in the sleeping state; the first attempt costs no `Box::pin`.

mod budget;
pub mod future;
mod policy;

use std::fmt;
use std::mem;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

pub use self::budget::RetryBudget;
#[cfg(feature = "hedge")]
pub(crate) use self::policy::MethodSet;
pub use self::policy::{RetryPolicy, MAX_ATTEMPTS};

use crate::annotations::{Deadline, IdempotencyKey, Idempotent};
use crate::body::RetryBody;
use crate::error::{BoxError, Error};

// ===== layer =====

/// Wraps a service in the retry loop of [`RetryPolicy`].
///
/// See the [module docs](self) for an example.
///
/// # Clone
///
/// Clones of the layer, and every service it makes, share the policy's
/// [`RetryBudget`].
#[derive(Clone, Debug)]
pub struct RetryLayer {
    policy: RetryPolicy,
}

impl RetryLayer {
    /// A layer with `policy`.
    ///
    /// # Panics
    ///
    /// If the policy is invalid (see [`RetryPolicy::validate`]: e.g.
    /// `max_attempts` outside `1..=100`), with a message that names the
    /// value; use [`try_new`](Self::try_new) for values that come from
    /// configuration.
    #[track_caller]
    pub fn new(policy: RetryPolicy) -> Self {
        crate::config::expect_valid("RetryLayer::new", Self::try_new(policy))
    }

    /// A layer with `policy`, checked.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if the policy is invalid (see
    /// [`RetryPolicy::validate`]).
    pub fn try_new(policy: RetryPolicy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(RetryLayer { policy })
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry {
            inner,
            policy: self.policy.clone(),
        }
    }
}

// ===== service =====

/// The service made by [`RetryLayer`].
///
/// # Errors
///
/// The last attempt's error, turned into [`Error`] (an inner
/// `rebound::Error` is kept as is) and named with the request; it carries
/// [`Attempts`](crate::Attempts) and [`RetryStop`](crate::RetryStop) in its
/// extensions. An error of the inner service's `poll_ready` before a retry
/// is returned as is.
///
/// # Clone
///
/// Clones share the budget.
#[derive(Clone)]
pub struct Retry<S> {
    inner: S,
    policy: RetryPolicy,
}

impl<S: fmt::Debug> fmt::Debug for Retry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish()
    }
}

impl<S> Retry<S> {
    /// Wrap `inner` with `policy`.
    ///
    /// # Panics
    ///
    /// As [`RetryLayer::new`].
    #[track_caller]
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        RetryLayer::new(policy).layer(inner)
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

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

impl<S, B, ResB> Service<Request<B>> for Retry<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    S::Error: Into<BoxError>,
    B: RetryBody,
    ResB: http_body::Body,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S, B, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The ready service goes with this request; `self` keeps a clone
        // that must be made ready again.
        let clone = self.inner.clone();
        let mut svc = mem::replace(&mut self.inner, clone);
        let deadline = Deadline::of(req.extensions());
        let (req, mut replay) = future::Replay::prepare(&self.policy, req, deadline);
        let fut = svc.call(req);
        if replay.may_retry() {
            replay.service = Some(svc);
        }
        future::ResponseFuture::new(fut, replay)
    }
}

/// Whether a request with these parts may be sent again after it may have
/// been processed: an eligible method, an [`Idempotent`] mark, or an
/// idempotency key the server can see ([`IdempotencyKey::is_seen`]).
pub(crate) fn is_idempotent(policy: &RetryPolicy, parts: &http::request::Parts) -> bool {
    policy.is_eligible_method(&parts.method)
        || parts.extensions.get::<Idempotent>().is_some()
        || IdempotencyKey::is_seen(&parts.headers, &parts.extensions)
}
