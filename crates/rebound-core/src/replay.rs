//! Streaming request bodies that can be sent again: [`RecordingBody`].
//!
//! A retry needs the request body a second time. Bodies already in memory
//! (`Full`, `Empty`, `String`) replay for free (see [`crate::body`]); a
//! *streaming* body is wrapped in a [`RecordingBody`], which records the chunks
//! while the first attempt streams them and plays the recording back to the
//! next attempt, up to a cap.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use futures_util::stream;
//! use http_body::Frame;
//! use http_body_util::{BodyExt, StreamBody};
//! use rebound_core::body::CloneableBody;
//! use rebound_core::replay::RecordingBody;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let chunks = stream::iter(["hello, ", "world"].map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s)))));
//! let kept = RecordingBody::new(StreamBody::new(chunks));
//!
//! // The retry layer asks for a copy before every attempt.
//! let first = kept.try_replay().expect("nothing read yet");
//! assert_eq!(first.collect().await?.to_bytes(), "hello, world");
//!
//! // The second attempt gets the same bytes, played back from the recording.
//! let second = kept.try_replay().expect("11 bytes is under the 64 KiB cap");
//! assert_eq!(second.collect().await?.to_bytes(), "hello, world");
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! All copies share one state: the real body, the recording (a list of
//! [`Bytes`] chunks and the trailers) and a counter of the chunks read so
//! far. Each copy only keeps its own position in that sequence. A copy first
//! plays back the recorded chunks it has not yielded yet, then reads the real
//! body where the recording ends (recording what it reads), then yields the
//! trailers. So:
//!
//! * A retry that starts **before** the first attempt read anything has
//!   nothing to play back and reads the real body itself: no chunk is sent
//!   twice (the bug of linkerd2 issue 15649 cannot happen, because a copy
//!   never replays what it just read).
//! * A copy dropped mid-stream leaves the recording behind; the next copy
//!   plays it back and then continues with the rest of the real body.
//! * Two copies alive at once (HTTP/2 may still be sending the previous
//!   attempt's body when the next one starts) both see the same sequence:
//!   whichever reads the real body records the chunk for the other, and
//!   wakes it.
//!
//! Chunks are kept as `Bytes` handles: recording a `Bytes` chunk and playing
//! it back is a reference-count increment, never a copy of the data (other
//! [`Buf`] types are turned into `Bytes` once, with
//! [`Buf::copy_to_bytes`]). Chunk boundaries and trailers are played back
//! exactly as they were read.
//!
//! # Framing
//!
//! Every copy *announces* what the real body announced when it was wrapped:
//! before a copy is polled, its `is_end_stream` is the real body's, and its
//! `size_hint` is exact only if the real body's was. A body of unknown
//! length is therefore sent the same way on every attempt (HTTP/1.1 chunked,
//! which is also the only way its trailers can travel), not chunked on the
//! first attempt and with a `Content-Length` on the next: the server sees
//! the same request each time, and request signatures over the framing
//! headers stay valid. Within those limits the hints are accurate for each
//! copy (the bytes it has yet to play back plus what the real body still
//! announces).
//!
//! # The cap
//!
//! Once more than [`max_bytes`](RecordingBody::with_max_bytes) bytes have been
//! read (default [64 KiB](RecordingBody::DEFAULT_MAX_BYTES)), the body is
//! **capped**: the recording is dropped (once no copy can still play it
//! back: see "Waiting for the rest of the body"), the copy that is reading
//! still streams the rest of the body through (the attempt in flight completes),
//! and [`try_replay`](CloneableBody::try_replay) returns `None` from then
//! on, so the request is not retried. A body that says up front (its
//! `size_hint` lower bound) that it is larger than the cap is capped from the
//! start and nothing is ever recorded. A body of exactly `max_bytes` bytes is
//! replayable. Only data counts; trailers are kept whatever their size.
//!
//! # Retries
//!
//! A retry asks for its copy with
//! [`try_replay_whole`](CloneableBody::try_replay_whole), which answers
//! only if the copy is **known to be sent whole**: the real body has ended
//! within the cap (everything is recorded), or no other copy is alive (the
//! new copy will read the rest of the real body itself, and a copy that
//! reads streams on past the cap), or the real body announces an upper
//! bound that keeps the total under the cap. Otherwise it answers `None`:
//! a server that answers early (a `503` after the first 4 KiB) while an
//! attempt still streams a body of unknown length leaves that attempt's
//! copy reading, and a retry copy made then would fail mid-stream, with a
//! truncated request on the wire, if the body later passed the cap.
//!
//! # Waiting for the rest of the body
//!
//! When the answer comes while the body is still streaming, the retry loop
//! keeps that answer (undrained) and, while it waits, reads the rest of
//! the body into the recording itself with
//! [`poll_buffer`](RecordingBody::poll_buffer) on the body it kept: once the
//! answer is in, the transport may stop polling the attempt's copy (HTTP/2
//! flow control, a connection the server stopped reading), so no one else
//! is sure to. The copy still sending plays back what the buffering read,
//! as from any other copy, so that attempt's request stays whole too.
//!
//! * The body **ends within the cap**: the retry goes ahead, once its
//!   backoff delay is over, with a copy played back from the recording.
//! * The body **passes the cap**: the buffering stops at the chunk that
//!   passed it (kept for the copy still sending, which then reads the rest
//!   itself), and the loop returns the answer at once, with
//!   [`RetryStop::NotReplayable`](crate::RetryStop::NotReplayable).
//! * The body **is still coming** when the delay is over: the loop waits on
//!   as long as the body keeps moving (a chunk at least every second), and
//!   never past the request's deadline; then it returns the answer, with
//!   `RetryStop::NotReplayable`. A body that waits for the response before
//!   it goes on (a bidirectional stream) therefore costs the caller at most
//!   one second more than the delay.
//!
//! Memory stays bounded by the cap (plus the one chunk that passed it), as
//! for any copy.
//!
//! # Errors
//!
//! A copy yields an [`Error`]:
//!
//! * of kind [`ErrorKind::Body`] when the real body fails while this copy
//!   reads it (an inner rebound [`Error`] is passed on unchanged); the body
//!   is not replayable after that;
//! * of kind [`ErrorKind::NotReplayable`] when it needs a chunk that is no
//!   longer recorded: another copy, alive at the same time, passed the cap or
//!   hit an error first.
//!
//! # Locking
//!
//! The shared state sits behind a `std::sync::Mutex`. Every critical section
//! is short and never waits: at most one non-blocking `poll_frame` of the
//! real body, and a few wakes. Contention only happens when two copies are
//! polled at the same time, which is rare.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::body::CloneableBody;
use crate::error::{BoxError, Error, ErrorKind};

/// A request body that records what it streams so that it can be sent again.
///
/// Create it with [`RecordingBody::new`] (64 KiB cap) or
/// [`RecordingBody::with_max_bytes`], keep it, and send the copies that
/// [`try_replay`](CloneableBody::try_replay) returns: one per attempt, the
/// first included. See the [module docs](self) for how it works.
///
/// Polled itself, the kept body behaves like any copy: it is a copy too. So
/// when `try_replay` already answers `None` before the first attempt (the
/// body announced more than the cap), send the kept body itself, once.
///
/// Wrap only streaming bodies: a body already in memory (`Full`, `Empty`,
/// `String`) is a [`CloneableBody`] by itself, with no cap and no lock.
pub struct RecordingBody<B> {
    shared: Arc<Mutex<Shared<B>>>,
    /// How many data chunks of the real body this copy has yielded.
    pos: usize,
    /// How many bytes this copy has yielded.
    sent: u64,
    /// Whether this copy has yielded its end (or an error).
    done: bool,
    /// Whether this copy may have left a waker among the waiters.
    registered: bool,
    /// Whether this copy has been polled.
    started: bool,
}

/// The old name of [`RecordingBody`].
#[deprecated(
    since = "0.1.0",
    note = "renamed `RecordingBody`: it records a streamed body so it can be sent again"
)]
pub type ReplayBody<B> = RecordingBody<B>;

