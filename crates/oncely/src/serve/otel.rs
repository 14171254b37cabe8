//! OpenTelemetry traces over OTLP/HTTP (protobuf), when the config has `[tracing]`.
//!
//! The guard makes the spans (`oncely_tower::trace`); this module only sends them. A
//! finished span goes into a bounded queue without waiting (`try_send`): a full queue
//! drops it and counts it in `oncely_trace_spans_dropped_total{reason="queue_full"}`. One
//! task takes spans off the queue, and POSTs them in batches of at most `max_batch`, every
//! `schedule_delay` or as soon as a batch is full, one request at a time, each bounded by
//! `export_timeout`, over the gateway's own hyper client (the same TLS setup as upstreams).
//! A batch the collector does not take (unreachable, an error status, too slow) is dropped
//! and counted (`reason="export_failed"`); spans are not retried, so a dead or hanging
//! collector costs requests nothing: while it hangs, the queue fills and spans are dropped.
//! `oncely_trace_spans_exported_total` counts what the collector took.
//!
//! On shutdown the task sends what is queued once more, within a short deadline.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request};
use http_body_util::{BodyExt, Limited};
use oncely_tower::trace::{AttributeValue, SpanData, SpanKind, SpanSink, Tracer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message;
use tokio::sync::{mpsc, watch};

use super::proxy::UpstreamClient;
use crate::config::tracing::Tracing;

/// How long the last export on shutdown may take.
const FINAL_EXPORT: Duration = Duration::from_secs(2);
/// How much of a collector's answer is read (it is only drained).
const MAX_ANSWER: usize = 64 << 10;

/// The sink the guard's tracer hands spans to: the export queue's sending end.
struct Queue {
    tx: mpsc::Sender<SpanData>,
    full: metrics::Counter,
}

impl SpanSink for Queue {
    fn submit(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.full.increment(1);
        }
    }
}

/// The running exporter: its tracer for the guard, and its task.
pub struct Exporter {
    tracer: Arc<Tracer>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    /// Starts exporting to `config`'s collector with `headers` (its
    /// [`Tracing::export_headers`]); `instance` names this gateway in the spans' resource
    /// (`service.instance.id`).
    pub fn start(
        config: &Tracing,
        headers: Vec<(http::HeaderName, HeaderValue)>,
        client: UpstreamClient,
        instance: &str,
    ) -> Exporter {
        // The counters below are bound to the recorder installed now, so install it first.
        let _ = super::prometheus::handle();
        describe();
        let (tx, rx) = mpsc::channel(config.max_queue);
        let sink = Arc::new(Queue {
            tx,
            full: metrics::counter!("oncely_trace_spans_dropped_total", "reason" => "queue_full"),
        });
        let tracer = Arc::new(Tracer::new(sink, config.sample_ratio()));
        let (stop, stopped) = watch::channel(false);
        let batch = Batch {
            client,
            headers,
            config: config.clone(),
            resource: resource(&config.service_name, instance),
            failing: false,
        };
        let task = tokio::spawn(batch.run(rx, stopped));
        Exporter { tracer, stop, task }
    }

    /// The tracer to put on the guard.
    pub fn tracer(&self) -> Arc<Tracer> {
        self.tracer.clone()
    }

