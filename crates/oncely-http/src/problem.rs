//! Every error answer oncely writes itself (and the names of oncely's headers):
//! `application/problem+json` (RFC 9457) with a `code` member. One type, [`Problem`],
//! turns into a response and never shows internals: the cause (a store error, an upstream
//! error) is logged where it happens, and the client gets a fixed title and a detail
//! written for it. The gateway's routes, the MCP endpoints, the webhook endpoints and the
//! admin API all answer through it, so they agree on `type` (`urn:oncely:problem:CODE`),
//! `title` (one per code) and the members (`docs/problems.md`).

use std::fmt;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use oncely_core::{RecordId, Timestamp};

use crate::dialect::{Dialect, Said, Spoken};
use crate::BoxBody;

/// The `Oncely-Status` header.
pub const ONCELY_STATUS: &str = "oncely-status";
/// The `Oncely-Record` header.
pub const ONCELY_RECORD: &str = "oncely-record";
/// The `Idempotent-Replayed` header.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The `Oncely-Key-Churn` header: the original record a request under a made-up key was
/// answered from.
pub const ONCELY_KEY_CHURN: &str = "oncely-key-churn";
/// Upstream to gateway: its answer is good until this RFC 3339 time at most.
pub const REPLAY_UNTIL: &str = "oncely-replay-until";
/// Upstream to gateway: its answer is good for this many seconds at most.
pub const REPLAY_SECONDS: &str = "oncely-replay-seconds";
/// The code of an error of the gateway's own, in every dialect.
pub const ONCELY_PROBLEM: &str = "oncely-problem";
/// Whether a retry of the request can succeed (`true`/`false`), on every error of the
/// gateway's own: the retry loops of the SDKs Stainless generates obey it.
pub const X_SHOULD_RETRY: &str = "x-should-retry";

/// What went wrong, as the contract and `docs/problems.md` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemCode {
    /// 400: `key = header` and no `Idempotency-Key`.
    KeyMissing,
    /// 400: empty, too long, or non-ASCII key.
    KeyInvalid,
    /// 400: a guarded request whose path cannot be normalised unambiguously (an
    /// encoded `/`, a bad escape).
    PathInvalid,
    /// 400: the request body could not be read (the client broke off). Not in the
    /// contract's table; an extension.
    BodyUnreadable,
    /// 409: the original is still running after `wait`; carries `Retry-After`.
    InFlight,
    /// 409: the record awaits reconciliation.
    OutcomeUnknown,
    /// 409: the original's answer was over `max_response` and was not kept.
    ResultTooLarge,
    /// 413: body over `max_body`.
    BodyTooLarge,
    /// 422: same key, different fingerprint.
    KeyReused,
    /// 502: the upstream refused or failed before any answer.
    UpstreamUnreachable,
    /// 503: the ledger cannot be reached; guarded requests are not forwarded.
    StoreUnavailable,
    /// 504: the upstream did not answer within `timeout`.
    UpstreamTimeout,
    /// 503: every upstream slot of the route (`concurrency`) stayed taken for all of
    /// `timeout`; the request was never sent and its record was released. Carries
    /// `Retry-After`. Not in the contract's table; an extension.
    UpstreamBusy,
    /// 404: no job with this id for this principal (`/_oncely/jobs/ID`). Not in the
    /// contract's table; an extension.
    NotFound,
    /// 409: the job's upstream call failed; its record was released, so sending the
    /// original request again runs it again. Not in the contract's table; an extension.
    JobFailed,
    /// 400 (webhooks): the signature does not verify, or its timestamp is outside
    /// `tolerance`; nothing was recorded.
    SignatureInvalid,
    /// 400 (webhooks): the delivery verified but its event id is missing or empty.
    EventIdMissing,
    /// 405 (webhooks): an endpoint was called with a method other than `POST`.
    MethodNotAllowed,
    /// 502 (MCP): the MCP server's answer broke off after it started.
    UpstreamFailed,
    /// 400 (admin): a query or body the admin API cannot use.
    BadRequest,
    /// 401 (admin): no bearer token, or a wrong one.
    Unauthorized,
    /// 403 (admin): the token variable is unset or empty, so the admin API is closed.
    AdminDisabled,
    /// 409 (admin): a resolution of a record that is not `outcome_unknown`.
    WrongState,
    /// 409 (admin): `redeliver` of a webhook delivery that is not dead-lettered.
    NotDead,
}