struct Shared<B> {
    source: Source<B>,
    /// The recorded data chunks, while not capped: `chunks[i]` is chunk `i`.
    chunks: Vec<Bytes>,
    /// The trailers, once read.
    trailers: Option<HeaderMap>,
    /// Data chunks read from the real body so far (recorded or not).
    read_chunks: usize,
    /// Bytes read from the real body so far (recorded or not).
    read_bytes: u64,
    max_bytes: usize,
    capped: bool,
    /// Whether the real body announced its exact length when wrapped.
    announced_exact: bool,
    /// Whether the real body was already at its end when wrapped.
    announced_empty: bool,
    /// Copies waiting for the real body while another copy may be the one
    /// registered with it.
    waiters: Vec<Waker>,
}

enum Source<B> {
    /// The real body has more to give.
    Open(Pin<Box<B>>),
    /// The real body ended (after its last chunk or its trailers).
    Ended,
    /// The real body failed; what it did not give is lost.
    Failed,
}

impl<B: Body> RecordingBody<B> {
    /// The default cap: 64 KiB.
    pub const DEFAULT_MAX_BYTES: usize = 64 * 1024;

    /// Wrap `body`, recording up to [`DEFAULT_MAX_BYTES`](Self::DEFAULT_MAX_BYTES).
    pub fn new(body: B) -> Self {
        Self::with_max_bytes(body, Self::DEFAULT_MAX_BYTES)
    }

