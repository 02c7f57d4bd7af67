//! The FaultServer does what its script says, observed from a raw
//! `TcpStream` (every byte and every socket error) and from hyper's client
//! (TLS with the generated certificate, HTTP/1.1 and HTTP/2).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rebound_test::fault::{Action, ConnectionAction, FaultServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// Generous bound for anything that should happen "at once".
const SOON: Duration = Duration::from_secs(5);
/// How long "nothing happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The peer closed cleanly (read returned 0).
    Eof,
    /// The peer reset the connection.
    Reset,
    /// Nothing more arrived before the wait ended.
    Quiet,
    /// Another error.
    Other(io::ErrorKind),
}

/// Reads until end of stream, an error, or `wait` has passed.
async fn read_all(conn: &mut TcpStream, wait: Duration) -> (Vec<u8>, End) {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return (got, End::Quiet),
            Ok(Ok(0)) => return (got, End::Eof),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => return (got, End::Reset),
            Ok(Err(e)) => return (got, End::Other(e.kind())),
        }
    }
}

/// Reads until `bytes` bytes have arrived (or the stream ends, fails, or
/// `wait` passes).
async fn read_n(conn: &mut TcpStream, bytes: usize, wait: Duration) -> Vec<u8> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while got.len() < bytes {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    got
}

async fn connect_and_send(server: &FaultServer, request: &str) -> TcpStream {
    let mut conn = TcpStream::connect(server.addr()).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    conn
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n")
}

/// Splits a raw response into head and body at the first blank line.
fn split(raw: &[u8]) -> (String, &[u8]) {
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    (
        String::from_utf8_lossy(&raw[..at]).into_owned(),
        &raw[at + 4..],
    )
}

#[tokio::test]
async fn responds_as_scripted_and_records_the_request() {
    let server = FaultServer::builder()
        .route(
            "/items",
            [Action::status(201)
                .header("x-ratelimit-remaining", "0")
                .header("connection", "close")
                .body("created")],
        )
        .start()
        .await;
    let mut conn = connect_and_send(
        &server,
        "POST /items?api_key=s3cret HTTP/1.1\r\nhost: test\r\nauthorization: Bearer tok\r\ncontent-length: 5\r\n\r\nhello",
    )
    .await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(
        end,
        End::Eof,
        "`connection: close` closes after the response"
    );
    let (head, body) = split(&raw);
    assert!(head.starts_with("HTTP/1.1 201 Created\r\n"), "{head}");
    assert!(head.contains("x-ratelimit-remaining: 0"), "{head}");
    assert!(head.contains("content-length: 7"), "{head}");
    assert_eq!(body, b"created");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, http::Method::POST);
    assert_eq!(r.target, "/items?api_key=s3cret");
    assert_eq!(r.path(), "/items");
    assert_eq!(r.query(), Some("api_key=s3cret"));
    assert_eq!(r.header("authorization"), Some("Bearer tok"));
    assert_eq!(r.body, "hello");
    assert_eq!(r.version, http::Version::HTTP_11);
    assert_eq!((r.index, r.connection, r.index_on_connection), (0, 0, 0));
    assert!(r.received_at <= Instant::now());
}

#[tokio::test]
async fn route_queue_then_default_on_one_keep_alive_connection() {
    let server = FaultServer::builder()
        .route("/x", [Action::status(503), Action::status(503)])
        .default(Action::status(200).body("fine"))
        .start()
        .await;
    let mut conn = TcpStream::connect(server.addr()).await.unwrap();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        conn.write_all(get("/x?n=1").as_bytes()).await.unwrap();
        let raw = read_n(&mut conn, 1, SOON).await;
        let text = String::from_utf8_lossy(&raw).into_owned();
        // Each response arrives whole before the next request is sent;
        // read the rest of the 200's body if it came separately.
        let text = if text.starts_with("HTTP/1.1 200") && !text.ends_with("fine") {
            let more = read_n(&mut conn, 4, SOON).await;
            text + &String::from_utf8_lossy(&more)
        } else {
            text
        };
        statuses.push(text[9..12].to_owned());
    }
    assert_eq!(statuses, ["503", "503", "200"]);
    assert_eq!(server.connections(), 1, "all three on one connection");
    let on_conn: Vec<_> = server
        .requests()
        .iter()
        .map(|r| (r.connection, r.index_on_connection))
        .collect();
    assert_eq!(on_conn, [(0, 0), (0, 1), (0, 2)]);
    assert_eq!(server.requests_to("/x").len(), 3);
}

