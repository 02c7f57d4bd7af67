//! Transport-agnostic layers of **rebound**: outbound HTTP calls that survive
//! a real network.
//!
//! Each layer is one concern and is useful alone; they talk to each other
//! only through typed [annotations] in `http::Extensions`, so they can be
//! reordered, replaced and tested one by one. The default order, outer to
//! inner (the ready-made client in `rebound-hyper` builds exactly this):
//!
//! ```text
//! caller ─► Trace            one span per logical request; redaction
//!           Deadline         total budget; stamps Deadline
//!           ConcurrencyLimit caps logical requests in flight
//!           IdempotencyKey   POST/PATCH get an Idempotency-Key once
//!           CircuitBreaker   fails requests to a broken host at once, not
//!                            sent; counts each request's final outcome
//!           Retry            the only loop: eligibility, budget, deadline
//!           Hedge            (opt-in) a copy of a slow first attempt
//!           Backoff          proposes the delay for each retryable outcome
//!           RetryAfterGate   holds requests to a host that asked for a pause
//!           AdaptiveLimit    per-attempt limit that shrinks on overload
//!           RetryAfter       parses Retry-After / pushback into a hint
//!           Classify         turns each attempt's outcome into a Verdict
//!           AttemptTimeout   per-attempt time to response head
//!           transport
//! ```
//!
//! Every layer's service has `type Error = `[`Error`]: one opaque error type
//! with a kind to branch on, a `source()` chain and its own extensions.
//!
//! # Conventions (DESIGN.md §10)
//!
//! * **Constructors.** `XLayer::new(..)` returns the layer and panics, naming
//!   the argument, on a value that cannot work; `XLayer::try_new(..)` returns
//!   the [configuration error](ErrorKind::Config) instead (see
//!   [`config::expect_valid`]). Setters follow the same rule (`x` / `try_x`).
//! * **Names.** The service of `XLayer` is `X` (`Retry`, `Classify`,
//!   `AttemptTimeout`, `ConcurrencyLimit`, ...), except where `X` is already
//!   a vocabulary or configuration value users write every day —
//!   [`Deadline`], [`Cancel`], [`IdempotencyKey`], [`Backoff`] — where it is
//!   `XService` (`DeadlineService`, `CancelService`, `IdempotencyKeyService`,
//!   `BackoffService`). We kept the vocabulary's short names rather than
//!   rename what every layer and caller reads.
//! * **Features.** One cargo feature per layer family (see the README).
//!
//! # Minimum supported Rust version
//!
//! 1.89, declared as `rust-version` in the workspace (what the locked
//! dependencies declare, checked in CI); raised only with a
//! minor release.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod annotations;
pub mod config;
pub mod error;
pub mod foreign;
pub mod redact;

// --- request bodies that can be sent again ---
pub mod body;
pub mod replay;

// --- retry core: classify, Retry-After, backoff, retry with budget ---
#[cfg(feature = "backoff")]
#[cfg_attr(docsrs, doc(cfg(feature = "backoff")))]
pub mod backoff;
pub mod classify;
#[cfg(feature = "hedge")]
#[cfg_attr(docsrs, doc(cfg(feature = "hedge")))]
pub mod hedge;
#[cfg(feature = "retry")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry")))]
pub mod retry;
#[cfg(feature = "retry-after")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry-after")))]
pub mod retry_after;

// --- gRPC: classification, method eligibility, deadlines that travel ---
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;

// --- timeouts: total deadline, per-attempt timeout, response bodies ---
#[cfg(feature = "timeout")]
#[cfg_attr(docsrs, doc(cfg(feature = "timeout")))]
pub mod attempt_timeout;
#[cfg(feature = "timeout")]
#[cfg_attr(docsrs, doc(cfg(feature = "timeout")))]
pub mod body_timeout;
#[cfg(feature = "timeout")]
#[cfg_attr(docsrs, doc(cfg(feature = "timeout")))]
pub mod deadline;

// --- writes: idempotency keys, in-attempt body reading ---
#[cfg(feature = "collect")]
#[cfg_attr(docsrs, doc(cfg(feature = "collect")))]
pub mod collect;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
#[cfg(feature = "reconcile")]
#[cfg_attr(docsrs, doc(cfg(feature = "reconcile")))]
pub mod reconcile;

