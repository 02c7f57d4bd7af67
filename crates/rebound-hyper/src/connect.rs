//! The connector: TCP and TLS as two stages, each with its own timeout and
//! its own error stage.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! use std::time::Duration;
//!
//! use rebound_core::{Sent, TimeoutStage};
//! use rebound_hyper::connect::{tls_config, Connector, TlsRoots};
//! use tower::ServiceExt;
//!
//! // A server that accepts TCP and never speaks TLS.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let addr = listener.local_addr().unwrap();
//! let _server = tokio::spawn(async move {
//!     let (_socket, _) = listener.accept().await.unwrap();
//!     std::future::pending::<()>().await;
//! });
//!
//! let connector = Connector::http(tls_config(&TlsRoots::Webpki, true)?)
//!     .tls_timeout(Duration::from_millis(200));
//! let uri: http::Uri = format!("https://localhost:{}/", addr.port()).parse().unwrap();
//! let err = connector.oneshot(uri).await.unwrap_err();
//! assert_eq!(err.timeout_stage(), Some(TimeoutStage::Tls));
//! assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));
//! # Ok(())
//! # }
//! ```
//!
//! [`Connector`] is the `tower::Service<Uri>` hyper-util's client connects
//! with. It runs two stages:
//!
//! 1. **connect**: the inner TCP connector (`C`, hyper-util's
//!    `HttpConnector` by default: DNS, then every resolved address in turn,
//!    with Happy Eyeballs) bounded by [`Connector::connect_timeout`] in
//!    total → [`TimeoutStage::Connect`]; a refusal or unreachable host →
//!    [`ErrorKind::Connect`].
//! 2. **tls** (for `https` only): the rustls handshake, bounded by
//!    [`Connector::tls_timeout`] measured from TCP-established →
//!    [`TimeoutStage::Tls`]; a failed handshake → [`ErrorKind::Tls`]. When
//!    the server's certificate failed verification (unknown issuer, not
//!    valid for the host name, expired, ...), the error's detail says why
//!    (`tls error: invalid server certificate: unknown issuer`) and it
//!    carries [`CertificateRejected`](rebound_core::annotations::CertificateRejected),
//!    which the default classifier makes fatal: the next attempt would
//!    meet the same certificate. Other handshake failures stay retryable.
//!
//! hyper-rustls's own connector runs both stages in one future with no
//! handshake timeout, so the handshake is done here with tokio-rustls; the
//! result is hyper-rustls's [`MaybeHttpsStream`], whose ALPN answer makes
//! hyper-util speak HTTP/2 when the server chose `h2`, inside a [`Stream`].
//!
//! With [`Connector::close_on`], every connection closes when a token is
//! cancelled (the ready-made client's shutdown uses it to close its pool):
//! its next read ends the stream and writes fail, so hyper-util's task for
//! that connection ends and the socket is closed, whether the connection is
//! idle in the pool or busy.
//!
//! Every error carries [`Sent::NotSent`]: nothing was written to a server.
//!
//! The TCP stage is pluggable ([`Connector::new`] takes any connector), so a
//! test can insert a connector that delays, or a proxy can be dialled.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use http::Uri;
use hyper::rt;
use hyper_rustls::{ConfigBuilderExt, MaybeHttpsStream};
use hyper_util::client::legacy::connect::Connected;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rebound_core::{BoxError, Error, ErrorKind, Sent, TimeoutStage};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tower_service::Service;

use crate::error::from_connect_stage;
use crate::response_body::validate;

/// Default [`Connector::connect_timeout`]: 3 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default [`Connector::tls_timeout`]: 5 s.
pub const DEFAULT_TLS_TIMEOUT: Duration = Duration::from_secs(5);

// ===== TLS configuration =====

/// Which root certificates the transport trusts.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum TlsRoots {
    /// Mozilla's roots, as packaged by `webpki-roots` (the default).
    #[default]
    Webpki,
    /// The operating system's roots (feature `native-roots`).
    #[cfg(feature = "native-roots")]
    #[cfg_attr(docsrs, doc(cfg(feature = "native-roots")))]
    Native,
    /// Exactly these roots (e.g. a test CA).
    Custom(RootCertStore),
}

