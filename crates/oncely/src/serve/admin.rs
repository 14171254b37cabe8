//! The admin API on `admin_listen` (axum).
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /healthz` | 200 when the store answers, else 503 (no token needed) |
//! | `GET /metrics` | Prometheus text (no token needed) |
//! | `GET /records?status=S&principal=P&route=R&limit=N` | JSON array, as `ledger list --json` (`P` its hash or its raw value) |
//! | `GET /records/ID` | one record, as `ledger show --json` |
//! | `POST /records/ID/resolve` | `{"released": true}` or `{"completed": true, "status": 200, "headers": {...}, "body": "..."}` (also `"state": "released" \| "completed"`, and headers as `["Name: value"]`) |
//! | `GET /usage?since=DURATION` | as `usage --since DURATION --json` (default `30d`) |
//! | `GET /usage?by=hour&since=DURATION` | as `usage --by hour --format json` (default `30d`) |
//! | `/console/...` | the operator console, HTML ([`super::console`]); the same token, or a session cookie |
//!
//! Everything else needs `Authorization: Bearer TOKEN`, the token being the value of the
//! variable `admin_token_env` names. When that variable is unset (or empty) those routes
//! answer 403; a missing or wrong token answers 401. Errors are
//! `application/problem+json` with a `code`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use metrics_exporter_prometheus::PrometheusHandle;
use oncely_core::{RecordId, State as RecordState};
use oncely_http::problem::{Problem, ProblemCode};
use oncely_store::{ListFilter, Store, StoreError};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::operations::{OpError, Verdict, Via};
use crate::records;

/// What the admin handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The ledger.
    pub store: Arc<dyn Store>,
    /// The config (for route windows).
    pub config: Arc<Config>,
    /// The bearer token; `None` closes the API.
    pub token: Option<String>,
    /// The metrics handle.
    pub metrics: PrometheusHandle,
    /// The webhook routes (`/webhooks/dead`, `/webhooks/dead/{id}/redeliver`), put behind
    /// the same bearer token.
    pub webhooks: Router,
    /// Wakes this process's webhook delivery worker (when it has one): the console's
    /// redeliveries are sent at once, as the admin API's are.
    pub webhook_waker: Option<oncely_webhooks::Waker>,
}

/// An admin API error: one type, rendered as problem+json (`oncely_http::problem`, the
/// one renderer), internals hidden.
#[derive(Debug)]
pub struct AdminError(Problem);

impl AdminError {
    fn new(code: ProblemCode, detail: impl Into<String>) -> AdminError {
        AdminError(Problem::new(code, detail))
    }
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> AdminError {
        match e {
            StoreError::NotFound(id) => {
                AdminError::new(ProblemCode::NotFound, format!("no ledger record {id}"))
            }
            StoreError::Transition(t) => AdminError::new(ProblemCode::WrongState, t.to_string()),
            other => {
                tracing::warn!(error = %other, "admin API: store failure");
                AdminError::new(
                    ProblemCode::StoreUnavailable,
                    "the ledger cannot be reached",
                )
            }
        }
    }
}

impl From<OpError> for AdminError {
    fn from(e: OpError) -> AdminError {
        match e {
            OpError::NotFound(_) | OpError::NoDelivery(_) => {
                AdminError::new(ProblemCode::NotFound, e.to_string())
            }
            OpError::NotOutcomeUnknown { .. } => {
                AdminError::new(ProblemCode::WrongState, e.to_string())
            }
            OpError::NotDead(_) => AdminError::new(ProblemCode::NotDead, e.to_string()),
            OpError::Invalid(_) | OpError::NotReconcilable(_) | OpError::Client(_) => {
                bad(e.to_string())
            }
            OpError::Store(e) => e.into(),
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        self.0.render().map(axum::body::Body::from)
    }
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    let guarded = Router::new()
        .route("/records", get(list))
        .route("/records/{id}", get(show))
        .route("/records/{id}/resolve", post(resolve))
        .route("/usage", get(usage))
        .route("/openapi.json", get(openapi))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    let webhooks = state
        .webhooks
        .clone()
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(guarded)
        .fallback(|| async { AdminError::new(ProblemCode::NotFound, "no such admin route") })
        .with_state(state.clone())
        .merge(webhooks)
        .merge(super::console::router(
            state.store,
            state.config,
            state.token,
            state.webhook_waker,
        ))
}

async fn auth(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return AdminError::new(
            ProblemCode::AdminDisabled,
            format!(
                "the admin API is closed: set {} to a token to open it",
                state.config.admin_token_env
            ),
        )
        .into_response();
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if bool::from(g.as_bytes().ct_eq(token.as_bytes())) => next.run(req).await,
        _ => {
            let mut res = AdminError::new(
                ProblemCode::Unauthorized,
                "a valid Authorization: Bearer token is required",
            )
            .into_response();
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            res
        }
    }
}

async fn healthz(State(state): State<AdminState>) -> Response {
    match tokio::time::timeout(Duration::from_secs(5), state.store.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ok\n").into_response(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "health check: the store does not answer");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response()
        }
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "store timed out\n").into_response(),
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    status: Option<String>,
    principal: Option<String>,
    route: Option<String>,
    limit: Option<usize>,
}

async fn list(
    State(state): State<AdminState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<RecordState>()
                .map_err(|e| AdminError::new(ProblemCode::BadRequest, e))?,
        ),
    };
    // As `ledger list --principal P`: the stored hash, or the raw value hashed.
    let principal = match q.principal.as_deref() {
        None | Some("") => None,
        Some(p) => Some(principal_filter(&state.store, p).await?),
    };
    let filter = ListFilter {
        state: status,
        principal,
        route: q.route,
        limit: q.limit,
    };
    let list = state.store.list(&filter).await?;
    Ok(Json(serde_json::Value::Array(
        list.iter().map(records::summary).collect(),
    )))
}

/// A principal as `?principal=P` takes it ([`crate::operations::principal_filter`]).
async fn principal_filter(store: &Arc<dyn Store>, p: &str) -> Result<String, AdminError> {
    Ok(crate::operations::principal_filter(store, p).await?)
}

async fn show(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let id = RecordId(id);
    match state.store.get(&id).await? {
        Some(r) => {
            let churn = state.store.churn_of(&r.id).await?;
            Ok(Json(records::detail(&r, &churn)))
        }
        None => Err(StoreError::NotFound(id).into()),
    }
}

/// The body of `POST /records/ID/resolve`. The verdict is `"released": true`,
/// `"completed": true`, or `"state": "released" | "completed"`; the headers a map, or a
/// list of `"Name: value"` lines as the CLI's `--header` takes them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(default)]
    released: bool,
    #[serde(default)]
    completed: bool,
    state: Option<String>,
    status: Option<u16>,
    #[serde(default)]
    headers: ResolveHeaders,
    body: Option<String>,
    /// The body as base64, for bytes that are not text (an extension).
    body_base64: Option<String>,
}

/// The headers of a resolution: `{"Name": "value"}` or `["Name: value", ...]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ResolveHeaders {
    Map(std::collections::BTreeMap<String, String>),
    Lines(Vec<String>),
}

