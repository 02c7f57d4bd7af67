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
//! cannot be copied ([`RetryBody::keep`] keeps nothing), and
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
//! change the request (another model id, another header).
//!
//! A fallback must never send data where it was not approved, and the
//! primary's credentials were approved for the primary only. So before a
//! route's rewrite runs, the request loses:
//!
//! * every **secret header**: those the redaction deny-list
//!   ([`HeaderDenyList::default`], the one the trace layers use, so the
//!   two cannot drift apart) names — `Authorization`,
//!   `Proxy-Authorization`, `Cookie`, `Set-Cookie`, `x-api-key`,
//!   `api-key`, `x-auth-token`, `x-amz-security-token`, `x-goog-api-key` —
//!   and every header its name rule catches: a name that contains
//!   `token`, `secret`, `password`, `session`, `signature`, `api-key`
//!   (`api_key`, `apikey`) or `auth` (`x-session-token`,
//!   `x-client-secret`, ...; [`redact::name_looks_secret`]);
//! * every **secret query parameter**: one whose name, percent-decoded
//!   and ignoring case, is `key` or `sig` or contains one of the same
//!   words (`api_key`, `apiKey`, `access_token`, `X-Amz-Signature`, ...;
//!   [`redact::query_name_looks_secret`]); a pair holding `;`, which
//!   some servers read as a separator, goes whole when any of its parts
//!   does (`page=2;token=t`). The other parameters keep their order and
//!   their encoding, and `?` goes when none is left;
//! * the `Host` header, which named the primary.
//!
//! A route receives a credential only if its rewrite sets it (its own
//! `Authorization`, `x-api-key` or `?key=`): the rewrite runs after the
//! strip, so what it sets is sent. The rule errs towards secret (`author`
//! is caught by `auth`). The opt-outs are explicit and named:
//! [`keep_headers`](FallbackLayer::keep_headers) and
//! [`keep_query_params`](FallbackLayer::keep_query_params) forward the
//! names given to every route; [`strip_headers`](FallbackLayer::strip_headers)
//! and [`strip_query_params`](FallbackLayer::strip_query_params) add names
//! to the strip; [`secret_headers`](FallbackLayer::secret_headers) replaces
//! the deny-list (give it the one your trace layer uses, if you changed
//! that one).
//!
//! ```
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use rebound_core::classify::{ClassifyLayer, HttpClassifier};
//! use rebound_core::fallback::{FallbackLayer, Route};
//! use rebound_core::retry::{RetryLayer, RetryPolicy};
//! use rebound_core::BoxError;
//! use std::sync::{Arc, Mutex};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), rebound_core::Error> {
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let inner = tower::service_fn({
//!     let seen = seen.clone();
//!     move |req: Request<Full<Bytes>>| {
//!         seen.lock().unwrap().push(req.uri().to_string());
//!         let mut res = Response::new(Full::new(Bytes::new()));
//!         if req.uri().host() == Some("eu.api.example") {
//!             *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
//!         } else {
//!             assert!(req.headers().get("x-api-key").is_none());
//!             assert!(req.headers().get("cookie").is_none());
//!         }
//!         async move { Ok::<_, BoxError>(res) }
//!     }
//! });
//! let route = Route::base_url("https://us.api.example").rewrite(|parts| {
//!     // The secondary's own credential, set after the strip.
//!     parts.headers.insert("authorization", "Bearer us-key".parse().unwrap());
//! });
//! let mut svc = ServiceBuilder::new()
//!     .layer(FallbackLayer::new([route]))
//!     .layer(RetryLayer::new(RetryPolicy::default().max_attempts(1)))
//!     .layer(ClassifyLayer::new(HttpClassifier::default()))
//!     .service(inner);
//!
//! let req = Request::get("https://eu.api.example/v1/models?api_key=s3cret&page=2")
//!     .header("x-api-key", "s3cret")
//!     .header("cookie", "session=s3cret")
//!     .body(Full::new(Bytes::new()))
//!     .unwrap();
//! svc.ready().await?.call(req).await?;
//! assert_eq!(
//!     *seen.lock().unwrap(),
//!     [
//!         "https://eu.api.example/v1/models?api_key=s3cret&page=2",
//!         "https://us.api.example/v1/models?page=2",
//!     ]
//! );
//! # Ok(())
//! # }
//! ```
//!
//! Only the [`Deadline`], [`IdempotencyKey`], [`PermitLease`] and
//! [`MaxAttempts`] (a request's own attempt count) annotations are carried to an alternate route (not the request's whole
//! extension map), and the previous route's outcome is dropped before the
//! next route is called (so what it holds — its connection, a permit in its
//! body — is not held across that call).
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
//! allocates) and [`RetryBody::keep`] of its body (a reference
//! count for bytes in memory) — the same price as the retry loop's
//! template, and one reference count for the layer's configuration.
//! Nothing else: no lock, no box until a fallback is taken; the strip
//! (a pass over the headers, and the query when there is one) runs only
//! for a route that is tried.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::HeaderName;
use http::uri::{Parts as UriParts, PathAndQuery};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use pin_project_lite::pin_project;
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::annotations::{
    Closing, Deadline, IdempotencyKey, MaxAttempts, PermitLease, RetryStop, Verdict,
};
use crate::body::RetryBody;
use crate::error::{BoxError, Error, ErrorKind, TimeoutStage};
use crate::redact::{self, HeaderDenyList};
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
    /// The route's port: the URL's, or its scheme's (443, 80), so that two
    /// routes to one host on different ports can be told apart.
    pub port: u16,
}

type Rewrite = Arc<dyn Fn(&mut http::request::Parts) + Send + Sync>;

/// One alternate route: an absolute base URL, and optionally a rewrite of
/// the request.
#[derive(Clone)]
pub struct Route {
    base: Result<(http::uri::Scheme, http::uri::Authority, String), String>,
    host: Arc<str>,
    port: u16,
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
        let (host, port) = match &base {
            Ok((scheme, a, _)) => {
                let port = a
                    .port_u16()
                    .unwrap_or(if *scheme == http::uri::Scheme::HTTPS {
                        443
                    } else {
                        80
                    });
                (Arc::from(a.host()), port)
            }
            Err(_) => (Arc::from(""), 0),
        };
        Route {
            base: base.map_err(|e: String| e),
            host,
            port,
            rewrite: None,
        }
    }

    /// The same route, whose request is then changed by `rewrite` (after
    /// the URL is set and the secret headers and query parameters are
    /// removed, so what it sets is kept): e.g. another model id in a
    /// header, or the route's own `Authorization`, `x-api-key` or `?key=`.
    pub fn rewrite<F>(mut self, rewrite: F) -> Self
    where
        F: Fn(&mut http::request::Parts) + Send + Sync + 'static,
    {
        self.rewrite = Some(Arc::new(rewrite));
        self
    }

    fn apply(&self, parts: &mut http::request::Parts, strip: &Strip) -> Result<(), Error> {
        let (scheme, authority, prefix) = self.base.as_ref().expect("checked at construction");
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let pq = strip.path_and_query(pq);
        let mut uri = UriParts::default();
        uri.scheme = Some(scheme.clone());
        uri.authority = Some(authority.clone());
        uri.path_and_query = Some(if prefix.is_empty() {
            match pq {
                // `?key=..` alone lost its query.
                Cow::Borrowed("") => PathAndQuery::try_from("/"),
                Cow::Borrowed(pq) => PathAndQuery::try_from(pq),
                Cow::Owned(pq) => PathAndQuery::try_from(pq),
            }
            .map_err(|_| Error::new(ErrorKind::InvalidRequest))?
        } else {
            PathAndQuery::try_from(format!("{prefix}{pq}"))
                .map_err(|_| Error::new(ErrorKind::InvalidRequest))?
        });
        parts.uri = Uri::from_parts(uri).map_err(|_| Error::new(ErrorKind::InvalidRequest))?;
        strip.headers(&mut parts.headers);
        // The Host header, if the caller set one, named the primary.
        parts.headers.remove(http::header::HOST);
        if let Some(rewrite) = &self.rewrite {
            rewrite(parts);
        }
        Ok(())
    }
}

