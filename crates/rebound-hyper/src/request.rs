//! The client's request builder: [`Client::request`], [`Client::get`],
//! [`Client::post`], [`Client::put`], [`Client::patch`],
//! [`Client::delete`] and [`Client::head`] return a [`RequestBuilder`].
//!
//! ```
//! use std::time::Duration;
//!
//! use rebound_hyper::Client;
//! use rebound_test::fault::{Action, FaultServer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let server = FaultServer::builder()
//!     .route("/v1/orders", [Action::status(503), Action::status(201)])
//!     .start()
//!     .await;
//! let client = Client::builder()
//!     .backoff(rebound_core::Backoff::exponential(Duration::from_millis(1), Duration::from_millis(10)))
//!     .build()?;
//!
//! // A builder is awaited as it is (`IntoFuture`), or sent with `send()`,
//! // whose future has a name (`SendFuture`) and can be spawned.
//! let res = client
//!     .post(server.url("/v1/orders"))
//!     .header("x-tenant", "blue")
//!     .json(&serde_json::json!({ "item": "tea" }))
//!     .idempotency_key("order-7f3a")
//!     .timeout(Duration::from_secs(5))
//!     .attempts(4)
//!     .await?;
//! assert_eq!(res.status(), 201);
//!
//! // The 503 was retried with the same key: the server can tell a repeat.
//! let posts = server.requests_to("/v1/orders");
//! assert_eq!(posts.len(), 2);
//! assert_eq!(posts[1].header("idempotency-key"), Some("order-7f3a"));
//! assert_eq!(posts[1].header("content-type"), Some("application/json"));
//! assert_eq!(posts[1].body, posts[0].body);
//!
//! // Bad input is an error when the request is sent, never a panic, and
//! // nothing goes out.
//! let err = client.get(server.url("/v1/orders")).header("bad name", "x").await.unwrap_err();
//! assert_eq!(err.kind(), rebound_core::ErrorKind::InvalidRequest);
//! assert_eq!(server.request_count(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # What each setter does
//!
//! * [`header`](RequestBuilder::header) appends a header;
//!   [`headers`](RequestBuilder::headers) replaces the headers of the
//!   names it holds.
//! * [`body`](RequestBuilder::body) sets the body (see [`Body`]: in memory
//!   it replays for free; streamed, it is recorded for replay up to the
//!   client's [`replay_cap`](crate::ClientBuilder::replay_cap)).
//!   [`json`](RequestBuilder::json) sets it to a value encoded as JSON and
//!   `Content-Type: application/json` (unless a `Content-Type` was set).
//! * [`query`](RequestBuilder::query) appends `name=value` pairs to the
//!   URL's query, percent-encoded.
//! * [`timeout`](RequestBuilder::timeout): this request's total budget, as a
//!   [`Deadline`] on the request. The client's stack honours **the earlier**
//!   of it and its own [`total_timeout`](crate::ClientBuilder::total_timeout)
//!   (and of a `Deadline` the request already carried): a per-request
//!   timeout can shorten the client's total, never lengthen it. It starts
//!   when the request is sent (or [built](RequestBuilder::build)) and
//!   covers everything the total does: waits, every attempt, backoff
//!   sleeps and reading the response body.
//! * [`attempts`](RequestBuilder::attempts): this request's attempts in
//!   all, first included, in place of the client's
//!   [`max_attempts`](crate::ClientBuilder::max_attempts), lower or higher,
//!   within `1..=100` (a [`MaxAttempts`] on the request, read by the retry
//!   loop). Only the count changes: a request that may not be sent again
//!   (a POST without a key) is still sent once, and the retry budget and
//!   the deadline still bound the retries.
//! * [`idempotency_key`](RequestBuilder::idempotency_key): the caller's
//!   own key, in the client's idempotency header (`Idempotency-Key`, or
//!   the [layer's](crate::ClientBuilder::idempotency_keys) configured name)
//!   and as an [`IdempotencyKey`] annotation. Every attempt carries it, so
//!   a POST with a key is retried like a GET; the client does not make one
//!   of its own.
//!
//! # Errors
//!
//! A builder never panics. The first bad value (a URL, header name or
//! value that does not parse, a body that cannot be encoded as JSON, a zero
//! timeout, attempts outside `1..=100`, a blank or invalid idempotency key)
//! is kept and returned when the request is sent, as an
//! [`ErrorKind::InvalidRequest`] error marked [`Sent::NotSent`], naming the
//! method and redacted URL (when the URL parsed) and never the value: a
//! header value may be a secret. Nothing is sent.

