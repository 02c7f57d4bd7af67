//! The script vocabulary: what the server does with a request ([`Action`])
//! and with a freshly accepted connection ([`ConnectionAction`]).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

/// What the [`FaultServer`](super::FaultServer) does with one request, once
/// it has read the request completely (head and body) and recorded it (or,
/// with [`after_body_bytes`](Action::after_body_bytes), once it has read
/// the first bytes of the body).
///
/// Start from a constructor ([`status`](Action::status),
/// [`never_respond`](Action::never_respond), [`close`](Action::close),
/// [`reset`](Action::reset), [`reset_mid_headers`](Action::reset_mid_headers),
/// [`stall_body`](Action::stall_body)) and refine it with the builder
/// methods. The methods that shape a response (`header`, `body`, `chunked`,
/// `trickle`, `stall_after`, ...) have no effect on actions that send no
/// response.
///
/// ```
/// use std::time::Duration;
/// use rebound_test::fault::Action;
///
/// // A 503 that asks the client to come back in one second.
/// let busy = Action::status(503).header("retry-after", "1");
/// // A 1 MiB body, generated on the fly, trickled at 64 KiB/s.
/// let slow = Action::status(200).body_len(1 << 20).trickle(64 * 1024);
/// // Head and 100 bytes of a 1000-byte body, then a TCP reset.
/// let cut = Action::status(200).body_len(1000).reset_after(100);
/// // 200 after 5 ms, unless more than 10 requests are in flight: then 429.
/// let adaptive = Action::status(200).delay(Duration::from_millis(5)).reject_above(10);
/// # let _ = (busy, slow, cut, adaptive);
/// ```
#[derive(Clone, Debug)]
pub struct Action {
    pub(crate) kind: Kind,
    pub(crate) delay: Duration,
    pub(crate) reject_above: Option<usize>,
    /// Act after this many request body bytes instead of after the whole
    /// body (HTTP/1.1 only).
    pub(crate) early: Option<u64>,
}

#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Respond(Reply),
    NeverRespond,
    Close,
    Reset,
    ResetMidHeaders,
}

/// A response as the script describes it.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: BodySource,
    pub(crate) chunked: bool,
    /// Bytes per second, `None` for as fast as the socket takes them.
    pub(crate) rate: Option<u64>,
    pub(crate) end: End,
}

#[derive(Clone, Debug)]
pub(crate) enum BodySource {
    Bytes(Bytes),
    /// `len` filler bytes generated on the fly.
    Filler(u64),
}

impl BodySource {
    pub(crate) fn len(&self) -> u64 {
        match self {
            BodySource::Bytes(b) => b.len() as u64,
            BodySource::Filler(n) => *n,
        }
    }
}

/// How the body ends, after how many body bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Complete,
    Stall(u64),
    Truncate(u64),
    Reset(u64),
}

impl Action {
    fn new(kind: Kind) -> Self {
        Action {
            kind,
            delay: Duration::ZERO,
            reject_above: None,
            early: None,
        }
    }

    /// Respond with this status, no extra header and an empty body
    /// (`content-length: 0`).
    ///
    /// # Panics
    ///
    /// If `code` is not a valid HTTP status code (100..=999).
    pub fn status(code: u16) -> Self {
        let status = StatusCode::from_u16(code)
            .unwrap_or_else(|_| panic!("Action::status: {code} is not a valid HTTP status code"));
        Action::new(Kind::Respond(Reply {
            status,
            headers: Vec::new(),
            body: BodySource::Bytes(Bytes::new()),
            chunked: false,
            rate: None,
            end: End::Complete,
        }))
    }

    /// Read the request, then never answer. The connection stays open until
    /// the client closes it or the server is dropped.
    pub fn never_respond() -> Self {
        Action::new(Kind::NeverRespond)
    }

    /// Read the request, then close the connection cleanly (TCP FIN, and a
    /// TLS `close_notify` on TLS) without sending a byte of response.
    ///
    /// On HTTP/2 the stream is reset instead.
    pub fn close() -> Self {
        Action::new(Kind::Close)
    }

    /// Read the request, then reset the connection (`SO_LINGER` 0 and
    /// close: the client sees `ECONNRESET`) without sending a byte of
    /// response.
    ///
    /// On HTTP/2 the stream is reset instead.
    pub fn reset() -> Self {
        Action::new(Kind::Reset)
    }

    /// Read the request, send the first bytes of a response head
    /// (`HTTP/1.1 200 OK` and part of a header line), then reset the
    /// connection (`SO_LINGER` 0).
    ///
    /// On HTTP/2 the stream is reset instead.
    pub fn reset_mid_headers() -> Self {
        Action::new(Kind::ResetMidHeaders)
    }

