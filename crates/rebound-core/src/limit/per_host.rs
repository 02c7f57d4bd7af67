//! One adaptive limiter per host, so that one slow upstream does not shrink
//! the limit of the others.
//!
//! ```
//! use rebound_core::limit::{Gradient, HostLimiters};
//!
//! let hosts = HostLimiters::try_new(Gradient::default(), 64).unwrap();
//! let a: http::Uri = "https://a.example/x".parse().unwrap();
//! let b: http::Uri = "https://B.example:443/y?q=1".parse().unwrap();
//! let limiter = hosts.for_uri(&a);
//! assert_eq!(limiter.current_limit(), 20);
//! // Another host, another limiter; the same host (any path), the same one.
//! assert!(!std::sync::Arc::ptr_eq(&limiter, &hosts.for_uri(&b)));
//! assert!(std::sync::Arc::ptr_eq(&limiter, &hosts.for_uri(&"https://a.example/z".parse().unwrap())));
//! assert_eq!(hosts.len(), 2);
//! ```
//!
//! [`HostLimiters`] keeps one [`AdaptiveLimiter`] per host, keyed as the
//! [host table](crate::host) keys a host (its authority: scheme,
//! lower-cased host, effective port; a keyed 64-bit hash, so no host name
//! is stored), each with the same [`Algorithm`]. A host gets its limiter on
//! its first attempt, starting at the algorithm's initial limit.
//!
//! The whole-stack service (and so the ready-made client) uses it with
//! [`StackLayer::adaptive_limit_per_host`](crate::stack::StackLayer::adaptive_limit_per_host):
//! the authority's key is the one the stack computes once per request for
//! the gate and the breaker. A stack built by hand uses it with
//! [`PerHostAdaptiveLimitLayer`], the per-host form of
//! [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer).
//!
//! # Bounded
//!
//! At most `max_hosts` limiters are kept. A new host past that evicts the
//! host used least recently (by a use counter, no clock): its limit is
//! forgotten, and attempts still in flight on it give their slots back to
//! the evicted limiter, which goes when the last one ends.
//!
//! # Cost: a per-thread cache of the last hosts
//!
//! A request's limiter is looked up once per attempt. The map is behind a
//! mutex, and its key is the authority's keyed hash (`host_and_port`, the
//! lower-cased host and SipHash: about 250 instructions), which the
//! ready-made client's defaults compute for nothing else while no host is
//! throttled or broken (the host table is idle). So each thread keeps the
//! last four hosts it looked up (of any set of limiters): the set's
//! id, its eviction count, the host's key, its scheme and its authority
//! **as the request spelled it** (never one with userinfo), and a weak
//! reference to the limiter. An attempt whose URI has the same scheme and
//! the same authority bytes (or, when the request's key is already known,
//! the same key) finds its limiter there: no hash, no lock, no map; the
//! key is handed on to the request (the gate, the breaker and the throttle
//! use it without hashing). Anything else (another spelling of the same
//! host, a host not seen lately on this thread, a set that evicted since)
//! takes the map under the mutex, as before, and refreshes the cache.
//!
//! Why this and not a lock-free map or a read-write lock: either still
//! hashes the authority and touches a shared lock word on every attempt; a
//! client talks to few hosts, from each thread mostly to one at a time, so
//! a few byte comparisons on the thread's own cache answer nearly every
//! attempt. The cache holds no limiter alive (a weak reference), and an
//! eviction makes every thread's entries of that set stale (its eviction
//! count moved), so no thread keeps using a forgotten limiter. The
//! least-recently-used order stays exact: a hit on a host that was not the
//! last one used moves the use counter (one atomic add), a hit on the last
//! one reads it. See BENCHMARKS.md for the figure per request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use http::Uri;

use super::adaptive::{AdaptiveLimiter, Algorithm};
use crate::error::Error;
use crate::host::{authority_key, scheme_tag, HostRef, KeyHasher};

/// Hosts each thread's cache keeps (see the module docs).
const CACHED: usize = 4;
/// Longer authorities are not cached (they take the map).
const MAX_CACHED_AUTHORITY: usize = 128;

/// Ids of sets of limiters, for the per-thread cache: never reused, so an
/// entry of a set that is gone never matches another.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One host in a thread's cache.
struct Cached {
    /// The set's id; 0: empty.
    set: u64,
    /// The set's evictions when cached: stale once it moved.
    evictions: u64,
    key: u64,
    scheme: u8,
    /// As the request spelled it; never with userinfo.
    authority: String,
    limiter: Weak<AdaptiveLimiter>,
}

