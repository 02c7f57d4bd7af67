//! `CollectBodyLayer`: the whole body inside the attempt, the size cap
//! (announced and streamed), body errors, the deadline, and a truncated body
//! retried by a retry loop above it.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full};
use rebound_core::collect::{CollectBodyLayer, CollectedBody};
use rebound_core::{Deadline, Error, ErrorKind, Sent, TimeoutStage};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, BoxError, Layer, Service, ServiceBuilder, ServiceExt};

// ===== a response body the test feeds frame by frame =====

type Tx = mpsc::UnboundedSender<Result<Frame<Bytes>, BoxError>>;

struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Result<Frame<Bytes>, BoxError>>,
    hint: SizeHint,
    /// Frames handed out so far.
    taken: Arc<AtomicUsize>,
}

fn channel() -> (Tx, ChannelBody, Arc<AtomicUsize>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let taken = Arc::new(AtomicUsize::new(0));
    let body = ChannelBody {
        rx,
        hint: SizeHint::default(),
        taken: taken.clone(),
    };
    (tx, body, taken)
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = std::task::ready!(self.rx.poll_recv(cx));
        if frame.is_some() {
            self.taken.fetch_add(1, Ordering::SeqCst);
        }
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

fn data(tx: &Tx, bytes: impl Into<Bytes>) {
    tx.send(Ok(Frame::data(bytes.into()))).unwrap();
}

/// A service that answers every request with the next prepared response.
fn answers<B: Send + 'static>(
    list: Vec<Response<B>>,
) -> impl Service<
    Request<()>,
    Response = Response<B>,
    Error = Infallible,
    Future = Ready<Result<Response<B>, Infallible>>,
> + Clone {
    let list = Arc::new(Mutex::new(list.into_iter()));
    service_fn(move |_req: Request<()>| {
        ready(Ok(list
            .lock()
            .unwrap()
            .next()
            .expect("a prepared response")))
    })
}

fn get() -> Request<()> {
    Request::builder()
        .method(Method::GET)
        .uri("http://api.example/v1/items?token=secret")
        .body(())
        .unwrap()
}

async fn send<S>(svc: &mut S, req: Request<()>) -> Result<Response<CollectedBody>, Error>
where
    S: Service<Request<()>, Response = Response<CollectedBody>, Error = Error>,
{
    svc.ready().await?.call(req).await
}

// ===== the happy path =====

#[tokio::test]
async fn the_whole_body_is_read_inside_the_attempt() {
    let (tx, body, _) = channel();
    let mut res = Response::new(body);
    *res.status_mut() = StatusCode::ACCEPTED;
    res.headers_mut()
        .insert("x-request-id", HeaderValue::from_static("r1"));
    res.extensions_mut().insert(7u32);
    let mut svc = CollectBodyLayer::new().layer(answers(vec![res]));

    let mut call = tokio_test::task::spawn(send(&mut svc, get()));
    assert!(call.poll().is_pending());
    data(&tx, "hello, ");
    assert!(call.is_woken());
    assert!(call.poll().is_pending(), "not before the body ends");
    data(&tx, "world");
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("42"));
    tx.send(Ok(Frame::trailers(trailers.clone()))).unwrap();
    drop(tx);
    let res = match call.poll() {
        Poll::Ready(res) => res.unwrap(),
        Poll::Pending => panic!("the body ended"),
    };
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(res.headers()["x-request-id"], "r1");
    assert_eq!(res.extensions().get::<u32>(), Some(&7));
    assert_eq!(res.body().bytes(), "hello, world");
    assert_eq!(res.body().trailers(), Some(&trailers));

    // And it is a Body like any other: one data frame, then the trailers.
    let body = res.into_body();
    assert_eq!(body.size_hint().exact(), Some(12));
    let collected = body.collect().await.unwrap();
    assert_eq!(collected.trailers(), Some(&trailers));
    assert_eq!(collected.to_bytes(), "hello, world");
}

#[tokio::test]
async fn an_empty_body_is_an_empty_collected_body() {
    let mut svc =
        CollectBodyLayer::new().layer(answers(vec![Response::new(Empty::<Bytes>::new())]));
    let res = send(&mut svc, get()).await.unwrap();
    assert!(res.body().is_empty());
    assert!(res.body().is_end_stream());
    assert_eq!(res.body().trailers(), None);
}

