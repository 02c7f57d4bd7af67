//! Redaction: what of a request may ever be shown.
//!
//! A URL is shown as `scheme://host[:port]/path` only: never its userinfo,
//! query string or fragment. Header values are never shown, except those on
//! an explicit allow-list (see the trace layer).
//!
//! ```
//! use rebound_core::redact::RedactedUri;
//!
//! let uri: http::Uri = "https://me:pw@api.example.com/v1/chat?api_key=s3cret".parse().unwrap();
//! assert_eq!(RedactedUri::new(&uri).to_string(), "https://api.example.com/v1/chat");
//! ```
//!
//! # Paths
//!
//! The path is shown by default (OpenTelemetry's `url.path`). An API that
//! puts a secret in the path (`/v1/keys/<secret>`) sets a
//! [`PathRedaction`]: hidden, templated (`/v1/keys/{key}`), or rewritten by
//! a closure. It is **one setting**, given to the trace layer
//! ([`TraceBuilder::path_redaction`](crate::trace::TraceBuilder::path_redaction))
//! or to the ready-made client, and used by everything that shows a path:
//! the spans' `url.path`, the events' `url.path`, and the URL in the
//! `Display` and `Debug` of every [`Error`](crate::Error) that leaves
//! through the trace layers.
//!
//! ```
//! use rebound_core::redact::{PathRedaction, RedactedUri};
//!
//! let uri: http::Uri = "https://api.example.com/v1/keys/sk-s3cret".parse().unwrap();
//! let keys = PathRedaction::templates(["/v1/keys/{key}"]);
//! let shown = RedactedUri::new(&uri).with_path_redaction(&keys);
//! assert_eq!(shown.to_string(), "https://api.example.com/v1/keys/{key}");
//! ```

use std::borrow::Cow;
use std::fmt;

use std::sync::Arc;

use http::header::{self, Entry, HeaderMap, HeaderName};
use http::uri::{Authority, Scheme};
use http::Uri;

/// A URL with its userinfo, query and fragment removed; safe to log, once
/// its path is redacted too if the path can hold a secret
/// ([`with_path_redaction`](Self::with_path_redaction)).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RedactedUri {
    scheme: Option<Scheme>,
    host: Option<String>,
    port: Option<u16>,
    path: String,
    /// Whether a [`PathRedaction`] other than the default was applied.
    path_redacted: bool,
}

impl RedactedUri {
    /// Redact `uri`.
    pub fn new(uri: &Uri) -> Self {
        RedactedUri {
            scheme: uri.scheme().cloned(),
            host: uri.host().map(str::to_owned),
            port: uri.port_u16(),
            path: uri.path().to_owned(),
            path_redacted: false,
        }
    }

    /// The same URL with its path shown as `redaction` says: the template
    /// it matches, what the closure made of it, or
    /// [`HIDDEN_PATH`] when hidden. Applied once: a path already redacted
    /// (by a redaction other than [`PathRedaction::full`]) is kept as is.
    pub fn with_path_redaction(mut self, redaction: &PathRedaction) -> Self {
        self.redact_path(redaction);
        self
    }

    /// In place, as [`with_path_redaction`](Self::with_path_redaction).
    pub(crate) fn redact_path(&mut self, redaction: &PathRedaction) {
        if self.path_redacted || redaction.is_full() {
            return;
        }
        let shown = match redaction.show(&self.path) {
            Some(Cow::Borrowed(p)) if p == self.path => None,
            Some(p) => Some(p.into_owned()),
            None => Some(HIDDEN_PATH.to_owned()),
        };
        if let Some(path) = shown {
            self.path = path;
        }
        self.path_redacted = true;
    }

    /// Whether a path redaction was applied
    /// ([`with_path_redaction`](Self::with_path_redaction)).
    pub fn is_path_redacted(&self) -> bool {
        self.path_redacted
    }

    /// The scheme, if the URL has one.
    pub fn scheme(&self) -> Option<&str> {
        self.scheme.as_ref().map(Scheme::as_str)
    }

    /// The host, if the URL has one.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The explicit port, if the URL has one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The path (never the query).
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl fmt::Display for RedactedUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = &self.scheme {
            write!(f, "{scheme}://")?;
        }
        if let Some(host) = &self.host {
            f.write_str(host)?;
            if let Some(port) = self.port {
                write!(f, ":{port}")?;
            }
        }
        f.write_str(&self.path)
    }
}

impl fmt::Debug for RedactedUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// What an error may say about its request: the method and the URI, kept
/// only to call [`Error::with_request`](crate::Error::with_request) (which
/// keeps the [redacted](RedactedUri) form) when something fails. Its `Debug`
/// is redacted too. Used by every layer and by `rebound-hyper`'s transport,
/// so errors are named the same way everywhere.
#[derive(Clone)]
pub struct RequestName {
    method: http::Method,
    uri: Uri,
}

impl RequestName {
    #[cfg(feature = "stack")]
    /// The name of a request with this method and URI.
    pub(crate) fn new(method: http::Method, uri: Uri) -> Self {
        RequestName { method, uri }
    }

    /// The name of `req` (clones its method and URI: reference counts, no
    /// allocation for standard methods).
    pub fn of<B>(req: &http::Request<B>) -> Self {
        RequestName {
            method: req.method().clone(),
            uri: req.uri().clone(),
        }
    }

    /// The request's method.
    pub fn method(&self) -> &http::Method {
        &self.method
    }

    /// The request's URI, unredacted: for this crate's own use (checks and
    /// errors redact it), never shown.
    #[cfg(feature = "reconcile")]
    pub(crate) fn uri(&self) -> &Uri {
        &self.uri
    }

    /// `err`, named with this request (a request already named is kept).
    pub fn name(&self, err: crate::Error) -> crate::Error {
        err.with_request(&self.method, &self.uri)
    }
}

impl fmt::Debug for RequestName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the raw URI: it may carry userinfo or a query string.
        write!(f, "{} {}", self.method, RedactedUri::new(&self.uri))
    }
}

// ===== paths =====

/// What an error shows for a path that is [hidden](PathRedaction::hidden):
/// `/{redacted}`. (Spans and events leave `url.path` out instead.)
pub const HIDDEN_PATH: &str = "/{redacted}";

/// How the path of a request URL is shown in spans, events and errors; see
/// the [module docs](self).
///
/// * [`full`](Self::full) (the default): as it is;
/// * [`hidden`](Self::hidden): never; spans and events have no `url.path`,
///   errors show [`HIDDEN_PATH`];
/// * [`templates`](Self::templates): a path that matches one of the
///   templates (`/v1/keys/{key}`: `{..}` stands for one non-empty segment)
///   is shown as that template, any other path as it is;
/// * [`with`](Self::with): as a closure of yours makes it.
///
/// ```
/// use std::borrow::Cow;
/// use rebound_core::redact::PathRedaction;
///
/// let keys = PathRedaction::templates(["/v1/keys/{key}", "/v1/users/{id}/tokens/{token}"]);
/// assert_eq!(keys.show("/v1/keys/sk-123").as_deref(), Some("/v1/keys/{key}"));
/// assert_eq!(keys.show("/v1/users/7/tokens/t-9").as_deref(), Some("/v1/users/{id}/tokens/{token}"));
/// assert_eq!(keys.show("/v1/models").as_deref(), Some("/v1/models"));
///
/// assert_eq!(PathRedaction::hidden().show("/v1/keys/sk-123"), None);
///
/// // Keep the first segment only.
/// let first = PathRedaction::with(|path: &str| match path[1..].find('/') {
///     Some(end) => Cow::Owned(format!("{}/*", &path[..end + 1])),
///     None => Cow::Borrowed(path),
/// });
/// assert_eq!(first.show("/v1/keys/sk-123").as_deref(), Some("/v1/*"));
/// ```
///
/// Cheap to clone (the templates and the closure are shared). Nothing is
/// computed unless a path is about to be shown: a span that is off, or a
/// request that succeeds with INFO-level logging, never calls it.
#[derive(Clone, Default)]
pub struct PathRedaction {
    kind: PathKind,
}

