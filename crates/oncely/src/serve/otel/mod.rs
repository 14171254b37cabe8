//! OpenTelemetry export, built on the `opentelemetry_sdk` and `opentelemetry-otlp` crates
//! from one resolved [`Telemetry`] (the file's `[tracing]` over the `OTEL_*` variables).
//!
//! The guard records its spans with `oncely_tower::trace` (cheap structs, no SDK types on
//! the request path); [`Spans`], the tracer's sink, turns each finished one into the SDK's
//! `SpanData` and hands it to the SDK's `BatchSpanProcessor`, which batches and exports it
//! with the OTLP exporter of the configured protocol (gRPC over tonic, HTTP protobuf or
//! JSON over [`transport::ExportClient`]). Sampling is the SDK's sampler
//! (`OTEL_TRACES_SAMPLER`), asked once per request ([`SdkSampler`]).
//!
//! Never in the way: a span is handed over without waiting. At most `max_queue` spans
//! wait for export ([`Spans`] keeps the count, so the processor's own queue never
//! overflows); a span that finds it full is dropped and counted in
//! `oncely_trace_spans_dropped_total{reason="queue_full"}`. A batch the collector does
//! not take (down, refusing, slower than the export timeout) is dropped and counted
//! (`reason="export_failed"`); `oncely_trace_spans_exported_total` counts what it took.
//! Exports run on the processor's thread, so a dead or hanging collector only fills the
//! queue.
//!
//! Metrics over OTLP ([`metrics`]) mirror the instruments of `/metrics`.

pub mod metrics;
mod protobuf;
mod transport;

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use oncely_tower::trace::{
    AttributeValue, Sample, SpanData, SpanKind, SpanSink, TraceParent, Tracer,
};
use opentelemetry::trace::{
    SpanContext, SpanId, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SamplingDecision, ShouldSample as _, SpanExporter,
    SpanProcessor as _,
};
use opentelemetry_sdk::Resource;

use crate::config::telemetry::{Export, Telemetry};
use crate::config::tracing::{Protocol, Sampler};
use protobuf::ProtobufSpans;

/// How long the last export on shutdown may take.
const FINAL_EXPORT: Duration = Duration::from_secs(2);

/// The running export: the tracer for the guard, and the pipelines to stop.
pub struct Exporter {
    tracer: Option<Arc<Tracer>>,
    spans: Option<Arc<Spans>>,
    metrics: Option<metrics::MetricsExport>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    /// Starts exporting what `telemetry` turns on; `instance` names this process in the
    /// resource (`service.instance.id`). Must run inside the Tokio runtime (the gRPC
    /// channel and the HTTP client spawn onto it).
    pub fn start(telemetry: &Telemetry, instance: &str) -> anyhow::Result<Exporter> {
        // The counters below are bound to the recorder installed now, so install it first.
        let _ = super::prometheus::handle();
        describe();
        let resource = resource(telemetry, instance);
        // Metrics first: handles registered from now on are mirrored over OTLP.
        let metrics = match &telemetry.metrics {
            Some(export) => Some(metrics::MetricsExport::start(telemetry, export, &resource)?),
            None => None,
        };
        let (tracer, spans) = match &telemetry.traces {
            Some(export) => {
                let spans = Arc::new(Spans::start(telemetry, export, &resource)?);
                let tracer = Arc::new(Tracer::with_sampler(
                    spans.clone(),
                    Arc::new(SdkSampler(sampler(telemetry.sampler))),
                ));
                (Some(tracer), Some(spans))
            }
            None => (None, None),
        };
        Ok(Exporter {
            tracer,
            spans,
            metrics,
        })
    }

    /// The tracer to put on the guard, when traces are on.
    pub fn tracer(&self) -> Option<Arc<Tracer>> {
        self.tracer.clone()
    }

    /// Sends what is waiting (within a short deadline) and stops.
    pub async fn stop(self) {
        let Exporter { spans, metrics, .. } = self;
        let stopping = tokio::task::spawn_blocking(move || {
            if let Some(spans) = spans {
                let _ = spans.processor.shutdown_with_timeout(FINAL_EXPORT);
            }
            if let Some(metrics) = metrics {
                metrics.stop(FINAL_EXPORT);
            }
        });
        let _ = tokio::time::timeout(FINAL_EXPORT * 2 + Duration::from_millis(200), stopping).await;
    }
}

fn describe() {
    ::metrics::describe_counter!(
        "oncely_trace_spans_dropped_total",
        "Trace spans dropped, by reason (queue_full: the export queue was full; export_failed: the collector did not take them)"
    );
    ::metrics::describe_counter!(
        "oncely_trace_spans_exported_total",
        "Trace spans the OTLP collector took"
    );
    for reason in ["queue_full", "export_failed"] {
        ::metrics::counter!("oncely_trace_spans_dropped_total", "reason" => reason).increment(0);
    }
    ::metrics::counter!("oncely_trace_spans_exported_total").increment(0);
}

