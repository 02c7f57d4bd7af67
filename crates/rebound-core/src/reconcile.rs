//! Reconcile an ambiguous write before it is sent again.
//!
//! A timeout, or a reset after the request was written, does not prove the
//! server did not do the work. For a write with a side effect, the safe
//! next step is to **ask** for the operation's state by its id before
//! sending the write again. [`ReconcileLayer`] does that.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::reconcile::{Check, OperationId, ReconcileLayer, Reconciled};
//! use rebound_core::retry::{RetryLayer, RetryPolicy};
//! use rebound_core::{Attempts, BoxError};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let created = Arc::new(AtomicU32::new(0));
//! // The server creates the order, then its answer is lost (a 502 from a
//! // proxy: retryable, maybe processed).
//! let inner = {
//!     let created = created.clone();
//!     tower::service_fn(move |_req: Request<Full<Bytes>>| {
//!         created.fetch_add(1, Ordering::SeqCst);
//!         async move {
//!             let mut res = Response::new(Full::new(Bytes::new()));
//!             *res.status_mut() = StatusCode::BAD_GATEWAY;
//!             Ok::<_, BoxError>(res)
//!         }
//!     })
//! };
//! // The status check: `GET /operations/{id}` in real life.
//! let check = tower::service_fn(|id: OperationId| async move {
//!     assert_eq!(id.as_str(), "order-7");
//!     let res = Response::new(Full::new(Bytes::from_static(b"{\"order\":7}")));
//!     Ok::<_, BoxError>(Check::Finished(res))
//! });
//! let mut svc = ServiceBuilder::new()
//!     .layer(RetryLayer::new(RetryPolicy::default().max_attempts(3)))
//!     .layer(ReconcileLayer::new(check))
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(inner);
//!
//! let req = Request::post("http://shop.example/orders")
//!     .header("idempotency-key", "order-7")
//!     .body(Full::new(Bytes::from_static(b"{}")))
//!     .unwrap();
//! let res = svc.ready().await?.call(req).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.extensions().get::<Reconciled>().unwrap().id.as_str(), "order-7");
//! assert_eq!(Attempts::of(res.extensions()), 1); // no second write
//! assert_eq!(created.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Placement
//!
//! **Below** the retry layer and above the classify layer (so it reads the
//! attempt's [`Verdict`]): it acts after each attempt's outcome and before
//! the retry loop decides on the next attempt, which is exactly "after an
//! outcome that is retryable but maybe processed, and before the next
//! attempt". It never repeats anything itself (DESIGN §1.4, one loop).
//!
//! **With `rebound::Client`**, give the layer to the builder:
//! `Client::builder().reconcile(ReconcileLayer::new(check))`. The client
//! puts it, in both of its stacks (`send` and the JSON helpers), below its
//! retry loop and its hedge and above its per-attempt layers (attempt
//! span, backoff, gate, adaptive limit, classifier), so those see the
//! attempt as it was; its own retry loop does the retries.
//! For the client, `Check::Finished` carries a `Response` with any body
//! (`http_body::Body<Data = Bytes>`): another rebound client's answer from
//! the status endpoint, or a response made from the caller's own records
//! (a database row, a cache entry); the client reads it into memory inside
//! the check's timeout. (A hedged client streams it, and so takes only a
//! rebound client's `Response<ClientBody>`.) The id is the
//! `Idempotency-Key` the client gives every POST and PATCH.
//!
//! # What the check is asked
//!
//! A check given to [`ReconcileLayer::new`] is a `Service<`[`OperationId`]`>`:
//! the id alone. One given to [`ReconcileLayer::with_request`] is a
//! `Service<`[`Inquiry`]`>`: the id, the write's method and its
//! [redacted](RedactedUri) URL (no userinfo, no query string), so one
//! check can tell `POST /orders` from `POST /refunds`.
//!
//! **On a stack of your own**, or around a client built with
//! `max_attempts(1)`: `RetryLayer → ReconcileLayer → ClassifyLayer →
//! service`. [`map_check`](ReconcileLayer::map_check) changes the check
//! (e.g. erases its type) and keeps the settings.
//!
//! # What it does
//!
//! When an attempt's outcome is [`Verdict::Retryable`] with
//! [`Sent::MaybeProcessed`] and the request carries an operation id — by
//! default its `Idempotency-Key` header, else its [`IdempotencyKey`]
//! annotation; or whatever [`ReconcileLayer::operation_id`] extracts — it
//! calls the status check (any `tower::Service<OperationId>`, e.g. a
//! `tower::service_fn`) with that id, bounded by the check timeout
//! ([`DEFAULT_CHECK_TIMEOUT`], 5 s, unless set) and the request's
//! [`Deadline`], whichever comes first:
//!
//! * [`Check::Finished`]`(response)` → the caller gets that response, with
//!   a [`Reconciled`] annotation and [`Verdict::Success`]: the retry loop
//!   returns it and sends no new write. Traced as `reconciled`.
//! * [`Check::NotFound`] → the outcome is left as it was (retryable): the
//!   retry goes ahead, with the same key. Traced as `not_found`.
//! * [`Check::Unknown`], a failed check, or one that timed out → an error
//!   of kind [`ErrorKind::Ambiguous`] with a fatal verdict (the loop stops)
//!   that carries the [`OperationId`] in its extensions and its message.
//!   Traced as `ambiguous`. With
//!   [`retry_when_ambiguous(true)`](ReconcileLayer::retry_when_ambiguous)
//!   the original retryable outcome is left instead.
//!
//! An outcome that is a success, fatal, or [`Sent::NotSent`] (a refused
//! connection: the server never saw it) is passed through untouched, with
//! no check. So is every request without an operation id.
//!
//! The id is not a secret (it is what the server's status endpoint is keyed
//! by), but it is only ever read from the id header or annotation, never
//! from another header.
//!
//! # Cost
//!
//! A request without an operation id pays one header lookup (and one
//! extension lookup) and nothing else. A request with one also clones, at
//! call time, the id's header value, the check service `C` and the
//! request's method and URI (to name an ambiguous error): reference counts
//! (`bytes` may allocate its shared counter once for a value that was not
//! shared yet; the retry layer's template clone above has usually done so
//! already). No lock. The check path is boxed.
//!
//! The check also runs after the **last** attempt's maybe-processed
//! outcome: the caller then gets the operation's result (or an ambiguous
//! error) rather than a lost answer. A `Finished` response is returned as
//! the check produced it, plus [`Reconciled`] and [`Verdict::Success`]: if
//! the check itself ran through a rebound client, its own annotations
//! (e.g. `Attempts`) stay on it.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Deadline, IdempotencyKey, Reason, Sent, Verdict};
use crate::error::{BoxError, Error, ErrorKind};
use crate::redact::{RedactedUri, RequestName};