type PathFn = dyn Fn(&str) -> Cow<'_, str> + Send + Sync;

#[derive(Clone, Default)]
enum PathKind {
    #[default]
    Full,
    Hidden,
    Templates(Arc<[Template]>),
    Custom(Arc<PathFn>),
}

/// A path template: `/v1/keys/{key}`, split into segments.
struct Template {
    text: String,
    /// `None` for a `{..}` segment, else the literal.
    segments: Vec<Option<String>>,
}

impl Template {
    fn parse(text: &str) -> Result<Self, crate::Error> {
        let bad =
            |why: &str| crate::Error::config(format!("path template {text:?} is invalid: {why}"));
        let Some(rest) = text.strip_prefix('/') else {
            return Err(bad("it must start with '/'"));
        };
        let mut segments = Vec::new();
        for seg in rest.split('/') {
            if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                if name.is_empty() || name.contains(['{', '}']) {
                    return Err(bad("a parameter is `{name}`, a whole segment"));
                }
                segments.push(None);
            } else if seg.contains(['{', '}']) {
                return Err(bad("a parameter is `{name}`, a whole segment"));
            } else {
                segments.push(Some(seg.to_owned()));
            }
        }
        Ok(Template {
            text: text.to_owned(),
            segments,
        })
    }

    fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = rest.split('/');
        for seg in &self.segments {
            match (seg, parts.next()) {
                (_, None) => return false,
                (None, Some("")) => return false,
                (None, Some(_)) => {}
                (Some(lit), Some(part)) if lit != part => return false,
                (Some(_), Some(_)) => {}
            }
        }
        parts.next().is_none()
    }
}

impl PathRedaction {
    /// Paths shown as they are (the default).
    pub fn full() -> Self {
        PathRedaction {
            kind: PathKind::Full,
        }
    }

    /// Paths never shown: spans and events leave `url.path` out, errors
    /// show [`HIDDEN_PATH`] instead.
    pub fn hidden() -> Self {
        PathRedaction {
            kind: PathKind::Hidden,
        }
    }

    /// A path that matches one of `templates` is shown as the template; any
    /// other path as it is. A template is a path whose segments may be
    /// `{name}`, which matches any one non-empty segment
    /// (`/v1/keys/{key}`); the first template that matches wins.
    ///
    /// # Panics
    ///
    /// If a template is invalid (see [`try_templates`](Self::try_templates)).
    pub fn templates<I>(templates: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        match Self::try_templates(templates) {
            Ok(r) => r,
            Err(e) => panic!("PathRedaction::templates: {e}"),
        }
    }

    /// As [`templates`](Self::templates), for templates that come from
    /// configuration.
    ///
    /// # Errors
    ///
    /// A [configuration error](crate::ErrorKind::Config) naming the
    /// template if one does not start with `/`, or has a brace that is not
    /// a whole `{name}` segment.
    pub fn try_templates<I>(templates: I) -> Result<Self, crate::Error>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let parsed = templates
            .into_iter()
            .map(|t| Template::parse(t.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PathRedaction {
            kind: PathKind::Templates(Arc::from(parsed)),
        })
    }

    /// Paths shown as `f` makes them (`Cow::Borrowed(path)` to show a path
    /// as it is, without allocating).
    pub fn with<F>(f: F) -> Self
    where
        F: Fn(&str) -> Cow<'_, str> + Send + Sync + 'static,
    {
        PathRedaction {
            kind: PathKind::Custom(Arc::new(f)),
        }
    }

    /// Whether paths are shown as they are (the default).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, PathKind::Full)
    }

    /// How `path` is shown; `None` when it is not shown at all.
    pub fn show<'a>(&'a self, path: &'a str) -> Option<Cow<'a, str>> {
        match &self.kind {
            PathKind::Full => Some(Cow::Borrowed(path)),
            PathKind::Hidden => None,
            PathKind::Templates(templates) => Some(Cow::Borrowed(
                templates
                    .iter()
                    .find(|t| t.matches(path))
                    .map_or(path, |t| t.text.as_str()),
            )),
            PathKind::Custom(f) => Some(f(path)),
        }
    }
}

impl fmt::Debug for PathRedaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            PathKind::Full => f.write_str("PathRedaction::Full"),
            PathKind::Hidden => f.write_str("PathRedaction::Hidden"),
            PathKind::Templates(t) => f
                .debug_tuple("PathRedaction::Templates")
                .field(&t.iter().map(|t| t.text.as_str()).collect::<Vec<_>>())
                .finish(),
            PathKind::Custom(_) => f.write_str("PathRedaction::Custom(..)"),
        }
    }
}

/// The authority of `uri` without userinfo (`host[:port]`), if it has one.
pub fn authority_without_userinfo(uri: &Uri) -> Option<Authority> {
    let auth = uri.authority()?;
    match auth.as_str().rfind('@') {
        None => Some(auth.clone()),
        Some(at) => auth.as_str()[at + 1..].parse().ok(),
    }
}

/// The effective port of `uri`: the explicit one, else 443 for `https`, 80
/// for `http`.
pub fn effective_port(uri: &Uri) -> Option<u16> {
    uri.port_u16().or_else(|| match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    })
}

/// Feeds the key of a URI's authority (given as its scheme and authority)
/// into `h`: the scheme, the lower-cased host (never userinfo) and the
/// [effective port](effective_port), so that `HTTP://Example.com`,
/// `http://example.com:80` and `http://user@example.com` give one key.
/// Requests without an authority (origin-form) all give one key.
///
/// The host table (`crate::host`) computes it at most once per request,
/// and only while some host is throttled or failing, or when an outcome
/// gives a host an entry. It reads the authority once, byte by byte (the
/// same host and port as [`Uri::host`] and [`Uri::port_u16`], without
/// their generic searches), and hands the hasher one buffer (SipHash costs
/// per call more than per byte): about a third of the instructions of
/// hashing the scheme, `Uri::host` and the port one by one.
#[cfg(any(feature = "breaker", feature = "retry-after"))]
pub(crate) fn hash_host<H: std::hash::Hasher>(
    scheme: Option<&str>,
    authority: Option<&str>,
    h: &mut H,
) {
    let mut out = KeyWriter {
        h,
        buf: [0; 64],
        n: 0,
    };
    // Scheme: 0 none, 1 http, 2 https, 3 another (its bytes and 0xff
    // follow; a scheme is ASCII, so 0xff ends it unambiguously).
    match scheme {
        None => out.push(0),
        Some("http") => out.push(1),
        Some("https") => out.push(2),
        Some(other) => {
            out.push(3);
            out.push_lower(other.as_bytes());
            out.push(0xff);
        }
    }
    let (host, port) = match authority {
        Some(authority) => {
            let (host, port) = host_and_port(authority);
            (Some(host), port)
        }
        None => (None, None),
    };
    // Host: 0 none; 1, the lower-cased host, 0xff (a host is ASCII).
    match host {
        Some(host) => {
            out.push(1);
            out.push_lower(host.as_bytes());
            out.push(0xff);
        }
        None => out.push(0),
    }
    let port = port.or(match scheme {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    });
    match port {
        Some(p) => {
            let [a, b] = p.to_le_bytes();
            out.push(1);
            out.push(a);
            out.push(b);
        }
        None => out.push(0),
    }
    out.h.write(&out.buf[..out.n]);
}

