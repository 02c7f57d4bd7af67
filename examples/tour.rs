//! A tour of rebound: the ready-made client against a misbehaving server on
//! 127.0.0.1, in a few seconds of real time.
//!
//! ```text
//! cargo run --example tour
//! ```
//!
//! A [`FaultServer`] (plain TCP) and a second one speaking TLS misbehave on
//! cue; the client goes through a 503 storm, a 429 with `Retry-After: 1`, a
//! server that never answers, a stalled body, a TLS handshake that hangs,
//! POSTs with and without an idempotency key, a refused connection, a hung
//! GET overtaken by its hedge, an outage where the retry budget stops a
//! retry storm, and a host whose circuit breaker opens, fails calls at
//! once, and closes again after a probe. Every request carries
//! a secret in its `Authorization` header, an `x-api-key` header, the query
//! (`?api_key=`) and the URL's userinfo.
//!
//! It prints one table line per scenario (attempts, the delays waited and
//! who chose them, the outcome, the time taken), then the log lines a user
//! would see at INFO, then a summary, and checks that the secret appears
//! nowhere in them. Loopback only; every call is bounded by its deadline,
//! and the whole run by 30 s.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request};
use http_body_util::BodyExt;
use rebound::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound::fallback::{FallbackLayer, Route, Served};
use rebound::hedge::HedgePolicy;
use rebound::rebound_hyper::ClientBody;
use rebound::reconcile::{Check, OperationId, ReconcileLayer, Reconciled};
use rebound::{
    Attempts, Backoff, Body, BoxError, Client, ClientBuilder, Hedged, RetryBudget, RetryStop,
    TlsRoots,
};
use rebound_test::capture::Capture;
use rebound_test::fault::{refused_addr, Action, ConnectionAction, FaultServer};
use tokio::time::Instant;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;

/// Planted in every request; must never be printed below the banner.
const SECRET: &str = "tour-s3cr3t-7Kq";

/// The log output a user would see (tracing-subscriber's `fmt` at INFO),
/// kept in memory so that the tour can print it per scenario and search it.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl LogBuf {
    fn take(&self) -> String {
        let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&std::mem::take(&mut *buf)).into_owned()
    }
}

impl Write for LogBuf {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One scenario's line of the table, and what it logged.
struct Row {
    title: &'static str,
    attempts: u32,
    delays: String,
    outcome: String,
    stop: String,
    elapsed: Duration,
    logs: String,
}

struct Tour {
    capture: Capture,
    logs: LogBuf,
    rows: Vec<Row>,
    /// Display and Debug of every error the tour saw.
    error_texts: Vec<String>,
    /// Retries the budget refused.
    saved_by_budget: u32,
}

impl Tour {
    /// Send `req` through `client`, read the body, and record a table row.
    async fn run(&mut self, title: &'static str, client: &Client, req: Request<Body>) {
        self.capture.clear();
        let start = Instant::now();
        let outcome = client.send(req).await;
        self.record(title, start, outcome).await;
    }

    /// Record a table row for an outcome of any stack over the client.
    async fn record(
        &mut self,
        title: &'static str,
        start: Instant,
        outcome: Result<http::Response<ClientBody>, rebound::Error>,
    ) {
        let (attempts, stop, outcome) = match outcome {
            Ok(res) => {
                let attempts = Attempts::of(res.extensions());
                let stop = res.extensions().get::<RetryStop>().copied();
                let hedged = res.extensions().get::<Hedged>().copied();
                let status = res.status();
                let how = match (
                    res.extensions().get::<Reconciled>(),
                    res.extensions().get::<Served>(),
                ) {
                    (Some(_), _) => " reconciled".to_owned(),
                    (_, Some(s)) => format!(" via route {}", s.route),
                    _ => String::new(),
                };
                let mut outcome = match res.into_body().collect().await {
                    Ok(body) if status.is_success() => {
                        format!("{status} ({} bytes){how}", body.to_bytes().len())
                    }
                    Ok(_) => status.to_string(),
                    Err(e) => {
                        self.error_texts.push(format!("{e} {e:?}"));
                        format!("{} head; body {}", status.as_u16(), e.kind())
                    }
                };
                if let Some(Hedged {
                    copies,
                    winner: Some(w),
                }) = hedged
                {
                    outcome.push_str(&format!(", copy {w}/{copies} won"));
                }
                (attempts, stop, outcome)
            }
            Err(e) => {
                self.error_texts.push(format!("{e} {e:?}"));
                (e.attempts(), e.retry_stop(), e.kind().to_string())
            }
        };
        let elapsed = start.elapsed();
        if stop == Some(RetryStop::Budget) {
            self.saved_by_budget += client_max_attempts() - attempts;
        }
        self.rows.push(Row {
            title,
            attempts,
            delays: self.delays(attempts),
            outcome,
            stop: stop.map_or("-", |s| s.as_str()).to_owned(),
            elapsed,
            logs: self.logs.take(),
        });
    }

