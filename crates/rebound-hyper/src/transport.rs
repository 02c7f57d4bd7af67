//! The transport: hyper-util's pooled client over the staged [`Connector`],
//! speaking rebound's error and body types.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! use rebound_core::Sent;
//! use rebound_hyper::{Body, HyperTransport};
//! use tower::ServiceExt;
//!
//! // Find a port with no listener.
//! let port = {
//!     let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
//!     l.local_addr().unwrap().port()
//! };
//! let transport = HyperTransport::builder().build()?;
//! let req = http::Request::post(format!("http://127.0.0.1:{port}/orders"))
//!     .body(Body::from("{}"))
//!     .unwrap();
//! let err = transport.oneshot(req).await.unwrap_err();
//! assert_eq!(err.kind(), rebound_core::ErrorKind::Connect);
//! // Nothing reached a server: safe to retry even a POST.
//! assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
//! # Ok(())
//! # }
//! ```
//!
//! [`HyperTransport`] is the innermost service of the stack: it only moves
//! bytes and reports what happened.
//!
//! * Connection: the [`Connector`] (connect and TLS stages with their own
//!   timeouts), rustls on `ring`, HTTP/1.1 and HTTP/2 by ALPN, hyper-util's
//!   connection pool.
//! * Response: returned as soon as its head arrives, with the body wrapped in
//!   a [`TransportBody`] (idle and minimum-rate timeouts). The ready-made
//!   [`Client`](crate::Client) takes hyper's body bare instead: its stack's
//!   one body wrapper applies the same timeouts (and counts the body for a
//!   shutdown).
//! * Errors: rebound [`Error`]s with their kind and an explicit
//!   [`Sent`] answer in their extensions (see
//!   [the crate docs](crate#errors-and-the-sent-answer)).
//! * hyper-util re-sends by itself a request that was never written to a
//!   *reused* pooled connection (`retry_canceled_requests`, kept on). Those
//!   re-sends happen inside one call of this service, so the retry layer
//!   above counts them as one attempt, never twice.
//!
//! # A silent HTTP/2 connection
//!
//! An HTTP/2 connection carries every request to its host, and hyper-util's
//! pool refreshes its idle time on every checkout. A peer that dies with
//! the socket open (no `GOAWAY`, no reset: a crashed middlebox, a dropped
//! NAT mapping) would otherwise get every attempt of every request for as
//! long as traffic continues. Two mechanisms retire it:
//!
//! * **Keep-alive PING**, on by default: when no frame has arrived for
//!   [`DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL`] (20 s) while a request or a
//!   response body is in flight on the connection, hyper sends a PING, and
//!   closes the connection (failing its streams) if the acknowledgement
//!   does not come within [`DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT`] (10 s). Any
//!   frame read counts as life, so a busy healthy connection is never
//!   pinged. Idle pooled connections are not pinged by default
//!   ([`TransportBuilder::http2_keep_alive_while_idle`]): gRPC servers
//!   answer frequent PINGs without streams with `GOAWAY`, and a stale idle
//!   connection is pinged as soon as a request uses it anyway (its last
//!   frame is older than the interval). 20 s stays below the body idle
//!   timeout of the ready-made client (30 s), so a quiet body sees at most
//!   one PING, fewer than the strikes gRPC servers tolerate before a
//!   `GOAWAY` (`too_many_pings`). Its cost, inside hyper and on HTTP/2
//!   only: a timer per connection, and per frame received a lock of a
//!   per-connection mutex and a clock read (to know the last frame's
//!   time).
//! * **Retiring on abandon**: when this service's [`ResponseFuture`] is
//!   dropped while it still waits for the response head of a request that
//!   went out on an HTTP/2 connection, after waiting at least
//!   [`http2_retire_abandoned_after`](TransportBuilder::http2_retire_abandoned_after),
//!   that connection is poisoned (hyper-util's
//!   [`Connected::poison`](hyper_util::client::legacy::connect::Connected::poison)):
//!   the pool never hands it out again, so the retry and every later
//!   request get a fresh connection, while the streams already on it run
//!   to their end. A timeout layer above this service drops the future
//!   when it fires, so a headers timeout heals at once. The transport
//!   knows nothing of that layer, only that it was abandoned after a given
//!   wait (DESIGN principle 3); whoever assembles both sets the wait, as
//!   [`ClientBuilder`](crate::ClientBuilder) does (7/8 of its attempt
//!   timeout, since the attempt's timer starts just before this service is
//!   called). Default for the transport alone: zero, every abandon
//!   retires.
//!
//! The price of the second mechanism, and its false positives:
//!
//! * Knowing the connection means [`capture_connection`] on the request:
//!   a watch channel, an `Arc` and one request extension (and, when the
//!   connection is handed the request, a clone of its connection info) —
//!   about four small allocations per request — plus one clock read when
//!   the wait is measured. It is paid only where HTTP/2 is possible:
//!   HTTP/2 enabled, an `https` URL (h2 is negotiated by ALPN only), and
//!   once this transport has negotiated `h2` on some connection. Plain
//!   `http`, `http2(false)`, and TLS servers that only speak HTTP/1.1 pay
//!   one atomic load. (A request sent before the first `h2` handshake
//!   completed is not captured; the keep-alive PING still covers it.)
//! * An abandon is not always a timeout. A caller that cancels an HTTP/2
//!   request (or a losing hedge) before the wait keeps the connection; one
//!   that cancels later (in the ready-made client: after 7/8 of the
//!   attempt timeout), or an attempt cut by the total deadline after that
//!   long, retires a connection that may be healthy: one new connection
//!   (TCP and TLS handshake) for the next request. Streams in flight on a
//!   retired connection are not affected. Telling the causes apart
//!   exactly would need the attempt's own deadline on every request (an
//!   extension insert, i.e. an allocation, on every user's happy path).
//! * An abandoned HTTP/1 request needs nothing: hyper does not return a
//!   connection with an unfinished exchange to the pool.
//!
//! # CONNECT
//!
//! A `CONNECT` request names only `host:port`. One whose URL has a path or
//! a query (other than the `/` that `http::Uri` parses for none) is refused
//! with an [`InvalidRequest`](ErrorKind::InvalidRequest) error, marked
//! [`Sent::NotSent`], before it reaches hyper-util, which would strip them
//! and log both at WARN — a query string (often a key) in a log line. An
//! extended CONNECT (RFC 8441, with a `hyper::ext::Protocol` extension)
//! keeps its path, as HTTP/2 sends it.
//!
//! # Userinfo in the URL
//!
//! hyper-util's pool logs the URI's authority at TRACE level, userinfo
//! included, so the transport removes userinfo before the request reaches
//! it. Like curl, browsers and reqwest, it turns `user:password@` into an
//! `Authorization: Basic` header (marked sensitive), since that is what a
//! user writing credentials in a URL expects; an `Authorization` header
//! already on the request wins and the userinfo is dropped.
//!
//! # Clone
//!
//! Cheap: the pool, the connector and its TLS configuration are shared.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::uri::Scheme;
use http::{HeaderValue, Method, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::rt;
use hyper_util::client::legacy::connect::{
    capture_connection, CaptureConnection, Connect, Connection, HttpConnector,
};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rebound_core::redact::authority_without_userinfo;
use rebound_core::shutdown::ShutdownHandle;
use rebound_core::{BoxError, Error, ErrorKind, Sent};
use rustls::ClientConfig;
use tokio::time::Instant;
use tower_service::Service;

use crate::body::Body;
use crate::connect::{self, Connector, TlsRoots};
use crate::error::{from_client, RequestName};
use crate::response_body::{validate, BodyTimeouts, MinBodyRate, TransportBody};

/// Default [`TransportBuilder::pool_idle_timeout`]: 90 s.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Default [`TransportBuilder::http2_keep_alive_interval`]: 20 s without a
/// frame from the server (while a stream is open) before a PING is sent.
pub const DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// Default [`TransportBuilder::http2_keep_alive_timeout`]: 10 s for the
/// PING's acknowledgement before the connection is closed.
pub const DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

// ===== impl TransportBuilder =====

/// Builds a [`HyperTransport`]. Values are checked by
/// [`build`](Self::build).
#[derive(Clone)]
pub struct TransportBuilder {
    connect_timeout: Duration,
    tls_timeout: Duration,
    body_idle_timeout: Option<Duration>,
    min_body_rate: Option<MinBodyRate>,
    roots: TlsRoots,
    tls_config: Option<Arc<ClientConfig>>,
    http2: bool,
    http2_prior_knowledge: bool,
    pool_idle_timeout: Duration,
    pool_max_idle_per_host: usize,
    h2_keep_alive_interval: Option<Duration>,
    h2_keep_alive_timeout: Duration,
    h2_keep_alive_while_idle: bool,
    h2_retire_after: Option<Duration>,
    shutdown: Option<ShutdownHandle>,
}

impl Default for TransportBuilder {
    fn default() -> Self {
        TransportBuilder {
            connect_timeout: connect::DEFAULT_CONNECT_TIMEOUT,
            tls_timeout: connect::DEFAULT_TLS_TIMEOUT,
            body_idle_timeout: None,
            min_body_rate: None,
            roots: TlsRoots::default(),
            tls_config: None,
            http2: true,
            http2_prior_knowledge: false,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            pool_max_idle_per_host: usize::MAX,
            h2_keep_alive_interval: Some(DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL),
            h2_keep_alive_timeout: DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT,
            h2_keep_alive_while_idle: false,
            h2_retire_after: Some(Duration::ZERO),
            shutdown: None,
        }
    }
}

impl fmt::Debug for TransportBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportBuilder")
            .field("connect_timeout", &self.connect_timeout)
            .field("tls_timeout", &self.tls_timeout)
            .field("body_idle_timeout", &self.body_idle_timeout)
            .field("min_body_rate", &self.min_body_rate)
            .field("roots", &self.roots)
            .field("custom_tls_config", &self.tls_config.is_some())
            .field("http2", &self.http2)
            .field("http2_prior_knowledge", &self.http2_prior_knowledge)
            .field("pool_idle_timeout", &self.pool_idle_timeout)
            .field("pool_max_idle_per_host", &self.pool_max_idle_per_host)
            .field("http2_keep_alive_interval", &self.h2_keep_alive_interval)
            .field("http2_keep_alive_timeout", &self.h2_keep_alive_timeout)
            .field(
                "http2_keep_alive_while_idle",
                &self.h2_keep_alive_while_idle,
            )
            .field("http2_retire_abandoned_after", &self.h2_retire_after)
            .field("shutdown", &self.shutdown.is_some())
            .finish()
    }
}

