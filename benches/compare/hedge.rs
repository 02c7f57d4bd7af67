//! Tail: an upstream (the bench server's `/tail`) where 1 % of answers take
//! 1 s and the rest about 1 ms, against no hedging, tower's `Hedge` and
//! rebound's hedging.
//!
//! Slowness belongs to the **attempt**, not the request: the first arrival
//! of every hundredth request id is slow, a second copy of it is fast (a
//! copy that reaches a healthy replica, or misses the GC pause). Columns,
//! each with its own connection pool, in interleaved rounds:
//!
//! * **all fast** — no slow answers at all, no hedging: the reference p99;
//! * **no hedging** — rebound's client with its defaults (hedging off);
//! * **tower Hedge** — `tower::hedge::Hedge` (p97, 100 samples, 1 s
//!   period) over the bare hyper-util client, behind a `Buffer` (its
//!   service is not `Clone`, and one per task would split its histogram).
//!   Its histogram holds whole milliseconds, rounded up, so its delay is a
//!   whole number of milliseconds;
//! * **rebound hedge** — rebound's client with
//!   `.hedge(HedgePolicy::percentile(0.97).min_samples(100).period(1 s))`.
//!
//! Both hedging columns warm up for a little over one period before each
//! measured pass, so their estimators hold a full period. Reported per
//! column: p50, p99, p99.9 over all measured requests, the extra requests
//! the server received (hedges), and rebound's targets: p99.9 ≤ 3× the
//! all-fast p99, ≤ 5 % extra requests, no worse than tower's `Hedge`.
//! The quick mode (CI) checks exact counts only: every answer a 200, the
//! server saw exactly the requests of the unhedged columns and exactly one
//! slow answer per hundred ids, and never more than requests plus hedges.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use rebound::hedge::HedgePolicy;
use rebound::Hedged;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::buffer::Buffer;
use tower::{BoxError, Service, ServiceExt as _};

use crate::loopback::hyper_client;
use crate::overhead::drain;
use crate::report::{f, percentile, Checks, Table};
use crate::server::ServerProcess;
use crate::Mode;

/// The percentile both hedging columns hedge at.
const PERCENTILE: f64 = 0.97;
/// Their minimum sample and histogram period.
const MIN_SAMPLES: u64 = 100;
const PERIOD: Duration = Duration::from_secs(1);
/// Warm-up before each measured pass of a hedging column.
const WARM_UP: Duration = Duration::from_millis(1_200);

/// Request ids, unique over the run.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

type Req = Request<Full<Bytes>>;

/// tower's hedge policy: hedge every request, count the hedges.
#[derive(Clone)]
struct TowerPolicy(Arc<AtomicU64>);

impl tower::hedge::Policy<Req> for TowerPolicy {
    fn clone_request(&self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _req: &Req) -> bool {
        self.0.fetch_add(1, Relaxed);
        true
    }
}

type TowerHedge =
    Buffer<Req, <tower::hedge::Hedge<HyperClient, TowerPolicy> as Service<Req>>::Future>;
type HyperClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// One column's client.
#[derive(Clone)]
enum Client {
    Rebound(rebound::Client),
    Tower(TowerHedge),
}

/// What one request saw: its status and whether (and how many) hedges
/// rebound reports for it.
async fn one(
    client: &mut Client,
    uri: &Uri,
    id: Option<u64>,
) -> Result<(StatusCode, u64), BoxError> {
    let id = id.map_or(HeaderValue::from_static("fast"), HeaderValue::from);
    match client {
        Client::Rebound(c) => {
            let mut req = Request::new(rebound::Body::empty());
            *req.uri_mut() = uri.clone();
            req.headers_mut().insert("x-tail-id", id);
            let res = c.send(req).await?;
            let hedges = res
                .extensions()
                .get::<Hedged>()
                .map_or(0, |h| u64::from(h.copies - 1));
            let status = res.status();
            drain(res.into_body()).await?;
            Ok((status, hedges))
        }
        Client::Tower(svc) => {
            let mut req = Request::new(Full::new(Bytes::new()));
            *req.uri_mut() = uri.clone();
            req.headers_mut().insert("x-tail-id", id);
            let res = svc.ready().await?.call(req).await?;
            let status = res.status();
            drain(res.into_body()).await?;
            Ok((status, 0))
        }
    }
}

