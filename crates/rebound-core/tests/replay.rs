//! `RecordingBody`: lazy recording, byte-identical replay, the cap, and copies
//! that start early, stop early or run at the same time.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full};
use rebound_core::body::CloneableBody;
use rebound_core::replay::RecordingBody;
use rebound_core::ErrorKind;
use tokio::sync::mpsc;
use tokio_test::task;

// ===== a streaming body the test feeds frame by frame =====

type Tx = mpsc::UnboundedSender<Result<Frame<Bytes>, io::Error>>;

struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Result<Frame<Bytes>, io::Error>>,
    /// Bytes still to come, when the body declares its exact length.
    left: Option<u64>,
}

fn channel() -> (Tx, ChannelBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, ChannelBody { rx, left: None })
}

fn channel_with_len(len: u64) -> (Tx, ChannelBody) {
    let (tx, mut body) = channel();
    body.left = Some(len);
    (tx, body)
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let frame = ready!(self.rx.poll_recv(cx));
        if let (Some(Ok(f)), Some(left)) = (&frame, &mut self.left) {
            if let Some(d) = f.data_ref() {
                *left -= d.len() as u64;
            }
        }
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> SizeHint {
        self.left
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

fn data(tx: &Tx, s: &'static str) {
    tx.send(Ok(Frame::data(Bytes::from_static(s.as_bytes()))))
        .unwrap();
}

fn trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t.insert("x-checksum", HeaderValue::from_static("abc"));
    t
}

/// Everything a body yields: its data chunks (boundaries kept) and trailers.
#[derive(Debug, PartialEq)]
struct Frames {
    chunks: Vec<Bytes>,
    trailers: Option<HeaderMap>,
}

async fn frames<B>(mut body: B) -> Result<Frames, B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut out = Frames {
        chunks: Vec::new(),
        trailers: None,
    };
    // Bounded: no test body yields more than 10,000 frames.
    for _ in 0..10_000 {
        let Some(frame) = body.frame().await else {
            assert!(body.is_end_stream(), "ended but is_end_stream() is false");
            return Ok(out);
        };
        let frame = frame?;
        assert!(out.trailers.is_none(), "a frame after the trailers");
        match frame.into_data() {
            Ok(d) => out.chunks.push(d),
            Err(f) => out.trailers = Some(f.into_trailers().unwrap()),
        }
    }
    panic!("body did not end");
}

fn chunks(list: &[&'static str]) -> Vec<Bytes> {
    list.iter()
        .map(|s| Bytes::from_static(s.as_bytes()))
        .collect()
}

type Polled<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

fn poll<B: Body + Unpin>(t: &mut task::Spawn<()>, body: &mut B) -> Polled<B> {
    t.enter(|cx, _| Pin::new(&mut *body).poll_frame(cx))
}

fn data_of<E: std::fmt::Debug>(p: Poll<Option<Result<Frame<Bytes>, E>>>) -> Bytes {
    match p {
        Poll::Ready(Some(Ok(f))) => f.into_data().expect("a data frame"),
        other => panic!("expected a data frame, got {other:?}"),
    }
}

// ===== linkerd2 issue 15649 =====

#[tokio::test]
async fn retry_before_first_attempt_polled_does_not_duplicate_first_chunk() {
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);

    // Attempt 1 is created and polled before any data exists.
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    assert!(poll(&mut ta, &mut a).is_pending());

    // It fails (e.g. REFUSED_STREAM) before reading anything: retry.
    let b = kept.try_replay().expect("nothing recorded, not capped");
    drop(a);

    data(&tx, "first");
    data(&tx, "second");
    drop(tx);
    let got = frames(b).await.unwrap();
    assert_eq!(got.chunks, chunks(&["first", "second"]));

    // And a third attempt gets exactly the same.
    let c = kept.try_replay().unwrap();
    assert_eq!(
        frames(c).await.unwrap().chunks,
        chunks(&["first", "second"])
    );
}

#[tokio::test]
async fn retry_before_first_attempt_ever_polled_does_not_duplicate_first_chunk() {
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);
    let a = kept.try_replay().unwrap();
    let b = kept.try_replay().unwrap();
    drop(a);
    data(&tx, "only");
    drop(tx);
    assert_eq!(frames(b).await.unwrap().chunks, chunks(&["only"]));
}