    /// Wrap `body`, recording up to `max_bytes` bytes; a body of more than
    /// `max_bytes` bytes is streamed once and is not replayable. Any value
    /// works: `0` makes only empty bodies replayable.
    pub fn with_max_bytes(body: B, max_bytes: usize) -> Self {
        let hint = body.size_hint();
        let capped = hint.lower() > max_bytes as u64;
        let announced_empty = body.is_end_stream();
        let source = if announced_empty {
            Source::Ended
        } else {
            Source::Open(Box::pin(body))
        };
        RecordingBody {
            shared: Arc::new(Mutex::new(Shared {
                source,
                chunks: Vec::new(),
                trailers: None,
                read_chunks: 0,
                read_bytes: 0,
                max_bytes,
                capped,
                announced_exact: hint.exact().is_some(),
                announced_empty,
                waiters: Vec::new(),
            })),
            pos: 0,
            sent: 0,
            done: false,
            registered: false,
            started: false,
        }
    }
}

impl<B> RecordingBody<B> {
    /// Whether the body passed its cap (or failed): it will not be replayed
    /// again, [`try_replay`](CloneableBody::try_replay) returns `None`.
    pub fn is_capped(&self) -> bool {
        let shared = lock(&self.shared);
        shared.capped || matches!(shared.source, Source::Failed)
    }

    /// The cap this body was created with.
    pub fn max_bytes(&self) -> usize {
        lock(&self.shared).max_bytes
    }
}

impl<B> RecordingBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// Read the real body into the recording, without yielding it, up to
    /// the cap: what the retry loop does while it waits for a body that an
    /// attempt was still sending when its answer came (see "Waiting for the
    /// rest of the body" in the [module docs](self)).
    ///
    /// * `Ready(Some(n))`: a chunk of `n` bytes was recorded; poll again.
    /// * `Ready(None)`: nothing more to read into the recording: the real
    ///   body ended (a copy made now is whole), or it passed the cap or
    ///   failed (no copy can be made; the chunks read are still played
    ///   back to a copy that was behind them, so the attempt sending the
    ///   body is not cut short).
    /// * `Pending`: waiting for the real body; `cx` is woken when it has
    ///   more (or when another copy read it).
    ///
    /// Every other copy plays back what this reads, as it would from any
    /// copy. This copy itself yields nothing of it: polled afterwards, it
    /// still starts from its own position.
    pub fn poll_buffer(&mut self, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        let mut guard = lock(&self.shared);
        let shared = &mut *guard;
        if shared.capped {
            return Poll::Ready(None);
        }
        let body = match &mut shared.source {
            Source::Open(body) => body,
            Source::Ended | Source::Failed => return Poll::Ready(None),
        };
        loop {
            let frame = match body.as_mut().poll_frame(cx) {
                Poll::Pending => {
                    shared.wait(cx.waker());
                    self.registered = true;
                    return Poll::Pending;
                }
                Poll::Ready(frame) => frame,
            };
            let out = match frame {
                None => {
                    shared.source = Source::Ended;
                    None
                }
                Some(Err(_)) => {
                    // The copy that sends the body learns of it as a
                    // `NotReplayable` error (what was lost is lost).
                    shared.source = Source::Failed;
                    shared.chunks = Vec::new();
                    None
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let chunk = data.copy_to_bytes(data.remaining());
                        if body.is_end_stream() {
                            shared.source = Source::Ended;
                        }
                        shared.record(&chunk, true);
                        (!shared.capped).then_some(chunk.len())
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => {
                            shared.trailers = Some(trailers);
                            shared.source = Source::Ended;
                            None
                        }
                        Err(_) => continue,
                    },
                },
            };
            shared.wake_others(cx.waker());
            return Poll::Ready(out);
        }
    }
}