// ===== what a route never receives =====

/// What is taken out of a request before it goes to an alternate route: a
/// plain value (no tower in it), decided per header name and per query
/// parameter name. The default strips what the redaction deny-list
/// ([`HeaderDenyList::default`]) denies and the query parameters whose
/// names look secret.
#[derive(Clone, Debug, Default)]
struct Strip {
    /// The secret headers: [`HeaderDenyList::default`] unless replaced.
    secret: HeaderDenyList,
    /// Secret headers forwarded all the same.
    keep: Vec<HeaderName>,
    /// Headers removed besides the secret ones.
    more: Vec<HeaderName>,
    /// Query parameters (decoded names) forwarded though they look secret.
    keep_query: Vec<String>,
    /// Query parameters (decoded names) removed besides those that look
    /// secret.
    more_query: Vec<String>,
}

impl Strip {
    /// Whether header `name` is removed.
    fn header(&self, name: &HeaderName) -> bool {
        self.more.contains(name) || (self.secret.contains(name) && !self.keep.contains(name))
    }

    /// Whether the query parameter `name` (decoded) is removed.
    fn query_param(&self, name: &str) -> bool {
        self.more_query.iter().any(|n| n == name)
            || (redact::query_name_looks_secret(name) && !self.keep_query.iter().any(|n| n == name))
    }

