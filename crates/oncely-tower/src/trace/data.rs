//! A finished span as a sink receives it ([`SpanData`]), and what it is to its trace
//! ([`SpanKind`]).

use std::time::SystemTime;

use super::attr::AttributeValue;

/// What a span is to its trace (OTLP's `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A request the gateway received.
    Server,
    /// A request the gateway sent.
    Client,
}

/// A finished span, as a [`SpanSink`] receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanData {
    /// The trace.
    pub trace_id: [u8; 16],
    /// This span.
    pub span_id: [u8; 8],
    /// The span it runs under, if any (the caller's, for a continued trace).
    pub parent_span_id: Option<[u8; 8]>,
    /// The `tracestate` it continued, if any.
    pub trace_state: Option<String>,
    /// The span's name.
    pub name: String,
    /// Server or client.
    pub kind: SpanKind,
    /// When it started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Its attributes, in the order they were set.
    pub attributes: Vec<(&'static str, AttributeValue)>,
    /// Why it failed, when it did (OTLP status `ERROR` with this message).
    pub error: Option<String>,
    /// Spans it links to (trace id, span id): a replay's or a join's link to the span
    /// that executed the original.
    pub links: Vec<([u8; 16], [u8; 8])>,
}