/// Feeds bytes to a hasher through a stack buffer: one `write` for a
/// usual authority.
#[cfg(any(feature = "breaker", feature = "retry-after"))]
struct KeyWriter<'a, H> {
    h: &'a mut H,
    buf: [u8; 64],
    n: usize,
}

#[cfg(any(feature = "breaker", feature = "retry-after"))]
impl<H: std::hash::Hasher> KeyWriter<'_, H> {
    fn push(&mut self, b: u8) {
        if self.n == self.buf.len() {
            self.h.write(&self.buf);
            self.n = 0;
        }
        self.buf[self.n] = b;
        self.n += 1;
    }

    fn push_lower(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.n..self.n + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                dst.make_ascii_lowercase();
                self.n += bytes.len();
            }
            None => {
                for &b in bytes {
                    self.push(b.to_ascii_lowercase());
                }
            }
        }
    }
}

/// The host and the explicit port of an authority, as [`Uri::host`] and
/// [`Uri::port_u16`] read them, in one pass: the host is what follows the
/// last `@` up to the first `:` after it (or up to and including the `]`
/// of an IPv6 literal); the port is what follows the last `:`, if it is a
/// `u16`.
#[cfg(any(feature = "breaker", feature = "retry-after"))]
pub(crate) fn host_and_port(authority: &str) -> (&str, Option<u16>) {
    let bytes = authority.as_bytes();
    // The host starts after the last `@` (userinfo), if any.
    let start = bytes.iter().rposition(|&b| b == b'@').map_or(0, |i| i + 1);
    let first_colon = bytes[start..]
        .iter()
        .position(|&b| b == b':')
        .map(|i| start + i);
    let last_colon = match first_colon {
        Some(first) => bytes[first..]
            .iter()
            .rposition(|&b| b == b':')
            .map(|i| first + i),
        // No `:` after the last `@`: the last one, if any, is in the
        // userinfo.
        None => bytes[..start].iter().rposition(|&b| b == b':'),
    };
    let host = if bytes.get(start) == Some(&b'[') {
        match authority[start..].find(']') {
            Some(end) => &authority[start..=start + end],
            None => &authority[start..],
        }
    } else {
        &authority[start..first_colon.unwrap_or(bytes.len())]
    };
    let port = last_colon.and_then(|i| authority[i + 1..].parse::<u16>().ok());
    (host, port)
}

// ===== headers: what is never shown, what may be =====

/// Headers whose values are secrets in every deployment; always on a
/// [`HeaderDenyList`], whatever else it holds.
pub const ALWAYS_SENSITIVE: [HeaderName; 4] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::SET_COOKIE,
];

/// The words that make a header name look secret, for the
/// [name rule](HeaderDenyList::name_rule): a name that contains one of them
/// (`x-amz-security-token`, `x-client-secret`, `x-session-id`,
/// `x-goog-signature`, `x-goog-api-key`, `x-auth-user`, ...) is denied.
pub const SECRET_NAME_WORDS: [&str; 9] = [
    "token",
    "secret",
    "password",
    "session",
    "signature",
    "api-key",
    "api_key",
    "apikey",
    "auth",
];

/// A bit for byte `c`: one of its own for each lowercase letter; other
/// bytes share bits with letters (a shared bit can only let a name through
/// the filter, never keep one out).
const fn letter_bit(c: u8) -> u64 {
    1u64 << (c.wrapping_sub(b'a') & 63)
}

/// The set of bytes of each word of [`SECRET_NAME_WORDS`], as
/// [`letter_bit`]s.
const WORD_LETTERS: [u64; SECRET_NAME_WORDS.len()] = {
    let mut out = [0u64; SECRET_NAME_WORDS.len()];
    let mut w = 0;
    while w < SECRET_NAME_WORDS.len() {
        let word = SECRET_NAME_WORDS[w].as_bytes();
        let mut i = 0;
        while i < word.len() {
            out[w] |= letter_bit(word[i]);
            i += 1;
        }
        w += 1;
    }
    out
};

/// Whether a header name says it carries a secret: it contains one of
/// [`SECRET_NAME_WORDS`] (header names are lowercase).
///
/// ```
/// use http::header::HeaderName;
/// use rebound_core::redact::name_looks_secret;
///
/// assert!(name_looks_secret(&HeaderName::from_static("x-amz-security-token")));
/// assert!(name_looks_secret(&HeaderName::from_static("x-goog-api-key")));
/// assert!(name_looks_secret(&HeaderName::from_static("www-authenticate")));
/// assert!(!name_looks_secret(&HeaderName::from_static("accept")));
/// assert!(!name_looks_secret(&HeaderName::from_static("x-request-id")));
/// ```
pub fn name_looks_secret(name: &HeaderName) -> bool {
    let table = standard_names();
    let text = name.as_str();
    match table.index_of(text) {
        Some(i) => table.secret >> i & 1 == 1,
        None => bytes_look_secret(text.as_bytes()),
    }
}

/// The name rule on lowercase bytes: whether `b` contains one of
/// [`SECRET_NAME_WORDS`]. One rule for header names and query parameter
/// names ([`query_name_looks_secret`]).
#[inline]
fn bytes_look_secret(b: &[u8]) -> bool {
    // This runs for every header of every request and response, so first a
    // cheap filter: the set of bytes in the name (one pass, a bit per byte
    // value) must hold every letter of some word. `content-type`,
    // `x-ratelimit-remaining`, `cache-control` fail it at once. Only then
    // one pass comparing where a word can start.
    let present = b.iter().fold(0u64, |m, &c| m | letter_bit(c));
    if !WORD_LETTERS.iter().any(|&w| w & !present == 0) {
        return false;
    }
    (0..b.len()).any(|i| {
        let rest = &b[i..];
        match b[i] {
            b't' => rest.starts_with(b"token"),
            b's' => {
                rest.starts_with(b"secret")
                    || rest.starts_with(b"session")
                    || rest.starts_with(b"signature")
            }
            b'p' => rest.starts_with(b"password"),
            b'a' => {
                rest.starts_with(b"auth")
                    || rest.starts_with(b"api-key")
                    || rest.starts_with(b"api_key")
                    || rest.starts_with(b"apikey")
            }
            _ => false,
        }
    })
}

// ===== standard header names: each verdict decided once =====