/// The resource: what the telemetry resolved (`service.name` first), the version, this
/// process, and the SDK's own attributes. Built empty, not by the SDK's detectors, which
/// would read `OTEL_SERVICE_NAME` over the file.
fn resource(telemetry: &Telemetry, instance: &str) -> Resource {
    let mut attributes: Vec<KeyValue> = telemetry
        .resource
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    let has = |key: &str| telemetry.resource.iter().any(|(k, _)| k == key);
    if !has("service.version") {
        attributes.push(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    }
    if !has("service.instance.id") {
        attributes.push(KeyValue::new("service.instance.id", instance.to_string()));
    }
    attributes.push(KeyValue::new("telemetry.sdk.name", "opentelemetry"));
    attributes.push(KeyValue::new("telemetry.sdk.language", "rust"));
    attributes.push(KeyValue::new("telemetry.sdk.version", "0.33"));
    Resource::builder_empty()
        .with_attributes(attributes)
        .build()
}

fn sampler(s: Sampler) -> opentelemetry_sdk::trace::Sampler {
    use opentelemetry_sdk::trace::Sampler as S;
    let ratio = |millionths: u32| f64::from(millionths) / 1_000_000.0;
    match s {
        Sampler::AlwaysOn => S::AlwaysOn,
        Sampler::AlwaysOff => S::AlwaysOff,
        Sampler::TraceIdRatio(r) => S::TraceIdRatioBased(ratio(r)),
        Sampler::ParentBasedAlwaysOn => S::ParentBased(Box::new(S::AlwaysOn)),
        Sampler::ParentBasedAlwaysOff => S::ParentBased(Box::new(S::AlwaysOff)),
        Sampler::ParentBasedTraceIdRatio(r) => {
            S::ParentBased(Box::new(S::TraceIdRatioBased(ratio(r))))
        }
    }
}

/// The SDK's sampler, asked with the caller's span as a remote parent.
#[derive(Debug)]
struct SdkSampler(opentelemetry_sdk::trace::Sampler);

impl Sample for SdkSampler {
    fn sample(&self, trace_id: [u8; 16], parent: Option<&TraceParent>, name: &str) -> bool {
        let trace_id = TraceId::from_bytes(trace_id);
        let cx = parent.map(|p| {
            let flags = if p.sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            };
            opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                SpanId::from_bytes(p.parent_id),
                flags,
                true,
                TraceState::default(),
            ))
        });
        let result = self.0.should_sample(
            cx.as_ref(),
            trace_id,
            name,
            &opentelemetry::trace::SpanKind::Server,
            &[],
            &[],
        );
        result.decision == SamplingDecision::RecordAndSample
    }
}

/// The tracer's sink: spans into the SDK's batch processor, at most `max_queue` waiting.
struct Spans {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    waiting: Arc<AtomicUsize>,
    max_queue: usize,
    full: ::metrics::Counter,
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spans").finish_non_exhaustive()
    }
}

impl Spans {
    fn start(telemetry: &Telemetry, export: &Export, resource: &Resource) -> anyhow::Result<Spans> {
        let waiting = Arc::new(AtomicUsize::new(0));
        // The processor's bound on an export (OTEL_BSP_EXPORT_TIMEOUT) is kept by the
        // exporter's own timeout: the processor's thread has none of its own.
        let export = Export {
            timeout: export.timeout.min(telemetry.batch.export_timeout),
            ..export.clone()
        };
        let exporter = Counted {
            inner: span_exporter(&export)?,
            waiting: waiting.clone(),
            exported: ::metrics::counter!("oncely_trace_spans_exported_total"),
            failed: ::metrics::counter!("oncely_trace_spans_dropped_total", "reason" => "export_failed"),
        };
        let b = telemetry.batch;
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(b.max_queue)
            .with_max_export_batch_size(b.max_batch)
            .with_scheduled_delay(b.schedule_delay)
            .build();
        let mut processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        processor.set_resource(resource);
        Ok(Spans {
            processor,
            scope: InstrumentationScope::builder("oncely")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            waiting,
            max_queue: b.max_queue,
            full: ::metrics::counter!("oncely_trace_spans_dropped_total", "reason" => "queue_full"),
        })
    }
}

impl SpanSink for Spans {
    fn submit(&self, span: SpanData) {
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            self.full.increment(1);
            return;
        }
        self.processor.on_end(sdk_span(span, &self.scope));
    }
}

