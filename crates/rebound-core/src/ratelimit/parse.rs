//! Reading a response's rate-limit headers: one parser per header family,
//! merged into one [`Reading`].
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use http::{HeaderMap, StatusCode};
//! use rebound_core::ratelimit::parse::{read, Dimension, Precision};
//!
//! let mut h = HeaderMap::new();
//! // OpenAI's documented example.
//! h.insert("x-ratelimit-limit-requests", "60".parse().unwrap());
//! h.insert("x-ratelimit-remaining-requests", "59".parse().unwrap());
//! h.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
//! h.insert("x-ratelimit-limit-tokens", "150000".parse().unwrap());
//! h.insert("x-ratelimit-remaining-tokens", "149984".parse().unwrap());
//! h.insert("x-ratelimit-reset-tokens", "6m0s".parse().unwrap());
//!
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
//! let reading = read(&h, StatusCode::OK, now);
//! let tokens = reading.get(Dimension::Tokens).unwrap();
//! assert_eq!(tokens.remaining, Some(149_984));
//! assert_eq!(tokens.reset, Some(Duration::from_secs(360)));
//! assert_eq!(tokens.precision, Precision::Milliseconds);
//! assert_eq!(reading.get(Dimension::Requests).unwrap().limit, Some(60));
//! ```
//!
//! # The families
//!
//! | family | headers | reset | precision |
//! |---|---|---|---|
//! | IETF `draft-ietf-httpapi-ratelimit-headers-10` | `RateLimit-Policy: "burst";q=100;w=60`, `RateLimit: "burst";r=50;t=30` (structured-field lists; the policy name a quoted string, or a token as before -10; `q` quota, `qu` unit, `w` window, `pk` partition key, `r` remaining, `t` seconds to reset) | delta seconds | seconds |
//! | legacy IETF | `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` | delta seconds | seconds |
//! | `X-RateLimit-*` | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` | delta seconds, or epoch seconds (GitHub): see below | seconds (milliseconds with a fraction) |
//! | OpenAI (and Azure OpenAI, which sends a subset) | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` | Go duration (`1s`, `6m0s`, `12ms`, `1h2m3.5s`) | milliseconds |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}` | RFC 3339 time (`2024-05-01T12:00:30Z`) | seconds (milliseconds with a fraction) |
//! | server pauses | `Retry-After` (on a 429 only: a 503's is about its request, see the gate), `retry-after-ms`, `x-ms-retry-after-ms` (Azure) | delta seconds or HTTP-date; milliseconds | — |
//! | the server's word on retrying (the classifier acts on it: [`HttpClassifier`](crate::classify::HttpClassifier)) | `x-should-retry: true` / `false` | — | — |
//!
//! Only IETF policies counted in requests (`qu` absent or `"requests"`)
//! are read; `content-bytes` and `concurrent-requests` policies are not
//! windows of requests and are skipped.
//!
//! **`X-RateLimit-Reset`: delta or epoch, by magnitude.** A value of at
//! least 1,000,000,000 (September 2001 as a Unix time, and 31 years as a
//! delay) is an epoch time in seconds, as GitHub sends it, and becomes the
//! time from `now` to it (zero if past); a smaller value is delta seconds.
//!
//! # Several families, several policies
//!
//! Per dimension, when several families (or several IETF policies) speak:
//! the **most restrictive remaining** count wins (the smallest; the limit
//! likewise), and the **most precise reset** wins (an OpenAI reset in
//! milliseconds over an IETF `t` in whole seconds); between resets of equal
//! precision, the later one. Among several IETF policies, the one with the
//! fewest requests remaining is kept (the later reset on a tie), with its
//! partition key.
//!
//! # Bad input
//!
//! A value that is malformed (not the family's grammar), negative, huge (a
//! count over 2⁶³, a reset over [`MAX_RESET`], a number over 15 digits in
//! a structured field), or duplicated (the header more than once, or
//! `5, 6` where one number is expected) is ignored — that header only —
//! with a DEBUG event on target `rebound::ratelimit` naming the header and
//! why, never its value. Nothing here panics.
//!
//! # Cost
//!
//! [`read`] walks the header names once; a response without any rate-limit
//! header costs that walk (a few comparisons per header) and nothing else.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};

/// The largest reset a header may announce: 366 days. A longer one is
/// ignored as bad input.
pub const MAX_RESET: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// At or above this, an `X-RateLimit-Reset` is an epoch time in seconds.
pub const EPOCH_THRESHOLD: u64 = 1_000_000_000;

