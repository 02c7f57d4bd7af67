//! Idempotency keys for writes: [`IdempotencyKeyLayer`].
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Method, Request, Response};
//! use rebound_core::idempotency::IdempotencyKeyLayer;
//! use rebound_core::IdempotencyKey;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut svc = ServiceBuilder::new()
//!     .layer(IdempotencyKeyLayer::new())
//!     // .layer(RetryLayer::new(..)) goes here, below: every attempt
//!     // then carries the same key.
//!     .service(tower::service_fn(|req: Request<()>| async move {
//!         // What the server sees: a UUIDv4 key, the same on every attempt.
//!         let key = req.headers()["idempotency-key"].clone();
//!         assert_eq!(key.len(), 36);
//!         // What the retry layer sees: this POST may be retried.
//!         assert_eq!(req.extensions().get::<IdempotencyKey>(), Some(&IdempotencyKey(key)));
//!         Ok::<_, Infallible>(Response::new(()))
//!     }));
//!
//! let post = Request::builder().method(Method::POST).uri("/v1/orders").body(())?;
//! svc.ready().await?.call(post).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What it does
//!
//! For a request whose method is in the set (POST and PATCH by default):
//!
//! * no `Idempotency-Key` header (the name is configurable, e.g.
//!   `X-Idempotency-Key`): the layer adds one, a fresh UUIDv4 from the OS
//!   random generator ([`UuidV4`]) or from a generator of yours
//!   ([`MakeIdempotencyKey`], any `Fn() -> HeaderValue`);
//! * a key the caller already set in the header is **kept as is**;
//! * a key the caller set only as an [`IdempotencyKey`] annotation is
//!   copied into the header.
//!
//! In every case the request leaves with the header *and* the
//! [`IdempotencyKey`] annotation, which tells the retry layer that this
//! request may be retried although its method is not idempotent: the server
//! can recognise a repeat. Requests of other methods pass untouched.
//!
//! # A blank key is no key
//!
//! A key that is empty or only spaces and tabs
//! ([`IdempotencyKey::is_blank`]) is **no key**: servers trim header values,
//! so every attempt would reach them with an empty key, which cannot tell a
//! repeat from a new request. So:
//!
//! * a blank `Idempotency-Key` header set by the caller is left as it is
//!   (the request is the caller's), but it is **not annotated**, and an
//!   [`IdempotencyKey`] annotation the caller set next to it is removed: the
//!   request is then not made retryable by a key, and a POST is sent **once**
//!   (the retry layer, too, takes a blank header as no key, so the same holds
//!   without this layer);
//! * a blank [`IdempotencyKey`] annotation without a header is ignored, and
//!   the layer adds a fresh key as if there were none;
//! * a blank value from the generator means "no key": nothing is added.
//!
//! We chose "no key, sent once" over failing the request because an empty
//! key header is what a caller sends when it has no key to give (an unset
//! variable in a template), and a request without a key is a valid request:
//! it must only never be repeated. The layer never sends anything twice on
//! the strength of a key the server cannot see.
//!
//! Put the layer **above** the retry layer: it runs once per logical request,
//! so every attempt carries the same key.
//!
//! # Conflicts
//!
//! A server that implements idempotency keys answers `409 Conflict` when a
//! request with the same key is still being processed, and `422 Unprocessable
//! Content` when the key was already used with another body. On a request
//! that carried a key, the layer marks those responses
//! [`Verdict::Fatal`] with the reasons `"idempotency key in flight"` and
//! `"idempotency key reused with another body"`, so logs and the caller say
//! why. Turn it off with
//! [`conflicts_fatal(false)`](IdempotencyKeyLayer::conflicts_fatal) for an API
//! that uses these statuses for something else. The layer sits above the
//! retry loop, so it refines the final verdict; the default classifier
//! already treats 409 and 422 as fatal, so they are not retried.
//!
//! # Is the key sensitive?
//!
//! The header value is **not** marked sensitive
//! ([`HeaderValue::set_sensitive`]). A key is not a credential: it
//! authorises nothing, the server scopes it to the caller's account, stores
//! it and usually echoes it, and operators correlate retries by it. Marking
//! it sensitive would only stop HTTP/2 from indexing it in HPACK, which is
//! what lets a retry on the same connection send it in a byte or two. It
//! still never reaches a rebound log line: the [`IdempotencyKey`] annotation
//! prints as `IdempotencyKey(..)` and header values are shown only from an
//! allow-list. A key the caller set, sensitive or not, is left as it is.
//!
//! # Errors
//!
//! The layer makes no errors of its own; errors of the inner service are
//! turned into [`Error`] with [`Error::from_boxed`].
//!
//! # Clone
//!
//! The layer and the service are cheap to clone: the method set and the
//! generator are shared behind an `Arc` (the generator need not be `Clone`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::HeaderName;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{IdempotencyKey, Reason, Verdict};
use crate::error::{BoxError, Error};

