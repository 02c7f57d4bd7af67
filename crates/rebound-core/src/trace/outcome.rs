//! Reading an outcome's annotations, once, for spans, events and metrics.

use std::time::Duration;

use http::{Extensions, HeaderMap, Response, StatusCode};
use tracing::Level;

use super::{BudgetLeft, GateWait, LimiterState};
use crate::annotations::{Attempts, ProposedDelay, RetryStop, Verdict};
use crate::error::{Error, ErrorKind, TimeoutStage};

/// Emit a `tracing` event at a level chosen at run time (DEBUG, INFO or
/// WARN); tracing's macros need the level as a constant.
macro_rules! event_at {
    ($level:expr, $($args:tt)+) => {{
        let level: ::tracing::Level = $level;
        if level == ::tracing::Level::WARN {
            ::tracing::warn!($($args)+)
        } else if level == ::tracing::Level::INFO {
            ::tracing::info!($($args)+)
        } else {
            ::tracing::debug!($($args)+)
        }
    }};
}
pub(crate) use event_at;

/// One attempt's or request's outcome, as the trace layers see it.
pub(crate) struct Outcome<'a> {
    pub(crate) status: Option<StatusCode>,
    pub(crate) error: Option<&'a Error>,
    pub(crate) headers: Option<&'a HeaderMap>,
    pub(crate) ext: &'a Extensions,
}

impl<'a> Outcome<'a> {
    pub(crate) fn of<B>(result: &'a Result<Response<B>, Error>) -> Self {
        match result {
            Ok(res) => Outcome {
                status: Some(res.status()),
                error: None,
                headers: Some(res.headers()),
                ext: res.extensions(),
            },
            Err(err) => Outcome {
                status: None,
                error: Some(err),
                headers: None,
                ext: err.extensions(),
            },
        }
    }

    pub(crate) fn verdict(&self) -> Option<&'a Verdict> {
        self.ext.get::<Verdict>()
    }

    /// `success`, `retryable`, `fatal`, or `unclassified` for an error no
    /// classifier has judged.
    pub(crate) fn verdict_label(&self) -> &'static str {
        match (self.verdict(), self.error) {
            (Some(v), _) => v.as_str(),
            (None, Some(_)) => "unclassified",
            (None, None) => "success",
        }
    }

    pub(crate) fn is_success(&self) -> bool {
        self.error.is_none() && self.verdict().is_none_or(Verdict::is_success)
    }

    /// OpenTelemetry's `error.type`: the error kind, or the status code of a
    /// response that is an error (4xx/5xx, or judged not a success).
    pub(crate) fn error_type(&self) -> Option<&str> {
        if let Some(err) = self.error {
            return Some(err.kind().as_str());
        }
        let status = self.status.as_ref()?;
        let failed = status.as_u16() >= 400 || !self.verdict().is_none_or(Verdict::is_success);
        failed.then(|| status.as_str())
    }

    pub(crate) fn attempts(&self) -> u32 {
        Attempts::of(self.ext)
    }

    /// Why the retry loop stopped, in one word: the [`RetryStop`] if a retry
    /// layer left one; otherwise `success`, `deadline`, `cancelled`,
    /// `fatal`, `not_retried` (a retryable outcome with no retry layer
    /// above) or `error` (an unclassified error).
    pub(crate) fn stop(&self) -> &'static str {
        if let Some(stop) = self.ext.get::<RetryStop>() {
            return stop.as_str();
        }
        if let Some(err) = self.error {
            return match err.kind() {
                ErrorKind::Timeout(TimeoutStage::Deadline) => "deadline",
                ErrorKind::Cancelled => "cancelled",
                ErrorKind::Closed => "closed",
                _ => match self.verdict() {
                    Some(Verdict::Retryable { .. }) => "not_retried",
                    Some(Verdict::Fatal { .. }) => "fatal",
                    _ => "error",
                },
            };
        }
        match self.verdict() {
            None | Some(Verdict::Success) => "success",
            Some(Verdict::Fatal { .. }) => "fatal",
            Some(Verdict::Retryable { .. }) => "not_retried",
        }
    }

    pub(crate) fn proposed_delay(&self) -> Option<&'a ProposedDelay> {
        self.ext.get::<ProposedDelay>()
    }

    pub(crate) fn budget_left(&self) -> Option<u32> {
        self.ext.get::<BudgetLeft>().map(|b| b.0)
    }

    pub(crate) fn limiter(&self) -> Option<&'a LimiterState> {
        self.ext.get::<LimiterState>()
    }

    pub(crate) fn gate_wait(&self) -> Option<Duration> {
        self.ext.get::<GateWait>().map(|g| g.0)
    }

    /// The level of the logical request's closing event:
    /// a success on the first attempt DEBUG, a success after retries INFO,
    /// giving up (an error, or a response still judged retryable) WARN, a
    /// fatal response DEBUG on the first attempt and INFO after retries, a
    /// cancellation DEBUG.
    pub(crate) fn request_level(&self) -> Level {
        let retried = self.attempts() > 1;
        if let Some(err) = self.error {
            return if matches!(err.kind(), ErrorKind::Cancelled) {
                Level::DEBUG
            } else {
                Level::WARN
            };
        }
        match self.verdict() {
            Some(Verdict::Retryable { .. }) => Level::WARN,
            _ if retried => Level::INFO,
            _ => Level::DEBUG,
        }
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::{Reason, Sent};

    fn resp(status: u16) -> Result<Response<()>, Error> {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok(r)
    }

    #[test]
    fn stop_and_level() {
        let ok = resp(200);
        let o = Outcome::of(&ok);
        assert_eq!(
            (o.stop(), o.request_level(), o.error_type()),
            ("success", Level::DEBUG, None)
        );

        let mut r = resp(503);
        if let Ok(res) = &mut r {
            res.extensions_mut().insert(Verdict::Retryable {
                reason: Reason::status(StatusCode::SERVICE_UNAVAILABLE),
                sent: Sent::MaybeProcessed,
            });
            res.extensions_mut().insert(RetryStop::Attempts);
            res.extensions_mut().insert(Attempts(3));
        }
        let o = Outcome::of(&r);
        assert_eq!(o.stop(), "attempts");
        assert_eq!(o.request_level(), Level::WARN);
        assert_eq!(o.error_type(), Some("503"));
        assert_eq!(o.verdict_label(), "retryable");

        let nf = resp(404);
        let o = Outcome::of(&nf);
        assert_eq!(o.error_type(), Some("404"));
        assert_eq!(o.request_level(), Level::DEBUG);

        let e: Result<Response<()>, Error> = Err(Error::timeout(TimeoutStage::Deadline));
        let o = Outcome::of(&e);
        assert_eq!(
            (o.stop(), o.request_level(), o.error_type()),
            ("deadline", Level::WARN, Some("timeout"))
        );
        assert_eq!(o.verdict_label(), "unclassified");

        let c: Result<Response<()>, Error> = Err(Error::new(ErrorKind::Cancelled));
        let o = Outcome::of(&c);
        assert_eq!((o.stop(), o.request_level()), ("cancelled", Level::DEBUG));
    }
}