/// The check timeout when none is set: 5 seconds.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

// ===== vocabulary =====

/// The id of an operation whose state the status check can ask for: the
/// idempotency key, or a caller-chosen id. Not a secret.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OperationId(HeaderValue);

impl OperationId {
    /// An id from a header value (e.g. an `Idempotency-Key`).
    pub fn new(value: HeaderValue) -> Self {
        OperationId(value)
    }

    /// The id as text (`"<non-ascii id>"` if it is not visible ASCII).
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or("<non-ascii id>")
    }

    /// The id as a header value.
    pub fn as_header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OperationId({:?})", self.as_str())
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// On a response: it was not the write's own answer but the status check's,
/// for the operation `id`, after the write's answer was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// The operation that was found finished.
    pub id: OperationId,
}

/// What a status check built with [`ReconcileLayer::with_request`] is
/// asked: the operation's id and the write it belongs to — its method and
/// its [redacted](RedactedUri) URL (no userinfo, no query string), so one
/// check can serve several endpoints, or look the operation up in a
/// database or a cache by more than its id.
#[derive(Clone)]
pub struct Inquiry {
    id: OperationId,
    name: RequestName,
}

impl Inquiry {
    /// An inquiry about `id`, for the write `req` (its method and URL are
    /// kept; its headers and body are not).
    pub fn new<B>(id: OperationId, req: &Request<B>) -> Self {
        Inquiry {
            id,
            name: RequestName::of(req),
        }
    }

