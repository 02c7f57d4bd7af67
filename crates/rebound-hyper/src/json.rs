//! JSON helpers of the ready-made client: [`Client::get_json`],
//! [`Client::post_json`] and [`Client::send_json`].
//!
//! ```
//! use std::time::Duration;
//!
//! use rebound_hyper::Client;
//! use rebound_test::fault::{Action, FaultServer};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize)]
//! struct NewOrder<'a> {
//!     item: &'a str,
//! }
//!
//! #[derive(Deserialize, Debug, PartialEq)]
//! struct Order {
//!     id: u64,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let server = FaultServer::builder()
//!     // The first answer is cut short: the body is read inside the
//!     // attempt, so this is a retryable failure like a 503.
//!     .route("/orders/7", [Action::status(200).body("{\"id\":7}").truncate_after(3)])
//!     .route("/orders", [Action::status(503), Action::status(201).body("{\"id\":8}")])
//!     .default(Action::status(200).body("{\"id\":7}"))
//!     .start()
//!     .await;
//! let client = Client::builder()
//!     .backoff(rebound_core::Backoff::exponential(Duration::from_millis(1), Duration::from_millis(10)))
//!     .build()?;
//!
//! let order: Order = client.get_json(server.url("/orders/7")).await?;
//! assert_eq!(order, Order { id: 7 });
//!
//! // A POST gets an Idempotency-Key, the same on every attempt, so it is
//! // retried after the 503.
//! let created: Order = client.post_json(server.url("/orders"), &NewOrder { item: "tea" }).await?;
//! assert_eq!(created, Order { id: 8 });
//! let posts = server.requests_to("/orders");
//! assert_eq!(posts.len(), 2);
//! assert_eq!(posts[0].header("idempotency-key"), posts[1].header("idempotency-key"));
//! assert_eq!(posts[1].header("content-type"), Some("application/json"));
//! # Ok(())
//! # }
//! ```
//!
//! # Reading inside the attempt
//!
//! These helpers go through a second stack of the client, the same layers
//! sharing the same connection pool, retry budget, limiters and Retry-After
//! gate, with a
//! [`CollectBodyLayer`](rebound_core::collect::CollectBodyLayer) right below
//! the classifier: the whole response body is read as part of each attempt.
//! A body cut short or reset is then a failed attempt and is retried like a
//! 503 (for requests that may be retried: GET, or a POST with its
//! `Idempotency-Key`). A body over
//! [`max_response_body`](crate::ClientBuilder::max_response_body) (10 MiB by
//! default) fails at once, not retried, with `body too large`, and nothing
//! more of it is read.
//!
//! # Errors
//!
//! Besides the errors of [`Client::send`], every error names the request:
//!
//! * The final response is not a success (2xx): [`ErrorKind::Status`]
//!   (`err.kind()`), an [`UnexpectedStatus`]
//!   source with the status, and the retry annotations of the response
//!   ([`Attempts`], [`RetryStop`]) in its extensions. The body is not
//!   decoded.
//! * The body is empty, is not JSON, or is JSON of another shape than `T`:
//!   [`ErrorKind::Decode`], never retried (the server answered; asking again
//!   would get the same answer). Its source is a [`JsonError`] with only the
//!   [category](JsonErrorCategory), line and column: `serde_json`'s own
//!   message can quote the body (`invalid type: string "…"`), so it is
//!   dropped, and no part of the body appears in the error's `Display` or
//!   `Debug`.
//! * The request body cannot be encoded as JSON (a map with non-string
//!   keys, a failing `Serialize`): [`ErrorKind::InvalidRequest`], nothing
//!   sent.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use rebound_core::redact::PathRedaction;
use rebound_core::{Attempts, BoxError, Error, ErrorKind, RetryStop, Sent};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tower::ServiceExt;

use crate::body::Body;
use crate::client::{parse_uri, Client, CollectingStack};

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

