//! `GET/POST /console/records/ID/reconcile`: asking the route's `reconcile` endpoint now
//! whether an `outcome_unknown` record's action happened, once, as `oncely ledger
//! reconcile` does (confirmation first).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect};
use axum::{Extension, Form};

use super::super::html::{esc, url_enc};
use super::super::state::{Console, Viewer};
use super::shared::{confirm_page, op_error, Confirmed, PageResult};
use crate::operations::{self, Via};
use crate::reconcile::Reconciled;

/// `GET /console/records/ID/reconcile`: the confirmation.
pub(crate) async fn reconcile_form(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> PageResult {
    let r = operations::unknown_record(&*console.store, &id, "reconcile")
        .await
        .map_err(op_error)?;
    let route = operations::reconcilable(Some(&console.config), &r).map_err(op_error)?;
    let spec = route.reconcile.as_ref().expect("a reconcilable route");
    let id = esc(r.id.as_str());
    Ok(confirm_page(
        &viewer,
        "Reconcile now",
        &format!(
            "Ask the upstream now whether the action of record <span class=\"mono\">{id}</span> happened: \
<code>{} {}</code> with <code>{{key}}</code> = the downstream key. 2xx completes the record with that answer, \
404 releases it, anything else leaves it outcome_unknown.",
            esc(spec.method.as_str()),
            esc(&spec.target_for("{key}")),
        ),
        &format!("/console/records/{id}/reconcile"),
        "Reconcile now",
        &format!("/console/records/{id}"),
    ))
}

/// `POST /console/records/ID/reconcile`: asks once, as `oncely ledger reconcile` does.
pub(crate) async fn reconcile(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(c): Form<Confirmed>,
) -> PageResult {
    if c.confirmed != "1" {
        return reconcile_form(State(console), Extension(viewer), Path(id)).await;
    }
    let outcome = operations::reconcile(&*console.store, Some(&console.config), &id, Via::Console)
        .await
        .map_err(op_error)?;
    let done = match &outcome {
        Reconciled::Completed(a) | Reconciled::Released(a) => {
            format!("reconciled: now {}", a.state)
        }
        Reconciled::Unknown(why) => format!("reconciled: still outcome_unknown ({why})"),
        Reconciled::Error(why) => format!("reconciliation failed ({why})"),
    };
    Ok(Redirect::to(&format!(
        "/console/records/{}?done={}",
        url_enc(&id),
        url_enc(&done)
    ))
    .into_response())
}
