//! `IdempotencyKeyLayer`: which requests get a key, that a caller's key is
//! kept, that every attempt below it carries the same key, and the 409/422
//! verdicts.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use http::header::HeaderName;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use rebound_core::idempotency::{IdempotencyKeyLayer, REASON_IN_FLIGHT, REASON_REUSED};
use rebound_core::{Error, ErrorKind, IdempotencyKey, TimeoutStage, Verdict};
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};

/// What the inner service saw of one request.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    header: Option<HeaderValue>,
    x_header: Option<HeaderValue>,
    annotation: Option<IdempotencyKey>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A service that records what it sees and answers `status`.
#[derive(Clone)]
struct Recorder {
    log: Log,
    status: StatusCode,
}

impl Service<Request<()>> for Recorder {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        self.log.lock().unwrap().push(seen(&req));
        let mut res = Response::new(());
        *res.status_mut() = self.status;
        ready(Ok(res))
    }
}

fn recorder(status: StatusCode) -> (Log, Recorder) {
    let log: Log = Arc::default();
    (log.clone(), Recorder { log, status })
}

fn seen<B>(req: &Request<B>) -> Seen {
    Seen {
        header: req.headers().get("idempotency-key").cloned(),
        x_header: req.headers().get("x-idempotency-key").cloned(),
        annotation: req.extensions().get::<IdempotencyKey>().cloned(),
    }
}

fn request(method: Method) -> Request<()> {
    Request::builder()
        .method(method)
        .uri("http://api.example/v1/orders")
        .body(())
        .unwrap()
}

async fn send<S>(svc: &mut S, req: Request<()>) -> Result<Response<()>, Error>
where
    S: Service<Request<()>, Response = Response<()>, Error = Error>,
{
    svc.ready().await?.call(req).await
}

fn assert_uuid_v4(value: &HeaderValue) {
    let id = uuid::Uuid::parse_str(value.to_str().unwrap()).expect("a UUID");
    assert_eq!(id.get_version_num(), 4, "{value:?}");
    assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
}

// ===== which requests get a key =====

#[tokio::test]
async fn post_and_patch_get_a_fresh_uuid_v4_key_and_the_annotation() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    send(&mut svc, request(Method::POST)).await.unwrap();
    send(&mut svc, request(Method::PATCH)).await.unwrap();
    send(&mut svc, request(Method::POST)).await.unwrap();

    let log = log.lock().unwrap();
    let mut keys = Vec::new();
    for s in log.iter() {
        let key = s.header.clone().expect("a key");
        assert_uuid_v4(&key);
        assert!(!key.is_sensitive(), "a key is not a secret");
        assert_eq!(s.annotation, Some(IdempotencyKey(key.clone())));
        keys.push(key);
    }
    keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    keys.dedup();
    assert_eq!(keys.len(), 3, "one fresh key per logical request");
}

#[tokio::test]
async fn other_methods_pass_untouched() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    for m in [Method::GET, Method::PUT, Method::DELETE, Method::HEAD] {
        send(&mut svc, request(m)).await.unwrap();
    }
    for s in log.lock().unwrap().iter() {
        assert_eq!(s.header, None);
        assert_eq!(s.annotation, None);
    }
}

#[tokio::test]
async fn the_method_set_is_configurable() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new()
        .methods([Method::PUT, Method::POST])
        .layer_service(inner);
    send(&mut svc, request(Method::PUT)).await.unwrap();
    send(&mut svc, request(Method::PATCH)).await.unwrap();
    let log = log.lock().unwrap();
    assert!(log[0].header.is_some() && log[0].annotation.is_some());
    assert!(log[1].header.is_none() && log[1].annotation.is_none());
}

#[tokio::test]
async fn the_header_name_is_configurable() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new()
        .header_name(HeaderName::from_static("x-idempotency-key"))
        .layer_service(inner);
    send(&mut svc, request(Method::POST)).await.unwrap();
    let s = log.lock().unwrap()[0].clone();
    assert_eq!(s.header, None);
    let key = s.x_header.expect("the configured header");
    assert_uuid_v4(&key);
    assert_eq!(s.annotation, Some(IdempotencyKey(key)));
}

// ===== the caller's key =====

#[tokio::test]
async fn a_key_the_caller_set_is_kept_as_is_and_annotated() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let mut req = request(Method::POST);
    let mut mine = HeaderValue::from_static("order-2024-0001");
    mine.set_sensitive(true);
    req.headers_mut().insert("idempotency-key", mine.clone());
    send(&mut svc, req).await.unwrap();

    let s = log.lock().unwrap()[0].clone();
    let got = s.header.unwrap();
    assert_eq!(got, mine);
    assert!(got.is_sensitive(), "the caller's choice is kept");
    assert_eq!(s.annotation, Some(IdempotencyKey(mine)));
}

