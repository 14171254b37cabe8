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

pub mod attr;
mod client;
mod context;
mod conventions;
mod data;
mod sample;
pub use attr::AttributeValue;
pub use client::ClientSpan;
use context::{new_span_id, new_trace_id};
pub use context::{trace_state, TraceParent, TRACEPARENT, TRACESTATE};
pub use conventions::{route_path, AttemptEnd, Connection, UpstreamAttributes};
pub use data::{SpanData, SpanKind};
pub use sample::{ParentOrRatio, Sample};

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

/// Where finished spans go. `submit` must return at once: a sink that cannot keep a span
/// drops it (and counts it), it never makes a request wait.
pub trait SpanSink: Send + Sync + 'static {
    /// Takes one finished, sampled span.
    fn submit(&self, span: SpanData);
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
                links: Vec::new(),
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
                links: Vec::new(),
            },
            sampled: parent.sampled,
        })
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
    /// The id its next child gets, when it was named ahead (see
    /// [`SpanParent::with_next_child`]).
    next_child: Option<[u8; 8]>,
}

impl SpanParent {
    /// This parent with its next child's span id chosen now, and the `traceparent` that
    /// names that child: for a message that must carry its client span's trace context
    /// before the span starts (an MCP call's `params._meta`).
    pub fn with_next_child(mut self) -> (SpanParent, TraceParent) {
        let id = new_span_id();
        self.next_child = Some(id);
        let tp = TraceParent {
            trace_id: self.trace_id,
            parent_id: id,
            sampled: self.sampled,
        };
        (self, tp)
    }

    /// The `tracestate` its children pass on.
    pub fn trace_state(&self) -> Option<&str> {
        self.trace_state.as_deref()
    }

    /// A child span, starting now.
    pub fn child(&self, name: String, kind: SpanKind) -> Span {
        let name = bounded(name);
        Span {
            tracer: self.tracer.clone(),
            data: SpanData {
                trace_id: self.trace_id,
                span_id: self.next_child.unwrap_or_else(new_span_id),
                parent_span_id: Some(self.span_id),
                trace_state: self.trace_state.clone(),
                name,
                kind,
                start: SystemTime::now(),
                end: SystemTime::UNIX_EPOCH,
                attributes: Vec::new(),
                error: None,
                links: Vec::new(),
            },
            sampled: self.sampled,
        }
    }

    /// The client span of an upstream call under this one, set as the `traceparent` (and
    /// `tracestate`) of the request to the upstream.
    pub fn upstream_call(&self, headers: &mut HeaderMap, method: &http::Method) -> ClientSpan {
        let (name, known) = conventions::method_name(method);
        let mut span = self.child(name.to_string(), SpanKind::Client);
        span.fixed(attr::HTTP_METHOD, name);
        if !known {
            span.set(attr::HTTP_METHOD_ORIGINAL, method.as_str());
        }
        span.propagate(headers);
        ClientSpan::new(span)
    }

    /// [`SpanParent::upstream_call`] of a whole request: its `url.full`, `server.address`
    /// and `server.port` when its URI is absolute, and its [`UpstreamAttributes`] in its
    /// extensions, for the sender that sets the URI later.
    pub fn upstream_request(&self, parts: &mut http::request::Parts) -> ClientSpan {
        let span = self.upstream_call(&mut parts.headers, &parts.method);
        let more = span.attributes();
        more.target(&parts.uri);
        parts.extensions.insert(more);
        span
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
            next_child: None,
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

    /// Sets an attribute to text of the program's own, without copying it.
    pub fn fixed(&mut self, key: &'static str, value: &'static str) {
        self.set(key, AttributeValue::Fixed(value));
    }

    /// Sets an attribute (replacing one of the same key).
    pub fn set(&mut self, key: &'static str, value: impl Into<AttributeValue>) {
        let value = match value.into() {
            AttributeValue::Str(s) => AttributeValue::Str(bounded(s)),
            // The program's own text is short.
            other => other,
        };
        match self.data.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.data.attributes.push((key, value)),
        }
    }

    /// Renames the span (an MCP request's span once its method and target are read).
    pub fn rename(&mut self, name: String) {
        self.data.name = bounded(name);
    }

    /// Links the span to another (a replay's to the span that executed the original).
    pub fn link(&mut self, trace_id: [u8; 16], span_id: [u8; 8]) {
        if trace_id != [0; 16] && span_id != [0; 8] && self.data.links.len() < 8 {
            self.data.links.push((trace_id, span_id));
        }
    }

