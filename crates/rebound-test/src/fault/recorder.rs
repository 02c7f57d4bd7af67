//! What the server saw, and the script it follows (both behind one lock, so
//! that the order of the records is the order in which actions were taken).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{HeaderMap, Method, Version};
use tokio::sync::watch;
use tokio::time::Instant;

use super::action::{Action, ConnectionAction};

/// One request as the [`FaultServer`](super::FaultServer) received it.
///
/// The fields are public for easy assertions; more may be added.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RecordedRequest {
    /// The request method.
    pub method: Method,
    /// The request target exactly as received: path and query
    /// (`/search?q=x`). On HTTP/2, the `:path` pseudo-header.
    pub target: String,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2.0`.
    pub version: Version,
    /// The request headers (on HTTP/2 without the pseudo-headers).
    pub headers: HeaderMap,
    /// The request body, decoded from its `content-length` or chunked
    /// framing.
    pub body: Bytes,
    /// When the request head had been read (`tokio::time`, so it follows a
    /// paused clock).
    pub received_at: Instant,
    /// The connection it came on: connections are numbered from 0 in
    /// accept order.
    pub connection: u64,
    /// Its position among all the requests the server received, from 0.
    pub index: usize,
    /// Its position among the requests of its connection, from 0: above 0
    /// means the connection was reused.
    pub index_on_connection: usize,
}

impl RecordedRequest {
    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// The query string without its `?`, if there is one.
    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// The value of a header, if present and valid UTF-8 (the first one if
    /// repeated).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Returned when a wait on the [`FaultServer`](super::FaultServer) ran out of
/// time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitTimeout {
    what: &'static str,
    wanted: u64,
    seen: u64,
}

impl WaitTimeout {
    /// How many were awaited.
    pub fn wanted(&self) -> u64 {
        self.wanted
    }

    /// How many had been seen when the time ran out.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

impl fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out waiting for {} {}: saw {}",
            self.wanted, self.what, self.seen
        )
    }
}

impl std::error::Error for WaitTimeout {}

pub(crate) struct Script {
    routes: HashMap<String, VecDeque<Action>>,
    default: Action,
    connections: VecDeque<ConnectionAction>,
    default_connection: ConnectionAction,
}

impl Script {
    pub(crate) fn new(
        routes: HashMap<String, VecDeque<Action>>,
        default: Action,
        connections: VecDeque<ConnectionAction>,
        default_connection: ConnectionAction,
    ) -> Self {
        Script {
            routes,
            default,
            connections,
            default_connection,
        }
    }
}

struct State {
    script: Script,
    requests: Vec<RecordedRequest>,
    per_connection: HashMap<u64, usize>,
}

impl State {
    fn push(&mut self, incoming: Incoming, body: Bytes) {
        let index = self.requests.len();
        let on_conn = self.per_connection.entry(incoming.connection).or_insert(0);
        let index_on_connection = *on_conn;
        *on_conn += 1;
        self.requests.push(RecordedRequest {
            method: incoming.method,
            target: incoming.target,
            version: incoming.version,
            headers: incoming.headers,
            body,
            received_at: incoming.received_at,
            connection: incoming.connection,
            index,
            index_on_connection,
        });
    }
}

/// The state shared by the server's tasks and the [`FaultServer`] handle.
///
/// [`FaultServer`]: super::FaultServer
pub(crate) struct Shared {
    state: Mutex<State>,
    received: watch::Sender<u64>,
    accepted: watch::Sender<u64>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    /// Request heads read, whether or not their body was read whole.
    started: AtomicUsize,
    /// Connections accepted and not yet closed.
    open: AtomicUsize,
}

/// The parts of a request known before it is recorded.
pub(crate) struct Incoming {
    pub(crate) method: Method,
    pub(crate) target: String,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) received_at: Instant,
    pub(crate) connection: u64,
}

impl Shared {
    pub(crate) fn new(script: Script) -> Arc<Self> {
        Arc::new(Shared {
            state: Mutex::new(State {
                script,
                requests: Vec::new(),
                per_connection: HashMap::new(),
            }),
            received: watch::Sender::new(0),
            accepted: watch::Sender::new(0),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-updated
        // in a way that matters to a test kit: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an accepted connection; returns its id and what to do with it.
    pub(crate) fn accept(&self) -> (u64, ConnectionAction) {
        let action = {
            let mut state = self.lock();
            let script = &mut state.script;
            script
                .connections
                .pop_front()
                .unwrap_or_else(|| script.default_connection.clone())
        };
        let mut id = 0;
        self.accepted.send_modify(|n| {
            id = *n;
            *n += 1;
        });
        (id, action)
    }

    /// Records a complete request and picks its action, atomically.
    pub(crate) fn record(&self, incoming: Incoming, body: Bytes) -> Action {
        let mut state = self.lock();
        let path = incoming.target.split('?').next().unwrap_or_default();
        let action = match state.script.routes.get_mut(path) {
            Some(queue) if !queue.is_empty() => queue.pop_front(),
            _ => None,
        }
        .unwrap_or_else(|| state.script.default.clone());
        state.push(incoming, body);
        drop(state);
        self.received.send_modify(|n| *n += 1);
        action
    }

    /// The action for a request to `target` if it is one that acts before
    /// the body is read ([`Action::after_body_bytes`]), taken from the
    /// script; `None` (and the script untouched) otherwise.
    pub(crate) fn take_early(&self, target: &str) -> Option<Action> {
        let mut state = self.lock();
        let path = target.split('?').next().unwrap_or_default();
        let script = &mut state.script;
        match script.routes.get_mut(path) {
            Some(queue) if !queue.is_empty() => {
                if queue.front().is_some_and(|a| a.early.is_some()) {
                    queue.pop_front()
                } else {
                    None
                }
            }
            _ => script
                .default
                .early
                .is_some()
                .then(|| script.default.clone()),
        }
    }

    /// Records a request whose action was taken already
    /// ([`take_early`](Self::take_early)).
    pub(crate) fn record_only(&self, incoming: Incoming, body: Bytes) {
        self.lock().push(incoming, body);
        self.received.send_modify(|n| *n += 1);
    }

    pub(crate) fn push_route(&self, path: &str, actions: impl IntoIterator<Item = Action>) {
        self.lock()
            .script
            .routes
            .entry(path.to_owned())
            .or_default()
            .extend(actions);
    }

    pub(crate) fn set_default(&self, action: Action) {
        self.lock().script.default = action;
    }

    pub(crate) fn set_default_connection(&self, action: ConnectionAction) {
        self.lock().script.default_connection = action;
    }

    pub(crate) fn push_connections(&self, actions: impl IntoIterator<Item = ConnectionAction>) {
        self.lock().script.connections.extend(actions);
    }

    pub(crate) fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    pub(crate) fn request_count(&self) -> u64 {
        *self.received.borrow()
    }

    /// One connection accepted; it counts as open until the guard drops.
    pub(crate) fn open_connection(self: &Arc<Self>) -> OpenConnection {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenConnection(Arc::clone(self))
    }

    pub(crate) fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    pub(crate) fn connection_count(&self) -> u64 {
        *self.accepted.borrow()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub(crate) fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Marks a request in flight until the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> InFlight {
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        InFlight {
            shared: Arc::clone(self),
        }
    }

    pub(crate) async fn wait_requests(
        &self,
        n: u64,
        timeout: std::time::Duration,
    ) -> Result<(), WaitTimeout> {
        wait(&self.received, n, timeout, "requests").await
    }

    pub(crate) async fn wait_connections(
        &self,
        n: u64,
        timeout: std::time::Duration,
    ) -> Result<(), WaitTimeout> {
        wait(&self.accepted, n, timeout, "connections").await
    }
}

async fn wait(
    counter: &watch::Sender<u64>,
    n: u64,
    timeout: std::time::Duration,
    what: &'static str,
) -> Result<(), WaitTimeout> {
    let mut rx = counter.subscribe();
    let reached = tokio::time::timeout(timeout, rx.wait_for(|seen| *seen >= n)).await;
    match reached {
        Ok(Ok(_)) => Ok(()),
        // The sender lives in `Shared`, which outlives this borrow: only the
        // timeout can end the wait.
        _ => Err(WaitTimeout {
            what,
            wanted: n,
            seen: *counter.borrow(),
        }),
    }
}

/// A request in flight; dropping it ends its flight.
pub(crate) struct InFlight {
    shared: Arc<Shared>,
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection the server still holds; see [`Shared::open_connection`].
pub(crate) struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}
