//! The store's side: what a [`HostStore`] keeps for the fleet, and the
//! stable host identity its keys are made of.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;

/// The future of a [`HostStore`] call: boxed (the trait is object-safe;
/// a call to the store is off the happy path) and `'static` (it may be
/// spawned).
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// Where a store sends the pauses the fleet set: `(host, time left)`, for
/// those in force when the watch (re)starts, then for each new one.
pub type PauseSink = Arc<dyn Fn(HostId, Duration) + Send + Sync>;

/// A store of host state shared by the replicas of a service: the quota of
/// each host and its Retry-After pause. Redis's is in the `rebound-redis`
/// crate.
///
/// Every method is bounded by the caller ([`SharedState`](super::SharedState)
/// puts a timeout and a breaker around each call); an implementation
/// should still not wait long by itself (e.g. no reconnect loop inside a
/// call).
pub trait HostStore: Send + Sync + fmt::Debug + 'static {
    /// Take up to `want` requests from `host`'s shared quota.
    fn lease(&self, host: HostId, want: u64) -> StoreFuture<Lease>;

    /// Give `n` leased requests that were not used back to `host`'s quota
    /// (never above its limit), if its window is still `window` (the
    /// [`Lease::Granted`] they came in): a give-back that arrives after
    /// the window reset is ignored, since the count was refilled.
    fn give_back(&self, host: HostId, n: u64, window: u64) -> StoreFuture<()>;

    /// What a response of `host` said of its request quota.
    fn observe(&self, host: HostId, observation: Observation) -> StoreFuture<()>;

    /// Pause `host` for every replica for `pause`, and tell them at once.
    fn pause(&self, host: HostId, pause: Duration) -> StoreFuture<()>;

    /// Send the pauses in force to `sink`, then every new one, until the
    /// connection is lost (an error) or the store is dropped.
    fn watch(&self, sink: PauseSink) -> StoreFuture<()>;
}

/// What a [`HostStore::lease`] gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// The store keeps no quota for this host (no response said one, or
    /// the store lost it): requests go, paced locally.
    Untracked,
    /// `granted` requests (zero: the quota is out), usable until the
    /// window resets in `reset_in`, if known.
    Granted {
        /// Requests granted, at most as many as asked.
        granted: u64,
        /// Time to the reset of the window they belong to, if known.
        reset_in: Option<Duration>,
        /// The store's name for that window (Redis's: its reset, in ms of
        /// its clock; 0 when the reset is unknown), for
        /// [`HostStore::give_back`].
        window: u64,
    },
}

/// A response's word on its host's request quota, for
/// [`HostStore::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Requests left in the window.
    pub remaining: u64,
    /// Time to the window's reset, if said.
    pub reset_in: Option<Duration>,
    /// The quota per window, if said.
    pub limit: Option<u64>,
    /// The window's length, if said.
    pub window: Option<Duration>,
    /// How finely the reset is known: a later reset within this is the
    /// same window.
    pub precision: Duration,
}

/// A store error: the store is down, slow (timed out) or said something
/// that makes no sense. Its message names no key value and no URL
/// password.
#[derive(Debug, Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
}

/// The kind of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// No connection, or it was lost.
    Unavailable,
    /// No answer within the call's bound.
    Timeout,
    /// An answer of the wrong shape.
    Garbage,
}

impl StoreError {
    /// An error of `kind`; `message` must hold no secret.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Timeout => "timed out",
            StoreErrorKind::Garbage => "bad answer",
        };
        write!(f, "shared state store {kind}: {}", self.message)
    }
}

impl std::error::Error for StoreError {}

/// A host as the whole fleet names it: a hash of its scheme, lower-cased
/// host and effective port (FNV-1a, 128 bits), the same in every process
/// and every build. Userinfo, path and query play no part; the key names
/// of a store hold this hash, never the host.
///
/// ```
/// use rebound_core::shared::HostId;
///
/// let a = HostId::of(&"https://API.example/v1?key=secret".parse().unwrap());
/// let b = HostId::of(&"https://user:pw@api.example:443/other".parse().unwrap());
/// assert_eq!(a, b);
/// assert_eq!(a.to_string().len(), 32);
/// assert!(!a.to_string().contains("api"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(pub u128);

const FNV_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

impl HostId {
    /// The id of `uri`'s host.
    pub fn of(uri: &Uri) -> HostId {
        let scheme = uri.scheme_str().unwrap_or("http");
        let port = uri.port_u16().unwrap_or(match scheme {
            "https" | "wss" => 443,
            _ => 80,
        });
        let mut h = FNV_OFFSET;
        let mut eat = |b: u8| {
            h ^= u128::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        };
        for b in scheme.bytes() {
            eat(b.to_ascii_lowercase());
        }
        eat(b'/');
        for b in uri.host().unwrap_or("").bytes() {
            eat(b.to_ascii_lowercase());
        }
        eat(b':');
        for b in port.to_be_bytes() {
            eat(b);
        }
        HostId(h)
    }

    /// The id of the quota of `partition` (a partition key as
    /// [`ratelimit::parse`](crate::ratelimit::parse) hashes it: FNV-1a,
    /// stable across builds) at this host; the host's own for `None`.
    pub fn with_partition(self, partition: Option<u64>) -> HostId {
        let Some(pk) = partition else { return self };
        let mut h = self.0;
        for b in std::iter::once(b'#').chain(pk.to_be_bytes()) {
            h ^= u128::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        HostId(h)
    }

    /// Parse the 32 hex digits of [`Display`](fmt::Display).
    pub fn parse(hex: &str) -> Option<HostId> {
        if hex.len() != 32 {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(HostId)
    }
}

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostId({self})")
    }
}
