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

use crate::BoxBody;

/// The `Oncely-Status` header.
pub const ONCELY_STATUS: &str = "oncely-status";
/// The `Oncely-Record` header.
pub const ONCELY_RECORD: &str = "oncely-record";
/// The `Idempotent-Replayed` header.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Upstream to gateway: its answer is good until this RFC 3339 time at most.
pub const REPLAY_UNTIL: &str = "oncely-replay-until";
/// Upstream to gateway: its answer is good for this many seconds at most.
pub const REPLAY_SECONDS: &str = "oncely-replay-seconds";

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
}

impl Problem {
    /// A problem with the given code and detail.
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Problem {
        Problem {
            code,
            detail: detail.into(),
            retry_after: None,
            record: None,
            original_at: None,
        }
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

    /// The problem document (RFC 9457 members plus `code`, `record`, `original_at`,
    /// `retry_after`).
    pub fn to_json(&self) -> serde_json::Value {
        let mut doc = serde_json::json!({
            "type": format!("urn:oncely:problem:{}", self.code.as_str()),
            "title": self.code.title(),
            "status": self.code.status().as_u16(),
            "detail": self.detail,
            "code": self.code.as_str(),
        });
        if let Some(id) = &self.record {
            doc["record"] = id.as_str().into();
        }
        if let Some(at) = self.original_at {
            doc["original_at"] = at.to_rfc3339().into();
        }
        if let Some(s) = self.retry_after {
            doc["retry_after"] = s.into();
        }
        doc
    }

    /// The answer: status, `Content-Type: application/problem+json`, `Oncely-Record`
    /// and `Retry-After` when known, with the document as its body. The caller adds
    /// `Oncely-Status` (and, for the webhook endpoints' 405, `Allow`).
    pub fn into_response(self) -> Response<BoxBody> {
        use http_body_util::BodyExt;
        self.render().map(|doc| {
            http_body_util::Full::new(doc)
                .map_err(|never| match never {})
                .boxed()
        })
    }

    /// The same answer with the document as bytes, for a caller with a body type of its
    /// own (`problem.render().map(axum::body::Body::from)`).
    pub fn render(&self) -> Response<Bytes> {
        let mut res = Response::new(Bytes::from(self.to_json().to_string()));
        *res.status_mut() = self.code.status();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(id) = &self.record {
            if let Ok(v) = HeaderValue::from_str(id.as_str()) {
                h.insert(ONCELY_RECORD, v);
            }
        }
        res
    }
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
            assert!(doc.get("record").is_none() && doc.get("retry_after").is_none());
        }
    }
}
