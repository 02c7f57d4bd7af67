//! Clients against overload (issue 22): an upstream that queues, two hosts
//! one of which is slowed, a fixed-capacity upstream offered ten times what
//! it takes, and the recovery after a slow phase. One
//! [`QueueingServer`](rebound_test::queueing::QueueingServer) per row.
//!
//! ```text
//! cargo bench --bench overload            # ~1.5 min
//! cargo bench --bench overload -- --quick # ~30 s
//! ```
//!
//! **Queueing server at 4× capacity**: 16 workers × 20 ms (capacity 800/s),
//! 64 closed-loop callers. Throughput is what the server completed per
//! second of the measured run (after a warm-up) against its capacity; the
//! p99 is the server's (arrival to answer: its queue plus its service),
//! against the 20 ms it takes unloaded. The callers' own p99 is printed
//! too, but with 64 closed-loop callers it is ~64/throughput whatever the
//! client does (Little's law): a limit moves the queue from the server to
//! the client, where a deadline can see it, it does not shorten it.
//!
//! **Two hosts, one slowed 10×**: 8 workers × 20 ms each, 24 callers each;
//! the fast host's throughput with the slow one beside it against its
//! throughput alone, per-host limit (the client's default) and one limiter
//! shared by both hosts.
//!
//! **Throttling**: a fixed-capacity server (4 workers × 20 ms,
//! `queue_bound(0)`: 503 past capacity; capacity 200/s) offered ~10× that
//! (40 callers, 20 ms pause between calls), one attempt per call, no
//! breaker. The target `(K + 0.2) × accepted` needs a server of fixed
//! capacity: one that refuses a random 90 % of whatever arrives receives
//! 10× what it accepts whatever the client sends.
//!
//! **Recovery**: the gradient client on the queueing server (16 × 20 ms,
//! 64 callers): the limit after 3 s, then 3 s at 10× the latency, then
//! the time until the limit is back within 10 % of its earlier level.
//!
//! Real time on a loopback socket, 2 shared cores: the figures vary with
//! the machine's load. Not run in CI.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use rebound::limit::{AdaptiveLimiter, Gradient, HostLimiters};
use rebound::throttle::ClientThrottle;
use rebound::{Client, ClientBuilder, ErrorKind};
use rebound_test::queueing::QueueingServer;
use tokio::task::JoinSet;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const LATENCY: Duration = Duration::from_millis(20);

#[derive(Clone, Copy)]
struct Times {
    warm: Duration,
    run: Duration,
}

