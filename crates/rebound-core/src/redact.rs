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

use std::fmt;

use std::sync::Arc;

use http::header::{self, Entry, HeaderMap, HeaderName};
use http::uri::{Authority, Scheme};
use http::Uri;

/// A URL with its userinfo, query and fragment removed; safe to log.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RedactedUri {
    scheme: Option<Scheme>,
    host: Option<String>,
    port: Option<u16>,
    path: String,
}

impl RedactedUri {
    /// Redact `uri`.
    pub fn new(uri: &Uri) -> Self {
        RedactedUri {
            scheme: uri.scheme().cloned(),
            host: uri.host().map(str::to_owned),
            port: uri.port_u16(),
            path: uri.path().to_owned(),
        }
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

// ===== headers: what is never shown, what may be =====

/// Headers whose values are secrets in every deployment; always on a
/// [`HeaderDenyList`], whatever else it holds.
pub const ALWAYS_SENSITIVE: [HeaderName; 4] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::SET_COOKIE,
];

/// Headers whose values are never recorded and which are marked
/// [sensitive](http::HeaderValue::set_sensitive), so `Debug` of a request or
/// response prints `Sensitive` instead of the value.
///
/// It always holds [`ALWAYS_SENSITIVE`] (`Authorization`,
/// `Proxy-Authorization`, `Cookie`, `Set-Cookie`); the default list adds
/// `x-api-key`, `api-key` and `x-auth-token`. Cheap to clone (shared).
///
/// ```
/// use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
/// use rebound_core::redact::HeaderDenyList;
///
/// let deny = HeaderDenyList::default().with(HeaderName::from_static("x-session"));
/// let mut headers = HeaderMap::new();
/// headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer s3cret"));
/// headers.insert("x-session", HeaderValue::from_static("s3cret"));
/// deny.mark_sensitive(&mut headers);
/// assert!(!format!("{headers:?}").contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderDenyList {
    names: Arc<[HeaderName]>,
}

impl HeaderDenyList {
    /// Only [`ALWAYS_SENSITIVE`]; nothing can be removed from it.
    pub fn minimal() -> Self {
        HeaderDenyList {
            names: Arc::from(ALWAYS_SENSITIVE.to_vec()),
        }
    }

    /// The same list with `name` added (no-op if it is already there).
    pub fn with(self, name: HeaderName) -> Self {
        if self.contains(&name) {
            return self;
        }
        let mut names = self.names.to_vec();
        names.push(name);
        HeaderDenyList {
            names: Arc::from(names),
        }
    }

    /// Whether `name` is on the list.
    pub fn contains(&self, name: &HeaderName) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// The names on the list.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        self.names.iter()
    }

    /// Mark every value of every deny-listed header in `headers` as
    /// sensitive. See [`set_sensitive`].
    pub fn mark_sensitive(&self, headers: &mut HeaderMap) {
        set_sensitive(headers, self.names.iter());
    }
}

impl Default for HeaderDenyList {
    /// [`ALWAYS_SENSITIVE`] plus `x-api-key`, `api-key` and `x-auth-token`.
    fn default() -> Self {
        let mut names = ALWAYS_SENSITIVE.to_vec();
        names.extend([
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static("api-key"),
            HeaderName::from_static("x-auth-token"),
        ]);
        HeaderDenyList {
            names: Arc::from(names),
        }
    }
}

impl fmt::Debug for HeaderDenyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names.iter()).finish()
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
/// `c`), never their values. Empty names are skipped.
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
        .split('&')
        .map(|pair| pair.split_once('=').map_or(pair, |(name, _)| name))
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let uri: Uri = "http://h/p".parse().unwrap();
        assert_eq!(query_param_names(&uri).count(), 0);
    }

    #[test]
    fn allow_list_dedups() {
        let a = HeaderAllowList::new([header::ACCEPT, header::ACCEPT, header::USER_AGENT]);
        assert_eq!(a.names().count(), 2);
        assert!(HeaderAllowList::default().is_empty());
    }
}
