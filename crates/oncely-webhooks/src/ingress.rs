//! The webhook ingress: verify, claim once, queue durably, then acknowledge.
//!
//! One [`WebhookEndpoint`] serves one `[[webhooks]]` entry (build it from a resolved
//! [`WebhookConfig`], mount [`WebhookEndpoint::router`]). For each `POST` to its path:
//!
//! 1. The body is read up to `max_body` (else 413 `body_too_large`).
//! 2. The signature is checked ([`Verifier`]); a failure, including a stale or
//!    future-dated timestamp, answers 400 `signature_invalid` with the [`VerifyError`](crate::VerifyError)'s
//!    one-line reason, and nothing is written.
//! 3. The event id is taken from the verifier's source (the scheme's default or
//!    `event_id = ...`). A verified delivery without one answers 400 `event_id_missing`
//!    and nothing is written: without an id there is nothing to deduplicate on, and
//!    silently accepting it would deliver every resend again.
//! 4. One transaction ([`Store::claim_with_task`]) claims the event id (record class
//!    `webhook`, scope = `webhook` + `POST PATH`, key = the event id) and, when
//!    `dedupe_fields` are set and the body holds all of them, a second key made of their
//!    values (`dedupe:` + SHA-256 of their canonical JSON), and queues the delivery. Both
//!    records are written **completed** at once (the event is acknowledged; the delivery's
//!    progress lives in the queue task), and they are kept for `dedupe_window`
//!    (default 7 days) to recognise resends. When the event id is not covered by the
//!    signature (`github`'s `X-GitHub-Delivery`, `hmac-sha256` with `event_id =
//!    "header:..."`) and the scheme has no signed timestamp, a third key is claimed with
//!    them: `signed:` + SHA-256 of the signed content (the body), so a captured delivery
//!    replayed under a new id is a duplicate too.
//! 5. Only after that commit: 200 with `Oncely-Status: fresh` and `Oncely-Record`. A
//!    delivery whose event id (or dedupe key) was already claimed answers 200
//!    `Oncely-Status: duplicate` with the id of the record that matched (the event id's,
//!    or the dedupe key's, whose `workflow_id` is the event id it first arrived as) and is
//!    not queued again. A
//!    store that cannot commit answers 503 `store_unavailable`: the sender retries later.
//!
//! The delivery itself is the delivery worker's job (`worker`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use http::{header, HeaderMap, HeaderValue, Request};
use oncely_core::{
    ClaimSpec, Class, Completion, Fingerprint, FingerprintBuilder, Identity, StoredResponse,
    Timestamp,
};
use oncely_http::problem::{Problem, ProblemCode, ONCELY_RECORD, ONCELY_STATUS};
use oncely_store::{Claim, NewTask, Store, StoreError};
use sha2::{Digest, Sha256};

use crate::queue::{Waker, TASK_KIND};
use crate::verify::Verifier;

/// The principal every webhook event is claimed as (its scope is `webhook` + `POST PATH`).
const PRINCIPAL: &str = "webhook";

/// How long an event id is remembered by default (Stripe retries for up to 3 days).
pub const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// One `[[webhooks]]` entry, resolved (secrets read, durations parsed).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The path senders post to, e.g. `/hooks/stripe`.
    pub path: String,
    /// The signature check, with its event id source (`Verifier::with_event_id` for
    /// `event_id = ...`).
    pub verifier: Verifier,
    /// JSON pointers whose values, together, also make a delivery unique.
    pub dedupe_fields: Vec<String>,
    /// Where deliveries are posted (`http://...`).
    pub deliver_to: String,
    /// How long one delivery attempt may take.
    pub deliver_timeout: Duration,
    /// Attempts before the delivery is dead-lettered.
    pub max_attempts: u32,
    /// The first retry's delay (doubled per attempt, full jitter, capped at 1 h).
    pub retry_backoff: Duration,
    /// The largest body accepted, in bytes.
    pub max_body: usize,
    /// How long an event id is remembered ([`DEFAULT_DEDUPE_WINDOW`]).
    pub dedupe_window: Duration,
}