// --- load control and cancellation ---
#[cfg(feature = "breaker")]
#[cfg_attr(docsrs, doc(cfg(feature = "breaker")))]
pub mod breaker;
#[cfg(feature = "cancel")]
#[cfg_attr(docsrs, doc(cfg(feature = "cancel")))]
pub mod cancel;
#[cfg(feature = "fallback")]
#[cfg_attr(docsrs, doc(cfg(feature = "fallback")))]
pub mod fallback;
#[cfg(feature = "retry-after")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry-after")))]
pub mod gate;
#[cfg(any(feature = "breaker", feature = "retry-after"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "breaker", feature = "retry-after"))))]
pub mod host;
#[cfg(feature = "limit")]
#[cfg_attr(docsrs, doc(cfg(feature = "limit")))]
pub mod limit;
#[cfg(feature = "ratelimit")]
#[cfg_attr(docsrs, doc(cfg(feature = "ratelimit")))]
pub mod ratelimit;
#[cfg(feature = "shared-state")]
#[cfg_attr(docsrs, doc(cfg(feature = "shared-state")))]
pub mod shared;
#[cfg(feature = "shutdown")]
#[cfg_attr(docsrs, doc(cfg(feature = "shutdown")))]
pub mod shutdown;
#[cfg(feature = "throttle")]
#[cfg_attr(docsrs, doc(cfg(feature = "throttle")))]
pub mod throttle;
#[cfg(any(feature = "limit", feature = "retry-after"))]
mod wait;

// --- the whole stack as one service (DESIGN.md §13) ---
#[cfg(feature = "stack")]
#[cfg_attr(docsrs, doc(cfg(feature = "stack")))]
pub mod stack;

// --- observability ---
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "trace")]
#[cfg_attr(docsrs, doc(cfg(feature = "trace")))]
pub mod trace;

// ===== the crate root: the layers, the vocabulary, the error =====
//
// And the values a layer's `new` takes (a policy, a schedule, a classifier,
// limit settings). Services, response futures, body wrappers and helpers are
// reached through their module (`rebound_core::deadline::DeadlineBody`, ...),
// as tower's are.

#[allow(deprecated)]
pub use crate::annotations::Attempt;
pub use crate::annotations::{
    AttemptNumber, Attempts, BudgetLeft, CertificateRejected, CircuitState, Closing, Deadline,
    DelaySource, GateWait, Hedged, IdempotencyKey, Idempotent, KeyGenerated, LimiterState,
    MaxAttempts, PermitLease, PreviousAttempt, ProposedDelay, Reason, RetryAfterHint, RetryStop,
    Sent, Verdict,
};
#[doc(hidden)]
pub use crate::body::ReplayableBody;
pub use crate::body::{CloneableBody, RetryBody};
pub use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};

#[cfg(feature = "timeout")]
pub use crate::attempt_timeout::AttemptTimeoutLayer;
#[cfg(feature = "backoff")]
pub use crate::backoff::{Backoff, BackoffLayer, Jitter};
#[cfg(feature = "breaker")]
pub use crate::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
#[cfg(feature = "cancel")]
pub use crate::cancel::{Cancel, CancelLayer};
pub use crate::classify::{Classifier, ClassifyLayer, HttpClassifier};
#[cfg(feature = "collect")]
pub use crate::collect::CollectBodyLayer;
#[cfg(feature = "timeout")]
pub use crate::deadline::DeadlineLayer;
#[cfg(feature = "fallback")]
pub use crate::fallback::FallbackLayer;
#[cfg(feature = "retry-after")]
pub use crate::gate::{GateMode, RetryAfterGateLayer};
#[cfg(feature = "grpc")]
pub use crate::grpc::{
    GrpcClassifier, GrpcTrailersLayer, InboundDeadlineLayer, MarkRetryableLayer,
    PropagateDeadlineLayer, RetryableMethods,
};
#[cfg(feature = "hedge")]
pub use crate::hedge::{HedgeLayer, HedgePolicy};
#[cfg(feature = "idempotency")]
pub use crate::idempotency::IdempotencyKeyLayer;
#[cfg(feature = "limit")]
pub use crate::limit::{AdaptiveLimitLayer, Aimd, ConcurrencyLimitLayer, Gradient};
#[cfg(feature = "ratelimit")]
pub use crate::ratelimit::RateLimitLayer;
#[cfg(feature = "reconcile")]
pub use crate::reconcile::ReconcileLayer;
#[cfg(feature = "retry")]
pub use crate::retry::{RetryBudget, RetryLayer, RetryPolicy};
#[cfg(feature = "retry-after")]
pub use crate::retry_after::{OverCap, RetryAfterLayer};
#[cfg(feature = "shutdown")]
pub use crate::shutdown::{ShutdownHandle, ShutdownLayer, ShutdownReport};
#[cfg(feature = "trace")]
pub use crate::trace::{AttemptTraceLayer, TraceLayer};
