//! The attribute keys of oncely's spans, one set for the HTTP layer, the MCP proxy and
//! the job worker: OpenTelemetry's semantic conventions (HTTP: stable; MCP: the GenAI
//! `mcp` model), pinned to the version `docs/telemetry.md` names, and oncely's own.
/// The ledger record's id.
pub const RECORD: &str = "oncely.record";
/// The route's name.
pub const ROUTE: &str = "oncely.route";
/// The `Oncely-Status` value (fresh, replayed, joined, bypassed, or the problem code).
pub const DECISION: &str = "oncely.status";
/// The route's class (`read`, `write`, `action`, `job`).
pub const CLASS: &str = "oncely.class";
/// Where the key came from (`header` or `fingerprint`).
pub const KEY_SOURCE: &str = "oncely.key_source";
/// Set (`true`) on the first request of a key made up for a retry that joined another
/// key's record.
pub const KEY_CHURN: &str = "oncely.key_churn";
/// The record's attempt.
pub const ATTEMPT: &str = "oncely.attempt";
/// The principal's keyed hash.
pub const PRINCIPAL: &str = "oncely.principal";
/// The upstream's status (for a replay, the stored one).
pub const UPSTREAM_STATUS: &str = "oncely.upstream_status";
/// The caller's workflow id.
pub const WORKFLOW_ID: &str = "oncely.workflow_id";
/// The MCP tool called (GenAI conventions).
pub const TOOL: &str = "gen_ai.tool.name";
/// The MCP method (`tools/call`, ...).
pub const MCP_METHOD: &str = "mcp.method.name";
/// The MCP protocol revision.
pub const MCP_PROTOCOL_VERSION: &str = "mcp.protocol.version";
/// The MCP session (revisions that have sessions).
pub const MCP_SESSION: &str = "mcp.session.id";
/// The JSON-RPC request id, as text.
pub const JSONRPC_ID: &str = "jsonrpc.request.id";
/// The GenAI operation (`execute_tool` for `tools/call`).
pub const GENAI_OPERATION: &str = "gen_ai.operation.name";
/// `tcp` over HTTP, `pipe` over stdio.
pub const NETWORK_TRANSPORT: &str = "network.transport";
/// The JSON-RPC error code of an error answer.
pub const RPC_STATUS: &str = "rpc.response.status_code";
/// What failed: a status code, a problem code, `tool_error`, a JSON-RPC code.
pub const ERROR_TYPE: &str = "error.type";
/// The method as it came, when it is not one HTTP defines.
pub const HTTP_METHOD_ORIGINAL: &str = "http.request.method_original";
/// `url.path`.
pub const URL_PATH: &str = "url.path";
/// `url.scheme`.
pub const URL_SCHEME: &str = "url.scheme";
/// `url.full` (an upstream's, query values redacted, no credentials).
pub const URL_FULL: &str = "url.full";
/// `server.address`.
pub const SERVER_ADDRESS: &str = "server.address";
/// `server.port`.
pub const SERVER_PORT: &str = "server.port";
/// `client.address`.
pub const CLIENT_ADDRESS: &str = "client.address";
/// `user_agent.original`.
pub const USER_AGENT: &str = "user_agent.original";
/// `network.protocol.version`.
pub const PROTOCOL_VERSION: &str = "network.protocol.version";
/// `http.request.resend_count`.
pub const RESEND_COUNT: &str = "http.request.resend_count";
/// HTTP method (semantic conventions).
pub const HTTP_METHOD: &str = "http.request.method";
/// HTTP status of the answer (semantic conventions).
pub const HTTP_STATUS: &str = "http.response.status_code";
/// The route pattern (semantic conventions).
pub const HTTP_ROUTE: &str = "http.route";

/// An attribute's value.
#[derive(Debug, Clone, Eq)]
pub enum AttributeValue {
    /// Text.
    Str(String),
    /// Text that is the program's own (`"fresh"`, `"https"`): kept without a copy.
    Fixed(&'static str),
    /// A whole number.
    Int(i64),
    /// True or false.
    Bool(bool),
}

impl AttributeValue {
    /// The text, for a text value.
    pub fn text(&self) -> Option<&str> {
        match self {
            AttributeValue::Str(s) => Some(s),
            AttributeValue::Fixed(s) => Some(s),
            AttributeValue::Int(_) | AttributeValue::Bool(_) => None,
        }
    }
}

/// Text equals text whether kept or fixed.
impl PartialEq for AttributeValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (AttributeValue::Int(a), AttributeValue::Int(b)) => a == b,
            (AttributeValue::Bool(a), AttributeValue::Bool(b)) => a == b,
            (a, b) => a.text().is_some() && a.text() == b.text(),
        }
    }
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

impl From<bool> for AttributeValue {
    fn from(v: bool) -> Self {
        AttributeValue::Bool(v)
    }
}

impl From<i64> for AttributeValue {
    fn from(v: i64) -> Self {
        AttributeValue::Int(v)
    }
}