/// A span as the SDK exports it.
fn sdk_span(s: SpanData, scope: &InstrumentationScope) -> opentelemetry_sdk::trace::SpanData {
    let state = s
        .trace_state
        .as_deref()
        .and_then(|t| t.parse::<TraceState>().ok())
        .unwrap_or_default();
    let kind = match s.kind {
        SpanKind::Server => opentelemetry::trace::SpanKind::Server,
        SpanKind::Client => opentelemetry::trace::SpanKind::Client,
    };
    let remote_parent = s.kind == SpanKind::Server && s.parent_span_id.is_some();
    opentelemetry_sdk::trace::SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(s.trace_id),
            SpanId::from_bytes(s.span_id),
            TraceFlags::SAMPLED,
            false,
            state,
        ),
        parent_span_id: s.parent_span_id.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: remote_parent,
        span_kind: kind,
        name: Cow::Owned(s.name),
        start_time: s.start,
        end_time: s.end,
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| match v {
                AttributeValue::Str(text) => KeyValue::new(k, text),
                AttributeValue::Fixed(text) => KeyValue::new(k, text),
                AttributeValue::Int(i) => KeyValue::new(k, i),
                AttributeValue::Bool(b) => KeyValue::new(k, b),
            })
            .collect(),
        dropped_attributes_count: 0,
        events: Default::default(),
        links: {
            let mut links = opentelemetry_sdk::trace::SpanLinks::default();
            links.links = s
                .links
                .into_iter()
                .map(|(trace, span)| {
                    opentelemetry::trace::Link::with_context(SpanContext::new(
                        TraceId::from_bytes(trace),
                        SpanId::from_bytes(span),
                        TraceFlags::SAMPLED,
                        true,
                        TraceState::default(),
                    ))
                })
                .collect();
            links
        },
        status: match s.error {
            Some(message) => Status::error(message),
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

/// The OTLP span exporter of `export`'s protocol, configured with every resolved value
/// (a value given to the builder wins over the crate's own reading of the variables):
/// the crate's for gRPC and HTTP/JSON, [`protobuf`]'s for HTTP/protobuf.
fn span_exporter(export: &Export) -> anyhow::Result<Exporters> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let built = match export.protocol {
        Protocol::HttpProtobuf => {
            return Ok(Exporters::Protobuf(Box::new(ProtobufSpans::new(export)?)))
        }
        Protocol::Grpc => transport::grpc_builder(builder.with_tonic(), export, "traces")?.build(),
        Protocol::HttpJson => {
            transport::http_builder(builder.with_http(), export, "traces")?.build()
        }
    };
    Ok(Exporters::Crate(Box::new(
        built.context("the OTLP span exporter")?,
    )))
}

/// The span exporter of one protocol.
#[derive(Debug)]
enum Exporters {
    /// `opentelemetry-otlp`'s (gRPC, HTTP/JSON).
    Crate(Box<opentelemetry_otlp::SpanExporter>),
    /// oncely's OTLP/HTTP protobuf encoder.
    Protobuf(Box<ProtobufSpans>),
}

impl SpanExporter for Exporters {
    async fn export(&self, batch: Vec<opentelemetry_sdk::trace::SpanData>) -> OTelSdkResult {
        match self {
            Exporters::Crate(e) => e.export(batch).await,
            Exporters::Protobuf(e) => e.export(batch).await,
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        match self {
            Exporters::Crate(e) => e.shutdown_with_timeout(timeout),
            Exporters::Protobuf(e) => e.shutdown_with_timeout(timeout),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        match self {
            Exporters::Crate(e) => e.set_resource(resource),
            Exporters::Protobuf(e) => e.set_resource(resource),
        }
    }
}

/// An exporter that counts what the collector took and what it did not, and frees the
/// spans' places in the queue.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    waiting: Arc<AtomicUsize>,
    exported: ::metrics::Counter,
    failed: ::metrics::Counter,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<opentelemetry_sdk::trace::SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.waiting.fetch_sub(n, Ordering::AcqRel);
        match &result {
            Ok(()) => self.exported.increment(n as u64),
            Err(e) => {
                self.failed.increment(n as u64);
                tracing::debug!(target: "oncely::otel", spans = n, error = %e, "trace export failed; spans dropped");
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_sampler_follows_the_parent_and_the_ratio() {
        let on = SdkSampler(sampler(Sampler::ParentBasedAlwaysOff));
        let parent = TraceParent {
            trace_id: [1; 16],
            parent_id: [2; 8],
            sampled: true,
        };
        assert!(on.sample([1; 16], Some(&parent), "x"));
        assert!(!on.sample([1; 16], None, "x"));
        let off = TraceParent {
            sampled: false,
            ..parent
        };
        assert!(!SdkSampler(sampler(Sampler::ParentBasedAlwaysOn)).sample(
            [1; 16],
            Some(&off),
            "x"
        ));
        assert!(SdkSampler(sampler(Sampler::AlwaysOn)).sample([1; 16], Some(&off), "x"));
        let half = SdkSampler(sampler(Sampler::TraceIdRatio(500_000)));
        let sampled = (0..1000u32)
            .filter(|_| half.sample(rand::random(), None, "x"))
            .count();
        assert!((350..650).contains(&sampled), "{sampled}");
    }
}
