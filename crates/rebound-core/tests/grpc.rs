//! The gRPC layers in one stack, on paused time: eligibility by method
//! path, Trailers-Only retries, pushback, and the grpc-timeout each attempt
//! carries.
#![cfg(all(
    feature = "grpc",
    feature = "retry",
    feature = "timeout",
    feature = "backoff",
    feature = "retry-after"
))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use rebound_core::grpc::{
    parse_grpc_timeout, Code, GrpcClassifier, MarkRetryableLayer, PropagateDeadlineLayer,
    RetryableMethods,
};
use rebound_core::{
    Attempts, Backoff, BackoffLayer, BoxError, ClassifyLayer, DeadlineLayer, RetryAfterLayer,
    RetryLayer, RetryPolicy, RetryStop,
};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

type Seen = Arc<Mutex<Vec<(Instant, Option<Duration>)>>>;

/// A server answering `statuses` in turn (as Trailers-Only `grpc-status`,
/// with the pushback given), recording when each attempt came and the
/// `grpc-timeout` it carried.
fn server(
    statuses: Vec<(&'static str, Option<&'static str>)>,
    seen: Seen,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    let statuses = Arc::new(statuses);
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(parse_grpc_timeout);
        let n = {
            let mut seen = seen.lock().unwrap();
            seen.push((Instant::now(), timeout));
            seen.len() - 1
        };
        let (status, pushback) = statuses.get(n).copied().unwrap_or(("0", None));
        async move {
            let mut res = Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", status);
            if let Some(p) = pushback {
                res = res.header("grpc-retry-pushback-ms", p);
            }
            Ok::<_, BoxError>(res.body(Full::new(Bytes::new())).unwrap())
        }
    })
}

fn call(path: &str, grpc: bool) -> Request<Full<Bytes>> {
    let mut b = Request::post(format!("http://svc.example{path}"));
    if grpc {
        b = b.header("content-type", "application/grpc");
    }
    b.body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .unwrap()
}

async fn run(
    statuses: Vec<(&'static str, Option<&'static str>)>,
    req: Request<Full<Bytes>>,
) -> (
    Result<Response<rebound_core::deadline::DeadlineBody<Full<Bytes>>>, rebound_core::Error>,
    Vec<(Instant, Option<Duration>)>,
    Instant,
) {
    let seen = Seen::default();
    let mut svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(1)))
        .layer(MarkRetryableLayer::new(
            RetryableMethods::none().service("kv.Store"),
        ))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
        .layer(PropagateDeadlineLayer::new())
        .layer(BackoffLayer::new(Backoff::exponential(
            Duration::from_millis(100),
            Duration::from_millis(100),
        )))
        .layer(RetryAfterLayer::new())
        .layer(ClassifyLayer::new(
            GrpcClassifier::default().retryable_code(Code::RESOURCE_EXHAUSTED),
        ))
        .service(server(statuses, seen.clone()));
    let start = Instant::now();
    let out = svc.ready().await.unwrap().call(req).await;
    let seen = seen.lock().unwrap().clone();
    (out, seen, start)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_attempt_carries_the_time_left() {
    let (out, seen, start) = run(
        vec![("14", None), ("14", None)],
        call("/kv.Store/Get", true),
    )
    .await;
    let res = out.unwrap();
    assert_eq!(Attempts::of(res.extensions()), 3);
    assert_eq!(seen.len(), 3);
    let mut previous = Duration::MAX;
    for (at, timeout) in seen {
        let timeout = timeout.expect("every attempt says how long it has");
        let left = Duration::from_secs(1) - (at - start);
        assert!(timeout <= left, "{timeout:?} > {left:?}");
        assert!(timeout < previous, "each attempt has less time");
        previous = timeout;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn pushback_overrides_the_backoff() {
    let (out, seen, _) = run(
        vec![("8", Some("300")), ("8", Some("-1"))],
        call("/kv.Store/Get", true),
    )
    .await;
    let err_res = out.unwrap();
    assert_eq!(
        err_res.extensions().get::<RetryStop>(),
        Some(&RetryStop::Fatal)
    );
    assert_eq!(seen.len(), 2, "the -1 pushback stops the loop");
    assert_eq!(seen[1].0 - seen[0].0, Duration::from_millis(300));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn only_declared_grpc_methods_are_eligible() {
    let (out, seen, _) = run(vec![("14", None)], call("/kv.Store/Put", true)).await;
    assert!(out.is_ok());
    assert_eq!(seen.len(), 2, "kv.Store is declared: Put is retried");

    let (out, seen, _) = run(vec![("14", None)], call("/billing.Pay/Charge", true)).await;
    assert_eq!(
        out.unwrap().extensions().get::<RetryStop>(),
        Some(&RetryStop::NotEligible)
    );
    assert_eq!(seen.len(), 1);

    // Not gRPC (no content-type): a POST stays ineligible, and no
    // grpc-timeout is written.
    let (_, seen, _) = run(vec![("14", None)], call("/kv.Store/Get", false)).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1, None);
}

/// gRFC A6's transparent retry: a call that never left the client (here a
/// refused connection, `Sent::NotSent`) is sent once more outside the
/// attempt count — for a gRPC call only, and only once.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_grpc_call_never_sent_gets_one_transparent_retry() {
    use rebound_core::{Error, ErrorKind};

    async fn attempts(refusals: usize, grpc: bool) -> (usize, Result<u32, ErrorKind>) {
        let n = Arc::new(Mutex::new(0usize));
        let inner = {
            let n = n.clone();
            tower::service_fn(move |_req: Request<Full<Bytes>>| {
                let mut n = n.lock().unwrap();
                *n += 1;
                let refuse = *n <= refusals;
                async move {
                    if refuse {
                        return Err(BoxError::from(Error::new(ErrorKind::Connect)));
                    }
                    Ok::<_, BoxError>(
                        Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "0")
                            .body(Full::new(Bytes::new()))
                            .unwrap(),
                    )
                }
            })
        };
        let mut svc = ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(2)))
            .layer(ClassifyLayer::new(GrpcClassifier::default()))
            .service(inner);
        // Not a method marked retryable: only never-sent calls go again.
        let out = svc
            .ready()
            .await
            .unwrap()
            .call(call("/kv.Store/Put", grpc))
            .await;
        let made = *n.lock().unwrap();
        (
            made,
            out.map(|r| Attempts::of(r.extensions()))
                .map_err(|e| e.kind()),
        )
    }

    // Two refusals with max_attempts(2): the third, transparent, attempt works.
    assert_eq!(attempts(2, true).await, (3, Ok(3)));
    // Only once: three refusals end the call.
    assert_eq!(attempts(3, true).await, (3, Err(ErrorKind::Connect)));
    // A plain HTTP request keeps its count.
    assert_eq!(attempts(2, false).await, (2, Err(ErrorKind::Connect)));
}

