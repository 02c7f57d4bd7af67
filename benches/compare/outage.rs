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

use crate::loopback::{hyper_client, ReqwestMw, Sender, Target, Tower};
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

    let (rows, flaky_row) = rt.block_on(async {
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
            // rebound: rows.push(("rebound::Client (defaults)", None, amplification(.., Tower(client), m).await?));

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
            Ok::<_, BoxError>((rows, flaky_row))
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
    table.pending("rebound::Client (defaults)");
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
    table.pending("rebound::Client (defaults)");
    table.print();
    checks.check("the 1 % server failed some requests", wanted > 0);
    checks.print();
    Ok(checks)
}
