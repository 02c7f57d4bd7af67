//! The herd: `n` clients start together against a server that fails
//! everything for a while, then recovers with a finite capacity; how many
//! calls do they make in all, and how long until the last one is served?
//! Compared across jitter modes, on the **paused tokio clock** (so the run
//! takes milliseconds and the figures are exact for a given seed), after
//! AWS's "Exponential Backoff And Jitter" simulation, where full jitter made
//! 0.43× the calls of un-jittered exponential backoff at 100 clients.
//!
//! The server is a `tower::service_fn` with shared counters and
//! `tokio::time`: 503 to everything until `outage` has passed; after that it
//! serves at most `per_window` requests per `window` (fixed windows) and
//! answers 503 to the rest. Each client retries every 503 after its
//! backoff's delay, up to `max_attempts` attempts.
//!
//! Each backoff sits behind the small [`HerdBackoff`] trait: a reference
//! implementation ([`RefBackoff`], AWS's modes) and rebound's own `Backoff`
//! (`Backoff::exponential(base, cap).jitter(Jitter::…)`), one row per mode.

use std::convert::Infallible;
use std::future::ready;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt as _};

use crate::report::{f, median, Checks, Table};
use crate::Mode;

/// What the herd needs from a backoff: the delay before retry number
/// `retry` (1 = the first retry). One value per client, so a mode may keep
/// state (decorrelated jitter remembers its last delay).
pub(crate) trait HerdBackoff {
    fn delay(&mut self, retry: u32) -> Duration;
}

/// The jitter modes of the reference backoff (AWS's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefJitter {
    /// `min(cap, base·2^(retry−1))`, no randomness.
    None,
    /// Uniform in `[0, exp]`.
    Full,
    /// `exp/2` plus uniform in `[0, exp/2]`.
    Equal,
    /// `min(cap, uniform in [base, 3·previous])`, previous starting at base.
    Decorrelated,
}

/// The reference exponential backoff with jitter, beside rebound's
/// `Backoff`.
#[derive(Debug)]
pub(crate) struct RefBackoff {
    base: Duration,
    cap: Duration,
    jitter: RefJitter,
    prev: Duration,
    rng: SmallRng,
}

impl RefBackoff {
    pub(crate) fn new(base: Duration, cap: Duration, jitter: RefJitter, seed: u64) -> Self {
        RefBackoff {
            base,
            cap,
            jitter,
            prev: base,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    fn uniform(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo, hi) = (lo.as_nanos() as u64, hi.as_nanos() as u64);
        Duration::from_nanos(if hi <= lo {
            lo
        } else {
            self.rng.random_range(lo..=hi)
        })
    }
}

impl HerdBackoff for RefBackoff {
    fn delay(&mut self, retry: u32) -> Duration {
        let exp = self
            .base
            .checked_mul(
                1u32.checked_shl(retry.saturating_sub(1))
                    .unwrap_or(u32::MAX),
            )
            .unwrap_or(self.cap)
            .min(self.cap);
        match self.jitter {
            RefJitter::None => exp,
            RefJitter::Full => self.uniform(Duration::ZERO, exp),
            RefJitter::Equal => exp / 2 + self.uniform(Duration::ZERO, exp / 2),
            RefJitter::Decorrelated => {
                let next = self.uniform(self.base, self.prev * 3).min(self.cap);
                self.prev = next;
                next
            }
        }
    }
}

/// The simulated server's parameters and the herd's.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    clients: usize,
    outage: Duration,
    window: Duration,
    per_window: u32,
    base: Duration,
    cap: Duration,
    max_attempts: u32,
}

/// Shared state of the simulated server.
#[derive(Debug)]
struct SimServer {
    start: Instant,
    outage: Duration,
    window: Duration,
    per_window: u32,
    /// (current window index, requests served in it)
    served: Mutex<(u128, u32)>,
    calls: AtomicU64,
}

impl SimServer {
    fn admit(&self) -> bool {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let elapsed = self.start.elapsed();
        if elapsed < self.outage {
            return false;
        }
        let w = elapsed.as_nanos() / self.window.as_nanos();
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        if served.0 != w {
            *served = (w, 0);
        }
        if served.1 < self.per_window {
            served.1 += 1;
            true
        } else {
            false
        }
    }
}

/// Result of one herd: total calls, time until the last client was served
/// (or gave up), clients that gave up.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    calls: u64,
    drain: Duration,
    gave_up: usize,
}

/// One herd on its own paused current-thread runtime.
fn simulate(
    s: Scenario,
    make: &dyn Fn(u64) -> Box<dyn HerdBackoff + Send>,
    seed: u64,
) -> Result<Outcome, BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    rt.block_on(async move {
        let server = Arc::new(SimServer {
            start: Instant::now(),
            outage: s.outage,
            window: s.window,
            per_window: s.per_window,
            served: Mutex::new((0, 0)),
            calls: AtomicU64::new(0),
        });
        let srv = server.clone();
        let svc = tower::service_fn(move |_req: Request<Empty<Bytes>>| {
            let mut res = Response::new(Empty::<Bytes>::new());
            if !srv.admit() {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            ready(Ok::<_, Infallible>(res))
        });

        let mut set = tokio::task::JoinSet::new();
        for client in 0..s.clients {
            let mut backoff = make(seed.wrapping_mul(1_000_003).wrapping_add(client as u64));
            let mut svc = svc.clone();
            set.spawn(async move {
                for attempt in 1..=s.max_attempts {
                    let res = svc.ready().await?.call(Request::new(Empty::new())).await?;
                    if res.status().is_success() {
                        return Ok::<_, Infallible>(Some(Instant::now()));
                    }
                    if attempt < s.max_attempts {
                        tokio::time::sleep(backoff.delay(attempt)).await;
                    }
                }
                Ok(None)
            });
        }
        // Bounded in simulated time too (the paused clock jumps ahead).
        let sim_limit = s.outage + s.cap * s.max_attempts + Duration::from_secs(60);
        let mut last = server.start;
        let mut gave_up = 0;
        tokio::time::timeout(sim_limit, async {
            while let Some(done) = set.join_next().await {
                match done?? {
                    Some(at) => last = last.max(at),
                    None => gave_up += 1,
                }
            }
            Ok::<_, BoxError>(())
        })
        .await
        .map_err(|_| "herd did not drain within its simulated time limit")??;
        if gave_up > 0 {
            last = last.max(Instant::now());
        }
        Ok(Outcome {
            calls: server.calls.load(Ordering::Relaxed),
            drain: last - server.start,
            gave_up,
        })
    })
}