    pub(crate) fn named(id: OperationId, name: RequestName) -> Self {
        Inquiry { id, name }
    }

    /// The operation's id.
    pub fn id(&self) -> &OperationId {
        &self.id
    }

    /// The operation's id, consuming the inquiry.
    pub fn into_id(self) -> OperationId {
        self.id
    }

    /// The write's method.
    pub fn method(&self) -> &http::Method {
        self.name.method()
    }

    /// The write's URL, redacted: scheme, host, port and path, never
    /// userinfo or the query string.
    pub fn url(&self) -> RedactedUri {
        RedactedUri::new(self.name.uri())
    }
}

impl fmt::Debug for Inquiry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inquiry")
            .field("id", &self.id)
            .field("request", &self.name)
            .finish()
    }
}

/// What a status check is called with: an [`OperationId`] alone (a check
/// given to [`ReconcileLayer::new`]) or an [`Inquiry`] (one given to
/// [`ReconcileLayer::with_request`]). Sealed: these two are all there is.
pub trait CheckRequest: sealed::Sealed + Send + 'static {
    /// The request for an inquiry.
    #[doc(hidden)]
    fn from_inquiry(inquiry: Inquiry) -> Self;
}

impl CheckRequest for OperationId {
    fn from_inquiry(inquiry: Inquiry) -> Self {
        inquiry.id
    }
}

impl CheckRequest for Inquiry {
    fn from_inquiry(inquiry: Inquiry) -> Self {
        inquiry
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::OperationId {}
    impl Sealed for super::Inquiry {}
}

/// What the status check found.
#[derive(Debug)]
pub enum Check<R> {
    /// The operation exists and is finished; this response is its result
    /// and is given to the caller.
    Finished(R),
    /// The server never saw the operation: sending it again is safe.
    NotFound,
    /// The server knows the operation but cannot say how it ended (still
    /// running, or no answer): sending it again is not safe.
    Unknown,
}

type IdFn = Arc<dyn Fn(&http::request::Parts) -> Option<OperationId> + Send + Sync>;

// ===== layer =====

/// Reconciles an ambiguous write with a status check `C` before the retry
/// loop sends it again.
///
/// `C` is a `tower::Service<Q, Response = Check<Response<B>>>` (e.g.
/// `tower::service_fn`), cloned for each check, where `Q` is
/// [`OperationId`] ([`new`](Self::new)) or [`Inquiry`]
/// ([`with_request`](Self::with_request): the id plus the write's method
/// and redacted URL).
///
/// See the [module docs](self) for an example and the placement.
pub struct ReconcileLayer<C, Q = OperationId> {
    check: C,
    timeout: Duration,
    retry_when_ambiguous: bool,
    id: Option<IdFn>,
    asks: PhantomData<fn() -> Q>,
}

impl<C: Clone, Q> Clone for ReconcileLayer<C, Q> {
    fn clone(&self) -> Self {
        ReconcileLayer {
            check: self.check.clone(),
            timeout: self.timeout,
            retry_when_ambiguous: self.retry_when_ambiguous,
            id: self.id.clone(),
            asks: PhantomData,
        }
    }
}

impl<C, Q> fmt::Debug for ReconcileLayer<C, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileLayer")
            .field("check", &std::any::type_name::<C>())
            .field("timeout", &self.timeout)
            .field("retry_when_ambiguous", &self.retry_when_ambiguous)
            .field("custom_id", &self.id.is_some())
            .finish()
    }
}

