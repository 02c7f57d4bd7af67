//! A scripted tonic server on `127.0.0.1:0`, and a hand-written client stub
//! (feature `tonic`): real gRPC over real sockets, with no `protoc`.
//!
//! Messages are raw bytes ([`RawCodec`]): tonic's own framing, encoding of
//! statuses (Trailers-Only for an error before any message, trailers after
//! messages) and metadata, without a generated message type.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use bytes::Bytes;
//! use rebound_test::grpc::{GrpcServer, Reply, TestClient};
//!
//! // The first call to a path fails with UNAVAILABLE, the next succeed.
//! let server = GrpcServer::start(|_path, n| {
//!     if n == 0 { Reply::status(tonic::Code::Unavailable) } else { Reply::ok("hi") }
//! })
//! .await?;
//! let channel = tonic::transport::Channel::from_shared(server.uri()).unwrap().connect_lazy();
//! let mut client = TestClient::new(channel);
//! let first = client.unary("/test.Echo/Say", Bytes::new()).await.unwrap_err();
//! assert_eq!(first.code(), tonic::Code::Unavailable);
//! let second = client.unary("/test.Echo/Say", Bytes::new()).await.unwrap();
//! assert_eq!(second.into_inner(), "hi");
//! assert_eq!(server.calls_to("/test.Echo/Say").len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! The server is served by hyper directly, not by
//! `tonic::transport::Server`: tonic's server answers CANCELLED when the
//! caller's `grpc-timeout` runs out, which would race the client's own
//! deadline in a test that wants to see the client give up. Each call's
//! `grpc-timeout` is recorded ([`GrpcCall::grpc_timeout`]).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures_util::Stream;
use http::uri::PathAndQuery;
use http::HeaderMap;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type MessageStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send + 'static>>;

// ===== codec =====

/// A tonic codec whose messages are raw bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

/// The encoder of [`RawCodec`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RawEncoder;

/// The decoder of [`RawCodec`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

// ===== script =====

/// What the server answers to one call.
#[derive(Clone, Debug)]
pub enum Reply {
    /// One message, then OK.
    Ok(Bytes),
    /// A status before any message (Trailers-Only), with metadata.
    Status {
        /// The code.
        code: Code,
        /// Metadata sent with it, e.g. `grpc-retry-pushback-ms`.
        metadata: Vec<(&'static str, String)>,
    },
    /// A server stream: these messages, then this status in the trailers.
    Stream {
        /// The messages.
        messages: Vec<Bytes>,
        /// The final status.
        code: Code,
    },
    /// Wait, then answer.
    After(Duration, Box<Reply>),
}

impl Reply {
    /// One message `body`, then OK.
    pub fn ok(body: impl Into<Bytes>) -> Reply {
        Reply::Ok(body.into())
    }

    /// A Trailers-Only status.
    pub fn status(code: Code) -> Reply {
        Reply::Status {
            code,
            metadata: Vec::new(),
        }
    }

    /// A Trailers-Only status with `grpc-retry-pushback-ms: ms`.
    pub fn pushback(code: Code, ms: i64) -> Reply {
        Reply::Status {
            code,
            metadata: vec![("grpc-retry-pushback-ms", ms.to_string())],
        }
    }

    /// This reply, after `delay`.
    pub fn after(delay: Duration, reply: Reply) -> Reply {
        Reply::After(delay, Box::new(reply))
    }

    fn is_stream(&self) -> bool {
        match self {
            Reply::Stream { .. } => true,
            Reply::After(_, r) => r.is_stream(),
            _ => false,
        }
    }

    fn delay_and_reply(self) -> (Duration, Reply) {
        match self {
            Reply::After(d, r) => {
                let (more, r) = r.delay_and_reply();
                (d + more, r)
            }
            r => (Duration::ZERO, r),
        }
    }
}

fn status_of(code: Code, metadata: Vec<(&'static str, String)>) -> Status {
    let mut map = MetadataMap::new();
    for (k, v) in metadata {
        if let Ok(v) = MetadataValue::try_from(v.as_str()) {
            map.insert(k, v);
        }
    }
    Status::with_metadata(code, "scripted", map)
}

struct Unary(Reply, Recorder);

/// Where a handler writes the message it decoded: call `index` of the log.
#[derive(Clone)]
struct Recorder {
    log: Arc<Mutex<Log>>,
    index: usize,
}

impl Recorder {
    fn message(&self, message: &Bytes) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(call) = log.calls.get_mut(self.index) {
            call.message = Some(message.clone());
        }
    }
}

impl tonic::server::UnaryService<Bytes> for Unary {
    type Response = Bytes;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        self.1.message(req.get_ref());
        let (delay, reply) = self.0.clone().delay_and_reply();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            match reply {
                Reply::Ok(b) => Ok(tonic::Response::new(b)),
                Reply::Status { code, metadata } => Err(status_of(code, metadata)),
                Reply::Stream { code, .. } => Err(Status::new(code, "scripted")),
                Reply::After(..) => unreachable!("flattened"),
            }
        })
    }
}

struct ServerStream(Reply, Recorder);

