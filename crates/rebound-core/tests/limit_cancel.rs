//! Cancellation by token: the response future ends with `Cancelled` at once,
//! everything below is dropped (queue places, attempts), nothing is left.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use rebound_core::annotations::Verdict;
use rebound_core::cancel::{Cancel, CancelLayer};
use rebound_core::limit::ConcurrencyLimitLayer;
use rebound_core::ErrorKind;
use tokio::time::Instant;
use tokio_test::{assert_pending, assert_ready, task};
use tokio_util::sync::CancellationToken;
use tower::{service_fn, ServiceBuilder, ServiceExt};

fn req(token: Option<&CancellationToken>) -> Request<()> {
    let mut r = Request::get("https://user:pw@api.test/slow?key=secret")
        .body(())
        .unwrap();
    if let Some(t) = token {
        r.extensions_mut().insert(Cancel(t.clone()));
    }
    r
}

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn token_ends_the_request_at_once_and_drops_what_is_below() {
    let baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let dropped = Arc::new(AtomicBool::new(false));
    let svc = {
        let dropped = dropped.clone();
        ServiceBuilder::new()
            .layer(CancelLayer::new())
            .service(service_fn(move |_req: Request<()>| {
                let flag = DropFlag(dropped.clone());
                async move {
                    let _flag = flag;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, Infallible>(Response::new(()))
                }
            }))
    };
    let token = CancellationToken::new();
    let start = Instant::now();
    let mut fut = task::spawn(svc.oneshot(req(Some(&token))));
    assert_pending!(fut.poll());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_pending!(fut.poll());
    assert!(!dropped.load(Ordering::SeqCst));

    token.cancel();
    assert!(fut.is_woken());
    let err = assert_ready!(fut.poll()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(err.extensions().get::<Verdict>().unwrap().is_fatal());
    let shown = err.to_string();
    assert_eq!(shown, "cancelled for GET https://api.test/slow");
    // The inner future is gone before the caller drops ours.
    assert!(dropped.load(Ordering::SeqCst));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    drop(fut);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline
    );
}

#[tokio::test(start_paused = true)]
async fn an_already_cancelled_request_is_not_sent() {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = {
        let calls = calls.clone();
        ServiceBuilder::new()
            .layer(CancelLayer::new())
            .service(service_fn(move |_req: Request<()>| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(())) }
            }))
    };
    let token = CancellationToken::new();
    token.cancel();
    let err = svc.clone().oneshot(req(Some(&token))).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Cancelled));
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Without a token, or with one that never fires: passes through.
    svc.clone().oneshot(req(None)).await.unwrap();
    svc.oneshot(req(Some(&CancellationToken::new())))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_queued_request_gives_its_place_back() {
    let svc = ServiceBuilder::new()
        .layer(CancelLayer::new())
        .layer(ConcurrencyLimitLayer::try_new(1).unwrap())
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"x"))))
        }));
    let limiter = svc.get_ref().limiter().clone();

    let held = svc.clone().oneshot(req(None)).await.unwrap();
    let token = CancellationToken::new();
    let mut queued = task::spawn(svc.clone().oneshot(req(Some(&token))));
    assert_pending!(queued.poll());
    let mut after = task::spawn(svc.clone().oneshot(req(None)));
    assert_pending!(after.poll());
    assert_eq!(limiter.queued(), 2);

    token.cancel();
    assert!(matches!(
        assert_ready!(queued.poll()).unwrap_err().kind(),
        ErrorKind::Cancelled
    ));
    assert_eq!(limiter.queued(), 1);
    // The permit goes to the live waiter behind it.
    drop(held);
    assert!(after.is_woken());
    assert_ready!(after.poll()).unwrap();
}