impl Cached {
    const EMPTY: Cached = Cached {
        set: 0,
        evictions: 0,
        key: 0,
        scheme: 0,
        authority: String::new(),
        limiter: Weak::new(),
    };
}

struct Cache {
    entries: [Cached; CACHED],
    /// The entry the next miss replaces (round robin).
    next: usize,
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            entries: [Cached::EMPTY, Cached::EMPTY, Cached::EMPTY, Cached::EMPTY],
            next: 0,
        })
    };
}

struct Hosts {
    by_key: HashMap<u64, Arc<AdaptiveLimiter>, BuildHasherDefault<KeyHasher>>,
}

/// One [`AdaptiveLimiter`] per host; see the [module docs](self).
pub struct HostLimiters {
    algorithm: Algorithm,
    max_hosts: usize,
    /// This set's id in the threads' caches.
    id: u64,
    /// The use counter: the "time" of a host's last use, for the eviction
    /// (each limiter keeps its own in `last_use`).
    uses: AtomicU64,
    /// Hosts evicted so far: cached entries of an older count are stale.
    evictions: AtomicU64,
    hosts: Mutex<Hosts>,
}

impl HostLimiters {
    /// Default number of hosts kept: 1024.
    pub const DEFAULT_MAX_HOSTS: usize = 1024;

    /// Limiters of `algorithm`, for at most `max_hosts` hosts.
    ///
    /// # Panics
    ///
    /// On a value [`try_new`](Self::try_new) refuses, with a message that
    /// names it; use `try_new` for values that come from configuration.
    #[track_caller]
    pub fn new(algorithm: impl Into<Algorithm>, max_hosts: usize) -> Self {
        crate::config::expect_valid("HostLimiters::new", Self::try_new(algorithm, max_hosts))
    }

    /// Limiters of `algorithm`, for at most `max_hosts` hosts.
    ///
    /// # Errors
    ///
    /// A [`Config`](crate::ErrorKind::Config) error if `max_hosts` is zero
    /// or the algorithm's settings are refused (see
    /// [`AdaptiveLimiter::try_new`]).
    pub fn try_new(algorithm: impl Into<Algorithm>, max_hosts: usize) -> Result<Self, Error> {
        let algorithm = algorithm.into();
        algorithm.validate()?;
        if max_hosts == 0 {
            return Err(Error::config(
                "per-host adaptive limit: max_hosts must be at least 1",
            ));
        }
        Ok(HostLimiters {
            algorithm,
            max_hosts,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            uses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            hosts: Mutex::new(Hosts {
                by_key: HashMap::default(),
            }),
        })
    }

    /// The algorithm every host's limiter runs.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The most hosts kept.
    pub fn max_hosts(&self) -> usize {
        self.max_hosts
    }

