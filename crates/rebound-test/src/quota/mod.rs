//! A real HTTP server on `127.0.0.1:0` that enforces a quota — N requests
//! and / or T tokens per window — and says so in the rate-limit headers of
//! one chosen provider family.
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::Empty;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use rebound_test::quota::{HeaderFamily, QuotaServer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let server = QuotaServer::builder()
//!     .requests(2)
//!     .window(Duration::from_secs(60))
//!     .headers(HeaderFamily::Ietf)
//!     .policy_name("burst")
//!     .start()
//!     .await;
//! let client = Client::builder(TokioExecutor::new())
//!     .build_http::<Empty<bytes::Bytes>>();
//! let url: http::Uri = server.url("/v1/chat").parse().unwrap();
//!
//! let mut statuses = Vec::new();
//! let mut last = None;
//! for _ in 0..3 {
//!     let res = client.get(url.clone()).await.unwrap();
//!     statuses.push(res.status().as_u16());
//!     last = Some(res);
//! }
//! assert_eq!(statuses, [200, 200, 429]);
//! let refused = last.unwrap();
//! // The clock is paused: the reset is exactly the window.
//! assert_eq!(refused.headers()["retry-after"], "60");
//! assert_eq!(refused.headers()["ratelimit-policy"], "\"burst\";q=2;w=60");
//! assert_eq!(refused.headers()["ratelimit"], "\"burst\";r=0;t=60");
//!
//! let snap = server.snapshot();
//! assert_eq!((snap.received, snap.accepted, snap.rejected), (3, 2, 1));
//! assert_eq!(snap.windows[0].accepted, 2);
//! # }
//! ```
//!
//! # The quota
//!
//! Time is cut into **fixed windows** of [`window`](QuotaServerBuilder::window)
//! (default 1 s) aligned to the server's start: window `i` covers
//! `[i·W, (i+1)·W)` of `tokio::time` elapsed since
//! [`start`](QuotaServerBuilder::start), so the server follows a paused
//! clock (`start_paused = true`, current-thread runtime) as well as real
//! time. In each window:
//!
//! * [`requests`](QuotaServerBuilder::requests)`(n)`: the first `n`
//!   requests are admitted;
//! * [`tokens`](QuotaServerBuilder::tokens)`(t)`: a request is admitted
//!   while the tokens charged so far plus its **estimate** fit in `t`; it
//!   is then charged its **actual** cost (which may be more or less: an
//!   estimate too low can take the window past `t`, reported as 0
//!   remaining);
//! * [`input_tokens`](QuotaServerBuilder::input_tokens) and
//!   [`output_tokens`](QuotaServerBuilder::output_tokens): the same, in
//!   separate buckets, as Anthropic keeps them.
//!
//! A request must fit every configured quota; one that does not is
//! answered **429** at once, and counts against none of them (refusals
//! are free). A request whose estimate exceeds a whole quota can never be
//! admitted: it gets a 429 in every window. Admitted requests wait the
//! configured [`latency`](QuotaServerBuilder::latency) (none by default)
//! and get a **200** with a JSON body naming the charge:
//! `{"usage":{"input_tokens":I,"output_tokens":O,"total_tokens":T}}`.
//!
//! The costs come from request headers ([`CostHeaders`], all optional,
//! names configurable): `x-test-tokens` (the estimate of the total,
//! default `x-test-input-tokens` + `x-test-output-tokens`),
//! `x-test-actual-tokens` (the actual total, default the estimate, or the
//! input plus the actual output when that is given), `x-test-input-tokens`
//! (known at admission: estimate and actual at once),
//! `x-test-output-tokens` (the output estimate, e.g. `max_tokens`) and
//! `x-test-actual-output-tokens`. A cost header that is not a decimal
//! `u64` gets a **400** naming the header, counted in
//! [`bad_requests`](QuotaSnapshot::bad_requests) and in no window.
//!
//! With a [`daily`](QuotaServerBuilder::daily) quota, a second, longer
//! period (default 24 h, also aligned to start) counts the admitted
//! requests; once it is used up every request gets a 429 whose reset is
//! the end of that period — hours away — and, with
//! [`DailyQuota::problem_json`], an `application/problem+json` body of the
//! draft's type
//! `https://iana.org/assignments/http-problem-types#quota-exceeded` with
//! `"violated-policies":["daily"]`.
//!
//! # Header families
//!
//! Every response (200 and 429) carries the headers of the one
//! [`HeaderFamily`] chosen with [`headers`](QuotaServerBuilder::headers)
//! (default [`HeaderFamily::None`]), describing the quota **after** the
//! request's charge. Resets are the time left in the current window (or
//! day), rounded **up** to the family's unit. A family with one requests
//! dimension reports the more restrictive of the window and the daily
//! quota (fewer remaining). With a quota of 100 requests per 60 s window
//! and 1000 tokens, 40 requests and 300 tokens used, 30 s into the window:
//!
//! | family | headers |
//! |---|---|
//! | [`Ietf`](HeaderFamily::Ietf) | `ratelimit-policy: "default";q=100;w=60` and `ratelimit: "default";r=60;t=30` (a daily quota adds `, "daily";q=..;w=86400` and `, "daily";r=..;t=..`; the name is [`policy_name`](QuotaServerBuilder::policy_name)) |
//! | [`Legacy`](HeaderFamily::Legacy) | `ratelimit-limit: 100`, `ratelimit-remaining: 60`, `ratelimit-reset: 30` |
//! | [`XRateLimit`](HeaderFamily::XRateLimit) | `x-ratelimit-limit: 100`, `x-ratelimit-remaining: 60`, `x-ratelimit-reset: 30` |
//! | [`GitHub`](HeaderFamily::GitHub) | `x-ratelimit-limit: 100`, `x-ratelimit-remaining: 60`, `x-ratelimit-used: 40`, `x-ratelimit-resource: core`, `x-ratelimit-reset: <epoch seconds>` |
//! | [`OpenAi`](HeaderFamily::OpenAi) | `x-ratelimit-limit-requests: 100`, `x-ratelimit-remaining-requests: 60`, `x-ratelimit-reset-requests: 30s`, and `x-ratelimit-{limit,remaining,reset}-tokens: 1000`, `700`, `30s` |
//! | [`Anthropic`](HeaderFamily::Anthropic) | `anthropic-ratelimit-requests-{limit,remaining,reset}: 100`, `60`, `2025-01-01T00:01:00Z`; the same for `tokens`, `input-tokens`, `output-tokens` where configured |
//! | [`Azure`](HeaderFamily::Azure) | `x-ratelimit-remaining-requests: 60`, `x-ratelimit-remaining-tokens: 700`; a 429 adds `retry-after-ms` |
//!
//! Go durations and RFC 3339 times are kept to the millisecond (`1.25s`,
//! `…T00:00:00.25Z`) so that short test windows stay exact; whole
//! seconds print as the providers print them. Wall-clock times are the
//! server's start on the wall clock ([`wall_clock`](QuotaServerBuilder::wall_clock),
//! default now) plus the `tokio::time` elapsed since start.
//!
//! A 429 also carries `Retry-After` (delta seconds, rounded up, so a
//! 200 ms window says `1`), unless [`retry_after`](QuotaServerBuilder::retry_after)
//! is off; that switch also governs Azure's `retry-after-ms`.
//!
//! # Counters
//!
//! [`QuotaServer::snapshot`] gives the totals (received, accepted,
//! rejected, tokens) and the [`WindowStats`] of each window that received
//! a request; [`QuotaServer::records`] the decision on each request. Both
//! are bounded: at most [`max_records`](QuotaServerBuilder::max_records)
//! records (default 100,000) and the last
//! [`max_windows`](QuotaServerBuilder::max_windows) windows (default
//! 10,000), with counts of what was dropped.
//!
//! # Protocols and lifetime
//!
//! HTTP/1.1 with keep-alive and HTTP/2 with prior knowledge (h2c) on the
//! same port. Dropping the server stops every task it started;
//! [`QuotaServer::shutdown`] also waits for them. It logs nothing.

mod headers;
mod ledger;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::watch;
use tokio::time::Instant;

pub use self::headers::HeaderFamily;
pub use self::ledger::{QuotaRecord, QuotaSnapshot, WindowStats};

use self::ledger::{Cost, Ledger, Limits};
use crate::serve::{self, Body, Running};

/// The request headers a [`QuotaServer`] reads a request's cost from.
/// See the [module docs](self#the-quota) for how they combine.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CostHeaders {
    /// The estimated total tokens, admitted on. Default `x-test-tokens`.
    pub tokens: HeaderName,
    /// The actual total tokens, charged. Default `x-test-actual-tokens`.
    pub actual_tokens: HeaderName,
    /// Input tokens (estimate and actual). Default `x-test-input-tokens`.
    pub input_tokens: HeaderName,
    /// Estimated output tokens. Default `x-test-output-tokens`.
    pub output_tokens: HeaderName,
    /// Actual output tokens. Default `x-test-actual-output-tokens`.
    pub actual_output_tokens: HeaderName,
}

