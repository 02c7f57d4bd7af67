//! The pacing engine: what each host's server last said about its quota,
//! and when a new request may go. No tower in it; the
//! [`RateLimitLayer`](super::RateLimitLayer) is a thin service over it.
//!
//! See the [module docs](super) for the rules and an example.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{StatusCode, Uri};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::parse::{Dimension, Precision, Reading};
use super::{Cost, QuotaSignal};
use crate::error::Error;
use crate::host::HostRef;

/// Partitions (IETF `pk`) kept per host; the oldest goes first.
const MAX_PARTITIONS: usize = 4;

// ===== settings =====

/// How a [`Pacer`] paces. See the [module docs](super) for what each
/// setting does.
#[derive(Clone, Debug)]
pub struct PacerConfig {
    spread_fraction: f64,
    release_jitter: Duration,
    max_wait: Duration,
    max_hosts: usize,
    seed: Option<u64>,
}

impl Default for PacerConfig {
    fn default() -> Self {
        PacerConfig {
            spread_fraction: 0.1,
            release_jitter: Duration::from_millis(100),
            max_wait: Duration::from_secs(60),
            max_hosts: 1024,
            seed: None,
        }
    }
}

impl PacerConfig {
    /// The defaults: spread the last 10 % of a quota, release jitter 100 ms,
    /// waits of at most 60 s, 1024 hosts.
    pub fn new() -> Self {
        Self::default()
    }

    /// The part of a quota, near its end, over which the remaining requests
    /// are spread over the time left in the window instead of sent at once.
    /// `0.0` never spreads (requests go until the quota is out, then wait
    /// for the reset); `1.0` spreads the whole quota evenly. Default `0.1`.
    /// Where the server does not say its limit, nothing is spread.
    pub fn spread_fraction(mut self, fraction: f64) -> Self {
        self.spread_fraction = fraction;
        self
    }

    /// The most a request released at a reset waits past it, drawn
    /// uniformly from `[0, jitter]` per request, so that the requests held
    /// for a reset do not all arrive at once. Default 100 ms.
    pub fn release_jitter(mut self, jitter: Duration) -> Self {
        self.release_jitter = jitter;
        self
    }

    /// The longest a request waits for its quota when it has no deadline
    /// (with one, the deadline bounds the wait). A quota that comes back
    /// later fails the request at once with
    /// [`ErrorKind::QuotaExhausted`](crate::ErrorKind::QuotaExhausted).
    /// Default 60 s.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// How many hosts the pacer keeps a quota for (those whose quota is
    /// low); past that, a new low host evicts the one whose window resets
    /// soonest. Default 1024.
    pub fn max_hosts(mut self, max_hosts: usize) -> Self {
        self.max_hosts = max_hosts;
        self
    }

    /// Seed the release jitter (tests); by default it is seeded from the OS.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&self.spread_fraction) {
            return Err(Error::config(format!(
                "rate limit: spread_fraction must be within 0.0..=1.0, got {}",
                self.spread_fraction
            )));
        }
        for (what, d) in [
            ("release_jitter", self.release_jitter),
            ("max_wait", self.max_wait),
        ] {
            if d > crate::config::MAX_DURATION {
                return Err(Error::config(format!(
                    "rate limit: {what} must be at most {:?}, got {d:?}",
                    crate::config::MAX_DURATION
                )));
            }
        }
        if self.max_hosts == 0 || self.max_hosts > 1 << 20 {
            return Err(Error::config(format!(
                "rate limit: max_hosts must be within 1..={}, got {}",
                1 << 20,
                self.max_hosts
            )));
        }
        Ok(())
    }
}

/// How long a request waits for the next answer when its host's quota is
/// out, answers are on their way, and the server never said when the
/// window ends.
const PROBE: Duration = Duration::from_millis(20);

// ===== the decision =====

