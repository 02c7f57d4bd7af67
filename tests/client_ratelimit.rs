//! Issue 21: the default `rebound::Client` paces by the quota its host
//! announces, over real sockets (`FaultServer` on 127.0.0.1): a quota at
//! zero with a 1 s reset makes the next request wait for the reset instead
//! of drawing a 429; a daily quota fails the next request at once, not
//! sent and not retried; `rate_limit(None)` sends it anyway; a 64-caller
//! run against a per-window quota draws no 429.
//!
//! Time is real: waits are checked only from below, every call is bounded
//! far above what it needs.

use std::time::Duration;

use rebound::ratelimit::QuotaReset;
use rebound::{Client, ErrorKind, RetryStop, Sent};
use rebound_test::fault::{Action, FaultServer};
use tokio::time::{timeout, Instant};

const BOUND: Duration = Duration::from_secs(20);

/// A request failed by the pacer: `QuotaExhausted`, not sent, not
/// retried, its `QuotaReset` at least `reset_after` away.
fn failed_fast_naming_the_reset(err: &rebound::Error, reset_after: Duration) {
    assert_eq!(err.kind(), ErrorKind::QuotaExhausted, "{err}");
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    assert_ne!(err.retry_stop(), Some(RetryStop::Attempts), "not retried");
    let reset = err.extensions().get::<QuotaReset>().expect("the reset");
    assert!(reset.at > Instant::now() + reset_after);
}