impl ProblemCode {
    /// Every code, in the order of the `as_str` arms (`docs/problems.md` is checked
    /// against it).
    pub const ALL: [ProblemCode; 24] = [
        ProblemCode::KeyMissing,
        ProblemCode::KeyInvalid,
        ProblemCode::PathInvalid,
        ProblemCode::BodyUnreadable,
        ProblemCode::InFlight,
        ProblemCode::OutcomeUnknown,
        ProblemCode::ResultTooLarge,
        ProblemCode::BodyTooLarge,
        ProblemCode::KeyReused,
        ProblemCode::UpstreamUnreachable,
        ProblemCode::StoreUnavailable,
        ProblemCode::UpstreamTimeout,
        ProblemCode::UpstreamBusy,
        ProblemCode::NotFound,
        ProblemCode::JobFailed,
        ProblemCode::SignatureInvalid,
        ProblemCode::EventIdMissing,
        ProblemCode::MethodNotAllowed,
        ProblemCode::UpstreamFailed,
        ProblemCode::BadRequest,
        ProblemCode::Unauthorized,
        ProblemCode::AdminDisabled,
        ProblemCode::WrongState,
        ProblemCode::NotDead,
    ];

    /// The `code` member.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemCode::KeyMissing => "key_missing",
            ProblemCode::KeyInvalid => "key_invalid",
            ProblemCode::PathInvalid => "path_invalid",
            ProblemCode::BodyUnreadable => "body_unreadable",
            ProblemCode::InFlight => "in_flight",
            ProblemCode::OutcomeUnknown => "outcome_unknown",
            ProblemCode::ResultTooLarge => "result_too_large",
            ProblemCode::BodyTooLarge => "body_too_large",
            ProblemCode::KeyReused => "key_reused",
            ProblemCode::UpstreamUnreachable => "upstream_unreachable",
            ProblemCode::StoreUnavailable => "store_unavailable",
            ProblemCode::UpstreamTimeout => "upstream_timeout",
            ProblemCode::UpstreamBusy => "upstream_busy",
            ProblemCode::NotFound => "not_found",
            ProblemCode::JobFailed => "job_failed",
            ProblemCode::SignatureInvalid => "signature_invalid",
            ProblemCode::EventIdMissing => "event_id_missing",
            ProblemCode::MethodNotAllowed => "method_not_allowed",
            ProblemCode::UpstreamFailed => "upstream_failed",
            ProblemCode::BadRequest => "bad_request",
            ProblemCode::Unauthorized => "unauthorized",
            ProblemCode::AdminDisabled => "admin_disabled",
            ProblemCode::WrongState => "wrong_state",
            ProblemCode::NotDead => "not_dead",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemCode::KeyMissing
            | ProblemCode::KeyInvalid
            | ProblemCode::PathInvalid
            | ProblemCode::BodyUnreadable
            | ProblemCode::SignatureInvalid
            | ProblemCode::EventIdMissing
            | ProblemCode::BadRequest => StatusCode::BAD_REQUEST,
            ProblemCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ProblemCode::AdminDisabled => StatusCode::FORBIDDEN,
            ProblemCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProblemCode::InFlight
            | ProblemCode::OutcomeUnknown
            | ProblemCode::ResultTooLarge
            | ProblemCode::JobFailed
            | ProblemCode::WrongState
            | ProblemCode::NotDead => StatusCode::CONFLICT,
            ProblemCode::NotFound => StatusCode::NOT_FOUND,
            ProblemCode::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemCode::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemCode::UpstreamUnreachable | ProblemCode::UpstreamFailed => {
                StatusCode::BAD_GATEWAY
            }
            ProblemCode::StoreUnavailable | ProblemCode::UpstreamBusy => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProblemCode::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Whether sending the request again can succeed, unless the problem says otherwise
    /// ([`Problem::with_should_retry`]): the ledger or an upstream slot may be back, the
    /// original may have finished, an upstream failure released its record. A refusal of
    /// the request itself, or an outcome that someone must reconcile, cannot.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ProblemCode::InFlight
                | ProblemCode::StoreUnavailable
                | ProblemCode::UpstreamBusy
                | ProblemCode::UpstreamUnreachable
                | ProblemCode::UpstreamTimeout
                | ProblemCode::UpstreamFailed
                | ProblemCode::BodyUnreadable
        )
    }

    /// A short, fixed summary (RFC 9457 `title`).
    pub fn title(self) -> &'static str {
        match self {
            ProblemCode::KeyMissing => "Idempotency-Key required",
            ProblemCode::KeyInvalid => "Invalid Idempotency-Key",
            ProblemCode::PathInvalid => "Invalid request path",
            ProblemCode::BodyUnreadable => "Request body unreadable",
            ProblemCode::InFlight => "Original request still in flight",
            ProblemCode::OutcomeUnknown => "Outcome unknown",
            ProblemCode::ResultTooLarge => "Result too large to replay",
            ProblemCode::BodyTooLarge => "Request body too large",
            ProblemCode::KeyReused => "Idempotency-Key reused",
            ProblemCode::UpstreamUnreachable => "Upstream unreachable",
            ProblemCode::StoreUnavailable => "Ledger unavailable",
            ProblemCode::UpstreamTimeout => "Upstream timeout",
            ProblemCode::UpstreamBusy => "Upstream busy",
            ProblemCode::NotFound => "Not found",
            ProblemCode::JobFailed => "Job failed",
            ProblemCode::SignatureInvalid => "Signature invalid",
            ProblemCode::EventIdMissing => "Event id missing",
            ProblemCode::MethodNotAllowed => "Method not allowed",
            ProblemCode::UpstreamFailed => "Upstream answer broke off",
            ProblemCode::BadRequest => "Bad request",
            ProblemCode::Unauthorized => "Unauthorized",
            ProblemCode::AdminDisabled => "Admin API disabled",
            ProblemCode::WrongState => "Wrong state",
            ProblemCode::NotDead => "Not dead",
        }
    }
}