    /// This span's trace id and span id.
    pub fn ids(&self) -> ([u8; 16], [u8; 8]) {
        (self.data.trace_id, self.data.span_id)
    }

    /// This span, as a record keeps the span that executed it.
    pub fn span_ref(&self) -> oncely_engine::SpanRef {
        oncely_engine::SpanRef {
            trace_id: self.data.trace_id,
            span_id: self.data.span_id,
        }
    }

    /// Links to the span a record's `TRACEID-SPANID` names (nothing for none, or for
    /// text that is not one).
    pub fn link_to(&mut self, text: Option<&str>) {
        let Some((trace, span)) = text.and_then(|t| t.split_once('-')) else {
            return;
        };
        let (mut t, mut s) = ([0u8; 16], [0u8; 8]);
        if hex::decode_to_slice(trace, &mut t).is_ok() && hex::decode_to_slice(span, &mut s).is_ok()
        {
            self.link(t, s);
        }
    }

    /// Continues `parent`'s trace instead (trace context a message carries, such as an
    /// MCP request's `params._meta.traceparent`, ahead of the HTTP header's), sampled
    /// again by the tracer's sampler; `trace_state` is kept only with it.
    pub fn continue_from(&mut self, parent: TraceParent, trace_state: Option<String>) {
        self.data.trace_id = parent.trace_id;
        self.data.parent_span_id = Some(parent.parent_id);
        self.data.trace_state = trace_state;
        self.sampled = self
            .tracer
            .sampler
            .sample(parent.trace_id, Some(&parent), &self.data.name);
    }

    /// Marks the span failed.
    pub fn fail(&mut self, why: impl Into<String>) {
        self.data.error = Some(bounded(why.into()));
    }

    /// Ends the span now and hands it to the sink when it is sampled.
    pub fn end(self) {
        self.end_at(SystemTime::now());
    }

    /// Ends the span at `at` (an upstream attempt that ended before its span is handed
    /// on).
    fn end_at(self, at: SystemTime) {
        let Span {
            tracer,
            mut data,
            sampled,
        } = self;
        if sampled {
            data.end = at;
            tracer.sink.submit(data);
        }
    }
}

/// Names a server span `{method} {http.route}` and sets the request's attributes:
/// `http.request.method`, `url.path`, `url.scheme`, `http.route`, `server.address` and
/// `server.port` (from `Host`, or the URI's authority over HTTP/2), `client.address`,
/// `user_agent.original`, `network.protocol.version`.
pub fn http_server_request<B>(span: &mut Span, req: &http::Request<B>, route: Option<&str>) {
    let (method, uri, version) = (req.method(), req.uri(), req.version());
    let (headers, extensions) = (req.headers(), req.extensions());
    let (name, known) = conventions::method_name(method);
    let display = if known { name } else { "HTTP" };
    span.rename(match route {
        Some(route) => {
            let mut name = String::with_capacity(display.len() + 1 + route.len());
            name.push_str(display);
            name.push(' ');
            name.push_str(route);
            name
        }
        None => display.to_string(),
    });
    span.fixed(attr::HTTP_METHOD, name);
    if !known {
        span.set(attr::HTTP_METHOD_ORIGINAL, method.as_str());
    }
    span.set(attr::URL_PATH, uri.path());
    let connection = extensions.get::<Connection>();
    let https = connection.map_or(uri.scheme_str() == Some("https"), |c| c.https);
    span.fixed(attr::URL_SCHEME, if https { "https" } else { "http" });
    if let Some(route) = route {
        span.set(attr::HTTP_ROUTE, route);
    }
    let authority = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()));
    if let Some((host, port)) = authority.and_then(conventions::host_and_port) {
        span.set(attr::SERVER_ADDRESS, host);
        let port = port.unwrap_or(if https { 443 } else { 80 });
        span.set(attr::SERVER_PORT, i64::from(port));
    }
    if let Some(c) = connection {
        span.set(attr::CLIENT_ADDRESS, conventions::ip_text(c.peer.ip()));
    }
    if let Some(agent) = headers
        .get(http::header::USER_AGENT)
        .and_then(|h| h.to_str().ok())
    {
        span.set(attr::USER_AGENT, agent);
    }
    span.fixed(
        attr::PROTOCOL_VERSION,
        conventions::protocol_version(version),
    );
}

