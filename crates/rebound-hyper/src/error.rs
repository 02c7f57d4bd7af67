//! Turning hyper-util's, hyper's, h2's and rustls's errors into
//! `rebound_core::Error` with the right kind, a short detail and an explicit
//! [`Sent`] answer.
//!
//! hyper-util's public error only says `is_connect()`; whether the request
//! may have been written is found by walking `source()`:
//!
//! * our connector's own error (connect / TLS failure or timeout) → its kind,
//!   [`Sent::NotSent`];
//! * no connection was ever handed the request (hyper-util attaches
//!   `connect_info` to every error that happens once a pooled connection has
//!   the request; errors during the HTTP/1 or HTTP/2 handshake have none) →
//!   `NotSent`;
//! * `hyper::Error::is_canceled` ("a pending item was dropped before ever
//!   being processed": the request was never written) → `NotSent`;
//! * HTTP/2 `REFUSED_STREAM`, or a graceful remote `GOAWAY` (`NO_ERROR`,
//!   which only fails streams above the server's last processed stream id)
//!   → `NotSent`;
//! * anything else → [`Sent::MaybeProcessed`]: an HTTP/1.1 connection
//!   reset, closed or broken after hyper began writing the request, or an
//!   HTTP/2 connection that failed without a `GOAWAY` below the stream, may
//!   come from a server that read the request and acted on it (see
//!   "What 'not sent' can be known from" in [`rebound_core::foreign`]).
//!
//! A TLS error whose chain holds rustls's `InvalidCertificate` (the
//! server's certificate failed verification) also carries
//! [`CertificateRejected`] with a short reason, and its detail names it
//! (`tls error: invalid server certificate: unknown issuer`), so the
//! classifier can tell it from a handshake that may work next time.

use std::error::Error as StdError;
use std::io;

use rebound_core::annotations::CertificateRejected;
use rebound_core::{BoxError, Error, ErrorKind, Sent};

pub(crate) use rebound_core::redact::RequestName;

use rebound_core::foreign::chain;

/// A short, secret-free description of the most telling error in the chain.
pub(crate) fn describe(err: &(dyn StdError + 'static)) -> Option<&'static str> {
    for e in chain(err) {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_canceled() {
                return Some("request canceled before it was sent");
            }
            if h.is_incomplete_message() {
                return Some("connection closed before the message completed");
            }
            if h.is_parse() {
                return Some("invalid HTTP message from the server");
            }
            if h.is_timeout() {
                return Some("timed out");
            }
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            match h2.reason() {
                Some(h2::Reason::REFUSED_STREAM) => return Some("HTTP/2 stream refused"),
                Some(_) if h2.is_go_away() => return Some("HTTP/2 connection going away"),
                Some(_) if h2.is_reset() => return Some("HTTP/2 stream reset"),
                _ => {}
            }
        }
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(match tls {
                rustls::Error::InvalidCertificate(c) => certificate_problem(c).0,
                rustls::Error::NoApplicationProtocol => "no common application protocol",
                rustls::Error::AlertReceived(_) => "alert received from the server",
                rustls::Error::PeerIncompatible(_) => "server incompatible",
                _ => "handshake failed",
            });
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            let text = match io.kind() {
                io::ErrorKind::ConnectionRefused => "connection refused",
                io::ErrorKind::ConnectionReset => "connection reset",
                io::ErrorKind::ConnectionAborted => "connection aborted",
                io::ErrorKind::BrokenPipe => "broken pipe",
                io::ErrorKind::UnexpectedEof => "unexpected end of stream",
                io::ErrorKind::TimedOut => "timed out",
                io::ErrorKind::AddrNotAvailable => "address not available",
                io::ErrorKind::NotConnected => "not connected",
                _ => continue,
            };
            return Some(text);
        }
    }
    None
}