impl Client {
    /// `GET uri` with `Accept: application/json`, the body read inside the
    /// attempt and decoded as `T`. See the [module docs](crate::json) for the
    /// errors.
    pub fn get_json<T>(
        &self,
        uri: impl TryInto<Uri, Error: Into<BoxError>>,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'static
    where
        T: DeserializeOwned,
    {
        let req = parse_uri(uri).map(|uri| {
            let mut req = Request::new(Body::empty());
            *req.uri_mut() = uri;
            req
        });
        let stack = self.collecting.clone();
        let path = self.path.clone();
        async move { run(stack, req?, path).await }
    }

    /// `POST uri` with `body` encoded as JSON (`Content-Type` and `Accept:
    /// application/json`), the response body read inside the attempt and
    /// decoded as `T`. The client's idempotency-key layer gives the request
    /// an `Idempotency-Key` (unless [turned
    /// off](crate::ClientBuilder::idempotency_keys)), so it is retried like
    /// a GET. See the [module docs](crate::json) for the errors.
    pub fn post_json<B, T>(
        &self,
        uri: impl TryInto<Uri, Error: Into<BoxError>>,
        body: &B,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'static
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let req = parse_uri(uri).and_then(|uri| {
            let json = serde_json::to_vec(body).map_err(|e| {
                let mut err = Error::new(ErrorKind::InvalidRequest)
                    .with_detail("request body cannot be encoded as JSON")
                    .with_source(JsonError::from_serde(&e))
                    .with_request(&Method::POST, &uri);
                err.redact_path(&self.path);
                err.extensions_mut().insert(Sent::NotSent);
                err
            })?;
            let mut req = Request::new(Body::from(json));
            *req.method_mut() = Method::POST;
            *req.uri_mut() = uri;
            req.headers_mut().insert(CONTENT_TYPE, APPLICATION_JSON);
            Ok(req)
        });
        let stack = self.collecting.clone();
        let path = self.path.clone();
        async move { run(stack, req?, path).await }
    }

    /// Send `req` with the response body read inside the attempt and decoded
    /// as `T`. `Accept: application/json` is added when absent, and
    /// `Content-Type: application/json` when absent and the body is not
    /// empty; other headers are the caller's. A streamed body is armed for
    /// replay like in [`send`](Client::send). See the [module
    /// docs](crate::json) for the errors.
    pub fn send_json<T, B>(
        &self,
        req: Request<B>,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'static
    where
        T: DeserializeOwned,
        B: Into<Body>,
    {
        let mut req = self.arm(req);
        let has_body = !matches!(req.body().as_bytes(), Some([]));
        if has_body && !req.headers().contains_key(CONTENT_TYPE) {
            req.headers_mut().insert(CONTENT_TYPE, APPLICATION_JSON);
        }
        let stack = self.collecting.clone();
        let path = self.path.clone();
        async move { run(stack, req, path).await }
    }
}

/// Send through the collecting stack and decode.
async fn run<T: DeserializeOwned>(
    stack: CollectingStack,
    mut req: Request<Body>,
    path: PathRedaction,
) -> Result<T, Error> {
    if !req.headers().contains_key(ACCEPT) {
        req.headers_mut().insert(ACCEPT, APPLICATION_JSON);
    }
    let method = req.method().clone();
    let uri = req.uri().clone();
    let res = stack.oneshot(req).await?;
    let (parts, body) = res.into_parts();
    let annotate = |mut err: Error| {
        if let Some(attempts) = parts.extensions.get::<Attempts>() {
            err.extensions_mut().insert(*attempts);
        }
        if let Some(stop) = parts.extensions.get::<RetryStop>() {
            err.extensions_mut().insert(*stop);
        }
        let mut err = err.with_request(&method, &uri);
        err.redact_path(&path);
        err
    };
    if !parts.status.is_success() {
        return Err(annotate(Error::new(ErrorKind::Status).with_source(
            UnexpectedStatus {
                status: parts.status,
            },
        )));
    }
    // Already in memory: this only unwraps the permit and deadline wrappers.
    let bytes = body.collect().await.map_err(annotate)?.to_bytes();
    decode(&bytes).map_err(annotate)
}

/// Decode `bytes` as `T`; the error never holds any of the bytes.
fn decode<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Error> {
    if bytes.is_empty() {
        return Err(Error::new(ErrorKind::Decode)
            .with_detail("response body is empty")
            .with_source(JsonError {
                category: JsonErrorCategory::Empty,
                line: 0,
                column: 0,
            }));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let source = JsonError::from_serde(&e);
        let detail = match source.category {
            JsonErrorCategory::Data => "response JSON does not have the expected shape",
            JsonErrorCategory::Eof => "response JSON ends early",
            _ => "response body is not valid JSON",
        };
        Error::new(ErrorKind::Decode)
            .with_detail(detail)
            .with_source(source)
    })
}

// ===== errors =====

/// Why JSON could not be encoded or decoded: the category and position
/// only. `serde_json`'s message is not kept, because it can quote the input
/// (`invalid type: string "…"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonError {
    category: JsonErrorCategory,
    line: usize,
    column: usize,
}

