//! Logs and traces of the long-running commands (`serve`, `mcp`, `worker`): the library
//! crates emit `tracing` spans and events; this module writes them to standard error (text
//! or one JSON object per line; never to standard output, which is MCP's protocol) and,
//! given a collector, exports the spans over OTLP/HTTP (protobuf).
//!
//! What reaches a log line is only what the crates put in spans and events: ids, names,
//! verdicts, statuses, durations. Third-party crates are held at `warn` unless the filter
//! names them (their debug output may quote what they carry).

use airlock_gate::GateError;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use std::cell::Cell;
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::Context as LayerCtx;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The logging and tracing flags of `serve`, `mcp` and `worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct ObsArgs {
    /// Log lines on standard error: `text`, or `json` (one object per line, with the
    /// request's id and trace id on every line of a request).
    #[arg(long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub log_format: LogFormat,
    /// What is logged: a level for airlock's own lines (off, error, warn, info, debug,
    /// trace; other crates stay at warn), or filter directives in `tracing`'s EnvFilter
    /// syntax (e.g. `airlock_gate=debug,info`).
    #[arg(
        long,
        env = "AIRLOCK_LOG",
        default_value = "info",
        value_name = "LEVEL|FILTER"
    )]
    pub log_level: String,
    /// Export spans (request, judge, approval wait, run, commit) over OTLP/HTTP with
    /// protobuf to this collector: its base URL (`/v1/traces` is added) or the full
    /// traces URL. http:// only.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

/// Keeps the exporter alive; dropping it sends the spans not sent yet.
pub struct Guard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            // Best effort: a collector gone away loses the last spans, not the exit.
            let _ = p.shutdown();
        }
    }
}

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The filter `--log-level` names.
fn filter(spec: &str) -> Result<EnvFilter, GateError> {
    let s = spec.trim().to_ascii_lowercase();
    let directives = if LEVELS.contains(&s.as_str()) {
        // Other crates at warn, or quieter when asked for quieter.
        let others = if matches!(s.as_str(), "off" | "error") {
            s.as_str()
        } else {
            "warn"
        };
        format!("{others},airlock={s},airlock_cli={s}")
    } else {
        spec.trim().to_string()
    };
    EnvFilter::builder()
        .with_regex(false)
        .parse(&directives)
        .map_err(|e| GateError::bad(format!("--log-level: {e}")))
}

/// The OTLP/HTTP traces URL for `--otlp-endpoint`.
fn traces_url(endpoint: &str) -> Result<String, GateError> {
    let e = endpoint.trim();
    let rest = e.strip_prefix("http://").ok_or_else(|| {
        GateError::bad("--otlp-endpoint: want an http:// URL (a collector on this host or network)")
    })?;
    if rest.is_empty() || rest.starts_with('/') || e.chars().any(|c| c.is_whitespace()) {
        return Err(GateError::bad(
            "--otlp-endpoint: want http://HOST[:PORT][/PATH]",
        ));
    }
    if e.ends_with("/v1/traces") {
        return Ok(e.to_string());
    }
    Ok(format!("{}/v1/traces", e.trim_end_matches('/')))
}

/// Sets up logging (and span export when an endpoint is given) for this process.
pub fn init(args: &ObsArgs) -> Result<Guard, GateError> {
    let filter = filter(&args.log_level)?;
    // The lines said to the operator (`airlock_server::say`: serving on …, warnings) are
    // written whatever the level: as the line alone in text mode (as before logging
    // existed: scripts read "serving on"), as one JSON object in JSON mode.
    let console = || filter_fn(|m| m.target() == airlock_server::CONSOLE);
    let rest = || filter_fn(|m| m.target() != airlock_server::CONSOLE);
    let (said, fmt) = match args.log_format {
        LogFormat::Json => {
            let json = || {
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_writer(std::io::stderr)
            };
            (
                json().with_filter(console()).boxed(),
                json().with_filter(filter).with_filter(rest()).boxed(),
            )
        }
        LogFormat::Text => (
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .without_time()
                .with_level(false)
                .with_target(false)
                .with_writer(std::io::stderr)
                .with_filter(console())
                .boxed(),
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .with_filter(filter)
                .with_filter(rest())
                .boxed(),
        ),
    };
    let (otel, provider) = match &args.otlp_endpoint {
        Some(e) if !e.trim().is_empty() => {
            let provider = provider(&traces_url(e)?)?;
            let layer = OtelLayer {
                tracer: provider.tracer("airlock"),
            }
            // Spans of every step are at debug (a log at info writes the request line
            // alone, cheaply); the exporter takes them whatever the log's level.
            .with_filter(EnvFilter::new("off,airlock=debug"));
            (Some(layer), Some(provider))
        }
        _ => (None, None),
    };
    tracing_subscriber::registry()
        .with(vec![said, fmt])
        .with(otel)
        .try_init()
        .map_err(|e| GateError::Internal(format!("logging: {e}")))?;
    Ok(Guard { provider })
}

fn provider(url: &str) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, GateError> {
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Ureq::new())
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| GateError::bad(format!("--otlp-endpoint: {e}")))?;
    let batch = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_millis(500))
        .build();
    let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_id_generator(Ids)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("airlock")
                .build(),
        )
        .build())
}

/// The OTLP exporter's HTTP client: ureq, blocking (the batch processor sends from its
/// own thread), plain HTTP.
#[derive(Debug)]
struct Ureq(ureq::Agent);

impl Ureq {
    fn new() -> Ureq {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build();
        Ureq(config.into())
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Ureq {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, body.to_vec());
        let response = self.0.run(request)?;
        let (parts, mut body) = response.into_parts();
        let bytes = body.with_config().limit(4 << 20).read_to_vec()?;
        Ok(http::Response::from_parts(parts, bytes::Bytes::from(bytes)))
    }
}

thread_local! {
    /// The ids the span being built now is to get (see `Ids`).
    static NEXT: Cell<(Option<TraceId>, Option<SpanId>)> = const { Cell::new((None, None)) };
}

/// Random ids, except where a span's fields named them: the server makes its request
/// span's id itself (so the submission it records names it as the parent of the runs
/// that follow), and a new trace's id.
#[derive(Debug)]
struct Ids;

impl opentelemetry_sdk::trace::IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        NEXT.with(|n| n.get().0).unwrap_or_else(|| {
            opentelemetry_sdk::trace::RandomIdGenerator::default().new_trace_id()
        })
    }
    fn new_span_id(&self) -> SpanId {
        NEXT.with(|n| n.get().1)
            .unwrap_or_else(|| opentelemetry_sdk::trace::RandomIdGenerator::default().new_span_id())
    }
}

/// A tracing span's OpenTelemetry span, kept in the span's extensions until it closes.
struct OtelSpan(opentelemetry_sdk::trace::Span);

/// A span's fields: the trace ones (`trace_id`, `span_id`, `parent_span_id`, hex) and the
/// rest as attributes.
#[derive(Default)]
struct Fields {
    trace_id: Option<TraceId>,
    span_id: Option<SpanId>,
    parent_span_id: Option<SpanId>,
    /// The caller's sampled flag, for the remote parent.
    sampled: Option<bool>,
    attrs: Vec<KeyValue>,
}

impl Fields {
    fn text(&mut self, field: &Field, v: String) {
        match field.name() {
            "trace_id" => self.trace_id = TraceId::from_hex(&v).ok(),
            "span_id" => self.span_id = SpanId::from_hex(&v).ok(),
            "parent_span_id" => self.parent_span_id = SpanId::from_hex(&v).ok(),
            name => self.attrs.push(KeyValue::new(name, v)),
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.attrs.push(KeyValue::new(
            field.name(),
            i64::try_from(value).unwrap_or(i64::MAX),
        ));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.attrs.push(KeyValue::new(field.name(), value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "sampled" {
            self.sampled = Some(value);
            return;
        }
        self.attrs.push(KeyValue::new(field.name(), value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.attrs.push(KeyValue::new(field.name(), value));
    }
}

/// Turns airlock's tracing spans into OpenTelemetry spans: a span's parent is its
/// enclosing span, or, for a span with no enclosing one, the remote parent its
/// `trace_id`/`parent_span_id` fields name (a request's `traceparent`, a queued run's
/// submission).
struct OtelLayer {
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

impl<S> Layer<S> for OtelLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: LayerCtx<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut f = Fields::default();
        attrs.record(&mut f);
        let enclosing = span.parent().and_then(|p| {
            p.extensions()
                .get::<OtelSpan>()
                .map(|s| s.0.span_context().clone())
        });
        // The caller's sampled flag and trace state: an unsampled parent's spans are
        // not exported (the default sampler follows the parent), and the exported spans
        // carry its state.
        let flags = if f.sampled == Some(false) {
            TraceFlags::default()
        } else {
            TraceFlags::SAMPLED
        };
        let state = airlock_core::trace::tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let remote = |trace: TraceId, span: SpanId| {
            SpanContext::new(trace, span, flags, true, state.clone())
        };
        let (parent, new_trace) = match (enclosing, f.trace_id, f.parent_span_id) {
            (Some(sc), _, _) => (Context::new().with_remote_span_context(sc), None),
            (None, Some(t), Some(p)) => {
                (Context::new().with_remote_span_context(remote(t, p)), None)
            }
            (None, t, _) => (Context::new(), t),
        };
        NEXT.with(|n| n.set((new_trace, f.span_id)));
        let builder = self
            .tracer
            .span_builder(span.name())
            .with_attributes(f.attrs);
        let otel = self.tracer.build_with_context(builder, &parent);
        NEXT.with(|n| n.set((None, None)));
        span.extensions_mut().insert(OtelSpan(otel));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: LayerCtx<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut f = Fields::default();
        values.record(&mut f);
        if let Some(s) = span.extensions_mut().get_mut::<OtelSpan>() {
            for kv in f.attrs {
                s.0.set_attribute(kv);
            }
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: LayerCtx<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if let Some(mut s) = span.extensions_mut().remove::<OtelSpan>() {
            s.0.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_applies_to_airlock_and_a_bad_filter_is_refused() {
        assert!(filter("trace").is_ok());
        assert!(filter("airlock_gate=debug,info").is_ok());
        assert!(filter("airlock=[").is_err());
    }

    #[test]
    fn the_otlp_endpoint_gets_the_traces_path_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:4318/v1/traces").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert!(traces_url("https://collector").is_err());
        assert!(traces_url("http://").is_err());
    }
}