#[tokio::test]
async fn a_key_set_only_as_annotation_goes_into_the_header() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let mut req = request(Method::POST);
    let mine = HeaderValue::from_static("from-annotation");
    req.extensions_mut().insert(IdempotencyKey(mine.clone()));
    send(&mut svc, req).await.unwrap();
    let s = log.lock().unwrap()[0].clone();
    assert_eq!(s.header, Some(mine.clone()));
    assert_eq!(s.annotation, Some(IdempotencyKey(mine)));
}

#[tokio::test]
async fn a_caller_supplied_generator_is_used() {
    let (log, inner) = recorder(StatusCode::OK);
    let n = AtomicU32::new(0);
    let mut svc = IdempotencyKeyLayer::new()
        .generator(move || {
            let i = n.fetch_add(1, Ordering::Relaxed);
            HeaderValue::from_str(&format!("key-{i}")).unwrap()
        })
        .layer_service(inner);
    send(&mut svc, request(Method::POST)).await.unwrap();
    send(&mut svc.clone(), request(Method::POST)).await.unwrap();
    let log = log.lock().unwrap();
    assert_eq!(log[0].header, Some(HeaderValue::from_static("key-0")));
    assert_eq!(
        log[1].header,
        Some(HeaderValue::from_static("key-1")),
        "clones share the generator"
    );
}

#[tokio::test]
async fn an_empty_key_is_no_key() {
    let (log, inner) = recorder(StatusCode::CONFLICT);
    let mut svc = IdempotencyKeyLayer::new()
        .generator(|| HeaderValue::from_static(""))
        .layer_service(inner);
    let res = send(&mut svc, request(Method::POST)).await.unwrap();
    assert_eq!(log.lock().unwrap()[0].header, None);
    assert_eq!(log.lock().unwrap()[0].annotation, None);
    assert!(
        res.extensions().get::<Verdict>().is_none(),
        "no key, no conflict verdict"
    );

    let mut req = request(Method::POST);
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_static(""));
    send(&mut svc, req).await.unwrap();
    assert_eq!(
        log.lock().unwrap()[1].annotation,
        None,
        "an empty header is not annotated"
    );
}

// ===== every attempt carries the same key =====

/// A minimal retry policy: retry a 503 up to `self.0` times.
#[derive(Clone)]
struct RetryOn503(u32);

impl<E> Policy<Request<()>, Response<()>, E> for RetryOn503 {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<()>,
        res: &mut Result<Response<()>, E>,
    ) -> Option<Ready<()>> {
        match res {
            Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE && self.0 > 0 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Request<()>) -> Option<Request<()>> {
        let mut copy = Request::new(());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}

#[tokio::test]
async fn every_attempt_below_the_layer_carries_the_same_key() {
    let log: Log = Arc::default();
    let statuses = Arc::new(Mutex::new(vec![201u16, 503, 503]));
    let inner = {
        let log = log.clone();
        service_fn(move |req: Request<()>| {
            log.lock().unwrap().push(seen(&req));
            let status = statuses.lock().unwrap().pop().unwrap();
            let mut res = Response::new(());
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            ready(Ok::<_, Infallible>(res))
        })
    };
    let mut svc = ServiceBuilder::new()
        .layer(IdempotencyKeyLayer::new())
        .layer(RetryLayer::new(RetryOn503(3)))
        .service(inner);
    let res = send(&mut svc, request(Method::POST)).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);

    let log = log.lock().unwrap();
    assert_eq!(log.len(), 3);
    let key = log[0].header.clone().unwrap();
    assert_uuid_v4(&key);
    for s in log.iter() {
        assert_eq!(s.header.as_ref(), Some(&key));
        assert_eq!(s.annotation, Some(IdempotencyKey(key.clone())));
    }
}

// ===== conflicts =====

#[tokio::test]
async fn conflict_answers_to_a_keyed_request_are_fatal_with_a_reason() {
    for (status, reason) in [
        (StatusCode::CONFLICT, REASON_IN_FLIGHT),
        (StatusCode::UNPROCESSABLE_ENTITY, REASON_REUSED),
    ] {
        let (_, inner) = recorder(status);
        let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
        let res = send(&mut svc, request(Method::POST)).await.unwrap();
        let verdict = Verdict::of(res.extensions());
        assert!(verdict.is_fatal(), "{status}");
        assert_eq!(verdict.reason().unwrap().as_str(), reason);
    }
    assert_eq!(REASON_IN_FLIGHT, "idempotency key in flight");
    assert_eq!(REASON_REUSED, "idempotency key reused with another body");
}

