//! Client-side adaptive throttling (Google SRE, "Handling Overload"): a
//! client that sheds its own overload, per host, before a request is sent.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use rebound_core::throttle::{ClientThrottle, ClientThrottleLayer};
//! use rebound_core::ErrorKind;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let layer = ClientThrottleLayer::try_new(ClientThrottle::default().seed(1)).unwrap();
//! let throttle = layer.throttle().clone();
//! // A host that refuses everything.
//! let svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(service_fn(|_req: Request<()>| async {
//!         let mut res = Response::new(());
//!         *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!         Ok::<_, Infallible>(res)
//!     }));
//! let uri: http::Uri = "https://api.example/v1".parse().unwrap();
//! let (mut sent, mut shed) = (0, 0);
//! for _ in 0..100 {
//!     match svc.clone().oneshot(Request::get(uri.clone()).body(()).unwrap()).await {
//!         Ok(_) => sent += 1,
//!         Err(e) if e.kind() == ErrorKind::ClientThrottled => shed += 1,
//!         Err(e) => panic!("{e}"),
//!     }
//! }
//! // With no accepts the probability is requests / (requests + 1):
//! // almost everything is shed locally after the first few.
//! assert!(shed > 80, "{sent} sent, {shed} shed");
//! assert!(throttle.probability(&uri) > 0.9);
//! # }
//! ```
//!
//! # The rule
//!
//! For each host (its authority, keyed as the [host table](crate::host)
//! keys it) the throttle counts, over a sliding **window** (default
//! 2 minutes, kept in 12 buckets of 10 s):
//!
//! * `requests`: the attempts the application asked for, **including**
//!   those the throttle shed;
//! * `accepts`: the attempts the host accepted: a response whose status is
//!   not 429 or 503. (A 429/503, an attempt timeout, a connect failure or
//!   any other error is not an accept.)
//!
//! and sheds a new attempt locally with probability
//!
//! ```text
//! p = max(0, (requests − K × accepts) / (requests + 1))
//! ```
//!
//! with `K` = 2 by default (the book's suggestion: the client sends up to
//! twice what the backend accepts; a lower `K` sheds sooner). While the
//! host accepts more than `1/K` of what is asked, `p` is 0 and nothing is
//! shed; a host that accepts nothing is asked about once in `requests + 1`.
//!
//! A shed attempt fails at once with
//! [`ErrorKind::ClientThrottled`], **not sent**
//! ([`Sent::NotSent`]), with a `Fatal` verdict: the retry loop does not
//! retry it, and a retry it cut short gives its budget token back.
//!
//! # What it achieves, and what it cannot
//!
//! Against a host of **fixed capacity** `C` (it refuses what comes past
//! `C`, as rebound-test's `QueueingServer` with `workers(C)` and
//! `queue_bound(0)` does), a client offering ten times `C` would send 10 ×
//! what is accepted; with the throttle it sends at most about `K × C`, so
//! the host receives about `K` times what it accepts. Against a host that
//! refuses a **random share** of whatever it receives, no client-side rule
//! changes the host's ratio (it is 10 for a 90 % refusal whatever is sent):
//! the throttle then only cuts the volume sent.
//!
//! # Cost
//!
//! Off by default in the ready-made client (one `None`). On, each attempt
//! hashes its host (once per request, shared with the gate and the
//! breaker), reads the clock and takes the throttle's mutex twice (to count
//! the request, then the accept).
//!
//! # Bounded
//!
//! At most [`max_hosts`](ClientThrottle::max_hosts) hosts are kept (default
//! 1024), the least recently used evicted past that (it starts again with
//! nothing counted).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode, Uri};
use pin_project_lite::pin_project;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Reason, Sent, Verdict};
use crate::error::{BoxError, Error, ErrorKind};
use crate::host::{HostRef, KeyHasher};

/// The settings of a [`Throttle`]; checked when it is built. See the
/// [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientThrottle {
    k: f64,
    window: Duration,
    buckets: u32,
    max_hosts: usize,
    seed: Option<u64>,
}

impl Default for ClientThrottle {
    fn default() -> Self {
        ClientThrottle {
            k: 2.0,
            window: Duration::from_secs(120),
            buckets: 12,
            max_hosts: 1024,
            seed: None,
        }
    }
}

