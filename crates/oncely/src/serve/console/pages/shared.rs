//! What the console's pages share: how a page answers (`ok`, a store error as a page),
//! reading the record a URL names, the confirmation page every action shows first and
//! the queries and forms more than one page takes.

use axum::http::StatusCode;
use axum::response::Response;
use oncely_core::{Record, RecordId};
use oncely_store::StoreError;
use serde::Deserialize;

use super::super::html::{csrf_field, error_page, esc, html, page, Section};
use super::super::state::{Console, Viewer};
use crate::operations::OpError;

/// Repeat events read for one record's history or one principal's chart.
pub(super) const EVENTS: usize = 10_000;

/// What a page handler answers: the page, or the page that says what went wrong.
pub(super) type PageResult = Result<Response, Response>;

/// A store error as a page: 404, 409, or 503 with the failure logged and hidden.
pub(super) fn store_error(e: StoreError) -> Response {
    match e {
        StoreError::NotFound(id) => error_page(
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("No ledger record {id}."),
        ),
        StoreError::Transition(t) => {
            error_page(StatusCode::CONFLICT, "Not possible now", &t.to_string())
        }
        other => {
            tracing::warn!(target: "oncely::console", error = %other, "console: store failure");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Ledger unavailable",
                "The ledger cannot be reached; nothing was changed.",
            )
        }
    }
}

/// A page with status 200.
pub(super) fn ok(
    title: &str,
    section: Section,
    viewer: &Viewer,
    notice: Option<&str>,
    body: &str,
) -> Response {
    html(
        StatusCode::OK,
        page(title, section, Some(viewer), notice, body),
    )
}

/// The record a URL names, or the page that says why not.
pub(super) async fn get_record(console: &Console, id: &str) -> Result<Record, Response> {
    let id = RecordId(id.to_owned());
    match console.store.get(&id).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(store_error(StoreError::NotFound(id))),
        Err(e) => Err(store_error(e)),
    }
}

/// The first `n` characters, with `…` when there were more.
pub(super) fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// The `?done=` a page is sent to after an action, shown as a notice.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct DoneQuery {
    pub(super) done: Option<String>,
}

/// An operator step that was not taken ([`crate::operations`]) as a page: 404, 409, 400,
/// or 503.
pub(super) fn op_error(e: OpError) -> Response {
    let conflict = |title: &str, text: &str| error_page(StatusCode::CONFLICT, title, text);
    match e {
        OpError::NotFound(id) => store_error(StoreError::NotFound(RecordId(id))),
        OpError::NotOutcomeUnknown { id, state, .. } => conflict(
            "Nothing to resolve",
            &format!(
                "Record {id} is {state}, not outcome_unknown: only an outcome_unknown record is resolved."
            ),
        ),
        OpError::NotReconcilable(why) => conflict(
            "Cannot reconcile",
            &format!("{why}: resolve the record by hand."),
        ),
        OpError::Client(why) => error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Cannot reconcile",
            &why,
        ),
        OpError::NoDelivery(why) => error_page(StatusCode::NOT_FOUND, "Not redelivered", &why),
        OpError::NotDead(why) => conflict("Not redelivered", &why),
        OpError::Invalid(why) => error_page(StatusCode::BAD_REQUEST, "Not possible", &why),
        OpError::Store(e) => store_error(e),
    }
}

/// A confirmation page: what will happen, and the one button that does it.
pub(super) fn confirm_page(
    viewer: &Viewer,
    title: &str,
    text: &str,
    action: &str,
    button: &str,
    back: &str,
) -> Response {
    ok(
        title,
        Section::None,
        viewer,
        None,
        &format!(
            "<p id=\"confirm-text\">{text}</p><form method=\"post\" action=\"{action}\" id=\"confirm-form\">{}\
<input type=\"hidden\" name=\"confirmed\" value=\"1\">\
<button type=\"submit\" id=\"confirm\" class=\"danger\">{}</button> <a href=\"{back}\" id=\"cancel\">cancel</a></form>",
            csrf_field(viewer),
            esc(button)
        ),
    )
}

/// An action's form: `confirmed=1` once the confirmation page was answered.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct Confirmed {
    #[serde(default)]
    pub(super) confirmed: String,
}
