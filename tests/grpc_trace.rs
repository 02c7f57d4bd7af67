//! Issue 12: a server-streaming call that fails in its trailers after two
//! messages is committed — never retried — and its final status is on the
//! trace. Alone in its test binary, with the capturing subscriber installed
//! first (tracing caches a callsite's interest process-wide).
#![cfg(feature = "tonic")]

use std::time::Duration;

use bytes::Bytes;
use rebound::grpc::tonic::IntoStatusLayer;
use rebound::grpc::{
    Code, GrpcClassifier, GrpcTrailersLayer, MarkRetryableLayer, RetryableMethods,
};
use rebound::{ClassifyLayer, DeadlineLayer, RetryLayer, RetryPolicy, TraceLayer};
use rebound_test::capture::Capture;
use rebound_test::grpc::{GrpcServer, Reply, TestClient};
use tonic::transport::Channel;
use tower::ServiceBuilder;

const LIST: &str = "/test.Echo/List";

#[tokio::test]
async fn a_stream_failing_in_its_trailers_is_not_retried_and_is_traced() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    tokio::time::timeout(Duration::from_secs(30), async {
        let server = GrpcServer::start(|_, _| Reply::Stream {
            messages: vec![Bytes::from_static(b"one"), Bytes::from_static(b"two")],
            code: tonic::Code::Internal,
        })
        .await
        .unwrap();
        let channel = Channel::from_shared(server.uri()).unwrap().connect_lazy();
        let stack = ServiceBuilder::new()
            .layer(IntoStatusLayer::new())
            .layer(TraceLayer::new())
            .layer(DeadlineLayer::new(Duration::from_secs(10)))
            .layer(MarkRetryableLayer::new(RetryableMethods::all()))
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
            .layer(GrpcTrailersLayer::new())
            // INTERNAL is retryable here, to show that a committed call is
            // not retried for it.
            .layer(ClassifyLayer::new(
                GrpcClassifier::default().retryable_code(Code::INTERNAL),
            ))
            .service(channel);
        let mut client = TestClient::new(stack);
        let mut stream = client
            .server_streaming(LIST, Bytes::new())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap(), "one");
        assert_eq!(stream.message().await.unwrap().unwrap(), "two");
        let status = stream.message().await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        drop(stream);
        assert_eq!(
            server.calls_to(LIST).len(),
            1,
            "a committed call is never retried"
        );
    })
    .await
    .unwrap();

    let failed: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.message() == Some("grpc call failed after its headers"))
        .collect();
    assert_eq!(failed.len(), 1, "{}", capture.text());
    assert_eq!(failed[0].field("grpc.code"), Some("INTERNAL"));
    assert_eq!(failed[0].field("grpc.status"), Some("13"));
    // The server's message is its own text: never logged.
    assert_eq!(capture.count("scripted"), 0, "{}", capture.text());
}
