//! Other crates' errors, recognised: what a bare hyper-util client, tower's
//! own middleware or the OS says, turned into rebound's kind and
//! [`Sent`] answer when [`Error::from_boxed`](crate::Error::from_boxed) meets it.
//!
//! rebound's layers work over any service (DESIGN.md §1, principle 9), so
//! the classifier must understand failures it did not make. Walking the
//! `source()` chain (and inside `io::Error`s, whose own `source()` skips the
//! error they wrap), the first error that says something decides:
//!
//! | error | kind | `Sent` |
//! |---|---|---|
//! | `tower::timeout::error::Elapsed` | `Timeout(Headers)` | `MaybeProcessed` |
//! | `tower::load_shed::error::Overloaded` | `Rejected` | `NotSent` (retryable: it never left) |
//! | hyper-util legacy `Error::is_connect()` with a timed-out `io::Error` inside (feature `hyper`) | `Timeout(Connect)` | `NotSent` |
//! | hyper-util legacy `Error::is_connect()` otherwise (feature `hyper`) | `Connect` | `NotSent` |
//! | `hyper::Error::is_canceled()` (feature `hyper`) | `Transport` | `NotSent` |
//! | an `h2::Error` with `REFUSED_STREAM` inside a `hyper::Error` (feature `hyper`) | `Transport` | `NotSent` |
//! | an `h2::Error` for a remote `GOAWAY` with `NO_ERROR` inside a `hyper::Error` (feature `hyper`) | `Transport` | `NotSent` |
//! | `hyper::Error::is_incomplete_message()` (feature `hyper`) | `Transport` | `MaybeProcessed` |
//! | `io::Error` `ConnectionRefused` | `Connect` | `NotSent` |
//! | `tonic::TimeoutExpired` (feature `tonic`): a `tonic::transport::Channel` enforcing the call's `grpc-timeout`, which rebound sets to the time left | `Timeout(Deadline)` | `MaybeProcessed` |
//!
//! Anything else stays a `Transport` error, which the classifier judges by
//! the `io::Error` it may hold (see [`crate::classify`]).
//!
//! # What "not sent" can be known from
//!
//! `NotSent` is claimed only where the request provably was not processed:
//!
//! * **canceled** (`hyper::Error::is_canceled`): hyper never wrote the
//!   request (its connection closed first). hyper-util re-sends these by
//!   itself on a reused connection (`retry_canceled_requests`).
//! * **HTTP/2 `REFUSED_STREAM`**: the server says it did no processing of
//!   the stream (RFC 9113 §8.7).
//! * **HTTP/2 `GOAWAY` from the server with `NO_ERROR`**: h2 fails, with
//!   this error, only the streams above the `GOAWAY`'s last stream id,
//!   which the server did not and will not process (RFC 9113 §6.8). The
//!   streams at or below it fail later, if at all, with the connection's
//!   own error (a reset, an end of stream): those may have been processed.
//!   A `GOAWAY` with an error code, or one we sent, proves nothing.
//!
//! What is **not** known: an HTTP/1.1 connection reset, closed or broken
//! (`ECONNRESET`, `EPIPE`, "connection closed before message completed")
//! after hyper started writing the request, reused connection or not and
//! with no byte of response read, may come from a server that read the
//! request and acted on it before closing (a crash, a proxy's timeout);
//! the same for an HTTP/2 connection that failed without a `GOAWAY` below
//! the stream. Those stay `MaybeProcessed`.

use std::error::Error as StdError;
use std::io;

use crate::annotations::Sent;
use crate::error::{ErrorKind, TimeoutStage};

/// `err` and its `source()` chain, looking inside `io::Error`s too (an
/// `io::Error`'s own `source()` skips the error it wraps, so a plain walk
/// misses what tokio-rustls or hyper-util put in one).
pub fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let mut next = Some(err);
    std::iter::from_fn(move || {
        let cur = next?;
        next = match cur.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => cur.source(),
        };
        Some(cur)
    })
}

