//! The guarded path of one HTTP request: from the request to a [`GuardedCall`], through
//! [`Guard::execute`], and from its [`Execution`] back to a response. Everything the
//! ledger decides lives in the guard; this file only translates.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use oncely_core::{
    Class, Disposition, DownstreamKey, FingerprintBuilder, Record, State, UpstreamResult,
};
use oncely_engine::Delivery;
use tower::Service;

use crate::body::full;
use crate::coding::{replay_body, Accept};
use crate::facts::RequestFacts;
use crate::guard::{Execution, FreshResponse, Guard, UpstreamCall, UpstreamFailure};
use crate::jobs::JobRequest;
use crate::log::{log_request, provider_request_id, RequestLog};
use crate::policy::RoutePolicy;
use crate::problem::{
    Problem, ProblemCode, IDEMPOTENT_REPLAYED, ONCELY_KEY_CHURN, ONCELY_RECORD, ONCELY_STATUS,
};
use crate::sources::RequestHead;
use crate::trace::{attr, Span};
use crate::upstream::{call_upstream, traced};
use crate::{BoxBody, BoxError};

/// The `Idempotency-Key` header.
pub(crate) use crate::sources::IDEMPOTENCY_KEY;

/// What to do with a request on a matched route that deduplicates.
#[derive(Debug)]
pub(crate) enum Decision {
    /// `guard_when` did not match, or the principal is missing: forwarded, marked.
    Bypass { principal: Option<String> },
    /// Guarded, for this principal (its keyed hash).
    Guard { principal: String },
}

impl Decision {
    pub(crate) fn of<B>(policy: &RoutePolicy, facts: &RequestFacts, req: &Request<B>) -> Decision {
        let principal = facts.principal.clone();
        if let Some(when) = &policy.guard_when {
            let matches = req
                .headers()
                .get(&when.header)
                .is_some_and(|v| v.as_bytes().starts_with(when.prefix.as_bytes()));
            if !matches {
                return Decision::Bypass { principal };
            }
        }
        match principal {
            Some(principal) => Decision::Guard { principal },
            None => Decision::Bypass { principal: None },
        }
    }
}