impl fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsRoots::Webpki => f.write_str("Webpki"),
            #[cfg(feature = "native-roots")]
            TlsRoots::Native => f.write_str("Native"),
            TlsRoots::Custom(store) => write!(f, "Custom({} roots)", store.len()),
        }
    }
}

/// A rustls client configuration on the `ring` provider with safe default
/// protocol versions, trusting `roots`, offering `h2` (when `http2`) and
/// `http/1.1` by ALPN.
///
/// # Errors
///
/// A [configuration error](ErrorKind::Config) if the roots cannot be loaded
/// (no native roots found, empty custom store).
pub fn tls_config(roots: &TlsRoots, http2: bool) -> Result<Arc<ClientConfig>, Error> {
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::config("TLS protocol versions unavailable").with_source(e))?;
    let builder = match roots {
        TlsRoots::Webpki => builder.with_webpki_roots(),
        #[cfg(feature = "native-roots")]
        TlsRoots::Native => builder
            .with_native_roots()
            .map_err(|e| Error::config("no native root certificates found").with_source(e))?,
        TlsRoots::Custom(store) => {
            if store.is_empty() {
                return Err(Error::config("the custom TLS root store is empty"));
            }
            builder.with_root_certificates(store.clone())
        }
    };
    let mut config = builder.with_no_client_auth();
    config.alpn_protocols = alpn(http2);
    Ok(Arc::new(config))
}

pub(crate) fn alpn(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    }
}

// ===== impl Connector =====

/// Connects TCP, then TLS for `https`, each stage with its own timeout; see
/// the [module docs](self).
///
/// # Clone
///
/// Cheap: the TLS configuration is shared behind an `Arc`; the inner TCP
/// connector is cloned (hyper-util's is an `Arc` too).
#[derive(Clone)]
pub struct Connector<C = HttpConnector> {
    tcp: C,
    tls: Arc<ClientConfig>,
    connect_timeout: Duration,
    tls_timeout: Duration,
    /// Set once a handshake negotiated `h2` (shared by clones): the
    /// transport captures connections only from then on.
    h2_seen: Arc<AtomicBool>,
    /// Connections close when this is cancelled. Behind an `Arc`: hyper-util
    /// clones the connector for every request, and a `CancellationToken`
    /// clone (and drop) locks its tree node's mutex.
    close: Option<Arc<CancellationToken>>,
}

impl Connector<HttpConnector> {
    /// A connector over hyper-util's `HttpConnector` (TCP_NODELAY on, `http`
    /// and `https` URIs allowed) with the default timeouts.
    pub fn http(tls: Arc<ClientConfig>) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        // hyper-util divides this among the resolved addresses, so a dead
        // first address leaves time for the next; the outer timeout below
        // bounds the stage as a whole.
        tcp.set_connect_timeout(Some(DEFAULT_CONNECT_TIMEOUT));
        Connector::new(tcp, tls)
    }
}

impl<C> Connector<C> {
    /// A connector whose TCP stage is `tcp`, with the default timeouts
    /// (connect 3 s, TLS 5 s). `tcp` must accept `https` URIs (for
    /// `HttpConnector`, call `enforce_http(false)`).
    pub fn new(tcp: C, tls: Arc<ClientConfig>) -> Self {
        Connector {
            tcp,
            tls,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls_timeout: DEFAULT_TLS_TIMEOUT,
            h2_seen: Arc::new(AtomicBool::new(false)),
            close: None,
        }
    }

    /// Every connection made from now on closes when `token` is cancelled:
    /// its next read ends the stream (end of file) and its writes fail, so
    /// the HTTP connection over it ends, idle or busy. A connection made
    /// after the cancellation closes at its first read.
    ///
    /// Cost: per connection, a child token registered once with a waker of
    /// its own; a read that finds no data then pays an `AtomicWaker`
    /// registration and an atomic load (no lock).
    pub fn close_on(mut self, token: CancellationToken) -> Self {
        self.close = Some(Arc::new(token));
        self
    }

