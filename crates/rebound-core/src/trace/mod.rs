//! Tracing that never leaks a secret: one span per logical request, one child
//! span per attempt, OpenTelemetry HTTP-client field names.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Empty;
//! use rebound_core::trace::TraceLayer;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::BoxError> {
//! let trace = TraceLayer::builder()
//!     .record_headers([http::header::ACCEPT]) // values recorded only for these
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(trace.clone())        // outermost: the logical request
//!     // .layer(RetryLayer::new(..))  the retry loop goes here
//!     .layer(trace.attempt_layer()) // directly below the retry layer
//!     .service(service_fn(|_req: Request<Empty<Bytes>>| async {
//!         Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
//!     }));
//!
//! let req = Request::get("https://user:pw@api.example.com/v1/models?api_key=s3cret")
//!     .header("authorization", "Bearer s3cret")
//!     .header("accept", "application/json")
//!     .header("x-request-id", "req-42")
//!     .body(Empty::new())?;
//! let res = svc.oneshot(req).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! # Ok(())
//! # }
//! ```
//!
//! With a subscriber at DEBUG this records a span `http.client.request` with
//! `http.request.method=GET server.address=api.example.com server.port=443
//! url.scheme=https url.path=/v1/models request_id=req-42
//! http.request.headers="accept=application/json"` and a child span
//! `http.client.attempt`; never `pw`, never `s3cret`.
//!
//! # Why our own layer and not tower-http's `TraceLayer`
//!
//! tower-http's `TraceLayer` is built for servers: its default span records
//! the whole URI (query string and userinfo included) and its default
//! `on_request`/`on_response` log headers at DEBUG; its notion of failure is
//! its own classifier, not our [`Verdict`](crate::Verdict); and it has one
//! span per request, with no idea of attempts. To use it safely we would
//! replace its `MakeSpan`, `OnRequest`, `OnResponse`, `OnFailure` and
//! classifier, i.e. everything but the plumbing, and still need a second
//! layer for attempts. A small layer of our own gets **redaction by
//! construction** instead: the only header values it ever reads are the
//! request id and the allow-listed headers, both checked against the
//! deny-list when the layer is built; it reads the URL only through its
//! host, port, scheme and path; it never touches a body. It also reads the
//! annotations ([`Attempts`](crate::Attempts),
//! [`RetryStop`](crate::RetryStop), [`Verdict`](crate::Verdict),
//! [`ProposedDelay`](crate::ProposedDelay)) that carry what a reader of the
//! logs needs, and costs nothing but a disabled span when DEBUG is off.
//!
//! # The spans
//!
//! Targets are `rebound::trace` (filter with e.g.
//! `RUST_LOG=rebound::trace=debug`).
//!
//! **`http.client.request`** (DEBUG), one per logical request, made by
//! [`TraceLayer`]:
//!
//! | field | value |
//! |---|---|
//! | `otel.name`, `otel.kind`, `otel.status_code` | the method, `client`, `ERROR` on failure (for `tracing-opentelemetry`) |
//! | `http.request.method` | `GET`, ... |
//! | `server.address`, `server.port` | host, and port (explicit or from the scheme) |
//! | `url.scheme`, `url.path` | never the query, never userinfo; the path as the [`PathRedaction`](crate::redact::PathRedaction) says |
//! | `url.query_names` | opt-in: the query parameter **names** (`api_key,page`) |
//! | `request_id` | from `x-request-id` (configurable) when printable and ≤ 128 bytes |
//! | `http.request.headers`, `http.response.headers` | only allow-listed headers (none by default) |
//! | `http.response.status_code` | the final status |
//! | `error.type` | the error kind (`timeout`, `connect`, ...) or, for a response that failed, its status code |
//! | `rebound.attempts` | attempts made |
//! | `rebound.stop` | why the loop stopped: `success`, `fatal`, `attempts`, `budget`, `deadline`, `not_eligible`, `not_replayable`, `cancelled`, `not_retried`, `error` |
//! | `rebound.budget_left`, `rebound.limiter`, `rebound.gate_wait_ms` | from the [`BudgetLeft`], [`LimiterState`], [`GateWait`] annotations, when present |
//! | `rebound.ratelimit.wait_ms`, `rebound.ratelimit.remaining`, `rebound.ratelimit.reset_ms` | recorded by the rate-limit layer (`ratelimit`) on the current span: how long the request was paced, and the response's smallest remaining quota and its reset (numbers only) |
//! | `rebound.elapsed_ms` | time to the response head |
//!
//! The response's body is a [`TraceBody`], which holds the request span:
//! the span closes when the body is dropped, and a body that fails after
//! the head is logged in it.
//!
//! **`http.client.attempt`** (DEBUG), a child per attempt, made by
//! [`AttemptTraceLayer`]: `rebound.attempt`, `http.request.resend_count`
//! (attempt − 1, **only** on attempts after the first),
//! `http.response.status_code`, `http.response.headers`, `error.type`,
//! `rebound.verdict` (`success`, `retryable`, `fatal`, `unclassified`),
//! `rebound.reason`, `rebound.sent`, `rebound.delay_ms` and
//! `rebound.delay_source` (`retry_after` or `backoff`, from
//! [`ProposedDelay`](crate::ProposedDelay)), `rebound.budget_left`,
//! `rebound.limiter`, `rebound.gate_wait_ms`, the three
//! `rebound.ratelimit.*` fields, `rebound.elapsed_ms`.
//!
//! # Levels
//!
//! | what | level |
//! |---|---|
//! | the spans | DEBUG |
//! | an attempt finished, whatever its outcome | DEBUG event `attempt finished` (with `error.message` for an error) |
//! | a retry: the retry loop decided to make another attempt | INFO event `retrying` when that attempt starts |
//! | success on the first attempt | DEBUG event `request finished` |
//! | success after retries | INFO event `request succeeded after retries` |
//! | a fatal response (e.g. 404) | DEBUG on the first attempt, INFO after retries |
//! | giving up: an error, or a response still retryable when the loop stopped | WARN event `request failed; giving up` with `rebound.stop` and `error.message` (the [redacted](crate::Error) `Display`) |
//! | the caller dropped the future | DEBUG event `request cancelled by the caller` |
//! | the response body failed after its head (stall, reset, truncation, deadline) | WARN event `response body failed` with `error.type`, `error.stage` (a timeout's) and `error.message`, from [`TraceBody`] |
//!
//! The `retrying` event is emitted by [`AttemptTraceLayer`] when an attempt
//! starts that carries a [`PreviousAttempt`](crate::PreviousAttempt): the
//! retry loop stamps one only on an attempt it has decided to make, after
//! the wait. So an INFO line always means a retry happens; an outcome the
//! loop does not retry (a POST without idempotency key, the last attempt,
//! the budget or the deadline) shows only as DEBUG `attempt finished` and
//! then WARN `request failed; giving up`. Its fields: `rebound.attempt` (the
//! attempt starting), `http.request.resend_count`, the previous attempt's
//! `rebound.reason` and `rebound.sent`, `rebound.delay_ms` and
//! `rebound.delay_source` (the wait just made and who chose it),
//! `rebound.retry_after_ms` (the server's hint, if any),
//! `rebound.budget_left`, and `rebound.limiter` (the state the failed
//! attempt reported, which the retry loop carries over).
//!
//! So a success on the first attempt costs a DEBUG span and nothing above
//! DEBUG. When spans are off (DEBUG disabled), the INFO and WARN events carry
//! `http.request.method`, `server.address`, `url.path` and `request_id`
//! themselves.
//!
//! # Redaction
//!
//! Never recorded anywhere (spans, events, `Debug` of the request):
//! `Authorization`, `Proxy-Authorization`, `Cookie`, `Set-Cookie` and every
//! header on the [deny-list](crate::redact::HeaderDenyList) (default adds
//! `x-api-key`, `api-key`, `x-auth-token`, `x-amz-security-token`,
//! `x-goog-api-key`, and every header whose name says `token`, `secret`,
//! `password`, `session`, `signature`, `api-key` or `auth`); URL userinfo;
//! the query string; bodies. [`TraceLayer`] marks deny-listed headers
//! [sensitive](http::HeaderValue::set_sensitive) on the request on its way
//! down, and on the response on its way up, so that `Debug` of either in any
//! layer prints `Sensitive` and HTTP/2 never indexes them (HPACK).
//!
//! The URL path is recorded, as OpenTelemetry asks, unless a
//! [`PathRedaction`](crate::redact::PathRedaction) says otherwise
//! ([`TraceBuilder::path_redaction`]): hidden, by template
//! (`/v1/keys/{key}`) or by a closure. The one setting applies to the
//! spans' and events' `url.path` and to every [`Error`](crate::Error) that
//! passes through either trace layer, response body errors included: its
//! `Display` and `Debug` then show the path the same way. (An error is named
//! with its request's raw path where it is made, deep in the stack; the
//! trace layers rewrite it on its way out, before it is logged or returned,
//! so the setting costs nothing on a request that succeeds.)
//!
//! ```
//! use rebound_core::redact::PathRedaction;
//! use rebound_core::trace::TraceLayer;
//!
//! let trace = TraceLayer::builder()
//!     .path_redaction(PathRedaction::templates(["/v1/keys/{key}"]))
//!     .build()
//!     .unwrap();
//! # let _ = trace;
//! ```
//!
//! Layers below should still strip URL userinfo before the transport (some
//! transports log the authority); the trace layer never reads it.
//!
//! # Metrics
//!
//! With the `metrics` feature the same layers record the metrics listed in
//! the `metrics` module of this crate.

