//! [`ConnectionAction::go_away`](super::ConnectionAction::go_away): an
//! HTTP/2 server that answers the client's first request with a `GOAWAY`
//! and resets the connection, written frame by frame (hyper's server
//! always counts a stream whose `HEADERS` it read as processed, so it
//! cannot send a `GOAWAY` below a stream it has seen).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::h1;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const ACK: u8 = 0x1;
/// The largest frame payload read (the default `SETTINGS_MAX_FRAME_SIZE`).
const MAX_FRAME: usize = 16 * 1024;
/// The largest flow-control window (RFC 9113 §6.9.1).
const MAX_WINDOW: u32 = (1 << 31) - 1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & MAX_WINDOW).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: its type, flags, stream id; the payload is discarded.
async fn read_frame(io: &mut TlsStream<TcpStream>) -> std::io::Result<(u8, u8, u32, usize)> {
    let mut head = [0u8; 9];
    io.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other("frame too large"));
    }
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & MAX_WINDOW;
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, len))
}

/// Serves one connection as described on
/// [`ConnectionAction::go_away`](super::ConnectionAction::go_away).
pub(crate) async fn serve(mut io: TlsStream<TcpStream>, last_stream_id: u32, read_first: u64) {
    if io.get_ref().1.alpn_protocol() != Some(b"h2") {
        return h1::reset(io);
    }
    // Our SETTINGS: the largest stream window, and the connection window
    // raised to match, so a client's body is held back by TCP alone.
    let mut settings = Vec::new();
    settings.extend_from_slice(&0x4u16.to_be_bytes()); // INITIAL_WINDOW_SIZE
    settings.extend_from_slice(&MAX_WINDOW.to_be_bytes());
    let mut hello = frame(SETTINGS, 0, 0, &settings);
    hello.extend(frame(
        WINDOW_UPDATE,
        0,
        0,
        &(MAX_WINDOW - 65_535).to_be_bytes(),
    ));
    let mut preface = [0u8; 24];
    if io.write_all(&hello).await.is_err()
        || io.flush().await.is_err()
        || io.read_exact(&mut preface).await.is_err()
        || &preface != PREFACE
    {
        return h1::reset(io);
    }
    // Up to the first request's HEADERS (and `read_first` bytes of DATA
    // after them), acknowledging the client's SETTINGS.
    let mut seen_headers = false;
    let mut body_read = 0u64;
    loop {
        let Ok((kind, flags, _stream, len)) = read_frame(&mut io).await else {
            return h1::reset(io);
        };
        match kind {
            SETTINGS
                if flags & ACK == 0
                    && io.write_all(&frame(SETTINGS, ACK, 0, &[])).await.is_err() =>
            {
                return h1::reset(io);
            }
            HEADERS => seen_headers = true,
            DATA if seen_headers => body_read += len as u64,
            _ => {}
        }
        if seen_headers && body_read >= read_first {
            break;
        }
    }
    // Nothing more is read: a client still sending a large body fills the
    // socket buffers and waits on its write when the GOAWAY comes; the
    // reset that follows fails that write.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A PING first, as a server shutting down gracefully sends one (hyper's
    // does, to learn which streams are in flight), which the client must
    // answer while its write waits.
    let mut goaway = frame(PING, 0, 0, &[0u8; 8]);
    let mut payload = Vec::with_capacity(8);
    payload.extend_from_slice(&(last_stream_id & MAX_WINDOW).to_be_bytes());
    payload.extend_from_slice(&0u32.to_be_bytes()); // NO_ERROR
    goaway.extend(frame(GOAWAY, 0, 0, &payload));
    if io.write_all(&goaway).await.is_err() || io.flush().await.is_err() {
        return h1::reset(io);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    h1::reset(io);
}