    /// The flag set once a handshake of this connector (or a clone)
    /// negotiated `h2`.
    pub(crate) fn h2_seen(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.h2_seen)
    }

    /// The time allowed for the TCP stage (DNS and every address tried).
    /// Default: 3 s.
    ///
    /// # Panics
    ///
    /// On a value [`try_connect_timeout`](Self::try_connect_timeout) refuses, with a message that
    /// names it; use `try_connect_timeout` for values that come from configuration.
    #[track_caller]
    pub fn connect_timeout(self, d: Duration) -> Self {
        rebound_core::config::expect_valid(
            "Connector::connect_timeout",
            self.try_connect_timeout(d),
        )
    }

    /// The time allowed for the TCP stage (DNS and every address tried).
    /// Default: 3 s.
    ///
    /// # Errors
    ///
    /// A [configuration error](ErrorKind::Config) if `d` is zero or over a
    /// day.
    pub fn try_connect_timeout(mut self, d: Duration) -> Result<Self, Error> {
        self.connect_timeout = validate("connect timeout", d)?;
        Ok(self)
    }

    /// The time allowed for the TLS handshake, from TCP-established.
    /// Default: 5 s.
    ///
    /// # Panics
    ///
    /// On a value [`try_tls_timeout`](Self::try_tls_timeout) refuses, with a message that
    /// names it; use `try_tls_timeout` for values that come from configuration.
    #[track_caller]
    pub fn tls_timeout(self, d: Duration) -> Self {
        rebound_core::config::expect_valid("Connector::tls_timeout", self.try_tls_timeout(d))
    }

    /// The time allowed for the TLS handshake, from TCP-established.
    /// Default: 5 s.
    ///
    /// # Errors
    ///
    /// A [configuration error](ErrorKind::Config) if `d` is zero or over a
    /// day.
    pub fn try_tls_timeout(mut self, d: Duration) -> Result<Self, Error> {
        self.tls_timeout = validate("TLS timeout", d)?;
        Ok(self)
    }

    /// A mutable reference to the inner TCP connector.
    pub fn tcp_mut(&mut self) -> &mut C {
        &mut self.tcp
    }
}

impl<C> fmt::Debug for Connector<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("connect_timeout", &self.connect_timeout)
            .field("tls_timeout", &self.tls_timeout)
            .field("alpn", &self.tls.alpn_protocols.len())
            .field("close_on", &self.close.is_some())
            .finish_non_exhaustive()
    }
}

/// The future of [`Connector`].
pub type ConnectFuture<T> =
    Pin<Box<dyn Future<Output = Result<Stream<T>, Error>> + Send + 'static>>;

fn not_sent(mut err: Error) -> Error {
    err.extensions_mut().insert(Sent::NotSent);
    err
}

fn server_name(uri: &Uri) -> Result<ServerName<'static>, Error> {
    let host = uri.host().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_owned()).map_err(|e| {
        not_sent(
            Error::new(ErrorKind::InvalidRequest)
                .with_detail("host is not a valid TLS server name")
                .with_source(e),
        )
    })
}

impl<C> Service<Uri> for Connector<C>
where
    C: Service<Uri>,
    C::Response: rt::Read + rt::Write + Connection + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = Stream<C::Response>;
    type Error = Error;
    type Future = ConnectFuture<C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp
            .poll_ready(cx)
            .map_err(|e| from_connect_stage(e.into(), ErrorKind::Connect, TimeoutStage::Connect))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let tls = match dst.scheme_str() {
            Some("https") => match server_name(&dst) {
                Ok(name) => Some((name, self.tls.clone())),
                Err(e) => return Box::pin(async move { Err(e) }),
            },
            Some("http") => None,
            _ => {
                let err = not_sent(
                    Error::new(ErrorKind::InvalidRequest).with_detail("unsupported URL scheme"),
                );
                return Box::pin(async move { Err(err) });
            }
        };
        let connect_timeout = self.connect_timeout;
        let tls_timeout = self.tls_timeout;
        let h2_seen = Arc::clone(&self.h2_seen);
        let close = self.close.as_deref().map(CancellationToken::child_token);
        let connecting = self.tcp.call(dst);
        Box::pin(async move {
            let tcp = match tokio::time::timeout(connect_timeout, connecting).await {
                Err(_elapsed) => return Err(not_sent(Error::timeout(TimeoutStage::Connect))),
                Ok(Err(e)) => {
                    return Err(from_connect_stage(
                        e.into(),
                        ErrorKind::Connect,
                        TimeoutStage::Connect,
                    ))
                }
                Ok(Ok(tcp)) => tcp,
            };
            let Some((name, config)) = tls else {
                return Ok(Stream::new(MaybeHttpsStream::Http(tcp), close));
            };
            let handshake =
                tokio_rustls::TlsConnector::from(config).connect(name, TokioIo::new(tcp));
            match tokio::time::timeout(tls_timeout, handshake).await {
                Err(_elapsed) => Err(not_sent(Error::timeout(TimeoutStage::Tls))),
                Ok(Err(e)) => Err(from_connect_stage(
                    Box::new(e),
                    ErrorKind::Tls,
                    TimeoutStage::Tls,
                )),
                Ok(Ok(stream)) => {
                    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        h2_seen.store(true, Ordering::Relaxed);
                    }
                    Ok(Stream::new(MaybeHttpsStream::from(stream), close))
                }
            }
        })
    }
}

