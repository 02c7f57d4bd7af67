//! The request body of the transport and the ready-made client.
//!
//! ```
//! use bytes::Bytes;
//! use rebound_core::body::CloneableBody;
//! use rebound_hyper::Body;
//!
//! // In-memory bodies replay for free (a reference count, not a copy).
//! let body = Body::from("{\"hello\":1}");
//! assert!(body.try_replay().is_some());
//! assert!(Body::empty().try_replay().is_some());
//!
//! // A streamed body replays once it is given a buffer cap: the ready-made
//! // client does that with its `replay_cap` (64 KiB by default).
//! let chunks = || futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from("a"))]);
//! assert!(Body::from_stream(chunks()).try_replay().is_none());
//! let body = Body::from_stream(chunks()).replay_cap(64 * 1024);
//! assert!(body.try_replay().is_some());
//! ```
//!
//! # Streamed bodies
//!
//! A streamed body is recorded while the first attempt sends it, by a
//! [`RecordingBody`], and played back byte for byte (data and trailers) to the
//! next attempts, as long as it stays within its cap. Past the cap the
//! recording is dropped, the attempt in flight still sends the whole body,
//! and the retry layer stops with
//! [`RetryStop::NotReplayable`](rebound_core::RetryStop::NotReplayable)
//! (verdict reason `body not replayable`).
//!
//! A server that answers before it read the whole body (a `503` after the
//! first KiB of an upload) leaves the rest of the stream unsent; the retry
//! layer reads it into the recording itself while it waits to retry
//! ([`CloneableBody::poll_buffer`]), within the cap and the deadline, and
//! retries with the whole body once the stream ended (see "Waiting for the
//! rest of the body" in [`rebound_core::replay`]). The cap is chosen when the body
//! is armed: by [`Body::replay_cap`], or by the ready-made client
//! ([`ClientBuilder::replay_cap`](crate::ClientBuilder::replay_cap))
//! for a body that was not armed yet.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use http_body::{Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use rebound_core::body::CloneableBody;
use rebound_core::replay::RecordingBody;
use rebound_core::BoxError;

/// A request body: empty, bytes already in memory, or a stream.
///
/// Empty and in-memory bodies can be sent again by the retry layer
/// ([`CloneableBody::try_replay`] is a reference-count increment and always
/// starts from the first byte). A streamed body can be sent again once it is
/// armed with a buffer cap ([`replay_cap`](Body::replay_cap); the ready-made
/// client arms every streamed body it sends) and as long as it has not
/// passed that cap; see the [module docs](self).
///
/// `Debug` shows the kind and length of a body, never its contents.
pub struct Body {
    kind: Kind,
}

enum Kind {
    Empty,
    Full {
        data: Bytes,
        sent: bool,
    },
    /// A stream not armed yet: sent once unless armed.
    Stream(UnsyncBoxBody<Bytes, BoxError>),
    /// A stream recorded for replay, up to its cap.
    Replay(RecordingBody<UnsyncBoxBody<Bytes, BoxError>>),
}

impl Body {
    /// An empty body.
    pub const fn empty() -> Self {
        Body { kind: Kind::Empty }
    }

    /// A body from bytes already in memory.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        if data.is_empty() {
            return Body::empty();
        }
        Body {
            kind: Kind::Full { data, sent: false },
        }
    }

    /// A body from any `http_body::Body` of `Bytes` (boxed; replayable once
    /// armed, see [`replay_cap`](Self::replay_cap)).
    pub fn wrap<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Body {
            kind: Kind::Stream(body.map_err(Into::into).boxed_unsync()),
        }
    }

    /// A body from a stream of byte chunks (boxed; replayable once armed,
    /// see [`replay_cap`](Self::replay_cap)).
    pub fn from_stream<S, E>(stream: S) -> Self
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        Body::wrap(StreamBody::new(
            stream.map_ok(Frame::data).map_err(Into::into),
        ))
    }

    /// Arm a streamed body for replay: record up to `max_bytes` bytes of it
    /// while it is sent, so that a retry can send it again (a body of exactly
    /// `max_bytes` bytes is replayable, one byte more is not). Empty,
    /// in-memory and already armed bodies are returned unchanged (an armed
    /// body keeps its first cap).
    pub fn replay_cap(self, max_bytes: usize) -> Self {
        match self.kind {
            Kind::Stream(body) => Body {
                kind: Kind::Replay(RecordingBody::with_max_bytes(body, max_bytes)),
            },
            kind => Body { kind },
        }
    }

    /// Whether this body can be sent again now: empty, in memory, or an
    /// armed stream that has not passed its cap nor failed.
    pub fn is_replayable(&self) -> bool {
        match &self.kind {
            Kind::Empty | Kind::Full { .. } => true,
            Kind::Stream(_) => false,
            Kind::Replay(body) => !body.is_capped(),
        }
    }

    /// The bytes of an in-memory body; `None` for a stream. Empty for an
    /// empty body.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.kind {
            Kind::Empty => Some(&[]),
            Kind::Full { data, .. } => Some(data),
            Kind::Stream(_) | Kind::Replay(_) => None,
        }
    }
}

