//! A real HTTP server on `127.0.0.1:0` that queues instead of refusing:
//! a fixed number of workers, each request served for a base latency, the
//! rest waiting their turn — so its latency grows with what it holds,
//! and it never answers 429. Optionally it sheds past a queue bound (503),
//! or refuses a set fraction of what it receives (503 or 429).
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::Empty;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use rebound_test::queueing::QueueingServer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let server = QueueingServer::builder()
//!     .workers(2)
//!     .latency(Duration::from_millis(100))
//!     .start()
//!     .await;
//! let client = Client::builder(TokioExecutor::new())
//!     .build_http::<Empty<bytes::Bytes>>();
//! let url: http::Uri = server.url("/work").parse().unwrap();
//!
//! // Six at once on two workers: three rounds of 100 ms.
//! let calls = (0..6).map(|_| client.get(url.clone()));
//! for res in futures_util::future::join_all(calls).await {
//!     assert_eq!(res.unwrap().status(), 200);
//! }
//! let snap = server.snapshot();
//! assert_eq!((snap.received, snap.completed), (6, 6));
//! assert_eq!(snap.in_service_max, 2);
//! assert_eq!(snap.queue_max, 4);
//! // Server-side time (queue wait + service), on the paused clock.
//! assert_eq!(snap.latency.min, Duration::from_millis(100));
//! assert_eq!(snap.latency.max, Duration::from_millis(300));
//! # }
//! ```
//!
//! # The model
//!
//! A request that arrives is first checked against the [`Refusal`] rule,
//! if one is set: a refused request is answered at once (its status, an
//! optional `Retry-After`, an empty body) and never queued. Otherwise it
//! takes a free worker, or waits in a FIFO queue for one; with a
//! [`queue_bound`](QueueingServerBuilder::queue_bound), a request that
//! finds the queue that long is answered **503** at once instead. A worker
//! holds the request for the [latency](QueueingServerBuilder::latency)
//! (`tokio::time::sleep`, so a paused clock runs it instantly), then it is
//! answered **200** `ok`. The request body is read through first. When
//! hyper drops a request whose client went away (an HTTP/2 stream reset
//! at once; a closed HTTP/1.1 connection when hyper notices it), its place
//! in the queue or its worker is freed and it is not counted completed.
//!
//! The latency can be changed while the server runs
//! ([`QueueingServer::set_latency`]), for a slow phase and a recovery.
//!
//! # Counters
//!
//! [`QueueingServer::snapshot`]: received, accepted (queued or served),
//! completed (answered 200), refused (by the rule), shed (queue full), the
//! most in service and the most queued at once, and a [`LatencySummary`]
//! of server-side time (arrival to answer: queue wait plus service) of the
//! completed requests, kept in an HDR histogram (microseconds, 3
//! significant digits, up to an hour: bounded memory whatever the count).
//! [`QueueingServer::reset_latency`] starts a fresh histogram.
//!
//! # Protocols and lifetime
//!
//! HTTP/1.1 with keep-alive and HTTP/2 with prior knowledge (h2c) on the
//! same port. Dropping the server stops every task it started;
//! [`QueueingServer::shutdown`] also waits for them. It logs nothing.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::RETRY_AFTER;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use crate::serve::{self, Body, Running};

/// Which requests a [`QueueingServer`] refuses, and how.
///
/// Both rules are deterministic: they depend only on a request's arrival
/// number (0, 1, 2, … in the order the server received them), so a test
/// run refuses the same requests every time.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    rule: Rule,
    status: StatusCode,
    retry_after: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    /// `refused` of every `of` consecutive arrivals, spread evenly.
    Fraction { refused: u32, of: u32 },
    /// Each arrival refused with `probability`, from a seeded sequence.
    Seeded { probability: f64, seed: u64 },
}

impl Refusal {
    /// Refuses exactly `refused` of every `of` consecutive requests,
    /// spread evenly (`fraction(9, 10)` refuses 9 of each 10, the first of
    /// each ten admitted; `fraction(1, 3)` refuses the 3rd of every 3).
    /// Answers 503 with no `Retry-After` unless set.
    pub fn fraction(refused: u32, of: u32) -> Self {
        Refusal {
            rule: Rule::Fraction { refused, of },
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: None,
        }
    }

    /// Refuses each request with `probability` (0 to 1), drawn from a
    /// sequence fixed by `seed` (SplitMix64 of the arrival number: the same
    /// seed refuses the same arrivals, on every platform and version).
    pub fn seeded(probability: f64, seed: u64) -> Self {
        Refusal {
            rule: Rule::Seeded { probability, seed },
            status: StatusCode::SERVICE_UNAVAILABLE,
            retry_after: None,
        }
    }

