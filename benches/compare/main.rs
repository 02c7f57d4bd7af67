//! rebound's side-by-side benchmark: the cost of its stack measured against
//! bare hyper, tower's own layers and reqwest, in the same run.
//!
//! This machine is shared and noisy, so no figure here is an absolute time:
//! every column is run in **interleaved rounds** (A B C, A B C, …) and each
//! figure is the median over rounds of a ratio (or difference) against the
//! baseline column measured in the same round. Allocation counts come from a
//! counting global allocator and do not depend on noise.
//!
//! ```text
//! cargo bench --bench compare                       # full run, by hand (minutes)
//! cargo bench --bench compare -- --quick            # tiny counts, seconds (CI)
//! cargo bench --bench compare -- --only outage,herd # some sections only
//! cargo bench --bench compare -- --only overhead --filter tower  # one column
//! ```
//!
//! Sections: `overhead` (in-process), `loopback` (a hyper server in a
//! separate process on 127.0.0.1), `outage` (amplification under 503s and
//! share of retries allowed at 1 % failure), `herd` (jitter modes on the
//! paused clock), `breaker` (one host down for 30 s, one healthy, on the
//! paused clock) and `hedge` (tail latency with 1 % slow answers: no
//! hedging, tower's `Hedge`, rebound's). `seq` (one client's sequential
//! requests, for callgrind; `--requests N`) runs only when `--only` names
//! it. See BENCHMARKS.md for what each number means.
//!
//! The same executable is the loopback server: run with `--bench-server` it
//! serves HTTP/1.1 on 127.0.0.1 until its parent closes its stdin or its
//! lifetime (seconds, the next argument) runs out.

use std::alloc::System;
use std::process::ExitCode;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

mod breaker;
mod hedge;
mod herd;
mod loopback;
mod outage;
mod overhead;
mod peers;
mod report;
mod seq;
mod server;

// Counts every allocation of this process with atomics (global, not per
// thread). `stats_alloc` holds the `unsafe impl GlobalAlloc`, so the
// workspace's `forbid(unsafe_code)` stands here too.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap allocations made by this process so far: `alloc` and `realloc`
/// calls (a growing `Vec` counts each time it moves).
pub(crate) fn allocations() -> u64 {
    let s = GLOBAL.stats();
    (s.allocations + s.reallocations) as u64
}

/// How much work each section does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mode {
    /// Tiny counts, a few seconds in all (CI's smoke run).
    pub(crate) quick: bool,
    /// Keep only the columns whose name contains this (the baseline always
    /// stays): one column at a time for a profiler.
    pub(crate) filter: Option<&'static str>,
}

impl Mode {
    /// Whether a column (not the baseline) is to be run.
    pub(crate) fn keeps(&self, column: &str) -> bool {
        self.filter.is_none_or(|f| column.contains(f))
    }

    /// Pick `quick` or `full` by mode.
    pub(crate) fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

const SECTIONS: [&str; 7] = [
    "overhead", "loopback", "outage", "herd", "breaker", "hedge", "seq",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--bench-server") {
        server::serve_main(args.get(i + 1).map(String::as_str));
    }

    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("REBOUND_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_owned).collect());
    if let Some(only) = &only {
        if let Some(bad) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
            eprintln!("unknown section {bad:?}; sections: {}", SECTIONS.join(", "));
            return ExitCode::FAILURE;
        }
    }
    let wanted = |s: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let filter = args
        .iter()
        .position(|a| a == "--filter")
        .and_then(|i| args.get(i + 1))
        .map(|f| &*Box::leak(f.clone().into_boxed_str()));
    let mode = Mode { quick, filter };
    let requests = match args.iter().position(|a| a == "--requests") {
        None => None,
        Some(i) => match args.get(i + 1).map(|n| n.parse::<usize>()) {
            Some(Ok(n)) => Some(n),
            _ => {
                eprintln!("--requests takes a number");
                return ExitCode::FAILURE;
            }
        },
    };

    println!(
        "# rebound benchmarks ({} mode, {} build, {} cores visible)",
        mode.pick("quick", "full"),
        if cfg!(debug_assertions) {
            "debug: figures NOT meaningful"
        } else {
            "optimized"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "Every ratio is the median over interleaved rounds of column / baseline in the same round."
    );

    let mut failures = Vec::new();
    let mut passed = 0;
    type Section = fn(Mode) -> Result<report::Checks, tower::BoxError>;
    let sections: [(&str, Section); 6] = [
        ("overhead", overhead::run),
        ("loopback", loopback::run),
        ("outage", outage::run),
        ("herd", herd::run),
        ("breaker", breaker::run),
        ("hedge", hedge::run),
    ];
    let mut results = Vec::new();
    for (name, run) in sections {
        if wanted(name) {
            results.push((name, run(mode)));
        }
    }
    // `seq` (instructions per request under callgrind) runs only when named.
    if only.as_ref().is_some_and(|o| o.iter().any(|x| x == "seq")) {
        results.push(("seq", seq::run(mode, requests)));
    }
    for (name, result) in results {
        match result {
            Ok(checks) => {
                passed += checks.passed();
                failures.extend(checks.failed().map(|c| format!("{name}: {c}")));
            }
            Err(e) => failures.push(format!("{name}: error: {e}")),
        }
    }

    for f in &failures {
        eprintln!("FAILED {f}");
    }
    // The closing line CI reads: sanity checks on exact counts, not timings.
    println!("\nchecks: {passed} passed, {} failed", failures.len());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