impl fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One gateway error answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {detail}")]
pub struct Problem {
    /// What went wrong.
    pub code: ProblemCode,
    /// A sentence for the client (never an internal error text).
    pub detail: String,
    /// `Retry-After` in seconds (for `in_flight`).
    pub retry_after: Option<u64>,
    /// The ledger record concerned, shown as `Oncely-Record` and `record`.
    pub record: Option<RecordId>,
    /// When the original request was made (`original_at`, for `result_too_large`,
    /// `in_flight`, `key_reused`).
    pub original_at: Option<Timestamp>,
    /// Whether a retry can succeed, where it is not the code's own
    /// ([`ProblemCode::retryable`]): an upstream failure whose record is
    /// `outcome_unknown`, not released.
    pub should_retry: Option<bool>,
}

impl Problem {
    /// A problem with the given code and detail.
    /// A ledger that cannot be reached is told with `Retry-After: 1`.
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Problem {
        Problem {
            code,
            detail: detail.into(),
            retry_after: (code == ProblemCode::StoreUnavailable).then_some(1),
            record: None,
            original_at: None,
            should_retry: None,
        }
    }

    /// Says whether a retry can succeed, against its code's default.
    pub fn with_should_retry(mut self, retry: bool) -> Problem {
        self.should_retry = Some(retry);
        self
    }

    /// Whether a retry of the request can succeed (`X-Should-Retry`).
    pub fn should_retry(&self) -> bool {
        self.should_retry.unwrap_or(self.code.retryable())
    }

    /// Names the record concerned.
    pub fn with_record(mut self, id: &RecordId) -> Problem {
        self.record = Some(id.clone());
        self
    }

    /// Adds the original request's time.
    pub fn with_original_at(mut self, at: Timestamp) -> Problem {
        self.original_at = Some(at);
        self
    }

    /// Adds `Retry-After`.
    pub fn with_retry_after(mut self, seconds: u64) -> Problem {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// The code of the gateway's own error that `res` answers with (the problem
    /// [`Problem::render_in`] put in its extensions), or `None` for any other answer (an
    /// upstream's, whatever its headers say).
    pub fn code_of<B>(res: &Response<B>) -> Option<&'static str> {
        res.extensions().get::<Problem>().map(|p| p.code.as_str())
    }

    /// The problem document (RFC 9457 members plus `code`, `record`, `original_at`,
    /// `retry_after`).
    pub fn to_json(&self) -> serde_json::Value {
        self.spoken(Dialect::Problem).document
    }

    /// The answer: status, `Content-Type: application/problem+json`, `Oncely-Record`
    /// and `Retry-After` when known, with the document as its body. The caller adds
    /// `Oncely-Status` (and, for the webhook endpoints' 405, `Allow`).
    pub fn into_response(self) -> Response<BoxBody> {
        self.into_response_in(Dialect::Problem)
    }

    fn spoken(&self, dialect: Dialect) -> Spoken {
        let said = Said {
            code: self.code.as_str(),
            title: self.code.title(),
            detail: &self.detail,
            record: self.record.as_ref().map(|id| id.as_str()),
            original_at: self.original_at.map(|at| at.to_rfc3339()),
            retry_after: self.retry_after,
        };
        (dialect.table())(&said, self.code.status(), self.should_retry())
    }

    /// [`Problem::into_response`] in `dialect`.
    pub fn into_response_in(self, dialect: Dialect) -> Response<BoxBody> {
        self.render_in(dialect).map(crate::full)
    }

