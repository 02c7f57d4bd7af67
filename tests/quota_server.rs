//! The QuotaServer over real sockets: each header family's exact output
//! (on the paused clock, so every reset is exact), refusals and their
//! reset, token estimates against actual usage, the daily quota, bad
//! input, h2c, and 64 concurrent callers through `rebound::Client` (real
//! time: only properties that hold on a slow machine are asserted; the
//! figures are printed, `-- --nocapture`).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use rebound_test::quota::{DailyQuota, HeaderFamily, QuotaServer, QuotaServerBuilder};
use tokio::task::JoinSet;
use tokio::time::{advance, timeout, Instant};

type Plain = HyperClient<HttpConnector, Empty<Bytes>>;

fn plain() -> Plain {
    HyperClient::builder(TokioExecutor::new()).build_http()
}

/// 2025-01-01T00:00:00Z.
fn new_year() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_735_689_600)
}

/// One GET with the given request headers: status, the response's
/// headers, its body.
async fn fetch(
    client: &Plain,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = timeout(
        Duration::from_secs(10),
        client.request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answered")
    .expect("a response");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The response headers, sorted, without the ones hyper adds.
fn quota_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    let mut out: Vec<_> = headers
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "date" | "content-length" | "content-type"))
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    out.sort();
    out
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out: Vec<_> = expected
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    out.sort();
    out
}

/// 100 requests and 1000 tokens per 60 s window; one request costing 300
/// tokens (100 input, 200 output) sent 30.5 s into the first window.
async fn one_reading(builder: QuotaServerBuilder) -> (StatusCode, Vec<(String, String)>) {
    let server = builder
        .requests(100)
        .tokens(1000)
        .window(Duration::from_secs(60))
        .wall_clock(new_year())
        .start()
        .await;
    advance(Duration::from_millis(30_500)).await;
    let (status, headers, _) = fetch(
        &plain(),
        &server.url("/v1/messages"),
        &[
            ("x-test-input-tokens", "100"),
            ("x-test-output-tokens", "200"),
        ],
    )
    .await;
    (status, quota_headers(&headers))
}