// ===== impl Stream =====

/// A connection made by [`Connector`]: hyper-rustls's [`MaybeHttpsStream`]
/// (plain TCP or TLS), closed when the connector's
/// [`close_on`](Connector::close_on) token is cancelled.
pub struct Stream<T> {
    inner: MaybeHttpsStream<T>,
    /// `Some` while the stream can still be closed by the token.
    close: Option<Close>,
    /// The token was cancelled: reads end, writes fail.
    closed: bool,
}

/// Watches a close token for one connection without a lock per read: the
/// token's wait is polled once, with a waker of our own ([`CutWake`]); a
/// read that waits only hands its task's waker to an `AtomicWaker` and
/// checks a flag.
struct Close {
    wake: Arc<CutWake>,
    /// Registered with the token (never polled again); dropping it
    /// unregisters.
    _wait: Pin<Box<WaitForCancellationFutureOwned>>,
}

/// Set, and the connection's task woken, when the close token is
/// cancelled.
#[derive(Default)]
struct CutWake {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl std::task::Wake for CutWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Close {
    fn new(token: CancellationToken) -> Self {
        let wake = Arc::new(CutWake::default());
        let mut wait = Box::pin(token.cancelled_owned());
        let waker = Waker::from(Arc::clone(&wake));
        if wait
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            wake.fired.store(true, Ordering::Release);
        }
        Close { wake, _wait: wait }
    }

    /// `true` once the token is cancelled; else the current task is woken
    /// when it is.
    fn poll_closed(&self, cx: &mut Context<'_>) -> bool {
        if self.wake.fired.load(Ordering::Acquire) {
            return true;
        }
        self.wake.task.register(cx.waker());
        // Cancelled between the check and the registration.
        self.wake.fired.load(Ordering::Acquire)
    }
}

impl<T> Stream<T> {
    fn new(inner: MaybeHttpsStream<T>, close: Option<CancellationToken>) -> Self {
        Stream {
            inner,
            close: close.map(Close::new),
            closed: false,
        }
    }

    /// The TCP or TLS stream inside.
    pub fn get_ref(&self) -> &MaybeHttpsStream<T> {
        &self.inner
    }

    /// Whether the close token was seen cancelled.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether the close token is cancelled; registers the task for its
    /// wake-up otherwise.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.closed && self.close.as_ref().is_some_and(|c| c.poll_closed(cx)) {
            self.closed = true;
            self.close = None;
        }
        self.closed
    }
}

impl<T> fmt::Debug for Stream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tls = matches!(self.inner, MaybeHttpsStream::Https(_));
        f.debug_struct("Stream")
            .field("tls", &tls)
            .field("closed", &self.closed)
            .finish()
    }
}

fn closed_io() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "connection closed by the client's shutdown",
    )
}

impl<T> rt::Read for Stream<T>
where
    T: rt::Read + rt::Write + Unpin,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.closed {
            // End of file: the HTTP connection ends.
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            // Only a read that waits looks at the token (and registers for
            // its wake-up): an idle connection waits here.
            Poll::Pending if this.poll_close(cx) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

impl<T> rt::Write for Stream<T>
where
    T: rt::Read + rt::Write + Unpin,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(closed_io()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(closed_io()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(closed_io()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T> Connection for Stream<T>
where
    T: rt::Read + rt::Write + Connection + Unpin,
{
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}
