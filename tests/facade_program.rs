//! The program of issue 2, compiled against the `rebound` facade: the retry
//! core stacked on a `tower::service_fn`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use rebound::{
    Attempts, Backoff, BackoffLayer, ClassifyLayer, Error, HttpClassifier, Jitter, RetryAfterLayer,
    RetryLayer, RetryPolicy,
};
use tower::{Service, ServiceExt};

#[tokio::test(start_paused = true)]
async fn the_issue_program_compiles_and_runs() -> Result<(), Error> {
    let calls = Arc::new(AtomicU32::new(0));
    let inner = {
        let calls = calls.clone();
        tower::service_fn(move |_req: Request<Full<Bytes>>| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let res = match n {
                    0 => Response::builder()
                        .status(StatusCode::TOO_MANY_REQUESTS)
                        .header("retry-after", "2")
                        .body(Full::new(Bytes::from_static(b"slow down"))),
                    1 => Response::builder()
                        .status(StatusCode::BAD_GATEWAY)
                        .body(Full::new(Bytes::new())),
                    _ => Response::builder().body(Full::new(Bytes::from_static(b"hello"))),
                };
                Ok::<_, std::convert::Infallible>(res.unwrap())
            }
        })
    };

    let mut svc = tower::ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
        .layer(BackoffLayer::new(
            Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10))
                .jitter(Jitter::Full),
        ))
        .layer(RetryAfterLayer::new())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);

    let start = tokio::time::Instant::now();
    let req = Request::get("https://api.example.com/v1/models")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res: Response<Full<Bytes>> = svc.ready().await?.call(req).await?;

    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<Attempts>(), Some(&Attempts(3)));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // 2 s from Retry-After, then at most 200 ms of backoff (full jitter).
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(waited <= Duration::from_millis(2_200), "{waited:?}");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "hello");
    Ok(())
}
