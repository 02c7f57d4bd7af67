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
//! the gate and the breaker.
//!
//! # Bounded
//!
//! At most `max_hosts` limiters are kept. A new host past that evicts the
//! host used least recently (by a use counter, no clock): its limit is
//! forgotten, and attempts still in flight on it give their slots back to
//! the evicted limiter, which goes when the last one ends.
//!
//! # Cost
//!
//! Finding a host's limiter takes a mutex around a hash map lookup (the key
//! is already a hash: it is not hashed again) and a reference count; see
//! BENCHMARKS.md for the figure per request.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

use http::Uri;

use super::adaptive::{AdaptiveLimiter, Algorithm};
use crate::error::Error;
use crate::host::{HostRef, KeyHasher};

struct Hosts {
    by_key: HashMap<u64, (Arc<AdaptiveLimiter>, u64), BuildHasherDefault<KeyHasher>>,
    /// Lookups so far: the "time" of a use, for the eviction.
    uses: u64,
}

/// One [`AdaptiveLimiter`] per host; see the [module docs](self).
pub struct HostLimiters {
    algorithm: Algorithm,
    max_hosts: usize,
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
            hosts: Mutex::new(Hosts {
                by_key: HashMap::default(),
                uses: 0,
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
        self.for_key(HostRef::of(uri).key())
    }

    /// The limiter of `uri`'s host, if it has one (not counted as a use).
    pub fn get(&self, uri: &Uri) -> Option<Arc<AdaptiveLimiter>> {
        let key = HostRef::of(uri).key();
        self.lock().by_key.get(&key).map(|(l, _)| Arc::clone(l))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hosts> {
        // A map of reference counts: consistent even if a holder panicked.
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The limiter of the host whose key is `key`, made if it has none.
    pub(crate) fn for_key(&self, key: u64) -> Arc<AdaptiveLimiter> {
        let mut hosts = self.lock();
        hosts.uses += 1;
        let now = hosts.uses;
        if let Some((limiter, used)) = hosts.by_key.get_mut(&key) {
            *used = now;
            return Arc::clone(limiter);
        }
        if hosts.by_key.len() >= self.max_hosts {
            // Bounded work: a scan of at most `max_hosts` entries, only
            // when a new host arrives at a full map.
            let lru = hosts
                .by_key
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k);
            if let Some(lru) = lru {
                hosts.by_key.remove(&lru);
            }
        }
        let limiter =
            Arc::new(AdaptiveLimiter::try_new(self.algorithm).expect("the settings were checked"));
        hosts.by_key.insert(key, (Arc::clone(&limiter), now));
        limiter
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
    fn bad_settings_are_refused() {
        let err = HostLimiters::try_new(Aimd::default(), 0).unwrap_err();
        assert!(err.to_string().contains("max_hosts"), "{err}");
        let err = HostLimiters::try_new(Aimd::default().min_limit(0), 8).unwrap_err();
        assert!(err.to_string().contains("min_limit"), "{err}");
    }
}
