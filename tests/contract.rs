//! The layer contract (DESIGN.md §10): every rebound layer's `new` returns
//! the layer, so it composes in `tower::ServiceBuilder` next to tower's and
//! tower-http's own layers; `new` panics naming the argument that cannot
//! work, and `try_new` returns the configuration error instead.

use rebound::ErrorKind;
use std::convert::Infallible;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use rebound::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound::{
    AdaptiveLimitLayer, Aimd, AttemptTimeoutLayer, Backoff, BackoffLayer, ClassifyLayer,
    ConcurrencyLimitLayer, DeadlineLayer, HedgeLayer, HedgePolicy, HttpClassifier, RetryAfterLayer,
    RetryLayer, RetryPolicy,
};
use tower::{ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn every_layer_composes_in_service_builder_with_towers_and_tower_https() {
    let svc = ServiceBuilder::new()
        .layer(tower_http::set_header::SetRequestHeaderLayer::overriding(
            http::header::USER_AGENT,
            HeaderValue::from_static("contract-test"),
        ))
        .layer(DeadlineLayer::new(Duration::from_secs(5)))
        .layer(ConcurrencyLimitLayer::new(8))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
        .layer(HedgeLayer::new(HedgePolicy::fixed(Duration::from_millis(
            50,
        ))))
        .layer(BackoffLayer::new(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        )))
        .layer(CircuitBreakerLayer::new(CircuitBreakerConfig::default()))
        .layer(AdaptiveLimitLayer::new(Aimd::default()))
        .layer(RetryAfterLayer::new().max_delay(Duration::from_secs(2)))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .layer(AttemptTimeoutLayer::new(Duration::from_secs(1)))
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(2)))
        .service(tower::service_fn(|req: Request<String>| async move {
            assert_eq!(req.headers()["user-agent"], "contract-test");
            Ok::<_, Infallible>(Response::new(String::from("ok")))
        }));
    let res = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(res.status(), 200);
}

#[test]
fn try_new_returns_the_error_that_new_panics_with() {
    for err in [
        DeadlineLayer::try_new(Duration::ZERO).unwrap_err(),
        AttemptTimeoutLayer::try_new(Duration::ZERO).unwrap_err(),
        ConcurrencyLimitLayer::try_new(0).unwrap_err(),
        AdaptiveLimitLayer::try_new(Aimd::default().min_limit(0)).unwrap_err(),
        RetryLayer::try_new(RetryPolicy::default().max_attempts(0)).unwrap_err(),
        CircuitBreakerLayer::try_new(CircuitBreakerConfig::default().failure_ratio(0.0))
            .unwrap_err(),
        HedgeLayer::try_new(HedgePolicy::fixed(Duration::ZERO)).unwrap_err(),
    ] {
        assert!(matches!(err.kind(), ErrorKind::Config), "{err}");
    }
}

#[test]
#[should_panic(
    expected = "DeadlineLayer::new: invalid configuration: total timeout must be greater than zero"
)]
fn deadline_new_names_its_argument() {
    let _ = DeadlineLayer::new(Duration::ZERO);
}

#[test]
#[should_panic(expected = "ConcurrencyLimitLayer::new")]
fn concurrency_new_refuses_zero() {
    let _ = ConcurrencyLimitLayer::new(0);
}

#[test]
#[should_panic(expected = "AttemptTimeoutLayer::new: invalid configuration: attempt timeout")]
fn attempt_timeout_new_names_its_argument() {
    let _ = AttemptTimeoutLayer::new(Duration::from_secs(2 * 24 * 60 * 60));
}

#[test]
#[should_panic(
    expected = "CircuitBreakerLayer::new: invalid configuration: CircuitBreakerConfig: failure_ratio must be in (0, 1], got 1.5"
)]
fn circuit_breaker_new_names_its_argument() {
    let _ = CircuitBreakerLayer::new(CircuitBreakerConfig::default().failure_ratio(1.5));
}