use std::future::{Future, IntoFuture};
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::uri::PathAndQuery;
use http::{Method, Request, Uri};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use rebound_core::annotations::{Deadline, IdempotencyKey, MaxAttempts};
use rebound_core::retry::MAX_ATTEMPTS;
use rebound_core::{BoxError, Error, ErrorKind, Sent};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::body::Body;
use crate::client::{parse_uri, Client, SendFuture};
use crate::json::JsonError;

const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// What a query component keeps as it is: RFC 3986's unreserved characters.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl Client {
    /// A request of `method` to `uri`; see [`RequestBuilder`]. A `uri` that
    /// does not parse is an [`ErrorKind::InvalidRequest`] error when the
    /// request is sent.
    pub fn request<U>(&self, method: Method, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, method, uri)
    }

    /// `GET uri`: a [`RequestBuilder`]. `client.get(url).await` sends it as
    /// it is; `client.get(url).send()` gives the nameable [`SendFuture`]
    /// (to spawn it, or to keep it in a struct).
    pub fn get<U>(&self, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, Method::GET, uri)
    }

    /// `POST uri`: a [`RequestBuilder`]. Without a key of the caller's
    /// ([`RequestBuilder::idempotency_key`]) the client's idempotency-key
    /// layer gives it one (unless
    /// [turned off](crate::ClientBuilder::idempotency_keys)).
    pub fn post<U>(&self, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, Method::POST, uri)
    }

    /// `PUT uri`: a [`RequestBuilder`].
    pub fn put<U>(&self, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, Method::PUT, uri)
    }

    /// `PATCH uri`: a [`RequestBuilder`]. Keyed like a POST.
    pub fn patch<U>(&self, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, Method::PATCH, uri)
    }

    /// `DELETE uri`: a [`RequestBuilder`].
    pub fn delete<U>(&self, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, Method::DELETE, uri)
    }

    /// `HEAD uri`: a [`RequestBuilder`].
    pub fn head<U>(&self, uri: U) -> RequestBuilder<'_>
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        RequestBuilder::new(self, Method::HEAD, uri)
    }
}