impl TransportBuilder {
    /// A builder with the defaults documented on each setter.
    pub fn new() -> Self {
        TransportBuilder::default()
    }

    /// Time allowed to establish TCP (DNS and every resolved address).
    /// Default: 3 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Time allowed for the TLS handshake, from TCP-established. Default:
    /// 5 s.
    pub fn tls_timeout(mut self, d: Duration) -> Self {
        self.tls_timeout = d;
        self
    }

    /// Fail a response body when no frame arrives for `d` while the caller
    /// reads it; `None` turns it off. Default: off.
    pub fn body_idle_timeout(mut self, d: impl Into<Option<Duration>>) -> Self {
        self.body_idle_timeout = d.into();
        self
    }

    /// Fail a response body slower than `rate` (see [`MinBodyRate`]);
    /// `None` turns it off. Default: off.
    pub fn min_body_rate(mut self, rate: impl Into<Option<MinBodyRate>>) -> Self {
        self.min_body_rate = rate.into();
        self
    }

    /// Which root certificates to trust. Default: [`TlsRoots::Webpki`].
    pub fn tls_roots(mut self, roots: TlsRoots) -> Self {
        self.roots = roots;
        self
    }

    /// Use this rustls configuration instead of one built from
    /// [`tls_roots`](Self::tls_roots). If it offers no ALPN protocol, `h2`
    /// (when enabled) and `http/1.1` are set. Default: none.
    pub fn tls_config(mut self, config: Arc<ClientConfig>) -> Self {
        self.tls_config = Some(config);
        self
    }