impl Default for Body {
    fn default() -> Self {
        Body::empty()
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Empty => f.write_str("Body::Empty"),
            Kind::Full { data, .. } => write!(f, "Body::Full({} bytes)", data.len()),
            Kind::Stream(_) => f.write_str("Body::Stream"),
            Kind::Replay(body) => write!(
                f,
                "Body::Stream(replay cap {} bytes{})",
                body.max_bytes(),
                if body.is_capped() { ", capped" } else { "" }
            ),
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Full { data, sent } => {
                if *sent {
                    Poll::Ready(None)
                } else {
                    *sent = true;
                    Poll::Ready(Some(Ok(Frame::data(data.clone()))))
                }
            }
            Kind::Stream(body) => Pin::new(body).poll_frame(cx),
            Kind::Replay(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full { sent, .. } => *sent,
            Kind::Stream(body) => body.is_end_stream(),
            Kind::Replay(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Full { data, sent } => {
                SizeHint::with_exact(if *sent { 0 } else { data.len() as u64 })
            }
            Kind::Stream(body) => body.size_hint(),
            Kind::Replay(body) => body.size_hint(),
        }
    }
}

impl CloneableBody for Body {
    fn try_replay(&self) -> Option<Self> {
        match &self.kind {
            Kind::Empty => Some(Body::empty()),
            // Always from the first byte, even if this copy was sent already.
            Kind::Full { data, .. } => Some(Body {
                kind: Kind::Full {
                    data: data.clone(),
                    sent: false,
                },
            }),
            Kind::Stream(_) => None,
            Kind::Replay(body) => body.try_replay().map(|copy| Body {
                kind: Kind::Replay(copy),
            }),
        }
    }

    fn try_replay_whole(&self) -> Option<Self> {
        match &self.kind {
            Kind::Replay(body) => body.try_replay_whole().map(|copy| Body {
                kind: Kind::Replay(copy),
            }),
            _ => self.try_replay(),
        }
    }

    fn poll_buffer(&mut self, cx: &mut Context<'_>) -> Poll<Option<usize>> {
        match &mut self.kind {
            Kind::Replay(body) => body.poll_buffer(cx),
            _ => Poll::Ready(None),
        }
    }
}

impl From<Bytes> for Body {
    fn from(data: Bytes) -> Self {
        Body::full(data)
    }
}

impl From<Vec<u8>> for Body {
    fn from(data: Vec<u8>) -> Self {
        Body::full(data)
    }
}

impl From<String> for Body {
    fn from(data: String) -> Self {
        Body::full(data)
    }
}

impl From<&'static str> for Body {
    fn from(data: &'static str) -> Self {
        Body::full(Bytes::from_static(data.as_bytes()))
    }
}

impl From<&'static [u8]> for Body {
    fn from(data: &'static [u8]) -> Self {
        Body::full(Bytes::from_static(data))
    }
}

impl From<()> for Body {
    fn from((): ()) -> Self {
        Body::empty()
    }
}

impl From<Empty<Bytes>> for Body {
    fn from(_: Empty<Bytes>) -> Self {
        Body::empty()
    }
}

