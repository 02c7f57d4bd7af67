//! Loopback throughput and latency: clients in this process against the
//! bench server in another process on 127.0.0.1, HTTP/1.1 with keep-alive.
//!
//! Per round: latency at concurrency 1 (p50, p99), this process's
//! allocations per request (all the client's: the server lives elsewhere),
//! and requests per second and CPU per request at concurrency 64; see
//! [`run`] for how the passes are interleaved. Every column has its own
//! client (its own pool). The client runtime is multi-threaded with 2
//! workers.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use cpu_time::ProcessTime;
use http::{Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom as _;
use rand::SeedableRng as _;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt as _};

use crate::overhead::drain;
use crate::peers::{
    reqwest_client, reqwest_retry_client, tower_stack, Attempts, TOWER_LIMIT, TOWER_TIMEOUT,
};
use crate::report::{f, percentile, Checks, Samples, Table};
use crate::server::ServerProcess;
use crate::{allocations, Mode};
use tower::limit::ConcurrencyLimit;
use tower::retry::Retry;
use tower::timeout::Timeout;

/// Where a client sends its requests: the same URL as a `Uri` (for
/// hyper-based clients) and as a string (for reqwest, as its users write it).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) uri: Uri,
    pub(crate) url: String,
}

impl Target {
    pub(crate) fn new(server: &ServerProcess, path: &str) -> Result<Self, BoxError> {
        let url = format!("http://{}{path}", server.addr);
        Ok(Target {
            uri: url.parse()?,
            url,
        })
    }
}

/// A client that can send one GET, read the body to its end and say the
/// status. Generic (not boxed) so no column pays for an extra allocation.
pub(crate) trait Sender: Clone + Send + 'static {
    fn send<'a>(
        &'a mut self,
        t: &'a Target,
    ) -> impl Future<Output = Result<StatusCode, BoxError>> + Send + 'a;
}

/// Any tower service over `http` types: the bare hyper-util client, tower's
/// layers on it, and (later) rebound's client or stack.
#[derive(Debug, Clone)]
pub(crate) struct Tower<S>(pub(crate) S);

impl<S, RB> Sender for Tower<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    async fn send<'a>(&'a mut self, t: &'a Target) -> Result<StatusCode, BoxError> {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = t.uri.clone();
        let svc = self.0.ready().await.map_err(Into::into)?;
        let res = svc.call(req).await.map_err(Into::into)?;
        let status = res.status();
        drain(res.into_body()).await?;
        Ok(status)
    }
}

/// rebound's ready-made client, used the usual way: `client.send(req)`,
/// then the body read to its end. Counts attempts and retries the budget
/// refused (for the outage section) from the final response's annotations.
#[derive(Debug, Clone)]
pub(crate) struct Rebound {
    pub(crate) client: rebound::Client,
    pub(crate) counters: Option<std::sync::Arc<ReboundCounters>>,
}

/// What [`Rebound`] saw on final responses.
#[derive(Debug, Default)]
pub(crate) struct ReboundCounters {
    /// Attempts beyond the first (`Attempts` on the final response).
    pub(crate) retries: std::sync::atomic::AtomicU64,
    /// Requests whose last failed attempt could have been retried but the
    /// retry budget said no (`RetryStop::Budget` on the final response).
    pub(crate) refused: std::sync::atomic::AtomicU64,
}

impl Rebound {
    pub(crate) fn new(client: rebound::Client) -> Self {
        Rebound {
            client,
            counters: None,
        }
    }
}

impl Sender for Rebound {
    async fn send<'a>(&'a mut self, t: &'a Target) -> Result<StatusCode, BoxError> {
        let mut req = Request::new(rebound::Body::empty());
        *req.uri_mut() = t.uri.clone();
        let res = self.client.send(req).await?;
        let status = res.status();
        if let Some(c) = &self.counters {
            use std::sync::atomic::Ordering::Relaxed;
            let attempts = rebound::annotations::Attempts::of(res.extensions());
            c.retries.fetch_add(u64::from(attempts - 1), Relaxed);
            if res.extensions().get::<rebound::annotations::RetryStop>()
                == Some(&rebound::annotations::RetryStop::Budget)
            {
                c.refused.fetch_add(1, Relaxed);
            }
        }
        drain(res.into_body()).await?;
        Ok(status)
    }
}

/// reqwest, used the usual way: `client.get(url).send().await?.bytes()`.
#[derive(Debug, Clone)]
pub(crate) struct Reqwest(pub(crate) reqwest::Client);

impl Sender for Reqwest {
    async fn send<'a>(&'a mut self, t: &'a Target) -> Result<StatusCode, BoxError> {
        let res = self.0.get(&t.url).send().await?;
        let status = res.status();
        res.bytes().await?;
        Ok(status)
    }
}

/// reqwest-middleware (with whatever middleware it was built with).
#[derive(Debug, Clone)]
pub(crate) struct ReqwestMw(pub(crate) reqwest_middleware::ClientWithMiddleware);