    /// Offer HTTP/2 by ALPN on TLS connections. Default: `true`.
    pub fn http2(mut self, enabled: bool) -> Self {
        self.http2 = enabled;
        self
    }

    /// Speak HTTP/2 from the first byte on every connection, plain-text
    /// ones included ("prior knowledge", h2c): what a plain-text gRPC server
    /// (tonic, grpc-go) expects. A TLS server must then speak HTTP/2 too;
    /// HTTP/1.1-only servers cannot be reached. Turns [`http2`](Self::http2)
    /// on. Default: `false` (plain text is HTTP/1.1, TLS negotiates by
    /// ALPN).
    pub fn http2_prior_knowledge(mut self, enabled: bool) -> Self {
        self.http2_prior_knowledge = enabled;
        if enabled {
            self.http2 = true;
        }
        self
    }

    /// How long an idle pooled connection is kept. Default: 90 s.
    pub fn pool_idle_timeout(mut self, d: Duration) -> Self {
        self.pool_idle_timeout = d;
        self
    }

    /// The most idle connections kept per host. Default: no limit.
    pub fn pool_max_idle_per_host(mut self, n: usize) -> Self {
        self.pool_max_idle_per_host = n;
        self
    }

    /// Send an HTTP/2 PING when no frame has arrived from the server for
    /// `interval` while a request or response is in flight on the
    /// connection (and also while it sits idle in the pool, with
    /// [`http2_keep_alive_while_idle`](Self::http2_keep_alive_while_idle));
    /// a PING not acknowledged within the
    /// [keep-alive timeout](Self::http2_keep_alive_timeout) closes the
    /// connection, failing its streams. `None` turns keep-alive off.
    /// Default: [`DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL`] (20 s).
    pub fn http2_keep_alive_interval(mut self, interval: impl Into<Option<Duration>>) -> Self {
        self.h2_keep_alive_interval = interval.into();
        self
    }