type Make = Box<dyn Fn(u64) -> Box<dyn HerdBackoff + Send>>;

fn reference(s: Scenario, jitter: RefJitter) -> Make {
    Box::new(move |seed| Box::new(RefBackoff::new(s.base, s.cap, jitter, seed)))
}

/// rebound's `Backoff` behind [`HerdBackoff`]: the delay after attempt
/// `retry` (rebound counts attempts from 1, so the first retry follows
/// attempt 1), remembering the previous delay for decorrelated jitter.
/// Seeded per client like the reference.
struct ReboundBackoff {
    backoff: rebound::Backoff,
    previous: Option<Duration>,
}

impl HerdBackoff for ReboundBackoff {
    fn delay(&mut self, retry: u32) -> Duration {
        let d = self.backoff.delay(retry, self.previous);
        self.previous = Some(d);
        d
    }
}

fn rebound_backoff(s: Scenario, jitter: rebound::Jitter) -> Make {
    Box::new(move |seed| {
        Box::new(ReboundBackoff {
            backoff: rebound::Backoff::exponential(s.base, s.cap)
                .jitter(jitter)
                .seed(seed),
            previous: None,
        })
    })
}

/// Runs the section and prints its table.
pub(crate) fn run(mode: Mode) -> Result<Checks, BoxError> {
    let s = Scenario {
        clients: mode.pick(20, 100),
        outage: Duration::from_secs(2),
        window: Duration::from_millis(10),
        per_window: mode.pick(2, 10),
        base: Duration::from_millis(10),
        cap: Duration::from_secs(1),
        max_attempts: 50,
    };
    let seeds: u64 = mode.pick(2, 9);
    let rows: Vec<(&str, Make)> = vec![
        (
            "reference: exponential, no jitter (baseline)",
            reference(s, RefJitter::None),
        ),
        ("reference: full jitter", reference(s, RefJitter::Full)),
        ("reference: equal jitter", reference(s, RefJitter::Equal)),
        (
            "reference: decorrelated jitter",
            reference(s, RefJitter::Decorrelated),
        ),
        (
            "rebound Backoff: no jitter (Proportional(0.0))",
            rebound_backoff(s, rebound::Jitter::Proportional(0.0)),
        ),
        (
            "rebound Backoff: Jitter::Full (its default)",
            rebound_backoff(s, rebound::Jitter::Full),
        ),
        (
            "rebound Backoff: Jitter::Equal",
            rebound_backoff(s, rebound::Jitter::Equal),
        ),
        (
            "rebound Backoff: Jitter::Decorrelated",
            rebound_backoff(s, rebound::Jitter::Decorrelated),
        ),
        (
            "rebound Backoff: Jitter::Proportional(0.2)",
            rebound_backoff(s, rebound::Jitter::Proportional(0.2)),
        ),
    ];

    let mut results = Vec::new();
    for (name, make) in &rows {
        let mut calls = Vec::new();
        let mut drain = Vec::new();
        let mut gave_up = 0;
        for seed in 0..seeds {
            let o = simulate(s, make.as_ref(), seed)?;
            calls.push(o.calls as f64);
            drain.push(o.drain.as_secs_f64());
            gave_up += o.gave_up;
        }
        results.push((*name, median(&mut calls), median(&mut drain), gave_up));
    }

    let mut table = Table::new(
        format!(
            "Herd on the paused clock: {} clients, server down {:?} then {} requests per {:?}; backoff base {:?}, cap {:?}, ≤ {} attempts (median of {seeds} seeds)",
            s.clients, s.outage, s.per_window, s.window, s.base, s.cap, s.max_attempts
        ),
        &["backoff", "total calls", "calls × none", "drain s", "drain × none", "gave up"],
    );
    let (base_calls, base_drain) = (results[0].1, results[0].2);
    for (name, calls, drain, gave_up) in &results {
        table.row(vec![
            (*name).to_owned(),
            f(*calls, 0),
            f(calls / base_calls, 2),
            f(*drain, 2),
            f(drain / base_drain, 2),
            gave_up.to_string(),
        ]);
    }
    table.print();

    let mut checks = Checks::default();
    checks.check(
        "every client was served (none gave up)",
        results.iter().all(|r| r.3 == 0),
    );
    checks.check(
        "the server saw at least one call per client",
        results.iter().all(|r| r.1 >= s.clients as f64),
    );
    checks.check(
        "rebound without jitter makes exactly the reference's calls",
        results[4].1 == results[0].1 && results[4].2 == results[0].2,
    );
    checks.print();
    Ok(checks)
}