/// A request being built for a [`Client`]; see the [module docs](self).
///
/// Send it with [`send`](Self::send) (a [`SendFuture`]), by awaiting it
/// (`IntoFuture`, the same future), or with
/// [`send_json`](Self::send_json) to decode a JSON answer. It borrows the
/// client; the future it becomes does not.
#[must_use = "a request builder does nothing until it is sent or awaited"]
pub struct RequestBuilder<'a> {
    client: &'a Client,
    /// The request so far, or the first bad value's error.
    request: Result<Request<Body>, Error>,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for RequestBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values and the query may be secrets: only what an error
        // would show.
        let mut d = f.debug_struct("RequestBuilder");
        match &self.request {
            Ok(req) => d.field("method", req.method()).field(
                "url",
                &format_args!("{}", rebound_core::redact::RedactedUri::new(req.uri())),
            ),
            Err(e) => d.field("error", e),
        };
        d.field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl<'a> RequestBuilder<'a> {
    fn new<U>(client: &'a Client, method: Method, uri: U) -> Self
    where
        U: TryInto<Uri>,
        U::Error: Into<BoxError>,
    {
        // A URL that does not parse: an error marked not sent.
        let request = parse_uri(uri).map(|uri| {
            let mut req = Request::new(Body::empty());
            *req.method_mut() = method;
            *req.uri_mut() = uri;
            req
        });
        RequestBuilder {
            client,
            request,
            timeout: None,
        }
    }

    /// Apply `f` to the request, unless a bad value came before.
    fn with(mut self, f: impl FnOnce(&mut Request<Body>) -> Result<(), Error>) -> Self {
        if let Ok(req) = &mut self.request {
            if let Err(e) = f(req) {
                let named = invalid_for(e, req, self.client);
                self.request = Err(named);
            }
        }
        self
    }

    /// Append the header `name: value`. A name or value that does not parse
    /// is an [`ErrorKind::InvalidRequest`] error when the request is sent
    /// (the value is never shown).
    pub fn header<K, V>(self, name: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.with(|req| {
            let name = HeaderName::try_from(name).map_err(|e| {
                Error::new(ErrorKind::InvalidRequest)
                    .with_detail("invalid header name")
                    .with_source(e.into())
            })?;
            let value = HeaderValue::try_from(value).map_err(|e| {
                Error::new(ErrorKind::InvalidRequest)
                    .with_detail("invalid header value")
                    .with_source(e.into())
            })?;
            req.headers_mut().append(name, value);
            Ok(())
        })
    }

    /// Set the headers in `headers`: each name it holds replaces that
    /// name's values so far; other headers are kept.
    pub fn headers(self, headers: HeaderMap) -> Self {
        self.with(|req| {
            req.headers_mut().extend(headers);
            Ok(())
        })
    }

    /// Set the body.
    pub fn body(self, body: impl Into<Body>) -> Self {
        self.with(|req| {
            *req.body_mut() = body.into();
            Ok(())
        })
    }

    /// Set the body to `value` encoded as JSON, and `Content-Type:
    /// application/json` unless a `Content-Type` is set. A value that
    /// cannot be encoded (a map with non-string keys, a failing
    /// `Serialize`) is an [`ErrorKind::InvalidRequest`] error when the
    /// request is sent.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Self {
        self.with(|req| {
            let json = serde_json::to_vec(value).map_err(|e| {
                Error::new(ErrorKind::InvalidRequest)
                    .with_detail("request body cannot be encoded as JSON")
                    .with_source(JsonError::from_serde(&e))
            })?;
            *req.body_mut() = Body::from(json);
            if !req.headers().contains_key(CONTENT_TYPE) {
                req.headers_mut().insert(CONTENT_TYPE, APPLICATION_JSON);
            }
            Ok(())
        })
    }

    /// Append `name=value` pairs to the URL's query, each percent-encoded
    /// (everything but RFC 3986's unreserved characters), after a query the
    /// URL already has.
    pub fn query<K, V>(self, pairs: &[(K, V)]) -> Self
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        self.with(|req| {
            if pairs.is_empty() {
                return Ok(());
            }
            let mut parts = req.uri().clone().into_parts();
            let (path, query) = match &parts.path_and_query {
                Some(pq) => (pq.path(), pq.query()),
                None => ("/", None),
            };
            let mut out = String::with_capacity(path.len() + 32);
            out.push_str(path);
            out.push('?');
            if let Some(q) = query.filter(|q| !q.is_empty()) {
                out.push_str(q);
                out.push('&');
            }
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push('&');
                }
                out.extend(utf8_percent_encode(k.as_ref(), QUERY));
                out.push('=');
                out.extend(utf8_percent_encode(v.as_ref(), QUERY));
            }
            let invalid = |e: http::Error| {
                Error::new(ErrorKind::InvalidRequest)
                    .with_detail("invalid query")
                    .with_source(e)
            };
            parts.path_and_query =
                Some(PathAndQuery::try_from(out).map_err(|e| invalid(e.into()))?);
            *req.uri_mut() = Uri::from_parts(parts).map_err(|e| invalid(e.into()))?;
            Ok(())
        })
    }

    /// This request's total budget, from when it is sent: the earlier of it
    /// and the client's [`total_timeout`](crate::ClientBuilder::total_timeout)
    /// applies (a [`Deadline`] on the request; see the
    /// [module docs](self)). A zero timeout is an
    /// [`ErrorKind::InvalidRequest`] error when the request is sent.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        if timeout.is_zero() {
            return self
                .with(|_| Err(Error::new(ErrorKind::InvalidRequest).with_detail("zero timeout")));
        }
        self.timeout = Some(timeout);
        self
    }

    /// This request's attempts in all, the first included, in place of the
    /// client's [`max_attempts`](crate::ClientBuilder::max_attempts):
    /// `1` sends it once, never retried; more than the client's lets it
    /// retry more (eligibility, the retry budget and the deadline still
    /// apply). Outside `1..=100`: an [`ErrorKind::InvalidRequest`] error
    /// when the request is sent.
    pub fn attempts(self, attempts: u32) -> Self {
        self.with(|req| {
            if !(1..=MAX_ATTEMPTS).contains(&attempts) {
                return Err(Error::new(ErrorKind::InvalidRequest)
                    .with_detail("attempts must be in 1..=100"));
            }
            req.extensions_mut().insert(MaxAttempts(attempts));
            Ok(())
        })
    }

    /// The caller's idempotency key for this request: sent in the client's
    /// idempotency header on every attempt, and making the request eligible
    /// for retry whatever its method (see the [module docs](self)). A key
    /// that is blank (empty or only spaces and tabs: servers would see no
    /// key, see [`IdempotencyKey::is_blank`]) or not a valid header value is
    /// an [`ErrorKind::InvalidRequest`] error when the request is sent.
    pub fn idempotency_key<V>(self, key: V) -> Self
    where
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        let header = self.client.key_header.clone();
        self.with(|req| {
            let value = HeaderValue::try_from(key).map_err(|e| {
                Error::new(ErrorKind::InvalidRequest)
                    .with_detail("invalid idempotency key")
                    .with_source(e.into())
            })?;
            if IdempotencyKey::is_blank(&value) {
                return Err(
                    Error::new(ErrorKind::InvalidRequest).with_detail("blank idempotency key")
                );
            }
            req.headers_mut().insert(header, value.clone());
            req.extensions_mut().insert(IdempotencyKey(value));
            Ok(())
        })
    }

    /// The request as built, with its [`Deadline`] (from now) if a
    /// [`timeout`](Self::timeout) was set; for [`Client::send`] or
    /// [`Client::send_json`] later.
    ///
    /// # Errors
    ///
    /// The first bad value given to the builder (see the
    /// [module docs](self)).
    pub fn build(self) -> Result<Request<Body>, Error> {
        let mut req = self.request?;
        if let Some(timeout) = self.timeout {
            // A deadline too far away to name is no deadline of ours.
            if let Some(at) = Instant::now().checked_add(timeout) {
                let at = match req.extensions().get::<Deadline>() {
                    Some(d) if d.0 < at => d.0,
                    _ => at,
                };
                req.extensions_mut().insert(Deadline(at));
            }
        }
        Ok(req)
    }

    /// Send the request through the client's stack (as
    /// [`Client::send`]). A bad value given to the builder is the
    /// future's error, and nothing is sent.
    pub fn send(self) -> SendFuture {
        let client = self.client;
        match self.build() {
            Ok(req) => client.send(req),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Send the request with the response body read inside each attempt
    /// and decoded as JSON `T` (as [`Client::send_json`]: `Accept:
    /// application/json` added; see [`crate::json`] for the errors).
    pub fn send_json<T>(self) -> impl Future<Output = Result<T, Error>> + Send + 'static
    where
        T: DeserializeOwned,
    {
        let client = self.client;
        let fut = self.build().map(|req| client.send_json::<T, _>(req));
        async move { fut?.await }
    }
}

impl IntoFuture for RequestBuilder<'_> {
    type Output = <SendFuture as Future>::Output;
    type IntoFuture = SendFuture;

    /// [`send`](RequestBuilder::send).
    fn into_future(self) -> SendFuture {
        self.send()
    }
}

/// A builder's error, named with the request (method, redacted URL, the
/// client's path redaction) and marked not sent.
fn invalid_for(err: Error, req: &Request<Body>, client: &Client) -> Error {
    let mut err = err.with_request(req.method(), req.uri());
    err.redact_path(&client.path);
    err.extensions_mut().insert(Sent::NotSent);
    err
}