#[tokio::test]
async fn the_default_client_waits_for_an_announced_reset_instead_of_a_429() {
    let server = FaultServer::builder()
        .route(
            "/v1/chat",
            [Action::status(200)
                .header("x-ratelimit-limit-requests", "60")
                .header("x-ratelimit-remaining-requests", "0")
                .header("x-ratelimit-reset-requests", "1s")],
        )
        .default(Action::status(200))
        .start()
        .await;
    let client = Client::builder().build().unwrap();
    assert!(client.layers().contains(&"RateLimitLayer"));
    let url = server.url("/v1/chat");
    let res = timeout(BOUND, client.get(url.as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    let start = Instant::now();
    let res = timeout(BOUND, client.get(url.as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_daily_quota_fails_the_next_request_at_once_not_sent_unless_pacing_is_off() {
    let daily = || {
        FaultServer::builder().default(
            Action::status(200)
                .header("ratelimit-policy", "\"daily\";q=1000;w=86400")
                .header("ratelimit", "\"daily\";r=0;t=86400"),
        )
    };
    let server = daily().start().await;
    let client = Client::builder().build().unwrap();
    let url = server.url("/v1/chat");
    timeout(BOUND, client.get(url.as_str()))
        .await
        .unwrap()
        .unwrap();
    let err = timeout(BOUND, client.get(url.as_str()))
        .await
        .unwrap()
        .unwrap_err();
    failed_fast_naming_the_reset(&err, Duration::from_secs(86_000));
    assert_eq!(server.requests().len(), 1, "not sent");

    // Control: with pacing off, the same server gets the second request.
    let server = daily().start().await;
    let client = Client::builder().rate_limit(None).build().unwrap();
    assert!(!client.layers().contains(&"RateLimitLayer"));
    let url = server.url("/v1/chat");
    for _ in 0..2 {
        timeout(BOUND, client.get(url.as_str()))
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(server.requests().len(), 2);
}

/// 64 callers for 6 s against `client`, and what the server counted per
/// window: (window, accepted, 429s).
async fn sixty_four_callers(client: Client) -> (u32, Vec<(u64, u64, u64)>) {
    use rebound_test::quota::{HeaderFamily, QuotaServer};

    let server = QuotaServer::builder()
        .requests(40)
        .window(Duration::from_secs(1))
        .headers(HeaderFamily::OpenAi)
        .start()
        .await;
    let url = server.url("/v1/chat");
    let deadline = Instant::now() + Duration::from_millis(5_500);
    let mut callers = Vec::new();
    for _ in 0..64 {
        let client = client.clone();
        let url = url.clone();
        callers.push(tokio::spawn(async move {
            let mut ok = 0u32;
            while Instant::now() < deadline && ok < 20 {
                match timeout(BOUND, client.get(url.as_str())).await.unwrap() {
                    Ok(res) if res.status() == 200 => ok += 1,
                    Ok(_) | Err(_) => break,
                }
            }
            ok
        }));
    }
    let mut ok = 0;
    for c in callers {
        ok += c.await.unwrap();
    }
    let windows = server
        .snapshot()
        .windows
        .iter()
        .map(|w| (w.index, w.accepted, w.rejected))
        .collect();
    (ok, windows)
}

/// 64 callers against a quota of 40 requests per 1 s window, announced on
/// every answer (OpenAI's headers), enforced by the server with 429s: the
/// default client draws less than half the 429s of the same client
/// without pacing (the Retry-After gate alone), and uses the quota. How
/// few once the quota is known (0–1 % from the third window on an idle
/// machine; later under load) is a figure of `cargo bench --bench
/// ratelimit`, not a test: it depends on the machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_callers_stay_within_an_announced_window_quota() {
    let (ok, paced) = sixty_four_callers(Client::builder().build().unwrap()).await;
    let (_, reactive) =
        sixty_four_callers(Client::builder().rate_limit(None).build().unwrap()).await;
    eprintln!("(window, accepted, 429s): paced {paced:?}, reactive {reactive:?}");
    assert!(ok >= 120, "the quota is used: {ok} of 40 per window");
    let total = |w: &[(u64, u64, u64)]| w.iter().map(|w| w.2).sum::<u64>();
    assert!(
        total(&paced) * 2 < total(&reactive),
        "paced {paced:?}, reactive {reactive:?}"
    );
}

/// A 200 whose headers say the quota is at zero lowers the adaptive limit
/// (issue 21: "on 429, lower your own concurrency"), before any 429; an
/// answer with quota left does not.
#[tokio::test]
async fn a_quota_at_zero_lowers_the_adaptive_limit() {
    use std::sync::Arc;

    use rebound::limit::{AdaptiveLimiter, Aimd};

    let server = FaultServer::builder()
        .route(
            "/low",
            [Action::status(200)
                .header("x-ratelimit-limit-requests", "60")
                .header("x-ratelimit-remaining-requests", "0")
                .header("x-ratelimit-reset-requests", "20ms")],
        )
        .route(
            "/plenty",
            [Action::status(200)
                .header("x-ratelimit-limit-requests", "60")
                .header("x-ratelimit-remaining-requests", "59")
                .header("x-ratelimit-reset-requests", "1s")],
        )
        .start()
        .await;
    let limiter = Arc::new(AdaptiveLimiter::new(
        Aimd::default().initial_limit(64).max_limit(64),
    ));
    let client = Client::builder()
        .adaptive_limiter(limiter.clone())
        .build()
        .unwrap();
    let res = timeout(BOUND, client.get(server.url("/plenty").as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    drop(res);
    assert_eq!(limiter.current_limit(), 64, "quota left: no signal");
    let res = timeout(BOUND, client.get(server.url("/low").as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    drop(res);
    assert!(limiter.current_limit() < 64, "{}", limiter.current_limit());
}

/// `x-should-retry` (OpenAI's and Anthropic's APIs) is the server's word:
/// a 503 saying `false` is not retried, a 409 saying `true` is (a GET).
#[tokio::test]
async fn the_servers_word_on_retrying_wins_over_the_status() {
    let server = FaultServer::builder()
        .route(
            "/no",
            [Action::status(503).header("x-should-retry", "false")],
        )
        .route(
            "/yes",
            [
                Action::status(409).header("x-should-retry", "true"),
                Action::status(200),
            ],
        )
        .start()
        .await;
    let client = Client::builder().build().unwrap();
    let res = timeout(BOUND, client.get(server.url("/no").as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(server.requests_to("/no").len(), 1, "not retried");
    let res = timeout(BOUND, client.get(server.url("/yes").as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(server.requests_to("/yes").len(), 2, "retried once");
}

/// The draft's `quota-exceeded` problem (a 429 of
/// `application/problem+json`, the daily quota's headers saying it resets
/// hours away, and `Retry-After`): the next request fails at once as
/// `QuotaExhausted`, not sent, not retried, the reset in the error — not
/// as the Retry-After gate's `Throttled`, which the client checks first.
#[tokio::test]
async fn a_quota_exceeded_problem_fails_the_next_request_naming_the_reset() {
    use rebound::{GateMode, RetryAfterHint};
    use rebound_test::quota::{DailyQuota, HeaderFamily, QuotaServer};

    let server = QuotaServer::builder()
        .headers(HeaderFamily::Ietf)
        .requests(1_000)
        .daily(DailyQuota::requests(2).problem_json(true))
        .start()
        .await;
    let url = server.url("/v1/chat");
    // Another client uses the day's quota up.
    let other = Client::builder()
        .rate_limit(None)
        .retry_after_gate(None::<GateMode>)
        .build()
        .unwrap();
    for _ in 0..2 {
        let res = timeout(BOUND, other.get(url.as_str()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let client = Client::builder().build().unwrap();
    let res = timeout(BOUND, client.get(url.as_str()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "the draft's problem"
    );
    drop(res);
    let received = server.snapshot().received;
    let err = timeout(BOUND, client.get(url.as_str()))
        .await
        .unwrap()
        .unwrap_err();
    failed_fast_naming_the_reset(&err, Duration::from_secs(3_600));
    let hint = err.extensions().get::<RetryAfterHint>().expect("a hint");
    assert!(hint.0 > Duration::from_secs(3_600));
    assert_eq!(server.snapshot().received, received, "not sent");
}
