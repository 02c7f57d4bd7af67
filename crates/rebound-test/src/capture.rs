//! Capture everything tracing emits, for assertions.
//!
//! [`Capture`] is a `tracing_subscriber` layer that keeps every span (its
//! name, level, parent and every field, including those recorded later) and
//! every event (level, message, fields, the span it happened in), at every
//! level down to TRACE. Install it for the current thread with
//! [`Capture::set_default`], run the code under test, then ask:
//!
//! ```
//! use rebound_test::capture::Capture;
//!
//! let capture = Capture::new();
//! {
//!     let _guard = capture.set_default();
//!     let span = tracing::debug_span!("call", "http.request.method" = "GET", status = tracing::field::Empty);
//!     let _entered = span.enter();
//!     span.record("status", 503);
//!     tracing::info!(attempt = 2, "retrying");
//! }
//! let span = capture.span("call").expect("span recorded");
//! assert_eq!(span.field("http.request.method"), Some("GET"));
//! assert_eq!(span.field("status"), Some("503"));
//! let event = &capture.events()[0];
//! assert_eq!(event.level, tracing::Level::INFO);
//! assert_eq!(event.message(), Some("retrying"));
//! assert_eq!(event.span.as_deref(), Some("call"));
//! assert_eq!(capture.count("retrying"), 1);
//! ```
//!
//! [`Capture::text`] renders everything captured (names, field names and
//! values, messages) into one string, which is what a "the secret appears
//! zero times" assertion should search: [`Capture::count`] does.
//!
//! The subscriber is thread-local (`tracing::subscriber::set_default`), so
//! tests running in parallel do not see each other's output; use a
//! current-thread runtime (the `#[tokio::test]` default).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A captured span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedSpan {
    /// The span's id while it was alive (ids are reused after close).
    pub id: u64,
    /// The span's name.
    pub name: String,
    /// Its level.
    pub level: Level,
    /// Its target (module path by default).
    pub target: String,
    /// The name of its parent span, if any.
    pub parent: Option<String>,
    /// Every field recorded, at creation or later, by name. Values are
    /// rendered: strings as is, everything else with `Debug` (which for a
    /// `%display` field is its `Display`).
    pub fields: BTreeMap<String, String>,
    /// Whether the span was closed (all handles dropped).
    pub closed: bool,
}

impl CapturedSpan {
    /// The rendered value of field `name`, if it was recorded.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// A captured event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedEvent {
    /// The event's level.
    pub level: Level,
    /// Its target.
    pub target: String,
    /// The name of the span it happened in, if any.
    pub span: Option<String>,
    /// The id of that span.
    pub span_id: Option<u64>,
    /// Every field by name, the message under `"message"`.
    pub fields: BTreeMap<String, String>,
}

impl CapturedEvent {
    /// The event's message, if it has one.
    pub fn message(&self) -> Option<&str> {
        self.field("message")
    }

    /// The rendered value of field `name`, if present.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Debug, Default)]
struct Store {
    spans: Vec<CapturedSpan>,
    events: Vec<CapturedEvent>,
}

/// A tracing layer that captures every span, field and event. Cheap to
/// clone: clones share what was captured.
///
/// See the [module docs](self).
#[derive(Clone, Default)]
pub struct Capture {
    store: Arc<Mutex<Store>>,
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let store = self.lock();
        f.debug_struct("Capture")
            .field("spans", &store.spans.len())
            .field("events", &store.events.len())
            .finish()
    }
}

impl Capture {
    /// An empty capture.
    pub fn new() -> Self {
        Capture::default()
    }

    /// Install a subscriber with only this layer, at TRACE, as the default
    /// for the current thread until the guard is dropped.
    ///
    /// Captures in one process are serialized: the guard also holds a
    /// process-wide lock, so that two tests capturing at once on different
    /// threads cannot disturb each other's callsite interest (tracing caches
    /// whether a callsite is enabled across all live subscribers, and a
    /// subscriber filtered at INFO on one thread could otherwise hide DEBUG
    /// spans from a capture on another).
    pub fn set_default(&self) -> CaptureGuard {
        let serial = serial_lock();
        let subscriber = tracing_subscriber::registry().with(self.clone());
        CaptureGuard {
            _default: tracing::subscriber::set_default(subscriber),
            _serial: serial,
        }
    }