#[tokio::test]
async fn retry_while_first_chunk_is_buffered_but_the_rest_is_not() {
    // The retry starts after attempt 1 read one chunk: the new copy plays
    // that chunk back once, then reads the rest of the real body.
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "one");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "one");
    let mut b = kept.try_replay().unwrap();
    drop(a);
    let mut tb = task::spawn(());
    assert_eq!(data_of(poll(&mut tb, &mut b)), "one");
    assert!(poll(&mut tb, &mut b).is_pending());
    data(&tx, "two");
    assert!(tb.is_woken());
    assert_eq!(data_of(poll(&mut tb, &mut b)), "two");
    drop(tx);
    assert!(matches!(poll(&mut tb, &mut b), Poll::Ready(None)));
}

// ===== stopping early =====

#[tokio::test]
async fn copy_dropped_mid_stream_then_next_copy_gets_the_full_body() {
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "alpha-");
    data(&tx, "beta-");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "alpha-");
    drop(a); // the attempt failed after sending one chunk

    data(&tx, "gamma");
    tx.send(Ok(Frame::trailers(trailers()))).unwrap();
    drop(tx);
    let b = kept.try_replay().unwrap();
    let got = frames(b).await.unwrap();
    assert_eq!(got.chunks, chunks(&["alpha-", "beta-", "gamma"]));
    assert_eq!(got.trailers, Some(trailers()));

    let c = kept.try_replay().unwrap();
    assert_eq!(frames(c).await.unwrap(), got);
}

// ===== the cap =====

#[tokio::test]
async fn body_ending_exactly_at_the_cap_is_replayable() {
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 10);
    data(&tx, "0123");
    data(&tx, "456789");
    drop(tx);
    let a = frames(kept.try_replay().unwrap()).await.unwrap();
    assert_eq!(a.chunks, chunks(&["0123", "456789"]));
    assert!(!kept.is_capped());
    let b = frames(kept.try_replay().expect("10 bytes, cap 10"))
        .await
        .unwrap();
    assert_eq!(a, b);
}

#[tokio::test]
async fn body_one_byte_over_the_cap_streams_once_and_is_not_replayable() {
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 10);
    data(&tx, "0123");
    data(&tx, "4567890");
    data(&tx, "tail");
    tx.send(Ok(Frame::trailers(trailers()))).unwrap();
    drop(tx);
    // The attempt in flight completes: every byte and the trailers.
    let a = frames(kept.try_replay().unwrap()).await.unwrap();
    assert_eq!(a.chunks, chunks(&["0123", "4567890", "tail"]));
    assert_eq!(a.trailers, Some(trailers()));
    assert!(kept.is_capped());
    assert!(kept.try_replay().is_none());
}

#[tokio::test]
async fn cap_is_checked_as_the_body_streams() {
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 10);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "0123456789");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "0123456789");
    assert!(kept.try_replay().is_some(), "at the cap, not past it");
    data(&tx, "x");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "x");
    assert!(kept.try_replay().is_none(), "one byte past the cap");
}

#[tokio::test]
async fn copy_behind_when_another_copy_passes_the_cap_fails_not_replayable() {
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 8);
    let mut a = kept.try_replay().unwrap();
    let mut b = kept.try_replay().unwrap();
    let (mut ta, mut tb) = (task::spawn(()), task::spawn(()));
    data(&tx, "12345");
    data(&tx, "6789");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "12345");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "6789"); // capped now
    match poll(&mut tb, &mut b) {
        Poll::Ready(Some(Err(e))) => assert_eq!(e.kind(), ErrorKind::NotReplayable),
        other => panic!("expected not replayable, got {other:?}"),
    }
    assert!(matches!(poll(&mut tb, &mut b), Poll::Ready(None)));
    assert!(b.is_end_stream());
    // The copy that passed the cap carries on.
    data(&tx, "more");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "more");
}

#[tokio::test]
async fn body_declaring_more_than_the_cap_is_never_recorded() {
    let kept =
        RecordingBody::with_max_bytes(Full::new(Bytes::from_static(b"twenty bytes of data")), 10);
    assert!(kept.is_capped());
    assert!(kept.try_replay().is_none());
    // The kept body itself is sent once, whole.
    assert_eq!(
        frames(kept).await.unwrap().chunks,
        chunks(&["twenty bytes of data"])
    );
}