    /// Send a `200` head announcing a 1 KiB body (`content-length: 1024`),
    /// then no body byte, ever: shorthand for
    /// `Action::status(200).body_len(1024).stall_after(0)`.
    pub fn stall_body() -> Self {
        Action::status(200).body_len(1024).stall_after(0)
    }

    /// Wait `delay` after reading the request before acting (for a response:
    /// before sending its head). Default: no delay.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Answer `429 Too Many Requests` at once (no delay, empty body) when
    /// more than `max_in_flight` requests, this one included, are in flight
    /// at the server when this request has been read; otherwise act as
    /// scripted. See [`FaultServer::in_flight`](super::FaultServer::in_flight)
    /// for what counts as in flight.
    ///
    /// This makes an upstream with a hidden concurrency limit, for load
    /// tests of adaptive limits. Default: never rejects.
    pub fn reject_above(mut self, max_in_flight: usize) -> Self {
        self.reject_above = Some(max_in_flight);
        self
    }

    /// Act (respond, close, reset, ...) as soon as the first `bytes` bytes
    /// of the request body have been read (or the whole body, if it is
    /// shorter), without waiting for the rest: a server that answers early,
    /// e.g. a `503` after reading 4 KiB of a large upload, while the client
    /// is still sending. After a response that keeps the connection alive,
    /// the server reads the rest of the body and only then records the
    /// request (with its whole body) and serves the next one; after an
    /// action that ends the connection, the request is recorded with the
    /// bytes read so far. Either way the request counts in
    /// [`requests_started`](super::FaultServer::requests_started) from its
    /// head on.
    ///
    /// The action is taken from the path's queue when the request head
    /// arrives (not after the body, as for other actions). HTTP/1.1 only: on
    /// HTTP/2 the body is read whole first, as without it. Default: the
    /// whole body is read first.
    pub fn after_body_bytes(mut self, bytes: u64) -> Self {
        self.early = Some(bytes);
        self
    }

    /// Add a response header (repeatable; headers are sent in this order).
    /// A `content-length` or `transfer-encoding` set here replaces the one
    /// the server would compute. A `connection: close` makes the server
    /// close the connection after the response.
    ///
    /// # Panics
    ///
    /// If `name` or `value` is not a valid header name or value.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("Action::header: invalid header name {name:?}"));
        let value = HeaderValue::from_str(value)
            .unwrap_or_else(|_| panic!("Action::header: invalid value for header {name}"));
        if let Kind::Respond(reply) = &mut self.kind {
            reply.headers.push((name, value));
        }
        self
    }

    /// The response body. Default: empty.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        if let Kind::Respond(reply) = &mut self.kind {
            reply.body = BodySource::Bytes(body.into());
        }
        self
    }

    /// A body of `len` bytes of filler (ASCII `x`), generated on the fly
    /// in chunks of at most 64 KiB: a 20 MiB body costs no 20 MiB buffer.
    pub fn body_len(mut self, len: u64) -> Self {
        if let Kind::Respond(reply) = &mut self.kind {
            reply.body = BodySource::Filler(len);
        }
        self
    }

    /// Send the body with `transfer-encoding: chunked` (HTTP/1.1) instead
    /// of a `content-length`. Default: `content-length`. No effect on
    /// HTTP/2, which has its own framing.
    pub fn chunked(mut self) -> Self {
        if let Kind::Respond(reply) = &mut self.kind {
            reply.chunked = true;
        }
        self
    }

    /// Send the body at about `bytes_per_sec`: one write of
    /// `bytes_per_sec / 10` bytes (at least 1, at most 16 KiB) at a time,
    /// evenly spaced. The first write goes out with the head. Default: as
    /// fast as the socket takes it.
    ///
    /// # Panics
    ///
    /// If `bytes_per_sec` is zero (use [`stall_after`](Action::stall_after)).
    pub fn trickle(mut self, bytes_per_sec: u64) -> Self {
        assert!(
            bytes_per_sec > 0,
            "Action::trickle: the rate must be at least 1 byte/s"
        );
        if let Kind::Respond(reply) = &mut self.kind {
            reply.rate = Some(bytes_per_sec);
        }
        self
    }

    /// Send the head and the first `bytes` body bytes, then send nothing
    /// more, ever (the connection stays open until the client closes it or
    /// the server is dropped).
    pub fn stall_after(self, bytes: u64) -> Self {
        self.ending(End::Stall(bytes))
    }

    /// Send the head (announcing the whole body) and the first `bytes`
    /// body bytes, then close the connection cleanly: the client sees a
    /// body shorter than its `content-length` (or a chunked body without
    /// its last chunk).
    pub fn truncate_after(self, bytes: u64) -> Self {
        self.ending(End::Truncate(bytes))
    }

    /// Send the head and the first `bytes` body bytes, then reset the
    /// connection (`SO_LINGER` 0): a reset mid-body.
    pub fn reset_after(self, bytes: u64) -> Self {
        self.ending(End::Reset(bytes))
    }

    fn ending(mut self, end: End) -> Self {
        if let Kind::Respond(reply) = &mut self.kind {
            reply.end = end;
        }
        self
    }
}

