//! Traces over OTLP/HTTP (protobuf), configured by OpenTelemetry's standard environment
//! variables (ADR 0035). `sift serve` exports when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used
//! as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended) is set, unless
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The exporter and the SDK read the
//! rest themselves: `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `OTEL_TRACES_SAMPLER` (and
//! `_ARG`), `OTEL_BSP_SCHEDULE_DELAY` and the other batch settings, `OTEL_SERVICE_NAME`
//! (default `sift`) and `OTEL_RESOURCE_ATTRIBUTES`.
//!
//! Every `tracing` span the log filter lets through becomes an OpenTelemetry span: the public
//! request (`request`, a caller's `traceparent` its parent), the search root and each shard's
//! leaf, a shard request to another node and its serving side there (the trace context goes
//! with it: [`sift_actors::trace_context`]), embedding, each agent step and each model call.

use std::sync::OnceLock;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetryLayer;

/// The provider, once export is on: flushed and shut down by [`shutdown`].
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether the environment asks for trace export.
pub fn wanted(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| env(name).is_some_and(|value| !value.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|value| value.trim() == "true")
        || env("OTEL_TRACES_EXPORTER").is_some_and(|value| value.trim() == "none");
    !disabled && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// The layer that exports spans, when the environment asks for it ([`wanted`]); it also
/// installs the W3C trace-context propagator. An endpoint that is not a URL is an error.
pub fn layer<S>() -> Result<Option<OpenTelemetryLayer<S, SdkTracer>>, String>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    if !wanted(|name| std::env::var(name).ok()) {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|error| format!("trace export (OTLP): {error}"))?;
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "sift".to_string());
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ])
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sift");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let _ = PROVIDER.set(provider);
    Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
}

/// Sends the spans still queued and stops the exporter (at the end of `sift serve`; outside
/// the async runtime, as the exporter's blocking client needs).
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.shutdown()
    {
        eprintln!("warning: trace export: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_is_on_with_an_endpoint_and_not_when_disabled() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| value.to_string())
            }
        };
        assert!(!wanted(with(&[])));
        assert!(!wanted(with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(wanted(with(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(wanted(with(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
        assert!(!wanted(with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ])));
        assert!(!wanted(with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])));
    }
}