    /// How long a keep-alive PING may wait for its acknowledgement before
    /// the connection is closed. Default:
    /// [`DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT`] (10 s).
    pub fn http2_keep_alive_timeout(mut self, timeout: Duration) -> Self {
        self.h2_keep_alive_timeout = timeout;
        self
    }

    /// Also send keep-alive PINGs on HTTP/2 connections with no request in
    /// flight, so a dead idle connection is closed before a request picks
    /// it. Some servers treat PINGs without streams as abuse (gRPC servers
    /// by default answer them with `GOAWAY` `ENHANCE_YOUR_CALM`). Default:
    /// `false`.
    pub fn http2_keep_alive_while_idle(mut self, enabled: bool) -> Self {
        self.h2_keep_alive_while_idle = enabled;
        self
    }

    /// Retire an HTTP/2 connection from the pool when a request on it is
    /// abandoned (its [`ResponseFuture`] dropped) after waiting at least
    /// `after` for its response head, so that later requests do not go to a
    /// connection that may have gone silent; `None` never retires one. A
    /// timeout layer above the transport should set this to (a little less
    /// than) its own timeout, so that a caller cancelling early keeps the
    /// connection; see the [module docs](self#a-silent-http2-connection).
    /// Default: zero (every abandoned HTTP/2 request retires its
    /// connection). [`ClientBuilder`](crate::ClientBuilder) sets it to 7/8 of
    /// its attempt timeout.
    pub fn http2_retire_abandoned_after(mut self, after: impl Into<Option<Duration>>) -> Self {
        self.h2_retire_after = after.into();
        self
    }

    /// Shut down with `handle` (see [`rebound_core::shutdown`]): each
    /// response body with bytes left to read (not a 204, a HEAD or an
    /// empty body) counts as in flight from the moment its head arrives
    /// until it ends or is dropped (an [`OpenBody`](rebound_core::shutdown::OpenBody) guard), and every
    /// connection — idle in the pool or busy — closes when the shutdown
    /// ends, so a body still being read then fails with
    /// [`ErrorKind::Closed`] (counted in
    /// [`ShutdownReport::bodies_cut`](rebound_core::shutdown::ShutdownReport::bodies_cut)).
    /// A request still waiting for its head holds no guard: it is the
    /// shutdown layer's to count (and cut) as a request, not a body.
    /// [`ClientBuilder`](crate::ClientBuilder) does this with the handle of
    /// [`Client::shutdown`](crate::Client::shutdown).
    ///
    /// Cost: a reference count per request, and two atomic adds per
    /// response with a body to read; per connection, a child token watched
    /// without a lock (see [`Connector::close_on`]).
    pub fn shutdown(mut self, handle: &ShutdownHandle) -> Self {
        self.shutdown = Some(handle.clone());
        self
    }

    /// The configured connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The configured TLS timeout.
    pub fn get_tls_timeout(&self) -> Duration {
        self.tls_timeout
    }

    /// Build the transport over hyper-util's `HttpConnector`.
    ///
    /// # Errors
    ///
    /// A [configuration error](ErrorKind::Config) naming the value that
    /// cannot work (a zero or over-a-day timeout, no root certificates).
    pub fn build(self) -> Result<HyperTransport, Error> {
        let connect_timeout = validate("connect timeout", self.connect_timeout)?;
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        self.build_with_tcp(tcp)
    }