#[tokio::test]
async fn a_body_exactly_at_the_cap_is_accepted() {
    let (tx, body, _) = channel();
    data(&tx, "12345");
    data(&tx, "67890");
    drop(tx);
    let mut svc = CollectBodyLayer::new()
        .max_bytes(10)
        .layer(answers(vec![Response::new(body)]));
    let res = send(&mut svc, get()).await.unwrap();
    assert_eq!(res.body().bytes(), "1234567890");
}

#[tokio::test]
async fn an_in_memory_body_is_not_copied() {
    let payload = Bytes::from(vec![b'x'; 64 * 1024]);
    let mut svc =
        CollectBodyLayer::new().layer(answers(vec![Response::new(Full::new(payload.clone()))]));
    let res = send(&mut svc, get()).await.unwrap();
    assert_eq!(res.body().bytes().as_ptr(), payload.as_ptr());
}

// ===== the cap =====

#[tokio::test]
async fn an_announced_length_over_the_cap_is_refused_without_reading() {
    // Content-Length says 20 MiB; the body has one frame ready, never read.
    let (tx, body, taken) = channel();
    data(&tx, vec![0u8; 1024]);
    let mut res = Response::new(body);
    res.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(20u64 * 1024 * 1024));
    let mut svc = CollectBodyLayer::new().layer(answers(vec![res]));
    let err = send(&mut svc, get()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BodyTooLarge);
    assert_eq!(taken.load(Ordering::SeqCst), 0, "nothing was read");
    assert!(tx.is_closed(), "the body was dropped at once");
    let shown = err.to_string();
    assert!(shown.starts_with("body too large"), "{shown}");
    assert!(
        shown.ends_with("for GET http://api.example/v1/items"),
        "{shown}"
    );

    // The same when only the body's size_hint says so.
    let (_tx, mut body, taken) = channel();
    body.hint = SizeHint::with_exact(11);
    let mut svc = CollectBodyLayer::new()
        .max_bytes(10)
        .layer(answers(vec![Response::new(body)]));
    let err = send(&mut svc, get()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::BodyTooLarge));
    assert_eq!(taken.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn content_length_of_a_response_without_content_is_not_a_size() {
    // HEAD: the Content-Length is that of the GET body, which is not sent.
    let mut head = Response::new(Empty::<Bytes>::new());
    head.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(20u64 * 1024 * 1024));
    let mut not_modified = Response::new(Empty::<Bytes>::new());
    *not_modified.status_mut() = StatusCode::NOT_MODIFIED;
    not_modified
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(20u64 * 1024 * 1024));
    let mut svc = CollectBodyLayer::new()
        .max_bytes(10)
        .layer(answers(vec![head, not_modified]));
    let mut req = get();
    *req.method_mut() = Method::HEAD;
    assert!(send(&mut svc, req).await.unwrap().body().is_empty());
    let res = send(&mut svc, get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
}

#[tokio::test]
async fn a_malformed_content_length_is_no_hint() {
    let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
    res.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from_static("lots"));
    let mut svc = CollectBodyLayer::new()
        .max_bytes(10)
        .layer(answers(vec![res]));
    assert_eq!(send(&mut svc, get()).await.unwrap().body().bytes(), "ok");
}

#[tokio::test]
async fn reading_stops_as_soon_as_the_cap_is_passed() {
    // No length announced; the server would send forever.
    let (tx, body, taken) = channel();
    for _ in 0..4 {
        data(&tx, vec![1u8; 4]);
    }
    let mut svc = CollectBodyLayer::new()
        .max_bytes(10)
        .layer(answers(vec![Response::new(body)]));
    let err = send(&mut svc, get()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BodyTooLarge);
    assert_eq!(
        taken.load(Ordering::SeqCst),
        3,
        "12 bytes read, the 4th frame is not"
    );
    assert!(tx.is_closed());
}

// ===== body errors =====

#[tokio::test]
async fn a_read_error_is_a_body_error_that_may_have_been_processed() {
    let (tx, body, _) = channel();
    data(&tx, "partial");
    tx.send(Err(Box::new(io::Error::new(
        io::ErrorKind::ConnectionReset,
        "reset",
    ))))
    .unwrap();
    let mut svc = CollectBodyLayer::new().layer(answers(vec![Response::new(body)]));
    let err = send(&mut svc, get()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Body);
    assert_eq!(
        err.find_source::<io::Error>().map(io::Error::kind),
        Some(io::ErrorKind::ConnectionReset)
    );
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
    assert_eq!(err.method(), Some(&Method::GET));
    assert!(!err.to_string().contains("secret"));
}

