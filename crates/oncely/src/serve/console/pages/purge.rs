//! `GET/POST /console/purge`: purging the expired records and the usage history's hours
//! past `usage_retention`, as `oncely ledger purge --expired` does (confirmation first).

use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};

use super::super::html::url_enc;
use super::super::state::{Console, Viewer};
use super::shared::{confirm_page, op_error, Confirmed, PageResult};
use crate::operations::{self, Via};

/// `GET /console/purge`: the confirmation.
pub(crate) async fn purge_form(Extension(viewer): Extension<Viewer>) -> Response {
    confirm_page(
        &viewer,
        "Purge expired records",
        "Delete every completed and released record whose window has ended, and the usage history's hours older than <code>usage_retention</code> (as <code>oncely ledger purge --expired</code>; the server also does this every minute). What the records counted stays in the usage history. Records in processing or outcome_unknown are never purged.",
        "/console/purge",
        "Purge",
        "/console/",
    )
}

/// `POST /console/purge`.
pub(crate) async fn purge(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Form(c): Form<Confirmed>,
) -> PageResult {
    if c.confirmed != "1" {
        return Ok(purge_form(Extension(viewer)).await);
    }
    let purged = operations::purge(
        &*console.store,
        console.config.usage_retention,
        Via::Console,
    )
    .await
    .map_err(op_error)?;
    let n = purged.records;
    Ok(Redirect::to(&format!(
        "/console/?done={}",
        url_enc(&format!(
            "purged {n} expired records and {} usage history rows",
            purged.history_rows
        ))
    ))
    .into_response())
}
