//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`).
//!
//! The trace layers record these when a recorder is installed (any
//! `metrics` exporter: Prometheus, OpenTelemetry, StatsD, ...); without one
//! the calls cost a few loads. Names follow the OpenTelemetry HTTP-client
//! conventions where one exists, and `rebound.client.*` otherwise.
//!
//! | name | type | unit | labels | recorded by |
//! |---|---|---|---|---|
//! | [`REQUEST_DURATION`] `http.client.request.duration` | histogram | s | method, status, error.type | `TraceLayer`, per logical request, to the response head |
//! | [`ATTEMPT_DURATION`] `http.client.attempt.duration` | histogram | s | method, status, error.type | `AttemptTraceLayer`, per attempt |
//! | [`REQUEST_ATTEMPTS`] `rebound.client.request.attempts` | histogram | {attempt} | method, stop | `TraceLayer` |
//! | [`RETRIES`] `rebound.client.retries` | counter | {retry} | method, reason, source | `AttemptTraceLayer`, on every attempt after the first |
//! | [`BUDGET_EXHAUSTED`] `rebound.client.retry_budget.exhausted` | counter | {request} | method | `TraceLayer`, when the loop stopped on [`RetryStop::Budget`](crate::RetryStop::Budget) |
//! | [`DEADLINE_EXPIRED`] `rebound.client.deadline.expired` | counter | {request} | method | `TraceLayer`, on a deadline timeout or [`RetryStop::Deadline`](crate::RetryStop::Deadline) |
//! | [`LIMITER_LIMIT`] `rebound.client.limiter.limit` | gauge | {request} | limiter | [`record_limiter`], or a [`LimiterState`] annotation |
//! | [`LIMITER_QUEUE_LENGTH`] `rebound.client.limiter.queue_length` | gauge | {request} | limiter | the same |
//! | [`HEDGES_SENT`] `rebound.client.hedges` | counter | {request} | method | `HedgeLayer`, per hedge sent |
//! | [`HEDGES_WON`] `rebound.client.hedges.won` | counter | {request} | method | `HedgeLayer`, when a hedge (not the original) gave the answer |
//! | [`GATE_WAITS`] `rebound.client.gate.waits` | counter | {request} | — | [`record_gate_wait`], or a [`GateWait`] annotation |
//! | [`GATE_WAIT_DURATION`] `rebound.client.gate.wait.duration` | histogram | s | — | the same |
//! | [`CIRCUIT_TRANSITIONS`] `rebound.client.circuit_breaker.transitions` | counter | {transition} | state | [`record_circuit_transition`], called by the circuit breaker |
//! | [`CIRCUIT_REJECTED`] `rebound.client.circuit_breaker.rejected` | counter | {request} | — | [`record_circuit_rejected`], called by the circuit breaker |
//! | [`ADAPTIVE_LIMIT`] `rebound.client.adaptive_limit.limit` | histogram | {request} | — | the adaptive limiter ([`record_adaptive`]), each time a host's limit changes |
//! | [`ADAPTIVE_MIN_RTT`] `rebound.client.adaptive_limit.min_rtt` | histogram | s | — | the same, a gradient limit's minimum round-trip time |
//! | [`ADAPTIVE_SAMPLE_RTT`] `rebound.client.adaptive_limit.sample_rtt` | histogram | s | — | the same, its sampled round-trip time |
//! | [`THROTTLE_SHED`] `rebound.client.throttle.shed` | counter | {attempt} | — | client-side throttling ([`record_throttle_shed`]), per attempt shed |
//! | [`THROTTLE_PROBABILITY`] `rebound.client.throttle.probability` | histogram | 1 | — | the same, the host's shedding probability then |
//! | [`CIRCUITS_OPEN`] `rebound.client.circuit_breaker.open` | gauge | {circuit} | — | [`record_circuit_opened`] / [`record_circuit_closed`], called by the circuit breaker: circuits not closed (open or half-open) now, in every breaker of the process |
//!
//! Labels (keys in the `LABEL_*` constants):
//!
//! * `http.request.method`: the method, or `_OTHER` for a non-standard one
//!   (as OpenTelemetry asks, so a caller cannot blow up cardinality);
//! * `http.response.status_code`: the status code, when there is a response;
//! * `error.type`: the error kind (`timeout`, `connect`, ...) or, for a
//!   response that failed, its status code; absent on success;
//! * `rebound.reason`: the previous attempt's verdict reason (`status 503`,
//!   `connect refused`; reasons are short fixed texts by contract);
//! * `rebound.delay_source`: `retry_after` or `backoff`;
//! * `rebound.stop`: why the loop stopped (`success`, `fatal`, `attempts`,
//!   `budget`, `deadline`, ...);
//! * `rebound.limiter`: the limiter's fixed name.
//! * `rebound.circuit.state`: the state a circuit entered (`open`,
//!   `half_open`, `closed`).
//!
//! **No label ever takes a URL, a host, a header value or a user id**: the
//! host is left out on purpose (unbounded in a multi-tenant client); add it
//! in your exporter if you know your hosts are few.
//!
//! Call [`describe`] once at start-up to register units and descriptions.
//!
//! ```
//! use metrics_util::debugging::DebuggingRecorder;
//! use rebound_core::trace::LimiterState;
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! metrics::with_local_recorder(&recorder, || {
//!     rebound_core::metrics::record_limiter(&LimiterState {
//!         limiter: "concurrency", limit: 8, in_flight: 3, queued: 0,
//!     });
//! });
//! let names: Vec<String> = snapshotter
//!     .snapshot()
//!     .into_vec()
//!     .into_iter()
//!     .map(|(key, ..)| key.key().name().to_owned())
//!     .collect();
//! assert!(names.contains(&rebound_core::metrics::LIMITER_LIMIT.to_owned()));
//! ```

use std::time::Duration;

use ::metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
};
use http::{Method, StatusCode};

pub use crate::annotations::{CircuitState, GateWait, LimiterState};

/// Duration of a logical request, to the response head (seconds).
pub const REQUEST_DURATION: &str = "http.client.request.duration";
/// Duration of one attempt, to the response head (seconds).
pub const ATTEMPT_DURATION: &str = "http.client.attempt.duration";
/// Attempts made per logical request.
pub const REQUEST_ATTEMPTS: &str = "rebound.client.request.attempts";
/// Retries sent, by the reason the previous attempt failed.
pub const RETRIES: &str = "rebound.client.retries";
/// Logical requests whose retries were refused by the retry budget.
pub const BUDGET_EXHAUSTED: &str = "rebound.client.retry_budget.exhausted";
/// Logical requests cut by their total deadline.
pub const DEADLINE_EXPIRED: &str = "rebound.client.deadline.expired";
/// A limiter's current limit.
pub const LIMITER_LIMIT: &str = "rebound.client.limiter.limit";
/// Requests waiting in a limiter's queue.
pub const LIMITER_QUEUE_LENGTH: &str = "rebound.client.limiter.queue_length";
/// Hedges sent (copies beyond the original).
pub const HEDGES_SENT: &str = "rebound.client.hedges";
/// Hedges whose answer won over the original's.
pub const HEDGES_WON: &str = "rebound.client.hedges.won";
/// Requests held by a Retry-After gate.
pub const GATE_WAITS: &str = "rebound.client.gate.waits";
/// How long requests were held by a Retry-After gate (seconds).
pub const GATE_WAIT_DURATION: &str = "rebound.client.gate.wait.duration";
/// Circuit state changes, by the state entered.
pub const CIRCUIT_TRANSITIONS: &str = "rebound.client.circuit_breaker.transitions";
/// Requests a circuit breaker failed at once (not sent).
pub const CIRCUIT_REJECTED: &str = "rebound.client.circuit_breaker.rejected";
/// Circuits not closed (open or half-open) now: the breaker's state as a
/// number, with no host label (see the module docs).
pub const CIRCUITS_OPEN: &str = "rebound.client.circuit_breaker.open";
/// An adaptive limit, recorded each time one changes (any host: the host
/// is not a label).
pub const ADAPTIVE_LIMIT: &str = "rebound.client.adaptive_limit.limit";
/// A gradient limit's minimum round-trip time when its limit changed (s).
pub const ADAPTIVE_MIN_RTT: &str = "rebound.client.adaptive_limit.min_rtt";
/// A gradient limit's sampled round-trip time when its limit changed (s).
pub const ADAPTIVE_SAMPLE_RTT: &str = "rebound.client.adaptive_limit.sample_rtt";
/// Client-side throttling's shedding probability of a host, recorded on
/// every attempt it shed.
pub const THROTTLE_PROBABILITY: &str = "rebound.client.throttle.probability";
/// Attempts client-side throttling shed.
pub const THROTTLE_SHED: &str = "rebound.client.throttle.shed";

/// Label: the request method (`_OTHER` for non-standard ones).
pub const LABEL_METHOD: &str = "http.request.method";
/// Label: the response status code.
pub const LABEL_STATUS: &str = "http.response.status_code";
/// Label: the error kind, or the status code of a failed response.
pub const LABEL_ERROR_TYPE: &str = "error.type";
/// Label: a verdict reason.
pub const LABEL_REASON: &str = "rebound.reason";
/// Label: where a delay came from (`retry_after`, `backoff`).
pub const LABEL_DELAY_SOURCE: &str = "rebound.delay_source";
/// Label: why the retry loop stopped.
pub const LABEL_STOP: &str = "rebound.stop";
/// Label: a limiter's fixed name.
pub const LABEL_LIMITER: &str = "rebound.limiter";
/// Label: the state a circuit entered.
pub const LABEL_CIRCUIT_STATE: &str = "rebound.circuit.state";

/// Register the unit and description of every metric above with the
/// installed recorder. Call once, after installing it.
pub fn describe() {
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Duration of HTTP client requests (logical, all attempts), to the response head."
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "Duration of one HTTP client attempt, to the response head."
    );
    describe_histogram!(
        REQUEST_ATTEMPTS,
        Unit::Count,
        "Attempts made per logical HTTP client request."
    );
    describe_counter!(
        RETRIES,
        Unit::Count,
        "Retries sent, by the reason the previous attempt failed."
    );
    describe_counter!(
        BUDGET_EXHAUSTED,
        Unit::Count,
        "Requests whose retries the retry budget refused."
    );
    describe_counter!(
        DEADLINE_EXPIRED,
        Unit::Count,
        "Requests cut by their total deadline."
    );
    describe_gauge!(
        LIMITER_LIMIT,
        Unit::Count,
        "Current limit of a concurrency limiter."
    );
    describe_gauge!(
        LIMITER_QUEUE_LENGTH,
        Unit::Count,
        "Requests waiting in a concurrency limiter's queue."
    );
    describe_counter!(
        HEDGES_SENT,
        Unit::Count,
        "Hedges sent: copies of a slow attempt beyond the original."
    );
    describe_counter!(
        HEDGES_WON,
        Unit::Count,
        "Hedges whose answer won over the original's."
    );
    describe_counter!(
        GATE_WAITS,
        Unit::Count,
        "Requests held by a Retry-After gate."
    );
    describe_histogram!(
        GATE_WAIT_DURATION,
        Unit::Seconds,
        "Time requests were held by a Retry-After gate."
    );
    describe_counter!(
        CIRCUIT_TRANSITIONS,
        Unit::Count,
        "Circuit breaker state changes, by the state entered."
    );
    describe_counter!(
        CIRCUIT_REJECTED,
        Unit::Count,
        "Requests a circuit breaker failed at once, not sent."
    );
    describe_gauge!(
        CIRCUITS_OPEN,
        Unit::Count,
        "Circuits not closed (open or half-open) now."
    );
}