fn lock<B>(shared: &Mutex<Shared<B>>) -> MutexGuard<'_, Shared<B>> {
    // A panic of the real body's `poll_frame` leaves our own state
    // consistent (it is updated only after the poll returns).
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B> Shared<B> {
    /// Count (and, within the cap, record) a chunk just read from the real
    /// body. `for_others`: the reader does not yield it itself (it is
    /// [buffering](RecordingBody::poll_buffer)), so the chunk that passes the
    /// cap is still recorded, with the rest of the recording, for the copy
    /// that will send it; a reader that yields its chunk drops the
    /// recording at once.
    fn record(&mut self, chunk: &Bytes, for_others: bool) {
        self.read_chunks += 1;
        self.read_bytes += chunk.len() as u64;
        if self.capped {
            // Past the cap every other copy is behind a chunk that was not
            // recorded: what is left of the recording serves no one.
            self.chunks = Vec::new();
            return;
        }
        if self.read_bytes > self.max_bytes as u64 {
            tracing::debug!(
                max_bytes = self.max_bytes,
                "request body passed the replay cap; it will not be replayed"
            );
            self.capped = true;
            if for_others {
                self.chunks.push(chunk.clone());
            } else {
                self.chunks = Vec::new();
            }
        } else {
            self.chunks.push(chunk.clone());
        }
    }

    /// Whether a copy at `pos` can still play back everything up to what
    /// has been read: the recording is complete that far.
    fn can_play_back(&self) -> bool {
        self.chunks.len() == self.read_chunks && !matches!(self.source, Source::Failed)
    }

    fn wait(&mut self, waker: &Waker) {
        if !self.waiters.iter().any(|w| w.will_wake(waker)) {
            self.waiters.push(waker.clone());
        }
    }

    /// Something happened to the real body: every other waiting copy may
    /// have something to do.
    fn wake_others(&mut self, me: &Waker) {
        for w in self.waiters.drain(..) {
            if !w.will_wake(me) {
                w.wake();
            }
        }
    }
}

fn capped_error() -> Error {
    Error::new(ErrorKind::NotReplayable)
        .with_detail("the request body passed the replay cap while this copy was behind")
}

fn failed_error() -> Error {
    Error::new(ErrorKind::NotReplayable)
        .with_detail("the request body failed while another copy read it")
}

fn body_error(err: impl Into<BoxError>) -> Error {
    match err.into().downcast::<Error>() {
        Ok(err) => *err,
        Err(other) => Error::new(ErrorKind::Body)
            .with_detail("reading the request body failed")
            .with_source(other),
    }
}

impl<B> Body for RecordingBody<B>
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
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        this.started = true;
        let mut guard = lock(&this.shared);
        let shared = &mut *guard;

        // Play back what this copy has not yielded yet.
        if this.pos < shared.read_chunks {
            // The recording is complete up to `read_chunks` unless the body
            // was capped or failed, which also dropped the recording.
            // (A body capped by buffering keeps its recording, the chunk
            // that passed the cap included, for the copy that sends it.)
            let chunk = match shared.chunks.get(this.pos) {
                Some(chunk) => chunk.clone(),
                _ => {
                    this.done = true;
                    let err = if shared.capped {
                        capped_error()
                    } else {
                        failed_error()
                    };
                    return Poll::Ready(Some(Err(err)));
                }
            };
            this.pos += 1;
            this.sent += chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }

        // Caught up with the real body.
        let body = match &mut shared.source {
            Source::Open(body) => body,
            Source::Ended => {
                this.done = true;
                return Poll::Ready(shared.trailers.clone().map(|t| Ok(Frame::trailers(t))));
            }
            Source::Failed => {
                this.done = true;
                return Poll::Ready(Some(Err(failed_error())));
            }
        };
        loop {
            let frame = match body.as_mut().poll_frame(cx) {
                Poll::Pending => {
                    shared.wait(cx.waker());
                    this.registered = true;
                    return Poll::Pending;
                }
                Poll::Ready(frame) => frame,
            };
            let out = match frame {
                None => {
                    shared.source = Source::Ended;
                    this.done = true;
                    None
                }
                Some(Err(err)) => {
                    shared.source = Source::Failed;
                    shared.chunks = Vec::new();
                    this.done = true;
                    Some(Err(body_error(err)))
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let chunk = data.copy_to_bytes(data.remaining());
                        let ended = body.is_end_stream();
                        shared.record(&chunk, false);
                        this.pos = shared.read_chunks;
                        this.sent = shared.read_bytes;
                        if ended {
                            // Drop the real body now: later copies need not
                            // poll it to learn that it ended.
                            shared.source = Source::Ended;
                        }
                        Some(Ok(Frame::data(chunk)))
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => {
                            // Trailers end the body. They are kept even when
                            // capped: a copy that is caught up needs them.
                            shared.trailers = Some(trailers.clone());
                            shared.source = Source::Ended;
                            this.done = true;
                            Some(Ok(Frame::trailers(trailers)))
                        }
                        // A kind of frame this version of http-body does not
                        // know: it cannot be sent on, skip it.
                        Err(_) => continue,
                    },
                },
            };
            shared.wake_others(cx.waker());
            return Poll::Ready(out);
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.done {
            return true;
        }
        let shared = lock(&self.shared);
        if !self.started {
            // Announce what the real body announced (see "Framing").
            return shared.announced_empty;
        }
        if self.pos < shared.read_chunks {
            return false;
        }
        match &shared.source {
            Source::Open(body) => body.is_end_stream(),
            Source::Ended => shared.trailers.is_none(),
            Source::Failed => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.done {
            return SizeHint::with_exact(0);
        }
        let shared = lock(&self.shared);
        // Bytes recorded but not yet yielded by this copy.
        let behind = if self.pos < shared.read_chunks {
            if !shared.can_play_back() {
                // This copy will fail: nothing more is known.
                return SizeHint::default();
            }
            shared.read_bytes - self.sent
        } else {
            0
        };
        let (lower, upper) = match &shared.source {
            Source::Open(body) => {
                let rest = body.size_hint();
                (
                    behind.saturating_add(rest.lower()),
                    rest.upper().map(|u| behind.saturating_add(u)),
                )
            }
            Source::Ended | Source::Failed => (behind, Some(behind)),
        };
        let mut hint = SizeHint::new();
        hint.set_lower(lower);
        match upper {
            // Never more exact than the real body was (see "Framing").
            Some(upper) if upper == lower && !shared.announced_exact => {}
            Some(upper) => hint.set_upper(upper),
            None => {}
        }
        hint
    }
}