use self::future::ResponseFuture;

/// The default header: `Idempotency-Key` (IETF draft
/// `draft-ietf-httpapi-idempotency-key-header`).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The verdict reason for a 409 answer to a request with a key.
pub const REASON_IN_FLIGHT: &str = "idempotency key in flight";

/// The verdict reason for a 422 answer to a request with a key.
pub const REASON_REUSED: &str = "idempotency key reused with another body";

// ===== key generators =====

/// Makes a fresh idempotency key.
///
/// Implemented for [`UuidV4`] (the default) and for every
/// `Fn() -> HeaderValue`, in the style of tower-http's `MakeHeaderValue`:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use http::HeaderValue;
/// use rebound_core::idempotency::IdempotencyKeyLayer;
///
/// let next = AtomicU64::new(1);
/// let layer = IdempotencyKeyLayer::new().generator(move || {
///     let n = next.fetch_add(1, Ordering::Relaxed);
///     HeaderValue::from_str(&format!("order-{n}")).expect("ASCII digits")
/// });
/// # let _ = layer;
/// ```
pub trait MakeIdempotencyKey {
    /// A new key. It must be unique per logical request; a blank value
    /// (empty or only whitespace) means "no key".
    fn make_key(&self) -> HeaderValue;
}

impl<F> MakeIdempotencyKey for F
where
    F: Fn() -> HeaderValue,
{
    fn make_key(&self) -> HeaderValue {
        self()
    }
}

/// The default key generator: a random UUID, version 4, in its hyphenated
/// lowercase form (`xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`), from the
/// operating system's random generator (the `uuid` crate through
/// `getrandom`).
#[derive(Debug, Clone, Copy, Default)]
pub struct UuidV4;

impl MakeIdempotencyKey for UuidV4 {
    fn make_key(&self) -> HeaderValue {
        let mut buf = uuid::Uuid::encode_buffer();
        let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buf);
        HeaderValue::from_str(text).expect("a hyphenated UUID is a valid header value")
    }
}

// ===== layer =====

/// Adds an idempotency key to POST and PATCH requests (configurable) and
/// annotates them so the retry layer may retry them.
///
/// See the [module docs](self) for an example and the rules.
pub struct IdempotencyKeyLayer<M = UuidV4> {
    config: Config<M>,
}

impl<M> Clone for IdempotencyKeyLayer<M> {
    fn clone(&self) -> Self {
        IdempotencyKeyLayer {
            config: self.config.clone(),
        }
    }
}

/// Cheap to clone (reference counts), whatever the generator is.
pub(crate) struct Config<M> {
    header: HeaderName,
    methods: Arc<[Method]>,
    conflicts_fatal: bool,
    make: Arc<M>,
}

impl<M> Clone for Config<M> {
    fn clone(&self) -> Self {
        Config {
            header: self.header.clone(),
            methods: Arc::clone(&self.methods),
            conflicts_fatal: self.conflicts_fatal,
            make: Arc::clone(&self.make),
        }
    }
}