    /// Remove the stripped headers, every value of each.
    fn headers(&self, headers: &mut HeaderMap) {
        let doomed: Vec<HeaderName> = headers.keys().filter(|n| self.header(n)).cloned().collect();
        for name in doomed {
            headers.remove(name);
        }
    }

    /// `pq` (a path and query) without the stripped query parameters; no
    /// `?` left when none is kept.
    fn path_and_query<'a>(&self, pq: &'a str) -> Cow<'a, str> {
        let Some((path, query)) = pq.split_once('?') else {
            return Cow::Borrowed(pq);
        };
        match redact::remove_query_params(query, |name| self.query_param(name)) {
            Cow::Borrowed(_) => Cow::Borrowed(pq),
            Cow::Owned(q) if q.is_empty() => Cow::Borrowed(path),
            Cow::Owned(q) => Cow::Owned(format!("{path}?{q}")),
        }
    }
}

// ===== layer =====

/// Falls back to an explicit list of [`Route`]s when the primary ends in a
/// retryable failure.
///
/// See the [module docs](self) for an example and the rules.
///
/// # Clone
///
/// Cloning the layer shares its configuration (one `Arc`).
#[derive(Clone, Debug)]
pub struct FallbackLayer {
    cfg: Arc<Config>,
}

/// A [`FallbackLayer`]'s configuration, shared by its services and their
/// futures: one reference count per request.
#[derive(Clone, Debug)]
struct Config {
    routes: Vec<Route>,
    strip: Strip,
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
            cfg: Arc::new(Config {
                routes,
                strip: Strip::default(),
                budget: None,
            }),
        })
    }

    fn cfg_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.cfg)
    }

    /// Remove these headers too before each alternate route's rewrite,
    /// besides the [secret ones](Self::secret_headers) (added to them, not
    /// instead of them; a name given here is removed even if
    /// [`keep_headers`](Self::keep_headers) names it). Default: none.
    pub fn strip_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.cfg_mut().strip.more.extend(names);
        self
    }

    /// The headers that are secret, and so never sent to an alternate
    /// route (unless [kept](Self::keep_headers)). Default:
    /// [`HeaderDenyList::default`], the trace layers' default deny-list:
    /// `Authorization`, `Proxy-Authorization`, `Cookie`, `Set-Cookie`,
    /// `x-api-key`, `api-key`, `x-auth-token`, `x-amz-security-token`,
    /// `x-goog-api-key`, and every header whose name contains `token`,
    /// `secret`, `password`, `session`, `signature`, `api-key` (`api_key`,
    /// `apikey`) or `auth` ([`redact::name_looks_secret`]). Give the same
    /// list you give [`TraceBuilder::deny_list`](crate::trace::TraceBuilder::deny_list)
    /// to keep one list for both; a [`HeaderDenyList`] always holds
    /// [`redact::ALWAYS_SENSITIVE`].
    pub fn secret_headers(mut self, list: HeaderDenyList) -> Self {
        self.cfg_mut().strip.secret = list;
        self
    }

    /// Send these secret headers to every alternate route all the same:
    /// the opt-out, for routes approved to receive the primary's
    /// credentials (another region of the same service, with the same
    /// keys). Default: none.
    pub fn keep_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.cfg_mut().strip.keep.extend(names);
        self
    }

    /// Remove these query parameters too (compared with each parameter's
    /// decoded name, case-sensitively), besides those whose names look
    /// secret ([`redact::query_name_looks_secret`]). Default: none.
    pub fn strip_query_params<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let names = names.into_iter().map(Into::into);
        self.cfg_mut().strip.more_query.extend(names);
        self
    }

    /// Send these query parameters to every alternate route though their
    /// names look secret (compared with each parameter's decoded name,
    /// case-sensitively): the opt-out, for a route approved to receive
    /// them, or a harmless name the rule catches (`author`). Default:
    /// none.
    pub fn keep_query_params<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let names = names.into_iter().map(Into::into);
        self.cfg_mut().strip.keep_query.extend(names);
        self
    }

    /// Charge each fallback to this retry budget (the one the retry layer
    /// uses, so that fallbacks and retries share one bound). Default: none
    /// (with the ready-made client: the client's retry budget).
    pub fn budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.cfg_mut().budget = Some(budget);
        self
    }

    /// Whether a budget was given (see [`budget`](Self::budget)).
    pub fn has_budget(&self) -> bool {
        self.cfg.budget.is_some()
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
        Some(Verdict::Fatal { .. }) => {
            return matches!(outcome, Err(e) if matches!(e.kind(), ErrorKind::CircuitOpen))
        }
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
    attempts: Option<MaxAttempts>,
}

