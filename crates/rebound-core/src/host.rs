//! The host table: what rebound keeps per host — the Retry-After gate's
//! "closed until" and the circuit breaker's circuit — in one bounded table,
//! one entry per host, touched only while some host is throttled or failing.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use rebound_core::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::gate::RetryAfterGateLayer;
//! use rebound_core::host::HostTable;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // One table for the gate and the breaker of a client.
//! let table = Arc::new(HostTable::default());
//! let breaker = CircuitBreakerLayer::shared(CircuitBreakerConfig::default(), table.clone());
//! let svc = ServiceBuilder::new()
//!     .layer(breaker)
//!     .layer(RetryAfterGateLayer::shared(table.clone()))
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(service_fn(|req: Request<()>| async move {
//!         let mut res = Response::new(());
//!         if req.uri().path() == "/broken" {
//!             *res.status_mut() = StatusCode::BAD_GATEWAY;
//!         }
//!         Ok::<_, Infallible>(res)
//!     }));
//! let get = |path: &str| Request::get(format!("https://api.example{path}")).body(()).unwrap();
//!
//! // Every host works: the table stays empty.
//! for _ in 0..100 {
//!     svc.clone().oneshot(get("/ok")).await.unwrap();
//! }
//! assert!(table.is_empty());
//!
//! // A failure gives its host an entry...
//! svc.clone().oneshot(get("/broken")).await.unwrap();
//! assert_eq!(table.len(), 1);
//!
//! // ...which goes once the failure has left the breaker's window (30 s).
//! tokio::time::advance(Duration::from_secs(31)).await;
//! svc.clone().oneshot(get("/ok")).await.unwrap();
//! assert!(table.is_empty());
//! # }
//! ```
//!
//! # One entry per host
//!
//! An entry holds, for one host (by default its **authority**: scheme,
//! lower-cased host, effective port; never userinfo, path or query):
//!
//! * the Retry-After gate's "closed until" ([`gate`](crate::gate));
//! * the circuit breaker's circuit: its state, its sliding window of
//!   outcomes, its run of failures, its probes
//!   ([`breaker`](crate::breaker)).
//!
//! A [`RetryAfterGateLayer`](crate::gate::RetryAfterGateLayer) and a
//! [`CircuitBreakerLayer`](crate::breaker::CircuitBreakerLayer) built over
//! the same table share each host's entry, so a request that needs both
//! hashes its authority once and finds one entry. The ready-made client
//! builds its gate and its default breaker over one table. A table serves
//! any number of gates but at most one breaker (the circuit in an entry is
//! that breaker's).
//!
//! Keys are 64-bit keyed hashes (the table never stores a host name, only,
//! for the breaker's log lines, its redacted `scheme://host:port`). The
//! hash key is random per process and shared by every table, so one key
//! computed for a request serves every table it meets.
//!
//! # Entries in use, and an idle table
//!
//! An entry is **in use** while its host has a reason to be remembered:
//! its gate is closed, its circuit is not closed (open or half-open), or a
//! failure the breaker counted is still in the breaker's window. It gets
//! its entry on the first of these (a gate closing, a counted failure) and
//! is released when none is left: when the gate has opened, the circuit is
//! closed and the last failure has left the window. Releasing happens when
//! a request meets the entry, and otherwise in a sweep that a request of a
//! busy table runs once an entry's release time has come (no task, no
//! timer). So after a blip the table returns to empty.
//!
//! The table counts its entries in use ([`len`](HostTable::len)). While
//! that count is zero — no host throttled, broken or failing — the table
//! is **idle**: a request reads that one atomic and nothing else; its
//! authority is not hashed, no entry is looked up, no clock is read, and
//! a success is not recorded anywhere. What that changes for the breaker
//! is in its [module docs](crate::breaker#the-host-table).
//!
//! # Bounded
//!
//! The table has [`max_entries`](HostTable::new) entries, allocated when
//! it is built (about 180 bytes each). A host may take one of four entries
//! (set-associative); when all four are taken, a host that needs one
//! evicts, in this order: an entry not in use; the closed circuit whose
//! entry is due for release soonest (its gate opens soonest, its failures
//! leave the window soonest); the open circuit whose break ends soonest.
//! A host that would only record a success never evicts an entry in use.
//!
//! # Concurrency
//!
//! Lock-free: each entry is a set of atomics (its key, its gate, its
//! circuit's state word and buckets), claimed and updated with
//! compare-and-swap. The only lock guards an entry's log label, taken when
//! a failing host first takes an entry and when a circuit changes state.
//!
//! # Room for more
//!
//! Later per-host state (an adaptive limit, a quota) goes into the entry
//! next to the gate and the circuit, and joins the "in use" rule: an entry
//! stays while any of its parts has something to remember.

// Built with only one of the gate and the breaker, the other's parts of an
// entry go unused.
#![cfg_attr(
    not(all(feature = "breaker", feature = "retry-after")),
    allow(dead_code)
)]

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use tokio::time::Instant;

use crate::error::Error;

/// Buckets in a circuit's sliding window.
pub(crate) const BUCKETS: usize = 10;
/// Entries a key may take (set-associative).
const WAYS: usize = 4;

/// An entry's key while it is free, and while it is being taken.
pub(crate) const EMPTY: u64 = 0;
pub(crate) const CLAIMING: u64 = 1;

// A circuit's state is one `AtomicU64`: until (ns since the table's base,
// 62 bits) | state (2 bits), so a reader never sees "open" with a stale
// reopening time.
pub(crate) const CLOSED: u64 = 0;
pub(crate) const OPEN: u64 = 1;
pub(crate) const HALF_OPEN: u64 = 2;
/// Open → half-open in progress (the winner resets the probe counters);
/// treated as open.
pub(crate) const SWITCHING: u64 = 3;

pub(crate) fn state_of(word: u64) -> u64 {
    word & 3
}

pub(crate) fn until_of(word: u64) -> u64 {
    word >> 2
}

/// The largest table [`HostTable::try_new`] builds.
const MAX_ENTRIES: usize = 1 << 24;

// ===== keys =====

/// The hash key of every table in the process.
fn hash_state() -> &'static RandomState {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::new)
}