/// What a quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// Requests.
    Requests,
    /// Tokens (input and output together, for an AI model API).
    Tokens,
    /// Input (prompt) tokens, where the server counts them apart.
    InputTokens,
    /// Output (completion) tokens, where the server counts them apart.
    OutputTokens,
}

impl Dimension {
    /// Every dimension, in index order.
    pub const ALL: [Dimension; 4] = [
        Dimension::Requests,
        Dimension::Tokens,
        Dimension::InputTokens,
        Dimension::OutputTokens,
    ];

    /// The dimension's place in [`Dimension::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `"requests"`, `"tokens"`, `"input_tokens"` or `"output_tokens"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
        }
    }
}

/// How finely a reset is known. Ordered: a finer precision is greater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Precision {
    /// Whole seconds (an IETF `t`, delta seconds, an epoch second).
    #[default]
    Seconds,
    /// Milliseconds or finer (a Go duration, a fractional time).
    Milliseconds,
}

impl Precision {
    /// How far off a reset of this precision may be: 1 s or 1 ms.
    pub fn granule(self) -> Duration {
        match self {
            Precision::Seconds => Duration::from_secs(1),
            Precision::Milliseconds => Duration::from_millis(1),
        }
    }
}

/// What a server said about one dimension of its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    /// The quota per window, if said.
    pub limit: Option<u64>,
    /// What is left of it, if said.
    pub remaining: Option<u64>,
    /// Time from the response to the window's reset, if said.
    pub reset: Option<Duration>,
    /// How finely `reset` is known.
    pub precision: Precision,
    /// The window's length, if said (an IETF policy's `w`).
    pub window: Option<Duration>,
}

impl Quota {
    fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset.is_none()
    }

    /// Merge `other` into `self` by the rules in the [module docs](self).
    fn merge(&mut self, other: Quota) {
        self.remaining = min_some(self.remaining, other.remaining);
        self.limit = min_some(self.limit, other.limit);
        self.window = self.window.or(other.window);
        match (self.reset, other.reset) {
            (_, None) => {}
            (None, Some(r)) => {
                self.reset = Some(r);
                self.precision = other.precision;
            }
            (Some(mine), Some(theirs)) => {
                if other.precision > self.precision
                    || (other.precision == self.precision && theirs > mine)
                {
                    self.reset = Some(theirs);
                    self.precision = other.precision;
                }
            }
        }
    }
}

fn min_some(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Everything a response said about the client's quota, per dimension,
/// and about retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    quotas: [Option<Quota>; 4],
    /// Whether any quota is set (so that `is_empty` is one test).
    said: bool,
    /// A pause the server asked for: `retry-after-ms` / `x-ms-retry-after-ms`
    /// (milliseconds; these win), else `Retry-After` on a 429 (a 503's is about its request). Wins
    /// over the rate-limit headers' resets when pacing.
    pub retry_after: Option<Duration>,
    /// The server's explicit word on retrying (`x-should-retry`).
    pub should_retry: Option<bool>,
    /// The IETF partition key (`pk`) the reading belongs to, hashed.
    pub partition: Option<u64>,
}

impl Reading {
    /// A response that said nothing: what [`read`] gives for one without a
    /// rate-limit header, as a constant (no reading made).
    pub(crate) const EMPTY: Reading = Reading {
        quotas: [None; 4],
        said: false,
        retry_after: None,
        should_retry: None,
        partition: None,
    };

    /// What the server said about `dimension`, if anything.
    pub fn get(&self, dimension: Dimension) -> Option<&Quota> {
        self.quotas[dimension.index()].as_ref()
    }

    /// Every dimension the server spoke of.
    pub fn quotas(&self) -> impl Iterator<Item = (Dimension, &Quota)> {
        Dimension::ALL
            .into_iter()
            .zip(self.quotas.iter())
            .filter_map(|(d, q)| q.as_ref().map(|q| (d, q)))
    }

    /// Whether the response said nothing about quotas or retrying.
    pub fn is_empty(&self) -> bool {
        !self.said && self.retry_after.is_none() && self.should_retry.is_none()
    }

    /// Whether the response named any quota (limit, remaining or reset of
    /// some dimension), beyond a pause or the word on retrying.
    pub(crate) fn has_quota(&self) -> bool {
        self.said
    }