impl<B> CloneableBody for RecordingBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    /// A new copy, from the start, unless the body passed its cap or failed.
    fn try_replay(&self) -> Option<Self> {
        let shared = lock(&self.shared);
        if shared.capped || matches!(shared.source, Source::Failed) {
            return None;
        }
        Some(self.copy())
    }

    /// A new copy, from the start, only if it is known to be sent whole
    /// (see "Retries" in the [module docs](self)).
    fn try_replay_whole(&self) -> Option<Self> {
        let shared = lock(&self.shared);
        if shared.capped {
            return None;
        }
        let whole = match &shared.source {
            Source::Ended => true,
            Source::Failed => false,
            Source::Open(body) => {
                // The new copy will be the only reader of the real body: a
                // reader streams the rest through even past the cap.
                // (`self` must not be reading either: not started, or done.)
                let idle = !self.started || self.done;
                let alone = idle && Arc::strong_count(&self.shared) == 1;
                // Or the rest is known to fit under the cap.
                let fits = body.size_hint().upper().is_some_and(|rest| {
                    shared.read_bytes.saturating_add(rest) <= shared.max_bytes as u64
                });
                alone || fits
            }
        };
        if !whole {
            tracing::debug!(
                read_bytes = shared.read_bytes,
                max_bytes = shared.max_bytes,
                "request body still streaming, of unknown length: not replayed"
            );
            return None;
        }
        Some(self.copy())
    }

    /// See [`RecordingBody::poll_buffer`].
    fn poll_buffer(&mut self, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        RecordingBody::poll_buffer(self, cx)
    }
}

impl<B> RecordingBody<B> {
    fn copy(&self) -> Self {
        RecordingBody {
            shared: Arc::clone(&self.shared),
            pos: 0,
            sent: 0,
            done: false,
            registered: false,
            started: false,
        }
    }
}

impl<B> Drop for RecordingBody<B> {
    fn drop(&mut self) {
        if self.registered {
            // This copy may be the one the real body would wake: hand the
            // wake-up to the others still waiting.
            let mut shared = lock(&self.shared);
            for w in shared.waiters.drain(..) {
                w.wake();
            }
        }
    }
}

impl<B> fmt::Debug for RecordingBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the data: only where this copy and the recording stand.
        let shared = lock(&self.shared);
        f.debug_struct("RecordingBody")
            .field("position", &self.pos)
            .field("sent_bytes", &self.sent)
            .field("read_bytes", &shared.read_bytes)
            .field("max_bytes", &shared.max_bytes)
            .field("capped", &shared.capped)
            .field(
                "source",
                &match shared.source {
                    Source::Open(_) => "open",
                    Source::Ended => "ended",
                    Source::Failed => "failed",
                },
            )
            .finish()
    }
}