/// What a pass saw.
#[derive(Default)]
struct Pass {
    /// Latency of each request, µs.
    latencies: Vec<u64>,
    not_ok: u64,
    /// Ids that are multiples of 100 (slow on first arrival).
    slow_ids: u64,
    /// Hedges rebound reported.
    hedges: u64,
}

/// `tasks` tasks send requests until `total` were sent or (if given) `for_at_most`
/// has passed; ids are drawn unless `all_fast`.
async fn pass(
    client: &Client,
    uri: &Uri,
    tasks: usize,
    total: u64,
    for_at_most: Option<Duration>,
    all_fast: bool,
) -> Result<Pass, BoxError> {
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let mut client = client.clone();
        let uri = uri.clone();
        let sent = sent.clone();
        set.spawn(async move {
            let mut p = Pass::default();
            while sent.fetch_add(1, Relaxed) < total
                && for_at_most.is_none_or(|d| start.elapsed() < d)
            {
                let id = (!all_fast).then(|| NEXT_ID.fetch_add(1, Relaxed));
                p.slow_ids += u64::from(id.is_some_and(|id| id % 100 == 0));
                let t = Instant::now();
                let (status, hedges) = one(&mut client, &uri, id).await?;
                p.latencies.push(t.elapsed().as_micros() as u64);
                p.not_ok += u64::from(status != StatusCode::OK);
                p.hedges += hedges;
            }
            Ok::<_, BoxError>(p)
        });
    }
    let mut all = Pass::default();
    while let Some(p) = set.join_next().await {
        let p = p??;
        all.latencies.extend(p.latencies);
        all.not_ok += p.not_ok;
        all.slow_ids += p.slow_ids;
        all.hedges += p.hedges;
    }
    Ok(all)
}

/// A counter of the bench server (`/__count`, `/__slow`).
async fn counter(server: &ServerProcess, path: &str) -> Result<u64, BoxError> {
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = format!("http://{}{path}", server.addr).parse()?;
    let res = hyper_client().request(req).await?;
    let body = res.into_body().collect().await?.to_bytes();
    Ok(std::str::from_utf8(&body)?.trim().parse()?)
}

/// One column and what its passes added up to.
struct Column {
    name: &'static str,
    client: Client,
    hedging: bool,
    all_fast: bool,
    tower_hedges: Option<Arc<AtomicU64>>,
    latencies: Vec<u64>,
    /// (p99, p99.9) of each round's pass, ms.
    per_round: Vec<(f64, f64)>,
    requests: u64,
    received: u64,
    hedges: u64,
}

