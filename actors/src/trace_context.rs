//! The W3C trace context (`traceparent`, `tracestate`) across processes. A node puts it on
//! the shard requests it sends to other nodes and reads it from the public and internal
//! requests it serves, so that one trace follows a request through the cluster. Without
//! trace export (the node's `traces` module installs the propagator only then) the global
//! propagator is OpenTelemetry's no-op: nothing is written and nothing read.

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Writes the current span's trace context into `headers`.
pub fn inject(headers: &mut HeaderMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut HeaderInjector(headers));
    });
}

/// Makes the trace context carried by `headers` the parent of `span`, which must not have
/// started yet. A missing or malformed `traceparent` leaves `span` the root of a new trace.
pub fn adopt(span: &tracing::Span, headers: &HeaderMap) {
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    });
    if parent.span().span_context().is_valid() {
        // Fails only without the OpenTelemetry layer, when there is nothing to parent.
        let _ = span.set_parent(parent);
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}
