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
}
