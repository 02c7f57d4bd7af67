//! `Client::shutdown` over real sockets: with 10 requests in flight (5
//! answered within 500 ms, 5 that would take 3 s) and 5 sleeping in backoff
//! after a 503, a 1 s grace period ends the backoff ones at once, lets the
//! quick ones succeed, and cuts the slow ones at about 1 s; a request made
//! afterwards never reaches the server, a second call returns the same
//! report, and no task is left behind.
//!
//! Bounds are generous (loopback on a shared CI machine): "at once" is
//! under 500 ms, "about 1 s" is between 0.9 s and 2 s.

use std::sync::Arc;
use std::time::Duration;

use rebound::{
    Backoff, Client, ErrorKind, Jitter, PreviousAttempt, RetryBudget, RetryStop, Sent,
    ShutdownReport,
};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::{sleep, Instant};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// The alive-task count once it is back to `baseline`, or whatever it is
/// after `within`.
async fn settled_tasks(baseline: usize, within: Duration) -> usize {
    let end = Instant::now() + within;
    while alive_tasks() != baseline && Instant::now() < end {
        sleep(Duration::from_millis(10)).await;
    }
    alive_tasks()
}

/// Polls `check` every 5 ms for at most 10 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < end, "never reached: {what}");
        sleep(Duration::from_millis(5)).await;
    }
}