mod attempt;
mod body;
mod config;
pub mod future;
mod observe;
mod outcome;
mod request;

pub use self::attempt::{AttemptTrace, AttemptTraceLayer};
pub use self::body::TraceBody;
pub use self::config::TraceBuilder;
pub use self::observe::{BudgetLeft, GateWait, LimiterState};
pub use self::request::{Trace, TraceLayer};

#[cfg(feature = "stack")]
pub(crate) use self::attempt::begin_attempt;
#[cfg(feature = "stack")]
pub(crate) use self::body::BodyWatch;
#[cfg(feature = "stack")]
pub(crate) use self::config::Config;
#[cfg(feature = "stack")]
pub(crate) use self::future::{AttemptState, RequestState};
#[cfg(feature = "stack")]
pub(crate) use self::request::begin;

/// The `tracing` target of every span and event of this module.
const TARGET: &str = "rebound::trace";

#[cfg(test)]
mod tests {
    use super::*;

    // The futures are `Send` whenever the inner future is: the stack can run
    // on a multi-threaded runtime.
    fn _futures_are_send() {
        fn is_send<T: Send>() {}
        type Inner = std::future::Ready<Result<http::Response<()>, crate::Error>>;
        is_send::<future::ResponseFuture<Inner>>();
        is_send::<future::AttemptFuture<Inner>>();
        is_send::<Trace<()>>();
        is_send::<AttemptTrace<()>>();
    }
}
