//! A real TCP (optionally TLS) server on `127.0.0.1:0` that misbehaves on
//! cue and records every request it receives.
//!
//! ```
//! use std::time::Duration;
//! use rebound_test::fault::{Action, FaultServer};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let server = FaultServer::builder()
//!     .route("/flaky", [Action::status(503).header("retry-after", "1")])
//!     .default(Action::status(200).body("ok"))
//!     .start()
//!     .await;
//!
//! // Two requests on one keep-alive connection: 503 first, then the default.
//! let mut conn = tokio::net::TcpStream::connect(server.addr()).await?;
//! let req = b"GET /flaky?token=s3cret HTTP/1.1\r\nhost: x\r\n\r\n";
//! conn.write_all(req).await?;
//! conn.write_all(req).await?;
//! let mut seen = Vec::new();
//! while !String::from_utf8_lossy(&seen).ends_with("ok") {
//!     let mut buf = [0u8; 1024];
//!     let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await??;
//!     assert!(n > 0, "closed early");
//!     seen.extend_from_slice(&buf[..n]);
//! }
//! let text = String::from_utf8_lossy(&seen);
//! assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"));
//! assert!(text.contains("HTTP/1.1 200 OK\r\n"));
//!
//! server.wait_for_requests(2, Duration::from_secs(5)).await.unwrap();
//! let requests = server.requests();
//! assert_eq!(requests[1].target, "/flaky?token=s3cret");
//! assert_eq!(requests[1].index_on_connection, 1);
//! assert_eq!(server.connections(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # The script
//!
//! Each accepted connection first takes the next entry of the
//! [connection queue](FaultServerBuilder::connections) (a
//! [`ConnectionAction`]: serve, serve some requests then go silent, never
//! read, hang the TLS handshake, close, reset, or refuse an HTTP/2 request
//! with a `GOAWAY` ([`ConnectionAction::go_away`]); once that queue is empty, it gets the
//! [default connection action](FaultServerBuilder::default_connection)
//! (serve, unless set).
//!
//! On a served connection, each request is read completely (unless its
//! action says [`Action::after_body_bytes`]), recorded, and
//! answered with an [`Action`] chosen by its **path** (the query is ignored
//! for matching, kept in the record): the next action queued for that path
//! by [`route`](FaultServerBuilder::route), or, when the path has no queue or
//! its queue is used up, the [default](FaultServerBuilder::default) action
//! (a `200` with an empty body unless set).
//!
//! So the precedence is: the connection's action (a connection that is not
//! served never gets to requests), then the path's queue, then the default
//! action. Queues can be extended and defaults replaced while the server
//! runs ([`FaultServer::route`], [`FaultServer::set_default`],
//! [`FaultServer::push_connections`],
//! [`FaultServer::set_default_connection`]).
//!
//! # Protocols
//!
//! Plain TCP speaks HTTP/1.1 (and 1.0) with keep-alive: a connection
//! serves requests until the client closes it, sends `connection: close`,
//! or an action ends it. With [`tls`](FaultServerBuilder::tls) the server
//! offers `h2` and `http/1.1` by ALPN, with a certificate for `localhost`
//! and `127.0.0.1` signed by a CA generated at start (trust it with
//! [`FaultServer::root_store`] or [`FaultServer::ca_cert_der`]). On HTTP/2,
//! well-formed responses, delays, stalls and trickles behave as on
//! HTTP/1.1, while [`Action::close`], [`Action::reset`],
//! [`Action::reset_mid_headers`], truncations and mid-body resets reset
//! the stream (`RST_STREAM`) instead of the connection.
//!
//! # Time
//!
//! Delays, trickles and arrival times use `tokio::time`, so they follow a
//! paused clock (`#[tokio::test(start_paused = true)]`): a 30 s delay
//! costs no wall-clock time there. Beware that a paused clock also jumps
//! over a client's own timeouts whenever the runtime is idle, real sockets
//! or not.
//!
//! # Limits
//!
//! Request heads up to 64 KiB and 128 headers, request bodies up to
//! 64 MiB (`content-length` or chunked); past that the connection is
//! closed. A client that half-closes its side of the connection
//! (`shutdown(Write)`) while a response is delayed or stalled is taken as
//! gone. The server logs nothing (no request detail can leak into a test's
//! captured logs).
//!
//! HTTP/1.1 is written by hand, byte by byte, so that resets
//! (`SO_LINGER` 0), truncations and half-written heads are exact; HTTP/2
//! goes through hyper's server.
//!
//! # Bounded
//!
//! Every task the server starts stops when the [`FaultServer`] is dropped:
//! stalls, trickles and never-answered requests included. A connection that
//! waits (a delay, a stall, [`Action::never_respond`],
//! [`ConnectionAction::never_read`]) also ends when its client closes it,
//! so the server's tasks do not outlive the client's requests (tests that
//! count the runtime's alive tasks can rely on it).
//! [`FaultServer::shutdown`] stops the server and waits until all its tasks
//! are gone.