impl WebhookConfig {
    /// A config with the contract's defaults: 30 s timeout, 10 attempts, 1 s backoff,
    /// 1 MiB bodies, a 7-day dedupe window, no dedupe fields.
    pub fn new(path: impl Into<String>, verifier: Verifier, deliver_to: impl Into<String>) -> Self {
        WebhookConfig {
            path: path.into(),
            verifier,
            dedupe_fields: Vec::new(),
            deliver_to: deliver_to.into(),
            deliver_timeout: Duration::from_secs(30),
            max_attempts: 10,
            retry_backoff: Duration::from_secs(1),
            max_body: 1 << 20,
            dedupe_window: DEFAULT_DEDUPE_WINDOW,
        }
    }
}

/// One webhook path: verifies, claims and queues deliveries.
#[derive(Debug, Clone)]
pub struct WebhookEndpoint {
    inner: Arc<Ingress>,
}

/// What one webhook path's ingress holds: its config, the store, the route its records
/// are claimed under, and the waker of its delivery worker.
#[derive(Debug)]
struct Ingress {
    config: WebhookConfig,
    store: Arc<dyn Store>,
    route: String,
    owner: String,
    waker: Option<Waker>,
}

impl WebhookEndpoint {
    /// The endpoint of `config` on `store`.
    pub fn new(config: WebhookConfig, store: Arc<dyn Store>) -> WebhookEndpoint {
        let route = format!("POST {}", config.path);
        WebhookEndpoint {
            inner: Arc::new(Ingress {
                route,
                owner: format!("ingress-{}", std::process::id()),
                store,
                config,
                waker: None,
            }),
        }
    }

    /// Wakes this worker as soon as a delivery is queued (else it finds it by polling).
    pub fn with_waker(self, waker: Waker) -> WebhookEndpoint {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|arc| Ingress {
            config: arc.config.clone(),
            store: arc.store.clone(),
            route: arc.route.clone(),
            owner: arc.owner.clone(),
            waker: arc.waker.clone(),
        });
        inner.waker = Some(waker);
        WebhookEndpoint {
            inner: Arc::new(inner),
        }
    }

    /// The path it serves.
    pub fn path(&self) -> &str {
        &self.inner.config.path
    }

    /// The config it was built from.
    pub fn config(&self) -> &WebhookConfig {
        &self.inner.config
    }

    /// A router that answers `POST` on the endpoint's path (other methods get 405, other
    /// paths the router's 404). Merge it into the gateway's router.
    pub fn router(&self) -> Router {
        Router::new()
            .route(&self.inner.config.path, post(handle))
            .with_state(self.clone())
    }

    /// Handles one delivery (whatever its path: the caller routed it here).
    pub async fn handle(&self, request: Request<Body>) -> Response {
        let inner = &self.inner;
        let (parts, body) = request.into_parts();
        let max = inner.config.max_body;
        if parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|len| len > max as u64)
        {
            return inner.rejected_too_large();
        }
        let body = match axum::body::to_bytes(body, max).await {
            Ok(body) => body,
            Err(e) => {
                let too_large = std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                    || e.to_string().contains("length limit");
                if too_large {
                    return inner.rejected_too_large();
                }
                return problem(
                    ProblemCode::BodyUnreadable,
                    &format!("the request body could not be read: {e}"),
                );
            }
        };
        inner.accept(&parts.headers, &body).await
    }
}

async fn handle(State(endpoint): State<WebhookEndpoint>, request: Request<Body>) -> Response {
    endpoint.handle(request).await
}

impl Ingress {
    fn rejected_too_large(&self) -> Response {
        metrics::counter!("oncely_webhook_events_total", "result" => "rejected").increment(1);
        tracing::info!(
            webhook = %self.config.path,
            state = "rejected",
            code = "body_too_large",
            "webhook event rejected"
        );
        problem(
            ProblemCode::BodyTooLarge,
            &format!(
                "the body is over this webhook's limit of {} bytes",
                self.config.max_body
            ),
        )
    }

    fn rejected(&self, code: ProblemCode, detail: &str) -> Response {
        metrics::counter!("oncely_webhook_events_total", "result" => "rejected").increment(1);
        tracing::info!(
            webhook = %self.config.path,
            state = "rejected",
            code = code.as_str(),
            reason = detail,
            "webhook event rejected"
        );
        problem(code, detail)
    }