impl Default for CostHeaders {
    fn default() -> Self {
        CostHeaders {
            tokens: HeaderName::from_static("x-test-tokens"),
            actual_tokens: HeaderName::from_static("x-test-actual-tokens"),
            input_tokens: HeaderName::from_static("x-test-input-tokens"),
            output_tokens: HeaderName::from_static("x-test-output-tokens"),
            actual_output_tokens: HeaderName::from_static("x-test-actual-output-tokens"),
        }
    }
}

/// A quota over a long period (a day by default), beside the window's;
/// see [`QuotaServerBuilder::daily`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DailyQuota {
    requests: u64,
    period: Duration,
    problem_json: bool,
}

impl DailyQuota {
    /// `requests` admitted requests per period.
    pub fn requests(requests: u64) -> Self {
        DailyQuota {
            requests,
            period: Duration::from_secs(24 * 60 * 60),
            problem_json: false,
        }
    }

    /// The period's length. Default: 24 h.
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Whether a refusal by this quota carries an
    /// `application/problem+json` body of type `quota-exceeded`. Default:
    /// `false` (an empty body).
    pub fn problem_json(mut self, on: bool) -> Self {
        self.problem_json = on;
        self
    }
}

/// Builds a [`QuotaServer`]; made by [`QuotaServer::builder`].
#[derive(Clone, Debug)]
pub struct QuotaServerBuilder {
    window: Duration,
    requests: Option<u64>,
    tokens: Option<u64>,
    input: Option<u64>,
    output: Option<u64>,
    daily: Option<DailyQuota>,
    family: HeaderFamily,
    retry_after: bool,
    policy_name: String,
    cost_headers: CostHeaders,
    latency: Duration,
    max_records: usize,
    max_windows: usize,
    wall_clock: Option<SystemTime>,
}