    /// Like [`set_default`](Self::set_default), but only spans and events at
    /// `max` or more severe are enabled, as with a subscriber filtered at
    /// that level (`Level::INFO`: INFO, WARN, ERROR; DEBUG spans are then
    /// disabled).
    pub fn set_default_at(&self, max: Level) -> CaptureGuard {
        let serial = serial_lock();
        let subscriber = tracing_subscriber::registry()
            .with(LevelFilter::from_level(max))
            .with(self.clone());
        CaptureGuard {
            _default: tracing::subscriber::set_default(subscriber),
            _serial: serial,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // A test that panicked while holding the lock must not hide what
        // was captured from the next assertion.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every span captured so far, in creation order.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        self.lock().spans.clone()
    }

    /// Every span named `name`, in creation order.
    pub fn spans_named(&self, name: &str) -> Vec<CapturedSpan> {
        self.lock()
            .spans
            .iter()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }

    /// The first span named `name`.
    pub fn span(&self, name: &str) -> Option<CapturedSpan> {
        self.lock().spans.iter().find(|s| s.name == name).cloned()
    }

    /// Every event captured so far, in order.
    pub fn events(&self) -> Vec<CapturedEvent> {
        self.lock().events.clone()
    }

    /// The events at `level` or more severe (`Level::INFO` gives INFO, WARN
    /// and ERROR).
    pub fn events_at_least(&self, level: Level) -> Vec<CapturedEvent> {
        self.lock()
            .events
            .iter()
            .filter(|e| e.level <= level)
            .cloned()
            .collect()
    }

    /// The most severe level of any span or event captured, if any.
    pub fn max_level(&self) -> Option<Level> {
        let store = self.lock();
        store
            .spans
            .iter()
            .map(|s| s.level)
            .chain(store.events.iter().map(|e| e.level))
            .min()
    }

    /// Forget everything captured so far.
    pub fn clear(&self) {
        let mut store = self.lock();
        store.spans.clear();
        store.events.clear();
    }

    /// Everything captured, one line per span or event: level, name or
    /// target, the parent or enclosing span, and every field name and value.
    pub fn text(&self) -> String {
        use fmt::Write;
        let store = self.lock();
        let mut out = String::new();
        for s in &store.spans {
            let _ = write!(out, "SPAN {} {} {}", s.level, s.target, s.name);
            if let Some(p) = &s.parent {
                let _ = write!(out, " parent={p}");
            }
            for (k, v) in &s.fields {
                let _ = write!(out, " {k}={v}");
            }
            out.push('\n');
        }
        for e in &store.events {
            let _ = write!(out, "EVENT {} {}", e.level, e.target);
            if let Some(p) = &e.span {
                let _ = write!(out, " in={p}");
            }
            for (k, v) in &e.fields {
                let _ = write!(out, " {k}={v}");
            }
            out.push('\n');
        }
        out
    }

    /// How many times `needle` occurs in [`text`](Self::text).
    pub fn count(&self, needle: &str) -> usize {
        if needle.is_empty() {
            return 0;
        }
        self.text().matches(needle).count()
    }
}

struct FieldVisitor<'a>(&'a mut BTreeMap<String, String>);

