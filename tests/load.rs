//! Load control over real sockets through the ready-made client: the
//! concurrency limit under 10,000 requests, a permit held until a slowly
//! read body ends, the adaptive limit finding a server's hidden limit, and
//! the Retry-After gate pausing one host only.
//!
//! Real sockets mean real time: every timing assertion has a wide margin,
//! and what matters is asserted by counts and order (the server's recorder,
//! the limiters' own counters), not by speed. Each test prints its figures
//! (`cargo test --test load -- --nocapture`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use rebound::{
    gate::GateTable, limit::AdaptiveLimiter, limit::ConcurrencyLimiter, Aimd, Attempts, Client,
    GateMode,
};
use rebound_test::fault::{Action, FaultServer};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout, Instant};

/// Waits (bounded: 10 s) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if cond() {
            return;
        }
        sleep(Duration::from_millis(5)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_requests_never_exceed_a_limit_of_64() {
    const TOTAL: usize = 10_000;
    const LIMIT: usize = 64;
    // Four times the limit offered at once, so that the limit binds.
    const OFFERED: usize = 256;

    let server = FaultServer::builder()
        .default(
            Action::status(200)
                .body("ok")
                .delay(Duration::from_millis(1)),
        )
        .start()
        .await;
    let limiter = Arc::new(ConcurrencyLimiter::try_new(LIMIT).unwrap());
    let client = Client::builder()
        .concurrency_limiter(limiter.clone())
        .build()
        .unwrap();
    let url = server.url("/load");

    let next = Arc::new(AtomicUsize::new(0));
    let most_queued = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..OFFERED {
        let (client, url, next) = (client.clone(), url.clone(), next.clone());
        let (limiter, most_queued) = (limiter.clone(), most_queued.clone());
        workers.spawn(async move {
            let mut done = 0;
            while next.fetch_add(1, Ordering::Relaxed) < TOTAL {
                let res = client.get(url.as_str()).await.unwrap();
                most_queued.fetch_max(limiter.queued(), Ordering::Relaxed);
                assert_eq!(res.status(), 200);
                let body = res.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(&body[..], b"ok");
                done += 1;
            }
            done
        });
    }
    let completed = timeout(Duration::from_secs(180), async {
        let mut completed = 0;
        while let Some(done) = workers.join_next().await {
            completed += done.unwrap();
        }
        completed
    })
    .await
    .expect("10,000 requests finish in bounded time");
    let took = start.elapsed();

    println!(
        "{TOTAL} requests, limit {LIMIT}, {OFFERED} offered: {took:?} ({:.0} req/s); \
         server peak in flight {}, {} connections, most queued at the limiter {}",
        TOTAL as f64 / took.as_secs_f64(),
        server.peak_in_flight(),
        server.connections(),
        most_queued.load(Ordering::Relaxed),
    );
    assert_eq!(completed, TOTAL);
    assert_eq!(server.request_count(), TOTAL as u64);
    assert!(
        server.peak_in_flight() <= LIMIT,
        "server saw {} in flight",
        server.peak_in_flight()
    );
    assert!(
        most_queued.load(Ordering::Relaxed) > 0,
        "the limit never bound: the test would prove nothing"
    );
    assert_eq!(limiter.available(), LIMIT, "every permit returned");
    assert_eq!(limiter.queued(), 0);
}

#[tokio::test]
async fn a_slowly_read_streamed_body_holds_the_permit_until_it_ends() {
    const LEN: usize = 1 << 20;
    let server = FaultServer::builder()
        .route("/big", [Action::status(200).body_len(LEN as u64).chunked()])
        .default(Action::status(200).body("second"))
        .start()
        .await;
    let limiter = Arc::new(ConcurrencyLimiter::try_new(1).unwrap());
    let client = Client::builder()
        .concurrency_limiter(limiter.clone())
        .build()
        .unwrap();

    let res = client.get(server.url("/big")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(limiter.available(), 0);

    let second = tokio::spawn({
        let client = client.clone();
        let url = server.url("/second");
        async move {
            let res = client.get(url).await.unwrap();
            let at = Instant::now();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (at, body)
        }
    });
    eventually("the second request queues", || limiter.queued() == 1).await;

    // Read the body slowly: 20 ms between frames.
    let start = Instant::now();
    let mut body = res.into_body();
    let (mut read, mut frames) = (0, 0);
    // When the frame that carried the last bytes was asked for: the
    // earliest the permit can have been let go.
    let mut last_polled = None;
    loop {
        let polled = Instant::now();
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame.unwrap().into_data() {
            read += data.len();
        }
        frames += 1;
        if read < LEN {
            // Still mid-body: the permit is still held, the second request
            // still waits, and the server has not seen it.
            assert_eq!(limiter.available(), 0, "released before the end");
            assert_eq!(limiter.queued(), 1);
            assert!(!second.is_finished());
            assert!(server.requests_to("/second").is_empty());
        } else if last_polled.is_none() {
            last_polled = Some(polled);
        }
        sleep(Duration::from_millis(20)).await;
    }
    let last_polled = last_polled.expect("the body ended");
    assert_eq!(read, LEN);
    assert!(frames > 1, "not streamed");

    let (second_at, second_body) = timeout(Duration::from_secs(10), second)
        .await
        .expect("the second request proceeds once the body ended")
        .unwrap();
    assert_eq!(&second_body[..], b"second");
    let sent = server.requests_to("/second")[0].received_at;
    assert!(
        sent >= last_polled,
        "the second request went before the body ended"
    );
    assert!(second_at >= last_polled);
    assert_eq!(limiter.available(), 1);
    println!(
        "1 MiB read in {frames} frames over {:?}; the second request reached the server {:?} \
         after the last frame was asked for",
        last_polled - start,
        sent - last_polled,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_settles_near_the_servers_hidden_limit() {
    const TOTAL: usize = 2_000;
    const OFFERED: usize = 100;
    const HIDDEN: usize = 10;

    // 200 after 10 ms, but 429 at once when more than 10 are in flight.
    let server = FaultServer::builder()
        .default(
            Action::status(200)
                .delay(Duration::from_millis(10))
                .reject_above(HIDDEN),
        )
        .start()
        .await;
    let adaptive = Arc::new(
        AdaptiveLimiter::try_new(
            Aimd::default()
                .min_limit(1)
                .initial_limit(OFFERED)
                .max_limit(200),
        )
        .unwrap(),
    );
    // With the default circuit breaker (issue 18): the 429s a server sheds
    // load with are throttling, which it never counts.
    let client = Client::builder()
        .adaptive_limiter(adaptive.clone())
        .build()
        .unwrap();
    let url = server.url("/work");

    // In completion order: (limit after it, final status, attempts).
    let log = Arc::new(Mutex::new(Vec::with_capacity(TOTAL)));
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..OFFERED {
        let (client, url, next, log) = (client.clone(), url.clone(), next.clone(), log.clone());
        let adaptive = adaptive.clone();
        workers.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < TOTAL {
                let res = client.get(url.as_str()).await.unwrap();
                let status = res.status().as_u16();
                let attempts = Attempts::of(res.extensions());
                res.into_body().collect().await.unwrap();
                log.lock()
                    .unwrap()
                    .push((adaptive.current_limit(), status, attempts));
            }
        });
    }
    timeout(Duration::from_secs(180), async {
        while let Some(done) = workers.join_next().await {
            done.unwrap();
        }
    })
    .await
    .expect("2,000 requests finish in bounded time");
    let took = start.elapsed();

    let log = log.lock().unwrap();
    assert_eq!(log.len(), TOTAL);
    let trajectory: Vec<String> = log
        .iter()
        .step_by(50)
        .map(|(limit, _, _)| limit.to_string())
        .collect();
    println!(
        "adaptive limit, every 50 completions (start {OFFERED}): {}",
        trajectory.join(" ")
    );

    // Per attempt: the server answers only 200 or 429, so every attempt
    // before a request's last was a 429.
    let rejected_share = |part: &[(usize, u16, u32)]| {
        let attempts: u32 = part.iter().map(|e| e.2).sum();
        let rejected: u32 = part.iter().map(|e| e.2 - 1 + u32::from(e.1 == 429)).sum();
        (rejected, attempts)
    };
    let (first, second) = log.split_at(TOTAL / 2);
    let (r1, a1) = rejected_share(first);
    let (r2, a2) = rejected_share(second);
    let limits: Vec<usize> = second.iter().map(|e| e.0).collect();
    let (lo, hi) = (*limits.iter().min().unwrap(), *limits.iter().max().unwrap());
    let mean = limits.iter().sum::<usize>() as f64 / limits.len() as f64;
    println!(
        "{TOTAL} requests, {OFFERED} offered, in {took:?}; 429s: first half {r1}/{a1} attempts, \
         second half {r2}/{a2} ({:.1} %); second-half limit {lo}..={hi}, mean {mean:.1}; \
         server peak in flight {}",
        100.0 * f64::from(r2) / f64::from(a2),
        server.peak_in_flight(),
    );

    assert!(
        f64::from(r2) < 0.10 * f64::from(a2),
        "429 share in the second half: {r2}/{a2}"
    );
    assert!(
        (5..=20).contains(&lo) && (5..=20).contains(&hi),
        "the limit did not settle near {HIDDEN}: {lo}..={hi}"
    );
    assert!((7.0..=15.0).contains(&mean), "mean limit {mean:.1}");
}

#[tokio::test]
async fn a_retry_after_pauses_that_host_and_no_other() {
    const PAUSE: Duration = Duration::from_secs(2);
    const FOLLOWERS: usize = 50;

    let server = FaultServer::builder()
        .route("/busy", [Action::status(429).header("retry-after", "2")])
        .start()
        .await;
    let other = FaultServer::builder().start().await;
    // One attempt per request: the 429 comes back at once, and the gate is
    // closed when it does.
    let client = Client::builder().max_attempts(1).build().unwrap();

    let busy = client.get(server.url("/busy")).await.unwrap();
    assert_eq!(busy.status(), 429);
    busy.into_body().collect().await.unwrap();
    // When the server read the 429'd request: the gate closed after that,
    // so it opens at least PAUSE later.
    let asked = server.requests()[0].received_at;

    let mut followers = JoinSet::new();
    for i in 0..FOLLOWERS {
        let client = client.clone();
        let url = server.url(&format!("/after/{i}"));
        followers.spawn(async move {
            let res = client.get(url).await.unwrap();
            assert_eq!(res.status(), 200);
            res.into_body().collect().await.unwrap();
            Instant::now()
        });
    }

    // Another host is not held: it answers while the gate is still closed.
    let res = client.get(other.url("/elsewhere")).await.unwrap();
    assert_eq!(res.status(), 200);
    let other_took = asked.elapsed();
    assert_eq!(
        server.request_count(),
        1,
        "the other host answered during the pause"
    );

    // Nothing reaches the paused host during the pause (sampled here; the
    // arrival times below are the exact check).
    while asked.elapsed() < PAUSE - Duration::from_millis(300) {
        assert_eq!(server.request_count(), 1, "a request during the pause");
        sleep(Duration::from_millis(20)).await;
    }

    let mut waited = Vec::with_capacity(FOLLOWERS);
    timeout(Duration::from_secs(30), async {
        while let Some(w) = followers.join_next().await {
            waited.push(w.unwrap() - asked);
        }
    })
    .await
    .expect("the followers go once the pause is over");
    let (lo, hi) = (*waited.iter().min().unwrap(), *waited.iter().max().unwrap());
    println!(
        "{FOLLOWERS} requests after a 429 with Retry-After: 2 completed {lo:?}..{hi:?} after the \
         server read the 429'd request; another host answered {other_took:?} after it"
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1 + FOLLOWERS);
    for r in &requests[1..] {
        let after = r.received_at - asked;
        assert!(
            after >= PAUSE,
            "{} arrived {after:?} after the 429",
            r.target
        );
    }
    assert!(lo >= PAUSE, "{lo:?}");
    assert!(hi < PAUSE * 10, "{hi:?}");
}

/// Issue 10, item 2: with `concurrency_limit(4)`, requests waiting at a
/// throttled host's Retry-After gate hold no concurrency permit, so another
/// host answers at once, and the limit still holds at the servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_host_holds_no_permit_another_host_needs() {
    const LIMIT: usize = 4;
    let a = FaultServer::builder()
        .route("/busy", [Action::status(429).header("retry-after", "3")])
        .default(Action::status(200).delay(Duration::from_millis(20)))
        .start()
        .await;
    let b = FaultServer::builder()
        .default(Action::status(200).delay(Duration::from_millis(20)))
        .start()
        .await;
    let limiter = Arc::new(ConcurrencyLimiter::try_new(LIMIT).unwrap());
    let table = Arc::new(GateTable::default());
    let client = Client::builder()
        .concurrency_limiter(limiter.clone())
        .gate_table(table.clone())
        .build()
        .unwrap();
    // One request to B first, so that the timed one below reuses a pooled
    // connection and measures waiting, not connecting.
    let warm = client.get(b.url("/warm")).await.unwrap();
    warm.into_body().collect().await.unwrap();

    // A answers 429, Retry-After: 3; its retry sleeps the pause.
    let first = tokio::spawn({
        let client = client.clone();
        let url = a.url("/busy");
        async move {
            let res = client.get(url).await.unwrap();
            (res.status(), Attempts::of(res.extensions()))
        }
    });
    eventually("A's gate closes", || !table.is_empty()).await;
    let closed_at = Instant::now();

    // Four more requests to A: they wait at A's gate.
    let mut to_a = JoinSet::new();
    for i in 0..LIMIT {
        let client = client.clone();
        let url = a.url(&format!("/next/{i}"));
        to_a.spawn(async move {
            let res = client.get(url).await.unwrap();
            let status = res.status();
            res.into_body().collect().await.unwrap();
            (status, Instant::now())
        });
    }
    sleep(Duration::from_millis(50)).await;
    // Only the first request's permit is taken (its retry is sleeping).
    assert_eq!(limiter.in_flight(), 1, "requests at A's gate hold permits");

    // B answers at once.
    let t = Instant::now();
    let res = client.get(b.url("/now")).await.unwrap();
    res.into_body().collect().await.unwrap();
    let b_took = t.elapsed();

    // And a burst to B while A is throttled stays under the limit.
    let mut to_b = JoinSet::new();
    for i in 0..20 {
        let client = client.clone();
        let url = b.url(&format!("/burst/{i}"));
        to_b.spawn(async move {
            let res = client.get(url).await.unwrap();
            assert_eq!(res.status(), 200);
            res.into_body().collect().await.unwrap();
        });
    }
    let mut most = 0;
    while !to_b.is_empty() {
        most = most.max(a.in_flight() + b.in_flight());
        if let Ok(Some(done)) = timeout(Duration::from_millis(2), to_b.join_next()).await {
            done.unwrap();
        }
    }
    let b_burst_done = closed_at.elapsed();

    let (status, attempts) = timeout(Duration::from_secs(30), first)
        .await
        .unwrap()
        .unwrap();
    let mut a_done = Vec::new();
    timeout(Duration::from_secs(30), async {
        while let Some(done) = to_a.join_next().await {
            a_done.push(done.unwrap());
        }
    })
    .await
    .expect("A's requests go once the pause is over");
    println!(
        "concurrency {LIMIT}, A throttled for 3 s: B answered in {b_took:?}; a burst of 20 to B \
         done {b_burst_done:?} after A's gate closed; peak in flight A {} B {}, sampled sum {most}",
        a.peak_in_flight(),
        b.peak_in_flight()
    );
    // "At once" against A's 3 s pause: 1 s tells the two apart on a loaded
    // machine (100 ms assumed an idle one: a debug build, beside the rest of
    // this binary's tests).
    assert!(b_took < Duration::from_secs(1), "B waited {b_took:?}");
    assert!(
        b_burst_done < Duration::from_secs(2),
        "B's burst waited for A: {b_burst_done:?}"
    );
    assert_eq!((status, attempts), (http::StatusCode::OK, 2));
    for (status, at) in &a_done {
        assert_eq!(*status, 200);
        assert!(*at - closed_at >= Duration::from_millis(2_900));
    }
    // The limit is never exceeded at the servers.
    assert!(a.peak_in_flight() <= LIMIT, "A saw {}", a.peak_in_flight());
    assert!(b.peak_in_flight() <= LIMIT, "B saw {}", b.peak_in_flight());
    assert!(most <= LIMIT, "both servers together saw {most}");
    assert_eq!(limiter.available(), LIMIT, "every permit returned");
}

/// Issue 10, item 5 (gate): a 503 with a long Retry-After on one path paces
/// only that request; other paths of the host answer at once. Asked for,
/// a 503 closes the host's gate; `GateMode::Off` keeps no gate at all.
#[tokio::test]
async fn a_503_on_one_path_does_not_hold_the_host() {
    let server = FaultServer::builder()
        .route("/bad", [Action::status(503).header("retry-after", "3600")])
        .route("/bad2", [Action::status(503).header("retry-after", "3600")])
        .route("/limited", [Action::status(429).header("retry-after", "2")])
        .start()
        .await;
    let table = Arc::new(GateTable::default());
    let client = Client::builder()
        .max_attempts(1)
        .retry_after_cap(Duration::from_secs(2))
        .gate_table(table.clone())
        .build()
        .unwrap();
    let res = client.get(server.url("/bad")).await.unwrap();
    assert_eq!(res.status(), 503);
    res.into_body().collect().await.unwrap();
    let t = Instant::now();
    let res = client.get(server.url("/good")).await.unwrap();
    let good_took = t.elapsed();
    assert_eq!(res.status(), 200);
    assert!(table.is_empty(), "a 503 closed the host's gate");

    // Host-wide 503 gating, asked for: the other path waits the capped 2 s.
    let gating = Client::builder()
        .max_attempts(1)
        .retry_after_cap(Duration::from_secs(2))
        .retry_after_gate_on_503(true)
        .build()
        .unwrap();
    let res = gating.get(server.url("/bad2")).await.unwrap();
    assert_eq!(res.status(), 503);
    let t = Instant::now();
    let res = gating.get(server.url("/good")).await.unwrap();
    let gated_took = t.elapsed();
    assert_eq!(res.status(), 200);

    // Off: even a 429 holds nothing.
    let off = Client::builder()
        .max_attempts(1)
        .retry_after_gate(GateMode::Off)
        .build()
        .unwrap();
    let res = off.get(server.url("/limited")).await.unwrap();
    assert_eq!(res.status(), 429);
    let t = Instant::now();
    let res = off.get(server.url("/good")).await.unwrap();
    let off_took = t.elapsed();
    assert_eq!(res.status(), 200);
    println!(
        "after 503 + Retry-After: 3600 (cap 2 s): another path answered in {good_took:?}; \
         with 503 gating on, in {gated_took:?}; gate off after a 429: {off_took:?}"
    );
    // "At once" against a closed gate's 2 s (the cap): 1 s tells the two
    // apart on a loaded machine.
    assert!(good_took < Duration::from_secs(1), "{good_took:?}");
    assert!(gated_took >= Duration::from_millis(1_900), "{gated_took:?}");
    assert!(gated_took < Duration::from_secs(20), "{gated_took:?}");
    assert!(off_took < Duration::from_secs(1), "{off_took:?}");
}

/// Why the retry loop stopped, for every final 429 [`simultaneous`] saw.
static STOPS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// Sends `n` simultaneous GETs to `url`; returns the final statuses.
async fn simultaneous(client: &Client, url: &str, n: usize) -> Vec<u16> {
    let mut all = JoinSet::new();
    // All start together: none is sent before every task is ready to go.
    let go = Arc::new(tokio::sync::Barrier::new(n + 1));
    for _ in 0..n {
        let (client, url, go) = (client.clone(), url.to_owned(), go.clone());
        all.spawn(async move {
            // Called before the barrier: every request is counted by the
            // retry budget (and has its deadline) before any is sent, which
            // is what "simultaneous" means; the future is polled after.
            let req = http::Request::get(url)
                .body(rebound::Body::empty())
                .unwrap();
            let call = client.send(req);
            go.wait().await;
            let res = call.await.unwrap();
            let status = res.status().as_u16();
            if status == 429 {
                // Why the retry loop gave up, for the figures.
                let stop = res.extensions().get::<rebound::RetryStop>().copied();
                if let Some(stop) = stop {
                    STOPS.lock().unwrap().push(stop.as_str());
                }
            }
            res.into_body().collect().await.unwrap();
            status
        });
    }
    go.wait().await;
    timeout(Duration::from_secs(120), async {
        let mut statuses = Vec::with_capacity(n);
        while let Some(s) = all.join_next().await {
            statuses.push(s.unwrap());
        }
        statuses
    })
    .await
    .expect("the requests finish in bounded time")
}

/// Issue 10, item 5: a burst of 40 simultaneous requests, starting at limit
/// 8, against a server that 429s above 2 in flight: every request succeeds,
/// and the server sends at most 0.4× the 429s it sends to a fixed limit of
/// 8 (the control, run here under the same settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_cuts_a_burst_of_429s() {
    const N: usize = 40;
    async fn run(aimd: Aimd) -> (u64, Vec<u16>, usize) {
        let server = FaultServer::builder()
            .default(
                Action::status(200)
                    .delay(Duration::from_millis(50))
                    .reject_above(2),
            )
            .start()
            .await;
        let limiter = Arc::new(AdaptiveLimiter::try_new(aimd).unwrap());
        // With the default circuit breaker, which never counts a 429.
        let client = Client::builder()
            .adaptive_limiter(limiter.clone())
            .max_attempts(30)
            .retry_budget(Arc::new(
                rebound::RetryBudget::try_new(10.0, Duration::from_secs(10), 100).unwrap(),
            ))
            .build()
            .unwrap();
        let statuses = simultaneous(&client, &server.url("/work"), N).await;
        let rejected = server.request_count() - N as u64;
        (rejected, statuses, limiter.current_limit())
    }
    let (control, control_statuses, _) =
        run(Aimd::default().min_limit(8).initial_limit(8).max_limit(8)).await;
    let (adaptive, statuses, limit) =
        run(Aimd::default().min_limit(1).initial_limit(8).max_limit(200)).await;
    println!(
        "{N} simultaneous, capacity 2: 429s sent by the server: adaptive (start 8) {adaptive}, \
         fixed 8 {control} ({:.2}x); adaptive limit at the end {limit}",
        adaptive as f64 / control as f64
    );
    assert!(control_statuses.iter().all(|s| *s == 200));
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(
        adaptive as f64 <= 0.4 * control as f64,
        "adaptive {adaptive} vs fixed {control}"
    );
    // The first wave (6 refused of 8) and a few probes: 11 measured, 32–38
    // before the limit followed what is in flight.
    assert!(adaptive <= 20, "adaptive {adaptive}");
}

