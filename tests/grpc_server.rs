//! Issue 12: on a tonic server, `InboundDeadlineLayer` makes the caller's
//! `grpc-timeout` the deadline the handler's outbound calls see.
#![cfg(feature = "tonic")]

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rebound::grpc::InboundDeadlineLayer;
use rebound::Deadline;
use rebound_test::grpc::{RawCodec, TestClient};
use tokio::time::Instant;
use tonic::server::NamedService;
use tonic::transport::Channel;

/// A hand-written tonic service: `/test.Deadline/Left` answers with the
/// milliseconds left before the task's current deadline ("none" without
/// one), as an outbound call made by the handler would see it.
#[derive(Clone)]
struct Left;

impl NamedService for Left {
    const NAME: &'static str = "test.Deadline";
}

struct Answer;

impl tonic::server::UnaryService<Bytes> for Answer {
    type Response = Bytes;
    type Future = std::future::Ready<Result<tonic::Response<Bytes>, tonic::Status>>;

    fn call(&mut self, _req: tonic::Request<Bytes>) -> Self::Future {
        let text = match Deadline::current() {
            Some(at) => at
                .saturating_duration_since(Instant::now())
                .as_millis()
                .to_string(),
            None => "none".to_owned(),
        };
        std::future::ready(Ok(tonic::Response::new(Bytes::from(text))))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Left {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(Answer, req).await)
        })
    }
}

#[tokio::test]
async fn a_tonic_server_hands_its_inbound_deadline_to_the_handler() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer(InboundDeadlineLayer::new())
                .add_service(Left)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let mut client = TestClient::new(channel);

        let mut req = tonic::Request::new(Bytes::new());
        req.set_timeout(Duration::from_millis(700));
        let left = client
            .unary_request("/test.Deadline/Left", req)
            .await
            .unwrap();
        let ms: u64 = std::str::from_utf8(left.get_ref())
            .unwrap()
            .parse()
            .unwrap();
        assert!((400..=700).contains(&ms), "{ms} ms left");

        // Without a grpc-timeout the handler has no deadline from the caller.
        let none = client
            .unary("/test.Deadline/Left", Bytes::new())
            .await
            .unwrap();
        assert_eq!(none.get_ref(), "none");
    })
    .await
    .unwrap();
}