    /// Merge `quota` for `dimension` into the reading (the rules of the
    /// [module docs](self)).
    pub fn merge(&mut self, dimension: Dimension, quota: Quota) {
        if quota.is_empty() {
            return;
        }
        self.said = true;
        match &mut self.quotas[dimension.index()] {
            Some(mine) => mine.merge(quota),
            slot => *slot = Some(quota),
        }
    }

    /// The smallest remaining count over every dimension, and its
    /// dimension: what the tracing fields show.
    pub fn tightest(&self) -> Option<(Dimension, Quota)> {
        if !self.said {
            return None;
        }
        self.quotas()
            .filter(|(_, q)| q.remaining.is_some())
            .min_by_key(|(_, q)| q.remaining)
            .map(|(d, q)| (d, *q))
    }
}

// ===== the one entry point =====

/// The header names read, by slot.
const NAMES: [&str; 30] = [
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "retry-after",
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "x-should-retry",
    "ratelimit",
    "ratelimit-policy",
];

const LEGACY: usize = 0;
const X: usize = 3;
const OPENAI: usize = 6;
const ANTHROPIC: usize = 12;
const RETRY_AFTER: usize = 24;
const RETRY_AFTER_MS: usize = 25;
const X_MS_RETRY_AFTER_MS: usize = 26;
const SHOULD_RETRY: usize = 27;
const IETF: usize = 28;
const IETF_POLICY: usize = 29;

/// The response's rate-limit headers, found in one walk over its headers
/// (no look-up by name, which would parse and hash each name): per slot
/// of [`NAMES`], its value, and bits for present and repeated.
struct Fields<'a> {
    headers: &'a HeaderMap,
    values: [Option<&'a HeaderValue>; NAMES.len()],
    present: u32,
    many: u32,
}

/// The slot of a header name, if it is one we read. Names that cannot be
/// are told apart by their first bytes, before any comparison with the
/// table.
#[inline]
fn slot_of(n: &str) -> Option<usize> {
    if !may_be_ours(n.as_bytes()) {
        return None;
    }
    NAMES.iter().position(|k| *k == n)
}

/// Whether a header name may be one of [`NAMES`]: its length and first
/// bytes (every name in the table passes; most others fail on the first
/// byte, without a comparison with the table).
#[inline(always)]
fn may_be_ours(b: &[u8]) -> bool {
    if b.len() < 9 {
        return false;
    }
    match b[0] {
        b'r' => b.starts_with(b"ratelimit") || b.starts_with(b"retry-after"),
        b'x' => {
            b.starts_with(b"x-ratelimit-") || b == b"x-ms-retry-after-ms" || b == b"x-should-retry"
        }
        b'a' => b.starts_with(b"anthropic-ratelimit-"),
        _ => false,
    }
}

/// Whether `headers` hold any header a reader reads: one pass over the
/// names, each turned away by its first bytes (see [`slot_of`]) — all a
/// response without rate-limit headers costs.
#[inline]
pub(crate) fn has_fields(headers: &HeaderMap) -> bool {
    // A name that passes the first bytes is nearly always ours (the
    // reader looks it up in the table); no table search here.
    headers
        .keys()
        .any(|name| may_be_ours(name.as_str().as_bytes()))
}

impl<'a> Fields<'a> {
    #[inline]
    fn of(headers: &'a HeaderMap) -> Fields<'a> {
        let mut f = Fields {
            headers,
            values: [None; NAMES.len()],
            present: 0,
            many: 0,
        };
        for (name, value) in headers {
            let Some(i) = slot_of(name.as_str()) else {
                continue;
            };
            let bit = 1u32 << i;
            if f.present & bit != 0 {
                f.many |= bit;
            }
            f.present |= bit;
            f.values[i] = Some(value);
        }
        f
    }

    /// Whether any slot in `from..to` is present.
    fn has(&self, from: usize, to: usize) -> bool {
        let mask = ((1u32 << (to - from)) - 1) << from;
        self.present & mask != 0
    }

    /// Slot `i`'s one value: `Err(())` when repeated.
    fn value(&self, i: usize) -> Option<Result<&'a HeaderValue, ()>> {
        let v = self.values[i]?;
        Some(if self.many & (1 << i) != 0 {
            Err(())
        } else {
            Ok(v)
        })
    }
}

