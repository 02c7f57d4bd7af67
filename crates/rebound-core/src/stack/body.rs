//! [`StackBody`]: the one response-body wrapper of the whole stack.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::collect::CollectedBody;
use crate::error::{BoxError, Error, TimeoutStage};
use crate::redact::RequestName;
use crate::trace::{BodyWatch, Config as TraceConfig};

pin_project! {
    /// What an attempt's response carries on the stack's path: the
    /// transport's body as it streams in, or (a request that asked for its
    /// body to be read inside the attempt) that body already read.
    #[project = PayloadProj]
    pub(crate) enum Payload<B> {
        Stream {
            #[pin]
            body: B,
        },
        Collected {
            body: CollectedBody,
        },
    }
}

impl<B> Payload<B> {
    pub(crate) fn stream(body: B) -> Self {
        Payload::Stream { body }
    }
}

impl<B> Body for Payload<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match self.project() {
            PayloadProj::Stream { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|frame| match frame {
                    // `Bytes` into `Bytes` moves; another `Buf` is copied.
                    Ok(frame) => Ok(frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))),
                    Err(e) => Err(Error::from_boxed(e.into())),
                })
            }),
            PayloadProj::Collected { body } => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map_err(|never| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Payload::Stream { body } => body.is_end_stream(),
            Payload::Collected { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Payload::Stream { body } => body.size_hint(),
            Payload::Collected { body } => body.size_hint(),
        }
    }
}

pin_project! {
    /// The response body of a [`Stack`](super::Stack): the inner body,
    /// frame for frame (its data as [`Bytes`]), or the body already read
    /// for a request that asked for it ([`Stack::collect`](super::Stack::collect)), under the three things the stacked layers' bodies
    /// did one wrapper each:
    ///
    /// * the **concurrency permit** is held until the body ends (its end of
    ///   stream or an error) or is dropped, as
    ///   [`LimitBody`](crate::limit::LimitBody) holds it;
    /// * reading past the **deadline** fails with
    ///   [`TimeoutStage::Deadline`], as [`DeadlineBody`](crate::deadline::DeadlineBody)
    ///   does (a body already at its end is not cut; the timer is armed
    ///   only once the inner body is pending);
    /// * a **failure** after the head is logged at WARN (`response body
    ///   failed`) in the request span, and its error's path shown as the
    ///   trace configuration says, as [`TraceBody`](crate::trace::TraceBody)
    ///   does.
    ///
    /// # Errors
    ///
    /// The inner body's errors, as [`Error`]s naming the request.
    pub struct StackBody<B> {
        #[pin]
        inner: Payload<B>,
        deadline: Instant,
        sleep: Option<Pin<Box<Sleep>>>,
        permit: Option<OwnedSemaphorePermit>,
        // `None` once a failure has been logged.
        watch: Option<BodyWatch>,
        // How the errors' paths are shown, kept after the watch is gone.
        cfg: Option<Arc<TraceConfig>>,
        request: Option<RequestName>,
    }
}

impl<B> StackBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(
        inner: Payload<B>,
        deadline: Instant,
        permit: Option<OwnedSemaphorePermit>,
        watch: Option<BodyWatch>,
        request: Option<RequestName>,
    ) -> Self {
        // A body that is already over (HEAD, 204, empty) holds nothing.
        let permit = if inner.is_end_stream() { None } else { permit };
        StackBody {
            inner,
            deadline,
            sleep: None,
            permit,
            watch,
            cfg: None,
            request,
        }
    }
}

impl<B> StackBody<B> {
    /// Whether this body still holds a concurrency permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// The deadline reading this body is bound by.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The inner body, unless it was read inside the attempt.
    pub fn get_ref(&self) -> Option<&B> {
        match &self.inner {
            Payload::Stream { body } => Some(body),
            Payload::Collected { .. } => None,
        }
    }

    /// Unwrap the inner body (the permit goes back, and neither the
    /// deadline nor the failure log applies any more); `None` for a body
    /// read inside the attempt.
    pub fn into_inner(self) -> Option<B> {
        match self.inner {
            Payload::Stream { body } => Some(body),
            Payload::Collected { .. } => None,
        }
    }
}

impl<B> fmt::Debug for StackBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBody")
            .field("deadline", &self.deadline)
            .field("holds_permit", &self.permit.is_some())
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl<B> Body for StackBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        // The deadline is checked first, so that a body whose frames are
        // always ready is cut too; a body at its end is not cut.
        let expired = match this.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
            None => Instant::now() >= *this.deadline,
        };
        let frame = if expired && !this.inner.is_end_stream() {
            Some(Err(Error::timeout(TimeoutStage::Deadline)))
        } else {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    // Waiting on the inner body: arm the timer, so that the
                    // deadline wakes this task.
                    let deadline = *this.deadline;
                    let sleep = this
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    ready!(sleep.as_mut().poll(cx));
                    Some(Err(Error::timeout(TimeoutStage::Deadline)))
                }
            }
        };
        let over = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if over {
            drop(this.permit.take());
        }
        Poll::Ready(match frame {
            Some(Err(err)) => {
                let mut err = match this.request {
                    Some(r) => r.name(err),
                    None => err,
                };
                if let Some(watch) = this.watch.take() {
                    watch.cfg.redact_error(&mut err);
                    *this.cfg = Some(watch.failed(&err));
                } else if let Some(cfg) = this.cfg {
                    cfg.redact_error(&mut err);
                }
                Some(Err(err))
            }
            other => other,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
