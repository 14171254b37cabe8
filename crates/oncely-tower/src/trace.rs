//! Traces: the W3C trace context a guarded request comes with and passes on, and the
//! spans it makes. The guard only builds [`SpanData`] and hands each finished span to a
//! [`SpanSink`]; sending them somewhere (OTLP in the binary) is the sink's business, and
//! a sink never blocks: a span it cannot keep is dropped.
//!
//! A guarded request gets a server span (its route, the decision — the `Oncely-Status`
//! value —, record id, attempt, principal hash, upstream status), and its upstream call a
//! client span under it. The upstream receives a `traceparent` naming that client span:
//! the caller's trace continued when the caller sent a valid `traceparent` (same trace
//! id, new span id, its sampled flag), a new trace otherwise. A malformed `traceparent` is
//! never passed on; nor is the `tracestate` of a trace that was not continued.
//!
//! Without a [`Tracer`] on the guard nothing here runs, and headers pass as they came.

use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, HeaderValue};

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C vendor trace state header.
pub const TRACESTATE: &str = "tracestate";

/// A valid W3C `traceparent`: the trace, the caller's span in it, whether it is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The span that sent the request: 8 bytes, not all zero.
    pub parent_id: [u8; 8],
    /// The `sampled` trace flag.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C Trace Context (level 1) says: version 2
    /// lower-case hex digits (not `ff`; `00` has exactly four fields, a later version
    /// may add fields after a `-`), trace id 32 and parent id 16 lower-case hex digits,
    /// neither all zeros, flags 2 hex digits. `None` for anything else.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = trim(value);
        if value.len() < 55 {
            return None;
        }
        let version = &value[0..2];
        if !lower_hex(version) || version == b"ff" {
            return None;
        }
        if version == b"00" && value.len() != 55 {
            return None;
        }
        if value.len() > 55 && value[55] != b'-' {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let (trace, parent, flags) = (&value[3..35], &value[36..52], &value[53..55]);
        if !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut parent_id = [0u8; 8];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(parent, &mut parent_id).ok()?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        let mut flag = [0u8; 1];
        hex::decode_to_slice(flags, &mut flag).ok()?;
        Some(TraceParent {
            trace_id,
            parent_id,
            sampled: flag[0] & 1 == 1,
        })
    }

    /// The header value, version `00`.
    pub fn to_header(&self) -> HeaderValue {
        let text = format!(
            "00-{}-{}-{}",
            hex::encode(self.trace_id),
            hex::encode(self.parent_id),
            if self.sampled { "01" } else { "00" }
        );
        HeaderValue::from_str(&text).expect("hex is a valid header value")
    }
}

/// The most bytes of a span's name, a text attribute or an error message: a value from a
/// caller (an MCP tool's name) must not make a span, and the batch it is exported in,
/// larger than a collector takes.
const MAX_TEXT: usize = 1024;

/// `text` cut to [`MAX_TEXT`] bytes at a character boundary, `…` marking the cut.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The most of a `tracestate` passed on: what the W3C asks every vendor to propagate.
const TRACESTATE_MAX_LEN: usize = 512;
/// The most list members a `tracestate` has.
const TRACESTATE_MAX_MEMBERS: usize = 32;

/// The caller's `tracestate` as the W3C list: several headers are one list; a list with
/// a malformed member is dropped whole (never passed on invalid); a valid one keeps its
/// first members up to 32 and 512 characters, so that a hostile one swells neither the
/// upstream's request nor the exported spans.
pub fn trace_state(headers: &HeaderMap) -> Option<String> {
    let mut kept = String::new();
    let mut count = 0;
    let mut full = false;
    for value in headers.get_all(TRACESTATE) {
        let value = value.to_str().ok()?;
        for member in value.split(',').map(|m| m.trim_matches([' ', '\t'])) {
            if member.is_empty() {
                continue;
            }
            if !tracestate_member(member) {
                return None;
            }
            let len = kept.len() + usize::from(!kept.is_empty()) + member.len();
            if full || count == TRACESTATE_MAX_MEMBERS || len > TRACESTATE_MAX_LEN {
                full = true;
                continue;
            }
            if !kept.is_empty() {
                kept.push(',');
            }
            kept.push_str(member);
            count += 1;
        }
    }
    (!kept.is_empty()).then_some(kept)
}

