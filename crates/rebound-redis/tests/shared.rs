//! The shared host state over a real redis-server and a real quota server
//! on 127.0.0.1: the fleet's pause, the fleet's quota and its overshoot
//! bound, and Redis killed, restarted, stopped (SIGSTOP) and answering
//! garbage. Each "replica" is a SharedState with its own RedisStore (its
//! own connections) over a bare hyper-util client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rebound_core::shared::{HostId, SharedConfig, SharedState, SharedStateLayer};
use rebound_redis::RedisStore;
use rebound_test::quota::{HeaderFamily, QuotaServer};
use rebound_test::redis::RedisServer;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

type Svc = BoxCloneService<Request<Empty<Bytes>>, Response<Incoming>, rebound_core::Error>;

/// Bounds loose enough for a loaded 2-core machine: these tests are about
/// sharing, not speed (the fault tests use the defaults).
fn relaxed() -> SharedConfig {
    SharedConfig::new()
        .call_timeout(Duration::from_millis(250))
        .failures_to_open(3)
}

fn replica(redis: &RedisServer, ns: &str, config: SharedConfig) -> (SharedState, Svc) {
    let store = RedisStore::new(&redis.url(), ns).expect("store");
    let state = SharedState::new(Arc::new(store), config);
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(SharedStateLayer::new(state.clone()))
        .service(client);
    (state, BoxCloneService::new(svc))
}

fn get(url: &str) -> Request<Empty<Bytes>> {
    Request::get(url).body(Empty::new()).unwrap()
}

