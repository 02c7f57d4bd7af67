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

use crate::ResponseBody;

/// A classifier the client can use on every body its attempts see:
/// hyper's `Incoming` (the client's own path), `ResponseBody<Incoming>` (a
/// client with a hedge, a fallback or a reconcile check) and the JSON
/// helpers' `CollectedBody`. Implemented by every type that is a
/// [`Classifier`] of all three and `Send + Sync + 'static` —
/// [`HttpClassifier`], [`GrpcClassifier`], and closures
/// `Fn(&Result<Response<B>, Error>) -> Verdict` generic enough to take any
/// body (e.g. ones that only look at the status and headers).
pub trait ClientClassifier:
    Classifier<Incoming>
    + Classifier<ResponseBody<Incoming>>
    + Classifier<CollectedBody>
    + Send
    + Sync
    + 'static
{
}

impl<T> ClientClassifier for T where
    T: Classifier<Incoming>
        + Classifier<ResponseBody<Incoming>>
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

impl Classifier<ResponseBody<Incoming>> for AnyClassifier {
    fn classify(&self, outcome: &Result<Response<ResponseBody<Incoming>>, Error>) -> Verdict {
        match self {
            AnyClassifier::Http(c) => c.classify(outcome),
            AnyClassifier::Grpc(c) => c.classify(outcome),
            AnyClassifier::Other(c) => {
                Classifier::<ResponseBody<Incoming>>::classify(c.as_ref(), outcome)
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