impl Default for ResolveHeaders {
    fn default() -> ResolveHeaders {
        ResolveHeaders::Map(Default::default())
    }
}

impl ResolveHeaders {
    fn pairs(self) -> Result<Vec<(String, String)>, AdminError> {
        match self {
            ResolveHeaders::Map(m) => Ok(m.into_iter().collect()),
            ResolveHeaders::Lines(lines) => lines
                .into_iter()
                .map(|line| {
                    line.split_once(':')
                        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
                        .ok_or_else(|| bad(format!("header {line:?} is not \"Name: value\"")))
                })
                .collect(),
        }
    }
}

fn bad(detail: impl Into<String>) -> AdminError {
    AdminError::new(ProblemCode::BadRequest, detail)
}

async fn resolve(
    State(state): State<AdminState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<serde_json::Value>, AdminError> {
    let b: ResolveBody = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("the body is not a resolution: {e}")))?;
    let (released, completed) = match b.state.as_deref() {
        None => (b.released, b.completed),
        Some("released") if !b.completed => (true, false),
        Some("completed") if !b.released => (false, true),
        Some(other) => {
            return Err(bad(format!(
                "\"state\": {other:?} (with released={}, completed={}) is not a verdict: use \"released\" or \"completed\"",
                b.released, b.completed
            )))
        }
    };
    let verdict = match (released, completed) {
        (true, false) => Verdict::Released,
        (false, true) => {
            let status = b
                .status
                .ok_or_else(|| bad("\"completed\" needs \"status\" (100-599)"))?;
            let mut headers = Vec::new();
            for (name, value) in b.headers.pairs()? {
                headers.push(crate::operations::header(&name, &value).map_err(bad)?);
            }
            let body = match (b.body, b.body_base64) {
                (Some(_), Some(_)) => return Err(bad("give body or body_base64, not both")),
                (Some(text), None) => text.into_bytes(),
                (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| bad(format!("body_base64: {e}")))?,
                (None, None) => Vec::new(),
            };
            Verdict::Completed {
                status,
                headers,
                body,
            }
        }
        _ => return Err(bad(
            "give exactly one of {\"released\": true} and {\"completed\": true, \"status\": ...}",
        )),
    };
    let after = crate::operations::resolve(
        &*state.store,
        Some(&state.config),
        &id,
        verdict,
        Via::AdminApi,
    )
    .await?;
    let churn = state.store.churn_of(&after.id).await?;
    Ok(Json(records::detail(&after, &churn)))
}

/// `GET /openapi.json`: the admin API as an OpenAPI 3.1 document, kept in the repository
/// as `docs/openapi.json` (a test checks it against the routes served here).
async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../../../../docs/openapi.json"),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct UsageQuery {
    since: Option<String>,
    by: Option<String>,
}

/// The period `GET /usage` covers when `since` is not given.
const USAGE_SINCE: Duration = Duration::from_secs(30 * 86_400);

/// `GET /usage?since=D`: per principal over the period (from the start of the hour `D`
/// ago; default 30d), as `usage --json`; with `by=hour`, the rows per principal, route
/// and hour, as `usage --by hour --format json`.
async fn usage(
    State(state): State<AdminState>,
    Query(q): Query<UsageQuery>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let by_hour = match q.by.as_deref() {
        None | Some("") => false,
        Some("hour") => true,
        Some(other) => return Err(bad(format!("by={other:?}: the only grouping is by=hour"))),
    };
    let since = match q.since.as_deref() {
        None | Some("") => USAGE_SINCE,
        Some(s) => oncely_core::parse_duration(s).map_err(bad)?,
    };
    let from = crate::operations::period_start(state.store.now().await?, since);
    if by_hour {
        let rows = state.store.usage_by_hour(Some(from)).await?;
        return Ok(Json(records::usage_hours(&rows)));
    }
    let u = state.store.usage(Some(from)).await?;
    Ok(Json(records::usage(&u)))
}