pub(crate) fn run(mode: Mode) -> Result<Checks, BoxError> {
    let per_pass: u64 = mode.pick(300, 4_000);
    let rounds = mode.pick(1, 5);
    let tasks = mode.pick(8, 16);
    let server = ServerProcess::spawn(Duration::from_secs(mode.pick(300, 1_800)))?;
    let uri: Uri = format!("http://{}/tail", server.addr).parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut checks = Checks::default();
    let columns = rt.block_on(async {
        let plain = || rebound::Client::builder().build().map(Client::Rebound);
        let tower_hedges = Arc::new(AtomicU64::new(0));
        let tower = {
            let hedge = tower::hedge::Hedge::new(
                hyper_client(),
                TowerPolicy(tower_hedges.clone()),
                MIN_SAMPLES,
                // A quantile, as `value_at_quantile` takes it (tower's own
                // tests pass 0.9): not a percent.
                PERCENTILE as f32,
                PERIOD,
            );
            Client::Tower(Buffer::new(hedge, 1024))
        };
        let rebound = rebound::Client::builder()
            .hedge(
                HedgePolicy::percentile(PERCENTILE)
                    .min_samples(MIN_SAMPLES)
                    .period(PERIOD),
            )
            .build()?;
        let column = |name, client, hedging, all_fast, tower_hedges| Column {
            name,
            client,
            hedging,
            all_fast,
            tower_hedges,
            latencies: Vec::new(),
            per_round: Vec::new(),
            requests: 0,
            received: 0,
            hedges: 0,
        };
        let mut columns = vec![
            column("all fast (no slow answers)", plain()?, false, true, None),
            column(
                "no hedging (rebound, defaults)",
                plain()?,
                false,
                false,
                None,
            ),
            column("tower Hedge p97", tower, true, false, Some(tower_hedges)),
            column(
                "rebound hedge p97",
                Client::Rebound(rebound),
                true,
                false,
                None,
            ),
        ];
        for round in 0..rounds {
            // Interleaved, each round in another order.
            let n = columns.len();
            for k in 0..n {
                let c = &mut columns[(k + round) % n];
                if !mode.keeps(c.name) && !c.all_fast {
                    continue;
                }
                if c.hedging {
                    pass(&c.client, &uri, tasks, 50_000, Some(WARM_UP), false).await?;
                }
                let tower_before = c.tower_hedges.as_ref().map(|h| h.load(Relaxed));
                let received = counter(&server, "/__count").await?;
                let slow = counter(&server, "/__slow").await?;
                let p = pass(&c.client, &uri, tasks, per_pass, None, c.all_fast).await?;
                let received = counter(&server, "/__count").await? - received;
                let slow = counter(&server, "/__slow").await? - slow;
                let hedges = match (&c.tower_hedges, tower_before) {
                    (Some(h), Some(before)) => h.load(Relaxed) - before,
                    _ => p.hedges,
                };
                let requests = p.latencies.len() as u64;
                checks.check(
                    format!("{}: every answer a 200 (round {round})", c.name),
                    p.not_ok == 0 && requests == per_pass,
                );
                if c.hedging {
                    checks.check(
                        format!(
                            "{}: requests <= received <= requests + hedges (round {round})",
                            c.name
                        ),
                        requests <= received && received <= requests + hedges,
                    );
                } else {
                    checks.check(
                        format!(
                            "{}: the server received exactly the requests (round {round})",
                            c.name
                        ),
                        received == requests,
                    );
                    checks.check(
                        format!(
                            "{}: one slow answer per hundred ids (round {round})",
                            c.name
                        ),
                        slow == p.slow_ids,
                    );
                }
                let mut sorted = p.latencies.clone();
                sorted.sort_unstable();
                let ms = |q: f64| percentile(&sorted, q) as f64 / 1000.0;
                c.per_round.push((ms(99.0), ms(99.9)));
                c.latencies.extend(p.latencies);
                c.requests += requests;
                c.received += received;
                c.hedges += hedges;
            }
        }
        Ok::<_, BoxError>(columns)
    })?;

    let mut table = Table::new(
        format!(
            "hedge: tail latency, 1 % of answers take 1 s ({tasks} tasks, {per_pass} requests per column per round, {rounds} round(s))"
        ),
        &[
            "column",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "extra requests",
            "p99.9 / all-fast p99",
            "p99.9 / tower's",
        ],
    );
    // Ratios per round (both columns measured in the same round), median
    // over rounds, as the other sections do; percentiles over all rounds.
    let ratio = |a: &Column, b: Option<&Column>, pick: fn(&(f64, f64)) -> f64| -> f64 {
        let Some(b) = b.filter(|b| b.per_round.len() == a.per_round.len()) else {
            return f64::NAN;
        };
        let mut r: Vec<f64> = a
            .per_round
            .iter()
            .zip(&b.per_round)
            .map(|(x, y)| x.1 / pick(y))
            .collect();
        crate::report::median(&mut r)
    };
    let fast = columns.iter().find(|c| c.all_fast);
    let tower = columns.iter().find(|c| c.tower_hedges.is_some());
    let mut figures = Vec::new();
    for c in &columns {
        if c.requests == 0 {
            continue;
        }
        let mut sorted = c.latencies.clone();
        sorted.sort_unstable();
        let ms = |p: f64| percentile(&sorted, p) as f64 / 1000.0;
        let (p50, p99, p999) = (ms(50.0), ms(99.0), ms(99.9));
        let extra = (c.received as f64 - c.requests as f64) / c.requests as f64 * 100.0;
        let to_fast = ratio(c, fast, |x| x.0);
        let to_tower = ratio(c, tower, |x| x.1);
        table.row(vec![
            c.name.to_owned(),
            f(p50, 2),
            f(p99, 2),
            f(p999, 2),
            format!("{} %", f(extra, 2)),
            f(to_fast, 2),
            f(to_tower, 2),
        ]);
        figures.push((c.name, to_fast, to_tower, extra));
    }
    table.print();
    let get = |name: &str| figures.iter().find(|(n, ..)| n.starts_with(name)).copied();
    if let (Some((_, r_fast, r_tower, rextra)), Some((.., textra))) = (get("rebound"), get("tower"))
    {
        println!(
            "\nrebound's targets (reported, not judged): p99.9 <= 3x all-fast p99: {} ({}x); \
             extra <= 5 %: {} ({} %); no worse than tower's Hedge at equal extra load: {} \
             (p99.9 {}x tower's, at {} vs {} % extra)",
            yes(r_fast <= 3.0),
            f(r_fast, 2),
            yes(rextra <= 5.0),
            f(rextra, 2),
            yes(r_tower <= 1.0 && rextra <= textra + 0.5),
            f(r_tower, 2),
            f(rextra, 2),
            f(textra, 2),
        );
    }

    // The happy path: what turning hedging on costs a request that answers
    // before its delay (a fixed 1 s hedge against `/ok`, which answers at
    // once), sequential, beside the same client with hedging off.
    let n = mode.pick(50, 2_000);
    let ok: Uri = format!("http://{}/ok", server.addr).parse()?;
    let (allocs, micros) = rt.block_on(async {
        let off = Client::Rebound(rebound::Client::builder().build()?);
        let on = Client::Rebound(
            rebound::Client::builder()
                .hedge(HedgePolicy::fixed(Duration::from_secs(1)))
                .build()?,
        );
        let mut allocs = [Vec::new(), Vec::new()];
        let mut micros = [Vec::new(), Vec::new()];
        for round in 0..mode.pick(2, 9) {
            for k in 0..2 {
                let i = (k + round) % 2;
                let mut c = if i == 0 { off.clone() } else { on.clone() };
                // Warm the pool.
                one(&mut c, &ok, None).await?;
                let a0 = crate::allocations();
                let t = Instant::now();
                for _ in 0..n {
                    let (status, hedges) = one(&mut c, &ok, None).await?;
                    if status != StatusCode::OK || hedges != 0 {
                        return Err::<_, BoxError>("happy path: not a plain 200".into());
                    }
                }
                micros[i].push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
                allocs[i].push((crate::allocations() - a0) as f64 / n as f64);
            }
        }
        Ok((allocs, micros))
    })?;
    let med = |v: &[f64]| crate::report::median(&mut v.to_vec());
    let mut table = Table::new(
        "hedge: the happy path (answers before the delay), sequential, per request",
        &["client", "allocations", "µs (loopback, sequential)"],
    );
    table.row(vec![
        "rebound, hedging off".to_owned(),
        f(med(&allocs[0]), 1),
        f(med(&micros[0]), 1),
    ]);
    table.row(vec![
        "rebound, hedge fixed(1 s)".to_owned(),
        f(med(&allocs[1]), 1),
        f(med(&micros[1]), 1),
    ]);
    table.print();
    checks.print();
    Ok(checks)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