mod action;
mod body;
mod goaway;
mod h1;
mod h2;
mod recorder;
mod tls;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::action::{Action, ConnectionAction};
pub use self::recorder::{RecordedRequest, WaitTimeout};

use self::action::ConnKind;
use self::recorder::{Script, Shared};
use self::tls::TlsMaterial;

/// A loopback HTTP server driven by a script of faults. See the
/// [module docs](self) for an example and the rules of the script.
///
/// Dropping it stops everything it started.
pub struct FaultServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tls: Option<Arc<TlsMaterial>>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl fmt::Debug for FaultServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultServer")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("connections", &self.connections())
            .field("requests", &self.request_count())
            .finish()
    }
}

/// Builds a [`FaultServer`]; made by [`FaultServer::builder`].
#[derive(Debug)]
pub struct FaultServerBuilder {
    routes: HashMap<String, VecDeque<Action>>,
    default: Action,
    connections: VecDeque<ConnectionAction>,
    default_connection: ConnectionAction,
    tls: bool,
}

impl FaultServerBuilder {
    /// Queues actions for requests to `path` (matched exactly, query
    /// ignored), used one per request in order; after the last, requests to
    /// `path` get the default action. Calling it again for the same path
    /// appends to its queue.
    pub fn route(mut self, path: &str, actions: impl IntoIterator<Item = Action>) -> Self {
        self.routes
            .entry(path.to_owned())
            .or_default()
            .extend(actions);
        self
    }

    /// The action for requests no route queue answers. Default:
    /// `Action::status(200)` (empty body).
    pub fn default(mut self, action: Action) -> Self {
        self.default = action;
        self
    }

    /// Queues actions for the next accepted connections, one per connection
    /// in accept order; after the last, connections get the
    /// [default connection action](Self::default_connection). Default:
    /// empty.
    pub fn connections(mut self, actions: impl IntoIterator<Item = ConnectionAction>) -> Self {
        self.connections.extend(actions);
        self
    }

    /// The action for connections the connection queue does not cover, e.g.
    /// `ConnectionAction::hang_tls()` to hang every handshake, retries
    /// included. Default: `ConnectionAction::serve()`.
    pub fn default_connection(mut self, action: ConnectionAction) -> Self {
        self.default_connection = action;
        self
    }

