//! Which gRPC methods may be retried: [`RetryableMethods`] and
//! [`MarkRetryableLayer`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use super::classify::GrpcClassifier;
use super::code::{is_grpc, Code};
use crate::annotations::{Idempotent, MaxAttempts};
use crate::error::Error;

/// The gRPC methods that are safe to retry after they may have been
/// processed, by path (`/package.Service/Method`), by service (every
/// method of `package.Service`), with a default for the rest — like the
/// `name` entries of a gRPC service config (gRFC A6).
///
/// gRPC calls are HTTP POSTs, which the retry layer does not retry unless
/// told they are safe: [`MarkRetryableLayer`] tells it, per call. A call
/// that was never sent (connect refused, `REFUSED_STREAM`) is retried
/// whatever this says.
///
/// ```
/// use rebound_core::grpc::RetryableMethods;
///
/// let m = RetryableMethods::none()
///     .service("echo.Echo")
///     .method("/kv.Store/Get")
///     .not_method("/echo.Echo/Charge");
/// assert!(m.is_retryable("/echo.Echo/Say"));
/// assert!(!m.is_retryable("/echo.Echo/Charge"));
/// assert!(m.is_retryable("/kv.Store/Get"));
/// assert!(!m.is_retryable("/kv.Store/Put"));
/// assert!(RetryableMethods::all().is_retryable("/kv.Store/Put"));
/// ```
///
/// # A retry policy per method (gRFC A6)
///
/// A gRPC service config gives each method (or service) its own
/// `retryPolicy`: how many attempts and which status codes to retry.
/// [`method_policy`](Self::method_policy) and
/// [`service_policy`](Self::service_policy) do the same: the calls they
/// match are retryable, and [`MarkRetryableLayer`] gives each one its
/// policy's attempt count (as [`MaxAttempts`], unless the call carries its
/// own) and retryable codes (as [`CallCodes`], which the retry loop judges
/// the call's `grpc-status` by instead of the classifier's set).
///
/// ```
/// use rebound_core::grpc::{Code, MethodPolicy, RetryableMethods};
///
/// let m = RetryableMethods::none()
///     // Reads: 5 attempts, also on RESOURCE_EXHAUSTED.
///     .service_policy(
///         "kv.Store",
///         MethodPolicy::new()
///             .max_attempts(5)
///             .retryable_codes([Code::UNAVAILABLE, Code::RESOURCE_EXHAUSTED]),
///     )
///     // One write that is safe to repeat, on UNAVAILABLE only, twice.
///     .method_policy("/kv.Store/Put", MethodPolicy::new().max_attempts(2));
/// assert!(m.is_retryable("/kv.Store/Get"));
/// assert_eq!(m.policy("/kv.Store/Get").unwrap().get_max_attempts(), Some(5));
/// assert_eq!(m.policy("/kv.Store/Put").unwrap().get_max_attempts(), Some(2));
/// assert!(m.policy("/echo.Echo/Say").is_none());
/// ```
///
/// # Clone
///
/// Cheap: the tables are shared.
#[derive(Clone, Default)]
pub struct RetryableMethods {
    default: bool,
    table: Arc<Table>,
}

#[derive(Default)]
struct Table {
    services: HashMap<Box<str>, bool>,
    methods: HashMap<Box<str>, bool>,
    service_policies: HashMap<Box<str>, MethodPolicy>,
    method_policies: HashMap<Box<str>, MethodPolicy>,
}

/// The retry policy of a gRPC method or service, as a service config's
/// `retryPolicy` gives it (gRFC A6): its attempt count and its retryable
/// status codes. Either left unset falls back to the retry layer's own
/// (its `max_attempts`, the classifier's codes). See
/// [`RetryableMethods::method_policy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MethodPolicy {
    max_attempts: Option<u32>,
    codes: Option<GrpcClassifier>,
}

impl MethodPolicy {
    /// A policy that sets nothing: the calls it matches are retryable, with
    /// the retry layer's attempts and the classifier's codes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The attempts a call gets, the first included (A6's `maxAttempts`).
    ///
    /// # Panics
    ///
    /// If `n` is 0, naming it; see [`try_max_attempts`](Self::try_max_attempts).
    #[track_caller]
    pub fn max_attempts(self, n: u32) -> Self {
        crate::config::expect_valid("MethodPolicy::max_attempts", self.try_max_attempts(n))
    }

    /// The attempts a call gets, checked.
    ///
    /// # Errors
    ///
    /// A configuration error if `n` is 0 (a call gets at least one).
    pub fn try_max_attempts(mut self, n: u32) -> Result<Self, Error> {
        if n == 0 {
            return Err(Error::config(
                "MethodPolicy max_attempts is 0: a call gets at least one attempt",
            ));
        }
        self.max_attempts = Some(n);
        Ok(self)
    }