/// One `key=value` list member: the key lower-case letters, digits and `_-*/` (with at
/// most one `@`, for a tenant), starting with a letter or a digit, at most 256; the value
/// 1 to 256 printable ASCII characters but `,` and `=`, not ending with a space.
fn tracestate_member(member: &str) -> bool {
    let Some((key, value)) = member.split_once('=') else {
        return false;
    };
    let key_ok = (1..=256).contains(&key.len())
        && key
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b))
        && key.bytes().filter(|b| *b == b'@').count() <= 1;
    let value_ok = (1..=256).contains(&value.len())
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=');
    key_ok && value_ok
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &v[start..end]
}

fn lower_hex(v: &[u8]) -> bool {
    v.iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// What a span is to its trace (OTLP's `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A request the gateway received.
    Server,
    /// A request the gateway sent.
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    /// Text.
    Str(String),
    /// A whole number.
    Int(i64),
}

impl From<&str> for AttributeValue {
    fn from(v: &str) -> Self {
        AttributeValue::Str(v.to_string())
    }
}

impl From<String> for AttributeValue {
    fn from(v: String) -> Self {
        AttributeValue::Str(v)
    }
}

impl From<i64> for AttributeValue {
    fn from(v: i64) -> Self {
        AttributeValue::Int(v)
    }
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
}

/// Where finished spans go. `submit` must return at once: a sink that cannot keep a span
/// drops it (and counts it), it never makes a request wait.
pub trait SpanSink: Send + Sync + 'static {
    /// Takes one finished, sampled span.
    fn submit(&self, span: SpanData);
}

/// Decides whether a server span is recorded and exported (an OpenTelemetry sampler: the
/// binary's is the SDK's, as `OTEL_TRACES_SAMPLER` names it). Called once per request,
/// with the trace id (the caller's, or a new one) and the caller's span when the trace
/// is continued; the request's children share its decision.
pub trait Sample: Send + Sync + 'static {
    /// Whether the span named `name` in trace `trace_id` is sampled.
    fn sample(&self, trace_id: [u8; 16], parent: Option<&TraceParent>, name: &str) -> bool;
}

/// A parent-based ratio sampler: a continued trace keeps its caller's sampled flag; a new
/// one is sampled when the last 8 bytes of its id, as a number, are below the threshold
/// (`u64::MAX` samples all, 0 none).
#[derive(Debug, Clone, Copy)]
pub struct ParentOrRatio {
    threshold: u64,
}

impl ParentOrRatio {
    /// Samples `ratio` (0 to 1) of new traces.
    pub fn new(ratio: f64) -> ParentOrRatio {
        let threshold = if ratio >= 1.0 {
            u64::MAX
        } else if ratio > 0.0 {
            (ratio * u64::MAX as f64) as u64
        } else {
            0
        };
        ParentOrRatio { threshold }
    }
}

impl Sample for ParentOrRatio {
    fn sample(&self, trace_id: [u8; 16], parent: Option<&TraceParent>, _: &str) -> bool {
        match parent {
            Some(p) => p.sampled,
            None => {
                let low = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes"));
                self.threshold == u64::MAX || low < self.threshold
            }
        }
    }
}

/// Starts the spans of guarded requests, samples them with its [`Sample`], and hands
/// finished spans to its sink.
pub struct Tracer {
    sink: Arc<dyn SpanSink>,
    sampler: Arc<dyn Sample>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").finish_non_exhaustive()
    }
}

impl Tracer {
    /// A tracer that samples `ratio` (0 to 1) of new traces into `sink` (a continued
    /// trace keeps its caller's sampled flag).
    pub fn new(sink: Arc<dyn SpanSink>, ratio: f64) -> Tracer {
        Tracer::with_sampler(sink, Arc::new(ParentOrRatio::new(ratio)))
    }

    /// A tracer that samples with `sampler` into `sink`.
    pub fn with_sampler(sink: Arc<dyn SpanSink>, sampler: Arc<dyn Sample>) -> Tracer {
        Tracer { sink, sampler }
    }