    async fn accept(&self, headers: &HeaderMap, body: &[u8]) -> Response {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let verified = match self.config.verifier.verify(headers, body, now_ms / 1000) {
            Ok(v) => v,
            Err(e) => return self.rejected(ProblemCode::SignatureInvalid, &e.to_string()),
        };
        let Some(event_id) = verified.event_id else {
            return self.rejected(
                ProblemCode::EventIdMissing,
                "the delivery verified, but its event id cannot be found (the body or \
                 header that should hold it is missing, empty or not a string or integer)",
            );
        };
        let fingerprint =
            FingerprintBuilder::new(PRINCIPAL, "POST", &self.config.path).body(body, &[]);
        let mut specs = vec![self.spec(&event_id, &event_id, fingerprint)];
        if let Some(key) = dedupe_key(&self.config.dedupe_fields, body) {
            specs.push(self.spec(&key, &event_id, fingerprint));
        }
        // An id nobody signed, and no signed timestamp to make a capture go stale: the
        // signed content itself (the body, for these schemes) is claimed too, so a
        // replay under a fresh id is a duplicate within `dedupe_window`.
        if verified.timestamp.is_none() && self.config.verifier.event_id_unsigned() {
            specs.push(self.spec(&signed_content_key(body), &event_id, fingerprint));
        }
        let mut task_headers = vec![("idempotency-key".to_string(), event_id.clone())];
        if let Some(ct) = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        {
            task_headers.insert(0, ("content-type".to_string(), ct.to_string()));
        }
        // The trace context the request came with (the gateway's span of it, when traces
        // are on): the delivery is in the trace of the request that received the event.
        for name in ["traceparent", "tracestate"] {
            if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                task_headers.push((name.to_string(), v.to_string()));
            }
        }
        let task = NewTask {
            kind: TASK_KIND.into(),
            target: self.config.deliver_to.clone(),
            method: "POST".into(),
            headers: task_headers,
            body: body.to_vec(),
            max_attempts: self.config.max_attempts.max(1),
            timeout: self.config.deliver_timeout,
            backoff: self.config.retry_backoff,
        };
        let completion = Completion {
            response: StoredResponse {
                status: 200,
                headers: Vec::new(),
                body: None,
            },
            units: 0,
            window: self.config.dedupe_window,
            replay_until: None,
            provider_request_id: None,
            trace: None,
        };
        // A resend of a known event is answered from a read (SQLite: the replay cache or
        // a read connection), without waiting for the writer.
        let known = match self.store.lookup(&specs[0].scope, &event_id).await {
            Ok(found) => found.filter(|r| !r.is_expired(Timestamp(now_ms))),
            Err(e) => return self.store_failed(&event_id, &e),
        };
        let claimed = match known {
            Some(record) => Ok(Claim::Existing(record)),
            None => {
                self.store
                    .claim_with_task(&specs, Some(completion), task)
                    .await
            }
        };
        match claimed {
            Ok(Claim::Owned(record)) => {
                metrics::counter!("oncely_webhook_events_total", "result" => "accepted")
                    .increment(1);
                tracing::info!(
                    webhook = %self.config.path,
                    state = "accepted",
                    event_id = %event_id,
                    record = %record.id,
                    "webhook event accepted and queued"
                );
                if let Some(waker) = &self.waker {
                    waker.wake();
                }
                acknowledged("fresh", record.id.as_str())
            }
            Ok(Claim::Existing(record)) => {
                metrics::counter!("oncely_webhook_events_total", "result" => "duplicate")
                    .increment(1);
                tracing::info!(
                    webhook = %self.config.path,
                    state = "duplicate",
                    event_id = %event_id,
                    record = %record.id,
                    first_event_id = record.workflow_id.as_deref().unwrap_or(""),
                    "webhook event is a duplicate; not queued again"
                );
                acknowledged("duplicate", record.id.as_str())
            }
            Err(e) => self.store_failed(&event_id, &e),
        }
    }

    fn store_failed(&self, event_id: &str, e: &StoreError) -> Response {
        tracing::warn!(
            webhook = %self.config.path,
            event_id,
            error = %e,
            "webhook event not acknowledged: the store failed"
        );
        store_problem(e)
    }

    /// The claim of `key`; its `workflow_id` is the event id, so a dedupe record names
    /// the event it was first received as.
    fn spec(&self, key: &str, event_id: &str, fingerprint: Fingerprint) -> ClaimSpec {
        ClaimSpec {
            identity: Identity::new(
                PRINCIPAL.into(),
                self.route.clone(),
                Class::Webhook,
                Some(key.to_string()),
                fingerprint,
                Some(event_id.to_string()),
            ),
            owner: self.owner.clone(),
            lease: ClaimSpec::DEFAULT_LEASE,
        }
    }
}