    /// The same answer with the document as bytes, for a caller with a body type of its
    /// own (`problem.render().map(axum::body::Body::from)`).
    pub fn render(&self) -> Response<Bytes> {
        self.render_in(Dialect::Problem)
    }

    /// The answer in `dialect`: its status and body as the dialect's table says, and in
    /// every dialect `Retry-After` when known, `X-Should-Retry`, `Oncely-Problem` and
    /// `Oncely-Record`. The problem itself rides along in the answer's extensions, so
    /// that a layer above can say it again in its route's dialect ([`speak`]).
    pub fn render_in(&self, dialect: Dialect) -> Response<Bytes> {
        let retry = self.should_retry();
        let spoken = self.spoken(dialect);
        let mut res = Response::new(Bytes::from(spoken.document.to_string()));
        *res.status_mut() = spoken.status;
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(spoken.content_type),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        h.insert(
            X_SHOULD_RETRY,
            HeaderValue::from_static(if retry { "true" } else { "false" }),
        );
        h.insert(ONCELY_PROBLEM, HeaderValue::from_static(self.code.as_str()));
        for (name, value) in spoken.headers {
            h.insert(name, HeaderValue::from_static(value));
        }
        if let Some(id) = &self.record {
            if let Ok(v) = HeaderValue::from_str(id.as_str()) {
                h.insert(ONCELY_RECORD, v);
            }
        }
        res.extensions_mut().insert(self.clone());
        res
    }
}

/// Says an error of the gateway's own again in `dialect`: an answer that carries its
/// [`Problem`] (every answer [`Problem::render_in`] made) gets the dialect's status, body
/// and headers; the headers its writer added (`Oncely-Status`, `Allow`) stay. Any other
/// answer (an upstream's, whatever its content type) is left as it is.
pub fn speak(res: Response<BoxBody>, dialect: Dialect) -> Response<BoxBody> {
    if dialect == Dialect::Problem {
        return res;
    }
    let Some(problem) = res.extensions().get::<Problem>().cloned() else {
        return res;
    };
    let (mut parts, _as_problem) = res.into_parts();
    let (again, body) = problem.render_in(dialect).into_parts();
    parts.status = again.status;
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &again.headers {
        parts.headers.insert(name.clone(), value.clone());
    }
    Response::from_parts(parts, crate::full(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_holds_every_code_of_as_str_once() {
        // `as_str` must name every variant (its match has no wildcard), so the codes in
        // its arms are every code there is; `ALL` must hold exactly those.
        let source = include_str!("problem.rs");
        let body = &source[source.find("pub fn as_str").unwrap()..];
        let body = &body[..body.find("\n    }\n").unwrap()];
        let arms: Vec<&str> = body
            .split("=> \"")
            .skip(1)
            .map(|rest| &rest[..rest.find('"').unwrap()])
            .collect();
        let all: Vec<&str> = ProblemCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            all, arms,
            "ProblemCode::ALL must list every code, in as_str's order"
        );
    }

    #[tokio::test]
    async fn renders_rfc9457_with_code() {
        use http_body_util::BodyExt;
        let p = Problem::new(ProblemCode::InFlight, "still running")
            .with_record(&RecordId("rec_1".into()))
            .with_retry_after(0);
        let res = p.into_response();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert_eq!(res.headers()["retry-after"], "1");
        assert_eq!(res.headers()[ONCELY_RECORD], "rec_1");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(doc["code"], "in_flight");
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["title"], "Original request still in flight");
        assert_eq!(doc["type"], "urn:oncely:problem:in_flight");
    }

    #[test]
    fn every_code_has_its_contract_status() {
        use ProblemCode::*;
        for (code, status) in [
            (KeyMissing, 400),
            (KeyInvalid, 400),
            (PathInvalid, 400),
            (InFlight, 409),
            (OutcomeUnknown, 409),
            (ResultTooLarge, 409),
            (BodyTooLarge, 413),
            (KeyReused, 422),
            (UpstreamUnreachable, 502),
            (StoreUnavailable, 503),
            (UpstreamTimeout, 504),
            (SignatureInvalid, 400),
            (EventIdMissing, 400),
            (BadRequest, 400),
            (Unauthorized, 401),
            (AdminDisabled, 403),
            (NotFound, 404),
            (MethodNotAllowed, 405),
            (WrongState, 409),
            (NotDead, 409),
            (UpstreamFailed, 502),
            (UpstreamBusy, 503),
        ] {
            assert_eq!(code.status().as_u16(), status, "{code}");
        }
    }
}