impl ClientThrottle {
    /// The multiplier `K` of the accepts, at least 1. Default is 2.
    pub fn k(mut self, k: f64) -> Self {
        self.k = k;
        self
    }

    /// The sliding window. Default is 2 minutes.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The buckets the window is kept in, 1 to 600 (each at least 1 ms).
    /// Default is 12 (10 s each).
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// The most hosts counted. Default is 1024.
    pub fn max_hosts(mut self, max_hosts: usize) -> Self {
        self.max_hosts = max_hosts;
        self
    }

    /// Seed the RNG of the shedding draw, for reproducible runs. Default:
    /// seeded from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::config(format!("client throttle: {what}")));
        if !(self.k >= 1.0 && self.k.is_finite()) {
            return bad(format!("k must be at least 1, got {}", self.k));
        }
        if !(1..=600).contains(&self.buckets) {
            return bad(format!("buckets must be in 1..=600, got {}", self.buckets));
        }
        if self.window / self.buckets < Duration::from_millis(1) {
            return bad(format!(
                "window ({:?}) must give each of its {} buckets at least 1 ms",
                self.window, self.buckets
            ));
        }
        if self.max_hosts == 0 {
            return bad("max_hosts must be at least 1".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// The bucket's number since the throttle's base; its counts are
    /// stale when it is not the number of the bucket now.
    index: u64,
    requests: u64,
    accepts: u64,
}

struct HostWindow {
    buckets: Box<[Bucket]>,
    used: u64,
}

struct Hosts {
    by_key: HashMap<u64, HostWindow, BuildHasherDefault<KeyHasher>>,
    uses: u64,
    rng: SmallRng,
}

/// The shared state of client-side throttling: per host, a sliding window
/// of requests and accepts. See the [module docs](self).
pub struct Throttle {
    cfg: ClientThrottle,
    bucket_ns: u64,
    base: Instant,
    hosts: Mutex<Hosts>,
}

/// What [`Throttle::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Admit {
    /// Send it; the probability was this.
    Go(f64),
    /// Shed it locally; the probability was this.
    Shed(f64),
}

impl Throttle {
    /// A throttle of the given settings.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(cfg: ClientThrottle) -> Self {
        crate::config::expect_valid("Throttle::new", Self::try_new(cfg))
    }