impl Sender for ReqwestMw {
    async fn send<'a>(&'a mut self, t: &'a Target) -> Result<StatusCode, BoxError> {
        let res = self.0.get(&t.url).send().await?;
        let status = res.status();
        res.bytes().await?;
        Ok(status)
    }
}

/// The bare hyper-util legacy client, HTTP/1.1, `TCP_NODELAY` as reqwest
/// sets it.
pub(crate) fn hyper_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

type Fut<'a> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>>;

/// One column of the loopback table.
pub(crate) trait Column: Send {
    fn name(&self) -> &str;
    /// One request (boxed: used for latency, where every column pays the
    /// same box).
    fn one<'a>(&'a mut self, t: &'a Target) -> Fut<'a>;
    /// `n` requests in a row in one future (used to count allocations).
    fn batch<'a>(&'a mut self, t: &'a Target, n: usize) -> Fut<'a>;
    /// `tasks` tasks sending `per_task` requests each.
    fn concurrent<'a>(&'a mut self, t: &'a Target, tasks: usize, per_task: usize) -> Fut<'a>;
}

struct Col<C> {
    name: String,
    client: C,
}

fn expect_ok(name: &str, status: StatusCode) -> Result<(), BoxError> {
    if status == StatusCode::OK {
        Ok(())
    } else {
        Err(format!("{name}: status {status}").into())
    }
}

impl<C: Sender> Column for Col<C> {
    fn name(&self) -> &str {
        &self.name
    }

    fn one<'a>(&'a mut self, t: &'a Target) -> Fut<'a> {
        Box::pin(async move { expect_ok(&self.name, self.client.send(t).await?) })
    }

    fn batch<'a>(&'a mut self, t: &'a Target, n: usize) -> Fut<'a> {
        Box::pin(async move {
            for _ in 0..n {
                expect_ok(&self.name, self.client.send(t).await?)?;
            }
            Ok(())
        })
    }

    fn concurrent<'a>(&'a mut self, t: &'a Target, tasks: usize, per_task: usize) -> Fut<'a> {
        Box::pin(async move {
            let mut set = JoinSet::new();
            for _ in 0..tasks {
                let mut client = self.client.clone();
                let t = t.clone();
                let name = self.name.clone();
                set.spawn(async move {
                    for _ in 0..per_task {
                        expect_ok(&name, client.send(&t).await?)?;
                    }
                    Ok::<_, BoxError>(())
                });
            }
            while let Some(done) = set.join_next().await {
                done??;
            }
            Ok(())
        })
    }
}

/// A loopback column from any [`Sender`].
pub(crate) fn column<C: Sender>(name: &str, client: C) -> Box<dyn Column> {
    Box::new(Col {
        name: name.to_owned(),
        client,
    })
}

fn columns() -> Result<Vec<Box<dyn Column>>, BoxError> {
    // Each column has its own client and so its own connection pool: a
    // shared pool would hand one column the connection another just warmed.
    Ok(vec![
        column("bare hyper-util client (baseline)", Tower(hyper_client())),
        // A/A control: the baseline again, as its own column. Its ratios
        // show how far apart two identical columns land in this run.
        column(
            "bare hyper-util client again (A/A control)",
            Tower(hyper_client()),
        ),
        column(
            "tower: ConcurrencyLimit + Retry(3) + Timeout on it",
            Tower(tower_stack(hyper_client(), Attempts::new(3))),
        ),
        // tower's stack split in two: where its cost on the wire comes from
        // (a timer armed per request is the larger part at c=1).
        column(
            "tower: Timeout alone on it",
            Tower(Timeout::new(hyper_client(), TOWER_TIMEOUT)),
        ),
        column(
            "tower: ConcurrencyLimit + Retry(3) alone on it",
            Tower(ConcurrencyLimit::new(
                Retry::new(Attempts::new(3), hyper_client()),
                TOWER_LIMIT,
            )),
        ),
        column("reqwest", Reqwest(reqwest_client()?)),
        column(
            "reqwest-middleware + reqwest-retry (1+3)",
            ReqwestMw(reqwest_retry_client(3)?),
        ),
        column(
            "rebound::Client (defaults)",
            Rebound::new(rebound::Client::builder().build()?),
        ),
    ])
}

const TASKS: usize = 64;

/// Drops the columns `--filter` leaves out; the baseline (first) stays.
fn keep(cols: &mut Vec<Box<dyn Column>>, mode: Mode) {
    let mut i = 0;
    cols.retain(|c| {
        i += 1;
        i == 1 || mode.keeps(c.name())
    });
}

