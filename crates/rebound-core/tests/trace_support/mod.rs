//! Shared pieces of the trace tests: a request with secrets planted
//! everywhere, a scripted inner service that annotates its outcomes as the
//! classify and backoff layers would, and a stand-in for the retry loop that
//! annotates the final outcome as the retry layer does.
//!
//! The retry stand-in is a test double for one job: driving the trace layers
//! through several attempts with the annotations of the contract. It is not
//! the retry layer.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{ACCEPT, AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, RETRY_AFTER, SET_COOKIE};
use http::{HeaderMap, Request, Response, StatusCode};
use rebound_core::annotations::{
    AttemptNumber, Attempts, DelaySource, PreviousAttempt, ProposedDelay, Reason, RetryStop, Sent,
    Verdict,
};
use rebound_core::body::CloneableBody;
use rebound_core::trace::{BudgetLeft, GateWait, LimiterState};
use rebound_core::{Error, ErrorKind, TimeoutStage};
use tower::{Service, ServiceExt};

/// The secret planted everywhere.
pub const SECRET: &str = "s3cr3t-XYZZY";

/// A URL with the secret in the userinfo and in the query.
pub fn secret_url() -> String {
    format!("https://alice:{SECRET}@api.example.com:8443/v1/items?api_key={SECRET}&page=2")
}

/// A POST with the secret in the URL, in every credential header and in the
/// body.
pub fn secret_request() -> Request<String> {
    Request::post(secret_url())
        .header(AUTHORIZATION, format!("Bearer {SECRET}"))
        .header(PROXY_AUTHORIZATION, format!("Basic {SECRET}"))
        .header("x-api-key", SECRET)
        .header("api-key", SECRET)
        .header(COOKIE, format!("session={SECRET}"))
        .header("x-request-id", "req-42")
        .header(ACCEPT, "application/json")
        .body(format!("{{\"password\":\"{SECRET}\"}}"))
        .unwrap()
}

/// Build the stack under test: trace, the retry stand-in (`max` attempts),
/// the attempt trace, then `inner`.
pub fn stack(
    layer: &rebound_core::trace::TraceLayer,
    inner: Scripted,
    max: u32,
) -> rebound_core::trace::Trace<FakeRetry<rebound_core::trace::AttemptTrace<Scripted>>> {
    tower::ServiceBuilder::new()
        .layer(layer.clone())
        .layer_fn(|s| FakeRetry::new(s, max))
        .layer(layer.attempt_layer())
        .service(inner)
}

/// What one attempt of the scripted service does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// 200, no annotation (absence is success).
    Ok,
    /// 503 with a `Set-Cookie` and `Retry-After: 2` carrying the secret in
    /// the cookie and the body; annotated retryable, 2 s from Retry-After.
    Unavailable,
    /// A connect error (refused, not sent), annotated retryable with a
    /// 100 ms backoff.
    Refused,
    /// 404, annotated fatal.
    NotFound,
    /// A deadline timeout error, unclassified.
    Deadline,
    /// Never answers.
    Hang,
}

/// What the scripted service saw of one attempt.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `Debug` of the request's headers.
    pub headers_debug: String,
    /// `Debug` of the whole request (URI and body included).
    pub request_debug: String,
    /// The request's headers.
    pub headers: HeaderMap,
    /// The attempt number stamped on it.
    pub attempt: u32,
}

/// A scripted inner service: answers each attempt with the next step (the
/// last step repeats), and records what it saw.
#[derive(Clone)]
pub struct Scripted {
    steps: Arc<Mutex<VecDeque<Step>>>,
    last: Step,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Annotations to put on every outcome, as a limiter and a gate would.
    pub annotate_state: bool,
}

