//! Dropping the caller's future at every stage of a request, over real
//! sockets through the ready-made client: no further attempt reaches the
//! server, the concurrency permit comes back at once (a queued request
//! proceeds), and no task is left behind.
//!
//! The stages: waiting for a concurrency permit, waiting for an adaptive
//! slot, connecting (a listener with a full accept queue), the TLS
//! handshake, waiting for the response head (HTTP/1.1, and HTTP/2 where
//! hyper runs a task per request), a backoff sleep, held at the Retry-After
//! gate (above the concurrency limit, holding no permit; and below it,
//! having queued for a permit and lent it back), reading the body
//! (HTTP/1.1 and HTTP/2); then a
//! `CancellationToken` attached with [`rebound::Cancel`].
//!
//! # How each test proves it
//!
//! * **No further attempt**: the [`FaultServer`]'s recorder (requests, and
//!   accepted connections for the stages before a request is written) shows
//!   nothing new after the drop, for longer than the dropped stage would
//!   have lasted where that is finite (backoff sleep, gate), or for a grace
//!   period where it is not — and anything that could still send an attempt
//!   after its future was dropped would have to be a task, which the third
//!   check rules out.
//! * **Permit back at once**: the client has a concurrency limit of 1
//!   ([`ConcurrencyLimiter`] shared in, to be observed). A second request
//!   queues behind the doomed one; after the drop it must complete well
//!   within the time the dropped stage would have held the permit (every
//!   stage here lasts at least [`STAGE`] undisturbed, or [`PAUSE`] for the
//!   backoff sleep and the gate, whose followers get [`PAUSE_PROMPT`]).
//! * **No task left behind**: the runtime's alive-task count
//!   (`Handle::metrics().num_alive_tasks()`) must come back to a baseline.
//!   Legitimate tasks exist besides ours: the FaultServer's accept loop and
//!   one task per connection it serves, hyper-util's connection tasks (one
//!   per open connection) and its pool's idle-interval task. So each test
//!   takes its baseline with the pool in the state the stage leaves it in:
//!   empty for stages whose drop must close the connection (TLS, headers,
//!   body: hyper cannot reuse a connection with an unfinished exchange),
//!   with the one idle connection the stage reuses for the others (backoff
//!   sleep, gate). Everything else is polled in the test's own task, never
//!   spawned, so the count is ours to read. The queued follower is not
//!   polled until the count has settled, so it adds nothing. Connection
//!   tasks end asynchronously (hyper notices the cancelled exchange, the
//!   server notices the closed socket), so the count is awaited, bounded
//!   (2 s), then compared exactly. Finally every client is dropped, and the
//!   count must come back to what the servers alone run.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use rebound::{
    limit::AdaptiveLimiter, limit::ConcurrencyLimiter, Aimd, Backoff, Cancel, Client,
    ClientBuilder, ErrorKind, Jitter, TlsRoots, Verdict,
};
use rebound_test::fault::{Action, ConnectionAction, FaultServer};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

/// How long an undisturbed stage lasts at least (every timeout of the
/// client is longer): a follower that completes within [`PROMPT`] did not
/// wait for it.
const STAGE: Duration = Duration::from_secs(120);

/// The bound for "at once" on a loopback request (which takes milliseconds):
/// 12 times shorter than [`STAGE`].
const PROMPT: Duration = Duration::from_secs(10);

/// The backoff sleep and the Retry-After pause of their tests: finite, so
/// that the tests can outwait them and see that no attempt follows.
const PAUSE: Duration = Duration::from_secs(6);