/// What a foreign error means, if rebound recognises it.
pub(crate) fn recognise(err: &(dyn StdError + 'static)) -> Option<(ErrorKind, Sent, &'static str)> {
    for e in chain(err) {
        if e.is::<tower::timeout::error::Elapsed>() {
            return Some((
                ErrorKind::Timeout(TimeoutStage::Headers),
                Sent::MaybeProcessed,
                "timed out (tower Timeout)",
            ));
        }
        #[cfg(feature = "tonic")]
        if e.is::<tonic::TimeoutExpired>() {
            return Some((
                ErrorKind::Timeout(TimeoutStage::Deadline),
                Sent::MaybeProcessed,
                "timed out (tonic grpc-timeout)",
            ));
        }
        if e.is::<tower::load_shed::error::Overloaded>() {
            return Some((
                ErrorKind::Rejected,
                Sent::NotSent,
                "overloaded (tower LoadShed)",
            ));
        }
        #[cfg(feature = "hyper")]
        if let Some(found) = hyper_errors(e) {
            return Some(found);
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::ConnectionRefused {
                return Some((ErrorKind::Connect, Sent::NotSent, "connection refused"));
            }
        }
    }
    None
}

#[cfg(feature = "hyper")]
fn hyper_errors(e: &(dyn StdError + 'static)) -> Option<(ErrorKind, Sent, &'static str)> {
    if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        if client.is_connect() {
            let timed_out = chain(e).any(|inner| {
                inner
                    .downcast_ref::<io::Error>()
                    .is_some_and(|io| io.kind() == io::ErrorKind::TimedOut)
            });
            return Some(if timed_out {
                (
                    ErrorKind::Timeout(TimeoutStage::Connect),
                    Sent::NotSent,
                    "connect timed out",
                )
            } else {
                (ErrorKind::Connect, Sent::NotSent, "connect error")
            });
        }
        // Not a connect error: its source (a `hyper::Error`) says more.
        return None;
    }
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        if h.is_canceled() {
            return Some((
                ErrorKind::Transport,
                Sent::NotSent,
                "request canceled before it was sent",
            ));
        }
        if let Some(found) = h2_refused(e) {
            return Some(found);
        }
        if h.is_incomplete_message() {
            return Some((
                ErrorKind::Transport,
                Sent::MaybeProcessed,
                "connection closed before the message completed",
            ));
        }
    }
    None
}

/// An HTTP/2 error below `e` (a `hyper::Error`) that proves the stream was
/// not processed: `REFUSED_STREAM`, or the server's graceful `GOAWAY`
/// (which h2 reports only for streams above its last stream id).
#[cfg(feature = "hyper")]
fn h2_refused(e: &(dyn StdError + 'static)) -> Option<(ErrorKind, Sent, &'static str)> {
    chain(e).find_map(|inner| {
        let h2 = inner.downcast_ref::<h2::Error>()?;
        if h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
            return Some((ErrorKind::Transport, Sent::NotSent, "HTTP/2 stream refused"));
        }
        (h2.is_go_away() && h2.is_remote() && h2.reason() == Some(h2::Reason::NO_ERROR)).then_some(
            (
                ErrorKind::Transport,
                Sent::NotSent,
                "HTTP/2 connection going away",
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tower_elapsed_is_a_headers_timeout() {
        let err: Box<dyn StdError + Send + Sync> = Box::new(tower::timeout::error::Elapsed::new());
        let (kind, sent, _) = recognise(&*err).unwrap();
        assert_eq!(kind, ErrorKind::Timeout(TimeoutStage::Headers));
        assert_eq!(sent, Sent::MaybeProcessed);
    }

    #[test]
    fn refused_inside_another_error_is_not_sent() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapper")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let err = Wrapper(io::Error::from(io::ErrorKind::ConnectionRefused));
        let (kind, sent, _) = recognise(&err).unwrap();
        assert_eq!(kind, ErrorKind::Connect);
        assert_eq!(sent, Sent::NotSent);
    }

    #[test]
    fn towers_overloaded_is_rejected_but_retryable_as_not_sent() {
        use crate::classify::HttpClassifier;
        use crate::error::Error;
        let err = Error::from_boxed(Box::new(tower::load_shed::error::Overloaded::new()));
        assert_eq!(err.kind(), ErrorKind::Rejected);
        let verdict = HttpClassifier::default().classify_error(&err);
        assert!(verdict.is_retryable(), "{verdict:?}");
        assert_eq!(verdict.sent(), Some(Sent::NotSent));
        // rebound's own rejection (a full queue) stays final.
        let ours = Error::new(ErrorKind::Rejected);
        assert!(!HttpClassifier::default()
            .classify_error(&ours)
            .is_retryable());
    }

    #[test]
    fn unknown_errors_are_not_recognised() {
        let err = io::Error::other("something");
        assert!(recognise(&err).is_none());
    }
}
