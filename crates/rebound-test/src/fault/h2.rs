//! HTTP/2 (negotiated by ALPN over TLS) through hyper's server. Well-formed
//! responses, delays, stalls and trickles behave as on HTTP/1.1; the
//! socket-level faults (close, reset, truncation) become stream resets.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::stream;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming as IncomingBody};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::action::{End, Kind, Reply};
use super::body::BodyPlan;
use super::recorder::{InFlight, Incoming, Shared};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ResBody = UnsyncBoxBody<Bytes, BoxError>;

/// Runs hyper's per-stream tasks on the server's tracker, so they stop when
/// the server is dropped and [`FaultServer::shutdown`] waits for them.
///
/// [`FaultServer::shutdown`]: super::FaultServer::shutdown
#[derive(Clone, Debug)]
pub(crate) struct Exec {
    pub(crate) tracker: TaskTracker,
    pub(crate) cancel: CancellationToken,
}

impl<F> hyper::rt::Executor<F> for Exec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = fut => {}
            }
        });
    }
}

/// Serves one HTTP/2 connection until the client leaves; with
/// `silent_after: Some(n)`, the connection goes silent at its request
/// after the first `n` (see [`Silenceable`]).
pub(crate) async fn serve(
    io: tokio_rustls::server::TlsStream<TcpStream>,
    connection: u64,
    shared: Arc<Shared>,
    exec: Exec,
    silent_after: Option<usize>,
) {
    let silent = Arc::new(AtomicBool::new(false));
    let io = Silenceable {
        inner: io,
        silent: Arc::clone(&silent),
    };
    let arrived = Arc::new(AtomicUsize::new(0));
    let svc = hyper::service::service_fn(move |req| {
        let index = arrived.fetch_add(1, Ordering::SeqCst);
        let go_silent = silent_after.is_some_and(|n| index >= n);
        handle(
            req,
            connection,
            Arc::clone(&shared),
            go_silent.then(|| Arc::clone(&silent)),
        )
    });
    let _ = hyper::server::conn::http2::Builder::new(exec)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// The connection's IO, which can go silent: from then on every write is
/// swallowed (the server believes it answered; nothing reaches the
/// client) and what the client sends is read and discarded, so the
/// connection still ends when the client leaves.
struct Silenceable<T> {
    inner: T,
    silent: Arc<AtomicBool>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Silenceable<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.silent.load(Ordering::SeqCst) {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let mut scratch = [0u8; 4096];
        loop {
            let mut discard = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut discard))?;
            if discard.filled().is_empty() {
                // The client left: end of stream.
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Silenceable<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.silent.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.silent.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.silent.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[derive(Debug)]
struct Fault(&'static str);

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Fault {}

fn empty() -> ResBody {
    Empty::new()
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

async fn handle(
    req: Request<IncomingBody>,
    connection: u64,
    shared: Arc<Shared>,
    go_silent: Option<Arc<AtomicBool>>,
) -> Result<Response<ResBody>, Fault> {
    let received_at = Instant::now();
    let in_flight = shared.enter();
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(Fault("request body failed")),
    };
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_owned())
        .unwrap_or_else(|| "/".to_owned());
    let action = shared.record(
        Incoming {
            method: parts.method,
            target,
            version: parts.version,
            headers: parts.headers,
            received_at,
            connection,
        },
        body,
    );
    if let Some(silent) = go_silent {
        // Recorded (its body read); from now on nothing reaches the client.
        silent.store(true, Ordering::SeqCst);
        drop(action);
        return std::future::pending().await;
    }
    if let Some(max) = action.reject_above {
        if shared.in_flight() > max {
            let mut res = Response::new(empty());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            return Ok(res);
        }
    }
    if !action.delay.is_zero() {
        tokio::time::sleep(action.delay).await;
    }
    match action.kind {
        Kind::NeverRespond => std::future::pending().await,
        Kind::Close => Err(Fault("scripted close")),
        Kind::Reset | Kind::ResetMidHeaders => Err(Fault("scripted reset")),
        Kind::Respond(reply) => Ok(respond(reply, in_flight)),
    }
}

/// Headers HTTP/2 forbids (RFC 9113 §8.2.2); dropped from scripted replies.
fn connection_specific(name: &HeaderName) -> bool {
    name == CONNECTION
        || name == TRANSFER_ENCODING
        || matches!(name.as_str(), "keep-alive" | "proxy-connection" | "upgrade")
}

fn respond(reply: Reply, in_flight: InFlight) -> Response<ResBody> {
    let mut res = Response::builder().status(reply.status);
    let mut has_length = false;
    for (name, value) in &reply.headers {
        if connection_specific(name) {
            continue;
        }
        has_length |= name == CONTENT_LENGTH;
        res = res.header(name, value);
    }
    if !has_length && !reply.chunked && reply.status != StatusCode::NO_CONTENT {
        res = res.header(CONTENT_LENGTH, reply.body.len());
    }
    let plan = BodyPlan::new(&reply);
    let frames = stream::unfold(Some((plan, reply.end, in_flight)), |state| async move {
        let (mut plan, end, in_flight) = state?;
        match plan.next_chunk().await {
            Some(chunk) => Some((Ok(Frame::data(chunk)), Some((plan, end, in_flight)))),
            None => match end {
                End::Complete => None,
                End::Stall(_) => {
                    std::future::pending::<()>().await;
                    None
                }
                End::Truncate(_) | End::Reset(_) => {
                    let err: BoxError = Box::new(Fault("scripted body fault"));
                    Some((Err(err), None))
                }
            },
        }
    });
    let body = StreamBody::new(frames).boxed_unsync();
    // The status and headers were validated when the action was built.
    res.body(body).unwrap_or_else(|_| Response::new(empty()))
}