impl<C> ReconcileLayer<C> {
    /// A layer that asks `check`, a `Service<`[`OperationId`]`>`, with the
    /// [`DEFAULT_CHECK_TIMEOUT`].
    pub fn new(check: C) -> Self {
        ReconcileLayer {
            check,
            timeout: DEFAULT_CHECK_TIMEOUT,
            retry_when_ambiguous: false,
            id: None,
            asks: PhantomData,
        }
    }
}

impl<C> ReconcileLayer<C, Inquiry> {
    /// A layer that asks `check`, a `Service<`[`Inquiry`]`>` that sees the
    /// write's method and redacted URL besides the id, with the
    /// [`DEFAULT_CHECK_TIMEOUT`].
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Method, Response};
    /// use http_body_util::Full;
    /// use rebound_core::reconcile::{Check, Inquiry, ReconcileLayer};
    /// use rebound_core::BoxError;
    ///
    /// // One check for two endpoints, answered from the caller's own
    /// // records (a database, a cache) rather than another HTTP call.
    /// let layer = ReconcileLayer::with_request(tower::service_fn(|q: Inquiry| async move {
    ///     let found = match (q.method(), q.url().path()) {
    ///         (&Method::POST, "/orders") => Some(format!("{{\"order\":\"{}\"}}", q.id())),
    ///         _ => None,
    ///     };
    ///     Ok::<_, BoxError>(match found {
    ///         Some(body) => Check::Finished(Response::new(Full::new(Bytes::from(body)))),
    ///         None => Check::NotFound,
    ///     })
    /// }));
    /// # let _ = layer;
    /// ```
    pub fn with_request(check: C) -> Self {
        ReconcileLayer {
            check,
            timeout: DEFAULT_CHECK_TIMEOUT,
            retry_when_ambiguous: false,
            id: None,
            asks: PhantomData,
        }
    }
}

impl<C, Q> ReconcileLayer<C, Q> {
    /// The check's own timeout (still bounded by the request's deadline).
    /// Default is [`DEFAULT_CHECK_TIMEOUT`] (5 s).
    ///
    /// # Panics
    ///
    /// If `timeout` is zero or longer than a day; see
    /// [`try_check_timeout`](Self::try_check_timeout).
    #[track_caller]
    pub fn check_timeout(self, timeout: Duration) -> Self {
        crate::config::expect_valid(
            "ReconcileLayer::check_timeout",
            self.try_check_timeout(timeout),
        )
    }

    /// The check's own timeout, checked.
    ///
    /// # Errors
    ///
    /// A configuration error if `timeout` is zero or longer than a day.
    pub fn try_check_timeout(mut self, timeout: Duration) -> Result<Self, Error> {
        self.timeout = crate::config::validate_duration("reconcile check timeout", timeout)?;
        Ok(self)
    }

    /// When the check cannot tell (unknown, failed, timed out): `false`
    /// (the default) stops with an [`ErrorKind::Ambiguous`] error; `true`
    /// leaves the retryable outcome, so the retry goes ahead with the same
    /// key (for servers known to honour it).
    pub fn retry_when_ambiguous(mut self, yes: bool) -> Self {
        self.retry_when_ambiguous = yes;
        self
    }

    /// The same layer (timeout, id source, ambiguity rule) with its check
    /// replaced by `f(check)`: to erase the check's type, or to adapt the
    /// body of the responses it returns. `rebound::ClientBuilder::reconcile`
    /// uses it to fit one check to both of the client's stacks.
    pub fn map_check<D>(self, f: impl FnOnce(C) -> D) -> ReconcileLayer<D, Q> {
        self.map_asking(f)
    }

    /// The same layer with its check replaced by `f(check)`, which asks
    /// with another request type (`R`): how a check of either kind is
    /// erased into one that takes an [`Inquiry`].
    pub fn map_asking<D, R>(self, f: impl FnOnce(C) -> D) -> ReconcileLayer<D, R> {
        ReconcileLayer {
            check: f(self.check),
            timeout: self.timeout,
            retry_when_ambiguous: self.retry_when_ambiguous,
            id: self.id,
            asks: PhantomData,
        }
    }

