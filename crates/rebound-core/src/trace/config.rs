//! What the trace layers record, and the checks made when they are built.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};

use super::{AttemptTraceLayer, TraceLayer};
use crate::error::Error;
use crate::redact::{self, HeaderAllowList, HeaderDenyList, PathRedaction};

/// The longest request id recorded; a longer value is not recorded at all.
const MAX_REQUEST_ID_LEN: usize = 128;
/// The longest allow-listed header value recorded; longer ones are cut.
const MAX_HEADER_VALUE_LEN: usize = 256;

/// Headers the attempt-number header may not replace: they frame the
/// message or route it.
const RESERVED: [HeaderName; 7] = [
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::TE,
    header::UPGRADE,
    header::CONTENT_TYPE,
];

/// Shared configuration of [`TraceLayer`] and [`AttemptTraceLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) deny: HeaderDenyList,
    pub(crate) allow: HeaderAllowList,
    pub(crate) request_id: Option<HeaderName>,
    pub(crate) query_names: bool,
    pub(crate) attempt_header: Option<HeaderName>,
    pub(crate) path: PathRedaction,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            deny: HeaderDenyList::default(),
            allow: HeaderAllowList::default(),
            request_id: Some(HeaderName::from_static("x-request-id")),
            query_names: false,
            attempt_header: None,
            path: PathRedaction::full(),
        }
    }
}

impl Config {
    /// The path of `uri` as it may be shown (`None`: not at all).
    pub(crate) fn shown_path<'a>(&'a self, uri: &'a Uri) -> Option<Cow<'a, str>> {
        self.path.show(uri.path())
    }

    /// Show the path of the URL `err` names as configured.
    pub(crate) fn redact_error(&self, err: &mut Error) {
        if !self.path.is_full() {
            err.redact_path(&self.path);
        }
    }

    /// The request id carried in the configured header, if it is printable
    /// ASCII, not marked sensitive, and at most 128 bytes.
    pub(crate) fn request_id<'a>(&self, headers: &'a HeaderMap) -> Option<&'a str> {
        let value = headers.get(self.request_id.as_ref()?)?;
        if value.is_sensitive() || value.len() > MAX_REQUEST_ID_LEN {
            return None;
        }
        value.to_str().ok()
    }

    /// The allow-listed headers of `headers` as `name=value, name=value`;
    /// `None` when the allow-list is empty (the default) or none is present.
    pub(crate) fn recorded_headers(&self, headers: &HeaderMap) -> Option<String> {
        if self.allow.is_empty() {
            return None;
        }
        let mut out = String::new();
        for name in self.allow.names() {
            if self.deny.contains(name) {
                continue;
            }
            for value in headers.get_all(name) {
                if value.is_sensitive() {
                    continue;
                }
                let Ok(text) = value.to_str() else { continue };
                if !out.is_empty() {
                    out.push_str(", ");
                }
                out.push_str(name.as_str());
                out.push('=');
                // `to_str` succeeded, so the value is ASCII and any byte
                // index is a char boundary.
                out.push_str(&text[..text.len().min(MAX_HEADER_VALUE_LEN)]);
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// The query parameter names, comma-separated, when recording them was
    /// asked for and the URI has any.
    pub(crate) fn query_names(&self, uri: &Uri) -> Option<String> {
        if !self.query_names {
            return None;
        }
        let names: Vec<&str> = redact::query_param_names(uri).collect();
        (!names.is_empty()).then(|| names.join(","))
    }
}

/// Builds a [`TraceLayer`] (and, from it, the matching
/// [`AttemptTraceLayer`]); made by [`TraceLayer::builder`].
///
/// # Errors
///
/// [`build`](Self::build) fails with a configuration error when a header is
/// both denied and allowed, when the request-id header is denied, or when the
/// attempt-number header is denied or reserved (`Host`, `Content-Length`,
/// ...).
#[derive(Clone)]
pub struct TraceBuilder {
    deny: HeaderDenyList,
    allow: Vec<HeaderName>,
    request_id: Option<HeaderName>,
    query_names: bool,
    attempt_header: Option<HeaderName>,
    path: PathRedaction,
}

impl fmt::Debug for TraceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceBuilder")
            .field("deny", &self.deny)
            .field("allow", &self.allow)
            .field("request_id", &self.request_id)
            .field("query_names", &self.query_names)
            .field("attempt_header", &self.attempt_header)
            .field("path", &self.path)
            .finish()
    }
}