    /// Sends what is queued (within a short deadline) and stops.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(FINAL_EXPORT + Duration::from_millis(200), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

fn describe() {
    metrics::describe_counter!(
        "oncely_trace_spans_dropped_total",
        "Trace spans dropped, by reason (queue_full: the export queue was full; export_failed: the collector did not take them)"
    );
    metrics::describe_counter!(
        "oncely_trace_spans_exported_total",
        "Trace spans the OTLP collector took"
    );
    for reason in ["queue_full", "export_failed"] {
        metrics::counter!("oncely_trace_spans_dropped_total", "reason" => reason).increment(0);
    }
    metrics::counter!("oncely_trace_spans_exported_total").increment(0);
}

fn resource(service_name: &str, instance: &str) -> Resource {
    Resource {
        attributes: vec![
            key_value(
                "service.name",
                AttributeValue::Str(service_name.to_string()),
            ),
            key_value(
                "service.version",
                AttributeValue::Str(env!("CARGO_PKG_VERSION").to_string()),
            ),
            key_value(
                "service.instance.id",
                AttributeValue::Str(instance.to_string()),
            ),
        ],
        ..Resource::default()
    }
}

/// The export task's state.
struct Batch {
    client: UpstreamClient,
    /// `headers` and those of `headers_env`.
    headers: Vec<(http::HeaderName, HeaderValue)>,
    config: Tracing,
    resource: Resource,
    /// The last export failed (so the next failure is not logged at warn again).
    failing: bool,
}

impl Batch {
    async fn run(mut self, mut rx: mpsc::Receiver<SpanData>, mut stop: watch::Receiver<bool>) {
        let max = self.config.max_batch;
        let mut spans: Vec<SpanData> = Vec::with_capacity(max.min(1024));
        let mut tick = tokio::time::interval(self.config.schedule_delay);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let room = max - spans.len();
            tokio::select! {
                n = rx.recv_many(&mut spans, room) => {
                    if n == 0 {
                        break;
                    }
                    if spans.len() >= max {
                        self.export(std::mem::take(&mut spans), self.config.export_timeout).await;
                    }
                }
                _ = tick.tick() => {
                    if !spans.is_empty() {
                        self.export(std::mem::take(&mut spans), self.config.export_timeout).await;
                    }
                }
                _ = stop.changed() => break,
            }
        }
        // Last: what is queued now, once, within the shutdown's deadline.
        let deadline = tokio::time::Instant::now() + FINAL_EXPORT;
        while let Ok(span) = rx.try_recv() {
            spans.push(span);
        }
        for chunk in spans.chunks(max) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                metrics::counter!("oncely_trace_spans_dropped_total", "reason" => "export_failed")
                    .increment(chunk.len() as u64);
                continue;
            }
            self.export(chunk.to_vec(), left.min(self.config.export_timeout))
                .await;
        }
    }

    /// POSTs one batch; counts it exported or dropped.
    async fn export(&mut self, spans: Vec<SpanData>, limit: Duration) {
        let n = spans.len() as u64;
        let body = encode(&self.resource, spans);
        let mut req = Request::new(oncely_tower::body::full(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.config.traces_url.clone();
        let h = req.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        for (name, value) in &self.headers {
            h.insert(name.clone(), value.clone());
        }
        let client = self.client.clone();
        let sent = tokio::time::timeout(limit, async move {
            let res = client.send(req).await.map_err(|e| e.to_string())?;
            let status = res.status();
            // Drained so that the connection can be used again.
            drain(res.into_body()).await;
            if status.is_success() {
                Ok(())
            } else {
                Err(format!("the collector answered {status}"))
            }
        })
        .await
        .unwrap_or_else(|_| Err(format!("the collector did not answer within {limit:?}")));
        match sent {
            Ok(()) => {
                metrics::counter!("oncely_trace_spans_exported_total").increment(n);
                if self.failing {
                    tracing::info!(target: "oncely::otel", "exporting traces again");
                    self.failing = false;
                }
            }
            Err(why) => {
                metrics::counter!("oncely_trace_spans_dropped_total", "reason" => "export_failed")
                    .increment(n);
                if self.failing {
                    tracing::debug!(target: "oncely::otel", spans = n, error = %why, "trace export failed; spans dropped");
                } else {
                    tracing::warn!(target: "oncely::otel", spans = n, error = %why, url = %self.config.traces_url, "trace export failed; spans dropped (logged again at debug until an export succeeds)");
                    self.failing = true;
                }
            }
        }
    }
}

/// One `ExportTraceServiceRequest` with these spans.
fn encode(resource: &Resource, spans: Vec<SpanData>) -> Vec<u8> {
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "oncely".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                spans: spans.into_iter().map(span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    request.encode_to_vec()
}

fn span(s: SpanData) -> Span {
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        trace_state: s.trace_state.unwrap_or_default(),
        parent_span_id: s.parent_span_id.map(|p| p.to_vec()).unwrap_or_default(),
        name: s.name,
        kind: match s.kind {
            SpanKind::Server => span::SpanKind::Server,
            SpanKind::Client => span::SpanKind::Client,
        } as i32,
        start_time_unix_nano: unix_nanos(s.start),
        end_time_unix_nano: unix_nanos(s.end),
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| key_value(k, v))
            .collect(),
        status: s.error.map(|message| Status {
            message,
            code: status::StatusCode::Error as i32,
        }),
        ..Span::default()
    }
}

fn key_value(key: &str, value: AttributeValue) -> KeyValue {
    let value = match value {
        AttributeValue::Str(s) => any_value::Value::StringValue(s),
        AttributeValue::Int(i) => any_value::Value::IntValue(i),
    };
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Reads up to [`MAX_ANSWER`] of an answer and drops it, so that its connection can be
/// used again. A combinator, boxed: an `async` block that collects a boxed-error body
/// cannot be proven `Send` for every lifetime of the error type (rust-lang/rust#64552).
fn drain(body: oncely_tower::BoxBody) -> futures::future::BoxFuture<'static, ()> {
    use futures::FutureExt as _;
    Box::pin(Limited::new(body, MAX_ANSWER).collect().map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_encode_as_otlp_protobuf() {
        let data = SpanData {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: Some([3; 8]),
            trace_state: Some("v=1".into()),
            name: "POST /v1/render".into(),
            kind: SpanKind::Server,
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(1),
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(2),
            attributes: vec![
                ("oncely.decision", AttributeValue::Str("fresh".into())),
                ("oncely.attempt", AttributeValue::Int(1)),
            ],
            error: Some("boom".into()),
        };
        let bytes = encode(&resource("svc", "inst_1"), vec![data]);
        let back = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let rs = &back.resource_spans[0];
        let service = &rs.resource.as_ref().unwrap().attributes[0];
        assert_eq!(service.key, "service.name");
        let s = &rs.scope_spans[0].spans[0];
        assert_eq!(s.trace_id, vec![1; 16]);
        assert_eq!(s.parent_span_id, vec![3; 8]);
        assert_eq!(s.kind, span::SpanKind::Server as i32);
        assert_eq!(s.start_time_unix_nano, 1_000_000_000);
        assert_eq!(s.end_time_unix_nano, 2_000_000_000);
        assert_eq!(s.attributes[1].key, "oncely.attempt");
        assert_eq!(
            s.attributes[1].value.as_ref().unwrap().value,
            Some(any_value::Value::IntValue(1))
        );
        assert_eq!(
            s.status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
    }
}