#[tokio::test]
async fn chunked_request_and_chunked_response() {
    let server = FaultServer::builder()
        .default(
            Action::status(200)
                .body("hello world")
                .chunked()
                .header("connection", "close"),
        )
        .start()
        .await;
    let mut conn = connect_and_send(
        &server,
        "PUT /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n",
    )
    .await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&raw);
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert_eq!(body, b"b\r\nhello world\r\n0\r\n\r\n");
    assert_eq!(server.requests()[0].body, "abcde");
}

#[tokio::test]
async fn hyper_client_reuses_its_connection() {
    let server = FaultServer::builder()
        .route("/r", [Action::status(503)])
        .start()
        .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: http::Uri = server.url("/r").parse().unwrap();
    let first = client.get(uri.clone()).await.unwrap();
    assert_eq!(first.status(), 503);
    first.into_body().collect().await.unwrap();
    let second = client.get(uri).await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(server.request_count(), 2);
    assert_eq!(
        server.connections(),
        1,
        "the drained 503 connection was reused"
    );
}

#[tokio::test]
async fn delay_holds_the_response_back() {
    let server = FaultServer::builder()
        .default(Action::status(204).delay(Duration::from_millis(400)))
        .start()
        .await;
    let started = Instant::now();
    let mut conn = connect_and_send(&server, &get("/slow")).await;
    let quiet = read_n(&mut conn, 1, Duration::from_millis(100)).await;
    assert!(quiet.is_empty(), "answered before its delay");
    let raw = read_n(&mut conn, 1, SOON).await;
    assert!(raw.starts_with(b"HTTP/1.1 204 No Content\r\n"));
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn never_read_connection_gets_nothing_and_records_nothing() {
    let server = FaultServer::builder()
        .connections([ConnectionAction::never_read()])
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/")).await;
    let (raw, end) = read_all(&mut conn, QUIET).await;
    assert_eq!((raw.len(), end), (0, End::Quiet));
    assert_eq!(server.connections(), 1);
    assert_eq!(server.request_count(), 0);

    // The queue is used up: the next connection is served.
    let mut next = connect_and_send(&server, &get("/")).await;
    assert!(read_n(&mut next, 12, SOON)
        .await
        .starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn never_respond_reads_records_and_stays_silent() {
    let server = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/hang?token=t")).await;
    server.wait_for_requests(1, SOON).await.unwrap();
    let (raw, end) = read_all(&mut conn, QUIET).await;
    assert_eq!((raw.len(), end), (0, End::Quiet));
    assert_eq!(server.in_flight(), 1);
    assert_eq!(server.requests()[0].target, "/hang?token=t");

    // When the client leaves, the request is no longer in flight.
    drop(conn);
    let deadline = Instant::now() + SOON;
    while server.in_flight() != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.in_flight(), 0);
    assert_eq!(server.peak_in_flight(), 1);
}

#[tokio::test]
async fn stalled_body_sends_the_head_then_nothing() {
    let server = FaultServer::builder()
        .default(Action::status(200).body_len(1000).stall_after(10))
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/stall")).await;
    let (raw, end) = read_all(&mut conn, Duration::from_millis(500)).await;
    assert_eq!(end, End::Quiet, "the stall neither ends nor fails");
    let (head, body) = split(&raw);
    assert!(head.contains("content-length: 1000"), "{head}");
    assert_eq!(body, [b'x'; 10]);

    let server = FaultServer::builder()
        .default(Action::stall_body())
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/stall")).await;
    let (raw, end) = read_all(&mut conn, QUIET).await;
    assert_eq!(end, End::Quiet);
    assert_eq!(split(&raw).1.len(), 0, "no body byte at all");
}

#[tokio::test]
async fn trickle_paces_the_body() {
    // 1000 bytes at 2000 B/s: 200-byte writes every 100 ms, about 400 ms.
    let server = FaultServer::builder()
        .default(Action::status(200).body_len(1000).trickle(2000))
        .start()
        .await;
    let started = Instant::now();
    let mut conn = connect_and_send(&server, &get("/slow")).await;
    let mut head_and_first = read_n(&mut conn, 1, SOON).await;
    // The head and the first write come at once, the rest later.
    let early = read_n(&mut conn, usize::MAX, Duration::from_millis(50)).await;
    head_and_first.extend_from_slice(&early);
    let (_, first_body) = split(&head_and_first);
    assert!(
        first_body.len() < 1000,
        "{} bytes at once",
        first_body.len()
    );
    let rest = read_n(&mut conn, 1000 - first_body.len(), SOON).await;
    assert_eq!(first_body.len() + rest.len(), 1000);
    assert!(started.elapsed() >= Duration::from_millis(350));
}

#[tokio::test]
async fn reset_mid_body_is_econnreset_after_some_bytes() {
    let server = FaultServer::builder()
        .default(Action::status(200).body_len(1000).reset_after(100))
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/r")).await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(end, End::Reset);
    // Bytes that arrived before the RST may or may not be delivered; none
    // past the reset point are.
    if raw.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(split(&raw).1.len() <= 100);
    }
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn reset_mid_headers_cuts_the_head() {
    let server = FaultServer::builder()
        .default(Action::reset_mid_headers())
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/r")).await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(end, End::Reset);
    assert!(b"HTTP/1.1 200 OK\r\ncontent-ty".starts_with(&raw));
}

#[tokio::test]
async fn reset_and_close_before_any_response() {
    let server = FaultServer::builder()
        .route("/reset", [Action::reset()])
        .route("/close", [Action::close()])
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/reset")).await;
    assert_eq!(read_all(&mut conn, SOON).await, (Vec::new(), End::Reset));
    let mut conn = connect_and_send(&server, &get("/close")).await;
    assert_eq!(read_all(&mut conn, SOON).await, (Vec::new(), End::Eof));
    assert_eq!(server.request_count(), 2, "both requests were read");
}

#[tokio::test]
async fn truncated_body_is_shorter_than_announced() {
    let server = FaultServer::builder()
        .default(Action::status(200).body("0123456789").truncate_after(4))
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/t")).await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(end, End::Eof);
    let (head, body) = split(&raw);
    assert!(head.contains("content-length: 10"), "{head}");
    assert_eq!(body, b"0123");

    // hyper sees an incomplete body.
    let server = FaultServer::builder()
        .default(Action::status(200).body_len(100_000).truncate_after(1000))
        .start()
        .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let res = client.get(server.url("/t").parse().unwrap()).await.unwrap();
    let err = res.into_body().collect().await.unwrap_err();
    let io = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<io::Error>())
        .map(io::Error::kind);
    assert_eq!(io, Some(io::ErrorKind::UnexpectedEof), "{err:?}");
}

#[tokio::test]
async fn connection_level_reset_and_close() {
    let server = FaultServer::builder()
        .connections([ConnectionAction::reset(), ConnectionAction::close()])
        .start()
        .await;
    let mut conn = TcpStream::connect(server.addr()).await.unwrap();
    assert_eq!(read_all(&mut conn, SOON).await, (Vec::new(), End::Reset));
    let mut conn = TcpStream::connect(server.addr()).await.unwrap();
    assert_eq!(read_all(&mut conn, SOON).await, (Vec::new(), End::Eof));
    assert_eq!(server.connections(), 2);
    assert_eq!(server.request_count(), 0);
}

#[tokio::test]
async fn head_request_gets_no_body() {
    let server = FaultServer::builder()
        .default(Action::status(200).body("body"))
        .start()
        .await;
    let mut conn = connect_and_send(
        &server,
        "HEAD / HTTP/1.1\r\nhost: t\r\n\r\nGET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(end, End::Eof, "the pipelined `connection: close` ends it");
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("content-length: 4").count(), 2, "{text}");
    assert!(text.ends_with("\r\n\r\nbody"), "{text}");
    assert_eq!(text.matches("body").count(), 1, "{text}");
}

#[tokio::test]
async fn large_body_streams_without_loss() {
    const LEN: u64 = 20 * 1024 * 1024;
    let server = FaultServer::builder()
        .default(Action::status(200).body_len(LEN))
        .start()
        .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let res = client
        .get(server.url("/big").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(res.headers()["content-length"], LEN.to_string().as_str());
    let mut body = res.into_body();
    let mut total = 0u64;
    while let Some(frame) = timeout(SOON, body.frame()).await.unwrap() {
        let data = frame.unwrap().into_data().unwrap();
        assert!(data.iter().all(|&b| b == b'x'));
        total += data.len() as u64;
    }
    assert_eq!(total, LEN);
}

#[tokio::test]
async fn reject_above_answers_429_past_the_limit() {
    let server = FaultServer::builder()
        .default(
            Action::status(200)
                .delay(Duration::from_millis(1500))
                .reject_above(2),
        )
        .start()
        .await;
    let mut conns = Vec::new();
    for _ in 0..2 {
        conns.push(connect_and_send(&server, &get("/load")).await);
    }
    // The first two are held; the next two find 3 in flight.
    server.wait_for_requests(2, SOON).await.unwrap();
    for _ in 0..2 {
        let mut conn = connect_and_send(&server, &get("/load")).await;
        let raw = read_n(&mut conn, 12, SOON).await;
        assert!(raw.starts_with(b"HTTP/1.1 429"), "{raw:?}");
    }
    for mut conn in conns {
        let raw = read_n(&mut conn, 12, SOON).await;
        assert!(raw.starts_with(b"HTTP/1.1 200"), "{raw:?}");
    }
    assert_eq!(server.peak_in_flight(), 3);
}

fn tls_client(
    server: &FaultServer,
    h2: bool,
) -> Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(server.root_store().unwrap())
        .with_no_client_auth();
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    let connector = if h2 {
        builder.enable_http2().build()
    } else {
        builder.enable_http1().build()
    };
    Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build(connector)
}

async fn tls_round_trip(h2: bool) {
    let server = FaultServer::builder()
        .route("/tls", [Action::status(201).body("over tls")])
        .tls()
        .start()
        .await;
    assert!(server.url("/tls").starts_with("https://127.0.0.1:"));
    assert!(server
        .ca_cert_pem()
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    let client = tls_client(&server, h2);
    let req = http::Request::post(server.url("/tls?k=v"))
        .body(Full::new(Bytes::from_static(b"payload")))
        .unwrap();
    let res = timeout(SOON, client.request(req)).await.unwrap().unwrap();
    let version = if h2 {
        http::Version::HTTP_2
    } else {
        http::Version::HTTP_11
    };
    assert_eq!(res.version(), version);
    assert_eq!(res.status(), 201);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "over tls");

    // A second request shares the connection.
    let res = client
        .request(
            http::Request::get(server.url("/again"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(server.connections(), 1);
    let requests = server.requests();
    assert_eq!(requests[0].version, version);
    assert_eq!(requests[0].target, "/tls?k=v");
    assert_eq!(requests[0].body, "payload");
}

#[tokio::test]
async fn tls_round_trip_http1() {
    tls_round_trip(false).await;
}

#[tokio::test]
async fn tls_round_trip_http2() {
    tls_round_trip(true).await;
}

#[tokio::test]
async fn http2_faults_reset_the_stream_and_stalls_stall() {
    let server = FaultServer::builder()
        .route("/reset", [Action::reset()])
        .route("/stall", [Action::stall_body()])
        .tls()
        .start()
        .await;
    let client = tls_client(&server, true);
    let get = |path: &str| {
        http::Request::get(server.url(path))
            .body(Full::default())
            .unwrap()
    };
    let err = timeout(SOON, client.request(get("/reset")))
        .await
        .unwrap()
        .unwrap_err();
    assert!(!err.is_connect(), "{err:?}");
    let res = timeout(SOON, client.request(get("/stall")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    assert!(
        timeout(QUIET, body.frame()).await.is_err(),
        "the body stalls"
    );
}

#[tokio::test]
async fn tls_handshake_hangs_when_scripted() {
    let server = FaultServer::builder()
        .connections([ConnectionAction::hang_tls()])
        .tls()
        .start()
        .await;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(server.root_store().unwrap())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();

    let tcp = TcpStream::connect(server.addr()).await.unwrap();
    let hung = timeout(QUIET, connector.connect(name.clone(), tcp)).await;
    assert!(hung.is_err(), "the handshake must not complete");

    // The next connection completes its handshake with the generated CA.
    let tcp = TcpStream::connect(server.addr()).await.unwrap();
    let done = timeout(SOON, connector.connect(name, tcp)).await.unwrap();
    assert!(done.is_ok(), "{done:?}");
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn wait_for_requests_is_bounded() {
    let server = FaultServer::builder().start().await;
    let err = server
        .wait_for_requests(1, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!((err.wanted(), err.seen()), (1, 0));
    assert_eq!(err.to_string(), "timed out waiting for 1 requests: saw 0");
    server.wait_for_connections(0, SOON).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_the_server_ends_its_stalls_and_tasks() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();
    let server = FaultServer::builder()
        .connections([ConnectionAction::never_read()])
        .default(Action::stall_body())
        .start()
        .await;
    let _never_read = TcpStream::connect(server.addr()).await.unwrap();
    let mut stalled = connect_and_send(&server, &get("/stall")).await;
    let head = read_n(&mut stalled, 1, SOON).await;
    assert!(head.starts_with(b"HTTP/1.1 200"));
    assert!(metrics.num_alive_tasks() > baseline);

    server.shutdown().await;
    assert_eq!(metrics.num_alive_tasks(), baseline, "no task left behind");
    let (_, end) = read_all(&mut stalled, SOON).await;
    assert_ne!(end, End::Quiet, "the stalled connection was closed");

    // Plain drop (no await) stops everything too.
    let server = FaultServer::builder()
        .default(Action::never_respond())
        .start()
        .await;
    let mut conn = connect_and_send(&server, &get("/")).await;
    server.wait_for_requests(1, SOON).await.unwrap();
    drop(server);
    let (_, end) = read_all(&mut conn, SOON).await;
    assert_ne!(end, End::Quiet);
}

#[tokio::test]
async fn default_connection_action_hangs_every_handshake() {
    let server = FaultServer::builder()
        .default_connection(ConnectionAction::hang_tls())
        .tls()
        .start()
        .await;
    let client = tls_client(&server, false);
    for _ in 0..2 {
        let req = http::Request::get(server.url("/"))
            .body(Full::default())
            .unwrap();
        assert!(timeout(QUIET, client.request(req)).await.is_err());
    }
    assert_eq!(server.connections(), 2);
    assert_eq!(server.request_count(), 0);
}

#[tokio::test]
async fn refused_addr_refuses() {
    let addr = rebound_test::fault::refused_addr().unwrap();
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
}

#[tokio::test(flavor = "current_thread")]
async fn waiting_connections_end_when_their_clients_leave() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let server = FaultServer::builder()
        .connections([ConnectionAction::never_read()])
        .route("/never", [Action::never_respond()])
        .route(
            "/delay",
            [Action::status(200).delay(Duration::from_secs(60))],
        )
        .route("/stall", [Action::stall_body()])
        .start()
        .await;
    let idle = metrics.num_alive_tasks();
    let mut clients = vec![connect_and_send(&server, &get("/")).await];
    server.wait_for_connections(1, SOON).await.unwrap();
    for path in ["/never", "/delay", "/stall"] {
        clients.push(connect_and_send(&server, &get(path)).await);
    }
    server.wait_for_requests(3, SOON).await.unwrap();
    assert_eq!(metrics.num_alive_tasks(), idle + 4);
    assert_eq!(server.in_flight(), 3);

    drop(clients);
    let deadline = Instant::now() + SOON;
    while metrics.num_alive_tasks() > idle && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        metrics.num_alive_tasks(),
        idle,
        "a connection task outlived its client"
    );
    assert_eq!(server.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_keeps_an_exact_peak_and_counts() {
    use futures_util::StreamExt;
    const REQUESTS: usize = 2_000;
    const CONCURRENCY: usize = 32;
    let server = FaultServer::builder()
        .default(Action::status(200).delay(Duration::from_millis(1)))
        .start()
        .await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: http::Uri = server.url("/load").parse().unwrap();
    let statuses: Vec<u16> = futures_util::stream::iter(0..REQUESTS)
        .map(|_| {
            let (client, uri) = (client.clone(), uri.clone());
            async move {
                let res = client.get(uri).await.unwrap();
                let status = res.status().as_u16();
                res.into_body().collect().await.unwrap();
                status
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    assert!(statuses.iter().all(|&s| s == 200));
    assert_eq!(server.request_count(), REQUESTS as u64);
    assert!(
        server.peak_in_flight() <= CONCURRENCY,
        "{}",
        server.peak_in_flight()
    );
    assert!(server.peak_in_flight() > 1, "requests overlapped");
    assert!(
        server.connections() <= CONCURRENCY as u64 * 2,
        "connections were reused"
    );
    let requests = server.requests();
    assert!(requests.iter().enumerate().all(|(i, r)| r.index == i));
}

#[tokio::test]
async fn script_can_change_while_running() {
    let server = FaultServer::builder().start().await;
    server.route("/a", [Action::status(418)]);
    server.set_default(Action::status(202));
    server.push_connections([ConnectionAction::reset()]);

    let mut conn = connect_and_send(&server, &get("/a")).await;
    assert_eq!(read_all(&mut conn, SOON).await.1, End::Reset);

    // HTTP/1.0 without keep-alive: one response, then the server closes.
    let mut conn = connect_and_send(&server, "GET /a HTTP/1.0\r\n\r\n").await;
    let (raw, end) = read_all(&mut conn, SOON).await;
    assert_eq!(end, End::Eof);
    assert!(raw.starts_with(b"HTTP/1.1 418 I'm a teapot\r\n"));

    let mut conn = connect_and_send(&server, "GET /b HTTP/1.0\r\n\r\n").await;
    let (raw, _) = read_all(&mut conn, SOON).await;
    assert!(raw.starts_with(b"HTTP/1.1 202 Accepted\r\n"));

    server.set_default_connection(ConnectionAction::close());
    let mut conn = TcpStream::connect(server.addr()).await.unwrap();
    assert_eq!(read_all(&mut conn, SOON).await, (Vec::new(), End::Eof));
    assert_eq!(server.connections(), 4);
    assert_eq!(server.request_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn delays_follow_a_paused_clock() {
    let server = FaultServer::builder()
        .default(Action::status(200).delay(Duration::from_secs(30)))
        .start()
        .await;
    let started = Instant::now();
    let mut conn = connect_and_send(&server, &get("/paused")).await;
    // Bounded in virtual time: the clock jumps to the server's 30 s timer
    // first, long before this one.
    let mut buf = [0u8; 12];
    timeout(Duration::from_secs(3600), conn.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    assert!(started.elapsed() >= Duration::from_secs(30));
    assert!(started.elapsed() < Duration::from_secs(3600));
    assert!(server.requests()[0].received_at < started + Duration::from_secs(1));
}

#[tokio::test]
async fn serve_then_silent_answers_n_requests_then_nothing() {
    let server = FaultServer::builder()
        .default(Action::status(200).body("ok"))
        .default_connection(ConnectionAction::serve_then_silent(1))
        .start()
        .await;
    // Two requests on one keep-alive connection: one answer, then silence
    // (no response, no close) although the second was read and recorded.
    let mut conn = connect_and_send(&server, &(get("/a") + &get("/b"))).await;
    server.wait_for_requests(2, SOON).await.unwrap();
    let (raw, end) = read_all(&mut conn, QUIET).await;
    assert_eq!(end, End::Quiet);
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 1, "{text}");
    assert!(text.ends_with("ok"), "{text}");
    assert_eq!(server.requests()[1].target, "/b");
    assert_eq!(server.requests()[1].index_on_connection, 1);
    // A new connection gets its one answer too.
    let mut other = connect_and_send(&server, &get("/c")).await;
    let (raw, _) = read_all(&mut other, QUIET).await;
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"));
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn after_body_bytes_answers_early_then_reads_and_records_the_whole_body() {
    let server = FaultServer::builder()
        .route(
            "/upload",
            [Action::status(503).body("busy").after_body_bytes(4096)],
        )
        .start()
        .await;
    for chunked in [false, true] {
        let mut conn = TcpStream::connect(server.addr()).await.unwrap();
        let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let framing = if chunked {
            "transfer-encoding: chunked".to_owned()
        } else {
            format!("content-length: {}", body.len())
        };
        let head = format!("POST /upload HTTP/1.1\r\nhost: test\r\n{framing}\r\n\r\n");
        conn.write_all(head.as_bytes()).await.unwrap();
        let send = |part: &[u8]| {
            if chunked {
                let mut out = format!("{:x}\r\n", part.len()).into_bytes();
                out.extend_from_slice(part);
                out.extend_from_slice(b"\r\n");
                out
            } else {
                part.to_vec()
            }
        };
        conn.write_all(&send(&body[..5000])).await.unwrap();
        // The answer comes before the rest of the body is sent.
        let expected = "HTTP/1.1 503 Service Unavailable\r\n";
        let raw = read_n(&mut conn, expected.len(), SOON).await;
        assert!(raw.starts_with(expected.as_bytes()), "{raw:?}");
        let before = server.request_count();
        conn.write_all(&send(&body[5000..])).await.unwrap();
        if chunked {
            conn.write_all(b"0\r\n\r\n").await.unwrap();
        }
        server
            .wait_for_requests(before + 1, SOON)
            .await
            .expect("recorded once the body is whole");
        let last = server.requests().pop().unwrap();
        assert_eq!(last.body.len(), body.len(), "chunked: {chunked}");
        assert!(last.body[..] == body[..]);
        // The connection is still good for the next request.
        conn.write_all(get("/next").as_bytes()).await.unwrap();
        server.wait_for_requests(before + 2, SOON).await.unwrap();
        // The queue is used up: the next upload is read whole first.
        server.route(
            "/upload",
            [Action::status(503).body("busy").after_body_bytes(4096)],
        );
    }
    assert_eq!(server.requests_started(), server.request_count());
}

#[tokio::test]
async fn go_away_refuses_the_first_http2_request_unprocessed_then_resets() {
    let server = FaultServer::builder()
        .tls()
        .connections([ConnectionAction::go_away(0), ConnectionAction::go_away(1)])
        .start()
        .await;
    for last_stream_id in [0u32, 1] {
        // A fresh client each time: one connection each.
        let client = tls_client(&server, true);
        let req = http::Request::post(server.url("/refused"))
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap();
        let err = timeout(SOON, client.request(req))
            .await
            .expect("answered within 5 s")
            .expect_err("no response");
        // The GOAWAY reaches hyper's client as the stream's error when it
        // is above the last stream id; below it, only the reset does.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
        let mut go_away = false;
        while let Some(e) = source {
            if let Some(h2) = e.downcast_ref::<hyper::Error>() {
                go_away |= format!("{h2:?}").contains("GoAway");
            }
            source = e.source();
        }
        assert_eq!(go_away, last_stream_id == 0, "{err:?}");
    }
    // Neither request was recorded or started: the server never read them
    // as requests.
    assert_eq!(server.connections(), 2);
    assert_eq!(server.request_count(), 0);
    assert_eq!(server.requests_started(), 0);
}

#[tokio::test]
async fn go_away_resets_a_connection_that_is_not_http2() {
    let server = FaultServer::builder()
        .tls()
        .connections([ConnectionAction::go_away(0)])
        .start()
        .await;
    let client = tls_client(&server, false);
    let req = http::Request::get(server.url("/h1"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    timeout(SOON, client.request(req))
        .await
        .expect("answered within 5 s")
        .expect_err("reset");
    assert_eq!(server.request_count(), 0);
}
