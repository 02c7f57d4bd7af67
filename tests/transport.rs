//! Issue 3's acceptance through the ready-made client over `FaultServer`:
//! every stage times out with its own stage, real TLS round trips, retries
//! counted as the server saw them, the deadline capping the attempt timeout,
//! the `Sent` answer deciding what a POST may retry, and configuration that
//! cannot work refused at `build()`.

use rebound::ErrorKind;
use std::time::Duration;

use http::{Method, Request, Version};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use rebound::rebound_hyper::connect::tls_config;
use rebound::{
    Attempts, Backoff, Body, Client, ClientBuilder, Deadline, Error, HyperTransport, MinBodyRate,
    RetryStop, Sent, TimeoutStage, TlsRoots,
};
use rebound_test::fault::{self, Action, ConnectionAction, FaultServer};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

/// Upper bound of any one test: far above what each needs (< 3 s).
const TEST_LIMIT: Duration = Duration::from_secs(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Run `f` bounded by [`TEST_LIMIT`].
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_LIMIT, f)
        .await
        .expect("test exceeded its time limit")
}

/// A client for tests: short backoff (the default 10 s cap would not fit
/// in the short totals used here), everything else as given.
fn client() -> ClientBuilder {
    Client::builder().backoff(Backoff::exponential(ms(5), ms(20)))
}

/// Read the whole body, returning the error if it fails.
async fn drain<B>(body: B) -> Result<bytes::Bytes, Error>
where
    B: http_body::Body<Error = Error>,
{
    body.collect().await.map(|c| c.to_bytes())
}

// ===== each stage times out with its own stage =====

/// Loopback always accepts at once, so the connect stage is tested with a
/// connector that waits: on the transport, and through the whole client
/// (`ClientBuilder::build_with_tcp`) below.
#[tokio::test]
async fn connect_stage_times_out_as_connect() {
    bounded(async {
        let delaying = tower::service_fn(|uri: http::Uri| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.call(uri).await
        });
        let transport = HyperTransport::builder()
            .connect_timeout(ms(200))
            .build_with_tcp(delaying)
            .unwrap();
        let start = Instant::now();
        let err = transport
            .oneshot(
                Request::get("http://127.0.0.1:9/")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Connect), "{err:?}");
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    })
    .await
}

#[tokio::test]
async fn connect_stage_through_the_client_is_retried_as_not_sent() {
    bounded(async {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let delaying = {
            let calls = calls.clone();
            tower::service_fn(move |uri: http::Uri| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    let mut http = HttpConnector::new();
                    http.enforce_http(false);
                    http.call(uri).await
                }
            })
        };
        let client = client()
            .connect_timeout(ms(100))
            .idempotency_keys(None)
            .build_with_tcp(delaying)
            .unwrap();
        // A POST without a key: retried all the same, since a connect
        // timeout means nothing was sent.
        let err = client
            .send(
                Request::post("http://127.0.0.1:9/charge")
                    .body(Body::from("{}"))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Connect), "{err:?}");
        assert_eq!(err.attempts(), 3, "{err:?}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    })
    .await
}

#[tokio::test]
async fn tls_stage_times_out_as_tls() {
    bounded(async {
        let server = FaultServer::builder()
            .tls()
            .connections([ConnectionAction::hang_tls()])
            .start()
            .await;
        let client = client()
            .tls_roots(TlsRoots::Custom(server.root_store().unwrap()))
            .tls_timeout(ms(300))
            .max_attempts(1)
            .build()
            .unwrap();
        let start = Instant::now();
        let err = client.get(server.url("/")).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Tls), "{err:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(server.request_count(), 0);
    })
    .await
}

/// A TLS hang is NotSent: with retries on, the next connection (served)
/// answers and the caller sees 200 after two attempts.
#[tokio::test]
async fn tls_hang_is_retried_on_a_new_connection() {
    bounded(async {
        let server = FaultServer::builder()
            .tls()
            .connections([ConnectionAction::hang_tls()])
            .default(Action::status(200).body("ok"))
            .start()
            .await;
        let client = client()
            .tls_roots(TlsRoots::Custom(server.root_store().unwrap()))
            .tls_timeout(ms(300))
            .build()
            .unwrap();
        let res = client.post_orders(&server).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(Attempts::of(res.extensions()), 2);
        assert_eq!(server.connections(), 2);
        assert_eq!(server.request_count(), 1);
    })
    .await
}