/// What [`Pacer::admit`] decides for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send it now.
    Go,
    /// Send it at this instant: its share of the quota is reserved (the
    /// remaining quota is spread over the window).
    Wait(Instant),
    /// Nothing is reserved: the quota is out until a reset (plus jitter)
    /// that comes within the deadline. Ask again at this instant.
    Later(Instant),
    /// The quota does not come back within the request's deadline (or
    /// [`max_wait`](PacerConfig::max_wait)): fail it, not sent.
    Exhausted {
        /// When the quota comes back, as the server said.
        reset: Instant,
        /// Which quota is out.
        dimension: Dimension,
    },
}

/// One request's place in a [`Pacer`]: its cost, and what it reserved.
/// Made by [`Pacer::ticket`], handed back with the response to
/// [`Pacer::record`]. Dropped without that (the request failed or was
/// cancelled), it gives its reservation back.
pub struct Ticket {
    pacer: Arc<Pacer>,
    costs: [u64; 4],
    /// Counted in the pacer's requests in flight.
    live: bool,
    /// Registered with its host's quota: the host's key, its partition,
    /// and the generation of the host's entry (an entry forgotten and made
    /// again counts this ticket as sent before it was tracked).
    reg: Option<(u64, Option<u64>, u64)>,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("costs", &self.costs)
            .field("live", &self.live)
            .field("registered", &self.reg.is_some())
            .finish()
    }
}

impl Ticket {
    /// The pacer this ticket belongs to.
    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }

    /// Settle a ticket whose response says nothing and that reserved
    /// nothing (not registered with a host): out of the in-flight counts,
    /// all [`Pacer::settle_ticket`] would do with an empty reading and no
    /// 429. `false` (nothing done) for a registered ticket.
    #[inline]
    pub(crate) fn settle_unread(&mut self) -> bool {
        if self.reg.is_some() {
            return false;
        }
        if std::mem::take(&mut self.live) {
            for (d, c) in self.costs.iter().enumerate() {
                if *c > 0 {
                    self.pacer.inflight[d].fetch_sub(*c, Ordering::Relaxed);
                }
            }
        }
        true
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.live {
            let pacer = self.pacer.clone();
            pacer.release(self);
        }
    }
}

// ===== per-host state =====

#[derive(Clone, Copy, Debug)]
struct Dim {
    known: bool,
    limit: Option<u64>,
    /// What is left now, by our count: the server's last remaining, less
    /// what was sent since or is in flight (may go below zero).
    left: i64,
    reset_at: Option<Instant>,
    precision: Precision,
    window: Option<Duration>,
    /// Reserved by requests registered here and still in flight.
    inflight: u64,
    /// Sent before the host was tracked and still in flight (estimate).
    untracked: u64,
    /// Spreading: the earliest the next request may go.
    next_slot: Instant,
    /// The smallest remaining count the server said in this window: its
    /// count only goes down within a window, so a reading above it was
    /// made before, and arrived late.
    server_min: u64,
}

impl Dim {
    fn new(now: Instant) -> Self {
        Dim {
            known: false,
            limit: None,
            left: 0,
            reset_at: None,
            precision: Precision::Seconds,
            window: None,
            inflight: 0,
            untracked: 0,
            next_slot: now,
            server_min: u64::MAX,
        }
    }

    fn others(&self) -> i64 {
        self.inflight
            .saturating_add(self.untracked)
            .min(i64::MAX as u64) as i64
    }

    /// A window that ended starts the next: with a known limit, what is
    /// left is the limit less what is in flight; without, the dimension is
    /// forgotten until the server speaks again.
    fn roll(&mut self, now: Instant) {
        let Some(reset) = self.reset_at else { return };
        if reset > now {
            return;
        }
        match self.limit {
            Some(limit) => {
                self.left = (limit.min(i64::MAX as u64) as i64) - self.others();
                self.reset_at = self.window.filter(|w| !w.is_zero()).and_then(|w| {
                    let behind = now.saturating_duration_since(reset).as_nanos() / w.as_nanos();
                    let steps = u32::try_from(behind + 1).ok()?;
                    reset.checked_add(w.checked_mul(steps)?)
                });
                self.next_slot = now;
                self.server_min = u64::MAX;
            }
            None => self.known = false,
        }
    }
}

#[derive(Debug)]
struct Part {
    pk: Option<u64>,
    dims: [Dim; 4],
    touched: Instant,
}

