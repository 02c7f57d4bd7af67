//! The loopback server: the bench binary itself, started again with
//! `--bench-server` as a separate process so that its work (and its
//! allocations) never count as the client's.
//!
//! It serves HTTP/1.1 on 127.0.0.1 only, with `TCP_NODELAY`:
//!
//! * `/ok` — 200 with a 2-byte body;
//! * `/status/503` — 503 with a short body, for every request (the outage);
//! * `/flaky/<pct>` — 503 for `pct` % of requests (a fixed pseudo-random
//!   sequence, the same in every run), 200 otherwise;
//! * `/tail` — the tail (see `hedge.rs`): 200 after about 1 ms, or after
//!   1 s for the first arrival of a request whose `x-tail-id` is a
//!   multiple of 100 (so a hedge of a slow request is fast, as a copy sent
//!   to a healthy replica would be);
//! * `/__count` — how many requests the paths above received (not
//!   itself counted); `/__slow` — how many slow `/tail` answers began.
//!
//! It stops when its parent closes its stdin (the parent exited or was
//! killed) or when its lifetime runs out, whichever is first; the parent's
//! [`ServerProcess`] also kills it when dropped.

use std::convert::Infallible;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tower::BoxError;

/// Requests received on the counted paths.
static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Slow `/tail` answers begun.
static SLOW: AtomicU64 = AtomicU64::new(0);

/// `/tail` ids already seen, by id modulo its length (a run sends far
/// fewer ids than this).
static SEEN: [std::sync::atomic::AtomicBool; 1 << 20] =
    [const { std::sync::atomic::AtomicBool::new(false) }; 1 << 20];

/// The longest a server may live, whatever its parent asks.
const MAX_LIFETIME_SECS: u64 = 3600;

/// A running server process; killed (and reaped) when dropped.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl ServerProcess {
    /// Starts the server for at most `lifetime` and waits (at most 20 s) for
    /// the address it listens on.
    pub(crate) fn spawn(lifetime: Duration) -> Result<Self, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--bench-server")
            .arg(lifetime.as_secs().max(1).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take();
        // From here on the guard owns the child, so an early return kills it.
        let mut guard = ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let stdout = stdout.ok_or("server has no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = tx.send(read);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .map_err(|_| "bench server did not say where it listens within 20 s")??;
        guard.addr = line
            .trim()
            .strip_prefix("listening ")
            .ok_or_else(|| format!("unexpected line from bench server: {line:?}"))?
            .parse()?;
        if !guard.addr.ip().is_loopback() {
            return Err("bench server must listen on loopback".into());
        }
        Ok(guard)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's `main`; never returns. `lifetime` is in seconds.
pub(crate) fn serve_main(lifetime: Option<&str>) -> ! {
    let lifetime = lifetime
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(600)
        .clamp(1, MAX_LIFETIME_SECS);

    // Leave when the parent goes away: its end of our stdin closes.
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        std::process::exit(0);
    });

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench server: runtime: {e}");
            std::process::exit(2);
        }
    };
    let result: Result<(), BoxError> = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let mut out = std::io::stdout();
        writeln!(out, "listening {}", listener.local_addr()?)?;
        out.flush()?;
        let end = tokio::time::sleep(Duration::from_secs(lifetime));
        tokio::pin!(end);
        loop {
            tokio::select! {
                _ = &mut end => return Ok(()),
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
                            .await;
                    });
                }
            }
        }
    });
    if let Err(e) = result {
        eprintln!("bench server: {e}");
        std::process::exit(2);
    }
    std::process::exit(0)
}

/// A fixed pseudo-random mix of `n` (splitmix64), for `/flaky`.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    let reply = |status: StatusCode, body: &'static [u8]| {
        let mut res = Response::new(Full::new(Bytes::from_static(body)));
        *res.status_mut() = status;
        Ok(res)
    };
    if path == "/__count" {
        let n = RECEIVED.load(Ordering::Relaxed);
        return Ok(Response::new(Full::new(Bytes::from(n.to_string()))));
    }
    if path == "/__slow" {
        let n = SLOW.load(Ordering::Relaxed);
        return Ok(Response::new(Full::new(Bytes::from(n.to_string()))));
    }
    let n = RECEIVED.fetch_add(1, Ordering::Relaxed);
    if path == "/ok" {
        reply(StatusCode::OK, b"ok")
    } else if path == "/tail" {
        let id = req
            .headers()
            .get("x-tail-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let slow = id.is_some_and(|id| {
            id % 100 == 0 && !SEEN[(id as usize) % SEEN.len()].swap(true, Ordering::Relaxed)
        });
        if slow {
            SLOW.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(1)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        reply(StatusCode::OK, b"ok")
    } else if path == "/status/503" {
        reply(StatusCode::SERVICE_UNAVAILABLE, b"unavailable")
    } else if let Some(pct) = path
        .strip_prefix("/flaky/")
        .and_then(|p| p.parse::<u64>().ok())
    {
        if mix(n) % 100 < pct {
            reply(StatusCode::SERVICE_UNAVAILABLE, b"unavailable")
        } else {
            reply(StatusCode::OK, b"ok")
        }
    } else {
        reply(StatusCode::NOT_FOUND, b"not found")
    }
}
