//! rebound's transport and ready-made client.
//!
//! * [`HyperTransport`]: hyper-util's pooled client with rustls (on `ring`,
//!   webpki roots by default, OS roots with feature `native-roots`), HTTP/1.1
//!   and HTTP/2 by ALPN. It is the innermost `tower::Service` of rebound's
//!   stack: it only moves bytes and reports what happened, as
//!   [`rebound_core::Error`]s.
//! * [`connect::Connector`]: the connect and TLS stages, each with its own
//!   timeout and error stage.
//! * [`TransportBody`]: response bodies with idle and minimum-rate timeouts.
//! * [`Body`]: the request body (empty, in memory — replayable — or
//!   streamed).
//! * [`Client`]: the ready-made stack over the transport, with a request
//!   builder ([`RequestBuilder`]: headers, JSON body, query, per-request
//!   timeout, attempts and idempotency key) and JSON helpers ([`json`])
//!   that read the response body inside each attempt.
//!
//! # Errors and the `Sent` answer
//!
//! Every transport error carries its kind (`Connect`, `Tls`,
//! `Timeout(stage)`, `Body`, `Transport`, `InvalidRequest`) and a
//! [`Sent`](rebound_core::Sent) value in its extensions, which the
//! classifier honours:
//!
//! | what happened | kind | `Sent` |
//! |---|---|---|
//! | TCP refused / unreachable | `Connect` | `NotSent` |
//! | TCP not established in time | `Timeout(Connect)` | `NotSent` |
//! | TLS handshake failed | `Tls` | `NotSent` |
//! | TLS handshake not done in time | `Timeout(Tls)` | `NotSent` |
//! | HTTP/1 or HTTP/2 handshake failed (no connection got the request) | `Transport` | `NotSent` |
//! | hyper: request canceled before it was written | `Transport` | `NotSent` |
//! | HTTP/2 `REFUSED_STREAM`, graceful `GOAWAY` above the last stream | `Transport` | `NotSent` |
//! | reset / closed after the request may have been written | `Transport` | `MaybeProcessed` |
//! | response body failed (reset, truncated) | `Body` | `MaybeProcessed` |
//! | response body idle / too slow | `Timeout(BodyIdle / BodyRate)` | `MaybeProcessed` |
//!
//! hyper-util re-sends on its own a request that was never written to a
//! reused pooled connection; that happens inside one transport call, so
//! rebound's retry layer never counts it as a second attempt.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
mod classifier;
pub mod client;
pub mod connect;
mod error;
pub mod json;
pub mod request;
pub mod response_body;
pub mod transport;

pub use crate::body::Body;
pub use crate::classifier::ClientClassifier;
#[allow(deprecated)]
pub use crate::client::ResponseFuture;
pub use crate::client::{Client, ClientBody, ClientBuilder, SendFuture};
pub use crate::connect::{Connector, TlsRoots};
pub use crate::json::{JsonError, JsonErrorCategory, UnexpectedStatus};
pub use crate::request::RequestBuilder;
#[allow(deprecated)]
pub use crate::response_body::ResponseBody;
pub use crate::response_body::{BodyTimeouts, MinBodyRate, TransportBody};
pub use crate::transport::{HyperTransport, TransportBuilder};