/// The dedupe key of a body: `dedupe:` + SHA-256 (hex) of the JSON array of the pointers'
/// values; `None` when no fields are configured, the body is not JSON (or repeats a
/// member name), or a field is missing (such a delivery is deduplicated by its event id
/// only).
pub fn dedupe_key(fields: &[String], body: &[u8]) -> Option<String> {
    if fields.is_empty() {
        return None;
    }
    // The body as written (`oncely_core::canon`), not as a parsed `serde_json::Value`
    // holds it: two order ids past 64 bits, or two amounts with many digits, are two
    // events, not one rounded double.
    let mut doc = oncely_core::canon::Json::parse(body)?;
    doc.normalize();
    let values = fields
        .iter()
        .map(|p| doc.pointer_mut(p).map(|v| v.clone()))
        .collect::<Option<Vec<_>>>()?;
    let canonical =
        oncely_core::canon::canonical_doc(&mut oncely_core::canon::Json::Arr(values), &[]);
    Some(format!(
        "dedupe:{}",
        hex::encode(Sha256::digest(&canonical))
    ))
}

/// The key of a delivery's signed content when its scheme signs the body alone (`github`,
/// `hmac-sha256` without a timestamp header): `signed:` + SHA-256 (hex) of the body.
pub fn signed_content_key(body: &[u8]) -> String {
    format!("signed:{}", hex::encode(Sha256::digest(body)))
}

fn acknowledged(status: &'static str, record: &str) -> Response {
    let mut res = Response::new(Body::empty());
    let h = res.headers_mut();
    h.insert(ONCELY_STATUS, HeaderValue::from_static(status));
    if let Ok(v) = HeaderValue::from_str(record) {
        h.insert(ONCELY_RECORD, v);
    }
    res
}

fn store_problem(e: &StoreError) -> Response {
    problem(
        ProblemCode::StoreUnavailable,
        &format!("the event was not recorded, so it is not acknowledged; send it again: {e}"),
    )
}

/// An `application/problem+json` answer (the one renderer, `oncely_http::problem`).
pub(crate) fn problem(code: ProblemCode, detail: &str) -> Response {
    Problem::new(code, detail).render().map(Body::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedupe_keys_need_every_field() {
        let fields = vec!["/type".to_string(), "/data/object/id".to_string()];
        let a = br#"{"id":"evt_1","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}"#;
        let b = br#"{"type":"charge.succeeded","id":"evt_2","data":{"object":{"id":"ch_1"}}}"#;
        let c = br#"{"id":"evt_3","type":"charge.succeeded","data":{"object":{"id":"ch_2"}}}"#;
        let ka = dedupe_key(&fields, a).unwrap();
        assert!(ka.starts_with("dedupe:"));
        assert_eq!(Some(ka.clone()), dedupe_key(&fields, b));
        assert_ne!(Some(ka), dedupe_key(&fields, c));
        assert_eq!(dedupe_key(&fields, br#"{"type":"x"}"#), None);
        assert_eq!(dedupe_key(&fields, b"not json"), None);
        assert_eq!(dedupe_key(&[], a), None);
        // Exact decimals: numbers that differ as decimals are two events, numbers equal
        // as decimals one. A body that repeats a member name is not canonical JSON: it
        // has no dedupe key (such a delivery is deduplicated by its event id only).
        let order = ["/order".to_string()];
        assert_ne!(
            dedupe_key(&order, br#"{"order":123456789012345678901234567891}"#),
            dedupe_key(&order, br#"{"order":123456789012345678901234567890}"#)
        );
        assert_ne!(
            dedupe_key(&order, br#"{"order":0.10000000000000000001}"#),
            dedupe_key(&order, br#"{"order":0.1}"#)
        );
        assert_eq!(
            dedupe_key(&order, br#"{"order":1e2}"#),
            dedupe_key(&order, br#"{"order":100.0, "x": 1}"#)
        );
        assert_eq!(
            dedupe_key(&order, br#"{"x":1,"order":{"b":1,"a":2}}"#),
            dedupe_key(&order, br#"{"order":{"a":2,"b":1}}"#)
        );
        assert_eq!(
            dedupe_key(&order, br#"{"order":1,"order":{"b":1,"a":2}}"#),
            None
        );
    }
}
