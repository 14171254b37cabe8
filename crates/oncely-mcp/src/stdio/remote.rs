//! MCP over stdio to a remote server: oncely between a host that starts only local
//! servers and an MCP server it reaches over Streamable HTTP ([`run_remote`]). The host's
//! side is the stdio wrapper's own ([`super::Host`]: the same core, guard, tool
//! learning and end); the server's side is a [`RemoteLink`](link::RemoteLink) instead of
//! the child. At the end, once the calls in flight are recorded, the remote session is
//! ended ([`link`]).

mod link;
mod session;

use std::sync::Arc;
use std::time::Duration;

use oncely_tower::Guard;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::lines::LineReader;
use super::server::{Queued, ToClient};
use super::{finish_in_flight, write_lines, Host};
use crate::config::McpConfig;
use crate::endpoint::McpEndpoint;
use crate::McpError;
use link::RemoteLink;

pub use session::Remote;

/// How long ending the remote session (`DELETE`) may take at the end.
const END_GRACE: Duration = Duration::from_secs(5);

/// Carries the host's messages on `input` and `output` through an endpoint of `config`
/// on `guard` to the server `remote` over the gateway's HTTP client
/// ([`McpEndpoint::direct`]), as `principal`, until the host closes `input` or `shutdown`
/// resolves; then the calls in flight run to their end and are recorded, and the remote
/// session is ended (the exit status is then 0). Fails only when the client cannot be
/// built (its extra CA file).
pub async fn run_remote<I, O>(
    config: McpConfig,
    guard: Arc<Guard>,
    remote: Remote,
    principal: String,
    input: I,
    output: O,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), McpError>
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin + Send + 'static,
{
    let client = McpEndpoint::direct(None)?;
    let (client_tx, client_lines) = mpsc::unbounded_channel();
    let queued = Arc::new(Queued::default());
    let to_client = ToClient::new(client_tx, queued.clone());
    let client_writer = tokio::spawn(write_lines(
        output,
        client_lines,
        None,
        "client",
        Some(queued),
    ));
    let limit = config.max_response.saturating_mul(4).max(64 << 20);
    let link = RemoteLink::new(remote, client, to_client.clone(), limit);

    let max_body = config.max_body;
    let timeout = config.timeout;
    let host = Host::new(
        config,
        guard.clone(),
        link.clone(),
        to_client.clone(),
        principal,
    );
    tracing::info!(route = %host.core.config().path,
        "guarding the remote MCP server's tools/call over stdio");

    let mut requests = JoinSet::new();
    let mut lines = LineReader::new(BufReader::new(input), max_body);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            line = lines.next() => match line {
                Ok(Some(line)) => host.line(line, max_body, &mut requests).await,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the host's input failed");
                    break;
                }
            },
            () = &mut shutdown => {
                tracing::info!("asked to stop: finishing the calls in flight");
                break;
            }
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
        }
    }
    link.client_gone();
    finish_in_flight(&guard, &mut requests, timeout).await;
    let _ = tokio::time::timeout(END_GRACE, link.end()).await;
    drop(host);
    drop(link);
    drop(to_client);
    let _ = tokio::time::timeout(Duration::from_secs(2), client_writer).await;
    Ok(())
}