#[tokio::test]
async fn replayable_exactly_up_to_the_cap_for_many_sizes_and_chunkings() {
    // Bounded: 3 chunk sizes x 21 lengths.
    for chunk in [1usize, 3, 7] {
        for len in 0..=20usize {
            let payload: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let (tx, inner) = channel();
            for part in payload.chunks(chunk) {
                tx.send(Ok(Frame::data(Bytes::copy_from_slice(part))))
                    .unwrap();
            }
            drop(tx);
            let kept = RecordingBody::with_max_bytes(inner, 10);
            let first = frames(kept.try_replay().unwrap()).await.unwrap();
            assert_eq!(first.chunks.concat(), payload, "chunk {chunk} len {len}");
            match kept.try_replay() {
                Some(copy) => {
                    assert!(len <= 10, "chunk {chunk} len {len} replayable past the cap");
                    assert_eq!(frames(copy).await.unwrap(), first);
                }
                None => assert!(len > 10, "chunk {chunk} len {len} not replayable"),
            }
        }
    }
}

// ===== trailers and empty bodies =====

#[tokio::test]
async fn trailers_are_replayed() {
    let (tx, inner) = channel();
    data(&tx, "payload");
    tx.send(Ok(Frame::trailers(trailers()))).unwrap();
    drop(tx);
    let kept = RecordingBody::new(inner);
    let a = frames(kept.try_replay().unwrap()).await.unwrap();
    assert_eq!(a.trailers, Some(trailers()));
    for _ in 0..3 {
        let copy = kept.try_replay().unwrap();
        assert!(!copy.is_end_stream());
        assert_eq!(frames(copy).await.unwrap(), a);
    }
}

#[tokio::test]
async fn trailers_only_body_is_replayed() {
    let (tx, inner) = channel();
    tx.send(Ok(Frame::trailers(trailers()))).unwrap();
    drop(tx);
    let kept = RecordingBody::new(inner);
    for _ in 0..2 {
        let got = frames(kept.try_replay().unwrap()).await.unwrap();
        assert!(got.chunks.is_empty());
        assert_eq!(got.trailers, Some(trailers()));
    }
}

#[tokio::test]
async fn empty_body_is_replayable_and_ends_at_once() {
    let kept = RecordingBody::new(Empty::<Bytes>::new());
    for _ in 0..3 {
        let copy = kept.try_replay().unwrap();
        assert!(copy.is_end_stream());
        assert_eq!(copy.size_hint().exact(), Some(0));
        let got = frames(copy).await.unwrap();
        assert!(got.chunks.is_empty() && got.trailers.is_none());
    }

    // A streaming body that turns out to be empty.
    let (tx, inner) = channel();
    drop(tx);
    let kept = RecordingBody::new(inner);
    let a = kept.try_replay().unwrap();
    assert!(!a.is_end_stream(), "not known before it is polled");
    assert_eq!(frames(a).await.unwrap().chunks, Vec::<Bytes>::new());
    let b = kept.try_replay().unwrap();
    assert!(
        !b.is_end_stream(),
        "announced like the real body: not known empty"
    );
    assert_eq!(b.size_hint().exact(), None);
    assert_eq!(frames(b).await.unwrap().chunks, Vec::<Bytes>::new());
}

// ===== size_hint and is_end_stream =====

#[tokio::test]
async fn size_hint_and_end_of_stream_are_right_for_every_copy() {
    let (tx, inner) = channel_with_len(9);
    let kept = RecordingBody::new(inner);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    assert_eq!(a.size_hint().exact(), Some(9));
    data(&tx, "abcd");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "abcd");
    assert_eq!(a.size_hint().exact(), Some(5));
    assert!(!a.is_end_stream());
    drop(a);

    // A new copy: 4 recorded bytes to play back + 5 still in the real body.
    let mut b = kept.try_replay().unwrap();
    let mut tb = task::spawn(());
    assert_eq!(b.size_hint().exact(), Some(9));
    assert_eq!(data_of(poll(&mut tb, &mut b)), "abcd");
    assert_eq!(b.size_hint().exact(), Some(5));
    data(&tx, "efghi");
    assert_eq!(data_of(poll(&mut tb, &mut b)), "efghi");
    assert_eq!(b.size_hint().exact(), Some(0));
    drop(tx);
    assert!(matches!(poll(&mut tb, &mut b), Poll::Ready(None)));
    assert!(b.is_end_stream());
    assert_eq!(b.size_hint().exact(), Some(0));

    // After the end, copies know everything exactly.
    let c = kept.try_replay().unwrap();
    assert_eq!(c.size_hint().exact(), Some(9));
    assert!(!c.is_end_stream());
    assert_eq!(frames(c).await.unwrap().chunks, chunks(&["abcd", "efghi"]));
}