#[tokio::test]
async fn headers_stage_times_out_as_headers() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::never_respond())
            .start()
            .await;
        let client = client()
            .attempt_timeout(ms(300))
            .max_attempts(1)
            .build()
            .unwrap();
        let start = Instant::now();
        let err = client.get(server.url("/slow")).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Headers), "{err:?}");
        assert!(start.elapsed() >= ms(300));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(server.requests_to("/slow").len(), 1);
    })
    .await
}

#[tokio::test]
async fn stalled_body_times_out_as_body_idle() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::status(200).body_len(1024).stall_after(100))
            .start()
            .await;
        let client = client().body_idle_timeout(ms(300)).build().unwrap();
        let res = client.get(server.url("/stall")).await.unwrap();
        assert_eq!(res.status(), 200);
        let start = Instant::now();
        let err = drain(res.into_body()).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyIdle), "{err:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        // The body is read after the retry loop: one request only.
        assert_eq!(server.request_count(), 1);
    })
    .await
}

#[tokio::test]
async fn trickling_body_times_out_as_body_rate() {
    bounded(async {
        // 50 B/s against a floor of 1000 B/s; frames arrive every 100 ms,
        // so the idle timeout never fires.
        let server = FaultServer::builder()
            .default(Action::status(200).body_len(100_000).trickle(50))
            .start()
            .await;
        let rate = MinBodyRate::try_new(1000, ms(500))
            .unwrap()
            .try_grace(ms(200))
            .unwrap();
        let client = client()
            .body_idle_timeout(Duration::from_secs(5))
            .min_body_rate(rate)
            .build()
            .unwrap();
        let res = client.get(server.url("/trickle")).await.unwrap();
        let start = Instant::now();
        let err = drain(res.into_body()).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::BodyRate), "{err:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    })
    .await
}

#[tokio::test]
async fn body_read_past_the_total_times_out_as_deadline() {
    bounded(async {
        // A body that keeps coming (no idle, no rate check) for far longer
        // than the total.
        let server = FaultServer::builder()
            .default(Action::status(200).body_len(100_000).trickle(100))
            .start()
            .await;
        let client = client()
            .total_timeout(ms(800))
            .attempt_timeout(ms(500))
            .body_idle_timeout(None)
            .build()
            .unwrap();
        let start = Instant::now();
        let res = client.get(server.url("/long")).await.unwrap();
        let err = drain(res.into_body()).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline), "{err:?}");
        let elapsed = start.elapsed();
        assert!(elapsed >= ms(800), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    })
    .await
}

/// A small body, and a slow one that finishes inside the grace period,
/// pass the rate check: no false positives on small or finished bodies.
#[tokio::test]
async fn small_and_finished_bodies_pass_the_rate_check() {
    bounded(async {
        let server = FaultServer::builder()
            .route("/small", [Action::status(200).body("tiny")])
            .route(
                "/slow-but-short",
                [Action::status(200).body_len(40).trickle(100)],
            )
            .start()
            .await;
        let rate = MinBodyRate::try_new(10_000, ms(300))
            .unwrap()
            .try_grace(Duration::from_secs(2))
            .unwrap();
        let client = client().min_body_rate(rate).build().unwrap();
        let res = client.get(server.url("/small")).await.unwrap();
        assert_eq!(&drain(res.into_body()).await.unwrap()[..], b"tiny");
        let res = client.get(server.url("/slow-but-short")).await.unwrap();
        assert_eq!(drain(res.into_body()).await.unwrap().len(), 40);
    })
    .await
}

