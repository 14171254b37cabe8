//! `GET /console/webhooks` and `GET/POST /console/webhooks/ID/redeliver`: the
//! dead-lettered webhook deliveries, and redelivering one (confirmation first).

use std::fmt::Write as _;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};

use super::super::html::{esc, url_enc, Section};
use super::super::state::{Console, Viewer};
use super::shared::{confirm_page, ok, op_error, store_error, Confirmed, DoneQuery, PageResult};
use crate::operations::{self, Via};

/// `GET /console/webhooks`: the dead-lettered deliveries.
pub(crate) async fn dead_letters(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(q): Query<DoneQuery>,
) -> PageResult {
    let dead = oncely_webhooks::list_dead(console.store.as_ref())
        .await
        .map_err(store_error)?;
    let mut body = String::new();
    if dead.is_empty() {
        body.push_str("<p class=\"empty\" id=\"no-dead\">No dead-lettered webhook deliveries.</p>");
    } else {
        body.push_str(
            "<table id=\"dead\"><thead><tr><th>delivery</th><th>event</th><th>to</th><th>attempts</th>\
<th>dead since</th><th>last error</th><th></th></tr></thead><tbody>",
        );
        for d in &dead {
            let _ = write!(
                body,
                "<tr data-delivery=\"{id}\"><td class=\"mono\">{id}</td><td class=\"mono\">{}</td><td>{}</td><td>{}/{}</td>\
<td>{}</td><td>{}</td><td><a class=\"button redeliver\" href=\"/console/webhooks/{id}/redeliver\">Redeliver…</a></td></tr>",
                esc(&d.event_id),
                esc(&d.deliver_to),
                d.attempts,
                d.max_attempts,
                esc(&d.updated_at),
                esc(d.last_error.as_deref().unwrap_or("-")),
                id = esc(&d.id),
            );
        }
        body.push_str("</tbody></table>");
    }
    let notice = q.done.as_deref().map(|d| format!("Done: {d}."));
    Ok(ok(
        "Webhook dead letters",
        Section::Webhooks,
        &viewer,
        notice.as_deref(),
        &body,
    ))
}

/// `GET /console/webhooks/ID/redeliver`: the confirmation.
pub(crate) async fn redeliver_form(
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Response {
    // The id comes from the link's path: one encoded segment in the form's action, so
    // that `..`, `/`, `?` or `#` in it cannot point the form at another action.
    let action = format!("/console/webhooks/{}/redeliver", esc(&url_enc(&id)));
    let id = esc(&id);
    confirm_page(
        &viewer,
        "Redeliver",
        &format!("Queue the dead delivery <span class=\"mono\">{id}</span> again: its attempts start over, and the handler gets the same event under the same Idempotency-Key."),
        &action,
        "Redeliver",
        "/console/webhooks",
    )
}

/// `POST /console/webhooks/ID/redeliver`, as `oncely webhooks redeliver` and the admin API
/// do; this process's delivery worker is woken to send it at once.
pub(crate) async fn redeliver(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(c): Form<Confirmed>,
) -> PageResult {
    if c.confirmed != "1" {
        return Ok(redeliver_form(Extension(viewer), Path(id)).await);
    }
    operations::redeliver(
        &*console.store,
        console.webhook_waker.as_ref(),
        &id,
        Via::Console,
    )
    .await
    .map_err(op_error)?;
    Ok(Redirect::to(&format!(
        "/console/webhooks?done={}",
        url_enc(&format!("{id} queued again"))
    ))
    .into_response())
}
