//! Which gRPC methods may be retried: [`RetryableMethods`] and
//! [`MarkRetryableLayer`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use super::code::is_grpc;
use crate::annotations::Idempotent;

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
}

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
    /// Whether `req` is a gRPC call to a method declared safe (what the
    /// service marks [`Idempotent`]).
    pub(crate) fn is_marked<B>(&self, req: &Request<B>) -> bool {
        is_grpc(req.headers()) && self.methods.is_retryable(req.uri().path())
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
        if is_grpc(req.headers()) && self.methods.is_retryable(req.uri().path()) {
            req.extensions_mut().insert(Idempotent);
        }
        self.inner.call(req)
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
