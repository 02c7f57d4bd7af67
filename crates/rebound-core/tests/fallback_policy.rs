//! `FallbackLayer`'s rules that `fallback.rs` had no test for, on paused
//! time over `tower::service_fn`: it falls back after an open circuit (the
//! real breaker below it) and after a connect failure not sent; never when
//! the request body has no replayable copy; never when the shared retry
//! budget refuses (one token per fallback); never once the deadline has
//! passed. Each "never" test has a control that falls back when the one
//! condition it tests is lifted, so it cannot pass by not falling back at
//! all. A body that passed its replay cap during the primary's attempt is
//! never sent to an alternate route (it would go out truncated).
#![cfg(all(feature = "fallback", feature = "retry", feature = "breaker"))]
#![allow(clippy::type_complexity)]

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use rebound_core::breaker::{CircuitBreakerConfig, CircuitBreakerLayer};
use rebound_core::classify::{ClassifyLayer, HttpClassifier};
use rebound_core::fallback::{FallbackLayer, Route, Served};
use rebound_core::replay::RecordingBody;
use rebound_core::retry::{RetryBudget, RetryLayer, RetryPolicy};
use rebound_core::{BoxError, CircuitState, CloneableBody, Deadline, Error, ErrorKind, Sent};
use tokio::time::{sleep, Instant};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

type ResB = Full<Bytes>;

const PRIMARY: &str = "https://primary.example/v1/chat";
const SECONDARY: &str = "https://secondary.example";

/// How the failing hosts (`primary.example`, `down.example`) fail.
#[derive(Clone, Copy)]
enum Fail {
    /// This status, at once.
    Status(u16),
    /// A connect error marked not sent, after this long.
    Connect(Duration),
}

/// What each host received: the request's body, or why it could not be
/// read whole.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, Result<Bytes, String>)>>>);

impl Seen {
    fn to(&self, host: &str) -> usize {
        self.bodies_to(host).len()
    }
    fn bodies_to(&self, host: &str) -> Vec<Result<Bytes, String>> {
        let seen = self.0.lock().unwrap();
        seen.iter()
            .filter(|(h, _)| h == host)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

fn connect_error() -> BoxError {
    let mut err = Error::new(ErrorKind::Connect).with_detail("connection refused");
    err.extensions_mut().insert(Sent::NotSent);
    Box::new(err)
}

/// Reads each request's body whole, then fails as `fail` says on
/// `primary.example` and `down.example`, and answers 200 elsewhere.
fn server<B>(
    fail: Fail,
) -> (
    Seen,
    impl Service<
            Request<B>,
            Response = Response<ResB>,
            Error = BoxError,
            Future = impl Future<Output = Result<Response<ResB>, BoxError>> + Send,
        > + Clone
        + Send
        + 'static,
)
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let seen = Seen::default();
    let svc = {
        let seen = seen.clone();
        tower::service_fn(move |req: Request<B>| {
            let seen = seen.clone();
            async move {
                let host = req.uri().host().unwrap_or_default().to_owned();
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .map_err(|e| e.into().to_string());
                seen.0.lock().unwrap().push((host.clone(), body));
                if host != "primary.example" && host != "down.example" {
                    return Ok(Response::new(Full::default()));
                }
                match fail {
                    Fail::Status(code) => {
                        let mut res = Response::new(Full::default());
                        *res.status_mut() = StatusCode::from_u16(code).unwrap();
                        Ok(res)
                    }
                    Fail::Connect(after) => {
                        sleep(after).await;
                        Err(connect_error())
                    }
                }
            }
        })
    };
    (seen, svc)
}

fn post<B>(body: B) -> Request<B> {
    Request::post(PRIMARY).body(body).unwrap()
}

fn prompt() -> Full<Bytes> {
    Full::new(Bytes::from_static(b"prompt"))
}

fn served<T>(outcome: &Result<Response<T>, Error>) -> Option<usize> {
    let ext = match outcome {
        Ok(res) => res.extensions(),
        Err(err) => err.extensions(),
    };
    ext.get::<Served>().map(|s| s.route)
}

// ===== when it falls back =====

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_open_circuit_on_the_primary_is_served_by_route_1() {
    let breaker = CircuitBreakerLayer::new(
        CircuitBreakerConfig::default()
            .failure_ratio(0.5)
            .minimum_throughput(2)
            .break_duration(Duration::from_secs(30)),
    );
    let (seen, inner) = server::<Full<Bytes>>(Fail::Status(503));
    // Fallback above the retry loop, the breaker below it (its place).
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(2)))
        .layer(breaker.clone())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner.clone());

    // Two 503s (two POSTs, not retried) open the primary's circuit; each
    // falls back already.
    for _ in 0..2 {
        let _ = svc.clone().oneshot(post(prompt())).await;
    }
    let primary: Uri = PRIMARY.parse().unwrap();
    assert_eq!(breaker.state(&primary), CircuitState::Open);
    assert_eq!(seen.to("primary.example"), 2);

    // Control: below the fallback, the primary now fails at once with
    // CircuitOpen, not sent.
    let bare = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(2)))
        .layer(breaker.clone())
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let err = bare.oneshot(post(prompt())).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
    assert_eq!(err.extensions().get::<Sent>(), Some(&Sent::NotSent));

    let secondary_before = seen.to("secondary.example");
    let out = svc.oneshot(post(prompt())).await;
    assert_eq!(served(&out), Some(1), "served by route 1");
    let res = out.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        seen.to("primary.example"),
        2,
        "the open circuit sent nothing"
    );
    assert_eq!(seen.to("secondary.example"), secondary_before + 1);
    assert_eq!(
        seen.bodies_to("secondary.example")
            .last()
            .unwrap()
            .as_deref(),
        Ok(&b"prompt"[..])
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_connect_failure_not_sent_is_served_by_route_1() {
    // Classified (Retryable, not sent) and retried until the attempts run
    // out, as in the ready-made stack.
    let (seen, inner) = server::<Full<Bytes>>(Fail::Connect(Duration::ZERO));
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(2)))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner.clone());
    let out = svc.oneshot(post(prompt())).await;
    assert_eq!(served(&out), Some(1));
    assert_eq!(out.unwrap().status(), StatusCode::OK);
    assert_eq!(
        seen.to("primary.example"),
        2,
        "the POST is retried: not sent"
    );
    assert_eq!(seen.to("secondary.example"), 1);

    // And by its kind alone, with no classifier to give it a verdict.
    let (seen, inner) = server::<Full<Bytes>>(Fail::Connect(Duration::ZERO));
    let bare = FallbackLayer::new([Route::base_url(SECONDARY)]).layer(inner);
    let out = bare.oneshot(post(prompt())).await;
    assert_eq!(served(&out), Some(1));
    assert_eq!(out.unwrap().status(), StatusCode::OK);
    assert_eq!(
        (seen.to("primary.example"), seen.to("secondary.example")),
        (1, 1)
    );
}

