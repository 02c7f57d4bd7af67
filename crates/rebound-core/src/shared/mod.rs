//! One quota and one Retry-After pause per host for a whole fleet of
//! replicas: host state kept in a shared store (Redis: the
//! `rebound-redis` crate), safe when the store is not.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::Arc;
//! use rebound_core::shared::{HostStore, SharedConfig, SharedState, SharedStateLayer};
//! # use rebound_core::shared::{HostId, Lease, Observation, PauseSink, StoreFuture};
//! # use std::time::Duration;
//! # #[derive(Debug)]
//! # struct NoStore;
//! # impl HostStore for NoStore {
//! #     fn lease(&self, _: HostId, _: u64) -> StoreFuture<Lease> { Box::pin(async { Ok(Lease::Untracked) }) }
//! #     fn give_back(&self, _: HostId, _: u64, _: u64) -> StoreFuture<()> { Box::pin(async { Ok(()) }) }
//! #     fn observe(&self, _: HostId, _: Observation) -> StoreFuture<()> { Box::pin(async { Ok(()) }) }
//! #     fn pause(&self, _: HostId, _: Duration) -> StoreFuture<()> { Box::pin(async { Ok(()) }) }
//! #     fn watch(&self, _: PauseSink) -> StoreFuture<()> { Box::pin(std::future::pending()) }
//! # }
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! // In a real fleet: `rebound_redis::RedisStore::new("redis://…", "my-service")`.
//! let store: Arc<dyn HostStore> = Arc::new(NoStore);
//! let shared = SharedState::new(store, SharedConfig::new());
//! let svc = ServiceBuilder::new()
//!     .layer(SharedStateLayer::new(shared))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, Infallible>(http::Response::new(()))
//!     }));
//! let req = http::Request::get("https://api.example/v1").body(()).unwrap();
//! assert_eq!(svc.oneshot(req).await?.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
//! # What is shared
//!
//! * **The request quota of each host.** A replica's first request to a
//!   host goes alone: the others wait for its answer (at most 500 ms,
//!   bounded by their deadline), which says whether the host has a quota
//!   to share, so a fleet that starts at once does not spend a window
//!   before it knows. The first response whose
//!   rate-limit headers name a request quota (any family
//!   [`ratelimit::parse`](crate::ratelimit::parse) reads) makes the host
//!   *tracked*: its remaining count and reset go to the store, which keeps
//!   one count for the fleet (a token bucket in one server-side script:
//!   what the server said was left, less what replicas took since, refilled
//!   to the limit at the reset). A request to a tracked host takes one
//!   request from its replica's **lease**, a batch taken from the shared
//!   count; only an empty lease costs a round trip. The lease's size adapts
//!   to the replica's rate (its requests of the last lease, spread over
//!   [`lease_period`](SharedConfig::lease_period), 100 ms; at most
//!   [`max_lease`](SharedConfig::max_lease), 32), so a busy replica makes
//!   about ten round trips a second per host and a quiet one takes one
//!   request at a time. A lease ends at the window's reset, or after
//!   [`lease_ttl`](SharedConfig::lease_ttl) (1 s), when what is left of it
//!   is given back. A lease of zero (the shared count is out) holds the
//!   host's requests until the reset, bounded by each request's
//!   [`Deadline`] (a reset after it fails the request at once with
//!   [`ErrorKind::QuotaExhausted`], not sent). After each lease, the next
//!   response's headers are sent to the store: the server's count corrects
//!   the shared one (it only lowers it within a window).
//!   A host whose responses name an IETF partition key (`pk`) has one
//!   shared count per partition, named by the host's [`HostId`] and the
//!   key's stable hash (FNV-1a: the same in every build of a fleet).
//! * **The Retry-After pause of each host.** A 429 with a Retry-After
//!   seen by any replica (by this layer, or by a gate over a
//!   [`HostTable`] given to [`attach`](SharedState::attach)) is written to
//!   the store with a time to live of the pause and published; every
//!   replica closes its gate at once (and its attached table's, so the
//!   retries inside the stack hold too), without polling. A replica that
//!   (re)connects reads the pauses in force.
//!
//! # How far over the quota the fleet can go
//!
//! Within a window every leased request was taken from the shared count,
//! which never exceeds what the server last said was left; so leased
//! requests alone never exceed the quota in a window they were leased in.
//! The fleet can go over by:
//!
//! 1. **Leases crossing a reset:** a replica's last leased requests sent
//!    just before its lease ends, received by the server after its window
//!    rolled, count in the next window, whose shared count is full: at
//!    most `replicas × max_lease` per window (4 × 32 = 128 by default; the
//!    lease ends at the reset the store computed on its own clock, so
//!    replicas' clocks play no part).
//! 2. **Unleased requests:** those sent before the host was tracked (one
//!    per replica: its first request; more when it took over 500 ms to
//!    answer, or a lease was asked before its observation reached the
//!    store), during a fall-back to local state (the store down;
//!    the local pacer still paces by the headers), and the retries inside
//!    the stack (a layer above the retry loop leases once per request;
//!    the response's [`Attempts`] then
//!    charge its retries to the shared count after the fact, as the
//!    host's lease debt, so they overshoot only until that write lands).
//!
//! A lease's unused requests given back after its window reset are
//! ignored by the store (it compares the lease's window with its own), so
//! a late give-back never adds to a refilled count.
//!
//! `tests/shared_state.rs` checks the first bound against a real quota
//! server and a real Redis: four replicas, after the first window, draw no
//! more 429s per window than `replicas × max_lease`.
//!
//! # Safe when the store is not
//!
//! Every call to the store is bounded by
//! [`call_timeout`](SharedConfig::call_timeout) (5 ms by default). A
//! failed or timed-out call counts against a breaker; after
//! [`failures_to_open`](SharedConfig::failures_to_open) (2) in a row the
//! breaker opens (failures within one call timeout of the last one counted
//! are one: calls in flight together time out together when the process is
//! not scheduled for a few ms): the store is not called for
//! [`probe_interval`](SharedConfig::probe_interval) (500 ms), then one
//! call probes it; a success rejoins. While open, requests use local state
//! only (the pacer, the local gates) — **fail-open**, the default — or,
//! with [`fail_closed`](SharedConfig::fail_closed), a request to a tracked
//! host fails at once with [`ErrorKind::QuotaExhausted`], not sent. One
//! WARN says the store is unavailable (its error kind; no URL, no key, no
//! value), one INFO that it is back. A request never waits for the store
//! longer than the call timeout, nor past its deadline.
//!
//! # Cost
//!
//! A client without shared state pays nothing. With it, a request to a
//! host with a lease in hand is admitted synchronously
//! ([`admit_now`](SharedState::admit_now): no future, no allocation): its
//! scheme and authority are folded to lower case and hashed 8 bytes at a
//! time (FxHash's step; the maps keyed by it hash no more), one
//! uncontended lock is taken and the lease decremented; its response is
//! read (its headers parsed) only when an observation is due. The stable
//! [`HostId`] and the host table's key are hashed once per host. The
//! layer's future is named ([`SharedStateFuture`]): boxed only for an
//! admission that waits. See BENCHMARKS.md for the count.
//!
//! # Why a lease, not a call per request
//!
//! A round trip per request (a GCRA check per call) would put the store's
//! latency and availability on every request; a lease makes it one round
//! trip per batch, at the price of the overshoot bound above. Background
//! refills were left out: they spend quota a replica may not use.
//!
//! # Tasks
//!
//! A [`SharedState`] starts two tasks (at its first request): one watches
//! the store's pauses, one performs the writes no request waits for (an
//! observation, a pause, a lease given back, a debt charged), up to 16 at
//! once, each bounded by the call timeout. A request never spawns: it queues its
//! write (a bounded queue of 1024; a write that finds it full is dropped
//! and counted by [`dropped_writes`](SharedState::dropped_writes)). Both
//! tasks end when the last clone of the state is dropped.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use pin_project_lite::pin_project;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Attempts, Deadline, Reason, RetryAfterHint, Sent, Verdict};
use crate::error::{BoxError, Error, ErrorKind};
use crate::host::{HostRef, HostTable};
use crate::ratelimit::parse::{self, Dimension};

