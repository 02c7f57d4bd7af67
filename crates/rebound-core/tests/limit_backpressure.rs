//! Backpressure tower can see: with `.backpressure(true)` the concurrency
//! limit and the adaptive limit reserve their permit in `poll_ready`, so
//! tower's `LoadShed` above them sheds; without it they keep waiting in the
//! response future.

use rebound_core::ErrorKind;
use std::convert::Infallible;
use std::future::poll_fn;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use rebound_core::limit::{AdaptiveLimitLayer, Aimd, ConcurrencyLimitLayer};
use rebound_core::Error;
use tokio::sync::watch;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok, task};
use tower::load_shed::error::Overloaded;
use tower::load_shed::LoadShedLayer;
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

fn req() -> Request<()> {
    Request::get("http://upstream.test/").body(()).unwrap()
}

/// A service whose responses are held until `release` is sent `true`.
fn held(
    release: watch::Receiver<bool>,
) -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |_req: Request<()>| {
        let mut release = release.clone();
        async move {
            release.wait_for(|go| *go).await.unwrap();
            Ok(Response::new(Full::new(Bytes::from_static(b"body"))))
        }
    })
}

fn is_overloaded(err: &BoxError) -> bool {
    // LoadShed's own error: not wrapped by anything.
    err.is::<Overloaded>()
}

/// Of 3 concurrent calls through `LoadShed` over a limit of 1 (with
/// backpressure), 2 are shed at once and 1 proceeds; once it is over, the
/// next call proceeds too.
async fn two_of_three_shed<L>(limit: L)
where
    L: Layer<tower::util::BoxCloneService<Request<()>, Response<Full<Bytes>>, Infallible>>,
    L::Service: Service<Request<()>, Error = Error> + Clone + Send + 'static,
    <L::Service as Service<Request<()>>>::Future: Send,
    <L::Service as Service<Request<()>>>::Response: Send,
{
    let (go, release) = watch::channel(false);
    let inner = tower::util::BoxCloneService::new(held(release));
    let svc = ServiceBuilder::new()
        .layer(LoadShedLayer::new())
        .layer(limit)
        .service(inner);

    let mut calls: Vec<_> = (0..3)
        .map(|_| task::spawn(svc.clone().oneshot(req())))
        .collect();
    let mut shed = 0;
    let mut pending = 0;
    for call in &mut calls {
        match call.poll() {
            std::task::Poll::Ready(Err(e)) => {
                assert!(is_overloaded(&e), "{e}");
                // rebound's classifier recognises it as never sent.
                assert!(matches!(Error::from_boxed(e).kind(), ErrorKind::Rejected));
                shed += 1;
            }
            std::task::Poll::Ready(Ok(_)) => panic!("the inner service is held"),
            std::task::Poll::Pending => pending += 1,
        }
    }
    assert_eq!((shed, pending), (2, 1), "2 shed at once, 1 proceeds");

    go.send(true).unwrap();
    let first = calls.remove(0);
    let res = first.await.expect("the call that got the permit succeeds");
    drop(res); // gives the permit back (the body held it)

    // Capacity is back: the next call is not shed.
    let res = svc.clone().oneshot(req()).await.expect("not shed");
    drop(res);
}

#[tokio::test(start_paused = true)]
async fn load_shed_sheds_over_the_concurrency_limit() {
    two_of_three_shed(ConcurrencyLimitLayer::new(1).backpressure(true)).await;
}

#[tokio::test(start_paused = true)]
async fn load_shed_sheds_over_the_adaptive_limit() {
    let aimd = Aimd::default().min_limit(1).initial_limit(1).max_limit(1);
    two_of_three_shed(AdaptiveLimitLayer::new(aimd).backpressure(true)).await;
}