impl<S, B, ResB> Service<Request<B>> for Fallback<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: RetryBody + Send + 'static,
    B::Kept: Send,
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
        let deadline = Deadline::of(req.extensions());
        let (req, routes) = Routes::save(&self.layer, req, deadline);
        let fut = svc.call(req);
        let saved = routes.map(|routes| future::Saved { routes, svc });
        future::ResponseFuture::new(fut, saved)
    }
}

/// The routes still to try for one request, and what each is made from:
/// the head and a replay of the body as the primary was sent, the
/// deadline. The one place that decides whether, and with what request,
/// the next route is tried; [`Fallback`]'s future and the whole-stack
/// service both ask it.
pub(crate) struct Routes<B: RetryBody> {
    head: Head,
    body: B::Kept,
    layer: FallbackLayer,
    /// The next route's index in the list.
    next: usize,
}

impl<B: RetryBody> Routes<B> {
    /// What the routes of `layer` need of `req` (and `req` to send first);
    /// `None` when its body cannot be replayed at all (no route could be
    /// sent it whole).
    pub(crate) fn save(
        layer: &FallbackLayer,
        req: Request<B>,
        deadline: Option<tokio::time::Instant>,
    ) -> (Request<B>, Option<Self>) {
        let (parts, body) = req.into_parts();
        let (body, kept) = body.keep();
        let req = Request::from_parts(parts, body);
        let Some(body) = kept else {
            return (req, None);
        };
        let routes = Routes {
            head: Head {
                method: req.method().clone(),
                uri: req.uri().clone(),
                version: req.version(),
                headers: req.headers().clone(),
                deadline,
                key: req.extensions().get::<IdempotencyKey>().cloned(),
                lease: req.extensions().get::<PermitLease>().cloned(),
                attempts: req.extensions().get::<MaxAttempts>().copied(),
            },
            body,
            layer: layer.clone(),
            next: 0,
        };
        (req, Some(routes))
    }