#[tokio::test]
async fn unknown_length_stays_unknown_until_the_end() {
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "xyz");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "xyz");
    let b = kept.try_replay().unwrap();
    assert_eq!(b.size_hint().lower(), 3);
    assert_eq!(b.size_hint().upper(), None);
    drop(tx);
    assert!(matches!(poll(&mut ta, &mut a), Poll::Ready(None)));
    // All is known now, but the copy announces what the real body did: an
    // unknown length (so it is framed the same way as the first attempt).
    assert_eq!(b.size_hint().lower(), 3);
    assert_eq!(b.size_hint().exact(), None);
    assert!(!b.is_end_stream());
    assert_eq!(frames(b).await.unwrap().chunks, chunks(&["xyz"]));
}

// ===== in-memory bodies =====

#[tokio::test]
async fn in_memory_body_is_replayed_without_copying() {
    let payload = Bytes::from(vec![7u8; 4096]);
    let kept = RecordingBody::new(Full::new(payload.clone()));
    for _ in 0..3 {
        let copy = kept.try_replay().unwrap();
        assert_eq!(copy.size_hint().exact(), Some(4096));
        let got = frames(copy).await.unwrap();
        assert_eq!(got.chunks.len(), 1);
        // The same allocation: a reference count, not a copy.
        assert_eq!(got.chunks[0].as_ptr(), payload.as_ptr());
    }
}

// ===== copies alive at the same time =====

#[tokio::test]
async fn two_copies_alive_at_once_both_get_every_chunk_and_are_woken() {
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);
    let mut a = kept.try_replay().unwrap();
    let mut b = kept.try_replay().unwrap();
    let (mut ta, mut tb) = (task::spawn(()), task::spawn(()));
    assert!(poll(&mut ta, &mut a).is_pending());
    assert!(poll(&mut tb, &mut b).is_pending()); // b is now the one registered
    data(&tx, "x");
    assert!(tb.is_woken());
    assert_eq!(data_of(poll(&mut tb, &mut b)), "x");
    assert!(ta.is_woken(), "a must be woken when b reads for it");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "x");

    // Both wait again; the one registered with the real body goes away.
    assert!(poll(&mut ta, &mut a).is_pending());
    assert!(poll(&mut tb, &mut b).is_pending());
    drop(b);
    assert!(ta.is_woken(), "a must take over when b is dropped");
    assert!(poll(&mut ta, &mut a).is_pending());
    data(&tx, "y");
    assert!(ta.is_woken());
    assert_eq!(data_of(poll(&mut ta, &mut a)), "y");
}

// ===== errors =====

