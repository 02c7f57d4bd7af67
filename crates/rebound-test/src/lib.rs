//! Test kit for rebound and its users.
//!
//! * [`mock`]: a scripted in-process [`MockService`](mock::MockService) for
//!   unit tests of single layers, recording every call.
//! * [`fault`]: a real TCP (optionally TLS) server on `127.0.0.1:0`, the
//!   [`FaultServer`](fault::FaultServer), driven by a script per connection
//!   or per path: it answers, stalls, trickles, resets, truncates, hangs the
//!   TLS handshake, and records every request it received.
//! * [`capture`]: a tracing subscriber that keeps every span, every field
//!   and every event message at TRACE, so tests can assert what was logged
//!   (and that a secret never was).
//!
//! * `grpc` (feature `tonic`): a scripted tonic server and a hand-written
//!   client stub, for gRPC tests with no `protoc`.
//!
//! This crate does not depend on `rebound-core`, so that `rebound-core` can
//! use it in its own tests without a second copy of its types.

pub mod capture;
pub mod fault;
#[cfg(feature = "tonic")]
pub mod grpc;
pub mod mock;