fn client() -> Client {
    Client::builder()
        .total_timeout(Duration::from_secs(120))
        .attempt_timeout(Duration::from_secs(30))
        .max_attempts(3)
        // A long backoff: only the shutdown can end it in this test.
        .backoff(
            Backoff::exponential(Duration::from_secs(60), Duration::from_secs(60))
                .jitter(Jitter::Proportional(0.0)),
        )
        // Every retry allowed: the 503s must go to sleep, not stop.
        .retry_budget(Arc::new(RetryBudget::new(
            1.0,
            Duration::from_secs(10),
            100,
        )))
        // Five 503s must not open a circuit for the quick requests.
        .circuit_breaker(None)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_waits_lets_quick_requests_finish_and_cuts_the_rest() {
    let server = FaultServer::builder()
        .route("/busy", (0..5).map(|_| Action::status(503)))
        .route(
            "/quick",
            (0..5).map(|_| Action::status(200).delay(Duration::from_millis(300))),
        )
        .route(
            "/slow",
            (0..5).map(|_| Action::status(200).delay(Duration::from_secs(3))),
        )
        .start()
        .await;
    let servers_only = alive_tasks();
    let client = client();

    // Five in backoff: each got its 503 and sleeps (60 s).
    let busy: Vec<_> = (0..5)
        .map(|_| tokio::spawn(client.get(server.url("/busy")).send()))
        .collect();
    until("five 503s served", || {
        server.requests_to("/busy").len() == 5
    })
    .await;
    sleep(Duration::from_millis(50)).await;
    assert!(busy.iter().all(|t| !t.is_finished()), "all in backoff");

    // Ten in flight: five answered within 500 ms, five that take 3 s.
    let quick: Vec<_> = (0..5)
        .map(|_| tokio::spawn(client.get(server.url("/quick")).send()))
        .collect();
    let slow: Vec<_> = (0..5)
        .map(|_| tokio::spawn(client.get(server.url("/slow")).send()))
        .collect();
    until("ten requests at the server", || server.in_flight() == 10).await;

    let start = Instant::now();
    let shutdown = tokio::spawn(client.shutdown(Duration::from_secs(1)));

    for t in busy {
        let err = t.await.unwrap().unwrap_err();
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "backoff ended at once: {took:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
        assert_eq!(err.retry_stop(), Some(RetryStop::Closed));
        let previous = err
            .extensions()
            .get::<PreviousAttempt>()
            .expect("last outcome");
        assert!(previous.verdict.is_retryable(), "{:?}", previous.verdict);
    }
    for t in quick {
        let res = t.await.unwrap().expect("answered within the grace period");
        assert_eq!(res.status(), 200);
        assert!(start.elapsed() < Duration::from_millis(900));
    }
    for t in slow {
        let err = t.await.unwrap().unwrap_err();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(2),
            "cut at about 1 s: {took:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
    }
    let report = shutdown.await.unwrap();
    println!("shutdown report: {report:?} after {:?}", start.elapsed());
    assert_eq!(
        report,
        client.shutdown(Duration::from_secs(1)).await,
        "same report"
    );
    let ShutdownReport {
        in_flight,
        completed,
        cancelled,
        ..
    } = report;
    assert_eq!((in_flight, completed, cancelled), (15, 10, 5));

    // Closed for good: never reaches the server.
    let seen = server.requests_started();
    let err = client.get(server.url("/quick")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    let clone = client.clone();
    assert!(clone.is_closed());
    assert!(matches!(
        clone.get(server.url("/quick")).await.unwrap_err().kind(),
        ErrorKind::Closed
    ));
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        server.requests_started(),
        seen,
        "nothing sent after shutdown"
    );

    // No task left: the server's side of the cut requests ends when its
    // 3 s delay does; the pool's idle connections with the last clone.
    drop((client, clone));
    assert_eq!(
        settled_tasks(servers_only, Duration::from_secs(5)).await,
        servers_only
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_shutdowns_from_clones_agree_and_zero_grace_cuts_at_once() {
    let server = FaultServer::builder()
        .default(Action::status(200).delay(Duration::from_secs(3)))
        .start()
        .await;
    let client = client();
    let reqs: Vec<_> = (0..3)
        .map(|_| tokio::spawn(client.get(server.url("/slow")).send()))
        .collect();
    until("three requests at the server", || server.in_flight() == 3).await;

    let start = Instant::now();
    let a = tokio::spawn(client.clone().shutdown(Duration::ZERO));
    let b = tokio::spawn(client.clone().shutdown(Duration::from_secs(30)));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(a, b);
    assert_eq!((a.in_flight, a.completed, a.cancelled), (3, 0, 3));
    for t in reqs {
        assert!(matches!(
            t.await.unwrap().unwrap_err().kind(),
            ErrorKind::Closed
        ));
    }
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}

/// A client whose pool keeps idle connections for a minute: only the
/// shutdown can close them within a test.
fn pooling_client(roots: Option<rebound::TlsRoots>) -> Client {
    let mut builder = Client::builder()
        .total_timeout(Duration::from_secs(20))
        .pool_idle_timeout(Duration::from_secs(60));
    if let Some(roots) = roots {
        builder = builder.tls_roots(roots);
    }
    builder.build().unwrap()
}

/// The pool is closed when the shutdown resolves: the server sees every
/// connection of the client closed (HTTP/1.1 over TCP and HTTP/2 over TLS)
/// while the client is still alive — long before the pool's idle timeout
/// (60 s) — and no task is left once the client is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_pooled_connections() {
    let plain = FaultServer::builder()
        .default(Action::status(200))
        .start()
        .await;
    let tls = FaultServer::builder()
        .tls()
        .default(Action::status(200))
        .start()
        .await;
    let servers_only = alive_tasks();
    let roots = rebound::TlsRoots::Custom(tls.root_store().expect("a TLS server"));
    let client = pooling_client(Some(roots));
    for _ in 0..3 {
        assert_eq!(client.get(plain.url("/a")).await.unwrap().status(), 200);
        let res = client.get(tls.url("/b")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.version(), http::Version::HTTP_2);
        // hyper-util puts an HTTP/1.1 connection back in the pool from its
        // connection task once it is ready for the next request; on a
        // loaded machine the next request can otherwise find the pool
        // empty and dial a second connection (seen in CI: (2, 1) below).
        sleep(Duration::from_millis(50)).await;
    }
    // Control: kept alive in the pool, one connection per server.
    sleep(Duration::from_millis(100)).await;
    assert_eq!((plain.connections(), tls.connections()), (1, 1));
    assert_eq!((plain.open_connections(), tls.open_connections()), (1, 1));

    let start = Instant::now();
    let report = client.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.in_flight, 0);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "nothing open: no grace needed ({:?})",
        start.elapsed()
    );
    until("both servers see their connection closed", || {
        plain.open_connections() == 0 && tls.open_connections() == 0
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(
        client.get(plain.url("/a")).await.unwrap_err().kind(),
        ErrorKind::Closed
    ));
    assert_eq!(plain.connections(), 1, "no new connection");
    // The pool's idle-sweep timer lives until its next tick (60 s) or the
    // last clone: drop it, and nothing of the client is left.
    drop(client);
    assert_eq!(
        settled_tasks(servers_only, Duration::from_secs(3)).await,
        servers_only
    );
}

/// A response body still being read counts as in flight: a body that ends
/// within the grace period is read whole (and the shutdown waits for it),
/// one that does not is cut at its end with `Closed`, and the report
/// counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_being_read_get_the_grace_period_then_are_cut() {
    let server = FaultServer::builder()
        // 400 bytes at 1000 B/s: about 0.4 s.
        .route("/short", [Action::status(200).body_len(400).trickle(1_000)])
        // 10,000 bytes at 1000 B/s: about 10 s.
        .route(
            "/long",
            [Action::status(200).body_len(10_000).trickle(1_000)],
        )
        .start()
        .await;
    let client = pooling_client(None);
    let read = |res: http::Response<rebound::ClientBody>| {
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            res.into_body().collect().await.map(|b| b.to_bytes().len())
        })
    };
    let short = read(client.get(server.url("/short")).await.unwrap());
    let long = read(client.get(server.url("/long")).await.unwrap());

    let start = Instant::now();
    let report = client.shutdown(Duration::from_secs(1)).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(2),
        "waited for the bodies until the grace period ended: {took:?}"
    );
    assert_eq!(report.in_flight, 0, "both heads were in before");
    assert_eq!(report.bodies_cut, 1, "{report:?}");
    assert_eq!(short.await.unwrap().expect("read within the grace"), 400);
    let err = long
        .await
        .unwrap()
        .expect_err("cut at the end of the grace");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    until("the connections closed", || server.open_connections() == 0).await;
}