    /// A throttle of the given settings.
    ///
    /// # Errors
    ///
    /// A [`Config`](ErrorKind::Config) error unless `k >= 1`, the buckets
    /// are 1 to 600 of at least 1 ms each and `max_hosts >= 1`; the message
    /// names the setting.
    pub fn try_new(cfg: ClientThrottle) -> Result<Self, Error> {
        cfg.validate()?;
        let bucket_ns = u64::try_from((cfg.window / cfg.buckets).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        Ok(Throttle {
            cfg,
            bucket_ns,
            base: Instant::now(),
            hosts: Mutex::new(Hosts {
                by_key: HashMap::default(),
                uses: 0,
                rng: match cfg.seed {
                    Some(seed) => SmallRng::seed_from_u64(seed),
                    None => SmallRng::from_os_rng(),
                },
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &ClientThrottle {
        &self.cfg
    }

    /// Hosts counted now.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Whether no host is counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The probability that the next attempt to `uri`'s host is shed now.
    pub fn probability(&self, uri: &Uri) -> f64 {
        let key = HostRef::of(uri).key();
        let now = self.bucket(Instant::now());
        let hosts = self.lock();
        hosts.by_key.get(&key).map_or(0.0, |w| self.p(w, now))
    }

    /// `(requests, accepts)` of `uri`'s host in the window now.
    pub fn counts(&self, uri: &Uri) -> (u64, u64) {
        let key = HostRef::of(uri).key();
        let now = self.bucket(Instant::now());
        let hosts = self.lock();
        hosts.by_key.get(&key).map_or((0, 0), |w| self.sums(w, now))
    }

    fn lock(&self) -> MutexGuard<'_, Hosts> {
        // Counters only: consistent even if a holder panicked.
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bucket(&self, now: Instant) -> u64 {
        let ns =
            u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        ns / self.bucket_ns
    }

    fn sums(&self, w: &HostWindow, now: u64) -> (u64, u64) {
        let oldest = now.saturating_sub(u64::from(self.cfg.buckets) - 1);
        w.buckets
            .iter()
            .filter(|b| b.index >= oldest && b.index <= now && (b.requests | b.accepts) != 0)
            .fold((0, 0), |(r, a), b| (r + b.requests, a + b.accepts))
    }

    fn p(&self, w: &HostWindow, now: u64) -> f64 {
        let (requests, accepts) = self.sums(w, now);
        let r = requests as f64;
        ((r - self.cfg.k * accepts as f64) / (r + 1.0)).max(0.0)
    }

    fn current<'a>(&self, w: &'a mut HostWindow, now: u64) -> &'a mut Bucket {
        let n = w.buckets.len() as u64;
        let b = &mut w.buckets[(now % n) as usize];
        if b.index != now {
            *b = Bucket {
                index: now,
                ..Bucket::default()
            };
        }
        b
    }

    /// Count an attempt to the host `key` and decide whether it is shed.
    pub(crate) fn admit(&self, key: u64, now: Instant) -> Admit {
        let now = self.bucket(now);
        let mut guard = self.lock();
        let hosts = &mut *guard;
        hosts.uses += 1;
        let used = hosts.uses;
        if !hosts.by_key.contains_key(&key) && hosts.by_key.len() >= self.cfg.max_hosts {
            let lru = hosts
                .by_key
                .iter()
                .min_by_key(|(_, w)| w.used)
                .map(|(k, _)| *k);
            if let Some(lru) = lru {
                hosts.by_key.remove(&lru);
            }
        }
        let w = hosts.by_key.entry(key).or_insert_with(|| HostWindow {
            buckets: vec![Bucket::default(); self.cfg.buckets as usize].into_boxed_slice(),
            used,
        });
        w.used = used;
        let p = self.p(w, now);
        self.current(w, now).requests += 1;
        if p > 0.0 && hosts.rng.random::<f64>() < p {
            Admit::Shed(p)
        } else {
            Admit::Go(p)
        }
    }

    /// Count an accept by the host `key` (an attempt it answered with a
    /// status other than 429 or 503).
    pub(crate) fn accepted(&self, key: u64, now: Instant) {
        let now = self.bucket(now);
        let mut hosts = self.lock();
        if let Some(w) = hosts.by_key.get_mut(&key) {
            self.current(w, now).accepts += 1;
        }
    }
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("config", &self.cfg)
            .field("hosts", &self.len())
            .finish()
    }
}

/// Whether an attempt's outcome is an accept by its host.
pub(crate) fn is_accept<B>(out: &Result<Response<B>, Error>) -> bool {
    matches!(out, Ok(res) if !matches!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ))
}

/// The error of a shed attempt: not sent, not retried.
pub(crate) fn shed_error(method: &http::Method, uri: &Uri, p: f64) -> Error {
    let mut err = Error::new(ErrorKind::ClientThrottled)
        .with_detail(if p >= 0.5 {
            "the host accepted few requests lately: shed locally"
        } else {
            "shed locally to follow what the host accepts"
        })
        .with_request(method, uri);
    let ext = err.extensions_mut();
    ext.insert(Sent::NotSent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("client throttled"),
    });
    ext.insert(ThrottleProbability(p));
    // The refusal's event: the probability, never the host or the URL.
    tracing::debug!(
        rebound.throttle_probability = p,
        "attempt shed by client-side throttling"
    );
    #[cfg(feature = "metrics")]
    crate::metrics::record_throttle_shed(p);
    err
}

/// On a shed attempt's error: the throttle's probability of shedding when
/// it was shed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleProbability(pub f64);

// === the layer ===

/// Client-side adaptive throttling as a tower layer; see the
/// [module docs](self).
///
/// # Clone
///
/// Clones share the same [`Throttle`].
#[derive(Debug, Clone)]
pub struct ClientThrottleLayer {
    throttle: Arc<Throttle>,
}

impl ClientThrottleLayer {
    /// A layer with a new throttle of the given settings.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it.
    #[track_caller]
    pub fn new(cfg: ClientThrottle) -> Self {
        crate::config::expect_valid("ClientThrottleLayer::new", Self::try_new(cfg))
    }

    /// A layer with a new throttle of the given settings.
    ///
    /// # Errors
    ///
    /// See [`Throttle::try_new`].
    pub fn try_new(cfg: ClientThrottle) -> Result<Self, Error> {
        Ok(Self::shared(Arc::new(Throttle::try_new(cfg)?)))
    }