    /// Build the transport over the TCP connector `tcp` (e.g. one that goes
    /// through a proxy, or, in tests, one that delays).
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn build_with_tcp<C>(self, tcp: C) -> Result<HyperTransport<C>, Error>
    where
        C: Service<Uri> + Clone + Send + Sync + 'static,
        C::Response: rt::Read + rt::Write + Connection + Send + Unpin + 'static,
        C::Future: Send + 'static,
        C::Error: Into<BoxError>,
    {
        let pool_idle_timeout = validate("pool idle timeout", self.pool_idle_timeout)?;
        let h2_keep_alive_interval = self
            .h2_keep_alive_interval
            .map(|d| validate("HTTP/2 keep-alive interval", d))
            .transpose()?;
        let h2_keep_alive_timeout =
            validate("HTTP/2 keep-alive timeout", self.h2_keep_alive_timeout)?;
        let mut body = BodyTimeouts::new();
        if let Some(idle) = self.body_idle_timeout {
            body = body.try_idle(idle)?;
        }
        if let Some(rate) = self.min_body_rate {
            body = body.min_rate(rate);
        }
        let tls = match self.tls_config {
            Some(config) if config.alpn_protocols.is_empty() => {
                let mut config = (*config).clone();
                config.alpn_protocols = connect::alpn(self.http2);
                Arc::new(config)
            }
            Some(config) => config,
            None => connect::tls_config(&self.roots, self.http2)?,
        };
        let mut connector = Connector::new(tcp, tls)
            .try_connect_timeout(self.connect_timeout)?
            .try_tls_timeout(self.tls_timeout)?;
        if let Some(handle) = &self.shutdown {
            connector = connector.close_on(handle.cut_token());
        }
        let h2_seen = connector.h2_seen();
        if self.http2_prior_knowledge {
            // Every connection is HTTP/2, whatever ALPN said (or not).
            h2_seen.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let client = HyperClient::builder(TokioExecutor::new())
            .http2_only(self.http2_prior_knowledge)
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(pool_idle_timeout)
            .pool_max_idle_per_host(self.pool_max_idle_per_host)
            .retry_canceled_requests(true)
            .http2_keep_alive_interval(h2_keep_alive_interval)
            .http2_keep_alive_timeout(h2_keep_alive_timeout)
            .http2_keep_alive_while_idle(self.h2_keep_alive_while_idle)
            .build(connector);
        Ok(HyperTransport {
            shared: Arc::new(Shared {
                client,
                body,
                retire: match self.h2_retire_after {
                    Some(after) if self.http2 => Some(Retire { h2_seen, after }),
                    _ => None,
                },
                shutdown: self.shutdown,
            }),
        })
    }
}

// ===== impl HyperTransport =====

/// hyper-util's client as a rebound transport; see the
/// [module docs](self).
pub struct HyperTransport<C = HttpConnector> {
    // Shared by every clone: the client's stack clones its attempt part,
    // this transport included, for every attempt, and a clone of
    // hyper-util's client is a dozen reference counts (connector, pool,
    // executor, timers), each bumped and dropped again per request; this
    // is one.
    shared: Arc<Shared<C>>,
}

/// What the clones of a [`HyperTransport`] share.
struct Shared<C> {
    client: HyperClient<Connector<C>, Body>,
    body: BodyTimeouts,
    /// `None` when HTTP/2 is off (no connection can be HTTP/2) or
    /// retiring is off: no request is captured.
    retire: Option<Retire>,
    /// Counts response bodies for a shutdown.
    shutdown: Option<ShutdownHandle>,
}

/// When an abandoned request retires its HTTP/2 connection; see the
/// module docs, "A silent HTTP/2 connection".
#[derive(Clone)]
struct Retire {
    /// Set by the connector once it negotiated `h2` on any connection.
    h2_seen: Arc<AtomicBool>,
    /// The least wait for the head after which an abandon retires.
    after: Duration,
}

impl HyperTransport {
    /// A [`TransportBuilder`] with the defaults.
    pub fn builder() -> TransportBuilder {
        TransportBuilder::new()
    }
}

impl<C> HyperTransport<C> {
    /// The timeouts applied to response bodies.
    pub fn body_timeouts(&self) -> BodyTimeouts {
        self.shared.body
    }
}

impl<C> Clone for HyperTransport<C> {
    /// Shares the client (its pool, connector and settings): one reference
    /// count.
    fn clone(&self) -> Self {
        HyperTransport {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C> fmt::Debug for HyperTransport<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HyperTransport")
            .field("body", &self.shared.body)
            .finish_non_exhaustive()
    }
}

impl<C, B> Service<Request<B>> for HyperTransport<C>
where
    Connector<C>: Connect + Clone + Send + Sync + 'static,
    B: Into<Body>,
{
    type Response = Response<TransportBody<Incoming>>;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready (it applies no backpressure).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = &*self.shared;
        let request = RequestName::of(&req);
        let mut call = shared.send(req.map(Into::into));
        if let State::Failed(failed) = &mut call.state {
            // Refused before it was sent: named now.
            *failed = failed.take().map(|e| request.name(e));
            return ResponseFuture {
                call,
                request: None,
                body: shared.body,
                shutdown: None,
            };
        }
        ResponseFuture {
            call,
            request: Some(request),
            body: shared.body,
            shutdown: shared.shutdown.clone(),
        }
    }
}

impl<C> Shared<C>
where
    Connector<C>: Connect + Clone + Send + Sync + 'static,
{
    /// Hand `req` to hyper-util (or fail it, unsent).
    fn send(&self, req: Request<Body>) -> Call {
        let mut req = match prepare(req) {
            Ok(req) => req,
            Err(e) => {
                return Call {
                    state: State::Failed(Some(e)),
                    connection: None,
                }
            }
        };
        // Only a request that can end up on an HTTP/2 connection is
        // captured (it costs a watch channel and an extension): HTTP/2 is
        // on, it is `https` (h2 is negotiated by ALPN only), and this
        // transport has negotiated h2 at least once.
        let connection = match &self.retire {
            Some(retire)
                if retire.h2_seen.load(Ordering::Relaxed)
                    && req.uri().scheme() == Some(&Scheme::HTTPS) =>
            {
                Some(Captured {
                    connection: capture_connection(&mut req),
                    // The clock is read only when a wait must be measured.
                    since: (!retire.after.is_zero()).then(Instant::now),
                    after: retire.after,
                })
            }
            _ => None,
        };
        Call {
            state: State::Sending(self.client.request(req)),
            connection,
        }
    }
}

// ===== impl HeadTransport =====

/// A [`HyperTransport`] that returns hyper's bare body, for a stack whose
/// own body wrapper applies the body timeouts and counts the body for the
/// shutdown (the client's [`StackLayer`](rebound_core::stack::StackLayer)
/// path): no [`TransportBody`], no shutdown guard, and errors left for the
/// stack to name (it names every error with its request), so an attempt
/// copies no request name.
pub(crate) struct HeadTransport<C> {
    shared: Arc<Shared<C>>,
}

impl<C> HyperTransport<C> {
    /// This transport for the client's stack; see [`HeadTransport`].
    pub(crate) fn heads(&self) -> HeadTransport<C> {
        HeadTransport {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C> Clone for HeadTransport<C> {
    fn clone(&self) -> Self {
        HeadTransport {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C> fmt::Debug for HeadTransport<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeadTransport").finish_non_exhaustive()
    }
}

impl<C, B> Service<Request<B>> for HeadTransport<C>
where
    Connector<C>: Connect + Clone + Send + Sync + 'static,
    B: Into<Body>,
{
    type Response = Response<Incoming>;
    type Error = Error;
    type Future = HeadFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready (it applies no backpressure).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        HeadFuture {
            call: self.shared.send(req.map(Into::into)),
        }
    }
}

/// The response future of [`HeadTransport`]: the response with hyper's
/// body, or an error not yet named. Dropped while waiting for the head, it
/// retires an HTTP/2 connection as [`ResponseFuture`] does.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct HeadFuture {
    call: Call,
}

impl fmt::Debug for HeadFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("transport::HeadFuture")
            .finish_non_exhaustive()
    }
}

impl Future for HeadFuture {
    type Output = Result<Response<Incoming>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.call.poll_head(cx)
    }
}

