//! An intention's identity: who asks for what, as every entry point names it and every
//! record keeps it ([`Identity`], built by [`Identity::new`]).

use crate::fingerprint::Fingerprint;
use crate::key::Scope;
use crate::policy::Class;

/// Who and what one intention is: the fields a claim names and its record keeps, declared
/// once. A claim (`ClaimSpec`), its record (`Record`) and the engine's `GuardedCall` each
/// hold one and dereference to it (`record.route` is the route of the record's identity),
/// so every entry point (an HTTP route, an MCP tool call, a queued job, a webhook event)
/// names an intention with the same fields, built by [`Identity::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Hash of principal + route.
    pub scope: Scope,
    /// The client's key, or the fingerprint (hex) when the key is implicit.
    pub key: String,
    /// The request's fingerprint, compared on every repeat.
    pub fingerprint: Fingerprint,
    /// The operation class.
    pub class: Class,
    /// The route (`METHOD PATTERN`, `PATH#tool` for MCP tools, or the webhook path), for
    /// listing.
    pub route: String,
    /// The principal's keyed hash.
    pub principal: String,
    /// The caller's workflow (from `X-Workflow-Id` or `traceparent`; a webhook's event
    /// id). A claim that reclaims a record without one keeps the record's.
    pub workflow_id: Option<String>,
}

impl Identity {
    /// The identity of a call of `class` by `principal` (its keyed hash) on `route`: its
    /// scope is principal + route, its key the client's `key` or, without one, the
    /// fingerprint's hex. The one place an identity is built, for every entry point.
    pub fn new(
        principal: String,
        route: String,
        class: Class,
        key: Option<String>,
        fingerprint: Fingerprint,
        workflow_id: Option<String>,
    ) -> Identity {
        Identity {
            scope: Scope::new(&principal, &route),
            key: key.unwrap_or_else(|| fingerprint.to_hex()),
            fingerprint,
            class,
            route,
            principal,
            workflow_id,
        }
    }
}