impl IdempotencyKeyLayer<UuidV4> {
    /// A layer with the defaults: header `Idempotency-Key`, methods POST and
    /// PATCH, UUIDv4 keys, 409/422 fatal.
    pub fn new() -> Self {
        IdempotencyKeyLayer {
            config: Config {
                header: IDEMPOTENCY_KEY,
                methods: Arc::new([Method::POST, Method::PATCH]),
                conflicts_fatal: true,
                make: Arc::new(UuidV4),
            },
        }
    }
}

impl Default for IdempotencyKeyLayer<UuidV4> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> IdempotencyKeyLayer<M> {
    /// The header that carries the key. Default is `Idempotency-Key`
    /// ([`IDEMPOTENCY_KEY`]).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.config.header = name;
        self
    }

    /// The header that carries the key.
    pub fn get_header_name(&self) -> &HeaderName {
        &self.config.header
    }

    /// The methods that get a key; any other request passes untouched.
    /// Default is POST and PATCH. An empty set turns the layer off.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a 409 or 422 answer to a request with a key is marked
    /// [`Verdict::Fatal`] with a reason that says so. Default is `true`.
    pub fn conflicts_fatal(mut self, fatal: bool) -> Self {
        self.config.conflicts_fatal = fatal;
        self
    }

    /// Make keys with `make` instead of random UUIDv4s. Default is
    /// [`UuidV4`].
    pub fn generator<M2: MakeIdempotencyKey>(self, make: M2) -> IdempotencyKeyLayer<M2> {
        let Config {
            header,
            methods,
            conflicts_fatal,
            make: _,
        } = self.config;
        IdempotencyKeyLayer {
            config: Config {
                header,
                methods,
                conflicts_fatal,
                make: Arc::new(make),
            },
        }
    }
}

impl<S, M> Layer<S> for IdempotencyKeyLayer<M> {
    type Service = IdempotencyKeyService<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyKeyService {
            inner,
            config: self.config.clone(),
        }
    }
}

impl<M> fmt::Debug for IdempotencyKeyLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config
            .fmt_fields(f.debug_struct("IdempotencyKeyLayer"))
    }
}

impl<M> Config<M> {
    fn fmt_fields(&self, mut d: fmt::DebugStruct<'_, '_>) -> fmt::Result {
        d.field("header", &self.header)
            .field("methods", &self.methods)
            .field("conflicts_fatal", &self.conflicts_fatal)
            .field("generator", &std::any::type_name::<M>())
            .finish()
    }
}

impl<M: MakeIdempotencyKey> Config<M> {
    /// Put the key on `req` if it is one of ours; whether it now carries one.
    fn apply<B>(&self, req: &mut Request<B>) -> bool {
        if !self.methods.contains(req.method()) {
            return false;
        }
        if let Some(value) = req.headers().get(&self.header) {
            // The caller's key: kept as is, annotated for the retry layer.
            if IdempotencyKey::is_blank(value) {
                // No key the server can see: nothing may make this request
                // retryable by a key (see "A blank key is no key").
                if req.extensions().get::<IdempotencyKey>().is_some() {
                    req.extensions_mut().remove::<IdempotencyKey>();
                }
                return false;
            }
            if req.extensions().get::<IdempotencyKey>().is_none() {
                let key = IdempotencyKey(value.clone());
                req.extensions_mut().insert(key);
            }
            return true;
        }
        let value = match req.extensions().get::<IdempotencyKey>() {
            // The caller chose the key through the annotation only.
            Some(key) if !IdempotencyKey::is_blank(&key.0) => key.0.clone(),
            _ => {
                let value = self.make.make_key();
                if IdempotencyKey::is_blank(&value) {
                    if req.extensions().get::<IdempotencyKey>().is_some() {
                        req.extensions_mut().remove::<IdempotencyKey>();
                    }
                    return false;
                }
                req.extensions_mut().insert(IdempotencyKey(value.clone()));
                req.extensions_mut()
                    .insert(crate::annotations::KeyGenerated);
                value
            }
        };
        req.headers_mut().insert(&self.header, value);
        true
    }
}