/// A hasher keyed like every table's keys (for a breaker's `key_fn`).
pub(crate) fn hasher() -> std::collections::hash_map::DefaultHasher {
    hash_state().build_hasher()
}

/// A finished hash as a key: never [`EMPTY`] or [`CLAIMING`].
pub(crate) fn finish(h: impl Hasher) -> u64 {
    #[cfg(test)]
    KEYS.with(|n| n.set(n.get() + 1));
    h.finish().max(CLAIMING + 1)
}

/// The key is already a keyed hash of the authority: hash it no further.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A URI's scheme as one byte, for the caches that compare a request's
/// spelling of its host with one seen before (the per-host limiters' and
/// the shared state's): `Some(0)` no scheme, `Some(1)` http, `Some(2)`
/// https, `None` any other (not cached).
#[cfg(any(feature = "limit", feature = "shared-state"))]
pub(crate) fn scheme_tag(uri: &Uri) -> Option<u8> {
    match uri.scheme() {
        None => Some(0),
        Some(s) if *s == http::uri::Scheme::HTTP => Some(1),
        Some(s) if *s == http::uri::Scheme::HTTPS => Some(2),
        Some(_) => None,
    }
}

/// A request's host as the table keys and names it: its scheme and
/// authority, borrowed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostRef<'a> {
    scheme: Option<&'a str>,
    authority: Option<&'a str>,
}

impl<'a> HostRef<'a> {
    pub(crate) fn of(uri: &'a Uri) -> Self {
        HostRef {
            scheme: uri.scheme_str(),
            authority: uri.authority().map(Authority::as_str),
        }
    }

    /// The authority's key: scheme, lower-cased host and effective port
    /// (see [`redact::hash_authority`](crate::redact)).
    pub(crate) fn key(self) -> u64 {
        let mut h = hasher();
        crate::redact::hash_host(self.scheme, self.authority, &mut h);
        finish(h)
    }