/// The answer's `http.response.status_code` and `error.type`: for an error of the
/// gateway's own (`code`, its problem code) that code, whatever the status, else the
/// status of a 5xx. A 5xx fails the span (a 4xx does not, as the HTTP conventions have it
/// for a server).
pub fn http_server_response(span: &mut Span, status: u16, code: Option<&str>) {
    span.set(attr::HTTP_STATUS, i64::from(status));
    let why = match code {
        Some(code) => code.to_string(),
        None if status >= 500 => status.to_string(),
        None => return,
    };
    span.set(attr::ERROR_TYPE, why.clone());
    if status >= 500 {
        span.fail(why);
    }
}

/// What an MCP request's server span is named and carries (the GenAI semantic
/// conventions' `mcp` model).
#[derive(Debug, Clone, Copy)]
pub struct McpRequest<'a> {
    /// `mcp.method.name`, e.g. `tools/call`.
    pub method: &'a str,
    /// The target the span is named after (the tool's name for `tools/call`).
    pub target: Option<&'a str>,
    /// The JSON-RPC request id, as JSON writes it (a string's quotes removed).
    pub id: Option<&'a serde_json::Value>,
    /// `mcp.protocol.version`, when the transport knows it.
    pub revision: Option<&'a str>,
    /// `mcp.session.id`, for revisions that have sessions.
    pub session: Option<&'a str>,
    /// `network.transport`: `tcp` over HTTP, `pipe` over stdio.
    pub transport: &'static str,
    /// The request's `params._meta`: its `traceparent` (with `tracestate`) is continued,
    /// ahead of the HTTP header's.
    pub meta: Option<&'a serde_json::Value>,
}

/// Names an MCP request's server span `{mcp.method.name} {target}` and sets its MCP
/// attributes (for `tools/call` also `gen_ai.tool.name` and `gen_ai.operation.name`
/// `execute_tool`); continues the trace context of `params._meta`.
pub fn mcp_server_request(span: &mut Span, request: &McpRequest<'_>) {
    if let Some(meta) = request.meta {
        let text = |key: &str| meta.get(key).and_then(serde_json::Value::as_str);
        if let Some(parent) = text(TRACEPARENT).and_then(|tp| TraceParent::parse(tp.as_bytes())) {
            let mut headers = HeaderMap::new();
            if let Some(state) = text(TRACESTATE).and_then(|s| HeaderValue::from_str(s).ok()) {
                headers.insert(TRACESTATE, state);
            }
            span.continue_from(parent, trace_state(&headers));
        }
    }
    span.rename(match request.target {
        Some(target) => format!("{} {target}", request.method),
        None => request.method.to_string(),
    });
    span.set(attr::MCP_METHOD, request.method);
    if request.method == "tools/call" {
        if let Some(tool) = request.target {
            span.set(attr::TOOL, tool);
        }
        span.fixed(attr::GENAI_OPERATION, "execute_tool");
    }
    match request.id {
        Some(serde_json::Value::String(s)) => span.set(attr::JSONRPC_ID, s.as_str()),
        Some(other) => span.set(attr::JSONRPC_ID, other.to_string()),
        None => {}
    }
    if let Some(revision) = request.revision {
        span.set(attr::MCP_PROTOCOL_VERSION, revision);
    }
    if let Some(session) = request.session {
        span.set(attr::MCP_SESSION, session);
    }
    span.fixed(attr::NETWORK_TRANSPORT, request.transport);
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
    fn a_record_s_span_text_links_back_to_the_span() {
        let sink = Arc::new(Collect::default());
        let tracer = Arc::new(Tracer::new(sink.clone(), 1.0));
        let first = tracer.start_request(&HeaderMap::new(), "POST /x".into());
        let text = first.span_ref().to_string();
        assert_eq!(text.len(), 32 + 1 + 16);
        assert_eq!(
            text,
            format!(
                "{}-{}",
                hex::encode(first.ids().0),
                hex::encode(first.ids().1)
            )
        );
        let mut repeat = tracer.start_request(&HeaderMap::new(), "POST /x".into());
        repeat.link_to(Some(&text));
        repeat.link_to(Some("not-a-span"));
        repeat.end();
        let spans = sink.0.lock().unwrap().clone();
        assert_eq!(spans[0].links, vec![first.ids()]);
    }

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
