//! `ReconcileLayer` over `tower::service_fn`, on paused time: a write whose
//! answer was lost is reconciled with a status check before it is sent again.
#![cfg(all(feature = "reconcile", feature = "retry"))]
#![allow(clippy::type_complexity)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use rebound_core::classify::{ClassifyLayer, HttpClassifier};
use rebound_core::reconcile::{Check, OperationId, ReconcileLayer, Reconciled};
use rebound_core::retry::{RetryLayer, RetryPolicy};
use rebound_core::{Attempts, BoxError, Error, ErrorKind, Verdict};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

type B = Full<Bytes>;

/// A server that records every write's key and answers with `script[n]`
/// (502 / connect error / 201), the last entry repeating.
fn server(
    script: &'static [u16],
) -> (
    Arc<Mutex<Vec<Option<String>>>>,
    impl Service<Request<B>, Response = Response<B>, Error = BoxError, Future = impl Send> + Clone,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let svc = {
        let seen = seen.clone();
        tower::service_fn(move |req: Request<B>| {
            let mut seen = seen.lock().unwrap();
            let key = req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned());
            seen.push(key);
            let code = script[(seen.len() - 1).min(script.len() - 1)];
            async move {
                if code == 0 {
                    return Err(BoxError::from(Error::new(ErrorKind::Connect)));
                }
                let mut res = Response::new(Full::new(Bytes::from_static(b"write")));
                *res.status_mut() = StatusCode::from_u16(code).unwrap();
                Ok(res)
            }
        })
    };
    (seen, svc)
}

fn post(key: Option<&str>) -> Request<B> {
    let mut b = Request::post("http://shop.example/orders?token=secret");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Full::new(Bytes::from_static(b"{}"))).unwrap()
}

fn counting_check(
    calls: Arc<AtomicU32>,
    answer: fn() -> Check<Response<B>>,
) -> impl Service<OperationId, Response = Check<Response<B>>, Error = BoxError, Future = impl Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |id: OperationId| {
        calls.fetch_add(1, Ordering::SeqCst);
        assert_eq!(id.as_str(), "op-1");
        async move { Ok::<_, BoxError>(answer()) }
    })
}

fn found() -> Check<Response<B>> {
    Check::Finished(Response::new(Full::new(Bytes::from_static(b"order 1"))))
}