    /// The delays waited before attempts 2.., and who chose them, from the
    /// INFO `retrying` events (one per retry, when the retried attempt
    /// starts).
    fn delays(&self, attempts: u32) -> String {
        let mut out = Vec::new();
        for e in self.capture.events() {
            if e.message() != Some("retrying") {
                continue;
            }
            let n: u32 = e
                .field("rebound.attempt")
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            if n < 2 || n > attempts {
                continue;
            }
            if let (Some(ms), Some(src)) =
                (e.field("rebound.delay_ms"), e.field("rebound.delay_source"))
            {
                out.push(format!("{ms} ms ({src})"));
            }
        }
        if out.is_empty() {
            "-".to_owned()
        } else {
            out.join(", ")
        }
    }
}

fn client_max_attempts() -> u32 {
    3
}

/// The tour's client: short timeouts so that every failure shows in well
/// under a second, Retry-After honoured up to 2 s.
fn builder(roots: &rustls::RootCertStore) -> ClientBuilder {
    Client::builder()
        .total_timeout(Duration::from_secs(5))
        .attempt_timeout(Duration::from_millis(600))
        .connect_timeout(Duration::from_millis(200))
        .tls_timeout(Duration::from_millis(200))
        .body_idle_timeout(Duration::from_millis(500))
        .max_attempts(client_max_attempts())
        .backoff(Backoff::exponential(
            Duration::from_millis(50),
            Duration::from_millis(500),
        ))
        .retry_after_cap(Duration::from_secs(2))
        .tls_roots(TlsRoots::Custom(roots.clone()))
}

/// A request to `base` + `path`, with the secret planted everywhere a
/// caller might put one.
fn request(method: Method, base: &str, path: &str, id: &str) -> Request<Body> {
    let (scheme, hostport) = base.split_once("://").expect("a base URL");
    let body = if method == Method::POST {
        Body::from(r#"{"amount":42}"#)
    } else {
        Body::empty()
    };
    Request::builder()
        .method(method)
        .uri(format!(
            "{scheme}://tour:{SECRET}@{hostport}{path}?api_key={SECRET}"
        ))
        .header("authorization", format!("Bearer {SECRET}"))
        .header("x-api-key", SECRET)
        .header("x-request-id", id)
        .body(body)
        .expect("a valid request")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    match tokio::time::timeout(Duration::from_secs(30), tour()).await {
        Ok(()) => {}
        Err(_) => {
            eprintln!("the tour took more than 30 s: a bug");
            std::process::exit(1);
        }
    }
}

async fn tour() {
    let capture = Capture::new();
    let logs = LogBuf::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::registry()
        .with(LevelFilter::INFO)
        .with(capture.clone())
        .with(
            tracing_subscriber::fmt::layer()
                .without_time()
                .with_writer(move || writer.clone()),
        );
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = FaultServer::builder()
        .route(
            "/flaky",
            [
                Action::status(503).body("busy"),
                Action::status(503).body("busy"),
            ],
        )
        .route("/limited", [Action::status(429).header("retry-after", "1")])
        .route("/slow", [Action::never_respond()])
        .route("/hedged", [Action::never_respond()])
        .route("/stalled", [Action::stall_body()])
        .route("/orders", [Action::status(503), Action::status(503)])
        .route("/payments", [Action::status(503)])
        .route("/down", std::iter::repeat_n(Action::status(503), 1000))
        .route("/broken", std::iter::repeat_n(Action::status(503), 5))
        .default(Action::status(200).body("ok"))
        .start()
        .await;
    let tls = FaultServer::builder()
        .tls()
        .default_connection(ConnectionAction::hang_tls())
        .start()
        .await;
    let roots = tls.root_store().expect("a TLS server has a root store");
    let base = server.url("");
    let refused = format!("http://{}", refused_addr().expect("a loopback port"));

    println!(
        "rebound tour: the ready-made client against a FaultServer on {}",
        server.addr()
    );
    println!(
        "every request carries the secret {SECRET:?} in Authorization, x-api-key, ?api_key= and the URL's userinfo\n"
    );

    let mut t = Tour {
        capture,
        logs,
        rows: Vec::new(),
        error_texts: Vec::new(),
        saved_by_budget: 0,
    };
    let client = |b: ClientBuilder| b.build().expect("a valid client");

    t.run(
        "GET, 503 twice then 200",
        &client(builder(&roots)),
        request(Method::GET, &base, "/flaky", "tour-1"),
    )
    .await;
    t.run(
        "GET, 429 + Retry-After: 1, then 200",
        &client(builder(&roots)),
        request(Method::GET, &base, "/limited", "tour-2"),
    )
    .await;
    t.run(
        "GET, server never answers, then 200",
        &client(builder(&roots)),
        request(Method::GET, &base, "/slow", "tour-3"),
    )
    .await;
    t.run(
        "GET, body stalls after the head",
        &client(builder(&roots)),
        request(Method::GET, &base, "/stalled", "tour-4"),
    )
    .await;
    t.run(
        "GET, TLS handshake hangs",
        &client(builder(&roots)),
        request(Method::GET, &tls.url(""), "/", "tour-5"),
    )
    .await;
    t.run(
        "POST to a 503, keys off: may be processed",
        &client(builder(&roots).idempotency_keys(None)),
        request(Method::POST, &base, "/payments", "tour-6"),
    )
    .await;
    t.run(
        "POST to 503, 503, 200 with the default key",
        &client(builder(&roots)),
        request(Method::POST, &base, "/orders", "tour-7"),
    )
    .await;
    t.run(
        "POST, keys off, refused: never sent",
        &client(builder(&roots).idempotency_keys(None)),
        request(Method::POST, &refused, "/orders", "tour-8"),
    )
    .await;

    // Hedging (off by default): the first attempt hangs, a copy goes after
    // 100 ms and answers; the hung one is cancelled (its connection closed).
    t.run(
        "GET, first copy hangs, hedge after 100 ms",
        &client(builder(&roots).hedge(HedgePolicy::fixed(Duration::from_millis(100)))),
        request(Method::GET, &base, "/hedged", "tour-h"),
    )
    .await;
    let singles = t.rows.len();

    // An outage: ten GETs to a server that is down, from one client whose
    // budget allows one retry per second and nothing per request.
    let budget = Arc::new(RetryBudget::new(0.0, Duration::from_secs(1), 1));
    let outage = client(builder(&roots).retry_budget(budget));
    for i in 0..10 {
        t.run(
            "outage: GET /down, retry budget 1/s",
            &outage,
            request(Method::GET, &base, "/down", &format!("tour-9.{i}")),
        )
        .await;
    }

    // One line for the outage: its ten calls together.
    let calls = t.rows.split_off(t.rows.len() - 10);
    let all_budget = calls.iter().all(|r| r.stop == "budget");
    t.rows.push(Row {
        title: "outage: 10 GETs, 503s, budget 1 retry/s",
        attempts: calls.iter().map(|r| r.attempts).sum(),
        delays: calls[0].delays.clone(),
        outcome: format!("10 x {}", calls[0].outcome),
        stop: if all_budget {
            "budget (all)".to_owned()
        } else {
            "mixed".to_owned()
        },
        elapsed: calls.iter().map(|r| r.elapsed).sum(),
        logs: {
            // The first two calls' lines; the others look like the second
            // (refused by the budget: no retry, so no INFO, only the WARN).
            let mut logs = calls[0].logs.clone() + &calls[1].logs;
            let more: usize = calls[2..].iter().map(|r| r.logs.lines().count()).sum();
            let like = match calls[1].logs.lines().count() {
                1 => "the last one, one per call".to_owned(),
                n => format!("the last {n}, {n} per call"),
            };
            logs.push_str(&format!("(... {more} more lines like {like})\n"));
            logs
        },
    });
    // Searched for the secret, though not printed.
    let mut omitted: String = calls[2..].iter().map(|r| r.logs.as_str()).collect();

    // A host that answers 503 five times, then recovers, behind a circuit
    // breaker tuned small (opens after 5 failed requests in a row, 500 ms
    // break; the client's defaults are 10 in a row, or 50 % of at least
    // 100 in 30 s, and 5 s) and one attempt per call, so that each call is
    // one attempt.
    let breaker = CircuitBreakerLayer::new(
        CircuitBreakerConfig::default()
            .consecutive_failures(5)
            .break_duration(Duration::from_millis(500)),
    );
    let broken = client(builder(&roots).max_attempts(1).circuit_breaker(breaker));
    for i in 0..10 {
        t.run(
            "breaker: GET /broken",
            &broken,
            request(Method::GET, &base, "/broken", &format!("tour-10.{i}")),
        )
        .await;
    }
    let tried = t.rows.split_off(t.rows.len() - 10);
    let fast = tried.iter().filter(|r| r.outcome == "circuit open").count();
    t.rows.push(Row {
        title: "breaker: 10 GETs to a host answering 503",
        attempts: tried.iter().map(|r| r.attempts).sum(),
        delays: "-".to_owned(),
        outcome: format!("{} x 503, {fast} x circuit open", 10 - fast),
        stop: "fatal (open)".to_owned(),
        elapsed: tried.iter().map(|r| r.elapsed).sum(),
        logs: {
            // Up to the first call failed at once; the others look like it.
            let shown = (10 - fast + 1).min(10);
            let mut logs: String = tried[..shown].iter().map(|r| r.logs.as_str()).collect();
            let more: usize = tried[shown..].iter().map(|r| r.logs.lines().count()).sum();
            if more > 0 {
                logs.push_str(&format!("(... {more} more lines like the last one)\n"));
            }
            logs
        },
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.run(
        "breaker: after the break, a probe closes it",
        &broken,
        request(Method::GET, &base, "/broken", "tour-10.10"),
    )
    .await;
    omitted.extend(tried.iter().map(|r| r.logs.as_str()));
    let calls_made = singles + calls.len() + tried.len() + 1 + 2;

    // ===== side effects: reconcile a lost answer, fall back within policy =====
    // A POST the server processes, then resets before answering: the
    // status check `GET /operations/{id}` finds it done, no second write.
    server.route("/transfers", [Action::reset()]);
    server.route(
        "/operations/tour-11",
        [Action::status(200).body(r#"{"transfer":"done"}"#)],
    );
    let checker = client(builder(&roots));
    let ops = base.clone();
    let check = tower::service_fn(move |id: OperationId| {
        let (checker, url) = (checker.clone(), format!("{ops}/operations/{id}"));
        async move {
            let res = checker.get(url).await?;
            Ok::<_, BoxError>(match res.status().as_u16() {
                200 => Check::Finished(res),
                404 => Check::NotFound,
                _ => Check::Unknown,
            })
        }
    });
    // The client's own option: the check runs inside its retry loop.
    let reconciling = client(
        builder(&roots).reconcile(ReconcileLayer::new(check).check_timeout(Duration::from_secs(1))),
    );
    let mut req = request(Method::POST, &server.url(""), "/transfers", "tour-11");
    req.headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static("tour-11"));
    t.capture.clear();
    let start = Instant::now();
    let out = reconciling.send(req).await;
    t.record("reconcile: POST reset after processing", start, out)
        .await;
    assert_eq!(server.requests_to("/transfers").len(), 1, "one transfer");

    // A primary that answers 503 to every attempt, then an approved
    // secondary; neither Authorization nor x-api-key crosses to it.
    let secondary = FaultServer::builder()
        .default(Action::status(200).body("ok from the secondary"))
        .start()
        .await;
    server.route("/chat", std::iter::repeat_n(Action::status(503), 3));
    // The client's own option: within its one deadline and retry budget.
    // The primary's credentials (Authorization, x-api-key, cookies, any
    // header or query parameter whose name looks secret) never reach the
    // secondary: nothing to list.
    let falling = client(
        builder(&roots)
            .circuit_breaker(None)
            .fallback(FallbackLayer::new([Route::base_url(&secondary.url(""))])),
    );
    t.capture.clear();
    let start = Instant::now();
    let out = falling
        .send(request(Method::GET, &server.url(""), "/chat", "tour-12"))
        .await;
    t.record("fallback: primary 503 x 3, secondary", start, out)
        .await;
    let got = secondary.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].header("authorization"),
        None,
        "no credential across hosts"
    );
    assert_eq!(
        got[0].header("x-api-key"),
        None,
        "no credential across hosts"
    );

    // ===== shutdown =====
    // One GET in flight (the server never answers), one sleeping in a
    // 2 s backoff after a 503; shutdown with 300 ms of grace ends the sleep
    // at once, cuts the hung one at 300 ms, and refuses what comes after.
    server.route("/closing/busy", [Action::status(503)]);
    server.route("/closing/hung", [Action::never_respond()]);
    let closing = client(
        builder(&roots).backoff(
            Backoff::exponential(Duration::from_secs(2), Duration::from_secs(2))
                .jitter(rebound::Jitter::Proportional(0.0)),
        ),
    );
    t.capture.clear();
    let start = Instant::now();
    let hung =
        tokio::spawn(closing.send(request(Method::GET, &base, "/closing/hung", "tour-11.0")));
    let busy =
        tokio::spawn(closing.send(request(Method::GET, &base, "/closing/busy", "tour-11.1")));
    while server.requests_to("/closing/hung").len() + server.requests_to("/closing/busy").len() < 2
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let open_before = server.open_connections();
    let report = closing.shutdown(Duration::from_millis(300)).await;
    // Its pool is closed: the server sees this client's connections end
    // (other clients of the tour keep theirs).
    let closed_by = Instant::now() + Duration::from_secs(2);
    while server.open_connections() >= open_before && Instant::now() < closed_by {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let connections_closed = open_before.saturating_sub(server.open_connections());
    for (title, task) in [
        ("shutdown: a GET in backoff (grace 300 ms)", busy),
        ("shutdown: a GET in flight (grace 300 ms)", hung),
    ] {
        let e = task.await.expect("no panic").expect_err("closed");
        t.error_texts.push(format!("{e} {e:?}"));
        t.rows.push(Row {
            title,
            attempts: e.attempts(),
            delays: "-".to_owned(),
            outcome: e.kind().to_string(),
            stop: e.retry_stop().map_or("-", |s| s.as_str()).to_owned(),
            elapsed: start.elapsed(),
            logs: t.logs.take(),
        });
    }
    let before = server.requests_started();
    let start = Instant::now();
    let e = closing
        .send(request(Method::GET, &base, "/closing/after", "tour-11.2"))
        .await
        .expect_err("refused");
    assert_eq!(server.requests_started(), before, "refused, never sent");
    t.error_texts.push(format!("{e} {e:?}"));
    t.rows.push(Row {
        title: "shutdown: a GET after it (never sent)",
        attempts: 0,
        delays: "-".to_owned(),
        outcome: e.kind().to_string(),
        stop: "-".to_owned(),
        elapsed: start.elapsed(),
        logs: t.logs.take(),
    });
    let shutdown_line = format!(
        "shutdown report: {} open at shutdown, {} completed in the grace period (the one in backoff, with its last outcome), {} cut at its end; the server saw {} of its connections closed",
        report.in_flight, report.completed, report.cancelled, connections_closed
    );
    let calls_made = calls_made + 2;

    // ===== the table =====
    println!(
        "{:<42} {:>8}  {:<34} {:<34} {:<12} {:>8}",
        "scenario", "attempts", "delays (chosen by)", "outcome", "stopped", "elapsed"
    );
    for r in &t.rows {
        println!(
            "{:<42} {:>8}  {:<34} {:<34} {:<12} {:>6} ms",
            r.title,
            r.attempts,
            r.delays,
            r.outcome,
            r.stop,
            r.elapsed.as_millis()
        );
    }

    // ===== the logs =====
    println!("\nwhat a user sees at INFO (tracing-subscriber fmt; DEBUG spans off):");
    let mut last = "";
    let mut log_lines = 0;
    for r in &t.rows {
        if r.logs.is_empty() {
            continue;
        }
        if r.title != last {
            println!("-- {}", r.title);
            last = r.title;
        }
        for line in r.logs.lines() {
            if !line.starts_with("(...") {
                log_lines += 1;
            }
            println!("   {line}");
        }
    }

    println!(
        "\n(not_eligible: a POST without an Idempotency-Key is retried only when it provably \
         never left, like the refused one; the body stall comes after the call returned its \
         200 head: the caller gets the error, and the trace logs it at WARN)"
    );

    // ===== the summary =====
    let scenarios = t.rows.len();
    let attempts: u32 = t.rows.iter().map(|r| r.attempts).sum();
    let retries = attempts - calls_made as u32;
    let all_logs: String = t.rows.iter().map(|r| r.logs.as_str()).collect::<String>() + &omitted;
    let leaks_in_logs = all_logs.matches(SECRET).count() + t.capture.count(SECRET);
    let leaks_in_errors = t.error_texts.iter().filter(|e| e.contains(SECRET)).count();
    println!("\n{shutdown_line}");
    println!(
        "\nsummary: {scenarios} scenarios, {calls_made} calls, {attempts} attempts ({retries} retries); \
         {} retries saved by the budget during the outage",
        t.saved_by_budget
    );
    println!(
        "secret: {leaks_in_logs} occurrence(s) in {} log lines ({log_lines} shown above) and in the \
         captured event fields; {leaks_in_errors} in {} error messages (Display and Debug)",
        all_logs.lines().filter(|l| !l.starts_with("(...")).count(),
        t.error_texts.len()
    );
    assert_eq!(leaks_in_logs + leaks_in_errors, 0, "the secret leaked");
}
