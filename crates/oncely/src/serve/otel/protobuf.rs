//! The OTLP/HTTP protobuf span exporter: the one part of the export oncely keeps written
//! by hand, because the crate's costs twice as much per span (BENCHMARKS.md, "What the
//! SDK costs, part by part"). `opentelemetry-otlp` turns each batch into the generated
//! message types first (every key and text copied into a `String`, each span's scope
//! hashed) and encodes those; [`encode`] writes the SDK's `SpanData` straight into the
//! protobuf wire format, the resource and the scope encoded once. Everything else stays
//! the SDK's: the batch processor, the samplers, the resource, the variables; and the gRPC
//! and HTTP/JSON exporters are the crate's.
//!
//! An export is one POST of `application/x-protobuf` (gzip when configured) through the
//! [`ExportClient`]; a 429, 502, 503 or 504 is sent again with backoff (honouring
//! `Retry-After`) while the export's time lasts, as the OTLP specification asks and the
//! crate does.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_http::HttpClient as _;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::transport::ExportClient;
use crate::config::telemetry::Export;

/// The pause before the first resend of a batch the collector could not take yet, doubled
/// each time up to [`MAX_PAUSE`] (a `Retry-After` wins), within the export's timeout.
const FIRST_RESEND: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// The span exporter of OTLP/HTTP protobuf.
#[derive(Debug)]
pub(super) struct ProtobufSpans {
    client: ExportClient,
    url: http::Uri,
    gzip: bool,
    timeout: Duration,
    /// The encoded `Resource` message, set by the processor once.
    resource: Vec<u8>,
}

impl ProtobufSpans {
    /// The exporter of `export` (its endpoint is the full URL, `/v1/traces` included).
    pub(super) fn new(export: &Export) -> anyhow::Result<ProtobufSpans> {
        Ok(ProtobufSpans {
            client: ExportClient::new(export, tokio::runtime::Handle::current())?,
            url: export.endpoint.parse()?,
            gzip: export.gzip,
            timeout: export.timeout,
            resource: Vec::new(),
        })
    }

    fn request(&self, body: &Bytes) -> http::Request<Bytes> {
        let mut req = http::Request::post(self.url.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(body.clone())
            .expect("a valid request");
        if self.gzip {
            req.headers_mut()
                .insert(CONTENT_ENCODING, http::HeaderValue::from_static("gzip"));
        }
        req
    }
}

impl SpanExporter for ProtobufSpans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut body = encode(&self.resource, &batch);
        if self.gzip {
            body = gzip(&body).map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        }
        let body = Bytes::from(body);
        let started = Instant::now();
        let mut resends = 0;
        loop {
            let answer = self.client.send_bytes(self.request(&body)).await;
            let why = match answer {
                Ok(resp) if resp.status().is_success() => return Ok(()),
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let retry_after = resp
                        .headers()
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let left = self.timeout.saturating_sub(started.elapsed());
                    let wait = retry_after.unwrap_or_else(|| {
                        oncely_core::backoff::exponential(FIRST_RESEND, resends, MAX_PAUSE)
                    });
                    if matches!(status, 429 | 502 | 503 | 504) && wait < left {
                        self.client.pause(wait).await;
                        resends += 1;
                        continue;
                    }
                    format!("the collector answered {status}")
                }
                Err(e) => e.to_string(),
            };
            return Err(OTelSdkError::InternalFailure(why));
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        let mut out = Vec::new();
        for (key, value) in resource.iter() {
            nested(&mut out, 1, |out| key_value(out, key.as_str(), value));
        }
        self.resource = out;
    }
}

fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body)?;
    gz.finish()
}