/// Read every family from `headers` into one [`Reading`] (merged by the
/// rules of the [module docs](self)). `status` decides whether
/// `Retry-After` counts (on a 429 only); `now` is the wall clock, for
/// epoch and RFC 3339 resets.
///
/// A cached response's fields describe the origin when it answered, not
/// now: callers skip responses with an `Age` header and 304s (the
/// [pacer](super) does; see [`is_cached`]).
pub fn read(headers: &HeaderMap, status: StatusCode, now: SystemTime) -> Reading {
    read_with(headers, status, || now)
}

/// [`read`] with the wall clock read only if a header needs it (an epoch
/// or RFC 3339 reset, an HTTP-date `Retry-After`).
pub(crate) fn read_with(
    headers: &HeaderMap,
    status: StatusCode,
    now: impl Fn() -> SystemTime,
) -> Reading {
    let f = Fields::of(headers);
    let mut reading = Reading::default();
    if f.present == 0 {
        return reading;
    }
    if f.has(IETF, IETF_POLICY + 1) {
        ietf(f.headers, &mut reading);
    }
    if f.has(LEGACY, X) {
        legacy(&f, &mut reading);
    }
    if f.has(X, OPENAI) {
        x_ratelimit(&f, &now, &mut reading);
    }
    if f.has(OPENAI, ANTHROPIC) {
        openai(&f, &mut reading);
    }
    if f.has(ANTHROPIC, RETRY_AFTER) {
        anthropic(&f, &now, &mut reading);
    }
    if f.has(RETRY_AFTER, SHOULD_RETRY) {
        reading.retry_after = retry_after(&f, status, &now);
    }
    if f.has(SHOULD_RETRY, SHOULD_RETRY + 1) {
        reading.should_retry = should_retry(&f);
    }
    reading
}

/// Whether a response is a cached copy whose rate-limit fields are stale:
/// it has an `Age` header, or is a 304.
pub fn is_cached(status: StatusCode, headers: &HeaderMap) -> bool {
    status == StatusCode::NOT_MODIFIED || headers.contains_key(http::header::AGE)
}

// ===== bad input =====

fn bad(header: &'static str, why: &'static str) {
    tracing::debug!(
        target: "rebound::ratelimit",
        header,
        why,
        "rate-limit header ignored"
    );
}

/// Optional white space off both ends.
fn trim_ows(s: &str) -> &str {
    let b = s.as_bytes();
    let start = b
        .iter()
        .position(|c| *c != b' ' && *c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| *c != b' ' && *c != b'\t')
        .map_or(start, |i| i + 1);
    &s[start..end]
}

/// The one value of slot `i`, or `None` (absent; or duplicated, with a
/// DEBUG event).
fn single<'a>(f: &Fields<'a>, i: usize) -> Option<&'a str> {
    let Ok(value) = f.value(i)? else {
        bad(NAMES[i], "duplicated");
        return None;
    };
    match value.to_str() {
        Ok(s) => Some(trim_ows(s)),
        Err(_) => {
            bad(NAMES[i], "not visible ASCII");
            None
        }
    }
}

/// A count: ASCII digits only, at most 2⁶³ − 1.
fn count(f: &Fields<'_>, i: usize) -> Option<u64> {
    let text = single(f, i)?;
    match parse_count(text) {
        Some(n) => Some(n),
        None => {
            bad(NAMES[i], "not a count");
            None
        }
    }
}

fn parse_count(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for b in text.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        // 19 digits fit in a u64.
        n = n * 10 + u64::from(b - b'0');
    }
    (n <= i64::MAX as u64).then_some(n)
}

/// `digits` or `digits.digits` as a duration in seconds (no sign, no
/// exponent); the precision says whether a fraction was given.
fn parse_decimal_seconds(text: &str) -> Option<(Duration, Precision)> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    if int.is_empty() || int.len() > 12 || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = int.parse().ok()?;
    let (nanos, precision) = match frac {
        None => (0, Precision::Seconds),
        Some(f) => (fraction_nanos(f)?, Precision::Milliseconds),
    };
    Some((Duration::new(secs, nanos), precision))
}

/// The digits after a decimal point as nanoseconds (1 to 9 digits used,
/// more ignored; at least one digit).
fn fraction_nanos(f: &str) -> Option<u32> {
    if f.is_empty() || f.len() > 18 || !f.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut nanos = 0u32;
    for (i, b) in f.bytes().take(9).enumerate() {
        nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
    }
    Some(nanos)
}