/// The guarded path, start to answer.
pub(crate) async fn guarded<S, B, ResBody>(
    guard: Arc<Guard>,
    policy: Arc<RoutePolicy>,
    principal: String,
    facts: RequestFacts,
    req: Request<B>,
    inner: S,
    started: Instant,
) -> Response<BoxBody>
where
    S: Service<Request<BoxBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let mut log = RequestLog {
        record: None,
        route: &policy.name,
        principal: Some(&principal),
        status: "",
        attempt: None,
        workflow_id: None,
        upstream_status: None,
        provider_request_id: None,
        started,
        span: facts.span,
    };
    let workflow = facts.workflow_id;
    log.workflow_id = workflow.as_deref();
    let (mut parts, body) = req.into_parts();

    // A key source that does not read the body refuses before the body is read; one
    // that does sees the headers as the client sent them, too.
    let mut body = Some(body);
    let mut bytes = Bytes::new();
    if policy.key.reads_body() {
        let unread = body.take().expect("the body is read once");
        bytes = match crate::facts::read_body(unread, &parts.headers, policy.max_body).await {
            Ok(b) => b,
            Err(p) => return refuse(p, &mut log),
        };
    }
    let client_key = match policy.key.make_key(&RequestHead::of_parts(&parts), &bytes) {
        Ok(k) => k,
        Err(p) => return refuse(p, &mut log),
    };
    if let Some(span) = &mut log.span {
        let source = if client_key.is_some() {
            "header"
        } else {
            "fingerprint"
        };
        span.fixed(attr::KEY_SOURCE, source);
    }
    // Hop-by-hop headers go now, before the downstream key is set: a caller's
    // `Connection: idempotency-key` must not remove the key the upstream gets.
    crate::headers::strip_hop_by_hop(&mut parts.headers);
    if let Some(unread) = body {
        bytes = match crate::facts::read_body(unread, &parts.headers, policy.max_body).await {
            Ok(b) => b,
            Err(p) => return refuse(p, &mut log),
        };
    }

    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut fp = FingerprintBuilder::new(&principal, parts.method.as_str(), path_and_query);
    for name in &policy.fingerprint_headers {
        let value = crate::sources::combined(&parts.headers, name);
        fp = fp.header(name.as_str(), value.as_deref());
    }
    // A form or an upload is read by its fields and parts, whatever its framing.
    let content_type = parts.headers.get(http::header::CONTENT_TYPE);
    let content_type = content_type.map(HeaderValue::as_bytes);
    let fingerprint = if policy.fingerprint_fields.is_empty() {
        fp.request_body(content_type, &bytes, &policy.ignore_fields)
    } else {
        fp.request_body_fields(content_type, &bytes, &policy.fingerprint_fields)
    };
    let request_units = policy
        .units
        .request_units(&RequestHead::of_parts(&parts), &bytes);
    let key = client_key.map(|k| k.as_str().to_string());
    let mut call = policy.guarded_call(
        principal.clone(),
        key,
        fingerprint,
        workflow.clone(),
        request_units,
    );
    // The record keeps the span that executes it: replays and joins link to it.
    call.trace = log.span.as_ref().map(Span::span_ref);

    let units = policy.units.clone();
    // What a replay or a join may be sent in.
    let accept = Accept::of(&parts.headers);
    // A queued job's upstream call continues this request's trace when it runs.
    if let (Some(span), Class::Job) = (&log.span, policy.class) {
        span.propagate(&mut parts.headers);
    }
    let upstream_span = log.span.as_ref().map(Span::as_parent);
    // A job keeps what its call needs in the durable queue until it has run.
    let job = (policy.class == Class::Job).then(|| JobRequest {
        method: parts.method.clone(),
        target: path_and_query.to_string(),
        headers: parts.headers.clone(),
        body: bytes.clone(),
    });
    let run = move |downstream: DownstreamKey, _: &Record| -> UpstreamCall {
        crate::headers::sent_whole(&mut parts.headers, bytes.len());
        parts.headers.insert(
            HeaderName::from_static(IDEMPOTENCY_KEY),
            HeaderValue::from_str(downstream.as_str()).expect("a downstream key is visible ASCII"),
        );
        let span = upstream_span.map(|parent| parent.upstream_request(&mut parts));
        // The owner holds the route's slot and times the call: the inner service does
        // neither.
        parts.extensions.insert(crate::upstream::OwnerSend);
        let req = Request::from_parts(parts, full(bytes));
        traced(call_upstream(inner, req, units), span)
    };

    let churn = call.churn.clone();
    let churn_key = call.key.clone();
    let execution = match job {
        Some(job) => guard.submit_job(&policy, call, job).await,
        None => guard.execute(call, run).await,
    };
    // A request under a made-up key answered from another key's record: its header names
    // the original, and its first request is counted (by the engine) and marked.
    let original = churn.as_ref().and_then(|_| {
        match &execution {
            // A released original run again for its made-up key.
            Execution::Fresh(fresh) => Some(&fresh.record),
            other => other.record(),
        }
        .filter(|r| r.key != churn_key)
        .map(|r| r.id.clone())
    });
    if let (Some(span), Some(c)) = (&mut log.span, &churn) {
        if c.joined_now() {
            span.set(attr::KEY_CHURN, true);
        }
    }
    // A repeat's answer of a record whose caller never got its own: once it is read to
    // its end, an answer of the record did reach a caller.
    let delivery = match &execution {
        Execution::Replayed(r) | Execution::Joined(r) => Delivery::repeat(guard.store(), r),
        _ => None,
    };
    let mut res = respond(execution, policy.class, &accept, &mut log);
    if let Some(id) = original {
        if let Ok(v) = HeaderValue::from_str(id.as_str()) {
            res.headers_mut().insert(ONCELY_KEY_CHURN, v);
        }
    }
    match delivery {
        Some(d) => res.map(|body| crate::body::delivered(body, d)),
        None => res,
    }
}

