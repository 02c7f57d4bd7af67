//! The adaptive limit's DEBUG event on every change. Alone in its own test
//! binary: tracing caches a callsite's interest process-wide, and the other
//! adaptive tests hit the same callsite on other threads with no subscriber,
//! which could cache it as disabled before this test's subscriber exists.

use http::{Request, Response, StatusCode};
use rebound_core::limit::{AdaptiveLimitLayer, Aimd};
use rebound_core::Error;
use rebound_test::capture::Capture;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[tokio::test(start_paused = true)]
async fn every_change_is_a_debug_event_with_the_current_limit() {
    let capture = Capture::new();
    let _guard = capture.set_default();

    let layer = AdaptiveLimitLayer::try_new(Aimd::default().initial_limit(10)).unwrap();
    let limiter = layer.limiter().clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            let mut res = Response::new(());
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok::<_, Error>(res)
        }));
    svc.oneshot(Request::get("http://upstream.test/x").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(limiter.current_limit(), 9);
    let out = capture.text();
    assert!(out.contains("current_limit=9"), "{out}");
    assert!(out.contains("previous_limit=10"), "{out}");
}
