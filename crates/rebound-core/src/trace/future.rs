//! Response futures of the trace layers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Method, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tracing::{Level, Span};

use super::body::{BodyWatch, TraceBody};
use super::config::{Config, RequestContext};
use super::outcome::{event_at, millis, Outcome};
use super::TARGET;
use crate::error::{BoxError, Error};

/// Whether anything can use a request's or an attempt's outcome beyond
/// marking its headers: its span, an event at `level` (a request's most
/// severe one is WARN, an attempt's DEBUG) or the metrics. With no
/// subscriber interested, a request that succeeds reads no clock and
/// looks up no annotation.
fn observed(span: &Span, level: Level) -> bool {
    cfg!(feature = "metrics") || !span.is_disabled() || tracing::level_enabled!(level)
}

/// When the request or attempt started, read only if someone may ask
/// (see [`observed`]).
fn start_if(observed: bool) -> Option<Instant> {
    observed.then(Instant::now)
}

// ===== ResponseFuture (logical request) =====

pin_project! {
    /// Response future of [`Trace`](super::Trace).
    ///
    /// Dropping it before it completes records the request as cancelled.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        // `None` once the outcome has been recorded.
        state: Option<RequestState>,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(state) = this.project().state.take() {
                state.cancelled();
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("done", &self.state.is_none())
            .finish_non_exhaustive()
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, state: RequestState) -> Self {
        ResponseFuture {
            inner,
            state: Some(state),
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<TraceBody<B>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.state.as_ref().map(|s| s.span.enter());
            ready!(this.inner.poll(cx))
        };
        let mut result = result.map_err(|e| Error::from_boxed(e.into()));
        let watch = this.state.take().map(|state| state.finish(&mut result));
        Poll::Ready(result.map(|res| res.map(|body| TraceBody::new(body, watch))))
    }
}

/// A logical request's trace, from its start to its outcome (see
/// [`begin`](super::request::begin)).
pub(crate) struct RequestState {
    pub(crate) span: Span,
    cfg: Arc<Config>,
    #[cfg(feature = "metrics")]
    method: Method,
    ctx: Option<Box<RequestContext>>,
    // `None` when no one was interested as the request started.
    start: Option<Instant>,
}