/// The standard header names of `http` ([`http::header`]'s constants). A
/// header map holds mostly these, and their verdicts never change, so each
/// [`HeaderDenyList`] decides them once, when it is built.
const STANDARD: [HeaderName; 81] = [
    header::ACCEPT,
    header::ACCEPT_CHARSET,
    header::ACCEPT_ENCODING,
    header::ACCEPT_LANGUAGE,
    header::ACCEPT_RANGES,
    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
    header::ACCESS_CONTROL_ALLOW_HEADERS,
    header::ACCESS_CONTROL_ALLOW_METHODS,
    header::ACCESS_CONTROL_ALLOW_ORIGIN,
    header::ACCESS_CONTROL_EXPOSE_HEADERS,
    header::ACCESS_CONTROL_MAX_AGE,
    header::ACCESS_CONTROL_REQUEST_HEADERS,
    header::ACCESS_CONTROL_REQUEST_METHOD,
    header::AGE,
    header::ALLOW,
    header::ALT_SVC,
    header::AUTHORIZATION,
    header::CACHE_CONTROL,
    header::CACHE_STATUS,
    header::CDN_CACHE_CONTROL,
    header::CONNECTION,
    header::CONTENT_DISPOSITION,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LENGTH,
    header::CONTENT_LOCATION,
    header::CONTENT_RANGE,
    header::CONTENT_SECURITY_POLICY,
    header::CONTENT_SECURITY_POLICY_REPORT_ONLY,
    header::CONTENT_TYPE,
    header::COOKIE,
    header::DNT,
    header::DATE,
    header::ETAG,
    header::EXPECT,
    header::EXPIRES,
    header::FORWARDED,
    header::FROM,
    header::HOST,
    header::IF_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_NONE_MATCH,
    header::IF_RANGE,
    header::IF_UNMODIFIED_SINCE,
    header::LAST_MODIFIED,
    header::LINK,
    header::LOCATION,
    header::MAX_FORWARDS,
    header::ORIGIN,
    header::PRAGMA,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::PUBLIC_KEY_PINS,
    header::PUBLIC_KEY_PINS_REPORT_ONLY,
    header::RANGE,
    header::REFERER,
    header::REFERRER_POLICY,
    header::REFRESH,
    header::RETRY_AFTER,
    header::SEC_WEBSOCKET_ACCEPT,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_VERSION,
    header::SERVER,
    header::SET_COOKIE,
    header::STRICT_TRANSPORT_SECURITY,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::USER_AGENT,
    header::UPGRADE,
    header::UPGRADE_INSECURE_REQUESTS,
    header::VARY,
    header::VIA,
    header::WARNING,
    header::WWW_AUTHENTICATE,
    header::X_CONTENT_TYPE_OPTIONS,
    header::X_DNS_PREFETCH_CONTROL,
    header::X_FRAME_OPTIONS,
    header::X_XSS_PROTECTION,
];

/// Slots of [`StandardNames`] (a power of two, about three per name).
const SLOTS: usize = 256;

/// Where each standard name's text lives: a standard [`HeaderName`]'s
/// `as_str()` is a `&'static str`, the same one every time, so its address
/// says which standard name it is without reading a byte. The look-up
/// compares the address *and* the length, and two strings with the same
/// address and length have the same bytes: a name found here has the
/// verdict of the standard name it is, whatever its representation, and a
/// name not found (a custom one, or a standard one whose text the compiler
/// copied) is scanned as before. Exact either way; only the cost differs.
struct StandardNames {
    /// The address of each slot's name (0: empty).
    addr: [usize; SLOTS],
    /// Its length and its index in [`STANDARD`].
    len: [u8; SLOTS],
    index: [u8; SLOTS],
    /// Bit `i`: [`STANDARD`]`[i]` [looks secret](name_looks_secret).
    secret: u128,
}

impl StandardNames {
    fn build() -> Self {
        let mut t = StandardNames {
            addr: [0; SLOTS],
            len: [0; SLOTS],
            index: [0; SLOTS],
            secret: 0,
        };
        for (i, name) in STANDARD.iter().enumerate() {
            let text = name.as_str();
            if bytes_look_secret(text.as_bytes()) {
                t.secret |= 1 << i;
            }
            let mut slot = Self::slot(text.as_ptr() as usize);
            while t.addr[slot] != 0 {
                slot = (slot + 1) % SLOTS;
            }
            t.addr[slot] = text.as_ptr() as usize;
            t.len[slot] = text.len() as u8;
            t.index[slot] = i as u8;
        }
        t
    }

    #[inline]
    fn slot(addr: usize) -> usize {
        ((addr as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SLOTS
    }

    /// The index in [`STANDARD`] of the name whose text is `text`, if it is
    /// one of them (and the compiler did not copy its text).
    #[inline]
    fn index_of(&self, text: &str) -> Option<u32> {
        let addr = text.as_ptr() as usize;
        let mut slot = Self::slot(addr);
        loop {
            match self.addr[slot] {
                0 => return None,
                a if a == addr && usize::from(self.len[slot]) == text.len() => {
                    return Some(u32::from(self.index[slot]));
                }
                _ => slot = (slot + 1) % SLOTS,
            }
        }
    }
}

/// The table of [`STANDARD`], built once per process.
fn standard_names() -> &'static StandardNames {
    static TABLE: std::sync::OnceLock<StandardNames> = std::sync::OnceLock::new();
    TABLE.get_or_init(StandardNames::build)
}

/// Up to this many names that are neither standard nor caught by the name
/// rule, [`HeaderDenyList::mark_sensitive`] compares each header with them
/// instead of looking each of them up.
const COMPARED_NAMES: usize = 4;

/// Headers whose values are never recorded and which are marked
/// [sensitive](http::HeaderValue::set_sensitive), so `Debug` of a request or
/// response prints `Sensitive` instead of the value, and HTTP/2 never
/// indexes them in HPACK.
///
/// It always holds [`ALWAYS_SENSITIVE`] (`Authorization`,
/// `Proxy-Authorization`, `Cookie`, `Set-Cookie`). The default list adds
/// `x-api-key`, `api-key`, `x-auth-token`, `x-amz-security-token` and
/// `x-goog-api-key`, and the [name rule](Self::name_rule): every header
/// whose name contains `token`, `secret`, `password`, `session`,
/// `signature`, `api-key` (or `api_key`, `apikey`) or `auth`
/// ([`name_looks_secret`]). Cheap to clone (shared).
///
/// The default list is one list for two promises: what the trace layers
/// never show, and what a [fallback](crate::fallback::FallbackLayer)
/// never sends to another route. Both take [`HeaderDenyList::default`].
///
/// ```
/// use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
/// use rebound_core::redact::HeaderDenyList;
///
/// let deny = HeaderDenyList::default().with(HeaderName::from_static("x-tenant"));
/// let mut headers = HeaderMap::new();
/// headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer s3cret"));
/// headers.insert("x-tenant", HeaderValue::from_static("s3cret"));
/// headers.insert("x-refresh-token", HeaderValue::from_static("s3cret"));
/// deny.mark_sensitive(&mut headers);
/// assert!(!format!("{headers:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderDenyList {
    names: Arc<[HeaderName]>,
    /// Whether names that [look secret](name_looks_secret) are denied too.
    rule: bool,
    /// Bit `i`: [`STANDARD`]`[i]` is denied (on the list or caught by the
    /// rule), so a standard header's verdict is one bit.
    standard: u128,
    /// The names the rule does not catch (all of them without the rule)
    /// that are not standard: those `mark_sensitive` must compare or look
    /// up one by one.
    uncaught: Arc<[HeaderName]>,
}

