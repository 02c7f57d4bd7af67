//! HTTP/1.1 by hand, over plain TCP or TLS: a small bounded request parser
//! (`httparse`) and raw response writes, so that every byte and every socket
//! fault is under the script's control.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::action::{Action, End, Kind, Reply};
use super::body::BodyPlan;
use super::recorder::{InFlight, Incoming, Shared};

/// The largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// The most request headers accepted.
const MAX_HEADERS: usize = 128;
/// The largest request body recorded; a larger one closes the connection.
const MAX_BODY: u64 = 64 * 1024 * 1024;
/// The largest chunk-size or trailer line.
const MAX_LINE: usize = 8 * 1024;
/// How much of a never-read connection is drained to notice its end.
pub(crate) const NEVER_READ_DRAIN: usize = 64 * 1024;

/// A byte stream with a TCP socket underneath, which can be reset.
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin + Send {
    fn tcp(&self) -> &TcpStream;
}

impl Socket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Socket for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// Resets the connection: `SO_LINGER` 0, then close, so the kernel sends an
/// RST instead of a FIN.
pub(crate) fn reset<S: Socket>(io: S) {
    // If the option cannot be set the socket is closed normally; the test
    // that expected a reset then fails visibly.
    let _ = socket2::SockRef::from(io.tcp()).set_linger(Some(Duration::ZERO));
    drop(io);
}

/// Reads and discards until the peer closes or the connection fails: how a
/// connection that will never answer again waits, without outliving its
/// client.
pub(crate) async fn drain_until_closed<S: Socket>(io: &mut S) {
    let mut scratch = [0u8; 4096];
    loop {
        match io.read(&mut scratch).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Sleeps for `delay` while watching the connection, so that a client that
/// leaves ends the wait; bytes that arrive meanwhile (a pipelined request)
/// are kept in `buf` for the parser. Returns whether the client is still
/// there.
async fn sleep_watching<S: Socket>(io: &mut S, buf: &mut BytesMut, delay: Duration) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        if buf.len() > MAX_HEAD {
            // Enough buffered; stop reading and just wait.
            sleep.await;
            return true;
        }
        tokio::select! {
            _ = &mut sleep => return true,
            read = io.read_buf(buf) => match read {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            },
        }
    }
}