    /// The status of a refusal (e.g. 429). Default: 503.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// A `Retry-After` (whole seconds, rounded up) on every refusal.
    /// Default: none.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    fn check(&self) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        match self.rule {
            Rule::Fraction { refused, of } if of == 0 || refused > of => bad(format!(
                "QueueingServer: refusal fraction {refused}/{of} must have 0 < of and refused <= of"
            )),
            Rule::Seeded { probability, .. } if !(0.0..=1.0).contains(&probability) => bad(
                format!("QueueingServer: refusal probability {probability} is not within 0 to 1"),
            ),
            _ if !(self.status.is_client_error() || self.status.is_server_error()) => bad(format!(
                "QueueingServer: refusal status {} is not a 4xx or 5xx",
                self.status
            )),
            _ => Ok(()),
        }
    }

    /// Whether arrival number `n` is refused.
    fn refuses(&self, n: u64) -> bool {
        match self.rule {
            Rule::Fraction { refused, of } => {
                let (refused, of) = (u64::from(refused), u64::from(of));
                let k = n % of;
                (k + 1) * refused / of > k * refused / of
            }
            Rule::Seeded { probability, seed } => {
                let r = splitmix64(seed.wrapping_add(n.wrapping_add(1).wrapping_mul(GAMMA)));
                // The top 53 bits as a uniform value in [0, 1).
                let u = (r >> 11) as f64 / (1u64 << 53) as f64;
                u < probability
            }
        }
    }
}

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output function (Steele, Lea, Flood 2014), written out so
/// that a seed means the same sequence forever (`rand`'s small RNGs do
/// not promise that across versions).
fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Server-side time of the completed requests: arrival to answer, to the
/// microsecond. `min` and `max` are exact; the percentiles are an HDR
/// histogram's (3 significant digits: within 0.1 %). All zero before the
/// first completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencySummary {
    /// Completed requests measured.
    pub count: u64,
    /// The shortest.
    pub min: Duration,
    /// The median.
    pub p50: Duration,
    /// The 90th percentile.
    pub p90: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The longest.
    pub max: Duration,
}

/// The counters of a [`QueueingServer`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueingSnapshot {
    /// Requests received: `received == accepted + refused + shed`.
    pub received: u64,
    /// Requests queued or served (not refused, not shed).
    pub accepted: u64,
    /// Requests answered 200 (accepted ones whose client stayed).
    pub completed: u64,
    /// Requests refused by the [`Refusal`] rule.
    pub refused: u64,
    /// Requests answered 503 because the queue was at its bound.
    pub shed: u64,
    /// Requests being served now.
    pub in_service: usize,
    /// The most served at once (at most the workers).
    pub in_service_max: usize,
    /// Requests waiting for a worker now.
    pub queued: usize,
    /// The most waiting at once.
    pub queue_max: usize,
    /// Server-side time of the completed requests.
    pub latency: LatencySummary,
}

/// Builds a [`QueueingServer`]; made by [`QueueingServer::builder`].
#[derive(Clone, Debug)]
pub struct QueueingServerBuilder {
    workers: usize,
    latency: Duration,
    queue_bound: Option<usize>,
    refusal: Option<Refusal>,
}

impl QueueingServerBuilder {
    /// How many requests are served at once. Default: 4.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// How long a worker holds each request. Default: 10 ms.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// The longest the queue may grow; a request that finds it full is
    /// answered 503 at once. `None`: unbounded. Default: `None`.
    pub fn queue_bound(mut self, bound: impl Into<Option<usize>>) -> Self {
        self.queue_bound = bound.into();
        self
    }

    /// Refuse some requests on arrival (see [`Refusal`]). `None`: refuse
    /// none. Default: `None`.
    pub fn refuse(mut self, refusal: impl Into<Option<Refusal>>) -> Self {
        self.refusal = refusal.into();
        self
    }