    /// Where the operation id comes from, instead of the `Idempotency-Key`
    /// header / [`IdempotencyKey`] annotation. `None` means no check for
    /// that request. Called once per request (keep it cheap).
    pub fn operation_id<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<OperationId> + Send + Sync + 'static,
    {
        self.id = Some(Arc::new(f));
        self
    }
}

impl<S, C: Clone, Q> Layer<S> for ReconcileLayer<C, Q> {
    type Service = Reconcile<S, C, Q>;

    fn layer(&self, inner: S) -> Self::Service {
        Reconcile {
            inner,
            layer: self.clone(),
        }
    }
}

// ===== service =====

/// The service made by [`ReconcileLayer`].
///
/// # Errors
///
/// The inner service's errors, as [`Error`]; an [`ErrorKind::Ambiguous`]
/// error when the check cannot tell.
pub struct Reconcile<S, C, Q = OperationId> {
    inner: S,
    layer: ReconcileLayer<C, Q>,
}

impl<S: Clone, C: Clone, Q> Clone for Reconcile<S, C, Q> {
    fn clone(&self) -> Self {
        Reconcile {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, C, Q> fmt::Debug for Reconcile<S, C, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconcile")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, C, Q> Reconcile<S, C, Q> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming `self`.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

fn operation_id(parts: &http::request::Parts) -> Option<OperationId> {
    match parts.headers.get(IDEMPOTENCY_KEY) {
        Some(v) if !IdempotencyKey::is_blank(v) => Some(OperationId(v.clone())),
        Some(_) => None,
        None => parts
            .extensions
            .get::<IdempotencyKey>()
            .filter(|k| !IdempotencyKey::is_blank(&k.0))
            .map(|k| OperationId(k.0.clone())),
    }
}

impl<S, C, Q, B, ResB> Service<Request<B>> for Reconcile<S, C, Q>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    Q: CheckRequest,
    C: Service<Q, Response = Check<Response<ResB>>> + Clone + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S::Future, C, ResB, Q>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let id = match &self.layer.id {
            Some(f) => f(&parts),
            None => operation_id(&parts),
        };
        let deadline = id.as_ref().and_then(|_| Deadline::of(&parts.extensions));
        let req = Request::from_parts(parts, body);
        let pending = id.map(|id| future::Pending {
            id,
            check: self.layer.check.clone(),
            timeout: self.layer.timeout,
            deadline,
            retry_when_ambiguous: self.layer.retry_when_ambiguous,
            name: RequestName::of(&req),
            asks: PhantomData,
        });
        let fut = self.inner.call(req);
        future::ResponseFuture::new(fut, pending)
    }
}

fn ambiguous(id: &OperationId, why: &'static str, name: &RequestName) -> Error {
    let mut e = Error::new(ErrorKind::Ambiguous).with_owned_detail(format!(
        "operation {id} may have been processed and its state is unknown ({why})"
    ));
    e.extensions_mut().insert(id.clone());
    e.extensions_mut().insert(Verdict::Fatal {
        reason: Reason::new_static("ambiguous write"),
    });
    name.name(e)
}

/// The response future of [`Reconcile`].
pub mod future {
    use super::*;

    pub(super) struct Pending<C, Q> {
        pub(super) id: OperationId,
        pub(super) check: C,
        pub(super) timeout: Duration,
        pub(super) deadline: Option<tokio::time::Instant>,
        pub(super) retry_when_ambiguous: bool,
        pub(super) name: RequestName,
        pub(super) asks: PhantomData<fn() -> Q>,
    }

    type Checking<R> = Pin<Box<dyn Future<Output = Result<Response<R>, Error>> + Send>>;

    pin_project! {
        /// The response future of [`Reconcile`](super::Reconcile).
        pub struct ResponseFuture<F, C, R, Q = OperationId> {
            #[pin]
            state: State<F, C, R, Q>,
        }
    }