    /// A layer over a throttle shared with other layers or clients.
    pub fn shared(throttle: Arc<Throttle>) -> Self {
        ClientThrottleLayer { throttle }
    }

    /// The throttle, to observe or to share.
    pub fn throttle(&self) -> &Arc<Throttle> {
        &self.throttle
    }
}

impl<S> Layer<S> for ClientThrottleLayer {
    type Service = ClientThrottleService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientThrottleService {
            inner,
            throttle: Arc::clone(&self.throttle),
        }
    }
}

/// The service of [`ClientThrottleLayer`]. Place it below the retry layer
/// so that each attempt is counted (and a retry can be shed).
#[derive(Debug, Clone)]
pub struct ClientThrottleService<S> {
    inner: S,
    throttle: Arc<Throttle>,
}

impl<S, B, ResB> Service<Request<B>> for ClientThrottleService<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = ThrottleFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let key = HostRef::of(req.uri()).key();
        match self.throttle.admit(key, Instant::now()) {
            Admit::Shed(p) => ThrottleFuture {
                inner: Inner::Shed {
                    err: Some(shed_error(req.method(), req.uri(), p)),
                },
            },
            Admit::Go(_) => ThrottleFuture {
                inner: Inner::Called {
                    fut: self.inner.call(req),
                    throttle: Arc::clone(&self.throttle),
                    key,
                },
            },
        }
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<F> {
        // Sent: counts the accept when the head arrives.
        Called { #[pin] fut: F, throttle: Arc<Throttle>, key: u64 },
        // Shed locally.
        Shed { err: Option<Error> },
    }
}

pin_project! {
    /// The response future of [`ClientThrottleService`].
    #[must_use = "futures do nothing unless polled"]
    pub struct ThrottleFuture<F> {
        #[pin]
        inner: Inner<F>,
    }
}

impl<F> fmt::Debug for ThrottleFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.inner {
            Inner::Called { .. } => "called",
            Inner::Shed { .. } => "shed",
        };
        f.debug_struct("ThrottleFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, ResB, E> Future for ThrottleFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<ResB>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().inner.project() {
            InnerProj::Shed { err } => {
                Poll::Ready(Err(err.take().expect("polled after completion")))
            }
            InnerProj::Called { fut, throttle, key } => {
                let out = std::task::ready!(fut.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
                if is_accept(&out) {
                    throttle.accepted(*key, Instant::now());
                }
                Poll::Ready(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_probability_follows_the_sre_formula_over_the_window() {
        let t = Throttle::try_new(ClientThrottle::default().seed(5)).unwrap();
        let uri: Uri = "http://a/x".parse().unwrap();
        let key = HostRef::of(&uri).key();
        // 10 requests, 5 accepts: 10 - 2×5 = 0.
        for i in 0..10 {
            assert!(matches!(t.admit(key, Instant::now()), Admit::Go(_)));
            if i % 2 == 0 {
                t.accepted(key, Instant::now());
            }
        }
        assert_eq!(t.probability(&uri), 0.0);
        // 10 more refused: (20 - 10) / 21.
        for _ in 0..10 {
            t.admit(key, Instant::now());
        }
        let (r, a) = t.counts(&uri);
        assert_eq!(a, 5);
        assert!((t.probability(&uri) - (r as f64 - 10.0) / (r as f64 + 1.0)).abs() < 1e-9);
        // Past the window, nothing is counted.
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(t.counts(&uri), (0, 0));
        assert_eq!(t.probability(&uri), 0.0);
    }

    #[test]
    fn bad_settings_are_named() {
        for (bad, name) in [
            (ClientThrottle::default().k(0.5), "k must"),
            (ClientThrottle::default().k(f64::NAN), "k must"),
            (ClientThrottle::default().buckets(0), "buckets"),
            (
                ClientThrottle::default()
                    .window(Duration::from_millis(5))
                    .buckets(10),
                "window",
            ),
            (ClientThrottle::default().max_hosts(0), "max_hosts"),
        ] {
            let err = Throttle::try_new(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config);
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn hosts_are_bounded() {
        let t = Throttle::try_new(ClientThrottle::default().max_hosts(2)).unwrap();
        for h in ["a", "b", "c"] {
            let uri: Uri = format!("http://{h}/").parse().unwrap();
            t.admit(HostRef::of(&uri).key(), Instant::now());
        }
        assert_eq!(t.len(), 2);
    }
}
