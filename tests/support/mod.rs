//! The fault matrix of issue 5, shared by `fault_matrix.rs` (which checks it
//! as a spec) and `secrets.rs` (which runs it with secrets planted and a
//! TRACE subscriber): every fault × GET, POST with idempotency keys off,
//! POST with the client's default key, through the ready-made [`Client`]
//! over real sockets on 127.0.0.1.

#![allow(dead_code, unreachable_pub)]

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use http_body_util::BodyExt;
use rebound::{
    limit::ConcurrencyLimiter, Attempts, Backoff, Body, Client, ErrorKind, MinBodyRate,
    RetryBudget, RetryStop, TimeoutStage, TlsRoots,
};
use rebound_test::fault::{Action, ConnectionAction, FaultServer};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

// ===== the client's configuration: short, so the matrix takes seconds =====

/// The total deadline of every call: room for three headers timeouts, and
/// 2 s to spare.
pub const TOTAL: Duration = Duration::from_secs(5);
/// Per attempt, to the response head: five times the connect and TLS
/// timeouts, so that on a loaded machine a hung handshake still ends at its
/// own stage, not at the attempt's. (Three times was not enough: beside
/// four busy loops on 2 cores, load average ~12, timers fired ~250 ms late
/// and one TLS hang ended as a headers timeout at 661 ms.)
pub const ATTEMPT: Duration = Duration::from_millis(1000);
/// TCP connect.
pub const CONNECT: Duration = Duration::from_millis(200);
/// TLS handshake.
pub const TLS: Duration = Duration::from_millis(200);
/// No body frame for this long fails the body. Four times the trickle's
/// write interval (100 ms), so a trickle is judged by its rate, not as idle.
pub const BODY_IDLE: Duration = Duration::from_millis(400);
/// The minimum body rate: 1000 B/s over windows of 200 ms, judged after a
/// grace of 1 s, so it first judges at 1.2 s — three times the idle timeout
/// that catches a stall (400 ms), well before the deadline (5 s).
pub fn min_body_rate() -> MinBodyRate {
    MinBodyRate::new(1000, Duration::from_millis(200)).grace(Duration::from_secs(1))
}
/// Retry-After is honoured up to this (the servers ask for 1 s).
pub const RETRY_AFTER_CAP: Duration = Duration::from_millis(100);
/// What a call may take past its deadline before the matrix calls it a
/// defect: generous (a loaded CI machine), yet far below any of the
/// defaults a bug would fall back to (10 s attempt, 30 s total).
pub const MARGIN: Duration = Duration::from_millis(1500);
/// Attempts in all per logical request.
pub const MAX_ATTEMPTS: u32 = 3;

/// The planted secret. Its Basic-auth form is checked too.
pub const SECRET: &str = "s3cr3t-Zq9x";

// ===== the spec =====

/// A fault the server (or the network) serves every attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing listens on the port.
    Refused,
    /// The listener's accept queue is full: SYNs go unanswered.
    ConnectHang,
    /// TCP is accepted, the TLS handshake never answered.
    TlsHang,
    /// The request is read, no response head ever comes.
    HeadersHang,
    /// A 200 head announcing 1 KiB, then not one body byte.
    BodyStall,
    /// A 200 with 10 000 bytes sent at 100 B/s.
    Trickle,
    /// Part of a response head, then a TCP reset.
    ResetMidHeaders,
    /// A 200 head and 100 of 1000 body bytes, then a TCP reset.
    ResetMidBody,
    /// A 200 head and 100 of 1000 body bytes, then a clean close.
    TruncatedBody,
    /// The request is read, the connection closed without a byte.
    CloseWithoutResponse,
    /// Every answer is a 503.
    Storm503,
    /// Every answer is a 429 with `Retry-After: 1`.
    Storm429,
}

impl Fault {
    /// Every fault, in the order of the table.
    pub const ALL: [Fault; 12] = [
        Fault::Refused,
        Fault::ConnectHang,
        Fault::TlsHang,
        Fault::HeadersHang,
        Fault::BodyStall,
        Fault::Trickle,
        Fault::ResetMidHeaders,
        Fault::ResetMidBody,
        Fault::TruncatedBody,
        Fault::CloseWithoutResponse,
        Fault::Storm503,
        Fault::Storm429,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Refused => "refused",
            Fault::ConnectHang => "connect hang",
            Fault::TlsHang => "TLS hang",
            Fault::HeadersHang => "headers hang",
            Fault::BodyStall => "body stall",
            Fault::Trickle => "trickle",
            Fault::ResetMidHeaders => "reset mid-headers",
            Fault::ResetMidBody => "reset mid-body",
            Fault::TruncatedBody => "truncated body",
            Fault::CloseWithoutResponse => "close, no response",
            Fault::Storm503 => "503 storm",
            Fault::Storm429 => "429 storm + Retry-After",
        }
    }
}

