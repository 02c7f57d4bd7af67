//! The header families a [`QuotaServer`](super::QuotaServer) answers in,
//! written from one [`Reading`] of the quota (plain functions, no I/O).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

/// The rate-limit header family every response of a
/// [`QuotaServer`](super::QuotaServer) carries. See the
/// [module docs](super#header-families) for the exact output of each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderFamily {
    /// No rate-limit header at all (a 429 still carries `Retry-After`
    /// when [`retry_after`](super::QuotaServerBuilder::retry_after) is on).
    #[default]
    None,
    /// IETF `draft-ietf-httpapi-ratelimit-headers-10`: `RateLimit-Policy`
    /// and `RateLimit` structured fields (requests only; the draft has no
    /// token unit).
    Ietf,
    /// The draft's older form: `RateLimit-Limit`, `RateLimit-Remaining`,
    /// `RateLimit-Reset` (delta seconds).
    Legacy,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
    /// (delta seconds).
    XRateLimit,
    /// GitHub's form: `X-RateLimit-Limit`, `-Remaining`, `-Used`,
    /// `-Resource: core` and `-Reset` in epoch seconds.
    GitHub,
    /// OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
    /// resets as Go durations (`6m0s`, `1.5s`, `12ms`).
    OpenAi,
    /// Anthropic:
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
    /// resets as RFC 3339 times.
    Anthropic,
    /// Azure OpenAI: `x-ratelimit-remaining-{requests,tokens}`, and on a
    /// 429 `retry-after-ms` beside `Retry-After`.
    Azure,
}

/// One dimension of the quota as a response reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dim {
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    /// Time from the response to the dimension's reset.
    pub(crate) reset: Duration,
    /// The length of its window.
    pub(crate) window: Duration,
}

/// What one response says about the quota.
#[derive(Clone, Debug)]
pub(crate) struct Reading {
    pub(crate) requests: Option<Dim>,
    pub(crate) tokens: Option<Dim>,
    pub(crate) input: Option<Dim>,
    pub(crate) output: Option<Dim>,
    pub(crate) daily: Option<Dim>,
    /// `Some` on a 429: how long until the quota that refused comes back.
    pub(crate) retry_after: Option<Duration>,
    /// The wall-clock time of the response (server start's wall clock
    /// plus the `tokio::time` elapsed since start).
    pub(crate) wall: SystemTime,
}

impl Reading {
    /// The requests dimension a single-dimension family reports: the more
    /// restrictive of the window's and the daily quota (fewer remaining;
    /// on a tie, the later reset).
    fn binding_requests(&self) -> Option<Dim> {
        match (self.requests, self.daily) {
            (Some(w), Some(d)) => {
                if (d.remaining, w.reset) < (w.remaining, d.reset) {
                    Some(d)
                } else {
                    Some(w)
                }
            }
            (w, d) => w.or(d),
        }
    }
}

/// Seconds rounded up: a reset is never reported earlier than it is.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Milliseconds rounded up.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let up = ms + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(up).unwrap_or(u64::MAX)
}