macro_rules! stack {
    ($layer:expr, $inner:expr) => {
        ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
            .layer($layer)
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service($inner)
    };
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn found_and_finished_replaces_the_outcome_and_sends_no_second_write() {
    let (seen, inner) = server(&[502, 201]);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = stack!(
        ReconcileLayer::new(counting_check(calls.clone(), found)),
        inner
    );
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<Reconciled>().unwrap().id.as_str(),
        "op-1"
    );
    assert!(Verdict::of(res.extensions()).is_success());
    assert_eq!(Attempts::of(res.extensions()), 1);
    assert_eq!(seen.lock().unwrap().len(), 1, "exactly one write");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn not_found_lets_the_retry_go_ahead_with_the_same_key() {
    let (seen, inner) = server(&[502, 201]);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = stack!(
        ReconcileLayer::new(counting_check(calls.clone(), || Check::NotFound)),
        inner
    );
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(res.extensions().get::<Reconciled>().is_none());
    assert_eq!(Attempts::of(res.extensions()), 2);
    let seen = seen.lock().unwrap();
    assert_eq!(*seen, vec![Some("op-1".into()), Some("op-1".into())]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_write_that_was_not_sent_is_retried_without_a_check() {
    let (seen, inner) = server(&[0, 201]);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = stack!(
        ReconcileLayer::new(counting_check(calls.clone(), found)),
        inner
    );
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "no check for a NotSent outcome"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_operation_id_means_no_check() {
    let (seen, inner) = server(&[502]);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = stack!(
        ReconcileLayer::new(counting_check(calls.clone(), found)),
        inner
    );
    let res = svc.ready().await.unwrap().call(post(None)).await.unwrap();
    // A POST without a key is not eligible for a retry: the 502 comes back.
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_check_that_hangs_is_ambiguous_at_its_timeout_with_the_id_and_no_secret() {
    let (seen, inner) = server(&[502, 201]);
    let check = tower::service_fn(|_id: OperationId| async {
        std::future::pending::<Result<Check<Response<B>>, BoxError>>().await
    });
    let mut svc = stack!(
        ReconcileLayer::new(check).check_timeout(Duration::from_millis(300)),
        inner
    );
    let start = Instant::now();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert!(matches!(err.kind(), ErrorKind::Ambiguous), "{err}");
    assert_eq!(err.kind(), ErrorKind::Ambiguous);
    assert_eq!(
        err.extensions().get::<OperationId>().unwrap().as_str(),
        "op-1"
    );
    assert!(Verdict::of(err.extensions()).is_fatal());
    let text = err.to_string();
    assert!(
        text.contains("op-1") && text.contains("timed out"),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
    assert_eq!(seen.lock().unwrap().len(), 1, "no second write");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn unknown_is_ambiguous_unless_configured_to_retry_anyway() {
    let (seen, inner) = server(&[502, 201]);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = stack!(
        ReconcileLayer::new(counting_check(calls.clone(), || Check::Unknown)),
        inner
    );
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Ambiguous));
    assert_eq!(seen.lock().unwrap().len(), 1);

    let (seen, inner) = server(&[502, 201]);
    let mut svc = stack!(
        ReconcileLayer::new(counting_check(calls.clone(), || Check::Unknown))
            .retry_when_ambiguous(true),
        inner
    );
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failing_check_is_ambiguous() {
    let (_seen, inner) = server(&[502]);
    let check = tower::service_fn(|_id: OperationId| async {
        Err::<Check<Response<B>>, BoxError>("status endpoint down".into())
    });
    let mut svc = stack!(ReconcileLayer::new(check), inner);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Ambiguous));
    assert!(err.to_string().contains("the check failed"), "{err}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_deadline_bounds_the_check() {
    let (_seen, inner) = server(&[502]);
    let check = tower::service_fn(|_id: OperationId| async {
        std::future::pending::<Result<Check<Response<B>>, BoxError>>().await
    });
    let mut svc = stack!(ReconcileLayer::new(check), inner);
    let start = Instant::now();
    let mut req = post(Some("op-1"));
    req.extensions_mut()
        .insert(rebound_core::Deadline(start + Duration::from_millis(50)));
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Ambiguous));
    assert_eq!(start.elapsed(), Duration::from_millis(50));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_caller_chosen_operation_id() {
    let (seen, inner) = server(&[502]);
    let calls = Arc::new(AtomicU32::new(0));
    let layer = ReconcileLayer::new(counting_check(calls.clone(), found)).operation_id(|parts| {
        parts
            .headers
            .get("x-op")
            .map(|v: &HeaderValue| OperationId::new(v.clone()))
    });
    let mut svc = stack!(layer, inner);
    let mut req = post(None);
    req.headers_mut()
        .insert("x-op", HeaderValue::from_static("op-1"));
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert!(res.extensions().get::<Reconciled>().is_some());
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
#[should_panic(expected = "ReconcileLayer::check_timeout")]
fn zero_check_timeout_panics_naming_it() {
    let check = tower::service_fn(|_id: OperationId| async {
        Ok::<Check<Response<B>>, BoxError>(Check::NotFound)
    });
    let _ = ReconcileLayer::new(check).check_timeout(Duration::ZERO);
}

/// A check built with `with_request` sees the write's method and its URL
/// with the query string left out, besides the id.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_check_with_the_request_sees_method_and_redacted_url() {
    use rebound_core::reconcile::Inquiry;

    let (seen, inner) = server(&[502, 201]);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let check = {
        let asked = asked.clone();
        tower::service_fn(move |q: Inquiry| {
            let line = format!("{} {} {}", q.method(), q.url(), q.id());
            assert_eq!(q.into_id().as_str(), "op-1");
            asked.lock().unwrap().push(line);
            async { Ok::<_, BoxError>(found()) }
        })
    };
    let mut svc = stack!(ReconcileLayer::with_request(check), inner);
    let res = svc
        .ready()
        .await
        .unwrap()
        .call(post(Some("op-1")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.extensions().get::<Reconciled>().is_some());
    assert_eq!(seen.lock().unwrap().len(), 1, "exactly one write");
    assert_eq!(
        *asked.lock().unwrap(),
        vec!["POST http://shop.example/orders op-1".to_owned()],
        "no query string"
    );
}