/// What is wrong with a certificate that failed verification: the error's
/// detail and the [`CertificateRejected`] reason. Static texts only: the
/// context some variants carry (names, times) is not shown.
fn certificate_problem(err: &rustls::CertificateError) -> (&'static str, &'static str) {
    use rustls::CertificateError as C;
    #[allow(deprecated)]
    match err {
        C::UnknownIssuer => (
            "invalid server certificate: unknown issuer",
            "unknown issuer",
        ),
        C::NotValidForName | C::NotValidForNameContext { .. } => (
            "invalid server certificate: not valid for the host name",
            "not valid for the host name",
        ),
        C::Expired | C::ExpiredContext { .. } => ("invalid server certificate: expired", "expired"),
        C::NotValidYet | C::NotValidYetContext { .. } => {
            ("invalid server certificate: not valid yet", "not valid yet")
        }
        C::Revoked => ("invalid server certificate: revoked", "revoked"),
        C::BadSignature
        | C::UnsupportedSignatureAlgorithm
        | C::UnsupportedSignatureAlgorithmContext { .. }
        | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => (
            "invalid server certificate: bad or unsupported signature",
            "bad signature",
        ),
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => (
            "invalid server certificate: not for server authentication",
            "not for server authentication",
        ),
        C::BadEncoding => ("invalid server certificate: bad encoding", "bad encoding"),
        C::UnknownRevocationStatus
        | C::ExpiredRevocationList
        | C::ExpiredRevocationListContext { .. } => (
            "invalid server certificate: revocation status unknown",
            "revocation status unknown",
        ),
        _ => ("invalid server certificate", "rejected"),
    }
}

/// The [`CertificateRejected`] fact, if the chain shows that the server's
/// certificate failed verification.
fn certificate_rejected(err: &(dyn StdError + 'static)) -> Option<CertificateRejected> {
    chain(err).find_map(|e| match e.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::InvalidCertificate(c)) => {
            Some(CertificateRejected(certificate_problem(c).1))
        }
        _ => None,
    })
}

/// Whether the chain shows that the request was certainly not processed.
fn never_processed(err: &(dyn StdError + 'static)) -> bool {
    chain(err).any(|e| {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_canceled() {
                return true;
            }
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return true;
            }
            if h2.is_go_away() && h2.is_remote() && h2.reason() == Some(h2::Reason::NO_ERROR) {
                return true;
            }
        }
        false
    })
}

/// The first rebound error in the chain (e.g. our connector's), if any.
fn find_rebound<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a Error> {
    chain(err).find_map(|e| e.downcast_ref::<Error>())
}

fn with_sent(mut err: Error, sent: Sent) -> Error {
    err.extensions_mut().insert(sent);
    err
}