fn within_max(header: &'static str, d: Duration) -> Option<Duration> {
    if d > MAX_RESET {
        bad(header, "reset too far away");
        None
    } else {
        Some(d)
    }
}

// ===== IETF draft-ietf-httpapi-ratelimit-headers-10 =====

/// One member of a structured-field list: its name (the bare item, a
/// String or a Token) and the parameters we read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Member {
    name: String,
    q: Option<u64>,
    qu: Option<String>,
    w: Option<u64>,
    r: Option<u64>,
    t: Option<u64>,
    pk: Option<u64>,
}

/// A parameter's value.
enum Bare {
    Integer(i64),
    Text(String),
    Bytes(u64),
    Other,
}

/// A strict parser for the subset of RFC 9651 (Structured Field Values)
/// the two fields use: a List of Items, each a String or Token with
/// Parameters whose values are Integers, Strings, Tokens, Byte Sequences,
/// Booleans or Decimals. Inner lists and anything else fail the field.
struct Sf<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Sf<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    fn list(mut self) -> Option<Vec<Member>> {
        let mut out = Vec::new();
        self.sp();
        if self.peek().is_none() {
            return Some(out);
        }
        loop {
            out.push(self.member()?);
            if out.len() > 32 {
                return None;
            }
            self.ows();
            match self.peek() {
                None => return Some(out),
                Some(b',') => {
                    self.i += 1;
                    self.ows();
                    self.peek()?; // a trailing comma is an error
                }
                Some(_) => return None,
            }
        }
    }

    fn member(&mut self) -> Option<Member> {
        let name = match self.bare()? {
            Bare::Text(name) => name,
            _ => return None,
        };
        let mut m = Member {
            name,
            ..Member::default()
        };
        while self.peek() == Some(b';') {
            self.i += 1;
            self.sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.i += 1;
                self.bare()?
            } else {
                Bare::Other // boolean true
            };
            let int = |v: &Bare| match v {
                Bare::Integer(n) if *n >= 0 => Some(*n as u64),
                _ => None,
            };
            // Unknown parameters are ignored, as RFC 9651 asks; a known one
            // of the wrong type fails the member.
            match key {
                "q" => m.q = Some(int(&value)?),
                "w" => m.w = Some(int(&value)?),
                "r" => m.r = Some(int(&value)?),
                "t" => m.t = Some(int(&value)?),
                "qu" => match value {
                    Bare::Text(u) => m.qu = Some(u),
                    _ => return None,
                },
                "pk" => match value {
                    Bare::Bytes(h) => m.pk = Some(h),
                    _ => return None,
                },
                _ => {}
            }
        }
        Some(m)
    }

    fn key(&mut self) -> Option<&'a str> {
        let start = self.i;
        match self.peek() {
            Some(b'a'..=b'z' | b'*') => self.i += 1,
            _ => return None,
        }
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i]).ok()
    }

    fn bare(&mut self) -> Option<Bare> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string().map(Bare::Text),
            b':' => self.bytes(),
            b'?' => {
                self.i += 1;
                match self.peek()? {
                    b'0' | b'1' => {
                        self.i += 1;
                        Some(Bare::Other)
                    }
                    _ => None,
                }
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'*' => self.token().map(Bare::Text),
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Bare> {
        let neg = self.peek() == Some(b'-');
        if neg {
            self.i += 1;
        }
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 {
            return None;
        }
        if self.peek() == Some(b'.') {
            // A Decimal: 12 integer digits, 1 to 3 fractional ones.
            if digits > 12 {
                return None;
            }
            self.i += 1;
            let f = self.i;
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
            return (1..=3).contains(&(self.i - f)).then_some(Bare::Other);
        }
        if digits > 15 {
            return None;
        }
        let n: i64 = std::str::from_utf8(&self.s[start..self.i])
            .ok()?
            .parse()
            .ok()?;
        Some(Bare::Integer(if neg { -n } else { n }))
    }

    fn string(&mut self) -> Option<String> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let c = self.peek()?;
            self.i += 1;
            match c {
                b'"' => return Some(out),
                b'\\' => {
                    let e = self.peek()?;
                    if e != b'"' && e != b'\\' {
                        return None;
                    }
                    self.i += 1;
                    out.push(e as char);
                }
                0x20..=0x7e => out.push(c as char),
                _ => return None,
            }
            if out.len() > 256 {
                return None;
            }
        }
    }

    fn token(&mut self) -> Option<String> {
        let start = self.i;
        self.i += 1;
        while matches!(
            self.peek(),
            Some(
                b'A'..=b'Z'
                | b'a'..=b'z'
                | b'0'..=b'9'
                | b'!'
                | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
                | b':'
                | b'/',
            )
        ) {
            self.i += 1;
        }
        if self.i - start > 256 {
            return None;
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()
            .map(str::to_owned)
    }

    /// A Byte Sequence, `:base64:`, kept only as a hash of its text (a
    /// partition key is an identity, never shown).
    fn bytes(&mut self) -> Option<Bare> {
        self.i += 1;
        let start = self.i;
        while matches!(
            self.peek(),
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'=')
        ) {
            self.i += 1;
        }
        if self.peek() != Some(b':') {
            return None;
        }
        let text = &self.s[start..self.i];
        self.i += 1;
        // FNV-1a: stable across processes and builds (the shared state
        // names a partition's quota in its store by it, for a fleet that
        // mixes builds), unlike `DefaultHasher`.
        let h = text.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Some(Bare::Bytes(h))
    }
}