impl Default for TraceBuilder {
    fn default() -> Self {
        let cfg = Config::default();
        TraceBuilder {
            deny: cfg.deny,
            allow: Vec::new(),
            request_id: cfg.request_id,
            query_names: cfg.query_names,
            attempt_header: cfg.attempt_header,
            path: cfg.path,
        }
    }
}

impl TraceBuilder {
    /// Add `name` to the deny-list: its values are never recorded and are
    /// marked sensitive on every request and response.
    ///
    /// Default: [`HeaderDenyList::default`] (`Authorization`,
    /// `Proxy-Authorization`, `Cookie`, `Set-Cookie`, `x-api-key`, `api-key`,
    /// `x-auth-token`, `x-amz-security-token`, `x-goog-api-key`, and every
    /// header whose name says `token`, `secret`, `password`, `session`,
    /// `signature`, `api-key` or `auth`).
    pub fn deny_header(mut self, name: HeaderName) -> Self {
        self.deny = self.deny.with(name);
        self
    }

    /// Replace the deny-list. The credential headers of
    /// [`redact::ALWAYS_SENSITIVE`] stay on it whatever `list` is.
    pub fn deny_list(mut self, list: HeaderDenyList) -> Self {
        self.deny = list;
        self
    }

    /// Record the values of the headers `names` (request headers on the
    /// request span, response headers on the request and attempt spans), as
    /// `http.request.headers` / `http.response.headers`. Values are cut at
    /// 256 bytes; values that are not visible ASCII or are marked sensitive
    /// are skipped.
    ///
    /// Default: none; no header value is recorded.
    pub fn record_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.allow.extend(names);
        self
    }

    /// Take the request id from header `name` into the span's `request_id`
    /// field.
    ///
    /// Default: `x-request-id`.
    pub fn request_id_header(mut self, name: HeaderName) -> Self {
        self.request_id = Some(name);
        self
    }

    /// Do not record a request id.
    pub fn no_request_id(mut self) -> Self {
        self.request_id = None;
        self
    }

    /// Record the **names** of the query parameters (never their values) as
    /// `url.query_names`. An API that puts a bare token in the query makes
    /// the token a "name", so this is opt-in.
    ///
    /// Default: `false`; nothing of the query is recorded.
    pub fn record_query_names(mut self, yes: bool) -> Self {
        self.query_names = yes;
        self
    }

    /// Have the [`AttemptTraceLayer`] send the attempt number (`1`, `2`,
    /// ...) upstream in header `name` on every attempt, so server logs can
    /// tell a retry from a first try.
    ///
    /// Default: off.
    pub fn send_attempt_header(mut self, name: HeaderName) -> Self {
        self.attempt_header = Some(name);
        self
    }

    /// How the URL path is shown, in the spans' and events' `url.path` and
    /// in the `Display` and `Debug` of every error that passes through the
    /// trace layers: as it is, hidden, by template, or by a closure (see
    /// [`PathRedaction`]). One setting for all three, so a secret in a path
    /// (`/v1/keys/<secret>`) appears in none of them.
    ///
    /// Default: [`PathRedaction::full`], the path as it is.
    pub fn path_redaction(mut self, redaction: PathRedaction) -> Self {
        self.path = redaction;
        self
    }

    /// Check the configuration and build the layer.
    ///
    /// # Errors
    ///
    /// See the [type docs](Self).
    pub fn build(self) -> Result<TraceLayer, Error> {
        for name in &self.allow {
            if self.deny.contains(name) {
                return Err(Error::config(format!(
                    "header `{name}` is on the deny-list and cannot be recorded"
                )));
            }
        }
        if let Some(name) = &self.request_id {
            if self.deny.contains(name) {
                return Err(Error::config(format!(
                    "request-id header `{name}` is on the deny-list"
                )));
            }
        }
        if let Some(name) = &self.attempt_header {
            if self.deny.contains(name) || RESERVED.contains(name) {
                return Err(Error::config(format!(
                    "header `{name}` cannot carry the attempt number"
                )));
            }
        }
        Ok(TraceLayer::from_config(Arc::new(Config {
            deny: self.deny,
            allow: HeaderAllowList::new(self.allow),
            request_id: self.request_id,
            query_names: self.query_names,
            attempt_header: self.attempt_header,
            path: self.path,
        })))
    }
}

