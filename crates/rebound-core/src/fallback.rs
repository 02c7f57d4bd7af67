//! Fall back to an explicit, ordered list of alternate routes — and only to
//! those, and only when policy allows.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::fallback::{FallbackLayer, Route, Served};
//! use rebound_core::retry::{RetryLayer, RetryPolicy};
//! use rebound_core::BoxError;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! // The primary region is down (503); the secondary answers.
//! let inner = tower::service_fn(|req: Request<Full<Bytes>>| async move {
//!     let mut res = Response::new(Full::new(Bytes::new()));
//!     if req.uri().host() == Some("eu.api.example") {
//!         *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//!     }
//!     Ok::<_, BoxError>(res)
//! });
//! let mut svc = ServiceBuilder::new()
//!     .layer(FallbackLayer::new([Route::base_url("https://us.api.example")]))
//!     .layer(RetryLayer::new(RetryPolicy::default().max_attempts(2)))
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(inner);
//!
//! let req = Request::get("https://eu.api.example/v1/models")
//!     .body(Full::new(Bytes::new()))
//!     .unwrap();
//! let res = svc.ready().await?.call(req).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.extensions().get::<Served>().unwrap().route, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Placement
//!
//! **Above** the retry loop (below the deadline): the primary gets its
//! whole retry loop first, and each route gets its own, all bounded by the
//! caller's deadline.
//!
//! **With `rebound::Client`**, give the layer to the builder:
//! `Client::builder().fallback(FallbackLayer::new(routes))`. The client puts
//! it, in both of its stacks (`send` and the JSON helpers), below its
//! deadline (the total timeout, or the caller's deadline if earlier), its
//! concurrency limit and its idempotency-key layer, and above its retry
//! loop; and it charges fallbacks to the client's retry budget unless
//! [`budget`](FallbackLayer::budget) gave the layer one. So the whole chain
//! ends by one deadline, the logical request keeps its one concurrency
//! permit, and every route carries the primary's `Idempotency-Key` (a
//! route to the same service can then recognise a write the primary may
//! have done). Stacked *around* a client instead, each route would get a
//! fresh total timeout and no shared budget.
//!
//! **On a stack of your own**, in the same order:
//! `DeadlineLayer → ConcurrencyLimitLayer → IdempotencyKeyLayer →
//! FallbackLayer → RetryLayer → … → ClassifyLayer → service`, with
//! `.budget(Arc::clone(retry_layer.policy().get_budget()))` to share the
//! retry loop's budget.
//!
//! # When it falls back
//!
//! Only when the primary's final outcome is a **retryable failure**: a
//! retryable [`Verdict`] (attempts or budget exhausted, a connect failure,
//! a 5xx/429 left over), or an error of kind [`ErrorKind::CircuitOpen`],
//! [`ErrorKind::Connect`] or a timeout other than the deadline. Never after
//! a fatal outcome (a 400, 401, 403, 404 or 422 is fatal by the classifier),
//! never when the retry loop stopped because the request may not be sent
//! again ([`RetryStop::NotEligible`]: a write without an idempotency key
//! that may have been processed — another route would be a second send),
//! never once the [`Deadline`] has passed or a shutdown has begun (the
//! task's [`Closing`] signal is closed), never when the request body
//! cannot be copied ([`ReplayableBody::try_replay`] returns `None`), and
//! never when the shared [`RetryBudget`] (if given,
//! [`FallbackLayer::budget`]) refuses: each fallback withdraws one retry.
//! Routes are tried in order; the first that does not end in a retryable
//! failure, or the last, is returned.
//!
//! # What it sends where
//!
//! Nothing outside the list is ever reached: each [`Route`] is an absolute
//! URL fixed at construction (scheme and authority replace the request's;
//! a path prefix is prepended), then the route's rewrite, if any, may
//! change the request (another model id, another header). Credentials do
//! not cross hosts by accident: the headers named by
//! [`FallbackLayer::strip_headers`] (`Authorization` by default) are
//! removed before the rewrite runs, so the alternate route receives one
//! only if its rewrite sets it. Only the [`Deadline`], [`IdempotencyKey`]
//! and [`PermitLease`] annotations are carried to an alternate route (not
//! the request's whole extension map), and the previous route's outcome is
//! dropped before the next route is called (so what it holds — its
//! connection, a permit in its body — is not held across that call).
//!
//! The response (or error) of an alternate route carries a [`Served`]
//! annotation with the route's index (1 for the first alternate; no
//! annotation means the primary) and its host; the trace records
//! `fallback` events with the same fields, never a query string or header.
//!
//! # Cost
//!
//! A fallback needs the request again, so every request pays for a copy
//! of its head (method, URI, version, headers: the header map's clone
//! allocates) and [`ReplayableBody::try_replay`] of its body (a reference
//! count for bytes in memory) — the same price as the retry loop's
//! template. Nothing else: no lock, no box until a fallback is taken.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::{HeaderName, AUTHORIZATION};
use http::uri::{Parts as UriParts, PathAndQuery};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use pin_project_lite::pin_project;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{Closing, Deadline, IdempotencyKey, PermitLease, RetryStop, Verdict};
use crate::body::ReplayableBody;
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};
use crate::retry::RetryBudget;