/// Record a limiter's state: its limit and queue length as gauges, labelled
/// with its name. For a limiter layer to call, or recorded by the trace
/// layers from a [`LimiterState`] annotation (do one or the other).
pub fn record_limiter(state: &LimiterState) {
    gauge!(LIMITER_LIMIT, LABEL_LIMITER => state.limiter).set(f64::from(state.limit));
    gauge!(LIMITER_QUEUE_LENGTH, LABEL_LIMITER => state.limiter).set(f64::from(state.queued));
}

/// Record an adaptive limit that changed to `limit`, with a gradient's
/// minimum and sampled round-trip times (ms). Called by the adaptive
/// limiter.
pub fn record_adaptive(limit: usize, min_rtt_ms: Option<f64>, sample_rtt_ms: Option<f64>) {
    histogram!(ADAPTIVE_LIMIT).record(limit as f64);
    if let Some(ms) = min_rtt_ms {
        histogram!(ADAPTIVE_MIN_RTT).record(ms / 1e3);
    }
    if let Some(ms) = sample_rtt_ms {
        histogram!(ADAPTIVE_SAMPLE_RTT).record(ms / 1e3);
    }
}

/// Record an attempt client-side throttling shed with probability `p`.
pub fn record_throttle_shed(p: f64) {
    counter!(THROTTLE_SHED).increment(1);
    histogram!(THROTTLE_PROBABILITY).record(p);
}