impl HeaderDenyList {
    fn from_parts(names: Vec<HeaderName>, rule: bool) -> Self {
        let caught = |n: &HeaderName| rule && bytes_look_secret(n.as_str().as_bytes());
        let standard = STANDARD
            .iter()
            .enumerate()
            .filter(|(_, s)| caught(s) || names.contains(s))
            .fold(0u128, |m, (i, _)| m | 1 << i);
        let uncaught: Vec<HeaderName> = names
            .iter()
            .filter(|n| !caught(n) && !STANDARD.contains(n))
            .cloned()
            .collect();
        HeaderDenyList {
            names: Arc::from(names),
            rule,
            standard,
            uncaught: Arc::from(uncaught),
        }
    }

    /// Whether the header named `name` (whose text is `text`) is denied: a
    /// standard name by its bit, any other by the rule and the uncaught
    /// names (compared here only when `compare`).
    #[inline]
    fn denies(&self, table: &StandardNames, name: &HeaderName, compare: bool) -> bool {
        let text = name.as_str();
        match table.index_of(text) {
            Some(i) => self.standard >> i & 1 == 1,
            None => {
                (self.rule && bytes_look_secret(text.as_bytes()))
                    || (compare && self.uncaught.iter().any(|n| n == name))
            }
        }
    }

    /// Only [`ALWAYS_SENSITIVE`], without the name rule; the credential
    /// headers cannot be removed from it.
    pub fn minimal() -> Self {
        HeaderDenyList::from_parts(ALWAYS_SENSITIVE.to_vec(), false)
    }

    /// The same list with `name` added (no-op if it is already there).
    pub fn with(self, name: HeaderName) -> Self {
        if self.names.contains(&name) {
            return self;
        }
        let mut names = self.names.to_vec();
        names.push(name);
        HeaderDenyList::from_parts(names, self.rule)
    }

    /// The same list, denying (`true`) or not every header whose name
    /// [looks secret](name_looks_secret) besides the names on it. On in
    /// the default list, off in [`minimal`](Self::minimal). Turn it off
    /// only to record a header the rule catches (`x-session-id`, say) and
    /// add the names you need to keep secret yourself.
    pub fn name_rule(self, on: bool) -> Self {
        if self.rule == on {
            return self;
        }
        HeaderDenyList::from_parts(self.names.to_vec(), on)
    }

    /// Whether the name rule is on.
    pub fn has_name_rule(&self) -> bool {
        self.rule
    }

    /// Whether `name` is denied: on the list, or caught by the name rule.
    pub fn contains(&self, name: &HeaderName) -> bool {
        self.denies(standard_names(), name, true)
    }

    /// The names on the list (not those the name rule catches).
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        self.names.iter()
    }

    /// Mark every value of every denied header in `headers` as sensitive
    /// (see [`set_sensitive`]): every header of the map is looked at once
    /// (no allocation); a standard header's verdict is one bit, decided
    /// when the list was built, and only other names are read.
    pub fn mark_sensitive(&self, headers: &mut HeaderMap) {
        if headers.is_empty() {
            return;
        }
        let table = standard_names();
        // A few names that are neither standard nor caught by the rule (by
        // default none): compared with each custom header in the one pass,
        // cheaper than hashing each name for a look-up (the trace layers
        // run this on every request and every response). Many: looked up
        // one by one first.
        let compare = self.uncaught.len() <= COMPARED_NAMES;
        if !compare {
            set_sensitive(headers, self.uncaught.iter());
        }
        for (name, value) in headers.iter_mut() {
            if !value.is_sensitive() && self.denies(table, name, compare) {
                value.set_sensitive(true);
            }
        }
    }
}

impl Default for HeaderDenyList {
    /// [`ALWAYS_SENSITIVE`] plus `x-api-key`, `api-key`, `x-auth-token`,
    /// `x-amz-security-token`, `x-goog-api-key`, and the name rule.
    fn default() -> Self {
        let mut names = ALWAYS_SENSITIVE.to_vec();
        names.extend([
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static("api-key"),
            HeaderName::from_static("x-auth-token"),
            HeaderName::from_static("x-amz-security-token"),
            HeaderName::from_static("x-goog-api-key"),
        ]);
        HeaderDenyList::from_parts(names, true)
    }
}

impl fmt::Debug for HeaderDenyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        l.entries(self.names.iter());
        if self.rule {
            l.entry(&format_args!(
                "<names with {}>",
                SECRET_NAME_WORDS.join("|")
            ));
        }
        l.finish()
    }
}

/// Headers whose values may be recorded in logs and spans. Empty by default:
/// no header value is shown unless named here.
///
/// A name that is also on the [`HeaderDenyList`] in use is never shown; the
/// trace layer's builder rejects such a configuration.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HeaderAllowList {
    names: Arc<[HeaderName]>,
}

impl HeaderAllowList {
    /// An allow-list of `names`.
    pub fn new(names: impl IntoIterator<Item = HeaderName>) -> Self {
        let mut v: Vec<HeaderName> = Vec::new();
        for n in names {
            if !v.contains(&n) {
                v.push(n);
            }
        }
        HeaderAllowList {
            names: Arc::from(v),
        }
    }

    /// Whether the list is empty (the default).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether `name` is on the list.
    pub fn contains(&self, name: &HeaderName) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// The names on the list.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        self.names.iter()
    }
}

impl fmt::Debug for HeaderAllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names.iter()).finish()
    }
}

/// Mark every value of the headers `names` in `headers` as sensitive
/// ([`HeaderValue::set_sensitive`](http::HeaderValue::set_sensitive)), so `Debug` of the map prints
/// `Sensitive`. The same step as tower-http's `SetSensitiveRequestHeaders`,
/// without the dependency.
pub fn set_sensitive<'a>(headers: &mut HeaderMap, names: impl IntoIterator<Item = &'a HeaderName>) {
    // `HeaderMap::entry` reserves room first, so on an empty map it
    // allocates even when the name is absent: look before taking an entry.
    if headers.is_empty() {
        return;
    }
    for name in names {
        if !headers.contains_key(name) {
            continue;
        }
        if let Entry::Occupied(mut entry) = headers.entry(name) {
            for value in entry.iter_mut() {
                value.set_sensitive(true);
            }
        }
    }
}

// ===== query: only the parameter names, opt-in =====

/// The names of the query parameters of `uri` (`?a=1&b&c=2` gives `a`, `b`,
/// `c`), never their values. Empty names are skipped. `;` separates
/// parameters too, as some servers read it (`?a=1;b=2` gives `a`, `b`), so
/// no value hides behind one.
///
/// Names are not always harmless: an API that puts a bare token in the query
/// (`?s3cret`) makes the token a "name". That is why recording them is
/// opt-in.
///
/// ```
/// let uri: http::Uri = "/v1/x?api_key=s3cret&page=2&flag".parse().unwrap();
/// let names: Vec<_> = rebound_core::redact::query_param_names(&uri).collect();
/// assert_eq!(names, ["api_key", "page", "flag"]);
/// ```
pub fn query_param_names(uri: &Uri) -> impl Iterator<Item = &str> {
    uri.query()
        .unwrap_or("")
        .split(['&', ';'])
        .map(|pair| pair.split_once('=').map_or(pair, |(name, _)| name))
        .filter(|name| !name.is_empty())
}

/// Query parameter names that are secrets though the
/// [name rule](SECRET_NAME_WORDS) does not catch them: `key` (Google APIs'
/// `?key=`) and `sig` (Azure shared-access signatures). Compared whole,
/// ignoring ASCII case (see [`query_name_looks_secret`]).
pub const SECRET_QUERY_NAMES: [&str; 2] = ["key", "sig"];