#[tokio::test(start_paused = true)]
async fn without_backpressure_load_shed_never_sheds() {
    // The default is unchanged: poll_ready passes through, the second call
    // waits for the permit inside its response future.
    let (go, release) = watch::channel(false);
    let svc = ServiceBuilder::new()
        .layer(LoadShedLayer::new())
        .layer(ConcurrencyLimitLayer::new(1))
        .service(held(release));
    let mut first = task::spawn(svc.clone().oneshot(req()));
    let mut second = task::spawn(svc.clone().oneshot(req()));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    go.send(true).unwrap();
    drop(first.await.unwrap());
    drop(second.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn not_ready_while_the_permit_is_taken_woken_when_it_comes_back() {
    let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<Full<Bytes>>, _>(
        ConcurrencyLimitLayer::new(1).backpressure(true),
    );

    assert_ready_ok!(svc.poll_ready());
    let mut call = task::spawn(svc.call(req()));
    // The permit went with the call: the service is not ready.
    assert_pending!(svc.poll_ready());
    assert_pending!(call.poll());

    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(Full::new(Bytes::from_static(b"body"))));
    let res = assert_ready_ok!(call.poll());
    // The body still holds the permit (LimitBody): still not ready.
    assert!(!svc.is_woken());
    assert_pending!(svc.poll_ready());

    // Reading the body to its end gives the permit back and wakes the
    // service.
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "body");
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn adaptive_not_ready_while_the_slot_is_taken() {
    let aimd = Aimd::default().min_limit(1).initial_limit(1).max_limit(1);
    let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(
        AdaptiveLimitLayer::new(aimd).backpressure(true),
    );

    assert_ready_ok!(svc.poll_ready());
    let mut call = task::spawn(svc.call(req()));
    assert_pending!(svc.poll_ready());

    // The slot goes back with the response head.
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(()));
    assert_ready_ok!(call.poll());
    assert!(svc.is_woken());
    assert_ready_ok!(svc.poll_ready());
}

#[tokio::test(start_paused = true)]
async fn a_clone_starts_without_the_permit_and_a_dropped_reservation_gives_it_back() {
    let (_go, release) = watch::channel(false);
    let layer = ConcurrencyLimitLayer::new(1).backpressure(true);
    let limiter = layer.limiter().clone();
    let mut a = layer.layer(held(release));
    let mut b = a.clone();

    let mut cx = task::spawn(());
    assert_ready!(cx.enter(|cx, _| a.poll_ready(cx))).unwrap();
    assert_eq!(limiter.available(), 0, "poll_ready reserved the permit");
    // The clone does not share the reservation: it waits for its own.
    let mut waiter = task::spawn(poll_fn(|cx| b.poll_ready(cx)));
    assert_pending!(waiter.poll());

    // A reservation dropped with its service goes back, to the waiter.
    drop(a);
    assert!(waiter.is_woken());
    assert_ready!(waiter.poll()).unwrap();
    drop(waiter);
    assert_eq!(limiter.available(), 0, "b holds it now");
    drop(b);
    assert_eq!(limiter.available(), 1);
}

#[tokio::test(start_paused = true)]
async fn call_without_poll_ready_waits_in_the_future() {
    // `call` that comes without a reserved permit (a caller that broke the
    // contract, or a clone) falls back to the default: it waits for a
    // permit inside its response future.
    let layer = ConcurrencyLimitLayer::new(1).backpressure(true);
    let limiter = layer.limiter().clone();
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"body"))))
    }));
    let first = svc.call(req()).await.unwrap();
    assert_eq!(limiter.in_flight(), 1);
    let mut second = task::spawn(svc.call(req()));
    assert_pending!(second.poll());
    assert_eq!(limiter.queued(), 1);
    drop(first);
    assert!(second.is_woken());
    let res = assert_ready_ok!(second.poll());
    drop(res);
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_poll_ready_waited_lends_its_permit_and_shows_the_state() {
    use rebound_core::annotations::{LimiterState, PermitLease};
    // As a request that queued in the future: the permit goes down as a
    // lease (so a gate below can give it back) and the outcome shows the
    // limiter's state; one that found a free permit carries neither.
    let layer = ConcurrencyLimitLayer::new(1).backpressure(true);
    let limiter = layer.limiter().clone();
    let mut svc = layer.layer(service_fn(|req: Request<()>| async move {
        let lent = req.extensions().get::<PermitLease>().is_some();
        let mut res = Response::new(Full::new(Bytes::from_static(b"body")));
        res.extensions_mut().insert(lent);
        Ok::<_, Infallible>(res)
    }));
    let mut other = svc.clone();

    svc.ready().await.unwrap();
    let first = svc.call(req()).await.unwrap();
    assert_eq!(first.extensions().get::<bool>(), Some(&false));
    assert!(first.extensions().get::<LimiterState>().is_none());

    let mut waiter = task::spawn(poll_fn(|cx| other.poll_ready(cx)));
    assert_pending!(waiter.poll());
    drop(first);
    assert!(waiter.is_woken());
    assert_ready!(waiter.poll()).unwrap();
    drop(waiter);
    let second = other.call(req()).await.unwrap();
    assert_eq!(second.extensions().get::<bool>(), Some(&true));
    let state = second.extensions().get::<LimiterState>().unwrap();
    assert_eq!(
        (state.limiter, state.limit, state.in_flight),
        ("concurrency", 1, 1)
    );
    // The body holds the permit, as usual.
    assert_eq!(limiter.in_flight(), 1);
    drop(second);
    assert_eq!(limiter.in_flight(), 0);
}
