//! Redis as rebound's shared host state: one request quota and one
//! Retry-After pause per host for every replica of a service.
//!
//! [`RedisStore`] is a [`HostStore`] for
//! [`SharedState`](rebound_core::shared::SharedState); see
//! [`rebound_core::shared`] for what is shared, how far over the quota a
//! fleet can go, and what happens when Redis is down or slow.
//!
//! ```no_run
//! use std::sync::Arc;
//! use rebound_core::shared::{SharedConfig, SharedState};
//! use rebound_redis::RedisStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let store = RedisStore::new("redis://127.0.0.1:6379/", "billing-svc")?;
//! let shared = SharedState::new(Arc::new(store), SharedConfig::new());
//! # let _ = shared;
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! All under the namespace, holding no host name, no partition key and no
//! secret — only the host's [`HostId`] (a hash):
//!
//! * `NS:q:ID` — the host's shared request count, a hash (`t` requests
//!   left, `r` the reset and `w` the window in ms of Redis's clock, `l` the
//!   limit), expiring two windows after its reset (an hour without one);
//! * `NS:p:ID` — the host's pause, with a time to live of the pause;
//! * channel `NS:pauses` — each new pause as `ID MS`.
//!
//! Every quota operation is one Lua script (`EVALSHA`, falling back to
//! `EVAL` and loading it when Redis lost its script cache), reading the
//! time from Redis itself (`TIME`), so replicas' clocks play no part.
//!
//! # Client
//!
//! redis-rs with its [`ConnectionManager`] (reconnects in the background,
//! never blocks a call on it) for the calls, and one pub/sub connection for
//! the pauses, re-made by the shared state's watch when lost. The store
//! must be made within a Tokio runtime.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rebound_core::shared::{
    HostId, HostStore, Lease, Observation, PauseSink, StoreError, StoreErrorKind, StoreFuture,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

/// The quota script: `lease`, `give` or `observe` on one host's count.
const QUOTA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 't', 'r', 'l', 'w')
local tok, r, l, w = tonumber(b[1]), tonumber(b[2]) or 0, tonumber(b[3]), tonumber(b[4]) or 0
if tok and r > 0 and now >= r then
  if l then tok = l else tok = nil end
  if w > 0 then r = r + w * (math.floor((now - r) / w) + 1) else r = 0 end
end
local op = ARGV[1]
local out = {0, 0, 0}
if op == 'lease' then
  if not tok then return {-1, -1, 0} end
  local g = math.min(tonumber(ARGV[2]), math.max(tok, 0))
  tok = tok - g
  if r > 0 then out = {g, r - now, r} else out = {g, -1, 0} end
elseif op == 'give' then
  -- Only to the window the lease came from: after a reset the count was
  -- refilled, and what a replica did not use of the last one is gone.
  if not tok or tonumber(ARGV[3]) ~= r then return out end
  tok = tok + tonumber(ARGV[2])
  if l and tok > l then tok = l end
elseif op == 'observe' then
  local rem, rin = tonumber(ARGV[2]), tonumber(ARGV[3])
  local lim, win, tol = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local nr = 0
  if rin >= 0 then nr = now + rin end
  if lim >= 0 then l = lim end
  if win > 0 then w = win end
  -- A later reset within the readings' jitter is the same window.
  tol = math.max(tol, 250)
  if nr > 0 and nr <= now then
    -- Made before a reset that has passed: says nothing of this window.
  elseif not tok or nr == 0 then
    tok = rem
    r = nr
  elseif r == 0 then
    -- Refilled at a reset whose next one was unknown: what the server
    -- says is left, less nothing leased since (only lowers the count).
    tok = math.min(tok, rem)
    r = nr
  elseif nr > r + tol then
    -- The server's window rolled before ours.
    tok = rem
    r = nr
  else
    tok = math.min(tok, rem)
  end
else
  return redis.error_reply('unknown op')
end
redis.call('HSET', KEYS[1], 't', tok, 'r', r, 'w', w)
if l then redis.call('HSET', KEYS[1], 'l', l) end
local ttl = 3600000
if r > 0 then ttl = (r - now) + 2 * math.max(w, 1000) end
redis.call('PEXPIRE', KEYS[1], math.max(ttl, 1000))
return out
"#;

/// The pause script: the longer pause wins; published either way.
const PAUSE: &str = r#"
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('SET', KEYS[1], '1', 'PX', ms)
end
redis.call('PUBLISH', KEYS[2], ARGV[2] .. ' ' .. ms)
return 1
"#;

/// Pause keys read on (re)connect, at most.
const MAX_PAUSES_READ: usize = 10_000;

