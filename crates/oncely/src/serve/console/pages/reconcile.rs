//! `GET/POST /console/records/ID/reconcile`: asking the route's `reconcile` endpoint now
//! whether an `outcome_unknown` record's action happened, once, as `oncely ledger
//! reconcile` does (confirmation first).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use oncely_core::{Record, State as RecordState};

use super::super::html::{error_page, esc, url_enc};
use super::super::state::{Console, Viewer};
use super::shared::{confirm_page, get_record, not_unknown, Confirmed, PageResult};
use crate::config::Route;
use crate::serve::reconcile::{reconcile_once, Reconciled};

/// `GET /console/records/ID/reconcile`: the confirmation.
pub(crate) async fn reconcile_form(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> PageResult {
    let r = get_record(&console, &id).await?;
    let route = reconcilable(&console, &r).map_err(|e| *e)?;
    let spec = route.reconcile.as_ref().expect("checked");
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

fn reconcilable<'a>(console: &'a Console, r: &Record) -> Result<&'a Route, Box<Response>> {
    if r.state != RecordState::OutcomeUnknown {
        return Err(Box::new(not_unknown(r)));
    }
    match console.config.route_named(&r.route) {
        Some(route) if route.reconcile.is_some() && route.upstream.is_some() => Ok(route),
        _ => Err(Box::new(error_page(
            StatusCode::CONFLICT,
            "Cannot reconcile",
            &format!("Route {:?} has no reconcile endpoint (or no upstream) in this config: resolve the record by hand.", r.route),
        ))),
    }
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
    let r = get_record(&console, &id).await?;
    let route = reconcilable(&console, &r).map_err(|e| *e)?;
    let client = crate::serve::proxy::upstream_client(console.config.upstream_ca.as_deref())
        .map_err(|e| {
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Cannot reconcile",
                &format!("{e:#}"),
            )
        })?;
    let attempt = match console.store.reconcile_schedule(&r.id).await {
        Ok(Some(s)) => s.attempts + 1,
        _ => 1,
    };
    let outcome = reconcile_once(&*console.store, &client, route, &r, attempt).await;
    let done = match &outcome {
        Reconciled::Completed(a) | Reconciled::Released(a) => {
            format!("reconciled: now {}", a.state)
        }
        Reconciled::Unknown(why) => format!("reconciled: still outcome_unknown ({why})"),
        Reconciled::Error(why) => format!("reconciliation failed ({why})"),
    };
    tracing::info!(
        target: "oncely::console",
        action = "reconcile",
        record = %r.id,
        route = %r.route,
        result = outcome.label(),
        by = "console",
        "console action"
    );
    Ok(Redirect::to(&format!(
        "/console/records/{}?done={}",
        url_enc(r.id.as_str()),
        url_enc(&done)
    ))
    .into_response())
}
