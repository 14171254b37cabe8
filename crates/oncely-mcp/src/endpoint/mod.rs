//! The HTTP service of one `[[mcp]]` endpoint (Streamable HTTP): the HTTP half of MCP
//! mode, in front of the transport-neutral [`crate::core`].
//!
//! Every `POST` carries one JSON-RPC message (or a batch), which goes to the core: what it
//! guards, answers itself or sends on is the core's (see there). This module keeps only
//! what is HTTP:
//! - reading a request: its body under `max_body`, its session (`Mcp-Session-Id`), its
//!   protocol era (`MCP-Protocol-Version`), and its caller, whose principal, workflow id
//!   and trace context are read from its headers when the core asks;
//! - the stateless era's routing headers (`Mcp-Method`, `Mcp-Name`) checked against the
//!   message (-32001, HTTP 400);
//! - a session's end (`DELETE`) while calls this endpoint owns run on that session:
//!   answered 200 at once, and sent on once those calls are recorded (the server would
//!   abort them); any other request that carries no message (`GET` streams) passes
//!   straight through;
//! - the core's server ([`upstream`]): a message sent as its client's request was (its
//!   headers, query and extensions), the answer read as HTTP;
//! - the answer (`response`): oncely's messages as JSON, a refusal with 400, nothing with
//!   202, a failure as problem+json, the server's answer streamed with its status and
//!   headers, edited on the way and marked with `Oncely-Status`, `Oncely-Record`,
//!   `Idempotent-Replayed` and `Retry-After`.
//!
//! # Layout
//!
//! `transport` reads a request and hands it to the core, `headers` reads the protocol
//! era and the routing headers, `upstream` is the core's server over HTTP, `response`
//! writes the core's reply as an HTTP answer.

mod headers;
mod response;
mod transport;
mod upstream;

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

use crate::catalog::ToolCatalog;
use crate::config::McpConfig;
use crate::core::Core;
use crate::BoxBody;
use crate::{BoxError, McpError};

use transport::HttpCore;
use upstream::HttpServer;

pub(crate) use upstream::send;
pub use upstream::McpUpstream;

/// The environment variable naming extra CA certificates (PEM) for `https://` upstreams
/// (the gateway's proxy reads the same one).
pub use oncely_http::client::EXTRA_CA_ENV;

/// One `[[mcp]]` endpoint: a tower `Service<http::Request<B>>` answering
/// `Response<BoxBody>`. Cheap to clone (shared state behind an `Arc`).
#[derive(Clone)]
pub struct McpEndpoint {
    core: Arc<HttpCore>,
}

impl std::fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpEndpoint")
            .field("path", &self.core.config().path)
            .field("upstream", &self.core.config().upstream)
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
        let url = config.upstream.clone();
        McpEndpoint {
            core: Core::new(config, guard, HttpServer { url, upstream }),
        }
    }

    /// The path this endpoint serves.
    pub fn path(&self) -> &str {
        &self.core.config().path
    }

    /// What the endpoint has learned about the upstream's tools.
    pub fn catalog(&self) -> &ToolCatalog {
        self.core.catalog()
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<BoxBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        transport::handle(self.core.clone(), req).await
    }
}

impl<B> tower::Service<Request<B>> for McpEndpoint
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let core = self.core.clone();
        Box::pin(async move { Ok(transport::handle(core, req).await) })
    }
}
