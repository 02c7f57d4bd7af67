//! A fleet against one quota (issue 23): 4 client **processes** (this
//! binary re-spawned as children) × 32 concurrent callers, one
//! [`QuotaServer`](rebound_test::quota::QuotaServer) (N requests per 1 s
//! window, OpenAI headers, `Retry-After` on its 429s) and one real
//! `redis-server` on 127.0.0.1, for 10 windows per row.
//!
//! ```text
//! cargo bench --bench fleet --features redis            # 10 windows per row
//! cargo bench --bench fleet --features redis -- --quick # 3 windows per row
//! ```
//!
//! Rows: the default client without shared state ("local only"); with
//! `shared_state` on Redis ("shared"); shared with Redis killed after a
//! third of the run and restarted after two thirds ("shared, Redis
//! killed"). Columns: what the server received and refused (429, as a share
//! of what it received), the share of the quota that was admitted — over
//! every window the server counted (the first and the last only partly
//! offered: the children start some milliseconds into window 0 and stop as
//! far into the last), and over the windows offered in full (1 to N − 1) —,
//! the callers' errors, and the Redis round
//! trips a request waited for (lease takes) per request.
//!
//! Real time on loopback: figures vary with the machine's load; the
//! server's own counts (admitted ≤ quota per window) do not. Not run in CI.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rebound::shared::{SharedConfig, SharedState};
use rebound::{Client, RedisStore};
use rebound_test::quota::{HeaderFamily, QuotaServer};
use rebound_test::redis::RedisServer;
use tokio::task::JoinSet;
use tokio::time::Instant;

const PROCESSES: usize = 4;
const CALLERS: usize = 32;
const QUOTA: u64 = 200;
const WINDOW: Duration = Duration::from_secs(1);

/// A child: `--fleet-child URL REDIS_URL|- MILLIS`; prints one line
/// `sent ok errors round_trips store_failures fallbacks`, and its errors by
/// kind (and non-200 answers by status) on stderr.
async fn child(url: String, redis: String, millis: u64) {
    let mut builder = Client::builder().total_timeout(Duration::from_secs(10));
    let mut state = None;
    if redis != "-" {
        let store = RedisStore::new(&redis, "fleet-bench").expect("store");
        let s = SharedState::new(Arc::new(store), SharedConfig::new());
        state = Some(s.clone());
        builder = builder.shared_state(s);
    }
    let client = builder.build().expect("client");
    let end = Instant::now() + Duration::from_millis(millis);
    let (sent, ok, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let kinds = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        u64,
    >::new()));
    let mut set = JoinSet::new();
    for _ in 0..CALLERS {
        let (client, url) = (client.clone(), url.clone());
        let (sent, ok, errors) = (sent.clone(), ok.clone(), errors.clone());
        let kinds = kinds.clone();
        set.spawn(async move {
            // Bounded: at most 100,000 requests per caller.
            for _ in 0..100_000 {
                if Instant::now() >= end {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
                let what = match client.get(url.as_str()).await {
                    Ok(res) if res.status() == 200 => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Ok(res) => format!("status {}", res.status().as_u16()),
                    Err(e) => format!("{:?}", e.kind()),
                };
                errors.fetch_add(1, Ordering::Relaxed);
                *kinds.lock().unwrap().entry(what).or_default() += 1;
            }
        });
    }
    while set.join_next().await.is_some() {}
    let kinds = kinds.lock().unwrap().clone();
    if !kinds.is_empty() {
        eprintln!("    child {}: errors {kinds:?}", std::process::id());
    }
    println!(
        "{} {} {} {} {} {}",
        sent.load(Ordering::Relaxed),
        ok.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        state.as_ref().map_or(0, SharedState::round_trips),
        state.as_ref().map_or(0, SharedState::store_failures),
        state.as_ref().map_or(0, SharedState::fallbacks),
    );
}

#[derive(Default)]
struct Totals {
    sent: u64,
    ok: u64,
    errors: u64,
    trips: u64,
    /// Per process: (store calls failed, fallbacks to local state).
    store: Vec<(u64, u64)>,
}