    /// The status codes a call is retried on (A6's
    /// `retryableStatusCodes`; OK never is).
    pub fn retryable_codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.codes = Some(GrpcClassifier::default().retryable_codes(codes));
        self
    }

    /// The attempt count, if set.
    pub fn get_max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The retryable codes, as a classifier, if set.
    pub fn get_retryable_codes(&self) -> Option<GrpcClassifier> {
        self.codes
    }
}

/// On a gRPC call: the status codes its method's [`MethodPolicy`] retries.
/// Set by [`MarkRetryableLayer`] (or by the caller); the retry loop judges
/// a failed attempt's `grpc-status` by it — retryable if in the set, fatal
/// otherwise — instead of by the classifier's set. Errors (a refused
/// connection, a reset) are judged as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallCodes(pub GrpcClassifier);

impl fmt::Debug for RetryableMethods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryableMethods")
            .field("default", &self.default)
            .field("services", &self.table.services)
            .field("methods", &self.table.methods)
            .finish()
    }
}

impl RetryableMethods {
    /// No method is retryable unless listed (the default).
    pub fn none() -> Self {
        Self::default()
    }

    /// Every method is retryable unless listed with
    /// [`not_method`](Self::not_method) or [`not_service`](Self::not_service).
    pub fn all() -> Self {
        RetryableMethods {
            default: true,
            table: Arc::default(),
        }
    }

    fn table(&mut self) -> &mut Table {
        if Arc::get_mut(&mut self.table).is_none() {
            let old = &*self.table;
            self.table = Arc::new(Table {
                services: old.services.clone(),
                methods: old.methods.clone(),
                service_policies: old.service_policies.clone(),
                method_policies: old.method_policies.clone(),
            });
        }
        Arc::get_mut(&mut self.table).expect("just made unique")
    }

    /// Methods not listed are retryable (`true`) or not. Default: `false`.
    pub fn default_retryable(mut self, on: bool) -> Self {
        self.default = on;
        self
    }

    /// The method at `path` is retryable. `path` is `/package.Service/Method`
    /// (the leading `/` may be left out); a path that names no method simply
    /// never matches.
    pub fn method(mut self, path: &str) -> Self {
        self.table().methods.insert(normalize(path), true);
        self
    }

    /// The method at `path` is not retryable, even if its service is.
    pub fn not_method(mut self, path: &str) -> Self {
        self.table().methods.insert(normalize(path), false);
        self
    }

    /// Every method of `service` (`package.Service`) is retryable unless
    /// listed with [`not_method`](Self::not_method).
    pub fn service(mut self, service: &str) -> Self {
        self.table()
            .services
            .insert(service.trim_matches('/').into(), true);
        self
    }

    /// No method of `service` is retryable unless listed with
    /// [`method`](Self::method).
    pub fn not_service(mut self, service: &str) -> Self {
        self.table()
            .services
            .insert(service.trim_matches('/').into(), false);
        self
    }

    /// The method at `path` is retryable, with its own `policy` (attempts,
    /// codes). A later [`not_method`](Self::not_method) for the same path
    /// makes it not retryable again.
    pub fn method_policy(mut self, path: &str, policy: MethodPolicy) -> Self {
        let path = normalize(path);
        let table = self.table();
        table.methods.insert(path.clone(), true);
        table.method_policies.insert(path, policy);
        self
    }

    /// Every method of `service` is retryable, with `policy`, unless its
    /// method has an entry of its own.
    pub fn service_policy(mut self, service: &str, policy: MethodPolicy) -> Self {
        let service: Box<str> = service.trim_matches('/').into();
        let table = self.table();
        table.services.insert(service.clone(), true);
        table.service_policies.insert(service, policy);
        self
    }

    /// The policy for the call at `path`: its method's, else its
    /// service's, if either was given one; `None` for a call that is not
    /// retryable.
    pub fn policy(&self, path: &str) -> Option<MethodPolicy> {
        if !self.is_retryable(path) {
            return None;
        }
        self.policy_of_retryable(path)
    }

    /// [`policy`](Self::policy) for a path already known to be retryable.
    fn policy_of_retryable(&self, path: &str) -> Option<MethodPolicy> {
        if self.table.method_policies.is_empty() && self.table.service_policies.is_empty() {
            return None;
        }
        if let Some(p) = self.table.method_policies.get(path) {
            return Some(*p);
        }
        if self.table.methods.contains_key(path) {
            // The method's own entry, without a policy, wins over its
            // service's policy.
            return None;
        }
        let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
        self.table.service_policies.get(service).copied()
    }

