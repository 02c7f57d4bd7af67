//! Issue 23: `ClientBuilder::shared_state` over a real redis-server and a
//! real quota server on 127.0.0.1. Two clients stand for two replicas
//! (each its own store connections): a 429 with Retry-After that one
//! client's attempt draws pauses the host for the other, which sends
//! nothing until the pause ends; both end with a 200 (the first by its
//! retry). Real time: waits are checked from below, calls bounded above.

use std::sync::Arc;
use std::time::Duration;

use rebound::shared::{SharedConfig, SharedState};
use rebound::{Client, RedisStore};
use rebound_test::quota::{HeaderFamily, QuotaServer};
use rebound_test::redis::RedisServer;
use tokio::time::{timeout, Instant};

const BOUND: Duration = Duration::from_secs(20);

fn replica(redis: &RedisServer) -> Client {
    let store = RedisStore::new(&redis.url(), "client-test").unwrap();
    let config = SharedConfig::new().call_timeout(Duration::from_millis(250));
    Client::builder()
        .shared_state(SharedState::new(Arc::new(store), config))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_429_one_client_draws_pauses_the_host_for_the_other() {
    let redis = RedisServer::start().await.expect("redis-server");
    let server = QuotaServer::builder()
        .requests(2)
        .window(Duration::from_secs(2))
        .headers(HeaderFamily::None)
        .retry_after(true)
        .start()
        .await;
    let url = server.url("/v1");
    let (a, b) = (replica(&redis), replica(&redis));
    // B has called the host (its watch of the fleet's pauses runs).
    let res = timeout(BOUND, b.get(url.as_str())).await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let res = timeout(BOUND, a.get(url.as_str())).await.unwrap().unwrap();
    assert_eq!(res.status(), 200);

    // A's next attempt draws the 429 (Retry-After ~2 s); its retry waits.
    let a_call = {
        let (a, url) = (a.clone(), url.clone());
        tokio::spawn(async move { timeout(BOUND, a.get(url.as_str())).await })
    };
    let start = Instant::now();
    while server.snapshot().rejected == 0 && start.elapsed() < BOUND {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let paused_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = server.request_count();

    let b_call = {
        let (b, url) = (b.clone(), url.clone());
        tokio::spawn(async move { timeout(BOUND, b.get(url.as_str())).await })
    };
    // Well inside the pause: nothing from either replica reached the host.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    if paused_at.elapsed() < Duration::from_millis(1_800) {
        assert_eq!(
            server.request_count(),
            before,
            "no request during the pause"
        );
    }
    let a_res = a_call.await.unwrap().unwrap().unwrap();
    let b_res = b_call.await.unwrap().unwrap().unwrap();
    assert_eq!(
        (a_res.status().as_u16(), b_res.status().as_u16()),
        (200, 200)
    );
    assert!(paused_at.elapsed() >= Duration::from_millis(900));
    assert_eq!(server.snapshot().rejected, 1, "one 429 for the fleet");
}