/// Record that a gate held a request for `wait`. For a gate to call, or
/// recorded by the trace layers from a [`GateWait`] annotation (do one or
/// the other).
pub fn record_gate_wait(wait: Duration) {
    counter!(GATE_WAITS).increment(1);
    histogram!(GATE_WAIT_DURATION).record(wait.as_secs_f64());
}

/// Record that a circuit entered `state`. Called by the circuit breaker on
/// each state change (the host is not a label: see above).
pub fn record_circuit_transition(state: CircuitState) {
    counter!(CIRCUIT_TRANSITIONS, LABEL_CIRCUIT_STATE => state.as_str()).increment(1);
}

/// Record that a closed circuit opened ([`CIRCUITS_OPEN`] up by one).
pub fn record_circuit_opened() {
    gauge!(CIRCUITS_OPEN).increment(1.0);
}

/// Record that a circuit closed again ([`CIRCUITS_OPEN`] down by one).
pub fn record_circuit_closed() {
    gauge!(CIRCUITS_OPEN).decrement(1.0);
}

/// Record that a circuit breaker failed a request at once.
pub fn record_circuit_rejected() {
    counter!(CIRCUIT_REJECTED).increment(1);
}

/// Record that a hedge of a `method` request was sent.
pub fn record_hedge_sent(method: &Method) {
    counter!(HEDGES_SENT, LABEL_METHOD => method_label(method)).increment(1);
}