/// A tonic request body (feature `tonic`), so that a tonic client stub
/// (`MyServiceClient::new(client)`) can call through [`Client`](crate::Client):
/// boxed like [`Body::wrap`], replayable up to the client's replay cap.
#[cfg(feature = "tonic")]
impl From<tonic::body::Body> for Body {
    fn from(body: tonic::body::Body) -> Self {
        if http_body::Body::is_end_stream(&body) {
            return Body::empty();
        }
        Body::wrap(body)
    }
}

impl From<Full<Bytes>> for Body {
    fn from(full: Full<Bytes>) -> Self {
        // `Full` does not give its bytes back; read the single frame it holds
        // without a runtime (it is always ready).
        let mut full = full;
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match http_body::Body::poll_frame(Pin::new(&mut full), &mut cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Body::full(data),
                Err(_) => Body::empty(),
            },
            _ => Body::empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body::Body as _;

    use super::*;

    #[tokio::test]
    async fn full_replays_from_the_start_even_after_being_sent() {
        let body = Body::from("hello");
        assert_eq!(body.size_hint().exact(), Some(5));
        let copy = body.try_replay().unwrap();
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..], b"hello");
        let again = copy.collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"hello");

        // A copy taken after the original was polled still starts at 0.
        let mut body = Body::from(vec![1u8, 2, 3]);
        let _ = body.frame().await;
        assert!(body.is_end_stream());
        let copy = body.try_replay().unwrap();
        assert_eq!(&copy.collect().await.unwrap().to_bytes()[..], &[1, 2, 3]);
    }

    #[tokio::test]
    async fn conversions_and_debug() {
        assert!(Body::empty().is_end_stream());
        assert!(Body::from("").is_end_stream());
        let b = Body::from(Full::new(Bytes::from_static(b"xyz")));
        assert_eq!(b.as_bytes(), Some(&b"xyz"[..]));
        assert_eq!(format!("{b:?}"), "Body::Full(3 bytes)");
        let s = Body::from_stream(futures_util::stream::iter([
            Ok::<_, std::io::Error>(Bytes::from("a")),
            Ok(Bytes::from("b")),
        ]));
        assert!(!s.is_replayable());
        assert_eq!(format!("{s:?}"), "Body::Stream");
        assert_eq!(&s.collect().await.unwrap().to_bytes()[..], b"ab");
    }

    fn chunks(n: usize, size: usize) -> Body {
        Body::from_stream(futures_util::stream::iter(
            (0..n).map(move |i| Ok::<_, std::io::Error>(Bytes::from(vec![i as u8; size]))),
        ))
    }

    #[tokio::test]
    async fn armed_stream_replays_byte_identical_under_the_cap() {
        let kept = chunks(4, 1000).replay_cap(4000);
        assert!(kept.is_replayable());
        let first = kept.try_replay().unwrap();
        let a = first.collect().await.unwrap().to_bytes();
        let second = kept.try_replay().expect("4000 bytes is at the cap");
        let b = second.collect().await.unwrap().to_bytes();
        assert_eq!(a.len(), 4000);
        assert_eq!(a, b);
        assert!(format!("{kept:?}").starts_with("Body::Stream(replay cap 4000 bytes"));
    }

    #[tokio::test]
    async fn armed_stream_over_the_cap_is_sent_once_then_not_replayable() {
        let kept = chunks(4, 1000).replay_cap(3999);
        let first = kept.try_replay().unwrap();
        // The attempt in flight still sends everything.
        assert_eq!(first.collect().await.unwrap().to_bytes().len(), 4000);
        assert!(kept.try_replay().is_none());
        assert!(!kept.is_replayable());
        assert!(format!("{kept:?}").ends_with(", capped)"));
    }

    #[tokio::test]
    async fn trailers_replay_and_arming_twice_keeps_the_first_cap() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("abc"));
        let frames = futures_util::stream::iter([
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"data"))),
            Ok(Frame::trailers(trailers.clone())),
        ]);
        let kept = Body::wrap(StreamBody::new(frames))
            .replay_cap(16)
            .replay_cap(0);
        for _ in 0..2 {
            let got = kept.try_replay().unwrap().collect().await.unwrap();
            assert_eq!(got.trailers(), Some(&trailers));
            assert_eq!(&got.to_bytes()[..], b"data");
        }
        // In-memory bodies are unchanged by arming.
        assert_eq!(Body::from("x").replay_cap(0).as_bytes(), Some(&b"x"[..]));
    }
}
