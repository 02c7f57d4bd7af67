//! The plain hyper server under [`QuotaServer`](crate::quota::QuotaServer)
//! and [`QueueingServer`](crate::queueing::QueueingServer): `127.0.0.1:0`,
//! HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on the same port
//! (hyper-util's `auto` builder tells them apart by the connection
//! preface), every task on one tracker, all of them stopped when the
//! server is dropped (as the [`FaultServer`](crate::fault::FaultServer)
//! does).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The response body both servers answer with: small and in memory.
pub(crate) type Body = Full<Bytes>;

/// Runs hyper's HTTP/2 stream tasks on the server's tracker, so that they
/// stop with the server.
#[derive(Clone, Debug)]
struct Exec {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl<F> hyper::rt::Executor<F> for Exec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = fut => {}
            }
        });
    }
}

/// A server that runs until dropped.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl Running {
    /// Stops accepting, ends every connection and waits until every task
    /// is gone.
    pub(crate) async fn shutdown(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.tracker.close();
    }
}

/// Binds `127.0.0.1:0` and serves every request with `handler`.
pub(crate) async fn start<H, F>(handler: H) -> io::Result<Running>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let exec = Exec {
        tracker: tracker.clone(),
        cancel: cancel.clone(),
    };
    let stop = cancel.clone();
    tracker.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = accept_loop(listener, handler, exec) => {}
        }
    });
    Ok(Running {
        addr,
        cancel,
        tracker,
    })
}

async fn accept_loop<H, F>(listener: TcpListener, handler: H, exec: Exec)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let builder = auto::Builder::new(exec.clone());
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of file descriptors or an aborted handshake: keep
                // accepting, without spinning.
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let handler = handler.clone();
        let svc = hyper::service::service_fn(move |req| {
            let answer = handler(req);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let builder = builder.clone();
        let cancel = exec.cancel.clone();
        exec.tracker.spawn(async move {
            let conn = builder.serve_connection(TokioIo::new(tcp), svc);
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

/// Waits until `counter` reaches `n`, or `timeout` (`tokio::time`) has
/// passed; `true` if it was reached.
pub(crate) async fn wait(
    counter: &tokio::sync::watch::Sender<u64>,
    n: u64,
    timeout: Duration,
) -> bool {
    let mut rx = counter.subscribe();
    let reached = tokio::time::timeout(timeout, rx.wait_for(|seen| *seen >= n)).await;
    matches!(reached, Ok(Ok(_)))
}
