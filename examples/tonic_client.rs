//! A tonic client through rebound's layers, over a real
//! `tonic::transport::Channel`, against a tonic server on loopback.
//!
//! Run: `cargo run --example tonic_client --features tonic` (about a
//! second).
//!
//! The server (tonic's server-side gRPC handling, served by hyper; messages
//! are raw bytes so no `protoc` is needed) has three methods:
//! * `/demo.Echo/Say` answers UNAVAILABLE twice, then OK: the client retries
//!   (the `demo.Echo` service is declared safe to retry) and prints 3
//!   attempts;
//! * `/demo.Echo/Busy` answers RESOURCE_EXHAUSTED with
//!   `grpc-retry-pushback-ms: 300`, then OK: the retry waits 300 ms, as the
//!   server asked;
//! * `/demo.Billing/Slow` takes 2 s: the 500 ms deadline ends it as
//!   DEADLINE_EXCEEDED, and the server was told how long it had
//!   (`grpc-timeout`).

use std::time::Duration;

use bytes::Bytes;
use rebound::grpc::tonic::{error_of, IntoStatusLayer};
use rebound::grpc::{
    Code, GrpcClassifier, GrpcTrailersLayer, MarkRetryableLayer, PropagateDeadlineLayer,
    RetryableMethods,
};
use rebound::{
    Attempts, Backoff, BackoffLayer, ClassifyLayer, DeadlineLayer, RetryAfterLayer, RetryLayer,
    RetryPolicy,
};
use rebound_test::grpc::{GrpcServer, Reply, TestClient};
use tokio::time::Instant;
use tonic::transport::Channel;
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = GrpcServer::start(|path, n| match (path, n) {
        ("/demo.Echo/Say", 0 | 1) => Reply::status(tonic::Code::Unavailable),
        ("/demo.Echo/Busy", 0) => Reply::pushback(tonic::Code::ResourceExhausted, 300),
        ("/demo.Billing/Slow", _) => Reply::after(Duration::from_secs(2), Reply::ok("late")),
        _ => Reply::ok("hello"),
    })
    .await?;

    // The rebound stack over a plain tonic channel, outer to inner. The
    // generated client (here a hand-written stub, `TestClient`) takes it as
    // it takes a channel.
    let channel = Channel::from_shared(server.uri())?.connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(IntoStatusLayer::new()) // rebound errors -> the right tonic::Status
        .layer(DeadlineLayer::new(Duration::from_millis(500)))
        .layer(MarkRetryableLayer::new(
            RetryableMethods::none().service("demo.Echo"),
        ))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
        .layer(PropagateDeadlineLayer::new()) // grpc-timeout = time left, per attempt
        .layer(BackoffLayer::new(Backoff::exponential(
            Duration::from_millis(20),
            Duration::from_millis(100),
        )))
        .layer(RetryAfterLayer::new()) // grpc-retry-pushback-ms
        .layer(GrpcTrailersLayer::new()) // a committed call's final status, on the trace
        .layer(ClassifyLayer::new(
            GrpcClassifier::default().retryable_code(Code::RESOURCE_EXHAUSTED),
        ))
        .service(channel);
    let mut client = TestClient::new(stack);

    for path in ["/demo.Echo/Say", "/demo.Echo/Busy", "/demo.Billing/Slow"] {
        let start = Instant::now();
        match client.unary(path, Bytes::from_static(b"hi")).await {
            Ok(res) => println!(
                "{path}: OK {:?} after {} attempt(s), {} ms",
                res.get_ref(),
                Attempts::of(res.extensions()),
                start.elapsed().as_millis()
            ),
            Err(status) => {
                let err = error_of(&status);
                println!(
                    "{path}: {:?} after {} attempt(s), {} ms ({})",
                    status.code(),
                    err.map_or(1, |e| e.attempts()),
                    start.elapsed().as_millis(),
                    status.message()
                );
            }
        }
    }
    let calls = server.calls();
    let first = calls.first().map(|c| c.at);
    for call in calls {
        println!(
            "  server saw {} at +{} ms, grpc-timeout: {}",
            call.path,
            first.map_or(0, |f| (call.at - f).as_millis()),
            call.grpc_timeout().unwrap_or("-")
        );
    }
    Ok(())
}
