//! **rebound**: outbound HTTP calls that survive a real network.
//!
//! A stack of small `tower::Layer`s — per-stage timeouts and a total
//! deadline, retry classification, exponential backoff with jitter,
//! Retry-After, Idempotency-Key injection, concurrency limits that adapt to
//! overload, cancellation that really cancels, tracing that never leaks a
//! secret — that stack on any tower service over `http` types, plus a
//! ready-made [`Client`] on hyper-util with rustls.
//!
//! This facade re-exports everything of `rebound-core` (the layers and their
//! vocabulary) and the client and transport of `rebound-hyper` at one root.

pub use rebound_core::*;
pub use rebound_hyper;
pub use rebound_hyper::{
    Body, BodyTimeouts, Client, ClientBody, ClientBuilder, HyperTransport, MinBodyRate,
    ResponseBody, TlsRoots, TransportBuilder,
};
