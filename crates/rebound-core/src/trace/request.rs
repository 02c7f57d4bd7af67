//! `TraceLayer`: one span per logical request.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::field::Empty;
use tracing::{Level, Span};

use super::config::{self, Config, RequestContext, TraceBuilder};
use super::future::{RequestState, ResponseFuture};
use super::{AttemptTraceLayer, TraceBody, TARGET};
use crate::error::{BoxError, Error};
use crate::redact::{self, PathRedaction};

/// Traces each logical request in one span, with redaction by construction.
///
/// Put it **outermost**, above the retry layer; put the matching
/// [`AttemptTraceLayer`] (from [`attempt_layer`](Self::attempt_layer))
/// directly below the retry layer. See the [module docs](super) for the
/// fields, levels and an example.
///
/// On its way down it marks every deny-listed request header
/// [sensitive](http::HeaderValue::set_sensitive), so `Debug` of the request
/// in any layer below hides the value; it does the same for the response's
/// headers on the way up.
///
/// # Errors
///
/// The inner service's errors are turned into [`Error`] with
/// [`Error::from_boxed`]; the layer adds none of its own.
///
/// # Clone
///
/// Cloning the layer or the service shares the configuration (an `Arc`).
#[derive(Clone)]
pub struct TraceLayer {
    cfg: Arc<Config>,
}

impl fmt::Debug for TraceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceLayer")
            .field("config", &self.cfg)
            .finish()
    }
}

impl Default for TraceLayer {
    fn default() -> Self {
        TraceLayer::new()
    }
}

impl TraceLayer {
    /// A trace layer with the defaults: the default deny-list, no header
    /// recorded, request id from `x-request-id`, no query parameter names, no
    /// attempt header.
    pub fn new() -> Self {
        TraceLayer::from_config(Arc::new(Config::default()))
    }

    /// A builder to change the defaults.
    pub fn builder() -> TraceBuilder {
        TraceBuilder::default()
    }

    pub(crate) fn from_config(cfg: Arc<Config>) -> Self {
        TraceLayer { cfg }
    }

    #[cfg(feature = "stack")]
    /// The shared configuration (for the whole-stack service).
    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.cfg
    }

    /// The [`AttemptTraceLayer`] with the same configuration (deny- and
    /// allow-lists, request-id header, attempt-number header, path
    /// redaction).
    pub fn attempt_layer(&self) -> AttemptTraceLayer {
        config::attempt_layer(&self.cfg)
    }

    /// How this layer shows URL paths (see
    /// [`TraceBuilder::path_redaction`]).
    pub fn path_redaction(&self) -> &PathRedaction {
        &self.cfg.path
    }

    /// The same configuration with the path redaction replaced by
    /// `redaction` (see [`TraceBuilder::path_redaction`]); for a
    /// configuration assembled in two places, as the ready-made client's
    /// builder does.
    pub fn with_path_redaction(&self, redaction: PathRedaction) -> TraceLayer {
        let mut cfg = Config::clone(&self.cfg);
        cfg.path = redaction;
        TraceLayer::from_config(Arc::new(cfg))
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trace {
            inner,
            cfg: self.cfg.clone(),
        }
    }
}

/// The service of [`TraceLayer`].
///
/// See the [module docs](super).
#[derive(Clone)]
pub struct Trace<S> {
    inner: S,
    cfg: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for Trace<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trace")
            .field("inner", &self.inner)
            .field("config", &self.cfg)
            .finish()
    }
}

impl<S> Trace<S> {
    /// Wrap `inner` with the default configuration.
    pub fn new(inner: S) -> Self {
        TraceLayer::new().layer(inner)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Trace<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<TraceBody<ResB>>;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let state = begin(&self.cfg, &mut req);
        let future = {
            let _entered = state.span.enter();
            self.inner.call(req)
        };
        ResponseFuture::new(future, state)
    }
}

/// A logical request's trace, begun: deny-listed request headers marked
/// sensitive, its span made, and what its events need when spans are off.
/// Shared by [`Trace`] and the whole-stack service.
pub(crate) fn begin<B>(cfg: &Arc<Config>, req: &mut Request<B>) -> RequestState {
    cfg.deny.mark_sensitive(req.headers_mut());
    let span = request_span(cfg, req);
    // With spans off, an INFO/WARN event must name its request itself.
    let ctx = (span.is_disabled() && tracing::level_enabled!(Level::INFO))
        .then(|| Box::new(RequestContext::new(cfg, req)));
    RequestState::new(span, cfg.clone(), req.method(), ctx)
}

/// The request span. Field values are computed only when the span is
/// enabled.
fn request_span<B>(cfg: &Config, req: &Request<B>) -> Span {
    let uri = req.uri();
    tracing::debug_span!(
        target: TARGET,
        "http.client.request",
        otel.name = req.method().as_str(),
        otel.kind = "client",
        otel.status_code = Empty,
        http.request.method = req.method().as_str(),
        server.address = uri.host(),
        server.port = redact::effective_port(uri),
        url.scheme = uri.scheme_str(),
        url.path = cfg.shown_path(uri).as_deref(),
        url.query_names = cfg.query_names(uri),
        request_id = cfg.request_id(req.headers()),
        http.request.headers = cfg.recorded_headers(req.headers()),
        http.response.status_code = Empty,
        http.response.headers = Empty,
        error.type = Empty,
        rebound.attempts = Empty,
        rebound.stop = Empty,
        rebound.budget_left = Empty,
        rebound.limiter = Empty,
        rebound.gate_wait_ms = Empty,
        rebound.ratelimit.wait_ms = Empty,
        rebound.ratelimit.remaining = Empty,
        rebound.ratelimit.reset_ms = Empty,
        rebound.elapsed_ms = Empty,
    )
}