#[tokio::test]
async fn conflict_verdicts_need_a_key_and_can_be_turned_off() {
    // No key (GET): the 409 is none of this layer's business.
    let (_, inner) = recorder(StatusCode::CONFLICT);
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let res = send(&mut svc, request(Method::GET)).await.unwrap();
    assert!(res.extensions().get::<Verdict>().is_none());

    // Turned off.
    let (_, inner) = recorder(StatusCode::UNPROCESSABLE_ENTITY);
    let mut svc = IdempotencyKeyLayer::new()
        .conflicts_fatal(false)
        .layer_service(inner);
    let res = send(&mut svc, request(Method::POST)).await.unwrap();
    assert!(res.extensions().get::<Verdict>().is_none());

    // Other statuses are left alone: absence stays the happy path.
    for status in [
        StatusCode::OK,
        StatusCode::BAD_REQUEST,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        let (_, inner) = recorder(status);
        let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
        let res = send(&mut svc, request(Method::POST)).await.unwrap();
        assert!(res.extensions().get::<Verdict>().is_none(), "{status}");
    }
}

#[tokio::test]
async fn a_verdict_from_below_is_replaced_only_on_conflicts() {
    let inner = service_fn(|_req: Request<()>| {
        let mut res = Response::new(());
        *res.status_mut() = StatusCode::CONFLICT;
        res.extensions_mut().insert(Verdict::Fatal {
            reason: rebound_core::Reason::status(StatusCode::CONFLICT),
        });
        ready(Ok::<_, Infallible>(res))
    });
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let res = send(&mut svc, request(Method::PATCH)).await.unwrap();
    assert_eq!(
        Verdict::of(res.extensions()).reason().unwrap().as_str(),
        REASON_IN_FLIGHT
    );
}

// ===== errors and readiness =====

#[tokio::test]
async fn inner_errors_pass_through_as_rebound_errors() {
    let inner = service_fn(|_req: Request<()>| {
        ready(Err::<Response<()>, BoxError>(Box::new(Error::timeout(
            TimeoutStage::Headers,
        ))))
    });
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let err = send(&mut svc, request(Method::POST)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Headers));

    let inner = service_fn(|_req: Request<()>| {
        ready(Err::<Response<()>, std::io::Error>(std::io::Error::other(
            "boom",
        )))
    });
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let err = send(&mut svc, request(Method::POST)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert!(err.find_source::<std::io::Error>().is_some());
}

#[tokio::test]
async fn readiness_passes_through() {
    let (mut svc, mut handle) =
        tower_test::mock::spawn_layer::<Request<()>, Response<()>, _>(IdempotencyKeyLayer::new());
    handle.allow(0);
    tokio_test::assert_pending!(svc.poll_ready());
    handle.allow(1);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let fut = svc.call(request(Method::POST));
    let (req, send_response) = handle.next_request().await.unwrap();
    assert_uuid_v4(req.headers().get("idempotency-key").unwrap());
    send_response.send_response(Response::new(()));
    fut.await.unwrap();
}

#[test]
fn debug_names_the_configuration() {
    let layer =
        IdempotencyKeyLayer::new().header_name(HeaderName::from_static("x-idempotency-key"));
    let shown = format!("{layer:?}");
    assert!(shown.contains("x-idempotency-key"), "{shown}");
    assert!(shown.contains("UuidV4"), "{shown}");
}

/// `layer.layer(svc)`, spelled so the tests read top-down.
trait LayerService: Sized {
    fn layer_service<S>(self, inner: S) -> <Self as tower::Layer<S>>::Service
    where
        Self: tower::Layer<S>,
    {
        tower::Layer::layer(&self, inner)
    }
}

impl<M> LayerService for IdempotencyKeyLayer<M> {}

#[test]
fn service_and_future_are_send_sync_and_clone() {
    fn check<S>(_: &S)
    where
        S: Service<Request<()>> + Clone + Send + Sync + 'static,
        S::Future: Send,
    {
    }
    let (_, inner) = recorder(StatusCode::OK);
    check(&IdempotencyKeyLayer::new().layer_service(inner.clone()));
    let n = AtomicU32::new(0);
    let with_generator = IdempotencyKeyLayer::new()
        .generator(move || HeaderValue::from(n.fetch_add(1, Ordering::Relaxed)));
    check(&with_generator.layer_service(inner));
}

