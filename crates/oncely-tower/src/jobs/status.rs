//! The status endpoint, `GET /_oncely/jobs/ID` and `GET /_oncely/jobs/ID/result`: a
//! job's JSON (its status, its URLs, what is known of its run) and, once it is done, its
//! answer; the 202 a job's request gets while the job still runs. Only the principal
//! that started a job is answered; anyone else gets 404, so an id reveals nothing.

use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use oncely_core::{Record, RecordId, State};
use oncely_engine::retry_after;

use crate::body::full;
use crate::coding::{replay_body, Accept};
use crate::guard::Guard;
use crate::problem::{Problem, ProblemCode, IDEMPOTENT_REPLAYED, ONCELY_RECORD, ONCELY_STATUS};
use crate::sources::RequestHead;
use crate::BoxBody;

/// Where job status lives on the gateway's own listener.
pub const JOBS_PATH: &str = "/_oncely/jobs/";

/// The status of a job as `GET /_oncely/jobs/ID` shows it.
pub fn job_status(record: &Record) -> &'static str {
    match record.state {
        State::Processing => "running",
        State::Completed => "completed",
        State::Released => "failed",
        State::OutcomeUnknown => "outcome_unknown",
    }
}

/// The JSON of a job: `job_id`, `status`, `status_url`, `started_at`, and what is known.
pub fn job_json(record: &Record) -> serde_json::Value {
    let id = record.id.as_str();
    let mut v = serde_json::json!({
        "job_id": id,
        "status": job_status(record),
        "status_url": format!("{JOBS_PATH}{id}"),
        "result_url": format!("{JOBS_PATH}{id}/result"),
        "started_at": record.created_at.to_rfc3339(),
        "updated_at": record.updated_at.to_rfc3339(),
        "attempt": record.attempt,
    });
    if let Some(at) = record.completed_at {
        v["completed_at"] = at.to_rfc3339().into();
    }
    if let Some(r) = &record.response {
        v["upstream_status"] = r.status.into();
    }
    if record.state != State::Completed {
        if let Some(e) = &record.last_error {
            v["error"] = e.clone().into();
        }
    }
    v
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<BoxBody> {
    let mut res = Response::new(full(v.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The 202 answer of a job still running.
pub(crate) fn accepted_response(record: &Record, retry_after: Duration) -> Response<BoxBody> {
    let v = job_json(record);
    let mut res = json_response(StatusCode::ACCEPTED, &v);
    let location = format!("{JOBS_PATH}{}", record.id);
    let h = res.headers_mut();
    if let Ok(l) = HeaderValue::from_str(&location) {
        h.insert(http::header::LOCATION, l);
    }
    h.insert(
        http::header::RETRY_AFTER,
        HeaderValue::from(retry_after.as_secs().max(1)),
    );
    res
}

/// Answers `GET /_oncely/jobs/ID` and `GET /_oncely/jobs/ID/result`, for the principal
/// that started the job only (anyone else, and any unknown id, gets 404).
pub async fn status_endpoint(guard: &Guard, req: &Request<()>) -> Response<BoxBody> {
    let not_found = || {
        Problem::new(
            ProblemCode::NotFound,
            "no job with this id for this account",
        )
        .into_response()
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return not_found();
    }
    let rest = &req.uri().path()[JOBS_PATH.len()..];
    let (id, result) = match rest.strip_suffix("/result") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    if id.is_empty() || id.contains('/') {
        return not_found();
    }
    let record = match guard.store().get(&RecordId(id.to_string())).await {
        Ok(Some(r)) if r.class == oncely_core::Class::Job => r,
        Ok(_) => return not_found(),
        Err(e) => {
            tracing::error!(target: "oncely::store", error = %e, "ledger unavailable; job status not answered");
            return Problem::new(
                ProblemCode::StoreUnavailable,
                "the ledger cannot be reached",
            )
            .into_response();
        }
    };
    let Some(policy) = guard.jobs.route(&record.route) else {
        return not_found();
    };
    let principal = policy
        .principal
        .make_principal(&RequestHead::of(req))
        .map(|raw| guard.principal_hash(&raw));
    if principal.as_deref() != Some(record.principal.as_str()) {
        return not_found();
    }
    let mut res = if !result {
        json_response(StatusCode::OK, &job_json(&record))
    } else {
        result_response(&record, policy.wait, &Accept::of(req.headers()))
    };
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        res.headers_mut().insert(ONCELY_RECORD, v);
    }
    res
}

fn result_response(record: &Record, wait: Duration, accept: &Accept) -> Response<BoxBody> {
    match (record.state, &record.response) {
        (State::Completed, Some(stored)) if stored.body.is_some() => {
            let mut headers = http::HeaderMap::new();
            crate::headers::replay_headers(&stored.headers, &mut headers);
            let body = replay_body(
                stored.body.clone().unwrap_or_default(),
                &mut headers,
                accept,
            );
            let mut res = Response::new(body);
            *res.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
            *res.headers_mut() = headers;
            let h = res.headers_mut();
            h.insert(ONCELY_STATUS, HeaderValue::from_static("replayed"));
            h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            res
        }
        (State::Completed, _) => Problem::new(
            ProblemCode::ResultTooLarge,
            "the job completed, but its answer was too large to keep",
        )
        .with_original_at(record.created_at)
        .into_response(),
        (State::Processing, _) => {
            let secs = retry_after(wait).as_secs().max(1);
            Problem::new(
                ProblemCode::InFlight,
                format!("the job is still running; ask again in {secs} seconds"),
            )
            .with_retry_after(secs)
            .with_original_at(record.created_at)
            .into_response()
        }
        (State::OutcomeUnknown, _) => Problem::new(
            ProblemCode::OutcomeUnknown,
            "the job may or may not have taken effect; it awaits reconciliation",
        )
        .with_original_at(record.created_at)
        .into_response(),
        (State::Released, _) => Problem::new(
            ProblemCode::JobFailed,
            "the job failed; send the original request again to run it again",
        )
        .with_original_at(record.created_at)
        .into_response(),
    }
}
