//! The circuit breaker under an outage, on the paused clock.
//!
//! Two hosts behind one stack (the circuit breaker with its defaults above
//! the retry loop, where the ready-made client puts it, so it counts
//! requests; retry with its default budget, a seeded backoff, the
//! classifier) over an in-process upstream that answers in 10 ms. Each host is offered the same
//! steady load of logical requests; `down` answers 503 to everything from
//! 10 s to 40 s, `up` stays healthy. The clock is tokio's paused clock, so
//! the 50 s timeline costs no wall time and every count is the same on
//! every run (the backoff's jitter is seeded): no figure is a timing.
//!
//! Figures, per column (breaker off, breaker with defaults):
//!
//! * **opened after**: from the start of the outage to the first call
//!   failed at once (the defaults: 10 failed requests in a row).
//! * **reached ÷ offered, outage**: attempts that reached `down` during the
//!   outage ÷ logical requests offered to it then (retries included: above
//!   1 without a breaker).
//! * **reached ÷ offered after open**: the same from the first call failed
//!   at once to the end of the outage (probes included, each a request
//!   with its retries). Target ≤ 5 %.
//! * **healthy host**: its success rate and whether it received exactly
//!   what it was offered (unaffected).
//! * **recovered**: `down`'s success rate over logical requests offered
//!   from recovery + break (5 s) + 1 s to the end, ÷ its success rate
//!   before the outage. Target ≥ 95 %.

use rebound::ErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use rebound::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound::classify::{ClassifyLayer, HttpClassifier};
use rebound::retry::{RetryLayer, RetryPolicy};
use rebound::{Backoff, BackoffLayer};

use crate::report::{f, Checks, Table};
use crate::Mode;

const OUTAGE_START: Duration = Duration::from_secs(10);
const OUTAGE_END: Duration = Duration::from_secs(40);
const END: Duration = Duration::from_secs(50);
const LATENCY: Duration = Duration::from_millis(10);
/// The default break duration (see `CircuitBreakerConfig`).
const BREAK: Duration = Duration::from_secs(5);

/// One logical request's fate.
#[derive(Clone, Copy)]
struct Outcome {
    down: bool,
    offered: Duration,
    /// When its outcome arrived.
    finished: Duration,
    ok: bool,
    circuit_open: bool,
}

#[derive(Default)]
struct Figures {
    /// When the first call was failed at once (since start).
    opened: Option<Duration>,
    offered_after_open: u64,
    reached_after_open: u64,
    reached_down_outage: u64,
    offered_down_outage: u64,
    up_offered: u64,
    up_reached: u64,
    up_ok: u64,
    pre_rate: f64,
    post_rate: f64,
    /// First success of `down` after the outage, since its end.
    first_success_after: Option<Duration>,
}