/// Issue 10, item 5: client defaults, 10,000 simultaneous requests against a
/// server that 429s above 20 in flight: at most 1 % of the callers get a
/// 429; then, with the server healthy, the limit climbs back to its maximum.
///
/// "Simultaneous": every request is called (so counted by the retry
/// budget) before one barrier releases them all to be sent. Started one
/// by one from a spawn loop instead, under CPU contention the first 429s
/// come back before most requests have been counted by the retry budget,
/// whose ratio then refuses their retries (measured with the whole load
/// binary running: 1.2–1.6 % of callers, all `RetryStop::Budget` after
/// one attempt). That is the budget's ratio working on what it has seen,
/// not the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_simultaneous_against_capacity_20() {
    const N: usize = 10_000;
    let server = FaultServer::builder()
        .default(
            Action::status(200)
                .delay(Duration::from_millis(5))
                .reject_above(20),
        )
        .start()
        .await;
    let aimd = rebound::rebound_hyper::client::default_adaptive_limit();
    let limiter = Arc::new(AdaptiveLimiter::try_new(aimd).unwrap());
    // With the default circuit breaker: 10,000 requests at once, most of
    // them 429ed at first, never open it (a 429 is throttling, not
    // breakage).
    let client = Client::builder()
        .adaptive_limiter(limiter.clone())
        // Not under test: every deadline starts before the barrier, and the
        // last of 10,000 requests through ~20 slots ends 2.5 s later at
        // best, but after the default 30 s on a loaded 2-core machine (a
        // debug build under a load average of 12: 40-50 s, and the last
        // ones failed "while waiting for an adaptive-limit slot"). The
        // bound is `simultaneous`'s 120 s.
        .total_timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let start = Instant::now();
    let statuses = simultaneous(&client, &server.url("/work"), N).await;
    let took = start.elapsed();
    let final_429 = statuses.iter().filter(|s| **s == 429).count();
    let sent_429 = server.request_count() - (N - final_429) as u64;
    let limit_after = limiter.current_limit();
    let stops = std::mem::take(&mut *STOPS.lock().unwrap());
    let budget_stops = stops.iter().filter(|s| **s == "budget").count();
    println!(
        "{N} simultaneous, capacity 20, client defaults: {took:?}; final 429s {final_429} \
         ({:.2} %, {budget_stops} refused by the retry budget), 429s sent {sent_429} \
         ({:.1} % of {} attempts), limit after {limit_after}, server peak in flight {}",
        100.0 * final_429 as f64 / N as f64,
        100.0 * sent_429 as f64 / server.request_count() as f64,
        server.request_count(),
        server.peak_in_flight(),
    );
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429));
    assert!(
        final_429 as f64 <= 0.01 * N as f64,
        "{final_429} callers got a 429"
    );

    // The server is healthy again: with demand, the limit climbs back.
    server.set_default(Action::status(200).delay(Duration::from_millis(5)));
    let max = aimd_max();
    let (mut sent, t) = (0, Instant::now());
    while limiter.current_limit() < max && sent < 50_000 && t.elapsed() < Duration::from_secs(60) {
        let statuses = simultaneous(&client, &server.url("/healthy"), 2 * max).await;
        assert!(statuses.iter().all(|s| *s == 200));
        sent += 2 * max;
    }
    println!(
        "healthy again: the limit went {limit_after} -> {} in {sent} requests, {:?}",
        limiter.current_limit(),
        t.elapsed()
    );
    assert_eq!(limiter.current_limit(), max, "did not climb back");
    // Probing past the last overload point: 1,024 requests measured (one
    // step per window all the way took 39,424).
    assert!(sent <= 10_000, "took {sent} requests to climb back");
}

fn aimd_max() -> usize {
    rebound::rebound_hyper::client::DEFAULT_ADAPTIVE_MAX
}
