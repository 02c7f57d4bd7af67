//! rebound's client composed with tower-http's own layers: `FollowRedirect`,
//! `Decompression` and `SetRequestHeader` stack around it like around any
//! `tower::Service` over `http` types.
//!
//! Run: `cargo run --example tower_http` (loopback only, a second at most).
//!
//! Where each sits, and why:
//! * `SetRequestHeader` outermost: the header is set once per logical request,
//!   so every redirect hop and every retry carries it.
//! * `FollowRedirect` above the client: each hop is its own logical request
//!   with its own deadline and retries; a 503 on the second hop is retried by
//!   rebound without re-walking the first.
//! * `Decompression` above the client: it only wraps the response body, so
//!   rebound's body timeouts and deadline still apply to the compressed bytes
//!   underneath.

use std::io::Write as _;
use std::time::Duration;

use http::header::{HeaderValue, USER_AGENT};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use rebound::{Attempts, Body, Client};
use rebound_test::fault::{Action, FaultServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_http::decompression::DecompressionLayer;
use tower_http::follow_redirect::FollowRedirectLayer;
use tower_http::set_header::SetRequestHeaderLayer;

fn gzip(data: &[u8]) -> Vec<u8> {
    // A tiny stored-block gzip stream, written by hand so the example needs
    // no compression crate of its own: header, one stored deflate block,
    // CRC32 and length.
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let len = data.len() as u16;
    out.push(1); // final stored block
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
    out.write_all(&crc32(data).to_le_bytes()).unwrap();
    out.write_all(&(data.len() as u32).to_le_bytes()).unwrap();
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let server = FaultServer::builder()
        // /old redirects to /new; /new is busy once, then answers gzip.
        .route("/old", [Action::status(302).header("location", "/new")])
        .route(
            "/new",
            [
                Action::status(503).body("busy"),
                Action::status(200)
                    .header("content-encoding", "gzip")
                    .body(gzip(b"hello from behind a redirect")),
            ],
        )
        .start()
        .await;

    let client = Client::builder()
        .total_timeout(Duration::from_secs(5))
        .attempt_timeout(Duration::from_secs(2))
        .backoff(rebound::Backoff::exponential(
            Duration::from_millis(5),
            Duration::from_millis(50),
        ))
        .build()?;

    let svc = ServiceBuilder::new()
        .layer(SetRequestHeaderLayer::overriding(
            USER_AGENT,
            HeaderValue::from_static("rebound-example/0.1"),
        ))
        .layer(FollowRedirectLayer::new())
        .layer(DecompressionLayer::new())
        .service(client);

    let req = Request::get(server.url("/old")).body(Body::empty())?;
    let res = svc.oneshot(req).await?;
    assert_eq!(res.status(), StatusCode::OK);
    let attempts = Attempts::of(res.extensions());
    let text = res.into_body().collect().await?.to_bytes();

    println!("final status: 200, attempts on the last hop: {attempts}");
    println!("decompressed body: {}", String::from_utf8_lossy(&text));
    for r in server.requests() {
        println!(
            "server saw: {} {} (user-agent: {})",
            r.method,
            r.path(),
            r.header("user-agent").unwrap_or("-")
        );
    }
    assert_eq!(&text[..], b"hello from behind a redirect");
    assert_eq!(attempts, 2);
    Ok(())
}