    /// Hosts with a limiter now.
    pub fn len(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Whether no host has a limiter yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limiter of `uri`'s host, made if it has none.
    pub fn for_uri(&self, uri: &Uri) -> Arc<AdaptiveLimiter> {
        self.lookup(uri, &mut None)
    }

    /// The limiter of `uri`'s host, if it has one (not counted as a use).
    pub fn get(&self, uri: &Uri) -> Option<Arc<AdaptiveLimiter>> {
        let key = HostRef::of(uri).key();
        self.lock().by_key.get(&key).map(Arc::clone)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hosts> {
        // A map of reference counts: consistent even if a holder panicked.
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limiter of `uri`'s host, made if it has none; `key` is the
    /// request's authority key if already computed, and gets it (from the
    /// cache or hashed) otherwise.
    pub(crate) fn lookup(&self, uri: &Uri, key: &mut Option<u64>) -> Arc<AdaptiveLimiter> {
        let scheme = scheme_tag(uri);
        let authority = uri.authority().map(|a| a.as_str());
        if let Some(limiter) = self.cached(scheme, authority, key) {
            return limiter;
        }
        let k = authority_key(uri, key);
        let limiter = self.for_key(k);
        if let (Some(scheme), Some(authority)) = (scheme, authority) {
            if authority.len() <= MAX_CACHED_AUTHORITY && !authority.contains('@') {
                self.remember(scheme, authority, k, &limiter);
            }
        }
        limiter
    }

    /// The hit path: this thread's cache (no hash, no lock).
    #[inline]
    fn cached(
        &self,
        scheme: Option<u8>,
        authority: Option<&str>,
        key: &mut Option<u64>,
    ) -> Option<Arc<AdaptiveLimiter>> {
        let (scheme, authority) = (scheme?, authority?);
        // Relaxed: a thread that does not see an eviction yet uses the
        // evicted limiter once more, which is still a working limiter.
        let evictions = self.evictions.load(Ordering::Relaxed);
        CACHE
            .try_with(|cache| {
                let cache = cache.borrow();
                let hit = cache.entries.iter().find(|e| {
                    e.set == self.id
                        && e.evictions == evictions
                        && match *key {
                            Some(k) => e.key == k,
                            None => e.scheme == scheme && e.authority == authority,
                        }
                })?;
                let limiter = hit.limiter.upgrade()?;
                *key = Some(hit.key);
                self.touch(&limiter);
                Some(limiter)
            })
            .ok()
            .flatten()
    }

    /// A use of `limiter` for the eviction's order: it is the last used.
    #[inline]
    fn touch(&self, limiter: &AdaptiveLimiter) {
        // Already the last host used: nothing to write.
        if limiter.last_use.load(Ordering::Relaxed) != self.uses.load(Ordering::Relaxed) {
            let now = self.uses.fetch_add(1, Ordering::Relaxed) + 1;
            limiter.last_use.store(now, Ordering::Relaxed);
        }
    }

    /// Cache `limiter` as the one of (`scheme`, `authority`) on this thread.
    fn remember(&self, scheme: u8, authority: &str, key: u64, limiter: &Arc<AdaptiveLimiter>) {
        let evictions = self.evictions.load(Ordering::Relaxed);
        let _ = CACHE.try_with(|cache| {
            let mut cache = cache.borrow_mut();
            let i = cache.next;
            cache.next = (i + 1) % CACHED;
            let e = &mut cache.entries[i];
            e.set = self.id;
            e.evictions = evictions;
            e.key = key;
            e.scheme = scheme;
            e.authority.clear();
            e.authority.push_str(authority);
            e.limiter = Arc::downgrade(limiter);
        });
    }

    /// The limiter of the host whose key is `key`, made if it has none.
    pub(crate) fn for_key(&self, key: u64) -> Arc<AdaptiveLimiter> {
        let mut hosts = self.lock();
        if let Some(limiter) = hosts.by_key.get(&key) {
            let limiter = Arc::clone(limiter);
            drop(hosts);
            self.touch(&limiter);
            return limiter;
        }
        if hosts.by_key.len() >= self.max_hosts {
            // Bounded work: a scan of at most `max_hosts` entries, only
            // when a new host arrives at a full map.
            let lru = hosts
                .by_key
                .iter()
                .min_by_key(|(_, l)| l.last_use.load(Ordering::Relaxed))
                .map(|(k, _)| *k);
            if let Some(lru) = lru {
                hosts.by_key.remove(&lru);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        let limiter =
            Arc::new(AdaptiveLimiter::try_new(self.algorithm).expect("the settings were checked"));
        let now = self.uses.fetch_add(1, Ordering::Relaxed) + 1;
        limiter.last_use.store(now, Ordering::Relaxed);
        hosts.by_key.insert(key, Arc::clone(&limiter));
        limiter
    }

    /// The limiter of every host that has one, in no particular order (for
    /// metrics and tests: the limit each host has now).
    pub fn limiters(&self) -> Vec<Arc<AdaptiveLimiter>> {
        self.lock().by_key.values().map(Arc::clone).collect()
    }
}

impl fmt::Debug for HostLimiters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostLimiters")
            .field("algorithm", &self.algorithm)
            .field("hosts", &self.len())
            .field("max_hosts", &self.max_hosts)
            .finish()
    }
}

// === the per-host layer ===

/// An [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer) that keys by host:
/// each attempt takes its slot from its host's limiter in a
/// [`HostLimiters`], so one slow or overloaded upstream shrinks its own
/// limit, not the others'. For the layers stacked by hand; the
/// ready-made client's adaptive limit is per host already.
///
/// ```
/// use std::convert::Infallible;
/// use std::sync::Arc;
/// use http::{Request, Response, StatusCode};
/// use rebound_core::limit::{Aimd, HostLimiters, PerHostAdaptiveLimitLayer};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let hosts = Arc::new(HostLimiters::new(Aimd::default().initial_limit(10).backoff_ratio(0.5), 64));
/// let svc = ServiceBuilder::new()
///     .layer(PerHostAdaptiveLimitLayer::new(hosts.clone()))
///     .service(service_fn(|req: Request<()>| async move {
///         let mut res = Response::new(());
///         if req.uri().host() == Some("busy.example") {
///             *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///         }
///         Ok::<_, Infallible>(res)
///     }));
/// let get = |url: &str| Request::get(url).body(()).unwrap();
/// svc.clone().oneshot(get("https://busy.example/a")).await.unwrap();
/// svc.clone().oneshot(get("https://calm.example/b")).await.unwrap();
///
/// // The busy host's limit halved; the calm host's did not move.
/// let busy = hosts.get(&"https://busy.example/".parse().unwrap()).unwrap();
/// let calm = hosts.get(&"https://calm.example/".parse().unwrap()).unwrap();
/// assert_eq!((busy.current_limit(), calm.current_limit()), (5, 10));
/// # }
/// ```
///
/// The outcome, the slot's release at the response head, the FIFO wait
/// bounded by the request's [`Deadline`](crate::Deadline) and what is
/// counted as overload are those of
/// [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer). There is no
/// backpressure mode: `poll_ready` cannot know which host the next request
/// is for, so it passes through and an attempt waits for its host's slot
/// in the response future.
///
/// # Clone
///
/// Clones share the same [`HostLimiters`].
#[derive(Clone, Debug)]
pub struct PerHostAdaptiveLimitLayer {
    hosts: Arc<HostLimiters>,
}

impl PerHostAdaptiveLimitLayer {
    /// A layer over `hosts` (share them with other layers or clients that
    /// talk to the same upstreams).
    pub fn new(hosts: Arc<HostLimiters>) -> Self {
        PerHostAdaptiveLimitLayer { hosts }
    }

    /// A layer with new limiters of `algorithm` for at most `max_hosts`
    /// hosts.
    ///
    /// # Errors
    ///
    /// See [`HostLimiters::try_new`].
    pub fn try_new(algorithm: impl Into<Algorithm>, max_hosts: usize) -> Result<Self, Error> {
        Ok(Self::new(Arc::new(HostLimiters::try_new(
            algorithm, max_hosts,
        )?)))
    }

    /// The per-host limiters, to observe (each host's
    /// [`current_limit`](AdaptiveLimiter::current_limit), its
    /// [`min_rtt`](AdaptiveLimiter::min_rtt)) or to share.
    pub fn hosts(&self) -> &Arc<HostLimiters> {
        &self.hosts
    }
}

impl<S> tower_layer::Layer<S> for PerHostAdaptiveLimitLayer {
    type Service = PerHostAdaptiveLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PerHostAdaptiveLimit {
            inner,
            hosts: self.hosts.clone(),
        }
    }
}

/// The service of [`PerHostAdaptiveLimitLayer`].
///
/// # Clone
///
/// Clones share the same [`HostLimiters`].
#[derive(Clone, Debug)]
pub struct PerHostAdaptiveLimit<S> {
    inner: S,
    hosts: Arc<HostLimiters>,
}

impl<S> PerHostAdaptiveLimit<S> {
    /// Wrap `inner` with the per-host limits of `hosts`.
    pub fn new(inner: S, hosts: Arc<HostLimiters>) -> Self {
        PerHostAdaptiveLimit { inner, hosts }
    }

    /// The per-host limiters.
    pub fn hosts(&self) -> &Arc<HostLimiters> {
        &self.hosts
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> tower_service::Service<http::Request<ReqB>> for PerHostAdaptiveLimit<S>
where
    S: tower_service::Service<http::Request<ReqB>, Response = http::Response<ResB>> + Clone,
    S::Error: Into<crate::error::BoxError>,
{
    type Response = http::Response<ResB>;
    type Error = Error;
    type Future = super::adaptive::ResponseFuture<S, http::Request<ReqB>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let limiter = self.hosts.for_uri(req.uri());
        super::adaptive::start(&mut self.inner, limiter, None, req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Aimd;

    fn uri(host: &str) -> Uri {
        format!("http://{host}/x").parse().unwrap()
    }

    #[test]
    fn keeps_at_most_max_hosts_evicting_the_least_recently_used() {
        let hosts = HostLimiters::try_new(Aimd::default(), 2).unwrap();
        let a = hosts.for_uri(&uri("a"));
        hosts.for_uri(&uri("b"));
        // `a` used again: `b` is the least recently used.
        assert!(Arc::ptr_eq(&a, &hosts.for_uri(&uri("a"))));
        hosts.for_uri(&uri("c"));
        assert_eq!(hosts.len(), 2);
        assert!(hosts.get(&uri("b")).is_none());
        assert!(Arc::ptr_eq(&a, &hosts.get(&uri("a")).unwrap()));
        assert!(hosts.get(&uri("c")).is_some());
    }

    #[test]
    fn the_threads_cache_finds_the_limiter_and_the_key_without_hashing() {
        let hosts = HostLimiters::try_new(Aimd::default(), 8).unwrap();
        let u = uri("cache.example:8080");
        let mut key = None;
        let a = hosts.lookup(&u, &mut key);
        let k = key.expect("the key, hashed on the miss");
        assert_eq!(k, HostRef::of(&u).key());
        let before = crate::host::keys_hashed();
        let mut key = None;
        assert!(Arc::ptr_eq(&a, &hosts.lookup(&u, &mut key)));
        // Found in the cache: the key comes with it, nothing was hashed.
        assert_eq!(key, Some(k));
        assert_eq!(crate::host::keys_hashed(), before);
        // A request whose key is known finds it by the key.
        assert!(Arc::ptr_eq(&a, &hosts.lookup(&u, &mut Some(k))));
        // Another spelling of the same host: hashed, the same limiter.
        let upper = uri("CACHE.example:8080");
        assert!(Arc::ptr_eq(&a, &hosts.lookup(&upper, &mut None)));
        assert!(crate::host::keys_hashed() > before);
        // Another set of limiters does not see this set's entries.
        let other = HostLimiters::try_new(Aimd::default(), 8).unwrap();
        assert!(!Arc::ptr_eq(&a, &other.lookup(&u, &mut None)));
        // Userinfo is never cached (and never stored).
        let secret: Uri = "http://user:pw@cache.example:8080/x".parse().unwrap();
        assert!(Arc::ptr_eq(&a, &hosts.lookup(&secret, &mut None)));
        CACHE.with(|c| {
            assert!(c
                .borrow()
                .entries
                .iter()
                .all(|e| !e.authority.contains('@')));
        });
    }

    #[test]
    fn an_eviction_makes_the_cached_limiters_stale() {
        let hosts = HostLimiters::try_new(Aimd::default(), 1).unwrap();
        let a = hosts.for_uri(&uri("a"));
        assert!(Arc::ptr_eq(&a, &hosts.for_uri(&uri("a"))));
        // `b` evicts `a`: the cached `a` is not used again.
        hosts.for_uri(&uri("b"));
        let again = hosts.for_uri(&uri("a"));
        assert!(!Arc::ptr_eq(&a, &again));
        assert_eq!(hosts.len(), 1);
        assert!(hosts.get(&uri("b")).is_none());
    }

    #[test]
    fn cached_hits_count_as_uses_for_the_eviction() {
        let hosts = HostLimiters::try_new(Aimd::default(), 2).unwrap();
        let a = hosts.for_uri(&uri("a"));
        hosts.for_uri(&uri("b"));
        // Hits from the cache, many times: `a` is the most recently used.
        for _ in 0..10 {
            assert!(Arc::ptr_eq(&a, &hosts.for_uri(&uri("a"))));
        }
        hosts.for_uri(&uri("c"));
        assert!(hosts.get(&uri("b")).is_none());
        assert!(Arc::ptr_eq(&a, &hosts.get(&uri("a")).unwrap()));
        assert_eq!(hosts.limiters().len(), 2);
    }

    #[test]
    fn bad_settings_are_refused() {
        let err = HostLimiters::try_new(Aimd::default(), 0).unwrap_err();
        assert!(err.to_string().contains("max_hosts"), "{err}");
        let err = HostLimiters::try_new(Aimd::default().min_limit(0), 8).unwrap_err();
        assert!(err.to_string().contains("min_limit"), "{err}");
    }
}