#[tokio::test]
async fn a_rebound_error_from_the_body_keeps_its_kind() {
    let (tx, body, _) = channel();
    data(&tx, "partial");
    tx.send(Err(Box::new(Error::timeout(TimeoutStage::BodyIdle))))
        .unwrap();
    let mut svc = CollectBodyLayer::new().layer(answers(vec![Response::new(body)]));
    let err = send(&mut svc, get()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::BodyIdle));
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
    assert!(err.url().is_some(), "named after the request");
}

#[tokio::test]
async fn inner_service_errors_pass_through() {
    let inner = service_fn(|_req: Request<()>| {
        ready(Err::<Response<Empty<Bytes>>, BoxError>(Box::new(
            Error::new(ErrorKind::Connect),
        )))
    });
    let mut svc = CollectBodyLayer::new().layer(inner);
    let err = send(&mut svc, get()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Connect));
    assert_eq!(err.extensions().get::<Sent>(), None, "not a body error");
}

// ===== the deadline =====

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_body() {
    let (tx, body, _) = channel();
    data(&tx, "slow");
    let mut svc = CollectBodyLayer::new().layer(answers(vec![Response::new(body)]));
    let start = Instant::now();
    let mut req = get();
    req.extensions_mut()
        .insert(Deadline(start + Duration::from_secs(2)));
    let err = send(&mut svc, req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    drop(tx);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_head() {
    let inner = service_fn(|_req: Request<()>| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    });
    let mut svc = CollectBodyLayer::new().layer(inner);
    let start = Instant::now();
    let mut req = get();
    req.extensions_mut()
        .insert(Deadline(start + Duration::from_secs(3)));
    let err = send(&mut svc, req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(TimeoutStage::Deadline));
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_a_slow_body_is_waited_for() {
    let (tx, body, _) = channel();
    let mut svc = CollectBodyLayer::new().layer(answers(vec![Response::new(body)]));
    let feeder = async move {
        tokio::time::sleep(Duration::from_secs(600)).await;
        data(&tx, "late");
    };
    let (res, ()) = tokio::join!(send(&mut svc, get()), feeder);
    assert_eq!(res.unwrap().body().bytes(), "late");
}

// ===== a truncated body is retried by a loop above =====

/// Retries an attempt that failed with a `Body` error, at most `self.0` times.
#[derive(Clone)]
struct RetryBodyErrors(u32);

impl<R> Policy<Request<()>, R, Error> for RetryBodyErrors {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Request<()>, res: &mut Result<R, Error>) -> Option<Ready<()>> {
        match res {
            Err(e) if matches!(e.kind(), ErrorKind::Body) && self.0 > 0 => {
                self.0 -= 1;
                Some(ready(()))
            }
            _ => None,
        }
    }

    fn clone_request(&mut self, req: &Request<()>) -> Option<Request<()>> {
        let mut copy = Request::new(());
        *copy.uri_mut() = req.uri().clone();
        Some(copy)
    }
}

#[tokio::test]
async fn a_truncated_body_fails_the_attempt_so_it_is_retried() {
    let (tx1, truncated, _) = channel();
    data(&tx1, "{\"id\":");
    tx1.send(Err(Box::new(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "connection closed before message completed",
    ))))
    .unwrap();
    let (tx2, good, _) = channel();
    data(&tx2, "{\"id\":7}");
    drop(tx2);
    let attempts = Arc::new(AtomicUsize::new(0));
    let inner = {
        let attempts = attempts.clone();
        let list = Arc::new(Mutex::new(vec![good, truncated]));
        service_fn(move |_req: Request<()>| {
            attempts.fetch_add(1, Ordering::SeqCst);
            ready(Ok::<_, Infallible>(Response::new(
                list.lock().unwrap().pop().unwrap(),
            )))
        })
    };
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryBodyErrors(2)))
        .layer(CollectBodyLayer::new())
        .service(inner);
    let res = send(&mut svc, get()).await.unwrap();
    assert_eq!(res.body().bytes(), "{\"id\":7}");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[test]
fn collected_body_debug_shows_no_data() {
    let body = CollectedBody::from(Bytes::from_static(b"secret-token"));
    let shown = format!("{body:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(shown.contains("len: 12"), "{shown}");
}

#[test]
fn service_and_future_are_send_sync_and_clone() {
    fn check<S>(_: &S)
    where
        S: Service<Request<()>, Response = Response<CollectedBody>> + Clone + Send + Sync + 'static,
        S::Future: Send,
    {
    }
    let svc = CollectBodyLayer::new().layer(answers(vec![Response::new(Full::new(Bytes::new()))]));
    check(&svc);
}