/// Whether a query parameter name says it carries a secret: ignoring ASCII
/// case, it is one of [`SECRET_QUERY_NAMES`] (`key`, `sig`) or it contains
/// one of [`SECRET_NAME_WORDS`] (`token`, `secret`, `password`, `session`,
/// `signature`, `api-key`, `api_key`, `apikey`, `auth`), the rule header
/// names follow ([`name_looks_secret`]).
///
/// So `api_key`, `apiKey`, `access_token`, `id_token`, `client_secret`,
/// `password`, `sessionid`, `X-Amz-Signature`, `X-Amz-Security-Token`,
/// `auth`, `key` and `sig` match; `page`, `q`, `limit`, `keys`, `pwd` and
/// `signed` do not. The rule errs towards secret: `author` and `oauth_scope`
/// match too.
///
/// `name` is the parameter's name **decoded** (`api_key`, not
/// `api%5Fkey`); [`remove_query_params`] decodes each name once before it
/// asks.
///
/// ```
/// use rebound_core::redact::query_name_looks_secret;
///
/// for name in ["api_key", "apiKey", "access_token", "X-Amz-Signature", "key", "sig"] {
///     assert!(query_name_looks_secret(name), "{name}");
/// }
/// for name in ["page", "q", "keys", "signed"] {
///     assert!(!query_name_looks_secret(name), "{name}");
/// }
/// ```
pub fn query_name_looks_secret(name: &str) -> bool {
    if SECRET_QUERY_NAMES
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
    {
        return true;
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        bytes_look_secret(name.to_ascii_lowercase().as_bytes())
    } else {
        bytes_look_secret(name.as_bytes())
    }
}

