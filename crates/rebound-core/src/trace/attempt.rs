//! `AttemptTraceLayer`: one child span per attempt.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::field::Empty;
use tracing::{Level, Span};

use super::config::{Config, RequestContext};
use super::future::{AttemptFuture, AttemptState};
use super::outcome::millis;
use super::{BudgetLeft, LimiterState, TARGET};
use crate::annotations::{AttemptNumber, PreviousAttempt};
use crate::error::{BoxError, Error};

/// Traces each attempt in a child span of the request span, and logs at
/// INFO (`retrying`) every attempt the retry loop makes after the first.
///
/// Put it **directly below the retry layer**: it then sees every attempt
/// (stamped [`AttemptNumber`]) and, on the way up, the annotations the layers below
/// add ([`Verdict`](crate::Verdict), [`ProposedDelay`](crate::ProposedDelay),
/// [`LimiterState`](super::LimiterState), ...). Get it from
/// [`TraceLayer::attempt_layer`](super::TraceLayer::attempt_layer) to share
/// the trace layer's configuration, or with [`AttemptTraceLayer::new`] for
/// the defaults. See the [module docs](super) for the fields and levels.
///
/// When configured with
/// [`send_attempt_header`](super::TraceBuilder::send_attempt_header), it sets
/// that header to the attempt number on every attempt.
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
pub struct AttemptTraceLayer {
    cfg: Arc<Config>,
}

impl fmt::Debug for AttemptTraceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptTraceLayer")
            .field("config", &self.cfg)
            .finish()
    }
}

impl Default for AttemptTraceLayer {
    fn default() -> Self {
        AttemptTraceLayer::new()
    }
}

impl AttemptTraceLayer {
    /// An attempt layer with the default configuration (see
    /// [`TraceLayer::new`](super::TraceLayer::new)).
    pub fn new() -> Self {
        AttemptTraceLayer::from_config(Arc::new(Config::default()))
    }

    pub(crate) fn from_config(cfg: Arc<Config>) -> Self {
        AttemptTraceLayer { cfg }
    }
}

impl<S> Layer<S> for AttemptTraceLayer {
    type Service = AttemptTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AttemptTrace {
            inner,
            cfg: self.cfg.clone(),
        }
    }
}

/// The service of [`AttemptTraceLayer`].
///
/// See the [module docs](super).
#[derive(Clone)]
pub struct AttemptTrace<S> {
    inner: S,
    cfg: Arc<Config>,
}

impl<S: fmt::Debug> fmt::Debug for AttemptTrace<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptTrace")
            .field("inner", &self.inner)
            .field("config", &self.cfg)
            .finish()
    }
}

impl<S> AttemptTrace<S> {
    /// Wrap `inner` with the default configuration.
    pub fn new(inner: S) -> Self {
        AttemptTraceLayer::new().layer(inner)
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

impl<S, ReqB, ResB> Service<Request<ReqB>> for AttemptTrace<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = AttemptFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let state = begin_attempt(&self.cfg, &mut req);
        let future = {
            let _entered = state.span.enter();
            self.inner.call(req)
        };
        AttemptFuture::new(future, state)
    }
}

/// An attempt's trace, begun: the attempt header set (when configured), its
/// span made, and the INFO `retrying` event of an attempt the retry loop
/// decided to make. Shared by [`AttemptTrace`] and the whole-stack service.
pub(crate) fn begin_attempt<B>(cfg: &Arc<Config>, req: &mut Request<B>) -> AttemptState {
    let attempt = AttemptNumber::of(req.extensions());
    if let Some(name) = &cfg.attempt_header {
        req.headers_mut()
            .insert(name.clone(), HeaderValue::from(attempt));
    }
    let budget_left = req.extensions().get::<BudgetLeft>().map(|b| b.0);
    let span = attempt_span(attempt, budget_left);
    // When spans are off, events name the request themselves; only the
    // DEBUG `attempt finished` event outlives this call.
    let context = |level: Level| {
        (span.is_disabled() && tracing::level_enabled!(level))
            .then(|| Box::new(RequestContext::new(cfg, req)))
    };
    let ctx = context(Level::DEBUG);
    // The retry loop stamps `PreviousAttempt` only on an attempt it
    // decided to make: this is where a retry is known to happen.
    if let Some(previous) = req.extensions().get::<PreviousAttempt>() {
        let limiter = req.extensions().get::<LimiterState>();
        let info_ctx = match &ctx {
            Some(_) => None,
            None => context(Level::INFO),
        };
        let _entered = span.enter();
        retrying(
            cfg,
            attempt,
            previous,
            budget_left,
            limiter,
            ctx.as_deref().or(info_ctx.as_deref()),
        );
        #[cfg(feature = "metrics")]
        {
            let reason = previous.verdict.reason().map_or("unknown", |r| r.as_str());
            let source = previous.delay.map(|d| d.source.as_str());
            crate::metrics::record_retry(req.method(), reason, source);
        }
    }
    AttemptState::new(span, cfg.clone(), req.method(), ctx, attempt, budget_left)
}

fn attempt_span(attempt: u32, budget_left: Option<u32>) -> Span {
    tracing::debug_span!(
        target: TARGET,
        "http.client.attempt",
        rebound.attempt = attempt,
        // OpenTelemetry: only on resends, i.e. attempts after the first.
        http.request.resend_count = (attempt > 1).then(|| attempt - 1),
        http.response.status_code = Empty,
        http.response.headers = Empty,
        error.type = Empty,
        rebound.verdict = Empty,
        rebound.reason = Empty,
        rebound.sent = Empty,
        rebound.delay_ms = Empty,
        rebound.delay_source = Empty,
        rebound.budget_left = budget_left,
        rebound.limiter = Empty,
        rebound.gate_wait_ms = Empty,
        rebound.ratelimit.wait_ms = Empty,
        rebound.ratelimit.remaining = Empty,
        rebound.ratelimit.reset_ms = Empty,
        rebound.elapsed_ms = Empty,
    )
}

/// The INFO event `retrying`, emitted when attempt `attempt` (> 1) starts:
/// why the previous attempt failed, how long the retry loop waited and who
/// chose that delay.
fn retrying(
    cfg: &Config,
    attempt: u32,
    previous: &PreviousAttempt,
    budget_left: Option<u32>,
    limiter: Option<&LimiterState>,
    ctx: Option<&RequestContext>,
) {
    let verdict = &previous.verdict;
    let delay = previous.delay.as_ref();
    let path = ctx.and_then(|c| cfg.shown_path(&c.uri));
    tracing::info!(
        target: TARGET,
        {
        rebound.attempt = attempt,
        http.request.resend_count = attempt.saturating_sub(1),
        rebound.reason = verdict.reason().map(|r| r.as_str()),
        rebound.sent = verdict.sent().map(|s| s.as_str()),
        rebound.delay_ms = delay.map(|d| millis(d.delay)),
        rebound.delay_source = delay.map(|d| d.source.as_str()),
        rebound.retry_after_ms = previous.retry_after.map(millis),
        rebound.budget_left = budget_left,
        rebound.limiter = limiter.map(tracing::field::display),
        http.request.method = ctx.map(|c| c.method.as_str()),
        server.address = ctx.and_then(|c| c.uri.host()),
        url.path = path.as_deref(),
        request_id = ctx.and_then(RequestContext::request_id),
        },
        "retrying"
    );
}