#[tokio::test]
async fn a_failing_body_gives_a_body_error_and_is_not_replayed() {
    let (tx, inner) = channel();
    let kept = RecordingBody::new(inner);
    let mut b = kept.try_replay().unwrap();
    let mut a = kept.try_replay().unwrap();
    let (mut ta, mut tb) = (task::spawn(()), task::spawn(()));
    data(&tx, "part");
    tx.send(Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset")))
        .unwrap();
    assert_eq!(data_of(poll(&mut ta, &mut a)), "part");
    match poll(&mut ta, &mut a) {
        Poll::Ready(Some(Err(e))) => {
            assert_eq!(e.kind(), ErrorKind::Body);
            assert!(e.find_source::<io::Error>().is_some());
        }
        other => panic!("expected a body error, got {other:?}"),
    }
    assert!(kept.is_capped());
    assert!(kept.try_replay().is_none());
    // A copy alive at the same time cannot finish either: it fails at once
    // rather than send a part of the body it cannot complete.
    match poll(&mut tb, &mut b) {
        Poll::Ready(Some(Err(e))) => assert_eq!(e.kind(), ErrorKind::NotReplayable),
        other => panic!("expected not replayable, got {other:?}"),
    }
}

#[tokio::test]
async fn debug_shows_no_data() {
    let kept = RecordingBody::new(Full::new(Bytes::from_static(b"secret-token")));
    let copy = kept.try_replay().unwrap();
    let _ = frames(copy).await.unwrap();
    let shown = format!("{kept:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(shown.contains("read_bytes: 12"), "{shown}");
}

#[test]
fn replay_body_is_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<RecordingBody<ChannelBody>>();
}

#[tokio::test]
async fn copies_announce_the_framing_of_the_real_body() {
    // Unknown length with trailers, fully recorded: a copy must not claim an
    // exact length, or HTTP/1.1 would send it with Content-Length, where
    // trailers cannot travel, instead of chunked like the first attempt.
    let (tx, inner) = channel();
    data(&tx, "abc");
    tx.send(Ok(Frame::trailers(trailers()))).unwrap();
    drop(tx);
    let kept = RecordingBody::new(inner);
    let first = frames(kept.try_replay().unwrap()).await.unwrap();
    let copy = kept.try_replay().unwrap();
    assert_eq!(copy.size_hint().exact(), None);
    assert_eq!(copy.size_hint().lower(), 3);
    assert!(!copy.is_end_stream());
    assert_eq!(frames(copy).await.unwrap(), first);

    // Known length: every copy says it exactly.
    let (tx, inner) = channel_with_len(3);
    data(&tx, "abc");
    drop(tx);
    let kept = RecordingBody::new(inner);
    let _ = frames(kept.try_replay().unwrap()).await.unwrap();
    assert_eq!(kept.try_replay().unwrap().size_hint().exact(), Some(3));
}

// ===== retries: a copy only if it is known to be sent whole (issue 10) =====

#[tokio::test]
async fn no_whole_copy_while_another_copy_still_reads_a_body_of_unknown_length() {
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 10);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "1234");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "1234");
    // The server answered already; `a` is still being sent. A retry copy
    // made now could be cut short if the body then passes the cap.
    assert!(kept.try_replay_whole().is_none());
    // (A plain copy is still possible: that is what a caller who accepts
    // the risk would ask for.)
    assert!(kept.try_replay().is_some());

    // That is what would happen: `a` reads past the cap, a copy behind it
    // cannot finish.
    let mut b = kept.try_replay().unwrap();
    let mut tb = task::spawn(());
    assert_eq!(data_of(poll(&mut tb, &mut b)), "1234");
    data(&tx, "5678901");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "5678901");
    match poll(&mut tb, &mut b) {
        Poll::Ready(Some(Err(e))) => assert_eq!(e.kind(), ErrorKind::NotReplayable),
        other => panic!("expected the copy behind to fail, got {other:?}"),
    }
}

#[tokio::test]
async fn a_whole_copy_once_the_body_ended_or_when_no_other_copy_reads() {
    // Ended within the cap: everything is recorded.
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 10);
    let a = kept.try_replay().unwrap();
    data(&tx, "1234");
    drop(tx);
    let a_frames = frames(a).await.unwrap();
    let b = kept.try_replay_whole().expect("ended within the cap");
    assert_eq!(frames(b).await.unwrap(), a_frames);

    // Mid-stream, but the copy that read is gone: the new copy reads the
    // rest itself, and a reader streams on even past the cap.
    let (tx, inner) = channel();
    let kept = RecordingBody::with_max_bytes(inner, 10);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "1234");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "1234");
    drop(a);
    let b = kept.try_replay_whole().expect("no other copy reads");
    data(&tx, "5678901");
    data(&tx, "more");
    drop(tx);
    let got = frames(b).await.unwrap();
    assert_eq!(got.chunks, chunks(&["1234", "5678901", "more"]));
    // Past the cap now: no third attempt.
    assert!(kept.try_replay_whole().is_none());
    assert!(kept.try_replay().is_none());
}

#[tokio::test]
async fn a_whole_copy_while_another_reads_when_the_rest_is_known_to_fit() {
    let (tx, inner) = channel_with_len(8);
    let kept = RecordingBody::with_max_bytes(inner, 10);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "1234");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "1234");
    let b = kept
        .try_replay_whole()
        .expect("4 + 4 announced bytes fit in 10");
    data(&tx, "5678");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "5678");
    drop(tx);
    assert_eq!(frames(b).await.unwrap().chunks, chunks(&["1234", "5678"]));

    // 10 read + 10 still announced = 20, under a cap of 30: fits too.
    let (tx, inner) = channel_with_len(20);
    let kept = RecordingBody::with_max_bytes(inner, 30);
    let mut a = kept.try_replay().unwrap();
    let mut ta = task::spawn(());
    data(&tx, "1234567890");
    assert_eq!(data_of(poll(&mut ta, &mut a)), "1234567890");
    assert!(kept.try_replay_whole().is_some());
}

