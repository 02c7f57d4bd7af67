//! Reading what servers say about their rate limits.
//!
//! [`parse`] reads every family of rate-limit headers (IETF `RateLimit` /
//! `RateLimit-Policy`, the legacy `RateLimit-*` and `X-RateLimit-*`,
//! OpenAI's, Anthropic's, Azure's) into one [`Reading`] per response.
//!
//! ```
//! use std::time::SystemTime;
//! use http::{HeaderMap, StatusCode};
//! use rebound_core::ratelimit::{parse, Dimension};
//!
//! let mut h = HeaderMap::new();
//! h.insert("ratelimit", "\"burst\";r=50;t=30".parse().unwrap());
//! let reading = parse::read(&h, StatusCode::OK, SystemTime::UNIX_EPOCH);
//! assert_eq!(reading.get(Dimension::Requests).unwrap().remaining, Some(50));
//! ```

pub mod parse;

pub use self::parse::{Dimension, Precision, Quota, Reading};