// ===== never without a copy of the body =====

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_without_a_replayable_copy_never_falls_back() {
    // No retry layer below: its own "body not replayable" verdict would
    // hide the fallback's rule. A body larger than its replay cap (known
    // from its size) has no copy from the start.
    let body = RecordingBody::with_max_bytes(prompt(), 2);
    assert!(body.try_replay().is_none());
    let (seen, inner) = server(Fail::Status(503));
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let out = svc.oneshot(post(body)).await;
    assert_eq!(served(&out), None);
    assert_eq!(out.unwrap().status(), 503, "the primary's failure");
    assert_eq!(
        seen.bodies_to("primary.example"),
        [Ok(Bytes::from("prompt"))]
    );
    assert_eq!(seen.to("secondary.example"), 0, "route 1 got nothing");

    // Control: the same body under its cap falls back.
    let (seen, inner) = server(Fail::Status(503));
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let out = svc.oneshot(post(RecordingBody::new(prompt()))).await;
    assert_eq!(served(&out), Some(1));
    assert_eq!(
        seen.bodies_to("secondary.example"),
        [Ok(Bytes::from("prompt"))]
    );
}

type Streamed = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A streamed body of unknown length: 12 bytes in three chunks.
fn streamed() -> Streamed {
    let chunks: Vec<_> = ["aaaa", "bbbb", "cccc"]
        .into_iter()
        .map(|c| Ok(Frame::data(Bytes::from(c))))
        .collect();
    StreamBody::new(stream::iter(chunks))
}

