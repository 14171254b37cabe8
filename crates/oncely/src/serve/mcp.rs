//! `[[mcp]]` endpoints in `oncely serve`: each config entry becomes an
//! [`oncely_mcp::McpEndpoint`] on the gateway's one [`Guard`], answering the requests whose
//! path is the entry's path, before the HTTP route table. Each sends upstream through a
//! [`Proxy`] of its own, as routes do: the entry's `retries`, the `Forwarded` and
//! `X-Forwarded-*` headers, the one header policy; its `concurrency` slots are held by
//! the engine's owner of each guarded call.

use std::sync::Arc;

use anyhow::Context as _;
use oncely_mcp::principal::JwtVerifier;
use oncely_mcp::{CallSettings, JwtKey, McpConfig, McpEndpoint, McpPrincipal, McpUpstream};
use oncely_tower::Guard;

use crate::config::{Config, McpEntry, Upstream};
use crate::upstream::retry::RetryPolicy;
use crate::upstream::{Proxy, Target, UpstreamClient};

/// The configured MCP endpoints, by path.
#[derive(Clone, Debug, Default)]
pub struct McpEndpoints {
    endpoints: Arc<Vec<McpEndpoint>>,
    /// What each endpoint was built from.
    built_from: Arc<Vec<Built>>,
}

/// The settings an endpoint is built from.
#[derive(Debug, Clone, PartialEq)]
struct Built {
    entry: McpEntry,
    max_body: u64,
    max_response: u64,
}

impl McpEndpoints {
    /// One endpoint per `[[mcp]]` entry, on `guard`. A JWT secret variable that is unset or
    /// a JWKS file that cannot be read stops the server with a clear error.
    pub fn new(
        config: &Config,
        guard: &Arc<Guard>,
        client: &UpstreamClient,
    ) -> anyhow::Result<McpEndpoints> {
        McpEndpoints::reloaded(config, guard, client, &McpEndpoints::default())
    }

    /// The endpoints of a config read again (SIGHUP). An entry that did not change keeps
    /// its endpoint, and with it what that endpoint tracks of the calls in flight (their
    /// cancellations are still dropped, a session's end is still held back until they are
    /// recorded); an entry with a `jwks_file` is built again, so the file is read again.
    pub fn reloaded(
        config: &Config,
        guard: &Arc<Guard>,
        client: &UpstreamClient,
        previous: &McpEndpoints,
    ) -> anyhow::Result<McpEndpoints> {
        if config.mcp.is_empty() {
            return Ok(McpEndpoints::default());
        }
        let mut endpoints = Vec::new();
        let mut built_from = Vec::new();
        for (i, entry) in config.mcp.iter().enumerate() {
            let built = Built {
                entry: entry.clone(),
                max_body: config.max_body,
                max_response: config.max_response,
            };
            let jwks = matches!(
                entry.principal,
                McpPrincipal::Jwt {
                    key: JwtKey::JwksFile(_),
                    ..
                }
            );
            let kept = previous
                .built_from
                .iter()
                .position(|b| *b == built)
                .filter(|_| !jwks)
                .map(|p| previous.endpoints[p].clone());
            let endpoint = match kept {
                Some(endpoint) => endpoint,
                None => {
                    let mcp = resolve(config, entry).with_context(|| format!("mcp[{i}]"))?;
                    let upstream =
                        upstream(config, entry, client).with_context(|| format!("mcp[{i}]"))?;
                    McpEndpoint::new(mcp, guard.clone(), upstream)
                }
            };
            endpoints.push(endpoint);
            built_from.push(built);
        }
        Ok(McpEndpoints {
            endpoints: Arc::new(endpoints),
            built_from: Arc::new(built_from),
        })
    }

    /// The endpoint serving `path`, if any.
    pub fn find(&self, path: &str) -> Option<&McpEndpoint> {
        self.endpoints.iter().find(|e| e.path() == path)
    }
}

/// The proxy an entry's endpoint sends through: to the server's origin (the endpoint
/// puts the server's path in each request), with the entry's retries. An MCP request is
/// retried only when it provably never reached the server (as on a `write` route).
fn upstream(
    config: &Config,
    entry: &McpEntry,
    client: &UpstreamClient,
) -> anyhow::Result<McpUpstream> {
    let uri = &entry.upstream.uri;
    let origin = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map(|a| a.as_str()).unwrap_or_default()
    );
    let origin = Upstream::parse(&origin).map_err(anyhow::Error::msg)?;
    let retry = (entry.retries > 0).then(|| {
        Arc::new(RetryPolicy {
            route: entry.path.clone(),
            class: oncely_core::Class::Write,
            retries: entry.retries,
            backoff: entry.retry_backoff,
            timeout: entry.timeout,
            max_body: config.max_body,
        })
    });
    let target = Target {
        upstream: origin,
        retry,
    };
    Ok(McpUpstream::new(Proxy::new(client.clone(), Some(target))))
}

fn resolve(config: &Config, entry: &McpEntry) -> anyhow::Result<McpConfig> {
    let mut mcp = McpConfig::new(&entry.path, &entry.upstream.uri.to_string())?
        .with_tools(&entry.tools)?
        .with_actions(&entry.actions)?
        .with_calls(CallSettings {
            window: entry.window,
            wait: entry.wait,
            timeout: entry.timeout,
            lease: entry.lease,
            units: entry.units.clone(),
            concurrency: entry.concurrency,
            max_body: config.max_body,
            max_response: config.max_response,
            key_arguments: entry.key_arguments.clone(),
            intent: entry.intent.clone(),
        });
    let verifier = match &entry.principal {
        McpPrincipal::Source(source) => {
            mcp.principal = Arc::new(source.clone());
            return Ok(mcp);
        }
        McpPrincipal::Jwt {
            claim,
            key: JwtKey::SecretEnv(var),
        } => {
            let secret = std::env::var(var)
                .ok()
                .filter(|s| !s.is_empty())
                .with_context(|| format!("jwt_secret_env: ${var} is not set"))?;
            JwtVerifier::hs256(claim, secret.as_bytes())?
        }
        McpPrincipal::Jwt {
            claim,
            key: JwtKey::JwksFile(path),
        } => {
            let jwks = std::fs::read_to_string(path)
                .with_context(|| format!("jwks_file: cannot read {}", path.display()))?;
            JwtVerifier::from_jwks(claim, &jwks)?
        }
    };
    let mut v = verifier.require_exp(entry.jwt_require_exp);
    if let Some(aud) = &entry.jwt_audience {
        v = v.with_audience(aud);
    }
    if let Some(iss) = &entry.jwt_issuer {
        v = v.with_issuer(iss);
    }
    mcp.principal = Arc::new(v);
    Ok(mcp)
}
