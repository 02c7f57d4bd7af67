//! The peers rebound is compared with, built the way their users build them:
//! tower's own `ConcurrencyLimit` + `Retry` + `Timeout` with a small real
//! retry policy (optionally with tower's `TpsBudget`), and the
//! reqwest / reqwest-middleware + reqwest-retry clients.

use std::future::Ready;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower::limit::ConcurrencyLimit;
use tower::retry::budget::{Budget as _, TpsBudget};
use tower::retry::{Policy, Retry};
use tower::timeout::Timeout;
use tower::ServiceBuilder;

/// tower's concurrency limit in the comparison stack: high enough never to
/// make a request wait here (we measure its cost, not its effect).
pub(crate) const TOWER_LIMIT: usize = 1024;
/// tower's per-attempt timeout in the comparison stack: never fires.
pub(crate) const TOWER_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a budgeted policy wanted to retry, and how often it was let.
#[derive(Debug, Default)]
pub(crate) struct RetryCounters {
    /// Retryable outcomes with attempts left.
    pub(crate) wanted: AtomicU64,
    /// Of those, retries actually made (the budget said yes).
    pub(crate) allowed: AtomicU64,
}

/// A minimal but real `tower::retry::Policy`: up to `max` attempts, retrying
/// errors and 5xx at once, cloning the request before each attempt (as any
/// policy must), optionally drawing on a shared `TpsBudget`.
#[derive(Debug, Clone)]
pub(crate) struct Attempts {
    left: u32,
    first: bool,
    budget: Option<Arc<TpsBudget>>,
    counters: Option<Arc<RetryCounters>>,
}

impl Attempts {
    pub(crate) fn new(max: u32) -> Self {
        Attempts {
            left: max,
            first: true,
            budget: None,
            counters: None,
        }
    }

    /// Retries also need a withdrawal from the shared `budget`.
    pub(crate) fn with_budget(mut self, budget: Arc<TpsBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Records in `counters` how many retries were wanted and allowed.
    pub(crate) fn with_counters(mut self, counters: Arc<RetryCounters>) -> Self {
        self.counters = Some(counters);
        self
    }
}

impl<B: Clone, RB, E> Policy<Request<B>, Response<RB>, E> for Attempts {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut Request<B>,
        result: &mut Result<Response<RB>, E>,
    ) -> Option<Self::Future> {
        if std::mem::take(&mut self.first) {
            if let Some(budget) = &self.budget {
                budget.deposit();
            }
        }
        let retryable = match result {
            Ok(res) => res.status().is_server_error(),
            Err(_) => true,
        };
        if !retryable || self.left <= 1 {
            return None;
        }
        if let Some(counters) = &self.counters {
            counters.wanted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(budget) = &self.budget {
            if !budget.withdraw() {
                return None;
            }
        }
        if let Some(counters) = &self.counters {
            counters.allowed.fetch_add(1, Ordering::Relaxed);
        }
        self.left -= 1;
        Some(std::future::ready(()))
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        Some(req.clone())
    }
}

/// tower's three layers, outer to inner in rebound's order: the limit,
/// the retry loop, the per-attempt timeout.
pub(crate) type TowerStack<S> = ConcurrencyLimit<Retry<Attempts, Timeout<S>>>;

/// `inner` under tower's three layers with `policy`.
pub(crate) fn tower_stack<S>(inner: S, policy: Attempts) -> TowerStack<S> {
    ServiceBuilder::new()
        .concurrency_limit(TOWER_LIMIT)
        .retry(policy)
        .timeout(TOWER_TIMEOUT)
        .service(inner)
}

/// Lets reqwest (built with `rustls-no-provider`) find a TLS provider; the
/// benches speak plain HTTP, but a real reqwest user has TLS compiled in.
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A reqwest client as a user builds it (no proxy lookup: loopback only).
pub(crate) fn reqwest_client() -> Result<reqwest::Client, reqwest::Error> {
    install_tls_provider();
    reqwest::Client::builder().no_proxy().build()
}

/// reqwest-middleware + reqwest-retry with `retries` retries after the first
/// attempt; its backoff is shortened to 1–4 ms so the bench does not sleep
/// for seconds (its default is 1 s – 30 min).
pub(crate) fn reqwest_retry_client(
    retries: u32,
) -> Result<reqwest_middleware::ClientWithMiddleware, reqwest::Error> {
    use reqwest_retry::{policies::ExponentialBackoff, RetryTransientMiddleware};
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(4))
        .build_with_max_retries(retries);
    Ok(reqwest_middleware::ClientBuilder::new(reqwest_client()?)
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .build())
}