/// `query` (a URL's query string, without its `?`) without the parameters
/// `remove` picks.
///
/// `remove` is asked once for each parameter (an `&`-separated pair, or a
/// bare name), with the parameter's name percent-decoded once (`api%5Fkey`
/// is asked as `api_key`; bytes that are not UTF-8 become U+FFFD; `+` is
/// left as it is). A pair with an empty name is kept without asking. Since
/// some servers also split on `;`, a pair holding `;` is asked once for
/// each `;`-separated part, and removed whole if any part is
/// (`page=2;token=t` goes). The
/// parameters kept are copied as they were — in their order, their names
/// and values not decoded or re-encoded — joined by `&`; the empty pairs of
/// `a=1&&b=2` are dropped once something is removed. When nothing is
/// removed, `query` itself is returned (borrowed, no allocation); when
/// everything is, an empty string.
///
/// ```
/// use rebound_core::redact::{query_name_looks_secret, remove_query_params};
///
/// let q = "api%5Fkey=s3cret&page=2&q=a%20b&token=t";
/// assert_eq!(remove_query_params(q, query_name_looks_secret), "page=2&q=a%20b");
/// assert_eq!(remove_query_params("page=2", query_name_looks_secret), "page=2");
/// // A secret behind `;`, which some servers read as a separator:
/// assert_eq!(remove_query_params("page=2;token=t&q=1", query_name_looks_secret), "q=1");
/// ```
pub fn remove_query_params<'a, F>(query: &'a str, mut remove: F) -> Cow<'a, str>
where
    F: FnMut(&str) -> bool,
{
    // Some servers also split a query on `;` (the old HTML 4 form, still
    // read by Java servlet containers and Go before 1.17): `a=1;token=t` is
    // then two parameters, and a secret one hidden behind `;` would be sent
    // on. So each `;`-separated part of a pair is asked too, and any secret
    // part removes the whole pair (erring towards secret).
    let mut removes = |pair: &str| {
        pair.split(';').any(|part| {
            let name = part.split_once('=').map_or(part, |(name, _)| name);
            !name.is_empty()
                && remove(&percent_encoding::percent_decode_str(name).decode_utf8_lossy())
        })
    };
    // First look, without allocating: most queries lose nothing.
    let Some(first) = query.split('&').position(&mut removes) else {
        return Cow::Borrowed(query);
    };
    let mut out = String::with_capacity(query.len());
    for (i, pair) in query.split('&').enumerate() {
        if pair.is_empty() || i == first || (i > first && removes(pair)) {
            continue;
        }
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(pair);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[cfg(any(feature = "breaker", feature = "retry-after"))]
    #[test]
    fn host_and_port_read_an_authority_as_http_does() {
        for a in [
            "example.com",
            "Example.COM:8080",
            "user@example.com",
            "user:pw@example.com:81",
            "us:er:pw@h:1",
            "a@b@host:443",
            "[::1]",
            "[::1]:8443",
            "u@[fe80::1]:9",
            "host:",
            "host:99999",
            "host:+80",
            "h:p@host",
        ] {
            let uri: Uri = format!("http://{a}/p").parse().unwrap();
            let (host, port) = host_and_port(uri.authority().unwrap().as_str());
            assert_eq!(Some(host), uri.host(), "{a}");
            assert_eq!(port, uri.port_u16(), "{a}");
        }
    }

    #[cfg(any(feature = "breaker", feature = "retry-after"))]
    #[test]
    fn one_authority_key_whatever_its_spelling() {
        use std::hash::{BuildHasher, Hasher};
        let state = std::collections::hash_map::RandomState::new();
        let key = |u: &str| {
            let mut h = state.build_hasher();
            let uri = u.parse::<Uri>().unwrap();
            hash_host(
                uri.scheme_str(),
                uri.authority().map(|a| a.as_str()),
                &mut h,
            );
            h.finish()
        };
        let same = [
            "http://example.com/a",
            "HTTP://EXAMPLE.com/b?q",
            "http://example.com:80/",
            "http://user:pw@Example.Com:80/x",
        ];
        for u in same {
            assert_eq!(key(u), key(same[0]), "{u}");
        }
        let long = format!("http://{}.example/", "a".repeat(300));
        assert_eq!(key(&long), key(&long.to_uppercase()));
        let different = [
            "https://example.com/",
            "http://example.com:8080/",
            "http://example.org/",
            "ftp://example.com/",
            "/origin-form",
            &long,
        ];
        for (i, a) in different.iter().enumerate() {
            assert_ne!(key(a), key(same[0]), "{a}");
            for b in &different[i + 1..] {
                assert_ne!(key(a), key(b), "{a} {b}");
            }
        }
        assert_eq!(key("https://example.com/"), key("https://example.com:443/"));
        assert_eq!(key("/a"), key("/b"));
    }
    #[test]
    fn strips_userinfo_query_fragment() {
        let uri: Uri = "http://u:p@h.example:81/p/q?x=1#f".parse().unwrap();
        let r = RedactedUri::new(&uri);
        assert_eq!(r.to_string(), "http://h.example:81/p/q");
        assert_eq!(format!("{r:?}"), "\"http://h.example:81/p/q\"");
        assert_eq!(
            authority_without_userinfo(&uri).unwrap().as_str(),
            "h.example:81"
        );
    }

    #[test]
    fn origin_form() {
        let uri: Uri = "/only/path?secret=1".parse().unwrap();
        assert_eq!(RedactedUri::new(&uri).to_string(), "/only/path");
        assert_eq!(effective_port(&uri), None);
        let uri: Uri = "https://h/".parse().unwrap();
        assert_eq!(effective_port(&uri), Some(443));
    }

    #[test]
    fn deny_list_always_holds_the_credentials() {
        let minimal = HeaderDenyList::minimal();
        for name in ALWAYS_SENSITIVE {
            assert!(minimal.contains(&name));
            assert!(HeaderDenyList::default().contains(&name));
        }
        assert!(!minimal.contains(&HeaderName::from_static("x-api-key")));
        assert!(HeaderDenyList::default().contains(&HeaderName::from_static("x-api-key")));
        assert!(HeaderDenyList::default().contains(&HeaderName::from_static("api-key")));
        let with = minimal.clone().with(header::COOKIE);
        assert_eq!(with, minimal);
    }

    #[test]
    fn default_deny_list_has_the_cloud_tokens_and_the_name_rule() {
        let deny = HeaderDenyList::default();
        for name in [
            "x-amz-security-token",
            "x-goog-api-key",
            "x-refresh-token",
            "x-client-secret",
            "x-db-password",
            "x-session-id",
            "x-goog-signature",
            "x-custom-api-key",
            "x-my-apikey",
            "x-auth-user",
            "www-authenticate",
        ] {
            assert!(deny.contains(&HeaderName::from_static(name)), "{name}");
        }
        for name in [
            "accept",
            "content-type",
            "x-request-id",
            "retry-after",
            "user-agent",
        ] {
            assert!(!deny.contains(&HeaderName::from_static(name)), "{name}");
        }
        // `minimal` has no rule; it can be turned on.
        let minimal = HeaderDenyList::minimal();
        assert!(!minimal.contains(&HeaderName::from_static("x-session-id")));
        assert!(minimal
            .name_rule(true)
            .contains(&HeaderName::from_static("x-session-id")));
        assert!(!HeaderDenyList::default()
            .name_rule(false)
            .contains(&HeaderName::from_static("x-session-id")));
        // The listed names stay denied without the rule.
        assert!(HeaderDenyList::default()
            .name_rule(false)
            .contains(&HeaderName::from_static("x-amz-security-token")));
        assert!(!format!("{deny:?}").is_empty());
    }

    #[test]
    fn the_name_rule_is_the_word_list() {
        let naive = |n: &str| SECRET_NAME_WORDS.iter().any(|w| n.contains(w));
        for name in [
            "accept",
            "authorization",
            "x-auth",
            "x-oauth-scope",
            "tokens",
            "x-tok",
            "x-secre",
            "x-secret",
            "sessio",
            "x-session",
            "x-signatur",
            "x-signature",
            "password",
            "x-passwd",
            "api-ke",
            "x-api-key",
            "x_api_key",
            "apikey",
            "x-apik",
            "content-type",
            "x-request-id",
            "set-cookie",
            "x-amz-date",
            "a",
            "t",
        ] {
            let h = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(name_looks_secret(&h), naive(name), "{name}");
        }
        // The letter filter never keeps a real match out.
        for word in SECRET_NAME_WORDS {
            for name in [
                word.to_owned(),
                format!("x-{word}"),
                format!("x-{word}-9"),
                format!("0{word}_z"),
            ] {
                let h = HeaderName::from_bytes(name.as_bytes()).unwrap();
                assert!(name_looks_secret(&h), "{name}");
            }
        }
    }

    #[test]
    fn the_name_rule_marks_values_sensitive() {
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-security-token", "SECRET1".parse().unwrap());
        headers.insert("x-goog-api-key", "SECRET2".parse().unwrap());
        headers.append("x-upstream-session", "SECRET3".parse().unwrap());
        headers.append("x-upstream-session", "SECRET4".parse().unwrap());
        headers.insert(header::ACCEPT, "text/plain".parse().unwrap());
        HeaderDenyList::default().mark_sensitive(&mut headers);
        let shown = format!("{headers:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("text/plain"));
        assert!(headers
            .iter()
            .filter(|(n, _)| *n != header::ACCEPT)
            .all(|(_, v)| v.is_sensitive()));
        assert!(!headers[header::ACCEPT].is_sensitive());
    }

    #[test]
    fn path_templates_match_whole_segments() {
        let t = PathRedaction::templates(["/v1/keys/{key}", "/v1/{org}/secrets/{name}"]);
        assert_eq!(t.show("/v1/keys/abc").as_deref(), Some("/v1/keys/{key}"));
        assert_eq!(
            t.show("/v1/acme/secrets/db").as_deref(),
            Some("/v1/{org}/secrets/{name}")
        );
        // No match: shown as is.
        for path in [
            "/v1/keys",
            "/v1/keys/",
            "/v1/keys/abc/more",
            "/v2/keys/abc",
            "/",
        ] {
            assert_eq!(t.show(path).as_deref(), Some(path), "{path}");
        }
        for bad in ["v1/keys", "/v1/{}", "/v1/a{b}", "/v1/{a}b", "/{a{b}}"] {
            let e = PathRedaction::try_templates([bad]).err().unwrap();
            assert!(matches!(e.kind(), ErrorKind::Config), "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(PathRedaction::default().is_full());
        assert_eq!(PathRedaction::hidden().show("/a"), None);
    }

    #[test]
    fn a_redacted_uri_is_redacted_once() {
        let uri: Uri = "https://h.example/v1/keys/SECRET?x=1".parse().unwrap();
        let hidden = RedactedUri::new(&uri).with_path_redaction(&PathRedaction::hidden());
        assert_eq!(hidden.to_string(), "https://h.example/{redacted}");
        assert!(hidden.is_path_redacted());
        // A second redaction does not apply to an already redacted path.
        let again = hidden
            .clone()
            .with_path_redaction(&PathRedaction::templates(["/{x}"]));
        assert_eq!(again, hidden);
        // The default leaves the path and does not count as redacted.
        let full = RedactedUri::new(&uri).with_path_redaction(&PathRedaction::full());
        assert!(!full.is_path_redacted());
        let closure = RedactedUri::new(&uri).with_path_redaction(&PathRedaction::with(|p| {
            Cow::Owned(p.replace("SECRET", "***"))
        }));
        assert_eq!(closure.to_string(), "https://h.example/v1/keys/***");
    }

    #[test]
    fn mark_sensitive_by_comparison_or_by_look_up_alike() {
        let names: Vec<HeaderName> = ["x-a", "x-b", "x-c", "x-d", "x-e", "x-f"]
            .iter()
            .map(|n| HeaderName::from_static(n))
            .collect();
        for (n, rule) in [(1, false), (4, false), (6, false), (2, true), (6, true)] {
            let list = HeaderDenyList::from_parts(names[..n].to_vec(), rule);
            let mut headers = HeaderMap::new();
            for name in &names {
                headers.append(name, "v1".parse().unwrap());
                headers.append(name, "v2".parse().unwrap());
            }
            headers.insert("x-my-token", "t".parse().unwrap());
            headers.insert(header::ACCEPT, "a".parse().unwrap());
            list.mark_sensitive(&mut headers);
            for (name, value) in &headers {
                let denied = names[..n].contains(name) || (rule && name == "x-my-token");
                assert_eq!(value.is_sensitive(), denied, "{name} {n} {rule}");
            }
        }
    }

    #[test]
    fn standard_names_by_their_bit_as_by_the_scan() {
        let table = standard_names();
        let lists = [
            HeaderDenyList::default(),
            HeaderDenyList::minimal(),
            HeaderDenyList::minimal().name_rule(true),
            HeaderDenyList::default()
                .name_rule(false)
                .with(header::ACCEPT)
                .with(header::WWW_AUTHENTICATE),
        ];
        for (i, name) in STANDARD.iter().enumerate() {
            // The look-up finds each standard name, however it was made.
            let parsed = HeaderName::from_bytes(name.as_str().to_uppercase().as_bytes()).unwrap();
            assert_eq!(table.index_of(name.as_str()), Some(i as u32), "{name}");
            assert_eq!(table.index_of(parsed.as_str()), Some(i as u32), "{name}");
            let looks = bytes_look_secret(name.as_str().as_bytes());
            assert_eq!(name_looks_secret(name), looks, "{name}");
            for list in &lists {
                let denied = list.names.contains(name) || (list.rule && looks);
                assert_eq!(list.contains(&parsed), denied, "{name} {list:?}");
                let mut headers = HeaderMap::new();
                headers.insert(parsed.clone(), "v".parse().unwrap());
                list.mark_sensitive(&mut headers);
                assert_eq!(headers[name].is_sensitive(), denied, "{name} {list:?}");
            }
        }
        // What the rule catches among them, and what it does not.
        for name in [
            header::AUTHORIZATION,
            header::PROXY_AUTHORIZATION,
            header::PROXY_AUTHENTICATE,
            header::WWW_AUTHENTICATE,
        ] {
            assert!(name_looks_secret(&name), "{name}");
        }
        assert!(!name_looks_secret(&header::COOKIE));
        // Text that is not a standard name's is not found.
        assert_eq!(table.index_of("x-request-id"), None);
        assert_eq!(table.index_of(&String::from("content-type")), None);
        assert_eq!(table.index_of(&header::CONTENT_TYPE.as_str()[..7]), None);
    }

    #[test]
    fn set_sensitive_marks_every_value() {
        let mut headers = HeaderMap::new();
        headers.append(header::SET_COOKIE, "a=SECRET1".parse().unwrap());
        headers.append(header::SET_COOKIE, "b=SECRET2".parse().unwrap());
        headers.insert(header::ACCEPT, "text/plain".parse().unwrap());
        HeaderDenyList::default().mark_sensitive(&mut headers);
        let shown = format!("{headers:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("text/plain"));
        assert!(headers
            .get_all(header::SET_COOKIE)
            .iter()
            .all(|v| v.is_sensitive()));
    }

    #[test]
    fn query_names_only() {
        let uri: Uri = "http://h/p?a=SECRET&&b&=x&c=".parse().unwrap();
        let names: Vec<_> = query_param_names(&uri).collect();
        assert_eq!(names, ["a", "b", "c"]);
        // `;` separates too: the value behind it is never read as a name.
        let uri: Uri = "http://h/p?a=1;token=SECRET&b".parse().unwrap();
        let names: Vec<_> = query_param_names(&uri).collect();
        assert_eq!(names, ["a", "token", "b"]);
        let uri: Uri = "http://h/p".parse().unwrap();
        assert_eq!(query_param_names(&uri).count(), 0);
    }

    #[test]
    fn one_name_rule_for_header_and_query_names() {
        // (name, caught as a header name, caught as a query name)
        let table = [
            ("authorization", true, true),
            ("proxy-authorization", true, true),
            ("auth", true, true),
            ("x-api-key", true, true),
            ("api-key", true, true),
            ("api_key", true, true),
            ("apikey", true, true),
            ("x-session-token", true, true),
            ("sessionid", true, true),
            ("access_token", true, true),
            ("id_token", true, true),
            ("client_secret", true, true),
            ("password", true, true),
            ("x-amz-signature", true, true),
            ("x-amz-security-token", true, true),
            // The rule errs towards secret.
            ("author", true, true),
            // Whole query names the word rule does not catch.
            ("key", false, true),
            ("sig", false, true),
            // Harmless.
            ("keys", false, false),
            ("signed", false, false),
            ("pwd", false, false),
            ("page", false, false),
            ("q", false, false),
            ("accept", false, false),
            ("x-request-id", false, false),
            ("idempotency-key", false, false),
            // On the deny-list by name, not by the rule.
            ("cookie", false, false),
        ];
        for (name, header, query) in table {
            let h = HeaderName::from_static(name);
            assert_eq!(name_looks_secret(&h), header, "header {name}");
            assert_eq!(query_name_looks_secret(name), query, "query {name}");
            let upper = name.to_ascii_uppercase();
            assert_eq!(query_name_looks_secret(&upper), query, "query {upper}");
            // The default deny-list: its names, and the rule.
            if header {
                assert!(HeaderDenyList::default().contains(&h), "{name}");
            }
        }
        // Every word of the header rule is a secret query name.
        for word in SECRET_NAME_WORDS {
            assert!(query_name_looks_secret(word), "{word}");
            assert!(query_name_looks_secret(&format!("my_{word}_2")), "{word}");
        }
    }

    #[test]
    fn remove_query_params_keeps_the_rest_as_it_was() {
        let strip = |q: &str| remove_query_params(q, query_name_looks_secret).into_owned();
        for (query, left) in [
            ("", ""),
            ("api_key=x", ""),
            ("api_key=x&token=y", ""),
            ("api_key=x&page=2", "page=2"),
            ("page=2&api_key=x", "page=2"),
            ("a=1&api_key=x&b=2", "a=1&b=2"),
            // Repeated, bare, empty values.
            ("a=1&token=t&b=%2F&token=u&c", "a=1&b=%2F&c"),
            ("token&page", "page"),
            ("token=&page=", "page="),
            // Names matched decoded, kept encoded; values never decoded.
            ("api%5Fkey=x&page=2", "page=2"),
            ("API%5fKEY=x&q=a+b%20c", "q=a+b%20c"),
            ("%74oken=x&n%61me=v%3D1", "n%61me=v%3D1"),
            ("q=api_key%3Dx", "q=api_key%3Dx"),
            // Not a valid escape, not UTF-8: matched as decoded, kept.
            ("%ZZ=1&key=2", "%ZZ=1"),
            ("%FF%FE=1&sig=2", "%FF%FE=1"),
            // An empty name is kept; empty pairs go once something does.
            ("=x&token=t", "=x"),
            ("a=1&&token=t&&b=2", "a=1&b=2"),
            // `;`, a separator to some servers: a secret part takes its
            // whole pair; an escaped `%3B` separates nothing.
            ("page=2;token=t&q=1", "q=1"),
            ("q=1&token=t;page=2", "q=1"),
            ("a=1;b=2;api%5Fkey=x", ""),
            ("q=a%3Btoken=t", "q=a%3Btoken=t"),
        ] {
            assert_eq!(strip(query), left, "{query}");
        }
        // Nothing removed: the query itself, empty pairs and all.
        for query in ["page=2", "a=1&&b=2", "&", "=x", "q=%20", "a=1;b=2", ";"] {
            assert!(
                matches!(remove_query_params(query, query_name_looks_secret), Cow::Borrowed(q) if q == query),
                "{query}"
            );
        }
        // `remove` sees decoded names, each once.
        let mut asked = Vec::new();
        let _ = remove_query_params("a%20b=1&&=2&c&a%20b=3", |n| {
            asked.push(n.to_owned());
            false
        });
        assert_eq!(asked, ["a b", "c", "a b"]);
    }

    #[test]
    fn allow_list_dedups() {
        let a = HeaderAllowList::new([header::ACCEPT, header::ACCEPT, header::USER_AGENT]);
        assert_eq!(a.names().count(), 2);
        assert!(HeaderAllowList::default().is_empty());
    }
}