    /// The server span of a request with these headers: a child of the caller's span
    /// when its `traceparent` is valid, else the root of a new trace.
    pub fn start_request(self: &Arc<Self>, headers: &HeaderMap, name: String) -> Span {
        let name = bounded(name);
        let parent = headers
            .get(TRACEPARENT)
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        let (trace_id, parent_id, trace_state) = match &parent {
            Some(p) => (p.trace_id, Some(p.parent_id), trace_state(headers)),
            None => (new_trace_id(), None, None),
        };
        let sampled = self.sampler.sample(trace_id, parent.as_ref(), &name);
        Span {
            tracer: self.clone(),
            data: SpanData {
                trace_id,
                span_id: new_span_id(),
                parent_span_id: parent_id,
                trace_state,
                name,
                kind: SpanKind::Server,
                start: SystemTime::now(),
                end: SystemTime::UNIX_EPOCH,
                attributes: Vec::new(),
                error: None,
            },
            sampled,
        }
    }

    /// The span a `traceparent` this gateway wrote earlier names as parent (a queued job's
    /// submission), continued by a new client span; `None` without a valid one.
    pub fn start_client_under(self: &Arc<Self>, headers: &HeaderMap, name: String) -> Option<Span> {
        let name = bounded(name);
        let parent = TraceParent::parse(headers.get(TRACEPARENT)?.as_bytes())?;
        Some(Span {
            tracer: self.clone(),
            data: SpanData {
                trace_id: parent.trace_id,
                span_id: new_span_id(),
                parent_span_id: Some(parent.parent_id),
                trace_state: trace_state(headers),
                name,
                kind: SpanKind::Client,
                start: SystemTime::now(),
                end: SystemTime::UNIX_EPOCH,
                attributes: Vec::new(),
                error: None,
            },
            sampled: parent.sampled,
        })
    }
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

/// A span's place in its trace, to start children from later (on another task).
#[derive(Debug, Clone)]
pub struct SpanParent {
    tracer: Arc<Tracer>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    trace_state: Option<String>,
    sampled: bool,
}

impl SpanParent {
    /// A child span, starting now.
    pub fn child(&self, name: String, kind: SpanKind) -> Span {
        let name = bounded(name);
        Span {
            tracer: self.tracer.clone(),
            data: SpanData {
                trace_id: self.trace_id,
                span_id: new_span_id(),
                parent_span_id: Some(self.span_id),
                trace_state: self.trace_state.clone(),
                name,
                kind,
                start: SystemTime::now(),
                end: SystemTime::UNIX_EPOCH,
                attributes: Vec::new(),
                error: None,
            },
            sampled: self.sampled,
        }
    }

    /// The client span of an upstream call under this one, set as the `traceparent` (and
    /// `tracestate`) of the request to the upstream.
    pub fn upstream_call(&self, headers: &mut HeaderMap, method: &http::Method) -> ClientSpan {
        let mut span = self.child(format!("upstream {method}"), SpanKind::Client);
        span.set(attr::HTTP_METHOD, method.as_str());
        span.propagate(headers);
        ClientSpan::new(span)
    }
}

/// A span being recorded. [`Span::end`] hands it to the sink (when sampled); a span
/// dropped without `end` is not exported.
#[derive(Debug)]
pub struct Span {
    tracer: Arc<Tracer>,
    data: SpanData,
    sampled: bool,
}

impl Span {
    /// A child span of this one, starting now.
    pub fn child(&self, name: String, kind: SpanKind) -> Span {
        self.as_parent().child(name, kind)
    }

    /// What a child started later needs of this span.
    pub fn as_parent(&self) -> SpanParent {
        SpanParent {
            tracer: self.tracer.clone(),
            trace_id: self.data.trace_id,
            span_id: self.data.span_id,
            trace_state: self.data.trace_state.clone(),
            sampled: self.sampled,
        }
    }

    /// This span as the parent of what it sends.
    pub fn trace_parent(&self) -> TraceParent {
        TraceParent {
            trace_id: self.data.trace_id,
            parent_id: self.data.span_id,
            sampled: self.sampled,
        }
    }

    /// Whether it will be exported.
    pub fn is_sampled(&self) -> bool {
        self.sampled
    }