/// "At once" against [`PAUSE`].
const PAUSE_PROMPT: Duration = Duration::from_secs(3);

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// The alive-task count once it is back to `baseline`, or whatever it is
/// after 2 s (connection tasks end asynchronously, within milliseconds on
/// loopback). Shorter than what is left of [`PAUSE`] when it is called, so
/// that a task left sleeping out the pause cannot end in time to hide.
async fn settled_tasks(baseline: usize) -> usize {
    for _ in 0..200 {
        if alive_tasks() == baseline {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    alive_tasks()
}

/// The stage itself runs tasks (connection tasks, hyper's per-stream task
/// on HTTP/2, the server's side): what the drop must end. Checked so that
/// "back to the baseline" is not vacuous.
fn tasks_during_the_stage(baseline: usize) {
    let during = alive_tasks();
    assert!(
        during > baseline,
        "the stage runs no task: {during} alive, baseline {baseline}"
    );
}

/// Polls `fut` in this task until `reached` holds (checked every 5 ms, for
/// at most 10 s).
///
/// # Panics
///
/// If `fut` finishes first, or the condition never holds.
async fn drive_until<F>(fut: &mut F, what: &str, mut reached: impl FnMut() -> bool)
where
    F: Future + Unpin,
{
    let wait = async {
        for _ in 0..2_000 {
            if reached() {
                return true;
            }
            sleep(Duration::from_millis(5)).await;
        }
        false
    };
    tokio::select! {
        biased;
        _ = fut => panic!("finished before: {what}"),
        ok = wait => assert!(ok, "never reached: {what}"),
    }
}

/// Polls `fut` in this task for `d`; it must still be pending.
async fn drive_for<F>(fut: &mut F, d: Duration, what: &str)
where
    F: Future + Unpin,
{
    tokio::select! {
        biased;
        _ = fut => panic!("finished while: {what}"),
        _ = sleep(d) => {}
    }
}

/// A client whose every timeout is longer than [`STAGE`], with a
/// concurrency limit of 1 shared in as `limiter`.
fn patient(limiter: &Arc<ConcurrencyLimiter>) -> ClientBuilder {
    Client::builder()
        .total_timeout(STAGE * 3)
        .attempt_timeout(STAGE + Duration::from_secs(10))
        .connect_timeout(STAGE + Duration::from_secs(10))
        .tls_timeout(STAGE + Duration::from_secs(10))
        .body_idle_timeout(STAGE + Duration::from_secs(10))
        .concurrency_limiter(limiter.clone())
}

fn limit_one() -> Arc<ConcurrencyLimiter> {
    Arc::new(ConcurrencyLimiter::try_new(1).unwrap())
}

/// Completes the queued follower within `within` of the drop, reads its
/// body, and checks that the permit is free again.
async fn follower_completes<F, B>(
    follower: &mut F,
    within: Duration,
    limiter: &ConcurrencyLimiter,
) -> Duration
where
    F: Future<Output = Result<http::Response<B>, rebound::Error>> + Unpin,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let start = Instant::now();
    let res = timeout(within, follower)
        .await
        .expect("the queued request proceeds at once after the drop")
        .expect("the queued request succeeds");
    assert_eq!(res.status(), 200);
    res.into_body().collect().await.unwrap();
    assert_eq!(limiter.available(), 1, "every permit is back");
    start.elapsed()
}

#[tokio::test]
async fn drop_while_waiting_for_a_permit() {
    let server = FaultServer::builder()
        .route("/hold", [Action::stall_body()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = patient(&limiter).build().unwrap();

    // The only permit is held by a response whose body never ends.
    let held = client.get(server.url("/hold")).await.unwrap();
    assert_eq!(limiter.available(), 0);
    // Baseline with `held`'s connection open on both sides: it stays so.
    let baseline = alive_tasks();

    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_until(&mut dropped, "queued for the permit", || {
        limiter.queued() == 1
    })
    .await;
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued behind it", || limiter.queued() == 2).await;

    drop(dropped);
    assert_eq!(
        limiter.queued(),
        1,
        "the dropped request left the queue at once"
    );
    assert_eq!(settled_tasks(baseline).await, baseline);

    // FIFO: had the dropped request kept its place, the permit would go to
    // it and the follower would wait forever.
    drop(held);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("permit stage: follower completed {took:?} after the holder let go");

    sleep(Duration::from_millis(500)).await;
    assert!(server.requests_to("/dropped").is_empty());
    assert_eq!(server.request_count(), 2, "/hold and /next only");

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_while_connecting() {
    // A listener whose accept queue is full: Linux drops further SYNs
    // (`tcp_abort_on_overflow` off, the default), so a connect to it hangs,
    // retransmitting its SYN at 1 s, 3 s, 7 s... A backlog of 0 holds one
    // connection, which `filler` takes.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let filler = TcpStream::connect(addr).await.unwrap();
    assert!(
        timeout(Duration::from_millis(500), TcpStream::connect(addr))
            .await
            .is_err(),
        "precondition: a connect to a listener with a full accept queue hangs"
    );

    let healthy = FaultServer::builder().start().await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = patient(&limiter).build().unwrap();
    let baseline = alive_tasks(); // empty pool, as the drop must leave it

    let mut dropped = Box::pin(client.get(format!("http://{addr}/dropped")).send());
    drive_until(&mut dropped, "permit taken", || limiter.available() == 0).await;
    drive_for(&mut dropped, Duration::from_millis(300), "connecting").await;
    let mut follower = Box::pin(client.get(healthy.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("connect stage: follower completed {took:?} after the drop");

    // No further attempt: with room in the accept queue again, a connect
    // still alive (its SYN retransmitted after 1 s, then 3 s) would be
    // accepted now.
    let (first, _) = listener.accept().await.unwrap();
    assert_eq!(first.peer_addr().unwrap(), filler.local_addr().unwrap());
    assert!(
        timeout(Duration::from_secs(4), listener.accept())
            .await
            .is_err(),
        "a connection arrived after the drop"
    );

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_during_the_tls_handshake() {
    let tls = FaultServer::builder()
        .tls()
        .default_connection(ConnectionAction::hang_tls())
        .start()
        .await;
    let healthy = FaultServer::builder().start().await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = patient(&limiter)
        .tls_roots(TlsRoots::Custom(tls.root_store().unwrap()))
        .build()
        .unwrap();
    // Empty pool; the server's task for the hung handshake must end when
    // the client closes the socket.
    let baseline = alive_tasks();

    let mut dropped = Box::pin(client.get(tls.url("/dropped")).send());
    drive_until(&mut dropped, "TCP accepted", || tls.connections() == 1).await;
    drive_for(
        &mut dropped,
        Duration::from_millis(300),
        "in the TLS handshake",
    )
    .await;
    let mut follower = Box::pin(client.get(healthy.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    tasks_during_the_stage(baseline);
    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("TLS stage: follower completed {took:?} after the drop");

    sleep(Duration::from_secs(1)).await;
    assert_eq!(tls.connections(), 1, "no new connection after the drop");
    assert_eq!(tls.request_count(), 0);

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_while_waiting_for_headers() {
    let server = FaultServer::builder()
        .route("/dropped", [Action::never_respond()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = patient(&limiter).build().unwrap();
    // Empty pool: the drop must close the connection it was using.
    let baseline = alive_tasks();

    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_until(&mut dropped, "request at the server", || {
        server.request_count() == 1
    })
    .await;
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    tasks_during_the_stage(baseline);
    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("headers stage: follower completed {took:?} after the drop");

    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        server.requests_to("/dropped").len(),
        1,
        "no further attempt"
    );

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_during_a_backoff_sleep() {
    let server = FaultServer::builder()
        .route("/dropped", [Action::status(503)])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = patient(&limiter)
        .backoff(Backoff::exponential(PAUSE, PAUSE).jitter(Jitter::Proportional(0.0)))
        .build()
        .unwrap();

    // One idle pooled connection, which the 503 reuses and gives back:
    // the state the stage leaves the pool in.
    let warm = client.get(server.url("/warm")).await.unwrap();
    warm.into_body().collect().await.unwrap();
    sleep(Duration::from_millis(100)).await;
    let baseline = alive_tasks();

    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_until(&mut dropped, "503 sent", || {
        server.requests_to("/dropped").len() == 1 && server.in_flight() == 0
    })
    .await;
    drive_for(
        &mut dropped,
        Duration::from_millis(300),
        "in the backoff sleep",
    )
    .await;
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    let dropped_at = Instant::now();
    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    // The sleep would have held the permit for PAUSE.
    let took = follower_completes(&mut follower, PAUSE_PROMPT, &limiter).await;
    println!("backoff stage: follower completed {took:?} after the drop");

    // Outwait the sleep: the retry never comes.
    sleep((dropped_at + PAUSE + Duration::from_secs(2)).saturating_duration_since(Instant::now()))
        .await;
    assert_eq!(
        server.requests_to("/dropped").len(),
        1,
        "no further attempt"
    );

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_behind_the_retry_after_gate() {
    let server = FaultServer::builder()
        .route(
            "/busy",
            [Action::status(429).header("retry-after", &PAUSE.as_secs().to_string())],
        )
        .start()
        .await;
    let other = FaultServer::builder().start().await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    // One attempt per request: the 429 comes back at once instead of
    // sleeping its Retry-After (that sleep is the backoff stage).
    let client = patient(&limiter).max_attempts(1).build().unwrap();

    let busy = client.get(server.url("/busy")).await.unwrap();
    assert_eq!(busy.status(), 429);
    busy.into_body().collect().await.unwrap();
    let gate_closed_at = Instant::now();
    // The 429's connection idles in the pool, as the stage leaves it.
    sleep(Duration::from_millis(100)).await;

    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_for(&mut dropped, Duration::from_millis(300), "held at the gate").await;
    assert_eq!(server.request_count(), 1, "the gate holds it");
    // Held above the concurrency limit, it holds no permit (issue 10,
    // item 2), so a follower to another host does not even queue.
    assert_eq!(limiter.available(), 1, "held at the gate with a permit");
    let mut follower = Box::pin(client.get(other.url("/next")).send());
    let took = follower_completes(&mut follower, PAUSE_PROMPT, &limiter).await;
    println!("gate stage: follower to another host completed in {took:?}");
    // Both connections idle in the pool now.
    sleep(Duration::from_millis(100)).await;
    let baseline = alive_tasks();

    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    assert_eq!(limiter.available(), 1);

    // Outwait the pause: the held request is never sent.
    sleep(
        (gate_closed_at + PAUSE + Duration::from_secs(2)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(server.requests_to("/dropped").is_empty(), "never sent");

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_while_reading_the_body() {
    let server = FaultServer::builder()
        .route("/dropped", [Action::stall_body()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = patient(&limiter).build().unwrap();
    // Empty pool: a connection with an unfinished body cannot be reused.
    let baseline = alive_tasks();

    let res = client.get(server.url("/dropped")).await.unwrap();
    let mut reading = Box::pin(res.into_body().collect());
    drive_for(
        &mut reading,
        Duration::from_millis(300),
        "reading a stalled body",
    )
    .await;
    assert_eq!(limiter.available(), 0, "the body holds the permit");
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    tasks_during_the_stage(baseline);
    drop(reading);
    assert_eq!(settled_tasks(baseline).await, baseline);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("body stage: follower completed {took:?} after the drop");

    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        server.requests_to("/dropped").len(),
        1,
        "no further attempt"
    );

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn a_cancellation_token_ends_the_attempt_and_is_never_retried() {
    let server = FaultServer::builder()
        .route("/slow", [Action::never_respond()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    // Retries on (3 attempts, fast backoff): a cancellation must not use
    // them.
    let client = patient(&limiter)
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
        .build()
        .unwrap();
    let baseline = alive_tasks();

    let token = CancellationToken::new();
    let mut req = http::Request::get(server.url("/slow?key=s3cret"))
        .body(rebound::Body::empty())
        .unwrap();
    req.extensions_mut().insert(Cancel(token.clone()));
    let mut fut = Box::pin(client.send(req));
    drive_until(&mut fut, "request at the server", || {
        server.request_count() == 1
    })
    .await;

    token.cancel();
    let err = timeout(PROMPT, &mut fut)
        .await
        .expect("the token ends the request at once")
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Cancelled), "{err}");
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(err.extensions().get::<Verdict>().unwrap().is_fatal());
    assert!(!err.to_string().contains("s3cret"), "{err}");
    assert_eq!(limiter.available(), 1, "the permit is back");
    drop(fut);

    assert_eq!(settled_tasks(baseline).await, baseline);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(server.requests_to("/slow").len(), 1, "never retried");

    drop(client);
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_while_waiting_for_an_adaptive_slot() {
    let server = FaultServer::builder()
        .route("/hold", [Action::never_respond()])
        .start()
        .await;
    let servers_only = alive_tasks();
    // The adaptive limit pinned at one attempt in flight (no concurrency
    // limit): the slot is held until the response head.
    let adaptive = Arc::new(
        AdaptiveLimiter::try_new(Aimd::default().min_limit(1).initial_limit(1).max_limit(1))
            .unwrap(),
    );
    let client = Client::builder()
        .total_timeout(STAGE * 3)
        .attempt_timeout(STAGE + Duration::from_secs(10))
        .adaptive_limiter(adaptive.clone())
        .build()
        .unwrap();

    let mut holder = Box::pin(client.get(server.url("/hold")).send());
    drive_until(&mut holder, "holder at the server", || {
        server.request_count() == 1
    })
    .await;
    // The holder's connection is open on both sides, and stays so.
    let baseline = alive_tasks();

    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_until(&mut dropped, "queued for a slot", || adaptive.queued() == 1).await;
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued behind it", || adaptive.queued() == 2).await;

    drop(dropped);
    assert_eq!(
        adaptive.queued(),
        1,
        "the dropped attempt left the queue at once"
    );
    assert_eq!(settled_tasks(baseline).await, baseline);

    // The holder gives its slot back (neutral outcome); FIFO: it goes to the
    // follower, not to the dropped attempt.
    drop(holder);
    let res = timeout(PROMPT, &mut follower)
        .await
        .expect("the follower proceeds at once")
        .unwrap();
    assert_eq!(res.status(), 200);
    res.into_body().collect().await.unwrap();
    assert_eq!(adaptive.available(), 1);
    assert_eq!(adaptive.current_limit(), 1);

    sleep(Duration::from_secs(1)).await;
    assert!(server.requests_to("/dropped").is_empty());

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

/// A client of `server` (TLS) whose pool holds one idle HTTP/2 connection.
async fn warm_h2_client(server: &FaultServer, limiter: &Arc<ConcurrencyLimiter>) -> Client {
    let client = patient(limiter)
        .tls_roots(TlsRoots::Custom(server.root_store().unwrap()))
        .build()
        .unwrap();
    let warm = client.get(server.url("/warm")).await.unwrap();
    assert_eq!(warm.version(), http::Version::HTTP_2);
    warm.into_body().collect().await.unwrap();
    sleep(Duration::from_millis(100)).await;
    client
}

/// On HTTP/2 hyper spawns a task per request (it waits for the response
/// stream): dropping the caller's future must end it, and reset the stream
/// (the connection stays, multiplexed).
#[tokio::test]
async fn drop_while_waiting_for_headers_over_http2() {
    let server = FaultServer::builder()
        .tls()
        .route("/dropped", [Action::never_respond()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = warm_h2_client(&server, &limiter).await;
    // One idle HTTP/2 connection, which the dropped request shares.
    let baseline = alive_tasks();

    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_until(&mut dropped, "request at the server", || {
        server.request_count() == 2
    })
    .await;
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    tasks_during_the_stage(baseline);
    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("headers stage (h2): follower completed {took:?} after the drop");

    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        server.requests_to("/dropped").len(),
        1,
        "no further attempt"
    );
    assert_eq!(server.connections(), 1, "one multiplexed connection");

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

#[tokio::test]
async fn drop_while_reading_the_body_over_http2() {
    let server = FaultServer::builder()
        .tls()
        .route("/dropped", [Action::stall_body()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let client = warm_h2_client(&server, &limiter).await;
    let baseline = alive_tasks();

    let res = client.get(server.url("/dropped")).await.unwrap();
    let mut reading = Box::pin(res.into_body().collect());
    drive_for(
        &mut reading,
        Duration::from_millis(300),
        "reading a stalled body",
    )
    .await;
    assert_eq!(limiter.available(), 0, "the body holds the permit");
    let mut follower = Box::pin(client.get(server.url("/next")).send());
    drive_until(&mut follower, "queued", || limiter.queued() == 1).await;

    tasks_during_the_stage(baseline);
    drop(reading);
    assert_eq!(settled_tasks(baseline).await, baseline);
    let took = follower_completes(&mut follower, PROMPT, &limiter).await;
    println!("body stage (h2): follower completed {took:?} after the drop");

    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        server.requests_to("/dropped").len(),
        1,
        "no further attempt"
    );

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}

/// The request queued for its permit while its host's gate closed: it gets
/// the permit, meets the closed gate below the retry loop, gives the permit
/// back while it waits (a follower to another host goes), and dropping it
/// there sends nothing and leaves nothing behind.
#[tokio::test]
async fn drop_behind_the_gate_after_queueing_for_a_permit() {
    let server = FaultServer::builder().start().await;
    let other = FaultServer::builder()
        .route("/hold", [Action::stall_body()])
        .start()
        .await;
    let servers_only = alive_tasks();
    let limiter = limit_one();
    let table = Arc::new(rebound::gate::GateTable::default());
    let client = patient(&limiter).gate_table(table.clone()).build().unwrap();

    // The only permit is held by a response whose body never ends.
    let held = client.get(other.url("/hold")).await.unwrap();
    let mut dropped = Box::pin(client.get(server.url("/dropped")).send());
    drive_until(&mut dropped, "queued for the permit", || {
        limiter.queued() == 1
    })
    .await;
    // The server's gate closes while it queues; then the permit comes free.
    let gate_closed_at = Instant::now();
    table.close(&server.url("/").parse().unwrap(), gate_closed_at + PAUSE);
    drop(held);
    drive_until(&mut dropped, "permit lent back at the gate", || {
        limiter.queued() == 0 && limiter.available() == 1
    })
    .await;
    drive_for(&mut dropped, Duration::from_millis(300), "held at the gate").await;
    assert_eq!(limiter.available(), 1, "held at the gate with a permit");
    let mut follower = Box::pin(client.get(other.url("/next")).send());
    let took = follower_completes(&mut follower, PAUSE_PROMPT, &limiter).await;
    println!("lent permit: follower to another host completed in {took:?}");
    sleep(Duration::from_millis(100)).await;
    let baseline = alive_tasks();

    drop(dropped);
    assert_eq!(settled_tasks(baseline).await, baseline);
    assert_eq!(limiter.available(), 1);
    // Outwait the pause: the held request is never sent, and never takes
    // the permit again.
    sleep(
        (gate_closed_at + PAUSE + Duration::from_secs(2)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert_eq!(server.request_count(), 0, "never sent");
    assert_eq!(limiter.available(), 1);

    drop((follower, client));
    assert_eq!(settled_tasks(servers_only).await, servers_only);
}
