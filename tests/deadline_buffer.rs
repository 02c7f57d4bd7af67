//! A deadline set above a `tower::buffer::Buffer`, or a task spawned with
//! the request, holds below it: `DeadlineLayer` stamps it on the request,
//! which crosses both (a task-local would not).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use rebound::deadline::DeadlineLayer;
use rebound::Deadline;
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};

type Req = Request<Full<Bytes>>;

fn req() -> Req {
    Request::get("http://api.example/v1")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_deadline_above_a_buffer_is_seen_below_it() {
    let start = Instant::now();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_millis(300)))
        .buffer(8)
        .service(service_fn(|req: Req| {
            // Below the buffer, in its worker task: `call` runs there (the
            // response future is polled by the caller's task).
            let seen = Deadline::of(req.extensions());
            async move {
                let mut res = Response::new(Full::new(Bytes::new()));
                res.extensions_mut().insert(seen);
                Ok::<_, Infallible>(res)
            }
        }));
    let res = svc.oneshot(req()).await.unwrap();
    let seen = res.extensions().get::<Option<Instant>>().copied().flatten();
    assert_eq!(seen, Some(start + Duration::from_millis(300)));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_reaches_a_task_spawned_with_the_request() {
    let start = Instant::now();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_millis(300)))
        .service(service_fn(|req: Req| async move {
            // The request goes to another task, as a queue or a worker
            // pool would send it.
            let seen = tokio::spawn(async move { Deadline::of(req.extensions()) })
                .await
                .unwrap();
            let mut res = Response::new(Full::new(Bytes::new()));
            res.extensions_mut().insert(seen);
            Ok::<_, Infallible>(res)
        }));
    let res = svc.oneshot(req()).await.unwrap();
    let seen = res.extensions().get::<Option<Instant>>().copied().flatten();
    assert_eq!(seen, Some(start + Duration::from_millis(300)));
}