    /// Serve TLS (HTTP/2 or HTTP/1.1 by ALPN) with a certificate generated
    /// at start. Default: plain TCP.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Binds `127.0.0.1:0`, generates the certificate if TLS was asked,
    /// and starts accepting.
    ///
    /// # Errors
    ///
    /// If the port cannot be bound or the certificate cannot be made.
    pub async fn try_start(self) -> io::Result<FaultServer> {
        let tls = if self.tls {
            Some(Arc::new(TlsMaterial::generate()?))
        } else {
            None
        };
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Shared::new(Script::new(
            self.routes,
            self.default,
            self.connections,
            self.default_connection,
        ));
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let acceptor = tls
            .as_ref()
            .map(|t| TlsAcceptor::from(Arc::clone(&t.server_config)));
        let ctx = Ctx {
            shared: Arc::clone(&shared),
            acceptor,
            exec: h2::Exec {
                tracker: tracker.clone(),
                cancel: cancel.clone(),
            },
        };
        let stop = cancel.clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = accept_loop(listener, ctx) => {}
            }
        });
        Ok(FaultServer {
            addr,
            shared,
            tls,
            cancel,
            tracker,
        })
    }

    /// Like [`try_start`](Self::try_start), for tests.
    ///
    /// # Panics
    ///
    /// If the server cannot start (no port on the loopback interface).
    pub async fn start(self) -> FaultServer {
        match self.try_start().await {
            Ok(server) => server,
            Err(e) => panic!("FaultServer failed to start: {e}"),
        }
    }
}

#[derive(Clone)]
struct Ctx {
    shared: Arc<Shared>,
    acceptor: Option<TlsAcceptor>,
    exec: h2::Exec,
}

async fn accept_loop(listener: TcpListener, ctx: Ctx) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of file descriptors or an aborted handshake: keep
                // accepting, without spinning.
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let (id, action) = ctx.shared.accept();
        let open = ctx.shared.open_connection();
        let conn = ctx.clone();
        let cancel = ctx.exec.cancel.clone();
        ctx.exec.tracker.spawn(async move {
            let _open = open;
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = connection(tcp, id, action, conn) => {}
            }
        });
    }
}

async fn connection(tcp: TcpStream, id: u64, action: ConnectionAction, ctx: Ctx) {
    let _ = tcp.set_nodelay(true);
    match action.kind {
        ConnKind::NeverRead => h1::hold_unprocessed(tcp).await,
        ConnKind::Close => drop(tcp),
        ConnKind::Reset => h1::reset(tcp),
        ConnKind::Serve => serve(tcp, id, None, ctx).await,
        ConnKind::ServeThenSilent(n) => serve(tcp, id, Some(n), ctx).await,
        ConnKind::GoAway {
            last_stream_id,
            read_first,
        } => {
            let Some(acceptor) = ctx.acceptor else {
                return h1::reset(tcp);
            };
            if let Ok(tls) = acceptor.accept(tcp).await {
                goaway::serve(tls, last_stream_id, read_first).await;
            }
        }
    }
}

/// Serves a connection; with `silent_after`, only that many requests.
async fn serve(tcp: TcpStream, id: u64, silent_after: Option<usize>, ctx: Ctx) {
    match ctx.acceptor {
        None => h1::serve(tcp, id, ctx.shared, silent_after).await,
        Some(acceptor) => {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                h2::serve(tls, id, ctx.shared, ctx.exec, silent_after).await
            } else {
                h1::serve(tls, id, ctx.shared, silent_after).await
            }
        }
    }
}

impl FaultServer {
    /// A builder with no route, no queued connection action, the default
    /// action `Action::status(200)`, the default connection action
    /// `ConnectionAction::serve()`, and plain TCP.
    pub fn builder() -> FaultServerBuilder {
        FaultServerBuilder {
            routes: HashMap::new(),
            default: Action::status(200),
            connections: VecDeque::new(),
            default_connection: ConnectionAction::serve(),
            tls: false,
        }
    }

