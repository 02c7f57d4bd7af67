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
//! Both wait for their slot **inside the response future**, never in
//! `poll_ready` (which passes through): the wait is FIFO, bounded by the
//! request's [`Deadline`](crate::annotations::Deadline), and dropping the
//! future leaves the queue at once.
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

pub mod adaptive;
pub mod concurrency;

pub use self::adaptive::{AdaptiveLimit, AdaptiveLimitLayer, AdaptiveLimiter, Aimd};
pub use self::concurrency::{
    ConcurrencyLimit, ConcurrencyLimitLayer, ConcurrencyLimiter, LimitBody,
};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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