// ===== vocabulary =====

/// On the outcome of an alternate route: which route served it. Absent on
/// the primary's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// 1 for the first route of the list, 2 for the second, ...
    pub route: usize,
    /// The route's host (no userinfo, no path, no query).
    pub host: Arc<str>,
}

type Rewrite = Arc<dyn Fn(&mut http::request::Parts) + Send + Sync>;

/// One alternate route: an absolute base URL, and optionally a rewrite of
/// the request.
#[derive(Clone)]
pub struct Route {
    base: Result<(http::uri::Scheme, http::uri::Authority, String), String>,
    host: Arc<str>,
    rewrite: Option<Rewrite>,
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("host", &self.host)
            .field("rewrite", &self.rewrite.is_some())
            .finish()
    }
}

impl Route {
    /// A route to `url`: an absolute URL (`https://us.api.example`, or
    /// with a path prefix, `https://api.example/eu`). Checked by the
    /// layer's constructor; it must have no userinfo and no query.
    pub fn base_url(url: &str) -> Self {
        let base = (|| {
            let uri: Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
            let scheme = uri.scheme().cloned().ok_or("not an absolute URL")?;
            let authority = uri.authority().cloned().ok_or("not an absolute URL")?;
            if authority.as_str().contains('@') {
                return Err("has userinfo".to_owned());
            }
            if uri.query().is_some() {
                return Err("has a query".to_owned());
            }
            let prefix = uri.path().trim_end_matches('/').to_owned();
            Ok((scheme, authority, prefix))
        })();
        let host = match &base {
            Ok((_, a, _)) => Arc::from(a.host()),
            Err(_) => Arc::from(""),
        };
        Route {
            base: base.map_err(|e: String| e),
            host,
            rewrite: None,
        }
    }

    /// The same route, whose request is then changed by `rewrite` (after
    /// the URL is set and the stripped headers are removed): e.g. another
    /// model id in a header, or the route's own `Authorization`.
    pub fn rewrite<F>(mut self, rewrite: F) -> Self
    where
        F: Fn(&mut http::request::Parts) + Send + Sync + 'static,
    {
        self.rewrite = Some(Arc::new(rewrite));
        self
    }

    fn apply(&self, parts: &mut http::request::Parts, strip: &[HeaderName]) -> Result<(), Error> {
        let (scheme, authority, prefix) = self.base.as_ref().expect("checked at construction");
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut uri = UriParts::default();
        uri.scheme = Some(scheme.clone());
        uri.authority = Some(authority.clone());
        uri.path_and_query = Some(if prefix.is_empty() {
            PathAndQuery::try_from(pq).map_err(|_| Error::new(ErrorKind::InvalidRequest))?
        } else {
            PathAndQuery::try_from(format!("{prefix}{pq}"))
                .map_err(|_| Error::new(ErrorKind::InvalidRequest))?
        });
        parts.uri = Uri::from_parts(uri).map_err(|_| Error::new(ErrorKind::InvalidRequest))?;
        for name in strip {
            parts.headers.remove(name);
        }
        // The Host header, if the caller set one, named the primary.
        parts.headers.remove(http::header::HOST);
        if let Some(rewrite) = &self.rewrite {
            rewrite(parts);
        }
        Ok(())
    }
}

// ===== layer =====

/// Falls back to an explicit list of [`Route`]s when the primary ends in a
/// retryable failure.
///
/// See the [module docs](self) for an example and the rules.
#[derive(Clone, Debug)]
pub struct FallbackLayer {
    routes: Arc<[Route]>,
    strip: Arc<[HeaderName]>,
    budget: Option<Arc<RetryBudget>>,
}

impl FallbackLayer {
    /// A layer with these alternate routes, in order.
    ///
    /// # Panics
    ///
    /// If the list is empty or a route is not an absolute URL (see
    /// [`try_new`](Self::try_new)).
    #[track_caller]
    pub fn new(routes: impl IntoIterator<Item = Route>) -> Self {
        crate::config::expect_valid("FallbackLayer::new", Self::try_new(routes))
    }