/// `ExportTraceServiceRequest` of `spans`, under the encoded `resource`: one
/// `ResourceSpans`, one `ScopeSpans` per run of spans with the same scope.
pub(super) fn encode(resource: &[u8], spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + spans.len() * 640);
    nested(&mut out, 1, |out| {
        // ResourceSpans.resource
        nested(out, 1, |out| out.extend_from_slice(resource));
        let mut rest = spans;
        while let Some(first) = rest.first() {
            let scope = &first.instrumentation_scope;
            let run = rest
                .iter()
                .position(|s| &s.instrumentation_scope != scope)
                .unwrap_or(rest.len());
            // ResourceSpans.scope_spans
            nested(out, 2, |out| {
                nested(out, 1, |out| instrumentation_scope(out, scope));
                for span in &rest[..run] {
                    nested(out, 2, |out| encode_span(out, span));
                }
                string(out, 3, scope.schema_url().unwrap_or_default());
            });
            rest = &rest[run..];
        }
    });
    out
}

fn instrumentation_scope(out: &mut Vec<u8>, scope: &InstrumentationScope) {
    string(out, 1, scope.name());
    string(out, 2, scope.version().unwrap_or_default());
    for kv in scope.attributes() {
        nested(out, 3, |out| key_value(out, kv.key.as_str(), &kv.value));
    }
}

/// A `Span` message (opentelemetry/proto/trace/v1/trace.proto).
fn encode_span(out: &mut Vec<u8>, s: &SpanData) {
    let context = &s.span_context;
    bytes(out, 1, &context.trace_id().to_bytes());
    bytes(out, 2, &context.span_id().to_bytes());
    string(out, 3, &context.trace_state().header());
    if s.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        bytes(out, 4, &s.parent_span_id.to_bytes());
    }
    string(out, 5, &s.name);
    let kind = match s.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    uint(out, 6, kind);
    fixed64(out, 7, nanos(s.start_time));
    fixed64(out, 8, nanos(s.end_time));
    attributes(out, 9, &s.attributes);
    uint(out, 10, u64::from(s.dropped_attributes_count));
    for event in s.events.iter() {
        nested(out, 11, |out| {
            fixed64(out, 1, nanos(event.timestamp));
            string(out, 2, &event.name);
            attributes(out, 3, &event.attributes);
            uint(out, 4, u64::from(event.dropped_attributes_count));
        });
    }
    uint(out, 12, u64::from(s.events.dropped_count));
    for link in s.links.iter() {
        nested(out, 13, |out| {
            let c = &link.span_context;
            bytes(out, 1, &c.trace_id().to_bytes());
            bytes(out, 2, &c.span_id().to_bytes());
            string(out, 3, &c.trace_state().header());
            attributes(out, 4, &link.attributes);
            uint(out, 5, u64::from(link.dropped_attributes_count));
            fixed32(out, 6, flags(c.is_remote(), c.trace_flags().to_u8()));
        });
    }
    uint(out, 14, u64::from(s.links.dropped_count));
    nested(out, 15, |out| {
        let (code, message) = match &s.status {
            Status::Unset => (0, ""),
            Status::Ok => (1, ""),
            Status::Error { description } => (2, description.as_ref()),
        };
        string(out, 2, message);
        uint(out, 3, code);
    });
    fixed32(
        out,
        16,
        flags(s.parent_span_is_remote, context.trace_flags().to_u8()),
    );
}

