//! gRPC status codes, and what `grpc-status` says.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// `grpc-status`: the gRPC outcome, in the response headers (Trailers-Only)
/// or in the trailers.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

// Verdict reasons, static so that classifying allocates nothing.
const REASONS: [&str; 17] = [
    "grpc OK",
    "grpc CANCELLED",
    "grpc UNKNOWN",
    "grpc INVALID_ARGUMENT",
    "grpc DEADLINE_EXCEEDED",
    "grpc NOT_FOUND",
    "grpc ALREADY_EXISTS",
    "grpc PERMISSION_DENIED",
    "grpc RESOURCE_EXHAUSTED",
    "grpc FAILED_PRECONDITION",
    "grpc ABORTED",
    "grpc OUT_OF_RANGE",
    "grpc UNIMPLEMENTED",
    "grpc INTERNAL",
    "grpc UNAVAILABLE",
    "grpc DATA_LOSS",
    "grpc UNAUTHENTICATED",
];

/// A gRPC status code (`0..=16`).
///
/// ```
/// use http::HeaderValue;
/// use rebound_core::grpc::Code;
///
/// assert_eq!(Code::from_header(&HeaderValue::from_static("14")), Code::UNAVAILABLE);
/// // Unknown or malformed values are UNKNOWN, as gRPC says.
/// assert_eq!(Code::from_header(&HeaderValue::from_static("99")), Code::UNKNOWN);
/// assert_eq!(Code::from_header(&HeaderValue::from_static("abc")), Code::UNKNOWN);
/// assert_eq!(Code::UNAVAILABLE.name(), "UNAVAILABLE");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Code(u8);

impl Code {
    /// 0: not an error.
    pub const OK: Code = Code(0);
    /// 1: cancelled, typically by the caller.
    pub const CANCELLED: Code = Code(1);
    /// 2: unknown error (also any unknown or malformed `grpc-status`).
    pub const UNKNOWN: Code = Code(2);
    /// 3: the client sent an invalid argument.
    pub const INVALID_ARGUMENT: Code = Code(3);
    /// 4: the deadline expired before the operation could complete.
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    /// 5: some requested entity was not found.
    pub const NOT_FOUND: Code = Code(5);
    /// 6: the entity a client tried to create already exists.
    pub const ALREADY_EXISTS: Code = Code(6);
    /// 7: the caller may not execute the operation.
    pub const PERMISSION_DENIED: Code = Code(7);
    /// 8: some resource has been exhausted (quota, rate limit).
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    /// 9: the system is not in a state required for the operation.
    pub const FAILED_PRECONDITION: Code = Code(9);
    /// 10: the operation was aborted (e.g. a concurrency conflict).
    pub const ABORTED: Code = Code(10);
    /// 11: the operation was attempted past the valid range.
    pub const OUT_OF_RANGE: Code = Code(11);
    /// 12: the operation is not implemented.
    pub const UNIMPLEMENTED: Code = Code(12);
    /// 13: an internal error.
    pub const INTERNAL: Code = Code(13);
    /// 14: the service is currently unavailable (transient).
    pub const UNAVAILABLE: Code = Code(14);
    /// 15: unrecoverable data loss or corruption.
    pub const DATA_LOSS: Code = Code(15);
    /// 16: no valid authentication credentials.
    pub const UNAUTHENTICATED: Code = Code(16);

    /// The code numbered `n`; UNKNOWN for a number outside `0..=16`.
    pub fn from_i32(n: i32) -> Code {
        if (0..=16).contains(&n) {
            Code(n as u8)
        } else {
            Code::UNKNOWN
        }
    }

    /// The code a `grpc-status` value names: up to three ASCII digits
    /// naming `0..=16`. Anything else (empty, not a number, out of range)
    /// is UNKNOWN, never a panic.
    pub fn from_header(value: &HeaderValue) -> Code {
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > 3 || !bytes.iter().all(u8::is_ascii_digit) {
            return Code::UNKNOWN;
        }
        let n = bytes.iter().fold(0i32, |n, b| n * 10 + i32::from(b - b'0'));
        Code::from_i32(n)
    }

    /// The code in `headers`' `grpc-status`, if there is one.
    pub fn from_headers(headers: &HeaderMap) -> Option<Code> {
        headers.get(GRPC_STATUS).map(Code::from_header)
    }

    /// The code gRPC gives a response that has no `grpc-status` and an HTTP
    /// status other than 200 (a proxy's error page, say), from gRPC's
    /// "HTTP to gRPC status code mapping": 400 INTERNAL, 401
    /// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 UNIMPLEMENTED, 429, 502,
    /// 503 and 504 UNAVAILABLE, anything else UNKNOWN.
    pub fn from_http_status(status: StatusCode) -> Code {
        match status.as_u16() {
            200 => Code::OK,
            400 => Code::INTERNAL,
            401 => Code::UNAUTHENTICATED,
            403 => Code::PERMISSION_DENIED,
            404 => Code::UNIMPLEMENTED,
            429 | 502 | 503 | 504 => Code::UNAVAILABLE,
            _ => Code::UNKNOWN,
        }
    }

    /// The number.
    pub fn as_u8(self) -> u8 {
        self.0
    }

    /// The name gRPC gives the code: `"UNAVAILABLE"`.
    pub fn name(self) -> &'static str {
        NAMES[self.0 as usize]
    }

    /// `"grpc UNAVAILABLE"`: the text of a verdict's reason.
    pub(crate) fn reason(self) -> &'static str {
        REASONS[self.0 as usize]
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One test for every layer, the HTTP classifier's hint included.
pub(crate) use crate::classify::is_grpc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_status() {
        for (text, code) in [
            ("0", Code::OK),
            ("14", Code::UNAVAILABLE),
            ("016", Code::UNAUTHENTICATED),
            ("3", Code::INVALID_ARGUMENT),
            ("17", Code::UNKNOWN),
            ("999", Code::UNKNOWN),
            ("1000", Code::UNKNOWN),
            ("", Code::UNKNOWN),
            ("-1", Code::UNKNOWN),
            (" 14", Code::UNKNOWN),
            ("1a", Code::UNKNOWN),
        ] {
            assert_eq!(
                Code::from_header(&HeaderValue::from_str(text).unwrap()),
                code,
                "{text:?}"
            );
        }
        assert_eq!(Code::from_i32(-5), Code::UNKNOWN);
        assert_eq!(Code::from_i32(8), Code::RESOURCE_EXHAUSTED);
        for n in 0..=16 {
            let c = Code::from_i32(n);
            assert!(c.reason().ends_with(c.name()));
        }
        assert_eq!(format!("{:?}", Code::UNAVAILABLE), "UNAVAILABLE(14)");
    }

    #[test]
    fn http_mapping() {
        assert_eq!(
            Code::from_http_status(StatusCode::SERVICE_UNAVAILABLE),
            Code::UNAVAILABLE
        );
        assert_eq!(
            Code::from_http_status(StatusCode::NOT_FOUND),
            Code::UNIMPLEMENTED
        );
        assert_eq!(
            Code::from_http_status(StatusCode::IM_A_TEAPOT),
            Code::UNKNOWN
        );
    }

    #[test]
    fn content_type() {
        let mut h = HeaderMap::new();
        assert!(!is_grpc(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert!(!is_grpc(&h));
    }
}