    /// Whether the call at `path` (`/package.Service/Method`) is retryable:
    /// its method entry, else its service entry, else the default.
    pub fn is_retryable(&self, path: &str) -> bool {
        if let Some(on) = self.table.methods.get(path) {
            return *on;
        }
        let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
        self.table
            .services
            .get(service)
            .copied()
            .unwrap_or(self.default)
    }
}

fn normalize(path: &str) -> Box<str> {
    if path.starts_with('/') {
        path.into()
    } else {
        format!("/{path}").into()
    }
}

/// Marks each gRPC call to a [retryable method](RetryableMethods) with the
/// [`Idempotent`] annotation, which makes it eligible for the retry layer
/// whatever its HTTP method (POST). Put it **above** the retry layer.
///
/// Requests that are not gRPC (no `content-type: application/grpc`) pass
/// untouched. Marking costs one extension insert, paid only by gRPC calls
/// to retryable methods.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug, Default)]
pub struct MarkRetryableLayer {
    methods: RetryableMethods,
}

impl MarkRetryableLayer {
    /// Mark the calls to `methods`.
    pub fn new(methods: RetryableMethods) -> Self {
        MarkRetryableLayer { methods }
    }

    #[cfg(feature = "stack")]
    /// Mark `req`, if it is a gRPC call to a method declared safe:
    /// [`Idempotent`], and its method's policy (see [`RetryableMethods`]).
    pub(crate) fn mark<B>(&self, req: &mut Request<B>) {
        mark(&self.methods, req)
    }
}

impl<S> Layer<S> for MarkRetryableLayer {
    type Service = MarkRetryable<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MarkRetryable {
            inner,
            methods: self.methods.clone(),
        }
    }
}

/// The service made by [`MarkRetryableLayer`].
#[derive(Clone, Debug)]
pub struct MarkRetryable<S> {
    inner: S,
    methods: RetryableMethods,
}

impl<S> MarkRetryable<S> {
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

impl<S, B> Service<Request<B>> for MarkRetryable<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        mark(&self.methods, &mut req);
        self.inner.call(req)
    }
}

fn mark<B>(methods: &RetryableMethods, req: &mut Request<B>) {
    if !(is_grpc(req.headers()) && methods.is_retryable(req.uri().path())) {
        return;
    }
    let policy = methods.policy_of_retryable(req.uri().path());
    let ext = req.extensions_mut();
    ext.insert(Idempotent);
    if let Some(policy) = policy {
        if let Some(n) = policy.max_attempts {
            // The caller's own count for this call wins.
            if ext.get::<MaxAttempts>().is_none() {
                ext.insert(MaxAttempts(n));
            }
        }
        if let Some(codes) = policy.codes {
            ext.insert(CallCodes(codes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_order() {
        let m = RetryableMethods::all()
            .not_service("a.A")
            .method("a.A/Ok")
            .not_method("/b.B/No");
        assert!(!m.is_retryable("/a.A/X"));
        assert!(m.is_retryable("/a.A/Ok"));
        assert!(!m.is_retryable("/b.B/No"));
        assert!(m.is_retryable("/b.B/Yes"));
        assert!(m.is_retryable("/"));
        // Clones share, and a changed clone does not change the original.
        let n = m.clone().default_retryable(false).method("/c.C/M");
        assert!(m.is_retryable("/c.C/N"));
        assert!(n.is_retryable("/c.C/M"));
        assert!(!n.is_retryable("/c.C/N"));
        assert!(!m.table.methods.contains_key("/c.C/M"));
    }

    #[tokio::test]
    async fn marks_only_grpc_calls_to_listed_methods() {
        use tower::ServiceExt;
        let svc = MarkRetryableLayer::new(RetryableMethods::none().method("/a.A/M")).layer(
            tower::service_fn(|req: Request<()>| async move {
                Ok::<_, std::convert::Infallible>(req.extensions().get::<Idempotent>().is_some())
            }),
        );
        let req = |path: &str, grpc: bool| {
            let mut b = Request::post(path);
            if grpc {
                b = b.header("content-type", "application/grpc");
            }
            b.body(()).unwrap()
        };
        assert!(svc.clone().oneshot(req("/a.A/M", true)).await.unwrap());
        assert!(!svc.clone().oneshot(req("/a.A/N", true)).await.unwrap());
        assert!(!svc.clone().oneshot(req("/a.A/M", false)).await.unwrap());
    }
}