#[tokio::test(start_paused = true)]
async fn each_family_writes_exactly_its_headers() {
    let cases: Vec<(HeaderFamily, Vec<(&str, &str)>)> = vec![
        (HeaderFamily::None, vec![]),
        (
            HeaderFamily::Ietf,
            vec![
                ("ratelimit-policy", "\"burst\";q=100;w=60"),
                ("ratelimit", "\"burst\";r=99;t=30"),
            ],
        ),
        (
            HeaderFamily::Legacy,
            vec![
                ("ratelimit-limit", "100"),
                ("ratelimit-remaining", "99"),
                ("ratelimit-reset", "30"),
            ],
        ),
        (
            HeaderFamily::XRateLimit,
            vec![
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-remaining", "99"),
                ("x-ratelimit-reset", "30"),
            ],
        ),
        (
            HeaderFamily::GitHub,
            vec![
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-remaining", "99"),
                ("x-ratelimit-used", "1"),
                ("x-ratelimit-resource", "core"),
                ("x-ratelimit-reset", "1735689660"),
            ],
        ),
        (
            HeaderFamily::OpenAi,
            vec![
                ("x-ratelimit-limit-requests", "100"),
                ("x-ratelimit-remaining-requests", "99"),
                ("x-ratelimit-reset-requests", "29.5s"),
                ("x-ratelimit-limit-tokens", "1000"),
                ("x-ratelimit-remaining-tokens", "700"),
                ("x-ratelimit-reset-tokens", "29.5s"),
            ],
        ),
        (
            HeaderFamily::Anthropic,
            vec![
                ("anthropic-ratelimit-requests-limit", "100"),
                ("anthropic-ratelimit-requests-remaining", "99"),
                ("anthropic-ratelimit-requests-reset", "2025-01-01T00:01:00Z"),
                ("anthropic-ratelimit-tokens-limit", "1000"),
                ("anthropic-ratelimit-tokens-remaining", "700"),
                ("anthropic-ratelimit-tokens-reset", "2025-01-01T00:01:00Z"),
            ],
        ),
        (
            HeaderFamily::Azure,
            vec![
                ("x-ratelimit-remaining-requests", "99"),
                ("x-ratelimit-remaining-tokens", "700"),
            ],
        ),
    ];
    for (family, expected) in cases {
        let builder = QuotaServer::builder().headers(family).policy_name("burst");
        let (status, got) = one_reading(builder).await;
        assert_eq!(status, 200, "{family:?}");
        assert_eq!(got, pairs(&expected), "{family:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn anthropic_reports_input_and_output_buckets_charged_their_actual_use() {
    let server = QuotaServer::builder()
        .headers(HeaderFamily::Anthropic)
        .tokens(1000)
        .input_tokens(500)
        .output_tokens(200)
        .window(Duration::from_secs(60))
        .wall_clock(new_year())
        .start()
        .await;
    advance(Duration::from_millis(250)).await;
    // max_tokens 150 reserved, 50 used.
    let (status, headers, body) = fetch(
        &plain(),
        &server.url("/v1/messages"),
        &[
            ("x-test-input-tokens", "100"),
            ("x-test-output-tokens", "150"),
            ("x-test-actual-output-tokens", "50"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"usage":{"input_tokens":100,"output_tokens":50,"total_tokens":150}}"#
    );
    let reset = "2025-01-01T00:01:00Z";
    assert_eq!(
        quota_headers(&headers),
        pairs(&[
            ("anthropic-ratelimit-tokens-limit", "1000"),
            ("anthropic-ratelimit-tokens-remaining", "850"),
            ("anthropic-ratelimit-tokens-reset", reset),
            ("anthropic-ratelimit-input-tokens-limit", "500"),
            ("anthropic-ratelimit-input-tokens-remaining", "400"),
            ("anthropic-ratelimit-input-tokens-reset", reset),
            ("anthropic-ratelimit-output-tokens-limit", "200"),
            ("anthropic-ratelimit-output-tokens-remaining", "150"),
            ("anthropic-ratelimit-output-tokens-reset", reset),
        ])
    );
    // The output bucket admits on the estimate: 150 left, 160 asked.
    let (status, headers, _) = fetch(
        &plain(),
        &server.url("/v1/messages"),
        &[("x-test-output-tokens", "160")],
    )
    .await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "60");
    let snap = server.snapshot();
    assert_eq!(
        (
            snap.tokens_used,
            snap.input_tokens_used,
            snap.output_tokens_used
        ),
        (150, 100, 50)
    );
}

#[tokio::test(start_paused = true)]
async fn refusals_carry_retry_after_until_the_window_ends() {
    let server = QuotaServer::builder()
        .headers(HeaderFamily::Azure)
        .requests(2)
        .window(Duration::from_millis(200))
        .start()
        .await;
    let client = plain();
    let url = server.url("/chat");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(fetch(&client, &url, &[]).await.0.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    advance(Duration::from_millis(50)).await;
    let (status, headers, body) = fetch(&client, &url, &[]).await;
    assert_eq!(status, 429);
    assert_eq!(body, "");
    assert_eq!(
        quota_headers(&headers),
        pairs(&[
            ("retry-after", "1"),
            ("retry-after-ms", "150"),
            ("x-ratelimit-remaining-requests", "0"),
        ])
    );
    // The next window admits again.
    advance(Duration::from_millis(150)).await;
    assert_eq!(fetch(&client, &url, &[]).await.0, 200);

    let snap = server.snapshot();
    assert_eq!((snap.received, snap.accepted, snap.rejected), (5, 3, 2));
    let per: Vec<_> = snap
        .windows
        .iter()
        .map(|w| (w.index, w.accepted, w.rejected))
        .collect();
    assert_eq!(per, [(0, 2, 2), (1, 1, 0)]);
    let records = server.records();
    assert_eq!(records.len(), 5);
    assert_eq!(records[3].at, Duration::from_millis(50));
    assert_eq!(records[4].window, 1);

    // Retry-After off: the refusal says nothing about when.
    let quiet = QuotaServer::builder()
        .headers(HeaderFamily::Azure)
        .requests(0)
        .retry_after(false)
        .start()
        .await;
    let (status, headers, _) = fetch(&client, &quiet.url("/"), &[]).await;
    assert_eq!(status, 429);
    assert_eq!(
        quota_headers(&headers),
        pairs(&[("x-ratelimit-remaining-requests", "0")])
    );
}

#[tokio::test(start_paused = true)]
async fn token_quota_admits_on_the_estimate_and_charges_the_actual() {
    let server = QuotaServer::builder()
        .headers(HeaderFamily::OpenAi)
        .tokens(1000)
        .window(Duration::from_secs(1))
        .start()
        .await;
    let client = plain();
    let url = server.url("/v1/chat/completions");
    // Estimated 400, used 100: admitted while the tokens used so far
    // plus 400 fit in 1000...
    let costs = [("400", "100"); 8];
    let mut statuses = Vec::new();
    let mut remaining = Vec::new();
    for (est, actual) in costs {
        let (status, headers, _) = fetch(
            &client,
            &url,
            &[("x-test-tokens", est), ("x-test-actual-tokens", actual)],
        )
        .await;
        statuses.push(status.as_u16());
        remaining.push(
            headers["x-ratelimit-remaining-tokens"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    // ...until 700 are used: 700 + 400 > 1000.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 429]);
    assert_eq!(
        remaining,
        ["900", "800", "700", "600", "500", "400", "300", "300"]
    );
    // An estimate too low takes the window past its quota: 0 remaining.
    let (status, headers, _) = fetch(
        &client,
        &url,
        &[("x-test-tokens", "300"), ("x-test-actual-tokens", "900")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-ratelimit-remaining-tokens"], "0");
    assert_eq!(server.snapshot().tokens_used, 700 + 900);
    assert_eq!(server.snapshot().windows[0].tokens_used, 1600);
}

#[tokio::test(start_paused = true)]
async fn daily_quota_refuses_hours_away_with_a_problem_body() {
    let server = QuotaServer::builder()
        .headers(HeaderFamily::Ietf)
        .requests(10)
        .window(Duration::from_secs(1))
        .daily(DailyQuota::requests(3).problem_json(true))
        .start()
        .await;
    let client = plain();
    let url = server.url("/v1/chat");
    for i in 0..3 {
        assert_eq!(fetch(&client, &url, &[]).await.0, 200, "request {i}");
        advance(Duration::from_secs(1)).await;
    }
    advance(Duration::from_millis(500)).await;
    let (status, headers, body) = fetch(&client, &url, &[]).await;
    assert_eq!(status, 429);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(
        body,
        concat!(
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
            r#""title":"Request cannot be satisfied as assigned quota has been exceeded","#,
            r#""status":429,"violated-policies":["daily"]}"#
        )
    );
    // 3.5 s into the day: 86,396.5 s left, rounded up.
    assert_eq!(
        quota_headers(&headers),
        pairs(&[
            ("retry-after", "86397"),
            (
                "ratelimit-policy",
                "\"default\";q=10;w=1, \"daily\";q=3;w=86400"
            ),
            ("ratelimit", "\"default\";r=10;t=1, \"daily\";r=0;t=86397"),
        ])
    );
    let snap = server.snapshot();
    assert_eq!((snap.rejected, snap.rejected_daily), (1, 1));
    assert!(server.records()[3].daily);

    // A family with one requests dimension reports the binding one.
    let legacy = QuotaServer::builder()
        .headers(HeaderFamily::Legacy)
        .requests(10)
        .daily(DailyQuota::requests(1).period(Duration::from_secs(3600)))
        .start()
        .await;
    assert_eq!(fetch(&client, &legacy.url("/"), &[]).await.0, 200);
    let (status, headers, body) = fetch(&client, &legacy.url("/"), &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::TOO_MANY_REQUESTS, ""));
    assert_eq!(
        quota_headers(&headers),
        pairs(&[
            ("retry-after", "3600"),
            ("ratelimit-limit", "1"),
            ("ratelimit-remaining", "0"),
            ("ratelimit-reset", "3600"),
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn a_malformed_cost_gets_a_400_naming_the_header() {
    let server = QuotaServer::builder().tokens(100).start().await;
    let client = plain();
    for bad in ["-5", "1e3", "ten", "18446744073709551616"] {
        let (status, _, body) = fetch(&client, &server.url("/"), &[("x-test-tokens", bad)]).await;
        assert_eq!(status, 400, "{bad}");
        assert!(body.contains("x-test-tokens"), "{body}");
        assert!(!body.contains(bad), "the value is not echoed: {body}");
    }
    let snap = server.snapshot();
    assert_eq!((snap.received, snap.bad_requests, snap.accepted), (4, 4, 0));
    assert!(snap.windows.is_empty());
}

#[tokio::test]
async fn bad_configuration_is_refused_with_a_reason() {
    let cases = [
        (
            QuotaServer::builder().window(Duration::ZERO),
            "window must be longer than zero",
        ),
        (
            QuotaServer::builder().daily(DailyQuota::requests(1).period(Duration::ZERO)),
            "daily period",
        ),
        (
            QuotaServer::builder().policy_name("a\"b"),
            "not a structured-field string",
        ),
        (QuotaServer::builder().policy_name(""), "policy name"),
    ];
    for (builder, says) in cases {
        let err = builder.try_start().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[tokio::test]
async fn speaks_h2c_with_prior_knowledge() {
    let server = QuotaServer::builder()
        .headers(HeaderFamily::XRateLimit)
        .requests(1)
        .window(Duration::from_secs(30))
        .start()
        .await;
    let client: Plain = HyperClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let res = client
        .get(server.url("/h2").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "0");
    let res = client
        .get(server.url("/h2").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    server.shutdown().await;
}

/// Many concurrent plain callers: what the callers saw and what the
/// server counted agree exactly, and no window admits past its quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_and_the_counters_agree() {
    const QUOTA: u64 = 25;
    let server = QuotaServer::builder()
        .headers(HeaderFamily::Ietf)
        .requests(QUOTA)
        .window(Duration::from_millis(200))
        .start()
        .await;
    let client = plain();
    let url: http::Uri = server.url("/load").parse().unwrap();
    let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut callers = JoinSet::new();
    for _ in 0..16 {
        let (client, url, ok, refused) = (client.clone(), url.clone(), ok.clone(), refused.clone());
        callers.spawn(async move {
            for _ in 0..40 {
                let res = client.get(url.clone()).await.unwrap();
                match res.status().as_u16() {
                    200 => ok.fetch_add(1, Ordering::Relaxed),
                    429 => refused.fetch_add(1, Ordering::Relaxed),
                    other => panic!("unexpected {other}"),
                };
                let _ = res.into_body().collect().await;
            }
        });
    }
    timeout(Duration::from_secs(60), async {
        while let Some(done) = callers.join_next().await {
            done.unwrap();
        }
    })
    .await
    .expect("the callers finished");
    let snap = server.snapshot();
    let (ok, refused) = (ok.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    println!(
        "16 callers × 40: {ok} admitted, {refused} refused, over {} windows",
        snap.windows.len()
    );
    assert_eq!(snap.received, 640);
    assert_eq!((snap.accepted, snap.rejected), (ok, refused));
    assert_eq!(
        snap.windows.iter().map(|w| w.received).sum::<u64>(),
        snap.received
    );
    for w in &snap.windows {
        assert!(
            w.accepted <= QUOTA,
            "window {} admitted {}",
            w.index,
            w.accepted
        );
        assert_eq!(w.received, w.accepted + w.rejected);
    }
}

/// Today's client (the reactive Retry-After gate) against a requests
/// quota: 64 concurrent callers for a few short windows. What is asserted
/// holds on any machine; the 429 count and the goodput are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebound_client_64_callers_against_a_requests_quota() {
    const QUOTA: u64 = 20;
    const WINDOW: Duration = Duration::from_millis(250);
    const RUN: Duration = Duration::from_secs(2);
    let server = QuotaServer::builder()
        .headers(HeaderFamily::Ietf)
        .requests(QUOTA)
        .window(WINDOW)
        .start()
        .await;
    let client = rebound::Client::builder()
        .total_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let url = server.url("/v1/chat");
    let start = Instant::now();
    let counts = Arc::new([
        AtomicU64::new(0), // 200
        AtomicU64::new(0), // 429 returned to the caller
        AtomicU64::new(0), // errors
    ]);
    let mut callers = JoinSet::new();
    for _ in 0..64 {
        let (client, url, counts) = (client.clone(), url.clone(), counts.clone());
        callers.spawn(async move {
            // Bounded in count and in time.
            for _ in 0..100 {
                if start.elapsed() >= RUN {
                    break;
                }
                match client.get(url.as_str()).await {
                    Ok(res) => {
                        let slot = match res.status().as_u16() {
                            200 => 0,
                            429 => 1,
                            other => panic!("unexpected {other}"),
                        };
                        let _ = res.into_body().collect().await;
                        counts[slot].fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        counts[2].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    timeout(Duration::from_secs(30), async {
        while let Some(done) = callers.join_next().await {
            done.expect("no caller panicked");
        }
    })
    .await
    .expect("the callers finished");
    let elapsed = start.elapsed();
    let snap = server.snapshot();
    let [ok, refused, errors] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    let windows = elapsed.as_nanos().div_ceil(WINDOW.as_nanos()) as u64;
    println!(
        "reactive client, 64 callers, {QUOTA}/{WINDOW:?} for {elapsed:?}: server saw {} \
         ({} admitted, {} × 429); callers got {ok} × 200, {refused} × 429, {errors} errors; \
         goodput {:.0}/s, {:.0} % of the quota offered in {windows} windows used",
        snap.received,
        snap.accepted,
        snap.rejected,
        snap.accepted as f64 / elapsed.as_secs_f64(),
        100.0 * snap.accepted as f64 / (QUOTA * windows) as f64,
    );
    assert_eq!(snap.received, snap.accepted + snap.rejected);
    assert_eq!(
        snap.windows.iter().map(|w| w.received).sum::<u64>(),
        snap.received
    );
    for w in &snap.windows {
        assert!(
            w.accepted <= QUOTA,
            "window {} admitted {}",
            w.index,
            w.accepted
        );
    }
    // Every 200 a caller saw was admitted by the server (a deadline can
    // cut an admitted one on its way back, never the reverse).
    assert!(ok <= snap.accepted, "{ok} > {}", snap.accepted);
    assert!(ok > 0, "something got through");
}
