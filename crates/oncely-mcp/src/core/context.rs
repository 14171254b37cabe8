//! What a transport knows of one message besides its bytes ([`Context`]), and who sent it
//! ([`Caller`]): the core asks only when it needs to.

use std::sync::Arc;

use oncely_tower::trace::Span;
use oncely_tower::{Guard, RequestFacts};

use crate::config::McpConfig;

/// Who sent a message, as its transport can tell: the core asks only when it needs to
/// (a guarded call, a task of oncely's).
pub trait Caller: Send + Sync {
    /// The facts of a call (principal, workflow id; no span: [`Caller::span`] starts
    /// that), whose principal `config` says how to read.
    fn facts(&self, guard: &Guard, config: &McpConfig) -> RequestFacts;

    /// The server span of a message it sent, when traces are on: continuing the trace
    /// context its transport carried (HTTP: `traceparent`), named by the core.
    fn span(&self, guard: &Guard) -> Option<Span>;

    /// `network.transport` of its messages: `tcp` (HTTP) unless said otherwise.
    fn transport(&self) -> &'static str {
        "tcp"
    }

    /// The protocol revision of its messages, when the transport knows it.
    fn revision(&self) -> Option<&str> {
        None
    }
}

/// A caller whose transport knows who it is (stdio: the wrapper's principal), and the
/// revision its session negotiated.
#[derive(Debug, Clone)]
pub struct KnownCaller(pub String, pub Option<String>);

impl Caller for KnownCaller {
    fn facts(&self, guard: &Guard, _config: &McpConfig) -> RequestFacts {
        RequestFacts {
            principal: Some(guard.principal_hash(self.0.as_bytes())),
            workflow_id: None,
            span: None,
        }
    }

    fn span(&self, guard: &Guard) -> Option<Span> {
        // No headers: a message's trace context comes from its `params._meta`.
        guard
            .tracer()
            .map(|t| t.start_request(&http::HeaderMap::new(), String::new()))
    }

    fn transport(&self) -> &'static str {
        "pipe"
    }

    fn revision(&self) -> Option<&str> {
        self.1.as_deref()
    }
}

/// What a transport knows of one message besides its bytes.
pub struct Context<O> {
    /// The client's session: cancellations and the guarded calls in flight are its own.
    pub session: Option<String>,
    /// The message is of the stateless era (2026-07-28 or later).
    pub modern: bool,
    /// Who sent it.
    pub caller: Arc<dyn Caller>,
    /// What the server needs to send it on ([`Server::Origin`]).
    pub origin: O,
}

impl<O: Clone> Clone for Context<O> {
    fn clone(&self) -> Self {
        Context {
            session: self.session.clone(),
            modern: self.modern,
            caller: self.caller.clone(),
            origin: self.origin.clone(),
        }
    }
}