impl QuotaServerBuilder {
    /// The window's length. Default: 1 s.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Requests admitted per window. Default: no requests quota.
    pub fn requests(mut self, n: u64) -> Self {
        self.requests = Some(n);
        self
    }

    /// Tokens per window, admitted on each request's estimate and charged
    /// its actual cost. Default: no token quota.
    pub fn tokens(mut self, n: u64) -> Self {
        self.tokens = Some(n);
        self
    }

    /// Input tokens per window, a bucket of their own. Default: none.
    pub fn input_tokens(mut self, n: u64) -> Self {
        self.input = Some(n);
        self
    }

    /// Output tokens per window, a bucket of their own. Default: none.
    pub fn output_tokens(mut self, n: u64) -> Self {
        self.output = Some(n);
        self
    }

    /// A daily quota beside the window's. Default: none.
    pub fn daily(mut self, daily: DailyQuota) -> Self {
        self.daily = Some(daily);
        self
    }

    /// The header family every response carries. Default:
    /// [`HeaderFamily::None`].
    pub fn headers(mut self, family: HeaderFamily) -> Self {
        self.family = family;
        self
    }

    /// Whether a 429 carries `Retry-After` (and, for
    /// [`HeaderFamily::Azure`], `retry-after-ms`). Default: `true`.
    pub fn retry_after(mut self, on: bool) -> Self {
        self.retry_after = on;
        self
    }