    /// Binds `127.0.0.1:0` and starts serving.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for zero workers or a refusal rule that cannot work
    /// (the message says which); otherwise if the port cannot be bound.
    pub async fn try_start(self) -> io::Result<QueueingServer> {
        if self.workers == 0 || self.workers > Semaphore::MAX_PERMITS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "QueueingServer: {} workers: there must be at least 1 (and at most {})",
                    self.workers,
                    Semaphore::MAX_PERMITS
                ),
            ));
        }
        if let Some(refusal) = &self.refusal {
            refusal.check()?;
        }
        let shared = Arc::new(Shared {
            workers: Semaphore::new(self.workers),
            latency_nanos: AtomicU64::new(nanos(self.latency)),
            queue_bound: self.queue_bound,
            refusal: self.refusal,
            arrivals: AtomicU64::new(0),
            received: watch::Sender::new(0),
            accepted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            in_service: AtomicUsize::new(0),
            in_service_max: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            queue_max: AtomicUsize::new(0),
            latencies: Mutex::new(Latencies::new()),
        });
        let handler_state = Arc::clone(&shared);
        let running = serve::start(move |req| handle(Arc::clone(&handler_state), req)).await?;
        Ok(QueueingServer { shared, running })
    }

    /// Like [`try_start`](Self::try_start), for tests.
    ///
    /// # Panics
    ///
    /// If the configuration is refused or the server cannot start; the
    /// message says why.
    pub async fn start(self) -> QueueingServer {
        match self.try_start().await {
            Ok(server) => server,
            Err(e) => panic!("QueueingServer failed to start: {e}"),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Microseconds, 1 µs to 1 h, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    // Valid bounds (low ≥ 1, high ≥ 2 × low, sigfig ≤ 5): cannot fail;
    // fall back to an auto-resizing histogram all the same.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| {
        let mut h = Histogram::new(3).unwrap_or_else(|_| unreachable!());
        h.auto(true);
        h
    })
}

struct Shared {
    workers: Semaphore,
    latency_nanos: AtomicU64,
    queue_bound: Option<usize>,
    refusal: Option<Refusal>,
    arrivals: AtomicU64,
    received: watch::Sender<u64>,
    accepted: AtomicU64,
    completed: AtomicU64,
    refused: AtomicU64,
    shed: AtomicU64,
    in_service: AtomicUsize,
    in_service_max: AtomicUsize,
    queued: AtomicUsize,
    queue_max: AtomicUsize,
    latencies: Mutex<Latencies>,
}

/// Completed requests' server-side times, in microseconds.
struct Latencies {
    histogram: Histogram<u64>,
    min: u64,
    max: u64,
}

impl Latencies {
    fn new() -> Self {
        Latencies {
            histogram: new_histogram(),
            min: u64::MAX,
            max: 0,
        }
    }

    fn record(&mut self, us: u64) {
        self.histogram.saturating_record(us);
        self.min = self.min.min(us);
        self.max = self.max.max(us);
    }

    fn summary(&self) -> LatencySummary {
        let h = &self.histogram;
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = Duration::from_micros;
        LatencySummary {
            count: h.len(),
            min: us(self.min),
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            max: us(self.max),
        }
    }
}

impl Shared {
    fn latencies(&self) -> MutexGuard<'_, Latencies> {
        self.latencies.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts one up on `now` (and its peak) until dropped.
struct Gauge<'a> {
    now: &'a AtomicUsize,
}

impl<'a> Gauge<'a> {
    fn enter(now: &'a AtomicUsize, max: &AtomicUsize) -> Self {
        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(n, Ordering::SeqCst);
        Gauge { now }
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn answer(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *res.status_mut() = status;
    res
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let arrived = Instant::now();
    let _ = http_body_util::BodyExt::collect(req.into_body()).await;
    let n = shared.arrivals.fetch_add(1, Ordering::SeqCst);
    if let Some(refusal) = shared.refusal.as_ref().filter(|r| r.refuses(n)) {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        shared.received.send_modify(|r| *r += 1);
        let mut res = answer(refusal.status, "");
        if let Some(after) = refusal.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        return res;
    }
    let permit = match shared.workers.try_acquire() {
        Ok(permit) => {
            shared.accepted.fetch_add(1, Ordering::SeqCst);
            shared.received.send_modify(|r| *r += 1);
            permit
        }
        Err(_) => {
            let bound = shared.queue_bound;
            let room = shared
                .queued
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                    (bound.is_none_or(|b| q < b)).then_some(q + 1)
                });
            let Ok(before) = room else {
                shared.shed.fetch_add(1, Ordering::SeqCst);
                shared.received.send_modify(|r| *r += 1);
                return answer(StatusCode::SERVICE_UNAVAILABLE, "");
            };
            shared.queue_max.fetch_max(before + 1, Ordering::SeqCst);
            shared.accepted.fetch_add(1, Ordering::SeqCst);
            shared.received.send_modify(|r| *r += 1);
            // Counted in above; this guard only takes it out again.
            let _queued = Gauge {
                now: &shared.queued,
            };
            match shared.workers.acquire().await {
                Ok(permit) => permit,
                // The semaphore is never closed.
                Err(_) => return answer(StatusCode::SERVICE_UNAVAILABLE, ""),
            }
        }
    };
    let _serving = Gauge::enter(&shared.in_service, &shared.in_service_max);
    let latency = Duration::from_nanos(shared.latency_nanos.load(Ordering::SeqCst));
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    drop(permit);
    let took = u64::try_from(arrived.elapsed().as_micros()).unwrap_or(u64::MAX);
    shared.latencies().record(took);
    shared.completed.fetch_add(1, Ordering::SeqCst);
    answer(StatusCode::OK, "ok")
}

