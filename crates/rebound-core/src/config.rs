//! Checks shared by every configurable value in rebound (this crate's layers
//! and `rebound-hyper`'s transport and client), so that one rule and one
//! wording hold everywhere.
//!
//! ```
//! use std::time::Duration;
//! use rebound_core::config::validate_duration;
//!
//! assert!(validate_duration("attempt timeout", Duration::from_secs(10)).is_ok());
//! let err = validate_duration("attempt timeout", Duration::ZERO).unwrap_err();
//! assert_eq!(err.kind(), rebound_core::ErrorKind::Config);
//! assert!(err.to_string().contains("attempt timeout must be greater than zero"));
//! ```

use std::time::Duration;

use crate::error::Error;

/// The longest duration any rebound setting accepts: one day. Anything
/// longer is certainly a unit mistake (milliseconds passed as seconds, ...).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks a configured duration named `what`: not zero, not longer than
/// [`MAX_DURATION`].
///
/// # Errors
///
/// A [configuration error](crate::ErrorKind::Config) that names `what` and the value.
pub fn validate_duration(what: &str, d: Duration) -> Result<Duration, Error> {
    if d.is_zero() {
        return Err(Error::config(format!("{what} must be greater than zero")));
    }
    if d > MAX_DURATION {
        return Err(Error::config(format!(
            "{what} of {d:?} is longer than the maximum of {MAX_DURATION:?}"
        )));
    }
    Ok(d)
}

/// The value of a checked constructor, or a panic that says which
/// constructor refused what: how every `new` in rebound follows tower's
/// idiom (DESIGN.md §10) — `new` returns the value and panics on arguments
/// that cannot work, `try_new` returns the [configuration
/// error](crate::ErrorKind::Config) instead.
///
/// ```should_panic
/// use std::time::Duration;
/// // "AttemptTimeoutLayer::new: invalid configuration: attempt timeout must be greater than zero"
/// let _ = rebound_core::AttemptTimeoutLayer::new(Duration::ZERO);
/// ```
#[track_caller]
pub fn expect_valid<T>(constructor: &str, checked: Result<T, Error>) -> T {
    match checked {
        Ok(value) => value,
        Err(e) => panic!("{constructor}: {e}"),
    }
}