    /// A layer with these alternate routes, checked.
    ///
    /// # Errors
    ///
    /// A configuration error if the list is empty or a route's base URL is
    /// not an absolute URL without userinfo or query (the error gives the
    /// route's index, not its URL).
    pub fn try_new(routes: impl IntoIterator<Item = Route>) -> Result<Self, Error> {
        let routes: Vec<Route> = routes.into_iter().collect();
        if routes.is_empty() {
            return Err(Error::config("fallback routes must not be empty"));
        }
        for (i, r) in routes.iter().enumerate() {
            if let Err(why) = &r.base {
                return Err(Error::config(format!("fallback route {}: {why}", i + 1)));
            }
        }
        Ok(FallbackLayer {
            routes: routes.into(),
            strip: Arc::from([AUTHORIZATION]),
            budget: None,
        })
    }

    /// The headers removed from the request before each alternate route's
    /// rewrite. Default is `Authorization` alone; pass every credential
    /// header you use (`x-api-key`, `cookie`, ...).
    pub fn strip_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.strip = names.into_iter().collect();
        self
    }

    /// Charge each fallback to this retry budget (the one the retry layer
    /// uses, so that fallbacks and retries share one bound). Default: none
    /// (with the ready-made client: the client's retry budget).
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Whether a budget was given (see [`budget`](Self::budget)).
    pub fn has_budget(&self) -> bool {
        self.budget.is_some()
    }
}

impl<S> Layer<S> for FallbackLayer {
    type Service = Fallback<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fallback {
            inner,
            layer: self.clone(),
        }
    }
}

// ===== service =====

/// The service made by [`FallbackLayer`].
///
/// # Errors
///
/// The last route's error, as [`Error`]; a deadline timeout if the
/// deadline passes during a fallback.
#[derive(Clone, Debug)]
pub struct Fallback<S> {
    inner: S,
    layer: FallbackLayer,
}

impl<S> Fallback<S> {
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

/// Whether an outcome lets a fallback be tried.
fn may_fall_back<R>(outcome: &Result<Response<R>, Error>) -> bool {
    let ext = match outcome {
        Ok(res) => res.extensions(),
        Err(e) => e.extensions(),
    };
    // The retry loop found the request unsafe to send again (a write with
    // no idempotency key that may have been processed): another route is
    // sending it again too.
    if ext.get::<RetryStop>() == Some(&RetryStop::NotEligible) {
        return false;
    }
    match ext.get::<Verdict>() {
        Some(Verdict::Retryable { .. }) => return true,
        // Fatal for the retry loop, but a reason to try another route: an
        // open circuit failed the request at once, not sent.
        Some(Verdict::Fatal { .. }) => return matches!(outcome, Err(e) if e.is_circuit_open()),
        Some(Verdict::Success) => return false,
        None => {}
    }
    match outcome {
        Ok(_) => false,
        Err(e) => match e.kind() {
            ErrorKind::CircuitOpen | ErrorKind::Connect => true,
            ErrorKind::Timeout(stage) => stage != TimeoutStage::Deadline,
            _ => false,
        },
    }
}

struct Head {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    deadline: Option<tokio::time::Instant>,
    key: Option<IdempotencyKey>,
    lease: Option<PermitLease>,
}

impl<S, B, ResB> Service<Request<B>> for Fallback<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: ReplayableBody + Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = Error;
    type Future = future::ResponseFuture<S, B, ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_boxed(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut svc = std::mem::replace(&mut self.inner, clone);
        let saved = req.body().try_replay().map(|body| {
            let head = Head {
                method: req.method().clone(),
                uri: req.uri().clone(),
                version: req.version(),
                headers: req.headers().clone(),
                deadline: Deadline::of(req.extensions()),
                key: req.extensions().get::<IdempotencyKey>().cloned(),
                lease: req.extensions().get::<PermitLease>().cloned(),
            };
            future::Saved {
                head,
                body,
                layer: self.layer.clone(),
                svc: None,
            }
        });
        let fut = svc.call(req);
        let saved = saved.map(|mut s| {
            s.svc = Some(svc);
            s
        });
        future::ResponseFuture::new(fut, saved)
    }
}

/// The response future of [`Fallback`].
pub mod future {
    use super::*;

    pub(super) struct Saved<S, B> {
        pub(super) head: Head,
        pub(super) body: B,
        pub(super) layer: FallbackLayer,
        pub(super) svc: Option<S>,
    }

    type Falling<R> = Pin<Box<dyn Future<Output = Result<Response<R>, Error>> + Send>>;

    pin_project! {
        /// The response future of [`Fallback`](super::Fallback).
        pub struct ResponseFuture<S, B, R> where S: Service<Request<B>> {
            #[pin]
            state: State<S, B, R>,
        }
    }

