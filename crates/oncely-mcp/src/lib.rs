//! oncely's MCP mode: a transparent proxy for MCP Streamable HTTP that runs each distinct
//! `tools/call` once, whatever the assistant does.
//!
//! Assistants retry tool calls that feel slow, and a client that times out sends
//! `notifications/cancelled` (or, in protocol 2026-07-28, closes its response stream), so
//! a server that honours it abandons the paid work and the retry pays again. An
//! [`McpEndpoint`] sits in front of one MCP server and:
//!
//! - passes every message through unchanged (initialize, sessions, GET streams, DELETE,
//!   `server/discover`, resources, prompts, progress, sampling), streaming JSON and SSE
//!   answers without buffering them;
//! - keys a guarded `tools/call` by principal, tool name and the RFC 8785 canonical
//!   `arguments` (never the JSON-RPC id, the session, `_meta` or `progressToken`);
//! - owns the first call's upstream request: the client's cancellation or closed stream
//!   never reaches it, and its result is stored even when its client is gone;
//! - answers a repeat within the window with the stored result under the repeat's own id,
//!   marked `_meta["dev.oncely/replay"] = {"status": "replayed"|"joined", "original_at"}`,
//!   and a repeat that outwaits `wait` with an `isError` result telling the model when to
//!   call again.
//!
//! # Layout
//!
//! - [`config`]: the resolved `[[mcp]]` endpoint config (principal source, tools, window).
//! - [`jsonrpc`]: reading JSON-RPC messages as plain JSON (no typed SDK drops fields).
//! - [`sse`]: an incremental Server-Sent Events parser, to find a response in a stream.
//! - [`catalog`]: which tools are read-only, learned from the upstream's `tools/list`.
//! - [`principal`]: who the caller is: a hashed header or a verified JWT claim.
//! - [`tasks`]: the `io.modelcontextprotocol/tasks` shapes oncely answers slow calls with.
//! - [`core`]: the transport-neutral core: one message in with its context, a reply
//!   out; the guard on the gateway's one engine (claim, owner task, wait, replay), the
//!   tasks extension, batches, the answers edited on the way; the server behind a trait.
//! - [`endpoint`]: the HTTP transport (Streamable HTTP) in front of the core.
//! - [`stdio`]: MCP over stdio in front of the core: a local server started as a child
//!   process, or a remote one over Streamable HTTP (`oncely mcp --url`).
//!
//! # Use
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use oncely_mcp::{McpConfig, McpEndpoint};
//!
//! let store = oncely_store::open("sqlite://oncely.db", Default::default()).await?;
//! let guard = Arc::new(oncely_tower::Guard::new(store, b"principal key".to_vec()));
//! let config = McpConfig::new("/mcp", "http://127.0.0.1:3001/mcp")?;
//! let endpoint = McpEndpoint::new(config, guard, McpEndpoint::direct(None)?);
//! // `endpoint` is a tower `Service<http::Request<B>>`; mount it at `/mcp`.
//! # let _ = endpoint; Ok(()) }
//! ```

pub mod catalog;
pub mod config;
pub mod core;
pub mod endpoint;
pub mod header_params;
pub mod jsonrpc;
pub mod key_arguments;
pub mod principal;
mod ring_jws;
pub mod sse;
pub mod stdio;
pub mod tasks;
pub mod tool_patterns;

mod body;

pub use config::{parse_units, CallSettings, JwtKey, McpConfig, McpPrincipal, ToolSelection};
pub use endpoint::{McpEndpoint, McpUpstream};
pub use key_arguments::KeyArguments;
pub use oncely_http::{BoxBody, BoxError};
pub use oncely_tower::{PrincipalSource, UnitsRule};

/// Why an MCP endpoint could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The `[[mcp]]` config is wrong.
    #[error("mcp config: {0}")]
    Config(String),
    /// The ledger could not be reached while setting up.
    #[error(transparent)]
    Store(#[from] oncely_store::StoreError),
}
