//! **rebound**: outbound HTTP calls that survive a real network.
//!
//! This facade re-exports everything of `rebound-core` (the layers and their
//! vocabulary) and the client and transport of `rebound-hyper` at one root.
//! The README follows (its examples are compiled as doc tests).
#![doc = include_str!("../README.md")]

pub use rebound_core::*;
pub use rebound_hyper;
/// The JSON helpers' errors and their docs (`Client::get_json`, ...).
pub use rebound_hyper::json;
pub use rebound_hyper::{
    Body, BodyTimeouts, Client, ClientBody, ClientBuilder, ClientClassifier, HyperTransport,
    JsonError, JsonErrorCategory, MinBodyRate, RequestBuilder, SendFuture, TlsRoots, TransportBody,
    TransportBuilder, UnexpectedStatus,
};
#[allow(deprecated)]
pub use rebound_hyper::{ResponseBody, ResponseFuture};
/// The Redis store of the shared host state (feature `redis`).
#[cfg(feature = "redis")]
pub use rebound_redis as redis;
#[cfg(feature = "redis")]
pub use rebound_redis::RedisStore;