// ===== service =====

/// The service made by [`IdempotencyKeyLayer`].
///
/// See the [module docs](self).
pub struct IdempotencyKeyService<S, M = UuidV4> {
    inner: S,
    config: Config<M>,
}

impl<S: Clone, M> Clone for IdempotencyKeyService<S, M> {
    fn clone(&self) -> Self {
        IdempotencyKeyService {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for IdempotencyKeyService<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("IdempotencyKeyService");
        d.field("inner", &self.inner);
        self.config.fmt_fields(d)
    }
}

impl<S, M> IdempotencyKeyService<S, M> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, by value.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, M, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyKeyService<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    M: MakeIdempotencyKey,
{
    type Response = Response<ResBody>;
    type Error = Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let keyed = self.config.apply(&mut req);
        ResponseFuture {
            inner: self.inner.call(req),
            check_conflicts: keyed && self.config.conflicts_fatal,
        }
    }
}

pub mod future {
    //! The response future of [`IdempotencyKeyService`].

    use super::*;

    // ===== impl ResponseFuture =====

    pin_project! {
        /// The response future of [`IdempotencyKeyService`].
        #[must_use = "futures do nothing unless polled"]
        pub struct ResponseFuture<F> {
            #[pin]
            pub(super) inner: F,
            pub(super) check_conflicts: bool,
        }
    }

    impl<F: fmt::Debug> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture")
                .field("inner", &self.inner)
                .field("check_conflicts", &self.check_conflicts)
                .finish()
        }
    }

    impl<F, B, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<B>, E>>,
        E: Into<BoxError>,
    {
        type Output = Result<Response<B>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let mut res = ready!(this.inner.poll(cx)).map_err(|e| Error::from_boxed(e.into()))?;
            if *this.check_conflicts {
                if let Some(reason) = conflict_reason(res.status()) {
                    res.extensions_mut().insert(Verdict::Fatal {
                        reason: Reason::new_static(reason),
                    });
                }
            }
            Poll::Ready(Ok(res))
        }
    }

    pub(crate) fn conflict_reason(status: StatusCode) -> Option<&'static str> {
        match status {
            StatusCode::CONFLICT => Some(REASON_IN_FLIGHT),
            StatusCode::UNPROCESSABLE_ENTITY => Some(REASON_REUSED),
            _ => None,
        }
    }
}

#[cfg(feature = "stack")]
impl<M: MakeIdempotencyKey> IdempotencyKeyLayer<M> {
    /// Give `req` its key, as the layer's service does; `true` when this
    /// request's responses are then checked for key conflicts (see
    /// [`conflicts_fatal`](Self::conflicts_fatal)).
    pub(crate) fn stamp<B>(&self, req: &mut Request<B>) -> bool {
        self.config.apply(req) && self.config.conflicts_fatal
    }
}

#[cfg(test)]
mod tests {
    use super::future::*;
    use super::*;

    #[test]
    fn uuid_v4_keys_are_valid_and_distinct() {
        let a = UuidV4.make_key();
        let b = UuidV4.make_key();
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(a.to_str().unwrap()).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(a.to_str().unwrap(), parsed.hyphenated().to_string());
        assert!(!a.is_sensitive());
    }

    #[test]
    fn conflict_reasons() {
        assert_eq!(
            conflict_reason(StatusCode::CONFLICT),
            Some(REASON_IN_FLIGHT)
        );
        assert_eq!(
            conflict_reason(StatusCode::UNPROCESSABLE_ENTITY),
            Some(REASON_REUSED)
        );
        assert_eq!(conflict_reason(StatusCode::BAD_REQUEST), None);
        assert_eq!(conflict_reason(StatusCode::OK), None);
    }
}