/// A request whose deadline has already passed fails at once, stage
/// `deadline`, without reaching the server.
#[tokio::test]
async fn a_request_past_its_deadline_never_reaches_the_server() {
    bounded(async {
        let server = FaultServer::builder().start().await;
        let client = client().build().unwrap();
        let mut req = Request::get(server.url("/late"))
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(Deadline(Instant::now() - ms(10)));
        let start = Instant::now();
        let err = client.send(req).await.unwrap_err();
        assert_eq!(err.timeout_stage(), Some(TimeoutStage::Deadline), "{err:?}");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // Nothing was sent: give a stray connection time to show up.
        tokio::time::sleep(ms(100)).await;
        assert_eq!(server.connections(), 0);
        assert_eq!(server.request_count(), 0);
    })
    .await
}

// ===== TLS round trips =====

async fn tls_round_trip(http2: bool, via_config: bool) -> Version {
    let server = FaultServer::builder()
        .tls()
        .default(Action::status(200).body("secure"))
        .start()
        .await;
    let roots = TlsRoots::Custom(server.root_store().unwrap());
    let builder = if via_config {
        client().tls_config(tls_config(&roots, http2).unwrap())
    } else {
        client().tls_roots(roots)
    };
    let client = builder.http2(http2).build().unwrap();
    let res = client.get(server.url("/tls")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 1);
    let version = res.version();
    let body = drain(res.into_body()).await.unwrap();
    assert_eq!(&body[..], b"secure");
    let seen = server.requests_to("/tls");
    assert_eq!(seen.len(), 1);
    version
}

#[tokio::test]
async fn tls_round_trip_over_http1_and_http2() {
    bounded(async {
        assert_eq!(tls_round_trip(false, false).await, Version::HTTP_11);
        assert_eq!(tls_round_trip(true, false).await, Version::HTTP_2);
        assert_eq!(tls_round_trip(false, true).await, Version::HTTP_11);
        assert_eq!(tls_round_trip(true, true).await, Version::HTTP_2);
    })
    .await
}

#[tokio::test]
async fn untrusted_server_certificate_is_a_tls_error() {
    bounded(async {
        let server = FaultServer::builder().tls().start().await;
        // Webpki roots do not know the generated CA.
        let client = client().max_attempts(1).build().unwrap();
        let err = client.get(server.url("/")).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Tls), "{err:?}");
        assert_eq!(server.request_count(), 0);
    })
    .await
}

// ===== retries as the server saw them =====

#[tokio::test]
async fn two_503_then_200_is_three_attempts() {
    bounded(async {
        let server = FaultServer::builder()
            .route(
                "/flaky",
                [
                    Action::status(503).body("busy"),
                    Action::status(503).body("busy"),
                    Action::status(200).body("ok"),
                ],
            )
            .start()
            .await;
        let client = client().build().unwrap();
        let res = client.get(server.url("/flaky")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(Attempts::of(res.extensions()), 3);
        assert_eq!(&drain(res.into_body()).await.unwrap()[..], b"ok");
        assert_eq!(server.requests_to("/flaky").len(), 3);
    })
    .await
}

/// The client refuses an attempt timeout over the total, so "total 1 s,
/// attempt 10 s" is a request carrying a 1 s deadline (as propagated from
/// an inbound request) into a client whose attempt timeout is 10 s: the
/// earlier deadline wins and caps the attempt.
#[tokio::test]
async fn a_one_second_deadline_caps_a_ten_second_attempt_timeout() {
    bounded(async {
        let server = FaultServer::builder()
            .default(Action::never_respond())
            .start()
            .await;
        let client = client()
            .total_timeout(Duration::from_secs(30))
            .attempt_timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let start = Instant::now();
        let mut req = Request::get(server.url("/never"))
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(Deadline(start + Duration::from_secs(1)));
        let err = client.send(req).await.unwrap_err();
        let elapsed = start.elapsed();
        assert!(
            matches!(
                err.timeout_stage(),
                Some(TimeoutStage::Deadline | TimeoutStage::Headers)
            ),
            "{err:?}"
        );
        assert!(elapsed >= ms(900), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
        eprintln!(
            "deadline 1 s, attempt 10 s: {} after {elapsed:?}, {} attempt(s)",
            err.timeout_stage().unwrap(),
            err.attempts()
        );
    })
    .await
}

#[tokio::test]
async fn refused_post_without_key_is_retried_as_not_sent() {
    bounded(async {
        let addr = fault::refused_addr().unwrap();
        let client = client()
            .idempotency_keys(None)
            .max_attempts(3)
            .build()
            .unwrap();
        let req = Request::post(format!("http://{addr}/orders"))
            .body(Body::from("{}"))
            .unwrap();
        let err = client.send(req).await.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Connect), "{err:?}");
        assert_eq!(err.attempts(), 3, "{err:?}");
        assert_eq!(err.retry_stop(), Some(RetryStop::Attempts), "{err:?}");
    })
    .await
}