    /// `scheme://host:port`, for the breaker's log lines (no userinfo, no
    /// path, no query).
    fn write_label(self, out: &mut String) {
        use std::fmt::Write as _;
        let (host, port) = match self.authority {
            Some(a) => {
                let (host, port) = crate::redact::host_and_port(a);
                (Some(host), port)
            }
            None => (None, None),
        };
        let _ = match (self.scheme, host) {
            (Some(s), Some(h)) => write!(out, "{s}://{h}"),
            (None, Some(h)) => write!(out, "{h}"),
            _ => write!(out, "(no authority)"),
        };
        let port = port.or(match self.scheme {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        });
        if let (Some(_), Some(port)) = (host, port) {
            let _ = write!(out, ":{port}");
        }
    }
}

/// A request's host kept by a standalone layer's response future until the
/// outcome says whether the table needs it: a reference count on the URI's
/// authority, instead of hashing it on every request.
#[derive(Clone, Debug)]
pub(crate) struct HostOwned {
    scheme: Option<Scheme>,
    authority: Option<Authority>,
}

impl HostOwned {
    pub(crate) fn of(uri: &Uri) -> Self {
        HostOwned {
            scheme: uri.scheme().cloned(),
            authority: uri.authority().cloned(),
        }
    }

    pub(crate) fn as_ref(&self) -> HostRef<'_> {
        HostRef {
            scheme: self.scheme.as_ref().map(Scheme::as_str),
            authority: self.authority.as_ref().map(Authority::as_str),
        }
    }
}

/// The key of `uri`'s authority, computed at most once into `cell`.
pub(crate) fn authority_key(uri: &Uri, cell: &mut Option<u64>) -> u64 {
    *cell.get_or_insert_with(|| HostRef::of(uri).key())
}

// ===== entries =====

/// The circuit breaker's part of an entry (see [`crate::breaker`]).
pub(crate) struct Circuit {
    pub(crate) state: AtomicU64,
    pub(crate) buckets: [AtomicU64; BUCKETS],
    /// Half-open bookkeeping: generation | probes admitted | succeeded.
    pub(crate) half: AtomicU64,
    /// Failures in a row while closed (the consecutive trigger).
    pub(crate) run: AtomicU32,
    /// Consecutive openings since the circuit last closed.
    pub(crate) breaks: AtomicU32,
    /// When the last counted failure leaves the window (ns since the
    /// table's base); 0: none.
    pub(crate) fail_until: AtomicU64,
}

impl Circuit {
    fn new() -> Self {
        Circuit {
            state: AtomicU64::new(CLOSED),
            buckets: Default::default(),
            half: AtomicU64::new(0),
            run: AtomicU32::new(0),
            breaks: AtomicU32::new(0),
            fail_until: AtomicU64::new(0),
        }
    }

    fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.state.store(CLOSED, Ordering::Relaxed);
        // A new generation: probes of the entry's previous circuit no
        // longer count.
        let gen = (self.half.load(Ordering::Relaxed) >> 32).wrapping_add(1);
        self.half.store(gen << 32, Ordering::Relaxed);
        self.run.store(0, Ordering::Relaxed);
        self.breaks.store(0, Ordering::Relaxed);
        self.fail_until.store(0, Ordering::Relaxed);
    }
}