/// Record that a hedge (not the original) of a `method` request won.
pub fn record_hedge_won(method: &Method) {
    counter!(HEDGES_WON, LABEL_METHOD => method_label(method)).increment(1);
}

/// The method as a label value: standard methods as themselves, anything
/// else as `_OTHER`.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "_OTHER",
    }
}

/// The outcome labels shared by the two duration histograms.
pub(crate) struct OutcomeLabels<'a> {
    pub(crate) method: &'a Method,
    pub(crate) status: Option<StatusCode>,
    pub(crate) error_type: Option<&'a str>,
}

impl OutcomeLabels<'_> {
    fn to_labels(&self) -> Vec<::metrics::Label> {
        let mut labels = Vec::with_capacity(3);
        labels.push(::metrics::Label::new(
            LABEL_METHOD,
            method_label(self.method),
        ));
        if let Some(status) = self.status {
            labels.push(::metrics::Label::new(
                LABEL_STATUS,
                status.as_str().to_owned(),
            ));
        }
        if let Some(error_type) = self.error_type {
            labels.push(::metrics::Label::new(
                LABEL_ERROR_TYPE,
                error_type.to_owned(),
            ));
        }
        labels
    }
}

pub(crate) fn record_request(
    outcome: &OutcomeLabels<'_>,
    elapsed: Duration,
    attempts: u32,
    stop: &'static str,
) {
    histogram!(REQUEST_DURATION, outcome.to_labels()).record(elapsed.as_secs_f64());
    let method = method_label(outcome.method);
    histogram!(REQUEST_ATTEMPTS, LABEL_METHOD => method, LABEL_STOP => stop)
        .record(f64::from(attempts));
    match stop {
        "budget" => counter!(BUDGET_EXHAUSTED, LABEL_METHOD => method).increment(1),
        "deadline" => counter!(DEADLINE_EXPIRED, LABEL_METHOD => method).increment(1),
        _ => {}
    }
}

pub(crate) fn record_attempt(outcome: &OutcomeLabels<'_>, elapsed: Duration) {
    histogram!(ATTEMPT_DURATION, outcome.to_labels()).record(elapsed.as_secs_f64());
}

pub(crate) fn record_retry(method: &Method, reason: &str, source: Option<&'static str>) {
    counter!(
        RETRIES,
        LABEL_METHOD => method_label(method),
        LABEL_REASON => reason.to_owned(),
        LABEL_DELAY_SOURCE => source.unwrap_or("none")
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_label_bounds_cardinality() {
        assert_eq!(method_label(&Method::POST), "POST");
        let custom = Method::from_bytes(b"PURGE-USER-12345").unwrap();
        assert_eq!(method_label(&custom), "_OTHER");
    }
}
