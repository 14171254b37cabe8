//! What a guarded route is: the resolved, validated policy the gateway's config (or an
//! embedding service) hands to the layer, the guarded call of one request on it (its
//! identity and the route's timings: `RoutePolicy::guarded_call`, the one place for
//! HTTP routes, MCP tool calls and queued jobs), and the small trait that finds it per
//! request.
//! The built-in key sources, principal sources and units rules live with their traits in
//! [`crate::sources`].

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use oncely_core::{ClaimSpec, Class, Fingerprint, Identity};
use oncely_engine::{CallChurn, GuardedCall};
use oncely_store::Churn;

pub use crate::sources::{KeyMode, PrincipalSource, UnitsRule};
use crate::sources::{MakeKey, MakePrincipal, MakeUnits};

/// Only requests whose `header` starts with `prefix` are guarded; the rest are forwarded
/// with `Oncely-Status: bypassed` (a website's "regenerate" button wants a new take).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardWhen {
    /// The header to look at.
    pub header: HeaderName,
    /// The prefix its value must start with (may be empty: the header must be present).
    pub prefix: String,
}

/// One guarded route, everything resolved and validated.
#[derive(Debug, Clone)]
pub struct RoutePolicy {
    /// The configured pattern, e.g. `POST /v1/render`; shown as the ledger's `route` and
    /// used as the `route` label of metrics.
    pub name: String,
    /// The operation class.
    pub class: Class,
    /// Where the key comes from (a [`KeyMode`], or any [`MakeKey`]).
    pub key: Arc<dyn MakeKey>,
    /// What identifies the account (a [`PrincipalSource`], or any [`MakePrincipal`]).
    pub principal: Arc<dyn MakePrincipal>,
    /// Headers that are part of the fingerprint.
    pub fingerprint_headers: Vec<HeaderName>,
    /// JSON pointers left out of the fingerprint.
    pub ignore_fields: Vec<String>,
    /// When not empty, the only fields of the body the fingerprint covers (JSON pointers,
    /// `/NAME` for a form field or a part): the complement of `ignore_fields`.
    pub fingerprint_fields: Vec<String>,
    /// Only these callers are guarded.
    pub guard_when: Option<GuardWhen>,
    /// Billing units of one execution (a [`UnitsRule`], or any [`MakeUnits`]).
    pub units: Arc<dyn MakeUnits>,
    /// How long a completed result is replayed.
    pub window: Duration,
    /// How long a duplicate waits for an in-flight original.
    pub wait: Duration,
    /// How long an owner's claim lasts without renewal.
    pub lease: Duration,
    /// Upstream timeout: the whole exchange, head and body.
    pub timeout: Duration,
    /// Larger request bodies get 413.
    pub max_body: u64,
    /// Larger answers reach their caller but are not stored.
    pub max_response: u64,
    /// Most upstream calls in flight for this route: a guarded call's owner holds one of
    /// its slots for its upstream call, the job worker (`JobWorker`) keeps a `job`
    /// route's further jobs queued (durably) until a call ends, and the embedding service
    /// takes one for a request the layer forwards unguarded (the gateway's proxy does).
    pub concurrency: Option<Concurrency>,
    /// The dialect the errors of the gateway's own are written in (`errors`).
    pub errors: oncely_http::Dialect,
    /// The caller's body ends before the completion is durable (default: after). A
    /// crash in between is a crash during the call: the record stays processing and is
    /// taken over by its class.
    pub answer_before_record: bool,
    /// How long after its creation a record whose caller never got its answer is joined
    /// by a request under a new `Idempotency-Key` with its fingerprint: a retry loop that
    /// makes up a key per attempt (`churn_window`, default 10 minutes; zero turns it
    /// off). Only for keys from the header on `write` and `action` routes.
    pub churn_window: Duration,
    /// What the embedding service attaches to the route for its inner service (the
    /// gateway: the route's upstream and retries). The layer never reads it; it puts the
    /// policy it matched (`Arc<RoutePolicy>`) in every request's extensions, so the inner
    /// service finds the route without matching it again.
    pub attached: http::Extensions,
}

