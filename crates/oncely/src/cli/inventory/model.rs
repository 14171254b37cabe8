//! What the inventory is made of: an operation or tool as a reader found it
//! ([`Found`], [`Target`]), and the line of the map it becomes ([`Entry`], with its
//! [`Gap`]s).

use std::time::Duration;

use oncely_core::Class;

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
}
