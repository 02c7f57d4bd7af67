//! Issue 20: `Client::builder().grpc(methods)` gets gRPC right in one call,
//! over real sockets against a tonic server: each method's own retry policy
//! (gRFC A6's service config: attempts and codes), and a committed call's
//! final status read from its trailers by the client itself, on its
//! one-service path and on its layered (hedged) path. Alone in its test
//! binary, with the capturing subscriber installed first (tracing caches a
//! callsite's interest process-wide).
#![cfg(feature = "tonic")]

use std::time::Duration;

use bytes::Bytes;
use rebound::grpc::{Code, MethodPolicy, RetryableMethods};
use rebound::hedge::HedgePolicy;
use rebound::Client;
use rebound_test::capture::Capture;
use rebound_test::grpc::{GrpcServer, Reply, TestClient};

const GET: &str = "/test.Store/Get";
const PUT: &str = "/test.Store/Put";
const LIST: &str = "/test.Echo/List";

fn methods() -> RetryableMethods {
    RetryableMethods::none()
        .service_policy(
            "test.Store",
            MethodPolicy::new()
                .max_attempts(4)
                .retryable_codes([Code::UNAVAILABLE, Code::RESOURCE_EXHAUSTED]),
        )
        .method_policy(PUT, MethodPolicy::new().max_attempts(2))
        .service("test.Echo")
}

#[tokio::test]
async fn the_grpc_preset_retries_by_each_methods_policy_and_reads_trailers() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    tokio::time::timeout(Duration::from_secs(60), async {
        let server = GrpcServer::start(|path, n| match path {
            // Three RESOURCE_EXHAUSTED, then OK.
            GET | PUT if n < 3 => Reply::status(tonic::Code::ResourceExhausted),
            LIST => Reply::Stream {
                messages: vec![Bytes::from_static(b"one")],
                code: tonic::Code::Internal,
            },
            _ => Reply::ok("pong"),
        })
        .await
        .unwrap();
        let origin: http::Uri = server.uri().parse().unwrap();
        let one = Client::builder()
            .grpc(methods())
            .total_timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        assert!(
            one.layers().contains(&"GrpcTrailersLayer"),
            "{:?}",
            one.layers()
        );
        let hedged = Client::builder()
            .grpc(methods())
            .hedge(HedgePolicy::fixed(Duration::from_secs(5)))
            .total_timeout(Duration::from_secs(20))
            .build()
            .unwrap();

        // test.Store/Get: its service's policy, RESOURCE_EXHAUSTED retried,
        // four attempts (the client's default is three, and its classifier
        // retries UNAVAILABLE only).
        let mut stub = TestClient::with_origin(one.clone(), origin.clone());
        let res = stub.unary(GET, Bytes::new()).await.unwrap();
        assert_eq!(res.get_ref(), "pong");
        assert_eq!(server.calls_to(GET).len(), 4);

        // test.Store/Put: its own policy, two attempts, UNAVAILABLE only.
        let status = stub.unary(PUT, Bytes::new()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert_eq!(
            server.calls_to(PUT).len(),
            1,
            "RESOURCE_EXHAUSTED is fatal for Put"
        );

        // A committed stream failing in its trailers: never retried, its
        // status recorded by the client, on both of its paths.
        for client in [one, hedged] {
            let before = server.calls_to(LIST).len();
            let mut stub = TestClient::with_origin(client, origin.clone());
            let mut stream = stub
                .server_streaming(LIST, Bytes::new())
                .await
                .unwrap()
                .into_inner();
            assert_eq!(stream.message().await.unwrap().unwrap(), "one");
            let status = stream.message().await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::Internal);
            drop(stream);
            assert_eq!(
                server.calls_to(LIST).len(),
                before + 1,
                "committed: sent once"
            );
        }
    })
    .await
    .unwrap();

    let failed: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.message() == Some("grpc call failed after its headers"))
        .collect();
    assert_eq!(failed.len(), 2, "one per path: {}", capture.text());
    for event in &failed {
        assert_eq!(event.field("grpc.code"), Some("INTERNAL"));
        assert_eq!(event.field("grpc.status"), Some("13"));
    }
    // The server's message is its own text: never logged.
    assert_eq!(capture.count("scripted"), 0, "{}", capture.text());
}