impl RequestState {
    pub(crate) fn new(
        span: Span,
        cfg: Arc<Config>,
        method: &Method,
        ctx: Option<Box<RequestContext>>,
    ) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = method;
        let start = start_if(observed(&span, Level::WARN));
        RequestState {
            span,
            cfg,
            #[cfg(feature = "metrics")]
            method: method.clone(),
            ctx,
            start,
        }
    }

    /// Record the outcome (marking its headers, redacting its error) and
    /// hand over what the response body logs its own failure with.
    pub(crate) fn finish<B>(self, result: &mut Result<Response<B>, Error>) -> BodyWatch {
        self.record(result);
        // The body outlives the head: it logs its own failure (and
        // redacts its errors' paths with the same configuration, moved,
        // not cloned).
        BodyWatch {
            span: self.span,
            ctx: self.ctx,
            cfg: self.cfg,
        }
    }

    fn record<B>(&self, result: &mut Result<Response<B>, Error>) {
        match result {
            Ok(res) => self.cfg.deny.mark_sensitive(res.headers_mut()),
            // Before it is logged, and before the caller sees it.
            Err(err) => self.cfg.redact_error(err),
        }
        let o = Outcome::of(result);
        let level = o.request_level();
        let span = &self.span;
        if !observed(span, level) {
            return;
        }
        let elapsed = self.start.map(|start| start.elapsed());
        let error_type = o.error_type();
        let attempts = o.attempts();
        let stop = o.stop();
        let budget_left = o.budget_left();
        let limiter = o.limiter();
        let gate_wait = o.gate_wait().map(millis);
        if !span.is_disabled() {
            if let Some(status) = o.status {
                span.record("http.response.status_code", status.as_u16());
            }
            if let Some(error_type) = error_type {
                span.record("error.type", error_type);
                span.record("otel.status_code", "ERROR");
            }
            if let Some(headers) = o.headers.and_then(|h| self.cfg.recorded_headers(h)) {
                span.record("http.response.headers", headers);
            }
            span.record("rebound.attempts", attempts);
            span.record("rebound.stop", stop);
            if let Some(b) = budget_left {
                span.record("rebound.budget_left", b);
            }
            if let Some(l) = limiter {
                span.record("rebound.limiter", tracing::field::display(l));
            }
            if let Some(w) = gate_wait {
                span.record("rebound.gate_wait_ms", w);
            }
            if let Some(elapsed) = elapsed {
                span.record("rebound.elapsed_ms", millis(elapsed));
            }
        }

        let message = if o.is_success() {
            if attempts > 1 {
                "request succeeded after retries"
            } else {
                "request finished"
            }
        } else if level == Level::WARN {
            "request failed; giving up"
        } else {
            "request finished without success"
        };
        let ctx = self.ctx.as_deref();
        let path = ctx.and_then(|c| self.cfg.shown_path(&c.uri));
        let _entered = span.enter();
        event_at!(
            level,
            target: TARGET,
            {
            http.response.status_code = o.status.map(|s| s.as_u16()),
            error.type = error_type,
            error.message = o.error.map(tracing::field::display),
            rebound.attempts = attempts,
            rebound.stop = stop,
            rebound.reason = o.verdict().and_then(|v| v.reason()).map(|r| r.as_str()),
            rebound.budget_left = budget_left,
            rebound.elapsed_ms = elapsed.map(millis),
            http.request.method = ctx.map(|c| c.method.as_str()),
            server.address = ctx.and_then(|c| c.uri.host()),
            url.path = path.as_deref(),
            request_id = ctx.and_then(RequestContext::request_id),
            },
            "{message}"
        );

        #[cfg(feature = "metrics")]
        {
            let labels = crate::metrics::OutcomeLabels {
                method: &self.method,
                status: o.status,
                error_type,
            };
            let elapsed = elapsed.unwrap_or_default();
            crate::metrics::record_request(&labels, elapsed, attempts, stop);
            if let Some(l) = limiter {
                crate::metrics::record_limiter(l);
            }
        }
    }

    /// The caller dropped the future before it completed.
    pub(crate) fn cancelled(self) {
        let elapsed = self.start.map(|start| start.elapsed());
        let span = &self.span;
        span.record("rebound.stop", "cancelled");
        span.record("error.type", "cancelled");
        if let Some(elapsed) = elapsed {
            span.record("rebound.elapsed_ms", millis(elapsed));
        }
        let ctx = self.ctx.as_deref();
        let path = ctx.and_then(|c| self.cfg.shown_path(&c.uri));
        let _entered = span.enter();
        tracing::debug!(
            target: TARGET,
            {
            rebound.stop = "cancelled",
            rebound.elapsed_ms = elapsed.map(millis),
            http.request.method = ctx.map(|c| c.method.as_str()),
            server.address = ctx.and_then(|c| c.uri.host()),
            url.path = path.as_deref(),
            request_id = ctx.and_then(RequestContext::request_id),
            },
            "request cancelled by the caller"
        );
        #[cfg(feature = "metrics")]
        {
            let labels = crate::metrics::OutcomeLabels {
                method: &self.method,
                status: None,
                error_type: Some("cancelled"),
            };
            let elapsed = elapsed.unwrap_or_default();
            crate::metrics::record_request(&labels, elapsed, 1, "cancelled");
        }
    }
}

// ===== AttemptFuture =====

pin_project! {
    /// Response future of [`AttemptTrace`](super::AttemptTrace).
    pub struct AttemptFuture<F> {
        #[pin]
        inner: F,
        state: Option<AttemptState>,
    }

    impl<F> PinnedDrop for AttemptFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(state) = this.project().state.take() {
                state.cancelled();
            }
        }
    }
}

impl<F> fmt::Debug for AttemptFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptFuture")
            .field("done", &self.state.is_none())
            .finish_non_exhaustive()
    }
}

impl<F> AttemptFuture<F> {
    pub(crate) fn new(inner: F, state: AttemptState) -> Self {
        AttemptFuture {
            inner,
            state: Some(state),
        }
    }
}

impl<F, B, E> Future for AttemptFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<B>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = {
            let _entered = this.state.as_ref().map(|s| s.span.enter());
            ready!(this.inner.poll(cx))
        };
        let mut result = result.map_err(|e| Error::from_boxed(e.into()));
        if let Some(state) = this.state.take() {
            state.finish(&mut result);
        }
        Poll::Ready(result)
    }
}

/// An attempt's trace, from its start to its outcome (see
/// [`begin_attempt`](super::attempt::begin_attempt)).
pub(crate) struct AttemptState {
    pub(crate) span: Span,
    cfg: Arc<Config>,
    #[cfg(feature = "metrics")]
    method: Method,
    ctx: Option<Box<RequestContext>>,
    attempt: u32,
    budget_left: Option<u32>,
    // `None` when no one was interested as the attempt started.
    start: Option<Instant>,
}