mod store;

pub use self::store::{
    HostId, HostStore, Lease, Observation, PauseSink, StoreError, StoreErrorKind, StoreFuture,
};

/// Hosts kept per [`SharedState`]; past that, the oldest entry goes.
const MAX_HOSTS: usize = 4096;
/// Pauses kept for hosts this replica has not called yet.
const MAX_PENDING: usize = 1024;
/// How long requests wait for the next answer when the shared count is out
/// and the store does not know the reset.
const PROBE: Duration = Duration::from_millis(50);

// ===== settings =====

/// How a [`SharedState`] uses its store. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct SharedConfig {
    call_timeout: Duration,
    failures_to_open: u32,
    probe_interval: Duration,
    fail_closed: bool,
    max_lease: u64,
    lease_period: Duration,
    lease_ttl: Duration,
    max_wait: Duration,
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig {
            call_timeout: Duration::from_millis(5),
            failures_to_open: 2,
            probe_interval: Duration::from_millis(500),
            fail_closed: false,
            max_lease: 32,
            lease_period: Duration::from_millis(100),
            lease_ttl: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
        }
    }
}

impl SharedConfig {
    /// The defaults: calls bounded by 5 ms, the breaker open after 2
    /// failures and probing every 500 ms, fail-open, leases of at most 32
    /// sized for 100 ms and kept at most 1 s, waits of at most 60 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest a request waits for one call to the store. Default 5 ms.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Failed calls in a row that open the breaker (failures within one
    /// [`call_timeout`](Self::call_timeout) of the last one counted count
    /// once). Default 2.
    pub fn failures_to_open(mut self, n: u32) -> Self {
        self.failures_to_open = n;
        self
    }

    /// How long the breaker stays open before a call probes the store.
    /// Default 500 ms.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// While the store is unavailable, fail requests to tracked hosts
    /// (`true`) instead of pacing them locally (`false`, the default).
    pub fn fail_closed(mut self, enabled: bool) -> Self {
        self.fail_closed = enabled;
        self
    }

    /// The largest lease a replica takes. Default 32.
    pub fn max_lease(mut self, n: u64) -> Self {
        self.max_lease = n;
        self
    }

    /// A lease is sized for this much of the replica's rate. Default 100 ms.
    pub fn lease_period(mut self, period: Duration) -> Self {
        self.lease_period = period;
        self
    }

    /// The longest a lease is kept; what is left then is given back.
    /// Default 1 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The longest a request without a deadline waits for the shared
    /// quota or a pause. Default 60 s.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let durations = [
            ("call_timeout", self.call_timeout),
            ("probe_interval", self.probe_interval),
            ("lease_period", self.lease_period),
            ("lease_ttl", self.lease_ttl),
            ("max_wait", self.max_wait),
        ];
        for (what, d) in durations {
            if d.is_zero() && what != "max_wait" {
                return Err(Error::config(format!(
                    "shared state: {what} must be above zero"
                )));
            }
            if d > crate::config::MAX_DURATION {
                return Err(Error::config(format!(
                    "shared state: {what} must be at most {:?}, got {d:?}",
                    crate::config::MAX_DURATION
                )));
            }
        }
        if self.failures_to_open == 0 {
            return Err(Error::config(
                "shared state: failures_to_open must be at least 1",
            ));
        }
        if !(1..=1 << 20).contains(&self.max_lease) {
            return Err(Error::config(format!(
                "shared state: max_lease must be within 1..={}, got {}",
                1 << 20,
                self.max_lease
            )));
        }
        Ok(())
    }
}

// ===== the breaker around the store =====

#[derive(Debug)]
struct Breaker {
    failures: AtomicU32,
    /// ns since `base` of the last failure counted in `failures`.
    last_failure: AtomicU64,
    /// Calls failed or timed out, in all.
    failed: AtomicU64,
    /// Times the breaker opened, in all.
    openings: AtomicU64,
    /// ns since `base` until which the store is not called; 0: closed.
    open_until: AtomicU64,
    warned: AtomicBool,
    base: Instant,
}

impl Breaker {
    /// Closed, nothing counted; its clock starts now.
    fn new() -> Self {
        Breaker {
            failures: AtomicU32::new(0),
            last_failure: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            openings: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            base: Instant::now(),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn allows(&self, now: Instant) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        until == 0 || self.ns(now) >= until
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.open_until.swap(0, Ordering::AcqRel) != 0
            && self.warned.swap(false, Ordering::AcqRel)
        {
            tracing::info!("shared host state is back: sharing again");
        }
    }

    fn failure(&self, config: &SharedConfig, err: &StoreError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        // Failures within one call timeout of the last one counted are one
        // hiccup, not several in a row: calls in flight together (the
        // writer's, the lease takes) time out together when the process is
        // not scheduled for a few ms, and that is no reason to stop sharing.
        let now = self.ns(Instant::now());
        let step = u64::try_from(config.call_timeout.as_nanos()).unwrap_or(u64::MAX);
        let last = self.last_failure.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) < step {
            return;
        }
        if self
            .last_failure
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= config.failures_to_open {
            if self.open_until.load(Ordering::Acquire) == 0 {
                self.openings.fetch_add(1, Ordering::Relaxed);
            }
            let until = self.ns(Instant::now() + config.probe_interval);
            self.open_until.store(until, Ordering::Release);
            if !self.warned.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    error = %err,
                    "shared host state unavailable: using local state"
                );
            }
        }
    }
}

// ===== per-host state =====

