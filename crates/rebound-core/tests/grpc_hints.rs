//! Issue 20: the two ways a gRPC stack silently never retries say so once,
//! at WARN: an HTTP classifier that sees gRPC answers, and a gRPC call that
//! failed retryably on a method nobody marked retryable.
#![cfg(all(feature = "grpc", feature = "retry"))]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::Full;
use rebound_core::classify::HttpClassifier;
use rebound_core::grpc::GrpcClassifier;
use rebound_core::{ClassifyLayer, RetryLayer, RetryPolicy, RetryStop};
use rebound_test::capture::Capture;
use tower::{service_fn, ServiceBuilder, ServiceExt};

/// A gRPC server's answer: 200 OK over HTTP/2, `grpc-status` in the head
/// (Trailers-Only).
fn grpc_answer(status: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("grpc-status", status)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn call() -> Request<Full<Bytes>> {
    Request::post("http://grpc.example/test.Echo/Ping")
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn an_http_classifier_on_grpc_answers_warns_once() {
    let capture = Capture::new();
    let guard = capture.set_default();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default()))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(grpc_answer("14"))
        }));
    for _ in 0..3 {
        let res = svc.clone().oneshot(call()).await.unwrap();
        // The UNAVAILABLE went unread: a "success", not retried.
        assert!(res.extensions().get::<RetryStop>().is_none());
    }
    drop(guard); // one capture at a time (the kit serialises them)
    let warns = capture.count("an HTTP classifier sees gRPC responses");
    assert_eq!(warns, 1, "{}", capture.text());

    // An HTTP/1 JSON answer does not warn (control, in a fresh capture).
    let capture = Capture::new();
    let _guard = capture.set_default();
    let svc = ServiceBuilder::new()
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }));
    svc.oneshot(call()).await.unwrap();
    assert_eq!(capture.count("an HTTP classifier sees gRPC responses"), 0);
}

#[tokio::test]
async fn a_grpc_call_not_eligible_for_want_of_a_marked_method_warns_once() {
    let capture = Capture::new();
    let _guard = capture.set_default();
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default()))
        .layer(ClassifyLayer::new(GrpcClassifier::default()))
        .service(service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(grpc_answer("14"))
        }));
    for _ in 0..3 {
        let res = svc.clone().oneshot(call()).await.unwrap();
        assert_eq!(
            res.extensions().get::<RetryStop>(),
            Some(&RetryStop::NotEligible)
        );
    }
    let text = capture.text();
    assert_eq!(
        capture.count("its method is not marked retryable"),
        1,
        "{text}"
    );
    assert!(text.contains("RetryableMethods"), "{text}");
}
