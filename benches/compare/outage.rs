//! Outage amplification and retries allowed under light failure, against
//! the bench server in another process.
//!
//! * **Outage**: every request gets a 503. Each column sends `m` logical
//!   requests one after the other; the server counts what it received.
//!   Amplification = requests received ÷ logical requests sent (1.0 = no
//!   retry at all; a client making 3 attempts per request gives 3.0).
//! * **1 % failure**: the server answers 503 to 1 % of requests (a fixed
//!   pseudo-random sequence). Share of retries allowed = retries made ÷
//!   retries the policy wanted (failed attempts with attempts left): what a
//!   retry budget costs when nothing is really wrong.
//!
//! The figures are counts, not timings, so one round is enough; the wall
//! time per logical request is printed for information.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use tokio::time::Instant;
use tower::retry::budget::TpsBudget;
use tower::BoxError;

use rebound::{Backoff, RetryBudget};

use crate::loopback::{hyper_client, Rebound, ReboundCounters, ReqwestMw, Sender, Target, Tower};
use crate::peers::{reqwest_retry_client, tower_stack, Attempts, RetryCounters};
use crate::report::{f, Checks, Table};
use crate::server::ServerProcess;
use crate::Mode;

/// How many requests the server has received on its counted paths.
async fn received(server: &ServerProcess) -> Result<u64, BoxError> {
    let mut req = Request::new(Full::new(Bytes::new()));
    *req.uri_mut() = format!("http://{}/__count", server.addr).parse()?;
    let res = hyper_client().request(req).await?;
    let body = res.into_body().collect().await?.to_bytes();
    Ok(std::str::from_utf8(&body)?.trim().parse()?)
}

/// rebound's client with its defaults, a shortened backoff, and `budget`
/// (the default budget, held here to read it); without its circuit breaker,
/// which would open in this outage and fail the calls before they are sent
/// (the `breaker` section measures that): here the retry budget alone.
fn rebound_client(budget: Arc<RetryBudget>) -> Result<rebound::Client, BoxError> {
    Ok(rebound::Client::builder()
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(4),
        ))
        .retry_budget(budget)
        .circuit_breaker(None)
        .build()?)
}

/// Sends `m` requests through `client` one after the other; returns
/// (requests the server received, wall time, last status).
async fn amplification<C: Sender>(
    server: &ServerProcess,
    target: &Target,
    mut client: C,
    m: u64,
) -> Result<(u64, Duration, StatusCode), BoxError> {
    let before = received(server).await?;
    let t0 = Instant::now();
    let mut last = StatusCode::OK;
    for _ in 0..m {
        last = client.send(target).await?;
    }
    let wall = t0.elapsed();
    Ok((received(server).await? - before, wall, last))
}