    pin_project! {
        #[project = StateProj]
        enum State<F, C, R, Q> {
            Called { #[pin] fut: F, pending: Option<Pending<C, Q>> },
            Checking { fut: Checking<R> },
        }
    }

    impl<F, C, R, Q> fmt::Debug for ResponseFuture<F, C, R, Q> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("reconcile::ResponseFuture")
                .finish_non_exhaustive()
        }
    }

    impl<F, C, R, Q> ResponseFuture<F, C, R, Q> {
        pub(super) fn new(fut: F, pending: Option<Pending<C, Q>>) -> Self {
            ResponseFuture {
                state: State::Called { fut, pending },
            }
        }
    }

    impl<F, C, R, E, Q> Future for ResponseFuture<F, C, R, Q>
    where
        F: Future<Output = Result<Response<R>, E>>,
        E: Into<BoxError>,
        Q: CheckRequest,
        C: Service<Q, Response = Check<Response<R>>> + Send + 'static,
        C::Error: Into<BoxError>,
        C::Future: Send + 'static,
        R: Send + 'static,
    {
        type Output = Result<Response<R>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut this = self.project();
            loop {
                match this.state.as_mut().project() {
                    StateProj::Called { fut, pending } => {
                        let outcome = ready!(fut.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
                        let ext = match &outcome {
                            Ok(res) => res.extensions(),
                            Err(e) => e.extensions(),
                        };
                        let maybe_processed = matches!(
                            ext.get::<Verdict>(),
                            Some(Verdict::Retryable {
                                sent: Sent::MaybeProcessed,
                                ..
                            })
                        );
                        let Some(p) = pending.take().filter(|_| maybe_processed) else {
                            return Poll::Ready(outcome);
                        };
                        let fut = Box::pin(run_check(p, outcome));
                        this.state.set(State::Checking { fut });
                    }
                    StateProj::Checking { fut } => return fut.as_mut().poll(cx),
                }
            }
        }
    }

    async fn run_check<C, R, Q>(
        p: Pending<C, Q>,
        outcome: Result<Response<R>, Error>,
    ) -> Result<Response<R>, Error>
    where
        Q: CheckRequest,
        C: Service<Q, Response = Check<Response<R>>> + Send + 'static,
        C::Error: Into<BoxError>,
        C::Future: Send + 'static,
    {
        let Pending {
            id,
            check,
            timeout,
            deadline,
            retry_when_ambiguous,
            name,
            asks: _,
        } = p;
        let mut until = tokio::time::Instant::now() + timeout;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let asked = Q::from_inquiry(Inquiry::named(id.clone(), name.clone()));
        let checked = match tokio::time::timeout_at(until, check.oneshot(asked)).await {
            Ok(Ok(check)) => Ok(check),
            Ok(Err(_)) => Err("the check failed"),
            Err(_) => Err("the check timed out"),
        };
        settle(checked, id, outcome, retry_when_ambiguous, &name, |res| res)
    }

    /// The outcome once the check answered (`Err`: why it did not — it
    /// failed, or timed out): the check's response (its body made an `R` by `into`), the
    /// original outcome, or an [`ErrorKind::Ambiguous`] error. Shared by
    /// [`Reconcile`](super::Reconcile)'s future and the whole-stack service.
    pub(crate) fn settle<R, X>(
        checked: Result<Check<Response<X>>, &'static str>,
        id: OperationId,
        outcome: Result<Response<R>, Error>,
        retry_when_ambiguous: bool,
        name: &RequestName,
        into: impl FnOnce(Response<X>) -> Response<R>,
    ) -> Result<Response<R>, Error> {
        let why = match checked {
            Ok(Check::Finished(res)) => {
                tracing::info!(outcome = "reconciled", operation_id = %id, "reconcile");
                let mut res = into(res);
                res.extensions_mut().insert(Verdict::Success);
                res.extensions_mut().insert(Reconciled { id });
                return Ok(res);
            }
            Ok(Check::NotFound) => {
                tracing::info!(outcome = "not_found", operation_id = %id, "reconcile");
                return outcome;
            }
            Ok(Check::Unknown) => "the check could not tell",
            Err(why) => why,
        };
        tracing::warn!(outcome = "ambiguous", operation_id = %id, why, "reconcile");
        if retry_when_ambiguous {
            return outcome;
        }
        Err(ambiguous(&id, why, name))
    }
}