/// The category of a [`JsonError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JsonErrorCategory {
    /// The body is empty (0 bytes).
    Empty,
    /// Not syntactically valid JSON.
    Syntax,
    /// Valid JSON of another shape than the type asked for (a missing
    /// field, a string where a number was expected, ...).
    Data,
    /// The JSON ends before the value does.
    Eof,
    /// The value could not be written or read (encoding only, in practice).
    Io,
}

impl JsonError {
    pub(crate) fn from_serde(e: &serde_json::Error) -> Self {
        use serde_json::error::Category;
        let category = match e.classify() {
            Category::Io => JsonErrorCategory::Io,
            Category::Syntax => JsonErrorCategory::Syntax,
            Category::Data => JsonErrorCategory::Data,
            Category::Eof => JsonErrorCategory::Eof,
        };
        JsonError {
            category,
            line: e.line(),
            column: e.column(),
        }
    }

    /// What kind of failure it is.
    pub fn category(&self) -> JsonErrorCategory {
        self.category
    }

    /// The line (from 1) where it was found; 0 when unknown.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The column (from 1) where it was found; 0 when unknown.
    pub fn column(&self) -> usize {
        self.column
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.category {
            JsonErrorCategory::Empty => return f.write_str("empty body"),
            JsonErrorCategory::Syntax => "syntax error",
            JsonErrorCategory::Data => "unexpected shape",
            JsonErrorCategory::Eof => "unexpected end",
            JsonErrorCategory::Io => "serialization failed",
        };
        if self.line == 0 {
            f.write_str(what)
        } else {
            write!(f, "{what} at line {} column {}", self.line, self.column)
        }
    }
}

impl StdError for JsonError {}

/// The final response of a JSON helper was not a success (2xx); its body
/// was not decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnexpectedStatus {
    status: StatusCode,
}

impl UnexpectedStatus {
    /// The status of the final response.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl fmt::Display for UnexpectedStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "status {}", self.status)
    }
}

impl StdError for UnexpectedStatus {}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Shape {
        id: u32,
    }

    fn shown(e: &Error) -> String {
        format!("{e} / {e:?}")
    }

    #[test]
    fn decode_errors_keep_only_category_and_position() {
        let e = decode::<Shape>(&Bytes::new()).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Decode));
        assert_eq!(e.to_string(), "decode error: response body is empty");
        assert_eq!(
            e.find_source::<JsonError>().unwrap().category(),
            JsonErrorCategory::Empty
        );

        // serde_json would say `invalid type: string "hunter2", expected u32`.
        let e = decode::<Shape>(&Bytes::from_static(b"{\"id\":\"hunter2\"}")).unwrap_err();
        let src = e.find_source::<JsonError>().unwrap();
        assert_eq!(src.category(), JsonErrorCategory::Data);
        assert_eq!((src.line(), src.column()), (1, 15));
        assert!(!shown(&e).contains("hunter2"), "{}", shown(&e));
        assert!(shown(&e).contains("does not have the expected shape"));
        assert!(shown(&e).contains("unexpected shape at line 1 column 15"));

        // A missing field is named by serde_json; the name is not body data,
        // but we keep nothing of its message anyway.
        let e = decode::<Shape>(&Bytes::from_static(b"{\"other\":\"s3cret\"}")).unwrap_err();
        assert!(!shown(&e).contains("s3cret"));

        let e = decode::<Shape>(&Bytes::from_static(b"<html>s3cret</html>")).unwrap_err();
        assert_eq!(
            e.find_source::<JsonError>().unwrap().category(),
            JsonErrorCategory::Syntax
        );
        assert!(!shown(&e).contains("s3cret"));
        assert!(e.to_string().contains("not valid JSON"));

        let e = decode::<Shape>(&Bytes::from_static(b"{\"id\":")).unwrap_err();
        assert_eq!(
            e.find_source::<JsonError>().unwrap().category(),
            JsonErrorCategory::Eof
        );

        let ok = decode::<Shape>(&Bytes::from_static(b" {\"id\": 3} ")).unwrap();
        assert_eq!(ok.id, 3);
    }

    #[test]
    fn unexpected_status_displays_the_status() {
        let s = UnexpectedStatus {
            status: StatusCode::SERVICE_UNAVAILABLE,
        };
        assert_eq!(s.to_string(), "status 503 Service Unavailable");
        assert_eq!(s.status(), 503);
    }
}