/// A shutdown with only a short body left waits for that body, not for the
/// whole grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_when_the_last_body_does() {
    let server = FaultServer::builder()
        .route("/short", [Action::status(200).body_len(300).trickle(1_000)])
        .start()
        .await;
    let client = pooling_client(None);
    let res = client.get(server.url("/short")).await.unwrap();
    let reader = tokio::spawn(async move {
        use http_body_util::BodyExt;
        res.into_body().collect().await.map(|b| b.to_bytes().len())
    });
    let start = Instant::now();
    let report = client.shutdown(Duration::from_secs(30)).await;
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "ended with the body: {took:?}"
    );
    assert_eq!(report.bodies_cut, 0);
    assert_eq!(reader.await.unwrap().unwrap(), 300);
}

/// A response with nothing left to read (an empty body) does not count as
/// a body in flight: a caller that keeps it does not hold the shutdown,
/// while one that keeps an unread body does (until the grace ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_response_holds_the_shutdown_only_if_its_body_has_bytes_left() {
    let server = FaultServer::builder()
        .route("/empty", [Action::status(204)])
        .route("/full", [Action::status(200).body("unread")])
        .start()
        .await;

    let client = pooling_client(None);
    let kept = client.get(server.url("/empty")).await.unwrap();
    assert_eq!(kept.status(), 204);
    let start = Instant::now();
    let report = client.shutdown(Duration::from_secs(5)).await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "an empty body is not in flight: {:?}",
        start.elapsed()
    );
    assert_eq!(report.bodies_cut, 0);
    drop(kept);

    // Control: an unread body with bytes left is in flight.
    let client = pooling_client(None);
    let kept = client.get(server.url("/full")).await.unwrap();
    let start = Instant::now();
    let report = client.shutdown(Duration::from_millis(500)).await;
    assert!(
        start.elapsed() >= Duration::from_millis(450),
        "waited for the unread body: {:?}",
        start.elapsed()
    );
    assert_eq!(report.bodies_cut, 1);
    drop(kept);
}

/// Requests still waiting for their response head when the shutdown ends
/// are requests cut, not bodies cut: the transport takes a body's guard
/// when the head arrives, not when the request is sent (issue 18: 5,000
/// requests cut before any response were reported as 5,000 bodies cut).
/// A body being read at the same time still counts as one body cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cut_before_their_head_are_not_counted_as_bodies() {
    const STUCK: usize = 20;
    let server = FaultServer::builder()
        .route("/stuck", (0..STUCK).map(|_| Action::never_respond()))
        // 10,000 bytes at 1000 B/s: still being read when the grace ends.
        .route(
            "/long",
            [Action::status(200).body_len(10_000).trickle(1_000)],
        )
        .start()
        .await;
    let client = client();
    let long = client.get(server.url("/long")).await.unwrap();
    let reader = tokio::spawn(async move {
        use http_body_util::BodyExt;
        long.into_body().collect().await.map(|b| b.to_bytes().len())
    });
    let stuck: Vec<_> = (0..STUCK)
        .map(|_| tokio::spawn(client.get(server.url("/stuck")).send()))
        .collect();
    until("the stuck requests at the server", || {
        server.requests_to("/stuck").len() == STUCK
    })
    .await;

    let report = client.shutdown(Duration::from_millis(300)).await;
    assert_eq!(report.in_flight, STUCK, "{report:?}");
    assert_eq!(report.cancelled, STUCK, "{report:?}");
    assert_eq!(report.completed, 0, "{report:?}");
    assert_eq!(report.bodies_cut, 1, "only the body being read: {report:?}");
    for t in stuck {
        let err = t.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
    }
    let err = reader.await.unwrap().expect_err("cut with the shutdown");
    assert_eq!(err.kind(), ErrorKind::Closed, "{err}");
}