/// The span flags: the W3C trace flags, and that the parent's remoteness is known.
fn flags(remote: bool, trace_flags: u8) -> u32 {
    const HAS_IS_REMOTE: u32 = 0x100;
    const IS_REMOTE: u32 = 0x200;
    u32::from(trace_flags) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn attributes(out: &mut Vec<u8>, field: u32, list: &[KeyValue]) {
    for kv in list {
        nested(out, field, |out| key_value(out, kv.key.as_str(), &kv.value));
    }
}

/// A `KeyValue`: the key, and the value as an `AnyValue`.
fn key_value(out: &mut Vec<u8>, key: &str, value: &Value) {
    string(out, 1, key);
    nested(out, 2, |out| any_value(out, value));
}

/// An `AnyValue`: its one field is written even when it holds the default.
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(s) => {
            tag(out, 1, 2);
            varint(out, s.as_str().len() as u64);
            out.extend_from_slice(s.as_str().as_bytes());
        }
        Value::Bool(b) => {
            tag(out, 2, 0);
            varint(out, u64::from(*b));
        }
        Value::I64(i) => {
            tag(out, 3, 0);
            varint(out, *i as u64);
        }
        Value::F64(f) => {
            tag(out, 4, 1);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::Array(array) => nested(out, 5, |out| {
            let values: Vec<Value> = match array {
                Array::Bool(v) => v.iter().copied().map(Value::Bool).collect(),
                Array::I64(v) => v.iter().copied().map(Value::I64).collect(),
                Array::F64(v) => v.iter().copied().map(Value::F64).collect(),
                Array::String(v) => v.iter().cloned().map(Value::String).collect(),
                _ => Vec::new(),
            };
            for v in &values {
                nested(out, 1, |out| any_value(out, v));
            }
        }),
        _ => {}
    }
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field holding what `content` writes: written in place after a
/// one-byte length, which grows (the content moved up) when the content is 128 bytes or
/// more. No allocation: most fields of a span (a key, a value) are short.
fn nested(out: &mut Vec<u8>, field: u32, content: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, 2);
    let at = out.len();
    out.push(0);
    content(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
        return;
    }
    let mut prefix = [0u8; 10];
    let (mut n, mut v) = (0, len as u64);
    while v >= 0x80 {
        prefix[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    prefix[n] = v as u8;
    n += 1;
    let end = out.len();
    out.resize(end + n - 1, 0);
    out.copy_within(at + 1..end, at + n);
    out[at..at + n].copy_from_slice(&prefix[..n]);
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    if !b.is_empty() {
        tag(out, field, 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(out, field, 0);
        varint(out, v);
    }
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        tag(out, field, 1);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    if v != 0 {
        tag(out, field, 5);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Link, SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use prost::Message as _;
    use std::borrow::Cow;

    fn span(
        name: &'static str,
        remote: bool,
        status: Status,
        scope: &InstrumentationScope,
    ) -> SpanData {
        let context = SpanContext::new(
            TraceId::from_bytes([7; 16]),
            SpanId::from_bytes([8; 8]),
            TraceFlags::SAMPLED,
            false,
            "vendor=1,other=two".parse::<TraceState>().unwrap(),
        );
        let mut links = opentelemetry_sdk::trace::SpanLinks::default();
        links.links.push(Link::with_context(SpanContext::new(
            TraceId::from_bytes([1; 16]),
            SpanId::from_bytes([2; 8]),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )));
        SpanData {
            span_context: context,
            parent_span_id: if remote {
                SpanId::from_bytes([9; 8])
            } else {
                SpanId::INVALID
            },
            parent_span_is_remote: remote,
            span_kind: if remote {
                SpanKind::Server
            } else {
                SpanKind::Client
            },
            name: Cow::Borrowed(name),
            start_time: UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789),
            end_time: UNIX_EPOCH + Duration::from_nanos(1_700_000_000_223_456_789),
            attributes: vec![
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.response.status_code", 200),
                KeyValue::new("oncely.attempt", -3),
                KeyValue::new("empty", ""),
                KeyValue::new("flag", false),
                KeyValue::new("ratio", 0.25),
                KeyValue::new("zero", 0),
                KeyValue::new("ünï", "cödé ✓"),
                KeyValue::new(
                    "list",
                    Value::Array(Array::String(vec!["a".into(), "b".into()])),
                ),
            ],
            dropped_attributes_count: 0,
            events: Default::default(),
            links,
            status,
            instrumentation_scope: scope.clone(),
        }
    }

    /// The bytes written here decode to the very message the crate's own conversion
    /// builds, for spans with every kind of value, links, statuses and two scopes.
    #[test]
    fn the_encoding_is_the_crates_message_byte_for_meaning() {
        let ours = InstrumentationScope::builder("oncely")
            .with_version("1.2")
            .build();
        let other = InstrumentationScope::builder("other")
            .with_attributes([KeyValue::new("k", "v")])
            .build();
        let batch = vec![
            span(
                "POST /v1/render",
                true,
                Status::error("upstream answered 503"),
                &ours,
            ),
            span("POST", false, Status::Unset, &ours),
            span("ok", false, Status::Ok, &other),
        ];
        let resource = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "oncely"),
                KeyValue::new("service.instance.id", "i-1"),
            ])
            .build();
        let mut exporter_resource = Vec::new();
        for (key, value) in resource.iter() {
            nested(&mut exporter_resource, 1, |out| {
                key_value(out, key.as_str(), value)
            });
        }
        let got = ExportTraceServiceRequest::decode(&encode(&exporter_resource, &batch)[..])
            .expect("our bytes decode");
        let want = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                batch,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(got, want);
        assert_eq!(got.resource_spans[0].scope_spans.len(), 2);
    }

    /// A collector on 127.0.0.1 that answers the first `busy` exports with `status` (and
    /// `Retry-After: 0`), then 200; it counts the exports and keeps the last body.
    async fn collector(
        busy: usize,
        status: u16,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = seen.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let n = {
                        let mut kept = kept.lock().unwrap();
                        kept.push(body.to_vec());
                        kept.len()
                    };
                    let code = if n <= busy { status } else { 200 };
                    (
                        http::StatusCode::from_u16(code).unwrap(),
                        [(http::header::RETRY_AFTER, "0")],
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/v1/traces"), seen)
    }

    fn exporter(endpoint: String) -> ProtobufSpans {
        ProtobufSpans::new(&Export {
            protocol: crate::config::tracing::Protocol::HttpProtobuf,
            endpoint,
            headers: Vec::new(),
            gzip: false,
            overridden_gzip: None,
            timeout: Duration::from_secs(5),
            certificate: None,
            client_identity: None,
        })
        .unwrap()
    }

    /// Exports `batch` as the batch processor does: on a thread of its own, outside the
    /// runtime (no timer, no reactor).
    fn export_off_runtime(exporter: ProtobufSpans, batch: Vec<SpanData>) -> OTelSdkResult {
        std::thread::spawn(move || futures::executor::block_on(exporter.export(batch)))
            .join()
            .expect("the export does not panic")
    }

    /// A collector that is busy (429, 503) gets the batch again, the same bytes; one that
    /// refuses it (400) does not, and the export fails (the spans are counted dropped).
    /// Exported from outside the runtime, as the batch processor's thread does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_collector_gets_the_batch_again_and_a_refusing_one_does_not() {
        let scope = InstrumentationScope::builder("oncely").build();
        let batch = || vec![span("x", false, Status::Unset, &scope)];
        for status in [429, 503] {
            let (url, seen) = collector(2, status).await;
            let result = export_off_runtime(exporter(url), batch());
            assert!(result.is_ok(), "{status}: {result:?}");
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 3, "{status}: two resends");
            assert!(
                seen.iter().all(|b| b == &seen[0]),
                "the same batch each time"
            );
            let decoded = ExportTraceServiceRequest::decode(&seen[0][..]).unwrap();
            assert_eq!(decoded.resource_spans[0].scope_spans[0].spans[0].name, "x");
        }
        let (url, seen) = collector(1, 400).await;
        assert!(export_off_runtime(exporter(url), batch()).is_err());
        assert_eq!(seen.lock().unwrap().len(), 1, "a refusal is not sent again");
    }

    #[test]
    fn varints_and_lengths_are_the_wire_formats() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut out = Vec::new();
        nested(&mut out, 2, |out| out.extend(std::iter::repeat_n(7u8, 200)));
        assert_eq!(&out[..3], &[0x12, 0xc8, 0x01]);
        assert_eq!(out.len(), 203);
        assert!(
            out[3..].iter().all(|&b| b == 7),
            "the content moved up whole"
        );
        let mut out = Vec::new();
        nested(&mut out, 1, |out| out.extend([1, 2, 3]));
        assert_eq!(out, [0x0a, 3, 1, 2, 3]);
        let mut out = Vec::new();
        nested(&mut out, 1, |out| {
            out.extend(std::iter::repeat_n(9u8, 20_000))
        });
        assert_eq!(&out[..4], &[0x0a, 0xa0, 0x9c, 0x01]);
        assert_eq!(out.len(), 20_004);
    }
}
