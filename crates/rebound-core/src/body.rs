//! Request bodies that can be sent again.
//!
//! A retry needs the request body a second time. [`CloneableBody`] is how the
//! retry layer asks a body for a copy: bodies already in memory answer with
//! a clone — `Full<Bytes>` and `Empty` cheaply (a reference count, never a
//! copy of the bytes), `String` by copying it (prefer `Full<Bytes>` for large
//! bodies); a streamed body is replayable once wrapped in
//! [`RecordingBody`](crate::replay::RecordingBody), which records it up to a cap; a
//! body that cannot be replayed answers `None`, and the request is then not
//! retried.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{Empty, Full};
//! use rebound_core::body::CloneableBody;
//!
//! let body = Full::new(Bytes::from_static(b"hello"));
//! assert!(body.try_replay().is_some());
//! assert!(Empty::<Bytes>::new().try_replay().is_some());
//! ```

use std::task::{Context, Poll};

use http_body_util::{Empty, Full};

/// The old name of [`CloneableBody`] (renamed so that the three request-body
/// names — `CloneableBody`, [`RetryBody`], [`RecordingBody`](crate::replay::RecordingBody)
/// — no longer look alike). A re-export, so existing `impl ReplayableBody for`
/// blocks keep compiling.
#[doc(hidden)]
pub use self::CloneableBody as ReplayableBody;

/// A request body that may be able to produce a fresh copy of itself for
/// another attempt.
///
/// `try_replay` is called on the body **before** an attempt is sent, so the
/// copy starts from the beginning. Returning `None` means "cannot be sent
/// again": the retry layer then makes a single attempt and says why.
pub trait CloneableBody: http_body::Body + Sized {
    /// A copy of this body, from its start, for another attempt; `None` if
    /// this body cannot be replayed.
    fn try_replay(&self) -> Option<Self>;

    /// A copy for a **retry**, only if it is known to be sent whole, from
    /// its first byte to its last: `None` when a copy made now could still
    /// be cut short (e.g. a streamed body that another attempt is still
    /// reading and that may yet pass its replay cap).
    ///
    /// The retry layer asks this before every retry (and
    /// [`try_replay`](Self::try_replay) before the first attempt); on
    /// `None` it stops and returns the last real outcome instead of starting
    /// an attempt that might go on the wire truncated.
    ///
    /// The default is [`try_replay`](Self::try_replay): right for bodies
    /// in memory, whose copies are always whole.
    fn try_replay_whole(&self) -> Option<Self> {
        self.try_replay()
    }

    /// Read more of the body into its replay buffer, without sending it,
    /// so that a retry can be sent whole: what the retry layer does while
    /// it waits for a streamed body that an attempt was still sending when
    /// the answer came (see [`RecordingBody::poll_buffer`](crate::replay::RecordingBody::poll_buffer)).
    /// `Ready(Some(n))`: `n` more bytes are buffered, poll again;
    /// `Ready(None)`: nothing more to buffer (the body is whole, or can no
    /// longer be replayed); `Pending`: waiting for the body.
    ///
    /// Called on the body the retry layer keeps (the one
    /// [`try_replay`](Self::try_replay) was called on), never on a copy
    /// being sent. The default is `Ready(None)`: right for bodies in
    /// memory, which are whole already.
    fn poll_buffer(&mut self, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        let _ = cx;
        Poll::Ready(None)
    }
}

impl<D> CloneableBody for Full<D>
where
    D: bytes::Buf + Clone,
{
    fn try_replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D: bytes::Buf> CloneableBody for Empty<D> {
    fn try_replay(&self) -> Option<Self> {
        Some(Empty::new())
    }
}

impl CloneableBody for String {
    fn try_replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// A request body the [retry layer](crate::retry) can send again: what it
/// keeps between attempts, and how it makes each attempt's body from that.
///
/// Every [`CloneableBody`] is one (it keeps a copy of itself). With the
/// `tonic` feature so is `tonic::body::Body`, a stream behind a box: it is
/// recorded with a [`RecordingBody`](crate::replay::RecordingBody) (64 KiB cap)
/// while the first attempt streams it, and each attempt gets a
/// `tonic::body::Body` over a copy — so the retry layer stacks directly over
/// a `tonic::transport::Channel`, with no adapter. The recording, like the
/// box, is paid only by bodies that are not already replayable.
pub trait RetryBody: http_body::Body + Sized {
    /// What the retry loop keeps to make the next attempt's body.
    type Kept;

    /// Called once, before the first attempt, when a retry is possible:
    /// the body to send first, and what to keep for the next attempts
    /// (`None`: this body cannot be sent again).
    fn keep(self) -> (Self, Option<Self::Kept>);

    /// A body for a retry, from its start, only if it is known to be sent
    /// whole (see [`CloneableBody::try_replay_whole`]); `None` if it cannot
    /// be replayed (it streamed past its cap) or not yet known to be whole.
    fn replay(kept: &Self::Kept) -> Option<Self>;

    /// Whether a copy can still be made at all (within its cap), even if
    /// it is not yet known to be whole: the retry loop then waits for it.
    fn may_replay(kept: &Self::Kept) -> bool;

    /// Read more of the body into what is kept, while the retry loop waits
    /// for it to become whole (see [`CloneableBody::poll_buffer`]). The
    /// default is `Ready(None)`: nothing to read.
    fn poll_buffer(kept: &mut Self::Kept, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        let _ = (kept, cx);
        Poll::Ready(None)
    }
}

impl<B: CloneableBody> RetryBody for B {
    type Kept = B;

    fn keep(self) -> (Self, Option<Self::Kept>) {
        let copy = self.try_replay();
        (self, copy)
    }

    fn replay(kept: &Self::Kept) -> Option<Self> {
        kept.try_replay_whole()
    }

    fn may_replay(kept: &Self::Kept) -> bool {
        kept.try_replay().is_some()
    }

    fn poll_buffer(kept: &mut Self::Kept, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        kept.poll_buffer(cx)
    }
}

#[cfg(feature = "tonic")]
impl RetryBody for tonic::body::Body {
    type Kept = crate::replay::RecordingBody<tonic::body::Body>;

    fn keep(self) -> (Self, Option<Self::Kept>) {
        let kept = crate::replay::RecordingBody::new(self);
        match kept.try_replay() {
            Some(first) => (tonic::body::Body::new(first), Some(kept)),
            // Unreachable: nothing has been read yet.
            None => (tonic::body::Body::empty(), None),
        }
    }

    fn replay(kept: &Self::Kept) -> Option<Self> {
        kept.try_replay_whole().map(tonic::body::Body::new)
    }

    fn may_replay(kept: &Self::Kept) -> bool {
        kept.try_replay().is_some()
    }

    fn poll_buffer(kept: &mut Self::Kept, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        kept.poll_buffer(cx)
    }
}