#[derive(Debug)]
struct Entry {
    id: HostId,
    /// The id of its quota in the store: the host's, or its partition's.
    quota_id: HostId,
    /// The host table's key for this host.
    table_key: u64,
    /// A pause the fleet set (or this replica saw).
    paused_until: Option<Instant>,
    /// The store keeps a quota for this host: requests take leases.
    tracked: bool,
    lease: u64,
    lease_until: Instant,
    /// The window the lease belongs to resets then (a lease left then is
    /// not given back: the count refilled).
    window_reset: Option<Instant>,
    /// The store's name for the lease's window (for a give-back).
    window: u64,
    /// The shared count is out until then.
    out_until: Option<Instant>,
    want: u64,
    fetching: bool,
    notify: Arc<Notify>,
    used: u64,
    since: Instant,
    /// The next response's headers go to the store.
    observe_due: bool,
    /// A response of this host was read (its first request went alone).
    seen: bool,
    /// Its first request is on its way: the others wait for its answer.
    probing: bool,
    touched: Instant,
}

/// The keys here are hashes already: a map needs no second one.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
    fn write_u128(&mut self, n: u128) {
        self.0 ^= (n as u64) ^ ((n >> 64) as u64);
    }
}

type Keyed<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// A request's host as this state keys it: its scheme and authority
/// (userinfo and a default port left out), folded to lower case and hashed
/// 8 bytes at a time (FxHash's step): a few dozen instructions, where the
/// host table's keyed hash (which an entry keeps for the table) costs
/// hundreds. Not keyed: the map it keys is bounded (4096 hosts), so
/// crafted collisions can slow a look-up, never grow it.
fn local_key(uri: &Uri) -> u64 {
    let scheme = uri.scheme_str().unwrap_or("").as_bytes();
    let mut authority = uri.authority().map_or(&b""[..], |a| a.as_str().as_bytes());
    if let Some(i) = authority.iter().rposition(|c| *c == b'@') {
        authority = &authority[i + 1..];
    }
    // The default port is no port: `https://h` and `https://h:443` are one
    // host (as `HostId` says).
    let default_port: &[u8] = match scheme {
        b"https" | b"wss" => b":443",
        b"http" | b"ws" => b":80",
        _ => b"",
    };
    if !default_port.is_empty() && authority.ends_with(default_port) {
        authority = &authority[..authority.len() - default_port.len()];
    }
    fx_folded(fx_folded(0, scheme), authority)
}

/// FxHash's step over `bytes` with bit 5 of every byte set, 8 at a time,
/// with their length: ASCII case folded in one OR a word. The characters
/// of a scheme and an authority (letters, digits, `.-:_~%!$&'()*+,;=[]`)
/// stay apart but for case: those it maps onto one another (`_` and DEL,
/// `[` and `{`, …) cannot both be in an authority.
fn fx_folded(mut h: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    const FOLD: u64 = 0x2020_2020_2020_2020;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ (u64::from_le_bytes(w) | FOLD)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    let mut w = [0u8; 8];
    w[..rest.len()].copy_from_slice(rest);
    (h.rotate_left(5) ^ (u64::from_le_bytes(w) | FOLD) ^ ((bytes.len() as u64) << 56))
        .wrapping_mul(K)
}

#[derive(Default)]
struct Hosts {
    by_key: Keyed<u64, Entry>,
    by_id: Keyed<HostId, u64>,
    /// The host table's key of each host → ours.
    by_table: Keyed<u64, u64>,
    /// Pauses of hosts not called yet.
    pending: Keyed<HostId, Instant>,
    /// The host of the last request admitted at once, as it was spelt.
    last: LastHost,
}

/// A host's scheme and authority as a request spelt them, beside its
/// [`local_key`]: a request spelling them alike (the usual case: one
/// client, one base URL) compares its bytes instead of hashing them.
/// Authorities longer than [`LastHost::MAX`] are not kept.
struct LastHost {
    key: u64,
    scheme: u8,
    len: u8,
    authority: [u8; LastHost::MAX],
}

impl Default for LastHost {
    fn default() -> Self {
        LastHost {
            key: 0,
            // No scheme tag is `u8::MAX`: an empty cell matches nothing.
            scheme: u8::MAX,
            len: 0,
            authority: [0; LastHost::MAX],
        }
    }
}

impl LastHost {
    const MAX: usize = 46;

    /// `uri`'s key: the kept one when it spells the same host, else
    /// [`local_key`] (kept for the next request).
    fn key(&mut self, uri: &Uri) -> u64 {
        let scheme = crate::host::scheme_tag(uri);
        let authority = uri.authority().map_or(&b""[..], |a| a.as_str().as_bytes());
        if scheme == Some(self.scheme) && authority == &self.authority[..usize::from(self.len)] {
            return self.key;
        }
        let key = local_key(uri);
        if let Some(scheme) = scheme.filter(|_| authority.len() <= Self::MAX) {
            self.key = key;
            self.scheme = scheme;
            self.len = authority.len() as u8;
            self.authority[..authority.len()].copy_from_slice(authority);
        }
        key
    }
}

struct Inner {
    store: Arc<dyn HostStore>,
    config: SharedConfig,
    hosts: Mutex<Hosts>,
    breaker: Arc<Breaker>,
    table: OnceLock<Weak<HostTable>>,
    watch: OnceLock<tokio::task::AbortHandle>,
    /// The writer task's queue; the task ends when this is dropped.
    writer: OnceLock<mpsc::Sender<Write>>,
    dropped_writes: AtomicU64,
    round_trips: AtomicU64,
}

/// Writes in the writer task's queue, at most.
const WRITE_QUEUE: usize = 1024;
/// Writes the writer task performs at once, at most.
const WRITES_IN_FLIGHT: usize = 16;

/// A write no request waits for, performed by the writer task.
enum Write {
    /// Leased requests not used, given back to the window they came from.
    GiveBack { id: HostId, n: u64, window: u64 },
    /// A response's word on the quota.
    Observe {
        id: HostId,
        observation: Observation,
    },
    /// A Retry-After pause for the fleet.
    Pause { id: HostId, pause: Duration },
    /// Requests sent without a lease (retries inside the stack), taken
    /// from the shared count.
    Charge { id: HostId, n: u64 },
}

impl Write {
    fn call(self, store: &dyn HostStore) -> StoreFuture<()> {
        match self {
            Write::GiveBack { id, n, window } => store.give_back(id, n, window),
            Write::Observe { id, observation } => store.observe(id, observation),
            Write::Pause { id, pause } => store.pause(id, pause),
            Write::Charge { id, n } => {
                let fut = store.lease(id, n);
                Box::pin(async move { fut.await.map(drop) })
            }
        }
    }
}