/// Links the request's span (if any) to the span that executed `record`'s original.
fn link_original(log: &mut RequestLog<'_>, record: &Record) {
    if let Some(span) = &mut log.span {
        span.link_to(record.trace.as_deref());
    }
}

/// Ends the request's span (if any) with what the log line says.
fn end_span(log: &mut RequestLog<'_>, status: StatusCode) {
    let Some(mut span) = log.span.take() else {
        return;
    };
    span.fixed(attr::DECISION, log.status);
    if let Some(record) = &log.record {
        span.set(attr::RECORD, record.as_str());
    }
    if let Some(attempt) = log.attempt {
        span.set(attr::ATTEMPT, i64::from(attempt));
    }
    if let Some(principal) = log.principal {
        span.set(attr::PRINCIPAL, principal);
    }
    if let Some(upstream) = log.upstream_status {
        span.set(attr::UPSTREAM_STATUS, i64::from(upstream));
    }
    if let Some(workflow) = log.workflow_id {
        span.set(attr::WORKFLOW_ID, workflow);
    }
    // An error of the gateway's own names its problem code as error.type.
    let own = !matches!(log.status, "fresh" | "replayed" | "joined" | "bypassed");
    crate::trace::http_server_response(&mut span, status.as_u16(), own.then_some(log.status));
    span.end();
}

/// Translates what the guard did into the answer.
fn respond(
    execution: Execution,
    class: Class,
    accept: &Accept,
    log: &mut RequestLog<'_>,
) -> Response<BoxBody> {
    match execution {
        Execution::Fresh(FreshResponse {
            record,
            status,
            headers,
            body,
        }) => {
            let mut res = Response::new(body);
            *res.status_mut() = status;
            *res.headers_mut() = headers;
            log.upstream_status = Some(status.as_u16());
            log.provider_request_id = provider_request_id(res.headers());
            finish(res, "fresh", &record, false, log)
        }
        Execution::Replayed(record) => {
            link_original(log, &record);
            replay(record, "replayed", accept, log)
        }
        Execution::Joined(record) => {
            link_original(log, &record);
            replay(record, "joined", accept, log)
        }
        Execution::InFlight {
            record,
            retry_after,
        } => {
            let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            let p = Problem::new(
                ProblemCode::InFlight,
                format!(
                    "an identical request is still running; it will not run twice. \
                     Send this request again in {secs} second{} to receive its result",
                    if secs == 1 { "" } else { "s" }
                ),
            )
            .with_retry_after(secs)
            .with_original_at(record.created_at);
            refuse_record(p, &record, log)
        }
        Execution::Accepted {
            record,
            first,
            retry_after,
        } => {
            let res = crate::jobs::accepted_response(&record, retry_after);
            finish(
                res,
                if first { "fresh" } else { "joined" },
                &record,
                !first,
                log,
            )
        }
        Execution::OutcomeUnknown(record) => {
            let p = Problem::new(
                ProblemCode::OutcomeUnknown,
                "an earlier identical request may or may not have taken effect; it awaits \
                 reconciliation and will not be executed again until then",
            )
            .with_original_at(record.created_at);
            refuse_record(p, &record, log)
        }
        Execution::TooLarge(record) => {
            let p = Problem::new(
                ProblemCode::ResultTooLarge,
                "the original request completed, but its answer was too large to keep for \
                 replay; it will not be executed again within its window",
            )
            .with_original_at(record.created_at);
            refuse_record(p, &record, log)
        }
        Execution::KeyReused(record) => {
            let p = Problem::new(
                ProblemCode::KeyReused,
                "this Idempotency-Key was already used with a different request",
            )
            .with_original_at(record.created_at);
            refuse_record(p, &record, log)
        }
        Execution::StoreUnavailable(reason) => {
            tracing::error!(target: "oncely::store", error = %reason, route = log.route, "ledger unavailable; request not forwarded");
            // A job's submission that the ledger takes after this answer still runs
            // (once): the same request, sent again, finds it.
            let detail = if class == Class::Job {
                "the ledger did not answer; the job was not started, but may still be queued: \
                 send the same request again to run it or to learn its state"
            } else {
                "the ledger cannot be reached; the request was not forwarded"
            };
            refuse(Problem::new(ProblemCode::StoreUnavailable, detail), log)
        }
        Execution::UpstreamFailed { record, failure } => {
            let (code, detail) = match &failure {
                UpstreamFailure::Unreachable(_) => (
                    ProblemCode::UpstreamUnreachable,
                    "the upstream could not be reached; nothing was sent".to_string(),
                ),
                UpstreamFailure::Lost(_) => (
                    ProblemCode::UpstreamUnreachable,
                    format!(
                        "the upstream failed before answering; the record is {}",
                        record.state
                    ),
                ),
                UpstreamFailure::Timeout => (
                    ProblemCode::UpstreamTimeout,
                    format!(
                        "the upstream did not answer in time; the record is {}",
                        record.state
                    ),
                ),
                UpstreamFailure::Busy => (
                    ProblemCode::UpstreamBusy,
                    format!(
                        "every upstream slot of this route stayed taken; the request was not \
                         sent and the record is {}: send it again later",
                        record.state
                    ),
                ),
            };
            // A retry can succeed when the record was released (or will be: the answer
            // may come before the owner's write); not when it is, or becomes,
            // `outcome_unknown`.
            let released = match record.state {
                State::Released => true,
                State::Processing => {
                    failure == UpstreamFailure::Busy
                        || matches!(failure, UpstreamFailure::Unreachable(_))
                        || class.dispose(UpstreamResult::LostAfterSend) == Disposition::Release
                }
                _ => false,
            };
            let mut problem = Problem::new(code, detail)
                .with_record(&record.id)
                .with_should_retry(released);
            if failure == UpstreamFailure::Busy {
                problem = problem.with_retry_after(1);
            }
            // The request was this record's execution, but its answer is the gateway's
            // own error: `Oncely-Status` (and the span, and the line) say its code.
            let res = problem.into_response();
            finish(res, code.as_str(), &record, false, log)
        }
    }
}