// ===== a blank key is no key (issue 10, item 3) =====

/// The real retry stack (idempotency key, retry, classify) over a mock
/// that answers 503 every time.
fn retrying_over(
    mock: &rebound_test::mock::MockService,
) -> impl Service<
    Request<http_body_util::Full<bytes::Bytes>>,
    Response = Response<http_body_util::Full<bytes::Bytes>>,
    Error = Error,
> {
    ServiceBuilder::new()
        .layer(IdempotencyKeyLayer::new())
        .layer(rebound_core::RetryLayer::new(
            rebound_core::RetryPolicy::default().max_attempts(3),
        ))
        .layer(rebound_core::ClassifyLayer::new(
            rebound_core::HttpClassifier::default(),
        ))
        .service(mock.clone())
}

fn post_with_key(key: &'static str) -> Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri("http://api.example/v1/orders")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_static(key));
    req
}

#[tokio::test(start_paused = true)]
async fn a_blank_callers_key_is_no_key_and_the_post_is_sent_once() {
    use rebound_test::mock::{MockService, Reply};
    for blank in ["", " ", "   ", "\t", " \t "] {
        let mock = MockService::new().otherwise(Reply::code(503));
        let mut req = post_with_key(blank);
        // An annotation next to a blank header does not make it a key: the
        // server sees the header.
        req.extensions_mut()
            .insert(IdempotencyKey(HeaderValue::from_static("not-what-is-sent")));
        let res = retrying_over(&mock).oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{blank:?}");
        assert_eq!(
            res.extensions().get::<rebound_core::RetryStop>(),
            Some(&rebound_core::RetryStop::NotEligible),
            "{blank:?}"
        );
        let calls = mock.calls();
        assert_eq!(calls.len(), 1, "{blank:?}: sent {} times", calls.len());
        // The caller's header is left as it was: no key was made up.
        assert_eq!(
            calls[0]
                .headers
                .get("idempotency-key")
                .map(|v| v.as_bytes()),
            Some(blank.as_bytes())
        );
    }

    // The control: a real key (even with spaces around it) is retried.
    let mock = MockService::new().otherwise(Reply::code(503));
    let res = retrying_over(&mock)
        .oneshot(post_with_key(" k-1 "))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(mock.call_count(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_blank_key_without_the_key_layer_is_no_key_for_the_retry_layer() {
    use rebound_test::mock::{MockService, Reply};
    let mock = MockService::new().otherwise(Reply::code(503));
    let svc = ServiceBuilder::new()
        .layer(rebound_core::RetryLayer::new(
            rebound_core::RetryPolicy::default().max_attempts(3),
        ))
        .layer(rebound_core::ClassifyLayer::new(
            rebound_core::HttpClassifier::default(),
        ))
        .service(mock.clone());
    let res = svc.oneshot(post_with_key("  ")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(mock.call_count(), 1);

    // A blank annotation alone is no key either.
    let mock = MockService::new().otherwise(Reply::code(503));
    let svc = ServiceBuilder::new()
        .layer(rebound_core::RetryLayer::new(
            rebound_core::RetryPolicy::default().max_attempts(3),
        ))
        .layer(rebound_core::ClassifyLayer::new(
            rebound_core::HttpClassifier::default(),
        ))
        .service(mock.clone());
    let mut req = post_with_key("x");
    req.headers_mut().remove("idempotency-key");
    req.extensions_mut()
        .insert(IdempotencyKey(HeaderValue::from_static(" \t")));
    svc.oneshot(req).await.unwrap();
    assert_eq!(mock.call_count(), 1);
}

#[tokio::test]
async fn a_blank_annotation_gets_a_fresh_key_and_a_blank_generated_key_is_none() {
    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new().layer_service(inner);
    let mut req = request(Method::POST);
    req.extensions_mut()
        .insert(IdempotencyKey(HeaderValue::from_static("  ")));
    send(&mut svc, req).await.unwrap();
    let key = log.lock().unwrap()[0].header.clone().expect("a fresh key");
    assert_uuid_v4(&key);

    let (log, inner) = recorder(StatusCode::OK);
    let mut svc = IdempotencyKeyLayer::new()
        .generator(|| HeaderValue::from_static(" "))
        .layer_service(inner);
    send(&mut svc, request(Method::POST)).await.unwrap();
    assert_eq!(log.lock().unwrap()[0].header, None);
    assert_eq!(log.lock().unwrap()[0].annotation, None);
}