/// `d` as Go's `time.Duration.String()` writes it, after rounding up to
/// whole milliseconds: `0s`, `12ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = ceil_millis(d);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (secs, frac) = (ms / 1000, ms % 1000);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let s = if frac == 0 {
        s.to_string()
    } else {
        let frac = format!("{frac:03}");
        format!("{s}.{}", frac.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// `at` in RFC 3339, UTC, rounded up to the millisecond; the fraction is
/// written only when it is not zero (`2025-01-01T00:00:00Z`,
/// `2025-01-01T00:00:00.25Z`).
pub(crate) fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = ceil_millis(since);
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    let odt = time::OffsetDateTime::from(at);
    odt.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Epoch seconds of `at`, rounded up.
fn epoch_secs(at: SystemTime) -> u64 {
    ceil_secs(at.duration_since(UNIX_EPOCH).unwrap_or_default())
}

fn put(headers: &mut HeaderMap, name: &'static str, value: impl ToString) {
    if let Ok(value) = HeaderValue::try_from(value.to_string()) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// Writes the family's headers for `reading` into `headers`, and
/// `Retry-After` (plus Azure's `retry-after-ms`) when the reading is a
/// refusal and `retry_after` is on. `policy` is the IETF policy name,
/// already checked to be a valid structured-field string.
pub(crate) fn render(
    family: HeaderFamily,
    reading: &Reading,
    policy: &str,
    retry_after: bool,
    headers: &mut HeaderMap,
) {
    if let (Some(wait), true) = (reading.retry_after, retry_after) {
        headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(wait)));
        if family == HeaderFamily::Azure {
            put(headers, "retry-after-ms", ceil_millis(wait));
        }
    }
    match family {
        HeaderFamily::None => {}
        HeaderFamily::Ietf => ietf(reading, policy, headers),
        HeaderFamily::Legacy => {
            if let Some(d) = reading.binding_requests() {
                put(headers, "ratelimit-limit", d.limit);
                put(headers, "ratelimit-remaining", d.remaining);
                put(headers, "ratelimit-reset", ceil_secs(d.reset));
            }
        }
        HeaderFamily::XRateLimit => {
            if let Some(d) = reading.binding_requests() {
                put(headers, "x-ratelimit-limit", d.limit);
                put(headers, "x-ratelimit-remaining", d.remaining);
                put(headers, "x-ratelimit-reset", ceil_secs(d.reset));
            }
        }
        HeaderFamily::GitHub => {
            if let Some(d) = reading.binding_requests() {
                put(headers, "x-ratelimit-limit", d.limit);
                put(headers, "x-ratelimit-remaining", d.remaining);
                put(
                    headers,
                    "x-ratelimit-used",
                    d.limit.saturating_sub(d.remaining),
                );
                put(headers, "x-ratelimit-resource", "core");
                put(
                    headers,
                    "x-ratelimit-reset",
                    epoch_secs(reading.wall + d.reset),
                );
            }
        }
        HeaderFamily::OpenAi => {
            if let Some(d) = reading.binding_requests() {
                put(headers, "x-ratelimit-limit-requests", d.limit);
                put(headers, "x-ratelimit-remaining-requests", d.remaining);
                put(headers, "x-ratelimit-reset-requests", go_duration(d.reset));
            }
            if let Some(d) = reading.tokens {
                put(headers, "x-ratelimit-limit-tokens", d.limit);
                put(headers, "x-ratelimit-remaining-tokens", d.remaining);
                put(headers, "x-ratelimit-reset-tokens", go_duration(d.reset));
            }
        }
        HeaderFamily::Anthropic => {
            let dims: [(Option<Dim>, [&'static str; 3]); 4] = [
                (
                    reading.binding_requests(),
                    [
                        "anthropic-ratelimit-requests-limit",
                        "anthropic-ratelimit-requests-remaining",
                        "anthropic-ratelimit-requests-reset",
                    ],
                ),
                (
                    reading.tokens,
                    [
                        "anthropic-ratelimit-tokens-limit",
                        "anthropic-ratelimit-tokens-remaining",
                        "anthropic-ratelimit-tokens-reset",
                    ],
                ),
                (
                    reading.input,
                    [
                        "anthropic-ratelimit-input-tokens-limit",
                        "anthropic-ratelimit-input-tokens-remaining",
                        "anthropic-ratelimit-input-tokens-reset",
                    ],
                ),
                (
                    reading.output,
                    [
                        "anthropic-ratelimit-output-tokens-limit",
                        "anthropic-ratelimit-output-tokens-remaining",
                        "anthropic-ratelimit-output-tokens-reset",
                    ],
                ),
            ];
            for (dim, [limit, remaining, reset]) in dims {
                if let Some(d) = dim {
                    put(headers, limit, d.limit);
                    put(headers, remaining, d.remaining);
                    put(headers, reset, rfc3339(reading.wall + d.reset));
                }
            }
        }
        HeaderFamily::Azure => {
            if let Some(d) = reading.binding_requests() {
                put(headers, "x-ratelimit-remaining-requests", d.remaining);
            }
            if let Some(d) = reading.tokens {
                put(headers, "x-ratelimit-remaining-tokens", d.remaining);
            }
        }
    }
}

fn ietf(reading: &Reading, policy: &str, headers: &mut HeaderMap) {
    let mut policies = Vec::new();
    let mut states = Vec::new();
    let named = [(policy, reading.requests), ("daily", reading.daily)];
    for (name, dim) in named {
        if let Some(d) = dim {
            policies.push(format!(
                "\"{name}\";q={};w={}",
                d.limit,
                ceil_secs(d.window)
            ));
            states.push(format!(
                "\"{name}\";r={};t={}",
                d.remaining,
                ceil_secs(d.reset)
            ));
        }
    }
    if !policies.is_empty() {
        put(headers, "ratelimit-policy", policies.join(", "));
        put(headers, "ratelimit", states.join(", "));
    }
}

/// Whether `name` can be written as a structured-field string without
/// escapes (printable ASCII, no `"` or `\`), and is not empty.
pub(crate) fn valid_policy_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_as_go_writes_them() {
        let ms = Duration::from_millis;
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (ms(12), "12ms"),
            (Duration::from_micros(11_500), "12ms"),
            (ms(999), "999ms"),
            (ms(1000), "1s"),
            (ms(1500), "1.5s"),
            (ms(1250), "1.25s"),
            (ms(59_999), "59.999s"),
            (ms(360_000), "6m0s"),
            (ms(61_500), "1m1.5s"),
            (ms(3_600_000), "1h0m0s"),
            (ms(86_400_000), "24h0m0s"),
        ] {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn rfc3339_whole_seconds_and_milliseconds() {
        let at = UNIX_EPOCH + Duration::from_secs(1_735_689_600);
        assert_eq!(rfc3339(at), "2025-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(at + Duration::from_millis(250)),
            "2025-01-01T00:00:00.25Z"
        );
        assert_eq!(
            rfc3339(at + Duration::from_micros(1)),
            "2025-01-01T00:00:00.001Z"
        );
    }

    #[test]
    fn rounding_is_up() {
        assert_eq!(ceil_secs(Duration::from_millis(200)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
        assert_eq!(ceil_millis(Duration::from_millis(7)), 7);
    }

    #[test]
    fn policy_names() {
        assert!(valid_policy_name("burst"));
        assert!(valid_policy_name("per minute"));
        assert!(!valid_policy_name(""));
        assert!(!valid_policy_name("a\"b"));
        assert!(!valid_policy_name("a\\b"));
        assert!(!valid_policy_name("é"));
    }
}