    /// The address it listens on (`127.0.0.1` and a free port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` followed by `path_and_query` (`https` with
    /// TLS). The generated certificate is valid for `127.0.0.1`.
    pub fn url(&self, path_and_query: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path_and_query}", self.addr)
    }

    /// Whether it serves TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The DER of the CA that signed the server certificate, to add to a
    /// client's root store; `None` without TLS.
    pub fn ca_cert_der(&self) -> Option<CertificateDer<'static>> {
        self.tls.as_ref().map(|t| t.ca_der.clone())
    }

    /// The same CA certificate in PEM; `None` without TLS.
    pub fn ca_cert_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// A root store trusting only the server's CA, ready for
    /// `rustls::ClientConfig::builder().with_root_certificates(..)`; `None`
    /// without TLS.
    pub fn root_store(&self) -> Option<rustls::RootCertStore> {
        self.tls.as_ref().map(|t| t.root_store())
    }

    /// Every request received so far, in the order the server acted on
    /// them.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests()
    }

    /// The requests received so far whose path (query excluded) is `path`.
    pub fn requests_to(&self, path: &str) -> Vec<RecordedRequest> {
        let mut all = self.shared.requests();
        all.retain(|r| r.path() == path);
        all
    }

    /// How many requests were received so far (read completely).
    pub fn request_count(&self) -> u64 {
        self.shared.request_count()
    }

    /// How many requests were started so far: request heads read, whether
    /// or not their body then arrived whole. More than
    /// [`request_count`](Self::request_count) means some requests were cut
    /// short (a client that gave up mid-body, or a truncated retry).
    pub fn requests_started(&self) -> u64 {
        self.shared.started() as u64
    }

    /// How many TCP connections were accepted so far (whatever became of
    /// them): fewer connections than requests means connections were
    /// reused.
    pub fn connections(&self) -> u64 {
        self.shared.connection_count()
    }

    /// How many accepted connections are still open: the server has not
    /// seen them closed (by the client, or by the connection's action).
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections()
    }

    /// How many requests are in flight now. A request is in flight from the
    /// moment its head has been read until the last write of its response
    /// begins (or, for an action that ends without a complete response,
    /// until the connection is closed, reset or left by the client). So the
    /// server never counts a request that its client already considers
    /// done, and [`peak_in_flight`](Self::peak_in_flight) never exceeds the
    /// client's own concurrency.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    /// The most requests that were in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.shared.peak_in_flight()
    }

    /// Waits until at least `n` requests have been received, or `timeout`
    /// (`tokio::time`) has passed.
    ///
    /// # Errors
    ///
    /// [`WaitTimeout`] if the time ran out first.
    pub async fn wait_for_requests(&self, n: u64, timeout: Duration) -> Result<(), WaitTimeout> {
        self.shared.wait_requests(n, timeout).await
    }

    /// Waits until at least `n` connections have been accepted, or
    /// `timeout` has passed.
    ///
    /// # Errors
    ///
    /// [`WaitTimeout`] if the time ran out first.
    pub async fn wait_for_connections(&self, n: u64, timeout: Duration) -> Result<(), WaitTimeout> {
        self.shared.wait_connections(n, timeout).await
    }

    /// Appends actions to the queue of `path`, as
    /// [`FaultServerBuilder::route`] does, while the server runs.
    pub fn route(&self, path: &str, actions: impl IntoIterator<Item = Action>) {
        self.shared.push_route(path, actions);
    }

    /// Replaces the default action while the server runs.
    pub fn set_default(&self, action: Action) {
        self.shared.set_default(action);
    }

    /// Appends connection actions, as [`FaultServerBuilder::connections`]
    /// does, while the server runs.
    pub fn push_connections(&self, actions: impl IntoIterator<Item = ConnectionAction>) {
        self.shared.push_connections(actions);
    }

    /// Replaces the default connection action while the server runs.
    pub fn set_default_connection(&self, action: ConnectionAction) {
        self.shared.set_default_connection(action);
    }

    /// Stops accepting, ends every connection, and waits until every task
    /// the server started is gone (dropping the server stops them too, but
    /// does not wait).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// An address on `127.0.0.1` where nothing listens (a port bound, then
/// released), for "connection refused" tests.
///
/// Another process could take the port in between; on a test machine that
/// is rare enough to ignore.
///
/// # Errors
///
/// If no port can be bound on the loopback interface.
pub fn refused_addr() -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    listener.local_addr()
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.tracker.close();
    }
}