/// The lines of a structured-field list header joined with `,` (a list may
/// be split over several lines), or `None` when absent or not ASCII.
fn sf_list(headers: &HeaderMap, name: &'static str) -> Option<Option<Vec<Member>>> {
    let mut all = headers.get_all(name).iter().peekable();
    all.peek()?;
    let mut joined = Vec::new();
    for (i, v) in all.enumerate() {
        if i > 0 {
            joined.push(b',');
        }
        joined.extend_from_slice(v.as_bytes());
    }
    let parsed = Sf { s: &joined, i: 0 }.list();
    if parsed.is_none() {
        bad(name, "not a structured-field list of policies");
    }
    Some(parsed)
}

/// Parse IETF `RateLimit-Policy` and `RateLimit` (draft-10) into the
/// requests dimension of `reading`.
fn ietf(headers: &HeaderMap, reading: &mut Reading) {
    let policies = sf_list(headers, "ratelimit-policy")
        .flatten()
        .unwrap_or_default();
    let limits = sf_list(headers, "ratelimit").flatten().unwrap_or_default();
    let counts_requests = |m: &Member| {
        m.qu.as_deref()
            .is_none_or(|u| u.eq_ignore_ascii_case("requests"))
    };
    let mut best: Option<(Quota, Option<u64>)> = None;
    for m in &limits {
        let Some(r) = m.r else {
            bad("ratelimit", "a member without r");
            continue;
        };
        let policy = policies.iter().find(|p| p.name == m.name);
        if policy.is_some_and(|p| !counts_requests(p)) {
            continue;
        }
        let Some(reset) =
            m.t.map(|t| within_max("ratelimit", Duration::from_secs(t)))
                .map_or(Some(None), |r| r.map(Some))
        else {
            continue;
        };
        let q = Quota {
            limit: policy.and_then(|p| p.q),
            remaining: Some(r),
            reset,
            precision: Precision::Seconds,
            window: policy.and_then(|p| p.w).map(Duration::from_secs),
        };
        let better = match &best {
            None => true,
            Some((b, _)) => {
                (q.remaining, std::cmp::Reverse(q.reset))
                    < (b.remaining, std::cmp::Reverse(b.reset))
            }
        };
        if better {
            best = Some((q, m.pk.or(policy.and_then(|p| p.pk))));
        }
    }
    match best {
        Some((q, pk)) => {
            reading.merge(Dimension::Requests, q);
            reading.partition = reading.partition.or(pk);
        }
        None => {
            // A policy alone says the quota and window, not what is left:
            // the smallest quota of requests.
            if let Some(p) = policies
                .iter()
                .filter(|p| counts_requests(p) && p.q.is_some())
                .min_by_key(|p| p.q)
            {
                reading.merge(
                    Dimension::Requests,
                    Quota {
                        limit: p.q,
                        window: p.w.map(Duration::from_secs),
                        ..Quota::default()
                    },
                );
                reading.partition = reading.partition.or(p.pk);
            }
        }
    }
}

// ===== legacy RateLimit-* and X-RateLimit-* =====