/// Check the URI (absolute; no path or query on a CONNECT) and move
/// userinfo into an `Authorization` header.
fn prepare(mut req: Request<Body>) -> Result<Request<Body>, Error> {
    let uri = req.uri();
    if uri.scheme().is_none() || uri.authority().is_none() {
        let detail = if rebound_core::classify::is_grpc(req.headers()) {
            // tonic's `Grpc::new(client)` sends a path only: say how to fix it.
            "the URL must be absolute (scheme and host): build the tonic client with \
             `tonic::client::Grpc::with_origin(client, origin)`, not `Grpc::new`"
        } else {
            "the URL must be absolute (scheme and host)"
        };
        let mut e = Error::new(ErrorKind::InvalidRequest).with_detail(detail);
        e.extensions_mut().insert(Sent::NotSent);
        return Err(e);
    }
    if req.method() == Method::CONNECT
        && req.extensions().get::<hyper::ext::Protocol>().is_none()
        && uri.path_and_query().is_some_and(|pq| pq.as_str() != "/")
    {
        // A CONNECT names only `host:port`; hyper-util would strip the path
        // and query, logging both at WARN (a query string in a log line).
        // An extended CONNECT (RFC 8441, with a `:protocol`) keeps its path.
        let mut e = Error::new(ErrorKind::InvalidRequest)
            .with_detail("a CONNECT request's URL takes no path or query, only host and port");
        e.extensions_mut().insert(Sent::NotSent);
        return Err(e);
    }
    let authority = uri.authority().expect("checked above").as_str();
    let Some(at) = authority.rfind('@') else {
        return Ok(req);
    };
    let userinfo = &authority[..at];
    if !req.headers().contains_key(AUTHORIZATION) {
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, p),
            None => (userinfo, ""),
        };
        let mut credentials = percent_decode(user);
        credentials.push(b':');
        credentials.extend_from_slice(&percent_decode(password));
        let mut value = b"Basic ".to_vec();
        value.extend_from_slice(base64(&credentials).as_bytes());
        let mut value = HeaderValue::from_bytes(&value).expect("base64 is a valid header value");
        value.set_sensitive(true);
        req.headers_mut().insert(AUTHORIZATION, value);
    }
    let mut parts = req.uri().clone().into_parts();
    parts.authority = authority_without_userinfo(req.uri());
    *req.uri_mut() = Uri::from_parts(parts).map_err(|e| {
        let mut err = Error::new(ErrorKind::InvalidRequest)
            .with_detail("invalid URL")
            .with_source(e);
        err.extensions_mut().insert(Sent::NotSent);
        err
    })?;
    Ok(req)
}