/// gRFC A6's per-method retry policy: each method's attempts and codes, not
/// one set for the classifier.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_method_has_its_own_attempts_and_codes() {
    use rebound_core::grpc::MethodPolicy;

    async fn run_with(
        methods: RetryableMethods,
        statuses: Vec<(&'static str, Option<&'static str>)>,
        path: &str,
    ) -> (usize, Option<RetryStop>, String) {
        let seen = Seen::default();
        let mut svc = ServiceBuilder::new()
            .layer(MarkRetryableLayer::new(methods))
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
            .layer(RetryAfterLayer::new())
            // The classifier's own set: UNAVAILABLE only.
            .layer(ClassifyLayer::new(GrpcClassifier::default()))
            .service(server(statuses, seen.clone()));
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(call(path, true))
            .await
            .unwrap();
        let stop = res.extensions().get::<RetryStop>().copied();
        let status = res.headers()["grpc-status"].to_str().unwrap().to_owned();
        let n = seen.lock().unwrap().len();
        (n, stop, status)
    }
    let methods = RetryableMethods::none()
        .service_policy(
            "kv.Store",
            MethodPolicy::new()
                .max_attempts(5)
                .retryable_codes([Code::UNAVAILABLE, Code::RESOURCE_EXHAUSTED]),
        )
        .method_policy(
            "/kv.Store/Put",
            MethodPolicy::new()
                .max_attempts(2)
                .retryable_codes([Code::ABORTED]),
        )
        .service("echo.Echo");
    let eights = vec![("8", None); 4];

    // kv.Store: RESOURCE_EXHAUSTED is retried, five attempts.
    assert_eq!(
        run_with(methods.clone(), eights.clone(), "/kv.Store/Get").await,
        (5, None, "0".into())
    );
    // Its Put: ABORTED only, two attempts; RESOURCE_EXHAUSTED is fatal.
    assert_eq!(
        run_with(methods.clone(), eights.clone(), "/kv.Store/Put").await,
        (1, Some(RetryStop::Fatal), "8".into())
    );
    assert_eq!(
        run_with(methods.clone(), vec![("10", None); 4], "/kv.Store/Put").await,
        (2, Some(RetryStop::Attempts), "10".into())
    );
    // echo.Echo, retryable without a policy: the classifier's codes and
    // the layer's three attempts.
    assert_eq!(
        run_with(methods.clone(), eights, "/echo.Echo/Say").await,
        (1, Some(RetryStop::Fatal), "8".into())
    );
    assert_eq!(
        run_with(methods.clone(), vec![("14", None); 4], "/echo.Echo/Say").await,
        (3, Some(RetryStop::Attempts), "14".into())
    );
    // A negative pushback still stops a code the method retries.
    assert_eq!(
        run_with(methods, vec![("8", Some("-1")); 4], "/kv.Store/Get").await,
        (1, Some(RetryStop::Fatal), "8".into())
    );
}

#[test]
fn a_method_policy_of_zero_attempts_is_refused() {
    use rebound_core::grpc::MethodPolicy;
    let err = MethodPolicy::new().try_max_attempts(0).unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
}
