//! gRPC: classification after gRFC A6, per-method retry eligibility, and
//! deadlines that travel (`grpc-timeout` out, inbound deadlines in).
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use rebound_core::grpc::{GrpcClassifier, GrpcTrailersLayer, MarkRetryableLayer, PropagateDeadlineLayer, RetryableMethods};
//! use rebound_core::{Attempts, BoxError, ClassifyLayer, DeadlineLayer, RetryAfterLayer, RetryLayer, RetryPolicy};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let calls = Arc::new(AtomicU32::new(0));
//! let server = {
//!     let calls = calls.clone();
//!     tower::service_fn(move |req: Request<Full<Bytes>>| {
//!         // Each attempt is told how long it has.
//!         assert!(req.headers().contains_key("grpc-timeout"));
//!         // UNAVAILABLE (Trailers-Only: the status is in the head), then OK.
//!         let status = if calls.fetch_add(1, Ordering::SeqCst) == 0 { "14" } else { "0" };
//!         async move {
//!             let res = Response::builder()
//!                 .header("content-type", "application/grpc")
//!                 .header("grpc-status", status)
//!                 .body(Full::new(Bytes::new()))
//!                 .unwrap();
//!             Ok::<_, BoxError>(res)
//!         }
//!     })
//! };
//! let mut client = ServiceBuilder::new()
//!     .layer(DeadlineLayer::new(Duration::from_secs(2)))
//!     // gRPC calls are POSTs: say which methods are safe to retry.
//!     .layer(MarkRetryableLayer::new(RetryableMethods::none().service("echo.Echo")))
//!     .layer(RetryLayer::new(RetryPolicy::default()))
//!     .layer(PropagateDeadlineLayer::new())
//!     .layer(GrpcTrailersLayer::new())
//!     .layer(RetryAfterLayer::new())
//!     .layer(ClassifyLayer::new(GrpcClassifier::default()))
//!     .service(server);
//!
//! let req = Request::post("http://echo.example/echo.Echo/Say")
//!     .header("content-type", "application/grpc")
//!     .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
//!     .unwrap();
//! let res = client.ready().await?.call(req).await?;
//! assert_eq!(res.headers()["grpc-status"], "0");
//! assert_eq!(Attempts::of(res.extensions()), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # Classification (gRFC A6)
//!
//! [`GrpcClassifier`] reads the **head** of each attempt:
//!
//! | outcome | verdict |
//! |---|---|
//! | `grpc-status` in the response headers (Trailers-Only: the server failed before sending anything), OK | `Success` |
//! | the same, a code in the retryable set (default UNAVAILABLE; [`GrpcClassifier::retryable_codes`]) | `Retryable { sent: MaybeProcessed }` |
//! | the same, any other code; an unknown or malformed `grpc-status` is UNKNOWN | `Fatal` |
//! | no `grpc-status`, HTTP status not 200 (a proxy's error) | the code gRPC maps it to ([`Code::from_http_status`]), as above |
//! | no `grpc-status`, HTTP 200: the call is **committed** | `Success`: never retried |
//! | an error (connect refused, reset, timeout, ...) | as [`HttpClassifier`](crate::HttpClassifier): a call never sent is `NotSent` |
//!
//! A committed call's final status arrives in the trailers, after the
//! caller has the response; [`GrpcTrailersLayer`] reads it there and
//! records it on the trace (and in metrics), as tower-http's
//! `GrpcErrorsAsFailures` classifies at end of stream.
//!
//! `grpc-retry-pushback-ms` is read by the
//! [`RetryAfterLayer`](crate::RetryAfterLayer) on every non-success head:
//! it overrides the backoff, is capped like `Retry-After` (60 s by default),
//! and a negative **or malformed** value (not a signed 32-bit integer, or
//! sent more than once) means "do not retry", as gRFC A6 says
//! ([`parse_grpc_pushback`](crate::retry_after::parse_grpc_pushback)).
//!
//! # Which calls may be retried
//!
//! A verdict is about the outcome; whether the *method* is safe to repeat is
//! about the request. gRPC calls are POSTs, which the retry layer does not
//! retry once they may have been processed. [`MarkRetryableLayer`], above
//! the retry layer, marks the calls to the [`RetryableMethods`] you declare
//! (by `/package.Service/Method`, by service, with a default) with the
//! [`Idempotent`](crate::Idempotent) annotation, which the retry layer
//! reads. A call that was never sent (connect refused, `REFUSED_STREAM`,
//! `GOAWAY` above the last stream id) is retried whatever the method,
//! within the same bounds as any retry (attempts, budget, deadline) —
//! and, as gRFC A6's **transparent retry**, once more when its attempts
//! are used up: a gRPC call (`content-type: application/grpc…`) whose last
//! attempt was never sent gets one extra attempt outside the count (still
//! within the budget and the deadline; [`Attempts`](crate::Attempts)
//! counts it). A6 retries transparently without limit while nothing
//! reaches the server; rebound does it once, so that a host that refuses
//! every connection is not hammered. It needs a retry to be possible at
//! all (`max_attempts` ≥ 2, so that the request's body is kept).
//!
//! # Deadlines that travel
//!
//! * **Out**: [`PropagateDeadlineLayer`], below the retry layer, writes the
//!   time left before the deadline into `grpc-timeout` on every attempt
//!   (never larger than the time left), and optionally into a budget header
//!   of milliseconds for plain HTTP.
//! * **In**: [`InboundDeadlineLayer`] on a server (axum or tonic) makes the
//!   caller's `grpc-timeout` (or budget header) the deadline of every
//!   outbound call made while handling the request. It is carried as the
//!   task's current deadline ([`Deadline::scope`](crate::Deadline::scope));
//!   see the layer for its limits (spawned tasks).
//!
//! With the `tonic` feature, [`tonic`] maps rebound's errors to
//! the right `tonic::Status`, and the retry layer takes `tonic::body::Body`
//! as it is ([`RetryBody`](crate::RetryBody)).

mod classify;
mod code;
mod deadline;
mod methods;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod tonic;

#[cfg(feature = "stack")]
pub(crate) use self::classify::record as record_trailers_status;
pub use self::classify::{
    future as trailers_future, GrpcClassifier, GrpcTrailers, GrpcTrailersBody, GrpcTrailersLayer,
};
pub use self::code::{Code, GRPC_STATUS};
pub use self::deadline::{
    encode_grpc_timeout, future as inbound_future, own_grpc_deadline, parse_grpc_timeout,
    InboundDeadline, InboundDeadlineLayer, PropagateDeadline, PropagateDeadlineLayer, GRPC_TIMEOUT,
};
pub use self::methods::{
    CallCodes, MarkRetryable, MarkRetryableLayer, MethodPolicy, RetryableMethods,
};
