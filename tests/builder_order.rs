//! Any order of the builder's setters builds the same client (issue 20):
//! `deadline_header` and `grpc_retryable_methods` once left `grpc-timeout`
//! off when called in that order.

use rebound::grpc::RetryableMethods;
use rebound::{Body, Client, ClientBuilder};
use rebound_test::fault::{Action, FaultServer};

const BUDGET: http::HeaderName = http::HeaderName::from_static("x-budget-ms");

async fn headers_sent(builder: ClientBuilder) -> (bool, bool) {
    let server = FaultServer::builder()
        .default(Action::status(200))
        .start()
        .await;
    let client: Client = builder.build().unwrap();
    let req = http::Request::post(server.url("/pkg.Svc/Call"))
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    client.send(req).await.unwrap();
    let seen = &server.requests()[0];
    (
        seen.header("grpc-timeout").is_some(),
        seen.header("x-budget-ms").is_some(),
    )
}

#[tokio::test]
async fn deadline_header_and_grpc_methods_in_either_order() {
    let a = headers_sent(
        Client::builder()
            .deadline_header(BUDGET)
            .grpc_retryable_methods(RetryableMethods::all()),
    )
    .await;
    let b = headers_sent(
        Client::builder()
            .grpc_retryable_methods(RetryableMethods::all())
            .deadline_header(BUDGET),
    )
    .await;
    assert_eq!(a, (true, true));
    assert_eq!(b, (true, true));
}

#[tokio::test]
async fn an_explicit_grpc_timeout_setting_wins_in_either_order() {
    let off_after = headers_sent(
        Client::builder()
            .grpc_retryable_methods(RetryableMethods::all())
            .propagate_grpc_timeout(false),
    )
    .await;
    let off_before = headers_sent(
        Client::builder()
            .propagate_grpc_timeout(false)
            .grpc_retryable_methods(RetryableMethods::all()),
    )
    .await;
    assert_eq!(off_after, (false, false));
    assert_eq!(off_before, (false, false));
}

/// `path_redaction` wins over the trace configuration's path redaction,
/// whichever is set first (its docs once said "whichever is set first").
#[tokio::test]
async fn path_redaction_wins_over_the_trace_configuration_in_either_order() {
    use rebound::redact::PathRedaction;
    use rebound::trace::TraceLayer;

    // A refused port: the error names the request's URL.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1/keys/sk-live-123");
    let trace_full = || {
        TraceLayer::builder()
            .path_redaction(PathRedaction::full())
            .build()
            .unwrap()
    };
    let builders = [
        Client::builder()
            .trace(trace_full())
            .path_redaction(PathRedaction::hidden()),
        Client::builder()
            .path_redaction(PathRedaction::hidden())
            .trace(trace_full()),
    ];
    for builder in builders {
        let client = builder.build().unwrap();
        let err = client
            .send(
                http::Request::get(url.as_str())
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
        assert!(!shown.contains("sk-live-123"), "{shown}");
    }
}