impl AttemptState {
    pub(crate) fn new(
        span: Span,
        cfg: Arc<Config>,
        method: &Method,
        ctx: Option<Box<RequestContext>>,
        attempt: u32,
        budget_left: Option<u32>,
    ) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = method;
        let start = start_if(observed(&span, Level::DEBUG));
        AttemptState {
            span,
            cfg,
            #[cfg(feature = "metrics")]
            method: method.clone(),
            ctx,
            attempt,
            budget_left,
            start,
        }
    }

    /// Record the outcome (marking its headers, redacting its error).
    pub(crate) fn finish<B>(self, result: &mut Result<Response<B>, Error>) {
        match result {
            // The retry layer may drop this response; whatever looks at it
            // before then must not see a Set-Cookie either.
            Ok(res) => self.cfg.deny.mark_sensitive(res.headers_mut()),
            // Before it is logged, and before the layers above see it.
            Err(err) => self.cfg.redact_error(err),
        }
        // Its one event is at DEBUG.
        if !observed(&self.span, Level::DEBUG) {
            return;
        }
        let elapsed = self.start.map(|start| start.elapsed());
        let o = Outcome::of(result);
        let error_type = o.error_type();
        let verdict = o.verdict();
        let reason = verdict.and_then(|v| v.reason()).map(|r| r.as_str());
        let sent = verdict.and_then(|v| v.sent()).map(|s| s.as_str());
        let delay = o.proposed_delay();
        let budget_left = o.budget_left().or(self.budget_left);
        let limiter = o.limiter();
        let gate_wait = o.gate_wait().map(millis);
        let span = &self.span;
        if !span.is_disabled() {
            if let Some(status) = o.status {
                span.record("http.response.status_code", status.as_u16());
            }
            if let Some(error_type) = error_type {
                span.record("error.type", error_type);
            }
            if let Some(headers) = o.headers.and_then(|h| self.cfg.recorded_headers(h)) {
                span.record("http.response.headers", headers);
            }
            span.record("rebound.verdict", o.verdict_label());
            if let Some(reason) = reason {
                span.record("rebound.reason", reason);
            }
            if let Some(sent) = sent {
                span.record("rebound.sent", sent);
            }
            if let Some(d) = delay {
                span.record("rebound.delay_ms", millis(d.delay));
                span.record("rebound.delay_source", d.source.as_str());
            }
            if let Some(b) = budget_left {
                span.record("rebound.budget_left", b);
            }
            if let Some(l) = limiter {
                span.record("rebound.limiter", tracing::field::display(l));
            }
            if let Some(w) = gate_wait {
                span.record("rebound.gate_wait_ms", w);
            }
            if let Some(elapsed) = elapsed {
                span.record("rebound.elapsed_ms", millis(elapsed));
            }
        }

        // Always DEBUG: whether a retryable attempt is retried is the retry
        // loop's decision, logged at INFO (`retrying`) when the next attempt
        // starts, or at WARN (`request failed; giving up`) by the request.
        let ctx = self.ctx.as_deref();
        let path = ctx.and_then(|c| self.cfg.shown_path(&c.uri));
        let _entered = span.enter();
        tracing::debug!(
            target: TARGET,
            {
            rebound.attempt = self.attempt,
            http.response.status_code = o.status.map(|s| s.as_u16()),
            error.type = error_type,
            error.message = o.error.map(tracing::field::display),
            rebound.verdict = o.verdict_label(),
            rebound.reason = reason,
            rebound.sent = sent,
            rebound.delay_ms = delay.map(|d| millis(d.delay)),
            rebound.delay_source = delay.map(|d| d.source.as_str()),
            rebound.budget_left = budget_left,
            rebound.limiter = limiter.map(tracing::field::display),
            rebound.elapsed_ms = elapsed.map(millis),
            http.request.method = ctx.map(|c| c.method.as_str()),
            server.address = ctx.and_then(|c| c.uri.host()),
            url.path = path.as_deref(),
            request_id = ctx.and_then(RequestContext::request_id),
            },
            "attempt finished"
        );

        #[cfg(feature = "metrics")]
        {
            let labels = crate::metrics::OutcomeLabels {
                method: &self.method,
                status: o.status,
                error_type,
            };
            crate::metrics::record_attempt(&labels, elapsed.unwrap_or_default());
            if let Some(l) = limiter {
                crate::metrics::record_limiter(l);
            }
            // Gates hold attempts (they sit below the retry layer), so they
            // are counted here, once per attempt, and not per request.
            if let Some(w) = o.gate_wait() {
                crate::metrics::record_gate_wait(w);
            }
        }
    }

    /// The attempt was dropped before it completed (the request was
    /// cancelled, or a layer above cut it).
    pub(crate) fn cancelled(self) {
        let elapsed = self.start.map(|start| start.elapsed());
        self.span.record("rebound.verdict", "cancelled");
        if let Some(elapsed) = elapsed {
            self.span.record("rebound.elapsed_ms", millis(elapsed));
        }
        let _entered = self.span.enter();
        tracing::debug!(
            target: TARGET,
            {
            rebound.attempt = self.attempt,
            rebound.elapsed_ms = elapsed.map(millis),
            },
            "attempt dropped before it finished"
        );
    }
}