/// A loopback HTTP server whose latency grows with the requests it holds.
/// See the [module docs](self) for an example and the model.
///
/// Dropping it stops everything it started.
pub struct QueueingServer {
    shared: Arc<Shared>,
    running: Running,
}

impl fmt::Debug for QueueingServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueingServer")
            .field("addr", &self.running.addr)
            .field("received", &*self.shared.received.borrow())
            .finish_non_exhaustive()
    }
}

impl QueueingServer {
    /// A builder: 4 workers, 10 ms latency, an unbounded queue, no
    /// refusals.
    pub fn builder() -> QueueingServerBuilder {
        QueueingServerBuilder {
            workers: 4,
            latency: Duration::from_millis(10),
            queue_bound: None,
            refusal: None,
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

    /// Changes how long a worker holds each request, from the next
    /// request that starts service.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_nanos
            .store(nanos(latency), Ordering::SeqCst);
    }

    /// Forgets the latencies measured so far (the counters stay).
    pub fn reset_latency(&self) {
        *self.shared.latencies() = Latencies::new();
    }

    /// The counters now.
    pub fn snapshot(&self) -> QueueingSnapshot {
        let s = &self.shared;
        let latency = s.latencies().summary();
        QueueingSnapshot {
            received: *s.received.borrow(),
            accepted: s.accepted.load(Ordering::SeqCst),
            completed: s.completed.load(Ordering::SeqCst),
            refused: s.refused.load(Ordering::SeqCst),
            shed: s.shed.load(Ordering::SeqCst),
            in_service: s.in_service.load(Ordering::SeqCst),
            in_service_max: s.in_service_max.load(Ordering::SeqCst),
            queued: s.queued.load(Ordering::SeqCst),
            queue_max: s.queue_max.load(Ordering::SeqCst),
            latency,
        }
    }

    /// Waits until at least `n` requests have been received, or `timeout`
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

    #[test]
    fn fractions_refuse_exactly_and_evenly() {
        let pattern = |r: Refusal, n: u64| -> String {
            (0..n)
                .map(|i| if r.refuses(i) { 'x' } else { '.' })
                .collect()
        };
        assert_eq!(
            pattern(Refusal::fraction(9, 10), 20),
            ".xxxxxxxxx.xxxxxxxxx"
        );
        assert_eq!(pattern(Refusal::fraction(1, 3), 6), "..x..x");
        assert_eq!(pattern(Refusal::fraction(0, 5), 5), ".....");
        assert_eq!(pattern(Refusal::fraction(4, 4), 4), "xxxx");
    }

    #[test]
    fn seeded_refusals_are_repeatable_and_near_the_probability() {
        let a = Refusal::seeded(0.3, 7);
        let refused = (0..10_000).filter(|&i| a.refuses(i)).count();
        assert!((2_800..=3_200).contains(&refused), "{refused}");
        let b = Refusal::seeded(0.3, 7);
        assert!((0..1_000).all(|i| a.refuses(i) == b.refuses(i)));
        let c = Refusal::seeded(0.3, 8);
        assert!((0..1_000).any(|i| a.refuses(i) != c.refuses(i)));
        assert!(!(0..1_000).any(|i| Refusal::seeded(0.0, 1).refuses(i)));
        assert!((0..1_000).all(|i| Refusal::seeded(1.0, 1).refuses(i)));
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        for (r, says) in [
            (Refusal::fraction(1, 0), "1/0"),
            (Refusal::fraction(3, 2), "3/2"),
            (Refusal::seeded(1.5, 0), "1.5"),
            (Refusal::seeded(f64::NAN, 0), "NaN"),
            (Refusal::fraction(1, 2).status(StatusCode::OK), "200 OK"),
        ] {
            let err = r.check().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains(says), "{err}");
        }
        assert!(Refusal::fraction(1, 2)
            .status(StatusCode::TOO_MANY_REQUESTS)
            .check()
            .is_ok());
    }
}