/// What the [`FaultServer`](super::FaultServer) does with a connection as
/// soon as it has accepted it, before any TLS handshake or request.
///
/// The builder's [`connections`](super::FaultServerBuilder::connections)
/// queue is consumed one entry per accepted connection, in accept order;
/// once it is empty, connections are [served](ConnectionAction::serve).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionAction {
    pub(crate) kind: ConnKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnKind {
    Serve,
    /// Serve this many requests, then go silent.
    ServeThenSilent(usize),
    NeverRead,
    Close,
    Reset,
    GoAway {
        last_stream_id: u32,
        read_first: u64,
    },
}

impl ConnectionAction {
    /// Serve the connection: TLS handshake if the server has TLS, then
    /// requests, each answered with the [`Action`] its path selects.
    pub fn serve() -> Self {
        ConnectionAction {
            kind: ConnKind::Serve,
        }
    }

    /// Serve the first `n` requests of the connection as
    /// [`serve`](ConnectionAction::serve) does, then go silent: from the
    /// next request on (which is still read and recorded), nothing more is
    /// written on the connection — no response, no HTTP/2 PING or SETTINGS
    /// acknowledgement, no `GOAWAY`, no reset — and what the client sends
    /// is read and discarded, until the client leaves or the server is
    /// dropped. This is what a client sees of a peer or a middlebox that
    /// died with the socket open.
    pub fn serve_then_silent(n: usize) -> Self {
        ConnectionAction {
            kind: ConnKind::ServeThenSilent(n),
        }
    }

    /// Accept the TCP connection and never process a byte of it: no TLS
    /// handshake, no request, no response, until the client leaves or the
    /// server is dropped.
    ///
    /// The first 64 KiB the client sends are drained and discarded, only so
    /// that the server notices the client leaving; past that nothing is
    /// read, so a client writing a larger request blocks as it would
    /// against a server that never reads.
    pub fn never_read() -> Self {
        ConnectionAction {
            kind: ConnKind::NeverRead,
        }
    }

    /// Accept the TCP connection and never complete the TLS handshake (the
    /// `ClientHello` is never read). The same as
    /// [`never_read`](ConnectionAction::never_read), named for what a TLS
    /// client sees.
    pub fn hang_tls() -> Self {
        ConnectionAction::never_read()
    }

    /// Close the connection as soon as it is accepted. A client that has
    /// already sent bytes may see a reset rather than an end of stream (the
    /// kernel resets a socket closed with unread data).
    pub fn close() -> Self {
        ConnectionAction {
            kind: ConnKind::Close,
        }
    }

    /// Reset the connection (`SO_LINGER` 0) as soon as it is accepted.
    pub fn reset() -> Self {
        ConnectionAction {
            kind: ConnKind::Reset,
        }
    }

    /// HTTP/2 (TLS with ALPN `h2`; any other connection is reset at once):
    /// complete the handshake, read the client's first request `HEADERS`,
    /// then read nothing more; 100 ms later send a `PING` and a `GOAWAY`
    /// (`NO_ERROR`) with `last_stream_id` (what a server shutting down
    /// gracefully ends with), and 50 ms after that reset the connection
    /// (`SO_LINGER` 0).
    ///
    /// With `last_stream_id` 0 the server refuses the request: a stream
    /// above the last stream id was not processed (RFC 9113 §6.8), and a
    /// client may send it again on another connection. With the request's
    /// own stream id (1 on a new connection) it says the request may have
    /// been processed. Requests on such a connection are not recorded
    /// (the server never reads them as requests) and do not count in
    /// [`requests_started`](super::FaultServer::requests_started).
    ///
    /// The server raises its flow-control windows to the maximum, so a
    /// client sending a large body (larger than the socket buffers) is
    /// held back by TCP only: it is waiting on its write when the `PING`
    /// and the `GOAWAY` arrive, and the reset then fails that write. (A
    /// client must still read the `GOAWAY` to learn that its request was
    /// not processed; hyper's HTTP/2 client does, write blocked or not.)
    /// See [`go_away_after_body_bytes`](Self::go_away_after_body_bytes) to
    /// let the body start first.
    pub fn go_away(last_stream_id: u32) -> Self {
        Self::go_away_after_body_bytes(last_stream_id, 0)
    }

    /// [`go_away`](Self::go_away), sent once at least `bytes` bytes of the
    /// request body (`DATA` payload) have been read after its `HEADERS`:
    /// the client is sending its body when the `GOAWAY` comes.
    pub fn go_away_after_body_bytes(last_stream_id: u32, bytes: u64) -> Self {
        ConnectionAction {
            kind: ConnKind::GoAway {
                last_stream_id,
                read_first: bytes,
            },
        }
    }
}
