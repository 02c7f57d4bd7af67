//! Issue 12: gRPC through rebound's layers over a real
//! `tonic::transport::Channel`, against a real tonic server
//! (`rebound_test::grpc`) on real sockets.
#![cfg(feature = "tonic")]

use rebound::ErrorKind;
use std::time::Duration;

use bytes::Bytes;
use rebound::grpc::tonic::{error_of, IntoStatusLayer};
use rebound::grpc::{
    parse_grpc_timeout, Code, GrpcClassifier, GrpcTrailersLayer, MarkRetryableLayer,
    PropagateDeadlineLayer, RetryableMethods,
};
use rebound::{
    Attempts, Backoff, BackoffLayer, ClassifyLayer, DeadlineLayer, RetryAfterLayer, RetryLayer,
    RetryPolicy, RetryStop,
};
use rebound_test::grpc::{GrpcServer, Reply, TestClient};
use tokio::time::Instant;
use tonic::transport::Channel;
use tower::ServiceBuilder;

const SAY: &str = "/test.Echo/Say";
const CHARGE: &str = "/test.Billing/Charge";

fn channel(uri: String) -> Channel {
    Channel::from_shared(uri).unwrap().connect_lazy()
}

/// The stack the README shows for tonic, outer to inner.
fn client(
    channel: Channel,
    classifier: GrpcClassifier,
    total: Duration,
) -> TestClient<
    impl tonic::client::GrpcService<
            tonic::body::Body,
            Error = tonic::Status,
            ResponseBody = impl http_body::Body<Data = Bytes, Error = rebound::Error> + Send + 'static,
        > + Clone,
> {
    let stack = ServiceBuilder::new()
        .layer(IntoStatusLayer::new())
        .layer(DeadlineLayer::new(total))
        .layer(MarkRetryableLayer::new(
            RetryableMethods::none().service("test.Echo"),
        ))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
        .layer(PropagateDeadlineLayer::new())
        .layer(BackoffLayer::new(Backoff::exponential(
            Duration::from_millis(10),
            Duration::from_millis(50),
        )))
        .layer(RetryAfterLayer::new())
        .layer(GrpcTrailersLayer::new())
        .layer(ClassifyLayer::new(classifier))
        .service(channel);
    TestClient::new(stack)
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("test took over 30 s")
}

#[tokio::test]
async fn unavailable_twice_then_ok_makes_three_calls() {
    within(async {
        let server = GrpcServer::start(|_, n| {
            if n < 2 {
                Reply::status(tonic::Code::Unavailable)
            } else {
                Reply::ok("ok")
            }
        })
        .await
        .unwrap();
        let mut c = client(
            channel(server.uri()),
            GrpcClassifier::default(),
            Duration::from_secs(10),
        );
        // Larger than one frame of most writers, still under the replay cap:
        // every attempt must carry the whole message, once.
        let message = Bytes::from(vec![7u8; 40 * 1024]);
        let res = c.unary(SAY, message.clone()).await.unwrap();
        assert_eq!(res.get_ref(), "ok");
        let calls = server.calls_to(SAY);
        assert_eq!(calls.len(), 3);
        for call in &calls {
            assert_eq!(
                call.message.as_ref(),
                Some(&message),
                "tonic's body, replayed"
            );
        }
        assert_eq!(Attempts::of(res.extensions()), 3);
        assert_eq!(res.metadata().get("rebound-attempts").unwrap(), "3");
    })
    .await
}

/// A server answering `code` to every call: `path` is called once, and the
/// status says why the loop stopped.
async fn called_once(code: tonic::Code, path: &'static str, stop: &str) {
    within(async {
        let server = GrpcServer::start(move |_, _| Reply::status(code))
            .await
            .unwrap();
        let mut c = client(
            channel(server.uri()),
            GrpcClassifier::default(),
            Duration::from_secs(10),
        );
        let status = c.unary(path, Bytes::new()).await.unwrap_err();
        assert_eq!(status.code(), code);
        assert_eq!(server.calls_to(path).len(), 1);
        assert_eq!(status.metadata().get("rebound-retry-stop").unwrap(), stop);
    })
    .await
}

#[tokio::test]
async fn invalid_argument_is_not_retried() {
    called_once(tonic::Code::InvalidArgument, SAY, "fatal").await
}

#[tokio::test]
async fn a_method_not_declared_retryable_is_called_once() {
    called_once(tonic::Code::Unavailable, CHARGE, "not_eligible").await
}

#[tokio::test]
async fn a_refused_connection_is_retried_whatever_the_method() {
    within(async {
        // A port that nothing listens on.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut c = client(
            channel(format!("http://127.0.0.1:{port}")),
            GrpcClassifier::default(),
            Duration::from_secs(10),
        );
        let status = c.unary(CHARGE, Bytes::new()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let err = error_of(&status).expect("the rebound error is the source");
        // Four attempts, and gRFC A6's one transparent retry of a call
        // that was never sent.
        assert_eq!(err.attempts(), 5, "{err}");
        assert_eq!(err.retry_stop(), Some(RetryStop::Attempts));
    })
    .await
}