    /// The window's policy name in the IETF fields (printable ASCII,
    /// without `"` or `\`). Default: `default`.
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy_name = name.into();
        self
    }

    /// The request headers costs are read from. Default:
    /// [`CostHeaders::default`].
    pub fn cost_headers(mut self, headers: CostHeaders) -> Self {
        self.cost_headers = headers;
        self
    }

    /// How long an admitted request takes to answer (`tokio::time`).
    /// Refusals answer at once. Default: zero.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// The most [records](QuotaServer::records) kept. Default: 100,000.
    pub fn max_records(mut self, n: usize) -> Self {
        self.max_records = n;
        self
    }

    /// The most windows kept in the [snapshot](QuotaServer::snapshot)
    /// (the latest ones, at least 1). Default: 10,000.
    pub fn max_windows(mut self, n: usize) -> Self {
        self.max_windows = n;
        self
    }

    /// The wall-clock time of the server's start, for the families that
    /// write times (GitHub's epoch seconds, Anthropic's RFC 3339). Default:
    /// the system clock when the server starts. Fix it for exact
    /// assertions.
    pub fn wall_clock(mut self, at_start: SystemTime) -> Self {
        self.wall_clock = Some(at_start);
        self
    }

    fn check(&self) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if self.window.is_zero() {
            return bad("QuotaServer: the window must be longer than zero".into());
        }
        if self.daily.as_ref().is_some_and(|d| d.period.is_zero()) {
            return bad("QuotaServer: the daily period must be longer than zero".into());
        }
        if !headers::valid_policy_name(&self.policy_name) {
            return bad(format!(
                "QuotaServer: policy name {:?} is not a structured-field string \
                 (printable ASCII without '\"' or '\\', not empty)",
                self.policy_name
            ));
        }
        Ok(())
    }

    /// Binds `127.0.0.1:0` and starts serving; the windows start now.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero window or period or an invalid policy
    /// name (the message says which); otherwise if the port cannot be
    /// bound.
    pub async fn try_start(self) -> io::Result<QuotaServer> {
        self.check()?;
        let limits = Limits {
            window: self.window,
            requests: self.requests,
            tokens: self.tokens,
            input: self.input,
            output: self.output,
            daily: self.daily.as_ref().map(|d| (d.requests, d.period)),
        };
        #[allow(clippy::disallowed_methods)] // the wall clock is what these families write
        let wall_start = self.wall_clock.unwrap_or_else(SystemTime::now);
        let shared = Arc::new(Shared {
            ledger: Mutex::new(Ledger::new(limits, self.max_records, self.max_windows)),
            received: watch::Sender::new(0),
            start: Instant::now(),
            wall_start,
            family: self.family,
            retry_after: self.retry_after,
            policy_name: self.policy_name,
            cost_headers: self.cost_headers,
            latency: self.latency,
            problem_json: self.daily.as_ref().is_some_and(|d| d.problem_json),
        });
        let handler_state = Arc::clone(&shared);
        let running = serve::start(move |req| handle(Arc::clone(&handler_state), req)).await?;
        Ok(QuotaServer { shared, running })
    }

    /// Like [`try_start`](Self::try_start), for tests.
    ///
    /// # Panics
    ///
    /// If the configuration is refused or the server cannot start; the
    /// message says why.
    pub async fn start(self) -> QuotaServer {
        match self.try_start().await {
            Ok(server) => server,
            Err(e) => panic!("QuotaServer failed to start: {e}"),
        }
    }
}

struct Shared {
    ledger: Mutex<Ledger>,
    received: watch::Sender<u64>,
    start: Instant,
    wall_start: SystemTime,
    family: HeaderFamily,
    retry_after: bool,
    policy_name: String,
    cost_headers: CostHeaders,
    latency: Duration,
    problem_json: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // A test kit's counters stay usable after a panic elsewhere.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a request's cost could not be read: the header's name.
struct BadCost(HeaderName);

fn read_cost(names: &CostHeaders, headers: &HeaderMap) -> Result<Cost, BadCost> {
    let num = |name: &HeaderName| -> Result<Option<u64>, BadCost> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| BadCost(name.clone())),
        }
    };
    let input = num(&names.input_tokens)?.unwrap_or(0);
    let est_output = num(&names.output_tokens)?.unwrap_or(0);
    let actual_output = num(&names.actual_output_tokens)?;
    let est_total = num(&names.tokens)?.unwrap_or(input.saturating_add(est_output));
    let output = actual_output.unwrap_or(est_output);
    let total = match (num(&names.actual_tokens)?, actual_output) {
        (Some(t), _) => t,
        (None, Some(o)) => input.saturating_add(o),
        (None, None) => est_total,
    };
    Ok(Cost {
        est_total,
        est_input: input,
        est_output,
        total,
        input,
        output,
    })
}

fn respond(status: StatusCode, content_type: Option<&'static str>, body: Bytes) -> Response<Body> {
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = status;
    if let Some(ct) = content_type {
        res.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    res
}

const PROBLEM: &str = concat!(
    r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
    r#""title":"Request cannot be satisfied as assigned quota has been exceeded","#,
    r#""status":429,"violated-policies":["daily"]}"#
);

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let elapsed = shared.start.elapsed();
    let (parts, body) = req.into_parts();
    // Read the request body through, so the connection stays usable.
    let _ = http_body_util::BodyExt::collect(body).await;
    let cost = read_cost(&shared.cost_headers, &parts.headers);
    let decision = match cost {
        Err(BadCost(name)) => {
            shared.lock().bad_request(elapsed);
            shared.received.send_modify(|n| *n += 1);
            let msg = format!("malformed cost header {name}: expected a decimal integer\n");
            return respond(StatusCode::BAD_REQUEST, Some("text/plain"), msg.into());
        }
        Ok(cost) => {
            let decision = shared.lock().admit(elapsed, cost);
            shared.received.send_modify(|n| *n += 1);
            (decision, cost)
        }
    };
    let (mut decision, cost) = decision;
    decision.reading.wall = shared.wall_start + elapsed;
    let mut res = if decision.status == StatusCode::OK {
        if !shared.latency.is_zero() {
            tokio::time::sleep(shared.latency).await;
        }
        let body = format!(
            r#"{{"usage":{{"input_tokens":{},"output_tokens":{},"total_tokens":{}}}}}"#,
            cost.input, cost.output, cost.total
        );
        respond(StatusCode::OK, Some("application/json"), body.into())
    } else if decision.daily && shared.problem_json {
        respond(
            decision.status,
            Some("application/problem+json"),
            Bytes::from_static(PROBLEM.as_bytes()),
        )
    } else {
        respond(decision.status, None, Bytes::new())
    };
    headers::render(
        shared.family,
        &decision.reading,
        &shared.policy_name,
        shared.retry_after,
        res.headers_mut(),
    );
    res
}