/// One call to the store, bounded by the call timeout, counted by the
/// breaker.
async fn bounded<T>(
    config: &SharedConfig,
    breaker: &Breaker,
    fut: StoreFuture<T>,
) -> Result<T, StoreError> {
    let out = match tokio::time::timeout(config.call_timeout, fut).await {
        Ok(out) => out,
        Err(_) => Err(StoreError::new(
            StoreErrorKind::Timeout,
            format!("no answer within {:?}", config.call_timeout),
        )),
    };
    match &out {
        Ok(_) => breaker.success(),
        Err(e) => breaker.failure(config, e),
    }
    out
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.get() {
            watch.abort();
        }
    }
}

/// Host state shared with the other replicas of a service through a
/// [`HostStore`]. See the [module docs](self).
///
/// # Clone
///
/// Clones share the same state, store and breaker.
#[derive(Clone)]
pub struct SharedState {
    inner: Arc<Inner>,
}

impl fmt::Debug for SharedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedState")
            .field("store", &self.inner.store)
            .field("config", &self.inner.config)
            .field("available", &!self.inner.breaker.is_open())
            .finish()
    }
}

/// A request's place at a [`SharedState`]: the host it went to; hand it
/// back with the response to [`SharedState::settle`].
#[derive(Debug, Clone, Copy)]
pub struct Admitted {
    key: u64,
    /// Its response's headers are to be read (an observation is due).
    due: bool,
}

enum Step {
    /// Go; the response is to be read.
    Go(bool),
    /// Wait until then, then ask again.
    Wait(Instant),
    /// A pause until then.
    Paused(Instant),
    /// Take a lease of this many.
    Fetch(u64),
    /// Another request is taking a lease: wait for it.
    Join(Arc<Notify>),
    /// A tracked host, the store unavailable (its breaker open).
    Down,
    /// The host's first request is on its way: wait for its answer (at
    /// most [`PROBE_WAIT`]), then go.
    Probe(Arc<Notify>),
}

/// How long requests to a host never answered wait for the answer to its
/// first request (which says whether it has a quota to share).
const PROBE_WAIT: Duration = Duration::from_millis(500);

impl SharedState {
    /// A shared state over `store`.
    ///
    /// # Panics
    ///
    /// On a setting [`try_new`](Self::try_new) refuses, naming it.
    #[track_caller]
    pub fn new(store: Arc<dyn HostStore>, config: SharedConfig) -> Self {
        crate::config::expect_valid("SharedState::new", Self::try_new(store, config))
    }