    /// Sets `traceparent` (and `tracestate`, only for a continued trace) on a request
    /// this span sends, replacing what the caller sent.
    pub fn propagate(&self, headers: &mut HeaderMap) {
        headers.insert(TRACEPARENT, self.trace_parent().to_header());
        match self
            .data
            .trace_state
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            Some(state) => {
                headers.insert(TRACESTATE, state);
            }
            None => {
                headers.remove(TRACESTATE);
            }
        }
    }

    /// Sets an attribute (replacing one of the same key).
    pub fn set(&mut self, key: &'static str, value: impl Into<AttributeValue>) {
        let value = match value.into() {
            AttributeValue::Str(s) => AttributeValue::Str(bounded(s)),
            other => other,
        };
        match self.data.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.data.attributes.push((key, value)),
        }
    }

    /// Marks the span failed.
    pub fn fail(&mut self, why: impl Into<String>) {
        self.data.error = Some(bounded(why.into()));
    }

    /// Ends the span now and hands it to the sink when it is sampled.
    pub fn end(self) {
        let Span {
            tracer,
            mut data,
            sampled,
        } = self;
        if sampled {
            data.end = SystemTime::now();
            tracer.sink.submit(data);
        }
    }
}

/// The span of an upstream call: ended with its answer, or, when dropped unanswered
/// (the call timed out, or was cut off), ended as failed.
#[derive(Debug)]
pub struct ClientSpan(Option<Span>);

impl ClientSpan {
    /// Watches `span`.
    pub fn new(span: Span) -> ClientSpan {
        ClientSpan(Some(span))
    }

    /// Ends it with the upstream's status (a 5xx marks it failed).
    pub fn answered(mut self, status: u16) {
        if let Some(mut span) = self.0.take() {
            span.set(attr::HTTP_STATUS, i64::from(status));
            if status >= 500 {
                span.fail(format!("upstream answered {status}"));
            }
            span.end();
        }
    }

    /// Ends it failed.
    pub fn failed(mut self, why: impl Into<String>) {
        if let Some(mut span) = self.0.take() {
            span.fail(why);
            span.end();
        }
    }
}

impl Drop for ClientSpan {
    fn drop(&mut self) {
        if let Some(mut span) = self.0.take() {
            span.fail("no answer: the call timed out or was cut off");
            span.end();
        }
    }
}

/// The attribute keys of oncely's spans, one set for the HTTP layer, the MCP proxy and
/// the job worker.
pub mod attr {
    /// The ledger record's id.
    pub const RECORD: &str = "oncely.record";
    /// The route's name.
    pub const ROUTE: &str = "oncely.route";
    /// The `Oncely-Status` value (fresh, replayed, joined, bypassed, or the problem code).
    pub const DECISION: &str = "oncely.decision";
    /// The record's attempt.
    pub const ATTEMPT: &str = "oncely.attempt";
    /// The principal's keyed hash.
    pub const PRINCIPAL: &str = "oncely.principal";
    /// The upstream's status (for a replay, the stored one).
    pub const UPSTREAM_STATUS: &str = "oncely.upstream_status";
    /// The caller's workflow id.
    pub const WORKFLOW_ID: &str = "oncely.workflow_id";
    /// The MCP tool called.
    pub const TOOL: &str = "oncely.mcp.tool";
    /// HTTP method (semantic conventions).
    pub const HTTP_METHOD: &str = "http.request.method";
    /// HTTP status of the answer (semantic conventions).
    pub const HTTP_STATUS: &str = "http.response.status_code";
    /// The route pattern (semantic conventions).
    pub const HTTP_ROUTE: &str = "http.route";
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Collect(Mutex<Vec<SpanData>>);