/// The three ways a request is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// `GET`: idempotent, retried whatever happened.
    Get,
    /// `POST` from a client built with `idempotency_keys(None)`: the client
    /// adds keys by default, so this column needs its own client. Retried
    /// only when the request was provably not sent.
    PostKeysOff,
    /// `POST` from a default client, which adds an `Idempotency-Key`: as
    /// retryable as a GET.
    PostWithKey,
}

impl Column {
    pub const ALL: [Column; 3] = [Column::Get, Column::PostKeysOff, Column::PostWithKey];

    pub fn name(self) -> &'static str {
        match self {
            Column::Get => "GET",
            Column::PostKeysOff => "POST, keys off",
            Column::PostWithKey => "POST + key",
        }
    }

    fn method(self) -> Method {
        match self {
            Column::Get => Method::GET,
            _ => Method::POST,
        }
    }
}

/// How a call ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The call returns this final status (the last attempt's).
    Status(u16),
    /// The call fails before a response head, with this kind.
    Fails(ErrorKind),
    /// The call returns a 200 head; reading its body fails with this kind.
    BodyFails(ErrorKind),
}

/// What one cell of the matrix must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Attempts made (and, where a server is reached, seen by the server).
    pub attempts: u32,
    /// How the call ends.
    pub end: End,
    /// Why the retry loop stopped, when it stopped on a failure.
    pub stop: Option<RetryStop>,
}

const fn x(attempts: u32, end: End, stop: Option<RetryStop>) -> Expect {
    Expect {
        attempts,
        end,
        stop,
    }
}

use End::{BodyFails, Fails, Status};
use ErrorKind::{Body as BodyErr, Connect, Timeout, Transport};
use TimeoutStage::{BodyIdle, BodyRate, Headers};
const ALL_USED: Option<RetryStop> = Some(RetryStop::Attempts);
const NOT_ELIGIBLE: Option<RetryStop> = Some(RetryStop::NotEligible);
/// Three attempts, stopped because all were used.
const fn retried(end: End) -> Expect {
    x(MAX_ATTEMPTS, end, ALL_USED)
}
/// One attempt: a POST without a key whose request may have been processed.
const fn not_eligible(end: End) -> Expect {
    x(1, end, NOT_ELIGIBLE)
}
/// One attempt whose head was a 200: nothing to retry; the body fails later.
const fn body_fails(kind: ErrorKind) -> Expect {
    x(1, BodyFails(kind), None)
}

/// The spec: for each fault, what GET, POST with keys off, and POST with a
/// key must show.
///
/// Read it as: a request that never left (refused, connect hang, TLS hang)
/// is retried whatever its method; one that may have been processed (no
/// head, reset, close, a 503/429) is retried only when it is idempotent (GET,
/// or POST carrying an `Idempotency-Key`); once a 200 head has arrived the
/// call has succeeded, and a body fault surfaces when the body is read, with
/// its own kind and stage, never retried.
pub const MATRIX: [(Fault, [Expect; 3]); 12] = [
    //   fault                        GET                                  POST, keys off                          POST + Idempotency-Key
    (
        Fault::Refused,
        [
            retried(Fails(Connect)),
            retried(Fails(Connect)),
            retried(Fails(Connect)),
        ],
    ),
    (
        Fault::ConnectHang,
        [
            retried(Fails(Timeout(TimeoutStage::Connect))),
            retried(Fails(Timeout(TimeoutStage::Connect))),
            retried(Fails(Timeout(TimeoutStage::Connect))),
        ],
    ),
    (
        Fault::TlsHang,
        [
            retried(Fails(Timeout(TimeoutStage::Tls))),
            retried(Fails(Timeout(TimeoutStage::Tls))),
            retried(Fails(Timeout(TimeoutStage::Tls))),
        ],
    ),
    (
        Fault::HeadersHang,
        [
            retried(Fails(Timeout(Headers))),
            not_eligible(Fails(Timeout(Headers))),
            retried(Fails(Timeout(Headers))),
        ],
    ),
    (
        Fault::BodyStall,
        [
            body_fails(Timeout(BodyIdle)),
            body_fails(Timeout(BodyIdle)),
            body_fails(Timeout(BodyIdle)),
        ],
    ),
    (
        Fault::Trickle,
        [
            body_fails(Timeout(BodyRate)),
            body_fails(Timeout(BodyRate)),
            body_fails(Timeout(BodyRate)),
        ],
    ),
    (
        Fault::ResetMidHeaders,
        [
            retried(Fails(Transport)),
            not_eligible(Fails(Transport)),
            retried(Fails(Transport)),
        ],
    ),
    (
        Fault::ResetMidBody,
        [
            body_fails(BodyErr),
            body_fails(BodyErr),
            body_fails(BodyErr),
        ],
    ),
    (
        Fault::TruncatedBody,
        [
            body_fails(BodyErr),
            body_fails(BodyErr),
            body_fails(BodyErr),
        ],
    ),
    (
        Fault::CloseWithoutResponse,
        [
            retried(Fails(Transport)),
            not_eligible(Fails(Transport)),
            retried(Fails(Transport)),
        ],
    ),
    (
        Fault::Storm503,
        [
            retried(Status(503)),
            not_eligible(Status(503)),
            retried(Status(503)),
        ],
    ),
    (
        Fault::Storm429,
        [
            retried(Status(429)),
            not_eligible(Status(429)),
            retried(Status(429)),
        ],
    ),
];