impl Visit for FieldVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // Keep the whole chain: a secret in a source must be seen too.
        let mut text = value.to_string();
        let mut cur = value.source();
        while let Some(e) = cur {
            text.push_str(": ");
            text.push_str(&e.to_string());
            cur = e.source();
        }
        text.push_str(&format!(" {value:?}"));
        self.0.insert(field.name().to_owned(), text);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut FieldVisitor(&mut fields));
        let parent = if let Some(p) = attrs.parent() {
            ctx.span(p).map(|s| s.name().to_owned())
        } else if attrs.is_contextual() {
            ctx.lookup_current().map(|s| s.name().to_owned())
        } else {
            None
        };
        let meta = attrs.metadata();
        self.lock().spans.push(CapturedSpan {
            id: id.into_u64(),
            name: meta.name().to_owned(),
            level: *meta.level(),
            target: meta.target().to_owned(),
            parent,
            fields,
            closed: false,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut store = self.lock();
        if let Some(span) = store
            .spans
            .iter_mut()
            .rev()
            .find(|s| s.id == id.into_u64() && !s.closed)
        {
            values.record(&mut FieldVisitor(&mut span.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut FieldVisitor(&mut fields));
        let span = ctx.event_span(event);
        let meta = event.metadata();
        self.lock().events.push(CapturedEvent {
            level: *meta.level(),
            target: meta.target().to_owned(),
            span: span.as_ref().map(|s| s.name().to_owned()),
            span_id: span.as_ref().map(|s| s.id().into_u64()),
            fields,
        });
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let mut store = self.lock();
        if let Some(span) = store
            .spans
            .iter_mut()
            .rev()
            .find(|s| s.id == id.into_u64() && !s.closed)
        {
            span.closed = true;
        }
    }
}

/// Keeps a [`Capture`] installed as the thread's default subscriber; see
/// [`Capture::set_default`]. Dropping it uninstalls the capture and lets the
/// next capture in this process start.
#[must_use = "the capture is uninstalled when the guard is dropped"]
pub struct CaptureGuard {
    // Field order matters: the subscriber goes before the lock is released.
    _default: tracing::subscriber::DefaultGuard,
    _serial: MutexGuard<'static, ()>,
}

impl std::fmt::Debug for CaptureGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureGuard").finish_non_exhaustive()
    }
}

fn serial_lock() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    // A test that panicked while capturing must not block the others.
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_spans_fields_events_and_levels() {
        let capture = Capture::new();
        {
            let _g = capture.set_default();
            let outer = tracing::debug_span!("outer", a = 1, later = tracing::field::Empty);
            let _e = outer.enter();
            let inner = tracing::trace_span!("inner", b = %"shown");
            inner.in_scope(|| tracing::trace!(secret_field = "xyz", "deep"));
            outer.record("later", "recorded");
            tracing::warn!("careful");
        }
        let outer = capture.span("outer").unwrap();
        assert_eq!(outer.field("a"), Some("1"));
        assert_eq!(outer.field("later"), Some("recorded"));
        assert!(outer.closed);
        let inner = capture.span("inner").unwrap();
        assert_eq!(inner.parent.as_deref(), Some("outer"));
        assert_eq!(inner.level, Level::TRACE);
        assert_eq!(inner.field("b"), Some("shown"));
        let events = capture.events();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].span.as_deref(), Some("inner"));
        assert_eq!(events[0].field("secret_field"), Some("xyz"));
        assert_eq!(capture.count("xyz"), 1);
        assert_eq!(capture.max_level(), Some(Level::WARN));
        assert_eq!(capture.events_at_least(Level::INFO).len(), 1);
        capture.clear();
        assert!(capture.text().is_empty());
    }

    #[test]
    fn level_filter_disables_what_is_below() {
        let capture = Capture::new();
        {
            let _g = capture.set_default_at(Level::INFO);
            let span = tracing::debug_span!("quiet");
            assert!(span.is_disabled());
            let _e = span.enter();
            tracing::debug!("hidden");
            tracing::info!("shown");
        }
        assert!(capture.spans().is_empty());
        let events = capture.events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].message(), Some("shown"));
        assert_eq!(events[0].span, None);
    }

    #[test]
    fn errors_are_captured_with_their_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("outer")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let capture = Capture::new();
        {
            let _g = capture.set_default();
            let e = Outer(std::io::Error::other("inner-detail"));
            tracing::error!(error = &e as &(dyn std::error::Error + 'static), "failed");
        }
        assert_eq!(capture.count("inner-detail"), 2, "{}", capture.text());
    }
}
