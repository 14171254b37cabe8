//! The HTTP service of one `[[mcp]]` endpoint.
//!
//! Every request is forwarded to the upstream MCP server unchanged and its answer streamed
//! back frame by frame, except:
//! - a guarded `tools/call` (see [`crate::catalog`]): handed to the gateway's one engine,
//!   [`oncely_tower::Guard::execute`], which claims it on the ledger and runs it on an owner
//!   task the client's connection does not own (renewing its lease, streaming the answer to
//!   the caller, recording it), or answers from the ledger; this module maps each
//!   [`Execution`](oncely_tower::Execution) to an MCP answer (a replayed result under the
//!   repeat's own id, or an `isError` result that says the original still runs);
//! - a `notifications/cancelled` naming a guarded call in flight: acknowledged with 202 and
//!   never forwarded, so the client's timeout never abandons the paid work upstream; in a
//!   session it is honoured towards the client, whose request gets no (more) answer;
//! - a session's end (`DELETE`) while calls this endpoint owns run on that session:
//!   answered 200 at once, and forwarded once those calls are recorded (the server would
//!   abort them);
//! - a `tools/list` answer: passed through, read on the way to learn which tools are
//!   read-only, and with every guarded tool's `execution.taskSupport` set to `forbidden`
//!   (2025-11-25's task-augmented calls never take a guarded call around the guard);
//! - a `server/discover` answer: passed through with the tasks extension advertised;
//! - `tasks/get`, `tasks/cancel`, `tasks/update` (2026-07-28): answered from the ledger
//!   for this endpoint's tasks (see [`crate::tasks`]), forwarded for the server's own.
//!
//! A guarded call is keyed by what [`jsonrpc::ToolCall`](crate::jsonrpc::ToolCall) reads
//! (tool, arguments, and a multi-round-trip continuation's `inputResponses` and
//! `requestState`), so nothing else it carries changes whether or how it is guarded. The forwarded guarded call carries
//! the derived downstream key in `_meta["dev.oncely/idempotency-key"]` and no `task`
//! parameter; tools listed in `actions` are class `action`.
//! What is stored is decided by a [`Classifier`](oncely_tower::Classifier) once the owner
//! task has read the whole answer: the JSON-RPC `result` for the call's id (found in a
//! JSON body, a batch, or an event stream) is stored; a JSON-RPC `error` or an HTTP error
//! releases the record, so the next identical call runs again, and so does an
//! `input_required` result (the server asks for input: the continuation that answers it is
//! the call that executes); an answer that ends (or breaks off) without the
//! call's response marks it `outcome_unknown` (it was sent and may have run). An answer over
//! `max_response` is stored without its body: repeats get an `isError` result saying the
//! result was too large to keep, and the tool does not run again within the window.
//! Every result oncely writes is shaped for the request's revision (`for_revision`).
//!
//! A `tools/call` inside a JSON-RPC batch (protocol 2025-03-26 only; batching was removed
//! in 2025-06-18) is guarded too: the batch is split, each guarded call goes through the
//! engine on its own, the rest is forwarded as a smaller batch, and the answers are joined
//! into one JSON array.
//!
//! # Layout
//!
//! The transport (HTTP) and the guard are apart, so that another transport can reuse the
//! guard; each file uses only the ones below it.
//!
//! - The transport: `transport` reads a request and routes it (cancellations, a
//!   session's end, the tasks extension's requests, a guarded call), `batch` splits a
//!   JSON-RPC batch, `forward` passes a request through to the [`McpUpstream`] and edits
//!   the answers oncely reads on the way, `headers` reads the protocol era and the routing
//!   headers.
//! - The guard: `guarded` runs a call through the engine (the caller's wait, the owner's
//!   upstream call and its classifier), `call` reads a guarded call from its JSON-RPC
//!   message, `answer` maps an execution to an MCP answer (replays, in-flight and
//!   `outcome_unknown` results, a task), `task_requests` answers the tasks extension's
//!   requests from the ledger, `results` writes the results and tasks as plain JSON.
//! - Shared below both: `state` (the endpoint's state and its one way upstream),
//!   `sessions` (guarded calls in flight, cancellations, held session ends) and `response`
//!   (the HTTP responses oncely writes, the messages in an answer).

mod answer;
mod batch;
mod call;
mod forward;
mod guarded;
mod headers;
mod messages;
mod response;
mod results;
mod sessions;
mod state;
mod task_requests;
mod transport;

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use oncely_http::client::ClientOptions;
use oncely_tower::client::UpstreamClient;
use oncely_tower::Guard;

use crate::body::McpBody;
use crate::catalog::ToolCatalog;
use crate::config::McpConfig;
use crate::{BoxError, McpError};

use state::Inner;

pub use crate::config::PRINCIPAL_HEADER;
pub use headers::is_stateless;
pub use messages::MessageContext;
pub use state::McpUpstream;

/// The environment variable naming extra CA certificates (PEM) for `https://` upstreams
/// (the gateway's proxy reads the same one).
pub use oncely_http::client::EXTRA_CA_ENV;

/// One `[[mcp]]` endpoint: a tower `Service<http::Request<B>>` answering
/// `Response<McpBody>`. Cheap to clone (shared state behind an `Arc`).
#[derive(Clone)]
pub struct McpEndpoint {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpEndpoint")
            .field("path", &self.inner.config.path)
            .field("upstream", &self.inner.config.upstream)
            .finish()
    }
}

impl McpEndpoint {
    /// The plain upstream: a pooled HTTP/1.1 client for `http://` and `https://` MCP
    /// servers, trusting the system's root certificates, plus the PEM certificates in
    /// `extra_ca` and in the file `$ONCELY_EXTRA_CA_FILE` names (`oncely_tower::client`,
    /// the gateway's one client), sending each request to its URI.
    pub fn direct(extra_ca: Option<&Path>) -> Result<McpUpstream, McpError> {
        let options = ClientOptions {
            pool_idle_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::with_extra_ca(extra_ca)
        };
        let client = UpstreamClient::new(&options).map_err(|e| McpError::Config(e.to_string()))?;
        Ok(McpUpstream::new(client.direct()))
    }

    /// Builds the endpoint for `config`, guarding calls with `guard` (the gateway's one
    /// engine: its ledger, its principal hashing, its owner tasks), sending upstream
    /// through `upstream`.
    pub fn new(config: McpConfig, guard: Arc<Guard>, upstream: McpUpstream) -> McpEndpoint {
        McpEndpoint {
            inner: Arc::new(Inner::new(config, guard, upstream)),
        }
    }

    /// The path this endpoint serves.
    pub fn path(&self) -> &str {
        &self.inner.config.path
    }

    /// What the endpoint has learned about the upstream's tools.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.inner.catalog
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<McpBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        transport::handle(self.inner.clone(), req).await
    }
}

impl<B> tower::Service<Request<B>> for McpEndpoint
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<McpBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<McpBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { Ok(transport::handle(inner, req).await) })
    }
}