async fn scenario(per_sec: u64, breaker: bool) -> Result<Figures, BoxError> {
    let start = Instant::now();
    // Arrival time (since start) of every attempt at `down`, and the count
    // at `up`.
    let down_arrivals = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let up_reached = Arc::new(AtomicU64::new(0));
    let upstream = {
        let (down_arrivals, up_reached) = (down_arrivals.clone(), up_reached.clone());
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let now = start.elapsed();
            let down = req.uri().host() == Some("down.example");
            let status = if down {
                down_arrivals.lock().unwrap().push(now);
                if (OUTAGE_START..OUTAGE_END).contains(&now) {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            } else {
                up_reached.fetch_add(1, Ordering::Relaxed);
                StatusCode::OK
            };
            async move {
                tokio::time::sleep(LATENCY).await;
                let mut res = Response::new(Full::new(Bytes::new()));
                *res.status_mut() = status;
                Ok::<_, std::convert::Infallible>(res)
            }
        })
    };
    let breaker = breaker.then(|| CircuitBreakerLayer::new(CircuitBreakerConfig::default()));
    let svc = ServiceBuilder::new()
        .option_layer(breaker)
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
        .layer(BackoffLayer::new(
            Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2)).seed(13),
        ))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(upstream);

    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    let every = Duration::from_secs(1) / per_sec as u32;
    let mut tick = tokio::time::interval(every);
    while start.elapsed() < END {
        tick.tick().await;
        let offered = start.elapsed();
        for down in [true, false] {
            let host = if down { "down.example" } else { "up.example" };
            let req = Request::get(format!("http://{host}/v1/items"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let (svc, outcomes) = (svc.clone(), outcomes.clone());
            tasks.spawn(async move {
                let out = svc.oneshot(req).await;
                let outcome = Outcome {
                    down,
                    offered,
                    finished: start.elapsed(),
                    ok: out.as_ref().is_ok_and(|r| r.status().is_success()),
                    circuit_open: out
                        .as_ref()
                        .is_err_and(|e| matches!(e.kind(), ErrorKind::CircuitOpen)),
                };
                outcomes.lock().unwrap().push(outcome);
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }

    let outcomes = outcomes.lock().unwrap();
    let arrivals = down_arrivals.lock().unwrap();
    let mut fig = Figures {
        opened: outcomes
            .iter()
            .filter(|o| o.down && o.circuit_open)
            .map(|o| o.finished)
            .min(),
        ..Figures::default()
    };
    let open_from = fig.opened.unwrap_or(OUTAGE_END);
    let in_outage = |t: &Duration| (OUTAGE_START..OUTAGE_END).contains(t);
    fig.offered_after_open = outcomes
        .iter()
        .filter(|o| o.down && (open_from..OUTAGE_END).contains(&o.offered))
        .count() as u64;
    fig.reached_after_open = arrivals
        .iter()
        .filter(|t| (open_from..OUTAGE_END).contains(*t))
        .count() as u64;
    fig.offered_down_outage = outcomes
        .iter()
        .filter(|o| o.down && in_outage(&o.offered))
        .count() as u64;
    fig.reached_down_outage = arrivals.iter().filter(|t| in_outage(t)).count() as u64;
    let up: Vec<&Outcome> = outcomes.iter().filter(|o| !o.down).collect();
    fig.up_offered = up.len() as u64;
    fig.up_ok = up.iter().filter(|o| o.ok).count() as u64;
    fig.up_reached = up_reached.load(Ordering::Relaxed);
    let rate = |from: Duration, to: Duration| {
        let set: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.down && (from..to).contains(&o.offered))
            .collect();
        set.iter().filter(|o| o.ok).count() as f64 / set.len().max(1) as f64
    };
    fig.pre_rate = rate(Duration::ZERO, OUTAGE_START);
    // Requests offered late in the run may still be in their retries at
    // the end: count those offered up to 2 s before it.
    fig.post_rate = rate(
        OUTAGE_END + BREAK + Duration::from_secs(1),
        END - Duration::from_secs(2),
    );
    fig.first_success_after = outcomes
        .iter()
        .filter(|o| o.down && o.ok && o.offered >= OUTAGE_END)
        .map(|o| o.offered - OUTAGE_END)
        .min();
    Ok(fig)
}

/// Runs the section and prints its table.
pub(crate) fn run(mode: Mode) -> Result<Checks, BoxError> {
    let per_sec = mode.pick(20, 200);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let mut checks = Checks::default();
    let mut table = Table::new(
        format!(
            "Circuit breaker, outage of one host for 30 s ({per_sec} logical requests/s per host, paused clock, breaker above retry 3 attempts + default budget)"
        ),
        &[
            "column",
            "opened after (s)",
            "reached ÷ offered, outage",
            "reached ÷ offered, after open",
            "healthy host ok",
            "recovered ÷ before",
            "first success after recovery (s)",
        ],
    );
    for (name, on) in [
        ("no breaker", false),
        ("rebound CircuitBreakerLayer (defaults)", true),
    ] {
        let fig = rt.block_on(scenario(per_sec, on))?;
        let after_open = fig.reached_after_open as f64 / fig.offered_after_open.max(1) as f64;
        let recovered = fig.post_rate / fig.pre_rate.max(f64::MIN_POSITIVE);
        table.row(vec![
            name.to_owned(),
            fig.opened.map_or("—".to_owned(), |t| {
                f((t.saturating_sub(OUTAGE_START)).as_secs_f64(), 2)
            }),
            f(
                fig.reached_down_outage as f64 / fig.offered_down_outage.max(1) as f64,
                3,
            ),
            if on {
                f(after_open, 3)
            } else {
                "—".to_owned()
            },
            format!("{}/{}", fig.up_ok, fig.up_offered),
            f(recovered, 3),
            fig.first_success_after
                .map_or("—".to_owned(), |t| f(t.as_secs_f64(), 2)),
        ]);
        checks.check(
            format!("{name}: the healthy host received exactly what it was offered"),
            fig.up_reached == fig.up_offered,
        );
        checks.check(
            format!("{name}: every request to the healthy host succeeded"),
            fig.up_ok == fig.up_offered,
        );
        checks.check(
            format!("{name}: pre-outage success rate is 100 %"),
            fig.pre_rate == 1.0,
        );
        if on {
            checks.check(
                format!("{name}: opened during the outage"),
                fig.opened
                    .is_some_and(|t| t >= OUTAGE_START && t < OUTAGE_END),
            );
            checks.check(
                format!("{name}: after opening, requests reaching the failing host ≤ 5 % of those offered"),
                after_open <= 0.05,
            );
            checks.check(
                format!(
                    "{name}: ≥ 95 % of the pre-outage success rate from break + 1 s after recovery"
                ),
                recovered >= 0.95,
            );
        } else {
            checks.check(
                format!("{name}: every request offered in the outage reached the failing host"),
                fig.reached_down_outage >= fig.offered_down_outage,
            );
        }
    }
    table.print();
    checks.print();
    Ok(checks)
}
