//! Load control: a concurrency limit for logical requests and an adaptive
//! (AIMD) limit for attempts.
//!
//! * [`ConcurrencyLimitLayer`] caps **logical requests** in flight. It sits
//!   above the retry layer, so one request holds one permit across all its
//!   attempts and backoff sleeps, and it holds the permit **until the
//!   response body ends or is dropped** (see [`LimitBody`]).
//! * [`AdaptiveLimitLayer`] caps **attempts** in flight with a limit that
//!   shrinks when the upstream says it is overloaded (429, 503, attempt
//!   timeout) and grows back while it succeeds. It sits below the
//!   retry layer and above the classifier.
//!
//! By default both wait for their slot **inside the response future**, not
//! in `poll_ready` (which passes through): the wait is FIFO, bounded by the
//! request's [`Deadline`](crate::annotations::Deadline), and dropping the
//! future leaves the queue at once (DESIGN.md §7). Backpressure that tower
//! can see is an option (below).
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use rebound_core::limit::{AdaptiveLimitLayer, Aimd, ConcurrencyLimitLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let limit = ConcurrencyLimitLayer::new(64);
//! let in_flight = limit.limiter().clone();
//! let svc = ServiceBuilder::new()
//!     .layer(limit)
//!     // .layer(RetryLayer::new(..)) goes here, between the two limits
//!     .layer(AdaptiveLimitLayer::new(Aimd::default()))
//!     .service(service_fn(|_req: http::Request<Full<Bytes>>| async {
//!         Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hi"))))
//!     }));
//!
//! let res = svc.oneshot(http::Request::new(Full::default())).await?;
//! assert_eq!(in_flight.in_flight(), 1); // held while the body is unread
//! let body = res.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(body, "hi");
//! assert_eq!(in_flight.in_flight(), 0); // released at end of stream
//! # Ok(())
//! # }
//! ```

//!
//! # Backpressure
//!
//! With `.backpressure(true)` ([`ConcurrencyLimitLayer::backpressure`],
//! [`AdaptiveLimitLayer::backpressure`]) a limit reports "no capacity" from
//! `poll_ready`, in the shape of tower's `ConcurrencyLimit`: `poll_ready`
//! reserves the permit (returning `Pending`, with the waker in the
//! semaphore's FIFO queue, while none is free), the service keeps it, and
//! `call` moves it into the response future. So tower's `LoadShed` above
//! sheds instead of queueing, and a `Buffer` above stops taking requests.
//!
//! * What stays: the concurrency limit's permit is held until the response
//!   body ends ([`LimitBody`]); the adaptive limit's slot until the response
//!   head (in the layer; its body's end in the whole-stack service), and its outcome feeds the limit; a request whose `poll_ready`
//!   had to wait carries its permit down as a
//!   [`PermitLease`](crate::annotations::PermitLease) and shows the
//!   limiter's state, as one that queued in the future does.
//! * What changes: a wait in `poll_ready` knows no request, so no
//!   [`Deadline`](crate::annotations::Deadline) bounds it and
//!   [`max_queue`](ConcurrencyLimiter::max_queue) does not count it (bound
//!   it with the caller's timeout, or shed with `LoadShed`); dropping the
//!   service (or the `ready()` future) leaves the queue and gives a reserved
//!   permit back.
//! * Clones of the service start without a permit (each reserves its own).
//!   A `call` that comes without a reserved permit is not a panic: it falls
//!   back to the default, waiting in the response future.
//!
//! A free permit is still taken without allocating or locking.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use rebound_core::limit::ConcurrencyLimitLayer;
//! use tower::load_shed::{error::Overloaded, LoadShedLayer};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let svc = ServiceBuilder::new()
//!     .layer(LoadShedLayer::new())
//!     .layer(ConcurrencyLimitLayer::new(1).backpressure(true))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hi"))))
//!     }));
//!
//! // The first response holds the only permit while its body is unread...
//! let first = svc.clone().oneshot(http::Request::new(())).await?;
//! // ...so the next request is shed at once instead of queueing.
//! let err = svc.clone().oneshot(http::Request::new(())).await.unwrap_err();
//! assert!(err.is::<Overloaded>());
//!
//! drop(first); // the permit comes back
//! svc.oneshot(http::Request::new(())).await?;
//! # Ok(())
//! # }
//! ```

pub mod adaptive;
pub mod concurrency;
mod gradient;
#[cfg(any(feature = "breaker", feature = "retry-after"))]
pub mod per_host;

pub use self::adaptive::{
    AdaptiveLimit, AdaptiveLimitLayer, AdaptiveLimiter, Aimd, Algorithm, Gradient,
};
#[cfg(feature = "stack")]
pub(crate) use self::adaptive::{AttemptSlot, HeldSlot};
pub use self::concurrency::{
    ConcurrencyLimit, ConcurrencyLimitLayer, ConcurrencyLimiter, LimitBody,
};
#[cfg(any(feature = "breaker", feature = "retry-after"))]
pub use self::per_host::{HostLimiters, PerHostAdaptiveLimit, PerHostAdaptiveLimitLayer};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::PollSemaphore;

/// The slow path of both limits: wait in the semaphore's FIFO queue for one
/// permit, until `deadline` at the latest. Resolves to `None` when the
/// deadline passed first (or the semaphore was closed, which rebound never
/// does). Dropping it leaves the queue at once.
///
/// Boxed because `Semaphore::acquire_owned` is an unnameable future; this is
/// off the happy path (a free permit is taken with `try_acquire_owned`).
type WaitPermit = Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send>>;

fn wait_permit(semaphore: Arc<Semaphore>, deadline: Option<Instant>) -> WaitPermit {
    Box::pin(async move {
        let acquire = semaphore.acquire_owned();
        match deadline {
            // `timeout_at` polls the acquire first, so a permit handed over
            // at the very instant of the deadline still counts.
            Some(deadline) => tokio::time::timeout_at(deadline, acquire)
                .await
                .ok()
                .and_then(Result::ok),
            None => acquire.await.ok(),
        }
    })
}

/// The backpressure half of both limits: a permit that `poll_ready`
/// reserves for the next `call`, in the shape of tower's `ConcurrencyLimit`.
///
/// Off (the default), it is one branch in `poll_ready` and `call`. On, it
/// waits with a [`PollSemaphore`] (FIFO, the waker in the semaphore's
/// queue; no allocation while a permit is free). Cloning gives a
/// reservation without a permit: each clone of a service reserves its own.
#[derive(Debug)]
struct Reservation {
    poll: Option<PollSemaphore>,
    reserved: Option<OwnedSemaphorePermit>,
    /// Whether the reservation had to wait (then the request is treated as
    /// one that queued: it lends its permit and shows the limiter's state).
    waited: bool,
}

impl Reservation {
    /// Backpressure off: `poll_ready` passes through.
    fn off() -> Self {
        Reservation {
            poll: None,
            reserved: None,
            waited: false,
        }
    }

    /// Backpressure on `semaphore` if `enabled`.
    fn new(semaphore: &Arc<Semaphore>, enabled: bool) -> Self {
        Reservation {
            poll: enabled.then(|| PollSemaphore::new(semaphore.clone())),
            ..Self::off()
        }
    }

    /// `Ready` once a permit is reserved, or at once with backpressure off.
    /// A closed semaphore (rebound never closes it) reserves nothing, so
    /// `call` takes the default path.
    // Inlined (also in unoptimised builds) so that backpressure off costs
    // the branch and nothing else.
    #[inline(always)]
    fn poll_reserve(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(poll) = &mut self.poll {
            if self.reserved.is_none() {
                match poll.poll_acquire(cx) {
                    Poll::Ready(permit) => self.reserved = permit,
                    Poll::Pending => {
                        self.waited = true;
                        return Poll::Pending;
                    }
                }
            }
        }
        Poll::Ready(())
    }

    /// The reserved permit, and whether reserving it had to wait.
    #[inline(always)]
    fn take(&mut self) -> Option<(OwnedSemaphorePermit, bool)> {
        let permit = self.reserved.take()?;
        Some((permit, std::mem::take(&mut self.waited)))
    }
}

impl Clone for Reservation {
    fn clone(&self) -> Self {
        Reservation {
            poll: self.poll.clone(),
            ..Self::off()
        }
    }
}