#[tokio::test]
async fn in_memory_bodies_are_always_whole() {
    let full = Full::new(Bytes::from_static(b"abc"));
    assert!(full.try_replay_whole().is_some());
    assert!(Empty::<Bytes>::new().try_replay_whole().is_some());
}

// ===== the retry loop with a body still streaming (issue 10) =====

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rest {
    /// The rest arrives during the backoff delay, within the cap.
    EndsInTime,
    /// The rest arrives during the delay and passes the cap.
    PassesTheCap,
    /// The rest arrives after the delay, the body idle less than the
    /// loop's 1 s idle bound (issue 18: now retried whole).
    AfterTheDelay,
    /// The rest arrives after the body was idle for longer than the bound.
    Stalled,
    /// The rest arrives after the request's deadline.
    PastTheDeadline,
}

#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_a_body_still_streaming_while_it_moves_then_decides() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use rebound_core::{
        Attempts, Backoff, BackoffLayer, ClassifyLayer, HttpClassifier, Jitter, RetryLayer,
        RetryPolicy, RetryStop,
    };
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    for rest in [
        Rest::EndsInTime,
        Rest::PassesTheCap,
        Rest::AfterTheDelay,
        Rest::Stalled,
        Rest::PastTheDeadline,
    ] {
        let (tx, inner) = channel();
        let calls = Arc::new(AtomicUsize::new(0));
        let retried_body: Arc<Mutex<Option<Bytes>>> = Arc::default();
        let svc = {
            let calls = calls.clone();
            let retried_body = retried_body.clone();
            service_fn(move |req: Request<RecordingBody<ChannelBody>>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let retried_body = retried_body.clone();
                async move {
                    let mut body = req.into_body();
                    let status = if n == 0 {
                        // Answer 503 after the first chunk; the transport
                        // goes on sending the rest, in the background.
                        let _ = body.frame().await;
                        tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        let all = body.collect().await.map(|c| c.to_bytes());
                        *retried_body.lock().unwrap() = all.ok();
                        StatusCode::CREATED
                    };
                    let mut res = Response::new(Empty::<Bytes>::new());
                    *res.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(res)
                }
            })
        };
        let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_millis(100))
            .jitter(Jitter::Proportional(0.0));
        let stack = ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
            .layer(BackoffLayer::new(backoff))
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(svc);

        data(&tx, "1234");
        tokio::spawn(async move {
            let (after, more) = match rest {
                Rest::EndsInTime => (50, "5678"),
                Rest::PassesTheCap => (50, "567890123"),
                Rest::AfterTheDelay | Rest::PastTheDeadline => (500, "5678"),
                Rest::Stalled => (3_000, "5678"),
            };
            tokio::time::sleep(Duration::from_millis(after)).await;
            let _ = tx.send(Ok(Frame::data(Bytes::from_static(more.as_bytes()))));
        });
        let mut req = Request::post("http://api.example/v1/upload")
            .header("idempotency-key", "k-1")
            .body(RecordingBody::with_max_bytes(inner, 10))
            .unwrap();
        let start = tokio::time::Instant::now();
        if rest == Rest::PastTheDeadline {
            req.extensions_mut()
                .insert(rebound_core::Deadline(start + Duration::from_millis(300)));
        }
        let res = stack.oneshot(req).await.unwrap();
        let took = start.elapsed();
        match rest {
            Rest::EndsInTime | Rest::AfterTheDelay => {
                assert_eq!(res.status(), StatusCode::CREATED, "{rest:?}");
                assert_eq!(Attempts::of(res.extensions()), 2);
                assert_eq!(
                    retried_body.lock().unwrap().as_deref(),
                    Some(&b"12345678"[..]),
                    "the retry sent the whole body"
                );
            }
            Rest::PassesTheCap | Rest::Stalled | Rest::PastTheDeadline => {
                assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{rest:?}");
                // Given up on as soon as it was known: the cap passed (at
                // 50 ms), the body idle for 1 s, the deadline (300 ms).
                let (at_least, under) = match rest {
                    Rest::PassesTheCap => (50, 100),
                    Rest::Stalled => (1_000, 3_000),
                    _ => (300, 500),
                };
                assert!(
                    took >= Duration::from_millis(at_least) && took < Duration::from_millis(under),
                    "{rest:?}: {took:?}"
                );
                assert_eq!(
                    res.extensions().get::<RetryStop>(),
                    Some(&RetryStop::NotReplayable),
                    "{rest:?}"
                );
                assert_eq!(
                    calls.load(Ordering::SeqCst),
                    1,
                    "{rest:?}: no retry started"
                );
            }
        }
    }
}