/// Send a POST whose streamed body passes its cap in the primary's
/// attempt through `svc`; check that the primary got it whole and that no
/// copy can be made any more; return the caller's outcome.
async fn send_past_the_cap<S>(svc: S, seen: &Seen) -> Result<Response<ResB>, Error>
where
    S: Service<Request<RecordingBody<Streamed>>, Response = Response<ResB>, Error = Error>,
{
    // The copy exists when the request is made (nothing read yet), but the
    // primary's attempt streams the body past its 4-byte cap: from then on
    // `try_replay` is `None`.
    let body = RecordingBody::with_max_bytes(streamed(), 4);
    let witness = body.try_replay().expect("nothing read yet");
    let out = svc.oneshot(post(body)).await;
    assert_eq!(
        seen.bodies_to("primary.example"),
        [Ok(Bytes::from("aaaabbbbcccc"))],
        "the primary's attempt streams it whole"
    );
    assert!(witness.is_capped() && witness.try_replay().is_none());
    out
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_body_that_passed_its_cap_during_the_primary_never_falls_back() {
    // Without a retry layer, and with one (the POST's 503 is not eligible
    // for a retry, so its verdict stays retryable), as in the ready-made
    // client.
    let (seen, inner) = server(Fail::Status(503));
    let bare = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let out = send_past_the_cap(bare, &seen).await;
    // Route 1 would get a body that fails at its first byte (its chunks
    // were dropped at the cap): a truncated request on a real transport.
    assert_eq!(
        seen.bodies_to("secondary.example"),
        [],
        "route 1 got nothing"
    );
    assert_eq!(served(&out), None);
    assert_eq!(out.unwrap().status(), 503, "the primary's failure");

    let (seen, inner) = server(Fail::Status(503));
    let retried = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
        .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let out = send_past_the_cap(retried, &seen).await;
    // The same with the retry loop between.
    assert_eq!(
        seen.bodies_to("secondary.example"),
        [],
        "route 1 got nothing"
    );
    assert_eq!(served(&out), None);
    assert_eq!(out.unwrap().status(), 503, "the primary's failure");
}

// ===== the budget =====

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_empty_budget_refuses_the_fallback_one_with_a_token_pays_one() {
    let budget = Arc::new(RetryBudget::new(1.0, Duration::from_secs(10), 0));
    assert_eq!(budget.remaining(), 0);
    let (seen, inner) = server::<Full<Bytes>>(Fail::Status(503));
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Route::base_url(SECONDARY)]).budget(budget.clone()))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);

    let out = svc.clone().oneshot(post(prompt())).await;
    assert_eq!(served(&out), None);
    assert_eq!(out.unwrap().status(), 503, "the primary's failure");
    assert_eq!(seen.to("secondary.example"), 0, "refused by the budget");

    // Control: one request recorded (ratio 1.0) is one token; the fallback
    // takes it, and only it.
    budget.deposit();
    assert_eq!(budget.remaining(), 1);
    let out = svc.oneshot(post(prompt())).await;
    assert_eq!(served(&out), Some(1));
    assert_eq!(budget.remaining(), 0);
    assert_eq!(seen.to("secondary.example"), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn each_fallback_withdraws_exactly_one_token() {
    // Route 1 is down too; route 2 answers.
    let routes = || {
        [
            Route::base_url("https://down.example"),
            Route::base_url(SECONDARY),
        ]
    };
    let budget = Arc::new(RetryBudget::new(1.0, Duration::from_secs(10), 0));
    for _ in 0..5 {
        budget.deposit();
    }
    assert_eq!(budget.remaining(), 5);
    let (seen, inner) = server::<Full<Bytes>>(Fail::Status(503));
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new(routes()).budget(budget.clone()))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner.clone());
    let out = svc.oneshot(post(prompt())).await;
    assert_eq!(served(&out), Some(2));
    assert_eq!(budget.remaining(), 3, "two fallbacks, two tokens");

    // With one token left, route 1 is tried and route 2 is refused: the
    // caller gets route 1's failure.
    let budget = Arc::new(RetryBudget::new(1.0, Duration::from_secs(10), 0));
    budget.deposit();
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new(routes()).budget(budget.clone()))
        .layer(ClassifyLayer::new(HttpClassifier::default()))
        .service(inner);
    let before = seen.to("secondary.example");
    let out = svc.oneshot(post(prompt())).await;
    assert_eq!(served(&out), Some(1));
    assert_eq!(out.unwrap().status(), 503, "route 1's failure");
    assert_eq!(budget.remaining(), 0);
    assert_eq!(seen.to("secondary.example"), before, "route 2 refused");
}

// ===== the deadline =====

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_fallback_when_the_deadline_passed_before_the_primary_failed() {
    // The primary's connect fails after 2 s; nothing below enforces the
    // deadline, so the fallback's own check is what is tested.
    for (deadline, falls_back) in [
        (Duration::from_secs(1), false),
        (Duration::from_secs(2), false), // the deadline is the failure's instant
        (Duration::from_secs(5), true),  // control
    ] {
        let (seen, inner) = server::<Full<Bytes>>(Fail::Connect(Duration::from_secs(2)));
        let svc = ServiceBuilder::new()
            .layer(FallbackLayer::new([Route::base_url(SECONDARY)]))
            .layer(ClassifyLayer::new(HttpClassifier::default()))
            .service(inner);
        let start = Instant::now();
        let mut req = post(prompt());
        req.extensions_mut().insert(Deadline(start + deadline));
        let out = svc.oneshot(req).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2), "{deadline:?}");
        if falls_back {
            assert_eq!(served(&out), Some(1));
            assert_eq!(seen.to("secondary.example"), 1);
        } else {
            assert_eq!(served(&out), None, "{deadline:?}");
            let err = out.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Connect, "the primary's failure");
            assert_eq!(seen.to("secondary.example"), 0, "{deadline:?}");
        }
        assert_eq!(seen.to("primary.example"), 1);
    }
}
