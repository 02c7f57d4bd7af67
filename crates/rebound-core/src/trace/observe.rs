//! Small annotations other layers may leave so the trace layers (and
//! metrics) can show state they do not own.

use std::fmt;
use std::time::Duration;

/// How many more retries the retry budget would allow at the moment an
/// attempt was sent (or the loop stopped).
///
/// A retry layer may stamp it on each attempt's request (the attempt span
/// shows it as `rebound.budget_left`) and on the final outcome (the request
/// span and the "giving up" event show it). Absent means "not known"; the
/// trace layers never insert it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BudgetLeft(pub u32);

/// The state of a limiter as a request or attempt passed it: a limiter may
/// put it on the outcome (or on the request on its way down). Shown as
/// `rebound.limiter` (`concurrency limit=8 in_flight=3 queued=0`) and, with
/// the `metrics` feature, recorded as the limiter gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimiterState {
    /// Which limiter: a fixed, low-cardinality name such as `"concurrency"`
    /// or `"adaptive"` (used as a metric label).
    pub limiter: &'static str,
    /// The current limit.
    pub limit: u32,
    /// Requests (or attempts) in flight, this one included.
    pub in_flight: u32,
    /// Requests waiting in the limiter's queue.
    pub queued: u32,
}

impl fmt::Display for LimiterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} limit={} in_flight={} queued={}",
            self.limiter, self.limit, self.in_flight, self.queued
        )
    }
}

/// How long a gate (e.g. the Retry-After gate) held this request before
/// letting it through; put on the outcome by the gate. Shown as
/// `rebound.gate_wait_ms` and, with the `metrics` feature, counted as a gate
/// wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GateWait(pub Duration);