// ===== the engine, for the whole-stack service =====

/// A status check whose response's body is already in memory, erased.
#[cfg(feature = "stack")]
pub(crate) type CheckFuture = Pin<
    Box<
        dyn Future<Output = Result<Check<Response<crate::collect::CollectedBody>>, BoxError>>
            + Send,
    >,
>;

/// What a status check came to: its answer, or why there is none.
#[cfg(feature = "stack")]
pub(crate) type Asked = Pin<
    Box<
        dyn Future<Output = Result<Check<Response<crate::collect::CollectedBody>>, &'static str>>
            + Send,
    >,
>;

/// A [`ReconcileLayer`] as the whole-stack service calls it: the check
/// erased (its responses read into memory), the settings.
#[cfg(feature = "stack")]
#[derive(Clone)]
pub(crate) struct ReconcileHook {
    check: Arc<dyn Fn(Inquiry) -> CheckFuture + Send + Sync>,
    timeout: Duration,
    retry_when_ambiguous: bool,
    id: Option<IdFn>,
}

#[cfg(feature = "stack")]
impl<C, Q> ReconcileLayer<C, Q>
where
    Q: CheckRequest,
    C: Service<Q, Response = Check<Response<crate::collect::CollectedBody>>>
        + Clone
        + Send
        + Sync
        + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    /// This layer's check and settings, for the whole-stack service.
    pub(crate) fn hook(self) -> ReconcileHook {
        let check = self.check;
        ReconcileHook {
            check: Arc::new(move |inquiry| {
                let check = check.clone();
                let asked = Q::from_inquiry(inquiry);
                Box::pin(async move { check.oneshot(asked).await.map_err(Into::into) })
            }),
            timeout: self.timeout,
            retry_when_ambiguous: self.retry_when_ambiguous,
            id: self.id,
        }
    }
}

#[cfg(feature = "stack")]
impl ReconcileHook {
    /// The operation id of a request with these parts, if it has one.
    pub(crate) fn operation_id(&self, parts: &http::request::Parts) -> Option<OperationId> {
        match &self.id {
            Some(f) => f(parts),
            None => operation_id(parts),
        }
    }

    /// Whether `outcome` is one to reconcile: retryable, maybe processed.
    pub(crate) fn wants<R>(outcome: &Result<Response<R>, Error>) -> bool {
        let ext = match outcome {
            Ok(res) => res.extensions(),
            Err(e) => e.extensions(),
        };
        matches!(
            ext.get::<Verdict>(),
            Some(Verdict::Retryable {
                sent: Sent::MaybeProcessed,
                ..
            })
        )
    }

    /// Ask the check about `id`, for the write `name`, within its timeout
    /// and `deadline`.
    pub(crate) fn ask(
        &self,
        id: OperationId,
        name: RequestName,
        deadline: tokio::time::Instant,
    ) -> Asked {
        let until = (tokio::time::Instant::now() + self.timeout).min(deadline);
        let checked = (self.check)(Inquiry::named(id, name));
        Box::pin(async move {
            match tokio::time::timeout_at(until, checked).await {
                Ok(Ok(check)) => Ok(check),
                Ok(Err(_)) => Err("the check failed"),
                Err(_) => Err("the check timed out"),
            }
        })
    }

    /// The outcome once the check answered; see [`future::settle`].
    pub(crate) fn settle<R>(
        &self,
        checked: Result<Check<Response<crate::collect::CollectedBody>>, &'static str>,
        id: OperationId,
        outcome: Result<Response<R>, Error>,
        name: &RequestName,
        into: impl FnOnce(Response<crate::collect::CollectedBody>) -> Response<R>,
    ) -> Result<Response<R>, Error> {
        future::settle(checked, id, outcome, self.retry_when_ambiguous, name, into)
    }
}