// ===== running it =====

/// Where secrets go in each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secrets {
    /// No secret anywhere.
    None,
    /// The secret in the URL's userinfo (`user:SECRET@`), the query
    /// (`?api_key=SECRET`), an `x-api-key` header, the body of a POST, and
    /// — when `authorization` — an `Authorization: Bearer SECRET` header
    /// (without it, the transport turns the userinfo into a Basic header).
    Planted { authorization: bool },
}

/// What one cell showed.
#[derive(Debug)]
pub struct CellReport {
    pub fault: Fault,
    pub column: Column,
    pub attempts: u32,
    pub end: End,
    pub stop: Option<RetryStop>,
    pub elapsed: Duration,
    /// `Display`, `Debug` and alternate `Debug` of every error the call
    /// produced, and the `Display` of every error in their `source()` chains.
    pub error_texts: Vec<String>,
    /// Every way the cell differs from the spec (empty: it matches).
    pub problems: Vec<String>,
}

/// The thing the client talks to in one cell.
enum Target {
    Server(FaultServer),
    /// A socket bound to a port and not listening: connects to it are
    /// refused, and no other server can take the port meanwhile (the cells
    /// start dozens of servers at once).
    Refused(TcpSocket),
    /// A listener whose accept queue is full, and the connection filling it.
    Hang(tokio::net::TcpListener, Vec<TcpStream>),
}

impl Target {
    async fn start(fault: Fault) -> Target {
        let server = FaultServer::builder();
        let server = match fault {
            Fault::Refused => {
                let socket = TcpSocket::new_v4().expect("socket");
                socket
                    .bind((std::net::Ipv4Addr::LOCALHOST, 0).into())
                    .expect("bind");
                return Target::Refused(socket);
            }
            Fault::ConnectHang => return hanging_listener().await,
            Fault::TlsHang => server
                .tls()
                .default_connection(ConnectionAction::hang_tls()),
            Fault::HeadersHang => server.default(Action::never_respond()),
            Fault::BodyStall => server.default(Action::stall_body()),
            Fault::Trickle => server.default(Action::status(200).body_len(10_000).trickle(100)),
            Fault::ResetMidHeaders => server.default(Action::reset_mid_headers()),
            Fault::ResetMidBody => {
                server.default(Action::status(200).body_len(1000).reset_after(100))
            }
            Fault::TruncatedBody => {
                server.default(Action::status(200).body_len(1000).truncate_after(100))
            }
            Fault::CloseWithoutResponse => server.default(Action::close()),
            Fault::Storm503 => server.default(Action::status(503).body("busy")),
            Fault::Storm429 => server.default(
                Action::status(429)
                    .header("retry-after", "1")
                    .body("slow down"),
            ),
        };
        Target::Server(server.start().await)
    }

    fn base(&self) -> String {
        match self {
            Target::Server(s) => s.url(""),
            Target::Refused(s) => format!("http://{}", s.local_addr().expect("bound")),
            Target::Hang(l, _) => format!("http://{}", l.local_addr().expect("bound")),
        }
    }

    fn roots(&self) -> Option<rustls::RootCertStore> {
        match self {
            Target::Server(s) => s.root_store(),
            _ => None,
        }
    }

    /// Attempts as the far side counted them: requests read, or, for a TLS
    /// hang, TCP connections accepted. `None` when nothing can count.
    fn seen(&self, fault: Fault) -> Option<u32> {
        match self {
            Target::Server(s) if fault == Fault::TlsHang => Some(s.connections() as u32),
            Target::Server(s) => Some(s.request_count() as u32),
            _ => None,
        }
    }