/// A route's `concurrency`: its limit, and the slots its upstream calls take, shared by
/// every request of the route in this process.
#[derive(Debug, Clone)]
pub struct Concurrency {
    /// Most upstream calls in flight.
    pub limit: usize,
    /// One permit per call in flight.
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl Concurrency {
    /// `limit` slots, all free.
    pub fn new(limit: usize) -> Concurrency {
        Concurrency {
            limit,
            slots: Arc::new(tokio::sync::Semaphore::new(limit)),
        }
    }
}

impl RoutePolicy {
    /// A policy with the contract's defaults: key `header-or-fingerprint`, principal
    /// `header:authorization`, window 3h, wait 20s, lease 30s, timeout 120s, max_body
    /// 10 MiB, max_response 32 MiB, no units.
    pub fn new(name: impl Into<String>, class: Class) -> RoutePolicy {
        RoutePolicy {
            name: name.into(),
            class,
            key: Arc::new(KeyMode::HeaderOrFingerprint),
            principal: Arc::new(PrincipalSource::Header(http::header::AUTHORIZATION)),
            fingerprint_headers: Vec::new(),
            ignore_fields: Vec::new(),
            fingerprint_fields: Vec::new(),
            guard_when: None,
            units: Arc::new(UnitsRule::None),
            window: Duration::from_secs(3 * 3600),
            wait: Duration::from_secs(20),
            lease: ClaimSpec::DEFAULT_LEASE,
            timeout: Duration::from_secs(120),
            max_body: 10 << 20,
            max_response: 32 << 20,
            concurrency: None,
            errors: oncely_http::Dialect::Problem,
            answer_before_record: false,
            churn_window: Duration::from_secs(600),
            attached: http::Extensions::new(),
        }
    }

    /// Whether requests on this route are deduplicated at all (`read` and `key = none`
    /// are forwarded every time).
    pub fn deduplicates(&self) -> bool {
        self.class != Class::Read && self.key.deduplicates()
    }

    /// The guarded call of one request on this route (an HTTP request, an MCP tool call),
    /// for `principal` (its keyed hash): its identity ([`Identity::new`]: its scope, its
    /// key, the client's or the fingerprint's hex) with the route's timings and upstream
    /// slots.
    pub fn guarded_call(
        &self,
        principal: String,
        key: Option<String>,
        fingerprint: Fingerprint,
        workflow_id: Option<String>,
        units: u64,
    ) -> GuardedCall {
        let churns = key.is_some()
            && !self.churn_window.is_zero()
            && matches!(self.class, Class::Write | Class::Action);
        let identity = Identity::new(
            principal,
            self.name.clone(),
            self.class,
            key,
            fingerprint,
            workflow_id,
        );
        let mut call = self.call(identity, units);
        if churns {
            call.churn = Some(CallChurn::new(Churn {
                window: self.churn_window,
                keep: self.window,
            }));
        }
        call
    }

    /// The guarded call of `identity` on this route (a queued job's run has its
    /// record's), with the route's timings and upstream slots: the only place a
    /// [`GuardedCall`] is assembled.
    pub fn call(&self, identity: Identity, units: u64) -> GuardedCall {
        GuardedCall {
            identity,
            window: self.window,
            wait: self.wait,
            lease: self.lease,
            timeout: self.timeout,
            max_response: self.max_response,
            units,
            answer_before_record: self.answer_before_record,
            slots: self.concurrency.as_ref().map(|c| c.slots.clone()),
            trace: None,
            churn: None,
        }
    }
}

/// Finds the policy of a request. Implemented by the gateway's route table, and by any
/// `Fn(&Method, &str) -> Option<Arc<RoutePolicy>>`.
pub trait RoutePolicies: Send + Sync + 'static {
    /// `None`: not a guarded route, forwarded untouched (streamed).
    fn policy(&self, method: &Method, path: &str) -> Option<Arc<RoutePolicy>>;

    /// The dialect of the gateway's own errors on a request that matches no route
    /// (`[defaults]`'s `errors`).
    fn default_errors(&self) -> oncely_http::Dialect {
        oncely_http::Dialect::Problem
    }
}

impl<F> RoutePolicies for F
where
    F: Fn(&Method, &str) -> Option<Arc<RoutePolicy>> + Send + Sync + 'static,
{
    fn policy(&self, method: &Method, path: &str) -> Option<Arc<RoutePolicy>> {
        self(method, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closures_are_route_tables() {
        let render = Arc::new(RoutePolicy::new("POST /v1/render", Class::Write));
        let table = move |m: &Method, p: &str| {
            (m == Method::POST && p == "/v1/render").then(|| render.clone())
        };
        assert!(table.policy(&Method::POST, "/v1/render").is_some());
        assert!(table.policy(&Method::GET, "/v1/render").is_none());
    }

    #[test]
    fn reads_and_keyless_routes_are_not_deduplicated() {
        let mut p = RoutePolicy::new("r", Class::Write);
        assert!(p.deduplicates());
        p.key = Arc::new(KeyMode::None);
        assert!(!p.deduplicates());
        let r = RoutePolicy::new("r", Class::Read);
        assert!(!r.deduplicates());
    }
}