impl Scripted {
    pub fn new(steps: &[Step]) -> Self {
        Scripted {
            steps: Arc::new(Mutex::new(steps.iter().copied().collect())),
            last: *steps.last().expect("at least one step"),
            seen: Arc::default(),
            annotate_state: false,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<Request<String>> for Scripted {
    type Response = Response<String>;
    type Error = Error;
    type Future = BoxFut<Result<Response<String>, Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<String>) -> Self::Future {
        // A layer below that logs what it got, at the most verbose level.
        tracing::trace!(headers = ?req.headers(), "inner service got a request");
        self.seen.lock().unwrap().push(Seen {
            headers_debug: format!("{:?}", req.headers()),
            request_debug: format!("{req:?}"),
            headers: req.headers().clone(),
            attempt: AttemptNumber::of(req.extensions()),
        });
        let step = self.steps.lock().unwrap().pop_front().unwrap_or(self.last);
        let annotate_state = self.annotate_state;
        let (method, uri) = (req.method().clone(), req.uri().clone());
        Box::pin(async move {
            let mut result = match step {
                Step::Ok => Ok(Response::new("ok".to_owned())),
                Step::Unavailable => {
                    let mut res = Response::new(format!("try later, token {SECRET}"));
                    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    res.headers_mut()
                        .insert(SET_COOKIE, format!("sid={SECRET}").parse().unwrap());
                    res.headers_mut().insert(RETRY_AFTER, "2".parse().unwrap());
                    res.extensions_mut().insert(Verdict::Retryable {
                        reason: Reason::status(StatusCode::SERVICE_UNAVAILABLE),
                        sent: Sent::MaybeProcessed,
                    });
                    res.extensions_mut().insert(ProposedDelay {
                        delay: Duration::from_secs(2),
                        source: DelaySource::RetryAfter,
                    });
                    Ok(res)
                }
                Step::Refused => {
                    let io = std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "connection refused",
                    );
                    let mut err = Error::new(ErrorKind::Connect)
                        .with_detail("connection refused")
                        .with_source(io)
                        .with_request(&method, &uri);
                    err.extensions_mut().insert(Verdict::Retryable {
                        reason: Reason::new_static("connect refused"),
                        sent: Sent::NotSent,
                    });
                    err.extensions_mut().insert(ProposedDelay {
                        delay: Duration::from_millis(100),
                        source: DelaySource::Backoff,
                    });
                    Err(err)
                }
                Step::NotFound => {
                    let mut res = Response::new(String::new());
                    *res.status_mut() = StatusCode::NOT_FOUND;
                    res.extensions_mut().insert(Verdict::Fatal {
                        reason: Reason::status(StatusCode::NOT_FOUND),
                    });
                    Ok(res)
                }
                Step::Deadline => {
                    Err(Error::timeout(TimeoutStage::Deadline).with_request(&method, &uri))
                }
                Step::Hang => std::future::pending().await,
            };
            if annotate_state {
                let ext = match &mut result {
                    Ok(res) => res.extensions_mut(),
                    Err(err) => err.extensions_mut(),
                };
                ext.insert(LimiterState {
                    limiter: "adaptive",
                    limit: 8,
                    in_flight: 3,
                    queued: 1,
                });
                ext.insert(GateWait(Duration::from_millis(1500)));
            }
            result
        })
    }
}

/// A stand-in for the retry loop (see the module docs): up to `max`
/// attempts while the verdict is retryable, sleeping the proposed delay,
/// stamping `AttemptNumber`, `PreviousAttempt` and (if set) `BudgetLeft` on each
/// attempt, and `Attempts` and `RetryStop` on the final outcome.
#[derive(Clone)]
pub struct FakeRetry<S> {
    inner: S,
    max: u32,
    /// What to say when it stops on a retryable outcome.
    pub exhausted: RetryStop,
    /// Budget left to stamp on each attempt, counting down.
    pub budget: Option<u32>,
}

impl<S> FakeRetry<S> {
    pub fn new(inner: S, max: u32) -> Self {
        FakeRetry {
            inner,
            max,
            exhausted: RetryStop::Attempts,
            budget: None,
        }
    }
}

impl<S> Service<Request<String>> for FakeRetry<S>
where
    S: Service<Request<String>, Response = Response<String>, Error = Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = Response<String>;
    type Error = Error;
    type Future = BoxFut<Result<Response<String>, Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<String>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let mut inner = this.inner.clone();
            let mut previous: Option<PreviousAttempt> = None;
            let mut n = 1;
            loop {
                let mut attempt = Request::new(req.body().try_replay().unwrap());
                *attempt.method_mut() = req.method().clone();
                *attempt.uri_mut() = req.uri().clone();
                *attempt.headers_mut() = req.headers().clone();
                *attempt.extensions_mut() = req.extensions().clone();
                if n > 1 {
                    attempt.extensions_mut().insert(AttemptNumber(n));
                }
                if let Some(p) = previous.take() {
                    attempt.extensions_mut().insert(p);
                }
                if let Some(b) = this.budget {
                    attempt
                        .extensions_mut()
                        .insert(BudgetLeft(b.saturating_sub(n - 1)));
                }
                let mut out = inner.ready().await?.call(attempt).await;
                let (verdict, delay) = {
                    let ext = match &out {
                        Ok(r) => r.extensions(),
                        Err(e) => e.extensions(),
                    };
                    (
                        Verdict::of(ext).into_owned(),
                        ext.get::<ProposedDelay>().copied(),
                    )
                };
                let stop = match &verdict {
                    Verdict::Success => None,
                    Verdict::Fatal { .. } => Some(RetryStop::Fatal),
                    Verdict::Retryable { .. } if n >= this.max => Some(this.exhausted),
                    Verdict::Retryable { .. } => {
                        let wait = delay.map_or(Duration::ZERO, |d| d.delay);
                        tokio::time::sleep(wait).await;
                        previous = Some(PreviousAttempt {
                            attempt: n,
                            verdict,
                            retry_after: None,
                            delay,
                        });
                        n += 1;
                        continue;
                    }
                };
                let ext = match &mut out {
                    Ok(r) => r.extensions_mut(),
                    Err(e) => e.extensions_mut(),
                };
                if n > 1 {
                    ext.insert(Attempts(n));
                }
                if let Some(stop) = stop {
                    ext.insert(stop);
                }
                if let Some(b) = this.budget {
                    ext.insert(BudgetLeft(b.saturating_sub(n - 1)));
                }
                return out;
            }
        })
    }
}
