//! The request body of the transport and the ready-made client.
//!
//! ```
//! use bytes::Bytes;
//! use rebound_core::body::ReplayableBody;
//! use rebound_hyper::Body;
//!
//! // In-memory bodies replay for free (a reference count, not a copy).
//! let body = Body::from("{\"hello\":1}");
//! assert!(body.try_replay().is_some());
//! assert!(Body::empty().try_replay().is_some());
//!
//! // A streamed body cannot be sent twice.
//! let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from("a"))]);
//! assert!(Body::from_stream(chunks).try_replay().is_none());
//! ```

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use http_body::{Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use rebound_core::body::ReplayableBody;
use rebound_core::BoxError;

/// A request body: empty, bytes already in memory, or a stream.
///
/// Empty and in-memory bodies can be sent again by the retry layer
/// ([`ReplayableBody::try_replay`] is a reference-count increment and always
/// starts from the first byte); a streamed body answers `None` (wrap it in a
/// buffering replay body to make it retryable).
///
/// `Debug` shows the kind and length of a body, never its contents.
pub struct Body {
    kind: Kind,
}

enum Kind {
    Empty,
    Full { data: Bytes, sent: bool },
    Stream(UnsyncBoxBody<Bytes, BoxError>),
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

    /// A body from any `http_body::Body` of `Bytes` (boxed; not replayable).
    pub fn wrap<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Body {
            kind: Kind::Stream(body.map_err(Into::into).boxed_unsync()),
        }
    }

    /// A body from a stream of byte chunks (boxed; not replayable).
    pub fn from_stream<S, E>(stream: S) -> Self
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        Body::wrap(StreamBody::new(
            stream.map_ok(Frame::data).map_err(Into::into),
        ))
    }

    /// Whether this body can be sent again (empty or in memory).
    pub fn is_replayable(&self) -> bool {
        !matches!(self.kind, Kind::Stream(_))
    }

    /// The bytes of an in-memory body; `None` for a stream. Empty for an
    /// empty body.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.kind {
            Kind::Empty => Some(&[]),
            Kind::Full { data, .. } => Some(data),
            Kind::Stream(_) => None,
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full { sent, .. } => *sent,
            Kind::Stream(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Full { data, sent } => {
                SizeHint::with_exact(if *sent { 0 } else { data.len() as u64 })
            }
            Kind::Stream(body) => body.size_hint(),
        }
    }
}

impl ReplayableBody for Body {
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
}