#[tokio::test]
async fn pushback_sets_the_delay_and_negative_stops() {
    within(async {
        let server = GrpcServer::start(|path, n| match (path, n) {
            ("/test.Echo/Wait", 0) => Reply::pushback(tonic::Code::ResourceExhausted, 500),
            ("/test.Echo/Never", _) => Reply::pushback(tonic::Code::ResourceExhausted, -1),
            _ => Reply::ok("ok"),
        })
        .await
        .unwrap();
        let classifier = GrpcClassifier::default().retryable_code(Code::RESOURCE_EXHAUSTED);
        let mut c = client(channel(server.uri()), classifier, Duration::from_secs(10));

        c.unary("/test.Echo/Wait", Bytes::new()).await.unwrap();
        let calls = server.calls_to("/test.Echo/Wait");
        assert_eq!(calls.len(), 2);
        let gap = calls[1].at - calls[0].at;
        assert!(gap >= Duration::from_millis(500), "{gap:?}");
        assert!(gap < Duration::from_secs(5), "{gap:?}");

        let status = c.unary("/test.Echo/Never", Bytes::new()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(server.calls_to("/test.Echo/Never").len(), 1);
    })
    .await
}

/// A server that answers every call UNAVAILABLE (retryable) with
/// `grpc-retry-pushback-ms: value`: how many calls reach it.
async fn calls_with_pushback(value: &str) -> (usize, tonic::Status) {
    let value = value.to_owned();
    let server = GrpcServer::start(move |_, _| Reply::Status {
        code: tonic::Code::Unavailable,
        metadata: vec![("grpc-retry-pushback-ms", value.clone())],
    })
    .await
    .unwrap();
    let mut c = client(
        channel(server.uri()),
        GrpcClassifier::default(),
        Duration::from_secs(10),
    );
    let status = c.unary(SAY, Bytes::new()).await.unwrap_err();
    (server.calls_to(SAY).len(), status)
}

#[tokio::test]
async fn a_malformed_pushback_is_not_retried() {
    within(async {
        // gRFC A6: "If the value for pushback is negative or unparseble,
        // then it will be seen as the server asking the client not to
        // retry at all."
        for bad in ["abc", "", "1.5", "+5", " 5", "5, 6", "99999999999999999999"] {
            let (calls, status) = calls_with_pushback(bad).await;
            assert_eq!(calls, 1, "pushback {bad:?}: the server saw {calls} calls");
            // The caller gets the server's own status, and why it stopped.
            assert_eq!(status.code(), tonic::Code::Unavailable, "{bad:?}");
            assert_eq!(
                status.metadata().get("rebound-retry-stop").unwrap(),
                "fatal",
                "{bad:?}"
            );
        }
        // Control: a valid pushback is retried (4 attempts, 10 ms apart).
        let (calls, status) = calls_with_pushback("10").await;
        assert_eq!(calls, 4, "a valid pushback retries");
        assert_eq!(status.code(), tonic::Code::Unavailable);
    })
    .await
}

/// A raw HTTP/2 server answering every call Trailers-Only UNAVAILABLE with
/// two `grpc-retry-pushback-ms` header lines (tonic's `Status` metadata
/// keeps one value per key, so the scripted server cannot send this).
async fn two_pushback_lines() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |_req: http::Request<hyper::body::Incoming>| {
                        seen.fetch_add(1, Ordering::SeqCst);
                        let res = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "14")
                            .header("grpc-retry-pushback-ms", "10")
                            .header("grpc-retry-pushback-ms", "20")
                            .body(http_body_util::Empty::<Bytes>::new())
                            .unwrap();
                        async move { Ok::<_, std::convert::Infallible>(res) }
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(io), svc)
                        .await;
            });
        }
    });
    (format!("http://{addr}"), calls)
}