/// Runs the section and prints its table.
///
/// Each round has three passes, each over every column in a shuffled order
/// (a fixed seed; so no column always runs first or after the same
/// neighbour):
///
/// 1. latency at concurrency 1, interleaved **per request** (A B C, C A B, …,
///    reshuffled every time), so a burst of noise from the machine's other
///    jobs hits every column alike; p50 and p99 per column and round;
/// 2. allocations: `n_alloc` requests in a row per column, counted;
/// 3. throughput at concurrency 64: `64 × per_task` requests per column,
///    and this process's CPU time per request over that pass (all of it is
///    the client's: the server is another process), which preemption by
///    other jobs does not inflate.
pub(crate) fn run(mode: Mode) -> Result<Checks, BoxError> {
    let rounds: usize = mode.pick(3, 25);
    let n1: usize = mode.pick(50, 1_000);
    let n_alloc: usize = mode.pick(50, 500);
    let per_task: usize = mode.pick(5, 100);
    let budget = mode.pick(Duration::from_secs(10), Duration::from_secs(240));
    let pass_limit = Duration::from_secs(60);

    let server = ServerProcess::spawn(budget * 2 + Duration::from_secs(60))?;
    let target = Target::new(&server, "/ok")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let (cols, p50, p99, rps, cpu, allocs) = rt.block_on(async {
        let mut cols = columns()?;
        keep(&mut cols, mode);
        let k = cols.len();
        let (mut p50, mut p99, mut rps, mut cpu, mut allocs) = (
            vec![Samples::default(); k],
            vec![Samples::default(); k],
            vec![Samples::default(); k],
            vec![Samples::default(); k],
            vec![Samples::default(); k],
        );
        // Warm up: open the 64 connections of each pool once.
        for col in &mut cols {
            tokio::time::timeout(pass_limit, col.concurrent(&target, TASKS, 2)).await??;
            tokio::time::timeout(pass_limit, col.batch(&target, n_alloc.min(100))).await??;
        }
        let mut lat = vec![Vec::with_capacity(n1); k];
        let start = Instant::now();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut order: Vec<usize> = (0..k).collect();
        for round in 0..rounds {
            for l in &mut lat {
                l.clear();
            }
            tokio::time::timeout(pass_limit, async {
                for _ in 0..n1 {
                    order.shuffle(&mut rng);
                    for &i in &order {
                        let one = cols[i].one(&target);
                        let t0 = Instant::now();
                        one.await?;
                        lat[i].push(t0.elapsed().as_nanos() as u64);
                    }
                }
                Ok::<_, BoxError>(())
            })
            .await??;
            for (i, l) in lat.iter_mut().enumerate() {
                l.sort_unstable();
                p50[i].0.push(percentile(l, 50.0) as f64);
                p99[i].0.push(percentile(l, 99.0) as f64);
            }

            order.shuffle(&mut rng);
            for &i in &order {
                let batch = cols[i].batch(&target, n_alloc);
                let a0 = allocations();
                tokio::time::timeout(pass_limit, batch).await??;
                let a1 = allocations();
                allocs[i].0.push((a1 - a0) as f64 / n_alloc as f64);
            }

            order.shuffle(&mut rng);
            for &i in &order {
                let t0 = Instant::now();
                let c0 = ProcessTime::now();
                tokio::time::timeout(pass_limit, cols[i].concurrent(&target, TASKS, per_task))
                    .await??;
                let requests = (TASKS * per_task) as f64;
                cpu[i].0.push(c0.elapsed().as_nanos() as f64 / requests);
                rps[i].0.push(requests / t0.elapsed().as_secs_f64());
            }
            if round >= 2 && start.elapsed() > budget {
                break;
            }
        }
        Ok::<_, BoxError>((cols, p50, p99, rps, cpu, allocs))
    })?;
    drop(server);

    let mut table = Table::new(
        format!(
            "Loopback, HTTP/1.1 on 127.0.0.1, server in another process ({} rounds; per column and round: c=1 {n1} requests, allocations over {n_alloc}, c=64 {} requests)",
            p50[0].0.len(),
            TASKS * per_task
        ),
        &[
            "column",
            "c=1 p50 µs",
            "p50 × bare",
            "c=1 p99 µs",
            "p99 × bare",
            "c=64 req/s",
            "req/s × bare",
            "c=64 CPU µs/req",
            "CPU × bare",
            "allocs/req",
        ],
    );
    for (i, col) in cols.iter().enumerate() {
        table.row(vec![
            col.name().to_owned(),
            f(p50[i].median() / 1e3, 1),
            f(p50[i].ratio_to(&p50[0]), 3),
            f(p99[i].median() / 1e3, 1),
            f(p99[i].ratio_to(&p99[0]), 2),
            f(rps[i].median(), 0),
            f(rps[i].ratio_to(&rps[0]), 3),
            f(cpu[i].median() / 1e3, 2),
            f(cpu[i].ratio_to(&cpu[0]), 3),
            f(allocs[i].median(), 1),
        ]);
    }
    table.print();

    let mut checks = Checks::default();
    checks.check(
        "every column completed every round",
        p50.iter().all(|s| s.0.len() == p50[0].0.len()),
    );
    checks.print();
    Ok(checks)
}
