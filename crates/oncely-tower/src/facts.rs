//! What the guard reads of one request, each once, for HTTP routes, queued jobs and MCP
//! tool calls alike: [`RequestFacts`] (the principal's keyed hash, the workflow id, the
//! server span) and [`read_body`] (the body under its limit). The guarded call made of
//! them is assembled by the route's policy (`RoutePolicy::guarded_call`).

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::HeaderMap;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::guard::Guard;
use crate::problem::{Problem, ProblemCode};
use crate::sources::{workflow_id, MakePrincipal, RequestHead};
use crate::trace::Span;
use crate::BoxError;

/// What is known of a request before the ledger is asked anything.
#[derive(Debug)]
pub struct RequestFacts {
    /// The principal's keyed hash ([`Guard::principal_hash`]), `None` when the request
    /// names none.
    pub principal: Option<String>,
    /// `X-Workflow-Id` (trimmed, at most 200 characters) or the `traceparent`'s trace id.
    pub workflow_id: Option<String>,
    /// The request's server span, when traces are on.
    pub span: Option<Span>,
}

impl RequestFacts {
    /// The facts of the request `head`, whose principal `principal` reads.
    pub fn read(
        guard: &Guard,
        head: &RequestHead<'_>,
        principal: &dyn MakePrincipal,
    ) -> RequestFacts {
        RequestFacts {
            // Named, and given its HTTP attributes, by the guard (`http_server_request`).
            span: guard
                .tracer()
                .map(|tracer| tracer.start_request(head.headers, String::new())),
            ..RequestFacts::unspanned(guard, head, principal)
        }
    }

    /// [`RequestFacts::read`] without the span, for a transport that starts its own (an
    /// MCP message's).
    pub fn unspanned(
        guard: &Guard,
        head: &RequestHead<'_>,
        principal: &dyn MakePrincipal,
    ) -> RequestFacts {
        RequestFacts {
            principal: principal
                .make_principal(head)
                .map(|raw| guard.principal_hash(&raw)),
            workflow_id: workflow_id(head.headers),
            span: None,
        }
    }
}

/// The whole body, or 413 `body_too_large` when it (or its declared `Content-Length`)
/// is larger than `max`, or 400 `body_unreadable` when it breaks off.
pub async fn read_body<B>(body: B, headers: &HeaderMap, max: u64) -> Result<Bytes, Problem>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        Problem::new(
            ProblemCode::BodyTooLarge,
            format!("the request body is larger than {max} bytes"),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "request body unreadable");
            Err(Problem::new(
                ProblemCode::BodyUnreadable,
                "the request body could not be read",
            ))
        }
    }
}