    async fn stop(self) {
        if let Target::Server(s) = self {
            s.shutdown().await;
        }
    }
}

/// A listener on 127.0.0.1 whose accept queue is full, so a new connect gets
/// no SYN-ACK and hangs (Linux drops SYNs to a full accept queue). Loopback
/// accepts at once otherwise, so this is how a real connect hang is made
/// without a test connector (the ready-made client takes none). The
/// precondition is checked: a probe connect must hang.
async fn hanging_listener() -> Target {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind((std::net::Ipv4Addr::LOCALHOST, 0).into())
        .expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("bound");
    let mut fill = Vec::new();
    // Bounded: a backlog of 0 holds one or two connections.
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(conn)) => fill.push(conn),
            Ok(Err(e)) => panic!("filling the accept queue failed: {e}"),
            // A connect hangs: the queue is full.
            Err(_) => return Target::Hang(listener, fill),
        }
    }
    panic!("could not fill a loopback accept queue: connects never hang on this OS");
}

/// The client of one cell: short timeouts, a retry budget that never
/// refuses (the matrix counts attempts, not the budget), keys on or off by
/// column, and a concurrency limiter the cell checks afterwards.
fn client(
    column: Column,
    roots: Option<rustls::RootCertStore>,
    limiter: &Arc<ConcurrencyLimiter>,
) -> Client {
    let budget = RetryBudget::try_new(10.0, Duration::from_secs(1), 1000).expect("budget");
    let mut builder = Client::builder()
        .total_timeout(TOTAL)
        .attempt_timeout(ATTEMPT)
        .connect_timeout(CONNECT)
        .tls_timeout(TLS)
        .body_idle_timeout(BODY_IDLE)
        .min_body_rate(min_body_rate())
        .max_attempts(MAX_ATTEMPTS)
        .retry_budget(Arc::new(budget))
        .backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(20),
        ))
        .retry_after_cap(RETRY_AFTER_CAP)
        .concurrency_limiter(Arc::clone(limiter))
        .idempotency_keys(
            (column != Column::PostKeysOff).then(rebound::idempotency::IdempotencyKeyLayer::new),
        );
    if let Some(roots) = roots {
        builder = builder.tls_roots(TlsRoots::Custom(roots));
    }
    builder.build().expect("a valid client")
}