/// Map an error of hyper-util's legacy client.
pub(crate) fn from_client(err: hyper_util::client::legacy::Error) -> Error {
    let dyn_err: &(dyn StdError + 'static) = &err;
    // Our connector's error (connect / TLS, failure or timeout), or any other
    // rebound error that travelled through hyper (e.g. from a request body).
    let found = find_rebound(dyn_err).map(Error::kind);
    let detail = describe(dyn_err);
    let sent = if err.is_connect() || err.connect_info().is_none() || never_processed(dyn_err) {
        Sent::NotSent
    } else {
        Sent::MaybeProcessed
    };
    let kind = match found {
        Some(kind) => kind,
        None if err.is_connect() => ErrorKind::Connect,
        None => ErrorKind::Transport,
    };
    let mut out = Error::new(kind);
    if let Some(detail) = detail {
        out = out.with_detail(detail);
    }
    if kind == ErrorKind::Tls {
        if let Some(rejected) = certificate_rejected(dyn_err) {
            out.extensions_mut().insert(rejected);
        }
    }
    with_sent(out.with_source(err), sent)
}

/// Map an error of a connector stage (`kind` is `Connect` or `Tls`); an
/// `io::ErrorKind::TimedOut` (hyper-util's own connect timeout) becomes a
/// timeout at `timeout_stage`.
pub(crate) fn from_connect_stage(
    err: BoxError,
    kind: ErrorKind,
    timeout_stage: rebound_core::TimeoutStage,
) -> Error {
    if err.downcast_ref::<Error>().is_some() {
        return Error::from_boxed(err);
    }
    let dyn_err: &(dyn StdError + 'static) = &*err;
    let timed_out = chain(dyn_err).any(|e| {
        e.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
    });
    let out = if timed_out {
        Error::timeout(timeout_stage)
    } else {
        Error::new(kind)
    };
    let mut out = match describe(dyn_err) {
        Some(detail) if !timed_out => out.with_detail(detail),
        _ => out,
    };
    if kind == ErrorKind::Tls && !timed_out {
        if let Some(rejected) = certificate_rejected(dyn_err) {
            out.extensions_mut().insert(rejected);
        }
    }
    with_sent(out.with_source(err), Sent::NotSent)
}

/// Map an error while reading a response body: kind `Body` (or the kind of
/// a rebound error found in the chain), always `MaybeProcessed`.
pub(crate) fn from_body(err: BoxError) -> Error {
    if err.downcast_ref::<Error>().is_some() {
        return Error::from_boxed(err);
    }
    let dyn_err: &(dyn StdError + 'static) = &*err;
    let mut out = Error::new(ErrorKind::Body);
    if let Some(detail) = describe(dyn_err) {
        out = out.with_detail(detail);
    }
    with_sent(out.with_source(err), Sent::MaybeProcessed)
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Wrap(Box<dyn StdError + Send + Sync>);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrap")
        }
    }
    impl StdError for Wrap {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn h2_refused_stream_is_never_processed() {
        let refused = Wrap(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
        assert!(never_processed(&refused));
        assert_eq!(describe(&refused), Some("HTTP/2 stream refused"));
        let other = Wrap(Box::new(h2::Error::from(h2::Reason::INTERNAL_ERROR)));
        assert!(!never_processed(&other));
    }

    #[test]
    fn io_inside_io_is_found() {
        let inner = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
        let outer = io::Error::other(Wrap(Box::new(inner)));
        assert_eq!(describe(&outer), Some("connection reset"));
        let tls = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(
            describe(&tls),
            Some("invalid server certificate: unknown issuer")
        );
    }

    #[test]
    fn connect_stage_timeouts_and_failures() {
        let refused: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        let e = from_connect_stage(
            refused,
            ErrorKind::Connect,
            rebound_core::TimeoutStage::Connect,
        );
        assert!(matches!(e.kind(), ErrorKind::Connect));
        assert_eq!(e.extensions().get::<Sent>(), Some(&Sent::NotSent));
        assert_eq!(e.to_string(), "connect error: connection refused");

        let timed_out: BoxError =
            Box::new(Wrap(Box::new(io::Error::from(io::ErrorKind::TimedOut))));
        let e = from_connect_stage(
            timed_out,
            ErrorKind::Connect,
            rebound_core::TimeoutStage::Connect,
        );
        assert_eq!(e.timeout_stage(), Some(rebound_core::TimeoutStage::Connect));
    }

    #[test]
    fn certificate_failures_are_marked_and_fatal() {
        use rebound_core::classify::HttpClassifier;
        use rustls::CertificateError as C;
        for (cert, reason) in [
            (C::UnknownIssuer, "unknown issuer"),
            (C::NotValidForName, "not valid for the host name"),
            (C::Expired, "expired"),
            (C::Revoked, "revoked"),
        ] {
            let io = io::Error::new(
                io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(cert),
            );
            let e = from_connect_stage(
                Box::new(io),
                ErrorKind::Tls,
                rebound_core::TimeoutStage::Tls,
            );
            assert!(matches!(e.kind(), ErrorKind::Tls));
            assert_eq!(
                e.extensions().get::<CertificateRejected>(),
                Some(&CertificateRejected(reason))
            );
            assert_eq!(
                e.to_string(),
                format!("tls error: invalid server certificate: {reason}")
            );
            let v = HttpClassifier::default().classify_error(&e);
            assert!(v.is_fatal(), "{reason}: {v}");
        }
        // Any other handshake failure stays a retryable TLS error.
        let io = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
        );
        let e = from_connect_stage(
            Box::new(io),
            ErrorKind::Tls,
            rebound_core::TimeoutStage::Tls,
        );
        assert!(matches!(e.kind(), ErrorKind::Tls));
        assert!(e.extensions().get::<CertificateRejected>().is_none());
        let v = HttpClassifier::default().classify_error(&e);
        assert_eq!(v.sent(), Some(Sent::NotSent), "{v}");
    }

    #[test]
    fn body_errors_are_maybe_processed() {
        let e = from_body(Box::new(io::Error::from(io::ErrorKind::UnexpectedEof)));
        assert!(matches!(e.kind(), ErrorKind::Body));
        assert_eq!(e.extensions().get::<Sent>(), Some(&Sent::MaybeProcessed));
        assert_eq!(e.to_string(), "body error: unexpected end of stream");
    }
}