#[derive(Debug)]
struct HostQuota {
    parts: Vec<Part>,
    current: usize,
    /// The server asked for a pause (Retry-After); wins over the headers.
    pause_until: Option<Instant>,
    /// Which entry for this host this is (see [`Ticket`]).
    gen: u64,
}

impl HostQuota {
    fn part(&mut self, pk: Option<u64>, now: Instant) -> usize {
        if let Some(i) = self.parts.iter().position(|p| p.pk == pk) {
            return i;
        }
        let part = Part {
            pk,
            dims: [Dim::new(now); 4],
            touched: now,
        };
        if self.parts.len() < MAX_PARTITIONS {
            self.parts.push(part);
            self.parts.len() - 1
        } else {
            let (i, _) = self
                .parts
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.touched)
                .expect("partitions are never empty");
            self.parts[i] = part;
            i
        }
    }

    /// When nothing here is left to remember (the last reset or pause).
    fn release_at(&self) -> Option<Instant> {
        self.parts
            .iter()
            .flat_map(|p| p.dims.iter())
            .filter(|d| d.known)
            .map(|d| d.reset_at)
            .chain(std::iter::once(self.pause_until))
            .flatten()
            .max()
    }
}

struct State {
    hosts: HashMap<u64, HostQuota>,
    rng: SmallRng,
    /// The generation of the next host entry.
    gen: u64,
}

// ===== impl Pacer =====

/// The pacing engine: per host (its authority, keyed as the
/// [host table](crate::host) keys it) and partition, what the server last
/// said for each [`Dimension`]; [`admit`](Self::admit) says when a request
/// may go, [`record`](Self::record) reads what its response said. See the
/// [module docs](super).
///
/// Share one between layers or clients by its `Arc`.
pub struct Pacer {
    config: PacerConfig,
    /// Per dimension, what requests in flight reserved (all hosts): one
    /// atomic add and one subtract per request on the happy path.
    inflight: [AtomicU64; 4],
    /// Hosts tracked: zero on the happy path (no host low on quota), when
    /// a request reads this and nothing else.
    watched: AtomicUsize,
    state: Mutex<State>,
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("config", &self.config)
            .field("hosts", &self.hosts())
            .finish()
    }
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::build(PacerConfig::default())
    }
}

impl Pacer {
    /// A pacer with `config`.
    ///
    /// # Panics
    ///
    /// On a setting [`try_new`](Self::try_new) refuses, naming it.
    #[track_caller]
    pub fn new(config: PacerConfig) -> Self {
        crate::config::expect_valid("Pacer::new", Self::try_new(config))
    }