/// Until `f` holds, checking every 10 ms, for at most `max`.
async fn eventually(max: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < max {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

#[tokio::test]
async fn one_replicas_429_pauses_the_host_for_every_replica() {
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(2)
        .window(Duration::from_secs(2))
        .headers(HeaderFamily::None)
        .retry_after(true)
        .start()
        .await;
    let url = server.url("/v1");
    let (_a_state, a) = replica(&redis, "t-gate", relaxed());
    let (b_state, b) = replica(&redis, "t-gate", relaxed());
    // B has called the host before (and is watching the fleet's pauses).
    b.clone().oneshot(get(&url)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A spends the rest and draws the 429.
    let res = a.clone().oneshot(get(&url)).await.unwrap();
    assert_eq!(res.status(), 200);
    let res = a.clone().oneshot(get(&url)).await.unwrap();
    assert_eq!(res.status(), 429);
    let paused_at = Instant::now();
    let pause: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let key = format!("t-gate:p:{}", HostId::of(&url.parse().unwrap()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ttl = redis.command(&["PTTL", &key]).await.unwrap();
    assert!(
        ttl.starts_with(':') && !ttl.starts_with(":-"),
        "pause key set: {ttl}"
    );

    // B's next request waits for the pause: the server sees nothing of it
    // before then, and it succeeds.
    let before = server.request_count();
    let res = b.clone().oneshot(get(&url)).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(paused_at.elapsed() >= Duration::from_millis(pause * 1000 - 100));
    assert_eq!(
        server.request_count(),
        before + 1,
        "one request from B, after the pause"
    );
    assert!(b_state.is_available());
}

#[tokio::test]
async fn a_replica_that_connects_late_reads_the_pause_in_force() {
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(1)
        .window(Duration::from_secs(2))
        .retry_after(true)
        .start()
        .await;
    let url = server.url("/");
    let (_a_state, a) = replica(&redis, "t-late", relaxed());
    a.clone().oneshot(get(&url)).await.unwrap();
    let res = a.clone().oneshot(get(&url)).await.unwrap();
    assert_eq!(res.status(), 429);
    let paused_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // C starts now, after the pause was published: its first request
    // starts the watch, which reads the pauses in force.
    let (_c_state, c) = replica(&redis, "t-late", relaxed());
    let before = server.request_count();
    // A first request to another host starts C's watch.
    let _ = c.clone().oneshot(get("http://127.0.0.1:9/")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let res = c.clone().oneshot(get(&url)).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(paused_at.elapsed() >= Duration::from_millis(1_500));
    assert_eq!(server.request_count(), before + 1);
}

/// Four replicas × 8 callers against 40 requests per 1 s window for 4
/// windows: after the first window (the host not yet tracked), the fleet
/// draws no more 429s per window than replicas × max_lease, and uses most
/// of the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_shares_one_quota_within_the_overshoot_bound() {
    const REPLICAS: u64 = 4;
    const CALLERS: usize = 8;
    const MAX_LEASE: u64 = 4;
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(40)
        .window(Duration::from_secs(1))
        .headers(HeaderFamily::OpenAi)
        .start()
        .await;
    let url = server.url("/v1/chat");
    let config = relaxed()
        .max_lease(MAX_LEASE)
        .max_wait(Duration::from_secs(2));
    let mut tasks = Vec::new();
    let end = Instant::now() + Duration::from_millis(4_000);
    let sent = Arc::new(AtomicU64::new(0));
    let mut states = Vec::new();
    for _ in 0..REPLICAS {
        let (state, svc) = replica(&redis, "t-quota", config.clone());
        states.push(state);
        for _ in 0..CALLERS {
            let (svc, url, sent) = (svc.clone(), url.clone(), sent.clone());
            tasks.push(tokio::spawn(async move {
                // Bounded: at most 400 requests per caller.
                for _ in 0..400 {
                    if Instant::now() >= end {
                        break;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    match svc.clone().oneshot(get(&url)).await {
                        Ok(res) if res.status() == 429 => {
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                        Ok(_) => {}
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let snap = server.snapshot();
    eprintln!("windows: {:?}", snap.windows);
    let later: Vec<_> = snap
        .windows
        .iter()
        .filter(|w| w.index >= 1 && w.index <= 3)
        .collect();
    assert!(!later.is_empty());
    for w in &later {
        assert!(
            w.rejected <= REPLICAS * MAX_LEASE,
            "window {}: {} 429s, over the bound {} (all windows: {:?})",
            w.index,
            w.rejected,
            REPLICAS * MAX_LEASE,
            snap.windows
        );
    }
    let used: u64 = later.iter().map(|w| w.accepted).sum();
    assert!(
        used * 10 >= 40 * later.len() as u64 * 8,
        "at least 80 % of the quota used: {:?}",
        snap.windows
    );
    let trips: u64 = states.iter().map(SharedState::round_trips).sum();
    assert!(
        trips * 2 <= sent.load(Ordering::Relaxed),
        "leases: {trips} round trips for {} requests",
        sent.load(Ordering::Relaxed)
    );
}

/// Redis killed mid-run: no request fails because of it, the replica
/// falls back at once, and rejoins once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_mid_run() {
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(100_000)
        .window(Duration::from_secs(1))
        .headers(HeaderFamily::OpenAi)
        .start()
        .await;
    let url = server.url("/");
    let (state, svc) = replica(&redis, "t-kill", SharedConfig::new().max_lease(4));
    let mut failed = 0;
    let mut slowest = Duration::ZERO;
    let run = |n: usize| {
        let (svc, url) = (svc.clone(), url.clone());
        async move {
            let mut out = (0, Duration::ZERO);
            for _ in 0..n {
                let t = Instant::now();
                if svc.clone().oneshot(get(&url)).await.is_err() {
                    out.0 += 1;
                }
                out.1 = out.1.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            out
        }
    };
    let (f, s) = run(20).await;
    (failed, slowest) = (failed + f, slowest.max(s));
    assert!(state.is_available());

    redis.kill().await;
    let (f, _) = run(40).await;
    failed += f;
    assert!(!state.is_available(), "fell back to local state");

    redis.restart().await.unwrap();
    assert!(
        {
            let mut back = false;
            for _ in 0..60 {
                let (f, _) = run(5).await;
                failed += f;
                if state.is_available() {
                    back = true;
                    break;
                }
            }
            back
        },
        "rejoined after Redis came back"
    );
    assert_eq!(failed, 0, "no request failed because of Redis");
    let _ = slowest;
}

/// A stopped Redis (SIGSTOP): requests wait at most the call timeout per
/// call, then go on local state; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_costs_requests_at_most_the_call_bound() {
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(100_000)
        .window(Duration::from_secs(1))
        .headers(HeaderFamily::OpenAi)
        .start()
        .await;
    let url = server.url("/");
    let timeout = Duration::from_millis(50);
    let (state, svc) = replica(
        &redis,
        "t-stop",
        SharedConfig::new().max_lease(2).call_timeout(timeout),
    );
    for _ in 0..10 {
        svc.clone().oneshot(get(&url)).await.unwrap();
    }
    redis.pause().unwrap();
    let start = Instant::now();
    let mut failed = 0;
    // Bounded: 40 requests, each bounded by the call timeout plus the
    // quota server's answer; the whole loop far under the 30 s bound.
    for _ in 0..40 {
        if svc.clone().oneshot(get(&url)).await.is_err() {
            failed += 1;
        }
    }
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(!state.is_available());
    redis.resume().unwrap();
    assert_eq!(failed, 0);
}

/// Garbage where the quota should be (a key of the wrong type): a store
/// error, the replica falls back, no request fails.
#[tokio::test]
async fn garbage_in_redis_falls_back_to_local_state() {
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(100_000)
        .headers(HeaderFamily::OpenAi)
        .start()
        .await;
    let url = server.url("/");
    let (state, svc) = replica(
        &redis,
        "t-garbage",
        relaxed().failures_to_open(1).max_lease(1),
    );
    for _ in 0..3 {
        svc.clone().oneshot(get(&url)).await.unwrap();
    }
    let key = format!("t-garbage:q:{}", HostId::of(&url.parse().unwrap()));
    redis.command(&["DEL", &key]).await.unwrap();
    redis.command(&["LPUSH", &key, "junk"]).await.unwrap();
    for _ in 0..5 {
        let res = svc.clone().oneshot(get(&url)).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    assert!(!state.is_available());
}

/// The WARN on falling back names no password, no key and no value.
#[tokio::test(flavor = "current_thread")]
async fn the_fallback_warning_holds_no_secret() {
    let capture = rebound_test::capture::Capture::new();
    let _guard = capture.set_default();
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(100_000)
        .headers(HeaderFamily::OpenAi)
        .start()
        .await;
    let url = server.url("/v1?api_key=hunter2");
    // A password this Redis does not want: every call fails.
    let bad = format!("redis://:s3cr3t-pw@127.0.0.1:{}/", redis.port());
    let store = RedisStore::new(&bad, "t-secret").unwrap();
    assert!(!format!("{store:?}").contains("s3cr3t"));
    let state = SharedState::new(Arc::new(store), SharedConfig::new().failures_to_open(1));
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(SharedStateLayer::new(state.clone()))
        .service(client);
    for _ in 0..5 {
        let res = svc.clone().oneshot(get(&url)).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    assert!(eventually(Duration::from_secs(2), || !state.is_available()).await);
    let text = capture.text();
    assert!(text.contains("shared host state unavailable"), "{text}");
    assert_eq!(capture.count("shared host state unavailable"), 1);
    for secret in ["s3cr3t", "hunter2", "t-secret:q:"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
}

/// A give-back of unused quota counts only in the window its lease came
/// from: after the reset the count was refilled, and a late give-back is
/// ignored by the script (it compares the lease's window with Redis's).
#[tokio::test]
async fn a_give_back_after_the_reset_is_ignored() {
    use rebound_core::shared::{HostStore, Lease, Observation};
    let redis = RedisServer::start().await.expect("redis-server");
    let store = RedisStore::new(&redis.url(), "t-give").expect("store");
    let host = HostId::of(&"https://api.example/".parse().unwrap());
    let window = Duration::from_millis(400);
    store
        .observe(
            host,
            Observation {
                remaining: 10,
                reset_in: Some(window),
                limit: Some(10),
                window: Some(window),
                precision: Duration::from_millis(1),
            },
        )
        .await
        .unwrap();
    let granted = |l: Lease| match l {
        Lease::Granted {
            granted, window, ..
        } => (granted, window),
        Lease::Untracked => panic!("untracked"),
    };
    // Within the window: given back, leased again.
    let (g, w1) = granted(store.lease(host, 4).await.unwrap());
    assert_eq!(g, 4);
    assert_ne!(w1, 0);
    store.give_back(host, 4, w1).await.unwrap();
    assert_eq!(granted(store.lease(host, 100).await.unwrap()).0, 10);
    store.give_back(host, 10, w1).await.unwrap();

    // A lease of 5, then the reset: the count is refilled to 10.
    let (g, w1) = granted(store.lease(host, 5).await.unwrap());
    assert_eq!(g, 5);
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    let (g, w2) = granted(store.lease(host, 1).await.unwrap());
    assert_eq!(g, 1);
    assert_ne!(w1, w2, "a new window");
    // The old lease's 5 come back late: ignored (else 9 + 5, capped: 10).
    store.give_back(host, 5, w1).await.unwrap();
    assert_eq!(granted(store.lease(host, 100).await.unwrap()).0, 9);
}

/// Retries inside the stack went without a lease: the response's attempt
/// count is the host's lease debt, taken from the shared count.
#[tokio::test]
async fn retries_are_lease_debt_taken_from_the_shared_count() {
    use http::{HeaderMap, Method, StatusCode};
    use rebound_core::shared::{HostStore, Lease};
    let redis = RedisServer::start().await.expect("redis-server");
    let store = Arc::new(RedisStore::new(&redis.url(), "t-debt").expect("store"));
    let state = SharedState::new(store.clone(), relaxed());
    let uri: http::Uri = "https://api.example/".parse().unwrap();
    let mut ok = HeaderMap::new();
    ok.insert("x-ratelimit-limit-requests", "100".parse().unwrap());
    ok.insert("x-ratelimit-remaining-requests", "100".parse().unwrap());
    ok.insert("x-ratelimit-reset-requests", "60s".parse().unwrap());
    // The first answer makes the host tracked, with 100 left.
    let a = state.admit(&Method::GET, &uri, None).await.unwrap();
    state.settle(a, StatusCode::OK, &ok);
    let host = HostId::of(&uri);
    let left = || async {
        let lease = store.lease(host, 0).await.unwrap();
        assert!(matches!(lease, Lease::Granted { .. }));
        // Read the count: take all, give all back.
        let Lease::Granted {
            granted, window, ..
        } = store.lease(host, 1000).await.unwrap()
        else {
            unreachable!()
        };
        store.give_back(host, granted, window).await.unwrap();
        granted
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = left().await;
    assert_eq!(before, 100);

    // A request leases (one round trip), takes 3 attempts: 2 retries, the
    // last a 429 (no Retry-After).
    let a = state.admit(&Method::GET, &uri, None).await.unwrap();
    let leased = 100 - left().await;
    state.settle_attempts(a, StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), 3);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(100 - left().await, leased + 2, "the 2 retries charged");
}