async fn row(name: &str, windows: u32, shared: bool, kill: bool) -> Result<(), String> {
    let redis = RedisServer::start()
        .await
        .map_err(|e| format!("redis-server: {e}"))?;
    let server = QuotaServer::builder()
        .requests(QUOTA)
        .window(WINDOW)
        .headers(HeaderFamily::OpenAi)
        .retry_after(true)
        .max_windows(1000)
        .start()
        .await;
    let millis = (WINDOW * windows).as_millis() as u64;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let child = Command::new(&exe)
            .arg("--fleet-child")
            .arg(server.url("/v1/chat"))
            .arg(if shared { redis.url() } else { "-".to_owned() })
            .arg(millis.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| e.to_string())?;
        children.push(child);
    }
    if kill {
        tokio::time::sleep(Duration::from_millis(millis / 3)).await;
        redis.kill().await;
        tokio::time::sleep(Duration::from_millis(millis / 3)).await;
        redis.restart().await.map_err(|e| e.to_string())?;
    }
    let mut totals = Totals::default();
    for mut child in children {
        let out = child.stdout.take().ok_or("no stdout")?;
        let handle = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = child.wait();
            line
        });
        let line = tokio::time::timeout(Duration::from_millis(millis + 60_000), handle)
            .await
            .map_err(|_| "a child did not finish")?
            .map_err(|e| e.to_string())?;
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if f.len() != 6 {
            return Err(format!("bad child line {line:?}"));
        }
        totals.sent += f[0];
        totals.ok += f[1];
        totals.errors += f[2];
        totals.trips += f[3];
        totals.store.push((f[4], f[5]));
    }
    let snap = server.snapshot();
    let used_windows = snap.windows.len().max(1) as u64;
    // The windows every process sent in from start to end: the children
    // start some milliseconds into window 0 (process start-up) and stop
    // that much into window `windows`, so those two are offered in part;
    // windows 1..windows are offered in full.
    let full: Vec<&rebound_test::quota::WindowStats> = snap
        .windows
        .iter()
        .filter(|w| w.index >= 1 && w.index < u64::from(windows))
        .collect();
    let full_accepted: u64 = full.iter().map(|w| w.accepted).sum();
    let full_quota = QUOTA * (full.len().max(1) as u64);
    let over = snap.windows.iter().map(|w| w.accepted).max().unwrap_or(0);
    if over > QUOTA {
        return Err(format!("the server admitted {over} in a window"));
    }
    println!(
        "| {name} | {} | {} ({:.2} %) | {:.1} % | {:.1} % | {} | {} | {:.3} |",
        snap.received,
        snap.rejected,
        100.0 * snap.rejected as f64 / snap.received.max(1) as f64,
        100.0 * snap.accepted as f64 / (QUOTA * used_windows) as f64,
        100.0 * full_accepted as f64 / full_quota as f64,
        totals.ok,
        totals.errors,
        totals.trips as f64 / totals.sent.max(1) as f64,
    );
    let per_window: Vec<u64> = snap.windows.iter().map(|w| w.rejected).collect();
    eprintln!("  {name}: 429s per window {per_window:?}");
    if shared {
        eprintln!(
            "  {name}: per process (store calls failed, fallbacks to local state) {:?}",
            totals.store
        );
    }
    Ok(())
}

/// A store that always grants a full lease and keeps nothing: for
/// counting the instructions of the happy path (a lease in hand), which
/// never calls the store.
#[derive(Debug)]
struct GrantAll;

impl rebound::shared::HostStore for GrantAll {
    fn lease(
        &self,
        _: rebound::shared::HostId,
        want: u64,
    ) -> rebound::shared::StoreFuture<rebound::shared::Lease> {
        Box::pin(async move {
            Ok(rebound::shared::Lease::Granted {
                granted: want,
                reset_in: Some(Duration::from_secs(3600)),
                window: 1,
            })
        })
    }
    fn give_back(
        &self,
        _: rebound::shared::HostId,
        _: u64,
        _: u64,
    ) -> rebound::shared::StoreFuture<()> {
        Box::pin(async { Ok(()) })
    }
    fn observe(
        &self,
        _: rebound::shared::HostId,
        _: rebound::shared::Observation,
    ) -> rebound::shared::StoreFuture<()> {
        Box::pin(async { Ok(()) })
    }
    fn pause(&self, _: rebound::shared::HostId, _: Duration) -> rebound::shared::StoreFuture<()> {
        Box::pin(async { Ok(()) })
    }
    fn watch(&self, _: rebound::shared::PauseSink) -> rebound::shared::StoreFuture<()> {
        Box::pin(std::future::pending())
    }
}

/// `--callgrind shared|local N`: N sequential requests through the local
/// pacer (`RateLimitLayer`) over `service_fn`, with or without the
/// `SharedStateLayer` in front, every response saying "plenty" in OpenAI's
/// headers; run under callgrind twice (N = 1000, 3000) for the happy
/// path's instructions per request (see BENCHMARKS.md).
fn callgrind(rt: &tokio::runtime::Runtime, shared: bool, n: u64) {
    use rebound::ratelimit::RateLimitLayer;
    use rebound::shared::SharedStateLayer;
    use tower::{service_fn, ServiceBuilder, ServiceExt};
    let inner = service_fn(|_req: http::Request<()>| async {
        let res = http::Response::builder()
            .header("x-ratelimit-limit-requests", "100000")
            .header("x-ratelimit-remaining-requests", "99999")
            .header("x-ratelimit-reset-requests", "1s")
            .body(())
            .unwrap();
        Ok::<_, std::convert::Infallible>(res)
    });
    let state = SharedState::new(Arc::new(GrantAll), SharedConfig::new());
    let svc = ServiceBuilder::new()
        .option_layer(shared.then(|| SharedStateLayer::new(state.clone())))
        .layer(RateLimitLayer::new())
        .service(inner);
    rt.block_on(async {
        for _ in 0..(100 + n) {
            let req = http::Request::get("https://api.example/v1")
                .body(())
                .unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            std::hint::black_box(res);
        }
    });
    eprintln!("round trips: {}", state.round_trips());
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(i) = args.iter().position(|a| a == "--fleet-child") {
        let (url, redis, millis) = (
            args[i + 1].clone(),
            args[i + 2].clone(),
            args[i + 3].parse().unwrap_or(1000),
        );
        rt.block_on(child(url, redis, millis));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == "--callgrind") {
        let shared = args[i + 1] == "shared";
        callgrind(&rt, shared, args[i + 2].parse().unwrap_or(1000));
        return ExitCode::SUCCESS;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let windows = if quick { 3 } else { 10 };
    println!(
        "{PROCESSES} processes × {CALLERS} callers, {QUOTA} requests per {WINDOW:?} window, {windows} windows\n"
    );
    println!("| fleet | server received | 429s (of received) | quota used, every window | quota used, windows 1–{} | callers' 200s | callers' errors | Redis round trips per request |", windows - 1);
    println!("|---|---|---|---|---|---|---|---|");
    let rows = [
        ("local only (no shared state)", false, false),
        ("shared (Redis)", true, false),
        ("shared, Redis killed 1/3 → 2/3", true, true),
    ];
    for (name, shared, kill) in rows {
        if let Err(e) = rt.block_on(row(name, windows, shared, kill)) {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
