//! Issue 12: `rebound::Client` speaks HTTP/2 with prior knowledge to a
//! plain-text tonic server, under a tonic client stub, with the gRPC
//! classifier and per-method eligibility from its builder.
#![cfg(feature = "tonic")]

use std::time::Duration;

use bytes::Bytes;
use rebound::grpc::{GrpcClassifier, RetryableMethods};
use rebound::Client;
use rebound_test::grpc::{GrpcServer, Reply, TestClient};

#[tokio::test]
async fn the_client_calls_a_plain_text_tonic_server() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let server = GrpcServer::start(|_, n| {
            if n == 0 {
                Reply::status(tonic::Code::Unavailable)
            } else {
                Reply::ok("pong")
            }
        })
        .await
        .unwrap();
        let client = Client::builder()
            .http2_prior_knowledge(true)
            .classifier(GrpcClassifier::default())
            .grpc_retryable_methods(RetryableMethods::none().service("test.Echo"))
            .total_timeout(Duration::from_secs(5))
            .attempt_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        // Not a Channel: the stub puts the server's origin in each URI.
        let mut stub = TestClient::with_origin(client, server.uri().parse().unwrap());
        let res = stub
            .unary("/test.Echo/Ping", Bytes::from_static(b"ping"))
            .await
            .unwrap();
        assert_eq!(res.get_ref(), "pong");
        let calls = server.calls_to("/test.Echo/Ping");
        assert_eq!(calls.len(), 2, "UNAVAILABLE, then OK");
        let timeout = calls[1].grpc_timeout().expect("the time left travels");
        let left = rebound::grpc::parse_grpc_timeout(&timeout.parse().unwrap()).unwrap();
        assert!(left <= Duration::from_secs(5), "{left:?}");
    })
    .await
    .unwrap();
}

/// Issue 20: a tonic client built with `Grpc::new` over `rebound::Client`
/// sends a path with no origin. That fails the same way every time: the
/// status is INTERNAL (not UNAVAILABLE, which callers retry), its message
/// says to use `with_origin`, and nothing reaches the server.
#[tokio::test]
async fn a_tonic_client_without_an_origin_gets_internal_with_a_hint() {
    use rebound::grpc::tonic::IntoStatusLayer;
    use tower::Layer;

    tokio::time::timeout(Duration::from_secs(30), async {
        let server = GrpcServer::start(|_, _| Reply::ok("pong")).await.unwrap();
        let client = Client::builder()
            .http2_prior_knowledge(true)
            .classifier(GrpcClassifier::default())
            .grpc_retryable_methods(RetryableMethods::none().service("test.Echo"))
            .build()
            .unwrap();
        let mut stub = TestClient::new(IntoStatusLayer::new().layer(client));
        let status = stub
            .unary("/test.Echo/Ping", Bytes::from_static(b"ping"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
        assert!(
            status.message().contains("with_origin"),
            "{}",
            status.message()
        );
        assert!(status.metadata().get("rebound-attempts").is_none());
        assert!(server.calls_to("/test.Echo/Ping").is_empty());
    })
    .await
    .unwrap();
}

/// Issue 20: tonic's `set_timeout` under `rebound::Client` is the call's
/// deadline: the client's own total (30 s here) and attempt timeout (20 s)
/// do not keep a call its caller gave 300 ms.
#[tokio::test]
async fn tonics_own_timeout_is_the_calls_deadline() {
    use rebound::grpc::tonic::IntoStatusLayer;
    use tower::Layer;

    tokio::time::timeout(Duration::from_secs(30), async {
        let server =
            GrpcServer::start(|_, _| Reply::after(Duration::from_secs(25), Reply::ok("late")))
                .await
                .unwrap();
        let client = Client::builder()
            .http2_prior_knowledge(true)
            .classifier(GrpcClassifier::default())
            .grpc_retryable_methods(RetryableMethods::none().service("test.Echo"))
            .total_timeout(Duration::from_secs(30))
            .attempt_timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let mut stub = TestClient::with_origin(
            IntoStatusLayer::new().layer(client),
            server.uri().parse().unwrap(),
        );
        let mut req = tonic::Request::new(Bytes::from_static(b"ping"));
        req.set_timeout(Duration::from_millis(300));
        let start = tokio::time::Instant::now();
        let status = stub
            .unary_request("/test.Echo/Ping", req)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        // Well under the attempt timeout, however slow the machine.
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        let calls = server.calls_to("/test.Echo/Ping");
        assert_eq!(calls.len(), 1);
        let sent = calls[0].grpc_timeout().expect("a grpc-timeout travels");
        let left = rebound::grpc::parse_grpc_timeout(&sent.parse().unwrap()).unwrap();
        assert!(left <= Duration::from_millis(300), "{left:?}");
    })
    .await
    .unwrap();
}