fn request(column: Column, base: &str, secrets: Secrets) -> Request<Body> {
    let (scheme, hostport) = base.split_once("://").expect("a base URL");
    let method = column.method();
    let mut req = match secrets {
        Secrets::None => Request::builder()
            .method(method.clone())
            .uri(format!("{scheme}://{hostport}/fault")),
        Secrets::Planted { authorization } => {
            let mut b = Request::builder()
                .method(method.clone())
                .uri(format!(
                    "{scheme}://user:{SECRET}@{hostport}/fault?api_key={SECRET}&page=2"
                ))
                .header("x-api-key", SECRET)
                .header("x-request-id", "matrix-1");
            if authorization {
                b = b.header("authorization", format!("Bearer {SECRET}"));
            }
            b
        }
    };
    if method == Method::POST {
        req = req.header("content-type", "application/json");
    }
    let body = match (method == Method::POST, secrets) {
        (false, _) => Body::empty(),
        (true, Secrets::None) => Body::from(r#"{"order":1}"#),
        (true, Secrets::Planted { .. }) => Body::from(format!(r#"{{"password":"{SECRET}"}}"#)),
    };
    req.body(body).expect("a valid request")
}

fn error_texts(err: &rebound::Error, out: &mut Vec<String>) {
    out.push(err.to_string());
    out.push(format!("{err:?}"));
    out.push(format!("{err:#?}"));
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        out.push(e.to_string());
        out.push(format!("{e:?}"));
        source = e.source();
    }
}

/// Run one cell and check it against `expect`; every mismatch is listed in
/// the report's `problems`.
pub async fn run_cell(
    fault: Fault,
    column: Column,
    expect: Expect,
    secrets: Secrets,
) -> CellReport {
    let cell = format!("[{} × {}]", fault.name(), column.name());
    let target = Target::start(fault).await;
    let limiter = Arc::new(ConcurrencyLimiter::try_new(16).expect("limiter"));
    let client = client(column, target.roots(), &limiter);
    let req = request(column, &target.base(), secrets);

    let start = Instant::now();
    let mut error_texts_out = Vec::new();
    // A hard bound far above the deadline: a hang fails the test, it never
    // blocks it.
    let (end, attempts, stop) = tokio::time::timeout(TOTAL * 5, async {
        match client.send(req).await {
            Ok(res) => {
                let attempts = Attempts::of(res.extensions());
                let stop = res.extensions().get::<RetryStop>().copied();
                let status = res.status().as_u16();
                match res.into_body().collect().await {
                    Ok(_) if status == 200 => panic!("{cell}: the body was read whole"),
                    Ok(_) => (Status(status), attempts, stop),
                    Err(e) => {
                        error_texts(&e, &mut error_texts_out);
                        assert_eq!(status, 200, "{cell}: body error on a {status}: {e:?}");
                        (BodyFails(e.kind()), attempts, stop)
                    }
                }
            }
            Err(e) => {
                error_texts(&e, &mut error_texts_out);
                (Fails(e.kind()), e.attempts(), e.retry_stop())
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{cell}: still running after {:?}", TOTAL * 5));
    let elapsed = start.elapsed();

    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(format!("{cell}: {what}"));
        }
    };
    check(
        end == expect.end,
        format!(
            "ended {end:?}, expected {:?}; errors: {error_texts_out:?}",
            expect.end
        ),
    );
    check(
        attempts == expect.attempts,
        format!(
            "{attempts} attempt(s) counted by the client, expected {}",
            expect.attempts
        ),
    );
    check(
        stop == expect.stop,
        format!("retry loop stopped {stop:?}, expected {:?}", expect.stop),
    );
    if let Some(seen) = target.seen(fault) {
        check(
            seen == expect.attempts,
            format!(
                "{seen} attempt(s) seen by the server, expected {}",
                expect.attempts
            ),
        );
    }
    if let Target::Server(server) = &target {
        let keys: Vec<Option<String>> = server
            .requests()
            .iter()
            .map(|r| r.header("idempotency-key").map(str::to_owned))
            .collect();
        let ok = match column {
            Column::Get | Column::PostKeysOff => keys.iter().all(Option::is_none),
            Column::PostWithKey => keys.iter().all(|k| k.is_some() && *k == keys[0]),
        };
        check(ok, format!("idempotency keys on the wire: {keys:?}"));
    }
    check(
        elapsed < TOTAL + MARGIN,
        format!("took {elapsed:?}, past its deadline {TOTAL:?} + {MARGIN:?}"),
    );
    check(
        limiter.in_flight() == 0,
        "a concurrency permit was left behind".to_owned(),
    );

    drop(client);
    target.stop().await;
    CellReport {
        fault,
        column,
        attempts,
        end,
        stop,
        elapsed,
        error_texts: error_texts_out,
        problems,
    }
}

/// Run every cell of [`MATRIX`], all at once (each has its own server and
/// client), and check each. Returns the reports in table order.
pub async fn run_matrix(secrets: Secrets) -> Vec<CellReport> {
    let cells = MATRIX.iter().flat_map(|(fault, row)| {
        Column::ALL
            .into_iter()
            .zip(row.iter().copied())
            .map(move |(column, expect)| run_cell(*fault, column, expect, secrets))
    });
    let reports = futures_util::future::join_all(cells).await;
    let problems: Vec<&String> = reports.iter().flat_map(|r| &r.problems).collect();
    assert!(
        problems.is_empty(),
        "{} cell(s) differ from the spec:\n{}\n\n{}",
        problems.len(),
        problems
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        render(&reports)
    );
    reports
}

/// Wait until the runtime has no task left alive (connection tasks of the
/// dropped clients' pools, server tasks). Bounded.
pub async fn assert_no_task_left() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} task(s) still alive 5 s after every call ended",
            metrics.num_alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The matrix as a table, one line per fault.
pub fn render(reports: &[CellReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} | {:<36} | {:<36} | {:<36}",
        "fault", "GET", "POST, keys off", "POST + Idempotency-Key"
    );
    for row in reports.chunks(3) {
        let _ = write!(out, "{:<24}", row[0].fault.name());
        for r in row {
            let end = match r.end {
                Status(s) => format!("{s}"),
                Fails(k) => format!("{k}"),
                BodyFails(k) => format!("200; body {}", k.to_string().replace("timeout ", "")),
            };
            let stop = r.stop.map_or("-", |s| s.as_str());
            let _ = write!(
                out,
                " | {}× {:<20} {:<6} {:>4}ms",
                r.attempts,
                end,
                stop.get(..6).unwrap_or(stop),
                r.elapsed.as_millis()
            );
        }
        out.push('\n');
    }
    out
}