#[tokio::test]
async fn post_reset_after_the_request_was_read_is_not_retried() {
    bounded(async {
        let server = FaultServer::builder()
            .route("/orders", [Action::reset()])
            .default(Action::status(200))
            .start()
            .await;
        let client = client()
            .idempotency_keys(None)
            .max_attempts(3)
            .build()
            .unwrap();
        let req = Request::post(server.url("/orders"))
            .body(Body::from("{\"item\":1}"))
            .unwrap();
        let err = client.send(req).await.unwrap_err();
        assert_eq!(err.attempts(), 1, "{err:?}");
        assert_eq!(err.retry_stop(), Some(RetryStop::NotEligible), "{err:?}");
        assert_eq!(
            err.extensions().get::<Sent>(),
            Some(&Sent::MaybeProcessed),
            "{err:?}"
        );
        let seen = server.requests_to("/orders");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].method, Method::POST);
        assert_eq!(&seen[0].body[..], b"{\"item\":1}");
    })
    .await
}

/// With keys on (the default), the same reset POST gets a key and is
/// retried, carrying the same key both times.
#[tokio::test]
async fn post_reset_with_a_key_is_retried_with_the_same_key() {
    bounded(async {
        let server = FaultServer::builder()
            .route("/orders", [Action::reset(), Action::status(201)])
            .start()
            .await;
        let client = client().build().unwrap();
        let res = client.post_orders(&server).await.unwrap();
        assert_eq!(res.status(), 201);
        assert_eq!(Attempts::of(res.extensions()), 2);
        let seen = server.requests_to("/orders");
        assert_eq!(seen.len(), 2);
        let key = seen[0].header("idempotency-key").expect("a key");
        assert_eq!(seen[1].header("idempotency-key"), Some(key));
    })
    .await
}

// ===== configuration that cannot work =====

#[test]
fn build_refuses_configuration_that_cannot_work() {
    let err = Client::builder()
        .attempt_timeout(Duration::from_secs(20))
        .total_timeout(Duration::from_secs(10))
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config));
    let msg = err.to_string();
    assert!(msg.contains("attempt timeout"), "{msg}");
    assert!(msg.contains("20s") && msg.contains("10s"), "{msg}");

    let err = Client::builder()
        .total_timeout(Duration::from_secs(5))
        .attempt_timeout(Duration::from_secs(1))
        .backoff(Backoff::exponential(ms(100), Duration::from_secs(6)))
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config));
    assert!(err.to_string().contains("backoff cap"), "{err}");

    let zero = Duration::ZERO;
    let cases: [(&str, ClientBuilder); 5] = [
        ("total", Client::builder().total_timeout(zero)),
        ("attempt", Client::builder().attempt_timeout(zero)),
        ("connect", Client::builder().connect_timeout(zero)),
        ("tls", Client::builder().tls_timeout(zero)),
        ("body idle", Client::builder().body_idle_timeout(zero)),
    ];
    for (what, builder) in cases {
        let err = builder.build().unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config), "{what}: {err:?}");
    }
    let err = Client::builder().max_attempts(0).build().unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config), "{err:?}");
}

// ===== hyper-util's own re-send is not a second attempt =====

