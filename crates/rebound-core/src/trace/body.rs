//! `TraceBody`: logs a response body that fails after its head.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tracing::Span;

use std::sync::Arc;

use super::config::{Config, RequestContext};
use super::TARGET;
use crate::error::{BoxError, Error, ErrorKind};

pin_project! {
    /// The response body of [`Trace`](super::Trace): the inner body,
    /// unchanged, except that a failure while reading it (a stall, a reset,
    /// a truncation, the deadline) is logged at WARN as
    /// `response body failed` with `error.type`, `error.stage` (for a
    /// timeout) and the redacted `error.message`, in the request span (or,
    /// with spans off, naming the request itself).
    ///
    /// The request's logical outcome is recorded at the response head; the
    /// body comes later, so without this a body that fails after a `200`
    /// head would log nothing. A body read to its end logs nothing, and
    /// wrapping costs no allocation: it holds the request span (keeping it
    /// open until the body is dropped) and what the events already had.
    ///
    /// # Errors
    ///
    /// The inner body's errors are turned into [`Error`] with
    /// [`Error::from_boxed`] (a rebound error passes through unchanged).
    pub struct TraceBody<B> {
        #[pin]
        inner: B,
        // `None` once a failure has been logged (or with nothing to log to).
        watch: Option<BodyWatch>,
        // How the errors' paths are shown; kept after the watch is gone.
        cfg: Option<Arc<Config>>,
    }
}

/// What a body failure is logged with: the request span and, with spans
/// off, the request's redacted name.
pub(crate) struct BodyWatch {
    pub(crate) span: Span,
    pub(crate) ctx: Option<Box<RequestContext>>,
    pub(crate) cfg: Arc<Config>,
}

impl<B> TraceBody<B> {
    pub(crate) fn new(inner: B, watch: Option<BodyWatch>) -> Self {
        TraceBody {
            inner,
            watch,
            cfg: None,
        }
    }

    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Unwrap the inner body (its failures are then no longer logged).
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> fmt::Debug for TraceBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceBody").finish_non_exhaustive()
    }
}

impl<B> Body for TraceBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match std::task::ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
            None => Poll::Ready(None),
            Some(Err(e)) => {
                let mut err = Error::from_boxed(e.into());
                if let Some(watch) = this.watch.take() {
                    watch.cfg.redact_error(&mut err);
                    *this.cfg = Some(watch.failed(&err));
                } else if let Some(cfg) = this.cfg {
                    cfg.redact_error(&mut err);
                }
                Poll::Ready(Some(Err(err)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl BodyWatch {
    /// Log the failure; the configuration is handed back for later errors.
    pub(crate) fn failed(self, err: &Error) -> Arc<Config> {
        let stage = match err.kind() {
            ErrorKind::Timeout(stage) => Some(stage.as_str()),
            _ => None,
        };
        let ctx = self.ctx.as_deref();
        let path = ctx.and_then(|c| self.cfg.shown_path(&c.uri));
        let _entered = self.span.enter();
        tracing::warn!(
            target: TARGET,
            {
            error.type = err.kind().as_str(),
            error.stage = stage,
            error.message = %err,
            http.request.method = ctx.map(|c| c.method.as_str()),
            server.address = ctx.and_then(|c| c.uri.host()),
            url.path = path.as_deref(),
            request_id = ctx.and_then(RequestContext::request_id),
            },
            "response body failed"
        );
        drop(_entered);
        drop(path);
        self.cfg
    }
}
