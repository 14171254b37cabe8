//! Operating the delivery queue: dead-lettered deliveries and sending one again.
//!
//! [`list_dead`] and [`redeliver`] back `oncely webhooks dead [--json]` and
//! `oncely webhooks redeliver ID`; [`admin_router`] serves the same on the admin API:
//!
//! - `GET /webhooks/dead` — a JSON array of [`DeadDelivery`].
//! - `POST /webhooks/dead/{id}/redeliver` — requeues it; answers the delivery (now
//!   `pending`), 404 `not_found` for an unknown id, 409 `not_dead` for one still queued.
//!
//! An ID is a delivery's task id (`task_...`) or its event's record id (`rec_...`, the
//! `Oncely-Record` the sender got).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use oncely_http::problem::ProblemCode;
use oncely_store::{Store, StoreError, Task, TaskError, TaskId, TaskState};
use serde::Serialize;

use crate::ingress::problem;
use crate::queue::{Waker, TASK_KIND};

/// One dead-lettered (or requeued) delivery, as `oncely webhooks dead --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadDelivery {
    /// The delivery's id (what `redeliver` takes).
    pub id: String,
    /// The event's ledger record (`Oncely-Record`).
    pub record: Option<String>,
    /// The event id (sent as `Idempotency-Key`).
    pub event_id: String,
    /// Where it goes.
    pub deliver_to: String,
    /// `dead`, or `pending` right after a redeliver.
    pub state: String,
    /// Attempts made.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// The body's size in bytes.
    pub body_bytes: usize,
    /// When the event was accepted (RFC 3339).
    pub received_at: String,
    /// When it last changed: dead-lettered, or requeued (RFC 3339).
    pub updated_at: String,
}

impl From<&Task> for DeadDelivery {
    fn from(t: &Task) -> DeadDelivery {
        DeadDelivery {
            id: t.id.to_string(),
            record: t.record.as_ref().map(|r| r.to_string()),
            event_id: t.header("idempotency-key").unwrap_or("").to_string(),
            deliver_to: t.target.clone(),
            state: t.state.to_string(),
            attempts: t.attempts,
            max_attempts: t.max_attempts,
            last_error: t.last_error.clone(),
            body_bytes: t.body.len(),
            received_at: t.created_at.to_rfc3339(),
            updated_at: t.updated_at.to_rfc3339(),
        }
    }
}

/// Every dead-lettered webhook delivery, oldest first.
pub async fn list_dead(store: &dyn Store) -> Result<Vec<DeadDelivery>, StoreError> {
    let tasks = store.list_tasks(TASK_KIND, Some(TaskState::Dead)).await?;
    Ok(tasks.iter().map(DeadDelivery::from).collect())
}

/// Queues a dead delivery again (attempts start over), found by task or record id.
/// Errors: [`TaskError::NotFound`] for an unknown id, [`TaskError::WrongState`] for a
/// delivery that is not dead.
pub async fn redeliver(store: &dyn Store, id: &str) -> Result<DeadDelivery, StoreError> {
    let task_id = if id.starts_with("task_") {
        TaskId(id.to_string())
    } else {
        let tasks = store.list_tasks(TASK_KIND, None).await?;
        let found = tasks
            .iter()
            .filter(|t| t.record.as_ref().is_some_and(|r| r.as_str() == id))
            .max_by_key(|t| t.created_at);
        match found {
            Some(t) => t.id.clone(),
            None => return Err(TaskError::NotFound(TaskId(id.to_string())).into()),
        }
    };
    let task = store.requeue_task(&task_id).await?;
    let delivery = DeadDelivery::from(&task);
    tracing::info!(
        task = %task.id,
        event_id = %delivery.event_id,
        state = "redelivered",
        "dead webhook delivery queued again"
    );
    Ok(delivery)
}

#[derive(Clone)]
struct Admin {
    store: Arc<dyn Store>,
    waker: Option<Waker>,
}

/// The admin API's webhook routes (`GET /webhooks/dead`,
/// `POST /webhooks/dead/{id}/redeliver`); the caller adds authentication. `waker` makes
/// this process's worker deliver a redelivered event at once.
pub fn admin_router(store: Arc<dyn Store>, waker: Option<Waker>) -> Router {
    Router::new()
        .route("/webhooks/dead", get(dead_handler))
        .route("/webhooks/dead/{id}/redeliver", post(redeliver_handler))
        .with_state(Admin { store, waker })
}

async fn dead_handler(State(admin): State<Admin>) -> Response {
    match list_dead(admin.store.as_ref()).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn redeliver_handler(State(admin): State<Admin>, Path(id): Path<String>) -> Response {
    match redeliver(admin.store.as_ref(), &id).await {
        Ok(delivery) => {
            if let Some(w) = &admin.waker {
                w.wake();
            }
            Json(delivery).into_response()
        }
        Err(e) => error_response(&e),
    }
}

fn error_response(e: &StoreError) -> Response {
    let detail = e.to_string();
    match e {
        StoreError::Task(TaskError::NotFound(_)) => problem(ProblemCode::NotFound, &detail),
        StoreError::Task(_) => problem(ProblemCode::NotDead, &detail),
        _ => problem(ProblemCode::StoreUnavailable, &detail),
    }
}