trait PostTo {
    fn post_orders(
        &self,
        server: &FaultServer,
    ) -> impl std::future::Future<Output = Result<http::Response<rebound::ClientBody>, Error>>;
}

impl PostTo for Client {
    fn post_orders(
        &self,
        server: &FaultServer,
    ) -> impl std::future::Future<Output = Result<http::Response<rebound::ClientBody>, Error>> {
        self.send(
            Request::post(server.url("/orders"))
                .body(Body::from("{}"))
                .unwrap(),
        )
    }
}

/// hyper-util re-sends by itself a request that was queued on a reused
/// pooled connection but never written because the connection turned out
/// closed (`retry_canceled_requests`). That re-send happens inside one
/// transport call, so rebound must report one attempt.
///
/// `FaultServer` cannot close an idle keep-alive connection (only
/// `connection: close`, which the client honours by not pooling), so the
/// server here is hand-written: it answers on the first connection, then
/// closes it idle on cue; later connections answer normally.
///
/// Making hyper-util take the re-send path needs the request queued on the
/// pooled connection *before* its connection task has seen the server's
/// FIN, and the FIN *visible* to that task before it writes the request.
/// The client runs on a current-thread runtime: the thread blocks (so no
/// task and no I/O driver runs) until the server has closed, then one
/// `yield_now` lets the driver record the FIN, and tokio polls the
/// `block_on` future before the woken connection task. The checkout still
/// sees the connection as idle and open, queues the request; the
/// connection task then reads EOF, closes without writing, and hands the
/// request back as "canceled", which hyper-util re-sends on a new
/// connection.
#[test]
fn hyper_util_resend_on_a_closed_pooled_connection_is_one_attempt() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn read_head(s: &mut tokio::net::TcpStream) -> bool {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        true
    }

    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = server_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
    let (closed_tx, closed_rx) = mpsc::channel::<()>();
    // Requests read on connection 1, and on later connections.
    let first = Arc::new(AtomicUsize::new(0));
    let later = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    {
        let (first, later, connections) = (first.clone(), later.clone(), connections.clone());
        server_rt.spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            connections.fetch_add(1, Ordering::SeqCst);
            if read_head(&mut s).await {
                first.fetch_add(1, Ordering::SeqCst);
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst")
                    .await
                    .unwrap();
            }
            // Keep-alive, idle, until told to close (as an idle timeout).
            let _ = close_rx.await;
            drop(s);
            let _ = closed_tx.send(());
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                connections.fetch_add(1, Ordering::SeqCst);
                let later = later.clone();
                tokio::spawn(async move {
                    while read_head(&mut s).await {
                        later.fetch_add(1, Ordering::SeqCst);
                        let res = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond";
                        if s.write_all(res).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }

    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("http://{addr}/again");
    let client = client().build().unwrap();
    let res = client_rt.block_on(async {
        tokio::time::timeout(TEST_LIMIT, async {
            let res = client.get(url.clone()).await.unwrap();
            assert_eq!(&drain(res.into_body()).await.unwrap()[..], b"first");
            // Let the connection go back to the pool, idle.
            tokio::time::sleep(ms(100)).await;
            close_tx.send(()).unwrap();
            // Block this thread (no task, no I/O driver) until the server
            // has closed, then leave the FIN time to arrive.
            closed_rx.recv_timeout(TEST_LIMIT).unwrap();
            // The wall clock is needed: the runtime must not run.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(ms(50));
            // The driver records the FIN and wakes the connection task;
            // this future is polled first and queues the request.
            tokio::task::yield_now().await;
            client.get(url.clone()).await
        })
        .await
        .expect("test exceeded its time limit")
    });
    let res = res.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(Attempts::of(res.extensions()), 1);
    let body = client_rt.block_on(drain(res.into_body())).unwrap();
    assert_eq!(&body[..], b"second");
    assert_eq!(first.load(Ordering::SeqCst), 1);
    assert_eq!(later.load(Ordering::SeqCst), 1);
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    drop(client);
    drop(client_rt);
    server_rt.shutdown_background();
}
