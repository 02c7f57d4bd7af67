//! A scripted in-process `tower::Service<http::Request<B>>` that records
//! every call: for unit tests of single layers.
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use rebound_test::mock::{MockService, Reply};
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let mock = MockService::new()
//!     .respond(Reply::code(503).header("retry-after", "1"))
//!     .delay(Duration::from_secs(2), Reply::code(200).body("ok"))
//!     .fail(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
//!
//! let mut svc = mock.clone();
//! let req = || Request::post("http://test/x").body(Full::new(Bytes::from_static(b"payload"))).unwrap();
//! let res = svc.call(req()).await.unwrap();
//! assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
//!
//! let start = tokio::time::Instant::now();
//! let res = svc.call(req()).await.unwrap();
//! assert_eq!(start.elapsed(), Duration::from_secs(2));
//! assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
//!
//! assert!(svc.call(req()).await.is_err());
//! // The script is empty: by default an error says so.
//! assert!(svc.call(req()).await.is_err());
//!
//! let calls = mock.calls();
//! assert_eq!(calls.len(), 4);
//! assert_eq!(calls[0].method, http::Method::POST);
//! assert_eq!(calls[0].body.as_deref(), Some(&b"payload"[..]));
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower_service::Service;

/// A boxed error, as `tower` layers exchange them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A scripted response.
#[derive(Clone, Debug)]
pub struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    /// A response with `status`, no headers and an empty body.
    pub fn status(status: StatusCode) -> Self {
        Reply {
            status,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }
    }

    /// A response with status `code`.
    ///
    /// # Panics
    ///
    /// If `code` is not a valid status (100..=999): a mistake in the test.
    pub fn code(code: u16) -> Self {
        Reply::status(StatusCode::from_u16(code).expect("a status code in 100..=999"))
    }

    /// Add a header.
    ///
    /// # Panics
    ///
    /// If `name` or `value` is not a valid header name/value: a mistake in
    /// the test.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid header name");
        let value = HeaderValue::from_str(value).expect("a valid header value");
        self.headers.append(name, value);
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut res = Response::new(Full::new(self.body));
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res
    }
}

/// One step of the script.
pub enum Step {
    /// Answer at once.
    Respond(Reply),
    /// Fail with this error.
    Fail(BoxError),
    /// Answer after this delay (`tokio::time`, so paused clocks apply).
    Delay(Duration, Reply),
    /// Never answer.
    Hang,
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Respond(r) => f.debug_tuple("Respond").field(&r.status).finish(),
            Step::Fail(e) => f.debug_tuple("Fail").field(&format_args!("{e}")).finish(),
            Step::Delay(d, r) => f.debug_tuple("Delay").field(d).field(&r.status).finish(),
            Step::Hang => f.write_str("Hang"),
        }
    }
}

/// What to do when the script is empty.
#[derive(Clone)]
enum Fallback {
    Exhausted,
    Respond(Reply),
    Fail(Arc<dyn Fn() -> BoxError + Send + Sync>),
}

/// One recorded call.
#[derive(Clone, Debug)]
pub struct Call {
    /// The request method.
    pub method: Method,
    /// The request URI.
    pub uri: Uri,
    /// The request headers.
    pub headers: HeaderMap,
    /// When the call arrived (`tokio::time`).
    pub at: Instant,
    /// The request body, once collected (`None` if collecting failed or has
    /// not finished).
    pub body: Option<Bytes>,
}

struct Shared {
    script: VecDeque<Step>,
    fallback: Fallback,
    calls: Vec<Call>,
}

/// A scripted `tower::Service<http::Request<B>>`; see the
/// [module docs](self).
///
/// Each call takes the next [`Step`] of the script; when the script is empty
/// it uses the fallback ([`otherwise`](Self::otherwise),
/// [`otherwise_fail`](Self::otherwise_fail)), by default an error saying the
/// script is exhausted. Always ready.
///
/// Clones share the script and the record.
#[derive(Clone)]
pub struct MockService {
    shared: Arc<Mutex<Shared>>,
}