fn replay(
    mut record: Record,
    status: &'static str,
    accept: &Accept,
    log: &mut RequestLog<'_>,
) -> Response<BoxBody> {
    // Moved out, not copied: the body becomes the answer's `Bytes` as it is (decoded on
    // the way out when the caller does not accept its coding).
    let stored = record.response.take().unwrap_or_default();
    let mut headers = http::HeaderMap::new();
    crate::headers::replay_headers(&stored.headers, &mut headers);
    let body = replay_body(stored.body.unwrap_or_default(), &mut headers, accept);
    let mut res = Response::new(body);
    *res.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    *res.headers_mut() = headers;
    log.upstream_status = Some(stored.status);
    log.provider_request_id = record.provider_request_id.take();
    finish(res, status, &record, true, log)
}

fn refuse(problem: Problem, log: &mut RequestLog<'_>) -> Response<BoxBody> {
    let status = problem.code.as_str();
    let mut res = problem.into_response();
    res.headers_mut()
        .insert(ONCELY_STATUS, HeaderValue::from_static(status));
    log.status = status;
    end_span(log, res.status());
    log_request(log);
    res
}

fn refuse_record(problem: Problem, record: &Record, log: &mut RequestLog<'_>) -> Response<BoxBody> {
    let status = problem.code.as_str();
    let res = problem.with_record(&record.id).into_response();
    finish(res, status, record, false, log)
}

fn finish(
    mut res: Response<BoxBody>,
    status: &'static str,
    record: &Record,
    replayed: bool,
    log: &mut RequestLog<'_>,
) -> Response<BoxBody> {
    let h = res.headers_mut();
    h.insert(ONCELY_STATUS, HeaderValue::from_static(status));
    if let Ok(v) = HeaderValue::from_str(record.id.as_str()) {
        h.insert(ONCELY_RECORD, v);
    }
    if replayed {
        h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    log.status = status;
    log.record = Some(record.id.to_string());
    log.attempt = Some(record.attempt);
    end_span(log, res.status());
    log_request(log);
    res
}