/// The first number of an old-draft `RateLimit-Limit` (`100` or
/// `100, 100;w=60`).
fn legacy_limit(f: &Fields<'_>, i: usize) -> Option<u64> {
    let text = single(f, i)?;
    let first = trim_ows(text.split([',', ';']).next().unwrap_or(""));
    let n = parse_count(first);
    if n.is_none() {
        bad(NAMES[i], "not a count");
    }
    n
}

fn legacy(f: &Fields<'_>, reading: &mut Reading) {
    let reset = single(f, LEGACY + 2).and_then(|t| match parse_count(t) {
        Some(s) => within_max(NAMES[LEGACY + 2], Duration::from_secs(s)),
        None => {
            bad(NAMES[LEGACY + 2], "not delta seconds");
            None
        }
    });
    reading.merge(
        Dimension::Requests,
        Quota {
            limit: legacy_limit(f, LEGACY),
            remaining: count(f, LEGACY + 1),
            reset,
            precision: Precision::Seconds,
            window: None,
        },
    );
}

fn x_ratelimit(f: &Fields<'_>, now: &dyn Fn() -> SystemTime, reading: &mut Reading) {
    let name = NAMES[X + 2];
    let reset = single(f, X + 2).and_then(|t| {
        let Some((value, precision)) = parse_decimal_seconds(t) else {
            bad(name, "not seconds");
            return None;
        };
        let delta = if value.as_secs() >= EPOCH_THRESHOLD {
            let at = SystemTime::UNIX_EPOCH.checked_add(value)?;
            at.duration_since(now()).unwrap_or(Duration::ZERO)
        } else {
            value
        };
        within_max(name, delta).map(|d| (d, precision))
    });
    reading.merge(
        Dimension::Requests,
        Quota {
            limit: legacy_limit(f, X),
            remaining: count(f, X + 1),
            reset: reset.map(|r| r.0),
            precision: reset.map_or(Precision::Seconds, |r| r.1),
            window: None,
        },
    );
}

// ===== OpenAI (and Azure OpenAI) =====

/// Parse a Go duration (`time.Duration.String()` and what `ParseDuration`
/// accepts, without a sign): `0`, `1s`, `6m0s`, `12ms`, `1h2m3.5s`, `1.5µs`.
/// Units `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`; each number may carry a
/// fraction. `None` for anything else, a negative value, or more than
/// [`MAX_RESET`].
///
/// ```
/// use std::time::Duration;
/// use rebound_core::ratelimit::parse::parse_go_duration;
///
/// assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
/// assert_eq!(parse_go_duration("12ms"), Some(Duration::from_millis(12)));
/// assert_eq!(parse_go_duration("1h2m3.5s"), Some(Duration::from_millis(3_723_500)));
/// assert_eq!(parse_go_duration("-1s"), None);
/// assert_eq!(parse_go_duration("1"), None);
/// ```
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    let mut rest = text;
    let mut total: u128 = 0; // nanoseconds
    while !rest.is_empty() {
        let int_end = rest
            .bytes()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(rest.len());
        let int = &rest[..int_end];
        rest = &rest[int_end..];
        let mut frac = "";
        if let Some(r) = rest.strip_prefix('.') {
            let end = r
                .bytes()
                .position(|b| !b.is_ascii_digit())
                .unwrap_or(r.len());
            frac = &r[..end];
            rest = &r[end..];
            if frac.is_empty() && int.is_empty() {
                return None;
            }
        }
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let unit_end = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let per: u128 = match &rest[..unit_end] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_end..];
        if int.len() > 20 {
            return None;
        }
        let whole: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        let mut part = whole.checked_mul(per)?;
        // The fraction, to the nanosecond.
        let mut scale = per;
        for b in frac.bytes().take(18) {
            scale /= 10;
            part += u128::from(b - b'0') * scale;
        }
        total = total.checked_add(part)?;
        if total > MAX_RESET.as_nanos() {
            return None;
        }
    }
    let secs = (total / 1_000_000_000) as u64;
    Some(Duration::new(secs, (total % 1_000_000_000) as u32))
}

fn openai(f: &Fields<'_>, reading: &mut Reading) {
    for (dimension, at) in [
        (Dimension::Requests, OPENAI),
        (Dimension::Tokens, OPENAI + 3),
    ] {
        if !f.has(at, at + 3) {
            continue;
        }
        let reset = single(f, at + 2).and_then(|t| {
            let d = parse_go_duration(t);
            if d.is_none() {
                bad(NAMES[at + 2], "not a Go duration within the cap");
            }
            d
        });
        reading.merge(
            dimension,
            Quota {
                limit: count(f, at),
                remaining: count(f, at + 1),
                reset,
                precision: Precision::Milliseconds,
                window: None,
            },
        );
    }
}

