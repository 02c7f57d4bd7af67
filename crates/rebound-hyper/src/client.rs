//! The ready-made client: rebound's layers over the hyper transport.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! use std::time::Duration;
//!
//! use rebound_hyper::Client;
//!
//! let client = Client::builder()
//!     .total_timeout(Duration::from_secs(15))
//!     .attempt_timeout(Duration::from_secs(10))
//!     .connect_timeout(Duration::from_secs(3))
//!     .build()?;
//! # drop(client);
//!
//! // Configuration that cannot work is refused when the client is built.
//! let err = Client::builder()
//!     .attempt_timeout(Duration::from_secs(20))
//!     .total_timeout(Duration::from_secs(10))
//!     .build()
//!     .unwrap_err();
//! assert!(err.is_config());
//! assert!(err.to_string().contains("attempt timeout (20s) is longer than the total timeout (10s)"));
//! # Ok(())
//! # }
//! ```
//!
//! [`Client::builder`] assembles, outer to inner: the total deadline
//! ([`DeadlineLayer`]), the per-attempt timeout ([`AttemptTimeoutLayer`])
//! and the [`HyperTransport`]. The retry, classification, backoff and limit
//! layers of DESIGN.md §2 slot in between them as they land.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use rebound_core::attempt_timeout::{self, AttemptTimeout, AttemptTimeoutLayer};
use rebound_core::deadline::{self, DeadlineBody, DeadlineLayer, DeadlineService};
use rebound_core::{Error, ErrorKind, Sent};
use rustls::ClientConfig;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::Body;
use crate::connect::TlsRoots;
use crate::response_body::{MinBodyRate, ResponseBody};
use crate::transport::{HyperTransport, TransportBuilder};

/// Default [`ClientBuilder::total_timeout`]: 30 s.
pub const DEFAULT_TOTAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`ClientBuilder::attempt_timeout`]: 10 s.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ClientBuilder::body_idle_timeout`]: 30 s.
pub const DEFAULT_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The body of a response from [`Client`]: the transport's body (idle and
/// minimum-rate timeouts) under the total deadline.
pub type ClientBody = DeadlineBody<ResponseBody<Incoming>>;

type Stack = DeadlineService<AttemptTimeout<HyperTransport>>;

// ===== impl ClientBuilder =====

/// Builds a [`Client`]; see the [module docs](self). Values are checked by
/// [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    total: Duration,
    attempt: Duration,
    body_idle: Option<Duration>,
    transport: TransportBuilder,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            total: DEFAULT_TOTAL_TIMEOUT,
            attempt: DEFAULT_ATTEMPT_TIMEOUT,
            body_idle: Some(DEFAULT_BODY_IDLE_TIMEOUT),
            transport: TransportBuilder::new(),
        }
    }
}

impl ClientBuilder {
    /// A builder with the defaults documented on each setter.
    pub fn new() -> Self {
        ClientBuilder::default()
    }

    /// The total budget of a logical request: every attempt, every wait
    /// between attempts and reading the response body. Default: 30 s.
    pub fn total_timeout(mut self, d: Duration) -> Self {
        self.total = d;
        self
    }

    /// The time one attempt may take until the response head arrives
    /// (connect and TLS included); never more than what is left of the
    /// total. Must not exceed the total timeout. Default: 10 s.
    pub fn attempt_timeout(mut self, d: Duration) -> Self {
        self.attempt = d;
        self
    }

    /// Time allowed to establish TCP (DNS and every resolved address).
    /// Default: 3 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.transport = self.transport.connect_timeout(d);
        self
    }

    /// Time allowed for the TLS handshake, from TCP-established. Default:
    /// 5 s.
    pub fn tls_timeout(mut self, d: Duration) -> Self {
        self.transport = self.transport.tls_timeout(d);
        self
    }

    /// Fail a response body when no frame arrives for `d` while the caller
    /// reads it; `None` turns it off. Default: 30 s.
    pub fn body_idle_timeout(mut self, d: impl Into<Option<Duration>>) -> Self {
        self.body_idle = d.into();
        self
    }

    /// Fail a response body slower than `rate` (see [`MinBodyRate`]);
    /// `None` turns it off. Default: off.
    pub fn min_body_rate(mut self, rate: impl Into<Option<MinBodyRate>>) -> Self {
        self.transport = self.transport.min_body_rate(rate);
        self
    }

    /// Which root certificates to trust. Default: [`TlsRoots::Webpki`].
    pub fn tls_roots(mut self, roots: TlsRoots) -> Self {
        self.transport = self.transport.tls_roots(roots);
        self
    }

    /// Use this rustls configuration instead of one built from
    /// [`tls_roots`](Self::tls_roots). Default: none.
    pub fn tls_config(mut self, config: Arc<ClientConfig>) -> Self {
        self.transport = self.transport.tls_config(config);
        self
    }

    /// Offer HTTP/2 by ALPN on TLS connections. Default: `true`.
    pub fn http2(mut self, enabled: bool) -> Self {
        self.transport = self.transport.http2(enabled);
        self
    }

    /// Build the client.
    ///
    /// # Errors
    ///
    /// A [configuration error](Error::is_config) saying what cannot work: a
    /// zero or over-a-day timeout, an attempt timeout longer than the total
    /// timeout, no root certificates.
    pub fn build(self) -> Result<Client, Error> {
        let deadline = DeadlineLayer::new(self.total)?;
        let attempt = AttemptTimeoutLayer::new(self.attempt)?;
        attempt.check_within(self.total)?;
        let transport = self.transport.body_idle_timeout(self.body_idle).build()?;
        Ok(Client {
            inner: deadline.layer(attempt.layer(transport)),
        })
    }
}

// ===== impl Client =====

/// rebound's ready-made HTTP client; see the [module docs](self).
///
/// # Clone
///
/// Cheap: clones share the connection pool and the configuration.
#[derive(Clone)]
pub struct Client {
    inner: Stack,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// A [`ClientBuilder`] with the defaults.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::new()
    }

    /// Send `req`.
    pub fn send<B>(
        &self,
        req: Request<B>,
    ) -> impl Future<Output = Result<Response<ClientBody>, Error>>
    where
        B: Into<Body>,
    {
        self.inner.clone().oneshot(req)
    }

    /// `GET uri`.
    pub fn get<U>(&self, uri: U) -> impl Future<Output = Result<Response<ClientBody>, Error>>
    where
        U: TryInto<Uri>,
        U::Error: Into<rebound_core::BoxError>,
    {
        let req = uri
            .try_into()
            .map_err(|e| {
                let mut err = Error::new(ErrorKind::InvalidRequest)
                    .with_detail("invalid URL")
                    .with_source(e);
                err.extensions_mut().insert(Sent::NotSent);
                err
            })
            .map(|uri| {
                let mut req = Request::new(Body::empty());
                *req.uri_mut() = uri;
                req
            });
        let inner = self.inner.clone();
        async move { inner.oneshot(req?).await }
    }
}

impl<B> Service<Request<B>> for Client
where
    B: Into<Body>,
{
    type Response = Response<ClientBody>;
    type Error = Error;
    type Future =
        deadline::ResponseFuture<attempt_timeout::ResponseFuture<crate::transport::ResponseFuture>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<Request<B>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.inner.call(req)
    }
}
