//! The classifier of the ready-made client: any [`Classifier`], with the
//! two built-in ones kept inline.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use http::Response;
use hyper::body::Incoming;
use rebound_core::classify::{Classifier, HttpClassifier};
use rebound_core::collect::CollectedBody;
use rebound_core::grpc::GrpcClassifier;
use rebound_core::{Error, Verdict};

use crate::TransportBody;

/// The bound [`ClientBuilder::classifier`](crate::ClientBuilder::classifier)
/// states: a [`Classifier`] of every body the client's attempts see —
/// hyper's `Incoming` (the client's own path), `TransportBody<Incoming>` (a
/// client with a hedge) and the JSON helpers' `CollectedBody` — that is
/// `Send + Sync + 'static`.
///
/// **There is one trait to implement, [`Classifier`]**: this one is
/// implemented for you, for every type that is a `Classifier<B>` for any `B`
/// ([`HttpClassifier`], [`GrpcClassifier`], and yours, written
/// `impl<B> Classifier<B> for Mine`). It cannot be implemented by hand.
/// A closure is a classifier of one body type only, so for the client write
/// a type:
///
/// ```
/// use http::{Response, StatusCode};
/// use rebound_core::classify::{Classifier, HttpClassifier};
/// use rebound_core::{Error, Verdict};
/// use rebound_hyper::Client;
///
/// /// The default table, and a response marked `x-queue-full` is
/// /// retryable like a 503, whatever its status.
/// #[derive(Clone, Copy, Default)]
/// struct QueueFull(HttpClassifier);
///
/// impl<B> Classifier<B> for QueueFull {
///     fn classify(&self, outcome: &Result<Response<B>, Error>) -> Verdict {
///         match outcome {
///             Ok(resp) if resp.headers().contains_key("x-queue-full") => {
///                 self.0.classify_status(StatusCode::SERVICE_UNAVAILABLE)
///             }
///             other => self.0.classify(other),
///         }
///     }
/// }
///
/// let client = Client::builder().classifier(QueueFull::default()).build();
/// # let _ = client;
/// ```
pub trait ClientClassifier:
    Classifier<Incoming>
    + Classifier<TransportBody<Incoming>>
    + Classifier<CollectedBody>
    + Send
    + Sync
    + 'static
{
}

impl<T> ClientClassifier for T where
    T: Classifier<Incoming>
        + Classifier<TransportBody<Incoming>>
        + Classifier<CollectedBody>
        + Send
        + Sync
        + 'static
{
}

/// What [`ClientBuilder::classifier`](crate::ClientBuilder::classifier)
/// keeps: the built-in classifiers by value (a branch, no indirect call, on
/// every attempt), any other behind an `Arc`.
#[derive(Clone)]
pub(crate) enum AnyClassifier {
    Http(HttpClassifier),
    Grpc(GrpcClassifier),
    Other(Arc<dyn ClientClassifier>),
}

impl AnyClassifier {
    pub(crate) fn of<C: ClientClassifier>(classifier: C) -> Self {
        let any: &dyn Any = &classifier;
        if let Some(http) = any.downcast_ref::<HttpClassifier>() {
            return AnyClassifier::Http(*http);
        }
        if let Some(grpc) = any.downcast_ref::<GrpcClassifier>() {
            return AnyClassifier::Grpc(*grpc);
        }
        AnyClassifier::Other(Arc::new(classifier))
    }
}

impl fmt::Debug for AnyClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyClassifier::Http(c) => c.fmt(f),
            AnyClassifier::Grpc(c) => c.fmt(f),
            AnyClassifier::Other(_) => f.write_str("custom classifier"),
        }
    }
}

impl Classifier<TransportBody<Incoming>> for AnyClassifier {
    fn classify(&self, outcome: &Result<Response<TransportBody<Incoming>>, Error>) -> Verdict {
        match self {
            AnyClassifier::Http(c) => c.classify(outcome),
            AnyClassifier::Grpc(c) => c.classify(outcome),
            AnyClassifier::Other(c) => {
                Classifier::<TransportBody<Incoming>>::classify(c.as_ref(), outcome)
            }
        }
    }
}

impl Classifier<Incoming> for AnyClassifier {
    fn classify(&self, outcome: &Result<Response<Incoming>, Error>) -> Verdict {
        match self {
            AnyClassifier::Http(c) => c.classify(outcome),
            AnyClassifier::Grpc(c) => c.classify(outcome),
            AnyClassifier::Other(c) => Classifier::<Incoming>::classify(c.as_ref(), outcome),
        }
    }
}

impl Classifier<CollectedBody> for AnyClassifier {
    fn classify(&self, outcome: &Result<Response<CollectedBody>, Error>) -> Verdict {
        match self {
            AnyClassifier::Http(c) => c.classify(outcome),
            AnyClassifier::Grpc(c) => c.classify(outcome),
            AnyClassifier::Other(c) => Classifier::<CollectedBody>::classify(c.as_ref(), outcome),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_stay_inline() {
        assert!(matches!(
            AnyClassifier::of(HttpClassifier::default()),
            AnyClassifier::Http(_)
        ));
        assert!(matches!(
            AnyClassifier::of(GrpcClassifier::default()),
            AnyClassifier::Grpc(_)
        ));
        #[derive(Clone)]
        struct Never;
        impl<B> Classifier<B> for Never {
            fn classify(&self, _: &Result<Response<B>, Error>) -> Verdict {
                Verdict::Success
            }
        }
        assert!(matches!(AnyClassifier::of(Never), AnyClassifier::Other(_)));
    }
}