/// A loopback HTTP server enforcing a quota. See the [module docs](self)
/// for an example and the rules.
///
/// Dropping it stops everything it started.
pub struct QuotaServer {
    shared: Arc<Shared>,
    running: Running,
}

impl fmt::Debug for QuotaServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaServer")
            .field("addr", &self.running.addr)
            .field("family", &self.shared.family)
            .field("received", &*self.shared.received.borrow())
            .finish_non_exhaustive()
    }
}

impl QuotaServer {
    /// A builder: 1 s windows, no quota yet, [`HeaderFamily::None`],
    /// `Retry-After` on, policy name `default`, the default
    /// [`CostHeaders`], no latency.
    pub fn builder() -> QuotaServerBuilder {
        QuotaServerBuilder {
            window: Duration::from_secs(1),
            requests: None,
            tokens: None,
            input: None,
            output: None,
            daily: None,
            family: HeaderFamily::None,
            retry_after: true,
            policy_name: "default".to_owned(),
            cost_headers: CostHeaders::default(),
            latency: Duration::ZERO,
            max_records: 100_000,
            max_windows: 10_000,
            wall_clock: None,
        }
    }

    /// The address it listens on (`127.0.0.1` and a free port).
    pub fn addr(&self) -> SocketAddr {
        self.running.addr
    }

    /// `http://127.0.0.1:PORT` followed by `path_and_query`.
    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{path_and_query}", self.running.addr)
    }

    /// When the windows started (`tokio::time`): window `i` begins at
    /// `started_at() + i × window`.
    pub fn started_at(&self) -> Instant {
        self.shared.start
    }

    /// The totals and the windows kept so far.
    pub fn snapshot(&self) -> QuotaSnapshot {
        self.shared.lock().snapshot()
    }

    /// The decision on each request so far, in the order they were
    /// decided (at most the cap of records).
    pub fn records(&self) -> Vec<QuotaRecord> {
        self.shared.lock().records()
    }

    /// How many requests were decided so far (malformed ones included).
    pub fn request_count(&self) -> u64 {
        *self.shared.received.borrow()
    }

    /// Waits until at least `n` requests have been decided, or `timeout`
    /// (`tokio::time`) has passed; `true` if they were.
    pub async fn wait_for_requests(&self, n: u64, timeout: Duration) -> bool {
        serve::wait(&self.shared.received, n, timeout).await
    }

    /// Stops accepting, ends every connection, and waits until every task
    /// the server started is gone.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn costs_combine_as_documented() {
        let names = CostHeaders::default();
        let c = read_cost(&names, &HeaderMap::new()).ok().unwrap();
        assert_eq!(c, Cost::default());
        let c = read_cost(
            &names,
            &headers(&[("x-test-tokens", "100"), ("x-test-actual-tokens", "70")]),
        )
        .ok()
        .unwrap();
        assert_eq!((c.est_total, c.total), (100, 70));
        let c = read_cost(
            &names,
            &headers(&[
                ("x-test-input-tokens", "10"),
                ("x-test-output-tokens", "50"),
                ("x-test-actual-output-tokens", "20"),
            ]),
        )
        .ok()
        .unwrap();
        assert_eq!(
            (c.est_total, c.total, c.input, c.est_output, c.output),
            (60, 30, 10, 50, 20)
        );
        for bad in ["-1", "1.5", "", "12abc", "99999999999999999999999"] {
            let h = headers(&[("x-test-tokens", "1")]);
            let mut h = h;
            h.insert("x-test-output-tokens", HeaderValue::from_str(bad).unwrap());
            match read_cost(&names, &h) {
                Err(BadCost(name)) => assert_eq!(name, "x-test-output-tokens"),
                Ok(c) => panic!("{bad:?} read as {c:?}"),
            }
        }
    }
}