/// Runs the section and prints its tables.
pub(crate) fn run(mode: Mode) -> Result<Checks, BoxError> {
    let m: u64 = mode.pick(20, 500);
    let m_flaky: u64 = mode.pick(300, 10_000);
    let limit = mode.pick(Duration::from_secs(30), Duration::from_secs(300));

    let server = ServerProcess::spawn(limit + Duration::from_secs(30))?;
    let outage = Target::new(&server, "/status/503")?;
    let flaky = Target::new(&server, "/flaky/1")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut checks = Checks::default();

    let (rows, flaky_row, rebound_row) = rt.block_on(async {
        tokio::time::timeout(limit, async {
            let hyper = hyper_client();
            let mut rows = Vec::new();
            // (name, expected amplification if exact, result)
            let r = amplification(&server, &outage, Tower(hyper.clone()), m).await?;
            rows.push(("bare hyper-util client (1 attempt)", Some(1.0), r));
            let r = amplification(
                &server,
                &outage,
                Tower(tower_stack(hyper.clone(), Attempts::new(3))),
                m,
            )
            .await?;
            rows.push(("tower: Retry(3 attempts), no budget", Some(3.0), r));
            let budgeted = Attempts::new(3).with_budget(Arc::new(TpsBudget::default()));
            let r = amplification(
                &server,
                &outage,
                Tower(tower_stack(hyper.clone(), budgeted)),
                m,
            )
            .await?;
            rows.push((
                "tower: Retry(3) + TpsBudget::default() (10 s, 10/s, 20 %)",
                None,
                r,
            ));
            let r = amplification(&server, &outage, ReqwestMw(reqwest_retry_client(3)?), m).await?;
            rows.push((
                "reqwest-retry (1+3, backoff shortened to 1–4 ms)",
                Some(4.0),
                r,
            ));
            // rebound's defaults, but for the backoff: shortened like
            // reqwest-retry's (its 100 ms–10 s would make the run take
            // minutes, and the 10 s budget window would slide under it).
            let budget = Arc::new(RetryBudget::default());
            let r =
                amplification(&server, &outage, Rebound::new(rebound_client(budget)?), m).await?;
            rows.push(("rebound::Client (defaults, backoff 1–4 ms)", None, r));

            let counters = Arc::new(RetryCounters::default());
            let policy = Attempts::new(3)
                .with_budget(Arc::new(TpsBudget::default()))
                .with_counters(counters.clone());
            let mut client = Tower(tower_stack(hyper, policy));
            for _ in 0..m_flaky {
                client.send(&flaky).await?;
            }
            let flaky_row = (
                counters.wanted.load(Ordering::Relaxed),
                counters.allowed.load(Ordering::Relaxed),
            );

            // rebound at 1 %: retries made = attempts beyond the first on
            // final responses (checked against the server's count);
            // retries wanted = those plus the ones the budget refused
            // (`RetryStop::Budget` on the final response).
            let budget = Arc::new(RetryBudget::default());
            let counters = Arc::new(ReboundCounters::default());
            let mut client = Rebound {
                client: rebound_client(budget.clone())?,
                counters: Some(counters.clone()),
            };
            let before = received(&server).await?;
            for _ in 0..m_flaky {
                client.send(&flaky).await?;
            }
            let at_server = received(&server).await? - before;
            let made = counters.retries.load(Ordering::Relaxed);
            let refused = counters.refused.load(Ordering::Relaxed);
            let rebound_row = (made + refused, made, at_server, budget.remaining());
            Ok::<_, BoxError>((rows, flaky_row, rebound_row))
        })
        .await
        .map_err(|_| "outage section ran out of time")?
    })?;
    drop(server);

    let mut table = Table::new(
        format!("Outage amplification: every request gets a 503 ({m} logical requests per column, one at a time)"),
        &["column", "received", "received ÷ sent", "ms per request", "final status"],
    );
    for (name, expected, (got, wall, last)) in &rows {
        let amp = *got as f64 / m as f64;
        table.row(vec![
            (*name).to_owned(),
            got.to_string(),
            f(amp, 2),
            f(wall.as_secs_f64() * 1e3 / m as f64, 3),
            last.as_u16().to_string(),
        ]);
        if let Some(expected) = expected {
            checks.check(
                format!("{name} amplifies exactly {expected}"),
                (amp - expected).abs() < 1e-9,
            );
        }
        checks.check(
            format!("{name} returns the last 503"),
            *last == StatusCode::SERVICE_UNAVAILABLE,
        );
    }
    table.print();

    let (wanted, allowed) = flaky_row;
    let mut table = Table::new(
        format!("Retries allowed at 1 % failure ({m_flaky} logical requests, one at a time)"),
        &[
            "column",
            "retries wanted",
            "retries allowed",
            "share allowed",
        ],
    );
    table.row(vec![
        "tower: Retry(3) + TpsBudget::default()".to_owned(),
        wanted.to_string(),
        allowed.to_string(),
        if wanted == 0 {
            "n/a".to_owned()
        } else {
            format!("{}%", f(100.0 * allowed as f64 / wanted as f64, 1))
        },
    ]);
    let (r_wanted, r_made, r_server, r_left) = rebound_row;
    table.row(vec![
        "rebound::Client (defaults, backoff 1–4 ms)".to_owned(),
        r_wanted.to_string(),
        r_made.to_string(),
        if r_wanted == 0 {
            "n/a".to_owned()
        } else {
            format!("{}%", f(100.0 * r_made as f64 / r_wanted as f64, 1))
        },
    ]);
    table.print();
    println!("  rebound: server received {r_server} for {m_flaky} logical requests; budget remaining at the end: {r_left}");
    checks.check("the 1 % server failed some requests", wanted > 0);
    checks.check(
        "rebound's retries (Attempts on final responses) match the server's count",
        r_server == m_flaky + r_made,
    );
    checks.check("rebound retried at 1 % failure", r_made > 0);
    checks.print();
    Ok(checks)
}