fn percent_decode(s: &str) -> Vec<u8> {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn base64(input: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(TABLE[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ===== impl ResponseFuture =====

enum State {
    Sending(hyper_util::client::legacy::ResponseFuture),
    Failed(Option<Error>),
    /// The head or the error was returned.
    Done,
}

/// One request handed to hyper-util: its future and, for a request that
/// may go out on HTTP/2, its connection (retired if the call is abandoned
/// while it waits for the head).
struct Call {
    state: State,
    /// The connection the request went out on, for requests that may be
    /// sent over HTTP/2.
    connection: Option<Captured>,
}

impl Call {
    /// The response head (with hyper's body) or the error, unnamed.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Response<Incoming>, Error>> {
        let out = match &mut self.state {
            State::Failed(err) => Err(err.take().expect("polled after completion")),
            State::Sending(fut) => std::task::ready!(Pin::new(fut).poll(cx)).map_err(from_client),
            State::Done => panic!("transport future polled after completion"),
        };
        self.state = State::Done;
        Poll::Ready(out)
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Completed (head or error), or never sent: nothing to retire.
        if !matches!(self.state, State::Sending(_)) {
            return;
        }
        let Some(captured) = &self.connection else {
            return;
        };
        if captured.since.is_some_and(|t| t.elapsed() < captured.after) {
            // Abandoned early: a caller's cancellation, not a timeout.
            return;
        }
        // `None`: dropped before a connection was handed the request
        // (while connecting); an HTTP/1 connection is not reused after an
        // abandoned request anyway.
        if let Some(connected) = captured.connection.connection_metadata().as_ref() {
            if connected.is_negotiated_h2() {
                connected.poison();
            }
        }
    }
}

/// The response future of [`HyperTransport`].
///
/// Dropped while still waiting for the response head of a request sent on
/// an HTTP/2 connection, it retires that connection from the pool (see the
/// [module docs](self#a-silent-http2-connection)).
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture {
    call: Call,
    /// `Some` until the future completes (`None` for a request refused
    /// before it was sent: its error is named already).
    request: Option<RequestName>,
    body: BodyTimeouts,
    /// The shutdown that counts the response body, from its head (when
    /// there is a body to read) until it ends.
    shutdown: Option<ShutdownHandle>,
}

/// A request's connection, captured to retire it if the request is
/// abandoned.
struct Captured {
    connection: CaptureConnection,
    /// When the request was handed to hyper-util; `None` when any abandon
    /// retires (`after` is zero).
    since: Option<Instant>,
    after: Duration,
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("transport::ResponseFuture")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<TransportBody<Incoming>>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let out = std::task::ready!(this.call.poll_head(cx));
        Poll::Ready(match (out, this.request.take()) {
            // Refused before it was sent, already named.
            (Err(e), None) => Err(e),
            (Ok(_), None) => unreachable!("a refused request has no response"),
            (Ok(res), Some(request)) => {
                let timeouts = this.body;
                // The guard is taken now, with the head: until then the
                // request is the shutdown layer's to count, and a request
                // cut before its head is no body cut. A body with nothing
                // to read (a 204, a HEAD, a `Content-Length: 0`) is not in
                // flight at all: a caller who keeps the response does not
                // hold a shutdown.
                let shutdown = this.shutdown.take();
                Ok(res.map(|b| {
                    let open = if hyper::body::Body::is_end_stream(&b) {
                        None
                    } else {
                        shutdown.as_ref().map(ShutdownHandle::open_body)
                    };
                    TransportBody::new(b, timeouts).named(request).tracked(open)
                }))
            }
            (Err(e), Some(request)) => Err(request.name(e)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn userinfo_becomes_a_sensitive_basic_header() {
        let req = Request::get("http://Al%40ice:p%3Ass@h.example:8080/x?q=1")
            .body(Body::empty())
            .unwrap();
        let req = prepare(req).unwrap();
        assert_eq!(req.uri().to_string(), "http://h.example:8080/x?q=1");
        let auth = req.headers().get(AUTHORIZATION).unwrap();
        assert!(auth.is_sensitive());
        // "Al@ice:p:ss"
        assert_eq!(auth, &format!("Basic {}", base64(b"Al@ice:p:ss")));
    }

    #[test]
    fn an_explicit_authorization_header_wins() {
        let req = Request::get("http://u:p@h.example/")
            .header(AUTHORIZATION, "Bearer t")
            .body(Body::empty())
            .unwrap();
        let req = prepare(req).unwrap();
        assert_eq!(req.uri().to_string(), "http://h.example/");
        assert_eq!(req.headers().get(AUTHORIZATION).unwrap(), "Bearer t");
    }

    #[test]
    fn relative_urls_are_rejected_as_not_sent() {
        let req = Request::get("/only/path").body(Body::empty()).unwrap();
        let err = prepare(req).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
    }

    #[test]
    fn connect_with_a_path_or_query_is_rejected_before_the_transport() {
        for url in [
            "https://proxy.example:443/tunnel?api_key=s3cret",
            "https://proxy.example:443/tunnel",
            "https://proxy.example:443/?api_key=s3cret",
        ] {
            let req = Request::connect(url).body(Body::empty()).unwrap();
            let err = prepare(req).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{url}");
            assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
            assert!(!format!("{err} {err:?}").contains("s3cret"));
        }
        // Host and port only (`/` is how `http::Uri` parses none) pass.
        for url in ["https://proxy.example:443", "https://proxy.example:443/"] {
            let req = Request::connect(url).body(Body::empty()).unwrap();
            assert!(prepare(req).is_ok(), "{url}");
        }
        // An extended CONNECT (HTTP/2 `:protocol`) keeps its path.
        let mut req = Request::connect("https://h.example/chat?room=1")
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        assert!(prepare(req).is_ok());
        // Other methods keep their path and query.
        let req = Request::get("https://h.example/x?q=1")
            .body(Body::empty())
            .unwrap();
        assert!(prepare(req).is_ok());
    }

    #[test]
    fn http2_keep_alive_is_on_by_default_and_checked() {
        let b = TransportBuilder::default();
        assert_eq!(
            b.h2_keep_alive_interval,
            Some(DEFAULT_HTTP2_KEEP_ALIVE_INTERVAL)
        );
        assert_eq!(b.h2_keep_alive_timeout, DEFAULT_HTTP2_KEEP_ALIVE_TIMEOUT);
        assert!(!b.h2_keep_alive_while_idle);
        assert_eq!(b.h2_retire_after, Some(Duration::ZERO));
        let err = TransportBuilder::new()
            .http2_keep_alive_timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config));
        assert!(
            err.to_string().contains("HTTP/2 keep-alive timeout"),
            "{err}"
        );
        let err = TransportBuilder::new()
            .http2_keep_alive_interval(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(
            err.to_string().contains("HTTP/2 keep-alive interval"),
            "{err}"
        );
        // `None` turns keep-alive off.
        assert!(TransportBuilder::new()
            .http2_keep_alive_interval(None)
            .http2_keep_alive_while_idle(true)
            .build()
            .is_ok());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b%zz%4"), b"a b%zz%4");
    }
}