    /// The next route's request after `outcome` (and which route it is),
    /// `None` when no route is to be tried now: the outcome does not allow
    /// it, no route is left, the deadline passed, a shutdown began
    /// (`closing`), the body cannot be sent whole, the budget refuses.
    /// `Err`: the route's rewrite failed, the request's final outcome.
    pub(crate) fn next<R>(
        &mut self,
        outcome: &Result<Response<R>, Error>,
        closing: bool,
    ) -> Option<Result<(Request<B>, Served), Error>> {
        let cfg = &self.layer.cfg;
        let route = cfg.routes.get(self.next)?;
        self.next += 1;
        let index = self.next;
        if !may_fall_back(outcome) {
            return None;
        }
        let head = &self.head;
        let refused = |why: &'static str| {
            tracing::info!(route = index, host = %route.host, why, "fallback refused");
            None
        };
        if head
            .deadline
            .is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            return refused("deadline");
        }
        // A shutdown has begun: like the retry loop, send nothing new.
        if closing {
            return refused("closed");
        }
        // `body` is a template, never sent itself: each route gets a copy
        // made when it is tried, and only one known to be sent whole (the
        // primary may have streamed the body past its replay cap). Before
        // the budget: a refusal here costs no token.
        let Some(this_body) = B::replay(&self.body) else {
            return refused("body");
        };
        if let Some(budget) = &cfg.budget {
            if !budget.try_withdraw() {
                return refused("budget");
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
        if let Some(attempts) = head.attempts {
            req.extensions_mut().insert(attempts);
        }
        let (mut parts, b) = req.into_parts();
        if let Err(e) = route.apply(&mut parts, &cfg.strip) {
            return Some(Err(e.with_request(&head.method, &head.uri)));
        }
        tracing::info!(route = index, host = %route.host, "fallback");
        let served = Served {
            route: index,
            host: route.host.clone(),
            port: route.port,
        };
        Some(Ok((Request::from_parts(parts, b), served)))
    }

    /// The deadline all routes share.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.head.deadline
    }

    /// The primary's method and URI, for errors.
    fn name(&self) -> (&Method, &Uri) {
        (&self.head.method, &self.head.uri)
    }
}

/// The response future of [`Fallback`].
pub mod future {
    use super::*;

    pub(super) struct Saved<S, B: RetryBody> {
        pub(super) routes: Routes<B>,
        pub(super) svc: S,
    }

    type Falling<R> = Pin<Box<dyn Future<Output = Result<Response<R>, Error>> + Send>>;

    pin_project! {
        /// The response future of [`Fallback`](super::Fallback).
        pub struct ResponseFuture<S, B, R> where S: Service<Request<B>>, B: RetryBody {
            #[pin]
            state: State<S, B, R>,
        }
    }

    pin_project! {
        #[project = StateProj]
        enum State<S, B, R> where S: Service<Request<B>>, B: RetryBody {
            Primary { #[pin] fut: S::Future, saved: Option<Saved<S, B>> },
            Falling { fut: Falling<R> },
        }
    }

    impl<S: Service<Request<B>>, B: RetryBody, R> fmt::Debug for ResponseFuture<S, B, R> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("fallback::ResponseFuture")
                .finish_non_exhaustive()
        }
    }

    impl<S: Service<Request<B>>, B: RetryBody, R> ResponseFuture<S, B, R> {
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
        B: RetryBody + Send + 'static,
        B::Kept: Send,
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
        B: RetryBody + Send + 'static,
        B::Kept: Send,
    {
        let Saved {
            mut routes,
            mut svc,
        } = saved;
        let closing = || Closing::current().is_some_and(|c| c.is_closed());
        while let Some(next) = routes.next(&outcome, closing()) {
            let (req, served) = match next {
                Ok(next) => next,
                Err(e) => return Err(e),
            };
            // This route's outcome replaces the last one: let go of it now,
            // not after this route's call (its connection; and the permit
            // its body holds, were a concurrency limit stacked below us).
            drop(outcome);
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
            let result = match routes.deadline() {
                Some(d) => match tokio::time::timeout_at(d, call).await {
                    Ok(r) => r.map_err(Error::from_boxed),
                    Err(_) => {
                        let (method, uri) = routes.name();
                        Err(Error::timeout(TimeoutStage::Deadline).with_request(method, uri))
                    }
                },
                None => call.await.map_err(Error::from_boxed),
            };
            outcome = result;
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