#[tokio::test]
async fn a_pushback_sent_twice_is_not_retried() {
    within(async {
        let (uri, calls) = two_pushback_lines().await;
        let mut c = client(
            channel(uri),
            GrpcClassifier::default(),
            Duration::from_secs(10),
        );
        let status = c.unary(SAY, Bytes::new()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    })
    .await
}

/// A path every scripted server below answers at once, to open the
/// connection before a timed call.
const WARM: &str = "/test.Echo/Warm";

/// Open `channel`'s connection (TCP and the HTTP/2 handshake) with one call
/// outside any deadline, so that a timed call after it measures the
/// deadline, not how fast this machine connects.
async fn warm(channel: &Channel) {
    let res = TestClient::new(channel.clone())
        .unary(WARM, Bytes::new())
        .await;
    res.expect("the warm-up call");
}

#[tokio::test]
async fn a_deadline_ends_a_slow_call_as_deadline_exceeded() {
    within(async {
        let server = GrpcServer::start(|path, _| {
            if path == WARM {
                Reply::ok("warm")
            } else {
                // Far past the deadline: only the deadline ends the call.
                Reply::after(Duration::from_secs(20), Reply::ok("late"))
            }
        })
        .await
        .unwrap();
        let channel = channel(server.uri());
        warm(&channel).await;
        let mut c = client(
            channel,
            GrpcClassifier::default(),
            Duration::from_millis(300),
        );
        let start = Instant::now();
        let status = c.unary(SAY, Bytes::new()).await.unwrap_err();
        let took = start.elapsed();
        assert_eq!(
            status.code(),
            tonic::Code::DeadlineExceeded,
            "{took:?} {status:?}"
        );
        assert!(matches!(
            error_of(&status).unwrap().kind(),
            ErrorKind::Timeout(_)
        ));
        // The deadline starts after `start`: never sooner. Long before the
        // server's answer (20 s); how late past 300 ms a loaded machine
        // delivers the error is not under test.
        assert!(took >= Duration::from_millis(290), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        let calls = server.calls_to(SAY);
        assert!(!calls.is_empty());
        for call in calls {
            let sent = call.grpc_timeout().expect("every attempt says how long");
            let sent = parse_grpc_timeout(&sent.parse().unwrap()).unwrap();
            // The time left when it was sent: at most the total, and at
            // least what was left when it arrived (the deadline was stamped
            // after `start`, the value written before the call arrived; 1 ms
            // for the rounding down of the encoding). Both hold however long
            // the transit takes.
            let left_on_arrival = Duration::from_millis(300).saturating_sub(call.at - start);
            assert!(sent <= Duration::from_millis(300), "{sent:?}");
            assert!(
                sent + Duration::from_millis(1) >= left_on_arrival,
                "{sent:?} vs {left_on_arrival:?} left on arrival"
            );
            assert!(sent > Duration::ZERO);
        }
    })
    .await
}

#[tokio::test]
async fn a_callers_longer_grpc_timeout_is_lowered_to_the_time_left() {
    within(async {
        let server = GrpcServer::start(|_, _| Reply::ok("ok")).await.unwrap();
        // A total that even a slow connect fits in, well under the 30 s asked.
        let mut c = client(
            channel(server.uri()),
            GrpcClassifier::default(),
            Duration::from_secs(5),
        );
        let mut req = tonic::Request::new(Bytes::new());
        req.set_timeout(Duration::from_secs(30));
        c.unary_request(SAY, req).await.unwrap();
        let call = &server.calls_to(SAY)[0];
        let sent = parse_grpc_timeout(&call.grpc_timeout().unwrap().parse().unwrap()).unwrap();
        assert!(sent <= Duration::from_secs(5), "{sent:?}");
    })
    .await
}

#[tokio::test]
async fn a_grpc_timeout_set_twice_is_sent_once_at_the_smaller_value() {
    within(async {
        let server = GrpcServer::start(|_, _| Reply::ok("ok")).await.unwrap();
        let mut c = client(
            channel(server.uri()),
            GrpcClassifier::default(),
            Duration::from_secs(10),
        );
        for order in [["100H", "300m"], ["300m", "100H"]] {
            let mut req = tonic::Request::new(Bytes::new());
            for t in order {
                req.metadata_mut()
                    .append("grpc-timeout", t.parse().unwrap());
            }
            c.unary_request(SAY, req).await.unwrap();
        }
        let calls = server.calls_to(SAY);
        assert_eq!(calls.len(), 2);
        for (call, order) in calls.iter().zip(["100H then 300m", "300m then 100H"]) {
            let sent: Vec<_> = call.headers.get_all("grpc-timeout").iter().collect();
            assert_eq!(sent.len(), 1, "{order}: {sent:?}");
            let sent = parse_grpc_timeout(sent[0]).unwrap();
            assert!(sent <= Duration::from_millis(300), "{order}: {sent:?}");
        }
    })
    .await
}

#[tokio::test]
async fn a_message_over_the_replay_cap_is_sent_once() {
    within(async {
        let server = GrpcServer::start(|_, _| Reply::status(tonic::Code::Unavailable))
            .await
            .unwrap();
        let mut c = client(
            channel(server.uri()),
            GrpcClassifier::default(),
            Duration::from_secs(10),
        );
        // Over RecordingBody's 64 KiB cap: the first attempt streams it whole,
        // and no retry can be made.
        let message = Bytes::from(vec![1u8; 100 * 1024]);
        let status = c.unary(SAY, message.clone()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let calls = server.calls_to(SAY);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].message.as_ref(), Some(&message));
        assert_eq!(
            status.metadata().get("rebound-retry-stop").unwrap(),
            "not_replayable"
        );
    })
    .await
}

#[tokio::test]
async fn tonics_set_timeout_becomes_the_deadline_with_the_inbound_layer_on_top() {
    within(async {
        let server = GrpcServer::start(|path, n| match (path, n) {
            (WARM, _) => Reply::ok("warm"),
            (_, 0) => Reply::status(tonic::Code::Unavailable),
            // Far past the deadline: only the deadline ends the call.
            _ => Reply::after(Duration::from_secs(20), Reply::ok("late")),
        })
        .await
        .unwrap();
        let channel = channel(server.uri());
        warm(&channel).await;
        // On a client stack, InboundDeadlineLayer reads the grpc-timeout
        // that tonic's `Request::set_timeout` wrote: the whole call, retries
        // included, ends by then, and each attempt carries what is left.
        let stack = ServiceBuilder::new()
            .layer(IntoStatusLayer::new())
            .layer(rebound::grpc::InboundDeadlineLayer::new())
            .layer(DeadlineLayer::new(Duration::from_secs(10)))
            .layer(MarkRetryableLayer::new(RetryableMethods::all()))
            .layer(RetryLayer::new(RetryPolicy::default().max_attempts(4)))
            .layer(PropagateDeadlineLayer::new())
            .layer(RetryAfterLayer::new())
            .layer(ClassifyLayer::new(GrpcClassifier::default()))
            .service(channel);
        let mut c = TestClient::new(stack);
        let mut req = tonic::Request::new(Bytes::new());
        // Room for two attempts on the warm connection, however loaded
        // the machine.
        req.set_timeout(Duration::from_secs(1));
        let start = Instant::now();
        let status = c.unary_request(SAY, req).await.unwrap_err();
        let took = start.elapsed();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        // Long before the server's answer (20 s).
        assert!(took < Duration::from_secs(10), "{took:?}");
        let calls = server.calls_to(SAY);
        assert_eq!(calls.len(), 2);
        let first = parse_grpc_timeout(&calls[0].grpc_timeout().unwrap().parse().unwrap()).unwrap();
        let second =
            parse_grpc_timeout(&calls[1].grpc_timeout().unwrap().parse().unwrap()).unwrap();
        assert!(first <= Duration::from_secs(1), "{first:?}");
        assert!(
            second < first,
            "the retry carries less: {second:?} vs {first:?}"
        );
    })
    .await
}

/// Issue 20: the bundle for a `Channel`, `StackLayer::grpc(methods)`, gets
/// the order right in one call: each method's policy, the time left as
/// `grpc-timeout`, no `Idempotency-Key` on gRPC calls, a method not marked
/// called once.
#[tokio::test]
async fn the_stack_layers_grpc_bundle_around_a_channel() {
    use rebound::grpc::MethodPolicy;
    use rebound::stack::StackLayer;

    within(async {
        let server = GrpcServer::start(|path, n| match (path, n) {
            (SAY, 0..=2) => Reply::status(tonic::Code::ResourceExhausted),
            (CHARGE, _) => Reply::status(tonic::Code::Unavailable),
            _ => Reply::ok("pong"),
        })
        .await
        .unwrap();
        let bundle = StackLayer::new()
            .deadline(DeadlineLayer::new(Duration::from_secs(10)))
            .backoff(BackoffLayer::new(Backoff::exponential(
                Duration::from_millis(10),
                Duration::from_millis(50),
            )))
            .grpc(
                RetryableMethods::none().service_policy(
                    "test.Echo",
                    MethodPolicy::new()
                        .max_attempts(5)
                        .retryable_codes([Code::UNAVAILABLE, Code::RESOURCE_EXHAUSTED]),
                ),
            );
        let svc = ServiceBuilder::new()
            .layer(IntoStatusLayer::new())
            .layer(bundle)
            .service(channel(server.uri()));
        let mut client = TestClient::new(svc);

        let res = client.unary(SAY, Bytes::new()).await.unwrap();
        assert_eq!(res.get_ref(), "pong");
        let calls = server.calls_to(SAY);
        assert_eq!(calls.len(), 4, "three RESOURCE_EXHAUSTED retried, then OK");
        for call in &calls {
            let left = parse_grpc_timeout(&call.grpc_timeout().unwrap().parse().unwrap()).unwrap();
            assert!(left <= Duration::from_secs(10), "{left:?}");
            assert!(!call.headers.contains_key("idempotency-key"));
        }

        // Billing is not marked: called once, however retryable its code.
        let status = client.unary(CHARGE, Bytes::new()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(server.calls_to(CHARGE).len(), 1);
    })
    .await
}