#[cfg(test)]
mod dialects {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn every_problem_says_whether_to_retry_and_its_code() {
        for code in ProblemCode::ALL {
            let res = Problem::new(code, "why").render();
            assert_eq!(res.headers()[ONCELY_PROBLEM], code.as_str());
            let retry = if code.retryable() { "true" } else { "false" };
            assert_eq!(res.headers()[X_SHOULD_RETRY], retry, "{code}");
        }
        let unknown = Problem::new(ProblemCode::UpstreamTimeout, "why").with_should_retry(false);
        assert_eq!(unknown.render().headers()[X_SHOULD_RETRY], "false");
        assert!(!ProblemCode::OutcomeUnknown.retryable());
        assert!(!ProblemCode::KeyReused.retryable());
        let store = Problem::new(ProblemCode::StoreUnavailable, "down").render();
        assert_eq!(store.headers()[header::RETRY_AFTER], "1");
    }

    #[tokio::test]
    async fn speak_says_a_problem_again_and_keeps_what_its_writer_added() {
        let mut res = Problem::new(ProblemCode::KeyReused, "other body")
            .with_record(&RecordId("rec_9".into()))
            .into_response();
        res.headers_mut()
            .insert(ONCELY_STATUS, HeaderValue::from_static("key_reused"));
        let res = speak(res, Dialect::Stripe);
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        let h = res.headers().clone();
        assert_eq!(h[ONCELY_STATUS], "key_reused");
        assert_eq!(h[ONCELY_RECORD], "rec_9");
        assert_eq!(h[ONCELY_PROBLEM], "key_reused");
        assert_eq!(h[X_SHOULD_RETRY], "false");
        assert_eq!(h["stripe-should-retry"], "false");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"error": {"type": "idempotency_error", "code": "key_reused",
                "message": "other body"}})
        );

        // An answer that is no problem of oncely's is left alone, whatever its type.
        let mut upstream = Response::new(crate::full(Bytes::from_static(b"{}")));
        upstream.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        let same = speak(upstream, Dialect::OpenAi);
        assert_eq!(
            same.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert!(same.headers().get(X_SHOULD_RETRY).is_none());
    }

    #[test]
    fn each_dialect_has_its_shape_and_status() {
        let p = Problem::new(ProblemCode::StoreUnavailable, "ledger down");
        let doc = |d: Dialect| -> (StatusCode, serde_json::Value) {
            let res = p.render_in(d);
            (res.status(), serde_json::from_slice(res.body()).unwrap())
        };
        assert_eq!(
            doc(Dialect::OpenAi),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"error": {"message": "ledger down", "type": "server_error",
                    "param": null, "code": "store_unavailable"}})
            )
        );
        assert_eq!(
            doc(Dialect::Anthropic),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"type": "error", "error": {"type": "overloaded_error",
                    "message": "ledger down"}})
            )
        );
        assert_eq!(
            doc(Dialect::Stripe).1["error"]["type"],
            "api_error",
            "a 5xx is Stripe's api_error"
        );
        let timeout = Problem::new(ProblemCode::UpstreamTimeout, "slow");
        let res = timeout.render_in(Dialect::Anthropic);
        let doc: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(doc["error"]["type"], "api_error");
        let missing = Problem::new(ProblemCode::KeyMissing, "no key").render_in(Dialect::OpenAi);
        let doc: serde_json::Value = serde_json::from_slice(missing.body()).unwrap();
        assert_eq!(doc["error"]["type"], "invalid_request_error");
    }
}

#[cfg(test)]
mod one_shape {
    use super::*;

    /// Every code renders the same document shape, whoever writes it (gateway, MCP,
    /// webhooks, admin): `type` names the code, `title` is the code's own, `status`
    /// matches the answer's.
    #[test]
    fn every_code_renders_one_shape() {
        for code in ProblemCode::ALL {
            let res = Problem::new(code, "why").render();
            assert_eq!(res.status(), code.status());
            assert_eq!(res.headers()["content-type"], "application/problem+json");
            let doc: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
            assert_eq!(doc["type"], format!("urn:oncely:problem:{code}"));
            assert_eq!(doc["title"], code.title());
            assert_eq!(doc["status"], code.status().as_u16());
            assert_eq!(doc["code"], code.as_str());
            assert_eq!(doc["detail"], "why");
            assert!(doc.get("record").is_none());
            // A ledger away is told when to come back; nothing else is, unless asked.
            let told = code == ProblemCode::StoreUnavailable;
            assert_eq!(doc.get("retry_after").is_some(), told, "{code}");
        }
    }
}