/// One host's entry.
pub(crate) struct Entry {
    pub(crate) key: AtomicU64,
    /// Counted in the table's entries in use.
    live: AtomicBool,
    /// The gate is closed until then (ns since the table's base); 0: open.
    gate_until: AtomicU64,
    pub(crate) circuit: Circuit,
    // Later: a per-host limit, a quota (see the module docs).
    /// Whether `label` names the entry's host.
    labelled: AtomicBool,
    /// `scheme://host:port` of the host, for the breaker's log lines.
    label: Mutex<String>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            key: AtomicU64::new(EMPTY),
            live: AtomicBool::new(false),
            gate_until: AtomicU64::new(0),
            circuit: Circuit::new(),
            labelled: AtomicBool::new(false),
            label: Mutex::new(String::new()),
        }
    }

    /// When nothing in the entry is left to remember (ns), if the entry
    /// does not itself say so later (an open circuit: `u64::MAX`).
    fn release_at(&self) -> u64 {
        if state_of(self.circuit.state.load(Ordering::SeqCst)) != CLOSED {
            return u64::MAX;
        }
        let gate = self.gate_until.load(Ordering::SeqCst);
        let failures = self.circuit.fail_until.load(Ordering::SeqCst);
        gate.max(failures)
    }

    /// The host's name for log lines.
    pub(crate) fn label(&self) -> String {
        self.label.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

// ===== impl HostTable =====

/// The per-host state of a client: one entry per host for the Retry-After
/// gate and the circuit breaker; bounded. See the [module docs](self).
///
/// Share one between layers with
/// [`RetryAfterGateLayer::shared`](crate::gate::RetryAfterGateLayer::shared)
/// and [`CircuitBreakerLayer::shared`](crate::breaker::CircuitBreakerLayer::shared).
pub struct HostTable {
    entries: Box<[Entry]>,
    /// Entries in use: zero means idle (the happy path reads only this).
    in_use: AtomicUsize,
    /// When the next entry may be released (ns since `base`);
    /// `u64::MAX`: none is due.
    next_sweep: AtomicU64,
    base: Instant,
    /// Whether a circuit breaker keeps its circuits here.
    has_breaker: AtomicBool,
    /// Told of every gate a response closes (the shared state's).
    #[cfg(feature = "shared-state")]
    on_close: OnceLock<OnClose>,
}

#[cfg(feature = "shared-state")]
type OnClose = Box<dyn Fn(u64, Instant) + Send + Sync>;

impl HostTable {
    /// Default number of entries.
    pub const DEFAULT_MAX_ENTRIES: usize = 1024;

    /// A table of `max_entries` entries.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(max_entries: usize) -> Self {
        crate::config::expect_valid("HostTable::new", Self::try_new(max_entries))
    }

    /// A table of `max_entries` entries.
    ///
    /// # Errors
    ///
    /// A [`Config`](crate::ErrorKind::Config) error if `max_entries` is zero
    /// or over 2²⁴.
    pub fn try_new(max_entries: usize) -> Result<Self, Error> {
        if !(1..=MAX_ENTRIES).contains(&max_entries) {
            return Err(Error::config(format!(
                "host table: max_entries must be in 1..={MAX_ENTRIES}, got {max_entries}"
            )));
        }
        Ok(HostTable {
            entries: (0..max_entries).map(|_| Entry::new()).collect(),
            in_use: AtomicUsize::new(0),
            next_sweep: AtomicU64::new(u64::MAX),
            base: Instant::now(),
            has_breaker: AtomicBool::new(false),
            #[cfg(feature = "shared-state")]
            on_close: OnceLock::new(),
        })
    }

    /// How many entries are in use: hosts with a closed gate, a circuit
    /// not closed, or a counted failure in the breaker's window (some may
    /// be due for release and not met since).
    pub fn len(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }

    /// Whether no entry is in use: the table is idle, and a request
    /// through it costs this one atomic load.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of entries, in use or not.
    pub fn max_entries(&self) -> usize {
        self.entries.len()
    }

    /// Until when the gate of `uri`'s authority is closed, if it is.
    pub fn closed_until(&self, uri: &Uri) -> Option<Instant> {
        if self.is_empty() {
            return None;
        }
        self.check(self.key(uri), Instant::now())
    }

    /// Close the gate of `uri`'s authority until `until` (a later closing
    /// already recorded wins).
    pub fn close(&self, uri: &Uri, until: Instant) {
        self.close_host(HostRef::of(uri).key(), Some(HostRef::of(uri)), until);
    }

    /// Open every gate. Circuits are left as they are.
    pub fn clear(&self) {
        let now = self.now();
        for (i, e) in self.entries.iter().enumerate() {
            if e.gate_until.swap(0, Ordering::SeqCst) != 0 {
                self.release_if_idle(i, now);
            }
        }
    }

    /// The authority's key: scheme, lower-cased host and effective port.
    /// `Uri::host` never includes userinfo. Requests without an authority
    /// (origin-form) share one key: they all go to the same inner service.
    pub(crate) fn key(&self, uri: &Uri) -> u64 {
        HostRef::of(uri).key()
    }

    /// Until when `key`'s gate is closed after `now`; an entry with nothing
    /// left to remember is released when met.
    pub(crate) fn check(&self, key: u64, now: Instant) -> Option<Instant> {
        if self.is_empty() {
            return None;
        }
        let now = self.ns(now);
        self.maybe_sweep(now);
        let i = self.find(key)?;
        let until = self.entries[i].gate_until.load(Ordering::Acquire);
        if until > now {
            Some(self.instant(until))
        } else {
            self.release_if_idle(i, now);
            None
        }
    }

    /// Close `key`'s gate until `until` (a later closing wins).
    pub(crate) fn close_key(&self, key: u64, until: Instant) {
        self.close_host(key, None, until);
        #[cfg(feature = "shared-state")]
        if let Some(on_close) = self.on_close.get() {
            on_close(key, until);
        }
    }

    /// Close `key`'s gate for a pause the fleet set: told to no one.
    #[cfg(feature = "shared-state")]
    pub(crate) fn close_quiet(&self, key: u64, until: Instant) {
        self.close_host(key, None, until);
    }

    /// Be told of every gate a response closes; `false` if something is
    /// told already.
    #[cfg(feature = "shared-state")]
    pub(crate) fn set_on_close(&self, on_close: OnClose) -> bool {
        self.on_close.set(on_close).is_ok()
    }

    fn close_host(&self, key: u64, host: Option<HostRef<'_>>, until: Instant) {
        let until = self.ns(until);
        let now = self.now();
        if until <= now {
            return;
        }
        let Some(i) = self.find(key).or_else(|| self.claim(key, host, true)) else {
            return;
        };
        self.entries[i]
            .gate_until
            .fetch_max(until, Ordering::SeqCst);
        self.mark_live(i);
    }

    // ----- for the breaker -----

    pub(crate) fn entry(&self, i: usize) -> &Entry {
        &self.entries[i]
    }

    /// Take the table for a breaker's circuits; `false` if one has it.
    pub(crate) fn attach_breaker(&self) -> bool {
        !self.has_breaker.swap(true, Ordering::AcqRel)
    }

    /// The time, ns since the table's base.
    pub(crate) fn now(&self) -> u64 {
        self.ns(Instant::now())
    }

    pub(crate) fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn instant(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// The first way of `key`'s set, then the others.
    fn ways(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let n = self.entries.len();
        // The high bits of the key, spread over 0..n (no power of two
        // needed).
        let start = ((u128::from(key) * n as u128) >> 64) as usize;
        (0..WAYS.min(n)).map(move |i| {
            let j = start + i;
            if j >= n {
                j - n
            } else {
                j
            }
        })
    }

    /// The entry of `key`, if it has one.
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        self.ways(key)
            .find(|&i| self.entries[i].key.load(Ordering::Acquire) == key)
    }

    /// Give `key` an entry (named after `host` for log lines): a free one
    /// of its set, else one not in use, else (with `evict`) the one in use
    /// that matters least. `None`: every way is being taken by others, or
    /// in use and not `evict`.
    pub(crate) fn claim(&self, key: u64, host: Option<HostRef<'_>>, evict: bool) -> Option<usize> {
        for i in self.ways(key) {
            if self.entries[i]
                .key
                .compare_exchange(EMPTY, CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.init(i, key, host);
                return Some(i);
            }
        }
        // Rank each taken way: not in use, then closed circuits by their
        // release time, then open ones by the end of their break.
        let mut victim: Option<(usize, u64, (u8, u64))> = None;
        for i in self.ways(key) {
            let e = &self.entries[i];
            let k = e.key.load(Ordering::Acquire);
            if k == CLAIMING {
                continue;
            }
            let rank = if !e.live.load(Ordering::Acquire) {
                (0, 0)
            } else if !evict {
                continue;
            } else {
                let word = e.circuit.state.load(Ordering::Acquire);
                if state_of(word) == CLOSED {
                    (1, e.release_at())
                } else {
                    (2, until_of(word))
                }
            };
            if victim.is_none_or(|(_, _, r)| rank < r) {
                victim = Some((i, k, rank));
            }
        }
        let (i, k, _) = victim?;
        let e = &self.entries[i];
        e.key
            .compare_exchange(k, CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        if e.live.swap(false, Ordering::SeqCst) {
            self.in_use.fetch_sub(1, Ordering::SeqCst);
        }
        self.init(i, key, host);
        Some(i)
    }

    fn init(&self, i: usize, key: u64, host: Option<HostRef<'_>>) {
        let e = &self.entries[i];
        e.circuit.reset();
        e.gate_until.store(0, Ordering::Relaxed);
        {
            let mut label = e.label.lock().unwrap_or_else(|p| p.into_inner());
            label.clear();
            if let Some(host) = host {
                host.write_label(&mut label);
            }
            e.labelled.store(host.is_some(), Ordering::Release);
        }
        e.key.store(key, Ordering::Release);
    }

    /// Name entry `i` after `host` if it was taken without a name (a gate
    /// closed from the whole-stack path, which does not keep the URI).
    pub(crate) fn name(&self, i: usize, host: Option<HostRef<'_>>) {
        let e = &self.entries[i];
        let Some(host) = host else { return };
        if e.labelled.load(Ordering::Acquire) {
            return;
        }
        let mut label = e.label.lock().unwrap_or_else(|p| p.into_inner());
        if !e.labelled.load(Ordering::Acquire) {
            label.clear();
            host.write_label(&mut label);
            e.labelled.store(true, Ordering::Release);
        }
    }

    /// Count entry `i` in use (it has something to remember now), and
    /// have it swept when that ends.
    pub(crate) fn mark_live(&self, i: usize) {
        let e = &self.entries[i];
        if !e.live.load(Ordering::SeqCst)
            && e.live
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.in_use.fetch_add(1, Ordering::SeqCst);
        }
        self.schedule(e.release_at());
    }

    /// Release entry `i` if nothing in it is left to remember at `now`;
    /// otherwise make sure a sweep comes when that ends.
    pub(crate) fn release_if_idle(&self, i: usize, now: u64) {
        let e = &self.entries[i];
        if !e.live.load(Ordering::SeqCst) {
            return;
        }
        let at = e.release_at();
        if at > now {
            self.schedule(at);
            return;
        }
        if e.live
            .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.in_use.fetch_sub(1, Ordering::SeqCst);
            // A failure or a closing that raced with the release: it saw
            // the entry in use, so it is ours to count again.
            if e.release_at() > now {
                self.mark_live(i);
            }
        }
    }

    fn schedule(&self, at: u64) {
        if at != u64::MAX && at < self.next_sweep.load(Ordering::Acquire) {
            self.next_sweep.fetch_min(at, Ordering::AcqRel);
        }
    }

    /// Release the entries whose release time has come, if one has: at most
    /// one sweep at a time, run by a request of a busy table.
    pub(crate) fn maybe_sweep(&self, now: u64) {
        let due = self.next_sweep.load(Ordering::Acquire);
        if now < due
            || self
                .next_sweep
                .compare_exchange(due, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let mut next = u64::MAX;
        for (i, e) in self.entries.iter().enumerate() {
            if !e.live.load(Ordering::Acquire) {
                continue;
            }
            let at = e.release_at();
            if at <= now {
                self.release_if_idle(i, now);
            } else {
                next = next.min(at);
            }
        }
        self.schedule(next);
    }
}

impl Default for HostTable {
    /// A table of [`HostTable::DEFAULT_MAX_ENTRIES`] entries.
    fn default() -> Self {
        HostTable::try_new(Self::DEFAULT_MAX_ENTRIES).expect("the default size is valid")
    }
}

impl fmt::Debug for HostTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostTable")
            .field("len", &self.len())
            .field("max_entries", &self.entries.len())
            .finish()
    }
}

#[cfg(test)]
thread_local! {
    /// Keys computed on this thread (each one a hash of a host), for tests.
    static KEYS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(all(test, feature = "breaker", feature = "retry-after"))]
mod tests;

/// Keys computed on this thread so far (tests only).
#[cfg(test)]
pub(crate) fn keys_hashed() -> usize {
    KEYS.with(std::cell::Cell::get)
}