impl fmt::Debug for MockService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("MockService")
            .field("script", &s.script)
            .field("calls", &s.calls.len())
            .finish()
    }
}

impl Default for MockService {
    fn default() -> Self {
        Self::new()
    }
}

impl MockService {
    /// An empty script.
    pub fn new() -> Self {
        MockService {
            shared: Arc::new(Mutex::new(Shared {
                script: VecDeque::new(),
                fallback: Fallback::Exhausted,
                calls: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append a step to the script.
    pub fn push(&self, step: Step) {
        self.lock().script.push_back(step);
    }

    /// Then answer with `reply`.
    pub fn respond(self, reply: Reply) -> Self {
        self.push(Step::Respond(reply));
        self
    }

    /// Then answer with `reply`, `n` times.
    pub fn respond_times(self, n: usize, reply: Reply) -> Self {
        for _ in 0..n {
            self.push(Step::Respond(reply.clone()));
        }
        self
    }

    /// Then fail with `err`.
    pub fn fail(self, err: impl Into<BoxError>) -> Self {
        self.push(Step::Fail(err.into()));
        self
    }

    /// Then answer with `reply` after `delay`.
    pub fn delay(self, delay: Duration, reply: Reply) -> Self {
        self.push(Step::Delay(delay, reply));
        self
    }

    /// Then never answer.
    pub fn hang(self) -> Self {
        self.push(Step::Hang);
        self
    }

    /// When the script is empty, answer with `reply`.
    pub fn otherwise(self, reply: Reply) -> Self {
        self.lock().fallback = Fallback::Respond(reply);
        self
    }

    /// When the script is empty, fail with a fresh error from `make`.
    pub fn otherwise_fail(self, make: impl Fn() -> BoxError + Send + Sync + 'static) -> Self {
        self.lock().fallback = Fallback::Fail(Arc::new(make));
        self
    }

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// How many calls were made.
    pub fn call_count(&self) -> usize {
        self.lock().calls.len()
    }

    /// How many scripted steps are left.
    pub fn remaining(&self) -> usize {
        self.lock().script.len()
    }
}

/// The error of an exhausted script.
#[derive(Debug)]
pub struct ScriptExhausted;

impl fmt::Display for ScriptExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mock service: script exhausted")
    }
}

impl std::error::Error for ScriptExhausted {}

impl<B> Service<Request<B>> for MockService
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let (index, step) = {
            let mut s = self.lock();
            s.calls.push(Call {
                method: parts.method,
                uri: parts.uri,
                headers: parts.headers,
                at: Instant::now(),
                body: None,
            });
            let step = match s.script.pop_front() {
                Some(step) => step,
                None => match &s.fallback {
                    Fallback::Exhausted => Step::Fail(Box::new(ScriptExhausted)),
                    Fallback::Respond(r) => Step::Respond(r.clone()),
                    Fallback::Fail(make) => Step::Fail(make()),
                },
            };
            (s.calls.len() - 1, step)
        };
        let shared = self.shared.clone();
        Box::pin(async move {
            if let Ok(collected) = body.collect().await {
                let bytes = collected.to_bytes();
                let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
                s.calls[index].body = Some(bytes);
            }
            match step {
                Step::Respond(reply) => Ok(reply.into_response()),
                Step::Fail(err) => Err(err),
                Step::Delay(d, reply) => {
                    tokio::time::sleep(d).await;
                    Ok(reply.into_response())
                }
                Step::Hang => std::future::pending().await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fallbacks_and_hang() {
        let mut svc = MockService::new().hang().otherwise(Reply::code(204));
        let hang = svc.call(Request::new(Full::new(Bytes::new())));
        assert!(tokio::time::timeout(Duration::from_secs(3600), hang)
            .await
            .is_err());
        let res = svc
            .call(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NO_CONTENT);

        let mut svc = MockService::new().otherwise_fail(|| "down".into());
        let err = svc
            .call(Request::new(Full::new(Bytes::new())))
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "down");
        assert_eq!(svc.call_count(), 1);
        assert_eq!(svc.remaining(), 0);
    }
}
