//! Test kit for rebound and its users.
//!
//! * [`mock`]: a scripted in-process [`MockService`](mock::MockService) for
//!   unit tests of single layers, recording every call.
//! * [`fault`]: a real TCP (optionally TLS) server on `127.0.0.1:0`, the
//!   [`FaultServer`](fault::FaultServer), driven by a script per connection
//!   or per path: it answers, stalls, trickles, resets, truncates, hangs the
//!   TLS handshake, and records every request it received.
//! * [`quota`]: a real HTTP server on `127.0.0.1:0`, the
//!   [`QuotaServer`](quota::QuotaServer), that enforces N requests and / or
//!   T tokens per fixed window (and optionally a daily quota), answers 429
//!   past it, and reports the quota in one provider's rate-limit headers
//!   (IETF draft, legacy, `X-RateLimit-*`, GitHub, OpenAI, Anthropic,
//!   Azure), counting what it admitted per window.
//! * [`queueing`]: a real HTTP server, the
//!   [`QueueingServer`](queueing::QueueingServer), with a fixed number of
//!   workers and a queue, so that its latency grows with the requests it
//!   holds (it never answers 429); optionally it sheds past a queue bound,
//!   or refuses a set fraction of requests (503 or 429), deterministically.
//! * [`capture`]: a tracing subscriber that keeps every span, every field
//!   and every event message at TRACE, so tests can assert what was logged
//!   (and that a secret never was).
//! * [`redis`]: a real `redis-server` on a free `127.0.0.1` port, the
//!   [`RedisServer`](redis::RedisServer), killed on drop, that a test can
//!   kill, restart and pause (SIGSTOP) to fault the shared host state.
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
pub mod queueing;
pub mod quota;
pub mod redis;
mod serve;