// ===== Anthropic =====

/// Parse an RFC 3339 date-time (`2024-05-01T12:00:30Z`,
/// `2024-05-01T12:00:30.250+02:00`; `T`/`t`, `Z`/`z` or a numeric offset;
/// a leap second reads as second 59). `None` for anything else, or a time
/// before 1970. The second value says whether a fraction was given.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use rebound_core::ratelimit::parse::parse_rfc3339;
///
/// let (t, _) = parse_rfc3339("2001-09-09T01:46:40Z").unwrap();
/// assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000));
/// assert!(parse_rfc3339("2001-02-29T00:00:00Z").is_none());
/// ```
pub fn parse_rfc3339(text: &str) -> Option<(SystemTime, Precision)> {
    let b = text.as_bytes();
    if b.len() < 20 || b.len() > 40 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = b.get(r)?;
        if !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(s.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let year = num(0..4)?;
    let month = num(5..7)?;
    let day = num(8..10)?;
    let hour = num(11..13)?;
    let minute = num(14..16)?;
    let second = num(17..19)?.min(59);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' {
        return None;
    }
    if b[16] != b':' {
        return None;
    }
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || num(17..19)? > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    let mut precision = Precision::Seconds;
    if b[i] == b'.' {
        let start = i + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        nanos = fraction_nanos(&text[start..end])?;
        precision = Precision::Milliseconds;
        i = end;
    }
    let offset: i64 = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let oh = i64::from((h1 - b'0') * 10 + (h2 - b'0'));
            let om = i64::from((m1 - b'0') * 10 + (m2 - b'0'));
            if oh > 23 || om > 59 {
                return None;
            }
            let off = oh * 3600 + om * 60;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second)
        - offset;
    let secs = u64::try_from(secs).ok()?;
    let at = SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))?;
    Some((at, precision))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400) => {
            29
        }
        _ => 28,
    }
}

/// Days from 1970-01-01 to the given civil date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn anthropic(f: &Fields<'_>, now: &dyn Fn() -> SystemTime, reading: &mut Reading) {
    for (k, dimension) in Dimension::ALL.into_iter().enumerate() {
        let at = ANTHROPIC + 3 * k;
        if !f.has(at, at + 3) {
            continue;
        }
        let reset = single(f, at + 2).and_then(|t| match parse_rfc3339(t) {
            Some((when, precision)) => {
                let d = when.duration_since(now()).unwrap_or(Duration::ZERO);
                within_max(NAMES[at + 2], d).map(|d| (d, precision))
            }
            None => {
                bad(NAMES[at + 2], "not an RFC 3339 time");
                None
            }
        });
        reading.merge(
            dimension,
            Quota {
                limit: count(f, at),
                remaining: count(f, at + 1),
                reset: reset.map(|r| r.0),
                precision: reset.map_or(Precision::Seconds, |r| r.1),
                window: None,
            },
        );
    }
}

// ===== pauses and the word on retrying =====

fn retry_after(
    f: &Fields<'_>,
    status: StatusCode,
    now: &dyn Fn() -> SystemTime,
) -> Option<Duration> {
    for i in [RETRY_AFTER_MS, X_MS_RETRY_AFTER_MS] {
        if let Some(ms) = count(f, i) {
            return within_max(NAMES[i], Duration::from_millis(ms));
        }
    }
    // A 503's Retry-After is about that request (a path down, a restart),
    // not the host's quota: the Retry-After gate holds it per path unless
    // asked (`close_on_503`). Only a 429's pauses the host here.
    if status != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let Ok(value) = f.value(RETRY_AFTER)? else {
        bad("retry-after", "duplicated");
        return None;
    };
    match crate::retry_after::parse_retry_after(value, now()) {
        Some(d) => within_max("retry-after", d),
        None => {
            bad("retry-after", "not delta seconds or an HTTP-date");
            None
        }
    }
}

fn should_retry(f: &Fields<'_>) -> Option<bool> {
    let text = single(f, SHOULD_RETRY)?;
    if text.eq_ignore_ascii_case("true") {
        Some(true)
    } else if text.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        bad("x-should-retry", "not true or false");
        None
    }
}

#[cfg(test)]
mod tests;