    /// A shared state over `store`.
    ///
    /// # Errors
    ///
    /// A [`Config`](ErrorKind::Config) error for a zero timeout, period or
    /// interval, a duration over a day, `failures_to_open` zero or
    /// `max_lease` outside `1..=2²⁰`.
    pub fn try_new(store: Arc<dyn HostStore>, config: SharedConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(SharedState {
            inner: Arc::new(Inner {
                store,
                config,
                hosts: Mutex::new(Hosts::default()),
                breaker: Arc::new(Breaker::new()),
                table: OnceLock::new(),
                watch: OnceLock::new(),
                writer: OnceLock::new(),
                dropped_writes: AtomicU64::new(0),
                round_trips: AtomicU64::new(0),
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SharedConfig {
        &self.inner.config
    }

    /// Whether the store is in use now (its breaker is closed).
    pub fn is_available(&self) -> bool {
        !self.inner.breaker.is_open()
    }

    /// Calls to the store that failed or timed out, in all (for
    /// benchmarks and metrics).
    pub fn store_failures(&self) -> u64 {
        self.inner.breaker.failed.load(Ordering::Relaxed)
    }

    /// Times the breaker around the store opened (the state fell back to
    /// local state), in all.
    pub fn fallbacks(&self) -> u64 {
        self.inner.breaker.openings.load(Ordering::Relaxed)
    }

    /// Calls made to the store that a request waited for (lease takes), for
    /// benchmarks.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// Writes (observations, pauses, leases given back) dropped because the
    /// writer task's queue was full.
    pub fn dropped_writes(&self) -> u64 {
        self.inner.dropped_writes.load(Ordering::Relaxed)
    }

    /// Share pauses with a [`HostTable`] (a gate's, a client's): a gate of
    /// the table that closes on a 429 publishes the pause to the fleet, and
    /// a pause from the fleet closes the table's gate. One table per state;
    /// `false` if one is attached already.
    pub fn attach(&self, table: &Arc<HostTable>) -> bool {
        if self.inner.table.set(Arc::downgrade(table)).is_err() {
            return false;
        }
        let weak = Arc::downgrade(&self.inner);
        table.set_on_close(Box::new(move |key, until| {
            if let Some(inner) = weak.upgrade() {
                let found = {
                    let hosts = inner.lock();
                    hosts
                        .by_table
                        .get(&key)
                        .and_then(|k| hosts.by_key.get(k).map(|e| (e.id, *k)))
                };
                if let Some((id, key)) = found {
                    let pause = until.saturating_duration_since(Instant::now());
                    SharedState { inner }.publish(id, key, pause, false);
                }
            }
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Hosts> {
        self.inner.lock()
    }

    /// Start the watch and the writer (once, within a runtime).
    fn start_tasks(&self) {
        if self.inner.watch.get().is_some() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (tx, rx) = mpsc::channel::<Write>(WRITE_QUEUE);
        if self.inner.writer.set(tx).is_ok() {
            // It holds no handle to the state: it ends when the state's
            // sender is dropped with the state.
            let store = self.inner.store.clone();
            let breaker = self.inner.breaker.clone();
            let config = self.inner.config.clone();
            tokio::spawn(async move {
                use futures_util::StreamExt;
                // Up to WRITES_IN_FLIGHT at a time: a write waits for no
                // other (an observation behind a slow give-back would be
                // stale by the time it lands).
                let writes = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|write| (write, rx))
                });
                writes
                    .for_each_concurrent(WRITES_IN_FLIGHT, |write| {
                        let (config, breaker, store) = (&config, &breaker, &store);
                        async move {
                            if breaker.allows(Instant::now()) {
                                let _ = bounded(config, breaker, write.call(&**store)).await;
                            }
                        }
                    })
                    .await;
            });
        }
        let weak = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let store = inner.store.clone();
                drop(inner);
                let w = weak.clone();
                let sink: PauseSink = Arc::new(move |id, pause| {
                    if let Some(inner) = w.upgrade() {
                        SharedState { inner }.remote_pause(id, pause);
                    }
                });
                let started = Instant::now();
                let _ = store.watch(sink).await;
                if started.elapsed() > Duration::from_secs(2) {
                    backoff = Duration::from_millis(50);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
        if let Err(task) = self.inner.watch.set(task.abort_handle()) {
            task.abort();
        }
    }

    /// A pause from the fleet (the store's watch).
    fn remote_pause(&self, id: HostId, pause: Duration) {
        let Some(until) = Instant::now().checked_add(pause) else {
            return;
        };
        let mut hosts = self.lock();
        let Some(&key) = hosts.by_id.get(&id) else {
            if hosts.pending.len() >= MAX_PENDING {
                let now = Instant::now();
                hosts.pending.retain(|_, t| *t > now);
            }
            if hosts.pending.len() < MAX_PENDING {
                let t = hosts.pending.entry(id).or_insert(until);
                *t = (*t).max(until);
            }
            return;
        };
        let Some(e) = hosts.by_key.get_mut(&key) else {
            return;
        };
        e.paused_until = Some(e.paused_until.map_or(until, |p| p.max(until)));
        let table_key = e.table_key;
        drop(hosts);
        if let Some(table) = self.inner.table.get().and_then(Weak::upgrade) {
            table.close_quiet(table_key, until);
        }
    }

    /// Pause `id` here and for the fleet (spawned, bounded).
    fn publish(&self, id: HostId, key: u64, pause: Duration, close_table: bool) {
        if pause.is_zero() {
            return;
        }
        let until = Instant::now().checked_add(pause);
        if let Some(until) = until {
            let table_key = self.lock().by_key.get_mut(&key).map(|e| {
                e.paused_until = Some(e.paused_until.map_or(until, |p| p.max(until)));
                e.table_key
            });
            if let (true, Some(table_key)) = (close_table, table_key) {
                if let Some(table) = self.inner.table.get().and_then(Weak::upgrade) {
                    table.close_quiet(table_key, until);
                }
            }
        }
        self.write(Write::Pause { id, pause });
    }

    /// Queue `write` for the writer task: never waits, never spawns.
    fn write(&self, write: Write) {
        if !self.inner.breaker.allows(Instant::now()) {
            return;
        }
        if let Some(writer) = self.inner.writer.get() {
            if writer.try_send(write).is_err() {
                self.inner.dropped_writes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn call<T>(&self, fut: StoreFuture<T>) -> Result<T, StoreError> {
        bounded(&self.inner.config, &self.inner.breaker, fut).await
    }

    fn step(&self, key: u64, uri: &Uri, now: Instant) -> Step {
        let config = &self.inner.config;
        let mut hosts = self.lock();
        let hosts = &mut *hosts;
        let e = match hosts.by_key.get_mut(&key) {
            Some(e) => e,
            None => {
                let id = HostId::of(uri);
                if hosts.by_key.len() >= MAX_HOSTS {
                    let oldest = hosts
                        .by_key
                        .iter()
                        .min_by_key(|(_, e)| e.touched)
                        .map(|(k, e)| (*k, e.id));
                    if let Some((k, id)) = oldest {
                        if let Some(e) = hosts.by_key.remove(&k) {
                            hosts.by_table.remove(&e.table_key);
                        }
                        hosts.by_id.remove(&id);
                    }
                }
                let paused_until = hosts.pending.remove(&id).filter(|t| *t > now);
                let table_key = HostRef::of(uri).key();
                hosts.by_id.insert(id, key);
                hosts.by_table.insert(table_key, key);
                hosts.by_key.entry(key).or_insert(Entry {
                    id,
                    quota_id: id,
                    table_key,
                    paused_until,
                    tracked: false,
                    lease: 0,
                    lease_until: now,
                    window_reset: None,
                    window: 0,
                    out_until: None,
                    want: (config.max_lease / 4).max(1),
                    fetching: false,
                    notify: Arc::new(Notify::new()),
                    used: 0,
                    since: now,
                    observe_due: true,
                    seen: false,
                    probing: false,
                    touched: now,
                })
            }
        };
        e.touched = now;
        if let Some(p) = e.paused_until {
            if p > now {
                return Step::Paused(p);
            }
            e.paused_until = None;
        }
        if !e.tracked {
            if !e.seen && self.inner.breaker.allows(now) {
                if e.probing {
                    return Step::Probe(e.notify.clone());
                }
                e.probing = true;
            }
            return Step::Go(true);
        }
        if e.lease > 0 && now < e.lease_until {
            e.lease -= 1;
            e.used += 1;
            return Step::Go(e.observe_due);
        }
        if e.lease > 0 {
            // Expired by its ttl within the window: give it back.
            let n = std::mem::take(&mut e.lease);
            if e.window_reset.is_none_or(|r| r > now) {
                let (id, window) = (e.quota_id, e.window);
                self.write(Write::GiveBack { id, n, window });
            }
        }
        if let Some(out) = e.out_until {
            if out > now {
                return Step::Wait(out);
            }
            e.out_until = None;
        }
        if !self.inner.breaker.allows(now) {
            return Step::Down;
        }
        if e.fetching {
            return Step::Join(e.notify.clone());
        }
        let elapsed = now.saturating_duration_since(e.since);
        if e.used > 0 && !elapsed.is_zero() {
            let rate = e.used as f64 / elapsed.as_secs_f64();
            let want = (rate * config.lease_period.as_secs_f64()).ceil();
            e.want = (want.min(config.max_lease as f64) as u64).clamp(1, config.max_lease);
        }
        e.used = 0;
        e.since = now;
        e.fetching = true;
        Step::Fetch(e.want)
    }

    /// The happy path of [`admit`](Self::admit), with no future: a request
    /// to a host with a lease in hand (or one the store keeps no quota
    /// for, answered before) is admitted at once. `None`: anything else
    /// (no lease, a pause, the host's first request, the state's tasks not
    /// started yet): call [`admit`](Self::admit).
    pub fn admit_now(&self, uri: &Uri) -> Option<Admitted> {
        self.inner.writer.get()?;
        let now = Instant::now();
        let mut hosts = self.lock();
        let hosts = &mut *hosts;
        let key = hosts.last.key(uri);
        let e = hosts.by_key.get_mut(&key)?;
        if e.paused_until.is_some() {
            return None;
        }
        let due = if e.tracked {
            if e.lease == 0 || now >= e.lease_until {
                return None;
            }
            e.lease -= 1;
            e.used += 1;
            e.observe_due
        } else if e.seen {
            true
        } else {
            return None;
        };
        e.touched = now;
        Some(Admitted { key, due })
    }

    /// Admit a request to `uri`: at once with a lease in hand (or to a host
    /// the store keeps no quota for), else after taking a lease, waiting
    /// for the shared quota or a pause (bounded by `deadline`, else
    /// [`max_wait`](SharedConfig::max_wait)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::QuotaExhausted`] (not sent) when the shared quota does
    /// not come back before the deadline, or the store is unavailable and
    /// the state fails closed; [`ErrorKind::Throttled`] when a pause ends
    /// after the deadline.
    pub async fn admit(
        &self,
        method: &Method,
        uri: &Uri,
        deadline: Option<Instant>,
    ) -> Result<Admitted, Error> {
        let key = local_key(uri);
        self.start_tasks();
        loop {
            let now = Instant::now();
            let bound = |t: Instant| {
                deadline.is_some_and(|d| t > d)
                    || t.saturating_duration_since(now) > self.inner.config.max_wait
            };
            // A pause and an empty quota wait alike; they fail with their
            // own kind and reason when the wait is past the bound.
            let (until, kind, why) = match self.step(key, uri, now) {
                Step::Go(due) => return Ok(Admitted { key, due }),
                Step::Paused(until) => (
                    until,
                    ErrorKind::Throttled,
                    "the fleet's pause of this host ends after the deadline",
                ),
                Step::Wait(until) => (
                    until,
                    ErrorKind::QuotaExhausted,
                    "no shared requests left before the deadline",
                ),
                Step::Probe(notify) => {
                    let until = deadline.map_or(now + PROBE_WAIT, |d| d.min(now + PROBE_WAIT));
                    let _ = tokio::time::timeout_at(until, notify.notified()).await;
                    // Go after the wait either way: the probe may have
                    // failed unanswered.
                    let mut hosts = self.lock();
                    if let Some(e) = hosts.by_key.get_mut(&key) {
                        if !e.seen && Instant::now() >= until {
                            // Its answer never came: stop waiting for it.
                            e.seen = true;
                            e.probing = false;
                        }
                        if e.tracked {
                            continue;
                        }
                    }
                    return Ok(Admitted { key, due: true });
                }
                Step::Down if self.inner.config.fail_closed => {
                    return Err(refused(
                        ErrorKind::QuotaExhausted,
                        "shared state unavailable (fail-closed)",
                        method,
                        uri,
                        self.inner.config.probe_interval,
                    ));
                }
                Step::Down => return Ok(Admitted { key, due: true }),
                Step::Join(notify) => {
                    let wait = self.inner.config.call_timeout * 2;
                    let _ = tokio::time::timeout(wait, notify.notified()).await;
                    continue;
                }
                Step::Fetch(want) => {
                    let fetched = Fetching { state: self, key };
                    let id = fetched.id();
                    self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
                    let out = self.call(self.inner.store.lease(id, want)).await;
                    match fetched.done(out) {
                        Ok(true) => return Ok(Admitted { key, due: true }),
                        Ok(false) => continue,
                        Err(_) if self.inner.config.fail_closed => {
                            return Err(refused(
                                ErrorKind::QuotaExhausted,
                                "shared state unavailable (fail-closed)",
                                method,
                                uri,
                                self.inner.config.probe_interval,
                            ));
                        }
                        Err(_) => return Ok(Admitted { key, due: true }),
                    }
                }
            };
            if bound(until) {
                return Err(refused(kind, why, method, uri, until - now));
            }
            tokio::time::sleep_until(until).await;
        }
    }

    /// Read what the response to an admitted request said: its pause
    /// (a 429 with a Retry-After) is published to the fleet; its quota
    /// headers, when an observation is due, go to the store. For a
    /// response that took one attempt; see
    /// [`settle_attempts`](Self::settle_attempts).
    pub fn settle(&self, admitted: Admitted, status: StatusCode, headers: &HeaderMap) {
        self.settle_attempts(admitted, status, headers, 1);
    }

    /// [`settle`](Self::settle) a response that took `attempts` attempts
    /// ([`Attempts`] of a retry loop below
    /// this state): the retries went without a lease, so they are the
    /// host's **lease debt**, taken from the shared count by the writer
    /// (whatever their answers: a retry's 429 counts like the first
    /// attempt's). A 429 of a tracked host also ends the lease in hand
    /// (the server is out; it is not given back) and makes its headers
    /// the next observation.
    #[inline]
    pub fn settle_attempts(
        &self,
        admitted: Admitted,
        status: StatusCode,
        headers: &HeaderMap,
        attempts: u32,
    ) {
        if !admitted.due && status != StatusCode::TOO_MANY_REQUESTS && attempts <= 1 {
            // A lease in hand and no observation due: nothing to read.
            return;
        }
        self.settle_read(admitted, status, headers, attempts);
    }

    fn settle_read(
        &self,
        admitted: Admitted,
        status: StatusCode,
        headers: &HeaderMap,
        attempts: u32,
    ) {
        let too_many = status == StatusCode::TOO_MANY_REQUESTS;
        let (id, quota_id, due, probe, debt) = {
            let mut hosts = self.lock();
            match hosts.by_key.get_mut(&admitted.key) {
                Some(e) => {
                    let probe = std::mem::take(&mut e.probing);
                    e.seen = true;
                    if too_many && e.tracked {
                        e.lease = 0;
                        e.observe_due = true;
                    }
                    let debt = if e.tracked {
                        attempts.saturating_sub(1)
                    } else {
                        0
                    };
                    (
                        e.id,
                        e.quota_id,
                        e.observe_due || !e.tracked,
                        probe.then(|| e.notify.clone()),
                        debt,
                    )
                }
                None => return,
            }
        };
        // The first answer of a host: those waiting for it go once it is
        // read (below), tracked or not.
        let _wake = probe.map(Wake);
        if debt > 0 {
            self.write(Write::Charge {
                id: quota_id,
                n: u64::from(debt),
            });
        }
        if !due && !too_many {
            return;
        }
        #[allow(clippy::disallowed_methods)] // the wall clock, for dates
        let reading = parse::read(headers, status, SystemTime::now());
        if too_many {
            if let Some(pause) = reading.retry_after {
                self.publish(id, admitted.key, pause, true);
            }
        }
        if !due || parse::is_cached(status, headers) {
            return;
        }
        let quota = reading
            .quotas()
            .find(|(d, q)| *d == Dimension::Requests && q.remaining.is_some());
        let Some((_, q)) = quota else { return };
        let observation = Observation {
            remaining: q.remaining.unwrap_or(0),
            reset_in: q.reset,
            limit: q.limit,
            window: q.window,
            precision: q.precision.granule(),
        };
        // The quota is the partition's the response named (the IETF
        // `pk`), if any: a partition of its own in the store.
        let quota_id = id.with_partition(reading.partition);
        if let Some(e) = self.lock().by_key.get_mut(&admitted.key) {
            e.observe_due = false;
            e.tracked = true;
            if e.quota_id != quota_id {
                // Leased from another partition's count: not this one's.
                e.quota_id = quota_id;
                e.lease = 0;
            }
        }
        self.write(Write::Observe {
            id: quota_id,
            observation,
        });
    }
}

/// Wakes the requests waiting for a host's first answer when dropped.
struct Wake(Arc<Notify>);

impl Drop for Wake {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Hosts> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A lease being taken: dropped before its answer (the request was
/// cancelled), it lets the others take one.
struct Fetching<'a> {
    state: &'a SharedState,
    key: u64,
}

impl Fetching<'_> {
    fn id(&self) -> HostId {
        self.state
            .lock()
            .by_key
            .get(&self.key)
            .map_or(HostId(0), |e| e.quota_id)
    }

    /// `Ok(true)`: go (the caller took one); `Ok(false)`: ask again.
    fn done(self, out: Result<Lease, StoreError>) -> Result<bool, StoreError> {
        let now = Instant::now();
        let config = &self.state.inner.config;
        let mut hosts = self.state.lock();
        let Some(e) = hosts.by_key.get_mut(&self.key) else {
            return Ok(true);
        };
        let go = match out {
            Err(e) => Err(e),
            Ok(Lease::Untracked) => {
                e.tracked = false;
                e.observe_due = true;
                Ok(true)
            }
            Ok(Lease::Granted {
                granted,
                reset_in,
                window,
            }) => {
                let reset = reset_in.and_then(|r| now.checked_add(r));
                e.window_reset = reset;
                e.window = window;
                e.observe_due = true;
                if granted == 0 {
                    e.out_until = Some(reset.unwrap_or(now + PROBE));
                    Ok(false)
                } else {
                    e.lease = granted - 1;
                    e.used += 1;
                    let ttl = now + config.lease_ttl;
                    e.lease_until = reset.map_or(ttl, |r| r.min(ttl));
                    Ok(true)
                }
            }
        };
        drop(hosts);
        go
    }
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.state.lock().by_key.get_mut(&self.key) {
            e.fetching = false;
            e.notify.notify_waiters();
        }
    }
}

fn refused(
    kind: ErrorKind,
    detail: &'static str,
    method: &Method,
    uri: &Uri,
    left: Duration,
) -> Error {
    let mut err = Error::new(kind)
        .with_detail(detail)
        .with_request(method, uri);
    let ext = err.extensions_mut();
    ext.insert(RetryAfterHint(left));
    ext.insert(Sent::NotSent);
    ext.insert(Verdict::Fatal {
        reason: Reason::new_static("shared quota"),
    });
    err
}

// ===== the layer =====

/// Admits requests against the fleet's shared quota and pauses, and reads
/// their responses into it. See the [module docs](self).
///
/// Place it above the retry layer (each request leases once) or below it
/// (each attempt does); with a Retry-After gate, [`SharedState::attach`]
/// its table so the pauses it closes reach the fleet.
///
/// # Clone
///
/// Clones share the same [`SharedState`].
#[derive(Clone, Debug)]
pub struct SharedStateLayer {
    state: SharedState,
}

impl SharedStateLayer {
    /// A layer over `state`.
    pub fn new(state: SharedState) -> Self {
        SharedStateLayer { state }
    }

    /// The state.
    pub fn state(&self) -> &SharedState {
        &self.state
    }
}

impl<S> Layer<S> for SharedStateLayer {
    type Service = SharedStateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SharedStateService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The service of [`SharedStateLayer`].
#[derive(Clone, Debug)]
pub struct SharedStateService<S> {
    inner: S,
    state: SharedState,
}

impl<S> SharedStateService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for SharedStateService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = SharedStateFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Ready when the inner service is: a request admitted at once (a
        // lease in hand) is its call, with no clone of it.
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let state = self.state.clone();
        let stage = match state.admit_now(req.uri()) {
            Some(admitted) => Stage::Calling {
                fut: self.inner.call(req),
                admitted,
            },
            None => {
                // The wait takes a clone, made ready after admission: the
                // ready one stays for the next call (what it holds, e.g. a
                // permit of a limit below, is not held through the wait).
                let svc = self.inner.clone();
                let (st, method, uri) = (state.clone(), req.method().clone(), req.uri().clone());
                let deadline = Deadline::of(req.extensions());
                Stage::Admitting {
                    admit: Box::pin(async move { st.admit(&method, &uri, deadline).await }),
                    svc: Some(svc),
                    req: Some(req),
                }
            }
        };
        SharedStateFuture { state, stage }
    }
}

pin_project! {
    /// The future of [`SharedStateService`]: no allocation when the
    /// request is admitted at once ([`SharedState::admit_now`]: a lease in
    /// hand); one box for an admission that waits or asks the store.
    pub struct SharedStateFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        state: SharedState,
        // The request is in the stage before the call: the future is as
        // large as the larger of the request and the inner future, not both.
        #[pin]
        stage: Stage<S, ReqB>,
    }
}

pin_project! {
    #[project = StageProj]
    enum Stage<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Admitting {
            admit: BoxFuture<'static, Result<Admitted, Error>>,
            svc: Option<S>,
            req: Option<Request<ReqB>>,
        },
        Ready {
            admitted: Admitted,
            svc: S,
            req: Option<Request<ReqB>>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            admitted: Admitted,
        },
        Done,
    }
}

impl<S, ReqB> fmt::Debug for SharedStateFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedStateFuture").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Future for SharedStateFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResB>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.stage.as_mut().project() {
                StageProj::Admitting { admit, svc, req } => match ready!(admit.as_mut().poll(cx)) {
                    Ok(admitted) => {
                        let req = req.take();
                        let svc = svc.take().expect("a service until it is ready");
                        this.stage.set(Stage::Ready { admitted, svc, req });
                    }
                    Err(e) => {
                        this.stage.set(Stage::Done);
                        return Poll::Ready(Err(e));
                    }
                },
                StageProj::Ready { admitted, svc, req } => {
                    let admitted = *admitted;
                    if let Err(e) = ready!(svc.poll_ready(cx)) {
                        this.stage.set(Stage::Done);
                        return Poll::Ready(Err(Error::from_boxed(e.into())));
                    }
                    let req = req.take().expect("a request until it is sent");
                    let fut = svc.call(req);
                    this.stage.set(Stage::Calling { fut, admitted });
                }
                StageProj::Calling { fut, admitted } => {
                    let admitted = *admitted;
                    let out = ready!(fut.poll(cx));
                    this.stage.set(Stage::Done);
                    let res = out.map_err(|e| Error::from_boxed(e.into()))?;
                    let attempts = Attempts::of(res.extensions());
                    this.state
                        .settle_attempts(admitted, res.status(), res.headers(), attempts);
                    return Poll::Ready(Ok(res));
                }
                StageProj::Done => panic!("SharedStateFuture polled after completion"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> u64 {
        local_key(&s.parse().unwrap())
    }

    #[test]
    fn the_local_key_ignores_case_and_userinfo_and_tells_hosts_apart() {
        assert_eq!(
            key("https://api.example/a"),
            key("https://API.Example/b?q=1")
        );
        assert_eq!(
            key("https://api.example/"),
            key("https://user:pw@api.example/")
        );
        assert_ne!(key("https://api.example/"), key("http://api.example/"));
        assert_ne!(
            key("https://api.example/"),
            key("https://api.example:8443/")
        );
        assert_ne!(key("https://a.example/"), key("https://b.example/"));
        assert_eq!(key("https://api.example/"), key("https://api.example:443/"));
        assert_eq!(key("http://api.example/"), key("http://api.example:80/"));
        assert_ne!(key("http://api.example/"), key("http://api.example:443/"));
        let long = format!("https://{}.example/", "x".repeat(100));
        assert_eq!(
            key(&long),
            key(&long.to_uppercase().replace("HTTPS", "https"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_flight_together_count_once_toward_opening() {
        let config = SharedConfig::new();
        let breaker = Breaker::new();
        let err = StoreError::new(StoreErrorKind::Timeout, "no answer");
        tokio::time::advance(Duration::from_millis(1)).await;
        for _ in 0..16 {
            breaker.failure(&config, &err);
        }
        assert!(breaker.allows(Instant::now()), "one burst is one failure");
        tokio::time::advance(config.call_timeout).await;
        breaker.failure(&config, &err);
        assert!(!breaker.allows(Instant::now()), "two apart open it");
        assert_eq!(breaker.failed.load(Ordering::Relaxed), 17);
        assert_eq!(breaker.openings.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_last_host_gives_each_spelling_its_own_key() {
        let mut last = LastHost::default();
        for u in [
            "https://api.example/a",
            "https://api.example/b",
            "http://api.example/",
            "https://API.example/",
            "https://b.example/",
            "https://api.example:8443/",
            "https://api.example/",
            "grpc://api.example/",
            "grpc://api.example/",
        ] {
            let uri: Uri = u.parse().unwrap();
            assert_eq!(last.key(&uri), local_key(&uri), "{u}");
        }
        let long: Uri = format!("https://{}.example/", "x".repeat(60))
            .parse()
            .unwrap();
        assert_eq!(last.key(&long), local_key(&long));
        assert_eq!(last.key(&long), local_key(&long));
    }

    #[test]
    fn bad_settings_are_errors_naming_them() {
        #[derive(Debug)]
        struct Never;
        impl HostStore for Never {
            fn lease(&self, _: HostId, _: u64) -> StoreFuture<Lease> {
                Box::pin(std::future::pending())
            }
            fn give_back(&self, _: HostId, _: u64, _: u64) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn observe(&self, _: HostId, _: Observation) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn pause(&self, _: HostId, _: Duration) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn watch(&self, _: PauseSink) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
        }
        for (config, name) in [
            (
                SharedConfig::new().call_timeout(Duration::ZERO),
                "call_timeout",
            ),
            (SharedConfig::new().max_lease(0), "max_lease"),
            (SharedConfig::new().failures_to_open(0), "failures_to_open"),
        ] {
            let err = SharedState::try_new(Arc::new(Never), config).unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    /// A store that never answers costs a request the call timeout, no
    /// more, and the request goes (fail-open); paused time.
    #[tokio::test(start_paused = true)]
    async fn a_store_that_never_answers_costs_the_call_timeout_then_local_state() {
        #[derive(Debug)]
        struct Slow;
        impl HostStore for Slow {
            fn lease(&self, _: HostId, _: u64) -> StoreFuture<Lease> {
                Box::pin(std::future::pending())
            }
            fn give_back(&self, _: HostId, _: u64, _: u64) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn observe(&self, _: HostId, _: Observation) -> StoreFuture<()> {
                Box::pin(async { Ok(()) })
            }
            fn pause(&self, _: HostId, _: Duration) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn watch(&self, _: PauseSink) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
        }
        let state = SharedState::new(Arc::new(Slow), SharedConfig::new());
        let uri: Uri = "https://api.example/".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-remaining-requests", "10".parse().unwrap());
        headers.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
        let a = state.admit(&Method::GET, &uri, None).await.unwrap();
        state.settle(a, StatusCode::OK, &headers);
        for i in 0..4 {
            let t = Instant::now();
            state.admit(&Method::GET, &uri, None).await.unwrap();
            let waited = t.elapsed();
            assert!(
                waited <= Duration::from_millis(5),
                "request {i}: {waited:?}"
            );
        }
        assert!(!state.is_available());

        // Fail-closed: the same, and then requests to the host fail at
        // once, not sent, until the store answers again.
        let closed = SharedState::new(Arc::new(Slow), SharedConfig::new().fail_closed(true));
        let a = closed.admit(&Method::GET, &uri, None).await.unwrap();
        closed.settle(a, StatusCode::OK, &headers);
        let mut refused = 0;
        for _ in 0..4 {
            let t = Instant::now();
            if let Err(e) = closed.admit(&Method::GET, &uri, None).await {
                assert_eq!(e.kind(), ErrorKind::QuotaExhausted);
                refused += 1;
            }
            assert!(t.elapsed() <= Duration::from_millis(5));
        }
        assert_eq!(refused, 4);
    }

    /// Requests spawn nothing: their writes go to the one writer task,
    /// whose queue drops (and counts) what does not fit; the watch and the
    /// writer end with the last clone of the state. Counted by the
    /// runtime's own count of live tasks; paused time.
    #[tokio::test(start_paused = true)]
    async fn requests_spawn_no_task_and_the_tasks_end_with_the_state() {
        /// Grants leases at once; every write hangs (to its bound), so a
        /// spawned write would stay alive and show in the count.
        #[derive(Debug)]
        struct Hangs;
        impl HostStore for Hangs {
            fn lease(&self, _: HostId, want: u64) -> StoreFuture<Lease> {
                Box::pin(async move {
                    Ok(Lease::Granted {
                        granted: want,
                        reset_in: Some(Duration::from_millis(50)),
                        window: 1,
                    })
                })
            }
            fn give_back(&self, _: HostId, _: u64, _: u64) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn observe(&self, _: HostId, _: Observation) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn pause(&self, _: HostId, _: Duration) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
            fn watch(&self, _: PauseSink) -> StoreFuture<()> {
                Box::pin(std::future::pending())
            }
        }
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        // Never opens: the hanging writes would otherwise switch it off.
        let config = SharedConfig::new()
            .failures_to_open(u32::MAX)
            .call_timeout(Duration::from_secs(1));
        let state = SharedState::new(Arc::new(Hangs), config);
        let uri: Uri = "https://api.example/".parse().unwrap();
        let mut ok = HeaderMap::new();
        ok.insert("x-ratelimit-remaining-requests", "1000".parse().unwrap());
        ok.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
        let mut paused = ok.clone();
        paused.insert("retry-after", "1".parse().unwrap());
        for i in 0..3000u32 {
            let a = state.admit(&Method::GET, &uri, None).await.unwrap();
            if i % 100 == 99 {
                state.settle(a, StatusCode::TOO_MANY_REQUESTS, &paused);
                tokio::time::sleep(Duration::from_secs(2)).await;
            } else {
                state.settle(a, StatusCode::OK, &ok);
            }
        }
        tokio::task::yield_now().await;
        // The watch and the writer, nothing per request.
        assert_eq!(metrics.num_alive_tasks(), before + 2);
        // The writer hangs on each write for its bound: the rest queue,
        // and are dropped and counted once the queue is full.
        assert!(state.dropped_writes() > 0);

        drop(state);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        // The writer ends once it has drained its queue (each write cut
        // by its bound).
        tokio::time::sleep(Duration::from_secs(WRITE_QUEUE as u64 + 10)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(metrics.num_alive_tasks(), before);
    }
}