    pin_project! {
        #[project = StateProj]
        enum State<S, B, R> where S: Service<Request<B>> {
            Primary { #[pin] fut: S::Future, saved: Option<Saved<S, B>> },
            Falling { fut: Falling<R> },
        }
    }

    impl<S: Service<Request<B>>, B, R> fmt::Debug for ResponseFuture<S, B, R> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("fallback::ResponseFuture")
                .finish_non_exhaustive()
        }
    }

    impl<S: Service<Request<B>>, B, R> ResponseFuture<S, B, R> {
        pub(super) fn new(fut: S::Future, saved: Option<Saved<S, B>>) -> Self {
            ResponseFuture {
                state: State::Primary { fut, saved },
            }
        }
    }

    impl<S, B, R> Future for ResponseFuture<S, B, R>
    where
        S: Service<Request<B>, Response = Response<R>> + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
        B: ReplayableBody + Send + 'static,
        R: Send + 'static,
    {
        type Output = Result<Response<R>, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut this = self.project();
            loop {
                match this.state.as_mut().project() {
                    StateProj::Primary { fut, saved } => {
                        let outcome = ready!(fut.poll(cx)).map_err(|e| Error::from_boxed(e.into()));
                        if !may_fall_back(&outcome) {
                            return Poll::Ready(outcome);
                        }
                        let Some(saved) = saved.take() else {
                            return Poll::Ready(outcome);
                        };
                        let fut = Box::pin(fall_back(saved, outcome));
                        this.state.set(State::Falling { fut });
                    }
                    StateProj::Falling { fut } => return fut.as_mut().poll(cx),
                }
            }
        }
    }

    async fn fall_back<S, B, R>(
        saved: Saved<S, B>,
        mut outcome: Result<Response<R>, Error>,
    ) -> Result<Response<R>, Error>
    where
        S: Service<Request<B>, Response = Response<R>> + Send + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
        B: ReplayableBody + Send + 'static,
    {
        let Saved {
            head,
            body,
            layer,
            svc,
        } = saved;
        let mut svc = svc.expect("set with the saved head");
        // `body` is a template, never sent itself: each route gets a copy
        // made when it is tried, and only one known to be sent whole (the
        // primary may have streamed the body past its replay cap).
        for (i, route) in layer.routes.iter().enumerate() {
            let index = i + 1;
            if !may_fall_back(&outcome) {
                break;
            }
            if head
                .deadline
                .is_some_and(|d| tokio::time::Instant::now() >= d)
            {
                tracing::info!(route = index, host = %route.host, why = "deadline", "fallback refused");
                break;
            }
            // A shutdown has begun: like the retry loop, send nothing new.
            if Closing::current().is_some_and(|c| c.is_closed()) {
                tracing::info!(route = index, host = %route.host, why = "closed", "fallback refused");
                break;
            }
            // Before the budget: a refusal here costs no token.
            let Some(this_body) = body.try_replay_whole() else {
                tracing::info!(route = index, host = %route.host, why = "body", "fallback refused");
                break;
            };
            if let Some(budget) = &layer.budget {
                if !budget.try_withdraw() {
                    tracing::info!(route = index, host = %route.host, why = "budget", "fallback refused");
                    break;
                }
            }
            let mut req = Request::new(this_body);
            *req.method_mut() = head.method.clone();
            *req.uri_mut() = head.uri.clone();
            *req.version_mut() = head.version;
            *req.headers_mut() = head.headers.clone();
            if let Some(d) = head.deadline {
                req.extensions_mut().insert(Deadline(d));
            }
            if let Some(k) = &head.key {
                req.extensions_mut().insert(k.clone());
            }
            if let Some(lease) = &head.lease {
                req.extensions_mut().insert(lease.clone());
            }
            let (mut parts, b) = req.into_parts();
            if let Err(e) = route.apply(&mut parts, &layer.strip) {
                return Err(e.with_request(&head.method, &head.uri));
            }
            let req = Request::from_parts(parts, b);
            // This route's outcome replaces the last one: let go of it now,
            // not after this route's call (its connection; and the permit
            // its body holds, were a concurrency limit stacked below us).
            drop(outcome);
            tracing::info!(route = index, host = %route.host, "fallback");
            let call = async {
                let ready: Result<&mut S, BoxError> = svc.ready().await.map_err(Into::into);
                match ready {
                    Ok(ready) => {
                        let fut = ready.call(req);
                        fut.await.map_err(Into::into)
                    }
                    Err(e) => Err(e),
                }
            };
            let result = match head.deadline {
                Some(d) => match tokio::time::timeout_at(d, call).await {
                    Ok(r) => r.map_err(Error::from_boxed),
                    Err(_) => Err(Error::timeout(TimeoutStage::Deadline)
                        .with_request(&head.method, &head.uri)),
                },
                None => call.await.map_err(Error::from_boxed),
            };
            outcome = result;
            let served = Served {
                route: index,
                host: route.host.clone(),
            };
            match &mut outcome {
                Ok(res) => {
                    res.extensions_mut().insert(served);
                }
                Err(e) => {
                    e.extensions_mut().insert(served);
                }
            }
        }
        outcome
    }
}
