//! Sequential loopback requests from one client, for counting instructions
//! per request under callgrind (see BENCHMARKS.md, "Instructions per
//! request"). Not part of a default run: only `--only seq` runs it.
//!
//! One column only: the first whose name contains `--filter` (no filter:
//! the bare hyper-util client). It sends 100 requests to warm up, then
//! `--requests N` (default 1,000) one after another on a **current-thread**
//! runtime, so that the count repeats from run to run (no work stealing, no
//! idle worker spinning). Run it twice with different `N` under callgrind
//! and divide the difference in instructions by the difference in `N`: what
//! is left is the client's cost per request, connection task included
//! (the server is another process, which callgrind does not follow).

use tower::BoxError;

use crate::loopback::{column, hyper_client, Column, Rebound, Target, Tower};
use crate::report::Checks;
use crate::server::ServerProcess;
use crate::{allocations, Mode};

fn columns() -> Result<Vec<Box<dyn Column>>, BoxError> {
    Ok(vec![
        column("bare hyper-util client (baseline)", Tower(hyper_client())),
        column(
            "rebound::Client (defaults)",
            Rebound::new(rebound::Client::builder().build()?),
        ),
        // `--filter no-pacing`: the defaults less the pacer, for its cost.
        column(
            "rebound::Client, no-pacing (rate_limit(None))",
            Rebound::new(rebound::Client::builder().rate_limit(None).build()?),
        ),
        // `--filter client-wide-aimd`: the default AIMD limit as one
        // limiter for every host (what the default was before issue 22),
        // for the per-host limit's cost.
        column(
            "rebound::Client, client-wide-aimd (adaptive_limiter)",
            Rebound::new(
                rebound::Client::builder()
                    .adaptive_limiter(std::sync::Arc::new(
                        rebound::limit::AdaptiveLimiter::try_new(
                            rebound::rebound_hyper::client::default_adaptive_limit(),
                        )?,
                    ))
                    .build()?,
            ),
        ),
        // `--filter gradient`: the per-host limit with the gradient
        // algorithm, for its cost over AIMD.
        column(
            "rebound::Client, gradient (adaptive_limit(Gradient))",
            Rebound::new(
                rebound::Client::builder()
                    .adaptive_limit(rebound::limit::Gradient::default())
                    .build()?,
            ),
        ),
    ])
}

/// Runs the section: `requests` requests in a row through one column.
pub(crate) fn run(mode: Mode, requests: Option<usize>) -> Result<Checks, BoxError> {
    let n = requests.unwrap_or(mode.pick(20, 1_000));
    let server = ServerProcess::spawn(std::time::Duration::from_secs(600))?;
    let target = Target::new(&server, "/ok")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (name, allocs) = rt.block_on(async {
        let mut cols = columns()?;
        let i = match mode.filter {
            None => 0,
            Some(f) => cols
                .iter()
                .position(|c| c.name().contains(f))
                .ok_or_else(|| format!("no column matches {f:?}"))?,
        };
        let col = &mut cols[i];
        col.batch(&target, 100).await?;
        let a0 = allocations();
        col.batch(&target, n).await?;
        let a1 = allocations();
        Ok::<_, BoxError>((col.name().to_owned(), (a1 - a0) as f64 / n.max(1) as f64))
    })?;
    drop(server);
    println!("\n## Sequential loopback (current-thread runtime)\n");
    println!("{name}: {n} requests, {allocs:.2} allocations per request");
    let mut checks = Checks::default();
    checks.check("every request answered 200", true);
    checks.print();
    Ok(checks)
}