impl tonic::server::ServerStreamingService<Bytes> for ServerStream {
    type Response = Bytes;
    type ResponseStream = MessageStream;
    type Future = BoxFuture<Result<tonic::Response<MessageStream>, Status>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        self.1.message(req.get_ref());
        let (delay, reply) = self.0.clone().delay_and_reply();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let Reply::Stream { messages, code } = reply else {
                unreachable!("dispatched by is_stream")
            };
            let mut items: Vec<Result<Bytes, Status>> = messages.into_iter().map(Ok).collect();
            if code != Code::Ok {
                items.push(Err(Status::new(code, "scripted")));
            }
            let stream: MessageStream = Box::pin(futures_util::stream::iter(items));
            Ok(tonic::Response::new(stream))
        })
    }
}

// ===== server =====

/// One call the server received.
#[derive(Clone, Debug)]
pub struct GrpcCall {
    /// `/package.Service/Method`.
    pub path: String,
    /// When it arrived.
    pub at: Instant,
    /// Its request headers (metadata).
    pub headers: HeaderMap,
    /// The request message, once the handler decoded it (`None` if the
    /// call's body never arrived whole).
    pub message: Option<Bytes>,
}

impl GrpcCall {
    /// Its `grpc-timeout`, as sent.
    pub fn grpc_timeout(&self) -> Option<&str> {
        self.headers
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct Log {
    calls: Vec<GrpcCall>,
    per_path: HashMap<String, usize>,
}

/// A scripted gRPC server (see the [module docs](self)). Stopped when
/// dropped.
pub struct GrpcServer {
    addr: SocketAddr,
    log: Arc<Mutex<Log>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for GrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl GrpcServer {
    /// Listen on `127.0.0.1:0`; `script(path, n)` answers the `n`-th call
    /// (from 0) to `path`.
    pub async fn start<F>(script: F) -> io::Result<GrpcServer>
    where
        F: Fn(&str, usize) -> Reply + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Log::default()));
        let script = Arc::new(script);
        let task = {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                loop {
                    let Ok((io, _)) = listener.accept().await else {
                        continue;
                    };
                    let log = Arc::clone(&log);
                    let script = Arc::clone(&script);
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(
                            move |req: http::Request<hyper::body::Incoming>| {
                                let path = req.uri().path().to_owned();
                                let (n, index) = {
                                    let mut log =
                                        log.lock().unwrap_or_else(PoisonError::into_inner);
                                    let index = log.calls.len();
                                    log.calls.push(GrpcCall {
                                        path: path.clone(),
                                        at: Instant::now(),
                                        headers: req.headers().clone(),
                                        message: None,
                                    });
                                    let n = log.per_path.entry(path.clone()).or_insert(0);
                                    *n += 1;
                                    (*n - 1, index)
                                };
                                let recorder = Recorder {
                                    log: Arc::clone(&log),
                                    index,
                                };
                                let reply = script(&path, n);
                                async move {
                                    let mut grpc = tonic::server::Grpc::new(RawCodec);
                                    let res = if reply.is_stream() {
                                        grpc.server_streaming(ServerStream(reply, recorder), req)
                                            .await
                                    } else {
                                        grpc.unary(Unary(reply, recorder), req).await
                                    };
                                    Ok::<_, std::convert::Infallible>(res)
                                }
                            },
                        );
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(io), svc)
                            .await;
                    });
                }
            })
        };
        Ok(GrpcServer { addr, log, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every call received so far.
    pub fn calls(&self) -> Vec<GrpcCall> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .calls
            .clone()
    }

    /// The calls received so far to `path`.
    pub fn calls_to(&self, path: &str) -> Vec<GrpcCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.path == path)
            .collect()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ===== client =====

/// A hand-written client stub over any gRPC service (a
/// `tonic::transport::Channel`, or a rebound stack over one), the way
/// tonic's generated `MyServiceClient::new(channel)` is.
#[derive(Clone, Debug)]
pub struct TestClient<T> {
    inner: tonic::client::Grpc<T>,
}

impl<T> TestClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    /// A client over `service`.
    pub fn new(service: T) -> Self {
        TestClient {
            inner: tonic::client::Grpc::new(service),
        }
    }

    /// A client over `service` whose requests carry `origin`
    /// (`http://host:port`) in their URI, as a service that is not a
    /// `tonic::transport::Channel` (e.g. `rebound::Client`) needs; tonic's
    /// generated clients have the same `with_origin`.
    pub fn with_origin(service: T, origin: http::Uri) -> Self {
        TestClient {
            inner: tonic::client::Grpc::with_origin(service, origin),
        }
    }

    /// A unary call to `path` with `message`.
    pub async fn unary(
        &mut self,
        path: &'static str,
        message: Bytes,
    ) -> Result<tonic::Response<Bytes>, Status> {
        self.unary_request(path, tonic::Request::new(message)).await
    }

    /// A unary call to `path` with a prepared request (metadata, timeout).
    pub async fn unary_request(
        &mut self,
        path: &'static str,
        request: tonic::Request<Bytes>,
    ) -> Result<tonic::Response<Bytes>, Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("not ready: {}", e.into())))?;
        self.inner
            .unary(request, PathAndQuery::from_static(path), RawCodec)
            .await
    }

    /// A server-streaming call to `path`.
    pub async fn server_streaming(
        &mut self,
        path: &'static str,
        message: Bytes,
    ) -> Result<tonic::Response<tonic::codec::Streaming<Bytes>>, Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("not ready: {}", e.into())))?;
        self.inner
            .server_streaming(
                tonic::Request::new(message),
                PathAndQuery::from_static(path),
                RawCodec,
            )
            .await
    }
}