    impl SpanSink for Collect {
        fn submit(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
    }

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_parsed_as_the_w3c_says() {
        let p = TraceParent::parse(VALID.as_bytes()).unwrap();
        assert_eq!(hex::encode(p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(p.parent_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.to_header(), VALID);
        let unsampled = VALID.replace("-01", "-00");
        assert!(!TraceParent::parse(unsampled.as_bytes()).unwrap().sampled);
        // A later version may add fields after a dash.
        let future = VALID.replacen("00-", "01-", 1) + "-what-ever";
        assert!(TraceParent::parse(future.as_bytes()).is_some());
        for bad in [
            "",
            "garbage",
            &VALID.to_uppercase(),
            &VALID.replacen("00-", "ff-", 1),
            &(VALID.to_string() + "-extra"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
            &(VALID.replacen("00-", "01-", 1) + "x"),
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_valid_parent_is_continued_and_anything_else_starts_a_trace() {
        let sink = Arc::new(Collect::default());
        let tracer = Arc::new(Tracer::new(sink.clone(), 1.0));
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, VALID.parse().unwrap());
        h.insert(TRACESTATE, "vendor=1".parse().unwrap());
        let server = tracer.start_request(&h, "POST /x".into());
        let client = server.child("upstream".into(), SpanKind::Client);
        let mut out = h.clone();
        client.propagate(&mut out);
        let sent = TraceParent::parse(out[TRACEPARENT].as_bytes()).unwrap();
        assert_eq!(
            hex::encode(sent.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_ne!(hex::encode(sent.parent_id), "00f067aa0ba902b7");
        assert_eq!(out[TRACESTATE], "vendor=1");
        client.end();
        server.end();
        let spans = sink.0.lock().unwrap().clone();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].span_id, sent.parent_id);
        assert_eq!(spans[0].parent_span_id, Some(spans[1].span_id));
        assert_eq!(
            spans[1].parent_span_id.map(hex::encode).as_deref(),
            Some("00f067aa0ba902b7")
        );

        // Malformed: a new trace; neither header is passed on as it came.
        let mut bad = HeaderMap::new();
        bad.insert(TRACEPARENT, "00-nope".parse().unwrap());
        bad.insert(TRACESTATE, "vendor=1".parse().unwrap());
        let server = tracer.start_request(&bad, "POST /x".into());
        let mut out = bad.clone();
        server.propagate(&mut out);
        assert!(TraceParent::parse(out[TRACEPARENT].as_bytes()).is_some());
        assert!(out.get(TRACESTATE).is_none());
        assert_eq!(server.data.parent_span_id, None);

        // The caller's "not sampled" is kept, and such a span is not exported.
        let mut off = HeaderMap::new();
        off.insert(TRACEPARENT, VALID.replace("-01", "-00").parse().unwrap());
        let server = tracer.start_request(&off, "POST /x".into());
        assert!(!server.is_sampled());
        let before = sink.0.lock().unwrap().len();
        server.end();
        assert_eq!(sink.0.lock().unwrap().len(), before);
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        assert_eq!(bounded("short".into()), "short");
        let cut = bounded("é".repeat(MAX_TEXT));
        assert!(cut.len() <= MAX_TEXT + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn tracestate_members_follow_the_w3c_list() {
        let mut h = HeaderMap::new();
        h.append(TRACESTATE, " a=1 ,, b@t=x y".parse().unwrap());
        h.append(TRACESTATE, "c=3".parse().unwrap());
        assert_eq!(trace_state(&h).as_deref(), Some("a=1,b@t=x y,c=3"));
        for bad in ["A=1", "a", "a=", "a=1=2", "@a=1", "a@b@c=1", "a=1,Bad=2"] {
            let mut h = HeaderMap::new();
            h.insert(TRACESTATE, bad.parse().unwrap());
            assert_eq!(trace_state(&h), None, "{bad}");
        }
    }

    #[test]
    fn the_ratio_samples_new_traces() {
        let sink = Arc::new(Collect::default());
        let none = Arc::new(Tracer::new(sink.clone(), 0.0));
        let all = Arc::new(Tracer::new(sink.clone(), 1.0));
        let half = Arc::new(Tracer::new(sink, 0.5));
        let h = HeaderMap::new();
        let mut sampled = 0;
        for _ in 0..1000 {
            assert!(!none.start_request(&h, "x".into()).is_sampled());
            assert!(all.start_request(&h, "x".into()).is_sampled());
            sampled += usize::from(half.start_request(&h, "x".into()).is_sampled());
        }
        assert!((350..650).contains(&sampled), "{sampled}");
    }
}
