//! What the inventory is made of: an operation or tool as a reader found it
//! ([`Found`], [`Target`], with what it [`Said`]), and the line of the map it becomes
//! ([`Entry`], with its [`Gap`]s and [`KeyArgument`]s).

use std::time::Duration;

use oncely_core::Class;
use serde_json::Value;

/// What the inventory is about: an HTTP operation or an MCP tool.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Http {
        method: http::Method,
        path: String,
        /// The operation's `servers` URL, when it is a usable upstream.
        server: Option<String>,
    },
    Tool {
        name: String,
        transport: Transport,
    },
}

/// How the inventory reached an MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    /// Streamable HTTP: the source is the server's URL, guarded by an `[[mcp]]` entry.
    Http,
    /// Standard input and output: the source is the command that starts the server,
    /// guarded by `oncely mcp -- COMMAND` in the host's config.
    Stdio,
}

impl Transport {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Stdio => "stdio",
        }
    }
}

/// One operation or tool as found, before the config is consulted.
#[derive(Debug, Clone)]
pub(super) struct Found {
    /// The file, URL or command (as given) it came from.
    pub(super) source: String,
    pub(super) target: Target,
    /// What the proposal goes by: operationId, summary, path or tool name.
    pub(super) words: String,
    pub(super) read_only_hint: bool,
    pub(super) destructive_hint: bool,
    /// What it tells its caller: a tool's description; an operation's summary and
    /// description, and its `Idempotency-Key` header's.
    pub(super) said: Vec<Said>,
    /// A tool's `inputSchema`.
    pub(super) input_schema: Option<Value>,
}

/// A text that tells the caller how to call an operation or tool.
#[derive(Debug, Clone)]
pub(super) struct Said {
    /// Where it is: "the tool's description", "the description of its Idempotency-Key
    /// header".
    pub(super) at: String,
    pub(super) text: String,
    /// It describes the key itself (its subject is the key).
    pub(super) of_key: bool,
}

/// A tool argument that is an idempotency key the model fills in.
#[derive(Debug, Clone)]
pub(super) struct KeyArgument {
    /// Its JSON pointer into the call's `arguments`.
    pub(super) pointer: String,
    /// The server gets a key derived from the record in it (else the model's value).
    pub(super) replaced: bool,
    /// What oncely does with it: "replaced with a derived UUID", "forwarded as sent
    /// (...)".
    pub(super) what: String,
}

/// A gap and the config lines that close it.
#[derive(Debug, Clone)]
pub(super) struct Gap {
    pub(super) kind: &'static str,
    pub(super) detail: String,
    pub(super) fix: String,
}

/// One line of the map.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) found: Found,
    pub(super) class: Class,
    pub(super) configured: bool,
    pub(super) key: Option<String>,
    pub(super) store: Option<String>,
    pub(super) window: Option<Duration>,
    pub(super) replay: String,
    pub(super) reconcile: Option<String>,
    pub(super) gaps: Vec<Gap>,
    /// A tool's key arguments.
    pub(super) key_arguments: Vec<KeyArgument>,
}