// ===== buffering while the retry loop waits (issue 18) =====

#[tokio::test]
async fn buffering_reads_ahead_of_the_copy_sending_and_makes_a_whole_copy() {
    let (tx, inner) = channel();
    let mut kept = RecordingBody::with_max_bytes(inner, 16);
    let mut sending = kept.try_replay().unwrap();
    let mut t = task::spawn(());
    let mut filler = task::spawn(());

    data(&tx, "aaaa");
    assert_eq!(data_of(poll(&mut t, &mut sending)), "aaaa");
    // The copy sending stops being polled (its answer came); the loop
    // reads the rest into the buffer.
    assert!(poll(&mut t, &mut sending).is_pending());
    assert!(filler.enter(|cx, _| kept.poll_buffer(cx)).is_pending());
    assert!(kept.try_replay_whole().is_none(), "still streaming");
    data(&tx, "bbbb");
    assert!(filler.is_woken());
    assert_eq!(
        filler.enter(|cx, _| kept.poll_buffer(cx)),
        Poll::Ready(Some(4))
    );
    assert!(t.is_woken(), "the copy behind is told");
    drop(tx);
    assert_eq!(
        filler.enter(|cx, _| kept.poll_buffer(cx)),
        Poll::Ready(None)
    );

    // Whole now: the retry's copy has every byte, and so does the copy
    // that was sending, which plays back what the buffering read.
    let retry = kept.try_replay_whole().expect("ended within the cap");
    assert_eq!(
        frames(retry).await.unwrap().chunks,
        chunks(&["aaaa", "bbbb"])
    );
    assert_eq!(frames(sending).await.unwrap().chunks, chunks(&["bbbb"]));
}

#[tokio::test]
async fn buffering_past_the_cap_stops_and_the_copy_sending_still_sends_it_all() {
    let (tx, inner) = channel();
    let mut kept = RecordingBody::with_max_bytes(inner, 6);
    let mut sending = kept.try_replay().unwrap();
    let mut t = task::spawn(());
    let mut filler = task::spawn(());

    data(&tx, "aaaa");
    assert_eq!(data_of(poll(&mut t, &mut sending)), "aaaa");
    data(&tx, "bbbb"); // 8 bytes: past the cap of 6
    data(&tx, "cccc");
    assert_eq!(
        filler.enter(|cx, _| kept.poll_buffer(cx)),
        Poll::Ready(None)
    );
    assert!(kept.is_capped());
    assert!(kept.try_replay_whole().is_none());
    assert!(kept.try_replay().is_none());
    // Buffering stopped at the chunk that passed the cap; nothing more is
    // read into a buffer that is no use.
    assert_eq!(
        filler.enter(|cx, _| kept.poll_buffer(cx)),
        Poll::Ready(None)
    );
    drop(kept);
    drop(tx);
    // The copy sending plays back the chunk the buffering read, then reads
    // the rest itself: nothing is lost, nothing is sent twice.
    assert_eq!(
        frames(sending).await.unwrap().chunks,
        chunks(&["bbbb", "cccc"])
    );
}

#[tokio::test]
async fn a_kept_body_dropped_while_buffering_hands_the_wake_up_to_the_copy_sending() {
    let (tx, inner) = channel();
    let mut kept = RecordingBody::with_max_bytes(inner, 16);
    let mut sending = kept.try_replay().unwrap();
    let mut t = task::spawn(());
    let mut filler = task::spawn(());
    assert!(poll(&mut t, &mut sending).is_pending());
    // The buffering polls last: the real body would wake it, not the copy.
    assert!(filler.enter(|cx, _| kept.poll_buffer(cx)).is_pending());
    drop(kept);
    assert!(t.is_woken(), "the copy sending polls the real body again");
    data(&tx, "aaaa");
    assert_eq!(data_of(poll(&mut t, &mut sending)), "aaaa");
}