    /// A pacer with `config`.
    ///
    /// # Errors
    ///
    /// A [`Config`](crate::ErrorKind::Config) error for a spread fraction
    /// outside `0.0..=1.0`, a jitter or wait over a day, or `max_hosts`
    /// zero or over 2²⁰.
    pub fn try_new(config: PacerConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Pacer::build(config))
    }

    fn build(config: PacerConfig) -> Self {
        let rng = match config.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        Pacer {
            config,
            inflight: Default::default(),
            watched: AtomicUsize::new(0),
            state: Mutex::new(State {
                hosts: HashMap::new(),
                rng,
                gen: 0,
            }),
        }
    }

    /// The settings.
    pub fn config(&self) -> &PacerConfig {
        &self.config
    }

    /// How many hosts are tracked (their quota is low, or they asked for
    /// a pause). Zero: every request costs one atomic read here.
    pub fn hosts(&self) -> usize {
        self.watched.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket for a request of `cost` (one request, and the cost's
    /// tokens).
    pub fn ticket(self: &Arc<Self>, cost: Option<&Cost>) -> Ticket {
        Ticket {
            pacer: self.clone(),
            costs: cost.map_or([1, 0, 0, 0], Cost::per_dimension),
            live: false,
            reg: None,
        }
    }

    /// The quota below which a dimension is spread (its last
    /// `spread_fraction` of `limit`).
    fn zone(&self, limit: Option<u64>) -> i64 {
        match limit {
            Some(l) => (l as f64 * self.config.spread_fraction)
                .ceil()
                .min(i64::MAX as f64) as i64,
            None => 0,
        }
    }

    fn jitter(&self, rng: &mut SmallRng) -> Duration {
        let max = self.config.release_jitter.as_nanos().min(u64::MAX as u128) as u64;
        if max == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(rng.random_range(0..=max))
    }

    /// Count `ticket` in flight (once), when it is let go (a request told
    /// to wait for a reset is not in flight): all [`admit`](Self::admit)
    /// does while no host is tracked.
    pub(crate) fn count(&self, ticket: &mut Ticket) {
        if !ticket.live {
            ticket.live = true;
            for (d, c) in ticket.costs.iter().enumerate() {
                if *c > 0 {
                    self.inflight[d].fetch_add(*c, Ordering::Relaxed);
                }
            }
        }
    }

    /// When may the request of `ticket`, to `uri`, go? `deadline` bounds a
    /// wait (else [`max_wait`](PacerConfig::max_wait) does). See [`Admit`];
    /// after [`Admit::Later`], call again at that instant with the same
    /// ticket.
    ///
    /// While no host is tracked this reads one atomic (and counts the
    /// ticket in flight): no hash, no lock, no clock beyond `now`.
    pub fn admit(
        &self,
        now: Instant,
        uri: &Uri,
        ticket: &mut Ticket,
        deadline: Option<Instant>,
    ) -> Admit {
        if self.watched.load(Ordering::Acquire) == 0 {
            self.count(ticket);
            return Admit::Go;
        }
        let key = HostRef::of(uri).key();
        let mut state = self.lock();
        let State { hosts, rng, .. } = &mut *state;
        let Some(host) = hosts.get_mut(&key) else {
            self.count(ticket);
            return Admit::Go;
        };
        let bound = |t: Instant| {
            deadline.is_some_and(|d| t > d)
                || t.saturating_duration_since(now) > self.config.max_wait
        };
        if let Some(pause) = host.pause_until {
            if pause > now {
                let t = pause + self.jitter(rng);
                if bound(t) {
                    return Admit::Exhausted {
                        reset: pause,
                        dimension: Dimension::Requests,
                    };
                }
                return Admit::Later(t);
            }
            host.pause_until = None;
        }
        let current = host.current;
        let part = &mut host.parts[current];
        part.touched = now;
        let costs = ticket.costs;
        let mut at = now;
        let mut blocked: Option<(Instant, Dimension)> = None;
        let mut probe = false;
        for dimension in Dimension::ALL {
            let d = &mut part.dims[dimension.index()];
            let c = costs[dimension.index()].min(i64::MAX as u64) as i64;
            if !d.known || c == 0 {
                continue;
            }
            d.roll(now);
            if !d.known || d.left >= c.saturating_add(self.zone(d.limit)) {
                continue;
            }
            let Some(reset) = d.reset_at.filter(|r| *r > now) else {
                // Low, and no word on when it comes back. Out, with answers
                // on their way (a window that just rolled over, whose
                // length the server never said): the next answer says
                // where the new window stands, so ask again shortly rather
                // than burst into a 429. Otherwise go: nothing else would
                // ever tell.
                if d.left < c && d.inflight > 0 {
                    probe = true;
                }
                continue;
            };
            if d.left >= c {
                at = at.max(d.next_slot.max(now));
            } else if blocked.is_none_or(|(r, _)| reset > r) {
                blocked = Some((reset, dimension));
            }
        }
        if let Some((reset, dimension)) = blocked {
            let t = reset + self.jitter(rng);
            if bound(t) {
                return Admit::Exhausted { reset, dimension };
            }
            return Admit::Later(t);
        }
        if probe {
            let t = now + PROBE + self.jitter(rng) / 4;
            if !bound(t) {
                return Admit::Later(t);
            }
        }
        // Spreading never fails a request that has quota: one whose slot
        // comes after its deadline goes now.
        if at > now && bound(at) {
            at = now;
        }
        for dimension in Dimension::ALL {
            let d = &mut part.dims[dimension.index()];
            let c = costs[dimension.index()].min(i64::MAX as u64) as i64;
            if !d.known || c == 0 {
                continue;
            }
            if d.left < c.saturating_add(self.zone(d.limit)) {
                if let Some(reset) = d.reset_at.filter(|r| *r > at) {
                    // The remaining `left / c` requests, evenly over the
                    // time left in the window.
                    let share = (d.left / c).max(1) as u32;
                    d.next_slot = at + (reset - at) / share;
                }
            }
            d.left = d.left.saturating_sub(c);
            d.inflight = d.inflight.saturating_add(c as u64);
        }
        ticket.reg = Some((key, part.pk, host.gen));
        self.count(ticket);
        if at > now {
            Admit::Wait(at)
        } else {
            Admit::Go
        }
    }

    /// When `uri`'s host's quota is out past `deadline` (or, without one,
    /// [`max_wait`](PacerConfig::max_wait)), and which: a pause the server
    /// asked for, or a quota at zero whose reset comes later. Reads only,
    /// reserves nothing. For the client's one-service stack, whose
    /// Retry-After gate is checked before the pacer: a request it fails
    /// fast names the quota and its reset, as with the layers stacked as
    /// documented (the pacer outside the gate).
    #[cfg(feature = "stack")]
    pub(crate) fn out_past(
        &self,
        now: Instant,
        uri: &Uri,
        deadline: Option<Instant>,
    ) -> Option<(Instant, Dimension)> {
        if self.watched.load(Ordering::Acquire) == 0 {
            return None;
        }
        let key = HostRef::of(uri).key();
        let state = self.lock();
        let host = state.hosts.get(&key)?;
        let bound = |t: Instant| {
            t > now
                && (deadline.is_some_and(|d| t > d)
                    || t.saturating_duration_since(now) > self.config.max_wait)
        };
        if let Some(pause) = host.pause_until.filter(|p| bound(*p)) {
            return Some((pause, Dimension::Requests));
        }
        let part = host.parts.get(host.current)?;
        Dimension::ALL.into_iter().find_map(|dimension| {
            let d = &part.dims[dimension.index()];
            let reset = d.reset_at.filter(|r| d.known && d.left < 1 && bound(*r))?;
            Some((reset, dimension))
        })
    }

    /// Read what the response to `ticket`'s request said (`reading`, parsed
    /// from its headers at `now`; skip cached responses): the host's quota
    /// is updated, the ticket's reservation is settled. Returns the signal
    /// for an adaptive limit when the response is a 429 or a quota is at
    /// zero.
    ///
    /// A response that says the quota is plenty, while no host is tracked,
    /// costs nothing more than the look at its numbers: no hash, no lock.
    pub fn record(
        &self,
        now: Instant,
        uri: &Uri,
        mut ticket: Ticket,
        status: StatusCode,
        reading: &Reading,
    ) -> Option<QuotaSignal> {
        debug_assert!(std::ptr::eq(self, &*ticket.pacer), "a ticket of this pacer");
        Self::settle_ticket(
            &mut ticket,
            || now,
            || HostRef::of(uri).key(),
            status,
            reading,
        )
    }

    /// [`record`](Self::record) with the clock and the host's key read only
    /// if the reading has to be stored.
    ///
    /// Settles `ticket` in place (it is left counted out and unregistered,
    /// for its owner to drop): no move of the ticket and no second handle
    /// on its pacer, on every response.
    pub(crate) fn settle_ticket(
        ticket: &mut Ticket,
        now: impl FnOnce() -> Instant,
        key: impl FnOnce() -> u64,
        status: StatusCode,
        reading: &Reading,
    ) -> Option<QuotaSignal> {
        let this: &Pacer = &ticket.pacer;
        let signal = QuotaSignal::of(status, reading);
        ticket.live = false;
        for (d, c) in ticket.costs.iter().enumerate() {
            if *c > 0 {
                this.inflight[d].fetch_sub(*c, Ordering::Relaxed);
            }
        }
        if reading.is_empty() && ticket.reg.is_none() {
            // Nothing said, nothing reserved: the happy path ends here.
            return signal;
        }
        let tight = (reading.retry_after.is_some() && reading.has_quota())
            || reading.quotas().any(|(dimension, q)| {
                q.remaining.is_some_and(|r| {
                    let d = dimension.index();
                    let flying = this.inflight[d].load(Ordering::Relaxed);
                    (r.min(i64::MAX as u64) as i64)
                        <= this.zone(q.limit).saturating_add(
                            flying.saturating_add(ticket.costs[d]).min(i64::MAX as u64) as i64,
                        )
                })
            });
        if !tight && ticket.reg.is_none() && this.watched.load(Ordering::Acquire) == 0 {
            return signal;
        }
        let key = match ticket.reg {
            Some((key, _, _)) => key,
            None => key(),
        };
        let now = now();
        let mut state = this.lock();
        state.gen += 1;
        let gen = state.gen;
        let hosts = &mut state.hosts;
        if !hosts.contains_key(&key) {
            if !tight {
                return signal;
            }
            if hosts.len() >= this.config.max_hosts {
                let evict = hosts
                    .iter()
                    .min_by_key(|(_, h)| h.release_at())
                    .map(|(k, _)| *k);
                if let Some(k) = evict {
                    hosts.remove(&k);
                    this.watched.fetch_sub(1, Ordering::AcqRel);
                }
            }
            hosts.insert(
                key,
                HostQuota {
                    parts: Vec::new(),
                    current: 0,
                    pause_until: None,
                    gen,
                },
            );
            this.watched.fetch_add(1, Ordering::AcqRel);
        }
        let host = hosts.get_mut(&key).expect("inserted above");
        let fresh = host.parts.is_empty();
        // Settle the ticket: its reservation leaves the partition it was
        // made in; an untracked request leaves the untracked estimate.
        match ticket.reg.take() {
            Some((_, pk, g)) if g == host.gen => {
                if let Some(p) = host.parts.iter_mut().find(|p| p.pk == pk) {
                    for (d, dim) in p.dims.iter_mut().enumerate() {
                        dim.inflight = dim.inflight.saturating_sub(ticket.costs[d]);
                    }
                }
            }
            _ => {
                for p in &mut host.parts {
                    for (d, dim) in p.dims.iter_mut().enumerate() {
                        dim.untracked = dim.untracked.saturating_sub(ticket.costs[d]);
                    }
                }
            }
        }
        let i = host.part(reading.partition, now);
        host.current = i;
        let part = &mut host.parts[i];
        part.touched = now;
        for (d, dim) in part.dims.iter_mut().enumerate() {
            let flying = this.inflight[d].load(Ordering::Relaxed);
            dim.untracked = if fresh {
                // Requests sent before the host was tracked are in flight,
                // and count against what the server says is left.
                flying
            } else {
                // Never more than is in flight at all (one that failed
                // unanswered left the estimate without settling it).
                dim.untracked.min(flying)
            };
        }
        for (dimension, q) in reading.quotas() {
            let d = &mut part.dims[dimension.index()];
            d.limit = q.limit.or(d.limit);
            d.window = q.window.or(d.window);
            let Some(remaining) = q.remaining else {
                continue;
            };
            let estimate = (remaining.min(i64::MAX as u64) as i64) - d.others();
            let reset_at = q.reset.and_then(|r| now.checked_add(r));
            let tolerance = q.precision.granule().max(d.precision.granule());
            let new_window = !d.known
                || d.reset_at.is_none_or(|old| old <= now)
                || matches!((reset_at, d.reset_at), (Some(new), Some(old)) if new > old + tolerance);
            if new_window {
                d.left = estimate;
                d.reset_at = reset_at;
                d.precision = q.precision;
                d.next_slot = now;
                d.server_min = remaining;
            } else if remaining <= d.server_min {
                // The server's latest count: it says what the requests it
                // answered really cost (an estimate corrected), less what
                // is still in flight.
                d.left = estimate;
                d.server_min = remaining;
                if reset_at.is_some() && q.precision > d.precision {
                    d.reset_at = reset_at;
                    d.precision = q.precision;
                }
            }
            // Else a reading made before the latest one, arrived late.
            d.known = true;
        }
        // Retry-After wins over the rate-limit headers it comes with. A
        // bare one (no quota named) is the Retry-After gate's to hold, as
        // its mode says (`retry_after_gate(None)`: nothing held).
        if let Some(pause) = reading.retry_after.filter(|_| reading.has_quota()) {
            if let Some(until) = now.checked_add(pause) {
                host.pause_until = Some(host.pause_until.map_or(until, |p| p.max(until)));
            }
        }
        this.untrack_if_plenty(hosts, key, now);
        signal
    }

    /// Forget a host whose every quota is plenty again (and that asks for
    /// no pause): its requests go back to the happy path.
    fn untrack_if_plenty(&self, hosts: &mut HashMap<u64, HostQuota>, key: u64, now: Instant) {
        let Some(host) = hosts.get(&key) else { return };
        if host.pause_until.is_some_and(|p| p > now) {
            return;
        }
        let plenty = host.parts.iter().all(|p| {
            p.dims.iter().enumerate().all(|(i, d)| {
                let flying = self.inflight[i]
                    .load(Ordering::Relaxed)
                    .min(i64::MAX as u64) as i64;
                !d.known
                    || (d.reset_at.is_some_and(|r| r <= now) && d.limit.is_none())
                    || d.left >= self.zone(d.limit).saturating_add(flying).saturating_add(1)
            })
        });
        if plenty {
            hosts.remove(&key);
            self.watched.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A request that ends without a response to read (an error, a drop):
    /// its reservation goes back to in flight accounting (the quota it may
    /// have used is not given back: the server may have counted it).
    fn release(&self, ticket: &mut Ticket) {
        ticket.live = false;
        for (d, c) in ticket.costs.iter().enumerate() {
            if *c > 0 {
                self.inflight[d].fetch_sub(*c, Ordering::Relaxed);
            }
        }
        // Not registered: sent while its host was not tracked, it is
        // settled (as all are) by its response, or left in the estimate.
        let Some((key, _, _)) = ticket.reg else {
            return;
        };
        let mut state = self.lock();
        let Some(host) = state.hosts.get_mut(&key) else {
            return;
        };
        let same = matches!(ticket.reg, Some((_, _, g)) if g == host.gen);
        let pk = ticket.reg.and_then(|r| r.1);
        for p in &mut host.parts {
            for (d, dim) in p.dims.iter_mut().enumerate() {
                if !same {
                    dim.untracked = dim.untracked.saturating_sub(ticket.costs[d]);
                } else if p.pk == pk {
                    dim.inflight = dim.inflight.saturating_sub(ticket.costs[d]);
                }
            }
        }
        ticket.reg = None;
    }

    /// Correct a request's token estimate with its actual usage, read by
    /// the caller from the response body (e.g. an AI API's `usage`
    /// object): what was reserved beyond the usage goes back to the host's
    /// token quotas, a usage beyond the estimate is taken from them. For
    /// servers that do not report remaining tokens in headers (a server
    /// that does already corrects the count with its next response).
    pub fn correct(&self, uri: &Uri, estimated: &Cost, used: &Cost) {
        if self.watched.load(Ordering::Acquire) == 0 {
            return;
        }
        let key = HostRef::of(uri).key();
        let mut state = self.lock();
        let Some(host) = state.hosts.get_mut(&key) else {
            return;
        };
        let current = host.current;
        let part = &mut host.parts[current];
        let (est, used) = (estimated.per_dimension(), used.per_dimension());
        for d in 1..4 {
            let delta = est[d].min(i64::MAX as u64) as i64 - used[d].min(i64::MAX as u64) as i64;
            part.dims[d].left = part.dims[d].left.saturating_add(delta);
        }
    }

    /// What the pacer counts as left for `dimension` of `uri`'s host now
    /// (its current partition), if the host is tracked.
    pub fn left(&self, uri: &Uri, dimension: Dimension) -> Option<i64> {
        let key = HostRef::of(uri).key();
        let state = self.lock();
        let host = state.hosts.get(&key)?;
        let d = &host.parts.get(host.current)?.dims[dimension.index()];
        d.known.then_some(d.left)
    }
}

#[cfg(test)]
mod tests;