/// Closed-loop callers on `url` until `stop`; each caller's latencies (ms)
/// of calls that started after `measure_from`.
fn callers(
    client: &Client,
    url: String,
    n: usize,
    pause: Option<Duration>,
    stop: Arc<AtomicBool>,
    measure_from: Instant,
    set: &mut JoinSet<(Vec<f64>, u64)>,
) {
    for _ in 0..n {
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        set.spawn(async move {
            let (mut lat, mut shed) = (Vec::new(), 0);
            // Bounded: at most this many calls per caller.
            for _ in 0..1_000_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let t0 = Instant::now();
                match client.get(url.as_str()).await {
                    Ok(res) => {
                        let _ = res.into_body().collect().await;
                        if t0 >= measure_from {
                            lat.push(t0.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::ClientThrottled => shed += 1,
                    Err(_) => {}
                }
                if let Some(p) = pause {
                    tokio::time::sleep(p).await;
                }
            }
            (lat, shed)
        });
    }
}

async fn join(set: &mut JoinSet<(Vec<f64>, u64)>) -> Result<(Vec<f64>, u64), BoxError> {
    let (mut all, mut shed) = (Vec::new(), 0);
    let out = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(done) = set.join_next().await {
            let (lat, s) = done?;
            all.extend(lat);
            shed += s;
        }
        Ok::<_, BoxError>(())
    })
    .await;
    out.map_err(|_| "callers did not finish in 60 s")??;
    Ok((all, shed))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

// ---- 1. queueing server at 4× capacity ----

async fn four_times(name: &str, builder: ClientBuilder, t: Times) -> Result<(), BoxError> {
    const WORKERS: usize = 16;
    let server = QueueingServer::builder()
        .workers(WORKERS)
        .latency(LATENCY)
        .start()
        .await;
    let client = builder.total_timeout(Duration::from_secs(30)).build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let measure_from = start + t.warm;
    let mut set = JoinSet::new();
    callers(
        &client,
        server.url("/work"),
        4 * WORKERS,
        None,
        stop.clone(),
        measure_from,
        &mut set,
    );
    tokio::time::sleep_until(measure_from).await;
    server.reset_latency();
    let done0 = server.snapshot().completed;
    tokio::time::sleep(t.run).await;
    let snap = server.snapshot();
    stop.store(true, Ordering::Relaxed);
    let (mut lat, _) = join(&mut set).await?;
    let capacity = WORKERS as f64 / LATENCY.as_secs_f64();
    let throughput = (snap.completed - done0) as f64 / t.run.as_secs_f64();
    println!(
        "| {name} | {:.0} / {capacity:.0} = **{:.0} %** | {:.1} ms = **{:.2}×** | {:.1} ms | {} |",
        throughput,
        100.0 * throughput / capacity,
        snap.latency.p99.as_secs_f64() * 1e3,
        snap.latency.p99.as_secs_f64() / LATENCY.as_secs_f64(),
        pct(&mut lat, 0.99),
        snap.queue_max,
    );
    Ok(())
}

// ---- 2. two hosts, one slowed ----

/// The fast host's completions per second, with the slow host beside it
/// (`slow`) or alone.
async fn two_hosts(builder: ClientBuilder, slow: bool, t: Times) -> Result<f64, BoxError> {
    const WORKERS: usize = 8;
    let fast = QueueingServer::builder()
        .workers(WORKERS)
        .latency(LATENCY)
        .start()
        .await;
    let other = QueueingServer::builder()
        .workers(WORKERS)
        .latency(LATENCY * 10)
        .start()
        .await;
    let client = builder.total_timeout(Duration::from_secs(30)).build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let measure_from = Instant::now() + t.warm;
    let mut set = JoinSet::new();
    callers(
        &client,
        fast.url("/work"),
        3 * WORKERS,
        None,
        stop.clone(),
        measure_from,
        &mut set,
    );
    if slow {
        callers(
            &client,
            other.url("/work"),
            3 * WORKERS,
            None,
            stop.clone(),
            measure_from,
            &mut set,
        );
    }
    tokio::time::sleep_until(measure_from).await;
    let done0 = fast.snapshot().completed;
    tokio::time::sleep(t.run).await;
    let done = fast.snapshot().completed - done0;
    stop.store(true, Ordering::Relaxed);
    join(&mut set).await?;
    Ok(done as f64 / t.run.as_secs_f64())
}

// ---- 3. throttling ----

async fn throttling(
    name: &str,
    throttle: Option<ClientThrottle>,
    t: Times,
) -> Result<(), BoxError> {
    const WORKERS: usize = 4;
    let server = QueueingServer::builder()
        .workers(WORKERS)
        .latency(LATENCY)
        .queue_bound(0)
        .start()
        .await;
    let client = Client::builder()
        .max_attempts(1)
        .circuit_breaker(None)
        .adaptive_limit(None)
        .client_throttle(throttle)
        .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut set = JoinSet::new();
    callers(
        &client,
        server.url("/work"),
        10 * WORKERS,
        Some(LATENCY),
        stop.clone(),
        start,
        &mut set,
    );
    tokio::time::sleep(t.warm + t.run).await;
    stop.store(true, Ordering::Relaxed);
    let (_, shed) = join(&mut set).await?;
    let snap = server.snapshot();
    println!(
        "| {name} | {} | {} | **{:.2}×** | {shed} |",
        snap.received,
        snap.accepted,
        snap.received as f64 / snap.accepted.max(1) as f64,
    );
    Ok(())
}

// ---- 4. recovery ----

async fn recovery(t: Times) -> Result<(), BoxError> {
    const WORKERS: usize = 16;
    let server = QueueingServer::builder()
        .workers(WORKERS)
        .latency(LATENCY)
        .start()
        .await;
    let hosts = Arc::new(HostLimiters::try_new(Gradient::default(), 16)?);
    let client = Client::builder()
        .adaptive_host_limiters(hosts.clone())
        .total_timeout(Duration::from_secs(30))
        .build()?;
    let url = server.url("/work");
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    callers(
        &client,
        url.clone(),
        4 * WORKERS,
        None,
        stop.clone(),
        Instant::now(),
        &mut set,
    );
    tokio::time::sleep(t.warm.max(Duration::from_secs(3))).await;
    let limiter = hosts.get(&url.parse()?).ok_or("no limiter for the host")?;
    let before = limiter.current_limit();
    server.set_latency(LATENCY * 10);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let slow = limiter.current_limit();
    server.set_latency(LATENCY);
    let since = Instant::now();
    let mut back = None;
    // Bounded: 10 s of 20 ms checks.
    for _ in 0..500 {
        if limiter.current_limit() * 10 >= before * 9 {
            back = Some(since.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    join(&mut set).await?;
    println!(
        "| gradient (per host) | {before} | {slow} | {} |",
        match back {
            Some(d) => format!("**{:.2} s**", d.as_secs_f64()),
            None => "not within 10 s".into(),
        }
    );
    Ok(())
}

async fn all(t: Times) -> Result<(), BoxError> {
    println!("\n## Queueing server, 16 workers × 20 ms, 64 callers (4× capacity)\n");
    println!("| client | throughput / capacity | server p99 / no-load | callers' p99 | server queue max |");
    println!("|---|---:|---:|---:|---:|");
    four_times(
        "gradient (adaptive_limit(Gradient::default()))",
        Client::builder().adaptive_limit(Gradient::default()),
        t,
    )
    .await?;
    four_times("AIMD (default)", Client::builder(), t).await?;
    four_times(
        "no limit (adaptive_limit(None))",
        Client::builder().adaptive_limit(None),
        t,
    )
    .await?;

    println!("\n## Two hosts, 8 workers × 20 ms each, one slowed 10×, 24 callers each\n");
    println!("| client | fast host alone | beside the slow host | ratio |");
    println!("|---|---:|---:|---:|");
    type Make = fn() -> ClientBuilder;
    let rows: [(&str, Make); 2] = [
        ("gradient, per host (default)", || {
            Client::builder().adaptive_limit(Gradient::default())
        }),
        ("gradient, one limiter for both hosts", || {
            Client::builder().adaptive_limiter(Arc::new(
                AdaptiveLimiter::try_new(Gradient::default()).expect("valid"),
            ))
        }),
    ];
    for (name, make) in rows {
        let solo = two_hosts(make(), false, t).await?;
        let beside = two_hosts(make(), true, t).await?;
        println!(
            "| {name} | {solo:.0}/s | {beside:.0}/s | **{:.1} %** |",
            100.0 * beside / solo
        );
    }

    println!("\n## Fixed capacity (4 workers × 20 ms, queue_bound(0)), ~10× offered\n");
    println!("| client | server received | accepted | received / accepted | shed locally |");
    println!("|---|---:|---:|---:|---:|");
    throttling("throttling off (default)", None, t).await?;
    throttling(
        "client_throttle(ClientThrottle::default()) (K = 2)",
        Some(ClientThrottle::default()),
        t,
    )
    .await?;

    println!("\n## Recovery after 3 s at 10× latency (16 workers, 64 callers)\n");
    println!(
        "| client | limit before | limit at the end of the slow phase | back within 10 % after |"
    );
    println!("|---|---:|---:|---:|");
    recovery(t).await?;
    Ok(())
}

fn main() -> ExitCode {
    let quick = std::env::args().any(|a| a == "--quick");
    let t = if quick {
        Times {
            warm: Duration::from_secs(1),
            run: Duration::from_secs(2),
        }
    } else {
        Times {
            warm: Duration::from_secs(2),
            run: Duration::from_secs(5),
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "overload bench{}: warm-up {:?}, measured {:?} per row",
        if quick { " (--quick)" } else { "" },
        t.warm,
        t.run
    );
    match rt.block_on(all(t)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