/// A [`HostStore`] on Redis. See the [crate docs](crate).
///
/// # Clone
///
/// Clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    client: redis::Client,
    manager: ConnectionManager,
    namespace: Arc<str>,
    quota: Arc<Script>,
    pause: Arc<Script>,
    connect_timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The address only: never the URL's password.
        f.debug_struct("RedisStore")
            .field(
                "addr",
                &self.client.get_connection_info().addr().to_string(),
            )
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl RedisStore {
    /// A store on the Redis at `url` (`redis://[user:password@]host:port/db`),
    /// its keys under `namespace` (1 to 64 of `A-Z a-z 0-9 _ - . :`). Does
    /// not connect: the first call does, and a Redis that is down is the
    /// shared state's to handle.
    ///
    /// # Errors
    ///
    /// A [`Config`](rebound_core::ErrorKind::Config) error for a URL that
    /// does not parse (the error does not repeat it) or a bad namespace.
    pub fn new(url: &str, namespace: &str) -> Result<Self, rebound_core::Error> {
        let ok = (1..=64).contains(&namespace.len())
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
        if !ok {
            return Err(rebound_core::Error::config(
                "redis store: namespace must be 1 to 64 of A-Z a-z 0-9 _ - . :",
            ));
        }
        let client = redis::Client::open(url).map_err(|e| {
            rebound_core::Error::config(format!(
                "redis store: the URL does not parse ({:?})",
                e.kind()
            ))
        })?;
        let connect_timeout = Duration::from_millis(250);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let manager =
            ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(|e| {
                rebound_core::Error::config(format!(
                    "redis store: no connection manager ({:?})",
                    e.kind()
                ))
            })?;
        Ok(RedisStore {
            client,
            manager,
            namespace: namespace.into(),
            quota: Arc::new(Script::new(QUOTA)),
            pause: Arc::new(Script::new(PAUSE)),
            connect_timeout,
        })
    }

    fn quota_key(&self, host: HostId) -> String {
        format!("{}:q:{host}", self.namespace)
    }

    fn pause_key(&self, host: HostId) -> String {
        format!("{}:p:{host}", self.namespace)
    }

    fn channel(&self) -> String {
        format!("{}:pauses", self.namespace)
    }

    fn run_quota(&self, host: HostId, args: Vec<i64>, op: &'static str) -> StoreFuture<Vec<i64>> {
        let mut con = self.manager.clone();
        let script = self.quota.clone();
        let key = self.quota_key(host);
        Box::pin(async move {
            let mut inv = script.key(key);
            inv.arg(op);
            for a in args {
                inv.arg(a);
            }
            let out: Vec<i64> = inv.invoke_async(&mut con).await.map_err(store_error)?;
            if out.len() != 3 {
                return Err(StoreError::new(
                    StoreErrorKind::Garbage,
                    "quota script: not a triple",
                ));
            }
            Ok(out)
        })
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A redis error as a store error: its kind only (no key, no value).
fn store_error(e: RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Garbage
    };
    StoreError::new(kind, format!("redis: {:?}", e.kind()))
}

impl HostStore for RedisStore {
    fn lease(&self, host: HostId, want: u64) -> StoreFuture<Lease> {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let fut = self.run_quota(host, vec![want], "lease");
        Box::pin(async move {
            let out = fut.await?;
            let (granted, reset, window) = (out[0], out[1], out[2]);
            if granted < 0 {
                return Ok(Lease::Untracked);
            }
            if granted > want {
                return Err(StoreError::new(
                    StoreErrorKind::Garbage,
                    "quota script: more granted than asked",
                ));
            }
            Ok(Lease::Granted {
                granted: granted as u64,
                reset_in: u64::try_from(reset).ok().map(Duration::from_millis),
                window: u64::try_from(window).unwrap_or(0),
            })
        })
    }

    fn give_back(&self, host: HostId, n: u64, window: u64) -> StoreFuture<()> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let window = i64::try_from(window).unwrap_or(-1);
        let fut = self.run_quota(host, vec![n, window], "give");
        Box::pin(async move { fut.await.map(drop) })
    }

    fn observe(&self, host: HostId, o: Observation) -> StoreFuture<()> {
        let args = vec![
            i64::try_from(o.remaining).unwrap_or(i64::MAX),
            o.reset_in.map_or(-1, ms),
            o.limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX)),
            o.window.map_or(0, ms),
            ms(o.precision),
        ];
        let fut = self.run_quota(host, args, "observe");
        Box::pin(async move { fut.await.map(drop) })
    }

    fn pause(&self, host: HostId, pause: Duration) -> StoreFuture<()> {
        let mut con = self.manager.clone();
        let script = self.pause.clone();
        let (key, channel) = (self.pause_key(host), self.channel());
        let pause = ms(pause).max(1);
        Box::pin(async move {
            let _: i64 = script
                .key(key)
                .key(channel)
                .arg(pause)
                .arg(host.to_string())
                .invoke_async(&mut con)
                .await
                .map_err(store_error)?;
            Ok(())
        })
    }

    fn watch(&self, sink: PauseSink) -> StoreFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let mut pubsub =
                match tokio::time::timeout(this.connect_timeout, this.client.get_async_pubsub())
                    .await
                {
                    Ok(r) => r.map_err(store_error)?,
                    Err(_) => {
                        return Err(StoreError::new(
                            StoreErrorKind::Timeout,
                            "redis: pub/sub connect",
                        ))
                    }
                };
            pubsub
                .subscribe(this.channel())
                .await
                .map_err(store_error)?;
            // The pauses set before this replica (re)connected.
            let mut con = this.manager.clone();
            let pattern = format!("{}:p:*", this.namespace);
            let mut cursor = 0u64;
            let mut read = 0usize;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut con)
                    .await
                    .map_err(store_error)?;
                for key in keys {
                    read += 1;
                    let Some(id) = key.rsplit(':').next().and_then(HostId::parse) else {
                        continue;
                    };
                    let ttl: i64 = redis::cmd("PTTL")
                        .arg(&key)
                        .query_async(&mut con)
                        .await
                        .map_err(store_error)?;
                    if let Ok(ttl) = u64::try_from(ttl) {
                        sink(id, Duration::from_millis(ttl));
                    }
                }
                cursor = next;
                if cursor == 0 || read >= MAX_PAUSES_READ {
                    break;
                }
            }
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let payload: String = match msg.get_payload() {
                    Ok(p) => p,
                    Err(_) => continue,
                };
                let mut parts = payload.split(' ');
                let id = parts.next().and_then(HostId::parse);
                let pause = parts.next().and_then(|m| m.parse::<u64>().ok());
                if let (Some(id), Some(pause)) = (id, pause) {
                    sink(id, Duration::from_millis(pause));
                }
            }
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "redis: pub/sub connection lost",
            ))
        })
    }
}
