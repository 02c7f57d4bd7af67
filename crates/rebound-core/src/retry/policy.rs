//! What the retry loop may do: attempts, budget, eligible methods.

use std::fmt;
use std::sync::Arc;

use http::Method;

use super::budget::RetryBudget;
use crate::annotations::MaxAttempts;
use crate::error::Error;

/// The most attempts [`RetryPolicy::max_attempts`] accepts.
pub const MAX_ATTEMPTS: u32 = 100;

/// The standard methods, in a fixed order, for the eligibility bit set.
pub(crate) const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::OPTIONS,
    Method::TRACE,
    Method::PUT,
    Method::DELETE,
    Method::POST,
    Method::PATCH,
    Method::CONNECT,
];

/// The bit of `m` in a method set, for standard methods.
fn method_bit(m: &Method) -> Option<u16> {
    METHODS.iter().position(|x| x == m).map(|i| 1 << i)
}

/// A set of standard methods (one bit each), the eligibility set of both
/// the retry policy and the hedge policy.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct MethodSet(u16);

impl MethodSet {
    /// The idempotent methods of RFC 9110: GET, HEAD, OPTIONS, TRACE, PUT,
    /// DELETE (both policies' default).
    pub(crate) fn idempotent() -> Self {
        MethodSet::of([
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ])
    }

    /// The standard methods among `methods` (others cannot be listed).
    pub(crate) fn of(methods: impl IntoIterator<Item = Method>) -> Self {
        MethodSet(
            methods
                .into_iter()
                .filter_map(|m| method_bit(&m))
                .fold(0, |a, b| a | b),
        )
    }

    /// Whether `method` is in the set.
    pub(crate) fn contains(self, method: &Method) -> bool {
        method_bit(method).is_some_and(|b| self.0 & b != 0)
    }
}

impl fmt::Debug for MethodSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                METHODS
                    .iter()
                    .filter(|m| self.contains(m))
                    .map(Method::as_str),
            )
            .finish()
    }
}

/// What the [`RetryLayer`](super::RetryLayer) may do.
///
/// * `max_attempts`: attempts in all, first included. Default: 3.
/// * `budget`: the [`RetryBudget`] shared by every request through the
///   layer and its clones. Default: a fresh `RetryBudget::default()` (20 %
///   over 10 s, floor 10/s accruing in bursts of at most 10), created with
///   the policy.
/// * eligible methods: those that may be retried after the request may have
///   been processed. Default: GET, HEAD, OPTIONS, TRACE, PUT, DELETE (the
///   idempotent methods of RFC 9110). A request with an idempotency key
///   the server can see
///   ([`IdempotencyKey::is_seen`](crate::annotations::IdempotencyKey::is_seen):
///   a non-blank `Idempotency-Key` header, or an annotation whose value a
///   header carries) is eligible whatever its method, and so is any
///   request whose verdict says [`Sent::NotSent`](crate::annotations::Sent).
///
/// # Clone
///
/// Clones share the budget.
#[derive(Clone)]
pub struct RetryPolicy {
    pub(super) max_attempts: u32,
    pub(super) budget: Arc<RetryBudget>,
    methods: MethodSet,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("budget", &self.budget)
            .field("methods", &self.methods)
            .finish()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            budget: Arc::new(RetryBudget::default()),
            methods: MethodSet::idempotent(),
        }
    }
}

impl RetryPolicy {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attempts in all, the first included. Default: 3. Valid: `1..=100`
    /// (checked by [`RetryLayer::try_new`](super::RetryLayer::try_new);
    /// [`RetryLayer::new`](super::RetryLayer::new) clamps into that range).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Use `budget`, which may be shared with other layers or clients.
    /// Default: a budget of this policy's own.
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// The methods that may be retried after the request may have been
    /// processed (replaces the set). Only the standard methods can be
    /// listed; others are eligible only with an idempotency key. Default:
    /// GET, HEAD, OPTIONS, TRACE, PUT, DELETE.
    pub fn eligible_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = MethodSet::of(methods);
        self
    }

    /// The attempts in all.
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The attempts in all for a request with extensions `ext`: its
    /// [`MaxAttempts`] when it carries one, clamped into `1..=100`, else
    /// the policy's count. What the retry loop (the layer's and the
    /// one-service stack's) counts against.
    pub fn max_attempts_for(&self, ext: &http::Extensions) -> u32 {
        match MaxAttempts::of(ext) {
            Some(n) => n.clamp(1, MAX_ATTEMPTS),
            None => self.max_attempts,
        }
    }

    /// The shared budget.
    pub fn get_budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// Whether `method` may be retried after the request may have been
    /// processed.
    pub fn is_eligible_method(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Check the values.
    ///
    /// # Errors
    ///
    /// A configuration [`Error`] if `max_attempts` is not in `1..=100`.
    pub fn validate(&self) -> Result<(), Error> {
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(Error::config(
                "RetryPolicy: max_attempts must be in 1..=100",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn defaults() {
        let p = RetryPolicy::default();
        assert_eq!(p.get_max_attempts(), 3);
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(p.is_eligible_method(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!p.is_eligible_method(&m), "{m}");
        }
        assert!(!p.is_eligible_method(&Method::from_bytes(b"PURGE").unwrap()));
        let p = p.eligible_methods([Method::GET, Method::POST]);
        assert!(p.is_eligible_method(&Method::POST));
        assert!(!p.is_eligible_method(&Method::PUT));
    }

    #[test]
    fn validation() {
        assert!(matches!(
            RetryPolicy::default()
                .max_attempts(0)
                .validate()
                .unwrap_err()
                .kind(),
            ErrorKind::Config
        ));
        assert!(RetryPolicy::default().max_attempts(101).validate().is_err());
        assert!(RetryPolicy::default().max_attempts(1).validate().is_ok());
    }

    #[test]
    fn a_request_may_set_its_own_count_within_the_range() {
        let p = RetryPolicy::default().max_attempts(4);
        let mut ext = http::Extensions::new();
        assert_eq!(p.max_attempts_for(&ext), 4);
        for (asked, got) in [
            (1, 1),
            (2, 2),
            (9, 9),
            (0, 1),
            (100, 100),
            (101, 100),
            (u32::MAX, 100),
        ] {
            ext.insert(MaxAttempts(asked));
            assert_eq!(p.max_attempts_for(&ext), got, "{asked}");
        }
    }

    #[test]
    #[should_panic(expected = "RetryLayer::new: invalid configuration")]
    fn the_layer_refuses_zero_attempts_by_name() {
        let _ = crate::retry::RetryLayer::new(RetryPolicy::default().max_attempts(0));
    }
}