/// Holds a connection without processing a byte of it. The first
/// [`NEVER_READ_DRAIN`] bytes are drained and discarded, only so that a
/// client that leaves ends the wait; past that nothing is read any more.
pub(crate) async fn hold_unprocessed(mut tcp: TcpStream) {
    let mut scratch = [0u8; 4096];
    let mut drained = 0;
    while drained < NEVER_READ_DRAIN {
        match tcp.read(&mut scratch).await {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
    std::future::pending::<()>().await
}

enum Framing {
    None,
    Length(u64),
    Chunked,
}

struct Head {
    method: Method,
    target: String,
    version: Version,
    headers: HeaderMap,
    framing: Framing,
    keep_alive: bool,
    expect_continue: bool,
}

/// Serves requests on one connection until the client leaves, the script
/// ends the connection, or a request is malformed. With `silent_after:
/// Some(n)`, the request after the first `n` is recorded and never
/// answered, and the connection only drains from then on.
pub(crate) async fn serve<S: Socket>(
    mut io: S,
    connection: u64,
    shared: Arc<Shared>,
    silent_after: Option<usize>,
) {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut served = 0usize;
    loop {
        let head = match read_head(&mut io, &mut buf).await {
            Ok(Some(head)) => head,
            Ok(None) | Err(_) => return,
        };
        let received_at = Instant::now();
        // Ends just before the last byte of the response is written, so
        // that a client never sees its request done while the server still
        // counts it in flight (peaks seen by the server are exact).
        let mut in_flight = Some(shared.enter());
        if head.expect_continue
            && io
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
        {
            return;
        }
        let is_head = head.method == Method::HEAD;
        let keep_alive = head.keep_alive;
        let mut reader = BodyReader::new(&head.framing);
        let early = shared.take_early(&head.target);
        let incoming = Incoming {
            method: head.method,
            target: head.target,
            version: head.version,
            headers: head.headers,
            received_at,
            connection,
        };
        let mut body = BytesMut::new();
        if let Some(action) = early {
            // Act after the first bytes of the body, read the rest after.
            let at = action.early.unwrap_or(0);
            let at = usize::try_from(at).unwrap_or(usize::MAX);
            if reader.read(&mut io, &mut buf, &mut body, at).await.is_err() {
                return;
            }
            let next = act(&mut io, &mut buf, action, is_head, &shared, &mut in_flight).await;
            if matches!(next, Ok(Next::KeepAlive))
                && reader
                    .read(&mut io, &mut buf, &mut body, usize::MAX)
                    .await
                    .is_err()
            {
                shared.record_only(incoming, body.freeze());
                return;
            }
            shared.record_only(incoming, body.freeze());
            match next {
                Ok(Next::KeepAlive) if keep_alive => continue,
                Ok(Next::KeepAlive) | Ok(Next::Close) => {
                    drop(in_flight);
                    let _ = io.shutdown().await;
                    return;
                }
                Ok(Next::Reset) => {
                    drop(in_flight);
                    return reset(io);
                }
                Ok(Next::Drain) => return drain_until_closed(&mut io).await,
                Err(_) => return,
            }
        }
        if reader
            .read(&mut io, &mut buf, &mut body, usize::MAX)
            .await
            .is_err()
        {
            return;
        }
        let action = shared.record(incoming, body.freeze());
        if silent_after.is_some_and(|n| served >= n) {
            return drain_until_closed(&mut io).await;
        }
        served += 1;
        let next = act(&mut io, &mut buf, action, is_head, &shared, &mut in_flight).await;
        match next {
            Ok(Next::KeepAlive) if keep_alive => {}
            Ok(Next::KeepAlive) | Ok(Next::Close) => {
                drop(in_flight);
                let _ = io.shutdown().await;
                return;
            }
            Ok(Next::Reset) => {
                drop(in_flight);
                return reset(io);
            }
            Ok(Next::Drain) => return drain_until_closed(&mut io).await,
            Err(_) => return,
        }
    }
}

/// What becomes of the connection after an action.
enum Next {
    KeepAlive,
    Close,
    Reset,
    /// Hold the connection without answering until the peer leaves.
    Drain,
}

async fn act<S: Socket>(
    io: &mut S,
    buf: &mut BytesMut,
    action: Action,
    is_head: bool,
    shared: &Shared,
    in_flight: &mut Option<InFlight>,
) -> io::Result<Next> {
    if let Some(max) = action.reject_above {
        if shared.in_flight() > max {
            in_flight.take();
            io.write_all(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n")
                .await?;
            io.flush().await?;
            return Ok(Next::KeepAlive);
        }
    }
    if !action.delay.is_zero() && !sleep_watching(io, buf, action.delay).await {
        // The client left during the delay: nothing to answer.
        return Ok(Next::Close);
    }
    match action.kind {
        Kind::NeverRespond => Ok(Next::Drain),
        Kind::Close => Ok(Next::Close),
        Kind::Reset => Ok(Next::Reset),
        Kind::ResetMidHeaders => {
            io.write_all(b"HTTP/1.1 200 OK\r\ncontent-ty").await?;
            io.flush().await?;
            Ok(Next::Reset)
        }
        Kind::Respond(reply) => respond(io, &reply, is_head, in_flight).await,
    }
}

async fn respond<S: Socket>(
    io: &mut S,
    reply: &Reply,
    is_head: bool,
    in_flight: &mut Option<InFlight>,
) -> io::Result<Next> {
    let no_body = is_head
        || reply.status.is_informational()
        || reply.status == StatusCode::NO_CONTENT
        || reply.status == StatusCode::NOT_MODIFIED;
    let has = |name: &HeaderName| reply.headers.iter().any(|(n, _)| n == name);
    let close_after = reply.headers.iter().any(|(n, v)| {
        n == CONNECTION
            && v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    });

    let mut head = Vec::with_capacity(256);
    let reason = reply.status.canonical_reason().unwrap_or("");
    head.extend_from_slice(format!("HTTP/1.1 {} {}\r\n", reply.status.as_u16(), reason).as_bytes());
    for (name, value) in &reply.headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let chunked = reply.chunked && !no_body;
    if !has(&CONTENT_LENGTH) && !has(&TRANSFER_ENCODING) {
        if chunked {
            head.extend_from_slice(b"transfer-encoding: chunked\r\n");
        } else if !(reply.status == StatusCode::NO_CONTENT || reply.status.is_informational()) {
            head.extend_from_slice(format!("content-length: {}\r\n", reply.body.len()).as_bytes());
        }
    }
    head.extend_from_slice(b"\r\n");
    let mut plan = BodyPlan::new(reply);
    let complete = reply.end == End::Complete;
    if no_body || (complete && !chunked && plan.is_done()) {
        in_flight.take();
    }
    io.write_all(&head).await?;
    io.flush().await?;

    if no_body {
        return Ok(if close_after {
            Next::Close
        } else {
            Next::KeepAlive
        });
    }

    while let Some(chunk) = plan.next_chunk().await {
        if complete && !chunked && plan.is_done() {
            in_flight.take();
        }
        if chunked {
            io.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            io.write_all(&chunk).await?;
            io.write_all(b"\r\n").await?;
        } else {
            io.write_all(&chunk).await?;
        }
        io.flush().await?;
    }
    match reply.end {
        End::Complete => {
            if chunked {
                in_flight.take();
                io.write_all(b"0\r\n\r\n").await?;
                io.flush().await?;
            }
            Ok(if close_after {
                Next::Close
            } else {
                Next::KeepAlive
            })
        }
        End::Stall(_) => Ok(Next::Drain),
        End::Truncate(_) => Ok(Next::Close),
        End::Reset(_) => Ok(Next::Reset),
    }
}

/// Reads one request head; `Ok(None)` on a clean end of stream between
/// requests.
async fn read_head<S: Socket>(io: &mut S, buf: &mut BytesMut) -> io::Result<Option<Head>> {
    loop {
        if !buf.is_empty() {
            if let Some(head) = parse_head(buf)? {
                return Ok(Some(head));
            }
        }
        if buf.len() > MAX_HEAD {
            return Err(invalid("request head too large"));
        }
        if io.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn parse_head(buf: &mut BytesMut) -> io::Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(invalid("malformed request head")),
    };
    let method = Method::from_bytes(req.method.unwrap_or("GET").as_bytes())
        .map_err(|_| invalid("bad method"))?;
    let target = req.path.unwrap_or("/").to_owned();
    let version = if req.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut map = HeaderMap::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Err(invalid("bad header"));
        };
        map.append(name, value);
    }
    buf.advance(len);

    let tokens = |name: HeaderName, token: &str| {
        map.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let framing = if tokens(TRANSFER_ENCODING, "chunked") {
        Framing::Chunked
    } else if let Some(len) = map.get(CONTENT_LENGTH) {
        let len = len
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| invalid("bad content-length"))?;
        Framing::Length(len)
    } else {
        Framing::None
    };
    let keep_alive = match version {
        Version::HTTP_10 => tokens(CONNECTION, "keep-alive"),
        _ => !tokens(CONNECTION, "close"),
    };
    let expect_continue = map
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(Some(Head {
        method,
        target,
        version,
        headers: map,
        framing,
        keep_alive,
        expect_continue,
    }))
}

async fn fill<S: Socket>(io: &mut S, buf: &mut BytesMut, at_least: usize) -> io::Result<()> {
    while buf.len() < at_least {
        if io.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

async fn read_line<S: Socket>(io: &mut S, buf: &mut BytesMut) -> io::Result<Bytes> {
    loop {
        if let Some(pos) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = buf.split_to(pos).freeze();
            buf.advance(2);
            return Ok(line);
        }
        if buf.len() > MAX_LINE {
            return Err(invalid("line too long"));
        }
        if io.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Reads a request body in steps, so that a server can act after its first
/// bytes and read the rest later ([`Action::after_body_bytes`]).
struct BodyReader {
    /// Bytes left in a `content-length` body, or in the current chunk.
    left: u64,
    chunked: bool,
    done: bool,
}

impl BodyReader {
    fn new(framing: &Framing) -> Self {
        match *framing {
            Framing::None => BodyReader {
                left: 0,
                chunked: false,
                done: true,
            },
            Framing::Length(len) => BodyReader {
                left: len,
                chunked: false,
                done: len == 0,
            },
            Framing::Chunked => BodyReader {
                left: 0,
                chunked: true,
                done: false,
            },
        }
    }

    /// Reads into `body` until it holds at least `until` bytes or the body
    /// ended.
    async fn read<S: Socket>(
        &mut self,
        io: &mut S,
        buf: &mut BytesMut,
        body: &mut BytesMut,
        until: usize,
    ) -> io::Result<()> {
        while !self.done && body.len() < until {
            if self.chunked && self.left == 0 {
                let line = read_line(io, buf).await?;
                let size = std::str::from_utf8(&line)
                    .ok()
                    .and_then(|l| l.split(';').next())
                    .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
                    .ok_or_else(|| invalid("bad chunk size"))?;
                if size == 0 {
                    // Trailers, up to the empty line.
                    while !read_line(io, buf).await?.is_empty() {}
                    self.done = true;
                    return Ok(());
                }
                self.left = size;
            }
            if body.len() as u64 + self.left > MAX_BODY {
                return Err(invalid("request body too large"));
            }
            fill(io, buf, 1).await?;
            let n = buf
                .len()
                .min(usize::try_from(self.left).unwrap_or(usize::MAX));
            body.extend_from_slice(&buf[..n]);
            buf.advance(n);
            self.left -= n as u64;
            if self.left == 0 {
                if self.chunked {
                    // The CRLF after the chunk's data.
                    fill(io, buf, 2).await?;
                    buf.advance(2);
                } else {
                    self.done = true;
                }
            }
        }
        Ok(())
    }
}