/// What an event needs to name its request when the span it belongs to is
/// disabled (DEBUG off): kept only then, and only when the event's level is
/// on. Clones are reference counts, not copies.
#[derive(Debug, Clone)]
pub(crate) struct RequestContext {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) request_id: Option<HeaderValue>,
}

impl RequestContext {
    pub(crate) fn new<B>(cfg: &Config, req: &Request<B>) -> Self {
        RequestContext {
            method: req.method().clone(),
            uri: req.uri().clone(),
            request_id: cfg
                .request_id(req.headers())
                .and_then(|id| HeaderValue::from_str(id).ok()),
        }
    }

    pub(crate) fn request_id(&self) -> Option<&str> {
        self.request_id.as_ref().and_then(|v| v.to_str().ok())
    }
}

/// The attempt-layer that shares this configuration.
pub(crate) fn attempt_layer(cfg: &Arc<Config>) -> AttemptTraceLayer {
    AttemptTraceLayer::from_config(cfg.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn build_rejects_what_cannot_work() {
        let denied = TraceLayer::builder().record_headers([header::AUTHORIZATION]);
        let e = denied.build().unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Config));
        assert!(e.to_string().contains("authorization"), "{e}");

        let e = TraceLayer::builder()
            .deny_header(HeaderName::from_static("x-trace"))
            .request_id_header(HeaderName::from_static("x-trace"))
            .build()
            .unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Config));

        for bad in [header::HOST, header::CONTENT_LENGTH, header::COOKIE] {
            let e = TraceLayer::builder()
                .send_attempt_header(bad)
                .build()
                .unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::Config));
        }

        // Replacing the deny-list keeps the credential headers on it.
        let e = TraceLayer::builder()
            .deny_list(HeaderDenyList::minimal())
            .record_headers([header::SET_COOKIE])
            .build()
            .unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Config));

        assert!(TraceLayer::builder()
            .record_headers([header::ACCEPT])
            .send_attempt_header(HeaderName::from_static("x-attempt"))
            .build()
            .is_ok());
    }

    #[test]
    fn request_id_must_be_short_printable_and_not_sensitive() {
        let cfg = Config::default();
        let mut h = HeaderMap::new();
        assert_eq!(cfg.request_id(&h), None);
        h.insert("x-request-id", HeaderValue::from_static("abc-1"));
        assert_eq!(cfg.request_id(&h), Some("abc-1"));
        h.insert(
            "x-request-id",
            HeaderValue::from_str(&"a".repeat(129)).unwrap(),
        );
        assert_eq!(cfg.request_id(&h), None);
        let mut v = HeaderValue::from_static("abc-2");
        v.set_sensitive(true);
        h.insert("x-request-id", v);
        assert_eq!(cfg.request_id(&h), None);
        h.insert(
            "x-request-id",
            HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert_eq!(cfg.request_id(&h), None);
    }

    #[test]
    fn recorded_headers_only_from_the_allow_list() {
        let mut cfg = Config::default();
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("text/plain"));
        h.insert("x-long", HeaderValue::from_str(&"b".repeat(300)).unwrap());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer SECRET"),
        );
        assert_eq!(cfg.recorded_headers(&h), None);
        cfg.allow = HeaderAllowList::new([
            header::ACCEPT,
            HeaderName::from_static("x-long"),
            header::AUTHORIZATION,
            header::USER_AGENT,
        ]);
        let shown = cfg.recorded_headers(&h).unwrap();
        assert!(
            shown.starts_with("accept=text/plain, x-long=bbb"),
            "{shown}"
        );
        assert_eq!(shown.len(), "accept=text/plain, x-long=".len() + 256);
        assert!(!shown.contains("SECRET"));
    }

    #[test]
    fn query_names_opt_in() {
        let mut cfg = Config::default();
        let uri: Uri = "/x?api_key=SECRET&page=2".parse().unwrap();
        assert_eq!(cfg.query_names(&uri), None);
        cfg.query_names = true;
        assert_eq!(cfg.query_names(&uri).as_deref(), Some("api_key,page"));
        assert_eq!(cfg.query_names(&"/x".parse().unwrap()), None);
    }
}
