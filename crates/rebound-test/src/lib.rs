//! Test kit for rebound and its users.
//!
//! * [`mock`]: a scripted in-process [`MockService`](mock::MockService) for
//!   unit tests of single layers, recording every call.
//! * [`fault`]: a real TCP (optionally TLS) server on `127.0.0.1:0`, the
//!   [`FaultServer`](fault::FaultServer), driven by a script per connection
//!   or per path: it answers, stalls, trickles, resets, truncates, hangs the
//!   TLS handshake, and records every request it received.
//!
//! This crate does not depend on `rebound-core`, so that `rebound-core` can
//! use it in its own tests without a second copy of its types.

pub mod fault;
pub mod mock;
